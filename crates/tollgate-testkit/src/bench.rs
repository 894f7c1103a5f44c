//! What the performance harness (`crates/tollgate/benches/harness.rs`) and the plan checks
//! (`crates/tollgate-postgres/tests/plans.rs`) read from and write to a test database:
//!
//! - [`TestDatabase::activity`]: the database's counters in `pg_stat_database` (commits, tuples);
//! - [`TestDatabase::statement_calls`]: statements executed, when `pg_stat_statements` is loaded;
//! - [`TestDatabase::seed_copies`]: grows the tables by copying one completed execution (its
//!   journal row, result, settlement and usage evidence) under new ids and keys;
//! - [`TestDatabase::explain_hot_path`]: `EXPLAIN (ANALYZE, BUFFERS)` of the queries a call, a
//!   replay, a usage reconciliation page and a scheduler pass run, on their real text;
//! - [`hot_statements`] and [`TestDatabase::generic_plan`]: every lookup of the call path and the
//!   index its generic plan must use (H-12).
//!
//! The statements measured are the stores' own, named through the `tollgate-postgres` seam
//! (`tollgate_postgres::test_support::statements`); the SQL that reads statistics and seeds
//! rows is here.

use crate::pg::{DbResultExt, TestDatabase};
use sqlx::{Connection, Row};
use tollgate_postgres::test_support::statements as sql;
use tollgate_store::StoreError;

/// Counters of one database in `pg_stat_database` (cumulative; take differences).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DbActivity {
    /// Transactions committed.
    pub xact_commit: i64,
    /// Transactions rolled back.
    pub xact_rollback: i64,
    /// Tuples returned by sequential and index scans (rows read).
    pub tup_returned: i64,
    /// Tuples fetched through indexes.
    pub tup_fetched: i64,
    /// Tuples inserted, updated and deleted.
    pub tup_written: i64,
}

impl DbActivity {
    /// `self - earlier`, counter by counter.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            xact_commit: self.xact_commit - earlier.xact_commit,
            xact_rollback: self.xact_rollback - earlier.xact_rollback,
            tup_returned: self.tup_returned - earlier.tup_returned,
            tup_fetched: self.tup_fetched - earlier.tup_fetched,
            tup_written: self.tup_written - earlier.tup_written,
        }
    }
}

/// One hot-path query's plan, summarized.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSummary {
    /// What the query is for.
    pub name: &'static str,
    /// The plan's nodes, outermost first (`Limit > Index Scan on usage_inbox_open_idx`).
    pub nodes: String,
    /// Rows the plan's scan nodes produced (summed over loops).
    pub rows_scanned: f64,
    /// Shared buffers hit or read.
    pub buffers: i64,
    /// Execution time in milliseconds.
    pub execution_ms: f64,
}

const ACTIVITY: &str = "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, \
     tup_inserted + tup_updated + tup_deleted AS tup_written \
     FROM pg_stat_database WHERE datname = current_database()";

const CLEAR_SNAPSHOT: &str = "SELECT pg_stat_clear_snapshot()";

const CREATE_STATEMENTS_EXTENSION: &str = "CREATE EXTENSION IF NOT EXISTS pg_stat_statements";

const STATEMENT_CALLS: &str = "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements \
     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// The new ids and key numbers of one seeding (dropped at commit).
const SEED_IDS: &str = "CREATE TEMP TABLE tollgate_seed ON COMMIT DROP AS \
     SELECT g, gen_random_uuid() AS id FROM generate_series(1, $1::bigint) AS g";

const SEED_EXECUTIONS: &str = "INSERT INTO executions \
     SELECT r.* FROM executions e CROSS JOIN tollgate_seed s \
     CROSS JOIN LATERAL jsonb_populate_record(NULL::executions, to_jsonb(e) \
         || jsonb_build_object('id', s.id, 'operation_key', e.operation_key || $3 || s.g)) AS r \
     WHERE e.scope = $1 AND e.operation_key = $2";

const SEED_RESULTS: &str = "INSERT INTO execution_results \
     SELECT r.* FROM executions e JOIN execution_results t ON t.execution_id = e.id \
     CROSS JOIN tollgate_seed s \
     CROSS JOIN LATERAL jsonb_populate_record(NULL::execution_results, to_jsonb(t) \
         || jsonb_build_object('execution_id', s.id)) AS r \
     WHERE e.scope = $1 AND e.operation_key = $2";

const SEED_SETTLEMENTS: &str = "INSERT INTO cost_settlements \
     SELECT r.* FROM executions e JOIN cost_settlements t ON t.execution_id = e.id \
     CROSS JOIN tollgate_seed s \
     CROSS JOIN LATERAL jsonb_populate_record(NULL::cost_settlements, to_jsonb(t) \
         || jsonb_build_object('settlement_id', gen_random_uuid(), 'execution_id', s.id, \
            'seq', nextval(pg_get_serial_sequence('cost_settlements', 'seq')), \
            'operation_key', t.operation_key || $3 || s.g)) AS r \
     WHERE e.scope = $1 AND e.operation_key = $2 \
     ORDER BY s.g";

