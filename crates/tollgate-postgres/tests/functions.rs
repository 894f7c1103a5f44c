//! The claim and the settlement of a call outside a root as one function call each (H-17, H-18):
//! the functions are what runs, they store exactly what the general transactions store, and a
//! settler whose copy of the row is out of date is settled by the general transaction.
#![cfg(test)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sqlx::{Connection, PgConnection};
use std::time::{Duration, Instant};
use tollgate_core::caps::CapWarning;
use tollgate_core::state::{ExecutionState, Outcome};
use tollgate_postgres::PgStores;
use tollgate_store::audit::verify_chain;
use tollgate_store::{
    AuditLog, AuditPosition, ClaimOutcome, ExecutionRecord, ExecutionStore, ResultStore,
    SettleOutcome,
};
use tollgate_testkit::conformance::{claim_req, money, scope, settle_req, text_config};
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// A migrated database of its own, counting calls of its PL/pgSQL functions.
async fn fresh() -> (TestDatabase, PgStores) {
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let mut admin = PgConnection::connect(&test_admin_url()).await.unwrap();
    sqlx::query(&format!(
        "ALTER DATABASE \"{}\" SET track_functions = 'pl'",
        database.name()
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    let stores = database.stores(4).await.unwrap();
    stores.migrate().await.unwrap();
    (database, stores.with_caller_lease_clock())
}

/// Calls of `name` in the database's statistics once they reach `at_least` (backends report them
/// when idle, about once a second), or what they were at the deadline.
async fn calls(database: &TestDatabase, name: &str, at_least: i64) -> i64 {
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&mut conn)
            .await
            .unwrap();
        let calls: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_user_functions \
             WHERE funcname = $1",
        )
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        if calls >= at_least || Instant::now() > deadline {
            return calls;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn claimed(s: &PgStores, key: &str, hold: &str) -> ExecutionRecord {
    let mut request = claim_req("a", key, capped(), hold);
    request.dispatch = true;
    match s.claim(request).await.unwrap() {
        ClaimOutcome::Claimed(r) => r,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// Warn and block caps on both windows.
fn capped() -> tollgate_core::config::CallConfig {
    let mut c = text_config();
    c.caps.session_warn = Some(money("0.2"));
    c.caps.session_block = Some(money("1.0"));
    c.caps.daily_warn = Some(money("0.5"));
    c.caps.daily_block = Some(money("1.5"));
    c
}

#[tokio::test]
async fn h_17_h_18_a_plain_call_is_claimed_and_settled_by_one_function_call_each() {
    let (database, s) = fresh().await;
    let r = claimed(&s, "k1", "0.1").await;
    assert_eq!(r.state, ExecutionState::Dispatched);
    let done = s.settle(settle_req(&r, "0.05", "x")).await.unwrap();
    assert_eq!(done.record.state, ExecutionState::Completed);
    assert_eq!(calls(&database, "tollgate_claim", 1).await, 1);
    assert_eq!(calls(&database, "tollgate_settle", 1).await, 1);
    let rows = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap();
    let kinds: Vec<&str> = rows.iter().map(|row| row.event.kind.as_str()).collect();
    assert_eq!(kinds, ["claimed", "dispatched", "settled"]);
    verify_chain(&rows).unwrap();
}

/// What a settlement returned and stored, without its fresh ids.
fn comparable(
    outcome: &SettleOutcome,
) -> (
    Option<Outcome>,
    Outcome,
    bool,
    Vec<CapWarning>,
    String,
    String,
) {
    (
        outcome.record.outcome,
        outcome.result.outcome,
        outcome.result.output.is_some(),
        outcome.result.warnings.clone(),
        format!("{:?}", outcome.session),
        format!("{:?}", outcome.daily),
    )
}

#[tokio::test]
async fn h_18_the_function_and_the_general_transaction_settle_alike() {
    // The same calls through the function (the settler's row in hand) and through the general
    // transaction (no row in hand): below the caps, a warn cap crossed, a block cap crossed
    // (output dropped), and an `unavailable` outcome past the block cap (kept as is).
    let steps = [
        ("k1", "0.1", "0.15", Outcome::Success),
        ("k2", "0.1", "0.1", Outcome::Success),
        ("k3", "0.1", "0.9", Outcome::Success),
    ];
    let (_fdb, by_function) = fresh().await;
    let (_gdb, by_transaction) = fresh().await;
    let mut seen_ids = Vec::new();
    for (key, hold, amount, outcome) in steps {
        let f = claimed(&by_function, key, hold).await;
        let g = claimed(&by_transaction, key, hold).await;
        let mut with_row = settle_req(&f, amount, "x");
        with_row.outcome = outcome;
        let mut without_row = settle_req(&g, amount, "x");
        without_row.outcome = outcome;
        without_row.seen = None;
        let a = by_function.settle(with_row).await.unwrap();
        let b = by_transaction.settle(without_row).await.unwrap();
        assert_eq!(comparable(&a), comparable(&b), "{key}");
        assert_eq!(
            by_function.result(f.id).await.unwrap().unwrap(),
            a.result,
            "{key}: the stored result is the one returned"
        );
        assert_eq!(
            by_transaction.result(g.id).await.unwrap().unwrap().warnings,
            a.result.warnings,
            "{key}"
        );
        seen_ids.push((f.id, a));
    }
    let (_, blocked) = &seen_ids[2];
    assert_eq!(blocked.result.outcome, Outcome::Blocked);
    assert!(blocked.result.output.is_none());
    assert_eq!(blocked.result.warnings.len(), 3);
    for s in [&by_function, &by_transaction] {
        let rows = s
            .audit_rows(&scope("a"), AuditPosition::START, 100)
            .await
            .unwrap();
        verify_chain(&rows).unwrap();
        let mut settled: Vec<&str> = rows
            .iter()
            .filter(|row| row.event.kind == "settled")
            .map(|row| row.event.detail["outcome"].as_str().unwrap())
            .collect();
        settled.sort_unstable();
        assert_eq!(settled, ["blocked", "success", "success"]);
    }
}

#[tokio::test]
async fn h_18_unavailable_past_a_block_cap_stays_unavailable_in_both() {
    let (_fdb, by_function) = fresh().await;
    let (_gdb, by_transaction) = fresh().await;
    let f = claimed(&by_function, "k1", "0.1").await;
    let g = claimed(&by_transaction, "k1", "0.1").await;
    let mut with_row = settle_req(&f, "1.2", "x");
    with_row.outcome = Outcome::Unavailable;
    with_row.output = None;
    let mut without_row = settle_req(&g, "1.2", "x");
    without_row.outcome = Outcome::Unavailable;
    without_row.output = None;
    without_row.seen = None;
    let a = by_function.settle(with_row).await.unwrap();
    let b = by_transaction.settle(without_row).await.unwrap();
    assert_eq!(a.result.outcome, Outcome::Unavailable);
    assert_eq!(comparable(&a), comparable(&b));
}

#[tokio::test]
async fn h_18_a_settler_with_an_outdated_row_is_settled_by_the_general_transaction() {
    let (_db, s) = fresh().await;
    let r = claimed(&s, "k1", "0.1").await;
    // The settler's copy says another hold: the function leaves it to the general transaction,
    // which settles against the stored row.
    let mut outdated = r.clone();
    outdated.hold = money("0.3");
    let mut request = settle_req(&r, "0.05", "x");
    request.seen = Some(Box::new(outdated));
    let done = s.settle(request).await.unwrap();
    assert_eq!(done.record.state, ExecutionState::Completed);
    assert_eq!(done.session.held, money("0"));
    assert_eq!(done.session.settled, money("0.05"));
    // A stale fence is refused as it is without a row in hand, and changes nothing.
    let again = s.settle(settle_req(&r, "0.05", "x")).await.unwrap_err();
    assert!(
        matches!(again, tollgate_store::StoreError::StaleFence(id) if id == r.id),
        "{again:?}"
    );
    let rows = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap();
    verify_chain(&rows).unwrap();
    assert_eq!(rows.len(), 3);
}

#[tokio::test]
async fn h_19_rows_answered_without_their_binding_equal_the_stored_rows() {
    // The functions answer the row without its binding; the store completes it with the binding
    // the caller sent, which is the stored one.
    let (_db, s) = fresh().await;
    let r = claimed(&s, "k1", "0.1").await;
    let stored = s
        .execution(&scope("a"), &tollgate_testkit::conformance::key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r, stored);
    let done = s.settle(settle_req(&r, "0.05", "x")).await.unwrap();
    let stored = s
        .execution(&scope("a"), &tollgate_testkit::conformance::key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.record, stored);
    assert_eq!(done.record.binding, r.binding);
}

#[tokio::test]
async fn h_20_concurrent_settlements_near_a_cap_each_see_their_own_total() {
    // Sixteen calls of one consumer and session, settled at once, with a warn cap crossed
    // half-way: whether a settlement wrote its result before its spend rows (no cap near on the
    // totals it read) or after them, each warning names the total after its own charge, and the
    // warned totals are exactly the ones at or past the cap.
    let (_db, s) = fresh().await;
    let mut config = text_config();
    config.caps.session_warn = Some(money("0.85"));
    let mut records = Vec::new();
    for i in 0..16 {
        let mut request = claim_req("a", &format!("k{i}"), config.clone(), "0.1");
        request.dispatch = true;
        match s.claim(request).await.unwrap() {
            ClaimOutcome::Claimed(r) => records.push(r),
            other => panic!("expected a claim, got {other:?}"),
        }
    }
    let s = std::sync::Arc::new(s);
    let settles = records.iter().map(|r| {
        let s = std::sync::Arc::clone(&s);
        let request = settle_req(r, "0.1", "x");
        tokio::spawn(async move { s.settle(request).await.unwrap() })
    });
    let mut warned: Vec<String> = Vec::new();
    for settled in futures::future::join_all(settles).await {
        let settled = settled.unwrap();
        assert_eq!(settled.result.outcome, Outcome::Success);
        for w in &settled.result.warnings {
            assert_eq!(w.spent, settled.session.settled);
            warned.push(w.spent.to_string());
        }
    }
    warned.sort();
    let mut expected: Vec<String> = (9..=16)
        .map(|k| money(&format!("{}.{}", k / 10, k % 10)).to_string())
        .collect();
    expected.sort();
    assert_eq!(warned, expected);
    let rows = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap();
    verify_chain(&rows).unwrap();
}

#[tokio::test]
async fn h_23_a_connection_lost_while_idle_is_replaced_before_use() {
    // One pooled connection; its backend is terminated while it sits idle. Past
    // `PING_AFTER_IDLE_MS` the pool pings it before handing it out, finds it gone and opens
    // another, so the next store operation succeeds.
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let s = database.stores(1).await.unwrap();
    s.migrate().await.unwrap();
    let s = s.with_caller_lease_clock();
    let r = claimed(&s, "k1", "0.1").await;
    let mut admin = PgConnection::connect(&test_admin_url()).await.unwrap();
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()) t",
    )
    .bind(database.name())
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(terminated, 1, "the pool's one connection");
    tokio::time::sleep(Duration::from_millis(
        tollgate_postgres::PING_AFTER_IDLE_MS + 200,
    ))
    .await;
    let done = s.settle(settle_req(&r, "0.05", "x")).await.unwrap();
    assert_eq!(done.record.state, ExecutionState::Completed);
}

/// The tables a call writes keep no rule on one column as a table constraint: each such rule is
/// the column's domain, and it still refuses a value that breaks it, with the same SQLSTATE.
#[tokio::test]
async fn h_25_column_rules_are_domains_that_still_refuse_bad_values() {
    let (database, s) = fresh().await;
    let tables = [
        "executions",
        "execution_results",
        "usage_inbox",
        "cost_settlements",
        "spend_sessions",
        "spend_days",
        "audit_log",
        "audit_heads",
        "roots",
        "root_receipts",
        "limit_windows",
    ];
    let single: Vec<String> = sqlx::query_scalar(
        "SELECT conrelid::regclass::text || '.' || conname FROM pg_constraint \
         WHERE contype = 'c' AND cardinality(conkey) = 1 \
           AND conrelid::regclass::text = ANY($1) ORDER BY 1",
    )
    .bind(&tables[..])
    .fetch_all(s.pool())
    .await
    .unwrap();
    assert_eq!(single, Vec::<String>::new());
    let across: Vec<String> = sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint \
         WHERE contype = 'c' AND conrelid::regclass::text = ANY($1) ORDER BY 1",
    )
    .bind(&tables[..])
    .fetch_all(s.pool())
    .await
    .unwrap();
    assert_eq!(
        across,
        [
            "execution_results_erased_has_no_content",
            "executions_cause_iff_not_dispatched",
            "executions_limits_whole",
            "executions_outcome_iff_completed",
            "executions_reconciliation_reason_state",
        ]
    );

    // Every column that had a rule of its own now has a domain, whose base type is the
    // column's type as before.
    let domains: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT table_name::text || '.' || column_name::text, domain_name::text, \
                data_type::text \
         FROM information_schema.columns \
         WHERE table_schema = 'public' AND domain_name IS NOT NULL ORDER BY 1",
    )
    .fetch_all(s.pool())
    .await
    .unwrap();
    assert_eq!(domains.len(), 45, "{domains:?}");
    for (column, domain, base) in [
        ("executions.state", "tollgate_execution_state", "text"),
        ("executions.hold", "tollgate_money", "numeric"),
        ("executions.fence", "tollgate_ordinal", "bigint"),
        ("cost_settlements.amount", "tollgate_money", "numeric"),
        ("cost_settlements.currency", "tollgate_currency", "text"),
        ("usage_inbox.input_tokens", "tollgate_count", "bigint"),
        ("spend_days.held", "tollgate_money", "numeric"),
        ("audit_log.chain", "tollgate_chain", "smallint"),
        ("roots.state", "tollgate_root_state", "text"),
        ("limit_windows.requests", "tollgate_count", "bigint"),
        ("limit_windows.in_flight", "tollgate_count", "bigint"),
        ("executions.limit_input_tokens", "tollgate_count", "bigint"),
    ] {
        assert!(
            domains.contains(&(column.into(), domain.into(), base.into())),
            "{column}: {domains:?}"
        );
    }

    // Each domain refuses what the constraint refused (23514, check_violation), and takes the
    // values at its edges.
    for (bad, good) in [
        ("'chat'::tollgate_kind", "'step'::tollgate_kind"),
        (
            "'running'::tollgate_execution_state",
            "'reconciliation_required'::tollgate_execution_state",
        ),
        (
            "'lost'::tollgate_not_dispatched_cause",
            "'expired'::tollgate_not_dispatched_cause",
        ),
        ("'ok'::tollgate_outcome", "'unavailable'::tollgate_outcome"),
        (
            "'unknown'::tollgate_reconciliation_reason",
            "'ambiguous_status'::tollgate_reconciliation_reason",
        ),
        (
            "'open'::tollgate_root_state",
            "'reconciled'::tollgate_root_state",
        ),
        (
            "'recovery'::tollgate_evidence_source",
            "'late'::tollgate_evidence_source",
        ),
        (
            "'late'::tollgate_settlement_source",
            "'recovery'::tollgate_settlement_source",
        ),
        ("'usd'::tollgate_currency", "'EUR'::tollgate_currency"),
        ("(-0.000000000001)::tollgate_money", "0::tollgate_money"),
        ("(-1)::tollgate_count", "0::tollgate_count"),
        ("0::tollgate_ordinal", "1::tollgate_ordinal"),
        ("64::tollgate_chain", "63::tollgate_chain"),
    ] {
        let e = sqlx::query(&format!("SELECT {bad}"))
            .execute(s.pool())
            .await
            .unwrap_err();
        assert_check_violation(&e, bad);
        sqlx::query(&format!("SELECT {good}"))
            .execute(s.pool())
            .await
            .unwrap();
    }

    // A write through a domain column is checked: a negative hold on a claimed row is refused
    // and changes nothing.
    let r = claimed(&s, "k1", "0.5").await;
    // A call's limit columns are set together or not at all: half of them is refused too.
    for update in [
        "UPDATE executions SET hold = -1 WHERE id = $1",
        "UPDATE executions SET limit_subjects = '{consumer:team-a}' WHERE id = $1",
    ] {
        let e = sqlx::query(update)
            .bind(r.id.0)
            .execute(s.pool())
            .await
            .unwrap_err();
        assert_check_violation(&e, update);
    }
    let hold: String = sqlx::query_scalar("SELECT hold::text FROM executions WHERE id = $1")
        .bind(r.id.0)
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(hold, "0.500000000000");
    drop(database);
}

