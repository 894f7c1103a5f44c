//! The cases of the fault matrix: what process 1 runs (under the fault), after which unfaulted
//! setup, and which keys and roots the checks look at.
//!
//! No runner calls `ResultStore::erase` or `AuditLog::append_audit`: the host does (an erasure
//! request, an event outside a state change), so the `erasure` case calls them as a host would.

use super::*;
use tollgate_store::fault::FaultKind;
use tollgate_store::{
    ApiKeyRecord, ApiKeyStore, AuditEvent, AuditLog, ExecutionStore, KeyDigest, KeyRole,
    ResultStore, SettlementStore, WorkScan,
};

/// The root of the step and recovery cases.
pub const STEP_ROOT: &str = "turn";
/// Its admission window.
pub const STEP_ROOT_DEADLINE_MS: u64 = 60_000;

/// How a key is run, recovered and replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `SingleCallRunner`, text.
    Text,
    /// `SingleCallRunner`, text at a price with free input tokens (`free_input_config`): a
    /// loaded input's own worst case is the profile's, so its dispatch mark keeps the hold.
    FreeInput,
    /// `SingleCallRunner`, json.
    Json,
    /// `StructuredCallRunner` (its root and call keys are derived from the host key).
    Structured,
    /// `GovernedStepRunner` under this root.
    Step(&'static str),
}

/// A key a case checks.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    pub flavor: Flavor,
}

const fn text(name: &'static str) -> Key {
    Key {
        name,
        flavor: Flavor::Text,
    }
}

const fn step(name: &'static str) -> Key {
    Key {
        name,
        flavor: Flavor::Step(STEP_ROOT),
    }
}

/// A case of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Case {
    /// A text call with its input in hand: the claim is also the dispatch mark (H-14).
    Text,
    /// A text call whose input is loaded after the claim and keeps the claim's hold: the plain
    /// dispatch mark (`mark_dispatched`).
    TextLoaded,
    /// A JSON call.
    Json,
    /// A structured call (its own root, one step, the root closed).
    Structured,
    /// Governed steps under a root: open, one step that settles, one the root cap blocks (its
    /// slot is given back), close.
    Step,
    /// `recover` of a prepared claim, a dispatched call with exact evidence, one without, and a
    /// completed step (its receipt set checked and repaired if needed).
    Recover,
    /// `reconcile_expired` over the same work, and the expired root.
    ReconcileExpired,
    /// `reconcile_usage` over late evidence equal to two settled calls' settlements.
    ReconcileUsage,
    /// An operator resolving a call that awaits reconciliation.
    Operator,
    /// Erasure: a host's audit event and erasure request, then the scheduler's erasure.
    Erasure,
    /// The service's tables: an API key created and looked up, the scheduler's work scan.
    Keys,
    /// The lease heartbeat (SC-100): a live claim's lease renewed with its fence, then a
    /// `reconcile_expired` pass that must leave it alone.
    Heartbeat,
    /// Three text calls of one consumer at once, their input in hand: on Postgres their claims
    /// (which are also their dispatch marks) share one batch, and so do their settlements.
    BatchText,
    /// Three text calls of one consumer at once whose input is loaded after the claim: a claim
    /// batch, each call's own dispatch mark, a settlement batch.
    BatchLoaded,
    /// Three calls at once, two of them with one key and one binding: one batch carries the
    /// key's claim and its replay, which must not send.
    BatchSameKey,
}

/// Calls a batch case sends at once (the batch hook gathers this many per statement).
pub const BATCH_CALLS: usize = 3;

impl Case {
    pub const ALL: [Case; 15] = [
        Case::Text,
        Case::TextLoaded,
        Case::Json,
        Case::Structured,
        Case::Step,
        Case::Recover,
        Case::ReconcileExpired,
        Case::ReconcileUsage,
        Case::Operator,
        Case::Erasure,
        Case::Keys,
        Case::Heartbeat,
        Case::BatchText,
        Case::BatchLoaded,
        Case::BatchSameKey,
    ];

    /// The cases whose calls meet in batches on Postgres (`fault_matrix::batches`).
    pub const BATCHES: [Case; 3] = [Case::BatchText, Case::BatchLoaded, Case::BatchSameKey];

