//! The HTTP service's part of the conformance suite ([`crate::service_conformance!`]): API keys
//! and the scheduler's work scan.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use super::*;

/// Instantiates the service suite for `$factory` (stores that also implement [`ApiKeyStore`]
/// and [`WorkScan`], i.e. [`ServiceStores`]).
#[macro_export]
macro_rules! service_conformance {
    ($factory:expr) => {
        $crate::store_conformance!(@tests $factory;
            sc_10_api_key_is_found_by_its_digest,
            api_key_digest_is_stored_once,
            unknown_api_key_digest_is_none,
            sc_140_keys_are_listed_revoked_and_touched,
            work_scan_finds_unfinished_executions,
            work_scan_finds_unacknowledged_evidence,
            work_scan_finds_roots_not_reconciled,
            work_scan_skips_scopes_without_work,
            work_scan_pages_in_name_order_after_a_cursor,
        );
    };
}

pub fn api_key(key: &str, scope_: &str, role: KeyRole) -> ApiKeyRecord {
    ApiKeyRecord::new(KeyDigest::of_key(key), scope(scope_), role, t0())
}

async fn work<S: ServiceStores>(s: &S) -> Vec<String> {
    s.scopes_with_work(None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|scope| scope.to_string())
        .collect()
}

fn open_root_in(scope_: &str, key_: &str) -> OpenRootRequest {
    let mut config = text_config();
    config.kind = CallKind::Step;
    OpenRootRequest {
        scope: scope(scope_),
        root_key: root_key(key_),
        binding: binding("s-1", config),
        deadline: t0() + Duration::seconds(60),
        now: t0(),
    }
}

async fn opened<S: ServiceStores>(s: &S, scope_: &str) -> RootRecord {
    match s.open_root(open_root_in(scope_, "r1")).await.unwrap() {
        RootOpen::Opened(root) => root,
        other => panic!("{other:?}"),
    }
}

pub async fn sc_10_api_key_is_found_by_its_digest<S: ServiceStores>(s: Arc<S>) {
    let caller = api_key("tg_caller", "a", KeyRole::Caller);
    let operator = api_key("tg_operator", "b", KeyRole::Operator);
    s.insert_key(caller.clone()).await.unwrap();
    s.insert_key(operator.clone()).await.unwrap();
    let found = s.key_by_digest(&caller.digest).await.unwrap();
    assert_eq!(found, Some(caller));
    let found = s
        .key_by_digest(&KeyDigest::of_key("tg_operator"))
        .await
        .unwrap();
    assert_eq!(found, Some(operator), "scope and role come with the key");
}

pub async fn api_key_digest_is_stored_once<S: ServiceStores>(s: Arc<S>) {
    let first = api_key("tg_same", "a", KeyRole::Caller);
    s.insert_key(first.clone()).await.unwrap();
    let again = api_key("tg_same", "b", KeyRole::Operator);
    assert!(matches!(
        s.insert_key(again).await,
        Err(StoreError::Duplicate(_))
    ));
    let kept = s.key_by_digest(&first.digest).await.unwrap();
    assert_eq!(kept, Some(first), "the first key is kept untouched");
}

pub async fn unknown_api_key_digest_is_none<S: ServiceStores>(s: Arc<S>) {
    let unknown = KeyDigest::of_key("tg_unknown");
    assert_eq!(s.key_by_digest(&unknown).await.unwrap(), None);
    s.insert_key(api_key("tg_known", "a", KeyRole::Finance))
        .await
        .unwrap();
    assert_eq!(s.key_by_digest(&unknown).await.unwrap(), None);
}

pub async fn work_scan_finds_unfinished_executions<S: ServiceStores>(s: Arc<S>) {
    // Prepared with a live lease: still work (the scan does not look at leases).
    claimed(&*s, claim_req("p", "k", text_config(), "0.1")).await;
    dispatched(&*s, claim_req("d", "k", text_config(), "0.1")).await;
    let r = dispatched(&*s, claim_req("r", "k", text_config(), "0.1")).await;
    s.mark_reconciliation_required(r.fence(), ReconciliationReason::NoResponse, None, t0())
        .await
        .unwrap();
    assert_eq!(work(&*s).await, ["d", "p", "r"]);
    // Expired leases are work too.
    let later = t0() + Duration::seconds(31);
    assert_eq!(s.expired(&scope("p"), later, 10).await.unwrap().len(), 1);
    assert_eq!(work(&*s).await, ["d", "p", "r"]);
}

pub async fn work_scan_finds_unacknowledged_evidence<S: ServiceStores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("e", "k", text_config(), "0.1")).await;
    s.settle(settle_req(&r, "0.1", "x")).await.unwrap();
    assert!(
        work(&*s).await.is_empty(),
        "a completed execution is no work"
    );
    let e = s.record_evidence(evidence(&r, 1)).await.unwrap();
    assert_eq!(work(&*s).await, ["e"]);
    s.acknowledge(&scope("e"), e.id, t0()).await.unwrap();
    assert!(
        work(&*s).await.is_empty(),
        "acknowledged evidence is no work"
    );
}

