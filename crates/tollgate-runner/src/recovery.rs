//! Recovery and reconciliation (SC-40..SC-44). None of it loads input or sends anything: it
//! works from the journal, the inbox and the stored snapshot only.

use crate::clock::Clock;
use crate::views;
use serde::Serialize;
use std::sync::Arc;
use tollgate_core::ids::{ExecutionId, OperationKey, Scope};
use tollgate_core::state::{
    ExecutionState, NotDispatchedCause, Outcome, ReconciliationReason, SettlementSource,
};
use tollgate_core::usage::Usage;
use tollgate_core::view::View;
use tollgate_store::{
    AllStores, Evidence, EvidenceSource, ExecutionRecord, NewEvidence, SettleRequest, StoreError,
    StoreResult, Stores,
};

/// Default page of `reconcile_usage` (SC-42).
pub const RECONCILE_PAGE_DEFAULT: u32 = 50;
/// Largest page of `reconcile_usage` and `reconcile_expired` (SC-42).
pub const RECONCILE_PAGE_MAX: u32 = 100;

/// Counts of a `reconcile_expired` pass (SR-11 shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ExpiredCounts {
    /// Roots reconciled.
    pub roots: u64,
    /// Executions finished (not dispatched, settled from evidence, or handed to operators).
    pub executions: u64,
}

/// Counts of a `reconcile_usage` pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct UsageCounts {
    /// Evidence rows examined.
    pub scanned: u64,
    /// Evidence rows acknowledged.
    pub acknowledged: u64,
    /// Seq of the last examined row (pass it as `after` to continue), `None` when none.
    pub cursor: Option<i64>,
}

/// Recovery and reconciliation over one set of stores.
#[derive(Clone)]
pub struct Reconciler {
    pub(crate) stores: Arc<dyn Stores>,
    roots: Option<Arc<dyn AllStores>>,
    pub(crate) clock: Arc<dyn Clock>,
}

/// The single exact, consistent piece of usage among `evidence`, or none when there is none or
/// when exact pieces disagree (conflicting evidence is never chosen automatically).
pub(crate) fn exact_usage(evidence: &[Evidence]) -> Option<&Evidence> {
    let mut exact = evidence.iter().filter(|e| e.exact);
    let first = exact.next()?;
    exact.all(|e| e.usage == first.usage).then_some(first)
}

impl Reconciler {
    /// A reconciler.
    pub fn new(stores: Arc<dyn Stores>, clock: Arc<dyn Clock>) -> Self {
        Self {
            stores,
            roots: None,
            clock,
        }
    }

    /// A reconciler that also expires and reconciles operation roots.
    pub fn with_roots(stores: Arc<dyn AllStores>, clock: Arc<dyn Clock>) -> Self {
        let base: Arc<dyn Stores> = stores.clone();
        Self {
            stores: base,
            roots: Some(stores),
            clock,
        }
    }

    /// `recover(scope, key, {lease_ms})` (SC-40): takes an exclusive fence only when the old lease
    /// has expired, then finishes the execution with the **original** snapshot and accounting
    /// day: a `prepared` row provably never went out (`not_dispatched`, cause `expired`); a
    /// `dispatched` row settles from exact inbox evidence (source `recovery`, output
    /// `unavailable`: input is never reloaded and nothing is re-sent) or goes to an operator.
    /// Returns the view afterwards (or the current view when nothing was eligible).
    ///
    /// # Errors
    /// Store failure.
    pub async fn recover(
        &self,
        scope: &Scope,
        key: &OperationKey,
        lease_ms: u64,
    ) -> StoreResult<Option<View>> {
        let now = self.clock.now();
        let states = [ExecutionState::Prepared, ExecutionState::Dispatched];
        if let Some(record) = self
            .stores
            .take_fence(scope, key, &states, true, lease_ms, now)
            .await?
        {
            self.finish(&record).await?;
        }
        views::read(self.stores.as_ref(), scope, key, self.clock.now()).await
    }

    async fn finish(&self, record: &ExecutionRecord) -> StoreResult<()> {
        let now = self.clock.now();
        if record.state == ExecutionState::Prepared {
            self.stores
                .mark_not_dispatched(record.fence(), NotDispatchedCause::Expired, now)
                .await?;
            return Ok(());
        }
        let evidence = self.stores.evidence_for(record.id).await?;
        let exact = exact_usage(&evidence);
        let priced = exact.and_then(|e| {
            record
                .binding
                .config
                .prices
                .cost(&e.usage)
                .ok()
                .map(|a| (e, a))
        });
        let reason = if exact.is_some() {
            ReconciliationReason::RecoveryUnpricedUsage
        } else {
            ReconciliationReason::RecoveryNoExactUsage
        };
        match priced {
            Some((evidence, amount)) => {
                let request = SettleRequest {
                    fence: record.fence(),
                    usage: evidence.usage,
                    amount,
                    source: SettlementSource::Recovery,
                    outcome: Outcome::Unavailable,
                    stop: None,
                    output: None,
                    step: None,
                    provider_ref: evidence.provider_ref.clone(),
                    evidence_id: Some(evidence.id),
                    evidence: None,
                    now,
                    seen: None,
                };
                self.stores.settle(request).await?;
            }
            None => {
                let provider_ref = evidence.iter().find_map(|e| e.provider_ref.clone());
                self.stores
                    .mark_reconciliation_required(record.fence(), reason, provider_ref, now)
                    .await?;
            }
        }
        Ok(())
    }

