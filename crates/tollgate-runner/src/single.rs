//! The text/JSON single-call runner (`createSingleCallRunner`, SC-1..SC-73).

use crate::engine::Engine;
use crate::error::RunError;
use crate::outcome::OutputPolicy;
use crate::settings::{InputLoader, JsonValidator, RunnerSettings};
use crate::views;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tollgate_core::config::CallConfig;
use tollgate_core::digest::Binding;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, Scope, SessionId};
use tollgate_core::invalid::InvalidReason;
use tollgate_core::limits::LimitCharge;
use tollgate_core::message::Message;
use tollgate_core::state::CallKind;
use tollgate_core::state::ExecutionState;
use tollgate_core::step::Step;
use tollgate_core::view::{Output, View};
use tollgate_provider::ProviderClient;
use tollgate_store::{ClaimOutcome, Stores};

/// One run.
pub struct RunRequest {
    /// Tenant (from the authenticated principal, never a request body: SC-10).
    pub scope: Scope,
    /// Session.
    pub session_id: SessionId,
    /// Idempotency key.
    pub operation_key: OperationKey,
    /// The host's revision of the input; part of the binding digest.
    pub input_revision: InputRevision,
    /// The caller's declared purpose of the call; part of the binding digest.
    pub intent: Intent,
    /// Lazy input.
    pub load_input: InputLoader,
    /// The caller's signal.
    pub cancel: CancellationToken,
    /// Limits of the caller beside the profile consumer's (an API key's, SC-220).
    pub limits: Vec<LimitCharge>,
}

struct TextPolicy {
    kind: CallKind,
    schema: Option<Arc<jsonschema::Validator>>,
    validate: Option<JsonValidator>,
}

impl OutputPolicy for TextPolicy {
    fn output(&self, step: &Step) -> Result<Output, InvalidReason> {
        if self.kind != CallKind::Json {
            return Ok(Output {
                text: Some(step.text.clone()),
                json: None,
            });
        }
        let json: serde_json::Value =
            serde_json::from_str(&step.text).map_err(|_| InvalidReason::TextMalformed)?;
        let schema_ok = self.schema.as_ref().is_none_or(|s| s.is_valid(&json));
        let host_ok = self.validate.as_ref().is_none_or(|v| v(&json));
        if schema_ok && host_ok {
            Ok(Output {
                text: Some(step.text.clone()),
                json: Some(json),
            })
        } else {
            Err(InvalidReason::TextMalformed)
        }
    }
}

/// The text/JSON single-call runner.
pub struct SingleCallRunner {
    engine: Engine,
}

impl SingleCallRunner {
    /// Builds a runner, checking the snapshot (SC-1..SC-8): a valid text or json config, no tool
    /// choice (SC-8), an explicit single-shot client (SC-7), and a request the client's support
    /// matrix accepts, temperature included (SC-5).
    ///
    /// # Errors
    /// [`RunError::InvalidConfig`] naming the problem.
    pub fn new(
        stores: Arc<dyn Stores>,
        client: Arc<dyn ProviderClient>,
        settings: RunnerSettings,
    ) -> Result<Self, RunError> {
        if !matches!(settings.config.kind, CallKind::Text | CallKind::Json) {
            return Err(RunError::InvalidConfig(format!(
                "a single-call runner cannot run {} calls",
                settings.config.kind
            )));
        }
        let schema = match &settings.config.output {
            Some(contract) => Some(Arc::new(
                jsonschema::validator_for(&contract.schema).map_err(|_| {
                    RunError::InvalidConfig("output schema is not a valid JSON Schema".into())
                })?,
            )),
            None => None,
        };
        let policy = Arc::new(TextPolicy {
            kind: settings.config.kind,
            schema,
            validate: settings.validate.clone(),
        });
        Ok(Self {
            engine: Engine::build(stores, client, settings, policy)?,
        })
    }

    /// The config snapshot.
    pub fn config(&self) -> &CallConfig {
        &self.engine.config
    }

