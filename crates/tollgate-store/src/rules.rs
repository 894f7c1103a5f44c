//! Pure pieces shared by every store implementation, so that they cannot drift: building rows,
//! applying holds and settlements to spend, the post-call block check, audit details.

use crate::error::{StoreError, StoreResult};
use crate::rows::*;
use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use tollgate_core::caps::{CapLevel, CurrencySpend, SpendTotals};
use tollgate_core::ids::{EvidenceId, ExecutionId, FenceToken, Scope, SettlementId};
use tollgate_core::money::{Currency, Money};
use tollgate_core::state::{ExecutionState, Outcome};

/// The lease end of a fence taken at `now`.
pub fn lease_end(now: DateTime<Utc>, lease_ms: u64) -> DateTime<Utc> {
    let ms = i64::try_from(lease_ms).unwrap_or(i64::MAX);
    now.checked_add_signed(Duration::milliseconds(ms))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// The `prepared` row a claim inserts. Its id puts its audit rows in its consumer's chain, in
/// the consumer's chain group, so consumers in different groups never wait on one chain head
/// and a batch of one consumer's calls moves one head (H-33).
pub fn new_execution(request: &ClaimRequest) -> ExecutionRecord {
    let chain = AuditChain::of_consumer(
        request.scope.as_str(),
        request.binding.config.consumer.as_str(),
    );
    ExecutionRecord {
        id: AuditChain::new_execution_in_chain(chain),
        scope: request.scope.clone(),
        operation_key: request.operation_key.clone(),
        kind: request.binding.config.kind,
        root_key: request.root_key.clone(),
        binding_digest: request.digest(),
        binding: request.binding.clone(),
        accounting_day: request.now.date_naive(),
        state: if request.dispatch {
            ExecutionState::Dispatched
        } else {
            ExecutionState::Prepared
        },
        not_dispatched_cause: None,
        reconciliation_reason: None,
        outcome: None,
        fence: FenceToken(1),
        lease_expires_at: lease_end(request.now, request.lease_ms),
        hold: request.hold,
        provider_ref: None,
        created_at: request.now,
        updated_at: request.now,
    }
}

/// Adds a hold.
///
/// # Errors
/// Overflow.
pub fn add_hold(totals: SpendTotals, hold: Money) -> StoreResult<SpendTotals> {
    Ok(SpendTotals {
        settled: totals.settled,
        held: totals
            .held
            .checked_add(hold)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
    })
}

/// Releases a hold. Releasing more than is held is an error, never floored at zero (SC-107).
///
/// # Errors
/// `HoldUnderflow` when `hold` is more than `totals.held`.
pub fn release_hold(totals: SpendTotals, hold: Money) -> StoreResult<SpendTotals> {
    let held = totals
        .held
        .checked_sub(hold)
        .map_err(|_| StoreError::HoldUnderflow {
            held: totals.held,
            release: hold,
        })?;
    Ok(SpendTotals {
        settled: totals.settled,
        held,
    })
}

/// How much a hold shrinks when `record`'s hold becomes `hold` before dispatch (SC-122).
///
/// # Errors
/// `HoldGrows` when `hold` is above the current hold.
pub fn hold_shrink(record: &ExecutionRecord, hold: Money) -> StoreResult<Money> {
    if hold > record.hold {
        return Err(StoreError::HoldGrows(record.id));
    }
    Ok(record.hold.checked_sub(hold)?)
}

/// Releases a hold and adds a settled amount.
///
/// # Errors
/// `HoldUnderflow` (see [`release_hold`]); overflow.
pub fn apply_settlement(
    totals: SpendTotals,
    hold: Money,
    amount: Money,
) -> StoreResult<SpendTotals> {
    let released = release_hold(totals, hold)?;
    Ok(SpendTotals {
        settled: released
            .settled
            .checked_add(amount)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        held: released.held,
    })
}

/// The currency an execution is charged in: its snapshot's (price table's), which is also the
/// currency of its caps and of the spend rows it counts against (SC-105).
pub fn currency_of(record: &ExecutionRecord) -> &Currency {
    &record.binding.config.currency
}

/// The currency of a root's totals: its binding snapshot's (SC-106).
pub fn root_currency(root: &RootRecord) -> &Currency {
    &root.binding.config.currency
}

/// A root's totals tagged with its currency.
pub fn root_spend(root: &RootRecord) -> CurrencySpend {
    CurrencySpend::new(root_currency(root).clone(), root.totals())
}

/// Checks that a call in `currency` may count against `root`'s totals.
///
/// # Errors
/// `CurrencyMismatch` when the root keeps its totals in another currency.
pub fn check_root_currency(root: &RootRecord, currency: &Currency) -> StoreResult<()> {
    root_spend(root).totals_in(currency)?;
    Ok(())
}

/// Checks that `fence` is current on `record` and the state is one of `allowed`.
///
/// # Errors
/// `StaleFence`.
pub fn check_fence(
    record: &ExecutionRecord,
    fence: Fence,
    allowed: &[ExecutionState],
) -> StoreResult<()> {
    if record.fence != fence.token || !allowed.contains(&record.state) {
        return Err(StoreError::StaleFence(record.id));
    }
    Ok(())
}

/// The states whose lease a live call renews (the unfinished ones).
pub const LEASED: [ExecutionState; 2] = [ExecutionState::Prepared, ExecutionState::Dispatched];

/// The states `settle` accepts.
pub const SETTLEABLE: [ExecutionState; 2] = [
    ExecutionState::Dispatched,
    ExecutionState::ReconciliationRequired,
];

/// The governed charge row of a settlement.
pub fn settlement_row(record: &ExecutionRecord, request: &SettleRequest) -> SettlementRecord {
    let config = &record.binding.config;
    SettlementRecord {
        id: SettlementId::new(),
        execution_id: record.id,
        scope: record.scope.clone(),
        operation_key: record.operation_key.clone(),
        kind: record.kind,
        consumer: config.consumer.clone(),
        session_id: record.binding.session_id.clone(),
        accounting_day: record.accounting_day,
        provider: config.provider.clone(),
        model: config.model.clone(),
        price_version: config.price_version.to_string(),
        policy_version: config.policy_version.to_string(),
        currency: config.currency.clone(),
        usage: request.usage,
        amount: request.amount,
        source: request.source,
        settled_at: request.now,
    }
}

/// The stored result, after the post-call block check on the settled totals (SC-15, SC-16):
/// warnings keep the output; an exceeded block cap turns the outcome into `blocked` and drops
/// output and step. The cost is settled either way. `session` and `daily` are the totals of the
/// execution's own spend rows, which are kept in its currency.
///
/// # Errors
/// `CurrencyMismatch` (never on rows picked by the execution's currency).
pub fn settled_result(
    record: &ExecutionRecord,
    request: &SettleRequest,
    session: SpendTotals,
    daily: SpendTotals,
) -> StoreResult<ResultRecord> {
    let currency = currency_of(record);
    let warnings = record.binding.config.caps.after_settle(
        currency,
        &CurrencySpend::new(currency.clone(), session),
        &CurrencySpend::new(currency.clone(), daily),
    )?;
    let blocked = warnings.iter().any(|w| w.level == CapLevel::Block)
        && request.outcome != Outcome::Unavailable;
    let retention = i64::try_from(record.binding.config.result_retention_secs).unwrap_or(i64::MAX);
    Ok(ResultRecord {
        execution_id: record.id,
        outcome: if blocked {
            Outcome::Blocked
        } else {
            request.outcome
        },
        stop: request.stop.clone(),
        output: if blocked {
            None
        } else {
            request.output.clone()
        },
        step: if blocked { None } else { request.step.clone() },
        warnings,
        retention_expires_at: request
            .now
            .checked_add_signed(Duration::seconds(retention))
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
        erased_at: None,
    })
}

/// The completed journal row.
pub fn completed(
    record: &ExecutionRecord,
    request: &SettleRequest,
    outcome: Outcome,
) -> ExecutionRecord {
    let mut done = record.clone();
    done.state = ExecutionState::Completed;
    done.outcome = Some(outcome);
    done.hold = Money::ZERO;
    if request.provider_ref.is_some() {
        done.provider_ref.clone_from(&request.provider_ref);
    }
    done.updated_at = request.now;
    done
}

/// Audit event for a journal transition (metadata only).
pub fn transition_event(record: &ExecutionRecord, kind: &str, at: DateTime<Utc>) -> AuditEvent {
    AuditEvent {
        scope: record.scope.clone(),
        execution_id: Some(record.id),
        kind: kind.to_string(),
        detail: json!({
            "operation_key": record.operation_key.as_str(),
            "state": record.state.as_str(),
            "fence": record.fence.0,
            "binding_digest": record.binding_digest.to_hex(),
            "hold": record.hold.to_string(),
            "cause": record.not_dispatched_cause.map(|c| c.as_str()),
            "reconciliation_reason": record.reconciliation_reason.map(|r| r.as_str()),
            "outcome": record.outcome.map(|o| o.as_str()),
        }),
        at,
    }
}

/// The audit events of a claim, in order: `claimed` (as the row was `prepared`), then, for a
/// claim that is also the dispatch mark, `dispatched`: the same trail as a claim followed by
/// `mark_dispatched`.
pub fn claim_events(record: &ExecutionRecord, at: DateTime<Utc>) -> Vec<AuditEvent> {
    if record.state != ExecutionState::Dispatched {
        return vec![transition_event(record, "claimed", at)];
    }
    let prepared = ExecutionRecord {
        state: ExecutionState::Prepared,
        ..record.clone()
    };
    vec![
        transition_event(&prepared, "claimed", at),
        transition_event(record, "dispatched", at),
    ]
}

/// When a settlement acknowledges the call's own evidence (`request.evidence`), which it records
/// in its unit: when that evidence is the execution's, exact, and its usage is the usage charged.
/// That is what `reconcile_usage` would find and acknowledge later (SC-42), so the settlement
/// acknowledges it at once and no later pass reads and writes it again (H-28): the answer is the acknowledgement time (`request.now`).
/// `None`: the evidence stays open for reconciliation (or there is none).
pub fn own_evidence_acknowledged_at(request: &SettleRequest) -> Option<DateTime<Utc>> {
    request
        .evidence
        .as_ref()
        .filter(|e| {
            e.execution_id == request.fence.execution_id && e.exact && e.usage == request.usage
        })
        .map(|_| request.now)
}

/// The evidence a settlement names in its audit row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SettledEvidence {
    /// The evidence the charged usage came from: the call's own, recorded in the settlement's
    /// unit, or the inbox row recovery or an operator settled from. `None`: none named.
    pub id: Option<EvidenceId>,
    /// Whether the settlement acknowledged it ([`own_evidence_acknowledged_at`]).
    pub acknowledged: bool,
}

