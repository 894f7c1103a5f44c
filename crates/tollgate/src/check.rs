//! `tollgate check [--config FILE]`: what an operator runs before going live (spec/storage.md —
//! Checking a deployment, SC-215). One row per check, in a fixed order: `ok`, `warn` or `FAIL`
//! with a short detail that never holds a secret or a URL's password. Any `FAIL` exits 1;
//! warnings alone exit 0. The database's facts come from `tollgate_postgres::check` (all SQL
//! lives there); this module only judges and prints them.

use crate::error::CommandError;
use crate::print;
use std::path::PathBuf;
use std::time::Duration;
use tollgate_postgres::check::{database_facts, DatabaseFacts};
use tollgate_server::config::{Env, FileConfig, POOL_CONNECTIONS_DEFAULT};
use tollgate_server::start::Options;

/// Longest wait for the database's connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest disagreement of the host's clock with the database's, beyond half the round trip.
pub const CLOCK_BOUND_MS: i64 = 1_000;
/// Base URL the built-in provider gets while an embedded configuration is validated (nothing is
/// sent to it).
const EMBEDDED_PLACEHOLDER_URL: &str = "http://127.0.0.1:9";

/// The names of the rows, in order.
pub const CHECKS: [&str; 10] = [
    "config",
    "provider_keys",
    "database",
    "sessions",
    "migrations",
    "role",
    "durability",
    "standby",
    "connections",
    "clock",
];

/// A row's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Holds.
    Ok,
    /// Worth knowing; does not fail the command.
    Warn,
    /// Would break a guarantee; the command exits 1.
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// One of [`CHECKS`].
    pub name: &'static str,
    /// The verdict.
    pub status: Status,
    /// What was found (no secret, no URL).
    pub detail: String,
}

fn row(name: &'static str, status: Status, detail: impl Into<String>) -> Row {
    Row {
        name,
        status,
        detail: redact(&detail.into()),
    }
}

/// `detail` with the password of any URL in it (`scheme://user:password@…`) and any
/// `password=…` replaced by `***`.
fn redact(detail: &str) -> String {
    let mut out = String::with_capacity(detail.len());
    let mut rest = detail;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail.find(['/', ' ', '"', '\'', '?']).unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(user_end), Some(colon)) if colon < user_end => {
                out.push_str(&authority[..=colon]);
                out.push_str("***");
                out.push_str(&authority[user_end..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    let mut redacted = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find("password=") {
        let (head, tail) = rest.split_at(at + "password=".len());
        redacted.push_str(head);
        redacted.push_str("***");
        let end = tail.find([' ', '&', '"', '\'']).unwrap_or(tail.len());
        rest = &tail[end..];
    }
    redacted.push_str(rest);
    redacted
}

/// What the configuration says, for the rows that follow it.
struct Configured {
    database_url: Option<String>,
    max_connections: u32,
}

/// `tollgate check [--config FILE] [--json]`.
///
/// # Errors
/// [`CommandError::CheckFailed`] naming the rows that FAIL (after printing the table).
pub async fn run(config: Option<PathBuf>, json: bool) -> Result<(), CommandError> {
    let options = Options::from_process(config);
    let rows = check(&options).await;
    if json {
        let checks: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name, "status": r.status.as_str(), "detail": r.detail
                })
            })
            .collect();
        let ok = !rows.iter().any(|r| r.status == Status::Fail);
        print::json(&serde_json::json!({ "ok": ok, "checks": checks }));
    } else {
        for line in table(&rows) {
            print::line(&line);
        }
    }
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.status == Status::Fail)
        .map(|r| r.name)
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CommandError::CheckFailed(format!(
            "check failed: {}",
            failed.join(", ")
        )))
    }
}

/// The table's lines: a header, then one line per row.
fn table(rows: &[Row]) -> Vec<String> {
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(5).max(5);
    let mut lines = vec![format!("{:<width$}  {:<6}  detail", "check", "status")];
    lines.extend(
        rows.iter()
            .map(|r| format!("{:<width$}  {:<6}  {}", r.name, r.status.as_str(), r.detail)),
    );
    lines
}

