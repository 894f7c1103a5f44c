//! The store conformance suite on Postgres (one brand-new database per test), plus the
//! guarantees only a database schema can give: exactly-once settlement and root receipts, an
//! append-only audit log, and the finance view with its read-only role.
#![cfg(test)]

use chrono::Utc;
use std::sync::Arc;
use tollgate_core::state::CallKind;
use tollgate_core::state::Outcome;
use tollgate_core::view::Output;
use tollgate_postgres::{PgStores, SessionTimeouts};
use tollgate_store::{
    ClaimOutcome, ExecutionRecord, ExecutionStore, ResultStore, RootStore, StoreError,
};
use tollgate_testkit::conformance::{
    claim_req, key, open_root, root_key, scope, settle_req, t0, text_config,
};
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// Connections of each conformance database's pool (the concurrency cases need more than the
/// default test pool).
const CONFORMANCE_POOL_CONNECTIONS: u32 = 8;

/// A migrated, empty database of its own (dropped once its pool is gone).
async fn fresh() -> Arc<PgStores> {
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let stores = database.stores(CONFORMANCE_POOL_CONNECTIONS).await.unwrap();
    stores.migrate().await.unwrap();
    // The cases pass their own `now` (a fixed day) and move it past leases.
    Arc::new(stores.with_caller_lease_clock())
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

async fn settled(s: &PgStores) -> ExecutionRecord {
    let ClaimOutcome::Claimed(r) = s
        .claim(claim_req("a", "k1", text_config(), "0.5"))
        .await
        .unwrap()
    else {
        panic!("expected a claim");
    };
    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
    s.settle(settle_req(&d, "0.1", "x")).await.unwrap();
    d
}

fn sqlstate(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(d) => d.code().map(|c| c.into_owned()),
        _ => None,
    }
}

#[tokio::test]
async fn exactly_one_settlement_is_enforced_by_the_schema() {
    let s = fresh().await;
    let r = settled(&s).await;
    let second = sqlx::query(
        "INSERT INTO cost_settlements (settlement_id, execution_id, scope, operation_key, kind, \
         consumer, session_id, accounting_day, provider, model, price_version, policy_version, \
         currency, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
         reasoning_tokens, amount, source, settled_at) \
         SELECT $1, execution_id, scope, operation_key, kind, consumer, session_id, \
         accounting_day, provider, model, price_version, policy_version, currency, input_tokens, \
         output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, amount, source, \
         settled_at FROM cost_settlements WHERE execution_id = $2",
    )
    .bind(uuid::Uuid::new_v4())
    .bind(r.id.0)
    .execute(s.pool())
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&second).as_deref(), Some("23505"));
    let sqlx::Error::Database(d) = &second else {
        panic!("database error expected");
    };
    assert_eq!(d.constraint(), Some("cost_settlements_execution_id_key"));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM cost_settlements")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    // A negative amount is refused by the schema too.
    let negative = sqlx::query("UPDATE cost_settlements SET amount = -1")
        .execute(s.pool())
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&negative).as_deref(), Some("23514"));
}

#[tokio::test]
async fn exactly_one_root_receipt_is_enforced_by_the_schema() {
    let s = fresh().await;
    let mut config = text_config();
    config.kind = CallKind::Step;
    let root = open_root(&*s, "r1", config.clone()).await;
    let mut req = claim_req("a", "c1", config, "0.5");
    req.root_key = Some(root_key("r1"));
    let ClaimOutcome::Claimed(r) = s.claim(req).await.unwrap() else {
        panic!("expected a claim");
    };
    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
    let out = s.settle(settle_req(&d, "0.1", "x")).await.unwrap();
    let receipt = out.root_receipt.unwrap();
    assert_eq!(receipt.root_id, root.id);
    assert_eq!(s.root_receipt(r.id).await.unwrap(), Some(receipt));
    let second = sqlx::query(
        "INSERT INTO root_receipts (root_id, execution_id, amount, currency, created_at) \
         SELECT root_id, execution_id, amount, currency, created_at FROM root_receipts \
         WHERE execution_id = $1",
    )
    .bind(r.id.0)
    .execute(s.pool())
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&second).as_deref(), Some("23505"));
    let sqlx::Error::Database(e) = &second else {
        panic!("database error expected");
    };
    assert_eq!(e.constraint(), Some("root_receipts_pkey"));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM root_receipts")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    // A receipt needs a real execution and a real root, and a non-negative amount.
    let orphan = sqlx::query(
        "INSERT INTO root_receipts (root_id, execution_id, amount, currency, created_at) \
         VALUES ($1, $2, 0, 'USD', now())",
    )
    .bind(root.id.0)
    .bind(uuid::Uuid::new_v4())
    .execute(s.pool())
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&orphan).as_deref(), Some("23503"));
    let negative = sqlx::query("UPDATE root_receipts SET amount = -1")
        .execute(s.pool())
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&negative).as_deref(), Some("23514"));
    // The root's totals are guarded the same way.
    let overdrawn = sqlx::query("UPDATE roots SET held = -1")
        .execute(s.pool())
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&overdrawn).as_deref(), Some("23514"));
    let unknown = sqlx::query("UPDATE roots SET state = 'gone'")
        .execute(s.pool())
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&unknown).as_deref(), Some("23514"));
}