/// A claim that finds its key taken reads the stored binding only when its digest differs from
/// the claimer's: a replay's record carries the claimer's binding, a conflict's the stored one.
#[tokio::test]
async fn h_26_a_replay_read_leaves_the_binding_in_the_row() {
    let (database, s) = fresh().await;
    let first = claimed(&s, "k1", "0.5").await;
    // The stored binding column now says another intent, under the same digest: only a read
    // that transfers the column can see it.
    sqlx::query(
        "UPDATE executions SET binding = jsonb_set(binding, '{intent}', '\"elsewhere\"') \
         WHERE id = $1",
    )
    .bind(first.id.0)
    .execute(s.pool())
    .await
    .unwrap();

    let mut replay = claim_req("a", "k1", capped(), "0.5");
    replay.binding_digest = Some(replay.binding.digest());
    let ClaimOutcome::Existing(found) = s.claim(replay.clone()).await.unwrap() else {
        panic!("expected the existing row");
    };
    assert_eq!(found.execution.id, first.id);
    assert_eq!(found.execution.binding, replay.binding);
    assert_eq!(found.execution.binding_digest, first.binding_digest);

    // Without a binding in hand (the read API), the stored column is what comes back.
    let read = s
        .execution_view(&scope("a"), &replay.operation_key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.execution.binding.intent.as_str(), "elsewhere");

    // A claimer with another binding gets the stored one, to name what differs.
    let mut conflict = claim_req("a", "k1", capped(), "0.5");
    conflict.binding.session_id = tollgate_core::ids::SessionId::parse("s-9").unwrap();
    let ClaimOutcome::Existing(found) = s.claim(conflict.clone()).await.unwrap() else {
        panic!("expected the existing row");
    };
    assert_eq!(found.execution.binding.intent.as_str(), "elsewhere");
    assert_eq!(
        found.execution.binding.differing_fields(&conflict.binding),
        ["session_id", "intent"]
    );
    drop(database);
}

/// A claim whose future is dropped while its statement waits on a lock leaves its lane
/// connection usable: the statement still commits on the server, and the next statement on that
/// connection reads the answer it left unread before sending its own.
#[tokio::test]
async fn h_27_a_statement_dropped_mid_answer_leaves_its_lane_connection_usable() {
    let (database, s) = fresh().await;
    claimed(&s, "k0", "0.1").await;
    let mut holder = PgConnection::connect(database.url()).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT * FROM audit_heads WHERE scope = 'a' FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let mut stuck = claim_req("a", "k1", capped(), "0.1");
    stuck.dispatch = true;
    let dropped = tokio::time::timeout(Duration::from_millis(300), s.claim(stuck)).await;
    assert!(dropped.is_err(), "the claim waits for the audit head");
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();

    // The next claims take the connection back (the lane hands out the one it got last).
    for key in ["k2", "k3"] {
        let record = claimed(&s, key, "0.1").await;
        assert_eq!(record.operation_key.as_str(), key);
        let view = s
            .execution_view(&scope("a"), &record.operation_key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.execution.id, record.id);
    }
    // The dropped claim committed on the server: its key is taken.
    let mut again = claim_req("a", "k1", capped(), "0.1");
    again.dispatch = true;
    assert!(matches!(
        s.claim(again).await.unwrap(),
        ClaimOutcome::Existing(_)
    ));
    drop(database);
}

