//! The governed step runner (`createGovernedStepRunner`, ST-1..ST-35): one structured model
//! response inside a root-fenced operation.

use crate::engine::Engine;
use crate::error::RunError;
use crate::outcome::OutputPolicy;
use crate::settings::{InputLoader, RunnerSettings};
use chrono::Duration as ChronoDuration;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tollgate_core::digest::{Binding, ROOT_BINDING_DOMAIN};
use tollgate_core::ids::{InputRevision, Intent, OperationKey, RootKey, Scope, SessionId};
use tollgate_core::invalid::InvalidReason;
use tollgate_core::limits::LimitCharge;
use tollgate_core::state::CallKind;
use tollgate_core::step::Step;
use tollgate_core::view::{Output, View, ViewState};
use tollgate_provider::ProviderClient;
use tollgate_store::{
    AllStores, ClaimOutcome, ExecutionRecord, OpenRootRequest, Reservation, RootOpen, RootRecord,
    RootState,
};

/// Longest root deadline accepted (a root is a turn, not a session).
pub const ROOT_DEADLINE_MS_MAX: u64 = 24 * 3600 * 1000;

/// Opening a root.
#[derive(Debug, Clone)]
pub struct OpenRoot {
    /// Tenant.
    pub scope: Scope,
    /// The root's key in the scope; reopening it with an equal binding returns it (SR-5).
    pub root_key: RootKey,
    /// Session.
    pub session_id: SessionId,
    /// The declared purpose; part of the root binding, shared by every step under it.
    pub intent: Intent,
    /// Revision of the planned input; part of the root binding, shared by every step under it.
    pub input_revision: InputRevision,
    /// Admission window from now.
    pub deadline_ms: u64,
}

/// One step under a root.
pub struct StepRequest {
    /// Tenant.
    pub scope: Scope,
    /// The root.
    pub root_key: RootKey,
    /// The step's idempotency key.
    pub operation_key: OperationKey,
    /// Lazy, trusted, already-planned input (ST-1).
    pub load_input: InputLoader,
    /// The caller's signal.
    pub cancel: CancellationToken,
    /// Limits of the caller beside the profile consumer's (an API key's, SC-220).
    pub limits: Vec<LimitCharge>,
}

/// Step output: the visible text; the step itself is kept with the result (ST-8).
pub(crate) struct StepPolicy;

impl OutputPolicy for StepPolicy {
    fn output(&self, step: &Step) -> Result<Output, InvalidReason> {
        Ok(Output {
            text: Some(step.text.clone()),
            json: None,
        })
    }

    fn keeps_step(&self) -> bool {
        true
    }
}

/// Runs model steps under operation roots: each send is one governed charge and one root receipt.
pub struct GovernedStepRunner {
    pub(crate) engine: Engine,
    pub(crate) roots: Arc<dyn AllStores>,
}

impl GovernedStepRunner {
    /// Builds the runner: a valid `step` (or `structured`) snapshot whose tools come from the
    /// host-authorized registry (ST-3, TC-1), a tool choice naming one of them and supported by
    /// the client's matrix (TC-2), and an explicit single-shot client (SC-7).
    ///
    /// # Errors
    /// [`RunError::InvalidConfig`].
    pub fn new(
        stores: Arc<dyn AllStores>,
        client: Arc<dyn ProviderClient>,
        settings: RunnerSettings,
    ) -> Result<Self, RunError> {
        if !matches!(settings.config.kind, CallKind::Step | CallKind::Structured) {
            return Err(RunError::InvalidConfig(format!(
                "a step runner cannot run {} calls",
                settings.config.kind
            )));
        }
        let base: Arc<dyn tollgate_store::Stores> = stores.clone();
        Ok(Self {
            engine: Engine::build(base, client, settings, Arc::new(StepPolicy))?,
            roots: stores,
        })
    }

    fn binding(
        &self,
        session_id: SessionId,
        intent: Intent,
        input_revision: InputRevision,
    ) -> Binding {
        Binding {
            session_id,
            intent,
            input_revision,
            config: self.engine.config.clone(),
        }
    }

    /// Opens a root, or returns the existing one when its immutable binding (without deadline)
    /// is the same (SR-5); a different binding is a conflict.
    ///
    /// # Errors
    /// Conflict, invalid deadline, store failure.
    pub async fn open_root(&self, request: OpenRoot) -> Result<RootRecord, RunError> {
        if request.deadline_ms == 0 || request.deadline_ms > ROOT_DEADLINE_MS_MAX {
            return Err(RunError::InvalidRequest(format!(
                "deadline_ms must be between 1 and {ROOT_DEADLINE_MS_MAX}"
            )));
        }
        let now = self.engine.ctx.clock.now();
        let binding = self.binding(request.session_id, request.intent, request.input_revision);
        let key = OperationKey::parse(request.root_key.as_str())
            .map_err(|e| RunError::InvalidRequest(e.to_string()))?;
        let deadline_ms = i64::try_from(request.deadline_ms).unwrap_or(i64::MAX);
        let open = OpenRootRequest {
            scope: request.scope,
            root_key: request.root_key,
            binding: binding.clone(),
            deadline: now + ChronoDuration::milliseconds(deadline_ms),
            now,
        };
        match self
            .roots
            .open_root(open)
            .await
            .map_err(|e| RunError::store(&key, e))?
        {
            RootOpen::Opened(root) => Ok(root),
            RootOpen::Existing(root)
                if root.binding_digest == binding.digest_in(ROOT_BINDING_DOMAIN) =>
            {
                Ok(root)
            }
            RootOpen::Existing(root) => Err(RunError::Conflict {
                operation_key: key,
                fields: root.binding.differing_fields(&binding),
            }),
        }
    }

