//! The runner suite on Postgres: every case on a brand-new, migrated database of its own.
//! `TOLLGATE_TEST_DATABASE_URL` names the server (a user that may create databases); the
//! default is the local trust-auth server.
#![cfg(test)]

mod suite;

use std::sync::Arc;
use tollgate_store::Stores;

fn admin_url() -> String {
    std::env::var("TOLLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn fresh() -> Arc<dyn Stores> {
    Arc::new(
        tollgate_postgres::fresh_test_database(&admin_url())
            .await
            .unwrap(),
    )
}

include!("suite/names.rs");