#[tokio::test]
async fn audit_log_rejects_update_and_delete() {
    let s = fresh().await;
    settled(&s).await;
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(before, 3, "claimed, dispatched, settled");
    for sql in [
        "UPDATE audit_log SET kind = 'forged'",
        "DELETE FROM audit_log",
        "DELETE FROM audit_log WHERE seq = 3",
        "TRUNCATE audit_log",
    ] {
        let e = sqlx::query(sql).execute(s.pool()).await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("P0001"), "{sql}");
    }
    let rows = tollgate_store::AuditLog::audit_rows(
        &*s,
        &scope("a"),
        tollgate_store::rows::AuditPosition::START,
        100,
    )
    .await
    .unwrap();
    assert_eq!(rows.len(), 3);
    tollgate_store::audit::verify_chain(&rows).unwrap();
}

#[tokio::test]
async fn sc_70_migrate_is_idempotent() {
    let s = fresh().await;
    s.migrate().await.unwrap();
    s.migrate().await.unwrap();
    s.ready().await.unwrap();
}

#[tokio::test]
async fn ready_requires_migrations() {
    let s = fresh().await;
    s.ready().await.unwrap();
    // A second, empty database: reachable but not migrated.
    let empty = TestDatabase::create(&test_admin_url()).await.unwrap();
    let bare = empty.stores(1).await.unwrap();
    assert!(matches!(
        bare.ready().await,
        Err(StoreError::Unavailable(_))
    ));
    bare.migrate().await.unwrap();
    bare.ready().await.unwrap();
}

#[tokio::test]
async fn sc_43_finance_view_has_the_contract_columns() {
    let s = fresh().await;
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_schema = 'finance' AND table_name = 'settlements' ORDER BY ordinal_position",
    )
    .fetch_all(s.pool())
    .await
    .unwrap();
    let names: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "settlement_id",
            "scope",
            "consumer",
            "session_id",
            "accounting_day",
            "execution_id",
            "operation_key",
            "kind",
            "provider",
            "model",
            "price_version",
            "policy_version",
            "currency",
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "reasoning_tokens",
            "amount",
            "source",
            "settled_at",
        ]
    );
    let amount = columns.iter().find(|(n, _)| n == "amount").unwrap();
    assert_eq!(amount.1, "numeric");
}

#[tokio::test]
async fn sc_43_finance_role_can_only_read_the_view() {
    let s = fresh().await;
    settled(&s).await;
    let mut conn = s.pool().acquire().await.unwrap();
    sqlx::query("SET ROLE tollgate_finance")
        .execute(&mut *conn)
        .await
        .unwrap();
    let (amount, source): (rust_decimal::Decimal, String) =
        sqlx::query_as("SELECT amount, source FROM finance.settlements")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(amount.normalize().to_string(), "0.1");
    assert_eq!(source, "stream");
    for sql in [
        "SELECT count(*) FROM cost_settlements",
        "SELECT count(*) FROM executions",
        "SELECT count(*) FROM audit_log",
        "DELETE FROM finance.settlements",
        "UPDATE finance.settlements SET amount = 0",
    ] {
        let e = sqlx::query(sql).execute(&mut *conn).await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{sql}");
    }
    sqlx::query("RESET ROLE").execute(&mut *conn).await.unwrap();
}

