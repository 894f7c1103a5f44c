//! Checks on the whole store, read through the in-memory stores' public read methods: after every
//! step (caps), every 25 steps and at the end (the ledger), and once after the final phase.
//!
//! - SC-16, ST-7 (every step): each capped row within its block cap (see `oracle`).
//! - SC-13, SC-52 (ledger): at most one settlement per execution; a settlement exactly for each
//!   completed execution; spend settled = the sum of settlements per consumer and session / day;
//!   held = the holds of open executions; finished executions hold nothing.
//! - ST-6 (ledger): a root's charged total = the sum of its receipts, its held total = the holds
//!   of its open calls, and each completed call under a root has a receipt equal to its charge.
//! - H-4, SC-41, SC-61 (final): nothing `prepared` or `dispatched` is left; every
//!   `reconciliation_required` execution has a reason (no usable evidence when the last fence
//!   was taken); roots whose calls are all final are reconciled.
//! - SC-12, SC-13 (final): a key was sent at most once, and only if its execution was dispatched.
//! - SC-42 (final): after the last usage pass, exactly the evidence that matches a durable
//!   settlement (or zero evidence of an unsent call) is acknowledged.
//! - SC-40 (final): every settlement with a cost is backed by exact evidence of that usage.
//! - SC-202 (final): a call whose own settlement failed once while its process lived on with its
//!   fence ends settled from its stream.

use super::oracle::check_rows;
use super::provider::SimProvider;
use super::shared::{Row, Shared};
use super::universe::{currency, id, scope, SCOPES};
use chrono::NaiveDate;
use std::collections::BTreeMap;
use tollgate_core::ids::{ExecutionId, OperationKey, Scope};
use tollgate_core::money::Money;
use tollgate_core::state::ExecutionState as S;
use tollgate_store::*;

const ALL: [S; 5] = [
    S::Prepared,
    S::Dispatched,
    S::Completed,
    S::NotDispatched,
    S::ReconciliationRequired,
];

fn add(a: Money, b: Money) -> Money {
    a.checked_add(b).unwrap_or(a)
}

fn open(state: S) -> bool {
    matches!(
        state,
        S::Prepared | S::Dispatched | S::ReconciliationRequired
    )
}

/// Every execution of every scope.
pub async fn executions(shared: &Shared) -> Vec<ExecutionRecord> {
    let mut all = Vec::new();
    for s in 0..SCOPES.len() {
        for state in ALL {
            let rows = shared.truth.by_state(&scope(s), state, u32::MAX).await;
            all.extend(rows.unwrap_or_default());
        }
    }
    all
}

async fn settlements(shared: &Shared) -> BTreeMap<ExecutionId, Vec<SettlementRecord>> {
    let from = NaiveDate::from_ymd_opt(2000, 1, 1).unwrap();
    let to = NaiveDate::from_ymd_opt(2100, 1, 1).unwrap();
    let rows = shared.truth.settlements(from, to, u32::MAX).await;
    let mut by = BTreeMap::<ExecutionId, Vec<SettlementRecord>>::new();
    for row in rows.unwrap_or_default() {
        by.entry(row.execution_id).or_default().push(row);
    }
    by
}

/// After every step: the block caps of every session and day row seen (roots are checked at
/// each commit that touches them, which covers every instant too).
pub async fn sample(shared: &Shared) {
    let rows: Vec<Row> = shared
        .model()
        .rows
        .iter()
        .filter(|r| !matches!(r, Row::Root(..)))
        .cloned()
        .collect();
    check_rows(shared, &rows).await;
}

fn spend_rows(record: &ExecutionRecord) -> [Row; 2] {
    let (s, c) = (record.scope.to_string(), record.consumer().to_string());
    [
        Row::Session(s.clone(), c.clone(), record.session_id().to_string()),
        Row::Daily(s, c, record.accounting_day),
    ]
}

