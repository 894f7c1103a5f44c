//! The fault matrix (spec/journal.md — Fault points): every store operation the wrapper
//! enumerates ([`StoreOp::ALL`]) × {fail, die before, die after} × each call a case makes of it.
//!
//! One combination runs in a world of its own (its inner stores — or, on Postgres, its own scope
//! in the case's database — and a manual clock):
//!
//! 1. the case's setup, unfaulted (the recovery cases leave work behind for recovery);
//! 2. process 1: the case runs over a [`FaultyStores`] armed with the fault. On death its task is
//!    dropped, and the dead wrapper keeps every task the runner spawned (the drive) pending
//!    forever, as after `kill -9`;
//! 3. process 2: a fresh wrapper over the same inner stores moves the clock past every lease,
//!    deadline and retention, recovers each key, and runs scheduler passes (`reconcile_expired`
//!    with roots, `reconcile_usage`, `erase_expired`);
//! 4. the checks ([`check`]): at most one send and one settlement per key, an end state the
//!    requirements allow, every root reconciled, the ledger's sums ([`ledger::violations`]); then
//!    a replay of every key, which must send nothing for a key that has a journal row.
#![allow(dead_code)]

pub mod batches;
pub mod cases;
pub mod ledger;
pub mod matrix;

use cases::{Case, Flavor, Key};
use futures::FutureExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_core::config::{CallConfig, OutputContract};
use tollgate_core::event::ProviderEvent as E;
use tollgate_core::ids::*;
use tollgate_core::message::{Message, Role, ToolChoice, ToolSpec};
use tollgate_core::state::{CallKind, ExecutionState};
use tollgate_core::usage::Usage;
use tollgate_provider::scripted::{ScriptedClient, ScriptedReply};
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::step::{GovernedStepRunner, StepRequest};
use tollgate_runner::structured::{derived_id, StructuredCallRunner};
use tollgate_runner::{ManualClock, RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::fault::{Fault, FaultyStores, StoreOp};
use tollgate_store::{MemoryStores, ServiceStores};
use tollgate_testkit::conformance::text_config;

/// Every call's input.
pub const INPUT: &str = "weather in Paris?";

/// The text profile with free input tokens (input, cache read and cache write at zero): every
/// input's worst case costs the profile's worst case, so a loaded input keeps the claim's hold.
pub fn free_input_config() -> CallConfig {
    let mut config = text_config();
    config.prices.input = tollgate_core::money::Money::ZERO;
    config.prices.cache_read = tollgate_core::money::Money::ZERO;
    config.prices.cache_write = tollgate_core::money::Money::ZERO;
    config
}
/// Lease of the fences recovery takes.
pub const RECOVERY_LEASE_MS: u64 = 10_000;
/// How far process 2 moves the clock: past every lease, root deadline and result retention.
pub const PROCESS_2_ADVANCE_MS: i64 = 2 * 3600 * 1000;
/// Real time a process may take before it counts as hung.
pub const HANG_LIMIT: Duration = Duration::from_secs(30);
/// Scheduler passes process 2 runs at most (it stops at the first pass that changes nothing).
pub const SCHEDULER_PASSES_MAX: usize = 4;

/// Where the inner stores come from.
#[derive(Clone)]
pub enum Base {
    /// Fresh in-memory stores for every combination.
    Memory,
    /// One Postgres database per case; every combination has a scope of its own in it. Process
    /// 1 runs on the first stores, process 2 on the second: the same database, but no pool,
    /// known-keys set or batch queue of the process that died.
    Postgres(Arc<dyn ServiceStores>, Arc<dyn ServiceStores>),
}

impl Base {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Postgres(..) => "postgres",
        }
    }

    /// The stores of process 1 and of process 2 (the same ones in memory, where the store is
    /// the database).
    fn stores(&self) -> (Arc<dyn ServiceStores>, Arc<dyn ServiceStores>) {
        match self {
            Self::Memory => {
                let stores: Arc<dyn ServiceStores> = Arc::new(MemoryStores::new());
                (stores.clone(), stores)
            }
            Self::Postgres(first, second) => (first.clone(), second.clone()),
        }
    }
}

/// One combination's world: the inner stores both processes share, the combination's scope, one
/// clock, and every client used for each key (so sends are counted per key).
pub struct World {
    pub inner: Arc<dyn ServiceStores>,
    /// The stores process 2 runs on.
    second: Arc<dyn ServiceStores>,
    pub scope: Scope,
    pub clock: Arc<ManualClock>,
    clients: Mutex<BTreeMap<&'static str, Vec<Arc<ScriptedClient>>>>,
    ids: Mutex<BTreeMap<&'static str, ExecutionId>>,
}

