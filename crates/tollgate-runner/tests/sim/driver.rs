//! The driver: one seeded generator decides every step of a run.
//!
//! Each step sleeps a random multiple of 10 ms of simulated time, then does one thing: starts a
//! call (text, json, structured, or a governed step under a root), replays or conflicts an
//! earlier call, opens or closes a root, fires a caller's signal, drops a caller's task, kills or
//! starts a process, arms or disarms a store fault, jumps the wall clock, or has a scheduler
//! process run a pass, recover one key or resolve one execution as an operator. After the step
//! every capped spend row is checked, and every 25 steps the whole ledger.
//!
//! Time discipline, which keeps a seed's run identical from one execution to the next: the driver
//! acts only at multiples of 10 ms, every task it starts first sleeps 5 ms, and every simulated
//! duration (latencies, loader and provider waits) is a multiple of 10 ms. No timer of a task can
//! therefore fire at an instant the driver acts; the runners' `select!`s are `biased`, so two of
//! their branches ready at once are chosen in order, never at random.

use super::calls::{attempt, CallSpec, Load};
use super::checks;
use super::process::Proc;
use super::provider::{Behaviour, Script, SimProvider};
use super::rng::Rng;
use super::shared::Shared;
use super::universe::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::RootKey;
use tollgate_core::usage::Usage;
use tollgate_runner::step::OpenRoot;
use tollgate_store::ExecutionStore;

/// A root the driver opened (or tried to).
#[derive(Debug, Clone)]
pub struct RootSpec {
    scope: usize,
    consumer: usize,
    session: String,
    intent: usize,
    key: String,
}

struct Inflight {
    handle: AbortHandle,
    cancel: CancellationToken,
}

/// Counts of one run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Steps run.
    pub steps: u64,
    /// Call attempts started.
    pub attempts: u64,
    /// Of which replays and conflicts.
    pub replays: u64,
    /// Processes killed.
    pub kills: u64,
    /// Clock jumps.
    pub jumps: u64,
    /// Scheduler passes.
    pub passes: u64,
}

/// The driver of one run.
pub struct Driver {
    pub(super) shared: Arc<Shared>,
    pub(super) provider: Arc<SimProvider>,
    pub(super) rng: Rng,
    pub(super) procs: Vec<Proc>,
    next_proc: u32,
    pub(super) calls: Vec<CallSpec>,
    roots: Vec<RootSpec>,
    inflight: Vec<Inflight>,
    pub(super) stats: Stats,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Call(Kind),
    Replay,
    Conflict,
    OpenRoot,
    CloseRoot,
    Cancel,
    Drop,
    Kill,
    Start,
    Arm,
    Disarm,
    Jump,
    Pass,
    Recover,
    Resolve,
    Idle,
}

const ACTIONS: [(u64, Action); 19] = [
    (11, Action::Call(Kind::Text)),
    (5, Action::Call(Kind::Json)),
    (7, Action::Call(Kind::Structured)),
    (9, Action::Call(Kind::Step)),
    (10, Action::Replay),
    (4, Action::Conflict),
    (6, Action::OpenRoot),
    (2, Action::CloseRoot),
    (3, Action::Cancel),
    (3, Action::Drop),
    (2, Action::Kill),
    (3, Action::Start),
    (4, Action::Arm),
    (5, Action::Disarm),
    (4, Action::Jump),
    (8, Action::Pass),
    (3, Action::Recover),
    (2, Action::Resolve),
    (10, Action::Idle),
];

impl Driver {
    /// A driver with one application and one scheduler process.
    pub fn new(shared: Arc<Shared>, provider: Arc<SimProvider>, rng: Rng) -> Self {
        let mut driver = Self {
            shared,
            provider,
            rng,
            procs: Vec::new(),
            next_proc: 0,
            calls: Vec::new(),
            roots: Vec::new(),
            inflight: Vec::new(),
            stats: Stats::default(),
        };
        driver.start(false);
        driver.start(true);
        driver
    }

    /// Counts so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Starts a process; returns its index.
    pub(super) fn start(&mut self, scheduler: bool) -> usize {
        self.next_proc += 1;
        let name = format!(
            "{}{}",
            if scheduler { "sched" } else { "app" },
            self.next_proc
        );
        let proc = Proc::start(&self.shared, &self.provider, name, scheduler);
        self.procs.push(proc);
        self.procs.len() - 1
    }

    /// A live process of the role, started if there is none.
    pub(super) fn proc_of(&mut self, scheduler: bool) -> usize {
        let live: Vec<usize> = (0..self.procs.len())
            .filter(|i| self.procs[*i].scheduler == scheduler)
            .collect();
        if live.is_empty() {
            return self.start(scheduler);
        }
        live[self.rng.index(live.len())]
    }

