//! The single-call runner suite, run against every store implementation.
#![allow(dead_code)]

pub mod cases;
pub mod races;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tollgate_core::caps::SpendTotals;
use tollgate_core::config::{CallConfig, OutputContract};
use tollgate_core::event::ProviderEvent;
use tollgate_core::ids::*;
use tollgate_core::message::{Message, Role};
use tollgate_core::money::Money;
use tollgate_core::state::CallKind;
use tollgate_core::usage::Usage;
use tollgate_provider::scripted::{ScriptedClient, ScriptedReply};
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::ManualClock;
use tollgate_runner::{InputLoader, RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::fault::FaultyStores;
use tollgate_store::Stores;
use tollgate_testkit::conformance::{money, scope, text_config};

/// Instantiates every case for a factory returning `Arc<dyn Stores>`.
#[macro_export]
macro_rules! runner_suite {
    ($factory:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let stores = ($factory)().await;
                $crate::suite::cases::$name($crate::suite::Harness::new(stores)).await;
            }
        )+
    };
}

pub struct Harness {
    pub faults: Arc<FaultyStores>,
    pub stores: Arc<dyn Stores>,
    pub clock: Arc<ManualClock>,
    pub loads: Arc<AtomicU64>,
}

pub fn t0() -> DateTime<Utc> {
    tollgate_testkit::conformance::t0()
}

impl Harness {
    pub fn new(base: Arc<dyn Stores>) -> Self {
        let faults = Arc::new(FaultyStores::new(base));
        Self {
            stores: faults.clone(),
            faults,
            clock: Arc::new(ManualClock::new(t0())),
            loads: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn runner(&self, config: CallConfig, client: &Arc<ScriptedClient>) -> SingleCallRunner {
        self.runner_retrying(
            config,
            client,
            RunnerSettings::new(text_config()).settle_retry_ms,
        )
    }

    /// A runner whose last writes are retried for `settle_retry_ms` while the store fails.
    pub fn runner_retrying(
        &self,
        config: CallConfig,
        client: &Arc<ScriptedClient>,
        settle_retry_ms: u64,
    ) -> SingleCallRunner {
        let mut settings = RunnerSettings::new(config);
        settings.clock = self.clock.clone();
        settings.settle_retry_ms = settle_retry_ms;
        SingleCallRunner::new(self.stores.clone(), client.clone(), settings).unwrap()
    }

    pub fn reconciler(&self) -> Reconciler {
        Reconciler::new(self.stores.clone(), self.clock.clone())
    }

    pub fn loader(&self, text: &str) -> InputLoader {
        let loads = self.loads.clone();
        let text = text.to_string();
        async move {
            loads.fetch_add(1, Ordering::SeqCst);
            Ok(vec![Message::text(Role::User, text)])
        }
        .boxed()
    }

    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::SeqCst)
    }

    pub fn request(&self, key: &str, text: &str) -> RunRequest {
        RunRequest {
            scope: scope("acme"),
            session_id: SessionId::parse("s-1").unwrap(),
            operation_key: OperationKey::parse(key).unwrap(),
            input_revision: InputRevision::parse("r-1").unwrap(),
            intent: Intent::parse("summarize").unwrap(),
            load_input: self.loader(text),
            cancel: CancellationToken::new(),
            limits: Vec::new(),
        }
    }

    pub async fn daily(&self) -> SpendTotals {
        self.stores
            .daily_spend(
                &scope("acme"),
                &ConsumerId::parse("team-a").unwrap(),
                t0().date_naive(),
                &tollgate_core::money::Currency::parse("USD").unwrap(),
            )
            .await
            .unwrap()
    }
}

pub fn client(replies: Vec<ScriptedReply>) -> Arc<ScriptedClient> {
    Arc::new(ScriptedClient::new(replies))
}

pub fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input,
        output,
        ..Usage::ZERO
    }
}

/// 10 input + 5 output tokens at 1 / 2 per million = 0.00002.
pub fn ok_reply(text: &str) -> ScriptedReply {
    ScriptedReply::text(text, usage(10, 5))
}

pub fn events_without_usage(text: &str) -> Vec<ProviderEvent> {
    vec![
        ProviderEvent::ProviderRef {
            id: "req-cut".into(),
        },
        ProviderEvent::TextDelta { text: text.into() },
    ]
}

pub fn json_config() -> CallConfig {
    let mut c = text_config();
    c.kind = CallKind::Json;
    c.output = Some(OutputContract {
        name: "answer".into(),
        schema: serde_json::json!({
            "type": "object",
            "required": ["answer", "ok"],
            "properties": {"answer": {"type": "string"}, "ok": {"type": "boolean"}}
        }),
    });
    c
}

pub fn m(s: &str) -> Money {
    money(s)
}
