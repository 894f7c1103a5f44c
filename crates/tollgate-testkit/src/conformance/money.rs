//! The money part of the conformance suite ([`crate::money_conformance!`], instantiated by
//! [`crate::store_conformance!`]): spend and caps per currency (SC-105, SC-106), over-release is
//! an error that changes nothing (SC-107), and repairing a root receipt never charges twice
//! (SC-108). The damage a partial write or a hand edit could leave is made through
//! [`StoreDamage`], which each store implements behind the stores' back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use super::*;
use async_trait::async_trait;
use tollgate_core::caps::SpendTotals;
use tollgate_core::money::Currency;
use tollgate_store::error::StoreResult;
use tollgate_store::ledger::LedgerInvariant;

/// Damage done behind the stores' back, as a partial write or a hand edit could leave it.
/// Implemented for the in-memory stores here (through their `test-support` hooks) and for the
/// Postgres stores with SQL in [`crate::pg`].
#[async_trait]
pub trait StoreDamage {
    /// Sets `held` of every spend row and root of `scope` to zero.
    async fn lose_holds(&self, scope: &Scope) -> StoreResult<()>;
    /// Removes the root receipt of `execution_id`, leaving its amount on the root's charged total.
    async fn drop_root_receipt(&self, execution_id: ExecutionId) -> StoreResult<()>;
}

#[async_trait]
impl StoreDamage for tollgate_store::MemoryStores {
    async fn lose_holds(&self, scope: &Scope) -> StoreResult<()> {
        tollgate_store::MemoryStores::lose_holds(self, scope)
    }

    async fn drop_root_receipt(&self, execution_id: ExecutionId) -> StoreResult<()> {
        tollgate_store::MemoryStores::drop_root_receipt(self, execution_id)
    }
}

/// Instantiates the money cases for `$factory` (stores that implement [`AllStores`] and
/// [`StoreDamage`]).
#[macro_export]
macro_rules! money_conformance {
    ($factory:expr) => {
        $crate::store_conformance!(@tests $factory;
            sc_105_each_currency_counts_only_against_its_own_cap,
            sc_106_a_call_under_a_root_in_another_currency_is_a_mismatch,
            sc_107_over_release_is_an_error_and_changes_nothing,
            sc_108_repairing_a_root_receipt_never_charges_twice,
        );
    };
}

fn eur() -> Currency {
    Currency::parse("EUR").unwrap()
}

/// A profile in EUR with its own price version, same prices.
fn in_euro(mut config: CallConfig) -> CallConfig {
    config.currency = eur();
    config.price_version = VersionId::parse("prices-eur").unwrap();
    config
}

fn step() -> CallConfig {
    let mut c = text_config();
    c.kind = CallKind::Step;
    c
}

fn under(root: &str, key_: &str, config: CallConfig, hold: &str) -> ClaimRequest {
    let mut req = claim_req("a", key_, config, hold);
    req.root_key = Some(root_key(root));
    req
}

/// Settled at the usage's price (10 input + 5 output = 0.00002), as the runners settle.
fn priced(record: &ExecutionRecord) -> SettleRequest {
    settle_req(record, "0.00002", "x")
}

async fn spend_in<S: AllStores>(s: &S, currency: &Currency) -> (SpendTotals, SpendTotals) {
    let consumer = ConsumerId::parse("team-a").unwrap();
    let session = SessionId::parse("s-1").unwrap();
    (
        s.session_spend(&scope("a"), &consumer, &session, currency)
            .await
            .unwrap(),
        s.daily_spend(&scope("a"), &consumer, t0().date_naive(), currency)
            .await
            .unwrap(),
    )
}

async fn audit_len<S: AllStores>(s: &S) -> usize {
    s.audit_rows(&scope("a"), AuditPosition::START, 10_000)
        .await
        .unwrap()
        .len()
}

/// One consumer with a USD and an EUR profile, each capped at 1.00 of its own currency: holds and
/// charges in one currency never count against the other's cap, and each currency has its own
/// spend rows.
pub async fn sc_105_each_currency_counts_only_against_its_own_cap<S: AllStores>(s: Arc<S>) {
    let usd_config = capped("1.00");
    let eur_config = in_euro(capped("1.00"));
    let u = dispatched(&*s, claim_req("a", "u1", usd_config.clone(), "0.8")).await;
    // 0.8 USD held; 0.8 EUR is under the EUR cap whatever is held in USD.
    let e = dispatched(&*s, claim_req("a", "e1", eur_config.clone(), "0.8")).await;
    s.settle(settle_req(&u, "0.5", "x")).await.unwrap();
    let settled = s.settle(settle_req(&e, "0.5", "x")).await.unwrap();
    assert!(
        settled.result.warnings.is_empty(),
        "{:?}",
        settled.result.warnings
    );
    let half = SpendTotals {
        settled: money("0.5"),
        held: Money::ZERO,
    };
    assert_eq!(spend_in(&*s, &usd()).await, (half, half));
    assert_eq!(spend_in(&*s, &eur()).await, (half, half));
    // Each cap now has 0.5 of room in its own currency.
    let blocked = s
        .claim(claim_req("a", "u2", usd_config, "0.6"))
        .await
        .unwrap();
    let ClaimOutcome::Blocked(blocked) = blocked else {
        panic!("expected a block, got {blocked:?}");
    };
    assert_eq!(blocked.settled, money("0.5"), "USD spend only");
    claimed(&*s, claim_req("a", "e2", eur_config.clone(), "0.5")).await;
    let blocked = s
        .claim(claim_req("a", "e3", eur_config, "0.01"))
        .await
        .unwrap();
    assert!(matches!(blocked, ClaimOutcome::Blocked(_)), "{blocked:?}");
    assert_eq!(
        spend_in(&*s, &usd()).await.1,
        half,
        "EUR holds never touch USD rows"
    );
}

