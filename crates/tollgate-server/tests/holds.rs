//! Holds that fit the request, over HTTP (spec/money.md — Holds): a call whose input is in the
//! request is claimed at its own worst case, so a block cap refuses only when it is nearly spent;
//! the 402 names what the call needed and what the cap had left.
#![cfg(test)]

mod support;

use reqwest::StatusCode;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use support::*;
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::{ConsumerId, Scope};
use tollgate_core::money::Money;
use tollgate_server::Backend;
use tollgate_store::SpendStore;
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// Profiles with `max_input_chars = 10`, `max_tokens = 64` under daily block caps. The profile's
/// worst case is (10 × 3 + 256 × 8 + 8) = 2086 input tokens at 1.25 + 64 at 2 per million =
/// 0.0027355; a call of "ping" holds (4 + 8 + 8) = 20 input tokens at 1.25 + 64 at 2 = 0.000153.
const PROFILES: &str = r#"
[[profiles]]
name = "fitted"
kind = "text"
provider = "mock"
model = "mock-echo"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-f"
max_tokens = 64
max_input_chars = 10
run_timeout_ms = 10000
[profiles.caps]
daily_block = "0.004"

[[profiles]]
name = "fitted-small"
kind = "text"
provider = "mock"
model = "mock-echo"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-g"
max_tokens = 64
max_input_chars = 10
run_timeout_ms = 10000
[profiles.caps]
daily_block = "0.0002"

[[profiles]]
name = "fitted-none"
kind = "text"
provider = "mock"
model = "mock-echo"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-h"
max_tokens = 64
max_input_chars = 10
run_timeout_ms = 10000
[profiles.caps]
daily_block = "0.00015"
"#;

const INPUT: &str = "ping";
const FITTED_HOLD: &str = "0.000153";
const PROFILE_HOLD: &str = "0.0027355";
const CAP: &str = "0.004";
const CALLS: u64 = 500;

fn m(s: &str) -> Money {
    Money::parse(s, "test").unwrap()
}

fn amount(error: &Value, field: &str) -> Money {
    m(error[field].as_str().unwrap())
}

/// SC-120: a call whose own worst case fits the cap is admitted, although the profile's worst
/// case would not fit; SC-123: a refusal answers 402 with the hold it needed, what was settled,
/// held and left under the cap, and the currency — never the input.
#[tokio::test]
async fn sc_120_sc_123_fitted_admission_and_the_402_body() {
    let s = Server::start_with(Backend::memory(), PROFILES).await;
    let (status, view, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("fitted-small", "a-1", "r-1", INPUT),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["state"], "completed");
    assert!(m(PROFILE_HOLD) > m("0.0002"));

    let secret_input = "pong-SECRET";
    let (status, body, text) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("fitted-none", "n-1", "r-1", &secret_input[..10]),
        )
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body}");
    let error = &body["error"];
    assert_eq!(error["code"], "cap_blocked");
    assert_eq!(error["cap"], "daily");
    assert_eq!(error["level"], "block");
    assert_eq!(error["currency"], "USD");
    // "pong-SECRE": 10 bytes + 8 + 8 = 26 input tokens at 1.25 + 64 at 2 per million.
    assert_eq!(amount(error, "hold"), m("0.0001605"));
    assert_eq!(amount(error, "limit"), m("0.00015"));
    assert_eq!(amount(error, "settled"), Money::ZERO);
    assert_eq!(amount(error, "held"), Money::ZERO);
    assert_eq!(amount(error, "available"), m("0.00015"));
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("0.0001605") && message.contains("USD"),
        "{message}"
    );
    assert!(!text.contains("pong"), "{text}");
    assert_eq!(s.mock.request_count(), 1);
    s.stop().await;
}

struct Tally {
    admitted: AtomicU64,
    refused: AtomicU64,
}

