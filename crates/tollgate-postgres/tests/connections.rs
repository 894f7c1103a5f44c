//! What the stores do when the database ends their connections (SC-203): a terminated backend
//! (`pg_terminate_backend`, a failover, a restart) leaves no connection behind that fails the
//! next call, and a claim whose statement lost its connection is sent once more, alone, on a
//! fresh one.
#![cfg(test)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tollgate_postgres::PgStores;
use tollgate_store::{ClaimOutcome, ExecutionStore};
use tollgate_testkit::conformance::{claim_req, text_config};
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// A migrated database of its own and stores with a lane (eight connections: four on the lane).
async fn fresh() -> (TestDatabase, PgStores) {
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let stores = database.stores(8).await.unwrap();
    stores.migrate().await.unwrap();
    (database, stores.with_caller_lease_clock())
}

async fn claim(s: &PgStores, key: &str) -> ClaimOutcome {
    let mut request = claim_req("a", key, text_config(), "0.01");
    request.dispatch = true;
    s.claim(request).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_203_calls_after_terminated_backends_succeed() {
    let (database, s) = fresh().await;
    // Warm every connection a call's own statements take: claims at once open several.
    for warm in 0..3 {
        let claims: Vec<_> = (0..8)
            .map(|n| {
                let s = s.clone();
                tokio::spawn(async move { claim(&s, &format!("warm-{warm}-{n}")).await })
            })
            .collect();
        for claimed in claims {
            assert!(matches!(claimed.await.unwrap(), ClaimOutcome::Claimed(_)));
        }
        // Reads of a call's view take the same connections, one each, all at once.
        let reads: Vec<_> = (0..8)
            .map(|n| {
                let s = s.clone();
                tokio::spawn(async move {
                    let key = tollgate_testkit::conformance::key(&format!("warm-{warm}-{n}"));
                    s.execution_view(&tollgate_testkit::conformance::scope("a"), &key)
                        .await
                })
            })
            .collect();
        for read in reads {
            assert!(read.await.unwrap().unwrap().is_some());
        }
    }
    assert!(matches!(claim(&s, "k1").await, ClaimOutcome::Claimed(_)));
    for round in 0..3 {
        let terminated = database.terminate_backends().await.unwrap();
        assert!(terminated > 0, "round {round}: nothing was connected");
        // At once (well within the idle time after which a connection is pinged before use):
        // the connections the stores hold are all dead, and the next claims still succeed.
        for n in 0..4 {
            let key = format!("after-{round}-{n}");
            match claim(&s, &key).await {
                ClaimOutcome::Claimed(record) => assert_eq!(record.operation_key.as_str(), key),
                other => panic!("round {round}: {key} was not claimed: {other:?}"),
            }
        }
    }
    // A replay of a key claimed before the terminations is still a replay.
    assert!(matches!(claim(&s, "k1").await, ClaimOutcome::Existing(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_205_lease_renewals_are_not_starved_by_a_saturated_pool() {
    let (_database, s) = fresh().await;
    let record = match claim(&s, "renewed").await {
        ClaimOutcome::Claimed(record) => record,
        other => panic!("expected a claim, got {other:?}"),
    };
    // Every connection of the pool taken, as by calls that wait on a slow database.
    let (pool_connections, _) = tollgate_postgres::test_support::split_connections(8);
    let mut held = Vec::new();
    for _ in 0..pool_connections {
        held.push(s.pool().acquire().await.unwrap());
    }
    let renewed = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        s.renew_lease(record.fence(), 3_000, chrono::Utc::now()),
    )
    .await
    .expect("a renewal waited for the saturated pool");
    assert_eq!(renewed.unwrap().fence(), record.fence());
    drop(held);
}

/// Every connection the stores open over TCP has the server's keepalive on (the pool's and the
/// lane's share one set of options): the server finds a connection whose client vanished in
/// seconds, not hours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_206_connections_carry_the_server_s_tcp_keepalive() {
    let (database, _) = fresh().await;
    let s = PgStores::connect_with(
        database.url(),
        4,
        tollgate_postgres::SessionTimeouts::default(),
    )
    .await
    .unwrap();
    let shown: Vec<String> = sqlx::query_scalar(
        "SELECT setting FROM pg_settings WHERE name IN \
         ('tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count') ORDER BY name",
    )
    .fetch_all(s.pool())
    .await
    .unwrap();
    let expected = [
        tollgate_postgres::TCP_KEEPALIVES_COUNT,
        tollgate_postgres::TCP_KEEPALIVES_IDLE_S,
        tollgate_postgres::TCP_KEEPALIVES_INTERVAL_S,
    ]
    .map(|n| n.to_string());
    assert_eq!(shown, expected);
}

/// Sends `signal` (`STOP`, `CONT`) to the database backend `pid`.
fn signal(pid: i32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// A store operation on a connection that stopped answering (its backend stopped: no answer,
/// no error, as behind a route that forwards nothing) fails `Unavailable` within the client-side
/// deadline of a statement, instead of waiting for the kernel to give the connection up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_206_an_operation_on_a_connection_that_stopped_answering_fails_within_its_deadline() {
    let (database, _) = fresh().await;
    let timeouts = tollgate_postgres::SessionTimeouts {
        statement_timeout_ms: 1_000,
        lock_timeout_ms: 500,
        idle_in_transaction_timeout_ms: 5_000,
    };
    // One connection: no lane, every statement on the pool's one connection.
    let s = PgStores::connect_with(database.url(), 1, timeouts)
        .await
        .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(s.pool())
        .await
        .unwrap();
    signal(pid, "STOP");
    let started = std::time::Instant::now();
    let mut request = claim_req("a", "k1", text_config(), "0.01");
    request.dispatch = true;
    let answered = tokio::time::timeout(std::time::Duration::from_secs(20), s.claim(request)).await;
    let waited = started.elapsed();
    signal(pid, "CONT");
    let answered = answered.expect("the store operation hung past its deadline");
    assert!(
        matches!(answered, Err(tollgate_store::StoreError::Unavailable(_))),
        "{answered:?}"
    );
    // The deadline: the server's statement_timeout (1 s) plus the client's slack (2 s).
    assert!(waited < std::time::Duration::from_secs(6), "{waited:?}");
}
