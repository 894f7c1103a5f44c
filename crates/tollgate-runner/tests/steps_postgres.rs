//! The step and structured runner suites on Postgres: every case on a brand-new, migrated
//! database of its own. `TOLLGATE_TEST_DATABASE_URL` names the server (a user that may create
//! databases); the default is the local trust-auth server.
#![cfg(test)]

mod steps;

use std::sync::Arc;
use tollgate_store::AllStores;

fn admin_url() -> String {
    std::env::var("TOLLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn fresh() -> Arc<dyn AllStores> {
    Arc::new(
        tollgate_testkit::pg::fresh_test_database(&admin_url())
            .await
            .unwrap(),
    )
}

include!("steps/names.rs");