    /// Runs `steps` steps, stopping at the first violation.
    pub async fn run(&mut self, steps: u64) {
        for step in 0..steps {
            self.shared.set_step(step);
            let dt = self.rng.weighted(&[(6, 10), (3, 200), (1, 2_000)]);
            let dt = self.rng.grid_ms(10, dt);
            tokio::time::sleep(Duration::from_millis(dt)).await;
            self.reap();
            let action = self.rng.weighted(&ACTIONS);
            self.act(action).await;
            self.stats.steps = step + 1;
            checks::sample(&self.shared).await;
            if step % 25 == 24 {
                checks::ledger(&self.shared).await;
            }
            if self.shared.has_violation() {
                return;
            }
        }
    }

    fn reap(&mut self) {
        for proc in &mut self.procs {
            proc.reap(&self.shared);
        }
        self.inflight.retain(|f| !f.handle.is_finished());
    }

    async fn act(&mut self, action: Action) {
        match action {
            Action::Call(kind) => self.new_call(kind).await,
            Action::Replay => self.replay(false).await,
            Action::Conflict => self.replay(true).await,
            Action::OpenRoot => self.open_root(),
            Action::CloseRoot => self.close_root(),
            Action::Cancel => self.signal(false),
            Action::Drop => self.signal(true),
            Action::Kill => self.kill(),
            Action::Start => self.restart(),
            Action::Arm => self.arm(),
            Action::Disarm => self.disarm(),
            Action::Jump => self.jump(),
            Action::Pass => self.pass(),
            Action::Recover => self.recover(),
            Action::Resolve => self.resolve().await,
            Action::Idle => {}
        }
    }
}

impl Driver {
    fn behaviour(&mut self) -> Behaviour {
        use Behaviour::*;
        self.rng.weighted(&[
            (40, Normal),
            (8, Slow),
            (5, Reasoning),
            (2, ReasoningLoop),
            (5, Hang),
            (5, CutBeforeUsage),
            (5, CutAfterUsage),
            (4, RefusePrestream),
            (3, EmptyRefusal),
            (3, ContentFilter),
            (3, Status429),
            (3, Status500),
            (2, Connect),
            (3, NoResponse),
            (4, Overrun),
            (2, Big),
            (3, ToolMalformed),
        ])
    }

    /// Scripts the provider for `spec`'s token.
    fn script(&mut self, spec: &CallSpec) {
        let behaviour = self.behaviour();
        // An overrun ignores max_tokens (100) by up to 30,000 tokens: up to 0.06, enough to pass
        // a block cap after settlement (the post-call block, SC-16).
        let output = match behaviour {
            Behaviour::Overrun => self.rng.range(101, 30_000),
            _ => self.rng.range(1, 100),
        };
        let usage = Usage {
            input: self.rng.range(1, 2_000),
            output,
            reasoning: if behaviour == Behaviour::Reasoning {
                5
            } else {
                0
            },
            ..Usage::ZERO
        };
        let first_ms = match behaviour {
            Behaviour::Slow => self.rng.grid_ms(1_000, 9_000),
            Behaviour::NoResponse => self.rng.grid_ms(10, 3_000),
            _ => self.rng.weighted(&[(6, 0), (3, 10), (1, 50)]),
        };
        let gap_ms = self.rng.weighted(&[(4, 0), (3, 10), (2, 100), (1, 1_000)]);
        let script = Script {
            behaviour,
            usage,
            first_ms,
            gap_ms,
            tools: spec.kind.uses_tools(),
            json: spec.kind == Kind::Json,
            early_usage: self.rng.chance(40),
        };
        self.provider.script(&spec.token(), script);
    }

    /// One of two sessions of the current epoch: sessions rotate every 100 steps, so session
    /// caps are hit and long runs still get fresh sessions.
    fn session(&mut self) -> String {
        format!("s-{}-{}", self.stats.steps / 100, self.rng.index(2))
    }

    fn load(&mut self) -> Load {
        match self.rng.below(100) {
            0..=3 => Load::Fails,
            4..=7 => Load::Invalid,
            8..=11 => Load::Ok(self.rng.grid_ms(500, 2_000)),
            _ => Load::Ok(self.rng.weighted(&[(7, 0), (3, 10)])),
        }
    }

    async fn new_call(&mut self, kind: Kind) {
        let root = if kind == Kind::Step {
            if self.roots.is_empty() {
                return self.open_root();
            }
            // Mostly one of the latest roots: older ones have mostly closed or expired.
            let recent = self.roots.len().min(3);
            let back = if self.rng.chance(80) {
                self.rng.index(recent)
            } else {
                self.rng.index(self.roots.len())
            };
            Some(self.roots[self.roots.len() - 1 - back].clone())
        } else {
            None
        };
        let n = self.calls.len();
        let spec = CallSpec {
            kind,
            scope: root
                .as_ref()
                .map_or_else(|| self.rng.index(SCOPES.len()), |r| r.scope),
            consumer: root
                .as_ref()
                .map_or_else(|| self.rng.index(CONSUMERS.len()), |r| r.consumer),
            session: match &root {
                Some(r) => r.session.clone(),
                None => self.session(),
            },
            intent: root.as_ref().map_or(0, |r| r.intent),
            key: format!("{}-{n}", kind.name()),
            root: root.map(|r| r.key),
            load: self.load(),
        };
        self.calls.push(spec.clone());
        self.spawn_attempt(spec, "call").await;
    }

