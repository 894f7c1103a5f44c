//! The step and structured runner suites on the in-memory stores.
#![cfg(test)]

mod steps;

use std::sync::Arc;
use tollgate_store::{AllStores, MemoryStores};

async fn fresh() -> Arc<dyn AllStores> {
    Arc::new(MemoryStores::new())
}

include!("steps/names.rs");

/// ST-31: a completed call whose root receipt went missing reads `reconciliation_required`, and
/// recovery repairs the receipt set from the governed charge, without sending.
#[tokio::test]
async fn st_31_recovery_repairs_a_missing_root_receipt() {
    let memory = Arc::new(MemoryStores::new());
    let h = steps::H::new(memory.clone());
    let c = steps::client(vec![steps::tool_reply("{}")]);
    let runner = h.steps(steps::step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let done = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    let id = done.execution_id.unwrap();
    memory.forget_root_receipt(id).unwrap();
    let scope = tollgate_testkit::conformance::scope("acme");
    let root = tollgate_core::ids::RootKey::parse("turn-1").unwrap();
    let key = tollgate_core::ids::OperationKey::parse("s1").unwrap();
    let broken = runner.read(&scope, &root, &key).await.unwrap().unwrap();
    assert_eq!(
        broken.state,
        tollgate_core::view::ViewState::ReconciliationRequired
    );
    assert_eq!(h.root("turn-1").await.charged, tollgate_core::Money::ZERO);
    let r = tollgate_runner::recovery::Reconciler::with_roots(h.stores.clone(), h.clock.clone());
    let repaired = runner
        .recover(&r, &scope, &root, &key, 1000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(repaired.state, tollgate_core::view::ViewState::Completed);
    assert_eq!(
        repaired.root_receipt.unwrap().amount,
        done.receipt.unwrap().amount
    );
    assert_eq!(
        h.root("turn-1").await.charged,
        tollgate_testkit::conformance::money("0.00002")
    );
    // Idempotent: a second recovery changes nothing.
    runner.recover(&r, &scope, &root, &key, 1000).await.unwrap();
    assert_eq!(
        h.root("turn-1").await.charged,
        tollgate_testkit::conformance::money("0.00002")
    );
    assert_eq!(c.sends(), 1);
}