/// SC-124: 500 parallel calls across two servers on one Postgres database, under one daily block
/// cap of 0.004 with a profile of `max_input_chars = 10` and `max_tokens = 64`: every call is
/// claimed at its fitted hold, settled + held never exceeds the cap (sampled concurrently through
/// store reads), refusals begin only when settlements and holds in flight nearly fill the cap,
/// and the ledger is clean afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sc_124_parallel_calls_on_two_servers_fill_the_cap_before_refusals() {
    let started = Instant::now();
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let first = Arc::new(database.stores(8).await.unwrap());
    first.migrate().await.unwrap();
    let second = Arc::new(database.stores(8).await.unwrap());
    let reader = database.stores(2).await.unwrap();
    let servers = Arc::new([
        Server::start_with(Backend::Postgres(first), PROFILES).await,
        Server::start_with(Backend::Postgres(second), PROFILES).await,
    ]);
    let scope = Scope::parse("acme").unwrap();
    let consumer = ConsumerId::parse("team-f").unwrap();
    let day = chrono::Utc::now().date_naive();
    let usd = tollgate_core::money::Currency::parse("USD").unwrap();
    let (cap, fitted) = (m(CAP), m(FITTED_HOLD));

    // The sampler reads the day's spend row while the calls run.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (done, scope, consumer, usd) =
            (done.clone(), scope.clone(), consumer.clone(), usd.clone());
        tokio::spawn(async move {
            let mut samples: Vec<SpendTotals> = Vec::new();
            while !done.load(Ordering::SeqCst) {
                samples.push(
                    reader
                        .daily_spend(&scope, &consumer, day, &usd)
                        .await
                        .unwrap(),
                );
                tokio::task::yield_now().await;
            }
            samples
        })
    };

    let tally = Arc::new(Tally {
        admitted: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    });
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let (servers, tally) = (servers.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            let s = &servers[(i % 2) as usize];
            let body = call("fitted", &format!("h-{i}"), "r-1", INPUT);
            let (status, body, _) = s.post("/v1/calls", &s.caller, &body).await;
            match status {
                StatusCode::OK => {
                    assert_eq!(body["state"], "completed", "{body}");
                    tally.admitted.fetch_add(1, Ordering::SeqCst);
                    None
                }
                StatusCode::PAYMENT_REQUIRED => {
                    tally.refused.fetch_add(1, Ordering::SeqCst);
                    Some(body["error"].clone())
                }
                other => panic!("call {i}: {other} {body}"),
            }
        }));
    }
    let mut refusals = Vec::new();
    for task in tasks {
        if let Some(error) = task.await.unwrap() {
            refusals.push(error);
        }
    }
    done.store(true, Ordering::SeqCst);
    let samples = sampler.await.unwrap();

    let admitted = tally.admitted.load(Ordering::SeqCst);
    let refused = tally.refused.load(Ordering::SeqCst);
    assert_eq!(admitted + refused, CALLS);
    // Nothing overran the cap, at any sampled instant or at the end.
    assert!(!samples.is_empty());
    for sample in &samples {
        let total = sample.settled.checked_add(sample.held).unwrap();
        assert!(total <= cap, "settled + held {total} above the cap {cap}");
    }
    let end = servers[0]
        .backend
        .stores()
        .daily_spend(&scope, &consumer, day, &usd)
        .await
        .unwrap();
    assert!(end.settled <= cap);
    assert_eq!(end.held, Money::ZERO);
    // Every call was claimed at its fitted hold; each refusal came when settlements and holds in
    // flight left less than one fitted hold under the cap.
    let mut fullest_at_refusal = cap;
    for error in &refusals {
        assert_eq!(error["code"], "cap_blocked");
        assert_eq!(amount(error, "hold"), fitted, "{error}");
        let taken = amount(error, "settled")
            .checked_add(amount(error, "held"))
            .unwrap();
        assert!(
            taken.checked_add(fitted).unwrap() > cap,
            "refused with room left: {error}"
        );
        fullest_at_refusal = fullest_at_refusal.min(taken);
    }
    // The admitted calls' holds cover at least 90% of the cap.
    let covered = Money::new(
        fitted.decimal() * rust_decimal::Decimal::from(admitted),
        "t",
    )
    .unwrap();
    assert!(
        covered.decimal() * rust_decimal::Decimal::from(10)
            >= cap.decimal() * rust_decimal::Decimal::from(9),
        "{admitted} admitted cover only {covered}"
    );
    let sends = servers[0].mock.request_count() + servers[1].mock.request_count();
    assert_eq!(sends, admitted);
    let report = servers[0]
        .backend
        .stores()
        .audit_ledger(None, 1000)
        .await
        .unwrap();
    assert!(report.ok && report.violations.is_empty(), "{report:?}");
    eprintln!(
        "SC-124: {admitted} admitted, {refused} refused in {:?}; settled {} of {cap}; \
         {} samples, least settled + held at a refusal {fullest_at_refusal}",
        started.elapsed(),
        end.settled,
        samples.len(),
    );
    let servers = Arc::into_inner(servers).unwrap();
    for s in servers {
        s.stop().await;
    }
}
