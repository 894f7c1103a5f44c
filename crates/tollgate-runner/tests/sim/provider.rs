//! The simulated provider: a scripted single-shot client shared by every process (the provider
//! is outside the processes: a request it took stays taken when its sender dies).
//!
//! Each call's input is one message naming its token — scope, journal key, intent and root — so
//! the provider knows which call a request belongs to, whichever process sends it and in whatever
//! order. The driver scripts a behaviour per token, covering what the mock provider does: text,
//! json and tool-call streams with terminal usage, reasoning, a reasoning loop, slow headers, slow
//! streams, hangs (a run timeout ends them), cuts before and after the usage, a pre-stream
//! refusal, an empty refusal, a content-filter refusal with its cost, 429 and 500 before any
//! stream, a failed connection, a lost response, an output-cap overrun and an oversized answer.
//! Every wait is a sleep in simulated time.
//!
//! On each send it checks, from its own counters and the journal: at most one send per
//! `(scope, key)` (SC-13, SC-14: replays and conflicts send nothing); a send only after a durable
//! claim and dispatch mark (SC-12, SC-17); and only under the binding the journal holds (SC-14,
//! ST-30).

use super::shared::Shared;
use async_trait::async_trait;
use futures::StreamExt;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_core::event::{error_kind, ProviderEvent as E};
use tollgate_core::ids::{OperationKey, Scope};
use tollgate_core::message::Part;
use tollgate_core::state::ExecutionState;
use tollgate_core::usage::Usage;
use tollgate_provider::{
    ClientDescriptor, EventStream, Protocol, ProviderClient, ProviderRequest, SendError,
    StatusClass,
};
use tollgate_store::ExecutionStore;

/// What the provider does with one call's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// The kind's answer (text, json or a tool call), terminal usage, clean end.
    Normal,
    /// Reasoning, then the answer.
    Reasoning,
    /// Reasoning deltas past the reasoning limit, then nothing.
    ReasoningLoop,
    /// Headers only after seconds, then the answer.
    Slow,
    /// Some text, then nothing until the reader gives up.
    Hang,
    /// Text, then the connection drops before any usage.
    CutBeforeUsage,
    /// Text and terminal usage, then the connection drops before the stop.
    CutAfterUsage,
    /// Provider reference and a clean end, nothing else (RF-2).
    RefusePrestream,
    /// A refusal stop with no content (RF-1).
    EmptyRefusal,
    /// A content-filter stop with its cost.
    ContentFilter,
    /// HTTP 429 before any stream, the provider's rejection (settles at zero).
    Status429,
    /// HTTP 500 before any stream, not proven unprocessed (ambiguous: goes to an operator).
    Status500,
    /// The connection fails: nothing reaches the provider.
    Connect,
    /// The request is taken, no response ever comes back.
    NoResponse,
    /// Ignores `max_tokens`: the cost can pass the worst case held.
    Overrun,
    /// More output than `max_output_chars`.
    Big,
    /// A tool call whose arguments are not JSON (tool kinds; the normal answer otherwise).
    ToolMalformed,
}

/// How the provider answers one token.
#[derive(Debug, Clone, Copy)]
pub struct Script {
    /// Behaviour.
    pub behaviour: Behaviour,
    /// Terminal usage.
    pub usage: Usage,
    /// Wait before the headers, ms.
    pub first_ms: u64,
    /// Wait between events, ms.
    pub gap_ms: u64,
    /// Answer with a tool call (structured and step calls).
    pub tools: bool,
    /// Answer with the JSON the json snapshot's schema accepts.
    pub json: bool,
    /// Announce an early, non-terminal usage first (as Anthropic's `message_start` does): a
    /// stream cut after it leaves inexact evidence.
    pub early_usage: bool,
}

/// The identity a call's input carries to the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// Scope.
    pub scope: String,
    /// Journal key (the derived call key for structured calls).
    pub key: String,
    /// Intent of the attempt's binding.
    pub intent: String,
    /// Root key, `-` for none.
    pub root: String,
}

impl Token {
    /// The message text carrying the token.
    pub fn text(&self) -> String {
        format!(
            "sim {} {} {} {}",
            self.scope, self.key, self.intent, self.root
        )
    }

    fn parse(text: &str) -> Option<Token> {
        let mut parts = text.split(' ');
        if parts.next()? != "sim" {
            return None;
        }
        Some(Token {
            scope: parts.next()?.into(),
            key: parts.next()?.into(),
            intent: parts.next()?.into(),
            root: parts.next()?.into(),
        })
    }
}

