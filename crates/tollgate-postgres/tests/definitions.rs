//! One live source per SQL function and composite type (`tollgate_postgres::DEFINITIONS`): after
//! `migrate`, the database's functions and composite types are exactly the ones the `.sql`
//! sources define, each equal to its source run into a scratch schema; a database left with stale
//! definitions is reported pending and put right by `migrate`; and the PL/pgSQL cap rule, which
//! the claim and the settlement functions share, agrees with the Rust rule.
#![cfg(test)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sqlx::{Connection, PgConnection};
use std::collections::BTreeMap;
use tollgate_core::caps::{CapWarning, Caps, CurrencySpend, SpendTotals};
use tollgate_core::money::{Currency, Money};
use tollgate_postgres::{PgStores, DEFINITIONS};
use tollgate_store::StoreError;
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// A migrated database of its own.
async fn fresh() -> (TestDatabase, PgStores) {
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let stores = database.stores(2).await.unwrap();
    stores.migrate().await.unwrap();
    (database, stores)
}

/// The functions and composite types of `schema`, looked up with `search_path` set to
/// `search_path` (so that both sides print the same type names unqualified): `function
/// name(arguments)` → `pg_get_functiondef` with the schema left out of the function's name, and
/// `type name` → its attributes (name and `format_type`, in order).
async fn definitions_in(
    conn: &mut PgConnection,
    schema: &str,
    search_path: &str,
) -> BTreeMap<String, String> {
    sqlx::query("SELECT set_config('search_path', $1, false)")
        .bind(search_path)
        .execute(&mut *conn)
        .await
        .unwrap();
    let functions: Vec<(String, String)> = sqlx::query_as(
        "SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) \
           || ')', pg_get_functiondef(p.oid) \
         FROM pg_proc p WHERE p.pronamespace = $1::regnamespace",
    )
    .bind(schema)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let types: Vec<(String, String)> = sqlx::query_as(
        "SELECT 'type ' || t.typname, string_agg(a.attname || ' ' \
           || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum) \
         FROM pg_type t JOIN pg_class c ON c.oid = t.typrelid AND c.relkind = 'c' \
         JOIN pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped \
         WHERE t.typnamespace = $1::regnamespace GROUP BY t.typname",
    )
    .bind(schema)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    sqlx::query("RESET search_path")
        .execute(&mut *conn)
        .await
        .unwrap();
    let qualified = format!("FUNCTION {schema}.");
    functions
        .into_iter()
        .map(|(name, def)| (name, def.replacen(&qualified, "FUNCTION ", 1)))
        .chain(types)
        .collect()
}

/// What the sources define, run into the scratch schema `source` of `database` (made anew).
async fn sources(conn: &mut PgConnection) -> BTreeMap<String, String> {
    sqlx::raw_sql("DROP SCHEMA IF EXISTS source CASCADE; CREATE SCHEMA source")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SET search_path = source, public")
        .execute(&mut *conn)
        .await
        .unwrap();
    for definition in &DEFINITIONS {
        sqlx::raw_sql(definition.sql)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", definition.path));
    }
    let defined = definitions_in(conn, "source", "source, public").await;
    sqlx::query("DROP SCHEMA source CASCADE")
        .execute(&mut *conn)
        .await
        .unwrap();
    defined
}

/// The definitions of `public` equal the sources': the same set, each the same.
async fn assert_public_is_the_sources(database: &TestDatabase) {
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    let expected = sources(&mut conn).await;
    let found = definitions_in(&mut conn, "public", "public").await;
    let names = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&found), names(&expected), "the set of definitions");
    for (name, source) in &expected {
        assert_eq!(&found[name], source, "{name} differs from its source");
    }
}

#[tokio::test]
async fn the_migrated_functions_and_types_are_their_sources() {
    let (database, _stores) = fresh().await;
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    let expected = sources(&mut conn).await;
    let mut names: Vec<&str> = expected.keys().map(String::as_str).collect();
    names
        .iter_mut()
        .for_each(|n| *n = n.split('(').next().unwrap());
    assert_eq!(
        names,
        [
            "function audit_log_append_only",
            "function tollgate_cap_crossed",
            "function tollgate_charge_spend",
            "function tollgate_claim",
            "function tollgate_claim_batch",
            "function tollgate_claim_calls",
            "function tollgate_claim_together",
            "function tollgate_config_missing",
            "function tollgate_crossed",
            "function tollgate_limits_admit",
            "function tollgate_limits_end",
            "function tollgate_lock_groups",
            "function tollgate_settle",
            "function tollgate_settle_batch",
            "function tollgate_settle_calls",
            "function tollgate_settle_together",
            "function tollgate_shard_batch",
            "type tollgate_claim_call",
            "type tollgate_settle_call",
            "type tollgate_settled",
        ]
    );
    assert_public_is_the_sources(&database).await;
    // The audit log's triggers still call their function.
    let triggers: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_trigger \
         WHERE tgrelid = 'audit_log'::regclass AND tgfoid = 'audit_log_append_only'::regproc",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(triggers, 2);
}

