//! Black-box tests of `tollgate check` (spec/storage.md — Checking a deployment, SC-215): the
//! built binary run against a healthy deployment (an application role on a migrated database)
//! and against one where each checked item is broken in turn, judged by its exit status and the
//! row it names. Each test creates its own database through the admin URL
//! `TOLLGATE_TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`).
#![cfg(test)]

mod support;

use serde_json::Value;
use std::process::Output;
use support::{fresh_database, run, stderr, stdout, tollgate, TempFile};
use tollgate_testkit::pg::cluster::{Pgbouncer, PoolMode, Replicated};
use tollgate_testkit::pg::TestDatabase;

/// The provider key variable the configurations name.
const KEY_VAR: &str = "TOLLGATE_CHECK_TEST_PROVIDER_KEY";

fn config(extra: &str) -> TempFile {
    TempFile::new(
        "check.toml",
        &format!(
            r#"
[[providers]]
name = "openai"
kind = "openai-chat"
base_url = "http://127.0.0.1:9"
api_key_env = "{KEY_VAR}"
{extra}
"#
        ),
    )
}

/// `tollgate --json check --config FILE` with `DATABASE_URL` = `url` and the key variable set
/// unless `key` is false.
fn check(config: &TempFile, url: Option<&str>, key: bool) -> Output {
    let mut command = tollgate();
    command
        .args(["--json", "check", "--config"])
        .arg(&config.0)
        .env_remove(KEY_VAR);
    if key {
        command.env(KEY_VAR, "sk-test-not-a-secret");
    }
    if let Some(url) = url {
        command.env("DATABASE_URL", url);
    }
    run(&mut command)
}

/// The rows by name: `(status, detail)`.
fn rows(output: &Output) -> Vec<(String, String, String)> {
    let report: Value = serde_json::from_str(stdout(output).trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}): {}\nstderr: {}",
            stdout(output),
            stderr(output)
        )
    });
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
                c["detail"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn status_of(output: &Output, name: &str) -> String {
    rows(output)
        .into_iter()
        .find(|(n, _, _)| n == name)
        .unwrap_or_else(|| panic!("no row {name}: {}", stdout(output)))
        .1
}

/// Asserts the command failed and named `name` as a FAIL row and on stderr.
fn assert_fails_naming(output: &Output, name: &str) {
    assert!(
        !output.status.success(),
        "check passed:\n{}",
        stdout(output)
    );
    assert_eq!(status_of(output, name), "FAIL", "{}", stdout(output));
    assert!(
        stderr(output).contains(name),
        "stderr does not name {name}: {}",
        stderr(output)
    );
}

async fn migrated() -> TestDatabase {
    let db = fresh_database().await;
    db.stores(2).await.unwrap().migrate().await.unwrap();
    db
}

fn with_options(url: &str, options: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options={options}")
}

#[tokio::test]
async fn sc_215_a_healthy_deployment_passes_with_warnings_only() {
    let db = migrated().await;
    let app = db.app_role_url().await.unwrap();
    let output = check(&config(""), Some(&app), true);
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status,
        stdout(&output),
        stderr(&output)
    );
    let rows = rows(&output);
    let names: Vec<&str> = rows.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "config",
            "provider_keys",
            "database",
            "sessions",
            "migrations",
            "role",
            "durability",
            "standby",
            "connections",
            "clock"
        ]
    );
    for (name, status, detail) in &rows {
        let expected: &[&str] = match name.as_str() {
            // No standby on the test server; other tests may hold connections.
            "standby" => &["warn"],
            "connections" => &["ok", "warn"],
            _ => &["ok"],
        };
        assert!(
            expected.contains(&status.as_str()),
            "{name}: {status} ({detail})"
        );
    }
    assert!(!stdout(&output).contains("sk-test-not-a-secret"));
}

#[test]
fn sc_215_a_config_that_does_not_parse_fails() {
    let bad = TempFile::new("bad.toml", "[[[providers\nname = ");
    assert_fails_naming(&check(&bad, None, true), "config");
}

#[test]
fn sc_215_an_unset_provider_key_variable_fails() {
    let output = check(&config(""), None, false);
    assert_fails_naming(&output, "provider_keys");
    assert_eq!(status_of(&output, "config"), "ok");
    assert!(stdout(&output).contains(KEY_VAR));
}

#[test]
fn sc_215_an_unreachable_database_fails_without_showing_the_password() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("postgres://app:pa55word-not-shown@127.0.0.1:{port}/tollgate");
    let output = check(&config(""), Some(&url), true);
    assert_fails_naming(&output, "database");
    for text in [stdout(&output), stderr(&output)] {
        assert!(!text.contains("pa55word-not-shown"), "{text}");
    }
}

