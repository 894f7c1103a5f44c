//! Two recoverers and two schedulers racing over the same stores: two `Reconciler`s (two
//! processes, each with its own store wrapper) on the same expired executions and the same
//! unacknowledged evidence. The durable record must show one finish per execution, at most one
//! settlement and one acknowledgement, and fence tokens that only go up (SC-41, SC-42, H-3).

use super::*;
use std::collections::BTreeMap;
use tollgate_core::state::{ExecutionState, Outcome};
use tollgate_runner::Clock as _;
use tollgate_store::fault::{Fault, FaultKind, StoreOp};
use tollgate_store::{
    AuditRow, ClaimOutcome, ClaimRequest, EvidenceSource, ExecutionRecord, NewEvidence,
    SettleRequest,
};

/// Rows per round.
const ROWS: usize = 24;
/// Rounds.
const ROUNDS: usize = 3;
/// Lease of the racers' fences.
const LEASE_MS: u64 = 10_000;

fn acme() -> Scope {
    scope("acme")
}

/// Another process over the same inner stores, yielding at every store call so that racers
/// interleave even over the in-memory stores.
fn process(h: &Harness) -> Arc<FaultyStores> {
    let stores = Arc::new(FaultyStores::new(h.faults.inner().clone()));
    stores.interleave();
    stores
}

fn reconciler(h: &Harness, stores: &Arc<FaultyStores>) -> Reconciler {
    Reconciler::new(stores.clone(), h.clock.clone())
}

async fn claim(h: &Harness, key: &str) -> ExecutionRecord {
    let config = tollgate_testkit::conformance::text_config();
    let request = ClaimRequest {
        scope: acme(),
        operation_key: OperationKey::parse(key).unwrap(),
        root_key: None,
        hold: config.worst_case_hold().unwrap(),
        binding: tollgate_testkit::conformance::binding("s-1", config),
        now: h.clock.now(),
        lease_ms: 30_000,
        dispatch: false,
        limits: tollgate_core::limits::ClaimLimits::default(),
        binding_digest: None,
    };
    match h.stores.claim(request).await.unwrap() {
        ClaimOutcome::Claimed(r) => r,
        other => panic!("{other:?}"),
    }
}

async fn evidence(h: &Harness, r: &ExecutionRecord, u: Usage, exact: bool) -> EvidenceId {
    h.stores
        .record_evidence(NewEvidence {
            scope: acme(),
            execution_id: r.id,
            operation_key: r.operation_key.clone(),
            provider_ref: Some("req-1".into()),
            usage: u,
            exact,
            source: EvidenceSource::Stream,
            now: h.clock.now(),
        })
        .await
        .unwrap()
        .id
}

/// Every audit row of the scope, in chain order.
async fn audit(h: &Harness) -> Vec<AuditRow> {
    let mut rows = Vec::new();
    loop {
        let after = rows
            .last()
            .map_or(tollgate_store::AuditPosition::START, AuditRow::position);
        let page = h.stores.audit_rows(&acme(), after, 500).await.unwrap();
        if page.is_empty() {
            return rows;
        }
        rows.extend(page);
    }
}

/// Each execution's fence tokens in chain order, and its count of each event kind.
type Trail = (Vec<i64>, BTreeMap<String, usize>);

fn trails(rows: &[AuditRow]) -> BTreeMap<ExecutionId, Trail> {
    let mut out: BTreeMap<ExecutionId, Trail> = BTreeMap::new();
    for row in rows {
        let Some(id) = row.event.execution_id else {
            continue;
        };
        let trail = out.entry(id).or_default();
        if let Some(fence) = row.event.detail["fence"].as_i64() {
            trail.0.push(fence);
        }
        *trail.1.entry(row.event.kind.clone()).or_default() += 1;
    }
    out
}

/// Fence tokens only go up: never down along the chain, and every `fence_taken` strictly up.
fn assert_fences_only_go_up(rows: &[AuditRow]) {
    let mut last: BTreeMap<ExecutionId, i64> = BTreeMap::new();
    for row in rows {
        let (Some(id), Some(fence)) = (row.event.execution_id, row.event.detail["fence"].as_i64())
        else {
            continue;
        };
        let before = last.insert(id, fence).unwrap_or(0);
        assert!(
            fence >= before,
            "fence of {id} went down: {before} → {fence}"
        );
        if row.event.kind == "fence_taken" {
            assert!(fence > before, "a fence of {id} was taken twice: {fence}");
        }
    }
}

