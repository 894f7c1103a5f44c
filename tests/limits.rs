//! Rate and concurrency limits across instances (spec/limits.md, SC-220..SC-225), black-box: two
//! `tollgate serve` processes on one fresh Postgres database and the mock provider in this
//! process, driven over HTTP on every door. The tests judge the servers by their answers, the
//! mock's request counts and the database's rows: a limit admits exactly its count across both
//! servers, every refusal is a 429 whose headers say when to come back and sends and writes
//! nothing, a replay is never limited, and a limit and a cap hold together.
#![cfg(test)]

mod support;
use support::{fresh_database, json_ok, run, serve_on, tollgate, ServeChild, TempFile};

use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tollgate_mock_provider::MockProvider;
use tollgate_testkit::pg::TestDatabase;

/// Calls of the two-server burst.
const BURST: usize = 500;
/// `requests_per_minute` of the burst's consumer.
const RPM: usize = 100;
/// `max_tokens` of every profile: what an admitted call counts against an output-token limit.
const MAX_TOKENS: u64 = 64;
/// Calls an output-token limit of the `tokens` profile admits in one window.
const TOKEN_CALLS: u64 = 6;
/// `in_flight` of the `flight` profile.
const IN_FLIGHT: usize = 7;
/// `requests_per_minute` of a stored key.
const KEY_RPM: usize = 5;

/// Profiles, each of its own consumer: `burst` (echo, 100 requests a minute), `tokens` (a slow
/// model, output tokens for six calls a minute), `flight` (a slow model, seven in flight),
/// `capped` (a slow model, a daily block cap of two holds and three requests a minute), `open`
/// (echo, no limit, for key limits) and `messages` (the Anthropic door, two requests a minute).
fn config(mock_url: &str) -> String {
    let price = |model: &str| {
        format!(
            "[prices.models.\"{model}\"]\ninput = \"1.00\"\noutput = \"2.00\"\n\
             cache_read = \"0.10\"\ncache_write = \"1.25\"\nreasoning = \"2.00\"\n"
        )
    };
    let profile = |name: &str, provider: &str, model: &str, extra: &str| {
        format!(
            "[[profiles]]\nname = \"{name}\"\nkind = \"text\"\nprovider = \"{provider}\"\n\
             model = \"{model}\"\npolicy_version = \"policy-1\"\nprice_version = \"prices-l\"\n\
             consumer = \"team-{name}\"\nmax_tokens = {MAX_TOKENS}\nmax_input_chars = 2000\n\
             run_timeout_ms = 30000\n{extra}\n"
        )
    };
    let token_limit = MAX_TOKENS * TOKEN_CALLS;
    [
        "[server]\nlisten = \"127.0.0.1:0\"\nconcurrency_limit = 4096\n".to_string(),
        format!("[[providers]]\nname = \"mock\"\nkind = \"openai-chat\"\nbase_url = \"{mock_url}\"\n"),
        format!(
            "[[providers]]\nname = \"mock-anthropic\"\nkind = \"anthropic\"\nbase_url = \"{mock_url}\"\n"
        ),
        format!(
            "[[prices]]\nversion = \"prices-l\"\ncurrency = \"USD\"\n{}{}",
            price("mock-echo"),
            price("mock-slow-4000")
        ) + &price("mock-slow-1500"),
        profile(
            "burst",
            "mock",
            "mock-echo",
            &format!("[profiles.limits]\nrequests_per_minute = {RPM}"),
        ),
        profile(
            "tokens",
            "mock",
            "mock-slow-4000",
            &format!("[profiles.limits]\noutput_tokens_per_minute = {token_limit}"),
        ),
        profile(
            "flight",
            "mock",
            "mock-slow-4000",
            &format!("[profiles.limits]\nin_flight = {IN_FLIGHT}"),
        ),
        // A call of this profile holds its request's own worst case (SC-120): `limits-c0`, 9
        // bytes, and the framing of one message (16 tokens) at the dearest input price (1.25 per
        // million), and 64 output tokens at 2.00 per million: 0.00015925. The cap admits two such
        // holds, not three.
        profile(
            "capped",
            "mock",
            "mock-slow-4000",
            "[profiles.caps]\ndaily_block = \"0.0004\"\n[profiles.limits]\nrequests_per_minute = 3",
        ),
        profile("open", "mock", "mock-echo", ""),
        profile("flight1", "mock", "mock-slow-1500", "[profiles.limits]\nin_flight = 1"),
        profile(
            "messages",
            "mock-anthropic",
            "mock-echo",
            "[profiles.limits]\nrequests_per_minute = 2",
        ),
    ]
    .join("\n")
}