impl World {
    pub fn new(
        (inner, second): (Arc<dyn ServiceStores>, Arc<dyn ServiceStores>),
        scope: Scope,
    ) -> Self {
        Self {
            inner,
            second,
            scope,
            clock: Arc::new(ManualClock::new(tollgate_testkit::conformance::t0())),
            clients: Mutex::new(BTreeMap::new()),
            ids: Mutex::new(BTreeMap::new()),
        }
    }

    /// A new process: a fresh wrapper over the shared inner stores.
    pub fn process(&self) -> Arc<FaultyStores> {
        Arc::new(FaultyStores::with_service(self.inner.clone()))
    }

    /// Process 2: a fresh wrapper over the second stores (on Postgres, stores that share
    /// nothing in memory with process 1's).
    pub fn second_process(&self) -> Arc<FaultyStores> {
        Arc::new(FaultyStores::with_service(self.second.clone()))
    }

    /// A client for `key`'s sends, answering `replies`.
    pub fn client(&self, key: &'static str, replies: Vec<ScriptedReply>) -> Arc<ScriptedClient> {
        let client = Arc::new(ScriptedClient::new(replies));
        self.clients
            .lock()
            .unwrap()
            .entry(key)
            .or_default()
            .push(client.clone());
        client
    }

    /// Sends for `key` so far, over every process.
    pub fn sends(&self, key: &str) -> u64 {
        self.clients
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |cs| cs.iter().map(|c| c.sends()).sum())
    }

    pub fn remember(&self, key: &'static str, id: ExecutionId) {
        self.ids.lock().unwrap().insert(key, id);
    }

    pub fn id(&self, key: &str) -> Option<ExecutionId> {
        self.ids.lock().unwrap().get(key).copied()
    }

    pub fn settings(&self, config: CallConfig) -> RunnerSettings {
        let mut settings = RunnerSettings::new(config);
        settings.clock = self.clock.clone();
        settings
    }

    pub fn reconciler(&self, stores: &Arc<FaultyStores>) -> Reconciler {
        Reconciler::with_roots(stores.clone(), self.clock.clone())
    }

    pub fn text_runner(
        &self,
        stores: &Arc<FaultyStores>,
        config: CallConfig,
        client: Arc<ScriptedClient>,
    ) -> SingleCallRunner {
        SingleCallRunner::new(
            stores.clone(),
            of_process(stores, client),
            self.settings(config),
        )
        .unwrap()
    }

    pub fn step_runner(
        &self,
        stores: &Arc<FaultyStores>,
        client: Arc<ScriptedClient>,
    ) -> GovernedStepRunner {
        GovernedStepRunner::new(
            stores.clone(),
            of_process(stores, client),
            self.settings(step_config()),
        )
        .unwrap()
    }

    pub fn structured_runner(
        &self,
        stores: &Arc<FaultyStores>,
        client: Arc<ScriptedClient>,
    ) -> StructuredCallRunner {
        StructuredCallRunner::new(
            stores.clone(),
            of_process(stores, client),
            self.settings(structured_config()),
        )
        .unwrap()
    }

    /// A text, json or structured run of `key`.
    pub fn request(&self, key: &str) -> RunRequest {
        RunRequest {
            scope: self.scope.clone(),
            session_id: SessionId::parse("s-1").unwrap(),
            operation_key: OperationKey::parse(key).unwrap(),
            input_revision: InputRevision::parse("r-1").unwrap(),
            intent: Intent::parse("summarize").unwrap(),
            load_input: async { Ok(vec![Message::text(Role::User, INPUT)]) }.boxed(),
            cancel: CancellationToken::new(),
            limits: Vec::new(),
        }
    }

    pub fn step_request(&self, root: &str, key: &str) -> StepRequest {
        StepRequest {
            scope: self.scope.clone(),
            root_key: RootKey::parse(root).unwrap(),
            operation_key: OperationKey::parse(key).unwrap(),
            load_input: async { Ok(vec![Message::text(Role::User, INPUT)]) }.boxed(),
            cancel: CancellationToken::new(),
            limits: Vec::new(),
        }
    }

    /// The journal key of `key` (a structured call's is derived from the host key).
    pub fn journal_key(&self, key: &Key) -> OperationKey {
        match key.flavor {
            Flavor::Structured => {
                OperationKey::parse(derived_id("call", &self.scope, &host_key(key))).unwrap()
            }
            _ => host_key(key),
        }
    }
}

