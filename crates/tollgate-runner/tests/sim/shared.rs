//! What every simulated process, the provider and the driver share: the one true store (the
//! in-memory stores every process writes through its own wrappers), the clock, the trace, the
//! violations found, and the model the oracle keeps of what the stores committed.

use super::clock::SimClock;
use super::rng::{fnv1a, Rng};
use chrono::NaiveDate;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tollgate_core::ids::{EvidenceId, ExecutionId, RootKey, Scope};
use tollgate_core::money::Money;

/// The one true store: the in-memory stores, or, built with `--features
/// mutation-skip-settle-fence`, the test kit's in-memory stores whose `settle` accepts a stale
/// fence (`tollgate_testkit::mutation`).
#[cfg(not(feature = "mutation-skip-settle-fence"))]
pub type Truth = tollgate_store::MemoryStores;
/// The one true store: the in-memory stores, or, built with `--features
/// mutation-skip-settle-fence`, the test kit's in-memory stores whose `settle` accepts a stale
/// fence (`tollgate_testkit::mutation`).
#[cfg(feature = "mutation-skip-settle-fence")]
pub type Truth = tollgate_testkit::mutation::SkipSettleFence;

/// Which deliberate defect, if any, the run carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// None: the product as it is.
    None,
    /// The test's store wrapper settles with the row's current fence token instead of the
    /// writer's, which removes the stale-fence guard of `settle` (H-3) from the composed store.
    SkipSettleFence,
}

/// A spend row with a block cap: a consumer's session, a consumer's day, or a root.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Row {
    /// `(scope, consumer, session)`.
    Session(String, String, String),
    /// `(scope, consumer, accounting day)`.
    Daily(String, String, NaiveDate),
    /// `(scope, root key)`.
    Root(String, String),
}

/// What the oracle knows of an execution from the writes it saw commit.
#[derive(Debug, Clone)]
pub struct Known {
    /// Scope.
    pub scope: Scope,
    /// Operation key (for the trace).
    pub key: String,
    /// The fence token last issued (claim or `take_fence`).
    pub token: i64,
    /// The worst case held at claim.
    pub hold: Money,
    /// Its spend rows.
    pub rows: Vec<Row>,
    /// Settlements seen committing.
    pub settlements: u32,
    /// Commit number of each `take_fence`, by token.
    pub fences: BTreeMap<i64, u64>,
    /// `(token, commit number)` of the move to `reconciliation_required`.
    pub reconciled: Option<(i64, u64)>,
}

/// The oracle's model.
#[derive(Debug, Default)]
pub struct Model {
    /// Executions by id.
    pub executions: BTreeMap<ExecutionId, Known>,
    /// Cost settled above the worst case held, per row (a post-call block is possible only then).
    pub excess: BTreeMap<Row, Money>,
    /// Commit number of each evidence row.
    pub evidence: BTreeMap<EvidenceId, u64>,
    /// Committed writes so far.
    pub commits: u64,
    /// Input loads per `(scope, journal key)`.
    pub loads: BTreeMap<(String, String), u32>,
    /// Rows seen.
    pub rows: BTreeSet<Row>,
}

#[derive(Default)]
struct Log {
    trace: Vec<String>,
    violations: Vec<String>,
    step: u64,
}

/// Shared by everything in one simulated run.
pub struct Shared {
    /// The stores every process writes to (through its own wrappers).
    pub truth: Arc<Truth>,
    /// The wall clock.
    pub clock: Arc<SimClock>,
    /// The deliberate defect of this run.
    pub mutation: Mutation,
    log: Mutex<Log>,
    model: Mutex<Model>,
    latency: Mutex<Rng>,
    calm: AtomicBool,
    blips: Mutex<BTreeMap<ExecutionId, Blip>>,
}

/// How long after a blip its drive's retries may still be running (their pauses double from
/// 50 ms to 1 s; a few attempts meet other faults of the run).
pub const BLIP_RETRY_MS: u128 = 3_000;

/// A call's own first settlement that failed once, the store briefly unavailable (SC-202).
#[derive(Debug, Clone)]
pub struct Blip {
    /// The process whose drive it was.
    pub proc: String,
    /// The fence the drive held.
    pub token: tollgate_core::ids::FenceToken,
    /// When (simulated milliseconds).
    pub at_ms: u128,
    /// Why the drive may not have kept the output after all: its process was killed, or a
    /// fault that lasts was armed on a settlement, evidence or read of its process.
    pub excused: Option<&'static str>,
}

