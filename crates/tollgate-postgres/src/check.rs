//! The facts `tollgate check` judges (spec/storage.md — Checking a deployment, SC-215): what
//! the database says about itself, its schema, the connecting role, its durability settings, its
//! standbys, its connection slots, its clock, and whether a pooler in front shares server
//! sessions. Read-only: every statement here is a `SELECT` on a connection opened as the
//! stores open theirs (to the URL's host that accepts writes, with the stores' session bounds),
//! so the settings read are the ones the server's own connections get.

use crate::error::{db, sqlstate, DbResultExt, UNDEFINED_TABLE};
use crate::hosts::{accepts_writes, close_quickly, sessions_shared, Target};
use crate::{definitions, SessionTimeouts, MIGRATOR};
use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use std::time::Duration;
use tollgate_store::StoreError;

/// What the database reports, as plain values. `None` where the schema is not there to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseFacts {
    /// `server_version`.
    pub server_version: String,
    /// `current_database()`.
    pub database: String,
    /// `current_user`: the role the server connects as.
    pub user: String,
    /// Whether that role is a superuser.
    pub superuser: bool,
    /// Versioned migrations embedded in this build.
    pub migrations_embedded: usize,
    /// Of those, how many the database has not applied (all of them without a migrations table).
    pub migrations_pending: usize,
    /// Whether the SQL functions' recorded digest differs from this build's sources.
    pub definitions_pending: bool,
    /// The owners of the tables in the schema of `executions`; empty when there is no such table.
    pub table_owners: Vec<String>,
    /// Whether the role owns a table of that schema, or is a member of a role that does;
    /// `None` without `executions`.
    pub owns_tables: Option<bool>,
    /// Whether the role may `UPDATE` `audit_log`; `None` without the table.
    pub audit_update: Option<bool>,
    /// Whether the role may `DELETE` from `audit_log`; `None` without the table.
    pub audit_delete: Option<bool>,
    /// Whether the role may `TRUNCATE` `audit_log`; `None` without the table.
    pub audit_truncate: Option<bool>,
    /// `fsync`.
    pub fsync: String,
    /// `full_page_writes`.
    pub full_page_writes: String,
    /// `synchronous_commit` as the role's sessions see it.
    pub synchronous_commit: String,
    /// `synchronous_standby_names`.
    pub synchronous_standby_names: String,
    /// Rows of `pg_stat_replication`.
    pub standbys: i64,
    /// Of those, with `sync_state` `sync` or `quorum`.
    pub sync_standbys: i64,
    /// Of those, whose `sync_state` the role may not read (it lacks `pg_read_all_stats`).
    pub hidden_standbys: i64,
    /// `max_connections`.
    pub max_connections: i64,
    /// `superuser_reserved_connections`.
    pub superuser_reserved_connections: i64,
    /// `reserved_connections` (Postgres 16 and later; 0 before).
    pub reserved_connections: i64,
    /// Client connections open now, other than this one.
    pub connections_in_use: i64,
    /// Whether the server accepts writes (neither a standby nor read-only by default).
    pub accepts_writes: bool,
    /// Whether two open connections share one server session (a pooler per transaction in
    /// front of the database: `hosts::sessions_shared`).
    pub shared_sessions: bool,
    /// The host's clock just before the database's clock was read.
    pub host_before: DateTime<Utc>,
    /// `clock_timestamp()` of the database.
    pub database_now: DateTime<Utc>,
    /// The host's clock just after the answer came.
    pub host_after: DateTime<Utc>,
}

type Settings = (String, String, String, String, i64, i64, i64, i64);

/// Connects once to `url` (within `connect_timeout`) and reads the facts.
///
/// # Errors
/// [`StoreError::Unavailable`] when the URL is not valid, the database cannot be reached in
/// time, or a catalog read fails; the message never holds the URL.
pub async fn database_facts(
    url: &str,
    connect_timeout: Duration,
) -> Result<DatabaseFacts, StoreError> {
    let target = Target::new(url, SessionTimeouts::default())?;
    let mut conn = tokio::time::timeout(connect_timeout, target.find_writable())
        .await
        .map_err(|_| {
            StoreError::Unavailable(format!(
                "no connection within {} ms",
                connect_timeout.as_millis()
            ))
        })??;
    let facts = read(&mut conn).await;
    let writable = accepts_writes(&mut conn).await;
    let shared_sessions = sessions_shared(&mut conn, &target).await;
    close_quickly(conn).await;
    Ok(DatabaseFacts {
        accepts_writes: writable?,
        shared_sessions: shared_sessions?,
        ..facts?
    })
}