pub async fn work_scan_finds_roots_not_reconciled<S: ServiceStores>(s: Arc<S>) {
    opened(&*s, "active").await;
    opened(&*s, "closed").await;
    s.close_root(&scope("closed"), &root_key("r1"), t0())
        .await
        .unwrap();
    opened(&*s, "expired").await;
    let past = t0() + Duration::seconds(61);
    let changed = s
        .reconcile_roots(&scope("expired"), past, 10)
        .await
        .unwrap();
    assert_eq!(changed[0].state, RootState::Expired);
    opened(&*s, "reconciled").await;
    s.close_root(&scope("reconciled"), &root_key("r1"), t0())
        .await
        .unwrap();
    let changed = s
        .reconcile_roots(&scope("reconciled"), t0(), 10)
        .await
        .unwrap();
    assert_eq!(changed[0].state, RootState::Reconciled);
    // An active root counts whatever its deadline; a reconciled one never.
    assert_eq!(work(&*s).await, ["active", "closed", "expired"]);
    let changed = s
        .reconcile_roots(&scope("expired"), past, 10)
        .await
        .unwrap();
    assert_eq!(changed[0].state, RootState::Reconciled);
    assert_eq!(work(&*s).await, ["active", "closed"]);
}

pub async fn work_scan_skips_scopes_without_work<S: ServiceStores>(s: Arc<S>) {
    assert!(work(&*s).await.is_empty(), "empty stores have no work");
    // Scope "done": a completed call, a not-dispatched call, acknowledged evidence, a key.
    let r = dispatched(&*s, claim_req("done", "k1", text_config(), "0.1")).await;
    s.settle(settle_req(&r, "0.1", "x")).await.unwrap();
    let n = claimed(&*s, claim_req("done", "k2", text_config(), "0.1")).await;
    s.mark_not_dispatched(n.fence(), NotDispatchedCause::Input, t0())
        .await
        .unwrap();
    let e = s.record_evidence(evidence(&r, 1)).await.unwrap();
    s.acknowledge(&scope("done"), e.id, t0()).await.unwrap();
    s.insert_key(api_key("tg_done", "done", KeyRole::Caller))
        .await
        .unwrap();
    // Scope "open": one prepared call.
    claimed(&*s, claim_req("open", "k1", text_config(), "0.1")).await;
    assert_eq!(work(&*s).await, ["open"]);
}

pub async fn work_scan_pages_in_name_order_after_a_cursor<S: ServiceStores>(s: Arc<S>) {
    for scope_ in ["c", "a", "b"] {
        claimed(&*s, claim_req(scope_, "k1", text_config(), "0.1")).await;
    }
    // A scope with several kinds of work is listed once.
    let r = claimed(&*s, claim_req("a", "k2", text_config(), "0.1")).await;
    s.record_evidence(evidence(&r, 1)).await.unwrap();
    s.open_root(open_root_in("a", "r1")).await.unwrap();
    let names = |scopes: Vec<Scope>| -> Vec<String> {
        scopes.into_iter().map(|scope| scope.to_string()).collect()
    };
    let all = s.scopes_with_work(None, 10).await.unwrap();
    assert_eq!(names(all), ["a", "b", "c"]);
    let first = s.scopes_with_work(None, 2).await.unwrap();
    assert_eq!(names(first), ["a", "b"]);
    let rest = s.scopes_with_work(Some(&scope("b")), 2).await.unwrap();
    assert_eq!(names(rest), ["c"]);
    assert!(s
        .scopes_with_work(Some(&scope("c")), 2)
        .await
        .unwrap()
        .is_empty());
    let between = s.scopes_with_work(Some(&scope("aa")), 10).await.unwrap();
    assert_eq!(names(between), ["b", "c"], "the cursor need not have work");
}

pub async fn sc_140_keys_are_listed_revoked_and_touched<S: ServiceStores>(s: Arc<S>) {
    let a1 = api_key("tg_a1", "a", KeyRole::Caller);
    let mut a2 = api_key("tg_a2", "a", KeyRole::Operator);
    a2.created_at = t0() + Duration::seconds(1);
    a2.expires_at = Some(t0() + Duration::days(30));
    let b1 = api_key("tg_b1", "b", KeyRole::Caller);
    for k in [&a1, &a2, &b1] {
        s.insert_key(k.clone()).await.unwrap();
    }
    let listed = s.list_keys(Some(&scope("a"))).await.unwrap();
    assert_eq!(
        listed,
        vec![a1.clone(), a2.clone()],
        "own scope, oldest first"
    );
    assert_eq!(s.list_keys(None).await.unwrap().len(), 3);

    // Another scope's key is not found; the right scope revokes, idempotently.
    let later = t0() + Duration::seconds(5);
    assert_eq!(
        s.revoke_key(Some(&scope("b")), &a1.digest, later)
            .await
            .unwrap(),
        None
    );
    let revoked = s
        .revoke_key(Some(&scope("a")), &a1.digest, later)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(revoked.revoked_at, Some(later));
    assert!(!revoked.usable_at(later));
    let again = s
        .revoke_key(None, &a1.digest, later + Duration::seconds(9))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        again.revoked_at,
        Some(later),
        "the first revocation time stays"
    );
    let unknown = KeyDigest::of_key("tg_none");
    assert_eq!(s.revoke_key(None, &unknown, later).await.unwrap(), None);
    let b = s.key_by_digest(&b1.digest).await.unwrap().unwrap();
    assert_eq!(b.revoked_at, None);

    // Expiry is stored; last use only moves forward.
    let a2_read = s.key_by_digest(&a2.digest).await.unwrap().unwrap();
    assert_eq!(a2_read.expires_at, a2.expires_at);
    assert!(a2_read.usable_at(t0()) && !a2_read.usable_at(t0() + Duration::days(31)));
    s.touch_key(&b1.digest, later).await.unwrap();
    s.touch_key(&b1.digest, t0()).await.unwrap();
    s.touch_key(&unknown, later).await.unwrap();
    let b = s.key_by_digest(&b1.digest).await.unwrap().unwrap();
    assert_eq!(b.last_used_at, Some(later));
}
