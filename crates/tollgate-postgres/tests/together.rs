//! A batch decided as a whole (H-38): `tollgate_claim_together` and `tollgate_settle_together`
//! write exactly what the batch's calls write one by one, answer exactly what they answer, and
//! give way to them whenever a call would be decided otherwise.
//!
//! Each case runs one batch statement twice on the same committed state, each time in a
//! transaction that is rolled back: once as it runs, and once with the set-based function
//! replaced (inside that transaction) by one that always gives way, so the batch goes call by
//! call. The answers and every table a call writes must be the same, and the function statistics
//! of the transaction tell which way each run went.
#![cfg(test)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sqlx::{Connection, PgConnection};
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// A migrated database of its own.
async fn fresh() -> TestDatabase {
    let database = TestDatabase::create(&test_admin_url()).await.unwrap();
    let stores = database.stores(2).await.unwrap();
    stores.migrate().await.unwrap();
    database
}

/// Every row a claim or a settlement writes, as JSON text in a fixed order. The sequence-drawn
/// columns (`seq` of the evidence and the charges, drawn again by each run) and the charge's
/// transaction id are left out; the rows are in `seq` order, so their order still counts.
const TABLES: &str = "SELECT jsonb_build_object(\
    'executions', (SELECT jsonb_agg(to_jsonb(e) ORDER BY e.scope, e.operation_key) FROM executions e), \
    'audit_log', (SELECT jsonb_agg(to_jsonb(a) ORDER BY a.scope, a.chain, a.seq) FROM audit_log a), \
    'audit_heads', (SELECT jsonb_agg(to_jsonb(h) ORDER BY h.scope, h.chain) FROM audit_heads h), \
    'spend_sessions', (SELECT jsonb_agg(to_jsonb(s) ORDER BY s.scope, s.consumer, s.session_id) FROM spend_sessions s), \
    'spend_days', (SELECT jsonb_agg(to_jsonb(d) ORDER BY d.scope, d.consumer, d.day) FROM spend_days d), \
    'limit_windows', (SELECT jsonb_agg(to_jsonb(l) ORDER BY l.scope, l.subject) FROM limit_windows l), \
    'usage_inbox', (SELECT jsonb_agg(to_jsonb(u) - 'seq' ORDER BY u.seq) FROM usage_inbox u), \
    'cost_settlements', (SELECT jsonb_agg(to_jsonb(c) - 'seq' - 'txid' ORDER BY c.seq) FROM cost_settlements c), \
    'execution_results', (SELECT jsonb_agg(to_jsonb(r) ORDER BY r.execution_id) FROM execution_results r))::text";

/// The claim calls `from ..= to` of the cases: scope `a`, keys `k<g>` (or `key` for every one
/// when given), two consumers, chains shared by some calls, dispatched (two audit rows) but for
/// every fourth, a daily block cap of `daily_block`, and every third under limits: its
/// consumer's and the key `x`'s, which all of them share (at most 5 in flight); the even ones name
/// their binding's config by digest (H-40).
fn claim_calls(from: i32, to: i32, key: Option<&str>, daily_block: &str) -> String {
    let key = key.map_or("'k' || g".to_owned(), |k| format!("'{k}'"));
    format!(
        "SELECT array_agg(ROW(\
            ('00000000-0000-0000-0000-' || lpad(g::text, 12, '0'))::uuid, 'a', {key}, 'text', \
            jsonb_build_object('n', g), 'd' || g, DATE '2026-12-06', \
            CASE WHEN g % 4 = 1 THEN 'prepared' ELSE 'dispatched' END, 1, \
            TIMESTAMPTZ '2026-12-06 12:00:00+00' + g * interval '1 second', 60000, 0.1 * g, \
            TIMESTAMPTZ '2026-12-06 12:00:00+00', TIMESTAMPTZ '2026-12-06 12:00:01+00', \
            (g % 3)::smallint, 64, '\\x01'::bytea, '\\x02'::bytea, \
            CASE WHEN g % 4 = 1 THEN ARRAY['claimed'] ELSE ARRAY['claimed', 'dispatched'] END, \
            jsonb_build_array(jsonb_build_object('g', g), jsonb_build_object('d', g)), \
            ARRAY[TIMESTAMPTZ '2026-12-06 12:00:00+00', TIMESTAMPTZ '2026-12-06 12:00:02+00'], \
            ARRAY[int4send(g), int4send(-g)], \
            CASE WHEN g % 2 = 0 THEN 'team-a' ELSE 'team-b' END, 's-' || (g % 4), 'USD', \
            NULL, {daily_block}::numeric, \
            CASE WHEN g % 3 = 0 THEN ARRAY[CASE WHEN g % 2 = 0 THEN 'consumer:team-a' \
                ELSE 'consumer:team-b' END, 'key:x'] END, \
            CASE WHEN g % 3 = 0 THEN ARRAY[10, 100, 100000, NULL, 5, NULL, NULL, NULL]::bigint[] END, \
            CASE WHEN g % 3 = 0 THEN ARRAY[40 + g, 20]::bigint[] END, \
            CASE WHEN g % 2 = 0 THEN encode(sha256(convert_to({CONFIG}, 'UTF8')), 'hex') END\
         )::tollgate_claim_call ORDER BY g) FROM generate_series({from}, {to}) AS g"
    )
}