/// Two holders of the same fence settle at once: the row lock lets exactly one through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_settles_charge_once() {
    let s = fresh().await;
    for round in 0..10 {
        let k = format!("k{round}");
        let ClaimOutcome::Claimed(r) = s
            .claim(claim_req("a", &k, text_config(), "0.5"))
            .await
            .unwrap()
        else {
            panic!("expected a claim");
        };
        let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (s, d) = (Arc::clone(&s), d.clone());
                tokio::spawn(async move { s.settle(settle_req(&d, "0.1", "x")).await })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => ok += 1,
                Err(StoreError::StaleFence(_)) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(ok, 1, "round {round}");
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM cost_settlements")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(n, 10);
}

/// Content is stored exactly as serialized: NUL escapes survive (jsonb would refuse them, and a
/// settlement must never fail because of what the model wrote).
#[tokio::test]
async fn content_round_trips_exactly() {
    let s = fresh().await;
    let ClaimOutcome::Claimed(r) = s
        .claim(claim_req("a", "k1", text_config(), "0.5"))
        .await
        .unwrap()
    else {
        panic!("expected a claim");
    };
    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
    let mut req = settle_req(&d, "0.000000000001", "a\u{0}b \u{1F600}");
    let json: serde_json::Value =
        serde_json::from_str(r#"{"z": 1, "a": [1.5, "\u0000"]}"#).unwrap();
    req.output = Some(Output {
        text: Some("a\u{0}b \u{1F600}".into()),
        json: Some(json),
    });
    let out = s.settle(req.clone()).await.unwrap();
    assert_eq!(out.result.outcome, Outcome::Success);
    let stored = s.result(r.id).await.unwrap().unwrap();
    assert_eq!(stored.output, req.output);
    let text: String =
        sqlx::query_scalar("SELECT output::text FROM execution_results WHERE execution_id = $1")
            .bind(r.id.0)
            .fetch_one(s.pool())
            .await
            .unwrap();
    assert_eq!(Some(text), serde_json::to_string(&req.output).ok());
    assert_eq!(out.settlement.amount.to_string(), "0.000000000001");
}

/// Reads return exactly what writes returned, including sub-microsecond clocks (truncated).
#[tokio::test]
async fn records_read_back_equal() {
    let s = fresh().await;
    let mut req = claim_req("a", "k1", text_config(), "0.50");
    req.now = Utc::now();
    let ClaimOutcome::Claimed(r) = s.claim(req).await.unwrap() else {
        panic!("expected a claim");
    };
    let read = s.execution(&scope("a"), &key("k1")).await.unwrap().unwrap();
    assert_eq!(read, r);
    assert_eq!(read.hold.to_string(), "0.5");
}

/// ST-31 on Postgres: a receipt set damaged outside the stores (the root receipt deleted and its
/// amount taken off the root) is repaired in one unit, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st_31_missing_root_receipt_is_repaired_once() {
    let s = fresh().await;
    let mut config = text_config();
    config.kind = CallKind::Step;
    open_root(&*s, "r1", config.clone()).await;
    let mut req = claim_req("a", "c1", config, "0.5");
    req.root_key = Some(root_key("r1"));
    let ClaimOutcome::Claimed(r) = s.claim(req).await.unwrap() else {
        panic!("expected a claim");
    };
    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
    s.settle(settle_req(&d, "0.1", "x")).await.unwrap();
    sqlx::query("DELETE FROM root_receipts WHERE execution_id = $1")
        .bind(r.id.0)
        .execute(s.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE roots SET charged = 0")
        .execute(s.pool())
        .await
        .unwrap();
    assert!(s.root_receipt(r.id).await.unwrap().is_none());
    assert!(
        s.repair_root_receipt(&scope("b"), r.id, t0())
            .await
            .unwrap()
            .is_none(),
        "another scope repairs nothing"
    );
    let repaired = s
        .repair_root_receipt(&scope("a"), r.id, t0())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(repaired.amount, tollgate_testkit::conformance::money("0.1"));
    let again = s
        .repair_root_receipt(&scope("a"), r.id, t0())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again, repaired);
    let root = s.root(&scope("a"), &root_key("r1")).await.unwrap().unwrap();
    assert_eq!(
        root.charged,
        tollgate_testkit::conformance::money("0.1"),
        "added once"
    );
}

