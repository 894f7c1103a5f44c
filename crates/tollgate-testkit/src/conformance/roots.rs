//! The operation-root part of the conformance suite ([`crate::root_conformance!`]).

use super::*;

/// Instantiates the operation-root suite for `$factory` (stores that also implement
/// [`RootStore`]).
#[macro_export]
macro_rules! root_conformance {
    ($factory:expr) => {
        $crate::store_conformance!(@tests $factory;
            st_5_slots_are_reserved_under_the_root_lock,
            st_33_closed_root_refuses_admissions_but_reserved_calls_finish,
            st_6_one_send_one_charge_one_root_receipt,
            st_7_root_block_cap_uses_inclusive_root_cost,
            rf_2_zero_settlement_writes_zero_root_receipt,
            roots_expire_at_their_deadline_and_reconcile_when_final,
            sr_5_existing_root_is_returned_untouched,
            root_cap_never_overrun_by_concurrent_steps,
            st_36_st_33_no_claim_lands_under_a_reconciled_root,
            st_36_orphan_slot_never_holds_reconciliation_past_the_deadline,
            sc_122_dispatch_mark_shrinks_the_hold_and_never_grows_it,
        );
    };
}

pub fn root_key(s: &str) -> RootKey {
    RootKey::parse(s).unwrap()
}

fn step_config() -> CallConfig {
    let mut c = text_config();
    c.kind = CallKind::Step;
    c
}

pub async fn open_root<S: AllStores>(s: &S, key_: &str, config: CallConfig) -> RootRecord {
    let req = OpenRootRequest {
        scope: scope("a"),
        root_key: root_key(key_),
        binding: binding("s-1", config),
        deadline: t0() + Duration::seconds(60),
        now: t0(),
    };
    match s.open_root(req).await.unwrap() {
        RootOpen::Opened(r) => r,
        other => panic!("{other:?}"),
    }
}

fn child(root: &str, key_: &str, config: CallConfig, hold: &str) -> ClaimRequest {
    let mut req = claim_req("a", key_, config, hold);
    req.root_key = Some(root_key(root));
    req
}

async fn root_of<S: AllStores>(s: &S, key_: &str) -> RootRecord {
    s.root(&scope("a"), &root_key(key_)).await.unwrap().unwrap()
}

