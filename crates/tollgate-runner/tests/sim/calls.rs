//! Calls as the driver makes them: what one call is, how an attempt at it runs in a process, what
//! its input loader checks, and what its answer must be.

use super::process::Runners;
use super::provider::Token;
use super::shared::Shared;
use super::universe::{id, intent, scope, Kind, INTENTS, SCOPES};
use futures::FutureExt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::{InputRevision, OperationKey, RootKey};
use tollgate_core::message::{Message, Role};
use tollgate_core::state::CallKind;
use tollgate_core::view::View;
use tollgate_runner::step::StepRequest;
use tollgate_runner::structured::derived_id;
use tollgate_runner::{InputLoader, RunError, RunRequest};
use tollgate_store::{ExecutionRecord, ExecutionStore};

/// What the host's loader does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Loads the token after `ms`.
    Ok(u64),
    /// Fails (`not_dispatched(input)`).
    Fails,
    /// Returns input over `max_input_chars` (`not_dispatched(invalid)`).
    Invalid,
}

/// One call: the same spec again is a replay; a changed kind, intent or root is a conflict.
#[derive(Debug, Clone)]
pub struct CallSpec {
    /// Kind.
    pub kind: Kind,
    /// Index into the scopes.
    pub scope: usize,
    /// Index into the consumers.
    pub consumer: usize,
    /// Session (sessions rotate as the run goes on).
    pub session: String,
    /// Index into the intents.
    pub intent: usize,
    /// Host key (the step's own key for steps).
    pub key: String,
    /// The root of a step.
    pub root: Option<String>,
    /// The loader's behaviour.
    pub load: Load,
}

/// What the journal said about the key when the attempt started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No execution yet.
    Fresh,
    /// An execution with this binding: a replay (SC-13).
    Replay,
    /// An execution with another binding: a conflict (SC-14, ST-30).
    Conflict,
}

fn call_kind(kind: Kind) -> CallKind {
    match kind {
        Kind::Text => CallKind::Text,
        Kind::Json => CallKind::Json,
        Kind::Structured => CallKind::Structured,
        Kind::Step => CallKind::Step,
    }
}

impl CallSpec {
    fn host_key(&self) -> OperationKey {
        OperationKey::parse(self.key.as_str()).unwrap()
    }

    /// The key the journal holds the call under.
    pub fn journal_key(&self) -> String {
        match self.kind {
            Kind::Structured => derived_id("call", &scope(self.scope), &self.host_key()),
            _ => self.key.clone(),
        }
    }

    /// The root the journal holds the call under.
    pub fn journal_root(&self) -> Option<String> {
        match self.kind {
            Kind::Structured => Some(derived_id("root", &scope(self.scope), &self.host_key())),
            _ => self.root.clone(),
        }
    }

    /// The token its input carries.
    pub fn token(&self) -> Token {
        Token {
            scope: SCOPES[self.scope].into(),
            key: self.journal_key(),
            intent: INTENTS[self.intent].into(),
            root: self.journal_root().unwrap_or_else(|| "-".into()),
        }
    }

    /// For the trace.
    pub fn describe(&self) -> String {
        format!(
            "{} {}/{} {} {}",
            self.kind.name(),
            SCOPES[self.scope],
            self.key,
            INTENTS[self.intent],
            self.root.as_deref().unwrap_or("-")
        )
    }

    /// Replay or conflict, judged against the journal's record of the key.
    pub fn expect(&self, existing: Option<&ExecutionRecord>) -> Expect {
        let Some(record) = existing else {
            return Expect::Fresh;
        };
        let same = record.kind == call_kind(self.kind)
            && record.binding.intent.as_str() == INTENTS[self.intent]
            && record.binding.session_id.as_str() == self.session
            && record.root_key.as_ref().map(|r| r.to_string()) == self.journal_root();
        if same {
            Expect::Replay
        } else {
            Expect::Conflict
        }
    }

    fn request(&self, load_input: InputLoader, cancel: CancellationToken) -> RunRequest {
        RunRequest {
            scope: scope(self.scope),
            session_id: id(&self.session),
            operation_key: self.host_key(),
            input_revision: InputRevision::parse("r-1").unwrap(),
            intent: intent(self.intent),
            load_input,
            cancel,
            limits: Vec::new(),
        }
    }
}

