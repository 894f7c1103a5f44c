//! The store wrapper under each simulated process.
//!
//! Every process reaches the one in-memory store through its own `SimStores` (and, above it, its
//! own `FaultyStores` with the faults the driver arms). A call sleeps a simulated round trip,
//! then passes the process's gate — a dead process reaches nothing — then runs on the in-memory
//! store, whose methods never yield, so each write commits atomically. The oracle sees the write
//! right after its commit. The acknowledgement then takes its own latency, and a process that died
//! meanwhile loses it (the write committed, the caller sees a failure); a live process loses one
//! now and then too (a connection that drops after its COMMIT).
//!
//! Under [`Mutation::SkipSettleFence`] the wrapper hands `settle` the row's current fence token in
//! place of the writer's, which removes the stale-fence guard from the store the runners see; the
//! oracle still judges the writer's own token.

use super::oracle;
use super::process::Gate;
use super::shared::{Mutation, Shared, Truth};
use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::*;
use tollgate_core::money::Money;
use tollgate_core::state::{ExecutionState, NotDispatchedCause, ReconciliationReason};
use tollgate_store::*;

/// One process's view of the store.
pub struct SimStores {
    shared: Arc<Shared>,
    gate: Arc<Gate>,
}

macro_rules! read {
    ($self:ident, $call:expr) => {{
        $self.enter().await?;
        let out = $call.await;
        $self.leave(out).await
    }};
}

impl SimStores {
    /// The store as `gate`'s process sees it.
    pub fn new(shared: Arc<Shared>, gate: Arc<Gate>) -> Self {
        Self { shared, gate }
    }

    fn inner(&self) -> &Truth {
        &self.shared.truth
    }

    async fn enter(&self) -> StoreResult<()> {
        let ms = self.shared.store_latency_ms();
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if self.gate.alive() {
            Ok(())
        } else {
            Err(StoreError::Unavailable(format!(
                "{} is dead",
                self.gate.name
            )))
        }
    }

    async fn leave<T>(&self, out: StoreResult<T>) -> StoreResult<T> {
        let ms = self.shared.ack_latency_ms();
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        match out {
            Ok(_) if !self.gate.alive() => Err(StoreError::Unavailable(format!(
                "{} died before the acknowledgement",
                self.gate.name
            ))),
            Ok(_) if self.shared.lost_ack() => {
                self.shared
                    .trace(format!("{} lost an acknowledgement", self.gate.name));
                Err(StoreError::Unavailable(
                    "connection lost after the round trip".into(),
                ))
            }
            out => out,
        }
    }

    /// The writer's request with the row's current token (the mutation), or unchanged.
    async fn mutated(&self, request: SettleRequest) -> SettleRequest {
        if self.shared.mutation != Mutation::SkipSettleFence {
            return request;
        }
        let id = request.fence.execution_id;
        let Some(scope) = self.shared.scope_of(id) else {
            return request;
        };
        match self.inner().execution_by_id(&scope, id).await {
            Ok(Some(record)) => SettleRequest {
                fence: record.fence(),
                ..request
            },
            _ => request,
        }
    }

    async fn fenced(
        &self,
        op: &str,
        fence: Fence,
        out: StoreResult<ExecutionRecord>,
    ) -> StoreResult<ExecutionRecord> {
        oracle::on_fenced(&self.shared, &self.gate.name, op, fence, &out).await;
        self.leave(out).await
    }
}

