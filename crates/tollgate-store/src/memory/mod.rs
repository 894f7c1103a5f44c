//! In-memory stores (SC-51): the embedded default. One mutex guards all tables, so every
//! multi-table operation is atomic exactly like its Postgres transaction.

use crate::audit::{audit_time, row_hash};
use crate::error::{StoreError, StoreResult};
use crate::rows::*;
use crate::rules;
use crate::traits::*;
use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use tollgate_core::caps::{CurrencySpend, SpendTotals};
use tollgate_core::digest::Digest256;
use tollgate_core::ids::*;
use tollgate_core::limits::{
    self, ClaimLimits, LimitEnd, LimitRefused, LimitSubject, LimitTokens, LimitWindow, LimitsHeld,
};
use tollgate_core::money::Currency;
use tollgate_core::state::{ExecutionState, NotDispatchedCause, ReconciliationReason};

#[derive(Default)]
struct Tables {
    executions: HashMap<ExecutionId, ExecutionRecord>,
    by_key: HashMap<(Scope, OperationKey), ExecutionId>,
    results: HashMap<ExecutionId, ResultRecord>,
    evidence: Vec<Evidence>,
    settlements: Vec<SettlementRecord>,
    settlement_by_execution: HashMap<ExecutionId, usize>,
    session_spend: HashMap<SessionSpendKey, SpendTotals>,
    daily_spend: HashMap<DaySpendKey, SpendTotals>,
    audit: HashMap<Scope, BTreeMap<AuditChain, Vec<AuditRow>>>,
    roots: HashMap<(Scope, RootKey), RootRecord>,
    root_receipts: HashMap<ExecutionId, RootReceipt>,
    api_keys: HashMap<KeyDigest, ApiKeyRecord>,
    /// Each limited subject's window, by `(scope, subject)` (SC-220).
    limit_windows: HashMap<(Scope, LimitSubject), LimitWindow>,
    /// What each limited execution counted at admission.
    limits_held: HashMap<ExecutionId, LimitsHeld>,
}

/// All stores in memory.
#[derive(Default)]
pub struct MemoryStores {
    tables: Mutex<Tables>,
}

impl MemoryStores {
    /// Empty stores.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> StoreResult<MutexGuard<'_, Tables>> {
        self.tables
            .lock()
            .map_err(|_| StoreError::Unavailable("in-memory store poisoned".into()))
    }
}

/// The windows an admitted claim leaves, when it was admitted, and the tokens it counts.
struct LimitsPlan {
    windows: Vec<((Scope, LimitSubject), LimitWindow)>,
    admitted_at: DateTime<Utc>,
    tokens: LimitTokens,
}

/// A session spend row: `(scope, consumer, session, currency)` (SC-105).
type SessionSpendKey = (Scope, ConsumerId, SessionId, Currency);
/// A day spend row: `(scope, consumer, day, currency)` (SC-105).
type DaySpendKey = (Scope, ConsumerId, NaiveDate, Currency);
type SpendKeys = (SessionSpendKey, DaySpendKey);

/// The two spend rows of an execution, in its snapshot's currency.
fn spend_keys(record: &ExecutionRecord) -> SpendKeys {
    let currency = rules::currency_of(record).clone();
    (
        (
            record.scope.clone(),
            record.consumer().clone(),
            record.session_id().clone(),
            currency.clone(),
        ),
        (
            record.scope.clone(),
            record.consumer().clone(),
            record.accounting_day,
            currency,
        ),
    )
}

impl Tables {
    /// The row under `(scope, key)` with its result, settlement and root receipt (H-10).
    fn view(&self, scope: &Scope, key: &OperationKey) -> Option<ExecutionView> {
        let execution = self
            .by_key
            .get(&(scope.clone(), key.clone()))
            .and_then(|id| self.executions.get(id))
            .cloned()?;
        let id = execution.id;
        Some(ExecutionView {
            result: self.results.get(&id).cloned(),
            settlement: self
                .settlement_by_execution
                .get(&id)
                .and_then(|i| self.settlements.get(*i))
                .cloned(),
            root_receipt: self.root_receipts.get(&id).cloned(),
            execution,
        })
    }

