//! The performance harness: tollgate against the machine's own limit, in one run.
//!
//! `cargo bench -p tollgate --bench harness` (spec/performance.md):
//!
//! 1. **pgbench** (Debian's `postgresql-contrib` client; the harness stops with a clear message
//!    when it is missing) on a scratch database of the same Postgres: TPC-B at 1 and 8 clients,
//!    select-only at 16; and the design's own ceiling: pgbench driving the claim and settlement
//!    functions of a first call (`benches/probe/db_only.sql`) at 8 clients on a migrated database,
//!    with no application;
//! 2. **the service**: real `tollgate serve` processes (the built binary) on a fresh database,
//!    the mock provider at zero delay in this process, driven over HTTP by `wrk` (one thread, N
//!    connections, a Lua script per case): one scope (c1, c16, c64), eight scopes, one hot daily
//!    block cap, the same hot cap under rate and concurrency limits that never refuse (what limits
//!    cost, spec/limits.md), replays of completed keys (c16), two servers on one database, and the
//!    mock alone (the baseline);
//!    then 1,000 calls in flight on `mock-slow-2000` against a fresh server over HTTP/1.1, and
//!    10,000 over HTTP/2 (prior knowledge, 100 a connection), for its peak RSS;
//! 3. **growth**: a read by key, a replay, one usage reconciliation page and the scheduler's scan
//!    for scopes with work, at 10k and 100k seeded executions (`TOLLGATE_HARNESS_GROWTH`);
//! 4. **collector**: SSE parsing and step collection per protocol, in MB/s and against
//!    `serde_json::from_slice` over the same bytes.
//!
//! Paired (H-7): pgbench and the service run in rounds that alternate which goes first; every
//! attempt counts (failures stay in the denominators). Loopback only; it stops by itself.
//!
//! Knobs (environment): `TOLLGATE_HARNESS_CASE_MS` (each load case's duration per round, default
//! 3000), `TOLLGATE_HARNESS_ROUNDS` (default 2), `TOLLGATE_HARNESS_PGBENCH_SCALE` (default 8),
//! `TOLLGATE_HARNESS_IN_FLIGHT` (default 1000), `TOLLGATE_HARNESS_MANY_IN_FLIGHT` (the second
//! in-flight case, default 10000; 0 = skip), `TOLLGATE_HARNESS_GROWTH` (execution counts,
//! comma-separated, default `10000,100000`; empty = skip), `TOLLGATE_HARNESS_SECTIONS` (any of
//! `load,growth,collector`, default all), `TOLLGATE_HARNESS_CASES` (the load cases that run, any of
//! `mock,one-scope,eight-scopes,hot,hot-limited,replay,two-servers,two-servers-one-consumer`;
//! default all; a ratio of a case that did not run reads `not measured`), `TOLLGATE_HARNESS_SERVER_BIN` (the `tollgate` binary the
//! servers run, for A/B runs of two builds; default this build's). Postgres:
//! `TOLLGATE_TEST_DATABASE_URL`. `benches/setup.sh` prepares a fresh machine.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::panic,
    missing_docs
)]

use futures::FutureExt;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tollgate_core::collector::CollectorLimits;
use tollgate_core::config::fixtures::text_config;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, Scope, SessionId};
use tollgate_core::message::{Message, Role};
use tollgate_mock_provider::MockProvider;
use tollgate_postgres::PgStores;
use tollgate_provider::http::{HttpClient, HttpClientConfig};
use tollgate_provider::Protocol;
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::{RunRequest, RunnerSettings, SingleCallRunner, SystemClock};
use tollgate_server::auth::generate_key;
use tollgate_store::traits::WorkScan;
use tollgate_store::KeyDigest;
use tollgate_testkit::bench::DbActivity;
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

// ---- knobs -------------------------------------------------------------------------------------

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        _ => default,
    }
}

struct Knobs {
    case: Duration,
    rounds: u64,
    pgbench_scale: u64,
    in_flight: u64,
    many_in_flight: u64,
    growth: Vec<u64>,
    sections: String,
    /// The load cases' families that run (`Case::family`); empty: all.
    cases: Vec<String>,
}

impl Knobs {
    fn from_env() -> Self {
        let growth = std::env::var("TOLLGATE_HARNESS_GROWTH")
            .unwrap_or_else(|_| "10000,100000".into())
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse().expect("TOLLGATE_HARNESS_GROWTH: numbers"))
            .collect();
        Self {
            case: Duration::from_millis(env_u64("TOLLGATE_HARNESS_CASE_MS", 3_000)),
            rounds: env_u64("TOLLGATE_HARNESS_ROUNDS", 2).max(1),
            pgbench_scale: env_u64("TOLLGATE_HARNESS_PGBENCH_SCALE", 8).max(1),
            in_flight: env_u64("TOLLGATE_HARNESS_IN_FLIGHT", 1_000).max(1),
            many_in_flight: env_u64("TOLLGATE_HARNESS_MANY_IN_FLIGHT", 10_000),
            growth,
            sections: std::env::var("TOLLGATE_HARNESS_SECTIONS")
                .unwrap_or_else(|_| "load,growth,collector".into()),
            cases: std::env::var("TOLLGATE_HARNESS_CASES")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    /// Whether the load case `case` runs.
    fn runs_case(&self, case: Case) -> bool {
        self.cases.is_empty() || self.cases.iter().any(|f| f == case.family())
    }

    fn runs(&self, section: &str) -> bool {
        self.sections.split(',').any(|s| s.trim() == section)
    }
}

// ---- pgbench -----------------------------------------------------------------------------------

fn require_pgbench() {
    let found = Command::new("pgbench")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!(
            "harness: `pgbench` not found on PATH. It is the Postgres benchmark client that gives \
             the machine's own limit; `benches/setup.sh` installs it and everything else the \
             harness needs (Debian: `apt-get install postgresql-contrib`)."
        );
        std::process::exit(2);
    }
}

