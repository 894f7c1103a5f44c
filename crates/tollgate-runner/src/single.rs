//! The text/JSON single-call runner (`createSingleCallRunner`, SC-1..SC-73).

use crate::clock::{Clock, SystemClock};
use crate::drive::{drive, BackgroundErrorFn, BackgroundFailure, Ctx};
use crate::error::{Interruption, RunError};
use crate::input::{check_input, probe_request, provider_request};
use crate::outcome::OutputPolicy;
use crate::views;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_core::config::CallConfig;
use tollgate_core::digest::Binding;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, Scope, SessionId};
use tollgate_core::invalid::InvalidReason;
use tollgate_core::message::Message;
use tollgate_core::state::{CallKind, NotDispatchedCause};
use tollgate_core::step::Step;
use tollgate_core::view::{Output, View};
use tollgate_provider::ProviderClient;
use tollgate_store::{ClaimOutcome, ClaimRequest, ExecutionRecord, Stores};

/// Default fence lease of a claimed execution.
pub const LEASE_MS_DEFAULT: u64 = 30_000;
/// Slack the caller waits past `run_timeout_ms` for the drive to record its outcome.
const FINISH_SLACK_MS: u64 = 5_000;

/// The host's synchronous JSON validator (SC-4).
pub type JsonValidator = Arc<dyn Fn(&serde_json::Value) -> bool + Send + Sync>;

/// Loads input lazily, after the claim (SC-11, SC-12).
pub type InputLoader = BoxFuture<'static, Result<Vec<Message>, String>>;

/// Everything a runner is built from.
pub struct RunnerSettings {
    /// The immutable config snapshot.
    pub config: CallConfig,
    /// Fence lease.
    pub lease_ms: u64,
    /// Host validator for JSON output (json calls).
    pub validate: Option<JsonValidator>,
    /// Metadata-only failures of background work.
    pub background_error: Option<BackgroundErrorFn>,
    /// Clock.
    pub clock: Arc<dyn Clock>,
}

impl RunnerSettings {
    /// Settings with defaults for everything but the config.
    pub fn new(config: CallConfig) -> Self {
        Self {
            config,
            lease_ms: LEASE_MS_DEFAULT,
            validate: None,
            background_error: None,
            clock: Arc::new(SystemClock),
        }
    }
}

