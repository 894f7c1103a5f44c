//! The limits part of the conformance suite ([`crate::limits_conformance!`], instantiated by
//! [`crate::store_conformance!`]): rate and concurrency limits decided in the claim's own unit
//! (SC-220..SC-223), a refusal writing nothing, replays never limited, and the ends of a call
//! giving back or correcting what it counted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use super::*;
use tollgate_core::limits::{
    ClaimLimits, LimitCharge, LimitKind, LimitRefused, LimitSubject, LimitTokens, LimitWindow,
    RateLimits, IN_FLIGHT_RETRY_MS, LIMIT_WINDOW_MS,
};

/// Instantiates the limits cases for `$factory`.
#[macro_export]
macro_rules! limits_conformance {
    ($factory:expr) => {
        $crate::store_conformance!(@tests $factory;
            sc_220_a_requests_limit_admits_exactly_its_limit_and_a_refusal_writes_nothing,
            sc_220_a_replay_is_never_limited,
            sc_220_a_window_closes_a_minute_after_it_opened,
            sc_220_a_cap_refuses_before_a_limit_and_neither_writes,
            sc_220_a_key_and_its_consumer_are_limited_each,
            sc_220_concurrent_claims_admit_exactly_the_limit,
            sc_220_a_claim_under_a_root_refused_by_a_limit_writes_nothing,
            sc_221_token_limits_count_the_worst_case_then_the_settled_usage,
            sc_222_a_call_in_flight_counts_until_it_ends,
            sc_223_a_call_never_sent_gives_back_its_request_and_tokens,
        );
    };
}

const TOKENS: LimitTokens = LimitTokens {
    input: 40,
    output: 100,
};

fn consumer_charge(config: &CallConfig, limits: RateLimits) -> LimitCharge {
    LimitCharge {
        subject: LimitSubject::Consumer(config.consumer.clone()),
        limits,
    }
}

fn key_charge(key_: &str, limits: RateLimits) -> LimitCharge {
    LimitCharge {
        subject: LimitSubject::Key(key_.into()),
        limits,
    }
}

fn requests(n: u64) -> RateLimits {
    RateLimits {
        requests_per_minute: Some(n),
        ..RateLimits::default()
    }
}

/// A claim of `key_` in scope `a` at `now` under `charges`, counting [`TOKENS`].
fn limited_req(key_: &str, charges: Vec<LimitCharge>, now: DateTime<Utc>) -> ClaimRequest {
    let mut req = claim_req("a", key_, text_config(), "0.1");
    req.now = now;
    req.limits = ClaimLimits {
        charges,
        tokens: TOKENS,
    };
    req
}

fn at_ms(ms: i64) -> DateTime<Utc> {
    t0() + Duration::milliseconds(ms)
}

fn refused(outcome: ClaimOutcome) -> LimitRefused {
    match outcome {
        ClaimOutcome::Limited(r) => r,
        other => panic!("expected a limit's refusal, got {other:?}"),
    }
}

async fn window<S: Stores>(s: &S, subject: &LimitSubject) -> Option<LimitWindow> {
    s.limit_windows(&scope("a"))
        .await
        .unwrap()
        .into_iter()
        .find(|(sub, _)| sub == subject)
        .map(|(_, w)| w)
}

fn consumer_subject() -> LimitSubject {
    LimitSubject::Consumer(text_config().consumer)
}

pub async fn sc_220_a_requests_limit_admits_exactly_its_limit_and_a_refusal_writes_nothing<
    S: Stores,
