//! The runner suite on Postgres: every case on a brand-new, migrated database of its own.
//! `TOLLGATE_TEST_DATABASE_URL` names the server (a user that may create databases); the
//! default is the local trust-auth server.
#![cfg(test)]

mod lease;
mod suite;

use std::sync::Arc;
use tollgate_store::Stores;

fn admin_url() -> String {
    std::env::var("TOLLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn fresh() -> Arc<dyn Stores> {
    Arc::new(
        tollgate_testkit::pg::fresh_test_database(&admin_url())
            .await
            .unwrap(),
    )
}

include!("suite/names.rs");

/// Stores with the production lease rule: the database's clock.
async fn fresh_with_database_clock() -> Arc<dyn Stores> {
    let database = tollgate_testkit::pg::TestDatabase::create(&admin_url())
        .await
        .unwrap();
    let stores = database
        .stores(tollgate_testkit::pg::TEST_POOL_CONNECTIONS)
        .await
        .unwrap();
    stores.migrate().await.unwrap();
    Arc::new(stores)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_100_slow_dispatch_mark_keeps_its_lease() {
    lease::sc_100_slow_dispatch_mark_keeps_its_lease(fresh_with_database_clock().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_102_skewed_host_clocks_do_not_expire_a_live_lease() {
    lease::sc_102_skewed_host_clocks_do_not_expire_a_live_lease(fresh_with_database_clock().await)
        .await;
}
