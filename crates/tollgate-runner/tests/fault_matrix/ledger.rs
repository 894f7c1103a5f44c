//! The ledger's sums, computed from store reads only.

use chrono::{Duration, NaiveDate};
use std::collections::BTreeMap;
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::{ConsumerId, ExecutionId, RootKey, Scope, SessionId};
use tollgate_core::money::{Currency, Money};
use tollgate_core::state::ExecutionState;
use tollgate_store::audit::verify_chain;
use tollgate_store::{AllStores, EvidenceSource, ExecutionRecord, RootState, SettlementRecord};

/// Reads of at most this many rows are enough for one combination.
const PAGE: u32 = 10_000;

const STATES: [ExecutionState; 5] = [
    ExecutionState::Prepared,
    ExecutionState::Dispatched,
    ExecutionState::Completed,
    ExecutionState::NotDispatched,
    ExecutionState::ReconciliationRequired,
];

fn is_open(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Prepared
            | ExecutionState::Dispatched
            | ExecutionState::ReconciliationRequired
    )
}

fn add(a: Money, b: Money) -> Money {
    a.checked_add(b).unwrap()
}

fn days() -> (NaiveDate, NaiveDate) {
    let day = tollgate_testkit::conformance::t0().date_naive();
    (day - Duration::days(1), day + Duration::days(2))
}

/// Every settlement of `scope` (the days around the test clock's).
async fn scope_settlements(stores: &dyn AllStores, scope: &Scope) -> Vec<SettlementRecord> {
    let (from, to) = days();
    let mut all = stores.settlements(from, to, PAGE).await.unwrap();
    all.retain(|s| &s.scope == scope);
    all
}

/// How many governed charges the execution has.
pub async fn settlements_of(stores: &dyn AllStores, id: ExecutionId) -> usize {
    let (from, to) = days();
    let all = stores.settlements(from, to, PAGE).await.unwrap();
    all.iter().filter(|s| s.execution_id == id).count()
}

/// Why an execution awaiting an operator should not: `Some` when the call's own evidence (the
/// stream's or late, not an operator's) holds exactly one consistent exact piece that its snapshot
/// prices — recovery would have settled it.
pub async fn settleable_evidence(stores: &dyn AllStores, row: &ExecutionRecord) -> Option<String> {
    let evidence = stores.evidence_for(row.id).await.unwrap();
    let mut exact = evidence
        .iter()
        .filter(|e| e.exact && e.source != EvidenceSource::Operator);
    let first = exact.next()?;
    if !exact.all(|e| e.usage == first.usage) {
        return None;
    }
    row.binding
        .config
        .prices
        .cost(&first.usage)
        .ok()
        .map(|amount| format!("exact evidence worth {amount} is in the inbox"))
}