>(
    s: Arc<S>,
) {
    let c = text_config();
    for i in 0..3 {
        let req = limited_req(
            &format!("k{i}"),
            vec![consumer_charge(&c, requests(3))],
            at_ms(i),
        );
        claimed(&*s, req).await;
    }
    let before = s.audit_heads(&scope("a")).await.unwrap();
    let req = limited_req("k3", vec![consumer_charge(&c, requests(3))], at_ms(1_000));
    let refusal = refused(s.claim(req).await.unwrap());
    assert_eq!(refusal.subject, consumer_subject());
    assert_eq!(refusal.kind, LimitKind::Requests);
    assert_eq!((refusal.limit, refusal.used, refusal.asked), (3, 3, 1));
    assert_eq!(refusal.remaining(), 0);
    // The window opened with the first call: it closes 60 s after it.
    assert_eq!(refusal.reset_ms, LIMIT_WINDOW_MS - 1_000);
    assert!(refusal.retryable());
    // Nothing of the refused claim: no row, no audit, no hold, no count.
    assert!(s
        .execution(&scope("a"), &key("k3"))
        .await
        .unwrap()
        .is_none());
    assert_eq!(s.audit_heads(&scope("a")).await.unwrap(), before);
    let d = s
        .daily_spend(&scope("a"), &c.consumer, t0().date_naive(), &usd())
        .await
        .unwrap();
    assert_eq!(d.held, money("0.3"));
    let w = window(&*s, &consumer_subject()).await.unwrap();
    assert_eq!((w.started_at, w.requests, w.in_flight), (t0(), 3, 3));
    assert_eq!(w.input_tokens, 3 * TOKENS.input);
}

pub async fn sc_220_a_replay_is_never_limited<S: Stores>(s: Arc<S>) {
    let c = text_config();
    let first = limited_req("k1", vec![consumer_charge(&c, requests(1))], t0());
    claimed(&*s, first.clone()).await;
    // The same key again is answered from its row, the limit full or not.
    match s.claim(first).await.unwrap() {
        ClaimOutcome::Existing(view) => assert_eq!(view.execution.operation_key, key("k1")),
        other => panic!("a replay was not answered from its row: {other:?}"),
    }
    let other = limited_req("k2", vec![consumer_charge(&c, requests(1))], t0());
    assert_eq!(refused(s.claim(other).await.unwrap()).used, 1);
    let w = window(&*s, &consumer_subject()).await.unwrap();
    assert_eq!(w.requests, 1);
}

pub async fn sc_220_a_window_closes_a_minute_after_it_opened<S: Stores>(s: Arc<S>) {
    let c = text_config();
    let charge = || vec![consumer_charge(&c, requests(1))];
    claimed(&*s, limited_req("k1", charge(), t0())).await;
    let last_ms = i64::try_from(LIMIT_WINDOW_MS).unwrap() - 1;
    let late = refused(
        s.claim(limited_req("k2", charge(), at_ms(last_ms)))
            .await
            .unwrap(),
    );
    assert_eq!(late.reset_ms, 1);
    // At exactly a minute the window has closed: the next call opens a new one.
    let next = at_ms(last_ms + 1);
    claimed(&*s, limited_req("k3", charge(), next)).await;
    let w = window(&*s, &consumer_subject()).await.unwrap();
    assert_eq!((w.started_at, w.requests), (next, 1));
    // Calls in flight are not windowed: both are still in flight.
    assert_eq!(w.in_flight, 2);
}

pub async fn sc_220_a_cap_refuses_before_a_limit_and_neither_writes<S: Stores>(s: Arc<S>) {
    let mut c = text_config();
    c.caps.daily_block = Some(money("0.15"));
    let charge = |c: &CallConfig| vec![consumer_charge(c, requests(1))];
    let mut req = limited_req("k1", charge(&c), t0());
    req.binding.config = c.clone();
    claimed(&*s, req).await;
    // Both the cap and the limit would refuse: the cap answers, and counts nothing.
    let mut both = limited_req("k2", charge(&c), t0());
    both.binding.config = c.clone();
    assert!(matches!(
        s.claim(both).await.unwrap(),
        ClaimOutcome::Blocked(_)
    ));
    // Only the limit refuses (a small hold fits the cap).
    let mut only_limit = limited_req("k3", charge(&c), t0());
    only_limit.binding.config = c.clone();
    only_limit.hold = money("0.01");
    assert_eq!(
        refused(s.claim(only_limit).await.unwrap()).kind,
        LimitKind::Requests
    );
    let w = window(&*s, &consumer_subject()).await.unwrap();
    assert_eq!((w.requests, w.in_flight), (1, 1));
    let d = s
        .daily_spend(&scope("a"), &c.consumer, t0().date_naive(), &usd())
        .await
        .unwrap();
    assert_eq!(d.held, money("0.1"));
}

