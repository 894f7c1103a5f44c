//! Time to first token (TTFT) of a streamed text call: through tollgate's OpenAI-compatible door
//! (`POST /v1/chat/completions`, `stream: true`, answered live: SC-213) against the mock
//! provider's own `/v1/chat/completions`, measured in one run, against the target of
//! spec/performance.md (the added p50 at one request at a time ≤ 2 ms).
//!
//! The mock provider and a tollgate server (the in-memory stores, and Postgres when reachable)
//! run in this process on loopback. A request's TTFT is the time from sending it to the arrival
//! of the first server-sent `data:` event whose `choices[0].delta.content` is not empty; the
//! rest of the stream is read to its `[DONE]`. Beside it, with no target: the time to the
//! response's headers (through tollgate the stream opens once the call is claimed, as it is
//! sent) and to `[DONE]` (through tollgate after the settlement). Every request carries a new `Idempotency-Key`, so each is a first call, never a
//! replay. A request counts as a success when it is a 200 event stream whose text is the
//! prompt echoed, with a `stop` finishing chunk (through tollgate also its `completed` state)
//! and `[DONE]`; anything else is a failure and stays in the denominators: a percentile ranks
//! failures after every success. A tollgate answer that is not `tollgate-stream: live` stops
//! the run.
//!
//! Paired evaluation (H-7): rounds alternate which side goes first. One request at a time (c1)
//! gives the figures against the target; eight at a time (c8) is reported as information.
//! `cargo bench -p tollgate-server --bench ttft` (Postgres from `TOLLGATE_TEST_DATABASE_URL`,
//! or `postgres://postgres@127.0.0.1:5432/postgres`: a fresh database of the test kit's,
//! dropped afterwards; skipped with a note when unreachable).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::panic,
    missing_docs
)]

use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::Scope;
use tollgate_mock_provider::MockProvider;
use tollgate_server::auth::KeyStore;
use tollgate_server::config::{Env, FileConfig};
use tollgate_server::metrics::Metrics;
use tollgate_server::{App, Backend};
use tollgate_store::KeyRole;
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// Rounds at c1 (sides alternate which goes first).
const ROUNDS: usize = 8;
/// Requests per round and side at c1, one after the other.
const CALLS_PER_ROUND: usize = 250;
/// Rounds at c8 (information).
const C8_ROUNDS: usize = 2;
/// Requests in flight at once in the c8 rounds.
const C8_CONCURRENCY: usize = 8;
/// Requests per round and side at c8 (each of the eight clients sends its share in turn).
const C8_CALLS_PER_ROUND: usize = 400;
/// Requests per side before the rounds (connections opened, caches warm); not counted.
const WARMUP: usize = 30;
/// The target: added p50 at c1, in milliseconds.
const TARGET_ADDED_P50_MS: f64 = 2.0;
/// Observations needed before a p95 is quoted.
const P95_OBSERVATIONS_MIN: usize = 20;
/// The mock's scenario: the prompt echoed, in 16-character deltas, at zero delay.
const MOCK_MODEL: &str = "mock-echo";
/// The tollgate profile over it.
const PROFILE: &str = "ttft";
/// The prompt (echoed: 8 text deltas after the role chunk).
const PROMPT: &str = "Summarize order 123: two boxes of tea, one kettle, shipped on Monday \
                      to the Leeds depot, due by Friday.";
/// Postgres pool of the tollgate server.
const PG_CONNECTIONS: u32 = 16;