/// A root must end `reconciled` once its calls are final; it may wait for an operator only for a
/// call that awaits one.
pub async fn root_finished(
    stores: &dyn AllStores,
    scope: &Scope,
    root_key: &RootKey,
) -> Vec<String> {
    let Some(root) = stores.root(scope, root_key).await.unwrap() else {
        return Vec::new();
    };
    if root.state == RootState::Reconciled {
        return Vec::new();
    }
    let calls = executions(stores, scope)
        .await
        .into_iter()
        .filter(|r| r.root_key.as_ref() == Some(root_key))
        .collect::<Vec<_>>();
    let awaiting_operator = calls
        .iter()
        .any(|r| r.state == ExecutionState::ReconciliationRequired);
    if awaiting_operator {
        return Vec::new();
    }
    vec![format!(
        "root {} stuck {} with {} reserved slot(s) and {} call(s) ({})",
        short(root_key.as_str()),
        root.state.as_str(),
        root.reserved_calls,
        calls.len(),
        calls
            .iter()
            .map(|r| r.state.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )]
}

fn short(key: &str) -> &str {
    key.get(..24).unwrap_or(key)
}

async fn executions(stores: &dyn AllStores, scope: &Scope) -> Vec<ExecutionRecord> {
    let mut all = Vec::new();
    for state in STATES {
        all.extend(stores.by_state(scope, state, PAGE).await.unwrap());
    }
    all
}

/// The ledger of `scope`, from store reads: spend settled = the sum of the settlements per
/// consumer and day (and per consumer and session); spend held = the holds of the open
/// executions; finished executions hold nothing, open ones keep their hold; one settlement per
/// completed execution and none for any other; a root's charged total = the sum of its receipts
/// (one per completed call, equal to its governed charge) and its held total = the holds of its
/// open calls; the scope's audit chain verifies.
///
/// The store's own ledger audit (`LedgerAudit::audit_ledger`) must agree: clean when these
/// sums are.
pub async fn violations(stores: &dyn AllStores, scope: &Scope, roots: &[RootKey]) -> Vec<String> {
    let mut out = Vec::new();
    match stores.audit_ledger(Some(scope), 100).await {
        Ok(report) if report.ok => {}
        Ok(report) => out.extend(
            report
                .violations
                .iter()
                .map(|v| format!("ledger audit: {v}")),
        ),
        Err(e) => out.push(format!("ledger audit failed: {e}")),
    }
    let rows = executions(stores, scope).await;
    let settlements = scope_settlements(stores, scope).await;
    let mut charges: BTreeMap<ExecutionId, Vec<&SettlementRecord>> = BTreeMap::new();
    for s in &settlements {
        charges.entry(s.execution_id).or_default().push(s);
    }
    let mut daily: BTreeMap<(ConsumerId, NaiveDate, Currency), SpendTotals> = BTreeMap::new();
    let mut session: BTreeMap<(ConsumerId, SessionId, Currency), SpendTotals> = BTreeMap::new();
    for row in &rows {
        let key = row.operation_key.as_str();
        let charged = charges.get(&row.id).map_or(0, Vec::len);
        let open = is_open(row.state);
        match (row.state, charged) {
            (ExecutionState::Completed, 1) => {}
            (ExecutionState::Completed, n) => {
                out.push(format!("{key}: completed with {n} charges"))
            }
            (_, 0) => {}
            (state, n) => out.push(format!("{key}: {state} with {n} charges")),
        }
        if open && row.hold == Money::ZERO {
            out.push(format!("{key}: {} without its hold", row.state));
        }
        if !open && row.hold != Money::ZERO {
            out.push(format!("{key}: {} still holds {}", row.state, row.hold));
        }
        let currency = row.binding.config.currency.clone();
        let d = daily
            .entry((row.consumer().clone(), row.accounting_day, currency.clone()))
            .or_default();
        let s = session
            .entry((row.consumer().clone(), row.session_id().clone(), currency))
            .or_default();
        if open {
            d.held = add(d.held, row.hold);
            s.held = add(s.held, row.hold);
        }
    }
    for charge in &settlements {
        if !rows.iter().any(|r| r.id == charge.execution_id) {
            out.push(format!("a charge of {} has no execution", charge.amount));
        }
        let currency = charge.currency.clone();
        let d = daily
            .entry((
                charge.consumer.clone(),
                charge.accounting_day,
                currency.clone(),
            ))
            .or_default();
        d.settled = add(d.settled, charge.amount);
        let s = session
            .entry((charge.consumer.clone(), charge.session_id.clone(), currency))
            .or_default();
        s.settled = add(s.settled, charge.amount);
    }
    for ((consumer, day, currency), expected) in &daily {
        let stored = stores
            .daily_spend(scope, consumer, *day, currency)
            .await
            .unwrap();
        if stored != *expected {
            out.push(format!(
                "daily spend of {consumer} on {day} is {stored:?}, the journal says {expected:?}"
            ));
        }
    }
    for ((consumer, id, currency), expected) in &session {
        let stored = stores
            .session_spend(scope, consumer, id, currency)
            .await
            .unwrap();
        if stored != *expected {
            out.push(format!(
                "session spend of {consumer} in {id} is {stored:?}, the journal says {expected:?}"
            ));
        }
    }
    for root_key in roots {
        let Some(root) = stores.root(scope, root_key).await.unwrap() else {
            continue;
        };
        let name = short(root_key.as_str());
        let receipts = stores.root_receipts(scope, root_key, PAGE).await.unwrap();
        let charged = receipts.iter().fold(Money::ZERO, |a, r| add(a, r.amount));
        if root.charged != charged {
            out.push(format!(
                "root {name} charged {} but its receipts sum to {charged}",
                root.charged
            ));
        }
        let calls: Vec<&ExecutionRecord> = rows
            .iter()
            .filter(|r| r.root_key.as_ref() == Some(root_key))
            .collect();
        let held = calls
            .iter()
            .filter(|r| is_open(r.state))
            .fold(Money::ZERO, |a, r| add(a, r.hold));
        if root.held != held {
            out.push(format!(
                "root {name} holds {} but its open calls hold {held}",
                root.held
            ));
        }
        for call in calls {
            let mine: Vec<_> = receipts
                .iter()
                .filter(|r| r.execution_id == call.id)
                .collect();
            let charge = charges.get(&call.id).and_then(|c| c.first());
            match (call.state, mine.as_slice(), charge) {
                (ExecutionState::Completed, [receipt], Some(charge))
                    if receipt.amount == charge.amount => {}
                (ExecutionState::Completed, ..) => out.push(format!(
                    "{}: completed under root {name} with {} receipt(s) for its charge",
                    call.operation_key,
                    mine.len()
                )),
                (_, [], _) => {}
                (state, ..) => out.push(format!(
                    "{}: {state} under root {name} has a root receipt",
                    call.operation_key
                )),
            }
        }
    }
    let audit = stores
        .audit_rows(scope, tollgate_store::AuditPosition::START, PAGE)
        .await
        .unwrap();
    if let Err(broken) = verify_chain(&audit) {
        out.push(format!("the audit chain does not verify: {broken:?}"));
    }
    out
}