fn require_wrk() {
    let found = Command::new("wrk")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        eprintln!(
            "harness: `wrk` not found on PATH. It is the HTTP load generator that drives the \
             service (a C client, so that the generator takes as little of the machine as \
             pgbench's client does); `benches/setup.sh` installs it and everything else the \
             harness needs (Debian: `apt-get install wrk`)."
        );
        std::process::exit(2);
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct PgbenchRun {
    tps: f64,
    latency_ms: f64,
    transactions: u64,
    failed: u64,
}

fn pgbench(url: &str, args: &[&str]) -> PgbenchRun {
    // libpq does not know sqlx's URL parameters (`statement-cache-capacity`).
    let url = url.split('?').next().unwrap_or(url);
    let out = Command::new("pgbench")
        .args(args)
        .arg(url)
        .output()
        .expect("pgbench runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        panic!(
            "pgbench {args:?} failed: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let number_after = |label: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    PgbenchRun {
        tps: number_after("tps = ").unwrap_or(0.0),
        latency_ms: number_after("latency average = ").unwrap_or(0.0),
        transactions: number_after("number of transactions actually processed: ").unwrap_or(0.0)
            as u64,
        failed: number_after("number of failed transactions: ").unwrap_or(0.0) as u64,
    }
}

// ---- the service -------------------------------------------------------------------------------

const SCOPES: usize = 8;
/// The server's `max_connections` the load section needs: two servers' pools, the in-flight
/// servers', pgbench's clients and the harness's own connections, with room for the tests of a
/// developer beside it.
const HARNESS_MAX_CONNECTIONS: u64 = 200;
/// Consumers (one profile each) that first calls are spread over.
const CONSUMERS: u64 = 8;
const SLOW_MODEL: &str = "mock-slow-2000";

struct Keys {
    /// One caller key per scope `perf-0` … `perf-7`.
    callers: Vec<String>,
}

fn config_text(mock_url: &str, keys: &Keys) -> String {
    let mut text = format!(
        r#"
[server]
listen = "127.0.0.1:0"

[database]
max_connections = 16

[[providers]]
name = "mock"
kind = "openai-chat"
base_url = "{mock_url}"

[[prices]]
version = "prices-perf"
currency = "USD"
"#
    );
    for model in ["mock-echo", SLOW_MODEL] {
        let _ = write!(
            text,
            r#"[prices.models."{model}"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"
"#
        );
    }
    // First calls spread over consumers (one scope may serve many); the hot-cap case is the one
    // consumer whose day row every call takes.
    let mut profiles: Vec<(String, &str, String, &str)> = (0..CONSUMERS)
        .map(|i| (format!("plain-{i}"), "mock-echo", format!("team-{i}"), ""))
        .collect();
    for (name, model, consumer, caps) in [
        ("plain", "mock-echo", "team-plain", ""),
        (
            "hot",
            "mock-echo",
            "team-hot",
            "[profiles.caps]\ndaily_block = \"1000000.00\"\n",
        ),
        // The hot case again under limits of every kind that never refuse: what limits cost.
        (
            "hot-limited",
            "mock-echo",
            "team-hot-limited",
            "[profiles.caps]\ndaily_block = \"1000000.00\"\n[profiles.limits]\n\
             requests_per_minute = 1000000000\ninput_tokens_per_minute = 9007199254740992\n\
             output_tokens_per_minute = 9007199254740992\nin_flight = 1000000\n",
        ),
        ("slow", SLOW_MODEL, "team-slow", ""),
    ] {
        profiles.push((name.to_string(), model, consumer.to_string(), caps));
    }
    for (name, model, consumer, caps) in &profiles {
        let _ = write!(
            text,
            r#"
[[profiles]]
name = "{name}"
kind = "text"
provider = "mock"
model = "{model}"
policy_version = "policy-1"
price_version = "prices-perf"
consumer = "{consumer}"
max_tokens = 64
max_input_chars = 2000
max_output_chars = 2000
run_timeout_ms = 30000
{caps}"#
        );
    }
    for (i, key) in keys.callers.iter().enumerate() {
        let _ = write!(
            text,
            "\n[[keys]]\nscope = \"perf-{i}\"\nrole = \"caller\"\nsha256 = \"{}\"\n",
            KeyDigest::of_key(key).to_hex()
        );
    }
    text
}

/// A running `tollgate serve`.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    /// A server of `config` on `db_url`; a `member` of a cluster (H-39) listens on a port
    /// chosen here and names it as its `[cluster] url`.
    async fn start(config: &Path, db_url: &str, member: bool) -> Self {
        // A/B runs of two builds: `TOLLGATE_HARNESS_SERVER_BIN` names the other build's binary
        // (it applies its own SQL functions when it starts).
        let binary = std::env::var("TOLLGATE_HARNESS_SERVER_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tollgate").to_string());
        let mut command = Command::new(binary);
        command.env_remove("DATABASE_URL").env_remove("RUST_LOG");
        for (name, _) in std::env::vars() {
            if name.to_ascii_uppercase().starts_with("TOLLGATE_") {
                command.env_remove(name);
            }
        }
        if member {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            command
                .env("TOLLGATE_SERVER__LISTEN", format!("127.0.0.1:{port}"))
                .env("TOLLGATE_CLUSTER__URL", format!("http://127.0.0.1:{port}"))
                .env(
                    "TOLLGATE_CLUSTER_SECRET",
                    "the shared secret of the harness's two members",
                );
        }
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .env("DATABASE_URL", db_url)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tollgate serve starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if !sent {
                    if let Some(rest) = line.split("listening on ").nth(1) {
                        let addr = rest.split_whitespace().next().unwrap_or_default();
                        let _ = tx.send(addr.to_string());
                        sent = true;
                        continue;
                    }
                }
                if line.contains("ERROR") || !sent {
                    eprintln!("[serve] {line}");
                }
            }
        });
        let base = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(60)))
            .await
            .unwrap()
            .expect("tollgate serve listens within 60 s");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = http
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "tollgate serve never became ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self { child, base }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time (user + system) in clock ticks, from `/proc/<pid>/stat`.
    fn cpu_ticks(&self) -> u64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        stat_fields_sum(&stat, 14..=15)
    }

    /// A `/proc/<pid>/status` value in KiB (`VmHWM`, `VmRSS`).
    fn status_kib(&self, name: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

// ---- the load generator ------------------------------------------------------------------------

/// What one request is: the URL, the bearer key (none for the mock) and the body.
/// What a load case saw, summed over its rounds.
#[derive(Debug, Default, Clone)]
struct Observed {
    latencies: Vec<Duration>,
    /// `(p50, p99)` of each wrk run (wrk reports percentiles, not every latency).
    runs: Vec<(Duration, Duration)>,
    ok: u64,
    failed: u64,
    wall: Duration,
    cpu_ticks: u64,
    /// CPU time of the whole Postgres cluster in the same window, in clock ticks
    /// ([`postgres_ticks`]).
    postgres_ticks: u64,
    db: DbActivity,
    statements: Option<i64>,
}

impl Observed {
    fn add(&mut self, other: Observed) {
        self.latencies.extend(other.latencies);
        self.runs.extend(other.runs);
        self.ok += other.ok;
        self.failed += other.failed;
        self.wall += other.wall;
        self.cpu_ticks += other.cpu_ticks;
        self.postgres_ticks += other.postgres_ticks;
        self.db = DbActivity {
            xact_commit: self.db.xact_commit + other.db.xact_commit,
            xact_rollback: self.db.xact_rollback + other.db.xact_rollback,
            tup_returned: self.db.tup_returned + other.db.tup_returned,
            tup_fetched: self.db.tup_fetched + other.db.tup_fetched,
            tup_written: self.db.tup_written + other.db.tup_written,
        };
        self.statements = match (self.statements, other.statements) {
            (Some(a), Some(b)) => Some(a + b),
            (None, b) => b,
            (a, None) => a,
        };
    }

    fn attempted(&self) -> u64 {
        self.ok + self.failed
    }

    fn per_sec(&self) -> f64 {
        self.ok as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    fn percentile(&self, p: usize) -> Option<Duration> {
        // wrk runs: the mean of their p50s, the largest of their p99s.
        if self.latencies.is_empty() && !self.runs.is_empty() {
            let n = u32::try_from(self.runs.len()).unwrap_or(1);
            return Some(match p {
                50 => self.runs.iter().map(|r| r.0).sum::<Duration>() / n,
                _ => self.runs.iter().map(|r| r.1).max().unwrap_or_default(),
            });
        }
        let mut all = self.latencies.clone();
        all.sort();
        (all.len() >= 20).then(|| all[(all.len() * p / 100).min(all.len() - 1)])
    }
}

/// What a wrk run is asked to send: requests `n = 0, 1, …` of `lua_request` (Lua that sets
/// `path`, `auth` and `body` from `n`), and the substrings a successful answer's body holds.
struct WrkPlan {
    url: String,
    lua_request: String,
    success: Vec<&'static str>,
}

/// A Lua string literal.
fn lua_str(text: &str) -> String {
    format!("{text:?}")
}

fn wrk_script(plan: &WrkPlan) -> String {
    let checks: String = plan
        .success
        .iter()
        .map(|c| format!(" and body:find({}, 1, true) ~= nil", lua_str(c)))
        .collect();
    format!(
        r#"local threads = {{}}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; bad = 0; n = 0 end
function request()
  local path, auth, body
{request}
  n = n + 1
  local headers = {{["content-type"] = "application/json"}}
  if auth ~= nil then headers["authorization"] = "Bearer " .. auth end
  return wrk.format("POST", path, headers, body)
end
function response(status, headers, body)
  if status == 200{checks} then ok = ok + 1 else bad = bad + 1 end
end
function done(summary, latency, requests)
  local o, b = 0, 0
  for _, t in ipairs(threads) do o = o + t:get("ok"); b = b + t:get("bad") end
  io.write(string.format("TOLLGATE ok=%d bad=%d errors=%d us=%d p50=%d p99=%d\n", o, b,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
"#,
        request = plan.lua_request,
    )
}

/// Runs wrk with `connections` connections (one thread) for `duration` and reads what the
/// script's `done` printed. Socket errors count as failures.
async fn drive_wrk(plan: &WrkPlan, connections: u64, duration: Duration, dir: &Path) -> Observed {
    static SCRIPTS: AtomicU64 = AtomicU64::new(0);
    let script = dir.join(format!(
        "wrk-{}.lua",
        SCRIPTS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&script, wrk_script(plan)).unwrap();
    let secs = duration.as_millis().div_ceil(1000).max(1);
    let mut command = tokio::process::Command::new("wrk");
    command
        .arg("-t1")
        .arg(format!("-c{connections}"))
        .arg(format!("-d{secs}s"))
        .arg("--timeout")
        .arg("60s")
        .arg("-s")
        .arg(&script)
        .arg(&plan.url);
    let out = command.output().await.expect("wrk runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text
        .lines()
        .find(|l| l.starts_with("TOLLGATE "))
        .unwrap_or_else(|| panic!("wrk printed no summary: {text}"));
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Observed {
        ok: field("ok="),
        failed: field("bad=") + field("errors="),
        wall: Duration::from_micros(field("us=")),
        runs: vec![(
            Duration::from_micros(field("p50=")),
            Duration::from_micros(field("p99=")),
        )],
        ..Observed::default()
    }
}

fn completed(status: u16, view: &Value) -> bool {
    status == 200 && view["state"] == "completed" && view["outcome"] == "success"
}

fn call_body(profile: &str, key: &str, session: &str) -> Value {
    json!({
        "profile": profile, "operation_key": key, "session_id": session,
        "input_revision": "r1", "intent": "perf",
        "input": {"messages": [{"role": "user", "content": "summarize order 123"}]}
    })
}

/// The service's load cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Case {
    MockDirect(u64),
    OneScope(u64),
    EightScopes(u64),
    HotCap(u64),
    /// The hot cap's consumer under limits of every kind, none of which refuses.
    HotLimited(u64),
    Replay(u64),
    TwoServers(u64),
    /// One consumer's calls (one scope, one profile) spread over both servers.
    TwoServersOneConsumer(u64),
}

impl Case {
    fn name(&self) -> String {
        match self {
            Case::MockDirect(c) => format!("mock alone c{c}"),
            Case::OneScope(c) => format!("first calls, 1 scope c{c}"),
            Case::EightScopes(c) => format!("first calls, 8 scopes c{c}"),
            Case::HotCap(c) => format!("first calls, 1 hot cap c{c}"),
            Case::HotLimited(c) => format!("first calls, 1 hot cap under limits c{c}"),
            Case::Replay(c) => format!("replays c{c}"),
            Case::TwoServers(c) => format!("first calls, 2 servers c{c}"),
            Case::TwoServersOneConsumer(c) => format!("first calls, 1 consumer on 2 servers c{c}"),
        }
    }

    /// The family `TOLLGATE_HARNESS_CASES` names the case by.
    fn family(&self) -> &'static str {
        match self {
            Case::MockDirect(_) => "mock",
            Case::OneScope(_) => "one-scope",
            Case::EightScopes(_) => "eight-scopes",
            Case::HotCap(_) => "hot",
            Case::HotLimited(_) => "hot-limited",
            Case::Replay(_) => "replay",
            Case::TwoServers(_) => "two-servers",
            Case::TwoServersOneConsumer(_) => "two-servers-one-consumer",
        }
    }

    fn concurrency(&self) -> u64 {
        match *self {
            Case::MockDirect(c)
            | Case::OneScope(c)
            | Case::EightScopes(c)
            | Case::HotCap(c)
            | Case::HotLimited(c)
            | Case::Replay(c)
            | Case::TwoServers(c)
            | Case::TwoServersOneConsumer(c) => c,
        }
    }
}

const CASES: [Case; 16] = [
    Case::MockDirect(1),
    Case::MockDirect(16),
    Case::OneScope(1),
    Case::OneScope(16),
    Case::OneScope(64),
    Case::EightScopes(16),
    Case::EightScopes(64),
    Case::HotCap(16),
    Case::HotCap(64),
    Case::HotLimited(16),
    Case::HotLimited(64),
    Case::Replay(16),
    Case::TwoServers(16),
    Case::TwoServers(64),
    Case::TwoServersOneConsumer(16),
    Case::TwoServersOneConsumer(64),
];

/// Completed keys replayed by the replay case.
const REPLAY_KEYS: u64 = 64;

struct Service {
    http: reqwest::Client,
    mock_url: String,
    keys: Keys,
    servers: Vec<Server>,
    db: TestDatabase,
    ticks_per_sec: f64,
    next: AtomicU64,
    round: AtomicU64,
    /// Where the wrk scripts go.
    dir: PathBuf,
}

impl Service {
    /// What wrk sends in `case`: one plan per server the case drives.
    fn wrk_plans(&self, case: Case) -> Vec<WrkPlan> {
        let round = self.round.load(Ordering::Relaxed);
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let keys: Vec<String> = self.keys.callers.iter().map(|k| lua_str(k)).collect();
        let keys = format!("{{{}}}", keys.join(", "));
        let calls = |base: &str, server: usize, hot: bool, scopes: u64| {
            let profile = if hot && matches!(case, Case::HotLimited(_)) {
                "\"hot-limited\"".to_string()
            } else if hot {
                "\"hot\"".to_string()
            } else if matches!(case, Case::TwoServersOneConsumer(_)) {
                "\"plain-0\"".to_string()
            } else {
                format!("string.format(\"plain-%d\", math.floor(n / {scopes}) % {CONSUMERS})")
            };
            WrkPlan {
                url: base.to_string(),
                lua_request: format!(
                    r#"  local keys = {keys}
  path = "/v1/calls"
  auth = keys[(n % {scopes}) + 1]
  body = string.format('{{"profile":"%s","operation_key":"k{round}-{first}-{server}-%d","session_id":"s%d","input_revision":"r1","intent":"perf","input":{{"messages":[{{"role":"user","content":"summarize order 123"}}]}}}}', {profile}, n, n % 97)"#
                ),
                success: vec!["\"state\":\"completed\"", "\"outcome\":\"success\""],
            }
        };
        match case {
            Case::MockDirect(_) => vec![WrkPlan {
                url: self.mock_url.clone(),
                lua_request: r#"  path = "/v1/chat/completions"
  body = '{"model":"mock-echo","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"summarize order 123"}]}'"#
                    .to_string(),
                success: vec![],
            }],
            Case::OneScope(_) => vec![calls(&self.servers[0].base, 0, false, 1)],
            Case::EightScopes(_) => vec![calls(&self.servers[0].base, 0, false, SCOPES as u64)],
            Case::HotCap(_) | Case::HotLimited(_) => {
                vec![calls(&self.servers[0].base, 0, true, 1)]
            }
            Case::TwoServers(_) | Case::TwoServersOneConsumer(_) => self.servers[1..]
                .iter()
                .enumerate()
                .map(|(i, server)| calls(&server.base, i, false, 1))
                .collect(),
            Case::Replay(_) => vec![WrkPlan {
                url: self.servers[0].base.clone(),
                lua_request: format!(
                    r#"  local i = n % {REPLAY_KEYS}
  path = "/v1/calls"
  auth = {}
  body = string.format('{{"profile":"plain","operation_key":"replay-%d","session_id":"r%d","input_revision":"r1","intent":"perf","input":{{"messages":[{{"role":"user","content":"summarize order 123"}}]}}}}', i, i)"#,
                    lua_str(&self.keys.callers[0])
                ),
                success: vec![
                    "\"state\":\"completed\"",
                    "\"outcome\":\"success\"",
                    "\"replayed\":true",
                ],
            }],
        }
    }

    /// CPU ticks of the server of the cases of one, or of the two members.
    async fn cpu_ticks(&self, servers: usize) -> u64 {
        let measured = if servers == 1 {
            &self.servers[..1]
        } else {
            &self.servers[1..]
        };
        measured.iter().map(Server::cpu_ticks).sum()
    }

    async fn measure(&self, case: Case, duration: Duration) -> Observed {
        let servers = if matches!(case, Case::TwoServers(_) | Case::TwoServersOneConsumer(_)) {
            2
        } else {
            1
        };
        let plans = self.wrk_plans(case);
        let per_plan = (case.concurrency() / plans.len() as u64).max(1);
        // Statistics reach pg_stat_database when a backend goes idle (about once a second).
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let (db0, st0, cpu0, pg0) = (
            self.db.activity().await.unwrap(),
            self.db.statement_calls().await.unwrap(),
            self.cpu_ticks(servers).await,
            postgres_ticks(),
        );
        let runs = futures::future::join_all(
            plans
                .iter()
                .map(|plan| drive_wrk(plan, per_plan, duration, &self.dir)),
        )
        .await;
        let mut seen = Observed::default();
        let mut wall = Duration::ZERO;
        for run in runs {
            wall = wall.max(run.wall);
            seen.add(run);
        }
        seen.wall = wall;
        let (cpu1, pg1) = (self.cpu_ticks(servers).await, postgres_ticks());
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let (db1, st1) = (
            self.db.activity().await.unwrap(),
            self.db.statement_calls().await.unwrap(),
        );
        seen.cpu_ticks = cpu1 - cpu0;
        seen.postgres_ticks = pg1.saturating_sub(pg0);
        seen.db = db1.since(&db0);
        seen.statements = st0.zip(st1).map(|(a, b)| b - a);
        seen
    }
}

/// CPU time (user + system) of every process named `postgres` on this machine, in clock ticks,
/// with the children each has reaped: the backends and workers running now, and through the
/// postmaster's reaped-children counts, those that ended (a backend whose connection closed, an
/// autovacuum worker). The database the load section drives runs on this machine; its own
/// background work (checkpoints, autovacuum, statistics) counts with the calls that cause it.
fn postgres_ticks() -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut ticks = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let command = stat
            .split_once('(')
            .and_then(|(_, rest)| rest.rsplit_once(')'))
            .map(|(command, _)| command);
        if command != Some("postgres") {
            continue;
        }
        // utime 14, stime 15, cutime 16, cstime 17.
        ticks += stat_fields_sum(&stat, 14..=17);
    }
    ticks
}

/// The sum of the numeric fields `fields` (numbered from 1, as proc(5) numbers them) of a
/// `/proc/<pid>/stat` line; a field that is missing or not a number counts 0.
fn stat_fields_sum(stat: &str, fields: std::ops::RangeInclusive<usize>) -> u64 {
    // Fields after the command name (which may hold spaces and parentheses) start at field 3.
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let after: Vec<&str> = rest.split_whitespace().collect();
    fields
        .filter_map(|n| after.get(n - 3).and_then(|f| f.parse::<u64>().ok()))
        .sum()
}

/// How the in-flight cases reach the server.
#[derive(Debug, Clone, Copy)]
enum Transport {
    /// One HTTP/1.1 connection a call.
    Http1,
    /// HTTP/2 with prior knowledge, this many calls a connection at once (the server's
    /// `http2_max_streams`), as a proxy in front of the service carries them.
    Http2 { streams: u64 },
}

impl Transport {
    /// Sockets one call holds in this process and in the server, beside the connections.
    fn sockets_a_call(self) -> u64 {
        match self {
            // This process: its request and the mock's side of the provider request; the
            // server: its client's and its provider request.
            Transport::Http1 => 2,
            // The mock's side here, the provider request there; the calls share connections.
            Transport::Http2 { .. } => 1,
        }
    }

    /// Connections `calls` calls take.
    fn connections(self, calls: u64) -> u64 {
        match self {
            Transport::Http1 => 0,
            Transport::Http2 { streams } => calls.div_ceil(streams.max(1)),
        }
    }
}

/// The peak RSS of a fresh server with `in_flight` calls on the slow model at once.
async fn peak_rss(
    config: &Path,
    db: &TestDatabase,
    caller: &str,
    in_flight: u64,
    transport: Transport,
) -> (u64, u64, u64, u64, Duration) {
    let server = Server::start(config, db.url(), false).await;
    let in_flight = calls_that_fit(server.pid(), in_flight, transport);
    let started = Instant::now();
    let tasks: Vec<tokio::task::JoinHandle<String>> = match transport {
        Transport::Http1 => {
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            (0..in_flight)
                .map(|i| {
                    let request = http
                        .post(format!("{}/v1/calls", server.base))
                        .bearer_auth(caller)
                        .json(&slow_call(i));
                    tokio::spawn(async move {
                        match request.send().await {
                            Ok(r) => {
                                let status = r.status().as_u16();
                                let v: Value = r.json().await.unwrap_or(Value::Null);
                                outcome(status, &v)
                            }
                            Err(e) if e.is_connect() => "connect error".to_string(),
                            Err(e) if e.is_timeout() => "timed out".to_string(),
                            Err(_) => "transport error".to_string(),
                        }
                    })
                })
                .collect()
        }
        Transport::Http2 { streams } => {
            let addr = server.base.trim_start_matches("http://").to_string();
            let mut senders = Vec::new();
            for _ in 0..transport.connections(in_flight) {
                let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
                let (send, connection) = h2::client::handshake(tcp).await.unwrap();
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                senders.push(send);
            }
            (0..in_flight)
                .map(|i| {
                    let send = senders[usize::try_from(i / streams.max(1)).unwrap()].clone();
                    let request = http::Request::post(format!("{}/v1/calls", server.base))
                        .header("authorization", format!("Bearer {caller}"))
                        .header("content-type", "application/json")
                        .body(())
                        .unwrap();
                    let body = serde_json::to_vec(&slow_call(i)).unwrap();
                    tokio::spawn(async move {
                        match h2_call(send, request, body).await {
                            Ok((status, v)) => outcome(status, &v),
                            Err(e) => format!("transport error: {e}"),
                        }
                    })
                })
                .collect()
        }
    };
    let mut ok = 0;
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for task in tasks {
        let done = task.await.unwrap_or_else(|_| "task failed".to_string());
        if done == "completed" {
            ok += 1;
        } else {
            *failures.entry(done).or_default() += 1;
        }
    }
    if !failures.is_empty() {
        println!("  {in_flight} in flight, failures by kind: {failures:?}");
    }
    let wall = started.elapsed();
    (
        server.status_kib("VmHWM"),
        in_flight,
        ok,
        in_flight - ok,
        wall,
    )
}

/// The body of the `i`th call of an in-flight case.
fn slow_call(i: u64) -> Value {
    call_body("slow", &format!("slow-{i}"), &format!("slow-{}", i % 97))
}

/// `completed`, or what else a call's answer was.
fn outcome(status: u16, view: &Value) -> String {
    if completed(status, view) {
        "completed".to_string()
    } else {
        format!("{status} {}", view["error"]["code"].as_str().unwrap_or("-"))
    }
}

/// One request over an HTTP/2 connection (`send`), waiting for a stream when the connection
/// carries as many as the server allows: its status and its body as JSON.
async fn h2_call(
    send: h2::client::SendRequest<bytes::Bytes>,
    request: http::Request<()>,
    body: Vec<u8>,
) -> Result<(u16, Value), h2::Error> {
    let mut send = send.ready().await?;
    let (answer, mut stream) = send.send_request(request, false)?;
    stream.send_data(bytes::Bytes::from(body), true)?;
    let answer = answer.await?;
    let status = answer.status().as_u16();
    let mut body = answer.into_body();
    let mut read = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        read.extend_from_slice(&chunk);
    }
    Ok((status, serde_json::from_slice(&read).unwrap_or(Value::Null)))
}

/// The open-file limits `(soft, hard)` of process `pid` (`/proc/<pid>/limits`).
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    let field = |n: usize| {
        limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(n))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field(3), field(4))
}