fn config_text(mock_url: &str) -> String {
    format!(
        r#"
[[providers]]
name = "mock"
kind = "openai-chat"
base_url = "{mock_url}"

[[prices]]
version = "prices-ttft"
currency = "USD"
[prices.models."{MOCK_MODEL}"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"

[[profiles]]
name = "{PROFILE}"
kind = "text"
provider = "mock"
model = "{MOCK_MODEL}"
policy_version = "policy-ttft"
price_version = "prices-ttft"
consumer = "team-ttft"
max_tokens = 64
max_input_chars = 1000
max_output_chars = 2000
run_timeout_ms = 10000
"#
    )
}

/// Where a side's requests go.
struct Side {
    name: &'static str,
    url: String,
    /// Model of the request body: the mock's scenario, or tollgate's profile.
    model: &'static str,
    /// A caller key (tollgate only).
    key: Option<String>,
}

impl Side {
    fn through_tollgate(&self) -> bool {
        self.key.is_some()
    }
}

/// A tollgate server on one backend, in this process.
struct Tollgate {
    side: Side,
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
    /// The Postgres database, kept until the end (dropped with it).
    _database: Option<TestDatabase>,
}

async fn tollgate(
    name: &'static str,
    backend: Backend,
    mock_url: &str,
    database: Option<TestDatabase>,
) -> Tollgate {
    let env = Env::new();
    let settings = FileConfig::from_toml(&config_text(mock_url), &env)
        .unwrap()
        .validate(&env)
        .unwrap();
    let keys = Arc::new(
        KeyStore::new(&settings.keys, backend.stores()).with_cache_ms(settings.key_cache_ms),
    );
    let caller = keys
        .create(&Scope::parse("ttft").unwrap(), KeyRole::Caller)
        .await
        .unwrap();
    let app = App::build(&settings, backend, keys, Arc::new(Metrics::default())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        listener.local_addr().unwrap()
    );
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(tollgate_server::run(
        listener,
        app,
        shutdown.clone().cancelled_owned(),
    ));
    Tollgate {
        side: Side {
            name,
            url,
            model: PROFILE,
            key: Some(caller.expose().to_string()),
        },
        shutdown,
        task,
        _database: database,
    }
}

/// A tollgate server on a fresh, migrated Postgres database, or why there is none.
async fn postgres(mock_url: &str) -> Result<Tollgate, String> {
    let admin = test_admin_url();
    let database = TestDatabase::create(&admin)
        .await
        .map_err(|e| format!("{e}"))?;
    let stores = database
        .stores(PG_CONNECTIONS)
        .await
        .map_err(|e| format!("{e}"))?;
    stores.migrate().await.map_err(|e| format!("{e}"))?;
    let backend = Backend::Postgres(Arc::new(stores));
    Ok(tollgate("tollgate, postgres", backend, mock_url, Some(database)).await)
}

/// One streamed request's times.
#[derive(Debug, Clone, Copy)]
struct Timed {
    /// To the response's headers (through tollgate: the call is claimed and being sent).
    headers: Duration,
    /// To the first non-empty content delta.
    ttft: Duration,
    /// To the end of the stream.
    total: Duration,
}

/// One streamed request to `side`: its times, or why it failed.
async fn one(http: &reqwest::Client, side: &Side, key: &str) -> Result<Timed, String> {
    let body = json!({
        "model": side.model,
        "stream": true,
        "messages": [{"role": "user", "content": PROMPT}],
    })
    .to_string();
    let mut request = http
        .post(&side.url)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body);
    if let Some(caller) = &side.key {
        request = request.bearer_auth(caller);
    }
    let started = Instant::now();
    let mut response = request.send().await.map_err(|e| format!("send: {e}"))?;
    let headers = started.elapsed();
    let status = response.status();
    if status != reqwest::StatusCode::OK {
        let text = response.text().await.unwrap_or_default();
        return Err(format!("status {status}: {text}"));
    }
    if side.through_tollgate() {
        let mode = response
            .headers()
            .get("tollgate-stream")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("(none)")
            .to_string();
        if mode != "live" {
            let text = response.text().await.unwrap_or_default();
            panic!(
                "{}: a streamed text call was answered with tollgate-stream: {mode}, not live; \
                 its body: {text}",
                side.name
            );
        }
    }
    let mut buffer: Vec<u8> = Vec::new();
    let mut ttft = None;
    let mut text = String::new();
    let (mut stopped, mut completed, mut done) = (false, false, false);
    loop {
        let chunk = response.chunk().await.map_err(|e| format!("body: {e}"))?;
        let arrived = started.elapsed();
        let Some(chunk) = chunk else { break };
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            let event = String::from_utf8(event).map_err(|_| "an event not UTF-8".to_string())?;
            for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                let data = data.trim_start();
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let value: Value =
                    serde_json::from_str(data).map_err(|e| format!("event {data:?}: {e}"))?;
                if value.get("error").is_some() {
                    return Err(format!("error event: {data}"));
                }
                let choice = &value["choices"][0];
                if let Some(content) = choice["delta"]["content"].as_str() {
                    if !content.is_empty() {
                        ttft.get_or_insert(arrived);
                        text.push_str(content);
                    }
                }
                stopped |= choice["finish_reason"] == "stop";
                completed |= value["tollgate"]["state"] == "completed";
            }
        }
    }
    let total = started.elapsed();
    let ttft = ttft.ok_or("no content delta")?;
    if text != PROMPT {
        return Err(format!("text {text:?} is not the prompt echoed"));
    }
    if !(stopped && done && (completed || !side.through_tollgate())) {
        return Err(format!(
            "incomplete stream: stop {stopped}, completed {completed}, [DONE] {done}"
        ));
    }
    Ok(Timed {
        headers,
        ttft,
        total,
    })
}

