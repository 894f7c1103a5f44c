//! The ledger-audit part of the conformance suite (instantiated by [`crate::store_conformance!`]
//! through [`crate::ledger_conformance!`]): after the flows the runners drive, the audit is
//! clean (also for one consumer charged in two currencies); a settlement the store was handed
//! unpriced is reported by name.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use super::*;
use tollgate_store::ledger::{LedgerInvariant, LedgerReport};

/// Instantiates the ledger-audit cases for `$factory` (stores that implement [`AllStores`]).
#[macro_export]
macro_rules! ledger_conformance {
    ($factory:expr) => {
        $crate::store_conformance!(@tests $factory;
            sc_90_ledger_audit_is_clean_after_the_runners_flows,
            sc_90_ledger_audit_is_clean_after_concurrent_calls,
            sc_91_ledger_audit_names_an_unpriced_settlement,
            sc_109_ledger_audit_checks_spend_per_currency,
        );
    };
}

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input,
        output,
        ..Usage::ZERO
    }
}

/// A settlement of `usage` priced with the execution's snapshot, as the runners settle.
fn priced(record: &ExecutionRecord, usage: Usage) -> SettleRequest {
    let amount = record.binding.config.prices.cost(&usage).unwrap();
    let mut req = settle_req(record, "0", "x");
    req.usage = usage;
    req.amount = amount;
    req
}

/// A zero settlement (a refusal proof, a rejected request).
fn zero(record: &ExecutionRecord) -> SettleRequest {
    let mut req = priced(record, Usage::ZERO);
    req.outcome = Outcome::Refused;
    req.output = None;
    req
}

async fn evidence<S: AllStores>(s: &S, r: &ExecutionRecord, usage: Usage, ack: bool) -> Evidence {
    let e = s
        .record_evidence(NewEvidence {
            scope: r.scope.clone(),
            execution_id: r.id,
            operation_key: r.operation_key.clone(),
            provider_ref: None,
            usage,
            exact: true,
            source: EvidenceSource::Stream,
            now: t0(),
        })
        .await
        .unwrap();
    if ack {
        s.acknowledge(&r.scope, e.id, t0()).await.unwrap();
    }
    e
}

fn step() -> CallConfig {
    let mut c = text_config();
    c.kind = CallKind::Step;
    c
}

fn under_root(key_: &str, hold: &str) -> ClaimRequest {
    let mut req = claim_req("a", key_, step(), hold);
    req.root_key = Some(super::root_key("r1"));
    req
}

async fn audit<S: AllStores>(s: &S, scope_: Option<&str>) -> LedgerReport {
    let scope_ = scope_.map(scope);
    s.audit_ledger(scope_.as_ref(), 100).await.unwrap()
}

pub async fn sc_90_ledger_audit_is_clean_after_the_runners_flows<S: AllStores>(s: Arc<S>) {
    let empty = audit(&*s, None).await;
    assert!(empty.ok && empty.violations.is_empty(), "{empty:?}");

    // A call settled from its stream, its evidence acknowledged.
    let d = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    evidence(&*s, &d, usage(10, 5), false).await;
    let out = s.settle(priced(&d, usage(10, 5))).await.unwrap();
    evidence(&*s, &out.record, usage(10, 5), true).await;
    // Not dispatched, with zero evidence acknowledged.
    let p = claimed(&*s, claim_req("a", "k2", text_config(), "0.4")).await;
    let nd = s
        .mark_not_dispatched(p.fence(), NotDispatchedCause::Input, t0())
        .await
        .unwrap();
    evidence(&*s, &nd, Usage::ZERO, true).await;
    // Reconciliation required, then settled by an operator with stated usage.
    let d = dispatched(&*s, claim_req("a", "k3", text_config(), "0.3")).await;
    s.mark_reconciliation_required(d.fence(), ReconciliationReason::NoResponse, None, t0())
        .await
        .unwrap();
    let op = s
        .take_fence(
            &scope("a"),
            &key("k3"),
            &[ExecutionState::ReconciliationRequired],
            false,
            1000,
            t0(),
        )
        .await
        .unwrap()
        .unwrap();
    let mut req = priced(&op, usage(7, 3));
    req.source = SettlementSource::Operator;
    s.settle(req).await.unwrap();
    // Open calls hold: prepared, dispatched, awaiting an operator; one in another session and
    // one on the next day.
    claimed(&*s, claim_req("a", "k4", text_config(), "0.2")).await;
    let mut other_session = claim_req("a", "k5", text_config(), "0.25");
    other_session.binding = binding("s-2", text_config());
    dispatched(&*s, other_session).await;
    let mut next_day = claim_req("a", "k6", text_config(), "0.125");
    next_day.now = t0() + Duration::days(1);
    let d = dispatched(&*s, next_day).await;
    s.mark_reconciliation_required(d.fence(), ReconciliationReason::NoResponse, None, t0())
        .await
        .unwrap();
    // A refusal settles at zero.
    let d = dispatched(&*s, claim_req("a", "k7", text_config(), "0.5")).await;
    s.settle(zero(&d)).await.unwrap();
    // A root with steps: settled, settled at zero, in flight, never sent.
    super::open_root(&*s, "r1", step()).await;
    for _ in 0..4 {
        s.reserve_slot(&scope("a"), &super::root_key("r1"), t0())
            .await
            .unwrap();
    }
    let d = dispatched(&*s, under_root("c1", "0.5")).await;
    s.settle(priced(&d, usage(100, 50))).await.unwrap();
    let d = dispatched(&*s, under_root("c2", "0.5")).await;
    s.settle(zero(&d)).await.unwrap();
    claimed(&*s, under_root("c3", "0.375")).await;
    let p = claimed(&*s, under_root("c4", "0.5")).await;
    s.mark_not_dispatched(p.fence(), NotDispatchedCause::Aborted, t0())
        .await
        .unwrap();
    // Another scope.
    let d = dispatched(&*s, claim_req("b", "k1", text_config(), "0.5")).await;
    s.settle(priced(&d, usage(1, 1))).await.unwrap();

    let report = audit(&*s, Some("a")).await;
    assert!(report.ok, "{:?}", report.violations);
    assert_eq!(report.scope, Some(scope("a")));
    let c = report.checked;
    assert_eq!(c.scopes, 1);
    assert_eq!(c.executions, 11);
    assert_eq!(c.settlements, 5, "k1, k3, k7, c1, c2");
    assert_eq!(c.roots, 1);
    assert_eq!(c.root_receipts, 2);
    assert_eq!(c.evidence, 2, "acknowledged rows only");
    assert_eq!(c.spend_rows, 4, "sessions s-1, s-2; days t0, t0 + 1");

    let all = audit(&*s, None).await;
    assert!(all.ok, "{:?}", all.violations);
    assert_eq!(all.scope, None);
    assert_eq!(all.checked.scopes, 2);
    assert_eq!(all.checked.executions, 12);
    assert!(audit(&*s, Some("nobody")).await.ok);
}