impl SettledEvidence {
    /// What a settlement names: the call's own evidence when it was `recorded` in the
    /// settlement's unit (acknowledged when [`own_evidence_acknowledged_at`] answered
    /// `acknowledged_at`), else the inbox row it was `settled_from` (recovery, an operator),
    /// which the settlement does not acknowledge.
    pub fn named(
        recorded: Option<EvidenceId>,
        acknowledged_at: Option<DateTime<Utc>>,
        settled_from: Option<EvidenceId>,
    ) -> Self {
        match recorded {
            Some(id) => Self {
                id: Some(id),
                acknowledged: acknowledged_at.is_some(),
            },
            None => Self {
                id: settled_from,
                acknowledged: false,
            },
        }
    }
}

/// Audit event of a settlement; its detail names the evidence (`evidence_id`, `null` when none)
/// and whether the settlement acknowledged it (`evidence_acknowledged`), the hold the settlement
/// released (`hold`) and whether the charge is above it (`above_hold`): a provider that billed
/// more than the worst case held is recorded, never silent (SC-207).
pub fn settled_event(
    record: &ExecutionRecord,
    settlement: &SettlementRecord,
    result: &ResultRecord,
    evidence: SettledEvidence,
    hold: Money,
) -> AuditEvent {
    AuditEvent {
        scope: record.scope.clone(),
        execution_id: Some(record.id),
        kind: "settled".into(),
        detail: json!({
            "operation_key": record.operation_key.as_str(),
            "settlement_id": settlement.id.to_string(),
            "amount": settlement.amount.to_string(),
            "currency": settlement.currency.as_str(),
            "source": settlement.source.as_str(),
            "outcome": result.outcome.as_str(),
            "fence": record.fence.0,
            "evidence_id": evidence.id.map(|id| id.to_string()),
            "evidence_acknowledged": evidence.acknowledged,
            "hold": hold.to_string(),
            "above_hold": settlement.amount > hold,
        }),
        at: settlement.settled_at,
    }
}

