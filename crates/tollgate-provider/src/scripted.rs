//! An in-process scripted client: replies come from a queue, sends are counted. For tests and
//! examples that need exact control of a provider's behaviour without a network.

use crate::client::{ClientDescriptor, EventStream, ProviderClient, ProviderRequest, SendError};
use crate::protocol::Protocol;
use async_trait::async_trait;
use futures::StreamExt;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_core::event::{error_kind, ProviderEvent};
use tollgate_core::usage::Usage;

/// One scripted reply.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptedReply {
    /// These events, then the stream ends.
    Events(Vec<ProviderEvent>),
    /// Waits, then these events.
    Delayed {
        /// Delay before the first event, ms.
        delay_ms: u64,
        /// Sent all at once after the delay; a cancel first yields one `aborted` error instead.
        events: Vec<ProviderEvent>,
    },
    /// These events, then nothing ever again (until cancelled).
    EventsThenHang(Vec<ProviderEvent>),
    /// The send fails.
    Fail(SendError),
}

impl ScriptedReply {
    /// A successful text reply with terminal usage and a clean end.
    pub fn text(text: &str, usage: Usage) -> Self {
        Self::Events(vec![
            ProviderEvent::ProviderRef {
                id: "req-scripted".into(),
            },
            ProviderEvent::TextDelta { text: text.into() },
            ProviderEvent::Stop {
                reason: "stop".into(),
            },
            ProviderEvent::Usage {
                usage,
                terminal: true,
            },
            ProviderEvent::Done,
        ])
    }
}

/// A scripted single-shot client.
pub struct ScriptedClient {
    replies: Mutex<VecDeque<ScriptedReply>>,
    sends: AtomicU64,
    descriptor: ClientDescriptor,
    last_request: Mutex<Option<ProviderRequest>>,
}

impl ScriptedClient {
    /// A single-shot client answering with `replies` in order.
    pub fn new(replies: impl IntoIterator<Item = ScriptedReply>) -> Self {
        Self::with_descriptor(
            replies,
            ClientDescriptor {
                protocol: Protocol::OpenAiChat,
                max_attempts: 1,
                fallback: false,
            },
        )
    }

    /// A client describing itself as `descriptor` (e.g. one with retries, to test rejection).
    pub fn with_descriptor(
        replies: impl IntoIterator<Item = ScriptedReply>,
        descriptor: ClientDescriptor,
    ) -> Self {
        Self {
            replies: Mutex::new(replies.into_iter().collect()),
            sends: AtomicU64::new(0),
            descriptor,
            last_request: Mutex::new(None),
        }
    }

    /// Queues another reply.
    pub fn push(&self, reply: ScriptedReply) {
        if let Ok(mut q) = self.replies.lock() {
            q.push_back(reply);
        }
    }

    /// How many sends reached the client.
    pub fn sends(&self) -> u64 {
        self.sends.load(Ordering::SeqCst)
    }

    /// The last request sent.
    pub fn last_request(&self) -> Option<ProviderRequest> {
        self.last_request.lock().ok().and_then(|r| r.clone())
    }
}

fn aborted() -> ProviderEvent {
    ProviderEvent::Error {
        kind: error_kind::ABORTED.into(),
        message: "aborted".into(),
    }
}

#[async_trait]
impl ProviderClient for ScriptedClient {
    fn descriptor(&self) -> ClientDescriptor {
        self.descriptor.clone()
    }

    fn check(&self, request: &ProviderRequest) -> Result<(), SendError> {
        crate::support::check(self.descriptor.protocol, request)
    }

    async fn send(
        &self,
        request: ProviderRequest,
        cancel: CancellationToken,
    ) -> Result<EventStream, SendError> {
        self.check(&request)?;
        self.sends.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut last) = self.last_request.lock() {
            *last = Some(request);
        }
        let reply = self
            .replies
            .lock()
            .ok()
            .and_then(|mut q| q.pop_front())
            .unwrap_or(ScriptedReply::Fail(SendError::NoResponse(
                "script exhausted".into(),
            )));
        match reply {
            ScriptedReply::Fail(e) => Err(e),
            ScriptedReply::Events(events) => Ok(futures::stream::iter(events).boxed()),
            ScriptedReply::Delayed { delay_ms, events } => {
                let delayed = async move {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(delay_ms)) => events,
                        _ = cancel.cancelled() => vec![aborted()],
                    }
                };
                Ok(futures::stream::once(delayed)
                    .flat_map(futures::stream::iter)
                    .boxed())
            }
            ScriptedReply::EventsThenHang(events) => {
                let tail = async move {
                    cancel.cancelled().await;
                    aborted()
                };
                Ok(futures::stream::iter(events)
                    .chain(futures::stream::once(tail))
                    .boxed())
            }
        }
    }
}