/// H-29: the indexes a call writes are the ones its reads need, and a charge's finance-feed
/// position `(txid, seq)` is unique: a second row at a position already taken is refused.
#[tokio::test]
async fn h_29_the_call_tables_keep_only_the_indexes_they_need() {
    let (_database, s) = fresh().await;
    let r = claimed(&s, "k1", "0.1").await;
    s.settle(settle_req(&r, "0.05", "x")).await.unwrap();
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT tablename::text, indexname::text FROM pg_indexes \
         WHERE schemaname = 'public' AND tablename IN ('executions', 'execution_results', \
           'usage_inbox', 'cost_settlements', 'audit_log', 'audit_heads', 'spend_sessions', \
           'spend_days', 'limit_windows') \
         ORDER BY tablename, indexname",
    )
    .fetch_all(s.pool())
    .await
    .unwrap();
    let names: Vec<String> = indexes.iter().map(|(t, i)| format!("{t}.{i}")).collect();
    assert_eq!(
        names,
        [
            "audit_heads.audit_heads_pkey",
            "audit_log.audit_log_pkey",
            "cost_settlements.cost_settlements_day_idx",
            "cost_settlements.cost_settlements_execution_id_key",
            "cost_settlements.cost_settlements_feed_key",
            "cost_settlements.cost_settlements_feed_scope_idx",
            "cost_settlements.cost_settlements_pkey",
            "execution_results.execution_results_pkey",
            "execution_results.execution_results_retention_idx",
            "executions.executions_open_scope_idx",
            "executions.executions_operation_key_scope_key",
            "executions.executions_pkey",
            "executions.executions_scope_root_key_idx",
            "executions.executions_state_scope_created_idx",
            "limit_windows.limit_windows_pkey",
            "spend_days.spend_days_pkey",
            "spend_sessions.spend_sessions_pkey",
            "usage_inbox.usage_inbox_acknowledged_scope_idx",
            "usage_inbox.usage_inbox_execution_idx",
            "usage_inbox.usage_inbox_open_idx",
            "usage_inbox.usage_inbox_pkey",
        ]
    );
    let copy = sqlx::query(
        "INSERT INTO cost_settlements (settlement_id, execution_id, seq, txid, scope, \
           operation_key, kind, consumer, session_id, accounting_day, provider, model, \
           price_version, policy_version, currency, input_tokens, output_tokens, \
           cache_read_tokens, cache_write_tokens, reasoning_tokens, amount, source, settled_at) \
         SELECT gen_random_uuid(), gen_random_uuid(), seq, txid, scope, operation_key, kind, \
           consumer, session_id, accounting_day, provider, model, price_version, \
           policy_version, currency, input_tokens, output_tokens, cache_read_tokens, \
           cache_write_tokens, reasoning_tokens, amount, source, settled_at \
         FROM cost_settlements",
    )
    .execute(s.pool())
    .await
    .unwrap_err();
    let code = copy.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("23505"), "{copy}");
    assert_eq!(
        copy.as_database_error().and_then(|e| e.constraint()),
        Some("cost_settlements_feed_key"),
        "{copy}"
    );
}

/// H-30: a claim of a key these stores have not seen with a row goes to the claim function
/// first (no read before it); a key they have seen (claimed or found) is read first. Another
/// instance that has not seen the key finds the same row through the claim function's answer,
/// takes no hold for it, and still sees a different binding; from then on it reads first too.
#[tokio::test]
async fn h_30_a_claim_reads_first_only_for_keys_it_has_seen() {
    let (database, s) = fresh().await;
    let other = database.stores(4).await.unwrap().with_caller_lease_clock();
    let first = claimed(&s, "k1", "0.5").await;
    assert_eq!(s.claims_read_first(), 0);
    assert_eq!(calls(&database, "tollgate_claim", 1).await, 1);

    // A replay here: read first.
    let ClaimOutcome::Existing(found) = s
        .claim(claim_req("a", "k1", capped(), "0.5"))
        .await
        .unwrap()
    else {
        panic!("expected the existing row");
    };
    assert_eq!(found.execution.id, first.id);
    assert_eq!(s.claims_read_first(), 1);

    // The other instance has not seen it: the claim function, which writes nothing, then the
    // read; the same row, and no second hold.
    let held = |stores: PgStores| async move {
        sqlx::query_scalar::<_, rust_decimal::Decimal>(
            "SELECT COALESCE(sum(held), 0) FROM spend_days",
        )
        .fetch_one(stores.pool())
        .await
        .unwrap()
    };
    let before = held(s.clone()).await;
    let ClaimOutcome::Existing(there) = other
        .claim(claim_req("a", "k1", capped(), "0.5"))
        .await
        .unwrap()
    else {
        panic!("expected the existing row");
    };
    assert_eq!(there.execution.id, first.id);
    assert_eq!(other.claims_read_first(), 0);
    assert_eq!(calls(&database, "tollgate_claim", 2).await, 2);
    assert_eq!(held(s.clone()).await, before);

    // Seen now: read first.
    let mut conflict = claim_req("a", "k1", capped(), "0.5");
    conflict.binding.session_id = tollgate_core::ids::SessionId::parse("s-9").unwrap();
    let ClaimOutcome::Existing(found) = other.claim(conflict.clone()).await.unwrap() else {
        panic!("expected the existing row");
    };
    assert_eq!(other.claims_read_first(), 1);
    assert_eq!(
        found.execution.binding.differing_fields(&conflict.binding),
        ["session_id"]
    );

    // A third instance meets the conflicting binding through the claim function's answer.
    let third = database.stores(4).await.unwrap().with_caller_lease_clock();
    let ClaimOutcome::Existing(found) = third.claim(conflict.clone()).await.unwrap() else {
        panic!("expected the existing row");
    };
    assert_eq!(third.claims_read_first(), 0);
    assert_eq!(
        found.execution.binding.differing_fields(&conflict.binding),
        ["session_id"]
    );
    assert_eq!(held(s.clone()).await, before);
}

/// A head of chain `chain` is refused by the column's domain (a check violation).
async fn head_refused(s: &PgStores, chain: i16) {
    let refused = sqlx::query(
        "INSERT INTO audit_heads (scope, chain, last_seq, last_hash) \
         VALUES ('b', $1, 0, repeat('0', 64))",
    )
    .bind(chain)
    .execute(s.pool())
    .await
    .unwrap_err();
    assert_check_violation(&refused, &refused.to_string());
}

/// `e` is the database's check_violation (23514); `what` names the statement that failed.
fn assert_check_violation(e: &sqlx::Error, what: &str) {
    assert_eq!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("23514"),
        "{what}"
    );
}

/// H-31: a scope's audit rows are spread over 64 chains. A database migrated before H-31 keeps
/// 16 heads per scope; the migration gives each such scope its 48 new heads, empty, so the
/// scope's chains end at their heads and a call appends to a new chain; a chain past 63 is
/// refused by the column's domain.
#[tokio::test]
async fn h_31_a_scope_of_sixteen_chains_gains_the_new_heads() {
    use sqlx::migrate::Migrator;
    use tollgate_store::audit::ChainVerifier;
    use tollgate_store::{AuditChain, AUDIT_CHAINS};
    const H_31: i64 = 20_261_201_050_000;
    assert_eq!(AUDIT_CHAINS, 64);
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let s = database.stores(4).await.unwrap();
    let before = Migrator {
        migrations: tollgate_postgres::MIGRATOR
            .iter()
            .filter(|m| m.version < H_31)
            .cloned()
            .collect::<Vec<_>>()
            .into(),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    };
    before.run(s.pool()).await.unwrap();
    // A scope as the 16-chain code left it: every head of its 16, one chain moved on.
    sqlx::query(
        "INSERT INTO audit_heads (scope, chain, last_seq, last_hash) \
         SELECT 'a', c, 0, repeat('0', 64) FROM generate_series(0, 15) AS c",
    )
    .execute(s.pool())
    .await
    .unwrap();
    head_refused(&s, 16).await;
    s.migrate().await.unwrap();
    let chains: Vec<i16> =
        sqlx::query_scalar("SELECT chain FROM audit_heads WHERE scope = 'a' ORDER BY chain")
            .fetch_all(s.pool())
            .await
            .unwrap();
    assert_eq!(chains, (0..64).collect::<Vec<i16>>());
    // Calls until one lands on a chain the migration added; every chain still ends at its head.
    let mut n = 0;
    loop {
        n += 1;
        let r = claimed(&s, &format!("k{n}"), "0.1").await;
        s.settle(settle_req(&r, "0.05", "x")).await.unwrap();
        if AuditChain::of_execution(r.id).0 >= 16 {
            break;
        }
        assert!(n < 200, "no call landed on chains 16..63");
    }
    let mut verifier = ChainVerifier::default();
    let rows = s
        .audit_rows(&scope("a"), AuditPosition::START, 1000)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3 * n);
    rows.iter().for_each(|row| verifier.push(row).unwrap());
    verifier
        .finish(&s.audit_heads(&scope("a")).await.unwrap())
        .unwrap();
    head_refused(&s, 64).await;
    drop(database);
}

/// A claim request of `consumer` (session `s-1`) under `config`, to be dispatched.
fn claim_of(
    consumer: &str,
    key: &str,
    mut config: tollgate_core::config::CallConfig,
) -> tollgate_store::ClaimRequest {
    config.consumer = tollgate_core::ids::ConsumerId::parse(consumer).unwrap();
    let mut request = claim_req("a", key, config, "0.1");
    request.dispatch = true;
    request
}