/// The settlement calls of claims `from ..= to` (as `claim_calls` made them), with evidence for
/// the even ones, acknowledged for every fourth, and caps that `warn` decides.
fn settle_calls(from: i32, to: i32, daily_warn: &str) -> String {
    format!(
        "SELECT array_agg(ROW(\
            ('00000000-0000-0000-0000-' || lpad(g::text, 12, '0'))::uuid, 1, \
            ARRAY['prepared', 'dispatched'], 'd' || g, 0.1 * g, 'ref-' || g, \
            TIMESTAMPTZ '2026-12-06 12:01:00+00' + g * interval '1 second', \
            CASE WHEN g % 2 = 0 THEN ('00000000-0000-0000-0001-' || lpad(g::text, 12, '0'))::uuid END, \
            'ref-' || g, ARRAY[10, 20, 1, 2, 3]::bigint[], true, 'stream', \
            TIMESTAMPTZ '2026-12-06 12:01:00+00', \
            CASE WHEN g % 4 = 0 THEN TIMESTAMPTZ '2026-12-06 12:01:00+00' END, \
            ('00000000-0000-0000-0002-' || lpad(g::text, 12, '0'))::uuid, \
            CASE WHEN g % 2 = 0 THEN 'team-a' ELSE 'team-b' END, 's-' || (g % 4), 'mock', 'm', \
            'prices-1', 'policy-1', 'USD', ARRAY[10 * g, 20, 1, 2, 3]::bigint[], 0.01 * g, \
            'stream', 'success', 'stop', to_jsonb('out ' || g)::text, NULL, \
            TIMESTAMPTZ '2026-12-13 12:00:00+00', NULL, 100.0, {daily_warn}::numeric, 100.0, \
            (g % 3)::smallint, '\\x05'::bytea, '\\x06'::bytea, \
            TIMESTAMPTZ '2026-12-06 12:01:00+00', jsonb_build_object('s', g), int4send(g), \
            jsonb_build_object('blocked', g), int4send(-g)\
         )::tollgate_settle_call ORDER BY g) FROM generate_series({from}, {to}) AS g"
    )
}

/// A replacement of `function` that always gives way, as the whole raises when it cannot decide
/// a call as alone.
fn giving_way(function: &str) -> String {
    let (calls, result) = match function {
        "tollgate_claim_together" => (
            "p_calls tollgate_claim_call[], OUT places integer[], OUT claimed executions[]",
            "",
        ),
        _ => (
            "p_calls tollgate_settle_call[]",
            "RETURNS tollgate_settled[]",
        ),
    };
    format!(
        "CREATE OR REPLACE FUNCTION {function}({calls}) {result} LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION USING ERRCODE = 'TG004', MESSAGE = 'give way'; END $$"
    )
}

/// One run of `batch` (`tollgate_claim_batch` or `tollgate_settle_batch`) over the calls that
/// `calls` selects, in a transaction rolled back afterwards: its answers, the tables after it,
/// and how many times the set-based function (without raising) and the single function ran.
struct Run {
    answers: Vec<String>,
    tables: String,
    together: i64,
    single: i64,
    /// Rows the run read from the tables a batch probes (sequential and index fetches).
    rows_read: i64,
    /// Of those, the rows of `audit_heads`.
    heads_read: i64,
}

