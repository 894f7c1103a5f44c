//! What one tenant's requests tell it of other tenants and what they cost the database: the
//! finance console's range read (SC-192), the finance feed's cursors (SC-193), and the console's
//! audit checks (SC-194). Over the app on a port-0 listener (support/), on the in-memory stores
//! and on a fresh Postgres database.
#![cfg(test)]

mod support;

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{admin_url, call, Server};
use tollgate_core::ids::Scope;
use tollgate_runner::ManualClock;
use tollgate_server::console::audit::{AuditChecks, AUDIT_CHECK_CACHE_MS};
use tollgate_server::console::finance::scope_settlements;
use tollgate_server::{ApiError, Backend};
use tollgate_store::fault::{FaultyStores, StoreOp};
use tollgate_store::{KeyRole, ServiceStores};
use tollgate_testkit::pg::TestDatabase;

fn acme() -> Scope {
    Scope::parse("acme").unwrap()
}

fn globex() -> Scope {
    Scope::parse("globex").unwrap()
}

async fn key_of(s: &Server, scope: &Scope, role: KeyRole) -> String {
    s.keys
        .create(scope, role)
        .await
        .unwrap()
        .expose()
        .to_string()
}

/// One call of `key`'s scope that settles.
async fn settled(s: &Server, key: &str, operation_key: &str) {
    let (status, view, _) = s
        .post(
            "/v1/calls",
            key,
            &call("summarize", operation_key, "r", "hi"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["state"], "completed", "{view}");
}

/// Store operations since `before`, by name (zero counts left out).
fn since(stores: &FaultyStores, before: &BTreeMap<StoreOp, u64>) -> BTreeMap<&'static str, u64> {
    stores
        .calls()
        .into_iter()
        .map(|(op, n)| (op.name(), n - before.get(&op).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// SC-192: the finance console reads one scope's settlements
// ---------------------------------------------------------------------------------------------

/// SC-192: with the bound lowered to 3, a tenant with 2 settlements gets its range while another
/// tenant settles 5 between them: the read is the scope's own (one store read of the scope's
/// rows, limited to the bound + 1), so the other tenant's volume neither refuses nor fills it.
/// The tenant past the bound is refused with a message naming the bound only.
#[tokio::test]
async fn sc_192_a_tenants_finance_range_does_not_depend_on_another_tenants_volume() {
    let s = Server::memory().await;
    settled(&s, &s.stranger, "g-0").await;
    settled(&s, &s.caller, "a-0").await;
    for i in 1..5 {
        settled(&s, &s.stranger, &format!("g-{i}")).await;
    }
    settled(&s, &s.caller, "a-1").await;
    let stores = FaultyStores::with_service(s.backend.stores());
    let today = Utc::now().date_naive();

    let before = stores.calls();
    let rows = scope_settlements(&stores, &acme(), today, today, 3)
        .await
        .unwrap();
    let keys: Vec<&str> = rows.iter().map(|r| r.operation_key.as_str()).collect();
    assert_eq!(keys, ["a-0", "a-1"], "the scope's rows, every one of them");
    assert_eq!(
        since(&stores, &before),
        BTreeMap::from([("scope_settlements", 1)]),
        "one read of the scope's rows, none across scopes"
    );

    let refused = scope_settlements(&stores, &globex(), today, today, 3)
        .await
        .unwrap_err();
    match refused {
        ApiError::Invalid(message) => assert_eq!(
            message, "the range holds more than 3 settlements: choose a shorter one",
            "the bound, no count"
        ),
        other => panic!("{other:?}"),
    }

    // The page itself reads the same way.
    let finance = key_of(&s, &acme(), KeyRole::Finance).await;
    let (status, page, _) = s.get("/v1/console/finance", &finance).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["settlements"], 2, "{page}");
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// SC-193: feed cursors
// ---------------------------------------------------------------------------------------------

/// Every page of `finance`'s feed from the start with `limit`, until an empty page: the rows and
/// the `next` of each page.
async fn feed(s: &Server, finance: &str, limit: u32) -> (Vec<Value>, Vec<String>) {
    let mut rows = Vec::new();
    let mut nexts = Vec::new();
    let mut after = String::new();
    loop {
        let (status, page, _) = s
            .get(
                &format!("/v1/finance/settlements?limit={limit}&after={after}"),
                finance,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let page_rows = page["settlements"].as_array().unwrap().clone();
        let next = page["next"].as_str().unwrap().to_string();
        if page_rows.is_empty() {
            assert_eq!(next, after, "an empty page keeps the cursor");
            return (rows, nexts);
        }
        assert_eq!(
            page_rows.last().unwrap()["cursor"].as_str(),
            Some(next.as_str())
        );
        rows.extend(page_rows);
        nexts.push(next.clone());
        after = next;
    }
}

/// The feed of `finance` once it lists `expected` rows (on Postgres a row is listed once every
/// older transaction of the cluster has ended).
async fn feed_of(
    s: &Server,
    finance: &str,
    limit: u32,
    expected: usize,
) -> (Vec<Value>, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (rows, nexts) = feed(s, finance, limit).await;
        if rows.len() >= expected || Instant::now() > deadline {
            return (rows, nexts);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn refused(s: &Server, finance: &str, after: &str) -> String {
    let (status, answer, _) = s
        .get(&format!("/v1/finance/settlements?after={after}"), finance)
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{after}: {answer}"
    );
    assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
    answer["error"]["message"].as_str().unwrap().to_string()
}

/// SC-193: two scopes settle interleaved. Each cursor scope `acme` receives is the id of its own
/// settlement (random; no position, no counter that the other scope's settlements advance), so
/// acme's cursors are the same whatever globex settled between them; paging by them yields each
/// of acme's settlements once, in order. A cursor of globex's, an altered cursor, another spelling
/// of a cursor and a position are refused alike; `other` (a second server on the same database,
/// when given) accepts the cursors the first handed out.
async fn sc_193_cursors_are_settlement_ids_bound_to_their_scope(
    s: &Server,
    other: Option<&Server>,
) {
    let acme_finance = key_of(s, &acme(), KeyRole::Finance).await;
    let globex_finance = key_of(s, &globex(), KeyRole::Finance).await;
    let order = ["a", "g", "g", "a", "g", "g", "g", "a"];
    let mut acme_keys = Vec::new();
    for (i, who) in order.iter().enumerate() {
        let key = format!("{who}-{i}");
        if *who == "a" {
            settled(s, &s.caller, &key).await;
            acme_keys.push(key);
        } else {
            settled(s, &s.stranger, &key).await;
        }
    }

    let (rows, nexts) = feed_of(s, &acme_finance, 1, acme_keys.len()).await;
    let keys: Vec<&str> = rows
        .iter()
        .map(|r| r["operation_key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys, acme_keys,
        "every settlement of the scope once, in order"
    );
    for (row, next) in rows.iter().zip(&nexts) {
        assert_eq!(row["scope"], "acme");
        let cursor = row["cursor"].as_str().unwrap();
        assert_eq!(cursor, next);
        assert_eq!(
            Some(cursor),
            row["id"].as_str(),
            "the cursor is the settlement's own id"
        );
        assert!(uuid::Uuid::try_parse(cursor).is_ok(), "{cursor}");
        assert!(
            !cursor.contains('.') && cursor.parse::<u64>().is_err(),
            "no position: {cursor}"
        );
    }

    let (globex_rows, _) = feed_of(s, &globex_finance, 100, 5).await;
    assert_eq!(globex_rows.len(), 5);
    let foreign = globex_rows[0]["cursor"].as_str().unwrap().to_string();
    let own = nexts[0].clone();
    let mut altered = own.clone();
    let last = altered.pop().unwrap();
    altered.push(if last == '0' { '1' } else { '0' });
    let message = refused(s, &acme_finance, &foreign).await;
    for bad in [
        altered,
        own.to_uppercase(),
        own.replace('-', ""),
        "1.1".to_string(),
        "0.0".to_string(),
        "junk".to_string(),
    ] {
        assert_eq!(
            refused(s, &acme_finance, &bad).await,
            message,
            "one message for every cursor the scope was not given"
        );
    }
    // The cursor still serves its own scope.
    let (status, page, _) = s
        .get(
            &format!("/v1/finance/settlements?after={own}"),
            &acme_finance,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        page["settlements"].as_array().unwrap().len(),
        acme_keys.len() - 1
    );

    if let Some(other) = other {
        let (status, page, _) = other
            .get(
                &format!("/v1/finance/settlements?after={own}"),
                &acme_finance,
            )
            .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "another server takes the cursor: {page}"
        );
        assert_eq!(
            page["settlements"][0]["operation_key"],
            acme_keys[1].as_str()
        );
        refused(other, &acme_finance, &foreign).await;
    }
}

#[tokio::test]
async fn sc_193_feed_cursors_on_memory() {
    let s = Server::memory().await;
    sc_193_cursors_are_settlement_ids_bound_to_their_scope(&s, None).await;
    s.stop().await;
}

#[tokio::test]
async fn sc_193_feed_cursors_on_postgres_across_two_servers() {
    let db = TestDatabase::create(&admin_url()).await.unwrap();
    let stores = db.stores(4).await.unwrap();
    stores.migrate().await.unwrap();
    let stores = Arc::new(stores);
    let s = Server::start(Backend::Postgres(stores.clone())).await;
    let other = Server::start(Backend::Postgres(Arc::new(db.stores(4).await.unwrap()))).await;
    sc_193_cursors_are_settlement_ids_bound_to_their_scope(&s, Some(&other)).await;
    other.stop().await;
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// SC-194: the console's audit checks
// ---------------------------------------------------------------------------------------------

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-12-03T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

/// SC-194: the chain verification and the ledger audit of a scope run once per window: asked
/// again within it they read nothing (counted by the fault wrapper) and answer from the first
/// check, marked cached with its time. Damage made after a clean check is still reported clean
/// until the window ends, and by the first request after it; requests that come together after
/// it run one check between them.
#[tokio::test]
async fn sc_194_audit_checks_run_once_per_window_and_report_damage_after_it() {
    let db = TestDatabase::create(&admin_url()).await.unwrap();
    let stores = db.stores(4).await.unwrap();
    stores.migrate().await.unwrap();
    let stores = Arc::new(stores);
    let s = Server::start(Backend::Postgres(stores.clone())).await;
    for n in 0..2 {
        settled(&s, &s.caller, &format!("k-{n}")).await;
    }
    let counted = FaultyStores::with_service(stores.clone() as Arc<dyn ServiceStores>);
    let clock = Arc::new(ManualClock::new(t0()));
    let checks = AuditChecks::new(AUDIT_CHECK_CACHE_MS, clock.clone());
    let window = i64::try_from(AUDIT_CHECK_CACHE_MS).unwrap();

    let before = counted.calls();
    let chain = checks.chain(&counted, &acme()).await.unwrap();
    let ledger = checks.ledger(&counted, &acme()).await.unwrap();
    assert!(chain.report.ok && ledger.report.ok, "{chain:?} {ledger:?}");
    assert!(!chain.cached && !ledger.cached);
    assert_eq!(chain.checked_at, t0());
    let first = since(&counted, &before);
    assert!(first.get("audit_rows").is_some_and(|n| *n > 0), "{first:?}");
    assert_eq!(first.get("audit_ledger"), Some(&1), "{first:?}");

    clock.advance_ms(window - 1);
    let before = counted.calls();
    for _ in 0..5 {
        let chain = checks.chain(&counted, &acme()).await.unwrap();
        let ledger = checks.ledger(&counted, &acme()).await.unwrap();
        assert!(chain.cached && ledger.cached);
        assert_eq!((chain.checked_at, ledger.checked_at), (t0(), t0()));
        assert_eq!(chain.cache_ms, AUDIT_CHECK_CACHE_MS);
    }
    assert_eq!(
        since(&counted, &before),
        BTreeMap::new(),
        "within the window nothing is read"
    );

    let (broken_chain, broken_seq) = db.delete_last_audit_row("acme").await.unwrap();
    db.shift_session_spend("team-a", "0.5").await.unwrap();
    let chain = checks.chain(&counted, &acme()).await.unwrap();
    assert!(
        chain.cached && chain.report.ok,
        "the window bounds how long damage is hidden"
    );

    clock.advance_ms(1);
    let chain = checks.chain(&counted, &acme()).await.unwrap();
    let ledger = checks.ledger(&counted, &acme()).await.unwrap();
    assert!(!chain.cached && !ledger.cached);
    assert_eq!(
        chain.checked_at,
        t0() + chrono::Duration::milliseconds(window)
    );
    assert!(!chain.report.ok, "{chain:?}");
    let violation = chain.report.first_violation.as_ref().unwrap();
    assert_eq!((violation.chain, violation.seq), (broken_chain, broken_seq));
    assert!(!ledger.report.ok, "{ledger:?}");

    clock.advance_ms(window);
    let before = counted.calls();
    let scope = acme();
    let (a, b, c) = tokio::join!(
        checks.chain(&counted, &scope),
        checks.chain(&counted, &scope),
        checks.chain(&counted, &scope),
    );
    let cached: Vec<bool> = [a, b, c].into_iter().map(|r| r.unwrap().cached).collect();
    assert_eq!(cached.iter().filter(|c| !**c).count(), 1, "{cached:?}");
    assert_eq!(since(&counted, &before).get("audit_heads"), Some(&1));
    s.stop().await;
}

/// SC-194: over HTTP, the audit page asked for twice answers the second time from the first
/// check, saying so and when it ran; the overview shares the scope's ledger audit.
#[tokio::test]
async fn sc_194_the_console_pages_say_when_a_check_is_cached() {
    let s = Server::memory().await;
    settled(&s, &s.caller, "k-0").await;
    let (status, first, _) = s.get("/v1/console/audit", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["chain"]["ok"], true, "{first}");
    assert_eq!(first["chain"]["cached"], false, "{first}");
    assert_eq!(first["ledger"]["cached"], false, "{first}");
    assert_eq!(first["chain"]["cache_ms"], AUDIT_CHECK_CACHE_MS);
    let (_, again, _) = s.get("/v1/console/audit", &s.operator).await;
    assert_eq!(again["chain"]["cached"], true, "{again}");
    assert_eq!(again["ledger"]["cached"], true, "{again}");
    assert_eq!(again["chain"]["checked_at"], first["chain"]["checked_at"]);
    assert_eq!(
        again["chain"]["rows_verified"],
        first["chain"]["rows_verified"]
    );
    let (status, overview, _) = s.get("/v1/console/overview", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    assert_eq!(overview["ledger"]["cached"], true, "{overview}");
    assert_eq!(
        overview["ledger"]["checked_at"],
        first["ledger"]["checked_at"]
    );
    s.stop().await;
}

/// SC-225, SC-220, SC-224 on the embedded stores: the overview shows a limited consumer's use
/// against its limits, a call over the limit is 429 `rate_limited` with its headers, and the
/// overview then says the consumer is limited.
#[tokio::test]
async fn sc_225_the_overview_shows_each_limited_consumer_s_use_against_its_limits() {
    let paced = r#"
[[profiles]]
name = "paced"
kind = "text"
provider = "mock"
model = "mock-echo"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-p"
max_tokens = 64
max_input_chars = 200
[profiles.limits]
requests_per_minute = 2
in_flight = 5
"#;
    let s = Server::start_with(tollgate_server::Backend::memory(), paced).await;
    let limits_of = |overview: &Value| {
        overview["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["consumer"] == "team-p")
            .cloned()
            .unwrap_or_else(|| panic!("no limits of team-p: {overview}"))
    };
    let (status, view, _) = s
        .post("/v1/calls", &s.caller, &call("paced", "p-1", "r", "hi"))
        .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    let (_, overview, _) = s.get("/v1/console/overview", &s.operator).await;
    let team_p = limits_of(&overview);
    assert_eq!(team_p["limits"]["requests_per_minute"], 2, "{team_p}");
    assert_eq!(team_p["limits"]["in_flight"], 5, "{team_p}");
    assert_eq!(team_p["requests"], 1, "{team_p}");
    assert_eq!(team_p["in_flight"], 0, "{team_p}");
    assert_eq!(team_p["level"], "ok", "{team_p}");
    assert!(team_p["window_ends_at"].is_string(), "{team_p}");
    // Consumers without limits are not listed.
    assert!(overview["limits"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["consumer"] == "team-p"));
    let (status, _, _) = s
        .post("/v1/calls", &s.caller, &call("paced", "p-2", "r", "hi"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, refused, _) = s
        .post("/v1/calls", &s.caller, &call("paced", "p-3", "r", "hi"))
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert_eq!(refused["error"]["code"], "rate_limited");
    assert_eq!(refused["error"]["limit_kind"], "requests");
    assert_eq!(refused["error"]["remaining"], 0);
    let (_, overview, _) = s.get("/v1/console/overview", &s.operator).await;
    let team_p = limits_of(&overview);
    assert_eq!(team_p["requests"], 2, "{team_p}");
    assert_eq!(team_p["level"], "limited", "{team_p}");
    // The refused key wrote nothing: reading it back finds no call.
    let (status, _, _) = s.get("/v1/calls/p-3", &s.caller).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    s.stop().await;
}