/// A process's provider client: it sends while the process lives. The harness drops a dead
/// process's task, but the drives it spawned stay scheduled, and one that had passed its last
/// store call before the death would otherwise send after it, which no killed process can.
struct ProcessClient {
    inner: Arc<ScriptedClient>,
    process: Arc<FaultyStores>,
}

#[async_trait::async_trait]
impl tollgate_provider::ProviderClient for ProcessClient {
    fn descriptor(&self) -> tollgate_provider::ClientDescriptor {
        self.inner.descriptor()
    }

    fn check(
        &self,
        request: &tollgate_provider::ProviderRequest,
    ) -> Result<(), tollgate_provider::SendError> {
        self.inner.check(request)
    }

    async fn send(
        &self,
        request: tollgate_provider::ProviderRequest,
        cancel: CancellationToken,
    ) -> Result<tollgate_provider::EventStream, tollgate_provider::SendError> {
        if self.process.is_dead() {
            std::future::pending::<()>().await;
        }
        self.inner.send(request, cancel).await
    }
}

/// `client` as `stores`'s process sends through it.
fn of_process(
    stores: &Arc<FaultyStores>,
    client: Arc<ScriptedClient>,
) -> Arc<dyn tollgate_provider::ProviderClient> {
    Arc::new(ProcessClient {
        inner: client,
        process: stores.clone(),
    })
}

pub fn host_key(key: &Key) -> OperationKey {
    OperationKey::parse(key.name).unwrap()
}

// ---- configs and replies ----------------------------------------------------------------------

pub fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input,
        output,
        ..Usage::ZERO
    }
}

/// A text reply with exact usage 10/5 (0.00002 at the fixture prices).
pub fn text_reply() -> ScriptedReply {
    ScriptedReply::text("hi", usage(10, 5))
}

pub fn json_reply() -> ScriptedReply {
    ScriptedReply::text(r#"{"answer":"yes","ok":true}"#, usage(10, 5))
}

/// A stream cut before its usage: the call goes to an operator.
pub fn cut_reply() -> ScriptedReply {
    ScriptedReply::Events(vec![
        E::ProviderRef {
            id: "req-cut".into(),
        },
        E::TextDelta { text: "cut".into() },
    ])
}

/// One forced tool call with exact usage 10/5.
pub fn tool_reply() -> ScriptedReply {
    ScriptedReply::Events(vec![
        E::ProviderRef { id: "req-1".into() },
        E::ToolCallStart {
            index: 0,
            id: "call_1".into(),
            name: "get_weather".into(),
        },
        E::ToolCallArgsDelta {
            index: 0,
            delta: r#"{"city":"Paris"}"#.into(),
        },
        E::ToolCallEnd { index: 0 },
        E::Stop {
            reason: "tool_calls".into(),
        },
        E::Usage {
            usage: usage(10, 5),
            terminal: true,
        },
        E::Done,
    ])
}

pub fn json_config() -> CallConfig {
    let mut c = text_config();
    c.kind = CallKind::Json;
    c.output = Some(OutputContract {
        name: "answer".into(),
        schema: serde_json::json!({
            "type": "object",
            "required": ["answer", "ok"],
            "properties": {"answer": {"type": "string"}, "ok": {"type": "boolean"}}
        }),
    });
    c
}

fn weather() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Weather by city".into(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {"city": {"type": "string"}}
        }),
    }
}

/// A step snapshot whose root block cap admits exactly one call in flight: after the first step
/// settled, a second is blocked (its slot is given back).
pub fn step_config() -> CallConfig {
    let mut c = text_config();
    c.kind = CallKind::Step;
    c.tools = vec![weather()];
    c.caps.root_block = Some(c.worst_case_hold().unwrap());
    c
}

pub fn structured_config() -> CallConfig {
    let mut c = text_config();
    c.kind = CallKind::Structured;
    c.tools = vec![weather()];
    c.tool_choice = Some(ToolChoice::Tool {
        name: "get_weather".into(),
    });
    c
}

// ---- processes ----------------------------------------------------------------------------------

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// Its work returned.
    Finished,
    /// A fault killed it; its task was dropped.
    Died,
    /// Neither within [`HANG_LIMIT`].
    Hung,
}

/// Runs `work` as a process over `stores`: when the wrapper dies, the work's task is dropped
/// (whatever the runner spawned stays pending on the dead wrapper).
pub async fn live<F>(stores: &Arc<FaultyStores>, work: F) -> Life
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut task = tokio::spawn(work);
    let life = tokio::time::timeout(HANG_LIMIT, async {
        tokio::select! {
            biased;
            joined = &mut task => {
                joined.expect("the process's work panicked");
                Life::Finished
            }
            () = stores.died() => Life::Died,
        }
    })
    .await
    .unwrap_or(Life::Hung);
    task.abort();
    life
}