    /// Appends usage evidence to the inbox.
    fn record_evidence(
        &mut self,
        evidence: NewEvidence,
        acknowledged_at: Option<DateTime<Utc>>,
    ) -> Evidence {
        let row = Evidence {
            id: EvidenceId::new(),
            seq: self.evidence.len() as i64 + 1,
            scope: evidence.scope,
            execution_id: evidence.execution_id,
            operation_key: evidence.operation_key,
            provider_ref: evidence.provider_ref,
            usage: evidence.usage,
            exact: evidence.exact,
            source: evidence.source,
            received_at: evidence.now,
            acknowledged_at,
        };
        self.evidence.push(row.clone());
        row
    }

    /// The in-memory counterpart of Postgres' `UNIQUE (execution_id)` on settlements: one
    /// governed charge per execution.
    fn check_one_settlement(&self, execution_id: ExecutionId) -> StoreResult<()> {
        if self.settlement_by_execution.contains_key(&execution_id) {
            return Err(StoreError::Duplicate(format!(
                "settlement of {execution_id}"
            )));
        }
        Ok(())
    }

    /// Adds a settlement checked by [`Tables::check_one_settlement`].
    fn push_settlement(&mut self, settlement: SettlementRecord) {
        let index = self.settlements.len();
        self.settlement_by_execution
            .insert(settlement.execution_id, index);
        self.settlements.push(settlement);
    }

    fn append(&mut self, event: AuditEvent) -> AuditRow {
        let mut event = event;
        event.at = audit_time(event.at);
        let chain = event.chain();
        let rows = self
            .audit
            .entry(event.scope.clone())
            .or_insert_with(|| AuditChain::all().map(|c| (c, Vec::new())).collect())
            .entry(chain)
            .or_default();
        let prev = rows.last().map(|r| r.hash).unwrap_or(Digest256([0; 32]));
        let seq = rows.len() as i64 + 1;
        let hash = row_hash(chain, &prev, seq, &event);
        let row = AuditRow {
            chain,
            seq,
            event,
            prev_hash: prev,
            hash,
        };
        rows.push(row.clone());
        row
    }