/// The whole ledger, at any instant (every store write is atomic).
pub async fn ledger(shared: &Shared) {
    // The store's own ledger audit must agree with the sums below.
    match tollgate_store::LedgerAudit::audit_ledger(shared.truth.as_ref(), None, 10).await {
        Ok(report) if report.ok => {}
        Ok(report) => shared.violation(format!(
            "SC-90: ledger audit: {}",
            report
                .first()
                .map_or_else(|| "violations".to_string(), |v| v.to_string())
        )),
        Err(e) => shared.violation(format!("SC-90: ledger audit failed: {e}")),
    }
    let all = executions(shared).await;
    let settled = settlements(shared).await;
    let mut expected = BTreeMap::<Row, (Money, Money)>::new();
    for record in &all {
        let what = format!("{}/{}", record.scope, record.operation_key);
        let charges = settled.get(&record.id).map_or(&[][..], |v| v.as_slice());
        if charges.len() > 1 {
            shared.violation(format!("SC-13: {} settlements of {what}", charges.len()));
        }
        if (record.state == S::Completed) != (charges.len() == 1) {
            shared.violation(format!(
                "SC-52: {what} is {} with {} settlements",
                record.state,
                charges.len()
            ));
        }
        if !open(record.state) && record.hold != Money::ZERO {
            shared.violation(format!(
                "{what} is {} and still holds {}",
                record.state, record.hold
            ));
        }
        let amount = charges.iter().fold(Money::ZERO, |a, c| add(a, c.amount));
        let held = if open(record.state) {
            record.hold
        } else {
            Money::ZERO
        };
        for row in spend_rows(record) {
            let e = expected.entry(row).or_insert((Money::ZERO, Money::ZERO));
            *e = (add(e.0, amount), add(e.1, held));
        }
    }
    for (row, (settled, held)) in expected {
        check_spend(shared, &row, settled, held).await;
    }
    roots(shared, &all, &settled).await;
}

async fn check_spend(shared: &Shared, row: &Row, settled: Money, held: Money) {
    let truth = &shared.truth;
    let totals = match row {
        Row::Session(s, c, n) => {
            let (s, c, n) = (id(s), id(c), id(n));
            truth.session_spend(&s, &c, &n, &currency()).await
        }
        Row::Daily(s, c, day) => truth.daily_spend(&id(s), &id(c), *day, &currency()).await,
        Row::Root(..) => return,
    };
    let Ok(totals) = totals else { return };
    if totals.settled != settled || totals.held != held {
        shared.violation(format!(
            "SC-52: {row:?} holds settled {} held {}, its executions say {settled} / {held}",
            totals.settled, totals.held
        ));
    }
}

async fn roots(
    shared: &Shared,
    all: &[ExecutionRecord],
    settled: &BTreeMap<ExecutionId, Vec<SettlementRecord>>,
) {
    let keys: Vec<Row> = shared.model().rows.iter().cloned().collect();
    for row in keys {
        let Row::Root(s, k) = &row else { continue };
        let (scope, key) = (id::<Scope>(s), id::<tollgate_core::ids::RootKey>(k));
        let Ok(Some(root)) = shared.truth.root(&scope, &key).await else {
            continue;
        };
        let calls: Vec<&ExecutionRecord> = all
            .iter()
            .filter(|r| r.scope == scope && r.root_key.as_ref() == Some(&key))
            .collect();
        let receipts = shared.truth.root_receipts(&scope, &key, u32::MAX).await;
        let receipts = receipts.unwrap_or_default();
        let charged = receipts.iter().fold(Money::ZERO, |a, r| add(a, r.amount));
        let held = calls
            .iter()
            .filter(|r| open(r.state))
            .fold(Money::ZERO, |a, r| add(a, r.hold));
        if root.charged != charged || root.held != held {
            shared.violation(format!(
                "ST-6: root {k} charged {} held {}, its receipts and calls say {charged} / {held}",
                root.charged, root.held
            ));
        }
        for call in calls.iter().filter(|c| c.state == S::Completed) {
            let charge = settled
                .get(&call.id)
                .and_then(|v| v.first())
                .map(|c| c.amount);
            let receipt = receipts
                .iter()
                .find(|r| r.execution_id == call.id)
                .map(|r| r.amount);
            if charge != receipt {
                shared.violation(format!(
                    "ST-6: {k}/{} charged {charge:?} with root receipt {receipt:?}",
                    call.operation_key
                ));
            }
        }
    }
}

/// After the final phase.
pub async fn final_checks(shared: &Shared, provider: &SimProvider) {
    let all = executions(shared).await;
    for record in &all {
        let what = format!("{}/{}", record.scope, record.operation_key);
        if matches!(record.state, S::Prepared | S::Dispatched) {
            shared.violation(format!(
                "H-4: {what} left {} after the final recovery",
                record.state
            ));
        }
        let evidence = shared
            .truth
            .evidence_for(record.id)
            .await
            .unwrap_or_default();
        if record.state == S::ReconciliationRequired {
            if let Some(missing) = unexplained(shared, record, &evidence) {
                shared.violation(format!("SC-41: {what} awaits an operator {missing}"));
            }
        }
        acknowledgements(shared, record, &evidence, &what).await;
    }
    sends(shared, provider).await;
    reconciled_roots(shared, &all).await;
    blips(shared, &all).await;
}

