//! Live streaming at the runner (SC-213): a call's text reaches its caller as the provider sends
//! it, before the provider has sent the rest, while the call is collected, settled and stored as
//! any other; a replay hands the caller nothing live.
#![cfg(test)]

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tollgate_core::event::ProviderEvent as E;
use tollgate_core::ids::*;
use tollgate_core::message::{Message, Role};
use tollgate_core::state::Outcome;
use tollgate_core::usage::Usage;
use tollgate_core::view::ViewState;
use tollgate_provider::{
    ClientDescriptor, EventStream, ProviderClient, ProviderRequest, SendError,
};
use tollgate_runner::live::{self, Live};
use tollgate_runner::{RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::{MemoryStores, SettlementStore};
use tollgate_testkit::conformance::{scope, text_config};

/// A provider that sends its first delta, then holds its stream open until `release`.
struct HeldBetweenDeltas {
    release: Arc<Notify>,
    sends: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl ProviderClient for HeldBetweenDeltas {
    fn descriptor(&self) -> ClientDescriptor {
        ClientDescriptor {
            protocol: tollgate_provider::Protocol::OpenAiChat,
            max_attempts: 1,
            fallback: false,
        }
    }

    fn check(&self, _request: &ProviderRequest) -> Result<(), SendError> {
        Ok(())
    }

    async fn send(
        &self,
        _request: ProviderRequest,
        _cancel: CancellationToken,
    ) -> Result<EventStream, SendError> {
        self.sends.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let release = Arc::clone(&self.release);
        let first = futures::stream::iter(vec![
            E::ProviderRef { id: "req-1".into() },
            E::TextDelta {
                text: "first ".into(),
            },
        ]);
        let rest = async move {
            release.notified().await;
            futures::stream::iter(vec![
                E::TextDelta {
                    text: "second".into(),
                },
                E::Stop {
                    reason: "stop".into(),
                },
                E::Usage {
                    usage: Usage {
                        input: 10,
                        output: 5,
                        ..Usage::ZERO
                    },
                    terminal: true,
                },
                E::Done,
            ])
        }
        .flatten_stream();
        Ok(first.chain(rest).boxed())
    }
}

fn request(key: &str) -> RunRequest {
    RunRequest {
        scope: scope("acme"),
        session_id: SessionId::parse("s-1").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        input_revision: InputRevision::parse("r-1").unwrap(),
        intent: Intent::parse("summarize").unwrap(),
        load_input: async { Ok(vec![Message::text(Role::User, "hello")]) }.boxed(),
        cancel: CancellationToken::new(),
        limits: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_213_text_reaches_the_caller_before_the_provider_sends_the_rest() {
    let stores = Arc::new(MemoryStores::new());
    let release = Arc::new(Notify::new());
    let client = Arc::new(HeldBetweenDeltas {
        release: Arc::clone(&release),
        sends: Default::default(),
    });
    let runner = Arc::new(
        SingleCallRunner::new(
            stores.clone(),
            client.clone(),
            RunnerSettings::new(text_config()),
        )
        .unwrap(),
    );
    let (sink, mut deltas) = live::channel();
    let call = {
        let runner = Arc::clone(&runner);
        tokio::spawn(async move { runner.run_live(request("k1"), None, sink).await })
    };
    // The reader learns the journal row, then the first delta arrives while the provider still
    // holds its stream open.
    let sent = tokio::time::timeout(Duration::from_secs(5), deltas.recv())
        .await
        .expect("the reader did not learn that the call was sent");
    let Some(Live::Sent(id)) = sent else {
        panic!("the reader's first event is the journal row: {sent:?}");
    };
    let first = tokio::time::timeout(Duration::from_secs(5), deltas.recv())
        .await
        .expect("the first delta did not reach the caller while the stream was held open");
    assert_eq!(first, Some(Live::Text("first ".into())));
    assert!(
        !call.is_finished(),
        "the call ended before the provider's second delta"
    );
    release.notify_one();
    assert_eq!(deltas.recv().await, Some(Live::Text("second".into())));
    let Some(Live::Usage(usage)) = deltas.recv().await else {
        panic!("the provider's usage reaches the reader");
    };
    assert_eq!((usage.input, usage.output), (10, 5));
    assert_eq!(
        deltas.recv().await,
        None,
        "the reader ends with the provider's stream"
    );
    // The answer is the governed one: collected, settled and stored as without a live reader.
    let view = call.await.unwrap().unwrap();
    assert_eq!(view.execution_id, Some(id));
    assert_eq!(view.state, ViewState::Completed);
    assert_eq!(view.outcome, Some(Outcome::Success));
    assert_eq!(view.output.unwrap().text.as_deref(), Some("first second"));
    let settled = stores
        .settlement(view.execution_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        settled.source,
        tollgate_core::state::SettlementSource::Stream
    );
    // A replay sends nothing and hands its live reader nothing: the stored answer is its answer.
    let (sink, mut deltas) = live::channel();
    let replayed = runner.run_live(request("k1"), None, sink).await.unwrap();
    assert!(replayed.replayed);
    assert_eq!(deltas.recv().await, None);
    assert_eq!(client.sends.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_213_a_caller_that_stops_reading_changes_nothing() {
    let stores = Arc::new(MemoryStores::new());
    let release = Arc::new(Notify::new());
    let client = Arc::new(HeldBetweenDeltas {
        release: Arc::clone(&release),
        sends: Default::default(),
    });
    let runner =
        SingleCallRunner::new(stores.clone(), client, RunnerSettings::new(text_config())).unwrap();
    let (sink, deltas) = live::channel();
    drop(deltas);
    release.notify_one();
    let view = runner.run_live(request("k2"), None, sink).await.unwrap();
    assert_eq!(view.outcome, Some(Outcome::Success));
    assert_eq!(view.output.unwrap().text.as_deref(), Some("first second"));
}