    fn record_mut(&mut self, id: ExecutionId) -> StoreResult<&mut ExecutionRecord> {
        self.executions
            .get_mut(&id)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    fn spend(&self, keys: &SpendKeys) -> (SpendTotals, SpendTotals) {
        (
            self.session_spend.get(&keys.0).copied().unwrap_or_default(),
            self.daily_spend.get(&keys.1).copied().unwrap_or_default(),
        )
    }

    fn set_spend(&mut self, keys: SpendKeys, session: SpendTotals, daily: SpendTotals) {
        self.session_spend.insert(keys.0, session);
        self.daily_spend.insert(keys.1, daily);
    }

    fn root_of(&mut self, record: &ExecutionRecord) -> Option<&mut RootRecord> {
        let key = record.root_key.clone()?;
        self.roots.get_mut(&(record.scope.clone(), key))
    }

    /// Releases an execution's hold from its spend rows and root: all computed first, so an
    /// over-release (`HoldUnderflow`) changes nothing (SC-107).
    fn release(&mut self, record: &ExecutionRecord) -> StoreResult<()> {
        let root_held = match self.root_of(record) {
            Some(root) => Some(rules::release_hold(root.totals(), record.hold)?.held),
            None => None,
        };
        let keys = spend_keys(record);
        let (s, d) = self.spend(&keys);
        let session = rules::release_hold(s, record.hold)?;
        let daily = rules::release_hold(d, record.hold)?;
        if let (Some(held), Some(root)) = (root_held, self.root_of(record)) {
            root.held = held;
        }
        self.set_spend(keys, session, daily);
        Ok(())
    }

    /// The windows a claim under `claim` at `now` leaves, and what it counts, computed without
    /// writing anything, so that a refusal changes nothing (SC-220). Subjects are judged in
    /// ascending order of their stored text, as Postgres locks and judges them.
    fn plan_limits(
        &self,
        scope: &Scope,
        claim: &ClaimLimits,
        now: DateTime<Utc>,
    ) -> Result<LimitsPlan, LimitRefused> {
        let mut charges: Vec<_> = claim.charges.iter().collect();
        charges.sort_by_cached_key(|charge| charge.subject.stored());
        let mut windows = Vec::with_capacity(charges.len());
        for charge in charges {
            let key = (scope.clone(), charge.subject.clone());
            let window = limits::admit(self.limit_windows.get(&key), charge, claim.tokens, now)?;
            windows.push((key, window));
        }
        Ok(LimitsPlan {
            windows,
            admitted_at: now,
            tokens: claim.tokens,
        })
    }

    /// Writes an admitted claim's windows and what execution `id` counted.
    fn apply_limits(&mut self, id: ExecutionId, plan: LimitsPlan) {
        if plan.windows.is_empty() {
            return;
        }
        let subjects = plan
            .windows
            .iter()
            .map(|((_, subject), _)| subject.clone())
            .collect();
        self.limit_windows.extend(plan.windows);
        self.limits_held.insert(
            id,
            LimitsHeld {
                admitted_at: plan.admitted_at,
                subjects,
                tokens: plan.tokens,
            },
        );
    }

    /// What the end of execution `id` does to the windows that counted it: each subject's window
    /// that contains the admission time (SC-222, SC-223).
    fn end_limits(&mut self, id: ExecutionId, scope: &Scope, end: LimitEnd) {
        let Some(held) = self.limits_held.get(&id) else {
            return;
        };
        for subject in &held.subjects {
            let key = (scope.clone(), subject.clone());
            if let Some(window) = self.limit_windows.get_mut(&key) {
                *window = limits::end(*window, held.admitted_at, held.tokens, end);
            }
        }
    }

    /// Applies a fenced transition and audits it.
    fn transition(
        &mut self,
        fence: Fence,
        allowed: &[ExecutionState],
        now: DateTime<Utc>,
        kind: &str,
        change: impl FnOnce(&mut ExecutionRecord),
    ) -> StoreResult<ExecutionRecord> {
        let record = self.record_mut(fence.execution_id)?;
        rules::check_fence(record, fence, allowed)?;
        change(record);
        record.updated_at = now;
        let record = record.clone();
        self.append(rules::transition_event(&record, kind, now));
        Ok(record)
    }
}

#[async_trait]
impl ExecutionStore for MemoryStores {
    async fn claim(&self, request: ClaimRequest) -> StoreResult<ClaimOutcome> {
        let mut t = self.lock()?;
        let key = (request.scope.clone(), request.operation_key.clone());
        if t.by_key.contains_key(&key) {
            let existing = t
                .view(&key.0, &key.1)
                .ok_or_else(|| StoreError::Corrupt("key without row".into()))?;
            return Ok(ClaimOutcome::Existing(Box::new(existing)));
        }
        let record = rules::new_execution(&request);
        let keys = spend_keys(&record);
        let (session, daily) = t.spend(&keys);
        let currency = rules::currency_of(&record);
        let caps = &request.binding.config.caps;
        if let Err(blocked) = caps.admit(
            currency,
            &CurrencySpend::new(currency.clone(), session),
            &CurrencySpend::new(currency.clone(), daily),
            request.hold,
        )? {
            return Ok(ClaimOutcome::Blocked(blocked));
        }
        let mut root_held = None;
        if let Some(root_key) = &request.root_key {
            let root = t
                .root_mut(&request.scope, root_key)
                .ok_or_else(|| StoreError::NotFound(format!("root {root_key}")))?;
            if !rules::root_takes_claim(root, request.now) {
                return Ok(ClaimOutcome::RootRefused(root.clone()));
            }
            if let Err(blocked) =
                caps.admit_root(currency, &rules::root_spend(root), request.hold)?
            {
                return Ok(ClaimOutcome::Blocked(blocked));
            }
            root_held = Some((root_key, rules::add_hold(root.totals(), request.hold)?.held));
        }
        // The limits after the caps and the root, as in Postgres; computed before anything is
        // written.
        let plan = match t.plan_limits(&request.scope, &request.limits, request.now) {
            Ok(plan) => plan,
            Err(refused) => return Ok(ClaimOutcome::Limited(refused)),
        };
        if let Some((root_key, held)) = root_held {
            if let Some(root) = t.root_mut(&request.scope, root_key) {
                root.held = held;
                root.updated_at = request.now;
            }
        }
        let session = rules::add_hold(session, request.hold)?;
        let daily = rules::add_hold(daily, request.hold)?;
        t.apply_limits(record.id, plan);
        t.set_spend(keys, session, daily);
        t.by_key.insert(key, record.id);
        t.executions.insert(record.id, record.clone());
        for event in rules::claim_events(&record, request.now) {
            t.append(event);
        }
        Ok(ClaimOutcome::Claimed(record))
    }