    /// Runs one step: the root slot is reserved before the child claim, and the claim (with its
    /// audit row) precedes loading the content (ST-5). The claim re-checks the root under its
    /// lock: a reconciled root or one past its deadline takes no claim (ST-36), so a slot left
    /// behind by a failed claim or a crash between the two writes never blocks reconciliation. One send → one governed charge and one
    /// root receipt (ST-6), block caps on the inclusive root cost (ST-7). The run is bounded by
    /// `run_timeout_ms`, the caller's signal and the root's deadline (ST-34).
    ///
    /// # Errors
    /// Root closed / expired / missing, conflict, cap blocked, store failure, interruption.
    pub async fn run_step(&self, request: StepRequest) -> Result<View, RunError> {
        let key = request.operation_key.clone();
        let root = self
            .root_or_missing(&request.scope, &request.root_key, &key)
            .await?;
        let binding = self.binding(
            root.binding.session_id.clone(),
            root.binding.intent.clone(),
            root.binding.input_revision.clone(),
        );
        let stores = &self.engine.ctx.stores;
        // A known key is a replay or a conflict, whatever the root's state now.
        if let Some(existing) = stores
            .execution(&request.scope, &key)
            .await
            .map_err(|e| RunError::store(&key, e))?
        {
            return self.replay(&existing, &request.root_key, &binding).await;
        }
        let now = self.engine.ctx.clock.now();
        match self
            .roots
            .reserve_slot(&request.scope, &request.root_key, now)
            .await
            .map_err(|e| RunError::store(&key, e))?
        {
            Reservation::Reserved(_) => {}
            Reservation::Missing => {
                return Err(RunError::RootNotFound(request.root_key.to_string()))
            }
            Reservation::Refused(r) if r.state == RootState::Closed => {
                return Err(RunError::RootClosed(r.root_key.to_string()))
            }
            Reservation::Refused(r) => return Err(RunError::RootExpired(r.root_key.to_string())),
        }
        let claim = self
            .engine
            .claim(
                &request.scope,
                &key,
                Some(request.root_key.clone()),
                &binding,
                (None, false),
                &request.limits,
            )
            .await;
        let record = match claim? {
            ClaimOutcome::Claimed(record) => record,
            ClaimOutcome::Limited(refused) => {
                self.release(&request.scope, &request.root_key, &key)
                    .await?;
                return Err(RunError::RateLimited(refused));
            }
            ClaimOutcome::Blocked(blocked) => {
                self.release(&request.scope, &request.root_key, &key)
                    .await?;
                let currency = self.engine.config.currency.clone();
                return Err(RunError::CapBlocked(blocked.in_currency(currency)));
            }
            ClaimOutcome::Existing(existing) => {
                self.release(&request.scope, &request.root_key, &key)
                    .await?;
                return self
                    .replay(&existing.execution, &request.root_key, &binding)
                    .await;
            }
            // The root was reconciled or its deadline passed between the reservation and the
            // claim: nothing was written, and the slot is moot — past its deadline a root takes no
            // claim and is reconciled on the calls it has (ST-36).
            ClaimOutcome::RootRefused(r) if r.state == RootState::Closed && now < r.deadline => {
                return Err(RunError::RootClosed(r.root_key.to_string()))
            }
            ClaimOutcome::RootRefused(r) => {
                return Err(RunError::RootExpired(r.root_key.to_string()))
            }
        };
        let until_deadline = (root.deadline - now).num_milliseconds().max(1);
        let read_ms = self
            .engine
            .config
            .run_timeout_ms
            .min(u64::try_from(until_deadline).unwrap_or(u64::MAX));
        let view = self
            .engine
            .run_claimed(record, request.load_input, request.cancel, read_ms, None)
            .await?;
        self.with_root_receipt(view).await
    }

    async fn release(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        key: &OperationKey,
    ) -> Result<(), RunError> {
        self.roots
            .release_slot(scope, root_key, self.engine.ctx.clock.now())
            .await
            .map_err(|e| RunError::store(key, e))
    }