    /// The same call again, or (`conflict`) with another kind, intent or root.
    async fn replay(&mut self, conflict: bool) {
        if self.calls.is_empty() {
            return;
        }
        let mut spec = self.calls[self.rng.index(self.calls.len())].clone();
        if conflict {
            match spec.kind {
                Kind::Text | Kind::Json if self.rng.chance(50) => {
                    spec.kind = if spec.kind == Kind::Text {
                        Kind::Json
                    } else {
                        Kind::Text
                    };
                }
                Kind::Step => {
                    let other = &self.roots[self.rng.index(self.roots.len())];
                    spec.root = Some(other.key.clone());
                    spec.intent = other.intent;
                    spec.scope = other.scope;
                    spec.consumer = other.consumer;
                    spec.session = other.session.clone();
                }
                _ => spec.intent = 1 - spec.intent,
            }
        }
        self.stats.replays += 1;
        let label = if conflict { "conflict" } else { "replay" };
        self.spawn_attempt(spec, label).await;
    }

    async fn spawn_attempt(&mut self, spec: CallSpec, label: &str) {
        self.script(&spec);
        let key = tollgate_core::ids::OperationKey::parse(spec.journal_key()).unwrap();
        let existing = self.shared.truth.execution(&scope(spec.scope), &key).await;
        let expect = spec.expect(existing.ok().flatten().as_ref());
        let p = self.proc_of(false);
        let cancel = CancellationToken::new();
        let (shared, runners) = (self.shared.clone(), self.procs[p].runners.clone());
        let label = format!("{} {label}", self.procs[p].gate.name);
        let task = attempt(shared, runners, spec, expect, cancel.clone(), label);
        let handle = self.procs[p].tasks.spawn(task);
        self.inflight.push(Inflight { handle, cancel });
        self.stats.attempts += 1;
    }

    fn open_root(&mut self) {
        let spec = RootSpec {
            scope: self.rng.index(SCOPES.len()),
            consumer: self.rng.index(CONSUMERS.len()),
            session: self.session(),
            intent: self.rng.index(INTENTS.len()),
            key: format!("root-{}", self.roots.len()),
        };
        let deadline_ms = self.rng.grid_ms(2_000, 60_000);
        let p = self.proc_of(false);
        let (shared, runners) = (self.shared.clone(), self.procs[p].runners.clone());
        let open = OpenRoot {
            scope: scope(spec.scope),
            root_key: RootKey::parse(spec.key.as_str()).unwrap(),
            session_id: id(&spec.session),
            intent: intent(spec.intent),
            input_revision: tollgate_core::ids::InputRevision::parse("r-1").unwrap(),
            deadline_ms,
        };
        let (c, what) = (
            spec.consumer,
            format!("{} open {}", self.procs[p].gate.name, spec.key),
        );
        self.procs[p].tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let out = runners.steps[c].open_root(open).await;
            let out = out.map_or_else(
                |e| super::calls::error_kind(&e),
                |r| r.state.as_str().into(),
            );
            shared.trace(format!("{what} -> {out}"));
        });
        self.roots.push(spec);
    }

    fn close_root(&mut self) {
        if self.roots.is_empty() {
            return;
        }
        let spec = self.roots[self.rng.index(self.roots.len())].clone();
        let p = self.proc_of(false);
        let (shared, runners) = (self.shared.clone(), self.procs[p].runners.clone());
        let what = format!("{} close {}", self.procs[p].gate.name, spec.key);
        self.procs[p].tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let root = RootKey::parse(spec.key.as_str()).unwrap();
            let out = runners.steps[spec.consumer]
                .close_root(&scope(spec.scope), &root)
                .await;
            let out = out.map_or_else(|e| super::calls::error_kind(&e), |_| "ok".into());
            shared.trace(format!("{what} -> {out}"));
        });
    }

    /// Fires a caller's signal, or (`drop`) drops the caller's task where it waits.
    fn signal(&mut self, drop: bool) {
        if self.inflight.is_empty() {
            return;
        }
        let i = self.rng.index(self.inflight.len());
        let target = self.inflight.swap_remove(i);
        if drop {
            target.handle.abort();
        } else {
            target.cancel.cancel();
        }
        let what = if drop { "drop" } else { "cancel" };
        self.shared.trace(format!("{what} an attempt"));
    }
}