/// SC-91 on Postgres: rows damaged with raw SQL are named by the ledger audit, by invariant and
/// row id — a spend row's settled total, a settlement's amount, a deleted root receipt — and
/// every invariant fires on the rows the Postgres audit reads.
mod ledger_damage {
    use super::*;
    use tollgate_store::{LedgerAudit, LedgerInvariant, LedgerReport, SpendRowKey};
    use tollgate_testkit::conformance::money;

    /// A call settled at its usage's price (10 input + 5 output = 0.00002), under root `r1` when
    /// `root` is set.
    async fn priced(s: &PgStores, key_: &str, root: bool) -> ExecutionRecord {
        let mut config = text_config();
        if root {
            config.kind = CallKind::Step;
            open_root(s, "r1", config.clone()).await;
        }
        let mut req = claim_req("a", key_, config, "0.5");
        if root {
            req.root_key = Some(root_key("r1"));
        }
        let ClaimOutcome::Claimed(r) = s.claim(req).await.unwrap() else {
            panic!("expected a claim");
        };
        let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
        s.settle(settle_req(&d, "0.00002", "x")).await.unwrap();
        d
    }

    async fn audit(s: &PgStores) -> LedgerReport {
        s.audit_ledger(Some(&scope("a")), 100).await.unwrap()
    }

    #[tokio::test]
    async fn sc_91_spend_row_settled_plus_a_cent_is_named() {
        let s = fresh().await;
        let r = priced(&s, "k1", false).await;
        assert!(audit(&s).await.ok);
        sqlx::query("UPDATE spend_sessions SET settled = settled + 0.01")
            .execute(s.pool())
            .await
            .unwrap();
        let report = audit(&s).await;
        assert!(!report.ok);
        assert_eq!(report.violations_total, 1, "{:?}", report.violations);
        let v = report.first().unwrap();
        assert_eq!(v.invariant, LedgerInvariant::SpendSettled);
        assert_eq!(
            v.spend,
            Some(SpendRowKey::Session {
                consumer: r.consumer().clone(),
                session_id: r.session_id().clone(),
                currency: r.binding.config.currency.clone(),
            })
        );
        assert_eq!(v.expected, Some(money("0.00002")));
        assert_eq!(v.found, Some(money("0.01002")));
    }

    #[tokio::test]
    async fn sc_91_a_settlement_amount_changed_is_named() {
        let s = fresh().await;
        let r = priced(&s, "k1", false).await;
        sqlx::query("UPDATE cost_settlements SET amount = amount + 0.01 WHERE execution_id = $1")
            .bind(r.id.0)
            .execute(s.pool())
            .await
            .unwrap();
        let report = audit(&s).await;
        let priced = report
            .violations
            .iter()
            .find(|v| v.invariant == LedgerInvariant::SettlementPriced)
            .unwrap_or_else(|| panic!("{:?}", report.violations));
        assert_eq!(priced.execution_id, Some(r.id));
        assert!(priced.settlement_id.is_some());
        assert_eq!(priced.expected, Some(money("0.00002")));
        assert_eq!(priced.found, Some(money("0.01002")));
        // The spend rows no longer add up to their settlements either.
        assert!(report
            .violations
            .iter()
            .any(|v| v.invariant == LedgerInvariant::SpendSettled));
    }