#[tokio::test]
async fn h_32_calls_arriving_together_are_batched_and_decided_as_alone() {
    // Forty claims of one consumer at once under a daily block cap that admits exactly thirty
    // holds of 0.1, then the thirty settlements at once: the batch functions ran, each claim
    // and settlement was decided as it would be alone (thirty claimed, ten refused from the
    // totals, every charge on the totals, one unbroken audit chain per head).
    let (database, s) = fresh().await;
    let mut config = text_config();
    config.caps.daily_block = Some(money("3.0"));
    let s = std::sync::Arc::new(s);
    let claims = (0..40).map(|i| {
        let s = std::sync::Arc::clone(&s);
        let request = claim_of("team-a", &format!("k{i}"), config.clone());
        tokio::spawn(async move { s.claim(request).await.unwrap() })
    });
    let mut records = Vec::new();
    let mut refused = 0;
    for outcome in futures::future::join_all(claims).await {
        match outcome.unwrap() {
            ClaimOutcome::Claimed(r) => records.push(r),
            ClaimOutcome::Blocked(_) => refused += 1,
            other => panic!("expected a claim or a refusal, got {other:?}"),
        }
    }
    assert_eq!((records.len(), refused), (30, 10));
    let settles = records.iter().map(|r| {
        let s = std::sync::Arc::clone(&s);
        let request = settle_req(r, "0.05", "x");
        tokio::spawn(async move { s.settle(request).await.unwrap() })
    });
    let mut settled = Vec::new();
    for done in futures::future::join_all(settles).await {
        let done = done.unwrap();
        assert_eq!(done.record.state, ExecutionState::Completed);
        assert_eq!(done.result.outcome, Outcome::Success);
        settled.push(done.daily.settled.to_string());
    }
    // Every settlement answered the day's total after its own charge: 0.05 .. 1.50, once each.
    settled.sort_by_key(|t| money(t));
    let expected: Vec<String> = (1..=30)
        .map(|k| money(&format!("{}.{:02}", k * 5 / 100, k * 5 % 100)).to_string())
        .collect();
    assert_eq!(settled, expected);
    assert!(calls(&database, "tollgate_claim_batch", 1).await >= 1);
    assert!(calls(&database, "tollgate_settle_batch", 1).await >= 1);
    let rows = s
        .audit_rows(&scope("a"), AuditPosition::START, 1000)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3 * 30);
    let mut verifier = tollgate_store::audit::ChainVerifier::default();
    rows.iter().for_each(|row| verifier.push(row).unwrap());
    verifier
        .finish(&s.audit_heads(&scope("a")).await.unwrap())
        .unwrap();
}

#[tokio::test]
async fn h_32_a_batch_leaves_out_a_call_that_would_wait_for_a_lock() {
    // One queue: while a claim of team-a waits for team-a's day row, a second claim of team-a
    // and one of team-b (a consumer of the same queue) queue behind it and go as one batch once
    // team-a's row is free. team-b's day row is still locked: the batch decides team-a's claim
    // and commits it, and leaves team-b's out (it would have waited while the batch held
    // team-a's rows), which goes alone and waits as a single claim does.
    let (database, s) = fresh().await;
    let config = text_config();
    // A second consumer whose calls take team-a's queue.
    let shard = s.batch_shard("a", "team-a").unwrap();
    let team_b = (0..1000)
        .map(|i| format!("team-b{i}"))
        .find(|c| s.batch_shard("a", c) == Some(shard))
        .unwrap();
    let team_b: &'static str = Box::leak(team_b.into_boxed_str());
    for consumer in ["team-a", team_b] {
        let first = claim_of(consumer, &format!("{consumer}-0"), config.clone());
        assert!(matches!(
            s.claim(first).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
    }
    let lock = |consumer: &'static str| {
        let url = database.url().to_owned();
        async move {
            let mut conn = PgConnection::connect(&url).await.unwrap();
            sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
            sqlx::query("SELECT 1 FROM spend_days WHERE consumer = $1 FOR UPDATE")
                .bind(consumer)
                .execute(&mut conn)
                .await
                .unwrap();
            conn
        }
    };
    let mut locker_a = lock("team-a").await;
    let mut locker_b = lock(team_b).await;
    let s = std::sync::Arc::new(s);
    let claim = |consumer: &str, key: &str| {
        let s = std::sync::Arc::clone(&s);
        let request = claim_of(consumer, key, config.clone());
        tokio::spawn(async move { s.claim(request).await.unwrap() })
    };
    let waiting = claim("team-a", "team-a-1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a2 = claim("team-a", "team-a-2");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b1 = claim(team_b, "team-b-1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished() && !a2.is_finished() && !b1.is_finished());
    sqlx::query("ROLLBACK")
        .execute(&mut locker_a)
        .await
        .unwrap();
    assert!(matches!(waiting.await.unwrap(), ClaimOutcome::Claimed(_)));
    // team-a's second claim commits with its batch while team-b's row is still locked.
    let a2 = tokio::time::timeout(Duration::from_secs(5), a2)
        .await
        .expect("the batch waited for team-b's row")
        .unwrap();
    assert!(matches!(a2, ClaimOutcome::Claimed(_)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!b1.is_finished());
    sqlx::query("ROLLBACK")
        .execute(&mut locker_b)
        .await
        .unwrap();
    assert!(matches!(b1.await.unwrap(), ClaimOutcome::Claimed(_)));
    assert_eq!(calls(&database, "tollgate_claim_batch", 1).await, 1);
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM executions")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(keys, 5);
}

/// The claim and settlement functions take their audit chain group's advisory lock before any
/// row (H-35): while another transaction holds it, a settlement and a claim of that group wait,
/// and both finish once it is released.
#[tokio::test]
async fn h_35_the_functions_wait_for_their_chain_group_s_lock() {
    let (database, s) = fresh().await;
    let r = claimed(&s, "k1", "0.1").await;
    let group = i32::from(tollgate_store::rows::AuditChain::of_execution(r.id).0 >> 3);
    let mut holder = PgConnection::connect(database.url()).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(1953459308, $1)")
        .bind(group)
        .execute(&mut holder)
        .await
        .unwrap();
    let settling = {
        let s = s.clone();
        let request = settle_req(&r, "0.05", "x");
        tokio::spawn(async move { s.settle(request).await })
    };
    // The same consumer's next execution is in the same group.
    let claiming = {
        let s = s.clone();
        tokio::spawn(async move { claimed(&s, "k2", "0.1").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !settling.is_finished(),
        "the settlement went past its group's lock"
    );
    assert!(
        !claiming.is_finished(),
        "the claim went past its group's lock"
    );
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), settling)
        .await
        .expect("the settlement finishes once the lock is released")
        .unwrap()
        .unwrap();
    assert_eq!(done.record.state, ExecutionState::Completed);
    let next = tokio::time::timeout(Duration::from_secs(10), claiming)
        .await
        .expect("the claim finishes once the lock is released")
        .unwrap();
    assert_eq!(
        tollgate_store::rows::AuditChain::of_execution(next.id).0 >> 3,
        tollgate_store::rows::AuditChain::of_execution(r.id).0 >> 3
    );
}

/// Lease renewals that arrive together go in one statement (H-36), each decided as alone: every
/// live fence is renewed, the same fence twice in one statement is renewed twice, a stale fence
/// answers `StaleFence` and an unknown execution `NotFound`.
#[tokio::test]
async fn h_36_renewals_arriving_together_share_a_statement_each_decided_as_alone() {
    use tollgate_core::ids::{ExecutionId, FenceToken};
    use tollgate_store::{Fence, StoreError};
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let s = database.stores(8).await.unwrap();
    s.migrate().await.unwrap();
    let s = s.with_caller_lease_clock();
    let mut records = Vec::new();
    for i in 0..40 {
        records.push(claimed(&s, &format!("r{i}"), "0.01").await);
    }
    let later = records[0].created_at + chrono::TimeDelta::seconds(5);
    for round in 0..5 {
        let mut renewals = Vec::new();
        for r in &records {
            renewals.push(s.renew_lease(r.fence(), 60_000, later));
        }
        // The first fence once more, a stale one and an unknown one, in the same burst.
        renewals.push(s.renew_lease(records[0].fence(), 60_000, later));
        let stale = Fence {
            execution_id: records[1].id,
            token: FenceToken(records[1].fence().token.0 + 7),
        };
        let unknown = Fence {
            execution_id: ExecutionId(uuid::Uuid::new_v4()),
            token: FenceToken(1),
        };
        renewals.push(s.renew_lease(stale, 60_000, later));
        renewals.push(s.renew_lease(unknown, 60_000, later));
        let answers = futures::future::join_all(renewals).await;
        for (r, answer) in records.iter().zip(&answers) {
            let renewed = answer
                .as_ref()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(renewed.id, r.id);
            assert_eq!(
                renewed.lease_expires_at,
                later + chrono::TimeDelta::milliseconds(60_000)
            );
        }
        let n = records.len();
        assert!(answers[n].is_ok(), "the same fence twice: {:?}", answers[n]);
        assert!(matches!(answers[n + 1], Err(StoreError::StaleFence(id)) if id == records[1].id));
        assert!(matches!(answers[n + 2], Err(StoreError::NotFound(_))));
    }
    assert!(
        s.renewed_together() > 0,
        "no renewal went in a statement with others"
    );
}

/// Reads of calls' views by key that arrive together go in one statement (H-37), each answered
/// as alone: a completed call's view with its result and settlement, a dispatched one's, a key
/// without a row (in its scope or only in another), the same key twice, and a claim's read as a
/// replay (its binding's digest held) or as a conflict (another binding: the stored one is read).
#[tokio::test]
async fn h_37_reads_arriving_together_share_a_statement_each_answered_as_alone() {
    let (_database, s) = fresh().await;
    let mut records = Vec::new();
    for i in 0..40 {
        let r = claimed(&s, &format!("v{i}"), "0.01").await;
        if i % 2 == 0 {
            s.settle(settle_req(&r, "0.005", "x")).await.unwrap();
        }
        records.push(r);
    }
    let key = |k: &str| tollgate_core::ids::OperationKey::parse(k).unwrap();
    let names: Vec<String> = (0..40)
        .map(|i| format!("v{i}"))
        .chain(["v-none".to_string(), "v0".to_string(), "v7".to_string()])
        .collect();
    let scopes: Vec<&str> = names
        .iter()
        .enumerate()
        .map(|(i, _)| if i == names.len() - 1 { "b" } else { "a" })
        .collect();
    // Each read alone first: the queues are idle, so each is its own statement.
    let mut alone = Vec::new();
    for (name, sc) in names.iter().zip(&scopes) {
        alone.push(s.execution_view(&scope(sc), &key(name)).await.unwrap());
    }
    assert_eq!(s.views_read_together(), 0, "reads one at a time go alone");
    assert!(alone[0]
        .as_ref()
        .is_some_and(|v| v.settlement.is_some() && v.result.is_some()));
    assert!(alone[1].as_ref().is_some_and(|v| v.settlement.is_none()));
    assert!(alone[40].is_none() && alone[42].is_none());
    for round in 0..3 {
        let reads = names.iter().zip(&scopes).map(|(name, sc)| {
            let (s, name, sc) = (s.clone(), key(name), scope(sc));
            async move { s.execution_view(&sc, &name).await }
        });
        let together = futures::future::join_all(reads).await;
        for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
            let t = t
                .as_ref()
                .unwrap_or_else(|e| panic!("round {round}, read {i}: {e}"));
            assert_eq!(a, t, "round {round}, read {i}");
        }
        // Claims of the keys seen: each reads first, holding its binding's digest.
        let claims = (0..40).map(|i| {
            let s = s.clone();
            let mut request = claim_req("a", &format!("v{i}"), capped(), "0.1");
            if i == 5 {
                request = claim_req("a", "v5", text_config(), "0.1");
            }
            async move { s.claim(request).await }
        });
        let answers = futures::future::join_all(claims).await;
        for (i, answer) in answers.into_iter().enumerate() {
            match answer.unwrap() {
                ClaimOutcome::Existing(view) => {
                    assert_eq!(view.execution.id, records[i].id, "round {round}, claim {i}");
                    assert_eq!(view.execution.binding, records[i].binding, "claim {i}");
                }
                other => panic!("round {round}, claim {i}: {other:?}"),
            }
        }
    }
    assert!(
        s.views_read_together() > 0,
        "no read went in a statement with others"
    );
}

// ---------------------------------------------------------------------------------------------
// Rate and concurrency limits (SC-220..SC-223).

use std::collections::BTreeMap;
use tollgate_core::ids::ConsumerId;
use tollgate_core::limits::{
    self as rule, ClaimLimits, LimitCharge, LimitEnd, LimitKind, LimitRefused, LimitSubject,
    LimitTokens, LimitWindow, RateLimits,
};
use tollgate_testkit::conformance::t0;

fn consumer_subject(name: &str) -> LimitSubject {
    LimitSubject::Consumer(ConsumerId::parse(name).unwrap())
}

fn key_subject() -> LimitSubject {
    LimitSubject::Key("ab12cd".into())
}

/// `ms` milliseconds after [`t0`].
fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
    t0() + chrono::TimeDelta::milliseconds(ms)
}