/// SC-41, H-3: two schedulers race `reconcile_expired` over the same expired executions —
/// prepared claims, dispatched calls with exact evidence and without — after a third process died
/// right after taking a fence. Each execution is finished exactly once, settled at most once, and
/// its fence tokens only go up.
pub async fn sc_41_h_3_two_schedulers_race_on_expired_executions(h: Harness) {
    let mut expected: BTreeMap<ExecutionId, ExecutionState> = BTreeMap::new();
    for round in 0..ROUNDS {
        for i in 0..ROWS {
            let r = claim(&h, &format!("x{round}-{i}")).await;
            let state = match i % 3 {
                0 => ExecutionState::NotDispatched,
                1 => {
                    let r = h
                        .stores
                        .mark_dispatched(r.fence(), h.clock.now())
                        .await
                        .unwrap();
                    evidence(&h, &r, usage(10, 5), true).await;
                    ExecutionState::Completed
                }
                _ => {
                    h.stores
                        .mark_dispatched(r.fence(), h.clock.now())
                        .await
                        .unwrap();
                    ExecutionState::ReconciliationRequired
                }
            };
            expected.insert(r.id, state);
        }
        h.clock.advance_ms(30_001);
        // A third process takes the first fence and dies: that execution is taken over once its
        // new lease ends, under a higher token.
        let doomed = process(&h);
        doomed.inject(Fault {
            op: StoreOp::TakeFence,
            nth: 1,
            kind: FaultKind::DieAfter,
        });
        let pass = tokio::spawn({
            let r = reconciler(&h, &doomed);
            async move { r.reconcile_expired(&acme(), 100, LEASE_MS).await }
        });
        doomed.died().await;
        pass.abort();
        h.clock.advance_ms(LEASE_MS as i64 + 1);
        let start = Arc::new(tokio::sync::Barrier::new(2));
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let r = reconciler(&h, &process(&h));
                let start = start.clone();
                tokio::spawn(async move {
                    start.wait().await;
                    let mut finished = 0;
                    loop {
                        let counts = r.reconcile_expired(&acme(), 7, LEASE_MS).await.unwrap();
                        if counts.executions == 0 {
                            return finished;
                        }
                        finished += counts.executions;
                    }
                })
            })
            .collect();
        let mut split = Vec::new();
        for racer in racers {
            split.push(racer.await.unwrap());
        }
        eprintln!("round {round}: the two schedulers finished {split:?}");
        let finished: u64 = split.iter().sum();
        assert_eq!(
            finished, ROWS as u64,
            "round {round}: each execution finished once"
        );
    }
    let day = t0().date_naive();
    let settlements = h.stores.settlements(day, day, 10_000).await.unwrap();
    let rows = audit(&h).await;
    assert_fences_only_go_up(&rows);
    let trails = trails(&rows);
    for (id, state) in &expected {
        let record = h
            .stores
            .execution_by_id(&acme(), *id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.state, *state, "{}", record.operation_key);
        let charges = settlements.iter().filter(|s| s.execution_id == *id).count();
        let settled = usize::from(*state == ExecutionState::Completed);
        assert_eq!(charges, settled, "{}: settlements", record.operation_key);
        let (fences, kinds) = &trails[id];
        let finishes: usize = ["not_dispatched", "settled", "reconciliation_required"]
            .iter()
            .map(|k| kinds.get(*k).copied().unwrap_or(0))
            .sum();
        assert_eq!(finishes, 1, "{}: {kinds:?}", record.operation_key);
        let taken = kinds.get("fence_taken").copied().unwrap_or(0);
        assert!(
            (1..=2).contains(&taken),
            "{}: fences taken {taken}",
            record.operation_key
        );
        assert_eq!(record.fence.0, 1 + taken as i64, "{}", record.operation_key);
        assert_eq!(fences.last().copied(), Some(record.fence.0));
    }
    // The dead process's fence was taken over once per round.
    let taken_twice = trails
        .values()
        .filter(|(_, kinds)| kinds.get("fence_taken") == Some(&2))
        .count();
    assert_eq!(taken_twice, ROUNDS);
    let d = h.daily().await;
    let open = expected
        .values()
        .filter(|s| **s == ExecutionState::ReconciliationRequired)
        .count();
    let hold = tollgate_testkit::conformance::text_config()
        .worst_case_hold()
        .unwrap();
    let held = (0..open).fold(Money::ZERO, |a, _| a.checked_add(hold).unwrap());
    assert_eq!(
        d.held, held,
        "only the calls awaiting an operator keep their hold"
    );
    let completed = settlements.len();
    assert_eq!(completed, ROUNDS * ROWS / 3);
}

