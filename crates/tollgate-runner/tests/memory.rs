//! The runner suite on the in-memory stores.
#![cfg(test)]

mod suite;

use std::sync::Arc;
use tollgate_store::{MemoryStores, Stores};

async fn fresh() -> Arc<dyn Stores> {
    Arc::new(MemoryStores::new())
}

include!("suite/names.rs");
