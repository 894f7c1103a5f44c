//! The structured single-call runner (`createStructuredCallRunner`, SR-1..SR-11): the text
//! runner's call shape for forced-tool extraction, running one governed step inside a root it
//! owns.

use crate::error::RunError;
use crate::outcome::{REFUSAL_STOPS, TRUNCATION_STOPS};
use crate::recovery::{Reconciler, UsageCounts};
use crate::settings::{BackgroundErrorFn, BackgroundFailure, RunnerSettings};
use crate::single::RunRequest;
use crate::step::{GovernedStepRunner, OpenRoot, StepRequest};
use crate::views;
use std::sync::Arc;
use tollgate_core::caps::CurrencySpend;
use tollgate_core::digest::domain_digest;
use tollgate_core::ids::{OperationKey, RootKey, Scope, SessionId};
use tollgate_core::state::{CallKind, Outcome};
use tollgate_core::step::ToolCall;
use tollgate_core::view::{View, ViewState};
use tollgate_provider::ProviderClient;
use tollgate_store::{AllStores, RootState, StoreError};

/// The reserved prefix of every identifier this runner derives (SR-4).
pub const STRUCTURED_PREFIX: &str = "alma-structured-v1";
/// How long past `run_timeout_ms` the owned root admits its one call.
pub const ROOT_DEADLINE_SLACK_MS: u64 = 60_000;

/// `alma-structured-v1:<kind>:<sha256>`: bound to scope and host key, domain-separated by kind,
/// never embedding the key (SR-4).
pub fn derived_id(kind: &str, scope: &Scope, key: &OperationKey) -> String {
    let domain = format!("{STRUCTURED_PREFIX}:{kind}");
    let digest = domain_digest(
        &domain,
        &[scope.as_str().as_bytes(), key.as_str().as_bytes()],
    );
    format!("{domain}:{}", digest.to_hex())
}

fn derived_keys(scope: &Scope, key: &OperationKey) -> Result<(RootKey, OperationKey), RunError> {
    let invalid = |e: tollgate_core::ids::IdError| RunError::InvalidRequest(e.to_string());
    Ok((
        RootKey::parse(derived_id("root", scope, key)).map_err(invalid)?,
        OperationKey::parse(derived_id("call", scope, key)).map_err(invalid)?,
    ))
}

/// The structured single-call runner.
pub struct StructuredCallRunner {
    steps: GovernedStepRunner,
    background_error: Option<BackgroundErrorFn>,
}

impl StructuredCallRunner {
    /// Builds the runner (SR-2): the text runner's config without `output`, plus trusted registry
    /// tools (validated and copied into the snapshot here) and an optional tool choice.
    ///
    /// # Errors
    /// [`RunError::InvalidConfig`].
    pub fn new(
        stores: Arc<dyn AllStores>,
        client: Arc<dyn ProviderClient>,
        settings: RunnerSettings,
    ) -> Result<Self, RunError> {
        if settings.config.kind != CallKind::Structured {
            return Err(RunError::InvalidConfig(format!(
                "a structured runner cannot run {} calls",
                settings.config.kind
            )));
        }
        if settings.config.tools.is_empty() {
            return Err(RunError::InvalidConfig(
                "structured calls need registry tools".into(),
            ));
        }
        let background_error = settings.background_error.clone();
        Ok(Self {
            steps: GovernedStepRunner::new(stores, client, settings)?,
            background_error,
        })
    }

    /// Runs the call (SR-1): preflight before any root exists (SR-6), the owned root opened or
    /// matched by its immutable binding (SR-5), one governed step, then the root closed as
    /// independent housekeeping (SR-8). The answer is the unmodified step view (SR-7) under the
    /// host's key.
    ///
    /// # Errors
    /// Conflict, cap blocked, store failure, interruption.
    pub async fn run(&self, request: RunRequest) -> Result<View, RunError> {
        let (root_key, call_key) = derived_keys(&request.scope, &request.operation_key)?;
        let engine = &self.steps.engine;
        let existing = self
            .steps
            .roots
            .root(&request.scope, &root_key)
            .await
            .map_err(|e| RunError::store(&request.operation_key, e))?;
        if existing.is_none() {
            self.preflight(&request.scope, &request.session_id, &request.operation_key)
                .await?;
        }
        let deadline_ms = engine.config.run_timeout_ms + ROOT_DEADLINE_SLACK_MS;
        self.steps
            .open_root(OpenRoot {
                scope: request.scope.clone(),
                root_key: root_key.clone(),
                session_id: request.session_id,
                intent: request.intent,
                input_revision: request.input_revision,
                deadline_ms,
            })
            .await
            .map_err(|e| with_host_key(e, &request.operation_key))?;
        let result = self
            .steps
            .run_step(StepRequest {
                scope: request.scope.clone(),
                root_key: root_key.clone(),
                operation_key: call_key,
                load_input: request.load_input,
                cancel: request.cancel,
                limits: Vec::new(),
            })
            .await;
        self.close_quietly(&request.scope, &root_key, &request.operation_key)
            .await;
        let mut view = result.map_err(|e| with_host_key(e, &request.operation_key))?;
        view.operation_key = request.operation_key;
        Ok(view)
    }

