//! Micro-benchmarks of the governed call path on the in-memory stores with a scripted provider:
//! a first call (claim, hold, dispatch mark, collect, evidence, settle, read back) against a
//! replay of the same key (one read), and the step collector on a long stream. Prints the
//! replay/first-call ratio measured in this run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use criterion::{criterion_group, criterion_main, Criterion};
use futures::FutureExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tollgate_core::collector::{Collector, CollectorLimits};
use tollgate_core::event::ProviderEvent;
use tollgate_core::ids::*;
use tollgate_core::message::{Message, Role};
use tollgate_core::usage::Usage;
use tollgate_provider::scripted::{ScriptedClient, ScriptedReply};
use tollgate_runner::{RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::MemoryStores;
use tollgate_testkit::conformance::text_config;

fn request(key: &str) -> RunRequest {
    RunRequest {
        scope: Scope::parse("bench").unwrap(),
        session_id: SessionId::parse("s").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        input_revision: InputRevision::parse("r").unwrap(),
        intent: Intent::parse("bench").unwrap(),
        load_input: async { Ok(vec![Message::text(Role::User, "hello")]) }.boxed(),
        cancel: CancellationToken::new(),
        limits: Vec::new(),
    }
}

fn reply() -> ScriptedReply {
    ScriptedReply::text(
        "hi",
        Usage {
            input: 10,
            output: 5,
            ..Usage::ZERO
        },
    )
}

fn time_per_iter(
    rt: &tokio::runtime::Runtime,
    runner: &SingleCallRunner,
    keys: impl Fn(u64) -> String,
    n: u64,
) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        rt.block_on(runner.run(request(&keys(i)))).unwrap();
    }
    start.elapsed() / u32::try_from(n).unwrap()
}

fn single_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = Arc::new(ScriptedClient::new(Vec::new()));
    let runner = SingleCallRunner::new(
        Arc::new(MemoryStores::new()),
        client.clone(),
        RunnerSettings::new(text_config()),
    )
    .unwrap();
    let counter = AtomicU64::new(0);
    let mut group = c.benchmark_group("single_call_memory");
    group.bench_function("first_call", |b| {
        b.iter(|| {
            client.push(reply());
            let i = counter.fetch_add(1, Ordering::Relaxed);
            rt.block_on(runner.run(request(&format!("k{i}")))).unwrap()
        })
    });
    client.push(reply());
    rt.block_on(runner.run(request("replayed"))).unwrap();
    group.bench_function("replay", |b| {
        b.iter(|| rt.block_on(runner.run(request("replayed"))).unwrap())
    });
    group.finish();
    // One paired measurement in this run, for the ratio.
    let n = 500;
    for _ in 0..n {
        client.push(reply());
    }
    let first = time_per_iter(&rt, &runner, |i| format!("ratio-{i}"), n);
    let replay = time_per_iter(&rt, &runner, |_| "replayed".into(), n);
    println!(
        "single_call_memory: first call {first:?}, replay {replay:?}, replay/first = {:.3}",
        replay.as_secs_f64() / first.as_secs_f64()
    );
}

fn collector(c: &mut Criterion) {
    let events: Vec<ProviderEvent> = (0..10_000)
        .map(|i| ProviderEvent::TextDelta {
            text: format!("tok{i} "),
        })
        .collect();
    let limits = CollectorLimits {
        max_output_chars: 10_000_000,
        max_reasoning_chars: 1_000_000,
        max_consecutive_reasoning: Some(100),
    };
    c.bench_function("collector_10k_text_deltas", |b| {
        b.iter(|| {
            let mut collector = Collector::new(limits).unwrap();
            for e in &events {
                collector.push(e.clone());
            }
            collector.finish()
        })
    });
}

criterion_group!(benches, single_call, collector);
criterion_main!(benches);