/// `us` microseconds after [`t0`].
fn at_us(us: i64) -> chrono::DateTime<chrono::Utc> {
    t0() + chrono::TimeDelta::microseconds(us)
}

fn window(started_ms: i64, counts: [u64; 4]) -> LimitWindow {
    let [requests, input_tokens, output_tokens, in_flight] = counts;
    LimitWindow {
        started_at: at(started_ms),
        requests,
        input_tokens,
        output_tokens,
        in_flight,
    }
}

fn tokens(input: u64, output: u64) -> LimitTokens {
    LimitTokens { input, output }
}

fn charge(subject: LimitSubject, limits: RateLimits) -> LimitCharge {
    LimitCharge { subject, limits }
}

fn rpm(n: u64) -> RateLimits {
    RateLimits {
        requests_per_minute: Some(n),
        ..RateLimits::default()
    }
}

/// A claim's limits as `tollgate_limits_admit` takes them, written out here (not by the
/// crate's encoder), so that the comparison also checks the shape the function reads: each
/// subject's stored text, its four limits in the order in_flight, requests, input tokens, output
/// tokens (`None`: not limited), and the tokens the call counts.
fn admit_args(
    charges: &[LimitCharge],
    t: LimitTokens,
) -> (Vec<String>, Vec<Option<i64>>, Vec<i64>) {
    let n = |v: u64| i64::try_from(v).unwrap();
    let subjects = charges.iter().map(|c| c.subject.stored()).collect();
    let values = charges
        .iter()
        .flat_map(|c| {
            [
                c.limits.in_flight,
                c.limits.requests_per_minute,
                c.limits.input_tokens_per_minute,
                c.limits.output_tokens_per_minute,
            ]
        })
        .map(|limit| limit.map(n))
        .collect();
    (subjects, values, vec![n(t.input), n(t.output)])
}

/// The refusal in a `TG003` error's detail.
fn refusal_of(error: &sqlx::Error) -> LimitRefused {
    let db = error.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("TG003"), "{error}");
    let detail = db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .and_then(|e| e.detail())
        .expect("a detail");
    let v: serde_json::Value = serde_json::from_str(detail).unwrap();
    LimitRefused {
        subject: LimitSubject::parse(v["subject"].as_str().unwrap()).unwrap(),
        kind: LimitKind::parse(v["kind"].as_str().unwrap()).unwrap(),
        limit: v["limit"].as_u64().unwrap(),
        used: v["used"].as_u64().unwrap(),
        asked: v["asked"].as_u64().unwrap(),
        reset_ms: v["reset_ms"].as_u64().unwrap(),
    }
}