    pub fn name(self) -> &'static str {
        match self {
            Case::Text => "text",
            Case::TextLoaded => "text_loaded",
            Case::Json => "json",
            Case::Structured => "structured",
            Case::Step => "step",
            Case::Recover => "recover",
            Case::ReconcileExpired => "reconcile_expired",
            Case::ReconcileUsage => "reconcile_usage",
            Case::Operator => "operator",
            Case::Erasure => "erasure",
            Case::Keys => "keys",
            Case::Heartbeat => "heartbeat",
            Case::BatchText => "batch_text",
            Case::BatchLoaded => "batch_loaded",
            Case::BatchSameKey => "batch_same_key",
        }
    }

    /// The keys whose sends, settlements and end state are checked.
    pub fn keys(self) -> Vec<Key> {
        match self {
            Case::Text => vec![text("k")],
            Case::TextLoaded => vec![Key {
                name: "w",
                flavor: Flavor::FreeInput,
            }],
            Case::Json => vec![Key {
                name: "k",
                flavor: Flavor::Json,
            }],
            Case::Structured => vec![Key {
                name: "x",
                flavor: Flavor::Structured,
            }],
            Case::Step => vec![step("s1"), step("s2")],
            Case::Recover | Case::ReconcileExpired => {
                vec![text("prep"), text("disp"), text("lost"), step("done")]
            }
            Case::ReconcileUsage => vec![text("a"), text("b")],
            Case::Operator => vec![text("cut")],
            Case::Erasure => vec![text("e")],
            Case::Keys => vec![],
            Case::Heartbeat => vec![text("live")],
            Case::BatchText => vec![text("b1"), text("b2"), text("b3")],
            Case::BatchLoaded => ["l1", "l2", "l3"]
                .map(|name| Key {
                    name,
                    flavor: Flavor::FreeInput,
                })
                .to_vec(),
            Case::BatchSameKey => vec![text("d1"), text("d2")],
        }
    }

    /// The roots that must end reconciled, with sums that agree with their receipts.
    pub fn roots(self, world: &World) -> Vec<RootKey> {
        match self {
            Case::Structured => {
                let key = OperationKey::parse("x").unwrap();
                vec![RootKey::parse(derived_id("root", &world.scope, &key)).unwrap()]
            }
            Case::Step | Case::Recover | Case::ReconcileExpired => {
                vec![RootKey::parse(STEP_ROOT).unwrap()]
            }
            _ => vec![],
        }
    }

    /// Unfaulted work before process 1.
    pub async fn setup(self, world: &Arc<World>) {
        match self {
            Case::Text | Case::TextLoaded | Case::Json | Case::Structured | Case::Step => {}
            Case::BatchText | Case::BatchLoaded | Case::BatchSameKey => {}
            Case::Recover | Case::ReconcileExpired => {
                // Left prepared: the process died right after its claim.
                let prep = Some((StoreOp::Claim, 1, FaultKind::DieAfter));
                text_call(world, "prep", text_reply(), prep).await;
                // Sent, its settlement failed: the stream's evidence was written alone (H-15).
                let disp = Some((StoreOp::Settle, 1, FaultKind::Fail));
                text_call(world, "disp", text_reply(), disp).await;
                // Sent, died before its settlement, which carried its evidence: neither is there.
                let lost = Some((StoreOp::Settle, 1, FaultKind::DieBefore));
                text_call(world, "lost", text_reply(), lost).await;
                // A completed step under a root that stays open past its deadline.
                let stores = world.process();
                let runner = world.step_runner(&stores, world.client("done", vec![tool_reply()]));
                open_root(world, &runner).await.unwrap();
                runner
                    .run_step(world.step_request(STEP_ROOT, "done"))
                    .await
                    .unwrap();
                world.clock.advance_ms(120_000);
            }
            Case::ReconcileUsage => {
                text_call(world, "a", text_reply(), None).await;
                text_call(world, "b", text_reply(), None).await;
                // Their own evidence was acknowledged by their settlements (H-28): late reports
                // equal to the settlements are what reconciliation acknowledges.
                let stores = world.process();
                let reconciler = world.reconciler(&stores);
                for key in ["a", "b"] {
                    let id = world.id(key).unwrap();
                    let charged = stores.settlement(id).await.unwrap().unwrap().usage;
                    reconciler
                        .record_late_evidence(&world.scope, id, charged, None)
                        .await
                        .unwrap();
                }
            }
            Case::Operator => text_call(world, "cut", cut_reply(), None).await,
            Case::Erasure => {
                text_call(world, "e", text_reply(), None).await;
                // Past the result's retention.
                world.clock.advance_ms(3_600_001);
            }
            Case::Keys => {}
            // A claim whose process stopped before its dispatch mark (loaded input: the mark that
            // shrinks the hold); its lease is still live.
            Case::Heartbeat => {
                text_call(
                    world,
                    "live",
                    text_reply(),
                    Some((StoreOp::MarkDispatchedWithHold, 1, FaultKind::DieBefore)),
                )
                .await;
            }
        }
    }

    /// Process 1 (under the fault). Errors are the runner's answers to the fault: ignored here,
    /// the checks look at what was stored.
    pub async fn process(self, world: Arc<World>, stores: Arc<FaultyStores>) {
        let scope = world.scope.clone();
        match self {
            Case::Text | Case::Json => {
                let (config, reply) = if self == Case::Text {
                    (text_config(), text_reply())
                } else {
                    (json_config(), json_reply())
                };
                let runner = world.text_runner(&stores, config, world.client("k", vec![reply]));
                // Text: the input in hand, claimed at its own worst case and dispatched by the
                // claim (H-14).
                // Json: loaded after the claim, the hold shrunk by the dispatch mark
                // (`mark_dispatched_with_hold`, SC-122).
                if self == Case::Text {
                    let input = [Message::text(Role::User, INPUT)];
                    let _ = runner.run_inline(world.request("k"), &input).await;
                } else {
                    let _ = runner.run(world.request("k")).await;
                }
            }
            Case::BatchText | Case::BatchSameKey => {
                let names: [&'static str; BATCH_CALLS] = if self == Case::BatchText {
                    ["b1", "b2", "b3"]
                } else {
                    ["d1", "d2", "d1"]
                };
                let calls = names.map(|name| {
                    let client = world.client(name, vec![text_reply()]);
                    let runner = world.text_runner(&stores, text_config(), client);
                    let request = world.request(name);
                    async move {
                        let input = [Message::text(Role::User, INPUT)];
                        let _ = runner.run_inline(request, &input).await;
                    }
                });
                futures::future::join_all(calls).await;
            }
            Case::BatchLoaded => {
                let calls = ["l1", "l2", "l3"].map(|name| {
                    let client = world.client(name, vec![text_reply()]);
                    let runner = world.text_runner(&stores, free_input_config(), client);
                    let request = world.request(name);
                    async move {
                        let _ = runner.run(request).await;
                    }
                });
                futures::future::join_all(calls).await;
            }
            Case::TextLoaded => {
                let client = world.client("w", vec![text_reply()]);
                let runner = world.text_runner(&stores, free_input_config(), client);
                let _ = runner.run(world.request("w")).await;
            }
            Case::Structured => {
                let runner =
                    world.structured_runner(&stores, world.client("x", vec![tool_reply()]));
                let _ = runner.run(world.request("x")).await;
            }
            Case::Step => {
                let first = world.step_runner(&stores, world.client("s1", vec![tool_reply()]));
                let second = world.step_runner(&stores, world.client("s2", vec![tool_reply()]));
                let _ = open_root(&world, &first).await;
                let _ = first.run_step(world.step_request(STEP_ROOT, "s1")).await;
                let _ = second.run_step(world.step_request(STEP_ROOT, "s2")).await;
                let _ = first
                    .close_root(&scope, &RootKey::parse(STEP_ROOT).unwrap())
                    .await;
            }
            Case::Recover => {
                let reconciler = world.reconciler(&stores);
                for key in ["prep", "disp", "lost"] {
                    let key = OperationKey::parse(key).unwrap();
                    let _ = reconciler.recover(&scope, &key, RECOVERY_LEASE_MS).await;
                }
                let runner = world.step_runner(&stores, world.client("done", vec![]));
                let _ = runner
                    .recover(
                        &reconciler,
                        &scope,
                        &RootKey::parse(STEP_ROOT).unwrap(),
                        &OperationKey::parse("done").unwrap(),
                        RECOVERY_LEASE_MS,
                    )
                    .await;
            }
            Case::ReconcileExpired => {
                let _ = world
                    .reconciler(&stores)
                    .reconcile_expired(&scope, 100, RECOVERY_LEASE_MS)
                    .await;
            }
            Case::ReconcileUsage => {
                let none = |_: &OperationKey| false;
                let _ = world
                    .reconciler(&stores)
                    .reconcile_usage(&scope, None, None, &none)
                    .await;
            }
            Case::Operator => {
                let id = world.id("cut").unwrap();
                let _ = world
                    .reconciler(&stores)
                    .resolve(&scope, id, usage(10, 5))
                    .await;
            }
            Case::Erasure => {
                let id = world.id("e").unwrap();
                let now = tollgate_runner::Clock::now(world.clock.as_ref());
                let event = AuditEvent {
                    scope: scope.clone(),
                    execution_id: Some(id),
                    kind: "erasure_requested".into(),
                    detail: serde_json::json!({}),
                    at: now,
                };
                let _ = stores.append_audit(event).await;
                let _ = stores.erase(&scope, id, now).await;
                let _ = world.reconciler(&stores).erase_expired(100).await;
            }
            Case::Keys => {
                // One key per combination's scope: the database is shared by the combinations.
                let digest = KeyDigest::of_key(&format!("faults-key-{scope}"));
                let now = tollgate_runner::Clock::now(world.clock.as_ref());
                let record = ApiKeyRecord::new(digest, scope.clone(), KeyRole::Caller, now);
                let _ = stores.insert_key(record).await;
                let _ = stores.key_by_digest(&digest).await;
                let _ = stores.touch_key(&digest, now).await;
                let _ = stores.list_keys(Some(&scope)).await;
                let _ = stores.revoke_key(Some(&scope), &digest, now).await;
                let _ = stores.scopes_with_work(None, 10).await;
            }
            Case::Heartbeat => {
                // The holder's heartbeat, late in its lease: renewed with its own fence, the
                // claim is not expired for a recoverer.
                let key = OperationKey::parse("live").unwrap();
                let Ok(Some(record)) = stores.execution(&scope, &key).await else {
                    return;
                };
                world.clock.advance_ms(20_000);
                let now = tollgate_runner::Clock::now(world.clock.as_ref());
                if stores
                    .renew_lease(record.fence(), 30_000, now)
                    .await
                    .is_err()
                {
                    return;
                }
                world.clock.advance_ms(20_000);
                let _ = world
                    .reconciler(&stores)
                    .reconcile_expired(&scope, 100, RECOVERY_LEASE_MS)
                    .await;
                // Renewed: still the holder's, never taken over.
                let row = world.inner.execution(&scope, &key).await.unwrap().unwrap();
                assert_eq!(row.fence, record.fence, "a renewed lease is not taken over");
            }
        }
    }
}