    /// Runs one call.
    ///
    /// # Errors
    /// Conflict (SC-14), cap blocked (SC-16), store failure (SC-17), interruption (SC-60).
    pub async fn run(&self, request: RunRequest) -> Result<View, RunError> {
        self.run_holding(request, None, None).await
    }

    /// Runs one call as [`SingleCallRunner::run`] or, with `input` in hand, as
    /// [`SingleCallRunner::run_inline`], handing the text it answers to `live` as the provider
    /// sends it (SC-213). The answer is the same as theirs; `live` ends once the provider's
    /// stream is read, before the settlement. A replay, a refusal or a call that is not sent
    /// hands `live` nothing.
    ///
    /// # Errors
    /// As [`SingleCallRunner::run`].
    pub async fn run_live(
        &self,
        request: RunRequest,
        input: Option<&[Message]>,
        live: crate::live::LiveSink,
    ) -> Result<View, RunError> {
        self.run_holding(request, input, Some(live)).await
    }

    /// Runs one call whose input is in hand (`input`, what `request.load_input` hands back): the
    /// claim holds that request's own worst case instead of the profile's (SC-120). Input the
    /// loader hands back whose worst case is above that hold is not sent (`not_dispatched`,
    /// cause `invalid`).
    ///
    /// # Errors
    /// As [`SingleCallRunner::run`].
    pub async fn run_inline(
        &self,
        request: RunRequest,
        input: &[Message],
    ) -> Result<View, RunError> {
        self.run_holding(request, Some(input), None).await
    }

    async fn run_holding(
        &self,
        request: RunRequest,
        inline: Option<&[Message]>,
        live: Option<crate::live::LiveSink>,
    ) -> Result<View, RunError> {
        let binding = Binding {
            session_id: request.session_id,
            intent: request.intent,
            input_revision: request.input_revision,
            config: self.engine.config.clone(),
        };
        // Input in hand that passes the checks a loaded input passes (and a caller still
        // waiting): the claim is also the dispatch mark, one commit instead of two (H-14).
        let ready = match inline {
            Some(messages) if !request.cancel.is_cancelled() => {
                self.engine.checked_inline(messages)
            }
            _ => None,
        };
        let claim = Box::pin(self.engine.claim(
            &request.scope,
            &request.operation_key,
            None,
            &binding,
            (inline, ready.is_some()),
            &request.limits,
        ))
        .await?;
        let record = match claim {
            ClaimOutcome::Claimed(record) => record,
            ClaimOutcome::Blocked(blocked) => {
                let currency = self.engine.config.currency.clone();
                return Err(RunError::CapBlocked(blocked.in_currency(currency)));
            }
            ClaimOutcome::Existing(existing) => {
                return self.engine.replay_found(&existing, &binding)
            }
            ClaimOutcome::Limited(refused) => return Err(RunError::RateLimited(refused)),
            // Only a claim under a root is refused by its root; this one has none.
            ClaimOutcome::RootRefused(root) => {
                return Err(RunError::RootClosed(root.root_key.to_string()))
            }
        };
        let read_ms = self.engine.config.run_timeout_ms;
        match ready {
            // Each branch's state on the heap, only the one taken: a call in flight holds it
            // while it waits for its drive.
            Some(provider_request) if record.state == ExecutionState::Dispatched => {
                Box::pin(self.engine.run_dispatched(
                    record,
                    provider_request,
                    request.cancel,
                    read_ms,
                    live,
                ))
                .await
            }
            _ => {
                Box::pin(self.engine.run_claimed(
                    record,
                    request.load_input,
                    request.cancel,
                    read_ms,
                    live,
                ))
                .await
            }
        }
    }

    /// `read(scope, key)` (SC-20..SC-22).
    ///
    /// # Errors
    /// Store failure.
    pub async fn read(&self, scope: &Scope, key: &OperationKey) -> Result<Option<View>, RunError> {
        let ctx = &self.engine.ctx;
        views::read(ctx.stores.as_ref(), scope, key, ctx.clock.now())
            .await
            .map_err(|e| RunError::store(key, e))
    }
}
