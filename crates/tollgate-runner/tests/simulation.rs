//! Deterministic simulation of the runners, recovery and the scheduler (spec/journal.md,
//! "Deterministic simulation"; the simulator itself is documented in `sim/mod.rs`).
//!
//! `cargo test` runs a bounded seed range. Longer runs and reproductions take environment
//! variables: `TOLLGATE_SIM_SEEDS=a..b` (a seed range), `TOLLGATE_SIM_SEED=n` (one seed),
//! `TOLLGATE_SIM_STEPS=n` (steps per seed), `TOLLGATE_SIM_TRACE=1` (print the trace of a failing
//! or single seed). A failure names the first failing seed and the command that reproduces it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Built against the store mutation, only the tests that expect it to be caught run.
#![cfg_attr(feature = "mutation-skip-settle-fence", allow(dead_code))]

mod sim;

use sim::{run_seed, Mutation, SeedReport};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Seeds `cargo test` runs.
const CI_SEEDS: u64 = 200;
/// Steps per seed in `cargo test`.
const CI_STEPS: u64 = 300;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The seeds and steps asked for by the environment, or the CI defaults.
fn plan() -> (Range<u64>, u64) {
    let steps = env_u64("TOLLGATE_SIM_STEPS").unwrap_or(CI_STEPS);
    if let Some(seed) = env_u64("TOLLGATE_SIM_SEED") {
        return (seed..seed + 1, steps);
    }
    let range = std::env::var("TOLLGATE_SIM_SEEDS").ok().and_then(|v| {
        let (a, b) = v.trim().split_once("..")?;
        Some(a.parse().ok()?..b.parse().ok()?)
    });
    (range.unwrap_or(0..CI_SEEDS), steps)
}

fn reproduce(seed: u64, steps: u64) -> String {
    format!(
        "TOLLGATE_SIM_SEED={seed} TOLLGATE_SIM_STEPS={steps} TOLLGATE_SIM_TRACE=1 \
         cargo test -p tollgate-runner --test simulation -- --nocapture"
    )
}

fn print_trace(report: &SeedReport) {
    for line in &report.trace {
        eprintln!("  {line}");
    }
}

/// Totals of a sweep: seeds, steps, attempts, sends, commits, deaths and clock jumps.
type Totals = [u64; 6];

fn add_totals(totals: &Mutex<Totals>, report: &SeedReport) {
    let s = report.stats;
    let counts = [
        1,
        s.steps,
        s.attempts,
        report.sends,
        report.commits,
        s.kills + s.jumps,
    ];
    let mut totals = totals.lock().unwrap();
    for (t, n) in totals.iter_mut().zip(counts) {
        *t += n;
    }
}

/// Runs `seeds` on up to two threads (one runtime per seed, so each seed's run is the same
/// whatever the thread); returns the first failing seed's report, if any, and the totals. Seeds
/// are taken in order and no seed above a failing one is started, so the report is the lowest
/// failing seed's.
fn sweep(seeds: Range<u64>, steps: u64, mutation: Mutation) -> (Option<SeedReport>, Totals) {
    let trace = std::env::var("TOLLGATE_SIM_TRACE").is_ok();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = if trace { 1 } else { cores.min(2) };
    let next = AtomicU64::new(seeds.start);
    let failing = AtomicU64::new(u64::MAX);
    let failed = Mutex::new(Vec::<SeedReport>::new());
    let totals = Mutex::new([0u64; 6]);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= seeds.end || seed > failing.load(Ordering::SeqCst) {
                    return;
                }
                let report = run_seed(seed, steps, mutation, trace);
                add_totals(&totals, &report);
                if report.violations.is_empty() {
                    if trace {
                        print_trace(&report);
                    }
                    continue;
                }
                failing.fetch_min(seed, Ordering::SeqCst);
                failed.lock().unwrap().push(report);
            });
        }
    });
    let first = failed
        .into_inner()
        .unwrap()
        .into_iter()
        .min_by_key(|r| r.seed);
    (first, totals.into_inner().unwrap())
}