    #[tokio::test]
    async fn sc_91_st_31_a_deleted_root_receipt_is_named() {
        let s = fresh().await;
        let r = priced(&s, "c1", true).await;
        assert!(audit(&s).await.ok);
        sqlx::query("DELETE FROM root_receipts WHERE execution_id = $1")
            .bind(r.id.0)
            .execute(s.pool())
            .await
            .unwrap();
        let report = audit(&s).await;
        let named: Vec<_> = report
            .violations
            .iter()
            .map(|v| (v.invariant, v.execution_id, v.root_key.clone()))
            .collect();
        assert_eq!(
            named,
            [
                (
                    LedgerInvariant::RootReceipt,
                    Some(r.id),
                    Some(root_key("r1"))
                ),
                (LedgerInvariant::RootCharged, None, Some(root_key("r1"))),
            ]
        );
        let charged = &report.violations[1];
        assert_eq!(
            (charged.expected, charged.found),
            (Some(money("0")), Some(money("0.00002")))
        );
        // Every scope at once says the same.
        let all = s.audit_ledger(None, 100).await.unwrap();
        assert_eq!(all.violations_total, 2);
        assert_eq!(all.checked.scopes, 1);
    }

    /// A call settled with its own exact evidence (acknowledged by the settlement, H-28).
    async fn with_evidence(s: &PgStores, key_: &str) -> ExecutionRecord {
        let req = claim_req("a", key_, text_config(), "0.5");
        let ClaimOutcome::Claimed(r) = s.claim(req).await.unwrap() else {
            panic!("expected a claim");
        };
        let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
        let mut settle = settle_req(&d, "0.00002", "x");
        settle.evidence = Some(tollgate_store::NewEvidence {
            scope: d.scope.clone(),
            execution_id: d.id,
            operation_key: d.operation_key.clone(),
            provider_ref: Some("req-1".into()),
            usage: settle.usage,
            exact: true,
            source: tollgate_store::EvidenceSource::Stream,
            now: t0(),
        });
        s.settle(settle).await.unwrap();
        d
    }

    /// The damage that breaks `invariant` alone (or first), as raw SQL over one execution's
    /// rows (`$1`: its id). The match is exhaustive: a new invariant does not compile until it
    /// has a damage here.
    fn damage(invariant: LedgerInvariant) -> (bool, &'static str) {
        use LedgerInvariant as I;
        // (under a root?, statement)
        match invariant {
            I::SpendSettled => (false, "UPDATE spend_sessions SET settled = settled + 0.01"),
            I::SpendHeld => (false, "UPDATE spend_days SET held = held + 0.01"),
            I::FinalHoldsNothing => (false, "UPDATE executions SET hold = 0.01 WHERE id = $1"),
            I::SettledExactlyOnce => (
                false,
                "UPDATE executions SET state = 'reconciliation_required', outcome = NULL \
                 WHERE id = $1",
            ),
            I::SettlementMatchesExecution => (
                false,
                "UPDATE cost_settlements SET operation_key = 'another' WHERE execution_id = $1",
            ),
            I::SettlementPriced => (
                false,
                "UPDATE cost_settlements SET amount = amount + 0.01 WHERE execution_id = $1",
            ),
            I::EvidenceAcknowledged => (
                false,
                "UPDATE usage_inbox SET output_tokens = output_tokens + 1 WHERE execution_id = $1",
            ),
            I::RootCharged => (true, "UPDATE roots SET charged = charged + 0.01"),
            I::RootHeld => (true, "UPDATE roots SET held = held + 0.01"),
            I::RootReceipt => (
                true,
                "UPDATE root_receipts SET amount = amount + 0.01 WHERE execution_id = $1",
            ),
        }
    }

    /// Every invariant of the ledger audit fires on rows the Postgres audit reads: for each, a
    /// clean database, one settled call (with its own evidence, or under a root), a damage that
    /// breaks that invariant, and the audit naming it on that call's rows.
    #[tokio::test]
    async fn sc_91_every_ledger_invariant_fires_on_postgres_rows() {
        let cases = LedgerInvariant::ALL.map(|invariant| async move {
            let s = fresh().await;
            let (root, statement) = damage(invariant);
            let r = if root {
                priced(&s, "c1", true).await
            } else {
                with_evidence(&s, "k1").await
            };
            let clean = audit(&s).await;
            assert!(clean.ok, "{invariant}: {:?}", clean.violations);
            sqlx::query(statement)
                .bind(r.id.0)
                .execute(s.pool())
                .await
                .unwrap();
            let report = audit(&s).await;
            let named = report.violations.iter().find(|v| v.invariant == invariant);
            assert!(
                named.is_some(),
                "{invariant} did not fire after `{statement}`: {:?}",
                report.violations
            );
            invariant
        });
        let fired = futures::future::join_all(cases).await;
        assert_eq!(fired, LedgerInvariant::ALL);
    }
}

