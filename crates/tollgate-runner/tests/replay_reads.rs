//! What a replay and a first call cost in store operations (spec/performance.md, H-14..H-16,
//! H-22), counted by the fault wrapper around the in-memory stores and around Postgres: a replay
//! is the claim's one read and nothing else; a first call with its input in hand is one claim
//! (also its dispatch mark) and one settlement (also its evidence), whose answer is the call's
//! view, equal to the view read afterwards.
#![cfg(test)]

use futures::FutureExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, Scope, SessionId};
use tollgate_core::message::{Message, Role};
use tollgate_core::usage::Usage;
use tollgate_core::view::ViewState;
use tollgate_provider::scripted::{ScriptedClient, ScriptedReply};
use tollgate_runner::{RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::fault::{FaultyStores, StoreOp};
use tollgate_store::{MemoryStores, Stores};
use tollgate_testkit::conformance::text_config;
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

fn request(key: &str) -> RunRequest {
    RunRequest {
        scope: Scope::parse("reads").unwrap(),
        session_id: SessionId::parse("s").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        input_revision: InputRevision::parse("r").unwrap(),
        intent: Intent::parse("count").unwrap(),
        load_input: async { Ok(vec![Message::text(Role::User, "hello")]) }.boxed(),
        cancel: CancellationToken::new(),
        limits: Vec::new(),
    }
}

/// The store operations the wrapper saw since `before`, by name (zero counts left out).
fn since(stores: &FaultyStores, before: &BTreeMap<StoreOp, u64>) -> BTreeMap<&'static str, u64> {
    stores
        .calls()
        .into_iter()
        .map(|(op, n)| (op.name(), n - before.get(&op).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

async fn h_14_h_15_h_16_h_22_store_operations_of_a_call_and_its_replay(inner: Arc<dyn Stores>) {
    let stores = Arc::new(FaultyStores::new(inner));
    let client = Arc::new(ScriptedClient::new(Vec::new()));
    client.push(ScriptedReply::text(
        "hi",
        Usage {
            input: 10,
            output: 5,
            ..Usage::ZERO
        },
    ));
    let runner = SingleCallRunner::new(
        Arc::clone(&stores) as Arc<dyn Stores>,
        client.clone(),
        RunnerSettings::new(text_config()),
    )
    .unwrap();
    let input = [Message::text(Role::User, "hello")];
    let before = stores.calls();
    let first = runner.run_inline(request("k"), &input).await.unwrap();
    assert_eq!(first.state, ViewState::Completed);
    let seen = since(&stores, &before);
    // The heartbeat may renew the lease on a slow machine; nothing else may appear.
    let mut writes = seen.clone();
    writes.remove("renew_lease");
    assert_eq!(
        writes,
        BTreeMap::from([("claim", 1), ("settle", 1)]),
        "a first call with its input in hand"
    );
    let read = runner
        .read(
            &Scope::parse("reads").unwrap(),
            &OperationKey::parse("k").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, first, "the answer is the committed view");
    let before = stores.calls();
    let replay = runner.run_inline(request("k"), &input).await.unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.receipt, first.receipt);
    assert_eq!(replay.output, first.output);
    assert_eq!(
        since(&stores, &before),
        BTreeMap::from([("claim", 1)]),
        "a replay is the claim's one read"
    );
    assert_eq!(client.sends(), 1);
}

#[tokio::test]
async fn h_14_h_15_h_16_h_22_store_operations_on_memory() {
    h_14_h_15_h_16_h_22_store_operations_of_a_call_and_its_replay(Arc::new(MemoryStores::new()))
        .await;
}

#[tokio::test]
async fn h_14_h_15_h_16_h_22_store_operations_on_postgres() {
    let db = TestDatabase::create(&test_admin_url()).await.unwrap();
    let stores = Arc::new(db.stores(4).await.unwrap());
    stores.migrate().await.unwrap();
    h_14_h_15_h_16_h_22_store_operations_of_a_call_and_its_replay(stores).await;
}