/// Every row, in the order of [`CHECKS`].
async fn check(options: &Options) -> Vec<Row> {
    let mut rows = Vec::with_capacity(CHECKS.len());
    let file = match FileConfig::load(options.config.as_deref(), &options.env) {
        Ok(file) => file,
        Err(e) => {
            rows.push(row("config", Status::Fail, format!("does not parse: {e}")));
            skip_from(&mut rows, "provider_keys", "not checked: no configuration");
            return rows;
        }
    };
    let (keys, env) = provider_keys(&file, &options.env);
    let (config, configured) = validated(file, &env);
    rows.push(config);
    rows.push(keys);
    match configured.database_url {
        None => {
            rows.push(row(
                "database",
                Status::Warn,
                "no database configured ([database] url or DATABASE_URL): the stores are in \
                 memory and lost on exit",
            ));
            skip_from(&mut rows, "migrations", "skipped: no database");
        }
        Some(url) => match database_facts(&url, CONNECT_TIMEOUT).await {
            Err(e) => {
                rows.push(row("database", Status::Fail, format!("unreachable: {e}")));
                skip_from(
                    &mut rows,
                    "migrations",
                    "not checked: the database is unreachable",
                );
            }
            Ok(facts) => rows.extend(judge_database(&facts, configured.max_connections)),
        },
    }
    rows
}

/// Appends a `warn` row saying `why` for every check from `first` on.
fn skip_from(rows: &mut Vec<Row>, first: &str, why: &str) {
    let start = CHECKS.iter().position(|c| *c == first).unwrap_or(0);
    rows.extend(
        CHECKS[start..]
            .iter()
            .map(|name| row(name, Status::Warn, why)),
    );
}

/// The provider keys row, and the environment with a placeholder for every unset key
/// variable, so that validation reports the configuration's other problems.
fn provider_keys(file: &FileConfig, env: &Env) -> (Row, Env) {
    let mut env = env.clone();
    let mut unset = Vec::new();
    let mut named = 0;
    for provider in &file.providers {
        let Some(var) = &provider.api_key_env else {
            continue;
        };
        named += 1;
        if env.get(var).is_none_or(String::is_empty) {
            unset.push(format!("{var} (provider {})", provider.name));
            env.insert(var.clone(), "placeholder".into());
        }
    }
    let keyless = file.providers.len() - named;
    let row = if !unset.is_empty() {
        row(
            "provider_keys",
            Status::Fail,
            format!("unset or empty: {}", unset.join(", ")),
        )
    } else if file.providers.is_empty() {
        row("provider_keys", Status::Ok, "no providers configured")
    } else {
        row(
            "provider_keys",
            Status::Ok,
            format!("{named} key variable(s) set; {keyless} provider(s) without api_key_env"),
        )
    };
    (row, env)
}

/// The config row, and what the rows after it need.
fn validated(mut file: FileConfig, env: &Env) -> (Row, Configured) {
    let embedded = file.is_embedded();
    let mut configured = Configured {
        database_url: file.database.url.as_ref().map(|u| u.expose().to_string()),
        max_connections: file
            .database
            .max_connections
            .unwrap_or(POOL_CONNECTIONS_DEFAULT),
    };
    if embedded {
        if let Err(e) = tollgate_server::embedded::extend(&mut file, EMBEDDED_PLACEHOLDER_URL) {
            return (
                row("config", Status::Fail, format!("invalid: {e}")),
                configured,
            );
        }
    }
    match file.validate(env) {
        Err(e) => (
            row("config", Status::Fail, format!("invalid: {e}")),
            configured,
        ),
        Ok(settings) => {
            configured.max_connections = settings.max_connections;
            let store = if embedded { "in memory" } else { "Postgres" };
            (
                row(
                    "config",
                    Status::Ok,
                    format!(
                        "{} profile(s), {} provider(s), {} configured key(s); stores {store}",
                        settings.profiles.len(),
                        settings.providers.len(),
                        settings.keys.len()
                    ),
                ),
                configured,
            )
        }
    }
}

