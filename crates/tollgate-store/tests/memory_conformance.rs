//! The store conformance suite on the in-memory stores.
#![cfg(test)]

use std::sync::Arc;
use tollgate_store::MemoryStores;

async fn fresh() -> Arc<MemoryStores> {
    Arc::new(MemoryStores::new())
}

tollgate_testkit::store_conformance!(fresh);

mod roots {
    use super::fresh;
    tollgate_testkit::root_conformance!(fresh);
}

mod service {
    use super::fresh;
    tollgate_testkit::service_conformance!(fresh);
}