/// Calls one HTTP/2 connection carries at once in the second in-flight case.
const MANY_IN_FLIGHT_STREAMS: u64 = 100;

/// Sockets a process keeps beside its calls' (listeners, database connections, files).
const OTHER_FILES: u64 = 200;

/// How many of `wanted` calls in flight fit the open-file limits of this process and of the
/// server `pid`, each call holding the sockets `transport` says in each
/// ([`Transport::sockets_a_call`]) beside the connections they share. Raises each soft limit to
/// its hard limit (`prlimit`); a hard limit cannot be raised without `CAP_SYS_RESOURCE`.
fn calls_that_fit(server: u32, wanted: u64, transport: Transport) -> u64 {
    let mut fit = wanted;
    for pid in [std::process::id(), server] {
        let (soft, hard) = open_file_limits(pid);
        if soft < hard {
            let _ = Command::new("prlimit")
                .arg(format!("--pid={pid}"))
                .arg(format!("--nofile={hard}:{hard}"))
                .status();
        }
        let (soft, _) = open_file_limits(pid);
        let room = soft.saturating_sub(OTHER_FILES + transport.connections(wanted));
        fit = fit.min(room / transport.sockets_a_call());
    }
    fit
}

// ---- the table ---------------------------------------------------------------------------------

fn ms(d: Option<Duration>) -> String {
    d.map_or("n/a".into(), |d| format!("{:.2}", d.as_secs_f64() * 1e3))
}