/// The database rows (from `database` on) for `facts`, with `pool` the configured
/// `[database] max_connections`.
pub fn judge_database(facts: &DatabaseFacts, pool: u32) -> Vec<Row> {
    let reached = format!(
        "PostgreSQL {}, database {} as role {}",
        facts.server_version, facts.database, facts.user
    );
    vec![
        if facts.accepts_writes {
            row("database", Status::Ok, reached)
        } else {
            row(
                "database",
                Status::Fail,
                format!("{reached}: a standby or read-only, where tollgate cannot write"),
            )
        },
        sessions(facts),
        migrations(facts),
        role(facts),
        durability(facts),
        standby(facts),
        connections(facts, pool),
        clock(facts),
    ]
}

fn sessions(facts: &DatabaseFacts) -> Row {
    if facts.shared_sessions {
        row(
            "sessions",
            Status::Fail,
            tollgate_postgres::hosts::SHARED_SESSIONS,
        )
    } else {
        row(
            "sessions",
            Status::Ok,
            "each connection has a server session of its own",
        )
    }
}

fn migrations(facts: &DatabaseFacts) -> Row {
    if facts.migrations_pending > 0 {
        row(
            "migrations",
            Status::Fail,
            format!(
                "{} of {} migrations not applied: run `tollgate migrate` as the owner",
                facts.migrations_pending, facts.migrations_embedded
            ),
        )
    } else if facts.definitions_pending {
        row(
            "migrations",
            Status::Fail,
            "the SQL functions are not this build's: run `tollgate migrate` as the owner",
        )
    } else {
        row(
            "migrations",
            Status::Ok,
            format!(
                "{} migrations applied; SQL functions current",
                facts.migrations_embedded
            ),
        )
    }
}

fn role(facts: &DatabaseFacts) -> Row {
    let user = &facts.user;
    let owners = facts.table_owners.join(", ");
    if facts.superuser {
        return row(
            "role",
            Status::Fail,
            format!("role {user} is a superuser: it can alter the tables and the audit log"),
        );
    }
    let Some(owns) = facts.owns_tables else {
        return row(
            "role",
            Status::Warn,
            "not checked: no tables (migrations not applied)",
        );
    };
    if owns {
        return row(
            "role",
            Status::Fail,
            format!(
                "role {user} owns the tables (owner {owners}): connect as a login role in \
                 tollgate_app"
            ),
        );
    }
    let mut may = Vec::new();
    for (privilege, granted) in [
        ("UPDATE", facts.audit_update),
        ("DELETE", facts.audit_delete),
        ("TRUNCATE", facts.audit_truncate),
    ] {
        match granted {
            Some(true) => may.push(privilege),
            Some(false) => {}
            None => {
                return row("role", Status::Fail, "no audit_log table");
            }
        }
    }
    if may.is_empty() {
        row(
            "role",
            Status::Ok,
            format!(
                "role {user} does not own the tables (owner {owners}) and may not UPDATE, \
                 DELETE or TRUNCATE audit_log"
            ),
        )
    } else {
        row(
            "role",
            Status::Fail,
            format!("role {user} may {} audit_log", may.join(", ")),
        )
    }
}

fn durability(facts: &DatabaseFacts) -> Row {
    let found = format!(
        "fsync={}, full_page_writes={}, synchronous_commit={}",
        facts.fsync, facts.full_page_writes, facts.synchronous_commit
    );
    let mut off = Vec::new();
    if facts.fsync != "on" {
        off.push("fsync");
    }
    if facts.full_page_writes != "on" {
        off.push("full_page_writes");
    }
    if facts.synchronous_commit == "off" {
        off.push("synchronous_commit");
    }
    if !off.is_empty() {
        row(
            "durability",
            Status::Fail,
            format!(
                "{found}: {} must be on, or a committed call can be lost",
                off.join(", ")
            ),
        )
    } else if facts.synchronous_commit == "local" {
        row(
            "durability",
            Status::Warn,
            format!("{found}: commits do not wait for a synchronous standby"),
        )
    } else {
        row("durability", Status::Ok, found)
    }
}