pub async fn st_5_slots_are_reserved_under_the_root_lock<S: AllStores>(s: Arc<S>) {
    let root = open_root(&*s, "r1", step_config()).await;
    assert_eq!(root.reserved_calls, 0);
    for _ in 0..3 {
        assert!(matches!(
            s.reserve_slot(&scope("a"), &root_key("r1"), t0())
                .await
                .unwrap(),
            Reservation::Reserved(_)
        ));
    }
    s.release_slot(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap();
    assert_eq!(root_of(&*s, "r1").await.reserved_calls, 2);
    assert!(matches!(
        s.reserve_slot(&scope("a"), &root_key("nope"), t0())
            .await
            .unwrap(),
        Reservation::Missing
    ));
    assert!(
        matches!(
            s.reserve_slot(&scope("b"), &root_key("r1"), t0())
                .await
                .unwrap(),
            Reservation::Missing
        ),
        "roots are scoped"
    );
}

pub async fn st_33_closed_root_refuses_admissions_but_reserved_calls_finish<S: AllStores>(
    s: Arc<S>,
) {
    open_root(&*s, "r1", step_config()).await;
    s.reserve_slot(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap();
    let r = claimed(&*s, child("r1", "c1", step_config(), "0.5")).await;
    let closed = s
        .close_root(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(closed.state, RootState::Closed);
    assert!(s
        .close_root(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap()
        .is_some());
    assert!(matches!(
        s.reserve_slot(&scope("a"), &root_key("r1"), t0())
            .await
            .unwrap(),
        Reservation::Refused(_)
    ));
    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
    let out = s.settle(settle_req(&d, "0.1", "x")).await.unwrap();
    assert!(out.root_receipt.is_some(), "a reserved call still settles");
}

pub async fn st_6_one_send_one_charge_one_root_receipt<S: AllStores>(s: Arc<S>) {
    open_root(&*s, "r1", step_config()).await;
    let mut amounts = Vec::new();
    for (i, amount) in ["0.1", "0.25"].iter().enumerate() {
        s.reserve_slot(&scope("a"), &root_key("r1"), t0())
            .await
            .unwrap();
        let r = claimed(&*s, child("r1", &format!("c{i}"), step_config(), "0.5")).await;
        assert_eq!(root_of(&*s, "r1").await.held, money("0.5"));
        let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
        let out = s.settle(settle_req(&d, amount, "x")).await.unwrap();
        let receipt = out.root_receipt.unwrap();
        assert_eq!(receipt.amount, money(amount));
        assert_eq!(s.root_receipt(r.id).await.unwrap(), Some(receipt.clone()));
        // The view's one read carries the root receipt too (H-10).
        let joined = s
            .execution_view(&scope("a"), &key(&format!("c{i}")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(joined.root_receipt, Some(receipt));
        assert!(s.settle(settle_req(&d, amount, "x")).await.is_err());
        amounts.push(money(amount));
    }
    let root = root_of(&*s, "r1").await;
    assert_eq!((root.charged, root.held), (money("0.35"), Money::ZERO));
    let receipts = s
        .root_receipts(&scope("a"), &root_key("r1"), 10)
        .await
        .unwrap();
    assert_eq!(receipts.len(), 2);
    let sum = receipts
        .iter()
        .fold(Money::ZERO, |acc, r| acc.checked_add(r.amount).unwrap());
    assert_eq!(sum, root.charged, "inclusive cost = sum of receipts");
}

pub async fn st_7_root_block_cap_uses_inclusive_root_cost<S: AllStores>(s: Arc<S>) {
    let mut c = step_config();
    c.caps.root_block = Some(money("1"));
    open_root(&*s, "r1", c.clone()).await;
    let r = claimed(&*s, child("r1", "c1", c.clone(), "0.6")).await;
    match s.claim(child("r1", "c2", c.clone(), "0.6")).await.unwrap() {
        ClaimOutcome::Blocked(b) => assert_eq!(b.window, tollgate_core::caps::CapWindow::Root),
        o => panic!("{o:?}"),
    }
    assert!(s
        .execution(&scope("a"), &key("c2"))
        .await
        .unwrap()
        .is_none());
    // Post-call: the provider overran the hold; the cost is settled, the output suppressed.
    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
    let out = s.settle(settle_req(&d, "1.2", "secret")).await.unwrap();
    assert_eq!(out.result.outcome, Outcome::Blocked);
    assert!(out.result.output.is_none());
    assert_eq!(out.root_receipt.unwrap().amount, money("1.2"));
    // Claims under a root without the root are refused loudly.
    assert!(s.claim(child("missing", "c3", c, "0.1")).await.is_err());
}

pub async fn rf_2_zero_settlement_writes_zero_root_receipt<S: AllStores>(s: Arc<S>) {
    open_root(&*s, "r1", step_config()).await;
    let r = claimed(&*s, child("r1", "c1", step_config(), "0.5")).await;
    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
    let mut req = settle_req(&d, "0", "");
    req.usage = Usage::ZERO;
    req.outcome = Outcome::Unavailable;
    req.output = None;
    let out = s.settle(req).await.unwrap();
    assert_eq!(out.root_receipt.unwrap().amount, Money::ZERO);
    let root = root_of(&*s, "r1").await;
    assert_eq!((root.charged, root.held), (Money::ZERO, Money::ZERO));
}

pub async fn roots_expire_at_their_deadline_and_reconcile_when_final<S: AllStores>(s: Arc<S>) {
    open_root(&*s, "r1", step_config()).await;
    s.reserve_slot(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap();
    let r = claimed(&*s, child("r1", "c1", step_config(), "0.5")).await;
    assert!(s
        .reconcile_roots(&scope("a"), t0(), 10)
        .await
        .unwrap()
        .is_empty());
    let late = t0() + Duration::seconds(61);
    assert!(matches!(
        s.reserve_slot(&scope("a"), &root_key("r1"), late)
            .await
            .unwrap(),
        Reservation::Refused(_)
    ));
    let changed = s.reconcile_roots(&scope("a"), late, 10).await.unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].state, RootState::Expired);
    // Not reconciled while its reserved call is unfinished.
    assert!(s
        .reconcile_roots(&scope("a"), late, 10)
        .await
        .unwrap()
        .is_empty());
    s.mark_not_dispatched(r.fence(), NotDispatchedCause::Expired, late)
        .await
        .unwrap();
    let changed = s.reconcile_roots(&scope("a"), late, 10).await.unwrap();
    assert_eq!(changed[0].state, RootState::Reconciled);
    assert_eq!(root_of(&*s, "r1").await.held, Money::ZERO);
}

pub async fn sr_5_existing_root_is_returned_untouched<S: AllStores>(s: Arc<S>) {
    let root = open_root(&*s, "r1", step_config()).await;
    assert_eq!(
        root.binding_digest,
        root.binding
            .digest_in(tollgate_core::digest::ROOT_BINDING_DOMAIN)
    );
    let mut other = step_config();
    other.model = "other".into();
    let req = OpenRootRequest {
        scope: scope("a"),
        root_key: root_key("r1"),
        binding: binding("s-1", other),
        deadline: t0() + Duration::seconds(999),
        now: t0(),
    };
    match s.open_root(req).await.unwrap() {
        RootOpen::Existing(r) => assert_eq!(r, root),
        o => panic!("{o:?}"),
    }
}

/// 40 concurrent steps under one root with a root block cap of 1.00 and holds of 0.1: the root's
/// charged + held never exceeds the cap, and its inclusive cost equals the sum of its receipts.
pub async fn root_cap_never_overrun_by_concurrent_steps<S: AllStores + 'static>(s: Arc<S>) {
    let mut c = step_config();
    c.caps.root_block = Some(money("1.00"));
    open_root(&*s, "r1", c.clone()).await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let s = Arc::clone(&s);
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            s.reserve_slot(&scope("a"), &root_key("r1"), t0())
                .await
                .unwrap();
            match s
                .claim(child("r1", &format!("c{i}"), c, "0.1"))
                .await
                .unwrap()
            {
                ClaimOutcome::Claimed(r) => {
                    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
                    s.settle(settle_req(&d, "0.07", "x")).await.unwrap();
                    1u32
                }
                _ => {
                    s.release_slot(&scope("a"), &root_key("r1"), t0())
                        .await
                        .unwrap();
                    0
                }
            }
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let root = root_of(&*s, "r1").await;
    assert!(root.charged.checked_add(root.held).unwrap() <= money("1.00"));
    assert_eq!(root.reserved_calls, i64::from(admitted));
    let receipts = s
        .root_receipts(&scope("a"), &root_key("r1"), 100)
        .await
        .unwrap();
    assert_eq!(receipts.len(), admitted as usize);
    let sum = receipts
        .iter()
        .fold(Money::ZERO, |acc, r| acc.checked_add(r.amount).unwrap());
    assert_eq!(sum, root.charged);
    assert!(admitted >= 10, "at least 10 fit: {admitted}");
}

fn refused(outcome: ClaimOutcome) -> RootRecord {
    match outcome {
        ClaimOutcome::RootRefused(r) => r,
        o => panic!("expected the root to refuse, got {o:?}"),
    }
}

/// ST-36 with ST-33: a closed root still takes the claim of a call it admitted; once it is
/// reconciled it takes none, whatever clock the claimer has, and the refused claim writes
/// nothing (no row, no hold on the root).
pub async fn st_36_st_33_no_claim_lands_under_a_reconciled_root<S: AllStores>(s: Arc<S>) {
    open_root(&*s, "r1", step_config()).await;
    s.reserve_slot(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap();
    s.close_root(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap();
    // Closed before its deadline, with a reserved slot and no call yet: the call may still come.
    assert!(s
        .reconcile_roots(&scope("a"), t0(), 10)
        .await
        .unwrap()
        .is_empty());
    let r = claimed(&*s, child("r1", "c1", step_config(), "0.5")).await;
    s.mark_not_dispatched(r.fence(), NotDispatchedCause::Input, t0())
        .await
        .unwrap();
    let changed = s.reconcile_roots(&scope("a"), t0(), 10).await.unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].state, RootState::Reconciled);
    let root = refused(
        s.claim(child("r1", "c2", step_config(), "0.5"))
            .await
            .unwrap(),
    );
    assert_eq!(root.state, RootState::Reconciled);
    assert!(s
        .execution(&scope("a"), &key("c2"))
        .await
        .unwrap()
        .is_none());
    let after = root_of(&*s, "r1").await;
    assert_eq!(
        (after.state, after.held),
        (RootState::Reconciled, Money::ZERO)
    );
    // A known key is still its own replay.
    assert!(matches!(
        s.claim(child("r1", "c1", step_config(), "0.5"))
            .await
            .unwrap(),
        ClaimOutcome::Existing(_)
    ));
}

/// ST-36: a slot reserved for a claim that never landed (the claim failed, or the process died
/// between the two writes) holds a closed root only until its deadline; past it, the root takes
/// no claim and is reconciled on the calls it has, and a late claim never lands on it.
pub async fn st_36_orphan_slot_never_holds_reconciliation_past_the_deadline<S: AllStores>(
    s: Arc<S>,
) {
    open_root(&*s, "r1", step_config()).await;
    s.reserve_slot(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap();
    let r = claimed(&*s, child("r1", "c1", step_config(), "0.5")).await;
    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
    s.settle(settle_req(&d, "0.1", "x")).await.unwrap();
    // The orphan: reserved, never claimed.
    s.reserve_slot(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap();
    s.close_root(&scope("a"), &root_key("r1"), t0())
        .await
        .unwrap();
    assert!(s
        .reconcile_roots(&scope("a"), t0(), 10)
        .await
        .unwrap()
        .is_empty());
    let late = t0() + Duration::seconds(61);
    // Past the deadline the slot can never be filled.
    let mut too_late = child("r1", "c2", step_config(), "0.5");
    too_late.now = late;
    assert_eq!(
        refused(s.claim(too_late).await.unwrap()).state,
        RootState::Closed
    );
    let changed = s.reconcile_roots(&scope("a"), late, 10).await.unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].state, RootState::Reconciled);
    assert_eq!(changed[0].reserved_calls, 2);
    // A claimer whose clock lags still finds the root reconciled.
    refused(
        s.claim(child("r1", "c2", step_config(), "0.5"))
            .await
            .unwrap(),
    );
    assert!(s
        .execution(&scope("a"), &key("c2"))
        .await
        .unwrap()
        .is_none());
    // An active root past its deadline takes no claim either, before it is even expired.
    open_root(&*s, "r2", step_config()).await;
    let mut late_claim = child("r2", "c3", step_config(), "0.5");
    late_claim.now = late;
    assert_eq!(
        refused(s.claim(late_claim).await.unwrap()).state,
        RootState::Active
    );
    assert_eq!(root_of(&*s, "r2").await.held, Money::ZERO);
}

/// SC-122: the dispatch mark may shrink the hold to the loaded request's worst case, in its own
/// unit: the difference leaves the session, day and root held totals; a hold never grows; a stale
/// fence writes nothing; the ledger stays clean.
pub async fn sc_122_dispatch_mark_shrinks_the_hold_and_never_grows_it<S: AllStores>(s: Arc<S>) {
    let mut c = step_config();
    c.caps.daily_block = Some(money("1"));
    open_root(&*s, "r1", c.clone()).await;
    let r = claimed(&*s, child("r1", "c1", c.clone(), "0.6")).await;
    // 0.6 held: a second claim of 0.6 does not fit the daily cap of 1.
    match s.claim(child("r1", "c2", c.clone(), "0.6")).await.unwrap() {
        ClaimOutcome::Blocked(b) => assert_eq!(b.held, money("0.6")),
        o => panic!("{o:?}"),
    }
    // Growing is refused, nothing written.
    let grown = s
        .mark_dispatched_with_hold(r.fence(), money("0.7"), t0())
        .await;
    assert_eq!(grown.unwrap_err(), StoreError::HoldGrows(r.id));
    let still = s.execution(&scope("a"), &key("c1")).await.unwrap().unwrap();
    assert_eq!(
        (still.state, still.hold),
        (ExecutionState::Prepared, money("0.6"))
    );
    // A stale fence is refused, nothing written.
    let mut stale = r.fence();
    stale.token = FenceToken(r.fence.0 + 1);
    assert!(matches!(
        s.mark_dispatched_with_hold(stale, money("0.1"), t0()).await,
        Err(StoreError::StaleFence(_))
    ));
    assert_eq!(daily(&*s, &r).await.held, money("0.6"));
    // Shrunk: the record, both spend rows and the root hold 0.1.
    let d = s
        .mark_dispatched_with_hold(r.fence(), money("0.1"), t0())
        .await
        .unwrap();
    assert_eq!(
        (d.state, d.hold),
        (ExecutionState::Dispatched, money("0.1"))
    );
    assert_eq!(daily(&*s, &r).await.held, money("0.1"));
    assert_eq!(session(&*s, &r).await.held, money("0.1"));
    assert_eq!(root_of(&*s, "r1").await.held, money("0.1"));
    // Only once: the row is no longer prepared.
    assert!(matches!(
        s.mark_dispatched_with_hold(d.fence(), money("0.05"), t0())
            .await,
        Err(StoreError::StaleFence(_))
    ));
    // The room freed admits the second claim now.
    let r2 = claimed(&*s, child("r1", "c2", c, "0.6")).await;
    assert_eq!(daily(&*s, &r2).await.held, money("0.7"));
    // Settlement releases exactly the shrunk hold.
    s.settle(settle_req(&d, "0.00002", "x")).await.unwrap();
    let day = daily(&*s, &r).await;
    assert_eq!((day.settled, day.held), (money("0.00002"), money("0.6")));
    let root = root_of(&*s, "r1").await;
    assert_eq!((root.charged, root.held), (money("0.00002"), money("0.6")));
    let report = s.audit_ledger(None, 100).await.unwrap();
    assert!(report.ok && report.violations.is_empty(), "{report:?}");
}