fn print_row(name: &str, seen: &Observed, ticks_per_sec: f64) {
    let attempted = seen.attempted().max(1) as f64;
    let cpu_ms = seen.cpu_ticks as f64 / ticks_per_sec * 1e3 / attempted;
    let postgres_ms = seen.postgres_ticks as f64 / ticks_per_sec * 1e3 / attempted;
    let stmts = seen
        .statements
        .map_or("n/a".into(), |s| format!("{:.1}", s as f64 / attempted));
    println!(
        "| {name} | {:.0} | {} | {} | {}/{} | {:.3} | {postgres_ms:.3} | {:.2} | {:.1} | {:.1} | {stmts} |",
        seen.per_sec(),
        ms(seen.percentile(50)),
        ms(seen.percentile(99)),
        seen.failed,
        seen.attempted(),
        cpu_ms,
        seen.db.xact_commit as f64 / attempted,
        seen.db.tup_returned as f64 / attempted,
        seen.db.tup_fetched as f64 / attempted,
    );
}

fn ratio_row(name: &str, value: f64, target: &str, met: bool) {
    if !value.is_finite() {
        // A case of the ratio did not run (`TOLLGATE_HARNESS_CASES`), or its denominator is
        // zero (a case without a success): there is no ratio to judge. A case that ran without
        // a success has the rate 0, and its ratio is missed.
        println!("| {name} | — | {target} | not measured |");
        return;
    }
    println!(
        "| {name} | {value:.3} | {target} | {} |",
        if met { "met" } else { "missed" }
    );
}