/// Two servers on one fresh database, the mock, and a caller key made by `tollgate keys create`.
struct Cluster {
    db: TestDatabase,
    mock: MockProvider,
    _config: TempFile,
    _servers: Vec<ServeChild>,
    bases: Vec<String>,
    http: reqwest::Client,
    caller: String,
    operator: String,
}

fn create_key(url: &str, extra: &[&str]) -> String {
    create_key_of(url, "caller", extra)
}

fn create_key_of(url: &str, role: &str, extra: &[&str]) -> String {
    let created = json_ok(&run(tollgate()
        .args([
            "--json", "keys", "create", "--scope", "acme", "--role", role,
        ])
        .args(extra)
        .env("DATABASE_URL", url)));
    created["key"].as_str().unwrap().to_string()
}

impl Cluster {
    async fn start() -> Self {
        let db = fresh_database().await;
        let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
            .await
            .unwrap();
        let config = TempFile::new("limits.toml", &config(&mock.base_url()));
        let caller = create_key(db.url(), &[]);
        let operator = create_key_of(db.url(), "operator", &[]);
        let mut servers = Vec::new();
        let mut bases = Vec::new();
        for _ in 0..2 {
            let (serve, base) = serve_on(&config.0, db.url()).await;
            servers.push(serve);
            bases.push(base);
        }
        Self {
            db,
            mock,
            _config: config,
            _servers: servers,
            bases,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                .build()
                .unwrap(),
            caller,
            operator,
        }
    }

    /// `POST /v1/calls` on server `n % 2`.
    async fn call(&self, n: usize, key: &str, profile: &str, op: &str) -> Answer {
        let body = json!({
            "profile": profile, "operation_key": op, "session_id": "s-1",
            "input_revision": "r-1", "intent": "limits",
            "input": {"messages": [{"role": "user", "content": format!("limits-{op}")}]}
        });
        let response = self
            .http
            .post(format!("{}/v1/calls", self.bases[n % 2]))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        Answer::of(response).await
    }

    /// The journal rows of `consumer` in scope `acme`, in any state.
    async fn executions_of(&self, consumer: &str) -> usize {
        use tollgate_core::state::ExecutionState as S;
        use tollgate_store::ExecutionStore;
        let stores = tollgate_postgres::PgStores::connect(self.db.url(), 2)
            .await
            .unwrap();
        let scope = tollgate_core::ids::Scope::parse("acme").unwrap();
        let mut n = 0;
        for state in [
            S::Prepared,
            S::Dispatched,
            S::Completed,
            S::NotDispatched,
            S::ReconciliationRequired,
        ] {
            let rows = stores.by_state(&scope, state, 100_000).await.unwrap();
            n += rows
                .iter()
                .filter(|r| r.binding.config.consumer.as_str() == consumer)
                .count();
        }
        n
    }

    async fn stop(self) {
        drop(self._servers);
        self.mock.shutdown().await;
        drop(self.db);
    }
}

/// One answer: status, headers, body.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    async fn of(response: reqwest::Response) -> Self {
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap();
        Self {
            status,
            headers,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn header_u64(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} header: {:?}", self.headers))
            .parse()
            .unwrap()
    }
}

