//! A fault-injecting wrapper around any stores, for testing what a runner does when a
//! persistence step fails (SC-17): each armed fault point fails its next calls with
//! [`StoreError::Unavailable`] without touching the inner store — or, for the `*AfterCommit`
//! points, after the inner write committed (a lost acknowledgement).

use crate::error::{StoreError, StoreResult};
use crate::rows::*;
use crate::traits::*;
use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::*;
use tollgate_core::state::{ExecutionState, NotDispatchedCause, ReconciliationReason};

/// Where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// `claim` fails before writing.
    Claim,
    /// `mark_dispatched` fails before writing.
    MarkDispatched,
    /// `mark_not_dispatched` fails before writing.
    MarkNotDispatched,
    /// `mark_reconciliation_required` fails before writing.
    MarkReconciliation,
    /// `settle` fails before writing.
    Settle,
    /// `settle` commits, then reports failure.
    SettleAfterCommit,
    /// `record_evidence` fails before writing.
    RecordEvidence,
    /// Reads of executions fail.
    Read,
    /// `close_root` fails before writing.
    CloseRoot,
    /// `root_receipt` reads nothing, as if the receipt set were incomplete.
    HideRootReceipt,
    /// `key_by_digest` fails.
    KeyLookup,
    /// `scopes_with_work` fails.
    WorkScan,
}

/// Stores with injectable faults.
pub struct FaultyStores {
    inner: Arc<dyn Stores>,
    roots: Option<Arc<dyn AllStores>>,
    service: Option<Arc<dyn ServiceStores>>,
    armed: Mutex<HashSet<FaultPoint>>,
}

impl FaultyStores {
    /// Wraps `inner` with no fault armed.
    pub fn new(inner: Arc<dyn Stores>) -> Self {
        Self {
            inner,
            roots: None,
            service: None,
            armed: Mutex::new(HashSet::new()),
        }
    }

    /// Wraps stores that also keep operation roots.
    pub fn with_roots(inner: Arc<dyn AllStores>) -> Self {
        let stores: Arc<dyn Stores> = inner.clone();
        Self {
            inner: stores,
            roots: Some(inner),
            service: None,
            armed: Mutex::new(HashSet::new()),
        }
    }

    /// Wraps stores that also keep API keys and scan for work (the HTTP service's stores).
    pub fn with_service(inner: Arc<dyn ServiceStores>) -> Self {
        let stores: Arc<dyn Stores> = inner.clone();
        let roots: Arc<dyn AllStores> = inner.clone();
        Self {
            inner: stores,
            roots: Some(roots),
            service: Some(inner),
            armed: Mutex::new(HashSet::new()),
        }
    }

    fn roots(&self) -> StoreResult<&Arc<dyn AllStores>> {
        self.roots
            .as_ref()
            .ok_or_else(|| StoreError::Unavailable("these stores keep no roots".into()))
    }

    fn service(&self) -> StoreResult<&Arc<dyn ServiceStores>> {
        self.service
            .as_ref()
            .ok_or_else(|| StoreError::Unavailable("these stores keep no service tables".into()))
    }

    /// Arms `point`: every call fails until disarmed.
    pub fn arm(&self, point: FaultPoint) {
        if let Ok(mut a) = self.armed.lock() {
            a.insert(point);
        }
    }

    /// Disarms `point`.
    pub fn disarm(&self, point: FaultPoint) {
        if let Ok(mut a) = self.armed.lock() {
            a.remove(&point);
        }
    }

    /// The wrapped stores.
    pub fn inner(&self) -> &Arc<dyn Stores> {
        &self.inner
    }