pub async fn sc_220_a_key_and_its_consumer_are_limited_each<S: Stores>(s: Arc<S>) {
    let c = text_config();
    let charges = |k: &str| vec![consumer_charge(&c, requests(3)), key_charge(k, requests(1))];
    claimed(&*s, limited_req("k1", charges("key-a"), t0())).await;
    let by_key = refused(
        s.claim(limited_req("k2", charges("key-a"), t0()))
            .await
            .unwrap(),
    );
    assert_eq!(by_key.subject, LimitSubject::Key("key-a".into()));
    // The refusal by the key counted nothing on the consumer either.
    assert_eq!(window(&*s, &consumer_subject()).await.unwrap().requests, 1);
    claimed(&*s, limited_req("k3", charges("key-b"), t0())).await;
    claimed(&*s, limited_req("k4", charges("key-c"), t0())).await;
    let by_consumer = refused(
        s.claim(limited_req("k5", charges("key-d"), t0()))
            .await
            .unwrap(),
    );
    assert_eq!(by_consumer.subject, consumer_subject());
    assert_eq!(by_consumer.used, 3);
    assert!(window(&*s, &LimitSubject::Key("key-d".into()))
        .await
        .is_none_or(|w| w.requests == 0));
}

pub async fn sc_220_concurrent_claims_admit_exactly_the_limit<S: Stores + 'static>(s: Arc<S>) {
    let c = text_config();
    let mut tasks = Vec::new();
    for i in 0..120 {
        let s = Arc::clone(&s);
        let req = limited_req(
            &format!("k{i}"),
            vec![consumer_charge(&c, requests(30))],
            t0(),
        );
        tasks.push(tokio::spawn(async move { s.claim(req).await.unwrap() }));
    }
    let (mut admitted, mut limited) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            ClaimOutcome::Claimed(_) => admitted += 1,
            ClaimOutcome::Limited(r) => {
                assert_eq!((r.kind, r.used), (LimitKind::Requests, 30));
                limited += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((admitted, limited), (30, 90));
    let w = window(&*s, &consumer_subject()).await.unwrap();
    assert_eq!((w.requests, w.in_flight), (30, 30));
}

pub async fn sc_220_a_claim_under_a_root_refused_by_a_limit_writes_nothing<S: AllStores>(
    s: Arc<S>,
) {
    let mut config = text_config();
    config.kind = CallKind::Step;
    let root = open_root(&*s, "r1", config.clone()).await;
    let under = |k: &str| {
        let mut req = limited_req(k, vec![consumer_charge(&config, requests(1))], t0());
        req.binding.config = config.clone();
        req.root_key = Some(root.root_key.clone());
        req
    };
    claimed(&*s, under("k1")).await;
    let held = s
        .root(&scope("a"), &root.root_key)
        .await
        .unwrap()
        .unwrap()
        .held;
    assert_eq!(refused(s.claim(under("k2")).await.unwrap()).used, 1);
    assert!(s
        .execution(&scope("a"), &key("k2"))
        .await
        .unwrap()
        .is_none());
    let after = s.root(&scope("a"), &root.root_key).await.unwrap().unwrap();
    assert_eq!(after.held, held);
}