async fn read(conn: &mut PgConnection) -> Result<DatabaseFacts, StoreError> {
    let (server_version, database, user, superuser): (String, String, String, bool) =
        sqlx::query_as(
            "SELECT current_setting('server_version'), current_database()::text, \
             current_user::text, COALESCE((SELECT rolsuper FROM pg_roles \
             WHERE rolname = current_user), false)",
        )
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    let applied: Vec<i64> =
        match sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&mut *conn)
            .await
        {
            Ok(applied) => applied,
            Err(e) if sqlstate(&e).as_deref() == Some(UNDEFINED_TABLE) => Vec::new(),
            Err(e) => return Err(db(e)),
        };
    let embedded: Vec<i64> = MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| m.version)
        .collect();
    let recorded: Option<String> =
        match sqlx::query_scalar("SELECT digest FROM tollgate_definitions WHERE singleton")
            .fetch_optional(&mut *conn)
            .await
        {
            Ok(recorded) => recorded,
            Err(e) if sqlstate(&e).as_deref() == Some(UNDEFINED_TABLE) => None,
            Err(e) => return Err(db(e)),
        };
    let (owners, owns_tables): (Vec<String>, Option<bool>) = sqlx::query_as(
        "SELECT COALESCE(array_agg(DISTINCT pg_get_userbyid(c.relowner)::text) \
         FILTER (WHERE c.oid IS NOT NULL), '{}'), \
         bool_or(pg_has_role(current_user, c.relowner, 'MEMBER')) \
         FROM pg_class c \
         WHERE c.relkind IN ('r', 'p') AND c.relnamespace = \
         (SELECT relnamespace FROM pg_class WHERE oid = to_regclass('executions'))",
    )
    .fetch_one(&mut *conn)
    .await
    .store_err()?;
    let (audit_update, audit_delete, audit_truncate): (Option<bool>, Option<bool>, Option<bool>) =
        sqlx::query_as(
            "SELECT has_table_privilege(to_regclass('audit_log'), 'UPDATE'), \
             has_table_privilege(to_regclass('audit_log'), 'DELETE'), \
             has_table_privilege(to_regclass('audit_log'), 'TRUNCATE')",
        )
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    let settings: Settings = sqlx::query_as(
        "SELECT current_setting('fsync'), current_setting('full_page_writes'), \
         current_setting('synchronous_commit'), current_setting('synchronous_standby_names'), \
         current_setting('max_connections')::int8, \
         current_setting('superuser_reserved_connections')::int8, \
         COALESCE(current_setting('reserved_connections', true)::int8, 0), \
         (SELECT count(*) FROM pg_stat_activity \
          WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())",
    )
    .fetch_one(&mut *conn)
    .await
    .store_err()?;
    let (standbys, sync_standbys, hidden_standbys): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')), \
         count(*) FILTER (WHERE sync_state IS NULL) FROM pg_stat_replication",
    )
    .fetch_one(&mut *conn)
    .await
    .store_err()?;
    let host_before = Utc::now();
    let database_now: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    let host_after = Utc::now();
    let (
        fsync,
        full_page_writes,
        synchronous_commit,
        synchronous_standby_names,
        max_connections,
        superuser_reserved_connections,
        reserved_connections,
        connections_in_use,
    ) = settings;
    Ok(DatabaseFacts {
        server_version,
        database,
        user,
        superuser,
        migrations_embedded: embedded.len(),
        migrations_pending: embedded.iter().filter(|v| !applied.contains(v)).count(),
        definitions_pending: definitions::is_pending(recorded.as_deref()),
        table_owners: owners,
        owns_tables,
        audit_update,
        audit_delete,
        audit_truncate,
        fsync,
        full_page_writes,
        synchronous_commit,
        synchronous_standby_names,
        standbys,
        sync_standbys,
        hidden_standbys,
        max_connections,
        superuser_reserved_connections,
        reserved_connections,
        connections_in_use,
        accepts_writes: true,
        shared_sessions: false,
        host_before,
        database_now,
        host_after,
    })
}