/// The claim function as its migration applied it: the cap rule written out in its body.
fn migrated_claim_body() -> String {
    include_str!("../../../migrations/20261201020000_claim_function.sql").replacen(
        "CREATE FUNCTION",
        "CREATE OR REPLACE FUNCTION",
        1,
    )
}

#[tokio::test]
async fn stale_definitions_are_pending_and_migrate_puts_them_right() {
    let (database, stores) = fresh().await;
    stores.ready().await.unwrap();
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    // An older body, a changed composite type (its batch function goes with it), a function the
    // sources do not define, and a digest that is not the sources'.
    sqlx::raw_sql(&migrated_claim_body())
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::raw_sql(
        "DROP TYPE tollgate_claim_call CASCADE; \
         CREATE TYPE tollgate_claim_call AS (id uuid, scope text); \
         CREATE FUNCTION tollgate_gone() RETURNS integer LANGUAGE sql AS $$ SELECT 1 $$; \
         UPDATE tollgate_definitions SET digest = 'stale'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    assert!(
        matches!(stores.ready().await, Err(StoreError::Unavailable(_))),
        "a stale digest is pending"
    );
    stores.migrate_if_pending().await.unwrap();
    stores.ready().await.unwrap();
    assert_public_is_the_sources(&database).await;
    // And again: nothing is pending, nothing changes.
    stores.migrate().await.unwrap();
    assert_public_is_the_sources(&database).await;
}

#[tokio::test]
async fn a_composite_type_a_column_uses_is_not_dropped() {
    let (database, stores) = fresh().await;
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    sqlx::raw_sql(
        "ALTER TYPE tollgate_settle_call ADD ATTRIBUTE extra integer; \
         CREATE TABLE keeps_calls (call tollgate_settle_call); \
         UPDATE tollgate_definitions SET digest = 'stale'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let Err(StoreError::Unavailable(reason)) = stores.migrate().await else {
        panic!("a type a column uses was changed");
    };
    assert!(reason.contains("keeps_calls.call"), "{reason}");
    // Nothing of the step was committed.
    let digest: String = sqlx::query_scalar("SELECT digest FROM tollgate_definitions")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(digest, "stale");
}

#[tokio::test]
async fn the_application_role_starts_on_current_definitions_and_is_refused_on_stale_ones() {
    let (database, stores) = fresh().await;
    let app = PgStores::connect(&database.app_role_url().await.unwrap(), 2)
        .await
        .unwrap();
    app.migrate_if_pending().await.unwrap();
    app.ready().await.unwrap();
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    sqlx::raw_sql(&migrated_claim_body())
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("UPDATE tollgate_definitions SET digest = 'stale'")
        .execute(&mut conn)
        .await
        .unwrap();
    let Err(StoreError::Unavailable(reason)) = app.migrate_if_pending().await else {
        panic!("the application role applied definitions");
    };
    assert!(reason.contains("42501"), "{reason}");
    assert!(app.ready().await.is_err());
    // The owner puts them right; the application role then starts.
    stores.migrate().await.unwrap();
    app.migrate_if_pending().await.unwrap();
    app.ready().await.unwrap();
    assert_public_is_the_sources(&database).await;
}

// ---- the cap rule ------------------------------------------------------------------------------

fn m(s: &str) -> Money {
    Money::parse(s, "test").unwrap()
}

fn currency(code: &str) -> Currency {
    Currency::parse(code).unwrap()
}

fn spend(code: &str, settled: &str, held: &str) -> CurrencySpend {
    CurrencySpend::new(
        currency(code),
        SpendTotals {
            settled: m(settled),
            held: m(held),
        },
    )
}

