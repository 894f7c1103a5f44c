//! The engine every runner shares: the claim, replay and conflict, the input checks and the
//! not-dispatched causes, the dispatch mark, the drive in its own task, and reading back.

use crate::drive::{drive, Ctx, Driven};
use crate::error::{Interruption, RunError};
use crate::input::{check_input, probe_request, provider_request};
use crate::lease::Heartbeat;
use crate::live::LiveSink;
use crate::outcome::OutputPolicy;
use crate::retry::Retry;
use crate::settings::{BackgroundErrorFn, BackgroundFailure, InputLoader, RunnerSettings};
use crate::views;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_core::config::CallConfig;
use tollgate_core::digest::{canonical_json, Binding, Digest256};
use tollgate_core::hold::{fitted_hold, request_input_tokens_bound, HoldError};
use tollgate_core::ids::{OperationKey, RootKey, Scope};
use tollgate_core::limits::{ClaimLimits, LimitCharge, LimitSubject, LimitTokens, RateLimits};
use tollgate_core::message::Message;
use tollgate_core::money::Money;
use tollgate_core::state::NotDispatchedCause;
use tollgate_core::view::View;
use tollgate_provider::{ProviderClient, ProviderRequest};
use tollgate_store::{
    ClaimOutcome, ClaimRequest, ExecutionRecord, ExecutionView, StoreError, Stores,
};
use tracing::Instrument;

/// Slack the caller waits past the read bound for the drive to record its outcome.
const FINISH_SLACK_MS: u64 = 5_000;

/// Same binding: a replay; another: a conflict naming the differing fields (SC-13, SC-14).
fn check_binding(
    existing: &ExecutionRecord,
    binding: &Binding,
    digest: Digest256,
) -> Result<(), RunError> {
    if existing.binding_digest != digest {
        return Err(RunError::Conflict {
            operation_key: existing.operation_key.clone(),
            fields: existing.binding.differing_fields(binding),
        });
    }
    Ok(())
}

/// Shared runner machinery.
pub(crate) struct Engine {
    pub ctx: Ctx,
    pub config: CallConfig,
    /// The canonical JSON of `config`, so that a binding of it is digested without serializing
    /// the snapshot again for every call (H-24).
    config_canonical: String,
    pub lease_ms: u64,
    pub policy: Arc<dyn OutputPolicy>,
    pub background_error: Option<BackgroundErrorFn>,
    /// Where the drives run, so that a host can wait for them on shutdown.
    pub drives: TaskTracker,
    /// The profile consumer's limits (SC-220).
    pub limits: RateLimits,
}