/// Audit event of a result's erasure (metadata only: the content is gone).
pub fn erased_event(scope: &Scope, id: ExecutionId, now: DateTime<Utc>) -> AuditEvent {
    AuditEvent {
        scope: scope.clone(),
        execution_id: Some(id),
        kind: "erased".into(),
        detail: json!({}),
        at: now,
    }
}

/// Audit event of an evidence acknowledgement by reconcile usage (a settlement that acknowledges
/// its own evidence says so in its `settled` row instead).
pub fn evidence_acknowledged_event(
    scope: &Scope,
    evidence: &Evidence,
    now: DateTime<Utc>,
) -> AuditEvent {
    AuditEvent {
        scope: scope.clone(),
        execution_id: Some(evidence.execution_id),
        kind: "evidence_acknowledged".into(),
        detail: json!({"evidence_id": evidence.id.to_string(), "seq": evidence.seq}),
        at: now,
    }
}

/// The active root an open inserts.
pub fn new_root(request: &OpenRootRequest) -> RootRecord {
    RootRecord {
        id: tollgate_core::ids::RootId::new(),
        scope: request.scope.clone(),
        root_key: request.root_key.clone(),
        binding_digest: request
            .binding
            .digest_in(tollgate_core::digest::ROOT_BINDING_DOMAIN),
        binding: request.binding.clone(),
        deadline: request.deadline,
        state: RootState::Active,
        reserved_calls: 0,
        charged: Money::ZERO,
        held: Money::ZERO,
        created_at: request.now,
        updated_at: request.now,
    }
}