/// A transaction that stalls while holding a scope's audit head (a client that went away inside
/// its transaction) cannot stop the scope: writes that need the lock fail after `lock_timeout` as
/// a store failure that changed nothing, and the server ends the idle transaction after
/// `idle_in_transaction_session_timeout`, after which the scope writes again.
#[tokio::test]
async fn sc_17_a_stalled_transaction_cannot_stop_a_scope() {
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    database.stores(1).await.unwrap().migrate().await.unwrap();
    let timeouts = SessionTimeouts {
        statement_timeout_ms: 10_000,
        lock_timeout_ms: 300,
        idle_in_transaction_timeout_ms: 1_500,
    };
    let s = PgStores::connect_with(database.url(), 4, timeouts)
        .await
        .unwrap();
    let first = s
        .claim(claim_req("acme", "k1", text_config(), "0.001"))
        .await
        .unwrap();
    assert!(matches!(first, ClaimOutcome::Claimed(_)));

    let mut stalled = s.pool().begin().await.unwrap();
    sqlx::query("SELECT last_seq FROM audit_heads WHERE scope = 'acme' FOR UPDATE")
        .fetch_one(&mut *stalled)
        .await
        .unwrap();

    let started = std::time::Instant::now();
    let blocked = s
        .claim(claim_req("acme", "k2", text_config(), "0.001"))
        .await;
    assert!(
        matches!(blocked, Err(StoreError::Unavailable(_))),
        "{blocked:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(s
        .execution(&scope("acme"), &key("k2"))
        .await
        .unwrap()
        .is_none());

    // The stalled session idles inside its transaction; the server ends it.
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let again = s
        .claim(claim_req("acme", "k2", text_config(), "0.001"))
        .await
        .unwrap();
    assert!(matches!(again, ClaimOutcome::Claimed(_)));
    drop(stalled);
}

#[test]
fn session_timeouts_have_bounded_defaults() {
    let d = SessionTimeouts::default();
    assert!(d.statement_timeout_ms > 0 && d.lock_timeout_ms > 0);
    assert!(d.idle_in_transaction_timeout_ms > 0);
}

/// SC-105 on existing data: the spend-currency migration gives each spend row the currency of
/// the settlements and executions that fed it; a row fed in USD and EUR becomes one row per
/// currency holding that currency's settlements and open holds; a row nothing names gets `USD`.
#[tokio::test]
async fn sc_105_spend_currency_migration_splits_rows_fed_in_two_currencies() {
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let s = database.stores(2).await.unwrap();
    let before = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            tollgate_postgres::MIGRATOR
                .migrations
                .iter()
                .filter(|m| m.version < 20261201002001)
                .cloned()
                .collect(),
        ),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    };
    before.run(s.pool()).await.unwrap();
    // team-a: USD 0.3 settled, EUR 0.2 settled and 0.5 held, all added up in one row per window;
    // team-b: one USD hold; team-c: a session row nothing names.
    sqlx::raw_sql(include_str!("spend_currency_seed.sql"))
        .execute(s.pool())
        .await
        .unwrap();
    s.migrate().await.unwrap();
    let rows = |table: &'static str| {
        let s = &s;
        async move {
            let sql = format!(
                "SELECT consumer, currency, settled::text, held::text FROM {table} \
                 ORDER BY consumer, currency"
            );
            let rows: Vec<(String, String, String, String)> =
                sqlx::query_as(&sql).fetch_all(s.pool()).await.unwrap();
            rows.into_iter()
                .map(|(c, cur, settled, held)| {
                    let n = |t: String| tollgate_testkit::conformance::money(&t).to_string();
                    (c, cur, n(settled), n(held))
                })
                .collect::<Vec<_>>()
        }
    };
    let row = |c: &str, cur: &str, settled: &str, held: &str| {
        (
            c.to_string(),
            cur.to_string(),
            settled.to_string(),
            held.to_string(),
        )
    };
    assert_eq!(
        rows("spend_sessions").await,
        [
            row("team-a", "EUR", "0.2", "0.5"),
            row("team-a", "USD", "0.3", "0"),
            row("team-b", "USD", "0", "0.1"),
            row("team-c", "USD", "0", "0"),
        ]
    );
    assert_eq!(
        rows("spend_days").await,
        [
            row("team-a", "EUR", "0.2", "0.5"),
            row("team-a", "USD", "0.3", "0"),
            row("team-b", "USD", "0", "0.1"),
        ]
    );
}

