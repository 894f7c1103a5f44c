#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use tollgate_core::caps::SpendTotals;

fn m(s: &str) -> Money {
    Money::parse(s, "test").unwrap()
}

fn scope() -> Scope {
    Scope::parse("a").unwrap()
}

fn day() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 11, 29).unwrap()
}

fn consumer() -> ConsumerId {
    ConsumerId::parse("team-a").unwrap()
}

fn session() -> SessionId {
    SessionId::parse("s-1").unwrap()
}

fn prices() -> TokenPrices {
    TokenPrices {
        input: m("1"),
        output: m("2"),
        cache_read: m("0.1"),
        cache_write: m("1.25"),
        reasoning: m("2"),
    }
}

fn usage() -> Usage {
    Usage {
        input: 10,
        output: 5,
        ..Usage::ZERO
    }
}

fn usd() -> Currency {
    Currency::parse("USD").unwrap()
}

fn execution(key: &str, state: ExecutionState, hold: &str) -> ExecutionFacts {
    ExecutionFacts {
        id: ExecutionId::new(),
        operation_key: OperationKey::parse(key).unwrap(),
        state,
        hold: m(hold),
        consumer: consumer(),
        session_id: session(),
        accounting_day: day(),
        root_key: None,
        root_id: None,
        currency: usd(),
        price_version: "prices-1".into(),
        prices: prices(),
        settlement: None,
        receipt: None,
    }
}

/// A completed execution settled at `10 input + 5 output` = 0.00002.
fn completed(key: &str) -> ExecutionFacts {
    let mut e = execution(key, ExecutionState::Completed, "0");
    e.settlement = Some(SettlementFacts {
        id: SettlementId::new(),
        execution_id: e.id,
        scope: scope(),
        operation_key: e.operation_key.clone(),
        consumer: consumer(),
        session_id: session(),
        accounting_day: day(),
        price_version: "prices-1".into(),
        currency: usd(),
        usage: usage(),
        amount: m("0.00002"),
    });
    e
}

fn rows(checker: &mut LedgerChecker, settled: &str, held: &str) {
    rows_in(checker, usd(), settled, held);
}

fn rows_in(checker: &mut LedgerChecker, currency: Currency, settled: &str, held: &str) {
    let totals = SpendTotals {
        settled: m(settled),
        held: m(held),
    };
    checker.spend_row(
        SpendRowKey::Session {
            consumer: consumer(),
            session_id: session(),
            currency: currency.clone(),
        },
        totals,
    );
    checker.spend_row(
        SpendRowKey::Day {
            consumer: consumer(),
            day: day(),
            currency,
        },
        totals,
    );
}

fn invariants(report: &LedgerReport) -> Vec<(LedgerInvariant, String)> {
    report
        .violations
        .iter()
        .map(|v| (v.invariant, v.reason.clone()))
        .collect()
}

#[test]
fn sc_91_consistent_rows_are_clean() {
    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0.00002", "0.5");
    c.execution(completed("k1"));
    c.execution(execution("k2", ExecutionState::Dispatched, "0.5"));
    c.execution(execution("k3", ExecutionState::NotDispatched, "0"));
    let report = c.finish();
    assert!(report.ok, "{report:?}");
    assert_eq!(report.checked.executions, 3);
    assert_eq!(report.checked.settlements, 1);
    assert_eq!(report.checked.spend_rows, 2);
}

#[test]
fn sc_91_spend_settled_names_the_row_and_both_amounts() {
    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0.01002", "0");
    c.execution(completed("k1"));
    let report = c.finish();
    assert!(!report.ok);
    assert_eq!(
        report.violations_total, 2,
        "the session row and the day row"
    );
    let v = report.first().unwrap();
    assert_eq!(v.invariant, LedgerInvariant::SpendSettled);
    assert_eq!(
        (v.expected, v.found),
        (Some(m("0.00002")), Some(m("0.01002")))
    );
    assert!(v.spend.is_some());
    let line = v.to_string();
    assert!(
        line.starts_with("spend_settled (mismatch): scope=a spend="),
        "{line}"
    );
}

