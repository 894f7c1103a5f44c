//! End-to-end load harness: governed calls through the single-call runner over real HTTP to the
//! mock provider, on the in-memory stores and on Postgres, measured in one run.
//!
//! Paired evaluation (H-7): rounds alternate which backend goes first, failures stay in the
//! denominators, and a p95 is quoted only with at least 20 successful observations.
//! `cargo bench -p tollgate-runner --bench load` (Postgres from `TOLLGATE_TEST_DATABASE_URL`, or
//! `postgres://postgres@127.0.0.1:5432/postgres`; skipped when unreachable).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::panic,
    missing_docs
)]

use futures::FutureExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::*;
use tollgate_core::message::{Message, Role};
use tollgate_mock_provider::MockProvider;
use tollgate_provider::http::{HttpClient, HttpClientConfig};
use tollgate_provider::Protocol;
use tollgate_runner::{RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::{MemoryStores, Stores};
use tollgate_testkit::conformance::text_config;

/// Calls per round and backend.
const CALLS_PER_ROUND: usize = 200;
/// Calls in flight at once.
const CONCURRENCY: usize = 16;
/// Rounds (backends alternate which goes first).
const ROUNDS: usize = 4;
/// Observations needed before a p95 is quoted.
const P95_OBSERVATIONS_MIN: usize = 20;

struct Round {
    latencies: Vec<Duration>,
    failures: usize,
    wall: Duration,
}

async fn round(runner: Arc<SingleCallRunner>, tag: &str) -> Round {
    let started = Instant::now();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::new();
    for i in 0..CALLS_PER_ROUND {
        let runner = runner.clone();
        let permit = semaphore.clone().acquire_owned().await.unwrap();
        let key = format!("{tag}-{i}");
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let request = RunRequest {
                scope: Scope::parse("load").unwrap(),
                session_id: SessionId::parse(format!("s{}", i % 10)).unwrap(),
                operation_key: OperationKey::parse(key).unwrap(),
                input_revision: InputRevision::parse("r").unwrap(),
                intent: Intent::parse("load").unwrap(),
                load_input: async { Ok(vec![Message::text(Role::User, "summarize order 123")]) }
                    .boxed(),
                cancel: CancellationToken::new(),
                limits: Vec::new(),
            };
            let t = Instant::now();
            let ok = runner.run(request).await.is_ok();
            (t.elapsed(), ok)
        }));
    }
    let mut out = Round {
        latencies: Vec::new(),
        failures: 0,
        wall: Duration::ZERO,
    };
    for t in tasks {
        match t.await {
            Ok((latency, true)) => out.latencies.push(latency),
            _ => out.failures += 1,
        }
    }
    out.wall = started.elapsed();
    out
}

fn report(name: &str, rounds: &[Round]) -> f64 {
    let mut all: Vec<Duration> = rounds.iter().flat_map(|r| r.latencies.clone()).collect();
    all.sort();
    let failures: usize = rounds.iter().map(|r| r.failures).sum();
    let attempted = rounds.len() * CALLS_PER_ROUND;
    let wall: Duration = rounds.iter().map(|r| r.wall).sum();
    let per_sec = (attempted - failures) as f64 / wall.as_secs_f64();
    let pct = |p: usize| all.get(all.len() * p / 100).copied();
    let p95 = if all.len() >= P95_OBSERVATIONS_MIN {
        format!("{:?}", pct(95).unwrap_or_default())
    } else {
        "n/a (< 20 observations)".into()
    };
    println!(
        "{name:<9} {per_sec:>8.0} calls/s  p50 {:?}  p95 {p95}  failures {failures}/{attempted}",
        pct(50).unwrap_or_default()
    );
    per_sec
}

async fn postgres() -> Option<Arc<dyn Stores>> {
    let admin = std::env::var("TOLLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let stores = tollgate_testkit::pg::fresh_test_database(&admin)
        .await
        .ok()?;
    Some(Arc::new(stores))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mock = MockProvider::start(([127, 0, 0, 1], 0).into()).await.unwrap();
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
        let runner = |stores: Arc<dyn Stores>| {
            Arc::new(SingleCallRunner::new(stores, client.clone(), RunnerSettings::new(text_config())).unwrap())
        };
        let memory = runner(Arc::new(MemoryStores::new()));
        let pg = postgres().await.map(runner);
        let (mut mem_rounds, mut pg_rounds) = (Vec::new(), Vec::new());
        for r in 0..ROUNDS {
            let memory_first = r % 2 == 0;
            if memory_first {
                mem_rounds.push(round(memory.clone(), &format!("m{r}")).await);
            }
            if let Some(pg) = &pg {
                pg_rounds.push(round(pg.clone(), &format!("p{r}")).await);
            }
            if !memory_first {
                mem_rounds.push(round(memory.clone(), &format!("m{r}")).await);
            }
        }
        println!("end-to-end over HTTP to the mock, {CONCURRENCY} in flight, {ROUNDS} alternating rounds of {CALLS_PER_ROUND}:");
        let m = report("memory", &mem_rounds);
        if pg.is_some() {
            let p = report("postgres", &pg_rounds);
            println!("postgres/memory throughput ratio = {:.3}", p / m);
        } else {
            println!("postgres   skipped (unreachable)");
        }
        println!("mock requests: {}", mock.request_count());
        mock.shutdown().await;
    });
}