/// `n` calls at once, alternating between the servers, each of its own key `{prefix}{i}`.
async fn burst(c: &Arc<Cluster>, key: &str, profile: &str, prefix: &str, n: usize) -> Vec<Answer> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let c = Arc::clone(c);
            let (key, profile, op) = (key.to_string(), profile.to_string(), format!("{prefix}{i}"));
            tokio::spawn(async move { c.call(i, &key, &profile, &op).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// The 429s of `answers`, each checked: code `rate_limited`, the limit it names, and headers
/// that say when to come back.
fn refusals<'a>(answers: &'a [Answer], kind: &str, limit: u64) -> Vec<&'a Answer> {
    let refused: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    for a in &refused {
        assert_eq!(a.body["error"]["code"], "rate_limited", "{}", a.body);
        assert_eq!(a.body["error"]["limit_kind"], kind);
        assert_eq!(a.body["error"]["limit"], limit);
        let after = a.header_u64("retry-after");
        assert!((1..=60).contains(&after), "Retry-After {after}");
        let after_ms = a.header_u64("retry-after-ms");
        assert!(after_ms <= after * 1_000 && after_ms > (after - 1) * 1_000);
        assert_eq!(a.header("x-should-retry"), Some("true"));
    }
    refused
}

fn admitted(answers: &[Answer]) -> usize {
    answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sc_220_sc_224_two_servers_admit_exactly_the_requests_limit_and_replays_are_never_limited()
{
    let c = Arc::new(Cluster::start().await);
    let answers = burst(&c, &c.caller, "burst", "b", BURST).await;
    let other: Vec<_> = answers
        .iter()
        .filter(|a| ![StatusCode::OK, StatusCode::TOO_MANY_REQUESTS].contains(&a.status))
        .map(|a| (a.status, a.body.clone()))
        .collect();
    assert!(
        other.is_empty(),
        "answers other than 200 and 429: {other:?}"
    );
    assert_eq!(admitted(&answers), RPM, "exactly the limit admitted");
    let refused = refusals(&answers, "requests", RPM as u64);
    assert_eq!(refused.len(), BURST - RPM);
    for a in &refused {
        assert_eq!(a.header("x-ratelimit-limit-requests"), Some("100"));
        assert_eq!(a.header("x-ratelimit-remaining-requests"), Some("0"));
        assert!(a
            .header("x-ratelimit-reset-requests")
            .is_some_and(|r| r.ends_with('s')));
    }
    // A refusal sent nothing and wrote nothing: one provider request and one row per admission.
    assert_eq!(c.mock.request_count(), RPM as u64);
    assert_eq!(c.executions_of("team-burst").await, RPM);
    // Replays of the admitted keys answer from their rows, on either server, the window full.
    let ok_keys: Vec<usize> = (0..BURST)
        .filter(|i| answers[*i].status == StatusCode::OK)
        .collect();
    for (n, i) in ok_keys.iter().take(10).enumerate() {
        let replay = c.call(n, &c.caller, "burst", &format!("b{i}")).await;
        assert_eq!(replay.status, StatusCode::OK, "{}", replay.body);
        assert_eq!(replay.body["replayed"], true);
    }
    assert_eq!(c.mock.request_count(), RPM as u64, "replays sent nothing");
    // Retry-After is usable: once it has passed, a refused key is admitted.
    let wait = refused
        .iter()
        .map(|a| a.header_u64("retry-after-ms"))
        .max()
        .unwrap();
    let late = c.call(0, &c.caller, "burst", "b-late").await;
    assert_eq!(late.status, StatusCode::TOO_MANY_REQUESTS);
    let late_wait = late.header_u64("retry-after-ms");
    assert!(late_wait <= wait);
    tokio::time::sleep(Duration::from_millis(late_wait + 50)).await;
    let after = c.call(1, &c.caller, "burst", "b-late").await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.body);
    Arc::into_inner(c).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sc_221_sc_222_token_and_in_flight_limits_hold_across_two_servers() {
    let c = Arc::new(Cluster::start().await);
    // Output tokens: each admitted call counts `max_tokens` until it settles (4 s later).
    let tokens = burst(&c, &c.caller, "tokens", "t", 40).await;
    assert_eq!(admitted(&tokens) as u64, TOKEN_CALLS);
    let refused = refusals(&tokens, "output_tokens", MAX_TOKENS * TOKEN_CALLS);
    assert_eq!(refused.len() as u64, 40 - TOKEN_CALLS);
    for a in &refused {
        assert!(a.header("x-ratelimit-limit-tokens").is_some());
        assert!(a.header("x-ratelimit-remaining-output-tokens").is_some());
    }
    // Calls in flight: seven at once; the 429s ask to come back in a second.
    let flight = burst(&c, &c.caller, "flight", "f", 30).await;
    assert_eq!(admitted(&flight), IN_FLIGHT);
    let refused = refusals(&flight, "in_flight", IN_FLIGHT as u64);
    assert_eq!(refused.len(), 30 - IN_FLIGHT);
    assert!(refused.iter().all(|a| a.header("retry-after") == Some("1")));
    // Once they have ended, the consumer has room again.
    let again = c.call(0, &c.caller, "flight", "f-again").await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(
        c.mock.request_count(),
        TOKEN_CALLS + IN_FLIGHT as u64 + 1,
        "no refused call was sent"
    );
    Arc::into_inner(c).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sc_220_sc_223_a_limit_and_a_cap_together_and_a_stored_key_s_limit() {
    let c = Arc::new(Cluster::start().await);
    // The cap admits two holds; the limit three calls a minute. Ten at once: the cap refuses
    // eight (402) and counts nothing against the limit.
    let first = burst(&c, &c.caller, "capped", "c", 10).await;
    assert_eq!(admitted(&first), 2);
    assert_eq!(
        first
            .iter()
            .filter(|a| a.status == StatusCode::PAYMENT_REQUIRED)
            .count(),
        8
    );
    // Settled, the two leave room under the cap; the limit has one call left.
    let third = c.call(0, &c.caller, "capped", "c-third").await;
    assert_eq!(third.status, StatusCode::OK, "{}", third.body);
    let fourth = c.call(1, &c.caller, "capped", "c-fourth").await;
    assert_eq!(
        fourth.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        fourth.body
    );
    assert_eq!(fourth.body["error"]["used"], 3);
    // A stored key with its own limit: five of twenty at once, across both servers, on a
    // profile whose consumer has none.
    let limited = create_key(c.db.url(), &["--requests-per-minute", &KEY_RPM.to_string()]);
    let answers = burst(&c, &limited, "open", "k", 20).await;
    assert_eq!(admitted(&answers), KEY_RPM);
    let refused = refusals(&answers, "requests", KEY_RPM as u64);
    assert!(refused.iter().all(|a| a.body["error"]["subject"] == "key"));
    // Another key of the same scope is not held back by it.
    let free = c.call(0, &c.caller, "open", "k-free").await;
    assert_eq!(free.status, StatusCode::OK, "{}", free.body);
    Arc::into_inner(c).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sc_224_every_door_answers_a_limit_with_429_and_the_provider_s_headers() {
    let c = Arc::new(Cluster::start().await);
    let messages = |op: &str| {
        json!({"model": "messages", "max_tokens": 16,
               "messages": [{"role": "user", "content": format!("door-{op}")}]})
    };
    let mut last = None;
    for (i, op) in ["m1", "m2", "m3"].iter().enumerate() {
        let response = c
            .http
            .post(format!("{}/v1/messages", c.bases[i % 2]))
            .header("x-api-key", &c.caller)
            .header("anthropic-version", "2023-06-01")
            .header("Idempotency-Key", *op)
            .json(&messages(op))
            .send()
            .await
            .unwrap();
        last = Some(Answer::of(response).await);
    }
    let refused = last.unwrap();
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.body
    );
    assert_eq!(refused.body["type"], "error");
    assert_eq!(refused.body["error"]["type"], "rate_limit_error");
    assert_eq!(
        refused.header("anthropic-ratelimit-requests-limit"),
        Some("2")
    );
    assert_eq!(
        refused.header("anthropic-ratelimit-requests-remaining"),
        Some("0")
    );
    assert!(refused
        .header("anthropic-ratelimit-requests-reset")
        .is_some());
    assert!(refused.header("retry-after").is_some());
    assert_eq!(refused.header("x-ratelimit-limit-requests"), Some("2"));
    // The OpenAI-compatible door, on the burst profile's consumer, refused alike.
    let chat = |op: &str| json!({"model": "burst", "messages": [{"role": "user", "content": format!("chat-{op}")}]});
    let mut statuses = Vec::new();
    for i in 0..(RPM + 1) {
        let response = c
            .http
            .post(format!("{}/v1/chat/completions", c.bases[i % 2]))
            .bearer_auth(&c.caller)
            .header("Idempotency-Key", format!("chat-{i}"))
            .json(&chat(&i.to_string()))
            .send()
            .await
            .unwrap();
        statuses.push(Answer::of(response).await);
    }
    assert_eq!(admitted(&statuses), RPM);
    let refused = statuses.last().unwrap();
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.body["error"]["type"], "requests");
    assert_eq!(refused.body["error"]["code"], "rate_limited");
    assert_eq!(refused.header("x-ratelimit-remaining-requests"), Some("0"));
    // Prometheus counts the refusals by subject and limit.
    let mut refusals_seen = 0;
    for base in &c.bases {
        let metrics = support::metrics_text(&c.http, base, Some(&c.operator))
            .await
            .expect("the server answers its metrics");
        let name = "tollgate_rate_limited_total{subject=\"consumer\",limit=\"requests\"}";
        refusals_seen += support::metric(&metrics, name)
            .unwrap_or_else(|| panic!("no refusal counter: {metrics}"));
    }
    assert_eq!(refusals_seen, 2);
    Arc::into_inner(c).unwrap().stop().await;
}

/// The official OpenAI Python SDK meets a refusal by calls in flight and backs off by the
/// answer's `retry-after-ms`, at its default retry settings: the call is admitted once the
/// call in flight has ended, and is sent once. The SDK's process is started and its client made
/// first, and the holder is sent only then, so the holder is in flight when the SDK's request
/// arrives however long the interpreter takes to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sc_224_the_openai_sdk_backs_off_by_the_limit_s_headers() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let c = Arc::new(Cluster::start().await);
    let script = r#"
import json, os, sys, time
from openai import OpenAI
client = OpenAI(base_url=os.environ["BASE"] + "/v1", api_key=os.environ["KEY"])
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
raw = client.chat.completions.with_raw_response.create(
    model="flight1",
    messages=[{"role": "user", "content": "limits-sdk"}],
    extra_headers={"Idempotency-Key": "sdk-1"},
)
print(json.dumps({"retries": raw.retries_taken, "elapsed": time.monotonic() - started,
                  "content": raw.parse().choices[0].message.content}))
"#;
    let mut sdk = tokio::process::Command::new(tollgate_testkit::sdk_tour::sdk_python())
        .arg("-c")
        .arg(script)
        .env("BASE", &c.bases[1])
        .env("KEY", &c.caller)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(sdk.stdout.take().unwrap());
    let mut ready = String::new();
    stdout.read_line(&mut ready).await.unwrap();
    if ready.trim() != "ready" {
        panic!("the SDK did not start: {}", stderr_of(&mut sdk).await);
    }
    let holder = {
        let c = Arc::clone(&c);
        tokio::spawn(async move { c.call(0, &c.caller, "flight1", "holder").await })
    };
    // The holder is in flight once the mock has its request.
    for _ in 0..500 {
        if c.mock.request_count() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(c.mock.request_count(), 1, "the holder is in flight");
    let mut stdin = sdk.stdin.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    stdin.flush().await.unwrap();
    let mut answer = String::new();
    stdout.read_line(&mut answer).await.unwrap();
    let stderr = stderr_of(&mut sdk).await;
    assert!(
        sdk.wait().await.unwrap().success(),
        "the SDK failed: {stderr}"
    );
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert!(answer["retries"].as_u64().unwrap() >= 1, "{answer}");
    assert!(answer["elapsed"].as_f64().unwrap() >= 0.9, "{answer}");
    assert!(
        answer["content"].as_str().unwrap().contains("limits-sdk"),
        "{answer}"
    );
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
    assert_eq!(c.mock.request_count_for("limits-sdk"), 1, "sent once");
    Arc::into_inner(c).unwrap().stop().await;
}

/// What a child process wrote to its piped stderr, to its end.
async fn stderr_of(child: &mut tokio::process::Child) -> String {
    use tokio::io::AsyncReadExt;
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        pipe.read_to_string(&mut stderr).await.unwrap();
    }
    stderr
}
