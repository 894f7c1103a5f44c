//! Database faults under load (SC-204): two real `tollgate serve` processes reach one fresh
//! Postgres database through a TCP proxy that this test runs and controls, while eight clients
//! send calls to both of them. At seeded moments the database ends every backend of the database
//! (`pg_terminate_backend`), the proxy closes every connection at once (a reset), refuses
//! connections for a while after closing them (an outage, as a database restart looks from the
//! client), or stops forwarding bytes without closing anything (a black hole, a half-open route).
//! Afterwards the schedulers finish whatever is left in flight, and the test checks that no call
//! reached the provider twice, nothing was charged twice, no request hung past its timeout, the
//! ledger and the audit chains are clean, no output the provider answered was lost, and that
//! calls succeed again right after each fault (spec/journal.md — A call's last writes outlive a
//! store outage; spec/storage.md — Connections the database ends).
//!
//! The mock provider runs in this process and counts requests by prompt; every operation key has
//! a prompt of its own (`dbf-<key>`), so each key's sends are observable.
//!
//! - `TOLLGATE_DB_FAULTS_SEED=N` replays the fault schedule and the clients' choices of a run (the
//!   seed is printed at the start and in every failure; without it the seed is [`DEFAULT_SEED`]).
//!
//! The servers' stderr goes to `target/tmp/db_faults/<case>-server-<a|b>.log`. Postgres as for
//! every suite: `TOLLGATE_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Run with `--nocapture` to see the figures.
#![cfg(test)]

mod support;
use support::{env_u64, Rng, TempDir};

use chrono::{Days, Utc};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::{ExecutionId, Scope};
use tollgate_core::money::Money;
use tollgate_core::state::{ExecutionState, Outcome};
use tollgate_mock_provider::MockProvider;
use tollgate_postgres::PgStores;
use tollgate_server::auth::generate_key;
use tollgate_store::{
    ExecutionRecord, ExecutionStore, KeyDigest, ResultStore, SettlementRecord, SettlementStore,
    StoreError,
};
use tollgate_testkit::pg::cluster::{Pgbouncer, PoolMode, Replicated};
use tollgate_testkit::pg::TestDatabase;

/// The scope of every key.
const SCOPE: &str = "dbfaults";
/// Concurrent client tasks.
const CLIENTS: u64 = 8;
/// The seed of a run without `TOLLGATE_DB_FAULTS_SEED`: fixed, so that CI runs are reproducible.
const DEFAULT_SEED: u64 = 0x6462_6661_2026;
/// `[runner] lease_ms`: the default lease, longer than the outage.
const LEASE_MS: u64 = 3_000;
/// `[runner] lease_ms` of the failover case: a promotion on a loaded two-core machine has taken
/// 5 s, and a call in flight must keep its fence through it to settle its own output.
const FAILOVER_LEASE_MS: u64 = 20_000;
/// `[scheduler] interval_ms`: short, so that what is left in flight is recovered quickly.
const INTERVAL_MS: u64 = 300;
/// Run timeout of both profiles: far above a call's own time, so only the database decides.
const RUN_TIMEOUT_MS: u64 = 10_000;
/// How long a client waits for one answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);
/// What a request may take beyond [`CLIENT_TIMEOUT`] before it counts as hung (scheduling on a
/// busy two-core machine).
const CLIENT_MARGIN: Duration = Duration::from_secs(2);
/// The load runs this long (ms, seeded) before the first fault.
const FIRST_FAULT_AFTER_MS: (u64, u64) = (1_500, 3_000);
/// After the calls succeed again, the load runs this long (ms, seeded) before the next fault.
const GAP_MS: (u64, u64) = (1_500, 3_000);
/// The load runs this long after the last fault's recovery.
const TAIL: Duration = Duration::from_secs(2);
/// A fresh call to each server succeeds within this long of a fault's end.
const RECOVERED_WITHIN: Duration = Duration::from_secs(5);
/// How long the probes keep trying before a fault counts as not recovered.
const PROBE_FOR: Duration = Duration::from_secs(30);
/// The outage: shorter than the lease, so a call that waits it out keeps its fence.
const OUTAGE_MS: u64 = 1_500;
/// The black hole.
const BLACK_HOLE_MS: u64 = 1_000;
/// How long a server may take to answer `/readyz` after its start.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long the schedulers may take, after the load stops, to finish every execution in flight.
const DRAIN_WITHIN: Duration = Duration::from_secs(30);
/// How long a termination waits for the server to list no backend of the database before it
/// goes on: the servers reconnect at once under load, so the wait may never see none.
const TERMINATE_WAIT: Duration = Duration::from_secs(2);
/// Upper bound of rows read back per state (far above what a run creates).
const READ_LIMIT: u32 = 1_000_000;

/// The cases run one after the other: each runs two servers on a two-core machine, and their
/// timing (leases, recovery) must not depend on another case's load.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---- seeded randomness --------------------------------------------------------------------------