/// SC-202: a call whose own settlement failed once (the store briefly away) and whose process
/// lived on with its fence ends settled by its own drive (source `stream`): its output kept,
/// never handed to recovery.
async fn blips(shared: &Shared, all: &[ExecutionRecord]) {
    for (id, blip) in shared.blips() {
        let Some(record) = all.iter().find(|r| r.id == id) else {
            continue;
        };
        if blip.excused.is_some() {
            continue;
        }
        let settlement = shared.truth.settlement(id).await.ok().flatten();
        // Its own settlement from the stream, under the fence its drive held.
        let kept = record.state == S::Completed
            && record.fence == blip.token
            && settlement
                .is_some_and(|s| s.source == tollgate_core::state::SettlementSource::Stream);
        if !kept {
            shared.violation(format!(
                "SC-202: {}/{} had one failed settlement while {} held its fence, and ended {} \
                 without its own settlement",
                record.scope, record.operation_key, blip.proc, record.state
            ));
        }
    }
}

/// Why a `reconciliation_required` execution could not be settled from its evidence: the
/// evidence committed before the fence of the writer that moved it there.
fn unexplained(shared: &Shared, record: &ExecutionRecord, evidence: &[Evidence]) -> Option<String> {
    let model = shared.model();
    let Some(known) = model.executions.get(&record.id) else {
        return Some("but was never seen claimed".into());
    };
    let Some((token, commit)) = known.reconciled else {
        return Some("but was never seen moving there".into());
    };
    let cutoff = if token == 1 {
        commit
    } else {
        known.fences.get(&token).copied().unwrap_or(commit)
    };
    let seen: Vec<&Evidence> = evidence
        .iter()
        .filter(|e| model.evidence.get(&e.id).is_some_and(|c| *c < cutoff))
        .filter(|e| e.exact)
        .collect();
    let first = seen.first()?;
    if seen.iter().any(|e| e.usage != first.usage) {
        return None;
    }
    record.binding.config.prices.cost(&first.usage).ok()?;
    Some(format!(
        "although exact evidence (total {}) was in the inbox when fence {token} was taken",
        first.usage.total()
    ))
}

async fn acknowledgements(
    shared: &Shared,
    record: &ExecutionRecord,
    evidence: &[Evidence],
    what: &str,
) {
    let settlement = shared.truth.settlement(record.id).await.ok().flatten();
    if let Some(s) = &settlement {
        let backed = s.usage.is_zero() || evidence.iter().any(|e| e.exact && e.usage == s.usage);
        if !backed {
            shared.violation(format!(
                "SC-40: {what} settled ({}) with usage no exact evidence shows",
                s.source.as_str()
            ));
        }
    }
    for e in evidence {
        let matches = e.exact
            && match record.state {
                S::Completed => settlement.as_ref().is_some_and(|s| s.usage == e.usage),
                S::NotDispatched => e.usage.is_zero(),
                _ => false,
            };
        if matches != e.acknowledged_at.is_some() {
            shared.violation(format!(
                "SC-42: evidence of {what} (exact {}, total {}) acknowledged {} in state {}",
                e.exact,
                e.usage.total(),
                e.acknowledged_at.is_some(),
                record.state
            ));
        }
    }
}

async fn sends(shared: &Shared, provider: &SimProvider) {
    for ((s, k), n) in provider.sends() {
        let what = format!("{s}/{k}");
        if n > 1 {
            shared.violation(format!("SC-13: {what} was sent {n} times"));
        }
        let record = shared
            .truth
            .execution(&id(&s), &id::<OperationKey>(&k))
            .await;
        match record.ok().flatten() {
            Some(r) if matches!(r.state, S::NotDispatched | S::Prepared) => {
                shared.violation(format!("SC-12: {what} was sent and is {}", r.state))
            }
            Some(_) => {}
            None => shared.violation(format!("SC-12: {what} was sent and has no execution")),
        }
    }
}

async fn reconciled_roots(shared: &Shared, all: &[ExecutionRecord]) {
    let keys: Vec<Row> = shared.model().rows.iter().cloned().collect();
    let mut roots: Vec<(Scope, tollgate_core::ids::RootKey)> = all
        .iter()
        .filter_map(|r| r.root_key.clone().map(|k| (r.scope.clone(), k)))
        .collect();
    roots.extend(keys.iter().filter_map(|row| match row {
        Row::Root(s, k) => Some((id(s), id(k))),
        _ => None,
    }));
    roots.sort();
    roots.dedup();
    for (scope, key) in roots {
        let Ok(Some(root)) = shared.truth.root(&scope, &key).await else {
            continue;
        };
        let calls: Vec<&ExecutionRecord> = all
            .iter()
            .filter(|r| r.scope == scope && r.root_key.as_ref() == Some(&key))
            .collect();
        let done =
            calls.len() as i64 >= root.reserved_calls && calls.iter().all(|c| c.state.is_final());
        if done && root.state != RootState::Reconciled {
            shared.violation(format!(
                "H-4: root {key} is {} with every call final",
                root.state.as_str()
            ));
        }
    }
}