async fn run(url: &str, batch: &str, calls: &str, call_by_call: bool) -> Run {
    let (together, single) = match batch {
        "tollgate_claim_batch" => ("tollgate_claim_together", "tollgate_claim"),
        _ => ("tollgate_settle_together", "tollgate_settle"),
    };
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
    sqlx::query("SET LOCAL track_functions = 'pl'")
        .execute(&mut conn)
        .await
        .unwrap();
    if call_by_call {
        sqlx::query(&giving_way(together))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let answers: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT concat_ws(' ', b.call_index, b.call_state, to_jsonb(b.call_row)::text) \
         FROM {batch}(({calls}), 1) b ORDER BY b.call_index"
    ))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let rows_read: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0)), 0)::bigint \
         FROM pg_stat_xact_user_tables WHERE relname IN \
         ('executions', 'audit_heads', 'spend_sessions', 'spend_days', 'limit_windows')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let heads_read: i64 = sqlx::query_scalar(
        "SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) \
         FROM pg_stat_xact_user_tables WHERE relname = 'audit_heads'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let tables: String = sqlx::query_scalar(TABLES)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let count = |name: &str| {
        format!(
            "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions \
             WHERE funcname = '{name}'"
        )
    };
    let together: i64 = sqlx::query_scalar(&count(together))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let single: i64 = sqlx::query_scalar(&count(single))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
    Run {
        answers,
        tables,
        together,
        single,
        rows_read,
        heads_read,
    }
}

/// Runs `batch` over `calls` both ways and checks they agree; answers whether the set-based
/// function decided the batch. Decided together, it reads at most `ROWS_READ_MAX` rows of the
/// tables it probes, however many rows they hold (`fill`), and at most `HEADS_READ_MAX` heads.
async fn both_ways(database: &TestDatabase, batch: &str, calls: &str) -> bool {
    let as_it_runs = run(database.url(), batch, calls, false).await;
    assert!(
        as_it_runs.together == 0 || as_it_runs.rows_read <= ROWS_READ_MAX,
        "{batch} read {} rows",
        as_it_runs.rows_read
    );
    assert!(
        as_it_runs.together == 0 || as_it_runs.heads_read <= HEADS_READ_MAX,
        "{batch} read {} audit heads",
        as_it_runs.heads_read
    );
    let by_call = run(database.url(), batch, calls, true).await;
    assert!(by_call.single > 0, "the batch went call by call");
    assert_eq!(as_it_runs.answers, by_call.answers, "{batch}: the answers");
    assert_eq!(as_it_runs.tables, by_call.tables, "{batch}: the tables");
    // A function that raises is not counted: `together` counts the batches it decided.
    assert_eq!(as_it_runs.together == 1, as_it_runs.single == 0);
    as_it_runs.together == 1
}

/// Commits `batch` over `calls`.
async fn commit(database: &TestDatabase, batch: &str, calls: &str) {
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    sqlx::query(&format!("SELECT count(*) FROM {batch}(({calls}), 1)"))
        .execute(&mut conn)
        .await
        .unwrap();
}

/// The most rows of the probed tables a batch of the cases decided together reads: its own rows,
/// heads, spend rows and windows, each a few times, and none of `fill`'s.
const ROWS_READ_MAX: i64 = 200;

/// The most audit heads a batch of the cases decided together reads: each head it appends to
/// twice (its lock and its move), and the cases' calls append to at most three chains (`g % 3`)
/// of their scope; none of the scope's other 61 heads, which a read by the scope alone would
/// return.
const HEADS_READ_MAX: i64 = 6;

/// The binding config that the even claims of [`claim_calls`] name by digest (H-40), stored by
/// [`fill`].
const CONFIG: &str = "'{\"model\": \"m\"}'";