    async fn mark_dispatched(
        &self,
        fence: Fence,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.lock()?
            .transition(fence, &[ExecutionState::Prepared], now, "dispatched", |r| {
                r.state = ExecutionState::Dispatched;
            })
    }

    async fn mark_dispatched_with_hold(
        &self,
        fence: Fence,
        hold: tollgate_core::Money,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut t = self.lock()?;
        let before = t
            .executions
            .get(&fence.execution_id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(fence.execution_id.to_string()))?;
        rules::check_fence(&before, fence, &[ExecutionState::Prepared])?;
        let shrink = rules::hold_shrink(&before, hold)?;
        t.release(&ExecutionRecord {
            hold: shrink,
            ..before
        })?;
        t.transition(fence, &[ExecutionState::Prepared], now, "dispatched", |r| {
            r.state = ExecutionState::Dispatched;
            r.hold = hold;
        })
    }

    async fn mark_not_dispatched(
        &self,
        fence: Fence,
        cause: NotDispatchedCause,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut t = self.lock()?;
        let before = t
            .executions
            .get(&fence.execution_id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(fence.execution_id.to_string()))?;
        rules::check_fence(&before, fence, &[ExecutionState::Prepared])?;
        t.release(&before)?;
        t.end_limits(before.id, &before.scope, LimitEnd::NotSent);
        t.transition(
            fence,
            &[ExecutionState::Prepared],
            now,
            "not_dispatched",
            |r| {
                r.state = ExecutionState::NotDispatched;
                r.not_dispatched_cause = Some(cause);
                r.hold = tollgate_core::Money::ZERO;
            },
        )
    }

    async fn mark_reconciliation_required(
        &self,
        fence: Fence,
        reason: ReconciliationReason,
        provider_ref: Option<String>,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut t = self.lock()?;
        let record = t.transition(
            fence,
            &[ExecutionState::Dispatched],
            now,
            "reconciliation_required",
            |r| {
                r.state = ExecutionState::ReconciliationRequired;
                r.reconciliation_reason = Some(reason);
                if provider_ref.is_some() {
                    r.provider_ref = provider_ref;
                }
            },
        )?;
        t.end_limits(record.id, &record.scope, LimitEnd::Parked);
        Ok(record)
    }