/// The outcomes of one side's rounds.
#[derive(Default)]
struct Tally {
    /// Every attempt: its times, or `None` for a failure.
    all: Vec<Option<Timed>>,
    /// Each round's TTFT p50 (failures ranked last).
    round_p50: Vec<Option<Duration>>,
    /// One failure's reason, to print.
    first_failure: Option<String>,
}

impl Tally {
    fn add_round(&mut self, outcomes: Vec<Result<Timed, String>>) {
        let round: Vec<Option<Timed>> = outcomes
            .into_iter()
            .map(|o| match o {
                Ok(t) => Some(t),
                Err(e) => {
                    self.first_failure.get_or_insert(e);
                    None
                }
            })
            .collect();
        self.round_p50.push(percentile(&ttfts(&round), 50));
        self.all.extend(round);
    }

    fn failures(&self) -> usize {
        self.all.iter().filter(|t| t.is_none()).count()
    }

    fn successes(&self) -> usize {
        self.all.len() - self.failures()
    }

    fn ttft(&self, p: usize) -> Option<Duration> {
        percentile(&ttfts(&self.all), p)
    }

    /// The `p`-th percentile of another of the times (failures ranked last).
    fn of(&self, time: fn(&Timed) -> Duration, p: usize) -> Option<Duration> {
        let times: Vec<Option<Duration>> = self.all.iter().map(|t| t.as_ref().map(time)).collect();
        percentile(&times, p)
    }
}

fn ttfts(outcomes: &[Option<Timed>]) -> Vec<Option<Duration>> {
    outcomes.iter().map(|t| t.map(|t| t.ttft)).collect()
}

/// The `p`-th percentile with failures (`None`) ranked after every success: `None` when it
/// falls on a failure.
fn percentile(values: &[Option<Duration>], p: usize) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by_key(|v| v.unwrap_or(Duration::MAX));
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("failed".into(), |d| format!("{:.3}", d.as_secs_f64() * 1e3))
}