// ---- one combination ----------------------------------------------------------------------------

/// What one combination showed.
pub struct Run {
    /// Calls of each operation in process 1.
    pub calls: BTreeMap<StoreOp, u64>,
    /// Whether the fault struck.
    pub hit: bool,
    /// How process 1 ended.
    pub life: Life,
    /// Every broken check.
    pub violations: Vec<String>,
}

/// Runs `case` with `fault` (none: the probe) in a world of its own named `scope`.
pub async fn run_combination(case: Case, base: &Base, scope: &str, fault: Option<Fault>) -> Run {
    let world = Arc::new(World::new(base.stores(), Scope::parse(scope).unwrap()));
    case.setup(&world).await;
    let process_1 = world.process();
    if let Some(fault) = fault {
        process_1.inject(fault);
    }
    let transient = fault.is_some_and(|f| f.kind == tollgate_store::fault::FaultKind::Fail);
    let (life, violations) = after_setup(case, &world, &process_1, transient).await;
    Run {
        calls: process_1.calls(),
        hit: !process_1.fired().is_empty(),
        life,
        violations,
    }
}

/// Process 1 over `process_1` (set up, its fault armed), process 2, and every check: how
/// process 1 ended and what broke. `transient`: process 1 lived through its fault, so every call
/// it sent keeps its output ([`check_transient`]).
pub async fn after_setup(
    case: Case,
    world: &Arc<World>,
    process_1: &Arc<FaultyStores>,
    transient: bool,
) -> (Life, Vec<String>) {
    let life = live(process_1, case.process(world.clone(), process_1.clone())).await;
    let mut violations = Vec::new();
    if life == Life::Hung {
        violations.push("process 1 hung without dying".to_string());
    }
    let process_2 = world.second_process();
    world.clock.advance_ms(PROCESS_2_ADVANCE_MS);
    if let Err(e) = recover(case, world, &process_2).await {
        violations.push(format!("recovery failed: {e}"));
    }
    violations.extend(check(case, world).await);
    violations.extend(check_transient(case, world, transient).await);
    violations.extend(replay(case, world, &process_2).await);
    let mut seen = std::collections::BTreeSet::new();
    violations.retain(|v| seen.insert(v.clone()));
    (life, violations)
}

/// Process 2: recovers every key, then runs scheduler passes until one changes nothing.
async fn recover(case: Case, world: &World, stores: &Arc<FaultyStores>) -> Result<(), String> {
    let reconciler = world.reconciler(stores);
    let scope = &world.scope;
    for key in case.keys() {
        let client = world.client(key.name, vec![]);
        match key.flavor {
            Flavor::Text | Flavor::FreeInput | Flavor::Json => reconciler
                .recover(scope, &host_key(&key), RECOVERY_LEASE_MS)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())?,
            Flavor::Structured => world
                .structured_runner(stores, client)
                .recover(&reconciler, scope, &host_key(&key), RECOVERY_LEASE_MS)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())?,
            Flavor::Step(root) => world
                .step_runner(stores, client)
                .recover(
                    &reconciler,
                    scope,
                    &RootKey::parse(root).unwrap(),
                    &host_key(&key),
                    RECOVERY_LEASE_MS,
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())?,
        }
    }
    let none = |_: &OperationKey| false;
    for _ in 0..SCHEDULER_PASSES_MAX {
        let expired = reconciler
            .reconcile_expired(scope, 100, RECOVERY_LEASE_MS)
            .await
            .map_err(|e| e.to_string())?;
        let usage = reconciler
            .reconcile_usage(scope, None, None, &none)
            .await
            .map_err(|e| e.to_string())?;
        let erased = reconciler
            .erase_expired(100)
            .await
            .map_err(|e| e.to_string())?;
        if expired.executions + expired.roots + usage.acknowledged + erased == 0 {
            break;
        }
    }
    Ok(())
}