    fn check(&self, point: FaultPoint) -> StoreResult<()> {
        let armed = self
            .armed
            .lock()
            .map(|a| a.contains(&point))
            .unwrap_or(true);
        if armed {
            Err(StoreError::Unavailable(format!(
                "injected fault at {point:?}"
            )))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl ExecutionStore for FaultyStores {
    async fn claim(&self, request: ClaimRequest) -> StoreResult<ClaimOutcome> {
        self.check(FaultPoint::Claim)?;
        self.inner.claim(request).await
    }
    async fn mark_dispatched(
        &self,
        fence: Fence,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.check(FaultPoint::MarkDispatched)?;
        self.inner.mark_dispatched(fence, now).await
    }
    async fn mark_not_dispatched(
        &self,
        fence: Fence,
        cause: NotDispatchedCause,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.check(FaultPoint::MarkNotDispatched)?;
        self.inner.mark_not_dispatched(fence, cause, now).await
    }
    async fn mark_reconciliation_required(
        &self,
        fence: Fence,
        reason: ReconciliationReason,
        provider_ref: Option<String>,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.check(FaultPoint::MarkReconciliation)?;
        self.inner
            .mark_reconciliation_required(fence, reason, provider_ref, now)
            .await
    }
    async fn settle(&self, request: SettleRequest) -> StoreResult<SettleOutcome> {
        self.check(FaultPoint::Settle)?;
        let out = self.inner.settle(request).await?;
        self.check(FaultPoint::SettleAfterCommit)?;
        Ok(out)
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
    async fn execution(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.check(FaultPoint::Read)?;
        self.inner.execution(scope, key).await
    }
    async fn execution_by_id(
        &self,
        scope: &Scope,
        id: ExecutionId,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.check(FaultPoint::Read)?;
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

#[async_trait]
impl ResultStore for FaultyStores {
    async fn result(&self, execution_id: ExecutionId) -> StoreResult<Option<ResultRecord>> {
        self.inner.result(execution_id).await
    }
    async fn erase(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        self.inner.erase(scope, execution_id, now).await
    }
    async fn erase_expired(&self, now: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        self.inner.erase_expired(now, limit).await
    }
}

#[async_trait]
impl UsageInbox for FaultyStores {
    async fn record_evidence(&self, evidence: NewEvidence) -> StoreResult<Evidence> {
        self.check(FaultPoint::RecordEvidence)?;
        self.inner.record_evidence(evidence).await
    }
    async fn evidence_for(&self, execution_id: ExecutionId) -> StoreResult<Vec<Evidence>> {
        self.inner.evidence_for(execution_id).await
    }
    async fn unacknowledged(
        &self,
        scope: &Scope,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<Evidence>> {
        self.inner.unacknowledged(scope, after, limit).await
    }
    async fn acknowledge(
        &self,
        scope: &Scope,
        id: EvidenceId,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        self.inner.acknowledge(scope, id, now).await
    }
}

#[async_trait]
impl SettlementStore for FaultyStores {
    async fn settlement(&self, execution_id: ExecutionId) -> StoreResult<Option<SettlementRecord>> {
        self.inner.settlement(execution_id).await
    }
    async fn settlements(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>> {
        self.inner.settlements(from, to, limit).await
    }
}

#[async_trait]
impl SpendStore for FaultyStores {
    async fn session_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        session: &SessionId,
    ) -> StoreResult<SpendTotals> {
        self.inner.session_spend(scope, consumer, session).await
    }
    async fn daily_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        day: NaiveDate,
    ) -> StoreResult<SpendTotals> {
        self.inner.daily_spend(scope, consumer, day).await
    }
}

#[async_trait]
impl AuditLog for FaultyStores {
    async fn append_audit(&self, event: AuditEvent) -> StoreResult<AuditRow> {
        self.inner.append_audit(event).await
    }
    async fn audit_rows(
        &self,
        scope: &Scope,
        after_seq: i64,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>> {
        self.inner.audit_rows(scope, after_seq, limit).await
    }
}

#[async_trait]
impl RootStore for FaultyStores {
    async fn open_root(&self, request: OpenRootRequest) -> StoreResult<RootOpen> {
        self.roots()?.open_root(request).await
    }
    async fn reserve_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Reservation> {
        self.roots()?.reserve_slot(scope, root_key, now).await
    }
    async fn release_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        self.roots()?.release_slot(scope, root_key, now).await
    }
    async fn close_root(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootRecord>> {
        self.check(FaultPoint::CloseRoot)?;
        self.roots()?.close_root(scope, root_key, now).await
    }
    async fn root(&self, scope: &Scope, root_key: &RootKey) -> StoreResult<Option<RootRecord>> {
        self.roots()?.root(scope, root_key).await
    }
    async fn root_receipt(&self, execution_id: ExecutionId) -> StoreResult<Option<RootReceipt>> {
        if self.check(FaultPoint::HideRootReceipt).is_err() {
            return Ok(None);
        }
        self.roots()?.root_receipt(execution_id).await
    }
    async fn root_receipts(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        limit: u32,
    ) -> StoreResult<Vec<RootReceipt>> {
        self.roots()?.root_receipts(scope, root_key, limit).await
    }
    async fn repair_root_receipt(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootReceipt>> {
        self.roots()?
            .repair_root_receipt(scope, execution_id, now)
            .await
    }
    async fn reconcile_roots(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<RootRecord>> {
        self.roots()?.reconcile_roots(scope, now, limit).await
    }
}

#[async_trait]
impl ApiKeyStore for FaultyStores {
    async fn insert_key(&self, key: ApiKeyRecord) -> StoreResult<()> {
        self.service()?.insert_key(key).await
    }
    async fn key_by_digest(&self, digest: &KeyDigest) -> StoreResult<Option<ApiKeyRecord>> {
        self.check(FaultPoint::KeyLookup)?;
        self.service()?.key_by_digest(digest).await
    }
}

#[async_trait]
impl WorkScan for FaultyStores {
    async fn scopes_with_work(&self, after: Option<&Scope>, limit: u32) -> StoreResult<Vec<Scope>> {
        self.check(FaultPoint::WorkScan)?;
        self.service()?.scopes_with_work(after, limit).await
    }
}

#[async_trait]
impl LedgerAudit for FaultyStores {
    /// Delegates: the audit only reads, so no fault point applies.
    async fn audit_ledger(
        &self,
        scope: Option<&Scope>,
        limit: u32,
    ) -> StoreResult<crate::ledger::LedgerReport> {
        self.roots()?.audit_ledger(scope, limit).await
    }
}
