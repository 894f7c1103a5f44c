//! Real process death (spec/journal.md — Process death): two `tollgate serve` processes on one
//! fresh Postgres database, driven with concurrent calls, replays and conflicting replays, while
//! one of them is killed with SIGKILL at seeded random moments and restarted, round after round.
//! Afterwards the scheduler finishes every orphaned execution, and the test checks that no call
//! reached the provider twice, nothing was charged twice, nothing is left in flight, every
//! execution awaiting an operator has a reason, the audit chain verifies and the ledger is clean.
//!
//! The mock provider runs in this process and counts requests by prompt; every operation key has
//! a prompt of its own (`kill-<key>`), so each key's sends are observable.
//!
//! - `TOLLGATE_KILL_SEED=N` replays the kill schedule and the clients' choices of a run (the seed
//!   is printed at the start and in every failure; without it the seed is [`DEFAULT_SEED`]);
//! - `TOLLGATE_KILL_ROUNDS=N` runs N kill rounds instead of [`DEFAULT_ROUNDS`].
//!
//! Postgres as for every suite: `TOLLGATE_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Run with `--nocapture` to see the summary.
#![cfg(test)]

mod support;
use support::{env_u64, Rng, TempDir};

use chrono::{Days, NaiveDate, Utc};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::{ConsumerId, ExecutionId, Scope, SessionId};
use tollgate_core::money::{Currency, Money};
use tollgate_core::state::ExecutionState;
use tollgate_mock_provider::MockProvider;
use tollgate_postgres::PgStores;
use tollgate_server::auth::generate_key;
use tollgate_store::KeyDigest;
use tollgate_store::{
    AuditLog, AuditPosition, AuditRow, Evidence, ExecutionRecord, ExecutionStore, SettlementRecord,
    SettlementStore, SpendStore, UsageInbox,
};
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// Kill rounds of the default run.
const DEFAULT_ROUNDS: u32 = 20;
/// The scope of every key.
const SCOPE: &str = "kill";
/// Concurrent client tasks.
const CLIENTS: u64 = 6;
/// A round waits this long (ms, seeded) before its kill.
const KILL_AFTER_MS: (u64, u64) = (150, 900);
/// A killed server stays down this long (ms, seeded) before its restart.
const DOWN_MS: (u64, u64) = (0, 250);
/// The seed of a run without `TOLLGATE_KILL_SEED`: fixed, so that CI runs are reproducible.
const DEFAULT_SEED: u64 = 0x6b69_6c6c_2026;
/// The servers run with the default lease and scheduler period (no `[runner]` or
/// `[scheduler] interval_ms` in their configuration): what is shown is the defaults' recovery.
const LEASE_MS: u64 = tollgate_runner::settings::LEASE_MS_DEFAULT;
/// The scheduler's default period; each pass is jittered by up to a fifth of it.
const INTERVAL_MS: u64 = tollgate_server::config::INTERVAL_MS_DEFAULT;
/// A killed server's calls are recovered within this long of the kill (SC-205): one lease after
/// their last renewal, at the next scheduler pass (the period plus its jitter), and the pass's own
/// work.
const RECOVERED_WITHIN_MS: u64 = LEASE_MS + INTERVAL_MS * 6 / 5 + 800;
/// Run timeout of both profiles.
const RUN_TIMEOUT_MS: u64 = 1_500;
/// How long a server may take to answer `/readyz` after its start.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long the scheduler may take, after the load stops, to finish every orphaned execution.
const DRAIN_WITHIN: Duration = Duration::from_secs(30);
/// Upper bound of rows read back per state (far above what a run creates).
const READ_LIMIT: u32 = 1_000_000;

// ---- seeded randomness --------------------------------------------------------------------------

fn seed() -> u64 {
    env_u64("TOLLGATE_KILL_SEED").unwrap_or(DEFAULT_SEED)
}

// ---- the configuration --------------------------------------------------------------------------

/// `(profile, provider, model, consumer)` of the two profiles: a slow chat model, and a less
/// slow one on the Anthropic protocol, so kills land before, during and after sends.
const PROFILES: [(&str, &str, &str, &str); 2] = [
    ("slow", "mock-chat", "mock-slow-200", "team-a"),
    ("brisk", "mock-anthropic", "mock-slow-60", "team-b"),
];