/// The feed's horizon, deterministically: a transaction that took its id before settlement X
/// committed holds X out of the feed; when it then inserts settlement Y (a higher `seq`) and
/// commits, the feed lists Y before X. A feed by `seq` would have handed out X's position and
/// then missed Y.
#[tokio::test]
async fn sc_141_a_settlement_waits_for_older_transactions_and_sorts_after_them() {
    use tollgate_store::{FeedPosition, SettlementStore};
    let s = fresh().await;
    let dispatch = |key: &'static str| {
        let s = Arc::clone(&s);
        async move {
            let mut req = claim_req("a", key, text_config(), "0.5");
            req.binding.session_id = tollgate_core::ids::SessionId::parse(key).unwrap();
            let ClaimOutcome::Claimed(r) = s.claim(req).await.unwrap() else {
                panic!("expected a claim");
            };
            s.mark_dispatched(r.fence(), t0()).await.unwrap()
        }
    };
    let x = dispatch("x").await;
    let y = dispatch("y").await;
    let mut older = s.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *older)
        .await
        .unwrap();
    s.settle(settle_req(&x, "0.1", "x")).await.unwrap();
    let feed = s
        .settlements_after(Some(&scope("a")), FeedPosition::START, 10)
        .await
        .unwrap();
    assert!(
        feed.is_empty(),
        "X waits for the older transaction: {feed:?}"
    );
    sqlx::query(
        "INSERT INTO cost_settlements (settlement_id, execution_id, scope, operation_key, kind, \
         consumer, session_id, accounting_day, provider, model, price_version, policy_version, \
         currency, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
         reasoning_tokens, amount, source, settled_at) \
         SELECT $1, $2, scope, 'y', kind, consumer, 'y', accounting_day, provider, model, \
         price_version, policy_version, currency, input_tokens, output_tokens, \
         cache_read_tokens, cache_write_tokens, reasoning_tokens, amount, source, settled_at \
         FROM cost_settlements WHERE execution_id = $3",
    )
    .bind(uuid::Uuid::new_v4())
    .bind(y.id.0)
    .bind(x.id.0)
    .execute(&mut *older)
    .await
    .unwrap();
    older.commit().await.unwrap();
    // Other databases' transactions on the cluster hold the horizon too: wait for them, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut feed = Vec::new();
    while feed.len() < 2 && std::time::Instant::now() < deadline {
        feed = s
            .settlements_after(Some(&scope("a")), FeedPosition::START, 10)
            .await
            .unwrap();
    }
    let ids: Vec<_> = feed.iter().map(|e| e.settlement.execution_id).collect();
    assert_eq!(ids, [y.id, x.id], "the older transaction's row first");
    assert!(
        feed[0].position.seq > feed[1].position.seq,
        "against seq order"
    );
}

/// A replay is answered from a plain read (H-9): with every write of `executions` blocked by
/// another transaction, claiming an existing key still returns the row at once. The insert path
/// (what a replay ran before) would wait for that lock.
#[tokio::test]
async fn h_9_a_replay_claim_writes_nothing() {
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let s = database.stores(4).await.unwrap();
    s.migrate().await.unwrap();
    let s = s.with_caller_lease_clock();
    let ClaimOutcome::Claimed(first) = s
        .claim(claim_req("a", "k1", text_config(), "0.5"))
        .await
        .unwrap()
    else {
        panic!("expected a claim");
    };
    let blocked = database.block_execution_writes().await.unwrap();
    let replay = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        s.claim(claim_req("a", "k1", text_config(), "0.5")),
    )
    .await
    .expect("a replay must not wait for a write lock")
    .unwrap();
    drop(blocked);
    let ClaimOutcome::Existing(existing) = replay else {
        panic!("expected the existing row");
    };
    assert_eq!(existing.execution, first);
}