pub async fn sc_221_token_limits_count_the_worst_case_then_the_settled_usage<S: Stores>(s: Arc<S>) {
    let c = text_config();
    let limits = RateLimits {
        input_tokens_per_minute: Some(100),
        output_tokens_per_minute: Some(1_000),
        ..RateLimits::default()
    };
    let charge = || vec![consumer_charge(&c, limits)];
    // 40 input tokens each at admission: two fit in 100, a third does not.
    let first = claimed(&*s, limited_req("k1", charge(), t0())).await;
    claimed(&*s, limited_req("k2", charge(), t0())).await;
    let full = refused(s.claim(limited_req("k3", charge(), t0())).await.unwrap());
    assert_eq!(
        (full.kind, full.used, full.asked),
        (LimitKind::InputTokens, 80, 40)
    );
    // The first settles with 10 input and 5 output tokens: the window counts those instead.
    let d = s.mark_dispatched(first.fence(), t0()).await.unwrap();
    s.settle(settle_req(&d, "0.01", "x")).await.unwrap();
    let w = window(&*s, &consumer_subject()).await.unwrap();
    assert_eq!((w.input_tokens, w.output_tokens), (50, 105));
    claimed(&*s, limited_req("k3", charge(), t0())).await;
    // A call that alone asks more than the limit is refused as never fitting.
    let mut huge = limited_req("k4", charge(), at_ms(LIMIT_WINDOW_MS as i64));
    huge.limits.tokens.input = 101;
    assert!(!refused(s.claim(huge).await.unwrap()).retryable());
}

pub async fn sc_222_a_call_in_flight_counts_until_it_ends<S: Stores>(s: Arc<S>) {
    let c = text_config();
    let limits = RateLimits {
        in_flight: Some(2),
        ..RateLimits::default()
    };
    let charge = || vec![consumer_charge(&c, limits)];
    let a = claimed(&*s, limited_req("k1", charge(), t0())).await;
    let b = claimed(&*s, limited_req("k2", charge(), t0())).await;
    let full = refused(s.claim(limited_req("k3", charge(), t0())).await.unwrap());
    assert_eq!(
        (full.kind, full.used, full.reset_ms),
        (LimitKind::InFlight, 2, IN_FLIGHT_RETRY_MS)
    );
    // A settlement ends a call in flight.
    let a = s.mark_dispatched(a.fence(), t0()).await.unwrap();
    s.settle(settle_req(&a, "0.01", "x")).await.unwrap();
    let c3 = claimed(&*s, limited_req("k3", charge(), t0())).await;
    // So does waiting for an operator, and its later settlement ends nothing twice.
    let b = s.mark_dispatched(b.fence(), t0()).await.unwrap();
    let parked = s
        .mark_reconciliation_required(
            b.fence(),
            ReconciliationReason::RecoveryNoExactUsage,
            None,
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(window(&*s, &consumer_subject()).await.unwrap().in_flight, 1);
    s.settle(settle_req(&parked, "0.01", "x")).await.unwrap();
    assert_eq!(window(&*s, &consumer_subject()).await.unwrap().in_flight, 1);
    claimed(&*s, limited_req("k4", charge(), t0())).await;
    // And a call that is never sent.
    s.mark_not_dispatched(c3.fence(), NotDispatchedCause::Invalid, t0())
        .await
        .unwrap();
    assert_eq!(window(&*s, &consumer_subject()).await.unwrap().in_flight, 1);
}

pub async fn sc_223_a_call_never_sent_gives_back_its_request_and_tokens<S: Stores>(s: Arc<S>) {
    let c = text_config();
    let charge = || vec![consumer_charge(&c, requests(2))];
    let a = claimed(&*s, limited_req("k1", charge(), t0())).await;
    claimed(&*s, limited_req("k2", charge(), t0())).await;
    s.mark_not_dispatched(a.fence(), NotDispatchedCause::Invalid, at_ms(10))
        .await
        .unwrap();
    let w = window(&*s, &consumer_subject()).await.unwrap();
    assert_eq!(
        (w.requests, w.input_tokens, w.in_flight),
        (1, TOKENS.input, 1)
    );
    claimed(&*s, limited_req("k3", charge(), at_ms(20))).await;
    assert!(matches!(
        s.claim(limited_req("k4", charge(), at_ms(30)))
            .await
            .unwrap(),
        ClaimOutcome::Limited(_)
    ));
}
