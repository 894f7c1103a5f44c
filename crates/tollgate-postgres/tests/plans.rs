//! Cached plans of the call path on a database without statistics (spec/performance.md, H-12).
#![cfg(test)]

use tollgate_testkit::bench::hot_statements;
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// A freshly migrated database has no statistics, so every index looks as cheap as any other.
/// The generic plan a pooled connection caches there must still reach each lookup's rows through
/// the index made for it: never a scan of the scope's rows filtered one by one, and no
/// sequential scan.
#[tokio::test]
async fn h_12_generic_plans_on_an_empty_database_use_the_lookup_indexes() {
    let db = TestDatabase::create(&test_admin_url()).await.unwrap();
    let stores = db.stores(2).await.unwrap();
    stores.migrate().await.unwrap();
    let mut wrong = Vec::new();
    for statement in hot_statements() {
        let plan = db.generic_plan(statement.sql).await.unwrap();
        let seq_scan = plan.nodes.iter().any(|n| n.starts_with("Seq Scan"));
        if seq_scan || plan.indexes.first().map(String::as_str) != Some(statement.index) {
            wrong.push(format!(
                "{}: expected {}, planned {}",
                statement.name,
                statement.index,
                plan.nodes.join(" > ")
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "plans off their index:\n{}",
        wrong.join("\n")
    );
}

/// The check can fail: before H-12 the listing index led by the scope took lookups by key.
#[tokio::test]
async fn h_12_the_plan_check_sees_a_lookup_planned_through_a_scope_index() {
    let db = TestDatabase::create(&test_admin_url()).await.unwrap();
    let stores = db.stores(2).await.unwrap();
    stores.migrate().await.unwrap();
    sqlx::raw_sql(
        "CREATE INDEX executions_scope_state_created_idx \
         ON executions (scope, state, created_at, id)",
    )
    .execute(stores.pool())
    .await
    .unwrap();
    let by_key = hot_statements()
        .into_iter()
        .find(|s| s.name == "execution by key")
        .unwrap();
    let plan = db.generic_plan(by_key.sql).await.unwrap();
    assert_eq!(
        plan.indexes.first().map(String::as_str),
        Some("executions_scope_state_created_idx"),
        "{plan:?}"
    );
}