/// Boundary cases of one cap: `(currency, spent, cap)`, with amounts at each currency's usual
/// scale and at the finest stored scale. The SQL rule sees amounts only: spend is kept per
/// currency, so a cap is only ever compared with spend in its own currency.
const CASES: [(&str, &str, Option<&str>); 14] = [
    ("USD", "0", Some("0")),
    ("USD", "0.000000000001", Some("0")),
    ("USD", "1.5", Some("1.5")),
    ("USD", "1.500000000001", Some("1.5")),
    ("USD", "1.499999999999", Some("1.5")),
    ("USD", "2", Some("1.5")),
    ("USD", "1.5", None),
    ("USD", "0", None),
    ("EUR", "10.01", Some("10")),
    ("EUR", "10.00", Some("10")),
    ("EUR", "9.99", Some("10")),
    ("JPY", "1000", Some("1000")),
    ("JPY", "1001", Some("1000")),
    ("JPY", "999", Some("1000")),
];

/// `tollgate_cap_crossed`, the one rule, against the Rust rule for each level: a warn cap by
/// `Caps::after_settle`, a block cap by `Caps::after_settle` (post-call) and by `Caps::admit`
/// (the claim's hold: `settled + held + hold > block`, which the claim function judges on the
/// totals with the hold added).
#[tokio::test]
async fn the_sql_cap_rule_agrees_with_the_rust_rule() {
    let (database, _stores) = fresh().await;
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    for (code, spent, cap) in CASES {
        let cur = currency(code);
        for level in ["warn", "block"] {
            let sql: bool = sqlx::query_scalar(
                "SELECT COALESCE(tollgate_cap_crossed($1, $2::numeric, $3::numeric), false)",
            )
            .bind(level)
            .bind(spent)
            .bind(cap)
            .fetch_one(&mut conn)
            .await
            .unwrap();
            let caps = match level {
                "warn" => Caps {
                    session_warn: cap.map(m),
                    ..Caps::default()
                },
                _ => Caps {
                    session_block: cap.map(m),
                    ..Caps::default()
                },
            };
            let after = caps
                .after_settle(&cur, &spend(code, spent, "0"), &spend(code, "0", "0"))
                .unwrap();
            assert_eq!(sql, !after.is_empty(), "{level} {code} {spent} {cap:?}");
            if level == "block" {
                // The same total as a hold on top of settled and held spend.
                let admitted = caps
                    .admit(
                        &cur,
                        &spend(code, "0", "0"),
                        &spend(code, "0", "0"),
                        m(spent),
                    )
                    .unwrap();
                assert_eq!(sql, admitted.is_err(), "hold {code} {spent} {cap:?}");
            }
        }
    }
}

/// `tollgate_crossed`, the post-call caps a settlement stores as warnings, equals
/// `Caps::after_settle`: the same caps crossed, in the same order, with the same amounts.
#[tokio::test]
async fn the_post_call_caps_equal_the_rust_warnings() {
    let (database, _stores) = fresh().await;
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    let caps = [
        Caps::default(),
        Caps {
            session_warn: Some(m("1")),
            session_block: Some(m("2")),
            daily_warn: Some(m("5")),
            daily_block: Some(m("10")),
            ..Caps::default()
        },
        Caps {
            session_block: Some(m("2")),
            daily_warn: Some(m("2")),
            ..Caps::default()
        },
        Caps {
            session_warn: Some(m("0")),
            daily_block: Some(m("0")),
            ..Caps::default()
        },
    ];
    let totals = [
        ("0", "0"),
        ("1", "1"),
        ("2", "5"),
        ("2.000000000001", "10"),
        ("3", "10.000000000001"),
        ("0.999999999999", "4.999999999999"),
    ];
    for caps in &caps {
        for (session, day) in totals {
            let cur = currency("USD");
            let rust = caps
                .after_settle(&cur, &spend("USD", session, "0"), &spend("USD", day, "0"))
                .unwrap();
            let amount = |m: Option<Money>| m.map(|m| m.decimal());
            let sql: sqlx::types::Json<Vec<CapWarning>> = sqlx::query_scalar(
                "SELECT tollgate_crossed($1::numeric, $2::numeric, $3, $4, $5, $6)",
            )
            .bind(session)
            .bind(day)
            .bind(amount(caps.session_warn))
            .bind(amount(caps.session_block))
            .bind(amount(caps.daily_warn))
            .bind(amount(caps.daily_block))
            .fetch_one(&mut conn)
            .await
            .unwrap();
            assert_eq!(sql.0, rust, "{caps:?} {session} {day}");
        }
    }
}
