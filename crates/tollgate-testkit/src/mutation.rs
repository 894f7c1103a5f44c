//! The simulation's deliberate store defect (feature `mutation-skip-settle-fence`):
//! [`SkipSettleFence`] forwards every store method to the in-memory stores, except that a
//! `settle` refused for a stale fence is retried with the row's current fence token, so a stale
//! writer settles an execution recovery took over. `crates/tollgate-runner/tests/simulation.rs`
//! runs the simulator on it (`cargo test -p tollgate-runner --test simulation --features
//! mutation-skip-settle-fence`) and shows that it catches the violation (H-3).
//!
//! The in-memory stores never yield inside a method, so the refused attempt, the read of the
//! current fence and the retry happen with nothing in between: the same as a settle that takes
//! its token from the row instead of the writer.

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::*;
use tollgate_core::money::Currency;
use tollgate_core::state::{ExecutionState, NotDispatchedCause, ReconciliationReason};
use tollgate_store::ledger::LedgerReport;
use tollgate_store::*;

/// The in-memory stores with a `settle` that ignores a stale fence.
#[derive(Default)]
pub struct SkipSettleFence {
    inner: MemoryStores,
}

impl SkipSettleFence {
    /// Fresh, empty stores.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Forwards each listed method of one trait to the inner stores.
macro_rules! forward {
    ($($trait:ident { $(fn $name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)+ })+) => {
        $(
            #[async_trait]
            impl $trait for SkipSettleFence {
                $(
                    async fn $name(&self, $($arg: $ty),*) -> StoreResult<$out> {
                        $trait::$name(&self.inner, $($arg),*).await
                    }
                )+
            }
        )+
    };
}

#[async_trait]
impl ExecutionStore for SkipSettleFence {
    async fn claim(&self, request: ClaimRequest) -> StoreResult<ClaimOutcome> {
        self.inner.claim(request).await
    }
    async fn mark_dispatched(
        &self,
        fence: Fence,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.inner.mark_dispatched(fence, now).await
    }
    async fn mark_dispatched_with_hold(
        &self,
        fence: Fence,
        hold: tollgate_core::money::Money,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.inner.mark_dispatched_with_hold(fence, hold, now).await
    }
    async fn mark_not_dispatched(
        &self,
        fence: Fence,
        cause: NotDispatchedCause,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.inner.mark_not_dispatched(fence, cause, now).await
    }
    async fn mark_reconciliation_required(
        &self,
        fence: Fence,
        reason: ReconciliationReason,
        provider_ref: Option<String>,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.inner
            .mark_reconciliation_required(fence, reason, provider_ref, now)
            .await
    }
    /// The defect: a settle refused for a stale fence is made again with the row's current one.
    async fn settle(&self, request: SettleRequest) -> StoreResult<SettleOutcome> {
        match self.inner.settle(request.clone()).await {
            Err(StoreError::StaleFence(id)) => {
                let fence = self.inner.current_fence(id)?;
                self.inner.settle(SettleRequest { fence, ..request }).await
            }
            out => out,
        }
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
        self.inner
            .take_fence(scope, key, states, require_expired, lease_ms, now)
            .await
    }
    async fn renew_lease(
        &self,
        fence: Fence,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.inner.renew_lease(fence, lease_ms, now).await
    }
    async fn execution(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.inner.execution(scope, key).await
    }
    async fn execution_view(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionView>> {
        self.inner.execution_view(scope, key).await
    }
    async fn execution_by_id(
        &self,
        scope: &Scope,
        id: ExecutionId,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.inner.execution_by_id(scope, id).await
    }
    async fn expired(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>> {
        self.inner.expired(scope, now, limit).await
    }
    async fn by_state(
        &self,
        scope: &Scope,
        state: ExecutionState,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>> {
        self.inner.by_state(scope, state, limit).await
    }
}

forward! {
    ResultStore {
        fn result(execution_id: ExecutionId) -> Option<ResultRecord>;
        fn erase(scope: &Scope, execution_id: ExecutionId, now: DateTime<Utc>) -> ();
        fn erase_expired(now: DateTime<Utc>, limit: u32) -> u64;
    }
    UsageInbox {
        fn record_evidence(evidence: NewEvidence) -> Evidence;
        fn evidence_for(execution_id: ExecutionId) -> Vec<Evidence>;
        fn unacknowledged(scope: &Scope, after: i64, limit: u32) -> Vec<Evidence>;
        fn acknowledge(scope: &Scope, id: EvidenceId, now: DateTime<Utc>) -> bool;
    }
    SettlementStore {
        fn settlement(execution_id: ExecutionId) -> Option<SettlementRecord>;
        fn settlements(from: NaiveDate, to: NaiveDate, limit: u32) -> Vec<SettlementRecord>;
        fn scope_settlements(scope: &Scope, from: NaiveDate, to: NaiveDate, limit: u32)
            -> Vec<SettlementRecord>;
        fn feed_position(scope: &Scope, id: SettlementId) -> Option<FeedPosition>;
        fn settlements_after(scope: Option<&Scope>, after: FeedPosition, limit: u32)
            -> Vec<FeedEntry>;
    }
    SpendStore {
        fn session_spend(
            scope: &Scope,
            consumer: &ConsumerId,
            session: &SessionId,
            currency: &Currency
        ) -> SpendTotals;
        fn daily_spend(scope: &Scope, consumer: &ConsumerId, day: NaiveDate, currency: &Currency)
            -> SpendTotals;
    }
    AuditLog {
        fn append_audit(event: AuditEvent) -> AuditRow;
        fn audit_rows(scope: &Scope, after: AuditPosition, limit: u32) -> Vec<AuditRow>;
        fn audit_heads(scope: &Scope) -> Vec<AuditHead>;
    }
    RootStore {
        fn open_root(request: OpenRootRequest) -> RootOpen;
        fn reserve_slot(scope: &Scope, root_key: &RootKey, now: DateTime<Utc>) -> Reservation;
        fn release_slot(scope: &Scope, root_key: &RootKey, now: DateTime<Utc>) -> ();
        fn close_root(scope: &Scope, root_key: &RootKey, now: DateTime<Utc>)
            -> Option<RootRecord>;
        fn root(scope: &Scope, root_key: &RootKey) -> Option<RootRecord>;
        fn root_receipt(execution_id: ExecutionId) -> Option<RootReceipt>;
        fn root_receipts(scope: &Scope, root_key: &RootKey, limit: u32) -> Vec<RootReceipt>;
        fn repair_root_receipt(scope: &Scope, execution_id: ExecutionId, now: DateTime<Utc>)
            -> Option<RootReceipt>;
        fn reconcile_roots(scope: &Scope, now: DateTime<Utc>, limit: u32) -> Vec<RootRecord>;
    }
    LedgerAudit {
        fn audit_ledger(scope: Option<&Scope>, limit: u32) -> LedgerReport;
    }
}