fn config_text(mock_url: &str, caller_sha: &str, operator_sha: &str) -> String {
    let mut text = format!(
        r#"
[server]
listen = "127.0.0.1:0"

[database]
max_connections = 8

[scheduler]
batch = 100

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

[[keys]]
scope = "{SCOPE}"
role = "operator"
sha256 = "{operator_sha}"

[[prices]]
version = "prices-kill"
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
price_version = "prices-kill"
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

// ---- server processes ---------------------------------------------------------------------------

/// The built binary, with an environment that cannot leak the developer's settings.
fn tollgate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command.env_remove("DATABASE_URL").env_remove("RUST_LOG");
    for (name, _) in std::env::vars() {
        if name.to_ascii_uppercase().starts_with("TOLLGATE_") {
            command.env_remove(name);
        }
    }
    command
}

/// Lines of a server's stderr kept for failure reports.
const LOG_LINES: usize = 80;

/// One `tollgate serve` slot: the current process (restarted after each kill), its address and
/// the tail of its stderr over all incarnations.
struct Server {
    name: &'static str,
    config: PathBuf,
    db_url: String,
    child: Option<Child>,
    incarnation: u32,
    /// `http://127.0.0.1:PORT` of the current process (a new port each start).
    base: Arc<RwLock<String>>,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Server {
    fn new(name: &'static str, config: &Path, db_url: &str) -> Self {
        Self {
            name,
            config: config.to_path_buf(),
            db_url: db_url.to_string(),
            child: None,
            incarnation: 0,
            base: Arc::new(RwLock::new(String::from("http://127.0.0.1:9"))),
            log: Arc::new(Mutex::new(VecDeque::new())),
        }
    }

    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Starts a new process and waits until it answers `/readyz`; returns how long that took.
    async fn start(&mut self, http: &reqwest::Client, context: &str) -> Duration {
        assert!(self.child.is_none(), "{}: already running", self.name);
        self.incarnation += 1;
        let started = Instant::now();
        // Both slots are members of one cluster (H-39): each incarnation names the port it
        // listens on as its `[cluster] url`, and the other member forwards the calls of the
        // groups it owns to it until it dies.
        let mut child = tollgate()
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .env("DATABASE_URL", &self.db_url)
            .envs(support::member_env(support::CLUSTER_SECRET))
            .current_dir(self.config.parent().unwrap_or(Path::new(".")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{context}: cannot start {}: {e}", self.name));
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, mut listening) = mpsc::unbounded_channel::<String>();
        let log = self.log.clone();
        let tag = format!("[{} #{}]", self.name, self.incarnation);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or_default();
                    let _ = tx.send(addr.to_string());
                }
                let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
                if log.len() == LOG_LINES {
                    log.pop_front();
                }
                log.push_back(format!("{tag} {line}"));
            }
        });
        self.child = Some(child);
        let base = match tokio::time::timeout(READY_WITHIN, listening.recv()).await {
            Ok(Some(base)) => base,
            _ => {
                let status = self
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten());
                panic!(
                    "{context}: {} #{} did not start listening (exit {status:?})\n{}",
                    self.name,
                    self.incarnation,
                    self.log_tail()
                );
            }
        };
        *self.base.write().unwrap_or_else(PoisonError::into_inner) = base.clone();
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let ready = http
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return started.elapsed();
            }
            self.assert_alive(context);
            assert!(
                Instant::now() < deadline,
                "{context}: {} #{} never became ready\n{}",
                self.name,
                self.incarnation,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL (`Child::kill` on unix), then reaps the process.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Fails when the current process exited on its own (a crash, not one of our kills).
    fn assert_alive(&mut self, context: &str) {
        if let Some(child) = self.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{context}: {} #{} exited on its own with {status}\n{}",
                    self.name,
                    self.incarnation,
                    self.log_tail()
                );
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---- the load -----------------------------------------------------------------------------------

/// What the clients saw of one operation key.
#[derive(Debug, Clone)]
struct KeyRecord {
    profile: &'static str,
    session: String,
    /// The round in which the key was first sent.
    round: u32,
    /// Execution id and receipt of a `completed` answer.
    completed: Option<(String, Value)>,
    /// Replays answered with the stored outcome.
    replays: u32,
    /// Conflicting replays answered 422.
    conflicts: u32,
}

/// The prompt of a key: unique per key, so the mock counts each key's sends.
fn prompt_of(key: &str) -> String {
    format!("kill-{key}")
}

/// The prompt of a conflicting replay of a key: must never be sent.
fn changed_prompt_of(key: &str) -> String {
    format!("kill-{key}-changed")
}

fn call_body(profile: &str, key: &str, session: &str, revision: &str, text: &str) -> Value {
    json!({
        "profile": profile, "operation_key": key, "session_id": session,
        "input_revision": revision, "intent": "kill-test",
        "input": {"messages": [{"role": "user", "content": text}]}
    })
}

/// State shared by the driver and the clients.
struct Load {
    seed: u64,
    http: reqwest::Client,
    caller: String,
    bases: [Arc<RwLock<String>>; 2],
    round: AtomicU32,
    stop: AtomicBool,
    keys: Mutex<BTreeMap<String, KeyRecord>>,
    /// Unexpected answers, each with seed, round and key.
    anomalies: Mutex<Vec<String>>,
    calls: AtomicU64,
    transport_errors: AtomicU64,
    replays: AtomicU64,
    conflicts: AtomicU64,
}

/// One HTTP answer: status and JSON body, or the transport error (a killed server).
type Answer = Result<(u16, Value), String>;

impl Load {
    fn keys(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, KeyRecord>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn anomaly(&self, key: &str, what: String) {
        let round = self.round.load(Ordering::SeqCst);
        self.anomalies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(format!(
                "seed {} round {round} key {key}: {what}",
                self.seed
            ));
    }

    fn base(&self, server: usize) -> String {
        self.bases[server]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn post(&self, server: usize, body: &Value) -> Answer {
        let response = self
            .http
            .post(format!("{}/v1/calls", self.base(server)))
            .bearer_auth(&self.caller)
            .json(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| e.to_string())?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// Posts to `server`, and after a transport error (the server was killed, or is down) once
    /// more, the same body, to the other one — what a caller does with an uncertain call.
    async fn post_either(&self, server: usize, body: &Value) -> Answer {
        self.calls.fetch_add(1, Ordering::Relaxed);
        match self.post(server, body).await {
            Ok(answer) => Ok(answer),
            Err(_) => {
                self.transport_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.calls.fetch_add(1, Ordering::Relaxed);
                let answer = self.post(1 - server, body).await;
                if answer.is_err() {
                    self.transport_errors.fetch_add(1, Ordering::Relaxed);
                }
                answer
            }
        }
    }

    /// A first call of a new key (or its uncertain retry).
    async fn new_key(&self, rng: &mut Rng, client: u64, n: u64) {
        let key = format!("c{client}-k{n}");
        let (profile, _, _, _) = PROFILES[(rng.next() % 2) as usize];
        let session = format!("s-{client}");
        let record = KeyRecord {
            profile,
            session: session.clone(),
            round: self.round.load(Ordering::SeqCst),
            completed: None,
            replays: 0,
            conflicts: 0,
        };
        self.keys().insert(key.clone(), record);
        let body = call_body(profile, &key, &session, "r-1", &prompt_of(&key));
        let server = (rng.next() % 2) as usize;
        match self.post_either(server, &body).await {
            Err(_) => {}
            // A store failure or a run that stopped waiting: the key is read back later.
            Ok((503 | 504, _)) => {}
            // The retry after a transport error met the first request still running (SC-209):
            // the key is read back later.
            Ok((409, error)) if error["error"]["code"] == "in_progress" => {}
            Ok((200, view)) => {
                let state = view["state"].as_str().unwrap_or_default();
                let known = ["completed", "not_dispatched", "reconciliation_required"];
                if !known.contains(&state) || view["operation_key"] != key.as_str() {
                    self.anomaly(&key, format!("first call answered {view}"));
                } else if state == "completed" {
                    let id = view["execution_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    if let Some(record) = self.keys().get_mut(&key) {
                        record.completed = Some((id, view["receipt"].clone()));
                    }
                }
            }
            Ok((status, body)) => {
                self.anomaly(&key, format!("first call answered {status} {body}"))
            }
        }
    }

    /// A completed key of this client, if any.
    fn completed_key(&self, rng: &mut Rng, client: u64) -> Option<(String, KeyRecord)> {
        let prefix = format!("c{client}-");
        let keys = self.keys();
        let done: Vec<_> = keys
            .iter()
            .filter(|(k, r)| k.starts_with(&prefix) && r.completed.is_some())
            .collect();
        if done.is_empty() {
            return None;
        }
        let (key, record) = done[(rng.next() % done.len() as u64) as usize];
        Some((key.clone(), record.clone()))
    }

    /// Same key, same body: the stored outcome, nothing sent (SC-13).
    async fn replay(&self, rng: &mut Rng, key: &str, record: &KeyRecord) {
        let body = call_body(record.profile, key, &record.session, "r-1", &prompt_of(key));
        let Some((id, receipt)) = &record.completed else {
            return;
        };
        match self.post_either((rng.next() % 2) as usize, &body).await {
            Err(_) => {}
            Ok((200, view))
                if view["replayed"] == true
                    && view["state"] == "completed"
                    && view["execution_id"] == id.as_str()
                    && &view["receipt"] == receipt =>
            {
                self.replays.fetch_add(1, Ordering::Relaxed);
                if let Some(r) = self.keys().get_mut(key) {
                    r.replays += 1;
                }
            }
            Ok((status, view)) => self.anomaly(
                key,
                format!("replay of completed {id} (receipt {receipt}) answered {status} {view}"),
            ),
        }
    }

    /// Same key, another input revision (and prompt): a conflict, nothing sent (SC-14).
    async fn conflict(&self, rng: &mut Rng, key: &str, record: &KeyRecord) {
        let body = call_body(
            record.profile,
            key,
            &record.session,
            "r-2",
            &changed_prompt_of(key),
        );
        match self.post_either((rng.next() % 2) as usize, &body).await {
            Err(_) => {}
            Ok((422, error)) if error["error"]["code"] == "conflict" => {
                self.conflicts.fetch_add(1, Ordering::Relaxed);
                if let Some(r) = self.keys().get_mut(key) {
                    r.conflicts += 1;
                }
            }
            Ok((status, body)) => {
                self.anomaly(key, format!("conflicting replay answered {status} {body}"));
            }
        }
    }

    async fn client(self: Arc<Self>, client: u64) {
        let mut rng = Rng(self.seed ^ (client + 1).wrapping_mul(0xA076_1D64_78BD_642F));
        let mut n = 0;
        while !self.stop.load(Ordering::SeqCst) {
            let pick = rng.next() % 100;
            match (pick, self.completed_key(&mut rng, client)) {
                (0..=19, Some((key, record))) => self.replay(&mut rng, &key, &record).await,
                (20..=29, Some((key, record))) => self.conflict(&mut rng, &key, &record).await,
                _ => {
                    n += 1;
                    self.new_key(&mut rng, client, n).await;
                }
            }
        }
    }
}

// ---- reading the outcome back (store traits only: SQL lives in tollgate-postgres) ---------------

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
        all.extend(stores.by_state(scope, state, READ_LIMIT).await.unwrap());
    }
    all
}

/// Every settlement of `scope` (settlements are listed by accounting day; a run spans at most a
/// day boundary).
async fn settlements(stores: &PgStores, scope: &Scope) -> Vec<SettlementRecord> {
    let today = Utc::now().date_naive();
    let from = today.checked_sub_days(Days::new(2)).unwrap_or(today);
    let to = today.checked_add_days(Days::new(2)).unwrap_or(today);
    stores
        .settlements(from, to, READ_LIMIT)
        .await
        .unwrap()
        .into_iter()
        .filter(|s| &s.scope == scope)
        .collect()
}

async fn audit_trail(stores: &PgStores, scope: &Scope) -> Vec<AuditRow> {
    let mut rows = Vec::new();
    loop {
        let after = rows.last().map_or(AuditPosition::START, AuditRow::position);
        let page = stores.audit_rows(scope, after, 1_000).await.unwrap();
        if page.is_empty() {
            return rows;
        }
        rows.extend(page);
    }
}

/// Why an execution waits for an operator, as the usage inbox explains it (spec/journal.md —
/// Recovery, SC-41), a cross-check of the reason stored on the row: no evidence, only inexact evidence, conflicting exact evidence, or exact
/// evidence the snapshot cannot price. `None` when there is one consistent, priceable piece of
/// exact evidence — then recovery should have settled it.
fn reconciliation_reason(record: &ExecutionRecord, evidence: &[Evidence]) -> Option<String> {
    if evidence.is_empty() {
        return Some("sent, no usage evidence (the stream never reported usage)".into());
    }
    let exact: Vec<_> = evidence.iter().filter(|e| e.exact).collect();
    let Some(first) = exact.first() else {
        return Some(format!(
            "{} piece(s) of inexact evidence only",
            evidence.len()
        ));
    };
    if exact.iter().any(|e| e.usage != first.usage) {
        return Some("conflicting exact evidence".into());
    }
    if record.binding.config.prices.cost(&first.usage).is_err() {
        return Some("exact evidence the snapshot cannot price".into());
    }
    None
}

fn add(total: &mut Money, amount: Money) {
    *total = total.checked_add(amount).unwrap();
}

/// The ledger audit of one scope: `Ok` when the ledger is clean, else every problem found.
///
/// It runs `tollgate audit ledger --scope S --json` on `db_url` (exit 0 and `"ok": true`
/// required), and cross-checks independently, through the store traits only (no SQL in tests):
///
/// - each completed execution has exactly one settlement, and no other execution has any;
/// - finished executions (`completed`, `not_dispatched`) hold nothing;
/// - each consumer's daily and session spend equals the sum of its settlements (`settled`) and
///   of the holds still kept (`held`).
async fn ledger_audit_clean(db_url: &str, scope: &str) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let audited = tollgate()
        .args(["audit", "ledger", "--scope", scope, "--json"])
        .env("DATABASE_URL", db_url)
        .output()
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_slice(&audited.stdout).unwrap_or(serde_json::Value::Null);
    if !audited.status.success() || report["ok"] != true {
        problems.push(format!(
            "tollgate audit ledger: {} {}",
            String::from_utf8_lossy(&audited.stdout),
            String::from_utf8_lossy(&audited.stderr)
        ));
    }
    let stores = PgStores::connect(db_url, 2).await.unwrap();
    let scope = Scope::parse(scope).unwrap();
    let executions = executions(&stores, &scope).await;
    let settlements = settlements(&stores, &scope).await;

    let mut settled_per_execution: HashMap<ExecutionId, Vec<&SettlementRecord>> = HashMap::new();
    for s in &settlements {
        settled_per_execution
            .entry(s.execution_id)
            .or_default()
            .push(s);
    }
    let mut daily: BTreeMap<(ConsumerId, NaiveDate, Currency), SpendTotals> = BTreeMap::new();
    let mut session: BTreeMap<(ConsumerId, SessionId, Currency), SpendTotals> = BTreeMap::new();
    let known: BTreeSet<ExecutionId> = executions.iter().map(|e| e.id).collect();
    for e in &executions {
        let key = e.operation_key.as_str();
        let settled = settled_per_execution.get(&e.id).map_or(0, Vec::len);
        let expected = usize::from(e.state == ExecutionState::Completed);
        if settled != expected {
            problems.push(format!(
                "key {key} ({}, {}): {settled} settlement(s), expected {expected}",
                e.id, e.state
            ));
        }
        if e.state.is_final() && e.hold != Money::ZERO {
            problems.push(format!(
                "key {key} ({}): {} but still holds {}",
                e.id, e.state, e.hold
            ));
        }
        let currency = e.binding.config.currency.clone();
        let day = daily
            .entry((e.consumer().clone(), e.accounting_day, currency.clone()))
            .or_default();
        let sess = session
            .entry((e.consumer().clone(), e.session_id().clone(), currency))
            .or_default();
        for totals in [day, sess] {
            add(&mut totals.held, e.hold);
            for s in settled_per_execution.get(&e.id).into_iter().flatten() {
                add(&mut totals.settled, s.amount);
            }
        }
    }
    for s in &settlements {
        if !known.contains(&s.execution_id) {
            problems.push(format!(
                "settlement {} of key {} has no execution",
                s.id,
                s.operation_key.as_str()
            ));
        }
    }
    for ((consumer, day, currency), expected) in &daily {
        let stored = stores
            .daily_spend(&scope, consumer, *day, currency)
            .await
            .unwrap();
        if &stored != expected {
            problems.push(format!(
                "daily spend of {} on {day}: stored {stored:?}, ledger {expected:?}",
                consumer.as_str()
            ));
        }
    }
    for ((consumer, id, currency), expected) in &session {
        let stored = stores
            .session_spend(&scope, consumer, id, currency)
            .await
            .unwrap();
        if &stored != expected {
            problems.push(format!(
                "session spend of {} in {}: stored {stored:?}, ledger {expected:?}",
                consumer.as_str(),
                id.as_str()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

// ---- the test -----------------------------------------------------------------------------------

/// Waits until no execution of `scope` is `prepared` or `dispatched` (the schedulers recover
/// them once their leases are over, H-4); returns how long that took.
async fn drain(stores: &PgStores, scope: &Scope, seed: u64, servers: &[Server]) -> Duration {
    let started = Instant::now();
    loop {
        let mut open = Vec::new();
        for state in [ExecutionState::Prepared, ExecutionState::Dispatched] {
            open.extend(stores.by_state(scope, state, READ_LIMIT).await.unwrap());
        }
        if open.is_empty() {
            return started.elapsed();
        }
        if started.elapsed() > DRAIN_WITHIN {
            let now = Utc::now();
            let open: Vec<String> = open
                .iter()
                .map(|e| {
                    let past = if e.lease_expires_at < now {
                        " (past)"
                    } else {
                        ""
                    };
                    format!(
                        "{} {} lease until {}{past}",
                        e.operation_key.as_str(),
                        e.state,
                        e.lease_expires_at
                    )
                })
                .collect();
            panic!(
                "seed {seed}: {} execution(s) still in flight {DRAIN_WITHIN:?} after the load \
                 (a claim's lease: {LEASE_MS} ms): {open:?}\n{}\n{}",
                open.len(),
                servers[0].log_tail(),
                servers[1].log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Executions of `scope` in flight (`prepared` or `dispatched`) now.
async fn in_flight(stores: &PgStores, scope: &Scope) -> usize {
    let mut open = 0;
    for state in [ExecutionState::Prepared, ExecutionState::Dispatched] {
        open += stores
            .by_state(scope, state, READ_LIMIT)
            .await
            .unwrap()
            .len();
    }
    open
}

/// What the checks found, and what they counted for the summary.
#[derive(Default)]
struct Findings {
    failures: Vec<String>,
    states: BTreeMap<String, usize>,
    sources: BTreeMap<String, usize>,
    reasons: BTreeMap<String, usize>,
    audit_rows: usize,
}

/// At most one send per key, every send belongs to a claimed key, no conflicting replay was
/// sent, and a replayed key was sent exactly once (replays add no sends).
fn check_sends(
    seed: u64,
    mock: &MockProvider,
    keys: &BTreeMap<String, KeyRecord>,
    claimed: &BTreeSet<&str>,
    findings: &mut Findings,
) {
    let round_of = |key: &str| keys.get(key).map_or(0, |r| r.round);
    let failures = &mut findings.failures;
    let by_prompt = mock.requests_by_prompt();
    let sent_total: u64 = by_prompt.values().sum();
    if sent_total != mock.request_count() {
        failures.push(format!(
            "seed {seed}: the mock counted {} request(s), {sent_total} of them by prompt",
            mock.request_count()
        ));
    }
    for (prompt, count) in &by_prompt {
        let key = prompt.strip_prefix("kill-").unwrap_or(prompt);
        if *count > 1 {
            failures.push(format!(
                "seed {seed} round {} key {key}: sent {count} times",
                round_of(key)
            ));
        }
        if let Some(key) = key.strip_suffix("-changed") {
            failures.push(format!(
                "seed {seed} round {} key {key}: a conflicting replay was sent ({count})",
                round_of(key)
            ));
        } else if !claimed.contains(key) {
            failures.push(format!(
                "seed {seed} round {} key {key}: sent without a journal row",
                round_of(key)
            ));
        }
    }
    for (key, record) in keys {
        let sent = mock.request_count_for(&prompt_of(key));
        if record.replays > 0 && sent != 1 {
            failures.push(format!(
                "seed {seed} round {} key {key}: replayed {} time(s), sent {sent} time(s)",
                record.round, record.replays
            ));
        }
    }
}

/// The journal agrees with the sends, no execution is settled twice or left in flight, and
/// every execution awaiting an operator has a reason and its audit row.
async fn check_journal(
    seed: u64,
    stores: &PgStores,
    scope: &Scope,
    mock: &MockProvider,
    keys: &BTreeMap<String, KeyRecord>,
    executions: &[ExecutionRecord],
    findings: &mut Findings,
) {
    let audit = audit_trail(stores, scope).await;
    findings.audit_rows = audit.len();
    let mut audited: HashMap<ExecutionId, Vec<&str>> = HashMap::new();
    for row in &audit {
        if let Some(id) = row.event.execution_id {
            audited.entry(id).or_default().push(&row.event.kind);
        }
    }
    let mut settled: HashMap<ExecutionId, usize> = HashMap::new();
    for s in settlements(stores, scope).await {
        *settled.entry(s.execution_id).or_default() += 1;
        *findings
            .sources
            .entry(s.source.as_str().to_string())
            .or_default() += 1;
    }
    for e in executions {
        let key = e.operation_key.as_str();
        let round = keys.get(key).map_or(0, |r| r.round);
        let at = format!("seed {seed} round {round} key {key} ({})", e.id);
        let sent = mock.request_count_for(&prompt_of(key));
        *findings.states.entry(e.state.to_string()).or_default() += 1;
        let settlements = settled.get(&e.id).copied().unwrap_or(0);
        if settlements > 1 {
            findings
                .failures
                .push(format!("{at}: settled {settlements} times"));
        }
        match e.state {
            ExecutionState::Prepared | ExecutionState::Dispatched => {
                findings.failures.push(format!(
                    "{at}: still {} (lease until {})",
                    e.state, e.lease_expires_at
                ));
            }
            ExecutionState::NotDispatched if sent != 0 => {
                findings.failures.push(format!(
                    "{at}: not_dispatched({:?}) but sent {sent} time(s)",
                    e.not_dispatched_cause
                ));
            }
            ExecutionState::Completed if sent != 1 => {
                findings
                    .failures
                    .push(format!("{at}: completed but sent {sent} time(s)"));
            }
            ExecutionState::ReconciliationRequired => {
                let evidence = stores.evidence_for(e.id).await.unwrap();
                if e.reconciliation_reason.is_none() {
                    findings.failures.push(format!(
                        "{at}: reconciliation_required without a stored reason"
                    ));
                }
                match reconciliation_reason(e, &evidence) {
                    Some(reason) => {
                        let stored = e.reconciliation_reason.map_or("none", |r| r.as_str());
                        *findings
                            .reasons
                            .entry(format!("{stored}: {reason}"))
                            .or_default() += 1;
                    }
                    None => findings.failures.push(format!(
                        "{at}: reconciliation_required without a reason: exact, priceable \
                         evidence {evidence:?}"
                    )),
                }
                let kinds = audited.get(&e.id).cloned().unwrap_or_default();
                if !kinds.contains(&"reconciliation_required") {
                    findings.failures.push(format!(
                        "{at}: reconciliation_required without its audit row: {kinds:?}"
                    ));
                }
            }
            _ => {}
        }
    }
}

/// The operator API lists what the store holds (its first page, at most 100 rows).
async fn check_operator_list(
    seed: u64,
    load: &Load,
    operator: &str,
    executions: &[ExecutionRecord],
    findings: &mut Findings,
) {
    let listed = load
        .http
        .get(format!(
            "{}/v1/admin/executions?state=reconciliation_required&limit=100",
            load.base(0)
        ))
        .bearer_auth(operator)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status().as_u16(), 200, "seed {seed}: admin list");
    let listed: Value = listed.json().await.unwrap();
    let listed: BTreeSet<String> = listed["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["operation_key"].as_str().unwrap_or_default().to_string())
        .collect();
    let awaiting: BTreeSet<String> = executions
        .iter()
        .filter(|e| e.state == ExecutionState::ReconciliationRequired)
        .map(|e| e.operation_key.as_str().to_string())
        .collect();
    if listed.len() != awaiting.len().min(100) || !listed.is_subset(&awaiting) {
        findings.failures.push(format!(
            "seed {seed}: the operator API lists {listed:?}, the store holds {awaiting:?}"
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_13_sc_14_sc_41_sc_61_h_3_h_4_killed_servers_never_send_or_charge_twice() {
    let test_started = Instant::now();
    let seed = seed();
    let rounds = env_u64("TOLLGATE_KILL_ROUNDS").map_or(DEFAULT_ROUNDS, |n| {
        u32::try_from(n).unwrap_or(u32::MAX).max(1)
    });
    eprintln!("kill test: seed {seed} (TOLLGATE_KILL_SEED={seed} reproduces it), {rounds} rounds");
    let mut rng = Rng(seed);

    // 1. A fresh database, migrated by the binary.
    let db = TestDatabase::create(&test_admin_url())
        .await
        .unwrap_or_else(|e| panic!("cannot create a test database: {e}"));
    let migrated = tollgate()
        .arg("migrate")
        .env("DATABASE_URL", db.url())
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&migrated.stderr)
    );

    let database_time = test_started.elapsed();

    // 2. The mock provider, in this process: its counters are read directly.
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();

    // 3. The configuration and two servers.
    let caller = generate_key().expose().to_string();
    let operator = generate_key().expose().to_string();
    let dir = TempDir::new("tollgate-kill");
    let config = dir.0.join("tollgate.toml");
    std::fs::write(
        &config,
        config_text(
            &mock.base_url(),
            &KeyDigest::of_key(&caller).to_hex(),
            &KeyDigest::of_key(&operator).to_hex(),
        ),
    )
    .unwrap();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut servers = [
        Server::new("server-a", &config, db.url()),
        Server::new("server-b", &config, db.url()),
    ];
    let mut startups = Vec::new();
    for server in &mut servers {
        startups.push(server.start(&http, &format!("seed {seed} start")).await);
    }
    let setup_time = test_started.elapsed();

    // 4. The load.
    let load = Arc::new(Load {
        seed,
        http: http.clone(),
        caller,
        bases: [servers[0].base.clone(), servers[1].base.clone()],
        round: AtomicU32::new(0),
        stop: AtomicBool::new(false),
        keys: Mutex::new(BTreeMap::new()),
        anomalies: Mutex::new(Vec::new()),
        calls: AtomicU64::new(0),
        transport_errors: AtomicU64::new(0),
        replays: AtomicU64::new(0),
        conflicts: AtomicU64::new(0),
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| tokio::spawn(load.clone().client(c)))
        .collect();

    // 5. Kill one server at a seeded moment, restart it, repeat.
    let stores = db.stores(4).await.unwrap();
    let scope = Scope::parse(SCOPE).unwrap();
    let load_started = Instant::now();
    let mut kills = [0u32; 2];
    let mut in_flight_at_kills = Vec::new();
    let mut last_kill = Instant::now();
    let mut forwarded = [0u64; 2];
    for round in 1..=rounds {
        load.round.store(round, Ordering::SeqCst);
        let context = format!("seed {seed} round {round}");
        tokio::time::sleep(Duration::from_millis(rng.range(KILL_AFTER_MS))).await;
        let victim = (rng.next() % 2) as usize;
        for server in &mut servers {
            server.assert_alive(&context);
        }
        in_flight_at_kills.push(in_flight(&stores, &scope).await);
        // The victim's forwards, before they go with it.
        let victim_base = servers[victim].base.read().unwrap().clone();
        let before = support::forwards(&http, &victim_base, Some(&operator)).await;
        forwarded[0] += before[0];
        forwarded[1] += before[1];
        servers[victim].kill();
        last_kill = Instant::now();
        kills[victim] += 1;
        tokio::time::sleep(Duration::from_millis(rng.range(DOWN_MS))).await;
        startups.push(servers[victim].start(&http, &context).await);
    }
    // A last stretch of load with both servers up, then stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    load.stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    let load_time = load_started.elapsed();
    for server in &mut servers {
        server.assert_alive(&format!("seed {seed} after the load"));
        let base = server.base.read().unwrap().clone();
        let [answered, unreachable] = support::forwards(&http, &base, Some(&operator)).await;
        forwarded[0] += answered;
        forwarded[1] += unreachable;
    }

    // 6. The schedulers finish every orphaned execution; then the checks.
    let drain_time = drain(&stores, &scope, seed, &servers).await;
    let recovered_after = last_kill.elapsed();

    let mut findings = Findings {
        failures: load
            .anomalies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
        ..Findings::default()
    };
    let keys = load.keys().clone();
    let executions = executions(&stores, &scope).await;
    let claimed: BTreeSet<&str> = executions
        .iter()
        .map(|e| e.operation_key.as_str())
        .collect();
    check_sends(seed, &mock, &keys, &claimed, &mut findings);
    check_journal(
        seed,
        &stores,
        &scope,
        &mock,
        &keys,
        &executions,
        &mut findings,
    )
    .await;
    check_operator_list(seed, &load, &operator, &executions, &mut findings).await;
    let verified = tollgate()
        .args(["audit", "verify", "--scope", SCOPE])
        .env("DATABASE_URL", db.url())
        .output()
        .unwrap();
    if !verified.status.success() {
        findings.failures.push(format!(
            "seed {seed}: audit verify failed: {} {}",
            String::from_utf8_lossy(&verified.stdout),
            String::from_utf8_lossy(&verified.stderr)
        ));
    }
    if let Err(problems) = ledger_audit_clean(db.url(), SCOPE).await {
        for problem in problems {
            findings
                .failures
                .push(format!("seed {seed}: ledger: {problem}"));
        }
    }
    // A killed server's calls were taken over within one lease and a scheduler pass (SC-205).
    if recovered_after > Duration::from_millis(RECOVERED_WITHIN_MS) {
        findings.failures.push(format!(
            "seed {seed}: the last kill's calls were recovered {:.1}s after it, past \
             {RECOVERED_WITHIN_MS} ms (lease {LEASE_MS} ms, scheduler period {INTERVAL_MS} ms)",
            recovered_after.as_secs_f64()
        ));
    }
    // The servers were members of one cluster: each sent the other's consumer's calls to it.
    if forwarded[0] == 0 {
        findings.failures.push(format!(
            "seed {seed}: no call was forwarded between the members ({forwarded:?})"
        ));
    }
    // The kills landed on work: calls were in flight when most of them struck.
    let kills_on_work = in_flight_at_kills.iter().filter(|n| **n > 0).count();
    if kills_on_work * 2 < in_flight_at_kills.len() {
        findings.failures.push(format!(
            "seed {seed}: only {kills_on_work} of {} kills struck with calls in flight: \
             {in_flight_at_kills:?}",
            in_flight_at_kills.len()
        ));
    }
    for server in &mut servers {
        server.kill();
    }

    let restart_ms: Vec<u128> = startups.iter().map(Duration::as_millis).collect();
    let summary = format!(
        "kill test: seed {seed}; {rounds} rounds, kills a={} b={}; database {:.1}s, setup {:.1}s, \
         load {:.1}s, drain {:.1}s, total {:.1}s; starts ms min {} max {}; {} keys, {} HTTP calls \
         ({} transport errors), {} replays and {} conflicts answered; {} provider requests; \
         executions {:?}; settlements by source {:?}; awaiting an operator: {:?}; \
         {} audit rows; calls in flight at the kills {:?}; the last kill's calls recovered \
         {:.1}s after it (bound {} ms); forwards between the members: {} answered, {} with no \
         answer (served where they arrived)",
        kills[0],
        kills[1],
        database_time.as_secs_f64(),
        setup_time.as_secs_f64(),
        load_time.as_secs_f64(),
        drain_time.as_secs_f64(),
        test_started.elapsed().as_secs_f64(),
        restart_ms.iter().min().unwrap_or(&0),
        restart_ms.iter().max().unwrap_or(&0),
        keys.len(),
        load.calls.load(Ordering::Relaxed),
        load.transport_errors.load(Ordering::Relaxed),
        load.replays.load(Ordering::Relaxed),
        load.conflicts.load(Ordering::Relaxed),
        mock.request_count(),
        findings.states,
        findings.sources,
        findings.reasons,
        findings.audit_rows,
        in_flight_at_kills,
        recovered_after.as_secs_f64(),
        RECOVERED_WITHIN_MS,
        forwarded[0],
        forwarded[1],
    );
    eprintln!("{summary}");
    mock.shutdown().await;
    assert!(
        findings.failures.is_empty(),
        "{summary}\n{} failure(s):\n{}\n--- server logs ---\n{}\n{}",
        findings.failures.len(),
        findings.failures.join("\n"),
        servers[0].log_tail(),
        servers[1].log_tail()
    );
    assert!(
        !keys.is_empty() && load.replays.load(Ordering::Relaxed) > 0,
        "{summary}: the load did too little to show anything"
    );
}
