//! The scheduler's scan for scopes with work on Postgres (spec/performance.md, H-8):
//! it reads about one index entry per scope with work, not every open row. Shown on the query
//! plans of a database grown by copying one completed execution (its evidence left open), not on
//! timings.
#![cfg(test)]

use futures::FutureExt;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, Scope, SessionId};
use tollgate_core::message::{Message, Role};
use tollgate_core::usage::Usage;
use tollgate_provider::scripted::{ScriptedClient, ScriptedReply};
use tollgate_runner::{RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::traits::WorkScan;
use tollgate_testkit::conformance::text_config;
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

const SCOPE: &str = "h8";
const TEMPLATE: &str = "template";
/// Open evidence rows the scope holds after seeding.
const OPEN_ROWS: u64 = 5_000;

fn request(key: &str) -> RunRequest {
    RunRequest {
        scope: Scope::parse(SCOPE).unwrap(),
        session_id: SessionId::parse("s").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        input_revision: InputRevision::parse("r").unwrap(),
        intent: Intent::parse("h8").unwrap(),
        load_input: async { Ok(vec![Message::text(Role::User, "hello")]) }.boxed(),
        cancel: CancellationToken::new(),
        limits: Vec::new(),
    }
}

#[tokio::test]
async fn h_8_scopes_with_work_reads_per_scope_not_per_open_row() {
    let db = TestDatabase::create(&test_admin_url()).await.unwrap();
    let stores = Arc::new(db.stores(4).await.unwrap());
    stores.migrate().await.unwrap();
    let client = Arc::new(ScriptedClient::new(Vec::new()));
    client.push(ScriptedReply::text(
        "hi",
        Usage {
            input: 10,
            output: 5,
            ..Usage::ZERO
        },
    ));
    let runner =
        SingleCallRunner::new(stores.clone(), client, RunnerSettings::new(text_config())).unwrap();
    runner.run(request(TEMPLATE)).await.unwrap();
    let seeded = db
        .seed_copies(SCOPE, TEMPLATE, "-c", OPEN_ROWS, true)
        .await
        .unwrap();
    assert_eq!(seeded, OPEN_ROWS);

    // The answer is the one scope with work.
    let scopes = stores.scopes_with_work(None, 100).await.unwrap();
    assert_eq!(scopes, [Scope::parse(SCOPE).unwrap()]);

    let plans = db.explain_hot_path(SCOPE, TEMPLATE, 100).await.unwrap();
    let plan = |name: &str| {
        plans
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no plan {name}: {plans:#?}"))
            .clone()
    };
    let before = plan("scopes with work (before H-8)");
    let now = plan("scopes with work");
    // The old query reads every open row: the seeding does give the scan something to read.
    assert!(before.rows_scanned >= OPEN_ROWS as f64, "{before:#?}");
    // The skip scan reads a few index entries per table, whatever the open rows.
    assert!(now.rows_scanned <= 20.0, "{now:#?}");
}