/// SC-12, SC-13, SC-14, SC-16, SC-17, SC-40, SC-41, SC-42, SC-52, SC-60, SC-61, ST-6, ST-7,
/// ST-30, H-3, H-4: every invariant holds on every seed of the plan.
#[cfg(not(feature = "mutation-skip-settle-fence"))]
#[test]
fn sc_13_sc_17_sc_40_st_30_h_3_h_4_simulated_seeds_keep_every_invariant() {
    let (seeds, steps) = plan();
    let started = Instant::now();
    let (failed, t) = sweep(seeds.clone(), steps, Mutation::None);
    eprintln!(
        "simulation: seeds {seeds:?} × {steps} steps: {} seeds, {} steps, {} call attempts, \
         {} sends, {} store commits, {} deaths and clock jumps, in {:.1?}",
        t[0],
        t[1],
        t[2],
        t[3],
        t[4],
        t[5],
        started.elapsed()
    );
    if let Some(report) = failed {
        print_trace(&report);
        panic!(
            "seed {} broke {} invariant(s) after {} steps; the first: {}\nreproduce: {}",
            report.seed,
            report.violations.len(),
            report.stats.steps,
            report.violations[0],
            reproduce(report.seed, steps)
        );
    }
}

/// One seed, run twice, makes the same trace: every event, commit and answer in the same order
/// at the same simulated instant.
#[cfg(not(feature = "mutation-skip-settle-fence"))]
#[test]
fn a_seed_replays_to_the_same_trace() {
    for seed in [3, 1_000_003] {
        let first = run_seed(seed, CI_STEPS, Mutation::None, true);
        let second = run_seed(seed, CI_STEPS, Mutation::None, true);
        let diverged = first
            .trace
            .iter()
            .zip(&second.trace)
            .position(|(a, b)| a != b);
        if let Some(i) = diverged {
            panic!(
                "seed {seed} diverged at trace line {i}:\n  {}\n  {}",
                first.trace[i], second.trace[i]
            );
        }
        assert_eq!(
            first.trace_len, second.trace_len,
            "seed {seed}: trace lengths"
        );
        assert_eq!(first.digest, second.digest, "seed {seed}: trace digests");
        assert!(
            first.trace_len > 500,
            "seed {seed}: a trace of {}",
            first.trace_len
        );
        eprintln!(
            "seed {seed}: {} trace lines, digest {:016x}, twice",
            first.trace_len, first.digest
        );
    }
}

/// Runs the CI seeds against a mutation until one seed catches it.
fn caught(mutation: Mutation, name: &str) -> SeedReport {
    let started = Instant::now();
    let (failed, t) = sweep(0..CI_SEEDS, CI_STEPS, mutation);
    let Some(report) = failed else {
        panic!("{name} survived {} seeds of {CI_STEPS} steps", t[0]);
    };
    eprintln!(
        "{name} caught by seed {} at step {} after {} seeds, in {:.1?}: {}",
        report.seed,
        report.stats.steps,
        t[0],
        started.elapsed(),
        report.violations[0]
    );
    report
}

/// H-3: with the test wrapper that settles with the row's current fence token (so a stale writer
/// settles an execution recovery already handed to an operator), the simulator finds the
/// violation within the CI seeds.
#[test]
fn h_3_simulator_catches_a_settle_that_ignores_the_fence() {
    let report = caught(
        Mutation::SkipSettleFence,
        "the test wrapper's settle without fence",
    );
    assert!(report.violations.iter().any(|v| v.contains("H-3")));
}

/// H-3: built with `--features mutation-skip-settle-fence` (the one true store is then the test
/// kit's in-memory stores whose settle ignores the writer's stale fence token), the simulator
/// finds the violation within the CI seeds.
#[cfg(feature = "mutation-skip-settle-fence")]
#[test]
fn h_3_simulator_catches_the_store_mutation() {
    let report = caught(Mutation::None, "mutation-skip-settle-fence");
    assert!(report.violations.iter().any(|v| v.contains("H-3")));
}