#[async_trait]
impl ExecutionStore for SimStores {
    async fn claim(&self, request: ClaimRequest) -> StoreResult<ClaimOutcome> {
        self.enter().await?;
        let out = self.inner().claim(request.clone()).await;
        oracle::on_claim(&self.shared, &self.gate.name, &request, &out).await;
        self.leave(out).await
    }
    async fn mark_dispatched(
        &self,
        fence: Fence,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.enter().await?;
        let out = self.inner().mark_dispatched(fence, now).await;
        self.fenced("mark_dispatched", fence, out).await
    }
    async fn mark_dispatched_with_hold(
        &self,
        fence: Fence,
        hold: Money,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.enter().await?;
        let out = self
            .inner()
            .mark_dispatched_with_hold(fence, hold, now)
            .await;
        oracle::on_hold_shrunk(&self.shared, fence, &out);
        self.fenced("mark_dispatched_with_hold", fence, out).await
    }
    async fn mark_not_dispatched(
        &self,
        fence: Fence,
        cause: NotDispatchedCause,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.enter().await?;
        let out = self.inner().mark_not_dispatched(fence, cause, now).await;
        self.fenced("mark_not_dispatched", fence, out).await
    }
    async fn mark_reconciliation_required(
        &self,
        fence: Fence,
        reason: ReconciliationReason,
        provider_ref: Option<String>,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.enter().await?;
        let out = self
            .inner()
            .mark_reconciliation_required(fence, reason, provider_ref, now)
            .await;
        self.fenced("mark_reconciliation_required", fence, out)
            .await
    }
    async fn settle(&self, request: SettleRequest) -> StoreResult<SettleOutcome> {
        self.enter().await?;
        let fence = request.fence;
        let own = request.source == tollgate_core::state::SettlementSource::Stream;
        if own && self.shared.settle_blip(fence, &self.gate.name) {
            self.shared
                .trace(format!("{} settle unavailable once", self.gate.name));
            return Err(StoreError::Unavailable("the store is briefly away".into()));
        }
        let request = self.mutated(request).await;
        let out = self.inner().settle(request).await;
        oracle::on_settle(&self.shared, &self.gate.name, fence, &out).await;
        self.leave(out).await
    }
    async fn take_fence(
        &self,
        scope: &Scope,
        key: &OperationKey,
        states: &[ExecutionState],
        require_expired: bool,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.enter().await?;
        let out = self
            .inner()
            .take_fence(scope, key, states, require_expired, lease_ms, now)
            .await;
        oracle::on_take_fence(&self.shared, &self.gate.name, key, &out);
        self.leave(out).await
    }
    async fn renew_lease(
        &self,
        fence: Fence,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.enter().await?;
        let out = self.inner().renew_lease(fence, lease_ms, now).await;
        self.fenced("renew_lease", fence, out).await
    }
    async fn execution(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionRecord>> {
        read!(self, self.inner().execution(scope, key))
    }
    async fn execution_view(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionView>> {
        read!(self, self.inner().execution_view(scope, key))
    }
    async fn execution_by_id(
        &self,
        scope: &Scope,
        id: ExecutionId,
    ) -> StoreResult<Option<ExecutionRecord>> {
        read!(self, self.inner().execution_by_id(scope, id))
    }
    async fn expired(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>> {
        read!(self, self.inner().expired(scope, now, limit))
    }
    async fn by_state(
        &self,
        scope: &Scope,
        state: ExecutionState,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>> {
        read!(self, self.inner().by_state(scope, state, limit))
    }
}

#[async_trait]
impl ResultStore for SimStores {
    async fn result(&self, execution_id: ExecutionId) -> StoreResult<Option<ResultRecord>> {
        read!(self, self.inner().result(execution_id))
    }
    async fn erase(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        read!(self, self.inner().erase(scope, execution_id, now))
    }
    async fn erase_expired(&self, now: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        read!(self, self.inner().erase_expired(now, limit))
    }
}

#[async_trait]
impl UsageInbox for SimStores {
    async fn record_evidence(&self, evidence: NewEvidence) -> StoreResult<Evidence> {
        self.enter().await?;
        let out = self.inner().record_evidence(evidence).await;
        oracle::on_evidence(&self.shared, &self.gate.name, &out);
        self.leave(out).await
    }
    async fn evidence_for(&self, execution_id: ExecutionId) -> StoreResult<Vec<Evidence>> {
        read!(self, self.inner().evidence_for(execution_id))
    }
    async fn unacknowledged(
        &self,
        scope: &Scope,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<Evidence>> {
        read!(self, self.inner().unacknowledged(scope, after, limit))
    }
    async fn acknowledge(
        &self,
        scope: &Scope,
        id: EvidenceId,
        now: DateTime<Utc>,
    ) -> StoreResult<bool> {
        self.enter().await?;
        let out = self.inner().acknowledge(scope, id, now).await;
        oracle::on_write(&self.shared, &self.gate.name, "acknowledge", scope, &out);
        self.leave(out).await
    }
}

#[async_trait]
impl SettlementStore for SimStores {
    async fn settlement(&self, execution_id: ExecutionId) -> StoreResult<Option<SettlementRecord>> {
        read!(self, self.inner().settlement(execution_id))
    }
    async fn settlements(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>> {
        read!(self, self.inner().settlements(from, to, limit))
    }
    async fn scope_settlements(
        &self,
        scope: &Scope,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>> {
        read!(self, self.inner().scope_settlements(scope, from, to, limit))
    }
    async fn feed_position(
        &self,
        scope: &Scope,
        id: SettlementId,
    ) -> StoreResult<Option<FeedPosition>> {
        read!(self, self.inner().feed_position(scope, id))
    }
    async fn settlements_after(
        &self,
        scope: Option<&Scope>,
        after: FeedPosition,
        limit: u32,
    ) -> StoreResult<Vec<FeedEntry>> {
        read!(self, self.inner().settlements_after(scope, after, limit))
    }
}

#[async_trait]
impl SpendStore for SimStores {
    async fn session_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        session: &SessionId,
        currency: &tollgate_core::money::Currency,
    ) -> StoreResult<SpendTotals> {
        read!(
            self,
            self.inner()
                .session_spend(scope, consumer, session, currency)
        )
    }
    async fn daily_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        day: NaiveDate,
        currency: &tollgate_core::money::Currency,
    ) -> StoreResult<SpendTotals> {
        read!(
            self,
            self.inner().daily_spend(scope, consumer, day, currency)
        )
    }
    async fn limit_windows(
        &self,
        scope: &Scope,
    ) -> StoreResult<
        Vec<(
            tollgate_core::limits::LimitSubject,
            tollgate_core::limits::LimitWindow,
        )>,
    > {
        read!(self, self.inner().limit_windows(scope))
    }
}

#[async_trait]
impl AuditLog for SimStores {
    async fn append_audit(&self, event: AuditEvent) -> StoreResult<AuditRow> {
        read!(self, self.inner().append_audit(event))
    }
    async fn audit_rows(
        &self,
        scope: &Scope,
        after: AuditPosition,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>> {
        read!(self, self.inner().audit_rows(scope, after, limit))
    }
    async fn audit_heads(&self, scope: &Scope) -> StoreResult<Vec<AuditHead>> {
        read!(self, self.inner().audit_heads(scope))
    }
}

#[async_trait]
impl LedgerAudit for SimStores {
    async fn audit_ledger(
        &self,
        scope: Option<&Scope>,
        limit: u32,
    ) -> StoreResult<tollgate_store::ledger::LedgerReport> {
        read!(self, self.inner().audit_ledger(scope, limit))
    }
}

#[async_trait]
impl RootStore for SimStores {
    async fn open_root(&self, request: OpenRootRequest) -> StoreResult<RootOpen> {
        self.enter().await?;
        let scope = request.scope.clone();
        let out = self.inner().open_root(request).await;
        oracle::on_write(&self.shared, &self.gate.name, "open_root", &scope, &out);
        self.leave(out).await
    }
    async fn reserve_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Reservation> {
        self.enter().await?;
        let out = self.inner().reserve_slot(scope, root_key, now).await;
        oracle::on_write(&self.shared, &self.gate.name, "reserve_slot", scope, &out);
        self.leave(out).await
    }
    async fn release_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        self.enter().await?;
        let out = self.inner().release_slot(scope, root_key, now).await;
        oracle::on_write(&self.shared, &self.gate.name, "release_slot", scope, &out);
        self.leave(out).await
    }
    async fn close_root(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootRecord>> {
        self.enter().await?;
        let out = self.inner().close_root(scope, root_key, now).await;
        oracle::on_write(&self.shared, &self.gate.name, "close_root", scope, &out);
        self.leave(out).await
    }
    async fn root(&self, scope: &Scope, root_key: &RootKey) -> StoreResult<Option<RootRecord>> {
        read!(self, self.inner().root(scope, root_key))
    }
    async fn root_receipt(&self, execution_id: ExecutionId) -> StoreResult<Option<RootReceipt>> {
        read!(self, self.inner().root_receipt(execution_id))
    }
    async fn root_receipts(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        limit: u32,
    ) -> StoreResult<Vec<RootReceipt>> {
        read!(self, self.inner().root_receipts(scope, root_key, limit))
    }
    async fn repair_root_receipt(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootReceipt>> {
        self.enter().await?;
        let out = self
            .inner()
            .repair_root_receipt(scope, execution_id, now)
            .await;
        oracle::on_write(
            &self.shared,
            &self.gate.name,
            "repair_root_receipt",
            scope,
            &out,
        );
        self.leave(out).await
    }
    async fn reconcile_roots(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<RootRecord>> {
        self.enter().await?;
        let out = self.inner().reconcile_roots(scope, now, limit).await;
        oracle::on_write(
            &self.shared,
            &self.gate.name,
            "reconcile_roots",
            scope,
            &out,
        );
        self.leave(out).await
    }
}