impl Engine {
    /// Checks a snapshot and a client and builds the engine: the snapshot must be valid (SC-8), the
    /// client single-shot, since a retry or a fallback would send a call twice (SC-7), and the
    /// client's support matrix must accept the snapshot's request, so that nothing it cannot send
    /// is ever claimed (SC-5, TC-2).
    pub fn build(
        stores: Arc<dyn Stores>,
        client: Arc<dyn ProviderClient>,
        settings: RunnerSettings,
        policy: Arc<dyn OutputPolicy>,
    ) -> Result<Self, RunError> {
        let config = settings.config;
        let invalid = |m: String| RunError::InvalidConfig(m);
        config.validate().map_err(|e| invalid(e.to_string()))?;
        if !client.descriptor().is_single_shot() {
            return Err(invalid(
                "the provider client must be single-shot (one attempt, no fallback)".into(),
            ));
        }
        client
            .check(&probe_request(&config))
            .map_err(|e| invalid(e.to_string()))?;
        config
            .worst_case_hold()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            ctx: Ctx {
                stores,
                client,
                clock: settings.clock,
                settle_retry_ms: settings.settle_retry_ms,
            },
            config_canonical: canonical_json(&serde_json::to_value(&config).map_err(|e| {
                RunError::InvalidConfig(format!("the snapshot does not serialize: {e}"))
            })?),
            config,
            lease_ms: settings.lease_ms,
            policy,
            background_error: settings.background_error,
            drives: settings.drives,
            limits: settings.limits,
        })
    }

    /// The digest of `binding`; from the engine's canonical snapshot when `binding` carries the
    /// engine's own snapshot, which saves serializing it again (H-24).
    fn digest_of(&self, binding: &Binding) -> Digest256 {
        if binding.config == self.config {
            binding.digest_with(&self.config_canonical)
        } else {
            binding.digest()
        }
    }

    /// Claims `(scope, key)` for `binding` (SC-12, SC-16), holding the worst case of `inline`
    /// when the input is in hand (SC-120), else the snapshot's worst case. With `dispatch`, the
    /// claim is also the dispatch mark, one commit instead of two (H-14): only for input in hand
    /// that [`Engine::checked_inline`] passed, because input that fails its checks must end
    /// `not_dispatched`.
    pub async fn claim(
        &self,
        scope: &Scope,
        key: &OperationKey,
        root_key: Option<RootKey>,
        binding: &Binding,
        (inline, dispatch): (Option<&[Message]>, bool),
        caller_limits: &[LimitCharge],
    ) -> Result<ClaimOutcome, RunError> {
        // Input in hand whose bound the profile does not cover is claimed at the profile's worst
        // case and refused before any send, as a loaded input would be (SC-207).
        let hold = match inline.map(|messages| fitted_hold(&self.config, messages)) {
            Some(Ok(hold)) => Ok(hold),
            Some(Err(HoldError::Money(e))) => Err(e),
            Some(Err(HoldError::AboveProfile)) | None => self.config.worst_case_hold(),
        }
        .map_err(|e| RunError::InvalidConfig(e.to_string()))?;
        let lease_ms = self.claim_lease_ms();
        let limits = self.claim_limits(inline, caller_limits);
        let claim = ClaimRequest {
            scope: scope.clone(),
            operation_key: key.clone(),
            root_key,
            binding: binding.clone(),
            binding_digest: Some(self.digest_of(binding)),
            hold,
            now: self.ctx.clock.now(),
            lease_ms,
            dispatch: dispatch && inline.is_some(),
            limits,
        };
        self.ctx
            .stores
            .claim(claim)
            .await
            .map_err(|e| RunError::store(key, e))
    }

    /// The limits a claim is admitted under: the profile consumer's, then the caller's, each
    /// with a limit set; the tokens are the fitted worst case the hold is computed from (the
    /// request in hand's input bound when it is within the profile's, else the profile's, and
    /// `max_tokens`), so that token limits count what the hold counts (SC-221).
    fn claim_limits(&self, inline: Option<&[Message]>, caller: &[LimitCharge]) -> ClaimLimits {
        let consumer = (!self.limits.is_empty()).then(|| LimitCharge {
            subject: LimitSubject::Consumer(self.config.consumer.clone()),
            limits: self.limits,
        });
        let charges: Vec<LimitCharge> = consumer
            .into_iter()
            .chain(caller.iter().filter(|c| !c.limits.is_empty()).cloned())
            .collect();
        if charges.is_empty() {
            return ClaimLimits::default();
        }
        let (profile_input, output) = self.config.worst_case_usage();
        let input = inline
            .map(|messages| request_input_tokens_bound(&self.config, messages))
            .filter(|bound| *bound <= profile_input)
            .unwrap_or(profile_input);
        ClaimLimits {
            charges,
            tokens: LimitTokens { input, output },
        }
    }

    /// Input in hand, checked as a loaded input is (input checks, the client's own check): the
    /// request to send, or `None` when it would not be sent (then the claim takes the usual
    /// path, which records why).
    pub fn checked_inline(&self, messages: &[Message]) -> Option<ProviderRequest> {
        check_input(&self.config, messages).ok()?;
        let request = provider_request(&self.config, messages.to_vec());
        self.ctx.client.check(&request).ok()?;
        Some(request)
    }

    /// The lease a claim takes and every renewal extends it by: the runner's `lease_ms`. It
    /// does not depend on the run timeout: the heartbeat (`crate::lease`) renews it from the
    /// claim to the call's last write, so a live call keeps it however long it runs, and a dead
    /// process's calls are free after one lease (SC-205).
    fn claim_lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// Starts renewing a fresh claim's lease, so that recovery takes the fence only once this
    /// process stops renewing (SC-100); it renews until dropped.
    fn heartbeat(&self, record: &ExecutionRecord) -> Heartbeat {
        Heartbeat::start(
            Arc::clone(&self.ctx.stores),
            Arc::clone(&self.ctx.clock),
            record.fence(),
            self.claim_lease_ms(),
            record.operation_key.clone(),
        )
    }

    /// A key that already has a row: the same binding is a replay, answered with the stored view,
    /// loading and sending nothing (SC-13); a different one is a conflict naming the fields
    /// (SC-14).
    pub async fn replay(
        &self,
        existing: &ExecutionRecord,
        binding: &Binding,
    ) -> Result<View, RunError> {
        check_binding(existing, binding, self.digest_of(binding))?;
        let mut view = self.view(existing).await?;
        view.replayed = true;
        Ok(view)
    }

    /// [`Engine::replay`] of the row a claim found, with what its view needs read in the same
    /// statement, so a replay costs the claim's one read and no other (H-16).
    ///
    /// # Errors
    /// Conflict (SC-14).
    pub fn replay_found(
        &self,
        existing: &ExecutionView,
        binding: &Binding,
    ) -> Result<View, RunError> {
        check_binding(&existing.execution, binding, self.digest_of(binding))?;
        let mut view = views::of_found(existing, self.ctx.clock.now());
        view.replayed = true;
        Ok(view)
    }

    /// The stored view of a record.
    pub async fn view(&self, record: &ExecutionRecord) -> Result<View, RunError> {
        views::view_of(self.ctx.stores.as_ref(), record, self.ctx.clock.now())
            .await
            .map_err(|e| RunError::store(&record.operation_key, e))
    }

    /// Records why a claimed call never went out, and answers with the stored view.
    pub async fn not_dispatched(
        &self,
        record: &ExecutionRecord,
        cause: NotDispatchedCause,
    ) -> Result<View, RunError> {
        tracing::info!(
            scope = %record.scope,
            operation_key = %record.operation_key,
            execution_id = %record.id,
            cause = cause.as_str(),
            "call not dispatched"
        );
        let stored = self
            .ctx
            .stores
            .mark_not_dispatched(record.fence(), cause, self.ctx.clock.now())
            .await
            .map_err(|e| RunError::store(&record.operation_key, e))?;
        self.view(&stored).await
    }

    /// From a fresh claim to the stored outcome: load input (or record why not), check it, mark
    /// the dispatch, drive the send in its own task bounded by `read_ms`, and read back.
    pub async fn run_claimed(
        &self,
        record: ExecutionRecord,
        load_input: InputLoader,
        cancel: CancellationToken,
        read_ms: u64,
        live: Option<LiveSink>,
    ) -> Result<View, RunError> {
        let key = record.operation_key.clone();
        // The lease stays live from the claim to the last write: through the input load, a
        // dispatch mark that waits for the store, and the drive (which takes the heartbeat
        // along, so it ends with the drive's settlement or terminal write).
        let heartbeat = self.heartbeat(&record);
        let (request, hold) = match self.load(&record, load_input, &cancel).await {
            Ok(loaded) => loaded,
            Err(cause) => return self.not_dispatched(&record, cause).await,
        };
        let now = self.ctx.clock.now();
        // The hold shrinks to the loaded request's own worst case in the dispatch mark's unit
        // (SC-122); an unchanged hold is a plain dispatch mark.
        let marked = if hold < record.hold {
            let stores = &self.ctx.stores;
            stores
                .mark_dispatched_with_hold(record.fence(), hold, now)
                .await
        } else {
            self.ctx.stores.mark_dispatched(record.fence(), now).await
        };
        let dispatched = match marked {
            Ok(r) => r,
            Err(e) => {
                // Still prepared: record why it never went out (best effort). Nothing was sent
                // either way, and an unfinished claim expires into not_dispatched(expired).
                let _ = self
                    .ctx
                    .stores
                    .mark_not_dispatched(record.fence(), NotDispatchedCause::Store, now)
                    .await;
                return Err(RunError::store(&key, e));
            }
        };
        self.finish_dispatched(dispatched, request, cancel, read_ms, heartbeat, live)
            .await
    }

    /// From a claim that was also the dispatch mark (its input checked before the claim): the
    /// drive and the read-back, as after a dispatch mark.
    pub async fn run_dispatched(
        &self,
        record: ExecutionRecord,
        request: ProviderRequest,
        cancel: CancellationToken,
        read_ms: u64,
        live: Option<LiveSink>,
    ) -> Result<View, RunError> {
        let heartbeat = self.heartbeat(&record);
        self.finish_dispatched(record, request, cancel, read_ms, heartbeat, live)
            .await
    }

    /// Drives a dispatched call in its own task and reads back what it stored.
    async fn finish_dispatched(
        &self,
        record: ExecutionRecord,
        request: ProviderRequest,
        cancel: CancellationToken,
        read_ms: u64,
        heartbeat: Heartbeat,
        live: Option<LiveSink>,
    ) -> Result<View, RunError> {
        let key = record.operation_key.clone();
        let (scope, execution_id, hold) = (record.scope.clone(), record.id, record.hold);
        let driven = self
            .drive_in_background(record, request, cancel, read_ms, heartbeat, live)
            .await?;
        // The committed rows, never what the drive meant to write (H-1): what its settlement's
        // commit answered, which saves a read (H-22), or else the view's one read (H-10).
        let mut view = match driven.settled {
            Some(settled) => {
                let mut view = views::of_settled(&settled, self.ctx.clock.now());
                view.above_hold = settled.settlement.amount > hold;
                if view.above_hold {
                    // Ids and amounts only (SC-207): the hold did not bound what was billed.
                    tracing::warn!(
                        scope = %scope,
                        operation_key = %key,
                        execution_id = %execution_id,
                        hold = %hold,
                        amount = %settled.settlement.amount,
                        "settled above its hold"
                    );
                }
                view
            }
            None => {
                let stores = self.ctx.stores.as_ref();
                views::read(stores, &scope, &key, self.ctx.clock.now())
                    .await
                    .map_err(|e| RunError::store(&key, e))?
                    .ok_or_else(|| RunError::store(&key, StoreError::NotFound(key.to_string())))?
            }
        };
        view.invalid_reason = driven.invalid_reason;
        // Ids, states and amounts only: never content.
        tracing::info!(
            scope = %scope,
            operation_key = %key,
            execution_id = %execution_id,
            state = ?view.state,
            outcome = ?view.outcome.map(|o| o.as_str()),
            invalid_reason = ?driven.invalid_reason.map(|r| r.as_str()),
            amount = ?view.receipt.as_ref().map(|r| r.amount.to_string()),
            "call finished"
        );
        Ok(view)
    }

    async fn load(
        &self,
        record: &ExecutionRecord,
        load_input: InputLoader,
        cancel: &CancellationToken,
    ) -> Result<(ProviderRequest, Money), NotDispatchedCause> {
        if cancel.is_cancelled() {
            return Err(NotDispatchedCause::Aborted);
        }
        let loaded = tokio::select! {
            biased;
            loaded = load_input => loaded,
            _ = cancel.cancelled() => return Err(NotDispatchedCause::Aborted),
        };
        let messages = loaded.map_err(|_| NotDispatchedCause::Input)?;
        let config = &record.binding.config;
        check_input(config, &messages).map_err(|_| NotDispatchedCause::Invalid)?;
        // A hold only shrinks: input whose worst case is above the claim's hold is not sent.
        let hold = fitted_hold(config, &messages).map_err(|_| NotDispatchedCause::Invalid)?;
        if hold > record.hold {
            return Err(NotDispatchedCause::Invalid);
        }
        let request = provider_request(config, messages);
        self.ctx
            .client
            .check(&request)
            .map_err(|_| NotDispatchedCause::Invalid)?;
        if cancel.is_cancelled() {
            return Err(NotDispatchedCause::Aborted);
        }
        Ok((request, hold))
    }

    /// Runs the drive as its own task, so that a caller who stops waiting does not stop the
    /// stream: it is drained to its end or its read bound, and its evidence settles the call
    /// (SC-60). Failures in the background are reported as metadata only.
    ///
    /// The task is spawned here, before anything is awaited, so the future the caller awaits
    /// holds the task's handle and its bounds only: the drive's state (the request, the record,
    /// the stream's collector) lives once, in its task.
    fn drive_in_background(
        &self,
        record: ExecutionRecord,
        request: ProviderRequest,
        cancel: CancellationToken,
        read_ms: u64,
        heartbeat: Heartbeat,
        live: Option<LiveSink>,
    ) -> impl std::future::Future<Output = Result<Driven, RunError>> + Send + 'static {
        let key = record.operation_key.clone();
        let report = self.background_error.clone();
        let report_key = key.to_string();
        let policy = Arc::clone(&self.policy);
        let ctx = self.ctx.clone();
        // In the caller's span, so the drive's events carry the request's and the call's ids.
        // Boxed before it is spawned: the task then holds a pointer, and the drive's state is
        // written once, into the box, instead of being moved through each layer of the spawn.
        let mut task = self.drives.spawn(Box::pin(
            async move {
                // Renewing until the drive's last write, even when the caller stops waiting.
                let retry = Retry::new(ctx.settle_retry_ms, heartbeat.lost());
                let _heartbeat = heartbeat;
                drive(ctx, record, request, policy, read_ms, retry, live).await
            }
            .in_current_span(),
        ));
        async move {
            let interrupted = |cause| RunError::Interrupted {
                operation_key: key.clone(),
                cause,
            };
            tokio::select! {
                // In order: a finished drive's answer wins over a cancel or the deadline that
                // came at the same instant, and runs replay alike (the simulation's traces).
                biased;
                joined = &mut task => joined.map_err(|_| interrupted(Interruption::Aborted))?,
                _ = cancel.cancelled() => {
                    tokio::spawn(report_when_done(task, report, report_key));
                    Err(interrupted(Interruption::Aborted))
                }
                _ = tokio::time::sleep(Duration::from_millis(read_ms + FINISH_SLACK_MS)) => {
                    tokio::spawn(report_when_done(task, report, report_key));
                    Err(interrupted(Interruption::Timeout))
                }
            }
        }
    }
}

async fn report_when_done(
    task: tokio::task::JoinHandle<Result<Driven, RunError>>,
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