/// The simulated provider.
pub struct SimProvider {
    shared: Arc<Shared>,
    scripts: Mutex<BTreeMap<String, Script>>,
    sends: Mutex<BTreeMap<(String, String), u32>>,
}

fn aborted() -> E {
    E::Error {
        kind: error_kind::ABORTED.into(),
        message: "aborted".into(),
    }
}

fn closed() -> E {
    E::Error {
        kind: error_kind::CONNECTION_CLOSED.into(),
        message: "connection closed".into(),
    }
}

fn usage_event(usage: Usage) -> E {
    E::Usage {
        usage,
        terminal: true,
    }
}

fn answer(script: &Script, malformed: bool) -> Vec<E> {
    if script.tools {
        let args = if malformed {
            r#"{"city": "unterminated"#
        } else {
            r#"{"city":"Paris"}"#
        };
        return vec![
            E::ToolCallStart {
                index: 0,
                id: "call_1".into(),
                name: "get_weather".into(),
            },
            E::ToolCallArgsDelta {
                index: 0,
                delta: args.into(),
            },
            E::ToolCallEnd { index: 0 },
            E::Stop {
                reason: "tool_calls".into(),
            },
        ];
    }
    let text = if script.json {
        r#"{"answer":"sim","ok":true}"#
    } else {
        "simulated answer"
    };
    vec![
        E::TextDelta { text: text.into() },
        E::Stop {
            reason: "stop".into(),
        },
    ]
}

/// The events of a stream and whether it hangs after them.
fn events(script: &Script) -> (Vec<E>, bool) {
    let id = E::ProviderRef {
        id: "req-sim".into(),
    };
    let text = E::TextDelta {
        text: "partial".into(),
    };
    let done = |mut v: Vec<E>| {
        v.push(usage_event(script.usage));
        v.push(E::Done);
        v
    };
    let with_answer = |mut v: Vec<E>, malformed| {
        v.extend(answer(script, malformed));
        done(v)
    };
    match script.behaviour {
        Behaviour::Normal | Behaviour::Slow | Behaviour::Overrun => {
            (with_answer(vec![id], false), false)
        }
        Behaviour::ToolMalformed => (with_answer(vec![id], true), false),
        Behaviour::Reasoning => {
            let think = E::ReasoningDelta {
                text: "thinking it through".into(),
            };
            (with_answer(vec![id, think], false), false)
        }
        Behaviour::ReasoningLoop => {
            let mut v = vec![id];
            v.extend((0..30).map(|_| E::ReasoningDelta {
                text: "x".repeat(50),
            }));
            (v, true)
        }
        Behaviour::Big => {
            let mut v = vec![id];
            v.extend((0..80).map(|_| E::TextDelta {
                text: "sixteen chars ok".into(),
            }));
            v.push(E::Stop {
                reason: "stop".into(),
            });
            (done(v), false)
        }
        Behaviour::Hang => (vec![id, text], true),
        Behaviour::CutBeforeUsage => (vec![id, text, closed()], false),
        Behaviour::CutAfterUsage => (vec![id, text, usage_event(script.usage), closed()], false),
        Behaviour::RefusePrestream => (vec![id, E::Done], false),
        Behaviour::EmptyRefusal => {
            let stop = E::Stop {
                reason: "refusal".into(),
            };
            (vec![id, stop, E::Done], false)
        }
        Behaviour::ContentFilter => {
            let stop = E::Stop {
                reason: "content_filter".into(),
            };
            (done(vec![id, stop]), false)
        }
        Behaviour::Status429
        | Behaviour::Status500
        | Behaviour::Connect
        | Behaviour::NoResponse => (Vec::new(), false),
    }
}

/// A stream yielding `events` `gap_ms` apart, then ending or hanging until cancelled.
fn timed(events: Vec<E>, gap_ms: u64, hang: bool, cancel: CancellationToken) -> EventStream {
    let state = (VecDeque::from(events), true, hang, cancel);
    futures::stream::unfold(state, move |(mut queue, first, hang, cancel)| async move {
        if let Some(event) = queue.pop_front() {
            if !first && gap_ms > 0 {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => {
                        return Some((aborted(), (VecDeque::new(), false, false, cancel)));
                    }
                    _ = tokio::time::sleep(Duration::from_millis(gap_ms)) => {}
                }
            }
            return Some((event, (queue, false, hang, cancel)));
        }
        if hang {
            cancel.cancelled().await;
            return Some((aborted(), (queue, false, false, cancel)));
        }
        None
    })
    .boxed()
}