fn standby(facts: &DatabaseFacts) -> Row {
    let names = facts.synchronous_standby_names.trim();
    if names.is_empty() {
        row(
            "standby",
            Status::Warn,
            "no synchronous standby (synchronous_standby_names is empty): a failover can lose \
             acknowledged claims and settlements",
        )
    } else if facts.sync_standbys > 0 {
        row(
            "standby",
            Status::Ok,
            format!(
                "{} synchronous standby(s) of {} connected (synchronous_standby_names = {names})",
                facts.sync_standbys, facts.standbys
            ),
        )
    } else if facts.hidden_standbys > 0 {
        row(
            "standby",
            Status::Warn,
            format!(
                "{} standby(s) connected, sync state not readable by role {} (grant \
                 pg_read_all_stats to see it)",
                facts.hidden_standbys, facts.user
            ),
        )
    } else {
        row(
            "standby",
            Status::Warn,
            format!(
                "synchronous_standby_names = {names} but no synchronous standby is connected: \
                 commits wait until one is"
            ),
        )
    }
}

fn connections(facts: &DatabaseFacts, pool: u32) -> Row {
    let reserved = facts.superuser_reserved_connections + facts.reserved_connections;
    let admitted = facts.max_connections - reserved;
    let free = admitted - facts.connections_in_use;
    let pool = i64::from(pool);
    let found = format!(
        "[database] max_connections = {pool}; the server admits {admitted} (max_connections {} \
         − {reserved} reserved), {} in use",
        facts.max_connections, facts.connections_in_use
    );
    if pool > admitted {
        row(
            "connections",
            Status::Fail,
            format!("{found}: the pool alone exceeds it; each instance adds its own pool"),
        )
    } else if pool > free {
        row(
            "connections",
            Status::Warn,
            format!("{found}: only {free} free now; each instance adds its own pool"),
        )
    } else {
        row(
            "connections",
            Status::Ok,
            format!("{found}; each instance (serve, scheduler) adds its own pool"),
        )
    }
}