/// Whether a root admits a new call at `now`.
pub fn root_admits(root: &RootRecord, now: DateTime<Utc>) -> bool {
    root.state == RootState::Active && now < root.deadline
}

/// Whether a root takes a child claim at `now` (ST-36): never once it is `reconciled` or its
/// deadline has passed. A closed root before its deadline still takes the claims of the calls it
/// admitted (ST-33). Decided under the root lock, in the claim's own unit.
pub fn root_takes_claim(root: &RootRecord, now: DateTime<Utc>) -> bool {
    root.state != RootState::Reconciled && now < root.deadline
}

/// Whether the calls of a closed or expired root are all accounted for (ST-36): every call under
/// it is final, and either at least `reserved_calls` calls exist or the deadline has passed. Past
/// its deadline a root takes no claim ([`root_takes_claim`]), so a reserved slot without a call
/// (its claim failed, or the process died between the two writes) can never be filled and is not
/// waited for.
pub fn root_calls_settled(
    root: &RootRecord,
    now: DateTime<Utc>,
    calls: i64,
    all_final: bool,
) -> bool {
    all_final && (calls >= root.reserved_calls || now >= root.deadline)
}

/// The root receipt of a settlement.
pub fn root_receipt(root: &RootRecord, settlement: &SettlementRecord) -> RootReceipt {
    RootReceipt {
        root_id: root.id,
        execution_id: settlement.execution_id,
        amount: settlement.amount,
        currency: settlement.currency.clone(),
        created_at: settlement.settled_at,
    }
}

/// Applies the root caps to a settled result: warnings kept, an exceeded root block cap
/// suppresses the output after the known cost is settled (ST-7, SC-16). `root` carries the
/// root's totals after the settlement.
///
/// # Errors
/// `CurrencyMismatch` when the root keeps its totals in another currency than the call.
pub fn apply_root_caps(
    record: &ExecutionRecord,
    result: &mut ResultRecord,
    root: &CurrencySpend,
) -> StoreResult<()> {
    let crossed = record
        .binding
        .config
        .caps
        .after_settle_root(currency_of(record), root)?;
    let blocked = crossed.iter().any(|w| w.level == CapLevel::Block);
    result.warnings.extend(crossed);
    if blocked && result.outcome != Outcome::Unavailable {
        result.outcome = Outcome::Blocked;
        result.output = None;
        result.step = None;
    }
    Ok(())
}

/// Audit event of a root change (metadata only).
pub fn root_event(root: &RootRecord, kind: &str, at: DateTime<Utc>) -> AuditEvent {
    AuditEvent {
        scope: root.scope.clone(),
        execution_id: None,
        kind: kind.to_string(),
        detail: json!({
            "root_key": root.root_key.as_str(),
            "root_id": root.id.to_string(),
            "state": root.state.as_str(),
            "reserved_calls": root.reserved_calls,
            "charged": root.charged.to_string(),
            "binding_digest": root.binding_digest.to_hex(),
        }),
        at,
    }
}

/// The next state of a root at `now` given whether all its reserved calls are final, or `None`
/// when it stays as it is.
pub fn root_next_state(
    root: &RootRecord,
    now: DateTime<Utc>,
    all_final: bool,
) -> Option<RootState> {
    match root.state {
        RootState::Active if now >= root.deadline => Some(RootState::Expired),
        RootState::Closed | RootState::Expired if all_final => Some(RootState::Reconciled),
        _ => None,
    }
}

/// Audit event of a repaired root receipt (metadata only).
pub fn root_receipt_repaired_event(
    root: &RootRecord,
    receipt: &RootReceipt,
    at: DateTime<Utc>,
) -> AuditEvent {
    AuditEvent {
        scope: root.scope.clone(),
        execution_id: Some(receipt.execution_id),
        kind: "root_receipt_repaired".into(),
        detail: json!({
            "root_key": root.root_key.as_str(),
            "root_id": root.id.to_string(),
            "amount": receipt.amount.to_string(),
            "charged": root.charged.to_string(),
        }),
        at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Money {
        Money::parse(s, "t").unwrap_or(Money::ZERO)
    }

    #[test]
    fn sc_107_releasing_more_than_is_held_is_an_error() {
        let totals = SpendTotals {
            settled: m("1"),
            held: m("0.5"),
        };
        assert_eq!(
            release_hold(totals, m("0.5")),
            Ok(SpendTotals {
                settled: m("1"),
                held: Money::ZERO
            })
        );
        let over = StoreError::HoldUnderflow {
            held: m("0.5"),
            release: m("0.6"),
        };
        assert_eq!(release_hold(totals, m("0.6")), Err(over.clone()));
        assert_eq!(apply_settlement(totals, m("0.6"), m("0.1")), Err(over));
    }
}
