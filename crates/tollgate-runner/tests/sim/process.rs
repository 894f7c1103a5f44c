//! Simulated processes and how they die.
//!
//! A process is a gate, the stores and provider client it reaches through that gate, its runners
//! and reconciler, and a `JoinSet` holding the tasks it started. The runners spawn each call's
//! drive as a task of its own, outside that set, so aborting the set cannot stop a drive that is
//! already reading a stream. Death is therefore two things at one instant: the gate closes —
//! every later store call and every later send of the process fails without reaching the store or
//! the provider, and a write that committed just before loses its acknowledgement — and the
//! process's `JoinSet` is aborted, dropping each of its tasks at whatever await it was parked on.
//! The orphaned drives run on, but nothing they do reaches the world: a dead process is
//! indistinguishable, from the stores and the provider, from one whose machine stopped. A
//! provider that already took a request keeps it (the send was counted). A restart is a new
//! process with a new gate.

use super::provider::SimProvider;
use super::shared::Shared;
use super::universe::{config, Kind, CONSUMERS};
use async_trait::async_trait;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tollgate_provider::{
    ClientDescriptor, EventStream, ProviderClient, ProviderRequest, SendError,
};
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::step::GovernedStepRunner;
use tollgate_runner::structured::StructuredCallRunner;
use tollgate_runner::{RunnerSettings, SingleCallRunner};
use tollgate_store::fault::{FaultPoint, FaultyStores};
use tollgate_store::AllStores;

/// Every fault point of the fault wrapper.
pub const FAULT_POINTS: [FaultPoint; 10] = [
    FaultPoint::Claim,
    FaultPoint::MarkDispatched,
    FaultPoint::MarkNotDispatched,
    FaultPoint::MarkReconciliation,
    FaultPoint::Settle,
    FaultPoint::SettleAfterCommit,
    FaultPoint::RecordEvidence,
    FaultPoint::Read,
    FaultPoint::CloseRoot,
    FaultPoint::HideRootReceipt,
];

/// Whether a process is alive.
pub struct Gate {
    /// For messages and the trace.
    pub name: String,
    alive: AtomicBool,
}

impl Gate {
    /// Alive?
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

/// The provider as one process reaches it.
struct GatedClient {
    gate: Arc<Gate>,
    provider: Arc<SimProvider>,
}

#[async_trait]
impl ProviderClient for GatedClient {
    fn descriptor(&self) -> ClientDescriptor {
        self.provider.descriptor()
    }
    fn check(&self, request: &ProviderRequest) -> Result<(), SendError> {
        self.provider.check(request)
    }
    async fn send(
        &self,
        request: ProviderRequest,
        cancel: CancellationToken,
    ) -> Result<EventStream, SendError> {
        if !self.gate.alive() {
            return Err(SendError::Connect(format!("{} is dead", self.gate.name)));
        }
        self.provider.send(request, cancel).await
    }
}

/// One process's runners, per consumer.
pub struct Runners {
    /// Text runners.
    pub text: Vec<SingleCallRunner>,
    /// JSON runners.
    pub json: Vec<SingleCallRunner>,
    /// Structured runners.
    pub structured: Vec<StructuredCallRunner>,
    /// Step runners.
    pub steps: Vec<GovernedStepRunner>,
    /// Recovery and reconciliation.
    pub reconciler: Reconciler,
}

/// A simulated process.
pub struct Proc {
    /// Its gate.
    pub gate: Arc<Gate>,
    /// Scheduler (recovery, reconciliation, operators) or application (calls).
    pub scheduler: bool,
    /// Its fault wrapper.
    pub faults: Arc<FaultyStores>,
    /// Indexes into [`FAULT_POINTS`] armed now.
    pub armed: Vec<usize>,
    /// Its runners.
    pub runners: Arc<Runners>,
    /// Its tasks.
    pub tasks: JoinSet<()>,
}

fn settings(shared: &Arc<Shared>, gate: &Arc<Gate>, kind: Kind, consumer: usize) -> RunnerSettings {
    let mut s = RunnerSettings::new(config(kind, consumer));
    s.clock = shared.clock.clone();
    s.lease_ms = 1_000;
    let (trace, name) = (shared.clone(), gate.name.clone());
    s.background_error = Some(Arc::new(move |f| {
        trace.trace(format!("{name} background {} {}", f.stage, f.operation_key));
    }));
    s
}

impl Proc {
    /// Starts a process named `name`.
    pub fn start(
        shared: &Arc<Shared>,
        provider: &Arc<SimProvider>,
        name: String,
        scheduler: bool,
    ) -> Self {
        let gate = Arc::new(Gate {
            name,
            alive: AtomicBool::new(true),
        });
        let sim = Arc::new(super::stores::SimStores::new(shared.clone(), gate.clone()));
        let faults = Arc::new(FaultyStores::with_roots(sim));
        let stores: Arc<dyn AllStores> = faults.clone();
        let client: Arc<dyn ProviderClient> = Arc::new(GatedClient {
            gate: gate.clone(),
            provider: provider.clone(),
        });
        let consumers = 0..CONSUMERS.len();
        let single = |kind| {
            consumers
                .clone()
                .map(|c| {
                    let s = settings(shared, &gate, kind, c);
                    SingleCallRunner::new(stores.clone(), client.clone(), s).unwrap()
                })
                .collect()
        };
        let runners = Runners {
            text: single(Kind::Text),
            json: single(Kind::Json),
            structured: consumers
                .clone()
                .map(|c| {
                    let s = settings(shared, &gate, Kind::Structured, c);
                    StructuredCallRunner::new(stores.clone(), client.clone(), s).unwrap()
                })
                .collect(),
            steps: consumers
                .map(|c| {
                    let s = settings(shared, &gate, Kind::Step, c);
                    GovernedStepRunner::new(stores.clone(), client.clone(), s).unwrap()
                })
                .collect(),
            reconciler: Reconciler::with_roots(stores, shared.clock.clone()),
        };
        shared.trace(format!("start {}", gate.name));
        Self {
            gate,
            scheduler,
            faults,
            armed: Vec::new(),
            runners: Arc::new(runners),
            tasks: JoinSet::new(),
        }
    }

    /// Kills the process: the gate closes, then its tasks are dropped where they wait.
    pub fn kill(&mut self, shared: &Shared) {
        self.gate.alive.store(false, Ordering::SeqCst);
        self.tasks.abort_all();
        shared.trace(format!("kill {}", self.gate.name));
    }

    /// Arms fault point `i`.
    pub fn arm(&mut self, i: usize) {
        self.faults.arm(FAULT_POINTS[i]);
        if !self.armed.contains(&i) {
            self.armed.push(i);
        }
    }

    /// Disarms every fault.
    pub fn disarm_all(&mut self) {
        for i in self.armed.drain(..) {
            self.faults.disarm(FAULT_POINTS[i]);
        }
    }

    /// Disarms the `n`th armed fault.
    pub fn disarm(&mut self, n: usize) {
        if n < self.armed.len() {
            let i = self.armed.remove(n);
            self.faults.disarm(FAULT_POINTS[i]);
        }
    }

    /// Reaps finished tasks; a task that panicked is a violation.
    pub fn reap(&mut self, shared: &Shared) {
        while let Some(done) = self.tasks.try_join_next() {
            if let Err(e) = done {
                if e.is_panic() {
                    shared.violation(format!("a task of {} panicked", self.gate.name));
                }
            }
        }
    }
}