/// One run.
pub struct RunRequest {
    /// Tenant (from the authenticated principal, never a request body: SC-10).
    pub scope: Scope,
    /// Session.
    pub session_id: SessionId,
    /// Idempotency key.
    pub operation_key: OperationKey,
    /// Input revision.
    pub input_revision: InputRevision,
    /// Intent.
    pub intent: Intent,
    /// Lazy input.
    pub load_input: InputLoader,
    /// The caller's signal.
    pub cancel: CancellationToken,
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
    ctx: Ctx,
    config: CallConfig,
    lease_ms: u64,
    policy: Arc<dyn OutputPolicy>,
    background_error: Option<BackgroundErrorFn>,
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
        let config = settings.config;
        let invalid = |m: String| RunError::InvalidConfig(m);
        if !matches!(config.kind, CallKind::Text | CallKind::Json) {
            return Err(invalid(format!(
                "a single-call runner cannot run {} calls",
                config.kind
            )));
        }
        config.validate().map_err(|e| invalid(e.to_string()))?;
        if !client.descriptor().is_single_shot() {
            return Err(invalid(
                "the provider client must be single-shot (one attempt, no fallback)".into(),
            ));
        }
        client
            .check(&probe_request(&config))
            .map_err(|e| invalid(e.to_string()))?;
        let schema = match &config.output {
            Some(contract) => Some(Arc::new(
                jsonschema::validator_for(&contract.schema)
                    .map_err(|_| invalid("output schema is not a valid JSON Schema".into()))?,
            )),
            None => None,
        };
        config
            .worst_case_hold()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            policy: Arc::new(TextPolicy {
                kind: config.kind,
                schema,
                validate: settings.validate,
            }),
            ctx: Ctx {
                stores,
                client,
                clock: settings.clock,
            },
            config,
            lease_ms: settings.lease_ms,
            background_error: settings.background_error,
        })
    }

    /// The config snapshot.
    pub fn config(&self) -> &CallConfig {
        &self.config
    }

    /// Runs one call.
    ///
    /// # Errors
    /// Conflict (SC-14), cap blocked (SC-16), store failure (SC-17), interruption (SC-60).
    pub async fn run(&self, request: RunRequest) -> Result<View, RunError> {
        let key = request.operation_key.clone();
        let binding = Binding {
            session_id: request.session_id,
            intent: request.intent,
            input_revision: request.input_revision,
            config: self.config.clone(),
        };
        let hold = self
            .config
            .worst_case_hold()
            .map_err(|e| RunError::InvalidConfig(e.to_string()))?;
        let claim = ClaimRequest {
            scope: request.scope.clone(),
            operation_key: key.clone(),
            root_key: None,
            binding: binding.clone(),
            hold,
            now: self.ctx.clock.now(),
            lease_ms: self.lease_ms,
        };
        let stores = &self.ctx.stores;
        let record = match stores
            .claim(claim)
            .await
            .map_err(|e| RunError::store(&key, e))?
        {
            ClaimOutcome::Claimed(record) => record,
            ClaimOutcome::Blocked(blocked) => return Err(RunError::CapBlocked(blocked)),
            ClaimOutcome::Existing(existing) => return self.replay(&existing, &binding).await,
        };
        self.run_claimed(record, request.load_input, request.cancel)
            .await
    }

    /// SC-13 / SC-14: same binding → the stored view, loading and sending nothing; different →
    /// conflict naming the fields.
    async fn replay(
        &self,
        existing: &ExecutionRecord,
        binding: &Binding,
    ) -> Result<View, RunError> {
        if existing.binding_digest != binding.digest() {
            return Err(RunError::Conflict {
                operation_key: existing.operation_key.clone(),
                fields: existing.binding.differing_fields(binding),
            });
        }
        let mut view = views::view_of(self.ctx.stores.as_ref(), existing, self.ctx.clock.now())
            .await
            .map_err(|e| RunError::store(&existing.operation_key, e))?;
        view.replayed = true;
        Ok(view)
    }

    async fn not_dispatched(
        &self,
        record: &ExecutionRecord,
        cause: NotDispatchedCause,
    ) -> Result<View, RunError> {
        let key = &record.operation_key;
        let stored = self
            .ctx
            .stores
            .mark_not_dispatched(record.fence(), cause, self.ctx.clock.now())
            .await
            .map_err(|e| RunError::store(key, e))?;
        views::view_of(self.ctx.stores.as_ref(), &stored, self.ctx.clock.now())
            .await
            .map_err(|e| RunError::store(key, e))
    }

    async fn run_claimed(
        &self,
        record: ExecutionRecord,
        load_input: InputLoader,
        cancel: CancellationToken,
    ) -> Result<View, RunError> {
        let key = record.operation_key.clone();
        if cancel.is_cancelled() {
            return self
                .not_dispatched(&record, NotDispatchedCause::Aborted)
                .await;
        }
        let messages = tokio::select! {
            loaded = load_input => loaded,
            _ = cancel.cancelled() => {
                return self.not_dispatched(&record, NotDispatchedCause::Aborted).await;
            }
        };
        let Ok(messages) = messages else {
            return self
                .not_dispatched(&record, NotDispatchedCause::Input)
                .await;
        };
        if check_input(&self.config, &messages).is_err() {
            return self
                .not_dispatched(&record, NotDispatchedCause::Invalid)
                .await;
        }
        let request = provider_request(&self.config, messages);
        if self.ctx.client.check(&request).is_err() {
            return self
                .not_dispatched(&record, NotDispatchedCause::Invalid)
                .await;
        }
        if cancel.is_cancelled() {
            return self
                .not_dispatched(&record, NotDispatchedCause::Aborted)
                .await;
        }
        let dispatched = match self
            .ctx
            .stores
            .mark_dispatched(record.fence(), self.ctx.clock.now())
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // Still prepared: try to record why it never went out; either way, nothing was
                // sent, and an unfinished claim expires into not_dispatched(expired).
                let _ = self
                    .ctx
                    .stores
                    .mark_not_dispatched(
                        record.fence(),
                        NotDispatchedCause::Store,
                        self.ctx.clock.now(),
                    )
                    .await;
                return Err(RunError::store(&key, e));
            }
        };
        let invalid_reason = self
            .drive_in_background(dispatched, request, cancel)
            .await?;
        let mut view = views::read(
            self.ctx.stores.as_ref(),
            &record.scope,
            &key,
            self.ctx.clock.now(),
        )
        .await
        .map_err(|e| RunError::store(&key, e))?
        .ok_or_else(|| {
            RunError::store(&key, tollgate_store::StoreError::NotFound(key.to_string()))
        })?;
        view.invalid_reason = invalid_reason;
        Ok(view)
    }

    /// Runs the drive as its own task, so that a caller who stops waiting (abort) does not stop
    /// the stream: it is drained to its end or its run timeout, and its evidence settles the call
    /// (SC-60). Failures in the background are reported as metadata only.
    async fn drive_in_background(
        &self,
        record: ExecutionRecord,
        request: tollgate_provider::ProviderRequest,
        cancel: CancellationToken,
    ) -> Result<Option<InvalidReason>, RunError> {
        let key = record.operation_key.clone();
        let wait_ms = record.binding.config.run_timeout_ms + FINISH_SLACK_MS;
        let report = self.background_error.clone();
        let report_key = key.to_string();
        let mut task = tokio::spawn(drive(
            self.ctx.clone(),
            record,
            request,
            Arc::clone(&self.policy),
        ));
        let interrupted = |cause| RunError::Interrupted {
            operation_key: key.clone(),
            cause,
        };
        tokio::select! {
            joined = &mut task => joined.map_err(|_| interrupted(Interruption::Aborted))?,
            _ = cancel.cancelled() => {
                tokio::spawn(report_when_done(task, report, report_key));
                Err(interrupted(Interruption::Aborted))
            }
            _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {
                tokio::spawn(report_when_done(task, report, report_key));
                Err(interrupted(Interruption::Timeout))
            }
        }
    }

    /// `read(scope, key)` (SC-20..SC-22).
    ///
    /// # Errors
    /// Store failure.
    pub async fn read(&self, scope: &Scope, key: &OperationKey) -> Result<Option<View>, RunError> {
        views::read(self.ctx.stores.as_ref(), scope, key, self.ctx.clock.now())
            .await
            .map_err(|e| RunError::store(key, e))
    }
}

async fn report_when_done(
    task: tokio::task::JoinHandle<Result<Option<InvalidReason>, RunError>>,
    report: Option<BackgroundErrorFn>,
    operation_key: String,
) {
    let failure = match task.await {
        Ok(Ok(_)) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "background drain task failed".to_string(),
    };
    if let Some(report) = report {
        report(BackgroundFailure {
            operation_key,
            stage: "drain",
            error: failure,
        });
    }
}