#[test]
fn sc_91_holds_of_open_executions_only() {
    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0", "0.7");
    c.execution(execution("k1", ExecutionState::Prepared, "0.5"));
    c.execution(execution(
        "k2",
        ExecutionState::ReconciliationRequired,
        "0.2",
    ));
    let report = c.finish();
    assert!(report.ok, "{report:?}");

    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0", "0.5");
    c.execution(execution("k1", ExecutionState::Prepared, "0.5"));
    c.execution(execution("k2", ExecutionState::NotDispatched, "0.2"));
    let report = c.finish();
    assert_eq!(
        invariants(&report),
        [(LedgerInvariant::FinalHoldsNothing, "not_dispatched".into())]
    );
}

#[test]
fn sc_91_settled_exactly_once_and_priced() {
    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0.00003", "0");
    let mut bad = completed("k1");
    if let Some(s) = bad.settlement.as_mut() {
        s.amount = m("0.00003");
    }
    c.execution(bad);
    c.execution(execution("k2", ExecutionState::Completed, "0"));
    let report = c.finish();
    assert_eq!(
        invariants(&report),
        [
            (LedgerInvariant::SettlementPriced, "amount".into()),
            (LedgerInvariant::SettledExactlyOnce, "missing".into()),
        ]
    );
    let priced = report.first().unwrap();
    assert_eq!(
        (priced.expected, priced.found),
        (Some(m("0.00002")), Some(m("0.00003")))
    );
    assert!(priced.settlement_id.is_some());
}

#[test]
fn sc_91_zero_settlement_of_a_refusal_is_priced_at_zero() {
    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0", "0");
    let mut refused = completed("k1");
    if let Some(s) = refused.settlement.as_mut() {
        s.usage = Usage::ZERO;
        s.amount = Money::ZERO;
    }
    c.execution(refused);
    assert!(c.finish().ok);
}

#[test]
fn sc_91_acknowledged_evidence_must_match() {
    let mut c = LedgerChecker::new(scope(), 10);
    let ev = |exact, state, settled: Option<Usage>, usage| EvidenceFacts {
        id: EvidenceId::new(),
        execution_id: ExecutionId::new(),
        exact,
        usage,
        execution_state: state,
        settlement_usage: settled,
    };
    let done = Some(ExecutionState::Completed);
    let nd = Some(ExecutionState::NotDispatched);
    c.evidence(ev(true, done, Some(usage()), usage()));
    c.evidence(ev(true, nd, None, Usage::ZERO));
    c.evidence(ev(false, done, Some(usage()), usage()));
    c.evidence(ev(true, done, Some(Usage::ZERO), usage()));
    c.evidence(ev(true, nd, None, usage()));
    c.evidence(ev(true, Some(ExecutionState::Dispatched), None, usage()));
    c.evidence(ev(true, None, None, usage()));
    let report = c.finish();
    let reasons: Vec<String> = report.violations.iter().map(|v| v.reason.clone()).collect();
    assert_eq!(
        reasons,
        ["not_exact", "usage", "usage", "state", "no_execution"]
    );
    assert_eq!(report.checked.evidence, 7);
}

#[test]
fn sc_91_root_totals_and_receipts() {
    let root = RootFacts {
        id: RootId::new(),
        root_key: RootKey::parse("r1").unwrap(),
        charged: m("0.00002"),
        held: m("0.5"),
    };
    let under = |mut e: ExecutionFacts| {
        e.root_key = Some(root.root_key.clone());
        e.root_id = Some(root.id);
        e
    };
    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0.00002", "0.5");
    c.root(root.clone());
    let mut done = under(completed("c1"));
    done.receipt = Some(ReceiptOfExecution {
        root_id: root.id,
        amount: m("0.00002"),
        currency: usd(),
    });
    let done_id = done.id;
    c.execution(done);
    c.execution(under(execution("c2", ExecutionState::Dispatched, "0.5")));
    c.receipt(ReceiptFacts {
        root_id: root.id,
        root_key: root.root_key.clone(),
        execution_id: done_id,
        amount: m("0.00002"),
        execution_root_key: Some(Some(root.root_key.clone())),
    });
    let report = c.finish();
    assert!(report.ok, "{report:?}");
    assert_eq!(report.checked.root_receipts, 1);

    // The receipt gone (and its amount still on the root): both halves of rule 7 speak.
    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0.00002", "0");
    c.root(RootFacts {
        held: Money::ZERO,
        ..root.clone()
    });
    c.execution(under(completed("c1")));
    let report = c.finish();
    assert_eq!(
        invariants(&report),
        [
            (LedgerInvariant::RootReceipt, "missing".into()),
            (LedgerInvariant::RootCharged, "mismatch".into()),
        ]
    );
}