/// The host's loader: counts loads (SC-13: a replay loads nothing) and checks that the claim is
/// durable before any input is loaded (SC-12).
fn loader(shared: &Arc<Shared>, spec: &CallSpec) -> InputLoader {
    let (shared, token, load) = (shared.clone(), spec.token(), spec.load);
    async move {
        let n = shared.count_load(&token.scope, &token.key);
        let what = format!("{}/{}", token.scope, token.key);
        if n > 1 {
            shared.violation(format!("SC-13: input of {what} loaded {n} times"));
        }
        let key = OperationKey::parse(token.key.as_str()).unwrap();
        let scope = tollgate_core::ids::Scope::parse(token.scope.as_str()).unwrap();
        if !matches!(shared.truth.execution(&scope, &key).await, Ok(Some(_))) {
            shared.violation(format!("SC-12: input of {what} loaded before its claim"));
        }
        match load {
            Load::Ok(ms) => {
                if ms > 0 {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Ok(vec![Message::text(Role::User, token.text())])
            }
            Load::Fails => Err("the simulated loader failed".to_string()),
            Load::Invalid => Ok(vec![Message::text(Role::User, "x".repeat(1001))]),
        }
    }
    .boxed()
}

/// A run error's kind, without ids.
pub fn error_kind(e: &RunError) -> String {
    match e {
        RunError::InvalidConfig(_) => "invalid_config".into(),
        RunError::InvalidRequest(_) => "invalid_request".into(),
        RunError::Conflict { fields, .. } => format!("conflict {}", fields.join(",")),
        RunError::CapBlocked(b) => format!("cap_blocked {}", b.window.as_str()),
        RunError::RateLimited(r) => format!("rate_limited {}", r.kind),
        RunError::Store { source, .. } => format!("store {}", super::oracle::err_kind(source)),
        RunError::RootClosed(_) => "root_closed".into(),
        RunError::RootExpired(_) => "root_expired".into(),
        RunError::RootNotFound(_) => "root_not_found".into(),
        RunError::Interrupted { cause, .. } => format!("interrupted {cause:?}"),
    }
}

/// A view's summary, without ids.
pub fn view_summary(view: &View) -> String {
    format!(
        "{:?} {} {}{}",
        view.state,
        view.outcome.map_or("-", |o| o.as_str()),
        view.not_dispatched_cause.map_or("-", |c| c.as_str()),
        if view.replayed { " replayed" } else { "" }
    )
}

fn check_answer(shared: &Shared, spec: &CallSpec, expect: Expect, result: &Result<View, RunError>) {
    match (expect, result) {
        (Expect::Conflict, Ok(view)) => shared.violation(format!(
            "SC-14: conflicting {} answered {}",
            spec.describe(),
            view_summary(view)
        )),
        (Expect::Replay, Ok(view)) if !view.replayed => shared.violation(format!(
            "SC-13: replay of {} answered a fresh {}",
            spec.describe(),
            view_summary(view)
        )),
        _ => {}
    }
}

/// One attempt at `spec` in a process. Starts 5 ms after the driver's step, so that no timer of
/// a call ever fires at the instant the driver acts (see the module docs of `driver`).
pub async fn attempt(
    shared: Arc<Shared>,
    runners: Arc<Runners>,
    spec: CallSpec,
    expect: Expect,
    cancel: CancellationToken,
    label: String,
) {
    tokio::time::sleep(Duration::from_millis(5)).await;
    let load = loader(&shared, &spec);
    let c = spec.consumer;
    let result = match spec.kind {
        Kind::Text => runners.text[c].run(spec.request(load, cancel)).await,
        Kind::Json => runners.json[c].run(spec.request(load, cancel)).await,
        Kind::Structured => runners.structured[c].run(spec.request(load, cancel)).await,
        Kind::Step => {
            let request = StepRequest {
                scope: scope(spec.scope),
                root_key: RootKey::parse(spec.root.clone().unwrap_or_default()).unwrap(),
                operation_key: spec.host_key(),
                load_input: load,
                cancel,
                limits: Vec::new(),
            };
            runners.steps[c].run_step(request).await
        }
    };
    check_answer(&shared, &spec, expect, &result);
    let answer = match &result {
        Ok(view) => view_summary(view),
        Err(e) => error_kind(e),
    };
    shared.trace(format!("{label} {} -> {answer}", spec.describe()));
}