    async fn settle(&self, request: SettleRequest) -> StoreResult<SettleOutcome> {
        let mut t = self.lock()?;
        let record = t
            .executions
            .get(&request.fence.execution_id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(request.fence.execution_id.to_string()))?;
        rules::check_fence(&record, request.fence, &rules::SETTLEABLE)?;
        t.check_one_settlement(record.id)?;
        let keys = spend_keys(&record);
        let (s, d) = t.spend(&keys);
        let session = rules::apply_settlement(s, record.hold, request.amount)?;
        let daily = rules::apply_settlement(d, record.hold, request.amount)?;
        let settlement = rules::settlement_row(&record, &request);
        let mut result = rules::settled_result(&record, &request, session, daily)?;
        // Everything is computed before anything is written: an over-release or a currency
        // mismatch changes nothing (SC-106, SC-107).
        let mut root_update = None;
        if let Some(root) = t.root_of(&record) {
            rules::check_root_currency(root, rules::currency_of(&record))?;
            let totals = rules::apply_settlement(root.totals(), record.hold, request.amount)?;
            let after = RootRecord {
                charged: totals.settled,
                held: totals.held,
                updated_at: request.now,
                ..root.clone()
            };
            rules::apply_root_caps(&record, &mut result, &rules::root_spend(&after))?;
            root_update = Some(after);
        }
        // The call's own evidence, in the settlement's unit (H-15), acknowledged by it when it
        // is what was charged (H-28).
        let acknowledged_at = rules::own_evidence_acknowledged_at(&request);
        let recorded = request
            .evidence
            .clone()
            .map(|evidence| t.record_evidence(evidence, acknowledged_at).id);
        let named = rules::SettledEvidence::named(recorded, acknowledged_at, request.evidence_id);
        let mut root_receipt = None;
        if let Some(after) = root_update {
            let receipt = rules::root_receipt(&after, &settlement);
            if let Some(root) = t.root_of(&record) {
                *root = after;
            }
            t.root_receipts.insert(record.id, receipt.clone());
            root_receipt = Some(receipt);
        }
        let done = rules::completed(&record, &request, result.outcome);
        t.end_limits(
            record.id,
            &record.scope,
            LimitEnd::Settled {
                tokens: LimitTokens::of_usage(&request.usage),
                from_flight: record.state == ExecutionState::Dispatched,
            },
        );
        t.set_spend(keys, session, daily);
        t.push_settlement(settlement.clone());
        t.results.insert(record.id, result.clone());
        t.executions.insert(record.id, done.clone());
        t.append(rules::settled_event(
            &done,
            &settlement,
            &result,
            named,
            record.hold,
        ));
        Ok(SettleOutcome {
            record: done,
            settlement,
            result,
            session,
            daily,
            root_receipt,
        })
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
        let mut t = self.lock()?;
        let Some(id) = t.by_key.get(&(scope.clone(), key.clone())).copied() else {
            return Ok(None);
        };
        let record = t.record_mut(id)?;
        let eligible =
            states.contains(&record.state) && (!require_expired || record.lease_expires_at <= now);
        if !eligible {
            return Ok(None);
        }
        record.fence = FenceToken(record.fence.0 + 1);
        record.lease_expires_at = rules::lease_end(now, lease_ms);
        record.updated_at = now;
        let record = record.clone();
        t.append(rules::transition_event(&record, "fence_taken", now));
        Ok(Some(record))
    }

    async fn renew_lease(
        &self,
        fence: Fence,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut t = self.lock()?;
        let record = t.record_mut(fence.execution_id)?;
        rules::check_fence(record, fence, &rules::LEASED)?;
        record.lease_expires_at = rules::lease_end(now, lease_ms);
        Ok(record.clone())
    }