/// `calls` requests to `side`, `concurrency` at a time (each client sends its next request
/// once its previous stream ended), keys tagged `tag`.
async fn round(
    http: &reqwest::Client,
    side: &Side,
    tag: &str,
    calls: usize,
    concurrency: usize,
) -> Vec<Result<Timed, String>> {
    if concurrency == 1 {
        let mut out = Vec::with_capacity(calls);
        for i in 0..calls {
            out.push(one(http, side, &format!("{tag}-{i}")).await);
        }
        return out;
    }
    let clients = (0..concurrency).map(|c| async move {
        let mut out = Vec::new();
        for i in (c..calls).step_by(concurrency) {
            out.push(one(http, side, &format!("{tag}-{i}")).await);
        }
        out
    });
    futures::future::join_all(clients)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Rounds over `sides`, alternating which goes first; one tally per side.
async fn rounds(
    http: &reqwest::Client,
    sides: &[&Side],
    level: &str,
    rounds: usize,
    calls: usize,
    concurrency: usize,
) -> Vec<Tally> {
    let mut tallies: Vec<Tally> = sides.iter().map(|_| Tally::default()).collect();
    for r in 0..rounds {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for s in order {
            let tag = format!("{level}-r{r}-s{s}");
            let outcomes = round(http, sides[s], &tag, calls, concurrency).await;
            tallies[s].add_round(outcomes);
        }
    }
    tallies
}

/// Prints the table of one level and, against the mock, each tollgate side's added p50.
fn report(sides: &[&Side], tallies: &[Tally], against_target: bool) {
    println!(
        "| side | TTFT p50 ms | TTFT p95 ms | to headers p50 ms | to [DONE] p50 ms | \
         failed/attempted |"
    );
    println!("|---|---|---|---|---|---|");
    for (side, t) in sides.iter().zip(tallies) {
        let p95 = if t.successes() >= P95_OBSERVATIONS_MIN {
            ms(t.ttft(95))
        } else {
            "n/a (< 20 observations)".into()
        };
        println!(
            "| {} | {} | {p95} | {} | {} | {}/{} |",
            side.name,
            ms(t.ttft(50)),
            ms(t.of(|t| t.headers, 50)),
            ms(t.of(|t| t.total, 50)),
            t.failures(),
            t.all.len()
        );
    }
    for t in tallies {
        if let Some(e) = &t.first_failure {
            println!("a failure: {e}");
        }
    }
    let mock = &tallies[0];
    for (side, t) in sides.iter().zip(tallies).skip(1) {
        let (Some(base), Some(through)) = (mock.ttft(50), t.ttft(50)) else {
            println!("{}: added p50 n/a (a p50 falls on a failure)", side.name);
            if against_target {
                println!(
                    "target: added p50 <= {TARGET_ADDED_P50_MS:.1} ms: not met ({})",
                    side.name
                );
            }
            continue;
        };
        let added = (through.as_secs_f64() - base.as_secs_f64()) * 1e3;
        let ratio = through.as_secs_f64() / base.as_secs_f64();
        let per_round: Vec<f64> = t
            .round_p50
            .iter()
            .zip(&mock.round_p50)
            .filter_map(|(a, b)| {
                Some((a.as_ref()?.as_secs_f64() - b.as_ref()?.as_secs_f64()) * 1e3)
            })
            .collect();
        let low = per_round.iter().copied().fold(f64::INFINITY, f64::min);
        let high = per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!(
            "{}: added p50 {added:.3} ms, ratio {ratio:.2} (p50 through tollgate / p50 of the \
             mock alone), per round {low:.3} to {high:.3} ms; {} observations ({} of the mock)",
            side.name,
            t.successes(),
            mock.successes()
        );
        if against_target {
            let verdict = if added <= TARGET_ADDED_P50_MS {
                "met"
            } else {
                "not met"
            };
            println!(
                "target: added p50 <= {TARGET_ADDED_P50_MS:.1} ms: {verdict} ({})",
                side.name
            );
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
            .await
            .unwrap();
        let mock_side = Side {
            name: "mock alone",
            url: format!("{}/v1/chat/completions", mock.base_url()),
            model: MOCK_MODEL,
            key: None,
        };
        let memory = tollgate(
            "tollgate, memory",
            Backend::memory(),
            &mock.base_url(),
            None,
        )
        .await;
        let pg = match postgres(&mock.base_url()).await {
            Ok(pg) => Some(pg),
            Err(e) => {
                println!("postgres skipped (unreachable: {e})");
                None
            }
        };
        let mut sides: Vec<&Side> = vec![&mock_side, &memory.side];
        if let Some(pg) = &pg {
            sides.push(&pg.side);
        }
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .build()
            .unwrap();
        for side in &sides {
            for i in 0..WARMUP {
                if let Err(e) = one(&http, side, &format!("warmup-{i}")).await {
                    panic!("{}: a warm-up request failed: {e}", side.name);
                }
            }
        }
        let c1 = rounds(&http, &sides, "c1", ROUNDS, CALLS_PER_ROUND, 1).await;
        let c8 = rounds(
            &http,
            &sides,
            "c8",
            C8_ROUNDS,
            C8_CALLS_PER_ROUND,
            C8_CONCURRENCY,
        )
        .await;
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        println!(
            "TTFT: from sending a streamed chat completion to its first content delta \
             ({MOCK_MODEL}, a {}-character prompt echoed in 16-character deltas), over loopback, \
             {cores} cores",
            PROMPT.chars().count()
        );
        println!(
            "c1: {ROUNDS} alternating rounds of {CALLS_PER_ROUND} requests per side, one at a time"
        );
        report(&sides, &c1, true);
        println!(
            "c{C8_CONCURRENCY} (information): {C8_ROUNDS} alternating rounds of \
             {C8_CALLS_PER_ROUND} requests per side, {C8_CONCURRENCY} at a time"
        );
        report(&sides, &c8, false);
        println!("mock requests: {}", mock.request_count());
        for t in std::iter::once(memory).chain(pg) {
            t.shutdown.cancel();
            t.task.await.unwrap().unwrap();
        }
        mock.shutdown().await;
    });
    // The runtime's tasks hold the last pools: once they are gone, the test kit's dropper
    // thread drops the database (it looks every 250 ms).
    drop(rt);
    std::thread::sleep(Duration::from_millis(600));
}