    async fn root_or_missing(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        key: &OperationKey,
    ) -> Result<RootRecord, RunError> {
        self.roots
            .root(scope, root_key)
            .await
            .map_err(|e| RunError::store(key, e))?
            .ok_or_else(|| RunError::RootNotFound(root_key.to_string()))
    }

    async fn replay(
        &self,
        existing: &ExecutionRecord,
        root_key: &RootKey,
        binding: &Binding,
    ) -> Result<View, RunError> {
        if existing.root_key.as_ref() != Some(root_key) {
            return Err(RunError::Conflict {
                operation_key: existing.operation_key.clone(),
                fields: vec!["root_key".into()],
            });
        }
        let view = self.engine.replay(existing, binding).await?;
        self.with_root_receipt(view).await
    }

    /// Adds the root receipt. `completed` requires both receipts (ST-31): a completed call under
    /// a root without its root receipt reads `reconciliation_required`.
    pub(crate) async fn with_root_receipt(&self, mut view: View) -> Result<View, RunError> {
        let Some(execution_id) = view.execution_id else {
            return Ok(view);
        };
        let receipt = self
            .roots
            .root_receipt(execution_id)
            .await
            .map_err(|e| RunError::store(&view.operation_key, e))?;
        match (receipt, &view.receipt) {
            (Some(root), Some(charge)) => {
                view.root_receipt = Some(tollgate_core::view::Receipt {
                    amount: root.amount,
                    ..charge.clone()
                });
            }
            _ if view.state == ViewState::Completed => {
                view.state = ViewState::ReconciliationRequired;
            }
            _ => {}
        }
        Ok(view)
    }

    /// `read({scope, root_key, operation_key})`: the step's view, bound to its root (ST-30); a
    /// key under another root reads as nothing.
    ///
    /// # Errors
    /// Store failure.
    pub async fn read(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        key: &OperationKey,
    ) -> Result<Option<View>, RunError> {
        let Some(record) = self
            .engine
            .ctx
            .stores
            .execution(scope, key)
            .await
            .map_err(|e| RunError::store(key, e))?
            .filter(|r| r.root_key.as_ref() == Some(root_key))
        else {
            return Ok(None);
        };
        let view = self.engine.view(&record).await?;
        self.with_root_receipt(view).await.map(Some)
    }

    /// `recover(key, {lease_ms})` bound to the call's registered root (ST-30, ST-32): nothing is
    /// sent and no input is loaded; a key under another root is not recovered. A completed call
    /// whose root receipt is missing has it repaired from its governed charge (ST-31).
    ///
    /// # Errors
    /// Store failure.
    pub async fn recover(
        &self,
        reconciler: &crate::recovery::Reconciler,
        scope: &Scope,
        root_key: &RootKey,
        key: &OperationKey,
        lease_ms: u64,
    ) -> Result<Option<View>, RunError> {
        let store_error = |e| RunError::store(key, e);
        let Some(record) = self
            .engine
            .ctx
            .stores
            .execution(scope, key)
            .await
            .map_err(store_error)?
            .filter(|r| r.root_key.as_ref() == Some(root_key))
        else {
            return Ok(None);
        };
        if record.state == tollgate_core::state::ExecutionState::Completed {
            let now = self.engine.ctx.clock.now();
            self.roots
                .repair_root_receipt(scope, record.id, now)
                .await
                .map_err(store_error)?;
        } else {
            reconciler
                .recover(scope, key, lease_ms)
                .await
                .map_err(store_error)?;
        }
        self.read(scope, root_key, key).await
    }

    /// Closes a root: no new admissions; reserved calls go on (ST-33).
    ///
    /// # Errors
    /// Store failure.
    pub async fn close_root(
        &self,
        scope: &Scope,
        root_key: &RootKey,
    ) -> Result<Option<RootRecord>, RunError> {
        self.roots
            .close_root(scope, root_key, self.engine.ctx.clock.now())
            .await
            .map_err(|e| root_error(root_key, e))
    }

    /// Reads a root.
    ///
    /// # Errors
    /// Store failure.
    pub async fn root(
        &self,
        scope: &Scope,
        root_key: &RootKey,
    ) -> Result<Option<RootRecord>, RunError> {
        self.roots
            .root(scope, root_key)
            .await
            .map_err(|e| root_error(root_key, e))
    }
}

/// A store failure on a root, reported under the root key (root keys are valid operation keys;
/// read as stored, since the key may come from a row written under an older identifier rule).
fn root_error(root_key: &RootKey, error: tollgate_store::StoreError) -> RunError {
    match OperationKey::from_stored(root_key.as_str()) {
        Ok(key) => RunError::store(&key, error),
        Err(_) => RunError::InvalidRequest(format!("root {root_key}: {error}")),
    }
}

/// `isStepInterruption(error)` (ST-35, spec: call-retry): true only for this runner's own
/// interruption — its timeout, its deadline, or its caller's signal — never for a store failure or
/// a stream failure.
pub fn is_step_interruption(error: &RunError) -> bool {
    error.is_interruption()
}