    /// `reconcile_expired(scope, {limit})` (SC-41): recovers up to `limit` (≤ 100) executions
    /// whose fences expired. Unknown or unpriced evidence goes to operators.
    ///
    /// # Errors
    /// Store failure.
    pub async fn reconcile_expired(
        &self,
        scope: &Scope,
        limit: u32,
        lease_ms: u64,
    ) -> StoreResult<ExpiredCounts> {
        let limit = limit.clamp(1, RECONCILE_PAGE_MAX);
        let expired = self.stores.expired(scope, self.clock.now(), limit).await?;
        let mut counts = ExpiredCounts::default();
        let states = [ExecutionState::Prepared, ExecutionState::Dispatched];
        for candidate in expired {
            let fenced = self
                .stores
                .take_fence(
                    scope,
                    &candidate.operation_key,
                    &states,
                    true,
                    lease_ms,
                    self.clock.now(),
                )
                .await?;
            // Another scheduler instance may have taken it first: skip, never double-finish.
            if let Some(record) = fenced {
                self.finish(&record).await?;
                counts.executions += 1;
            }
        }
        // Roots after their calls, so a root whose last call just finished reconciles now.
        if let Some(roots) = &self.roots {
            let changed = roots
                .reconcile_roots(scope, self.clock.now(), limit)
                .await?;
            counts.roots = changed.len() as u64;
        }
        Ok(counts)
    }

    /// `reconcile_usage(scope, {limit, after}, {skip})` (SC-42, SC-44): acknowledges evidence only
    /// when it is exact and matches the durable settlement of a completed execution, or when it
    /// is zero evidence of a provably unsent call. Unknown or conflicting evidence stays
    /// unacknowledged; `skip(key)` leaves a key's rows pending.
    ///
    /// # Errors
    /// Store failure.
    pub async fn reconcile_usage(
        &self,
        scope: &Scope,
        limit: Option<u32>,
        after: Option<i64>,
        skip: &(dyn Fn(&OperationKey) -> bool + Send + Sync),
    ) -> StoreResult<UsageCounts> {
        let limit = limit
            .unwrap_or(RECONCILE_PAGE_DEFAULT)
            .clamp(1, RECONCILE_PAGE_MAX);
        let page = self
            .stores
            .unacknowledged(scope, after.unwrap_or(0), limit)
            .await?;
        let mut counts = UsageCounts::default();
        for evidence in &page {
            counts.scanned += 1;
            counts.cursor = Some(evidence.seq);
            if skip(&evidence.operation_key) || !self.is_settled_exactly(scope, evidence).await? {
                continue;
            }
            // Counted only when this pass acknowledged it: a concurrent pass over the same page
            // may have come first.
            if self
                .stores
                .acknowledge(scope, evidence.id, self.clock.now())
                .await?
            {
                counts.acknowledged += 1;
            }
        }
        Ok(counts)
    }

    async fn is_settled_exactly(&self, scope: &Scope, evidence: &Evidence) -> StoreResult<bool> {
        if !evidence.exact {
            return Ok(false);
        }
        let Some(record) = self
            .stores
            .execution_by_id(scope, evidence.execution_id)
            .await?
        else {
            return Ok(false);
        };
        match record.state {
            ExecutionState::Completed => Ok(self
                .stores
                .settlement(record.id)
                .await?
                .is_some_and(|s| s.usage == evidence.usage)),
            ExecutionState::NotDispatched => Ok(evidence.usage.is_zero()),
            _ => Ok(false),
        }
    }

    /// Records late usage evidence for an execution (source `late`). It never rewrites a
    /// settlement: reconciliation compares it, operators decide.
    ///
    /// # Errors
    /// `NotFound` when the execution is not in `scope`.
    pub async fn record_late_evidence(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        usage: Usage,
        provider_ref: Option<String>,
    ) -> StoreResult<Evidence> {
        let record = self
            .stores
            .execution_by_id(scope, execution_id)
            .await?
            .ok_or_else(|| StoreError::NotFound(execution_id.to_string()))?;
        self.stores
            .record_evidence(NewEvidence {
                scope: scope.clone(),
                execution_id,
                operation_key: record.operation_key,
                provider_ref,
                usage,
                exact: true,
                source: EvidenceSource::Late,
                now: self.clock.now(),
            })
            .await
    }

    /// The operator's settlement of a fenced `reconciliation_required` execution (source
    /// `operator`, output `unavailable`), backed by the evidence `evidence_id`: one fenced unit
    /// that charges `amount`, releases the hold and audits `settled`.
    pub(crate) async fn settle_by_operator(
        &self,
        fenced: &ExecutionRecord,
        usage: Usage,
        amount: tollgate_core::money::Money,
        provider_ref: Option<String>,
        evidence_id: tollgate_core::ids::EvidenceId,
        now: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<tollgate_store::SettleOutcome> {
        self.stores
            .settle(SettleRequest {
                fence: fenced.fence(),
                usage,
                amount,
                source: SettlementSource::Operator,
                outcome: Outcome::Unavailable,
                stop: None,
                output: None,
                step: None,
                provider_ref,
                evidence_id: Some(evidence_id),
                evidence: None,
                now,
                seen: None,
            })
            .await
    }

    /// The stores this reconciler works on.
    pub(crate) fn stores(&self) -> &dyn Stores {
        self.stores.as_ref()
    }

    /// The reconciler's clock.
    pub(crate) fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// Erases results whose retention ended (SC-71, SC-73).
    ///
    /// # Errors
    /// Store failure.
    pub async fn erase_expired(&self, limit: u32) -> StoreResult<u64> {
        self.stores
            .erase_expired(self.clock.now(), limit.clamp(1, RECONCILE_PAGE_MAX))
            .await
    }
}