fn clock(facts: &DatabaseFacts) -> Row {
    let round_trip = facts.host_after - facts.host_before;
    let midpoint = facts.host_before + round_trip / 2;
    let offset_ms = (facts.database_now - midpoint).num_milliseconds();
    let slack_ms = round_trip.num_milliseconds() / 2;
    let found = format!(
        "the database's clock is {offset_ms} ms from the host's (round trip {} ms, bound \
         {CLOCK_BOUND_MS} ms)",
        round_trip.num_milliseconds()
    );
    if offset_ms.abs() - slack_ms > CLOCK_BOUND_MS {
        row("clock", Status::Fail, found)
    } else {
        row("clock", Status::Ok, found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeDelta, Utc};

    fn healthy() -> DatabaseFacts {
        let now = Utc::now();
        DatabaseFacts {
            server_version: "15.2".into(),
            database: "tollgate".into(),
            user: "tollgate_server".into(),
            superuser: false,
            migrations_embedded: 30,
            migrations_pending: 0,
            definitions_pending: false,
            table_owners: vec!["tollgate_owner".into()],
            owns_tables: Some(false),
            audit_update: Some(false),
            audit_delete: Some(false),
            audit_truncate: Some(false),
            fsync: "on".into(),
            full_page_writes: "on".into(),
            synchronous_commit: "on".into(),
            synchronous_standby_names: "standby1".into(),
            standbys: 1,
            sync_standbys: 1,
            hidden_standbys: 0,
            max_connections: 100,
            superuser_reserved_connections: 3,
            reserved_connections: 0,
            connections_in_use: 10,
            accepts_writes: true,
            shared_sessions: false,
            host_before: now,
            database_now: now + TimeDelta::milliseconds(2),
            host_after: now + TimeDelta::milliseconds(4),
        }
    }

    fn status(rows: &[Row], name: &str) -> Status {
        rows.iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no row {name}"))
            .status
    }

    #[test]
    fn sc_215_healthy_facts_pass_every_row() {
        let rows = judge_database(&healthy(), 16);
        assert_eq!(
            rows.iter().map(|r| r.name).collect::<Vec<_>>(),
            CHECKS[2..].to_vec()
        );
        assert!(rows.iter().all(|r| r.status == Status::Ok), "{rows:#?}");
    }

    #[test]
    fn sc_215_fsync_or_full_page_writes_off_fails_durability() {
        for facts in [
            DatabaseFacts {
                fsync: "off".into(),
                ..healthy()
            },
            DatabaseFacts {
                full_page_writes: "off".into(),
                ..healthy()
            },
            DatabaseFacts {
                synchronous_commit: "off".into(),
                ..healthy()
            },
        ] {
            let rows = judge_database(&facts, 16);
            assert_eq!(status(&rows, "durability"), Status::Fail, "{rows:#?}");
        }
        let local = DatabaseFacts {
            synchronous_commit: "local".into(),
            ..healthy()
        };
        assert_eq!(
            status(&judge_database(&local, 16), "durability"),
            Status::Warn
        );
    }

    #[test]
    fn sc_216_a_standby_fails_the_database_row() {
        let rows = judge_database(
            &DatabaseFacts {
                accepts_writes: false,
                ..healthy()
            },
            16,
        );
        assert_eq!(status(&rows, "database"), Status::Fail);
    }

    #[test]
    fn sc_217_shared_server_sessions_fail_naming_the_pool_mode() {
        let rows = judge_database(
            &DatabaseFacts {
                shared_sessions: true,
                ..healthy()
            },
            16,
        );
        assert_eq!(status(&rows, "sessions"), Status::Fail);
        let detail = &rows.iter().find(|r| r.name == "sessions").unwrap().detail;
        assert!(detail.contains("pool_mode = session"), "{detail}");
    }

    #[test]
    fn sc_215_no_synchronous_standby_warns() {
        for facts in [
            DatabaseFacts {
                synchronous_standby_names: String::new(),
                sync_standbys: 0,
                standbys: 0,
                ..healthy()
            },
            DatabaseFacts {
                sync_standbys: 0,
                ..healthy()
            },
            DatabaseFacts {
                sync_standbys: 0,
                hidden_standbys: 1,
                ..healthy()
            },
        ] {
            assert_eq!(status(&judge_database(&facts, 16), "standby"), Status::Warn);
        }
    }

    #[test]
    fn sc_215_a_superuser_or_audit_rights_fail_the_role() {
        for facts in [
            DatabaseFacts {
                superuser: true,
                ..healthy()
            },
            DatabaseFacts {
                owns_tables: Some(true),
                ..healthy()
            },
            DatabaseFacts {
                audit_delete: Some(true),
                ..healthy()
            },
            DatabaseFacts {
                audit_update: Some(true),
                ..healthy()
            },
        ] {
            assert_eq!(status(&judge_database(&facts, 16), "role"), Status::Fail);
        }
    }

    #[test]
    fn sc_215_pools_and_clocks_are_judged_against_their_bounds() {
        assert_eq!(
            status(&judge_database(&healthy(), 98), "connections"),
            Status::Fail
        );
        assert_eq!(
            status(&judge_database(&healthy(), 97), "connections"),
            Status::Warn
        );
        let now = Utc::now();
        let skewed = DatabaseFacts {
            host_before: now,
            database_now: now + TimeDelta::milliseconds(1_500),
            host_after: now + TimeDelta::milliseconds(2),
            ..healthy()
        };
        assert_eq!(status(&judge_database(&skewed, 16), "clock"), Status::Fail);
        // A slow round trip widens the bound by half of it.
        let slow = DatabaseFacts {
            host_before: now,
            database_now: now + TimeDelta::milliseconds(2_500),
            host_after: now + TimeDelta::milliseconds(3_000),
            ..healthy()
        };
        assert_eq!(status(&judge_database(&slow, 16), "clock"), Status::Ok);
    }

    #[test]
    fn sc_215_details_hold_no_url_password() {
        assert_eq!(
            redact("cannot read postgres://app:s3cret@db:5432/x and password=hunter2 end"),
            "cannot read postgres://app:***@db:5432/x and password=*** end"
        );
        assert_eq!(redact("http://127.0.0.1:9/v1"), "http://127.0.0.1:9/v1");
    }
}