#[tokio::test]
async fn sc_215_a_database_without_migrations_fails() {
    let db = fresh_database().await;
    assert_fails_naming(&check(&config(""), Some(db.url()), true), "migrations");
}

#[tokio::test]
async fn sc_215_connecting_as_the_tables_owner_fails_the_role() {
    let db = migrated().await;
    let output = check(&config(""), Some(db.url()), true);
    assert_fails_naming(&output, "role");
    assert_eq!(status_of(&output, "migrations"), "ok");
}

#[tokio::test]
async fn sc_215_a_pool_above_the_servers_connections_fails() {
    let db = migrated().await;
    let app = db.app_role_url().await.unwrap();
    let output = check(
        &config("[database]\nmax_connections = 1000\n"),
        Some(&app),
        true,
    );
    assert_fails_naming(&output, "connections");
}

#[tokio::test]
async fn sc_215_synchronous_commit_off_fails_durability() {
    let db = migrated().await;
    let app = db.app_role_url().await.unwrap();
    let url = with_options(&app, "-c%20synchronous_commit%3Doff");
    let output = check(&config(""), Some(&url), true);
    assert_fails_naming(&output, "durability");
    assert_eq!(status_of(&output, "role"), "ok");
}

/// Behind pgbouncer in `pool_mode = transaction` two connections share one server session:
/// `tollgate check` fails the sessions row and `tollgate serve` refuses to start, both naming
/// `pool_mode = session`; in `pool_mode = session` the row passes.
#[tokio::test]
async fn sc_217_a_pooler_per_transaction_fails_check_and_is_refused_by_serve() {
    let db = migrated().await;
    let per_transaction = Pgbouncer::in_front_of(db.url(), PoolMode::Transaction)
        .await
        .unwrap();
    let url = per_transaction.url(db.name());
    let output = check(&config(""), Some(&url), true);
    assert_fails_naming(&output, "sessions");
    assert!(
        stdout(&output).contains("pool_mode = session"),
        "{}",
        stdout(&output)
    );

    let serve = run(tollgate()
        .args(["serve", "--config"])
        .arg(&config("").0)
        .env(KEY_VAR, "sk-test-not-a-secret")
        .env("DATABASE_URL", &url));
    assert!(
        !serve.status.success(),
        "serve started behind a pooler per transaction"
    );
    assert!(
        stderr(&serve).contains("pool_mode = session"),
        "{}",
        stderr(&serve)
    );

    let per_session = Pgbouncer::in_front_of(db.url(), PoolMode::Session)
        .await
        .unwrap();
    let output = check(&config(""), Some(&per_session.url(db.name())), true);
    assert_eq!(status_of(&output, "sessions"), "ok", "{}", stdout(&output));
    assert_eq!(
        status_of(&output, "migrations"),
        "ok",
        "{}",
        stdout(&output)
    );

    // A pgbouncer that refuses the driver's startup parameter: named, with the setting.
    let strict = Pgbouncer::in_front_of_ignoring(db.url(), PoolMode::Session, "")
        .await
        .unwrap();
    let output = check(&config(""), Some(&strict.url(db.name())), true);
    assert_fails_naming(&output, "database");
    assert!(
        stdout(&output).contains("ignore_startup_parameters"),
        "{}",
        stdout(&output)
    );
}

/// A URL naming a primary and its synchronous standby: `tollgate check` reaches the primary
/// (the host that accepts writes, whichever comes first in the list) and passes the standby row.
#[tokio::test]
async fn sc_216_check_finds_the_primary_and_its_synchronous_standby_in_a_list_of_hosts() {
    let replicated = Replicated::start().await.unwrap();
    replicated.create_database("tollgate_check").await.unwrap();
    let both = replicated.url("tollgate_check");
    let migrated = run(tollgate().arg("migrate").env("DATABASE_URL", &both));
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    // The standby first: the check skips it and reads the primary.
    let (hosts, rest) = both
        .trim_start_matches("postgres://postgres@")
        .split_once('/')
        .unwrap();
    let (primary, standby) = hosts.split_once(',').unwrap();
    let standby_first = format!("postgres://postgres@{standby},{primary}/{rest}");
    for url in [both.as_str(), standby_first.as_str()] {
        let output = check(&config(""), Some(url), true);
        assert_eq!(status_of(&output, "database"), "ok", "{}", stdout(&output));
        assert_eq!(status_of(&output, "standby"), "ok", "{}", stdout(&output));
        assert_eq!(
            status_of(&output, "migrations"),
            "ok",
            "{}",
            stdout(&output)
        );
    }
    // The standby alone is no place to run.
    let alone = check(
        &config(""),
        Some(&replicated.standby_url("tollgate_check")),
        true,
    );
    assert_fails_naming(&alone, "database");
    assert!(stdout(&alone).contains("standby"), "{}", stdout(&alone));
}