impl Shared {
    /// A fresh world.
    pub fn new(clock: Arc<SimClock>, mutation: Mutation, latency: Rng) -> Self {
        Self {
            truth: Arc::new(Truth::new()),
            clock,
            mutation,
            log: Mutex::new(Log::default()),
            model: Mutex::new(Model::default()),
            latency: Mutex::new(latency),
            calm: AtomicBool::new(false),
            blips: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether the first settlement a call's own drive sends fails once (1 in 6), as when the
    /// store is briefly unavailable; recorded, since the drive must then keep the output by
    /// retrying (SC-202). Never in the final phase.
    pub fn settle_blip(&self, fence: tollgate_store::Fence, proc: &str) -> bool {
        if self.calm.load(Ordering::SeqCst) {
            return false;
        }
        let mut blips = self.blips.lock().unwrap_or_else(|e| e.into_inner());
        if blips.contains_key(&fence.execution_id) {
            return false;
        }
        let blip = self
            .latency
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .below(6)
            == 0;
        // Judged only while the drive still holds the fence: a writer that lost it before it
        // settled has nothing to keep.
        let holds = self
            .model()
            .executions
            .get(&fence.execution_id)
            .is_some_and(|k| k.token == fence.token.0);
        if blip && holds {
            blips.insert(
                fence.execution_id,
                Blip {
                    proc: proc.to_string(),
                    token: fence.token,
                    at_ms: self.clock.elapsed_ms(),
                    excused: None,
                },
            );
        }
        blip
    }

    /// Excuses with `why` every blip of `proc` whose call is not settled yet (its drive may still
    /// be retrying).
    pub fn excuse_blips(&self, proc: &str, why: &'static str) {
        let mut blips = self.blips.lock().unwrap_or_else(|e| e.into_inner());
        let model = self.model();
        for (id, blip) in blips.iter_mut().filter(|(_, b)| b.proc == proc) {
            let settled = model.executions.get(id).is_some_and(|k| k.settlements > 0);
            if !settled {
                blip.excused.get_or_insert(why);
            }
        }
    }

    /// A fence of `id` taken by another writer: it excuses the blip of a call not settled yet
    /// when it comes within [`BLIP_RETRY_MS`] of it (the lease lapsed, a clock jump, while the
    /// drive retried); later, the drive should have settled long before.
    pub fn fence_taken(&self, id: ExecutionId) {
        let mut blips = self.blips.lock().unwrap_or_else(|e| e.into_inner());
        let settled = self
            .model()
            .executions
            .get(&id)
            .is_some_and(|k| k.settlements > 0);
        let now = self.clock.elapsed_ms();
        if let Some(blip) = blips.get_mut(&id) {
            if !settled && now.saturating_sub(blip.at_ms) <= BLIP_RETRY_MS {
                blip.excused
                    .get_or_insert("its fence was taken while it retried");
            }
        }
    }

    /// Every blip so far.
    pub fn blips(&self) -> BTreeMap<ExecutionId, Blip> {
        self.blips.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The model, locked. Never held across an await.
    pub fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on no connection drops (the final phase).
    pub fn calm_down(&self) {
        self.calm.store(true, Ordering::SeqCst);
    }

    /// Sets the driver's step number (for messages).
    pub fn set_step(&self, step: u64) {
        self.log().step = step;
    }

    /// Appends a trace line stamped with simulated time.
    pub fn trace(&self, line: impl AsRef<str>) {
        let ms = self.clock.elapsed_ms();
        self.log().trace.push(format!("{ms} {}", line.as_ref()));
    }

    /// Records a broken invariant.
    pub fn violation(&self, what: impl AsRef<str>) {
        let ms = self.clock.elapsed_ms();
        let mut log = self.log();
        let line = format!("step {} at {ms} ms: {}", log.step, what.as_ref());
        log.trace.push(format!("VIOLATION {line}"));
        log.violations.push(line);
    }

    /// Whether an invariant broke.
    pub fn has_violation(&self) -> bool {
        !self.log().violations.is_empty()
    }

    /// Violations so far.
    pub fn violations(&self) -> Vec<String> {
        self.log().violations.clone()
    }

    /// The trace so far and its digest.
    pub fn trace_digest(&self) -> (usize, u64) {
        let log = self.log();
        (log.trace.len(), fnv1a(&log.trace))
    }

    /// The whole trace.
    pub fn trace_lines(&self) -> Vec<String> {
        self.log().trace.clone()
    }

    /// Latency of one store round trip, on the 10 ms grid: mostly none or a few ms, rarely a
    /// stall of seconds (a slow store that can outlive a lease).
    pub fn store_latency_ms(&self) -> u64 {
        let mut rng = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        match rng.below(1000) {
            0..=599 => 0,
            600..=989 => rng.grid_ms(10, 30),
            990..=994 => 1_500,
            _ => 2_600,
        }
    }

    /// Latency of a store's acknowledgement after its commit: none or a few ms (a process that
    /// dies in it loses the acknowledgement of a committed write).
    pub fn ack_latency_ms(&self) -> u64 {
        let mut rng = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        if rng.chance(80) {
            0
        } else {
            rng.grid_ms(10, 30)
        }
    }

    /// Whether a live connection drops right after a round trip (1 in 300): a committed write
    /// reports a failure, as after a COMMIT whose answer never arrived.
    pub fn lost_ack(&self) -> bool {
        if self.calm.load(Ordering::SeqCst) {
            return false;
        }
        let mut rng = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        rng.below(300) == 0
    }

    /// Counts an input load of `(scope, journal key)`; returns how many there were.
    pub fn count_load(&self, scope: &str, key: &str) -> u32 {
        let mut model = self.model();
        let n = model
            .loads
            .entry((scope.to_string(), key.to_string()))
            .or_default();
        *n += 1;
        *n
    }
}

/// The spend rows of a root.
pub fn root_row(scope: &Scope, root: &RootKey) -> Row {
    Row::Root(scope.to_string(), root.to_string())
}