fn in_euro(mut e: ExecutionFacts) -> ExecutionFacts {
    e.currency = Currency::parse("EUR").unwrap();
    if let Some(s) = e.settlement.as_mut() {
        s.currency = e.currency.clone();
    }
    e
}

#[test]
fn sc_109_spend_is_checked_per_currency() {
    // One consumer charged in USD and in EUR: one pair of rows per currency, each equal to its
    // own currency's settlements and holds.
    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0.00002", "0");
    rows_in(&mut c, Currency::parse("EUR").unwrap(), "0.00002", "0.5");
    c.execution(completed("k1"));
    c.execution(in_euro(completed("k2")));
    c.execution(in_euro(execution("k3", ExecutionState::Dispatched, "0.5")));
    let report = c.finish();
    assert!(report.ok, "{:?}", report.violations);
    assert_eq!(report.checked.spend_rows, 4);

    // The same amounts added up in the USD rows (as one row for both currencies would hold
    // them) disagree with both currencies' rows.
    let mut c = LedgerChecker::new(scope(), 10);
    rows(&mut c, "0.00004", "0.5");
    c.execution(completed("k1"));
    c.execution(in_euro(completed("k2")));
    c.execution(in_euro(execution("k3", ExecutionState::Dispatched, "0.5")));
    let report = c.finish();
    let eur = Currency::parse("EUR").unwrap();
    let named: Vec<_> = report
        .violations
        .iter()
        .map(|v| {
            let currency = match v.spend.as_ref().unwrap() {
                SpendRowKey::Session { currency, .. } | SpendRowKey::Day { currency, .. } => {
                    currency.clone()
                }
            };
            (v.invariant, currency, v.expected, v.found)
        })
        .collect();
    let usd_settled = (
        LedgerInvariant::SpendSettled,
        usd(),
        Some(m("0.00002")),
        Some(m("0.00004")),
    );
    let usd_held = (
        LedgerInvariant::SpendHeld,
        usd(),
        Some(m("0")),
        Some(m("0.5")),
    );
    let eur_settled = (
        LedgerInvariant::SpendSettled,
        eur.clone(),
        Some(m("0.00002")),
        Some(m("0")),
    );
    let eur_held = (
        LedgerInvariant::SpendHeld,
        eur,
        Some(m("0.5")),
        Some(m("0")),
    );
    assert_eq!(named.len(), 8, "{named:?}");
    for want in [usd_settled, usd_held, eur_settled, eur_held] {
        assert_eq!(named.iter().filter(|v| **v == want).count(), 2, "{want:?}");
    }
}

#[test]
fn sc_90_limit_lists_some_and_counts_all() {
    let mut c = LedgerChecker::new(scope(), 2);
    for i in 0..5 {
        c.execution(execution(&format!("k{i}"), ExecutionState::Completed, "0"));
    }
    let report = c.finish();
    assert_eq!(report.violations.len(), 2);
    assert_eq!(report.violations_total, 5);
    assert!(report.truncated && !report.ok);
    let mut all = LedgerReport::empty(None);
    all.absorb(report.clone(), 3);
    all.absorb(report, 3);
    assert_eq!((all.violations.len(), all.violations_total), (3, 10));
    assert_eq!(all.checked.scopes, 2);
}

#[test]
fn invariant_names_are_stable_snake_case() {
    for invariant in LedgerInvariant::ALL {
        let json = serde_json::to_value(invariant).unwrap();
        assert_eq!(json, invariant.as_str());
    }
}