/// A text call of `key` in a process of its own. With `dies_at`, the process dies at that call:
/// after it for `claim` (the claim is left prepared), before it otherwise. Remembers the
/// execution id.
async fn text_call(
    world: &Arc<World>,
    key: &'static str,
    reply: ScriptedReply,
    fault: Option<(StoreOp, u64, FaultKind)>,
) {
    let stores = world.process();
    if let Some((op, nth, kind)) = fault {
        stores.inject(Fault { op, nth, kind });
    }
    let runner = world.text_runner(&stores, text_config(), world.client(key, vec![reply]));
    let request = world.request(key);
    let life = live(&stores, async move {
        let _ = runner.run(request).await;
    })
    .await;
    let dies = fault.is_some_and(|(_, _, kind)| kind != FaultKind::Fail);
    let expected = if dies { Life::Died } else { Life::Finished };
    assert_eq!(life, expected, "setup of {key}");
    let row = world
        .inner
        .execution(&world.scope, &OperationKey::parse(key).unwrap())
        .await
        .unwrap()
        .unwrap();
    world.remember(key, row.id);
}

async fn open_root(
    world: &World,
    runner: &GovernedStepRunner,
) -> Result<tollgate_store::RootRecord, tollgate_runner::RunError> {
    runner
        .open_root(tollgate_runner::step::OpenRoot {
            scope: world.scope.clone(),
            root_key: RootKey::parse(STEP_ROOT).unwrap(),
            session_id: SessionId::parse("s-1").unwrap(),
            intent: Intent::parse("plan").unwrap(),
            input_revision: InputRevision::parse("r-1").unwrap(),
            deadline_ms: STEP_ROOT_DEADLINE_MS,
        })
        .await
}