/// Claims, sends, refusals and settlements racing on one consumer's spend rows leave a ledger
/// whose totals agree with its rows.
pub async fn sc_90_ledger_audit_is_clean_after_concurrent_calls<S: AllStores + 'static>(s: Arc<S>) {
    let mut tasks = Vec::new();
    for i in 0..24u64 {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let r = claimed(&*s, claim_req("a", &format!("k{i}"), text_config(), "0.1")).await;
            match i % 3 {
                0 => {
                    s.mark_not_dispatched(r.fence(), NotDispatchedCause::Aborted, t0())
                        .await
                        .unwrap();
                }
                1 => {
                    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
                    s.settle(priced(&d, usage(i, 2 * i))).await.unwrap();
                }
                _ => {
                    s.mark_dispatched(r.fence(), t0()).await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = audit(&*s, Some("a")).await;
    assert!(report.ok, "{:?}", report.violations);
    assert_eq!(report.checked.executions, 24);
    assert_eq!(report.checked.settlements, 8);
}

/// The store takes the amount it is handed; the audit prices the usage again and names the
/// settlement whose amount is not its usage's price.
pub async fn sc_91_ledger_audit_names_an_unpriced_settlement<S: AllStores>(s: Arc<S>) {
    let d = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let out = s.settle(settle_req(&d, "0.1", "x")).await.unwrap();
    let report = audit(&*s, Some("a")).await;
    assert!(!report.ok);
    assert_eq!(report.violations_total, 1, "{:?}", report.violations);
    let v = report.first().unwrap();
    assert_eq!(v.invariant, LedgerInvariant::SettlementPriced);
    assert_eq!(v.reason, "amount");
    assert_eq!(v.execution_id, Some(d.id));
    assert_eq!(v.settlement_id, Some(out.settlement.id));
    assert_eq!(v.expected, Some(money("0.00002")), "10 input + 5 output");
    assert_eq!(v.found, Some(money("0.1")));
}

/// One consumer charged through snapshots in two currencies: each currency has its own session
/// and day rows, and the audit checks each against its own currency's settlements and holds.
pub async fn sc_109_ledger_audit_checks_spend_per_currency<S: AllStores>(s: Arc<S>) {
    let d = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    s.settle(priced(&d, usage(10, 5))).await.unwrap();
    let mut euro = text_config();
    euro.currency = tollgate_core::money::Currency::parse("EUR").unwrap();
    euro.price_version = VersionId::parse("prices-eur").unwrap();
    let d = dispatched(&*s, claim_req("a", "k2", euro.clone(), "0.5")).await;
    s.settle(priced(&d, usage(10, 5))).await.unwrap();
    dispatched(&*s, claim_req("a", "k3", euro, "0.25")).await;
    let report = audit(&*s, Some("a")).await;
    assert!(report.ok, "{:?}", report.violations);
    assert_eq!(
        report.checked.spend_rows, 4,
        "a session and a day row per currency"
    );
    assert_eq!(
        daily(&*s, &d).await,
        tollgate_core::caps::SpendTotals {
            settled: money("0.00002"),
            held: money("0.25"),
        }
    );
}