/// A root keeps its totals in its snapshot's currency: a call in another currency under it is
/// refused with `CurrencyMismatch` instead of being added up, and nothing is written.
pub async fn sc_106_a_call_under_a_root_in_another_currency_is_a_mismatch<S: AllStores>(s: Arc<S>) {
    let mut root_config = step();
    root_config.caps.root_block = Some(money("10"));
    let root = open_root(&*s, "r1", root_config).await;
    let before = audit_len(&*s).await;
    let refused = s
        .claim(under("r1", "c1", in_euro(step()), "0.5"))
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        StoreError::CurrencyMismatch {
            expected: eur(),
            found: usd(),
        }
    );
    assert!(s
        .execution(&scope("a"), &key("c1"))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        s.root(&scope("a"), &root_key("r1")).await.unwrap(),
        Some(root)
    );
    assert_eq!(spend_in(&*s, &eur()).await, Default::default());
    assert_eq!(audit_len(&*s).await, before);
    // A call in the root's currency is admitted as usual.
    claimed(&*s, under("r1", "c2", step(), "0.5")).await;
}

/// Releasing more than a spend row or root holds is `HoldUnderflow`, never floored at zero, and
/// the unit writes nothing: on `not_dispatched` and on settlement.
pub async fn sc_107_over_release_is_an_error_and_changes_nothing<S: AllStores + StoreDamage>(
    s: Arc<S>,
) {
    open_root(&*s, "r1", step()).await;
    let prepared = claimed(&*s, under("r1", "c1", step(), "0.5")).await;
    let sent = dispatched(&*s, under("r1", "c2", step(), "0.25")).await;
    s.lose_holds(&scope("a")).await.unwrap();
    let spend = spend_in(&*s, &usd()).await;
    let root = s.root(&scope("a"), &root_key("r1")).await.unwrap();
    let rows = audit_len(&*s).await;

    let e = s
        .mark_not_dispatched(prepared.fence(), NotDispatchedCause::Input, t0())
        .await
        .unwrap_err();
    assert_eq!(
        e,
        StoreError::HoldUnderflow {
            held: Money::ZERO,
            release: money("0.5"),
        }
    );
    let e = s.settle(priced(&sent)).await.unwrap_err();
    assert_eq!(
        e,
        StoreError::HoldUnderflow {
            held: Money::ZERO,
            release: money("0.25"),
        }
    );

    let c1 = s.execution(&scope("a"), &key("c1")).await.unwrap();
    assert_eq!(c1, Some(prepared));
    let c2 = s.execution(&scope("a"), &key("c2")).await.unwrap();
    assert_eq!(c2, Some(sent.clone()));
    assert!(s.settlement(sent.id).await.unwrap().is_none());
    assert!(s.result(sent.id).await.unwrap().is_none());
    assert!(s.root_receipt(sent.id).await.unwrap().is_none());
    assert_eq!(spend_in(&*s, &usd()).await, spend);
    assert_eq!(s.root(&scope("a"), &root_key("r1")).await.unwrap(), root);
    assert_eq!(audit_len(&*s).await, rows);
}

/// A root receipt lost while its charge stayed on the root (a partial write): the repair writes
/// the receipt and leaves the root's charged total equal to the sum of its receipts — once,
/// however often it runs — and the ledger audit agrees.
pub async fn sc_108_repairing_a_root_receipt_never_charges_twice<S: AllStores + StoreDamage>(
    s: Arc<S>,
) {
    open_root(&*s, "r1", step()).await;
    let mut calls = Vec::new();
    for k in ["c1", "c2"] {
        let d = dispatched(&*s, under("r1", k, step(), "0.5")).await;
        s.settle(priced(&d)).await.unwrap();
        calls.push(d);
    }
    let charged = |root: Option<RootRecord>| root.unwrap().charged;
    let root = s.root(&scope("a"), &root_key("r1")).await.unwrap();
    assert_eq!(charged(root), money("0.00004"));
    s.drop_root_receipt(calls[0].id).await.unwrap();
    let report = s.audit_ledger(Some(&scope("a")), 100).await.unwrap();
    let named: Vec<_> = report.violations.iter().map(|v| v.invariant).collect();
    assert_eq!(
        named,
        [LedgerInvariant::RootReceipt, LedgerInvariant::RootCharged]
    );

    let repaired = s
        .repair_root_receipt(&scope("a"), calls[0].id, t0())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(repaired.amount, money("0.00002"));
    let again = s
        .repair_root_receipt(&scope("a"), calls[0].id, t0())
        .await
        .unwrap();
    assert_eq!(again, Some(repaired));
    let receipts = s
        .root_receipts(&scope("a"), &root_key("r1"), 100)
        .await
        .unwrap();
    let sum = receipts
        .iter()
        .try_fold(Money::ZERO, |acc, r| acc.checked_add(r.amount))
        .unwrap();
    assert_eq!(receipts.len(), 2);
    let root = s.root(&scope("a"), &root_key("r1")).await.unwrap();
    assert_eq!(charged(root), sum, "Σ root receipts");
    assert_eq!(sum, money("0.00004"), "charged once");
    let report = s.audit_ledger(Some(&scope("a")), 100).await.unwrap();
    assert!(report.ok, "{:?}", report.violations);
    let repairs = s
        .audit_rows(&scope("a"), AuditPosition::START, 10_000)
        .await
        .unwrap()
        .iter()
        .filter(|r| r.event.kind == "root_receipt_repaired")
        .count();
    assert_eq!(repairs, 1);
}