/// Rows beside the cases' in every table a batch probes, more than `ROWS_READ_MAX` of each and on
/// the cases' own leading key columns: executions of another scope, sessions and days of the
/// cases' consumers, chains' heads of other scopes and windows of other subjects. A plan that
/// reads a table, or an index by less than its whole key, reads them.
async fn fill(database: &TestDatabase) {
    let mut conn = PgConnection::connect(database.url()).await.unwrap();
    let config = format!(
        "INSERT INTO binding_configs (digest, config) \
         SELECT encode(sha256(convert_to({CONFIG}, 'UTF8')), 'hex'), {CONFIG}::json"
    );
    for statement in [
        config.as_str(),
        "INSERT INTO executions (id, scope, operation_key, kind, binding, binding_digest, \
            accounting_day, state, outcome, fence, lease_expires_at, hold, created_at, updated_at) \
         SELECT gen_random_uuid(), 'filler', 'f' || g, 'text', '{}', 'd', DATE '2026-12-06', \
            'completed', 'success', 1, now(), 0, now(), now() FROM generate_series(1, 3000) AS g",
        "INSERT INTO spend_sessions (scope, consumer, session_id, currency, held) \
         SELECT 'a', c, 'f-' || g, 'USD', 0 FROM generate_series(1, 1000) AS g, \
            unnest(ARRAY['team-a', 'team-b']) AS c",
        "INSERT INTO spend_days (scope, consumer, day, currency, held) \
         SELECT 'a', c, DATE '2020-01-01' + g, 'USD', 0 FROM generate_series(1, 1000) AS g, \
            unnest(ARRAY['team-a', 'team-b']) AS c",
        "INSERT INTO audit_heads (scope, chain, last_seq, last_hash) \
         SELECT 'a-' || g, c, 0, repeat('0', 64) FROM generate_series(1, 50) AS g, \
            generate_series(0, 63) AS c",
        "INSERT INTO limit_windows (scope, subject, started_at) \
         SELECT 'a', 'key:f' || g, now() FROM generate_series(1, 1000) AS g",
    ] {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
}

#[tokio::test]
async fn h_38_a_batch_decided_together_writes_and_answers_what_its_calls_alone_do() {
    let database = fresh().await;
    fill(&database).await;
    // A scope's first claims make its audit heads, and the first limited claims their windows:
    // those batches go call by call, alike.
    let first = claim_calls(1, 2, None, "100.0");
    assert!(!both_ways(&database, "tollgate_claim_batch", &first).await);
    commit(&database, "tollgate_claim_batch", &first).await;
    let windows = claim_calls(42, 45, None, "100.0");
    assert!(!both_ways(&database, "tollgate_claim_batch", &windows).await);
    commit(&database, "tollgate_claim_batch", &windows).await;

    // Claims of two consumers on shared chains, three under limits on shared windows, with two
    // keys that already have rows (calls 1 and 2): decided together, exactly as call by call.
    let claims = claim_calls(1, 9, None, "100.0");
    assert!(both_ways(&database, "tollgate_claim_batch", &claims).await);
    // The same key three times in one batch: the first claims it, the others answer no row.
    let same_key = claim_calls(20, 22, Some("same"), "100.0");
    assert!(both_ways(&database, "tollgate_claim_batch", &same_key).await);
    // A daily block cap that some of the holds cross: the batch gives way, and the calls alone
    // claim those it admits and refuse the others.
    let capped = claim_calls(30, 38, None, "15.0");
    assert!(!both_ways(&database, "tollgate_claim_batch", &capped).await);
    // Six limited claims where the key's window admits three more in flight: call by call.
    let limited = claim_calls(60, 75, None, "100.0");
    assert!(!both_ways(&database, "tollgate_claim_batch", &limited).await);
    // A limited claim admitted a minute after its window opened restarts it: call by call.
    let later = claim_calls(100, 105, None, "100.0");
    assert!(!both_ways(&database, "tollgate_claim_batch", &later).await);

    commit(&database, "tollgate_claim_batch", &claims).await;
    // The settlements of calls 3..=9 (two prepared, three limited, two of those dispatched,
    // evidence for some, acknowledged for some), under caps that none crosses: decided
    // together.
    let settles = settle_calls(3, 9, "100.0");
    assert!(both_ways(&database, "tollgate_settle_batch", &settles).await);
    // A warn cap that the batch's charges cross: the batch gives way, and the calls alone store
    // their warnings.
    let warned = settle_calls(3, 9, "0.2");
    assert!(!both_ways(&database, "tollgate_settle_batch", &warned).await);
    // A settlement whose fence is not the row's: the batch gives way, and that call goes alone.
    let stale = settle_calls(3, 9, "100.0").replace("::uuid, 1, ", "::uuid, 1 + (g = 5)::int, ");
    assert!(!both_ways(&database, "tollgate_settle_batch", &stale).await);
}