const SEED_EVIDENCE: &str = "INSERT INTO usage_inbox \
     SELECT r.* FROM executions e JOIN usage_inbox t ON t.execution_id = e.id \
     CROSS JOIN tollgate_seed s \
     CROSS JOIN LATERAL jsonb_populate_record(NULL::usage_inbox, to_jsonb(t) \
         || jsonb_build_object('id', gen_random_uuid(), 'execution_id', s.id, \
            'seq', nextval(pg_get_serial_sequence('usage_inbox', 'seq')), \
            'operation_key', t.operation_key || $3 || s.g, \
            'acknowledged_at', CASE WHEN $4 THEN NULL ELSE to_jsonb(now()) END)) AS r \
     WHERE e.scope = $1 AND e.operation_key = $2 \
     ORDER BY s.g";

/// After a bulk copy: the tables vacuumed and analyzed, and a checkpoint, so neither autovacuum
/// nor the checkpointer works through the copy while a size is measured.
const SETTLE_AFTER_COPY: [&str; 2] = [
    "VACUUM (ANALYZE) executions, execution_results, cost_settlements, usage_inbox",
    "CHECKPOINT",
];

const EXECUTION_ID: &str = "SELECT id FROM executions WHERE scope = $1 AND operation_key = $2";

/// Rows a plan node and its children produced at scan nodes, and its node chain.
fn walk(plan: &serde_json::Value, nodes: &mut Vec<String>, rows: &mut f64) {
    let kind = plan["Node Type"].as_str().unwrap_or("?");
    let on = plan["Index Name"]
        .as_str()
        .or_else(|| plan["Relation Name"].as_str());
    nodes.push(match on {
        Some(on) => format!("{kind} on {on}"),
        None => kind.to_string(),
    });
    if kind.contains("Scan") {
        let actual = plan["Actual Rows"].as_f64().unwrap_or(0.0);
        let loops = plan["Actual Loops"].as_f64().unwrap_or(1.0);
        *rows += actual * loops;
    }
    if let Some(children) = plan["Plans"].as_array() {
        for child in children {
            walk(child, nodes, rows);
        }
    }
}

/// A statement of the call path and the index its plan must reach its rows through (H-12).
#[derive(Debug, Clone, Copy)]
pub struct HotStatement {
    /// What the statement is for.
    pub name: &'static str,
    /// Its text, as the store sends it.
    pub sql: &'static str,
    /// The index the plan must use.
    pub index: &'static str,
}

/// Every lookup of a call, a replay, a settlement and a reconciliation page, with its index.
pub fn hot_statements() -> Vec<HotStatement> {
    let s = |name, sql, index| HotStatement { name, sql, index };
    vec![
        s(
            "execution by key",
            sql::EXECUTION_BY_KEY,
            "executions_operation_key_scope_key",
        ),
        s(
            "view by key",
            sql::VIEW_BY_KEY,
            "executions_operation_key_scope_key",
        ),
        s(
            "views by keys, read together",
            sql::VIEWS_BY_KEYS,
            "executions_operation_key_scope_key",
        ),
        s("execution by id", sql::EXECUTION_BY_ID, "executions_pkey"),
        s("execution lock", sql::EXECUTION_LOCK, "executions_pkey"),
        s("fenced transition", sql::FENCED, "executions_pkey"),
        s("lease renewal", sql::RENEW_LEASE, "executions_pkey"),
        s("expired leases", sql::EXPIRED, "executions_open_scope_idx"),
        s(
            "rows in one state",
            sql::BY_STATE,
            "executions_state_scope_created_idx",
        ),
        s(
            "result by execution",
            sql::RESULT_BY_ID,
            "execution_results_pkey",
        ),
        s(
            "settlement by execution",
            sql::SETTLEMENT_BY_EXECUTION,
            "cost_settlements_execution_id_key",
        ),
        s(
            "evidence by execution",
            sql::EVIDENCE_OF,
            "usage_inbox_execution_idx",
        ),
        s(
            "open evidence page",
            sql::OPEN_EVIDENCE,
            "usage_inbox_open_idx",
        ),
        s(
            "evidence acknowledgement",
            sql::ACKNOWLEDGE,
            "usage_inbox_pkey",
        ),
        s("spend write", sql::SPEND_WRITE, "spend_sessions_pkey"),
        s("audit head lock", sql::AUDIT_HEAD_LOCK, "audit_heads_pkey"),
        s("api key", sql::API_KEY_BY_DIGEST, "api_keys_pkey"),
        s("api key use", sql::API_KEY_TOUCH, "api_keys_pkey"),
    ]
}