fn seed() -> u64 {
    env_u64("TOLLGATE_DB_FAULTS_SEED").unwrap_or(DEFAULT_SEED)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---- the proxy ----------------------------------------------------------------------------------

/// The connections of one generation: a reset cancels the token and waits until none is left.
#[derive(Clone)]
struct Generation {
    token: CancellationToken,
    live: Arc<AtomicU64>,
}

impl Generation {
    fn new() -> Self {
        Self {
            token: CancellationToken::new(),
            live: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// Counts a connection of a generation as live while it exists.
struct Live(Arc<AtomicU64>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the proxy counted, in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ProxyCounts {
    /// Client connections accepted and forwarded.
    accepted: u64,
    /// Client connections accepted during an outage and closed at once.
    refused: u64,
    /// Connections closed by a reset (or at the start of an outage, or at a black hole's end).
    reset: u64,
    /// Connections the database closed (a terminated backend).
    closed_by_database: u64,
    /// Connections whose upstream connect failed.
    upstream_failures: u64,
}

impl ProxyCounts {
    fn since(self, before: Self) -> Self {
        Self {
            accepted: self.accepted - before.accepted,
            refused: self.refused - before.refused,
            reset: self.reset - before.reset,
            closed_by_database: self.closed_by_database - before.closed_by_database,
            upstream_failures: self.upstream_failures - before.upstream_failures,
        }
    }
}

struct ProxyShared {
    upstream: String,
    generation: Mutex<Generation>,
    /// Until when new connections are refused.
    refuse_until: Mutex<Option<Instant>>,
    /// `true` while the route is a black hole.
    paused: watch::Sender<bool>,
    counts: Mutex<ProxyCounts>,
}

impl ProxyShared {
    fn count(&self, f: impl FnOnce(&mut ProxyCounts)) {
        f(&mut lock(&self.counts));
    }
}

/// A TCP proxy on loopback between the servers and Postgres, one upstream connection per client
/// connection, bytes copied both ways, with the faults the test injects.
struct Proxy {
    port: u16,
    shared: Arc<ProxyShared>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (paused, _) = watch::channel(false);
        let shared = Arc::new(ProxyShared {
            upstream: upstream.to_string(),
            generation: Mutex::new(Generation::new()),
            refuse_until: Mutex::new(None),
            paused,
            counts: Mutex::new(ProxyCounts::default()),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Self {
            port,
            shared,
            accept,
        }
    }

    fn counts(&self) -> ProxyCounts {
        *lock(&self.shared.counts)
    }

    /// Connections open now.
    fn open(&self) -> u64 {
        lock(&self.shared.generation).live.load(Ordering::SeqCst)
    }

    /// Closes every proxied connection at once (both sides dropped) and waits, bounded, until
    /// all of them are gone; answers how many were open.
    async fn reset(&self) -> u64 {
        let old = std::mem::replace(&mut *lock(&self.shared.generation), Generation::new());
        let open = old.live.load(Ordering::SeqCst);
        old.token.cancel();
        let deadline = Instant::now() + Duration::from_secs(5);
        while old.live.load(Ordering::SeqCst) > 0 {
            assert!(
                Instant::now() < deadline,
                "the proxy's connections did not close within 5 s of a reset"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        open
    }

    /// Closes every connection and refuses new ones (accepts and closes them at once) for `ms`,
    /// as a database restart looks from the client; answers how many were open.
    async fn outage(&self, ms: u64) -> u64 {
        *lock(&self.shared.refuse_until) = Some(Instant::now() + Duration::from_millis(ms));
        let open = self.reset().await;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        *lock(&self.shared.refuse_until) = None;
        open
    }

    /// Keeps every connection open but forwards no byte either way for `ms` (new connections
    /// wait too), then resumes them, or closes them when `then_reset`; answers how many were
    /// open.
    async fn black_hole(&self, ms: u64, then_reset: bool) -> u64 {
        self.shared.paused.send_replace(true);
        let open = self.open();
        tokio::time::sleep(Duration::from_millis(ms)).await;
        if then_reset {
            self.reset().await;
        }
        self.shared.paused.send_replace(false);
        open
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        lock(&self.shared.generation).token.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<ProxyShared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors, say: pacing, not a wait for anything.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let refusing = lock(&shared.refuse_until).is_some_and(|until| Instant::now() < until);
        if refusing {
            shared.count(|c| c.refused += 1);
            drop(client);
            continue;
        }
        shared.count(|c| c.accepted += 1);
        let generation = lock(&shared.generation).clone();
        generation.live.fetch_add(1, Ordering::SeqCst);
        let live = Live(generation.live.clone());
        tokio::spawn(forward(shared.clone(), client, generation.token, live));
    }
}

/// Waits while the route is a black hole.
async fn route_open(paused: &mut watch::Receiver<bool>) {
    let _ = paused.wait_for(|paused| !*paused).await;
}

/// Copies `from` to `to` until either ends; forwards nothing while the route is a black hole.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut paused: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        route_open(&mut paused).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        route_open(&mut paused).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn forward(
    shared: Arc<ProxyShared>,
    client: TcpStream,
    token: CancellationToken,
    _live: Live,
) {
    let mut paused = shared.paused.subscribe();
    // A connection opened into a black hole gets no answer until the route opens again.
    tokio::select! {
        () = token.cancelled() => return,
        () = route_open(&mut paused) => {}
    }
    let upstream = tokio::select! {
        () = token.cancelled() => return,
        upstream = TcpStream::connect(&shared.upstream) => upstream,
    };
    let Ok(upstream) = upstream else {
        shared.count(|c| c.upstream_failures += 1);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    tokio::select! {
        () = token.cancelled() => shared.count(|c| c.reset += 1),
        () = pump(client_read, upstream_write, shared.paused.subscribe()) => {}
        () = pump(upstream_read, client_write, shared.paused.subscribe()) => {
            shared.count(|c| c.closed_by_database += 1);
        }
    }
    // Both halves of both sockets are dropped here: the connection is closed on both sides.
}

/// `(url before the host, host:port, url after it)` of a Postgres URL.
fn split_url(url: &str) -> (String, String, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host.to_string()),
        None => (String::new(), authority.to_string()),
    };
    let host = if host.contains(':') {
        host
    } else {
        format!("{host}:5432")
    };
    (format!("{scheme}://{user}"), host, path.to_string())
}

// ---- the faults ---------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `pg_terminate_backend` of every backend of the database.
    Terminate,
    /// The proxy closes every connection.
    Reset,
    /// The proxy closes every connection and refuses new ones for `OUTAGE_MS`.
    Outage,
    /// The proxy forwards nothing for `BLACK_HOLE_MS`, then resumes.
    BlackHoleResumed,
    /// The proxy forwards nothing for `BLACK_HOLE_MS`, then closes every connection.
    BlackHoleReset,
    /// The primary's postmaster is killed with SIGKILL and its synchronous standby promoted.
    Failover,
}

impl Fault {
    fn name(self) -> String {
        match self {
            Fault::Terminate => "terminate backends".into(),
            Fault::Reset => "proxy reset".into(),
            Fault::Outage => format!("outage {OUTAGE_MS} ms"),
            Fault::BlackHoleResumed => format!("black hole {BLACK_HOLE_MS} ms, resumed"),
            Fault::BlackHoleReset => format!("black hole {BLACK_HOLE_MS} ms, reset"),
            Fault::Failover => "primary killed, standby promoted".into(),
        }
    }
}

/// What one fault did, and how long the calls took to succeed again.
#[derive(Debug, Clone)]
struct Struck {
    fault: Fault,
    /// Since the start of the load.
    began: Duration,
    ended: Duration,
    /// Executions `prepared` or `dispatched` just before the fault.
    in_flight: usize,
    /// Backends the database terminated (`None`: the wait for none to be listed was cut short
    /// because the servers reconnected at once).
    terminated: Option<u64>,
    /// Proxied connections open when the fault struck.
    open: u64,
    /// What the proxy counted from the fault's start to the probes' success.
    proxy: ProxyCounts,
    /// From the fault's end to the first successful call, per server, and the calls it took.
    first_success: [Option<(Duration, u32)>; 2],
}

// ---- the configuration and the servers ----------------------------------------------------------

/// `(profile, provider, model, consumer)`: a quick chat model, and a slow one on the Anthropic
/// protocol whose sends are in flight for 300 ms, so faults land before, during and after sends.
const PROFILES: [(&str, &str, &str, &str); 2] = [
    ("echo", "mock-chat", "mock-echo", "team-a"),
    ("slow", "mock-anthropic", "mock-slow-300", "team-b"),
];

fn config_text(database_url: &str, mock_url: &str, caller_sha: &str, lease_ms: u64) -> String {
    let mut text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
# The members' counters of forwarded calls are read from `/metrics` (H-39).
metrics_public = true

[database]
url = "{database_url}"
max_connections = 8

[scheduler]
interval_ms = {INTERVAL_MS}
batch = 100

[runner]
lease_ms = {lease_ms}

[[providers]]
name = "mock-chat"
kind = "openai-chat"
base_url = "{mock_url}"

[[providers]]
name = "mock-anthropic"
kind = "anthropic"
base_url = "{mock_url}"

[[keys]]
scope = "{SCOPE}"
role = "caller"
sha256 = "{caller_sha}"

[[prices]]
version = "prices-dbf"
currency = "USD"
"#
    );
    for (_, _, model, _) in PROFILES {
        text.push_str(&format!(
            r#"[prices.models."{model}"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"
"#
        ));
    }
    for (name, provider, model, consumer) in PROFILES {
        text.push_str(&format!(
            r#"
[[profiles]]
name = "{name}"
kind = "text"
provider = "{provider}"
model = "{model}"
policy_version = "policy-1"
price_version = "prices-dbf"
consumer = "{consumer}"
max_tokens = 64
max_input_chars = 2000
max_output_chars = 2000
run_timeout_ms = {RUN_TIMEOUT_MS}
"#
        ));
    }
    text
}

/// The built binary (`support::tollgate`), also without the developer's `TOLLGATE_*` settings.
fn tollgate() -> Command {
    let mut command = support::tollgate();
    for (name, _) in std::env::vars() {
        if name.to_ascii_uppercase().starts_with("TOLLGATE_") {
            command.env_remove(name);
        }
    }
    command
}

/// Lines of a server's stderr kept for failure reports (all of it is in its log file).
const LOG_LINES: usize = 60;

/// One `tollgate serve` process, its address, its log file and the tail of its stderr.
struct Server {
    name: String,
    child: Child,
    base: String,
    log_file: PathBuf,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl Server {
    /// Starts `tollgate serve --config CONFIG` (its database is the config's `[database] url`)
    /// and waits until it answers `/readyz`.
    async fn start(name: String, config: &Path, log_file: PathBuf, http: &reqwest::Client) -> Self {
        // The servers are members of one cluster (H-39): each names the port it listens on as
        // its `[cluster] url`; their heartbeats reach the database through the same route as
        // their calls, so the faults below reach the membership too.
        let mut child = tollgate()
            .arg("serve")
            .arg("--config")
            .arg(config)
            .envs(support::member_env(support::CLUSTER_SECRET))
            .current_dir(config.parent().unwrap_or(Path::new(".")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, mut listening) = mpsc::unbounded_channel::<String>();
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let mut file = std::fs::File::create(&log_file)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log_file.display()));
        let kept = tail.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or_default();
                    let _ = tx.send(addr.to_string());
                }
                let _ = writeln!(file, "{line}");
                let mut kept = lock(&kept);
                if kept.len() == LOG_LINES {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        let mut server = Self {
            name,
            child,
            base: String::new(),
            log_file,
            tail,
        };
        server.base = match tokio::time::timeout(READY_WITHIN, listening.recv()).await {
            Ok(Some(base)) => base,
            _ => panic!(
                "{} did not start listening (exit {:?})\n{}",
                server.name,
                server.child.try_wait().ok().flatten(),
                server.log_tail()
            ),
        };
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let ready = http
                .get(format!("{}/readyz", server.base))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return server;
            }
            server.assert_alive("startup");
            assert!(
                Instant::now() < deadline,
                "{} never became ready\n{}",
                server.name,
                server.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log_tail(&self) -> String {
        let tail = lock(&self.tail);
        let lines: Vec<String> = tail
            .iter()
            .map(|l| format!("[{}] {l}", self.name))
            .collect();
        format!(
            "--- {} (all of it in {}) ---\n{}",
            self.name,
            self.log_file.display(),
            lines.join("\n")
        )
    }

    /// Fails when the process exited on its own.
    fn assert_alive(&mut self, context: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{context}: {} exited on its own with {status}\n{}",
                self.name,
                self.log_tail()
            );
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- the load -----------------------------------------------------------------------------------

/// The prompt of a key: unique per key, so the mock counts each key's sends.
fn prompt_of(key: &str) -> String {
    format!("dbf-{key}")
}

fn call_body(profile: &str, key: &str, session: &str) -> Value {
    json!({
        "profile": profile, "operation_key": key, "session_id": session,
        "input_revision": "r-1", "intent": "db-faults",
        "input": {"messages": [{"role": "user", "content": prompt_of(key)}]}
    })
}

/// How one request ended (no content: the view's state and outcome only).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    /// An HTTP answer: status, and for a view its state and outcome.
    Answer {
        status: u16,
        state: Option<String>,
        outcome: Option<String>,
    },
    /// No answer within [`CLIENT_TIMEOUT`].
    TimedOut,
    /// The connection failed.
    Transport(String),
}

impl Reply {
    fn status(&self) -> Option<u16> {
        match self {
            Reply::Answer { status, .. } => Some(*status),
            _ => None,
        }
    }

    fn succeeded(&self) -> bool {
        matches!(self, Reply::Answer { status: 200, state: Some(s), outcome: Some(o) }
            if s == "completed" && o == "success")
    }

    fn short(&self) -> String {
        match self {
            Reply::Answer {
                status,
                state,
                outcome,
            } => format!(
                "{status} {} {}",
                state.as_deref().unwrap_or("-"),
                outcome.as_deref().unwrap_or("-")
            ),
            Reply::TimedOut => "timed out".into(),
            Reply::Transport(e) => format!("transport error: {e}"),
        }
    }
}

/// Why a request was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A client's call (or its retry on the other server).
    Load,
    /// A fresh call right after a fault, until one succeeds.
    Probe,
    /// After the drain, the same call again, for a key whose call was acknowledged.
    Replay,
}

/// One HTTP request of a client, a probe or a replay.
#[derive(Debug, Clone)]
struct Request {
    key: String,
    profile: &'static str,
    server: usize,
    kind: Kind,
    /// Since the start of the load.
    began: Duration,
    took: Duration,
    reply: Reply,
}

/// State shared by the driver and the clients.
struct Load {
    seed: u64,
    http: reqwest::Client,
    caller: String,
    bases: [String; 2],
    started: Instant,
    stop: AtomicBool,
    requests: Mutex<Vec<Request>>,
}

impl Load {
    async fn post(&self, server: usize, key: &str, profile: &'static str, kind: Kind) -> Reply {
        let began = self.started.elapsed();
        let session = format!("s-{}", key.split('-').next().unwrap_or(key));
        let body = call_body(profile, key, &session);
        let sent = self
            .http
            .post(format!("{}/v1/calls", self.bases[server]))
            .bearer_auth(&self.caller)
            .timeout(CLIENT_TIMEOUT)
            .json(&body)
            .send()
            .await;
        let reply = match sent {
            Err(e) if e.is_timeout() => Reply::TimedOut,
            Err(e) => Reply::Transport(e.to_string()),
            Ok(response) => {
                let status = response.status().as_u16();
                match response.text().await {
                    Err(e) if e.is_timeout() => Reply::TimedOut,
                    Err(e) => Reply::Transport(e.to_string()),
                    Ok(text) => {
                        let view: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                        let field = |name: &str| view[name].as_str().map(str::to_string);
                        Reply::Answer {
                            status,
                            state: field("state"),
                            outcome: field("outcome"),
                        }
                    }
                }
            }
        };
        lock(&self.requests).push(Request {
            key: key.to_string(),
            profile,
            server,
            kind,
            began,
            took: self.started.elapsed() - began,
            reply: reply.clone(),
        });
        reply
    }

    /// New keys one after the other; a call answered 503 or not answered is sent once more, the
    /// same key to the other server, as a caller does with an uncertain call.
    async fn client(self: Arc<Self>, client: u64) {
        let mut rng = Rng(self.seed ^ (client + 1).wrapping_mul(0xA076_1D64_78BD_642F));
        let mut n = 0;
        while !self.stop.load(Ordering::SeqCst) {
            n += 1;
            let key = format!("c{client}-k{n}");
            // A third of the calls on the slow model.
            let (profile, ..) = match rng.next() % 3 {
                0 => PROFILES[1],
                _ => PROFILES[0],
            };
            let server = (rng.next() % 2) as usize;
            let reply = self.post(server, &key, profile, Kind::Load).await;
            let uncertain = matches!(reply, Reply::Transport(_)) || reply.status() == Some(503);
            if uncertain {
                // Pacing of the caller's retry, not a wait for anything.
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.post(1 - server, &key, profile, Kind::Load).await;
            }
        }
    }

    /// Fresh calls to `server` until one succeeds; answers how long after `since` that was.
    async fn first_success(
        &self,
        server: usize,
        fault: usize,
        since: Instant,
    ) -> Option<(Duration, u32)> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let key = format!("p{fault}-s{server}-a{attempt}");
            if self
                .post(server, &key, "echo", Kind::Probe)
                .await
                .succeeded()
            {
                return Some((since.elapsed(), attempt));
            }
            if since.elapsed() > PROBE_FOR {
                return None;
            }
            // Pacing of the probes, not a wait for anything.
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Load {
    /// Sends every acknowledged call once more (the same key, the same body), [`CLIENTS`] at a
    /// time, alternating the servers: each must answer its stored outcome and send nothing.
    async fn replay_acknowledged(self: &Arc<Self>) {
        let mut acknowledged: Vec<(String, &'static str)> = Vec::new();
        for r in lock(&self.requests).iter() {
            if r.reply.succeeded() && !acknowledged.iter().any(|(k, _)| k == &r.key) {
                acknowledged.push((r.key.clone(), r.profile));
            }
        }
        let queue = Arc::new(Mutex::new(acknowledged));
        let replayers: Vec<_> = (0..CLIENTS)
            .map(|n| {
                let (load, queue) = (self.clone(), queue.clone());
                tokio::spawn(async move {
                    let server = usize::from(n % 2 == 1);
                    loop {
                        let Some((key, profile)) = lock(&queue).pop() else {
                            return;
                        };
                        load.post(server, &key, profile, Kind::Replay).await;
                    }
                })
            })
            .collect();
        for replayer in replayers {
            replayer.await.unwrap();
        }
    }
}

// ---- reading the outcome back (store traits only: SQL lives in tollgate-postgres) ---------------

/// Retries a read through the test's own stores: the terminations end their connections too.
async fn read<T, F, Fut>(what: &str, f: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match f().await {
            Ok(value) => return value,
            Err(_) if attempt < 20 => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

const ALL_STATES: [ExecutionState; 5] = [
    ExecutionState::Prepared,
    ExecutionState::Dispatched,
    ExecutionState::Completed,
    ExecutionState::NotDispatched,
    ExecutionState::ReconciliationRequired,
];

async fn executions(stores: &PgStores, scope: &Scope) -> Vec<ExecutionRecord> {
    let mut all = Vec::new();
    for state in ALL_STATES {
        all.extend(read("executions", || stores.by_state(scope, state, READ_LIMIT)).await);
    }
    all
}

async fn in_flight(stores: &PgStores, scope: &Scope) -> Vec<ExecutionRecord> {
    let mut open = Vec::new();
    for state in [ExecutionState::Prepared, ExecutionState::Dispatched] {
        open.extend(read("in flight", || stores.by_state(scope, state, READ_LIMIT)).await);
    }
    open
}

/// Every settlement of `scope` (settlements are listed by accounting day; a run spans at most a
/// day boundary).
async fn settlements(stores: &PgStores, scope: &Scope) -> Vec<SettlementRecord> {
    let today = Utc::now().date_naive();
    let from = today.checked_sub_days(Days::new(2)).unwrap_or(today);
    let to = today.checked_add_days(Days::new(2)).unwrap_or(today);
    read("settlements", || stores.settlements(from, to, READ_LIMIT))
        .await
        .into_iter()
        .filter(|s| &s.scope == scope)
        .collect()
}

/// Waits until no execution of `scope` is `prepared` or `dispatched`; answers how long it took.
async fn drain(stores: &PgStores, scope: &Scope, context: &str, servers: &[Server]) -> Duration {
    let started = Instant::now();
    loop {
        let open = in_flight(stores, scope).await;
        if open.is_empty() {
            return started.elapsed();
        }
        if started.elapsed() > DRAIN_WITHIN {
            let open: Vec<String> = open
                .iter()
                .map(|e| {
                    format!(
                        "{} {} lease until {}",
                        e.operation_key.as_str(),
                        e.state,
                        e.lease_expires_at
                    )
                })
                .collect();
            panic!(
                "{context}: {} execution(s) still in flight {DRAIN_WITHIN:?} after the load \
                 (lease {LEASE_MS} ms): {open:?}\n{}\n{}",
                open.len(),
                servers[0].log_tail(),
                servers[1].log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- the database -------------------------------------------------------------------------------

/// Where the servers' database is, and what stands between them and it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    /// A fresh database of the test server, behind the test's proxy.
    Proxied,
    /// The same, with pgbouncer (`pool_mode = session`) between the servers and the proxy.
    Pooled,
    /// A primary and its synchronous standby of the test's own; the servers' URL names both
    /// hosts, and there is no proxy.
    Replicated,
}

/// Name of the database of a [`Topology::Replicated`] case.
const REPLICATED_DATABASE: &str = "tollgate_failover";

/// The database of a case and what the faults strike.
struct Database {
    /// The URL the servers get (through the proxy, pgbouncer, or both hosts).
    servers_url: String,
    /// The URL the test's commands (`migrate`, `audit`) and its own stores use: the database
    /// itself, or both hosts.
    direct_url: String,
    /// A fresh database of the test server (not with [`Topology::Replicated`]).
    fresh: Option<TestDatabase>,
    proxy: Option<Proxy>,
    pooler: Option<Pgbouncer>,
    replicated: Option<Replicated>,
}

impl Database {
    /// Sets up `topology` and migrates the database with the binary (`tollgate migrate`).
    async fn start(topology: Topology, context: &str) -> Self {
        let database = match topology {
            Topology::Proxied | Topology::Pooled => {
                let db = support::fresh_database().await;
                let (before_host, upstream, after_host) = split_url(db.url());
                let proxy = Proxy::start(&upstream).await;
                let (servers_url, pooler) = if topology == Topology::Pooled {
                    let pooler = Pgbouncer::start(proxy.port, PoolMode::Session)
                        .await
                        .unwrap_or_else(|e| panic!("{context}: pgbouncer: {e}"));
                    (pooler.url(db.name()), Some(pooler))
                } else {
                    (
                        format!("{before_host}127.0.0.1:{}{after_host}", proxy.port),
                        None,
                    )
                };
                Self {
                    servers_url,
                    direct_url: db.url().to_string(),
                    fresh: Some(db),
                    proxy: Some(proxy),
                    pooler,
                    replicated: None,
                }
            }
            Topology::Replicated => {
                let replicated = Replicated::start()
                    .await
                    .unwrap_or_else(|e| panic!("{context}: primary and standby: {e}"));
                replicated
                    .create_database(REPLICATED_DATABASE)
                    .await
                    .unwrap_or_else(|e| panic!("{context}: create database: {e}"));
                let url = replicated.url(REPLICATED_DATABASE);
                Self {
                    servers_url: url.clone(),
                    direct_url: url,
                    fresh: None,
                    proxy: None,
                    pooler: None,
                    replicated: Some(replicated),
                }
            }
        };
        let migrated = support::run(
            tollgate()
                .arg("migrate")
                .env("DATABASE_URL", &database.direct_url),
        );
        assert!(
            migrated.status.success(),
            "{context}: migrate: {}",
            support::stderr(&migrated)
        );
        database
    }

    /// The test's own stores, on [`Database::direct_url`] (with both hosts they follow the
    /// failover as the servers do).
    async fn stores(&self) -> PgStores {
        match &self.fresh {
            Some(db) => db.stores(4).await.unwrap(),
            None => PgStores::connect(&self.direct_url, 4).await.unwrap(),
        }
    }

    fn proxy(&self) -> &Proxy {
        self.proxy
            .as_ref()
            .expect("a fault of the proxy in a case with a proxy")
    }

    fn proxy_counts(&self) -> ProxyCounts {
        self.proxy.as_ref().map(Proxy::counts).unwrap_or_default()
    }

    /// Connections open now: the proxy's, or the primary's client backends.
    async fn open(&self) -> u64 {
        match (&self.proxy, &self.replicated) {
            (Some(proxy), _) => proxy.open(),
            (None, Some(replicated)) => replicated
                .primary_connections(REPLICATED_DATABASE)
                .await
                .map_or(0, |n| u64::try_from(n).unwrap_or(0)),
            (None, None) => 0,
        }
    }
}

// ---- the case -----------------------------------------------------------------------------------

/// The figures of a case, for the table and the assertions.
#[derive(Default)]
struct Figures {
    failures: Vec<String>,
    keys: usize,
    requests: usize,
    probes: usize,
    replays: usize,
    /// Replays that did not answer the stored success.
    replays_failed: usize,
    /// Calls acknowledged (answered completed and successful) before the first fault began.
    acknowledged_before: usize,
    /// Acknowledged calls whose execution is not completed with one settlement.
    acknowledged_lost: usize,
    /// Logins pgbouncer logged (with a pooler).
    pooler_logins: Option<usize>,
    sends: u64,
    settled: usize,
    states: BTreeMap<String, usize>,
    outputs_lost: usize,
    answered_503: usize,
    keys_503: usize,
    keys_503_completed: usize,
    transport_errors: usize,
    timed_out: usize,
    longest: Duration,
    unsent_awaiting_operator: usize,
    /// Calls the members forwarded to each other (H-39): answered, and with no answer (served
    /// where they arrived).
    forwarded: [u64; 2],
    /// What the figures count, key by key, where it is not the rule (printed, not failed).
    notes: Vec<String>,
}

/// Runs one case: a fresh database, the proxy, two servers, the load, `plan`'s faults at seeded
/// moments, the drain, the checks; prints the figures and fails on any finding.
async fn run_case(case: &str, topology: Topology, mut plan: Vec<Fault>) {
    let _serial = SERIAL.lock().await;
    let test_started = Instant::now();
    let seed = seed();
    let mut rng = Rng(seed ^ case.len() as u64);
    rng.shuffle(&mut plan);
    let context = format!("{case}, seed {seed}");
    let names: Vec<String> = plan.iter().map(|f| f.name()).collect();
    eprintln!(
        "db faults ({case}): seed {seed} (TOLLGATE_DB_FAULTS_SEED={seed} reproduces it); \
         faults in order: {names:?}"
    );

    // 1. The database, migrated by the binary, and what stands in front of it.
    let database = Database::start(topology, &context).await;

    // 2. The mock provider, in this process.
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();

    // 3. Two servers on it.
    let caller = generate_key().expose().to_string();
    let dir = TempDir::new("tollgate-db-faults");
    let config = dir.0.join("tollgate.toml");
    std::fs::write(
        &config,
        config_text(
            &database.servers_url,
            &mock.base_url(),
            &KeyDigest::of_key(&caller).to_hex(),
            if topology == Topology::Replicated {
                FAILOVER_LEASE_MS
            } else {
                LEASE_MS
            },
        ),
    )
    .unwrap();
    let logs = Path::new(env!("CARGO_TARGET_TMPDIR")).join("db_faults");
    std::fs::create_dir_all(&logs).unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let slug: String = case
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut servers = Vec::new();
    for name in ["a", "b"] {
        let log = logs.join(format!("{slug}-server-{name}.log"));
        servers.push(Server::start(format!("server-{name}"), &config, log, &http).await);
    }
    let setup_time = test_started.elapsed();

    // 4. The load.
    let load = Arc::new(Load {
        seed,
        http: http.clone(),
        caller,
        bases: [servers[0].base.clone(), servers[1].base.clone()],
        started: Instant::now(),
        stop: AtomicBool::new(false),
        requests: Mutex::new(Vec::new()),
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| tokio::spawn(load.clone().client(c)))
        .collect();

    // 5. The faults, each at a seeded moment, each followed by fresh calls to both servers
    //    until they succeed.
    let stores = database.stores().await;
    let scope = Scope::parse(SCOPE).unwrap();
    let mut struck = Vec::new();
    tokio::time::sleep(Duration::from_millis(rng.range(FIRST_FAULT_AFTER_MS))).await;
    for (n, fault) in plan.iter().copied().enumerate() {
        if n > 0 {
            tokio::time::sleep(Duration::from_millis(rng.range(GAP_MS))).await;
        }
        for server in &mut servers {
            server.assert_alive(&context);
        }
        let in_flight = in_flight(&stores, &scope).await.len();
        let counts_before = database.proxy_counts();
        let open_before = database.open().await;
        let began = load.started.elapsed();
        let mut terminated = None;
        let open = match fault {
            Fault::Terminate => {
                let db = database.fresh.as_ref().expect("a fresh database");
                match tokio::time::timeout(TERMINATE_WAIT, db.terminate_backends()).await {
                    Ok(Ok(n)) => terminated = Some(n),
                    Ok(Err(e)) => panic!("{context}: terminate backends: {e}"),
                    // The backends were terminated; the servers reconnected before the wait saw
                    // none listed.
                    Err(_) => {}
                }
                open_before
            }
            Fault::Reset => database.proxy().reset().await,
            Fault::Outage => database.proxy().outage(OUTAGE_MS).await,
            Fault::BlackHoleResumed => database.proxy().black_hole(BLACK_HOLE_MS, false).await,
            Fault::BlackHoleReset => database.proxy().black_hole(BLACK_HOLE_MS, true).await,
            Fault::Failover => {
                let replicated = database.replicated.as_ref().expect("a standby");
                replicated
                    .kill_primary()
                    .await
                    .unwrap_or_else(|e| panic!("{context}: kill the primary: {e}"));
                replicated
                    .promote_standby()
                    .unwrap_or_else(|e| panic!("{context}: promote the standby: {e}"));
                open_before
            }
        };
        let ended_at = Instant::now();
        let ended = load.started.elapsed();
        let (a, b) = tokio::join!(
            load.first_success(0, n, ended_at),
            load.first_success(1, n, ended_at)
        );
        struck.push(Struck {
            fault,
            began,
            ended,
            in_flight,
            terminated,
            open,
            proxy: database.proxy_counts().since(counts_before),
            first_success: [a, b],
        });
    }
    tokio::time::sleep(TAIL).await;
    load.stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    let load_time = load.started.elapsed();
    let mut forwarded = [0u64; 2];
    for server in &mut servers {
        server.assert_alive(&format!("{context}: after the load"));
        let [answered, unanswered] = support::forwards(&load.http, &server.base, None).await;
        forwarded[0] += answered;
        forwarded[1] += unanswered;
    }

    // 6. The schedulers finish what is left in flight; every acknowledged call is sent again
    //    (a replay); then the checks.
    let drain_time = drain(&stores, &scope, &context, &servers).await;
    load.replay_acknowledged().await;
    let requests = lock(&load.requests).clone();
    let mut figures = Figures {
        forwarded,
        requests: requests.len(),
        probes: requests.iter().filter(|r| r.kind == Kind::Probe).count(),
        replays: requests.iter().filter(|r| r.kind == Kind::Replay).count(),
        ..Figures::default()
    };
    // The servers were members of one cluster: each sent the other's consumer's calls to it.
    if forwarded[0] == 0 {
        figures.failures.push(format!(
            "{context}: no call was forwarded between the members ({forwarded:?})"
        ));
    }
    if let Some(pooler) = &database.pooler {
        // Every connection of the servers went through pgbouncer: it logged their logins.
        let logins = pooler.log_text().matches("login attempt").count();
        if logins == 0 {
            figures
                .failures
                .push(format!("{context}: pgbouncer logged no login"));
        }
        figures.pooler_logins = Some(logins);
    }
    check(
        &context,
        &stores,
        &scope,
        &mock,
        &requests,
        &struck,
        &mut figures,
    )
    .await;
    for (command, what) in [
        (vec!["audit", "verify", "--scope", SCOPE], "audit verify"),
        (
            vec!["audit", "ledger", "--scope", SCOPE, "--json"],
            "audit ledger",
        ),
    ] {
        let output = support::run(
            tollgate()
                .args(&command)
                .env("DATABASE_URL", &database.direct_url),
        );
        let report: Value =
            serde_json::from_str(support::stdout(&output).trim()).unwrap_or(Value::Null);
        let clean = output.status.success() && (what != "audit ledger" || report["ok"] == true);
        if !clean {
            figures.failures.push(format!(
                "{context}: {what} failed: {} {}",
                support::stdout(&output),
                support::stderr(&output)
            ));
        }
    }

    let table = figures_table(
        case,
        seed,
        &figures,
        &struck,
        &requests,
        [setup_time, load_time, drain_time, test_started.elapsed()],
    );
    eprintln!("{table}");
    mock.shutdown().await;
    let logs = format!("{}\n{}", servers[0].log_tail(), servers[1].log_tail());
    drop(servers);
    drop(database);
    assert!(
        figures.failures.is_empty(),
        "{table}\n{} failure(s):\n{}\n{logs}",
        figures.failures.len(),
        figures.failures.join("\n")
    );
}

/// The checks of SC-204 on what the clients saw, what the mock counted and what the stores hold.
async fn check(
    context: &str,
    stores: &PgStores,
    scope: &Scope,
    mock: &MockProvider,
    requests: &[Request],
    struck: &[Struck],
    figures: &mut Figures,
) {
    let failures = &mut figures.failures;
    let fault_at = |at: Duration| -> String {
        struck
            .iter()
            .rev()
            .find(|s| s.began <= at)
            .map_or("before the first fault".into(), |s| {
                format!("after {} at {:.1}s", s.fault.name(), s.began.as_secs_f64())
            })
    };
    let mut replies: BTreeMap<&str, Vec<&Request>> = BTreeMap::new();
    for r in requests {
        replies.entry(r.key.as_str()).or_default().push(r);
    }
    let story = |key: &str| -> String {
        replies.get(key).map_or("no request".into(), |rs| {
            rs.iter()
                .map(|r| {
                    format!(
                        "server {} at {:.2}s took {} ms: {} ({})",
                        r.server,
                        r.began.as_secs_f64(),
                        r.took.as_millis(),
                        r.reply.short(),
                        fault_at(r.began)
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
    };
    figures.keys = replies.len();

    // No request hung past its timeout.
    for r in requests {
        figures.longest = figures.longest.max(r.took);
        match &r.reply {
            Reply::TimedOut => figures.timed_out += 1,
            Reply::Transport(_) => figures.transport_errors += 1,
            Reply::Answer { status: 503, .. } => figures.answered_503 += 1,
            Reply::Answer { .. } => {}
        }
        if r.reply == Reply::TimedOut || r.took > CLIENT_TIMEOUT + CLIENT_MARGIN {
            failures.push(format!("{context}: key {} hung: {}", r.key, story(&r.key)));
        }
    }

    // No key sent twice; every send belongs to a journal row.
    let executions = executions(stores, scope).await;
    let by_key: HashMap<&str, &ExecutionRecord> = executions
        .iter()
        .map(|e| (e.operation_key.as_str(), e))
        .collect();
    let by_prompt = mock.requests_by_prompt();
    figures.sends = mock.request_count();
    let counted: u64 = by_prompt.values().sum();
    if counted != figures.sends {
        failures.push(format!(
            "{context}: the mock counted {} request(s), {counted} of them by prompt",
            figures.sends
        ));
    }
    for (prompt, count) in &by_prompt {
        let key = prompt.strip_prefix("dbf-").unwrap_or(prompt);
        if *count > 1 {
            failures.push(format!(
                "{context}: key {key} sent {count} times: {}",
                story(key)
            ));
        }
        if !by_key.contains_key(key) {
            failures.push(format!("{context}: key {key} sent without a journal row"));
        }
    }

    // No settlement twice; one per completed execution, none for any other.
    let mut settled: HashMap<ExecutionId, usize> = HashMap::new();
    for s in settlements(stores, scope).await {
        *settled.entry(s.execution_id).or_default() += 1;
    }
    figures.settled = settled.len();

    // Every call the mock answered ends completed with its output stored.
    for e in &executions {
        let key = e.operation_key.as_str();
        let sent = mock.request_count_for(&prompt_of(key));
        *figures.states.entry(e.state.to_string()).or_default() += 1;
        let settlements = settled.get(&e.id).copied().unwrap_or(0);
        let expected = usize::from(e.state == ExecutionState::Completed);
        if settlements != expected {
            failures.push(format!(
                "{context}: key {key} ({}): {settlements} settlement(s), expected {expected}",
                e.state
            ));
        }
        if e.state.is_final() && e.hold != Money::ZERO {
            failures.push(format!(
                "{context}: key {key}: {} but still holds {}",
                e.state, e.hold
            ));
        }
        let result = if e.state == ExecutionState::Completed {
            read("result", || stores.result(e.id)).await
        } else {
            None
        };
        let kept_output = result
            .as_ref()
            .is_some_and(|r| r.outcome == Outcome::Success && r.output.is_some());
        match (sent, e.state) {
            (0, ExecutionState::Completed) => failures.push(format!(
                "{context}: key {key}: completed but never sent: {}",
                story(key)
            )),
            (0, ExecutionState::ReconciliationRequired) => {
                figures.unsent_awaiting_operator += 1;
                figures.notes.push(format!(
                    "key {key} awaits an operator ({:?}) but was never sent: {}",
                    e.reconciliation_reason.map(|r| r.as_str()),
                    story(key)
                ));
            }
            (0, _) => {}
            (_, ExecutionState::Completed) if kept_output => {}
            (_, state) => {
                figures.outputs_lost += 1;
                failures.push(format!(
                    "{context}: key {key}: the mock answered it, it ended {state} (reason {:?}, \
                     outcome {:?}, output stored {}): {}",
                    e.reconciliation_reason.map(|r| r.as_str()),
                    result.as_ref().map(|r| r.outcome.as_str()),
                    result.as_ref().is_some_and(|r| r.output.is_some()),
                    story(key)
                ));
            }
        }
    }

    // Every acknowledged call is completed with one settlement (after a failover: on the new
    // primary), and its replay answered the stored success (sending nothing: counted above).
    let first_fault = struck.first().map(|s| s.began);
    let mut acknowledged: BTreeMap<&str, bool> = BTreeMap::new();
    for r in requests
        .iter()
        .filter(|r| r.kind != Kind::Replay && r.reply.succeeded())
    {
        let before = first_fault.is_some_and(|at| r.began + r.took < at);
        *acknowledged.entry(r.key.as_str()).or_default() |= before;
    }
    figures.acknowledged_before = acknowledged.values().filter(|b| **b).count();
    for key in acknowledged.keys() {
        let kept = by_key.get(key).is_some_and(|e| {
            e.state == ExecutionState::Completed && settled.get(&e.id) == Some(&1)
        });
        if !kept {
            figures.acknowledged_lost += 1;
            failures.push(format!(
                "{context}: key {key} was acknowledged, and is {}: {}",
                by_key.get(key).map_or("gone".to_string(), |e| format!(
                    "{} with {} settlement(s)",
                    e.state,
                    settled.get(&e.id).copied().unwrap_or(0)
                )),
                story(key)
            ));
        }
    }
    for r in requests.iter().filter(|r| r.kind == Kind::Replay) {
        if !r.reply.succeeded() {
            figures.replays_failed += 1;
            failures.push(format!(
                "{context}: the replay of acknowledged key {} answered {}",
                r.key,
                r.reply.short()
            ));
        }
    }

    // Fresh calls right after a fault that did not succeed.
    for r in requests
        .iter()
        .filter(|r| r.kind == Kind::Probe && !r.reply.succeeded())
    {
        figures.notes.push(format!(
            "probe {} to server {} at {:.2}s ({}): {} in {} ms",
            r.key,
            r.server,
            r.began.as_secs_f64(),
            fault_at(r.began),
            r.reply.short(),
            r.took.as_millis()
        ));
    }

    // Calls answered 503 (or not at all) that nevertheless completed.
    for (key, rs) in &replies {
        if rs.iter().any(|r| r.reply.status() == Some(503)) {
            figures.keys_503 += 1;
            if by_key
                .get(key)
                .is_some_and(|e| e.state == ExecutionState::Completed)
            {
                figures.keys_503_completed += 1;
            }
        }
    }

    // Every fault struck, and the calls succeeded again soon after each.
    for s in struck {
        let name = s.fault.name();
        let touched = s.open + s.proxy.closed_by_database + s.proxy.reset + s.proxy.refused;
        if touched == 0 {
            failures.push(format!(
                "{context}: {name} at {:.1}s struck no connection",
                s.began.as_secs_f64()
            ));
        }
        for (server, first) in s.first_success.iter().enumerate() {
            match first {
                Some((after, _)) if *after <= RECOVERED_WITHIN => {}
                _ => failures.push(format!(
                    "{context}: after {name} (ended at {:.1}s) server {server}'s first successful \
                     call came {first:?}, bound {RECOVERED_WITHIN:?}",
                    s.ended.as_secs_f64()
                )),
            }
        }
    }
    let on_work = struck.iter().filter(|s| s.in_flight > 0).count();
    if on_work * 2 < struck.len() {
        failures.push(format!(
            "{context}: only {on_work} of {} faults struck with calls in flight",
            struck.len()
        ));
    }
    if figures.sends == 0 || figures.states.get("completed").copied().unwrap_or(0) == 0 {
        failures.push(format!("{context}: the load completed nothing"));
    }
}

/// `ms (calls)` of a first success.
fn first(success: Option<(Duration, u32)>) -> String {
    success.map_or("none".into(), |(d, calls)| {
        format!("{} ({calls})", d.as_millis())
    })
}

/// The slower of a fault's two first successes.
fn slowest(s: &Struck) -> Duration {
    s.first_success
        .iter()
        .flatten()
        .map(|(d, _)| *d)
        .max()
        .unwrap_or_default()
}

/// The figures as markdown tables, to be copied into spec/journal.md.
fn figures_table(
    case: &str,
    seed: u64,
    f: &Figures,
    struck: &[Struck],
    requests: &[Request],
    [setup, load, drain, total]: [Duration; 4],
) -> String {
    let mut out = format!(
        "\ndb faults ({case}), seed {seed}: setup {:.1}s, load {:.1}s, drain {:.1}s, total \
         {:.1}s\n\n",
        setup.as_secs_f64(),
        load.as_secs_f64(),
        drain.as_secs_f64(),
        total.as_secs_f64()
    );
    out.push_str(
        "| fault | at s | lasted ms | in flight | connections open | closed by the database | \
         closed by the proxy | refused | 503s until recovered | first success a ms (calls) | b ms (calls) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut kinds: BTreeMap<String, (usize, usize, Duration)> = BTreeMap::new();
    for s in struck {
        let recovered = s.ended + slowest(s);
        let errors = requests
            .iter()
            .filter(|r| {
                let end = r.began + r.took;
                end >= s.began && end <= recovered && r.reply.status() == Some(503)
            })
            .count();
        let closed = match s.terminated {
            Some(n) => format!("{} (terminated {n})", s.proxy.closed_by_database),
            None => s.proxy.closed_by_database.to_string(),
        };
        out.push_str(&format!(
            "| {} | {:.1} | {} | {} | {} | {closed} | {} | {} | {errors} | {} | {} |\n",
            s.fault.name(),
            s.began.as_secs_f64(),
            (s.ended - s.began).as_millis(),
            s.in_flight,
            s.open,
            s.proxy.reset,
            s.proxy.refused,
            first(s.first_success[0]),
            first(s.first_success[1]),
        ));
        let kind = kinds.entry(s.fault.name()).or_default();
        kind.0 += 1;
        kind.1 += errors;
        kind.2 = kind.2.max(slowest(s));
    }
    out.push_str("\n| fault kind | faults | 503s until recovered | slowest first success ms |\n|---|---|---|---|\n");
    for (name, (count, errors, slowest)) in &kinds {
        out.push_str(&format!(
            "| {name} | {count} | {errors} | {} |\n",
            slowest.as_millis()
        ));
    }
    let rows: [(&str, String); 16] = [
        ("calls (keys, probes included)", f.keys.to_string()),
        (
            "HTTP requests (probes; replays)",
            format!("{} ({}; {})", f.requests, f.probes, f.replays),
        ),
        (
            "acknowledged before the first fault",
            f.acknowledged_before.to_string(),
        ),
        (
            "acknowledged, then not completed and settled",
            f.acknowledged_lost.to_string(),
        ),
        (
            "replays not answered their stored success",
            f.replays_failed.to_string(),
        ),
        ("sends at the mock", f.sends.to_string()),
        ("settled executions", f.settled.to_string()),
        ("executions by state", format!("{:?}", f.states)),
        ("outputs lost", f.outputs_lost.to_string()),
        (
            "503 answers (keys; of them completed)",
            format!(
                "{} ({}; {})",
                f.answered_503, f.keys_503, f.keys_503_completed
            ),
        ),
        ("transport errors", f.transport_errors.to_string()),
        ("requests past the timeout", f.timed_out.to_string()),
        ("longest request ms", f.longest.as_millis().to_string()),
        (
            "awaiting an operator, never sent",
            f.unsent_awaiting_operator.to_string(),
        ),
        (
            "forwarded between the members (answered; no answer)",
            format!("{}; {}", f.forwarded[0], f.forwarded[1]),
        ),
        ("failures", f.failures.len().to_string()),
    ];
    let pooler = f
        .pooler_logins
        .map(|n| format!("\npgbouncer (pool_mode = session) logged {n} logins of the servers\n"));
    out.push_str("\n| figure | value |\n|---|---|\n");
    for (name, value) in rows {
        out.push_str(&format!("| {name} | {value} |\n"));
    }
    out.push_str(&pooler.unwrap_or_default());
    for note in &f.notes {
        out.push_str(&format!("\n{note}"));
    }
    out
}

// ---- the tests ----------------------------------------------------------------------------------

/// Three rounds of terminated backends, two proxy resets and one outage shorter than the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_204_sc_202_terminations_resets_and_an_outage_lose_no_output() {
    let mut plan = vec![Fault::Terminate; 3];
    plan.extend([Fault::Reset, Fault::Reset, Fault::Outage]);
    run_case(
        "terminations, resets and an outage",
        Topology::Proxied,
        plan,
    )
    .await;
}

/// A route that forwards nothing for a second, once resumed, once reset at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_204_a_black_holed_route_loses_no_output_and_hangs_no_request() {
    run_case(
        "black hole",
        Topology::Proxied,
        vec![Fault::BlackHoleResumed, Fault::BlackHoleReset],
    )
    .await;
}

/// The primary's postmaster killed with SIGKILL mid-load and its synchronous standby promoted:
/// the servers, whose URL names both hosts, find the new primary without a restart; every call
/// acknowledged before the failover is there with its settlement, no key is sent twice, the
/// replays of acknowledged calls send nothing, and calls succeed again within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_216_a_failover_to_a_synchronous_standby_loses_no_acknowledged_call() {
    run_case(
        "failover to a synchronous standby",
        Topology::Replicated,
        vec![Fault::Failover],
    )
    .await;
}

/// The servers behind a real pgbouncer in `pool_mode = session`, with the terminations,
/// resets and outage of the first case between pgbouncer and the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_217_behind_pgbouncer_in_session_mode_nothing_is_sent_or_charged_twice() {
    let mut plan = vec![Fault::Terminate; 2];
    plan.extend([Fault::Reset, Fault::Outage]);
    run_case("behind pgbouncer, session mode", Topology::Pooled, plan).await;
}

#[test]
fn the_proxy_url_keeps_everything_but_the_host() {
    assert_eq!(
        split_url("postgres://postgres@127.0.0.1:5432/tollgate_t_1?sslmode=disable"),
        (
            "postgres://postgres@".to_string(),
            "127.0.0.1:5432".to_string(),
            "/tollgate_t_1?sslmode=disable".to_string()
        )
    );
    assert_eq!(
        split_url("postgres://u:p@db/x"),
        (
            "postgres://u:p@".to_string(),
            "db:5432".to_string(),
            "/x".to_string()
        )
    );
}
