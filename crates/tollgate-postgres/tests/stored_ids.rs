//! Identifiers read back from the database: a row whose ids hold invisible format characters
//! (written before requests refused them) still reads as it was written, through every read of
//! its execution, settlement, the work scan and the ledger audit (SC-198).
#![cfg(test)]

use std::sync::Arc;
use tollgate_core::ids::{ConsumerId, OperationKey, Scope, SessionId};
use tollgate_core::state::ExecutionState;
use tollgate_postgres::PgStores;
use tollgate_store::{ClaimOutcome, ExecutionStore, LedgerAudit, SettlementStore, WorkScan};
use tollgate_testkit::conformance::{claim_req, settle_req, t0, text_config};
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

async fn fresh() -> Arc<PgStores> {
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let stores = database.stores(2).await.unwrap();
    stores.migrate().await.unwrap();
    Arc::new(stores.with_caller_lease_clock())
}

/// SC-198: the stored-row reads take [`Scope::from_stored`] and its kin, so the request rule
/// does not turn an old row into a corrupt one.
#[tokio::test]
async fn sc_198_rows_whose_ids_hold_format_characters_still_read() {
    let s = fresh().await;
    let scope = Scope::from_stored("acme\u{202E}").unwrap();
    let key = OperationKey::from_stored("order-\u{202E}1").unwrap();
    let consumer = ConsumerId::from_stored("team\u{200B}a").unwrap();
    let mut request = claim_req("a", "k", text_config(), "0.5");
    request.scope = scope.clone();
    request.operation_key = key.clone();
    request.binding.session_id = SessionId::from_stored("s\u{FEFF}1").unwrap();
    request.binding.config.consumer = consumer.clone();
    let ClaimOutcome::Claimed(claimed) = s.claim(request).await.unwrap() else {
        panic!("expected a claim");
    };
    let dispatched = s.mark_dispatched(claimed.fence(), t0()).await.unwrap();

    let read = s.execution(&scope, &key).await.unwrap().unwrap();
    assert_eq!(read, dispatched);
    assert_eq!(read.consumer(), &consumer);
    let by_state = s
        .by_state(&scope, ExecutionState::Dispatched, 10)
        .await
        .unwrap();
    assert_eq!(by_state.len(), 1);
    let work = s.scopes_with_work(None, 10).await.unwrap();
    assert_eq!(work, vec![scope.clone()]);

    s.settle(settle_req(&dispatched, "0.00002", "x"))
        .await
        .unwrap();
    let settlement = s.settlement(dispatched.id).await.unwrap().unwrap();
    assert_eq!(settlement.consumer, consumer);
    assert_eq!(settlement.operation_key, key);
    let report = s.audit_ledger(Some(&scope), 20).await.unwrap();
    assert!(report.violations.is_empty(), "{report:?}");
}