/// The generic plan of one statement: its scan nodes as `Node Type on index-or-table`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenericPlan {
    /// Every node, outermost first.
    pub nodes: Vec<String>,
    /// Every index the plan reads.
    pub indexes: Vec<String>,
}

fn collect_generic(plan: &serde_json::Value, out: &mut GenericPlan) {
    let kind = plan["Node Type"].as_str().unwrap_or("?");
    match plan["Index Name"].as_str() {
        Some(index) => {
            out.indexes.push(index.to_string());
            out.nodes.push(format!("{kind} on {index}"));
        }
        None => match plan["Relation Name"].as_str() {
            Some(table) => out.nodes.push(format!("{kind} on {table}")),
            None => out.nodes.push(kind.to_string()),
        },
    }
    if let Some(children) = plan["Plans"].as_array() {
        for child in children {
            collect_generic(child, out);
        }
    }
}

impl TestDatabase {
    /// The server's setting `name` (`current_setting`), as text.
    ///
    /// # Errors
    /// The database cannot be reached, or there is no such setting.
    pub async fn setting(&self, name: &str) -> Result<String, StoreError> {
        let mut conn = self.connection().await?;
        let value = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .store_err();
        let _ = conn.close().await;
        value
    }

    /// The database's counters now. Statistics reach `pg_stat_database` when a backend goes idle
    /// (at most about once a second), so read them a moment after the work.
    ///
    /// # Errors
    /// The database cannot be read.
    pub async fn activity(&self) -> Result<DbActivity, StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query(CLEAR_SNAPSHOT)
            .execute(&mut conn)
            .await
            .store_err()?;
        let row = sqlx::query(ACTIVITY)
            .fetch_one(&mut conn)
            .await
            .store_err()?;
        let _ = conn.close().await;
        Ok(DbActivity {
            xact_commit: row.try_get("xact_commit").store_err()?,
            xact_rollback: row.try_get("xact_rollback").store_err()?,
            tup_returned: row.try_get("tup_returned").store_err()?,
            tup_fetched: row.try_get("tup_fetched").store_err()?,
            tup_written: row.try_get("tup_written").store_err()?,
        })
    }

    /// Statements executed in this database so far, from `pg_stat_statements`; `None` when the
    /// module is not loaded (`shared_preload_libraries`) or the extension cannot be created.
    ///
    /// # Errors
    /// The database cannot be reached.
    pub async fn statement_calls(&self) -> Result<Option<i64>, StoreError> {
        let mut conn = self.connection().await?;
        if sqlx::query(CREATE_STATEMENTS_EXTENSION)
            .execute(&mut conn)
            .await
            .is_err()
        {
            return Ok(None);
        }
        let calls = sqlx::query_scalar(STATEMENT_CALLS)
            .fetch_one(&mut conn)
            .await
            .ok();
        let _ = conn.close().await;
        Ok(calls)
    }

    /// Copies the completed execution `(scope, operation_key)` — journal row, result,
    /// settlement and usage evidence — `copies` times under new ids and the keys
    /// `<operation_key><tag><n>` (n = 1..=copies), in one transaction, then vacuums and analyzes
    /// the tables and takes a checkpoint (the copy's own maintenance, before anything is measured).
    /// The copies' evidence is left unacknowledged when `open_evidence`. Audit rows are not
    /// copied (each would need its place in the hash chain). Returns the journal rows written.
    ///
    /// # Errors
    /// No such execution; the database cannot be written.
    pub async fn seed_copies(
        &self,
        scope: &str,
        operation_key: &str,
        tag: &str,
        copies: u64,
        open_evidence: bool,
    ) -> Result<u64, StoreError> {
        let copies =
            i64::try_from(copies).map_err(|_| StoreError::Unavailable("too many copies".into()))?;
        let mut conn = self.connection().await?;
        let mut tx = conn.begin().await.store_err()?;
        sqlx::query(SEED_IDS)
            .bind(copies)
            .execute(&mut *tx)
            .await
            .store_err()?;
        let written = sqlx::query(SEED_EXECUTIONS)
            .bind(scope)
            .bind(operation_key)
            .bind(tag)
            .execute(&mut *tx)
            .await
            .store_err()?
            .rows_affected();
        sqlx::query(SEED_RESULTS)
            .bind(scope)
            .bind(operation_key)
            .execute(&mut *tx)
            .await
            .store_err()?;
        for (statement, open) in [
            (SEED_SETTLEMENTS, None),
            (SEED_EVIDENCE, Some(open_evidence)),
        ] {
            let mut query = sqlx::query(statement)
                .bind(scope)
                .bind(operation_key)
                .bind(tag);
            if let Some(open) = open {
                query = query.bind(open);
            }
            query.execute(&mut *tx).await.store_err()?;
        }
        tx.commit().await.store_err()?;
        for statement in SETTLE_AFTER_COPY {
            sqlx::raw_sql(statement)
                .execute(&mut conn)
                .await
                .store_err()?;
        }
        let _ = conn.close().await;
        Ok(written)
    }

    /// `EXPLAIN (ANALYZE, BUFFERS)` of the hot-path queries, run on their real text with the
    /// execution `(scope, operation_key)` (completed, with a result, a settlement and evidence):
    /// the lookup by key, its result, settlement and evidence, a scope's open-evidence page and
    /// the scheduler's scan for scopes with work.
    ///
    /// # Errors
    /// No such execution; the database cannot be read.
    pub async fn explain_hot_path(
        &self,
        scope: &str,
        operation_key: &str,
        page: i64,
    ) -> Result<Vec<PlanSummary>, StoreError> {
        let mut conn = self.connection().await?;
        let id: uuid::Uuid = sqlx::query_scalar(EXECUTION_ID)
            .bind(scope)
            .bind(operation_key)
            .fetch_one(&mut conn)
            .await
            .store_err()?;
        let mut out = Vec::new();
        enum Args {
            ScopeKey,
            Id,
            OpenPage,
            Work,
        }
        let queries: [(&'static str, &'static str, Args); 7] = [
            ("execution by key", sql::EXECUTION_BY_KEY, Args::ScopeKey),
            ("result by execution", sql::RESULT_BY_ID, Args::Id),
            (
                "settlement by execution",
                sql::SETTLEMENT_BY_EXECUTION,
                Args::Id,
            ),
            ("evidence by execution", sql::EVIDENCE_OF, Args::Id),
            ("open evidence page", sql::OPEN_EVIDENCE, Args::OpenPage),
            ("scopes with work", sql::SCOPES_WITH_WORK, Args::Work),
            (
                "scopes with work (before H-8)",
                sql::SCOPES_WITH_WORK_FULL_SCAN,
                Args::Work,
            ),
        ];
        for (name, sql, args) in queries {
            let text = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}");
            let query = sqlx::query_scalar::<_, serde_json::Value>(&text);
            let query = match args {
                Args::ScopeKey => query.bind(scope).bind(operation_key),
                Args::Id => query.bind(id),
                Args::OpenPage => query.bind(scope).bind(0_i64).bind(page),
                Args::Work => query.bind("").bind(page),
            };
            let plan = query.fetch_one(&mut conn).await.store_err()?;
            let top = &plan[0];
            let (mut nodes, mut rows) = (Vec::new(), 0.0);
            walk(&top["Plan"], &mut nodes, &mut rows);
            let buffers = top["Plan"]["Shared Hit Blocks"].as_i64().unwrap_or(0)
                + top["Plan"]["Shared Read Blocks"].as_i64().unwrap_or(0);
            out.push(PlanSummary {
                name,
                nodes: nodes.join(" > "),
                rows_scanned: rows,
                buffers,
                execution_ms: top["Execution Time"].as_f64().unwrap_or(0.0),
            });
        }
        let _ = conn.close().await;
        Ok(out)
    }

    /// The plan a connection caches for `sql` once it stops planning per execution (`plan_cache_mode
    /// = force_generic_plan`), on this database as it is now: what a long-lived pool runs when it
    /// prepared its statements before the tables had statistics.
    ///
    /// # Errors
    /// The statement does not prepare, or the database cannot be read.
    pub async fn generic_plan(&self, sql: &str) -> Result<GenericPlan, StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query("SET plan_cache_mode = force_generic_plan")
            .execute(&mut conn)
            .await
            .store_err()?;
        sqlx::raw_sql(&format!("PREPARE tollgate_plan AS {sql}"))
            .execute(&mut conn)
            .await
            .store_err()?;
        let params: i32 = sqlx::query_scalar(
            "SELECT cardinality(parameter_types) FROM pg_prepared_statements \
             WHERE name = 'tollgate_plan'",
        )
        .fetch_one(&mut conn)
        .await
        .store_err()?;
        let nulls = vec!["NULL"; usize::try_from(params).unwrap_or(0)].join(", ");
        let explain = if nulls.is_empty() {
            "EXPLAIN (FORMAT JSON) EXECUTE tollgate_plan".to_string()
        } else {
            format!("EXPLAIN (FORMAT JSON) EXECUTE tollgate_plan({nulls})")
        };
        let plan: serde_json::Value = sqlx::query_scalar(&explain)
            .fetch_one(&mut conn)
            .await
            .store_err()?;
        let _ = conn.close().await;
        let mut out = GenericPlan {
            nodes: Vec::new(),
            indexes: Vec::new(),
        };
        collect_generic(&plan[0]["Plan"], &mut out);
        Ok(out)
    }
}
