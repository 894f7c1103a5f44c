//! A deterministic simulation of the runners, recovery and the scheduler, in the spirit of
//! TigerBeetle's VOPR and FoundationDB's simulator (spec/journal.md, "Deterministic simulation").
//!
//! One `u64` seed drives a whole run: a tokio current-thread runtime with paused time, the
//! in-memory stores behind one fault wrapper and one gate per simulated process, a scripted
//! provider, concurrent calls of every kind over two scopes and two consumers with small block
//! caps, replays and conflicts, scheduler processes, process deaths, dropped callers, store faults
//! and clock jumps. The oracle checks every commit, the driver samples the caps after every step
//! and the ledger every 25 steps, and a final phase recovers everything and checks the end state.
//!
//! - `rng`: the seeded generator and the trace digest.
//! - `clock`: the wall clock, in step with paused tokio time.
//! - `universe`: scopes, consumers, caps and the snapshots of each kind of call.
//! - `shared`: what everything shares: the true store, the trace, the oracle's model.
//! - `stores`: the per-process store wrapper (latency, gate, oracle hooks, the test mutation).
//! - `oracle`: the checks made at each commit.
//! - `process`: processes and the model of their death.
//! - `provider`: the scripted provider and the checks made at each send.
//! - `calls`: calls, their attempts, loaders and expected answers.
//! - `driver`, `ops`: the step loop, its actions and the final phase.
//! - `checks`: ledger and final checks.

pub mod calls;
pub mod checks;
pub mod clock;
pub mod driver;
pub mod ops;
pub mod oracle;
pub mod process;
pub mod provider;
pub mod rng;
pub mod shared;
pub mod stores;
pub mod universe;

use chrono::{DateTime, Utc};
use std::sync::Arc;

pub use driver::Stats;
pub use shared::Mutation;

/// What one seed's run did.
#[derive(Debug, Clone)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Counts.
    pub stats: Stats,
    /// Sends the provider took.
    pub sends: u64,
    /// Store writes committed.
    pub commits: u64,
    /// Trace lines.
    pub trace_len: usize,
    /// Digest of the trace.
    pub digest: u64,
    /// Broken invariants (empty when the run passed).
    pub violations: Vec<String>,
    /// The trace, when asked for.
    pub trace: Vec<String>,
}

/// The simulated wall clock's start: a weekday morning, so a day jump changes the accounting day.
fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

/// Runs `seed` for `steps` steps (then the final phase) on its own paused runtime.
pub fn run_seed(seed: u64, steps: u64, mutation: Mutation, keep_trace: bool) -> SeedReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(simulate(seed, steps, mutation, keep_trace))
}

async fn simulate(seed: u64, steps: u64, mutation: Mutation, keep_trace: bool) -> SeedReport {
    let mut rng = rng::Rng::new(seed);
    let clock = Arc::new(clock::SimClock::new(t0()));
    let shared = Arc::new(shared::Shared::new(clock, mutation, rng.fork()));
    let provider = Arc::new(provider::SimProvider::new(shared.clone()));
    let mut driver = driver::Driver::new(shared.clone(), provider.clone(), rng);
    driver.run(steps).await;
    if !shared.has_violation() {
        driver.finish().await;
    }
    let (trace_len, digest) = shared.trace_digest();
    let commits = shared.model().commits;
    SeedReport {
        seed,
        stats: driver.stats(),
        sends: provider.sends().values().map(|n| u64::from(*n)).sum(),
        commits,
        trace_len,
        digest,
        violations: shared.violations(),
        trace: if keep_trace {
            shared.trace_lines()
        } else {
            Vec::new()
        },
    }
}
