//! The step and structured runner suites on the in-memory stores.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod steps;

use std::sync::Arc;
use tollgate_store::{MemoryStores, TreeStores};

async fn fresh() -> Arc<dyn TreeStores> {
    Arc::new(MemoryStores::new())
}

include!("steps/names.rs");