fn token_of(request: &ProviderRequest) -> Option<Token> {
    let last = request.messages.last()?;
    last.content.iter().find_map(|part| match part {
        Part::Text { text } => Token::parse(text),
        _ => None,
    })
}

impl SimProvider {
    /// A provider with no script yet.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            scripts: Mutex::new(BTreeMap::new()),
            sends: Mutex::new(BTreeMap::new()),
        }
    }

    /// Scripts `token` (the first script of a token stays).
    pub fn script(&self, token: &Token, script: Script) {
        if let Ok(mut scripts) = self.scripts.lock() {
            scripts.entry(token.text()).or_insert(script);
        }
    }

    /// Sends per `(scope, journal key)`.
    pub fn sends(&self) -> BTreeMap<(String, String), u32> {
        self.sends.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Counts a send of `token` and checks it against the journal.
    async fn on_send(&self, token: &Token) {
        let n = {
            let mut sends = self.sends.lock().unwrap_or_else(|e| e.into_inner());
            let n = sends
                .entry((token.scope.clone(), token.key.clone()))
                .or_default();
            *n += 1;
            *n
        };
        let what = format!("{}/{}", token.scope, token.key);
        self.shared
            .trace(format!("provider send {what} {}", token.intent));
        if n > 1 {
            self.shared
                .violation(format!("SC-13: send number {n} of {what}"));
        }
        let scope = Scope::parse(&token.scope).ok();
        let key = OperationKey::parse(&token.key).ok();
        let record = match (scope, key) {
            (Some(s), Some(k)) => self.shared.truth.execution(&s, &k).await.ok().flatten(),
            _ => None,
        };
        let Some(record) = record else {
            return self
                .shared
                .violation(format!("SC-12: {what} sent without a claim"));
        };
        if matches!(
            record.state,
            ExecutionState::Prepared | ExecutionState::NotDispatched
        ) {
            self.shared.violation(format!(
                "SC-12: {what} sent while the journal says {}",
                record.state
            ));
        }
        let root = record.root_key.as_ref().map_or("-", |r| r.as_str());
        if record.binding.intent.as_str() != token.intent || root != token.root {
            self.shared.violation(format!(
                "SC-14: {what} sent under intent {} root {} but claimed under {} {root}",
                token.intent, token.root, record.binding.intent
            ));
        }
    }
}

#[async_trait]
impl ProviderClient for SimProvider {
    fn descriptor(&self) -> ClientDescriptor {
        ClientDescriptor {
            protocol: Protocol::OpenAiChat,
            max_attempts: 1,
            fallback: false,
        }
    }

    fn check(&self, request: &ProviderRequest) -> Result<(), SendError> {
        tollgate_provider::support::check(Protocol::OpenAiChat, request)
    }

    async fn send(
        &self,
        request: ProviderRequest,
        cancel: CancellationToken,
    ) -> Result<EventStream, SendError> {
        self.check(&request)?;
        let Some(token) = token_of(&request) else {
            self.shared
                .violation("a request without a simulation token");
            return Err(SendError::Unsupported("no token".into()));
        };
        let script = self
            .scripts
            .lock()
            .ok()
            .and_then(|s| s.get(&token.text()).copied());
        let Some(script) = script else {
            self.shared
                .violation(format!("no script for {}", token.text()));
            return Err(SendError::Unsupported("no script".into()));
        };
        if script.behaviour == Behaviour::Connect {
            return Err(SendError::Connect("refused".into()));
        }
        self.on_send(&token).await;
        if script.first_ms > 0 {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(SendError::NoResponse("aborted".into())),
                _ = tokio::time::sleep(Duration::from_millis(script.first_ms)) => {}
            }
        }
        let provider_ref = Some("req-sim".to_string());
        match script.behaviour {
            Behaviour::Status429 => Err(SendError::Status {
                status: 429,
                provider_ref,
                class: StatusClass::NotProcessed,
            }),
            Behaviour::Status500 => Err(SendError::Status {
                status: 500,
                provider_ref,
                class: StatusClass::Ambiguous,
            }),
            Behaviour::NoResponse => Err(SendError::NoResponse("reset".into())),
            _ => {
                let (mut events, hang) = events(&script);
                let refusal = matches!(
                    script.behaviour,
                    Behaviour::RefusePrestream | Behaviour::EmptyRefusal
                );
                if script.early_usage && !refusal {
                    let early = Usage {
                        output: 1,
                        ..script.usage
                    };
                    let at = events.len().min(1);
                    events.insert(
                        at,
                        E::Usage {
                            usage: early,
                            terminal: false,
                        },
                    );
                }
                Ok(timed(events, script.gap_ms, hang, cancel))
            }
        }
    }
}