/// The windows of scope `a` as stored, by subject.
async fn stored_windows(conn: &mut PgConnection) -> Vec<(LimitSubject, LimitWindow)> {
    let rows: Vec<(String, chrono::DateTime<chrono::Utc>, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT subject, started_at, requests, input_tokens, output_tokens, in_flight \
         FROM limit_windows WHERE scope = 'a'",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let mut windows: Vec<_> = rows
        .into_iter()
        .map(|(s, started_at, r, i, o, f)| {
            (
                LimitSubject::parse(&s).unwrap(),
                LimitWindow {
                    started_at,
                    requests: r.try_into().unwrap(),
                    input_tokens: i.try_into().unwrap(),
                    output_tokens: o.try_into().unwrap(),
                    in_flight: f.try_into().unwrap(),
                },
            )
        })
        .collect();
    windows.sort_by(|a, b| a.0.cmp(&b.0));
    windows
}

/// Replaces scope `a`'s windows with `before` (in the caller's transaction).
async fn put_windows(conn: &mut PgConnection, before: &[(LimitSubject, LimitWindow)]) {
    sqlx::query("DELETE FROM limit_windows")
        .execute(&mut *conn)
        .await
        .unwrap();
    for (subject, w) in before {
        sqlx::query(
            "INSERT INTO limit_windows (scope, subject, started_at, requests, input_tokens, \
             output_tokens, in_flight) VALUES ('a', $1, $2, $3, $4, $5, $6)",
        )
        .bind(subject.stored())
        .bind(w.started_at)
        .bind(i64::try_from(w.requests).unwrap())
        .bind(i64::try_from(w.input_tokens).unwrap())
        .bind(i64::try_from(w.output_tokens).unwrap())
        .bind(i64::try_from(w.in_flight).unwrap())
        .execute(&mut *conn)
        .await
        .unwrap();
    }
}

/// What an admission leaves: every window by subject; or the refusal.
type Admitted = Result<Vec<(LimitSubject, LimitWindow)>, LimitRefused>;

/// `tollgate_core::limits::admit` for each charge, on the windows before the claim, subjects in
/// ascending order of their stored text.
fn rust_admit(
    before: &[(LimitSubject, LimitWindow)],
    charges: &[LimitCharge],
    t: LimitTokens,
    now: chrono::DateTime<chrono::Utc>,
) -> Admitted {
    let stored: BTreeMap<LimitSubject, LimitWindow> = before.iter().cloned().collect();
    let mut after = stored.clone();
    let mut charges: Vec<&LimitCharge> = charges.iter().collect();
    charges.sort_by_key(|c| c.subject.stored());
    for c in charges {
        let w = rule::admit(stored.get(&c.subject), c, t, now)?;
        after.insert(c.subject.clone(), w);
    }
    Ok(after.into_iter().collect())
}

/// `tollgate_limits_admit` on the same windows, in a transaction rolled back after.
async fn sql_admit(
    conn: &mut PgConnection,
    before: &[(LimitSubject, LimitWindow)],
    charges: &[LimitCharge],
    t: LimitTokens,
    now: chrono::DateTime<chrono::Utc>,
) -> Admitted {
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    put_windows(conn, before).await;
    let (subjects, values, tokens) = admit_args(charges, t);
    let answer = sqlx::query("SELECT tollgate_limits_admit('a', $1, $2, $3, $4)")
        .bind(subjects)
        .bind(values)
        .bind(tokens)
        .bind(now)
        .execute(&mut *conn)
        .await;
    let out = match answer {
        Err(e) => Err(refusal_of(&e)),
        Ok(_) => Ok(stored_windows(conn).await),
    };
    sqlx::query("ROLLBACK").execute(&mut *conn).await.unwrap();
    out
}

/// One admission case: the windows before, the charges, the tokens and the time.
struct AdmitCase {
    name: &'static str,
    before: Vec<(LimitSubject, LimitWindow)>,
    charges: Vec<LimitCharge>,
    tokens: LimitTokens,
    now: chrono::DateTime<chrono::Utc>,
}

/// Each case through both rules: the same windows after, or the same refusal.
async fn compare_admissions(cases: Vec<AdmitCase>) -> Vec<Admitted> {
    let (_database, s) = fresh().await;
    let mut conn = PgConnection::connect(_database.url()).await.unwrap();
    let mut out = Vec::new();
    for case in cases {
        let rust = rust_admit(&case.before, &case.charges, case.tokens, case.now);
        let sql = sql_admit(
            &mut conn,
            &case.before,
            &case.charges,
            case.tokens,
            case.now,
        )
        .await;
        assert_eq!(sql, rust, "{}", case.name);
        out.push(rust);
    }
    drop(s);
    out
}

/// One end case: the window, when the call was admitted, what it counted, and its end.
struct EndCase {
    name: &'static str,
    before: LimitWindow,
    admitted_at: chrono::DateTime<chrono::Utc>,
    held: LimitTokens,
    end: LimitEnd,
}

/// Each end through `tollgate_core::limits::end` and `tollgate_limits_end`: the same window.
async fn compare_ends(cases: Vec<EndCase>) -> Vec<LimitWindow> {
    let (database, _s) = fresh().await;
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    let subject = consumer_subject("team-a");
    let mut out = Vec::new();
    for case in cases {
        let rust = rule::end(case.before, case.admitted_at, case.held, case.end);
        let (name, settled, from_flight) = match case.end {
            LimitEnd::NotSent => ("not_sent", None, false),
            LimitEnd::Parked => ("parked", None, false),
            LimitEnd::Settled {
                tokens,
                from_flight,
            } => ("settled", Some(tokens), from_flight),
        };
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        put_windows(&mut conn, &[(subject.clone(), case.before)]).await;
        // What the claim keeps: the subjects, the tokens and the admission time.
        sqlx::query("SELECT tollgate_limits_end('a', $1, $2, $3, $4, $5, $6, $7, $8)")
            .bind(vec![subject.stored()])
            .bind(i64::try_from(case.held.input).unwrap())
            .bind(i64::try_from(case.held.output).unwrap())
            .bind(case.admitted_at)
            .bind(name)
            .bind(settled.map(|t| i64::try_from(t.input).unwrap()))
            .bind(settled.map(|t| i64::try_from(t.output).unwrap()))
            .bind(from_flight)
            .execute(&mut conn)
            .await
            .unwrap();
        let sql = stored_windows(&mut conn).await;
        sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
        assert_eq!(sql, [(subject.clone(), rust)], "{}", case.name);
        out.push(rust);
    }
    out
}

/// SC-220 through the batched claim function: 200 claims of one consumer at once under 50
/// requests a minute admit exactly 50; each refusal (a batch call rolled back alone, then sent by
/// the single function, which states it) names the limit, and writes nothing.
#[tokio::test]
async fn sc_220_two_hundred_concurrent_batched_claims_admit_exactly_the_requests_limit() {
    let (database, s) = fresh().await;
    assert!(s.batch_shard("a", "team-a").is_some(), "batches are on");
    let subject = consumer_subject("team-a");
    let limits = ClaimLimits {
        charges: vec![charge(subject.clone(), rpm(50))],
        tokens: tokens(10, 5),
    };
    let s = std::sync::Arc::new(s);
    let claims = (0..200).map(|i| {
        let s = std::sync::Arc::clone(&s);
        let mut request = claim_of("team-a", &format!("k{i}"), text_config());
        request.limits = limits.clone();
        tokio::spawn(async move { s.claim(request).await.unwrap() })
    });
    let (mut admitted, mut limited) = (0, 0);
    for outcome in futures::future::join_all(claims).await {
        match outcome.unwrap() {
            ClaimOutcome::Claimed(r) => {
                assert_eq!(r.state, ExecutionState::Dispatched);
                admitted += 1;
            }
            ClaimOutcome::Limited(refused) => {
                assert_eq!(refused.subject, subject);
                assert_eq!(refused.kind, LimitKind::Requests);
                assert_eq!((refused.limit, refused.used, refused.asked), (50, 50, 1));
                assert!((1..=60_000).contains(&refused.reset_ms), "{refused:?}");
                limited += 1;
            }
            other => panic!("expected a claim or a limit, got {other:?}"),
        }
    }
    assert_eq!((admitted, limited), (50, 150));
    assert!(calls(&database, "tollgate_claim_batch", 1).await >= 1);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM executions")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(rows, 50);
    // Each row keeps what its end needs, written with it: the subjects, the tokens and the
    // admission time (not the limits).
    type Kept = (
        Option<Vec<String>>,
        Option<i64>,
        Option<i64>,
        Option<chrono::DateTime<chrono::Utc>>,
    );
    let kept: Vec<Kept> = sqlx::query_as(
        "SELECT limit_subjects, limit_input_tokens, limit_output_tokens, limit_admitted_at \
         FROM executions",
    )
    .fetch_all(s.pool())
    .await
    .unwrap();
    assert_eq!(kept.len(), 50);
    for kept in kept {
        assert_eq!(
            kept,
            (Some(vec![subject.stored()]), Some(10), Some(5), Some(t0()))
        );
    }
    let windows = tollgate_store::SpendStore::limit_windows(&*s, &scope("a"))
        .await
        .unwrap();
    assert_eq!(
        windows,
        [(
            subject,
            LimitWindow {
                started_at: t0(),
                requests: 50,
                input_tokens: 500,
                output_tokens: 250,
                in_flight: 50,
            }
        )]
    );
    let held: rust_decimal::Decimal =
        sqlx::query_scalar("SELECT COALESCE(sum(held), 0) FROM spend_days")
            .fetch_one(s.pool())
            .await
            .unwrap();
    assert_eq!(money(&held.to_string()), money("5.0"));
    let audit = s
        .audit_rows(&scope("a"), AuditPosition::START, 1000)
        .await
        .unwrap();
    assert_eq!(audit.len(), 2 * 50);
    let mut verifier = tollgate_store::audit::ChainVerifier::default();
    audit.iter().for_each(|row| verifier.push(row).unwrap());
    verifier
        .finish(&s.audit_heads(&scope("a")).await.unwrap())
        .unwrap();
}

/// SC-221: `tollgate_limits_admit` is `tollgate_core::limits::admit` on its boundaries: exactly
/// at a limit, one over, a call that asks more than the limit, a window that closed exactly
/// 60 000 ms after it opened (or has a microsecond left), several subjects, the kinds' order.
#[tokio::test]
async fn sc_221_the_sql_admission_agrees_with_the_rust_rule() {
    let c = || consumer_subject("team-a");
    let input = |n| RateLimits {
        input_tokens_per_minute: Some(n),
        ..RateLimits::default()
    };
    let output = |n| RateLimits {
        output_tokens_per_minute: Some(n),
        ..RateLimits::default()
    };
    let t = tokens(10, 5);
    let case = |name, before, charges, tokens, now| AdmitCase {
        name,
        before,
        charges,
        tokens,
        now,
    };
    let cases = vec![
        case("no window yet", vec![], vec![charge(c(), rpm(3))], t, at(5)),
        case(
            "exactly at the requests limit",
            vec![(c(), window(0, [2, 0, 0, 2]))],
            vec![charge(c(), rpm(3))],
            t,
            at(1_000),
        ),
        case(
            "one over the requests limit",
            vec![(c(), window(0, [3, 0, 0, 3]))],
            vec![charge(c(), rpm(3))],
            t,
            at(1_000),
        ),
        case(
            "exactly at the input limit",
            vec![(c(), window(0, [1, 15, 0, 1]))],
            vec![charge(c(), input(25))],
            t,
            at(1),
        ),
        case(
            "one over the input limit",
            vec![(c(), window(0, [1, 16, 0, 1]))],
            vec![charge(c(), input(25))],
            t,
            at(1),
        ),
        case(
            "exactly at the output limit",
            vec![(c(), window(0, [1, 0, 95, 1]))],
            vec![charge(c(), output(100))],
            t,
            at(1),
        ),
        case(
            "one over the output limit",
            vec![(c(), window(0, [1, 0, 96, 1]))],
            vec![charge(c(), output(100))],
            t,
            at(1),
        ),
        case(
            "asks more than the limit itself",
            vec![],
            vec![charge(c(), input(9))],
            t,
            at(0),
        ),
        case(
            "the window closed at exactly 60 000 ms",
            vec![(c(), window(0, [3, 30, 15, 2]))],
            vec![charge(c(), rpm(3))],
            t,
            at(60_000),
        ),
        case(
            "one millisecond before the window closes",
            vec![(c(), window(0, [3, 30, 15, 2]))],
            vec![charge(c(), rpm(3))],
            t,
            at(59_999),
        ),
        case(
            "half a millisecond before the window closes",
            vec![(c(), window(0, [3, 30, 15, 2]))],
            vec![charge(c(), rpm(3))],
            t,
            at_us(59_999_500),
        ),
        case(
            "a microsecond short of a whole second left",
            vec![(c(), window(0, [3, 30, 15, 2]))],
            vec![charge(c(), rpm(3))],
            t,
            at_us(59_000_001),
        ),
        case(
            "a charge without limits still counts",
            vec![(c(), window(0, [3, 30, 15, 2]))],
            vec![charge(c(), RateLimits::default())],
            t,
            at(10),
        ),
        case(
            "the consumer admits, the key refuses: the key is named",
            vec![
                (c(), window(0, [0, 0, 0, 0])),
                (key_subject(), window(0, [2, 0, 0, 0])),
            ],
            vec![charge(c(), rpm(5)), charge(key_subject(), rpm(2))],
            t,
            at(10),
        ),
        case(
            "both subjects admit, the key's row is new",
            vec![(c(), window(0, [1, 10, 5, 1]))],
            vec![charge(c(), rpm(5)), charge(key_subject(), rpm(2))],
            t,
            at(10),
        ),
        case(
            "calls in flight are judged before requests",
            vec![(c(), window(0, [1, 0, 0, 1]))],
            vec![charge(
                c(),
                RateLimits {
                    requests_per_minute: Some(1),
                    in_flight: Some(1),
                    ..RateLimits::default()
                },
            )],
            t,
            at(10),
        ),
    ];
    let results = compare_admissions(cases).await;
    // The rule's verdicts, as the cases mean them.
    let refused = |i: usize| results[i].clone().unwrap_err();
    assert!(results[1].is_ok());
    assert_eq!(
        (refused(2).kind, refused(2).used, refused(2).reset_ms),
        (LimitKind::Requests, 3, 59_000)
    );
    assert!(results[3].is_ok());
    assert_eq!(
        (refused(4).kind, refused(4).used),
        (LimitKind::InputTokens, 16)
    );
    assert!(results[5].is_ok());
    assert_eq!(refused(6).kind, LimitKind::OutputTokens);
    assert!(!refused(7).retryable());
    let reopened = results[8].clone().unwrap();
    assert_eq!(
        reopened[0].1,
        LimitWindow {
            started_at: at(60_000),
            requests: 1,
            input_tokens: 10,
            output_tokens: 5,
            in_flight: 3,
        }
    );
    assert_eq!(refused(9).reset_ms, 1);
    assert_eq!(refused(10).reset_ms, 1);
    assert_eq!(refused(11).reset_ms, 999);
    assert_eq!(refused(13).subject, key_subject());
    assert_eq!(results[14].clone().unwrap().len(), 2);
    assert_eq!(refused(15).kind, LimitKind::InFlight);
}

/// SC-222: calls in flight carry over into a new window, are refused with the short retry, and
/// end when a call is parked or settles straight from `dispatched`; never below zero.
#[tokio::test]
async fn sc_222_the_sql_calls_in_flight_agree_with_the_rust_rule() {
    let c = || consumer_subject("team-a");
    let flight = |n| RateLimits {
        in_flight: Some(n),
        ..RateLimits::default()
    };
    let t = tokens(10, 5);
    let admissions = compare_admissions(vec![
        AdmitCase {
            name: "in flight carried over a closed window refuses",
            before: vec![(c(), window(0, [4, 40, 20, 2]))],
            charges: vec![charge(c(), flight(2))],
            tokens: t,
            now: at(70_000),
        },
        AdmitCase {
            name: "in flight carried over a closed window admits",
            before: vec![(c(), window(0, [4, 40, 20, 1]))],
            charges: vec![charge(c(), flight(2))],
            tokens: t,
            now: at(70_000),
        },
    ])
    .await;
    let refused = admissions[0].clone().unwrap_err();
    assert_eq!(
        (refused.kind, refused.used, refused.reset_ms),
        (LimitKind::InFlight, 2, rule::IN_FLIGHT_RETRY_MS)
    );
    assert_eq!(admissions[1].clone().unwrap()[0].1.in_flight, 2);
    let ends = compare_ends(vec![
        EndCase {
            name: "parked",
            before: window(0, [2, 20, 10, 2]),
            admitted_at: at(0),
            held: t,
            end: LimitEnd::Parked,
        },
        EndCase {
            name: "parked with none in flight stays at zero",
            before: window(0, [2, 20, 10, 0]),
            admitted_at: at(0),
            held: t,
            end: LimitEnd::Parked,
        },
        EndCase {
            name: "parked after its window closed",
            before: window(60_000, [1, 10, 5, 2]),
            admitted_at: at(0),
            held: t,
            end: LimitEnd::Parked,
        },
        EndCase {
            name: "settled after being parked leaves flight alone",
            before: window(0, [2, 20, 10, 1]),
            admitted_at: at(0),
            held: t,
            end: LimitEnd::Settled {
                tokens: tokens(3, 50),
                from_flight: false,
            },
        },
    ])
    .await;
    assert_eq!(ends[0].in_flight, 1);
    assert_eq!(ends[1].in_flight, 0);
    assert_eq!((ends[2].in_flight, ends[2].input_tokens), (1, 10));
    assert_eq!(
        (
            ends[3].in_flight,
            ends[3].input_tokens,
            ends[3].output_tokens
        ),
        (1, 13, 55)
    );
}

/// SC-223: a call never sent gives its request and tokens back to the window that counted it; a
/// settled one corrects that window to its usage; a window opened since is left as it is, but
/// the call leaves flight; no count goes below zero.
#[tokio::test]
async fn sc_223_the_sql_give_backs_and_corrections_agree_with_the_rust_rule() {
    let t = tokens(10, 5);
    let settled = |input, output| LimitEnd::Settled {
        tokens: tokens(input, output),
        from_flight: true,
    };
    let ends = compare_ends(vec![
        EndCase {
            name: "not sent, in the window that counted it",
            before: window(0, [2, 20, 10, 2]),
            admitted_at: at(0),
            held: t,
            end: LimitEnd::NotSent,
        },
        EndCase {
            name: "not sent, after a new window opened",
            before: window(60_000, [1, 10, 5, 2]),
            admitted_at: at(0),
            held: t,
            end: LimitEnd::NotSent,
        },
        EndCase {
            name: "not sent, counts below what it counted",
            before: window(0, [0, 3, 1, 0]),
            admitted_at: at(0),
            held: t,
            end: LimitEnd::NotSent,
        },
        EndCase {
            name: "settled in the same window",
            before: window(0, [2, 20, 10, 2]),
            admitted_at: at(0),
            held: t,
            end: settled(3, 50),
        },
        EndCase {
            name: "settled in the same window, long after it closed (no window opened since)",
            before: window(0, [2, 20, 10, 2]),
            admitted_at: at(0),
            held: t,
            end: settled(0, 0),
        },
        EndCase {
            name: "settled after a new window opened",
            before: window(60_000, [1, 10, 5, 2]),
            admitted_at: at(0),
            held: t,
            end: settled(100, 100),
        },
        EndCase {
            name: "settled, counts below what it counted",
            before: window(0, [1, 4, 2, 1]),
            admitted_at: at(0),
            held: t,
            end: settled(3, 1),
        },
        EndCase {
            name: "not sent, admitted in the middle of its window",
            before: window(0, [2, 20, 10, 2]),
            admitted_at: at(30_000),
            held: t,
            end: LimitEnd::NotSent,
        },
        EndCase {
            name: "not sent, admitted a microsecond before its window closed",
            before: window(0, [2, 20, 10, 2]),
            admitted_at: at_us(59_999_999),
            held: t,
            end: LimitEnd::NotSent,
        },
        EndCase {
            name: "settled, admitted when the window closed: a later window counted it",
            before: window(0, [2, 20, 10, 2]),
            admitted_at: at(60_000),
            held: t,
            end: settled(3, 50),
        },
        EndCase {
            name: "not sent, admitted before the window opened: an earlier one counted it",
            before: window(60_000, [1, 10, 5, 2]),
            admitted_at: at(59_999),
            held: t,
            end: LimitEnd::NotSent,
        },
    ])
    .await;
    assert_eq!(ends[7], window(0, [1, 10, 5, 1]));
    assert_eq!(ends[8], window(0, [1, 10, 5, 1]));
    assert_eq!(ends[9], window(0, [2, 20, 10, 1]));
    assert_eq!(ends[10], window(60_000, [1, 10, 5, 1]));
    assert_eq!(ends[0], window(0, [1, 10, 5, 1]));
    assert_eq!(ends[1], window(60_000, [1, 10, 5, 1]));
    assert_eq!(ends[2], window(0, [0, 0, 0, 0]));
    assert_eq!(ends[3], window(0, [2, 13, 55, 1]));
    assert_eq!(ends[5], window(60_000, [1, 10, 5, 1]));
    assert_eq!(ends[6], window(0, [1, 3, 1, 0]));
}

/// SC-220 on the general transaction: a claim under a root refused by a limit writes nothing (no
/// row, no audit row, no hold on the spend rows or the root, no count in the window), and the
/// call admitted before it is counted once.
#[tokio::test]
async fn sc_220_a_claim_under_a_root_refused_by_a_limit_writes_nothing() {
    use tollgate_store::RootStore;
    let (_database, s) = fresh().await;
    let mut config = text_config();
    config.kind = tollgate_core::state::CallKind::Step;
    let root = tollgate_testkit::conformance::open_root(&s, "r1", config.clone()).await;
    let subject = consumer_subject(config.consumer.as_str());
    let under = |k: &str| {
        let mut request = claim_req("a", k, config.clone(), "0.1");
        request.root_key = Some(root.root_key.clone());
        request.dispatch = true;
        request.limits = ClaimLimits {
            charges: vec![charge(subject.clone(), rpm(1))],
            tokens: tokens(10, 5),
        };
        request
    };
    assert!(matches!(
        s.claim(under("k1")).await.unwrap(),
        ClaimOutcome::Claimed(_)
    ));
    let count = |sql: &'static str| {
        let pool = s.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let audit_before = count("SELECT count(*) FROM audit_log").await;
    let day_held = || {
        let pool = s.pool().clone();
        async move {
            sqlx::query_scalar::<_, rust_decimal::Decimal>(
                "SELECT COALESCE(sum(held), 0) FROM spend_days",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let held_before = day_held().await;
    let root_before = s.root(&scope("a"), &root.root_key).await.unwrap().unwrap();
    let ClaimOutcome::Limited(refused) = s.claim(under("k2")).await.unwrap() else {
        panic!("expected a limit's refusal");
    };
    assert_eq!(
        (refused.kind, refused.limit, refused.used),
        (LimitKind::Requests, 1, 1)
    );
    assert_eq!(count("SELECT count(*) FROM executions").await, 1);
    assert_eq!(count("SELECT count(*) FROM audit_log").await, audit_before);
    assert_eq!(day_held().await, held_before);
    let root_after = s.root(&scope("a"), &root.root_key).await.unwrap().unwrap();
    assert_eq!(
        (root_after.held, root_after.charged),
        (root_before.held, root_before.charged)
    );
    let windows = tollgate_store::SpendStore::limit_windows(&s, &scope("a"))
        .await
        .unwrap();
    assert_eq!(windows.len(), 1);
    assert_eq!((windows[0].1.requests, windows[0].1.in_flight), (1, 1));
    // The application role may do to the windows what it may do to the spend rows.
    let privileges = |table: &'static str| {
        let pool = s.pool().clone();
        async move {
            sqlx::query_as::<_, (bool, bool, bool, bool)>(
                "SELECT has_table_privilege('tollgate_app', $1, 'SELECT'), \
                 has_table_privilege('tollgate_app', $1, 'INSERT'), \
                 has_table_privilege('tollgate_app', $1, 'UPDATE'), \
                 has_table_privilege('tollgate_app', $1, 'DELETE')",
            )
            .bind(table)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(privileges("limit_windows").await, (true, true, true, false));
    assert_eq!(
        privileges("limit_windows").await,
        privileges("spend_days").await
    );
}

/// SC-222, SC-223 through the stores: the same limited calls (one never sent, one settled by the
/// function, one by the general transaction, one parked then settled, one settled after its
/// window closed and another opened) leave the same windows on Postgres, by either path, as in
/// memory.
#[tokio::test]
async fn sc_223_the_ends_of_limited_calls_leave_the_windows_the_in_memory_store_leaves() {
    use tollgate_core::state::ReconciliationReason;
    let subject = consumer_subject("team-a");
    let limits = ClaimLimits {
        charges: vec![
            charge(
                subject.clone(),
                RateLimits {
                    requests_per_minute: Some(10),
                    input_tokens_per_minute: Some(1_000),
                    output_tokens_per_minute: Some(1_000),
                    in_flight: Some(5),
                },
            ),
            charge(key_subject(), rpm(20)),
        ],
        tokens: tokens(40, 100),
    };
    async fn run<S: ExecutionStore + tollgate_store::SpendStore>(
        s: &S,
        limits: &ClaimLimits,
    ) -> Vec<(LimitSubject, LimitWindow)> {
        let claim = |key: &str, dispatch: bool, now| {
            let mut request = claim_of("team-a", key, text_config());
            request.dispatch = dispatch;
            request.limits = limits.clone();
            request.now = now;
            request
        };
        let claimed = |outcome: ClaimOutcome| match outcome {
            ClaimOutcome::Claimed(r) => r,
            other => panic!("expected a claim, got {other:?}"),
        };
        // Never sent.
        let r1 = claimed(s.claim(claim("k1", false, t0())).await.unwrap());
        s.mark_not_dispatched(
            r1.fence(),
            tollgate_core::state::NotDispatchedCause::Input,
            t0(),
        )
        .await
        .unwrap();
        // Settled with the row in hand (the function), and without (the general transaction).
        let r2 = claimed(s.claim(claim("k2", true, t0())).await.unwrap());
        s.settle(settle_req(&r2, "0.01", "x")).await.unwrap();
        let r3 = claimed(s.claim(claim("k3", true, t0())).await.unwrap());
        let mut without_row = settle_req(&r3, "0.01", "x");
        without_row.seen = None;
        without_row.usage.cache_read = 7;
        without_row.usage.reasoning = 3;
        s.settle(without_row).await.unwrap();
        // Parked, then settled from `reconciliation_required`.
        let r4 = claimed(s.claim(claim("k4", true, t0())).await.unwrap());
        let parked = s
            .mark_reconciliation_required(r4.fence(), ReconciliationReason::NoResponse, None, t0())
            .await
            .unwrap();
        s.settle(settle_req(&parked, "0.01", "x")).await.unwrap();
        // Counted in the first window, settled after the next one opened.
        let r5 = claimed(s.claim(claim("k5", true, t0())).await.unwrap());
        claimed(s.claim(claim("k6", true, at(61_000))).await.unwrap());
        let mut late = settle_req(&r5, "0.01", "x");
        late.now = at(62_000);
        s.settle(late).await.unwrap();
        s.limit_windows(&scope("a")).await.unwrap()
    }
    let memory = run(&tollgate_store::MemoryStores::new(), &limits).await;
    let (_fdb, by_function) = fresh().await;
    let (_gdb, general) = fresh().await;
    let general = general.with_general_transactions();
    assert_eq!(run(&by_function, &limits).await, memory, "the functions");
    assert_eq!(
        run(&general, &limits).await,
        memory,
        "the general transactions"
    );
    // The consumer's window opened by k6: one request, its worst case, one call in flight (k6).
    let consumer = memory.iter().find(|(s, _)| *s == subject).unwrap().1;
    assert_eq!(
        consumer,
        LimitWindow {
            started_at: at(61_000),
            requests: 1,
            input_tokens: 40,
            output_tokens: 100,
            in_flight: 1,
        }
    );
}

/// The harness's probes (`benches/probe/db_only.sql`, `db_limited.sql`: a first call's claim and
/// settlement as pgbench drives them) run on a migrated database and settle what they claim, so
/// a change of the functions' parameters cannot leave them behind (H-7).
#[tokio::test]
async fn h_7_the_harness_probes_call_the_functions_as_they_are() {
    let (database, _s) = fresh().await;
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    let probes = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/probe");
    let config = std::fs::read_to_string(probes.join("db_config.sql")).unwrap();
    sqlx::raw_sql(&config).execute(&mut conn).await.unwrap();
    for probe in ["db_only.sql", "db_limited.sql"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../benches/probe")
            .join(probe);
        let script = std::fs::read_to_string(&path).unwrap();
        let mut vars = vec![("n".to_string(), format!("{}", probe.len()))];
        vars.push(("c".into(), "3".into()));
        vars.push(("chain".into(), "5".into()));
        let mut eid = None;
        for line in script.lines().filter(|l| !l.starts_with("\\set")) {
            let mut sql = line.trim_end_matches("\\gset").trim().to_string();
            // Longest names first, so that `:chain` is not read as `:c` followed by `hain`.
            let mut names = vars.clone();
            names.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
            for (name, value) in &names {
                sql = sql.replace(&format!(":{name}::"), &format!("{value}::"));
                sql = sql.replace(&format!(":{name})"), &format!("{value})"));
            }
            if let Some(id) = &eid {
                sql = sql.replace(":eid", &format!("'{id}'"));
            }
            let id: uuid::Uuid = sqlx::query_scalar(&sql)
                .fetch_one(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{probe}: {e}"));
            eid.get_or_insert(id);
        }
        let state: String = sqlx::query_scalar("SELECT state::text FROM executions WHERE id = $1")
            .bind(eid.unwrap())
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(state, "completed", "{probe}");
    }
    let windows: i64 = sqlx::query_scalar("SELECT in_flight FROM limit_windows")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(windows, 0, "the limited probe's call left flight");
}

/// H-40: the claim function writes a binding without its config and names the config by the
/// SHA-256 of its text, stored once for every call of the profile; every read gives the whole
/// binding back; a config is content-addressed and immutable for the application; and a config
/// the database lost (a restore, a failover) while the stores remembered it stored is stored
/// again by the next claim that names it, which then claims.
#[tokio::test]
async fn h_40_a_binding_config_is_stored_once_and_read_back_whole() {
    use tollgate_testkit::conformance::key;
    let (database, s) = fresh().await;
    let first = claimed(&s, "k1", "0.1").await;
    let second = claimed(&s, "k2", "0.1").await;
    let counts = || async {
        sqlx::query_as::<_, (i64, i64, i64, i32)>(
            "SELECT (SELECT count(*) FROM binding_configs), \
             (SELECT count(*) FROM executions e JOIN binding_configs c \
                ON c.digest = e.config_digest), \
             (SELECT count(*) FROM executions WHERE binding ? 'config'), \
             (SELECT max(pg_column_size(binding)) FROM executions)",
        )
        .fetch_one(s.pool())
        .await
        .unwrap()
    };
    let (configs, named, whole, largest) = counts().await;
    assert_eq!((configs, named, whole), (1, 2, 0));
    assert!(
        largest < 200,
        "a binding without its config: {largest} bytes"
    );

    let read = |k: &'static str| {
        let s = s.clone();
        async move {
            s.execution(&scope("a"), &key(k))
                .await
                .unwrap()
                .unwrap()
                .binding
        }
    };
    assert_eq!(read("k1").await, first.binding);
    assert_eq!(first.binding.digest(), first.binding_digest);
    let done = s.settle(settle_req(&second, "0.05", "x")).await.unwrap();
    assert_eq!(done.record.binding, second.binding);
    assert_eq!(read("k2").await, second.binding);
    let view = s
        .execution_view(&scope("a"), &key("k2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.execution.binding, second.binding);

    // Content-addressed: a digest that is not the config's is refused.
    let refused =
        sqlx::query("INSERT INTO binding_configs (digest, config) VALUES (repeat('0', 64), '{}')")
            .execute(s.pool())
            .await
            .unwrap_err();
    assert_check_violation(&refused, "a config under another digest");

    // Immutable for the application role.
    let app = database.app_role_url().await.unwrap();
    let mut conn = PgConnection::connect(&app).await.unwrap();
    for tamper in [
        "DELETE FROM binding_configs",
        "UPDATE binding_configs SET config = '{}'",
    ] {
        let e = sqlx::query(tamper).execute(&mut conn).await.unwrap_err();
        assert_eq!(
            e.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("42501"),
            "{tamper}"
        );
    }

    // Lost behind the stores' back (the owner can delete; a restore can lose it): the next claim
    // is told, stores it again and claims; the rows that named it read whole again.
    sqlx::query("DELETE FROM binding_configs")
        .execute(s.pool())
        .await
        .unwrap();
    let third = claimed(&s, "k3", "0.1").await;
    assert_eq!(read("k3").await, third.binding);
    assert_eq!(read("k1").await, first.binding);
    let (configs, named, whole, _) = counts().await;
    assert_eq!((configs, named, whole), (1, 3, 0));

    // Lost again, then claims arriving together: those a batch carries are refused there as a
    // whole and one by one, go alone, store the config again and claim.
    sqlx::query("DELETE FROM binding_configs")
        .execute(s.pool())
        .await
        .unwrap();
    let keys: Vec<String> = (4..20).map(|n| format!("k{n}")).collect();
    let together = keys.iter().map(|k| claimed(&s, k, "0.01"));
    let claims = futures::future::join_all(together).await;
    for (k, claim) in keys.iter().zip(&claims) {
        assert_eq!(claim.operation_key.as_str(), k);
    }
    let (configs, named, whole, _) = counts().await;
    assert_eq!((configs, named, whole), (1, 19, 0));
    assert!(
        calls(&database, "tollgate_claim_batch", 1).await >= 1,
        "the claims went in a batch"
    );
}