/// SC-42: two schedulers race `reconcile_usage` over the same unacknowledged evidence — evidence
/// that equals its settlement, inexact evidence, and late evidence that disagrees. Each matching
/// row is acknowledged exactly once, and the passes' counts add up to the acknowledgements; the
/// others stay pending; settlements are never rewritten.
pub async fn sc_42_two_usage_reconcilers_race_on_unacknowledged_evidence(h: Harness) {
    let mut matching = Vec::new();
    let mut pending = Vec::new();
    let mut total_counted = 0;
    for round in 0..ROUNDS {
        for i in 0..ROWS {
            let r = claim(&h, &format!("u{round}-{i}")).await;
            let r = h
                .stores
                .mark_dispatched(r.fence(), h.clock.now())
                .await
                .unwrap();
            let exact = evidence(&h, &r, usage(10, 5), true).await;
            h.stores
                .settle(SettleRequest {
                    fence: r.fence(),
                    usage: usage(10, 5),
                    amount: m("0.00002"),
                    source: tollgate_core::state::SettlementSource::Stream,
                    outcome: Outcome::Success,
                    stop: Some("stop".into()),
                    output: None,
                    step: None,
                    provider_ref: Some("req-1".into()),
                    evidence_id: Some(exact),
                    evidence: None,
                    now: h.clock.now(),
                    seen: None,
                })
                .await
                .unwrap();
            matching.push(exact);
            match i % 4 {
                0 => pending.push(evidence(&h, &r, usage(10, 4), false).await),
                1 => pending.push(evidence(&h, &r, usage(10, 9), true).await),
                _ => {}
            }
        }
        let never = |_: &OperationKey| false;
        let start = Arc::new(tokio::sync::Barrier::new(2));
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let r = reconciler(&h, &process(&h));
                let start = start.clone();
                tokio::spawn(async move {
                    start.wait().await;
                    let (mut after, mut acknowledged) = (None, 0);
                    loop {
                        let counts = r
                            .reconcile_usage(&acme(), Some(5), after, &never)
                            .await
                            .unwrap();
                        acknowledged += counts.acknowledged;
                        match counts.cursor {
                            Some(cursor) => after = Some(cursor),
                            None => return acknowledged,
                        }
                    }
                })
            })
            .collect();
        let mut split = Vec::new();
        for racer in racers {
            split.push(racer.await.unwrap());
        }
        eprintln!("round {round}: the two passes counted {split:?} acknowledgements of {ROWS}");
        total_counted += split.iter().sum::<u64>();
    }
    let rows = audit(&h).await;
    let mut acknowledgements: BTreeMap<String, usize> = BTreeMap::new();
    for row in rows
        .iter()
        .filter(|r| r.event.kind == "evidence_acknowledged")
    {
        let id = row.event.detail["evidence_id"]
            .as_str()
            .unwrap()
            .to_string();
        *acknowledgements.entry(id).or_default() += 1;
    }
    for id in &matching {
        assert_eq!(
            acknowledgements.get(&id.to_string()),
            Some(&1),
            "evidence {id} is acknowledged exactly once"
        );
    }
    assert_eq!(
        acknowledgements.len(),
        matching.len(),
        "nothing else acknowledged"
    );
    let open = h.stores.unacknowledged(&acme(), 0, 10_000).await.unwrap();
    let mut open_ids: Vec<_> = open.iter().map(|e| e.id).collect();
    open_ids.sort();
    pending.sort();
    assert_eq!(
        open_ids, pending,
        "inexact and disagreeing evidence stays pending"
    );
    let day = t0().date_naive();
    let settlements = h.stores.settlements(day, day, 10_000).await.unwrap();
    assert_eq!(settlements.len(), matching.len());
    assert!(settlements.iter().all(|s| s.usage == usage(10, 5)));
    // The passes' own counts add up to the durable record: a row both racers reached is counted
    // by the one that acknowledged it.
    assert_eq!(total_counted, matching.len() as u64);
}