/// The checks after recovery: sends and settlements per key, the end state, roots, the ledger.
pub async fn check(case: Case, world: &World) -> Vec<String> {
    let stores = world.inner.as_ref();
    let scope = &world.scope;
    let mut out = Vec::new();
    for key in case.keys() {
        let name = key.name;
        let sends = world.sends(name);
        if sends > 1 {
            out.push(format!("{name}: sent {sends} times"));
        }
        let row = stores
            .execution(scope, &world.journal_key(&key))
            .await
            .unwrap();
        let Some(row) = row else {
            if sends > 0 {
                out.push(format!("{name}: sent without a journal row"));
            }
            continue;
        };
        let settlements = ledger::settlements_of(stores, row.id).await;
        if settlements > 1 {
            out.push(format!("{name}: settled {settlements} times"));
        }
        match row.state {
            // Completed means the provider answered it: exactly one send.
            ExecutionState::Completed if sends == 1 => {}
            ExecutionState::Completed => {
                out.push(format!("{name}: completed after {sends} send(s)"))
            }
            ExecutionState::NotDispatched if sends == 0 => {}
            ExecutionState::NotDispatched => {
                out.push(format!("{name}: not_dispatched after {sends} send(s)"))
            }
            ExecutionState::ReconciliationRequired => {
                if let Some(problem) = ledger::settleable_evidence(stores, &row).await {
                    out.push(format!(
                        "{name}: reconciliation_required without a reason: {problem}"
                    ));
                }
                if row.hold == tollgate_core::money::Money::ZERO {
                    out.push(format!("{name}: reconciliation_required without its hold"));
                }
            }
            ExecutionState::Prepared | ExecutionState::Dispatched => {
                out.push(format!("{name}: still {} after recovery (H-4)", row.state))
            }
        }
    }
    for root_key in case.roots(world) {
        out.extend(ledger::root_finished(stores, scope, &root_key).await);
    }
    out.extend(ledger::violations(stores, scope, &case.roots(world)).await);
    out
}

/// A call whose process lived through its fault (one failed store write: the store briefly
/// unavailable; a batch statement refused, not sent, or whose connection was lost) keeps what
/// the provider answered (SC-202, SC-203): every key of a call case that was sent ends settled
/// by its own drive (source `stream`), never handed to recovery, which cannot regenerate the
/// output, or to an operator. Removing the settlement's retry breaks this.
async fn check_transient(case: Case, world: &World, transient: bool) -> Vec<String> {
    let mut out = Vec::new();
    let calls = matches!(
        case,
        Case::Text
            | Case::TextLoaded
            | Case::Json
            | Case::Structured
            | Case::Step
            | Case::BatchText
            | Case::BatchLoaded
            | Case::BatchSameKey
    );
    if !transient || !calls {
        return out;
    }
    let stores = world.inner.as_ref();
    for key in case.keys() {
        let name = key.name;
        if world.sends(name) != 1 {
            continue;
        }
        let Some(row) = stores
            .execution(&world.scope, &world.journal_key(&key))
            .await
            .unwrap()
        else {
            continue;
        };
        let settlement = stores.settlement(row.id).await.unwrap();
        match (row.state, settlement) {
            (ExecutionState::Completed, Some(s))
                if s.source == tollgate_core::state::SettlementSource::Stream => {}
            (state, s) => out.push(format!(
                "{name}: sent, and one failed store write left it {state} (settlement source \
                 {:?}): its output was not kept",
                s.map(|s| s.source.as_str())
            )),
        }
    }
    out
}

/// A replay of every key after recovery (a later process): it sends nothing for a key with a
/// journal row, and no key is ever sent twice.
async fn replay(case: Case, world: &World, stores: &Arc<FaultyStores>) -> Vec<String> {
    let mut out = Vec::new();
    for key in case.keys() {
        let name = key.name;
        let known = world
            .inner
            .execution(&world.scope, &world.journal_key(&key))
            .await
            .unwrap()
            .is_some();
        let before = world.sends(name);
        let reply = match key.flavor {
            Flavor::Text | Flavor::FreeInput => text_reply(),
            Flavor::Json => json_reply(),
            Flavor::Structured | Flavor::Step(_) => tool_reply(),
        };
        let client = world.client(name, vec![reply]);
        let _ = match key.flavor {
            Flavor::Text => world
                .text_runner(stores, text_config(), client)
                .run(world.request(name))
                .await
                .map(|_| ()),
            Flavor::FreeInput => world
                .text_runner(stores, free_input_config(), client)
                .run(world.request(name))
                .await
                .map(|_| ()),
            Flavor::Json => world
                .text_runner(stores, json_config(), client)
                .run(world.request(name))
                .await
                .map(|_| ()),
            Flavor::Structured => world
                .structured_runner(stores, client)
                .run(world.request(name))
                .await
                .map(|_| ()),
            Flavor::Step(root) => world
                .step_runner(stores, client)
                .run_step(world.step_request(root, name))
                .await
                .map(|_| ()),
        };
        let after = world.sends(name);
        if known && after > before {
            out.push(format!("{name}: a replay after recovery sent again"));
        }
        if after > 1 {
            out.push(format!("{name}: sent {after} times with the replay"));
        }
    }
    out
}