    /// The session and daily block caps, checked against settled + held spend before any root
    /// exists, so a call the caps refuse leaves no root behind (SR-6). The claim checks again,
    /// atomically with its hold.
    async fn preflight(
        &self,
        scope: &Scope,
        session_id: &SessionId,
        key: &OperationKey,
    ) -> Result<(), RunError> {
        let engine = &self.steps.engine;
        let config = &engine.config;
        let stores = &engine.ctx.stores;
        let day = engine.ctx.clock.now().date_naive();
        // Caps and spend rows are in the snapshot's currency (SC-105).
        let currency = &config.currency;
        let session = stores
            .session_spend(scope, &config.consumer, session_id, currency)
            .await
            .map_err(|e| RunError::store(key, e))?;
        let daily = stores
            .daily_spend(scope, &config.consumer, day, currency)
            .await
            .map_err(|e| RunError::store(key, e))?;
        let hold = config
            .worst_case_hold()
            .map_err(|e| RunError::InvalidConfig(e.to_string()))?;
        config
            .caps
            .admit(
                currency,
                &CurrencySpend::new(currency.clone(), session),
                &CurrencySpend::new(currency.clone(), daily),
                hold,
            )
            .map_err(|e| RunError::InvalidConfig(e.to_string()))?
            .map_err(RunError::CapBlocked)
    }

    /// Closes the root as housekeeping: a failed close never hides a completed result, since the
    /// unclosed root expires and is reconciled anyway (SR-8). The failure is reported as metadata.
    async fn close_quietly(&self, scope: &Scope, root_key: &RootKey, key: &OperationKey) {
        if let Err(e) = self.steps.close_root(scope, root_key).await {
            if let Some(report) = &self.background_error {
                report(BackgroundFailure {
                    operation_key: key.to_string(),
                    stage: "close_root",
                    error: e.to_string(),
                });
            }
        }
    }

    /// `read(scope, key)` (SR-7..SR-9): the step view when the call has a journal record;
    /// otherwise the root decides, read under its lock: none → nothing; active → `in_progress`
    /// whatever the clock says; reconciled → `not_dispatched` (no call can land under it any more,
    /// ST-36); closed or expired with reserved calls → `reconciliation_required`; with zero
    /// reserved calls → `not_dispatched` with no record and no cause (SC-32).
    ///
    /// # Errors
    /// Store failure.
    pub async fn read(&self, scope: &Scope, key: &OperationKey) -> Result<Option<View>, RunError> {
        let (root_key, call_key) = derived_keys(scope, key)?;
        if let Some(mut view) = self.steps.read(scope, &root_key, &call_key).await? {
            view.operation_key = key.clone();
            return Ok(Some(view));
        }
        let Some(root) = self.steps.root(scope, &root_key).await? else {
            return Ok(None);
        };
        let state = match root.state {
            RootState::Active => ViewState::InProgress,
            // Reconciled: no call can be claimed under it any more (ST-36). Its call, if any,
            // was claimed before it was reconciled; without one, a slot it still counts stood for
            // a claim that never landed.
            RootState::Reconciled => {
                if let Some(mut view) = self.steps.read(scope, &root_key, &call_key).await? {
                    view.operation_key = key.clone();
                    return Ok(Some(view));
                }
                ViewState::NotDispatched
            }
            _ if root.reserved_calls > 0 => ViewState::ReconciliationRequired,
            _ => ViewState::NotDispatched,
        };
        Ok(Some(views::bare(key.clone(), state)))
    }

    /// `recover(scope, key, {lease_ms})` with the host key (SR-11).
    ///
    /// # Errors
    /// Store failure.
    pub async fn recover(
        &self,
        reconciler: &Reconciler,
        scope: &Scope,
        key: &OperationKey,
        lease_ms: u64,
    ) -> Result<Option<View>, RunError> {
        let (root_key, call_key) = derived_keys(scope, key)?;
        self.steps
            .recover(reconciler, scope, &root_key, &call_key, lease_ms)
            .await
            .map_err(|e| with_host_key(e, key))?;
        self.read(scope, key).await
    }

    /// `reconcile_usage(scope, key, query)` with the host key (SR-11): only this call's evidence.
    ///
    /// # Errors
    /// Store failure.
    pub async fn reconcile_usage(
        &self,
        reconciler: &Reconciler,
        scope: &Scope,
        key: &OperationKey,
        limit: Option<u32>,
        after: Option<i64>,
    ) -> Result<UsageCounts, StoreError> {
        let (_, call_key) =
            derived_keys(scope, key).map_err(|e| StoreError::NotFound(e.to_string()))?;
        let others = move |k: &OperationKey| k != &call_key;
        reconciler
            .reconcile_usage(scope, limit, after, &others)
            .await
    }
}

/// The one valid extraction of a completed view (TC-6): outcome `success`, a stop that is neither
/// a refusal nor a truncation, exactly the expected tool name, arguments that parsed. Refusals,
/// truncation, unavailable output and malformed arguments are never a valid extraction. The caller
/// still validates the arguments against its business schema.
pub fn valid_extraction<'a>(view: &'a View, tool: &str) -> Option<&'a ToolCall> {
    if view.state != ViewState::Completed || view.outcome != Some(Outcome::Success) {
        return None;
    }
    let step = view.step.as_ref()?;
    let stop = step.stop.as_deref()?;
    if REFUSAL_STOPS.contains(&stop) || TRUNCATION_STOPS.contains(&stop) {
        return None;
    }
    let mut calls = step.tool_calls.iter().filter(|c| c.name == tool);
    let call = calls.next()?;
    if calls.next().is_some() || call.malformed {
        return None;
    }
    Some(call)
}

fn with_host_key(error: RunError, key: &OperationKey) -> RunError {
    match error {
        RunError::Conflict { fields, .. } => RunError::Conflict {
            operation_key: key.clone(),
            fields,
        },
        RunError::Store { source, .. } => RunError::Store {
            operation_key: key.clone(),
            source,
        },
        RunError::Interrupted { cause, .. } => RunError::Interrupted {
            operation_key: key.clone(),
            cause,
        },
        other => other,
    }
}
