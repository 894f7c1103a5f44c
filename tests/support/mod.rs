//! Helpers shared by the black-box tests of the built `tollgate` binary (`tests/cli.rs`,
//! `tests/service.rs`, `tests/kill.rs`, `tests/db_faults.rs`, …): running it, reading its
//! output, temporary files and directories, a fresh Postgres database per test, a `tollgate
//! serve` child on it, and seeded randomness.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// The built binary, with an environment that cannot leak the developer's database or log level.
pub fn tollgate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command
        .env_remove("DATABASE_URL")
        .env_remove("DATABASE_OWNER_URL")
        .env_remove("RUST_LOG");
    command
}

pub fn run(command: &mut Command) -> Output {
    command.output().expect("the tollgate binary runs")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts exit 0 and parses stdout as one JSON value.
pub fn json_ok(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "exit {:?}\nstderr: {}",
        output.status,
        stderr(output)
    );
    serde_json::from_str(stdout(output).trim()).unwrap_or_else(|e| {
        panic!("stdout is not one JSON value ({e}): {}", stdout(output));
    })
}

/// A file under the temp dir holding `content`, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(name: &str, content: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "tollgate-test-{}-{name}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&path, content).unwrap();
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A brand-new empty database (dropped once the returned guard is gone).
pub async fn fresh_database() -> TestDatabase {
    TestDatabase::create(&test_admin_url())
        .await
        .unwrap_or_else(|e| panic!("cannot create a test database: {e}"))
}

/// A `tollgate serve` child, killed (SIGKILL) and reaped on drop.
pub struct ServeChild(pub std::process::Child);

impl Drop for ServeChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tollgate serve` and returns it with its base URL once it answers `/readyz`.
pub async fn serve_on(config: &Path, db_url: &str) -> (ServeChild, String) {
    serve_from(config, Some(db_url)).await
}

/// Starts `tollgate serve` on the embedded default (no database) and returns it with its base
/// URL once it answers `/readyz`.
pub async fn serve_embedded(config: &Path) -> (ServeChild, String) {
    serve_from(config, None).await
}

/// The shared secret of the test clusters' members (`TOLLGATE_CLUSTER_SECRET`).
pub const CLUSTER_SECRET: &str = "the shared secret of the members of a test cluster";

/// The environment that makes `tollgate serve` a member of a cluster (spec/performance.md,
/// H-39) with `secret`: it listens on a port chosen here and names it as its `[cluster] url`.
pub fn member_env(secret: &str) -> [(&'static str, String); 3] {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    [
        ("TOLLGATE_SERVER__LISTEN", format!("127.0.0.1:{port}")),
        ("TOLLGATE_CLUSTER__URL", format!("http://127.0.0.1:{port}")),
        ("TOLLGATE_CLUSTER_SECRET", secret.to_string()),
    ]
}

/// Starts `tollgate serve` on `db_url` as a member of a cluster with `secret`
/// ([`member_env`]).
pub async fn serve_member(config: &Path, db_url: &str, secret: &str) -> (ServeChild, String) {
    serve_with(config, Some(db_url), &member_env(secret)).await
}

async fn serve_from(config: &Path, db_url: Option<&str>) -> (ServeChild, String) {
    serve_with(config, db_url, &[]).await
}

async fn serve_with(
    config: &Path,
    db_url: Option<&str>,
    env: &[(&str, String)],
) -> (ServeChild, String) {
    use std::io::{BufRead, BufReader};
    let mut command = tollgate();
    command.arg("serve").arg("--config").arg(config);
    if let Some(url) = db_url {
        command.env("DATABASE_URL", url);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let child = ServeChild(child);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("listening on ").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().into());
            }
        }
    });
    let base =
        tokio::task::spawn_blocking(move || rx.recv_timeout(std::time::Duration::from_secs(60)))
            .await
            .unwrap()
            .expect("serve starts listening");
    let http = reqwest::Client::new();
    for _ in 0..3000 {
        let ready = http.get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            return (child, base);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("serve never became ready");
}

/// `x.xx000` → `x.xx`, so that NUMERIC text and the decimal strings of reports and answers compare.
pub fn normalized(amount: &str) -> String {
    if amount.contains('.') {
        amount
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        amount.to_string()
    }
}

/// splitmix64: small, deterministic, good enough to spread fault moments and client choices from
/// one printed seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, (lo, hi): (u64, u64)) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// A temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new, empty directory named after `prefix`.
    pub fn new(prefix: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The number in the environment variable `name`, if it is set; panics, naming it, when it is
/// not a number.
pub fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

/// The value of the sample `name` in a Prometheus text: an unlabelled metric's name, or a name
/// with its labels written in (`tollgate_forwarded_calls_total{outcome="answered"}`).
pub fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// A server's `GET /metrics` text, with `key` when the route asks for one; `None` when the
/// server does not answer.
pub async fn metrics_text(http: &reqwest::Client, base: &str, key: Option<&str>) -> Option<String> {
    let mut request = http.get(format!("{base}/metrics"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.ok()?.text().await.ok()
}

/// A member's forwards so far (spec/performance.md, H-39): `[answered, unreachable]`; zeros
/// when it does not answer or counts none.
pub async fn forwards(http: &reqwest::Client, base: &str, key: Option<&str>) -> [u64; 2] {
    let text = metrics_text(http, base, key).await.unwrap_or_default();
    [
        metric(
            &text,
            "tollgate_forwarded_calls_total{outcome=\"answered\"}",
        )
        .unwrap_or(0),
        metric(
            &text,
            "tollgate_forwarded_calls_total{outcome=\"unreachable\"}",
        )
        .unwrap_or(0),
    ]
}