    async fn execution(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionRecord>> {
        let t = self.lock()?;
        Ok(t.by_key
            .get(&(scope.clone(), key.clone()))
            .and_then(|id| t.executions.get(id))
            .cloned())
    }

    async fn execution_view(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionView>> {
        Ok(self.lock()?.view(scope, key))
    }

    async fn execution_by_id(
        &self,
        scope: &Scope,
        id: ExecutionId,
    ) -> StoreResult<Option<ExecutionRecord>> {
        Ok(self
            .lock()?
            .executions
            .get(&id)
            .filter(|r| &r.scope == scope)
            .cloned())
    }

    async fn expired(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>> {
        let t = self.lock()?;
        let mut out: Vec<_> = t
            .executions
            .values()
            .filter(|r| {
                &r.scope == scope
                    && matches!(
                        r.state,
                        ExecutionState::Prepared | ExecutionState::Dispatched
                    )
                    && r.lease_expires_at <= now
            })
            .cloned()
            .collect();
        out.sort_by_key(|r| (r.lease_expires_at, r.id));
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn by_state(
        &self,
        scope: &Scope,
        state: ExecutionState,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>> {
        let t = self.lock()?;
        let mut out: Vec<_> = t
            .executions
            .values()
            .filter(|r| &r.scope == scope && r.state == state)
            .cloned()
            .collect();
        out.sort_by_key(|r| (r.created_at, r.id));
        out.truncate(limit as usize);
        Ok(out)
    }
}

fn erase_content(result: &mut ResultRecord, now: DateTime<Utc>) -> bool {
    if result.erased_at.is_some() {
        return false;
    }
    result.output = None;
    result.step = None;
    result.erased_at = Some(now);
    true
}

#[async_trait]
impl ResultStore for MemoryStores {
    async fn result(&self, execution_id: ExecutionId) -> StoreResult<Option<ResultRecord>> {
        Ok(self.lock()?.results.get(&execution_id).cloned())
    }

    async fn erase(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        let mut t = self.lock()?;
        let in_scope = t
            .executions
            .get(&execution_id)
            .is_some_and(|r| &r.scope == scope);
        let result = t
            .results
            .get_mut(&execution_id)
            .filter(|_| in_scope)
            .ok_or_else(|| StoreError::NotFound(execution_id.to_string()))?;
        if erase_content(result, now) {
            t.append(rules::erased_event(scope, execution_id, now));
        }
        Ok(())
    }

    async fn erase_expired(&self, now: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        let mut t = self.lock()?;
        let due: Vec<ExecutionId> = t
            .results
            .values()
            .filter(|r| r.erased_at.is_none() && r.retention_expires_at <= now)
            .map(|r| r.execution_id)
            .take(limit as usize)
            .collect();
        for id in &due {
            let scope = t.executions.get(id).map(|r| r.scope.clone());
            if let (Some(result), Some(scope)) = (t.results.get_mut(id), scope) {
                erase_content(result, now);
                t.append(rules::erased_event(&scope, *id, now));
            }
        }
        Ok(due.len() as u64)
    }
}

#[async_trait]
impl UsageInbox for MemoryStores {
    async fn record_evidence(&self, evidence: NewEvidence) -> StoreResult<Evidence> {
        Ok(self.lock()?.record_evidence(evidence, None))
    }

    async fn evidence_for(&self, execution_id: ExecutionId) -> StoreResult<Vec<Evidence>> {
        Ok(self
            .lock()?
            .evidence
            .iter()
            .filter(|e| e.execution_id == execution_id)
            .cloned()
            .collect())
    }

    async fn unacknowledged(
        &self,
        scope: &Scope,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<Evidence>> {
        Ok(self
            .lock()?
            .evidence
            .iter()
            .filter(|e| &e.scope == scope && e.seq > after && e.acknowledged_at.is_none())
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn acknowledge(
        &self,
        scope: &Scope,
        id: EvidenceId,
        now: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let mut t = self.lock()?;
        let evidence = t
            .evidence
            .iter_mut()
            .find(|e| e.id == id && &e.scope == scope)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        if evidence.acknowledged_at.is_some() {
            return Ok(false);
        }
        evidence.acknowledged_at = Some(now);
        let event = rules::evidence_acknowledged_event(scope, evidence, now);
        t.append(event);
        Ok(true)
    }
}

#[async_trait]
impl SettlementStore for MemoryStores {
    async fn settlement(&self, execution_id: ExecutionId) -> StoreResult<Option<SettlementRecord>> {
        let t = self.lock()?;
        Ok(t.settlement_by_execution
            .get(&execution_id)
            .and_then(|i| t.settlements.get(*i))
            .cloned())
    }

    async fn settlements(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>> {
        Ok(self
            .lock()?
            .settlements
            .iter()
            .filter(|s| s.accounting_day >= from && s.accounting_day <= to)
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn scope_settlements(
        &self,
        scope: &Scope,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>> {
        let mut rows: Vec<SettlementRecord> = self
            .lock()?
            .settlements
            .iter()
            .filter(|s| &s.scope == scope && s.accounting_day >= from && s.accounting_day <= to)
            .cloned()
            .collect();
        // Insert order is settlement order; a stable sort by day keeps it within a day.
        rows.sort_by_key(|s| s.accounting_day);
        rows.truncate(limit as usize);
        Ok(rows)
    }

    async fn feed_position(
        &self,
        scope: &Scope,
        id: SettlementId,
    ) -> StoreResult<Option<FeedPosition>> {
        // The n-th settlement (from 1) sits at (n, n), as in `settlements_after`.
        Ok(self
            .lock()?
            .settlements
            .iter()
            .zip(1u64..)
            .find(|(s, _)| s.id == id && &s.scope == scope)
            .map(|(_, n)| FeedPosition {
                txid: n,
                seq: i64::try_from(n).unwrap_or(i64::MAX),
            }))
    }

    async fn settlements_after(
        &self,
        scope: Option<&Scope>,
        after: FeedPosition,
        limit: u32,
    ) -> StoreResult<Vec<FeedEntry>> {
        // Every write is atomic under the lock: insert order is commit order, so the n-th
        // settlement (from 1) sits at (n, n).
        Ok(self
            .lock()?
            .settlements
            .iter()
            .zip(1u64..)
            .map(|(s, n)| FeedEntry {
                position: FeedPosition {
                    txid: n,
                    seq: i64::try_from(n).unwrap_or(i64::MAX),
                },
                settlement: s.clone(),
            })
            .filter(|e| e.position > after && scope.is_none_or(|sc| &e.settlement.scope == sc))
            .take(limit as usize)
            .collect())
    }
}

#[async_trait]
impl SpendStore for MemoryStores {
    async fn session_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        session: &SessionId,
        currency: &Currency,
    ) -> StoreResult<SpendTotals> {
        Ok(self
            .lock()?
            .session_spend
            .get(&(
                scope.clone(),
                consumer.clone(),
                session.clone(),
                currency.clone(),
            ))
            .copied()
            .unwrap_or_default())
    }

    async fn daily_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        day: NaiveDate,
        currency: &Currency,
    ) -> StoreResult<SpendTotals> {
        Ok(self
            .lock()?
            .daily_spend
            .get(&(scope.clone(), consumer.clone(), day, currency.clone()))
            .copied()
            .unwrap_or_default())
    }

    async fn limit_windows(&self, scope: &Scope) -> StoreResult<Vec<(LimitSubject, LimitWindow)>> {
        let t = self.lock()?;
        let mut windows: Vec<_> = t
            .limit_windows
            .iter()
            .filter(|((s, _), _)| s == scope)
            .map(|((_, subject), window)| (subject.clone(), *window))
            .collect();
        windows.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(windows)
    }
}

#[async_trait]
impl AuditLog for MemoryStores {
    async fn append_audit(&self, event: AuditEvent) -> StoreResult<AuditRow> {
        Ok(self.lock()?.append(event))
    }

    async fn audit_rows(
        &self,
        scope: &Scope,
        after: AuditPosition,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>> {
        Ok(self
            .lock()?
            .audit
            .get(scope)
            .map(|chains| {
                chains
                    .range(after.chain..)
                    .flat_map(|(_, rows)| rows.iter())
                    .filter(|r| r.position() > after)
                    .take(limit as usize)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn audit_heads(&self, scope: &Scope) -> StoreResult<Vec<AuditHead>> {
        Ok(self
            .lock()?
            .audit
            .get(scope)
            .map(|chains| {
                chains
                    .iter()
                    .map(|(chain, rows)| AuditHead {
                        chain: *chain,
                        seq: rows.last().map_or(0, |r| r.seq),
                        hash: rows.last().map_or(Digest256([0; 32]), |r| r.hash),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }
}

mod api_keys;
mod ledger;
mod roots;
mod work;

/// Test hooks below the store methods (feature `test-support`), for the conformance suite and
/// the simulation in the test kit (`tollgate-testkit`).
#[cfg(feature = "test-support")]
impl MemoryStores {
    /// The settlement insert with only its one-per-execution check, as `settle` makes it.
    ///
    /// # Errors
    /// `Duplicate` when the execution already has a settlement.
    pub fn insert_settlement_unchecked(
        &self,
        settlement: &SettlementRecord,
    ) -> StoreResult<SettlementRecord> {
        let mut t = self.lock()?;
        t.check_one_settlement(settlement.execution_id)?;
        t.push_settlement(settlement.clone());
        Ok(settlement.clone())
    }

    /// The current fence of execution `id`, in whatever scope it is.
    ///
    /// # Errors
    /// `NotFound` when there is no such execution.
    pub fn current_fence(&self, id: ExecutionId) -> StoreResult<Fence> {
        self.lock()?
            .executions
            .get(&id)
            .map(ExecutionRecord::fence)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }
}
