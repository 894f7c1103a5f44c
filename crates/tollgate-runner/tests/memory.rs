//! The runner suite on the in-memory stores.
#![cfg(test)]

mod lease;
mod suite;

use std::sync::Arc;
use tollgate_store::{MemoryStores, Stores};

async fn fresh() -> Arc<dyn Stores> {
    Arc::new(MemoryStores::new())
}

include!("suite/names.rs");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_100_slow_dispatch_mark_keeps_its_lease() {
    lease::sc_100_slow_dispatch_mark_keeps_its_lease(fresh().await).await;
}

#[tokio::test(start_paused = true)]
async fn sc_103_heartbeat_ends_with_the_call() {
    lease::sc_103_heartbeat_ends_with_the_call(fresh().await).await;
}