/// A figure the table shows without a target.
fn info_row(name: &str, value: f64) {
    if value.is_finite() {
        println!("| {name} | {value:.3} | — | info |");
    } else {
        println!("| {name} | — | — | info, not measured |");
    }
}

async fn load_section(knobs: &Knobs, admin: &str) {
    // pgbench's scratch database.
    let bench_db = TestDatabase::create(admin).await.unwrap();
    let _bench_pool = bench_db.stores(1).await.unwrap();
    let scale = knobs.pgbench_scale.to_string();
    let t = Instant::now();
    pgbench(bench_db.url(), &["-i", "-q", "-s", &scale]);
    println!("pgbench -i -s {scale}: {:.1} s", t.elapsed().as_secs_f64());
    // The design's ceiling: the two function calls of a first call, driven by pgbench alone.
    let ceiling_db = TestDatabase::create(admin).await.unwrap();
    ceiling_db.stores(1).await.unwrap().migrate().await.unwrap();
    // The probes' binding config, stored once as the server stores it (H-40).
    let config_script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/probe/db_config.sql");
    pgbench(
        ceiling_db.url(),
        &["-n", "-t", "1", "-f", config_script.to_str().unwrap()],
    );
    let ceiling_script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/probe/db_only.sql");
    let ceiling_script = ceiling_script.to_str().unwrap().to_string();
    // The same two functions with a consumer limit of every kind that never refuses: what limits
    // cost the database.
    let limited_script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/probe/db_limited.sql");
    let limited_script = limited_script.to_str().unwrap().to_string();

    // The service's database, migrated, and the mock.
    let db = TestDatabase::create(admin).await.unwrap();
    let pool = db.stores(2).await.unwrap();
    pool.migrate().await.unwrap();
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let keys = Keys {
        callers: (0..SCOPES)
            .map(|_| generate_key().expose().to_string())
            .collect(),
    };
    let dir = std::env::temp_dir().join(format!(
        "tollgate-harness-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let config: PathBuf = dir.join("tollgate.toml");
    std::fs::write(&config, config_text(&mock.base_url(), &keys)).unwrap();
    // One server for the cases of one, and two members of a cluster (H-39) for the cases of two.
    let servers = vec![
        Server::start(&config, db.url(), false).await,
        Server::start(&config, db.url(), true).await,
        Server::start(&config, db.url(), true).await,
    ];
    // The two members count each other once each has read the other's row (a heartbeat apart);
    // a build that is no member (an A/B run's other binary) never writes one.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let members = pool.instances(2_000).await.map_or(0, |m| m.len());
        if members >= 2 {
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let statements_loaded = db.statement_calls().await.unwrap().is_some();
    let max_connections: u64 = db
        .setting("max_connections")
        .await
        .unwrap()
        .parse()
        .unwrap_or(0);
    if !statements_loaded || max_connections < HARNESS_MAX_CONNECTIONS {
        eprintln!(
            "harness: the Postgres server needs pg_stat_statements in shared_preload_libraries \
             (loaded: {statements_loaded}) and max_connections ≥ {HARNESS_MAX_CONNECTIONS} (now \
             {max_connections}) for statements per call and for two servers beside pgbench; \
             `benches/setup.sh` sets both (and restarts the cluster)."
        );
        std::process::exit(2);
    }
    let service = Service {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()
            .unwrap(),
        mock_url: mock.base_url(),
        keys,
        servers,
        db,
        ticks_per_sec: clock_ticks_per_sec(),
        next: AtomicU64::new(0),
        round: AtomicU64::new(0),
        dir: dir.clone(),
    };
    // The keys the replay case replays, completed once.
    for i in 0..REPLAY_KEYS {
        let r = service
            .http
            .post(format!("{}/v1/calls", service.servers[0].base))
            .bearer_auth(&service.keys.callers[0])
            .json(&call_body(
                "plain",
                &format!("replay-{i}"),
                &format!("r{i}"),
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "a replay key completes");
    }

    let secs = knobs.case.as_secs().max(1).to_string();
    let mut tpcb1 = Vec::new();
    let mut tpcb8 = Vec::new();
    let mut select16 = Vec::new();
    let mut ceiling8 = Vec::new();
    let mut limited8 = Vec::new();
    let mut seen: BTreeMap<Case, Observed> = BTreeMap::new();
    for round in 0..knobs.rounds {
        service.round.store(round, Ordering::Relaxed);
        let pg_first = round % 2 == 0;
        let run_pgbench =
            |tpcb1: &mut Vec<PgbenchRun>,
             tpcb8: &mut Vec<PgbenchRun>,
             select16: &mut Vec<PgbenchRun>,
             (ceiling8, limited8): (&mut Vec<PgbenchRun>, &mut Vec<PgbenchRun>)| {
                tpcb1.push(pgbench(
                    bench_db.url(),
                    &["-n", "-c", "1", "-j", "1", "-T", &secs],
                ));
                tpcb8.push(pgbench(
                    bench_db.url(),
                    &["-n", "-c", "8", "-j", "2", "-T", &secs],
                ));
                select16.push(pgbench(
                    bench_db.url(),
                    &["-n", "-S", "-c", "16", "-j", "2", "-T", &secs],
                ));
                let probe = |script: &str| {
                    pgbench(
                        ceiling_db.url(),
                        &[
                            "-n", "-M", "prepared", "-c", "8", "-j", "2", "-T", &secs, "-f", script,
                        ],
                    )
                };
                ceiling8.push(probe(&ceiling_script));
                limited8.push(probe(&limited_script));
            };
        if pg_first {
            run_pgbench(
                &mut tpcb1,
                &mut tpcb8,
                &mut select16,
                (&mut ceiling8, &mut limited8),
            );
        }
        let mut order: Vec<Case> = CASES
            .iter()
            .copied()
            .filter(|c| knobs.runs_case(*c))
            .collect();
        if !pg_first {
            order.reverse();
        }
        for case in order {
            let observed = service.measure(case, knobs.case).await;
            seen.entry(case).or_default().add(observed);
        }
        if !pg_first {
            run_pgbench(
                &mut tpcb1,
                &mut tpcb8,
                &mut select16,
                (&mut ceiling8, &mut limited8),
            );
        }
        println!("round {} of {} done", round + 1, knobs.rounds);
    }
    let (rss_kib, _, rss_ok, rss_failed, rss_wall) = peak_rss(
        &config,
        &service.db,
        &service.keys.callers[1],
        knobs.in_flight,
        Transport::Http1,
    )
    .await;
    let many_rss = if knobs.many_in_flight > 0 {
        // A server that admits them all (the default request and connection bounds are far
        // below), reached over HTTP/2 as a proxy reaches it: a call holds its provider request's
        // socket and a stream of a shared connection, where over HTTP/1.1 it would hold two
        // sockets, more than this machine's open-file limit allows for 10,000.
        let many_config = dir.join("tollgate-many.toml");
        let bound = knobs.many_in_flight + 1_000;
        let many_transport = Transport::Http2 {
            streams: MANY_IN_FLIGHT_STREAMS,
        };
        std::fs::write(
            &many_config,
            config_text(&mock.base_url(), &service.keys).replacen(
                "listen = \"127.0.0.1:0\"",
                &format!(
                    "listen = \"127.0.0.1:0\"\nconcurrency_limit = {bound}\nconnections_max = {bound}\nhttp2_max_streams = {MANY_IN_FLIGHT_STREAMS}"
                ),
                1,
            ),
        )
        .unwrap();
        let (kib, ran, ok, failed, wall) = peak_rss(
            &many_config,
            &service.db,
            &service.keys.callers[2],
            knobs.many_in_flight,
            many_transport,
        )
        .await;
        println!(
            "peak RSS with {ran} calls in flight on {SLOW_MODEL} over HTTP/2 ({MANY_IN_FLIGHT_STREAMS} a connection): {:.1} MiB (VmHWM of a fresh server), {ok} completed, {failed} failed, {:.1} s",
            kib as f64 / 1024.0,
            wall.as_secs_f64()
        );
        if ran < knobs.many_in_flight {
            println!(
                "  ({} wanted: the open-file limit of this process or the server, {} soft and \
                 hard here, admits {ran} calls of {} socket(s) each; a hard limit rises only with \
                 CAP_SYS_RESOURCE)",
                knobs.many_in_flight,
                open_file_limits(std::process::id()).1,
                many_transport.sockets_a_call()
            );
        }
        Some((kib, ran, failed))
    } else {
        None
    };

    let mean = |runs: &[PgbenchRun], f: fn(&PgbenchRun) -> f64| {
        runs.iter().map(f).sum::<f64>() / runs.len().max(1) as f64
    };
    let tpcb1_lat = mean(&tpcb1, |r| r.latency_ms);
    let tpcb1_tps = mean(&tpcb1, |r| r.tps);
    let tpcb8_tps = mean(&tpcb8, |r| r.tps);
    let select16_tps = mean(&select16, |r| r.tps);
    let ceiling8_tps = mean(&ceiling8, |r| r.tps);
    let limited8_tps = mean(&limited8, |r| r.tps);
    let pg_failed: u64 = tpcb1
        .iter()
        .chain(&tpcb8)
        .chain(&select16)
        .chain(&ceiling8)
        .chain(&limited8)
        .map(|r| r.failed)
        .sum();
    let pg_total: u64 = tpcb1
        .iter()
        .chain(&tpcb8)
        .chain(&select16)
        .chain(&ceiling8)
        .chain(&limited8)
        .map(|r| r.transactions + r.failed)
        .sum();

    println!();
    println!(
        "## Load: {} round(s) of {} ms per case, pgbench and the service alternating which goes first",
        knobs.rounds,
        knobs.case.as_millis()
    );
    println!();
    println!("| pgbench (scale {scale}) | TPS | latency avg ms |");
    println!("|---|---|---|");
    println!("| TPC-B c1 | {tpcb1_tps:.0} | {tpcb1_lat:.2} |");
    println!(
        "| TPC-B c8 | {tpcb8_tps:.0} | {:.2} |",
        mean(&tpcb8, |r| r.latency_ms)
    );
    println!(
        "| select-only c16 | {select16_tps:.0} | {:.2} |",
        mean(&select16, |r| r.latency_ms)
    );
    println!(
        "| tollgate_claim + tollgate_settle c8 (no application) | {ceiling8_tps:.0} | {:.2} |",
        mean(&ceiling8, |r| r.latency_ms)
    );
    println!(
        "| the same under a limit that never refuses c8 | {limited8_tps:.0} | {:.2} |",
        mean(&limited8, |r| r.latency_ms)
    );
    println!("pgbench failed transactions: {pg_failed} of {pg_total}");
    println!();
    println!(
        "| case | ok/s | p50 ms | p99 ms | failed/attempted | server CPU ms/call | Postgres CPU ms/call | commits/call | tup_returned/call | tup_fetched/call | statements/call |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (case, observed) in &seen {
        print_row(&case.name(), observed, service.ticks_per_sec);
    }
    println!(
        "peak RSS with {} calls in flight on {SLOW_MODEL}: {:.1} MiB (VmHWM of a fresh server), {rss_ok} completed, {rss_failed} failed, {:.1} s",
        knobs.in_flight,
        rss_kib as f64 / 1024.0,
        rss_wall.as_secs_f64()
    );

    let best = |f: fn(&Case) -> bool| {
        seen.iter()
            .filter(|(c, _)| f(c))
            .map(|(_, o)| o.per_sec())
            // NaN when no case of the family ran, so its ratios read "not measured".
            .fold(f64::NAN, f64::max)
    };
    let one_scope = best(|c| matches!(c, Case::OneScope(_)));
    let eight = best(|c| matches!(c, Case::EightScopes(_)));
    let hot = best(|c| matches!(c, Case::HotCap(_)));
    let hot_limited = best(|c| matches!(c, Case::HotLimited(_)));
    let replays = best(|c| matches!(c, Case::Replay(_)));
    let two = best(|c| matches!(c, Case::TwoServers(_)));
    let two_one = best(|c| matches!(c, Case::TwoServersOneConsumer(_)));
    let p50 = |case: Case| {
        seen.get(&case)
            .and_then(|o| o.percentile(50))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    };
    let p99 = |case: Case| {
        seen.get(&case)
            .and_then(|o| o.percentile(99))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    };
    let added = p50(Case::OneScope(1)) - p50(Case::MockDirect(1));
    println!();
    println!("| ratio | value | target | |");
    println!("|---|---|---|---|");
    let at_least = |name: &str, value: f64, target: f64| {
        ratio_row(name, value, &format!("≥ {target:.2}"), value >= target);
    };
    at_least(
        "first calls/s, 1 scope over 8 consumers (best of c1/c16/c64) / TPC-B c8 TPS",
        one_scope / tpcb8_tps,
        1.0,
    );
    info_row(
        "the design's ceiling: claim + settle functions by pgbench c8 / TPC-B c8 TPS",
        ceiling8_tps / tpcb8_tps,
    );
    info_row(
        "first calls/s, 1 scope (best) / the design's ceiling",
        one_scope / ceiling8_tps,
    );
    at_least(
        "first calls/s, 8 scopes / TPC-B c8 TPS",
        eight / tpcb8_tps,
        1.0,
    );
    at_least(
        "first calls/s, 1 hot cap / TPC-B c8 TPS",
        hot / tpcb8_tps,
        0.9,
    );
    info_row(
        "claim + settle functions under a limit that never refuses / without, by pgbench c8",
        limited8_tps / ceiling8_tps,
    );
    at_least(
        "first calls/s, 1 hot cap under limits that never refuse / the same without limits",
        hot_limited / hot,
        0.9,
    );
    at_least(
        "first calls/s, 2 servers, 8 consumers / TPC-B c8 TPS",
        two / tpcb8_tps,
        0.75,
    );
    at_least(
        "first calls/s, 1 consumer on 2 servers / TPC-B c8 TPS",
        two_one / tpcb8_tps,
        0.75,
    );
    at_least(
        "first calls/s, 2 servers, 8 consumers / 1 server, 1 scope",
        two / one_scope,
        1.0,
    );
    at_least(
        "first calls/s, 1 consumer on 2 servers / 1 server, 1 scope",
        two_one / one_scope,
        1.0,
    );
    for case in CASES.iter().filter(|c| c.concurrency() == 64) {
        let ratio = p99(*case) / p50(*case);
        ratio_row(
            &format!("p99 / p50, {}", case.name()),
            ratio,
            "≤ 2.50",
            ratio <= 2.5,
        );
    }
    ratio_row(
        &format!("added latency c1 ({added:.2} ms = p50 call − p50 mock) / TPC-B c1 latency"),
        added / tpcb1_lat,
        "≤ 3",
        added / tpcb1_lat <= 3.0,
    );
    at_least(
        "replays/s c16 / select-only c16 TPS",
        replays / select16_tps,
        0.6,
    );
    ratio_row(
        &format!("peak RSS MiB, {} in flight", knobs.in_flight),
        rss_kib as f64 / 1024.0,
        "≤ 100",
        (rss_kib as f64 / 1024.0) <= 100.0 && rss_failed == 0,
    );
    if let Some((kib, ran, failed)) = many_rss {
        ratio_row(
            &format!("peak RSS MiB, {ran} in flight over HTTP/2, all completed"),
            kib as f64 / 1024.0,
            "≤ 1024",
            (kib as f64 / 1024.0) <= 1024.0 && failed == 0 && ran >= knobs.many_in_flight,
        );
    }

    drop(service);
    mock.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- growth ------------------------------------------------------------------------------------

const GROWTH_SCOPE: &str = "growth";
const GROWTH_TEMPLATE: &str = "template";
/// Rows per page of the usage reconciliation (the scheduler's batch).
const PAGE: u32 = 100;

fn request(key: &str) -> RunRequest {
    RunRequest {
        scope: Scope::parse(GROWTH_SCOPE).unwrap(),
        session_id: SessionId::parse("g").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        input_revision: InputRevision::parse("r").unwrap(),
        intent: Intent::parse("growth").unwrap(),
        load_input: async { Ok(vec![Message::text(Role::User, "summarize order 123")]) }.boxed(),
        cancel: CancellationToken::new(),
        limits: Vec::new(),
    }
}

/// Median of `n` timings of `f`.
async fn median<F, Fut>(n: usize, mut f: F) -> Duration
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        f(i).await;
        all.push(t.elapsed());
    }
    all.sort();
    all[n / 2]
}

async fn growth_section(knobs: &Knobs, admin: &str) {
    if knobs.growth.is_empty() {
        println!("growth: skipped (TOLLGATE_HARNESS_GROWTH is empty)");
        return;
    }
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let db = TestDatabase::create(admin).await.unwrap();
    let stores: PgStores = db.stores(4).await.unwrap();
    stores.migrate().await.unwrap();
    let stores = Arc::new(stores);
    let client = Arc::new(
        HttpClient::new(HttpClientConfig {
            protocol: Protocol::OpenAiChat,
            base_url: mock.base_url(),
            api_key: None,
            connect_timeout_ms: 2_000,
            read_timeout_ms: 10_000,
            max_attempts: 1,
        })
        .unwrap(),
    );
    let runner =
        SingleCallRunner::new(stores.clone(), client, RunnerSettings::new(text_config())).unwrap();
    runner.run(request(GROWTH_TEMPLATE)).await.unwrap();
    let reconciler = Reconciler::new(stores.clone(), Arc::new(SystemClock));
    let scope = Scope::parse(GROWTH_SCOPE).unwrap();
    let mut rows = 1_u64;
    let mut table = Vec::new();
    for (step, &size) in knobs.growth.iter().enumerate() {
        if size > rows {
            let t = Instant::now();
            rows += db
                .seed_copies(
                    GROWTH_SCOPE,
                    GROWTH_TEMPLATE,
                    &format!("-g{step}-"),
                    size - rows,
                    true,
                )
                .await
                .unwrap();
            println!(
                "seeded to {rows} executions (open evidence for every copy) in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
        let probe = format!("{GROWTH_TEMPLATE}-g{step}-1");
        let read = median(51, |i| {
            let key = if i % 2 == 0 {
                GROWTH_TEMPLATE.to_string()
            } else {
                probe.clone()
            };
            let (stores, scope) = (stores.clone(), scope.clone());
            async move {
                let key = OperationKey::parse(key).unwrap();
                let view = tollgate_runner::views::read(&*stores, &scope, &key, chrono::Utc::now())
                    .await
                    .unwrap();
                assert!(view.is_some());
            }
        })
        .await;
        let replay = median(51, |_| {
            let runner = &runner;
            async move {
                runner.run(request(GROWTH_TEMPLATE)).await.unwrap();
            }
        })
        .await;
        let page = median(5, |_| {
            let (reconciler, scope) = (&reconciler, scope.clone());
            async move {
                let counts = reconciler
                    .reconcile_usage(&scope, Some(PAGE), None, &|_| false)
                    .await
                    .unwrap();
                assert!(counts.scanned > 0);
            }
        })
        .await;
        let scan = median(11, |_| {
            let stores = stores.clone();
            async move {
                let scopes = stores.scopes_with_work(None, 100).await.unwrap();
                assert!(!scopes.is_empty());
            }
        })
        .await;
        let plans = db
            .explain_hot_path(GROWTH_SCOPE, GROWTH_TEMPLATE, i64::from(PAGE))
            .await
            .unwrap();
        table.push((rows, read, replay, page, scan, plans));
    }
    println!();
    println!("## Growth (in-process library calls on Postgres; medians)");
    println!();
    println!("| executions | read by key ms | replay ms | reconcile_usage page of {PAGE} ms | scopes with work ms |");
    println!("|---|---|---|---|---|");
    for (rows, read, replay, page, scan, _) in &table {
        println!(
            "| {rows} | {} | {} | {} | {} |",
            ms(Some(*read)),
            ms(Some(*replay)),
            ms(Some(*page)),
            ms(Some(*scan))
        );
    }
    if let (Some(first), Some(last)) = (table.first(), table.last()) {
        let r = |a: Duration, b: Duration| b.as_secs_f64() / a.as_secs_f64();
        println!(
            "| {}× rows: ratio to the first | {:.2} | {:.2} | {:.2} | {:.2} |",
            last.0 / first.0.max(1),
            r(first.1, last.1),
            r(first.2, last.2),
            r(first.3, last.3),
            r(first.4, last.4)
        );
    }
    println!();
    println!("| executions | query | plan | rows scanned | buffers | ms |");
    println!("|---|---|---|---|---|---|");
    for (rows, _, _, _, _, plans) in &table {
        for p in plans {
            println!(
                "| {rows} | {} | {} | {:.0} | {} | {:.3} |",
                p.name, p.nodes, p.rows_scanned, p.buffers, p.execution_ms
            );
        }
    }
    drop(runner);
    mock.shutdown().await;
}

// ---- collector ---------------------------------------------------------------------------------

/// Characters of the collected text per stream.
const COLLECTOR_CHARS: u64 = 200_000;

async fn collector_section() {
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let model = format!("mock-big@{COLLECTOR_CHARS}");
    let messages = json!([{"role": "user", "content": "go"}]);
    let cases = [
        (
            Protocol::OpenAiChat,
            "openai-chat",
            "/v1/chat/completions",
            json!({"model": model, "stream": true, "messages": messages,
                   "stream_options": {"include_usage": true}}),
        ),
        (
            Protocol::OpenAiResponses,
            "openai-responses",
            "/v1/responses",
            json!({"model": model, "stream": true, "input": messages}),
        ),
        (
            Protocol::Anthropic,
            "anthropic",
            "/v1/messages",
            json!({"model": model, "stream": true, "max_tokens": 64, "messages": messages}),
        ),
    ];
    let limits = CollectorLimits {
        max_output_chars: 10_000_000,
        max_reasoning_chars: 1_000_000,
        max_consecutive_reasoning: None,
    };
    println!();
    println!(
        "## Collector (SSE parse + step collection, {COLLECTOR_CHARS} chars in 16-char deltas)"
    );
    println!();
    println!("| protocol | stream bytes | parse + collect MB/s | serde_json::from_slice MB/s | ratio (target ≥ 0.30) |");
    println!("|---|---|---|---|---|");
    for (protocol, name, path, body) in cases {
        let bytes = http
            .post(format!("{}{path}", mock.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        // The JSON payloads of the same stream, for the baseline.
        let text = String::from_utf8_lossy(&bytes).to_string();
        let payloads: Vec<&[u8]> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim_start)
            .filter(|d| *d != "[DONE]")
            .map(str::as_bytes)
            .collect();
        let collected = tollgate_provider::parse::parse_stream(protocol, &bytes, limits);
        let text_len = collected["step"]["text"]
            .as_str()
            .or_else(|| collected["step"]["content"][0]["text"].as_str())
            .map(str::len);
        assert!(
            collected["stream_error"].is_null(),
            "{name}: the stream parses cleanly: {}",
            collected["stream_error"]
        );
        let iterations = 20;
        let mbs = |elapsed: Duration| {
            bytes.len() as f64 * iterations as f64 / 1e6 / elapsed.as_secs_f64()
        };
        // Alternate the two measurements (H-7), keeping their sums.
        let (mut parse_time, mut serde_time) = (Duration::ZERO, Duration::ZERO);
        for i in 0..iterations * 2 {
            let parse_turn = (i % 2 == 0) == (i / 2 % 2 == 0);
            let t = Instant::now();
            if parse_turn {
                std::hint::black_box(tollgate_provider::parse::parse_stream(
                    protocol, &bytes, limits,
                ));
                parse_time += t.elapsed();
            } else {
                for p in &payloads {
                    std::hint::black_box(serde_json::from_slice::<Value>(p).unwrap());
                }
                serde_time += t.elapsed();
            }
        }
        let (parse, serde) = (mbs(parse_time), mbs(serde_time));
        println!(
            "| {name} | {} ({} payloads{}) | {parse:.1} | {serde:.1} | {:.2} |",
            bytes.len(),
            payloads.len(),
            text_len.map_or(String::new(), |n| format!(", {n} chars collected")),
            parse / serde
        );
    }
    mock.shutdown().await;
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    if std::env::args().skip(1).any(|a| a != "--bench") {
        println!("harness: no filters or options; see the knobs in the file's header");
    }
    let knobs = Knobs::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let admin = test_admin_url();
    let started = Instant::now();
    runtime.block_on(async {
        if knobs.runs("load") {
            require_pgbench();
            require_wrk();
            load_section(&knobs, &admin).await;
        }
        if knobs.runs("growth") {
            growth_section(&knobs, &admin).await;
        }
        if knobs.runs("collector") {
            collector_section().await;
        }
    });
    println!();
    println!("harness done in {:.0} s", started.elapsed().as_secs_f64());
}
