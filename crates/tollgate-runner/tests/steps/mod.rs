//! Governed step and structured runner cases, run against every store with roots.
#![allow(dead_code)]

use chrono::{DateTime, Utc};
use futures::FutureExt;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tollgate_core::config::CallConfig;
use tollgate_core::event::ProviderEvent as E;
use tollgate_core::ids::*;
use tollgate_core::message::{Message, Role, ToolChoice, ToolSpec};
use tollgate_core::money::Money;
use tollgate_core::state::{CallKind, Outcome};
use tollgate_core::usage::Usage;
use tollgate_core::view::ViewState;
use tollgate_provider::scripted::{ScriptedClient, ScriptedReply};
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::step::{is_step_interruption, GovernedStepRunner, OpenRoot, StepRequest};
use tollgate_runner::structured::{derived_id, StructuredCallRunner};
use tollgate_runner::{Clock as _, ManualClock, RunError};
use tollgate_runner::{RunRequest, RunnerSettings};
use tollgate_store::fault::{FaultPoint, FaultyStores};
use tollgate_store::{AllStores, RootState};
use tollgate_testkit::conformance::{money, scope, text_config};

#[macro_export]
macro_rules! step_suite {
    ($factory:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let stores = ($factory)().await;
                $crate::steps::$name($crate::steps::H::new(stores)).await;
            }
        )+
    };
}

pub struct H {
    pub faults: Arc<FaultyStores>,
    pub stores: Arc<dyn AllStores>,
    pub clock: Arc<ManualClock>,
}

pub fn t0() -> DateTime<Utc> {
    tollgate_testkit::conformance::t0()
}

fn weather() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Weather by city".into(),
        input_schema: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    }
}

pub fn step_config() -> CallConfig {
    let mut c = text_config();
    c.kind = CallKind::Step;
    c.tools = vec![weather()];
    c
}

pub fn structured_config() -> CallConfig {
    let mut c = step_config();
    c.kind = CallKind::Structured;
    c.tool_choice = Some(ToolChoice::Tool {
        name: "get_weather".into(),
    });
    c
}

fn u(input: u64, output: u64) -> Usage {
    Usage {
        input,
        output,
        ..Usage::ZERO
    }
}

/// Text, a tool call with the given raw arguments, terminal usage 10/5, clean end.
pub fn tool_reply(args: &str) -> ScriptedReply {
    ScriptedReply::Events(vec![
        E::ProviderRef { id: "req-1".into() },
        E::TextDelta {
            text: "Checking.".into(),
        },
        E::ToolCallStart {
            index: 0,
            id: "call_1".into(),
            name: "get_weather".into(),
        },
        E::ToolCallArgsDelta {
            index: 0,
            delta: args.into(),
        },
        E::ToolCallEnd { index: 0 },
        E::Stop {
            reason: "tool_calls".into(),
        },
        E::Usage {
            usage: u(10, 5),
            terminal: true,
        },
        E::Done,
    ])
}

impl H {
    pub fn new(base: Arc<dyn AllStores>) -> Self {
        let faults = Arc::new(FaultyStores::with_roots(base));
        Self {
            stores: faults.clone(),
            faults,
            clock: Arc::new(ManualClock::new(t0())),
        }
    }

    fn settings(&self, config: CallConfig) -> RunnerSettings {
        let mut s = RunnerSettings::new(config);
        s.clock = self.clock.clone();
        s
    }

    pub fn steps(&self, config: CallConfig, client: &Arc<ScriptedClient>) -> GovernedStepRunner {
        GovernedStepRunner::new(self.stores.clone(), client.clone(), self.settings(config)).unwrap()
    }

    /// A step runner whose last writes are retried for `settle_retry_ms` while the store fails.
    pub fn steps_retrying(
        &self,
        config: CallConfig,
        client: &Arc<ScriptedClient>,
        settle_retry_ms: u64,
    ) -> GovernedStepRunner {
        let mut settings = self.settings(config);
        settings.settle_retry_ms = settle_retry_ms;
        GovernedStepRunner::new(self.stores.clone(), client.clone(), settings).unwrap()
    }

    pub fn structured(&self, client: &Arc<ScriptedClient>) -> StructuredCallRunner {
        StructuredCallRunner::new(
            self.stores.clone(),
            client.clone(),
            self.settings(structured_config()),
        )
        .unwrap()
    }

    pub async fn open(&self, runner: &GovernedStepRunner, root: &str, deadline_ms: u64) {
        runner
            .open_root(OpenRoot {
                scope: scope("acme"),
                root_key: RootKey::parse(root).unwrap(),
                session_id: SessionId::parse("s-1").unwrap(),
                intent: Intent::parse("plan").unwrap(),
                input_revision: InputRevision::parse("r-1").unwrap(),
                deadline_ms,
            })
            .await
            .unwrap();
    }

    pub fn step(&self, root: &str, key: &str) -> StepRequest {
        StepRequest {
            scope: scope("acme"),
            root_key: RootKey::parse(root).unwrap(),
            operation_key: OperationKey::parse(key).unwrap(),
            load_input: async { Ok(vec![Message::text(Role::User, "weather in Paris?")]) }.boxed(),
            cancel: CancellationToken::new(),
            limits: Vec::new(),
        }
    }

    pub fn call(&self, key: &str) -> RunRequest {
        RunRequest {
            scope: scope("acme"),
            session_id: SessionId::parse("s-1").unwrap(),
            operation_key: OperationKey::parse(key).unwrap(),
            input_revision: InputRevision::parse("r-1").unwrap(),
            intent: Intent::parse("extract").unwrap(),
            load_input: async { Ok(vec![Message::text(Role::User, "weather in Paris?")]) }.boxed(),
            cancel: CancellationToken::new(),
            limits: Vec::new(),
        }
    }

    pub async fn root(&self, key: &str) -> tollgate_store::RootRecord {
        self.stores
            .root(&scope("acme"), &RootKey::parse(key).unwrap())
            .await
            .unwrap()
            .unwrap()
    }
}

pub fn client(replies: Vec<ScriptedReply>) -> Arc<ScriptedClient> {
    Arc::new(ScriptedClient::new(replies))
}

fn key(s: &str) -> OperationKey {
    OperationKey::parse(s).unwrap()
}

fn rk(s: &str) -> RootKey {
    RootKey::parse(s).unwrap()
}

pub async fn st_5_root_slot_and_claim_precede_loading(h: H) {
    let c = client(vec![tool_reply(r#"{"city":"Paris"}"#)]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let stores = h.stores.clone();
    let mut req = h.step("turn-1", "s1");
    req.load_input = async move {
        let root = stores
            .root(&scope("acme"), &rk("turn-1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(root.reserved_calls, 1, "slot reserved before the claim");
        let row = stores
            .execution(&scope("acme"), &key("s1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.root_key, Some(rk("turn-1")));
        let audit = stores
            .audit_rows(&scope("acme"), tollgate_store::AuditPosition::START, 100)
            .await
            .unwrap();
        assert!(
            audit.iter().any(|r| r.event.kind == "claimed"),
            "audit before load"
        );
        Ok(vec![Message::text(Role::User, "weather in Paris?")])
    }
    .boxed();
    let view = runner.run_step(req).await.unwrap();
    assert_eq!(view.state, ViewState::Completed);
}

pub async fn st_6_one_send_one_charge_one_root_receipt(h: H) {
    let c = client(vec![
        tool_reply(r#"{"city":"Paris"}"#),
        tool_reply(r#"{"city":"Rome"}"#),
    ]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let a = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    let b = runner.run_step(h.step("turn-1", "s2")).await.unwrap();
    for v in [&a, &b] {
        let (charge, root) = (v.receipt.clone().unwrap(), v.root_receipt.clone().unwrap());
        assert_eq!(charge.amount, money("0.00002"));
        assert_eq!(root.amount, charge.amount);
    }
    assert_eq!(c.sends(), 2);
    let root = h.root("turn-1").await;
    assert_eq!(root.charged, money("0.00004"), "inclusive root cost");
    // A replay sends nothing and returns both original receipts.
    let again = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(
        (again.receipt, again.root_receipt),
        (a.receipt, a.root_receipt)
    );
    assert_eq!(c.sends(), 2);
}

pub async fn st_7_root_block_cap_uses_inclusive_cost(h: H) {
    let mut config = step_config();
    let hold = config.worst_case_hold().unwrap();
    // Room for exactly one worst case at a time.
    config.caps.root_block =
        Some(Money::new(hold.decimal() * rust_decimal::Decimal::from(2), "t").unwrap());
    let c = client(vec![tool_reply("{}"), tool_reply("{}")]);
    let runner = h.steps(config.clone(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    runner.run_step(h.step("turn-1", "s2")).await.unwrap();
    let root = h.root("turn-1").await;
    assert_eq!(root.charged, money("0.00004"));
    assert_eq!(root.held, Money::ZERO);
    // Charged 0.00004 + a hold of ~0.0066 exceeds 2 × hold − … only when the cap is tight:
    let mut tight = step_config();
    tight.caps.root_block = Some(hold);
    let runner = h.steps(tight, &c);
    h.open(&runner, "turn-2", 60_000).await;
    c.push(tool_reply("{}"));
    runner.run_step(h.step("turn-2", "t1")).await.unwrap();
    let blocked = runner.run_step(h.step("turn-2", "t2")).await;
    assert!(
        matches!(blocked, Err(RunError::CapBlocked(b)) if b.window == tollgate_core::caps::CapWindow::Root)
    );
    assert_eq!(
        h.root("turn-2").await.reserved_calls,
        1,
        "the refused slot is given back"
    );
}

pub async fn st_8_step_view_keeps_order_text_and_tool_calls(h: H) {
    let c = client(vec![tool_reply(r#"{"city":"Paris"}"#)]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let view = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    let step = view.step.unwrap();
    assert_eq!(step.text, "Checking.");
    assert_eq!(step.blocks.len(), 2);
    assert_eq!(step.blocks[0].order(), 0);
    assert_eq!(step.blocks[1].order(), 1);
    assert_eq!(step.tool_calls.len(), 1);
    assert_eq!(step.tool_calls[0].input["city"], "Paris");
    assert!(!step.tool_calls[0].malformed);
    assert_eq!(step.stop.as_deref(), Some("tool_calls"));
}

pub async fn st_9_malformed_arguments_are_empty_and_flagged(h: H) {
    let c = client(vec![tool_reply(r#"{"city": "Par"#)]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let view = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    let step = view.step.clone().unwrap();
    assert!(step.tool_calls[0].malformed);
    assert_eq!(step.tool_calls[0].input, serde_json::json!({}));
    assert!(
        !serde_json::to_string(&view).unwrap().contains("Par\""),
        "raw text never kept"
    );
}

pub async fn st_9_invalid_output_never_authorizes_tools(h: H) {
    let mut config = step_config();
    config.max_output_chars = 12;
    let c = client(vec![tool_reply(r#"{"city":"Paris"}"#)]);
    let runner = h.steps(config, &c);
    h.open(&runner, "turn-1", 60_000).await;
    let view = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    assert_eq!(view.outcome, Some(Outcome::Invalid));
    assert_eq!(
        view.invalid_reason.map(|r| r.as_str()),
        Some("output_chars")
    );
    assert!(view.step.unwrap().tool_calls.is_empty());
    assert!(
        view.root_receipt.is_some(),
        "invalid output is charged on the root too"
    );
    let read = runner
        .read(&scope("acme"), &rk("turn-1"), &key("s1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.invalid_reason, None, "ST-20: run response only");
}

pub async fn st_22_reasoning_loop_stops_reading_unsettled(h: H) {
    let mut config = step_config();
    config.max_consecutive_reasoning = Some(3);
    let mut events = vec![E::ProviderRef { id: "r".into() }];
    events.extend((0..50).map(|_| E::ReasoningDelta { text: "hmm".into() }));
    let c = client(vec![ScriptedReply::EventsThenHang(events)]);
    let runner = h.steps(config, &c);
    h.open(&runner, "turn-1", 60_000).await;
    let view = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    assert_eq!(view.state, ViewState::ReconciliationRequired);
    assert_eq!(
        view.invalid_reason.map(|r| r.as_str()),
        Some("reasoning_loop")
    );
    assert!(view.receipt.is_none() && view.root_receipt.is_none());
}

pub async fn st_23_cut_before_usage_has_no_charge_and_no_root_receipt(h: H) {
    let c = client(vec![ScriptedReply::Events(vec![
        E::ProviderRef { id: "r".into() },
        E::TextDelta { text: "par".into() },
        E::Error {
            kind: "connection_closed".into(),
            message: "eof".into(),
        },
    ])]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let view = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    assert_eq!(view.state, ViewState::ReconciliationRequired);
    assert!(view.root_receipt.is_none());
    let id = view.execution_id.unwrap();
    assert!(h.stores.root_receipt(id).await.unwrap().is_none());
    assert!(h.stores.settlement(id).await.unwrap().is_none());
}

pub async fn st_23_usage_before_cut_is_invalid_with_cost_on_both_receipts(h: H) {
    let c = client(vec![ScriptedReply::Events(vec![
        E::ProviderRef { id: "r".into() },
        E::TextDelta { text: "par".into() },
        E::Usage {
            usage: u(10, 5),
            terminal: true,
        },
        E::Error {
            kind: "connection_closed".into(),
            message: "eof".into(),
        },
    ])]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let view = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    assert_eq!(view.outcome, Some(Outcome::Invalid));
    assert_eq!(view.receipt.unwrap().amount, money("0.00002"));
    assert_eq!(view.root_receipt.unwrap().amount, money("0.00002"));
}

pub async fn st_30_read_binds_the_call_to_its_root(h: H) {
    let c = client(vec![tool_reply("{}")]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    h.open(&runner, "turn-2", 60_000).await;
    runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    assert!(runner
        .read(&scope("acme"), &rk("turn-1"), &key("s1"))
        .await
        .unwrap()
        .is_some());
    assert!(runner
        .read(&scope("acme"), &rk("turn-2"), &key("s1"))
        .await
        .unwrap()
        .is_none());
    // The same key under another root is a conflict, never a second send.
    let other = runner.run_step(h.step("turn-2", "s1")).await;
    assert!(matches!(other, Err(RunError::Conflict { fields, .. }) if fields == ["root_key"]));
    assert_eq!(c.sends(), 1);
    let r = Reconciler::with_roots(h.stores.clone(), h.clock.clone());
    assert!(runner
        .recover(&r, &scope("acme"), &rk("turn-2"), &key("s1"), 1000)
        .await
        .unwrap()
        .is_none());
}

pub async fn st_33_closed_root_refuses_new_steps_but_finishes_reserved_ones(h: H) {
    let c = client(vec![tool_reply("{}")]);
    let runner = Arc::new(h.steps(step_config(), &c));
    h.open(&runner, "turn-1", 60_000).await;
    let closer = runner.clone();
    let mut req = h.step("turn-1", "s1");
    req.load_input = async move {
        closer
            .close_root(&scope("acme"), &rk("turn-1"))
            .await
            .unwrap();
        Ok(vec![Message::text(Role::User, "go")])
    }
    .boxed();
    let done = runner.run_step(req).await.unwrap();
    assert_eq!(
        done.state,
        ViewState::Completed,
        "a reserved call is never cancelled"
    );
    let refused = runner.run_step(h.step("turn-1", "s2")).await;
    assert!(matches!(refused, Err(RunError::RootClosed(_))));
    assert_eq!(c.sends(), 1);
}

pub async fn st_34_root_deadline_bounds_the_run(h: H) {
    let c = client(vec![ScriptedReply::EventsThenHang(vec![E::ProviderRef {
        id: "r".into(),
    }])]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 300).await;
    let started = std::time::Instant::now();
    let view = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    // Bounded by the 300 ms deadline, not the 10 s run timeout (generous for loaded machines).
    assert!(started.elapsed() < std::time::Duration::from_secs(9));
    assert_eq!(view.state, ViewState::ReconciliationRequired);
    h.clock.advance_ms(301);
    let late = runner.run_step(h.step("turn-1", "s2")).await;
    assert!(matches!(late, Err(RunError::RootExpired(_))));
}

pub async fn st_35_only_the_runners_own_interruption_counts(h: H) {
    let c = client(vec![ScriptedReply::EventsThenHang(vec![E::ProviderRef {
        id: "r".into(),
    }])]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let req = h.step("turn-1", "s1");
    let cancel = req.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let aborted = runner.run_step(req).await.unwrap_err();
    assert!(is_step_interruption(&aborted));
    h.faults.arm(FaultPoint::MarkDispatched);
    let store = runner.run_step(h.step("turn-1", "s2")).await.unwrap_err();
    assert!(
        !is_step_interruption(&store),
        "a store failure is not an interruption"
    );
}

pub async fn rf_1_empty_refusal_settles_zero_with_zero_root_receipt(h: H) {
    let c = client(vec![ScriptedReply::Events(vec![
        E::ProviderRef { id: "msg_1".into() },
        E::Stop {
            reason: "refusal".into(),
        },
        E::Usage {
            usage: u(10, 0),
            terminal: true,
        },
        E::Done,
    ])]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let view = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    assert_eq!(view.outcome, Some(Outcome::Refused));
    assert_eq!(view.receipt.unwrap().amount, Money::ZERO);
    assert_eq!(view.root_receipt.unwrap().amount, Money::ZERO);
    assert!(view.output.is_none());
}

pub async fn rf_2_prestream_refusal_completes_unavailable_with_null_stop(h: H) {
    let c = client(vec![ScriptedReply::Events(vec![
        E::ProviderRef { id: "r".into() },
        E::Done,
    ])]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let view = runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    assert_eq!(view.state, ViewState::Completed);
    assert_eq!(view.outcome, Some(Outcome::Unavailable));
    assert_eq!(view.root_receipt.unwrap().amount, Money::ZERO);
    assert!(view.step.is_none_or(|s| s.stop.is_none()));
}

pub async fn st_3_tc_2_forced_tool_must_be_a_registry_tool(h: H) {
    let mut config = step_config();
    config.tool_choice = Some(ToolChoice::Tool {
        name: "delete_everything".into(),
    });
    let c = client(vec![]);
    let r = GovernedStepRunner::new(h.stores.clone(), c.clone(), h.settings(config));
    assert!(matches!(r, Err(RunError::InvalidConfig(_))));
    assert_eq!(c.sends(), 0);
}

pub async fn tc_4_changed_tool_choice_conflicts(h: H) {
    let c = client(vec![tool_reply("{}")]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let mut auto = step_config();
    auto.tool_choice = Some(ToolChoice::Auto);
    let other = h.steps(auto, &c);
    let conflict = other
        .open_root(OpenRoot {
            scope: scope("acme"),
            root_key: rk("turn-1"),
            session_id: SessionId::parse("s-1").unwrap(),
            intent: Intent::parse("plan").unwrap(),
            input_revision: InputRevision::parse("r-1").unwrap(),
            deadline_ms: 60_000,
        })
        .await;
    assert!(
        matches!(conflict, Err(RunError::Conflict { fields, .. }) if fields == ["config.tool_choice"])
    );
}

pub async fn sr_4_derived_ids_are_bound_and_never_embed_the_key(h: H) {
    let _ = h;
    let a = derived_id("root", &scope("acme"), &key("order-secret-123"));
    let b = derived_id("call", &scope("acme"), &key("order-secret-123"));
    let c = derived_id("root", &scope("other"), &key("order-secret-123"));
    assert!(a.starts_with("alma-structured-v1:root:") && b.starts_with("alma-structured-v1:call:"));
    assert_eq!(a.len(), "alma-structured-v1:root:".len() + 64);
    assert_ne!(
        a[a.len() - 64..],
        b[b.len() - 64..],
        "domain-separated by kind"
    );
    assert_ne!(a, c, "bound to scope");
    assert!(!a.contains("order-secret"));
}

pub async fn sr_5_replay_by_immutable_binding_needs_no_clock(h: H) {
    let c = client(vec![tool_reply(r#"{"city":"Paris"}"#)]);
    let runner = h.structured(&c);
    let first = runner.run(h.call("extract-1")).await.unwrap();
    assert_eq!(first.operation_key, key("extract-1"));
    h.clock.advance_ms(10 * 24 * 3600 * 1000);
    let again = runner.run(h.call("extract-1")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.receipt, first.receipt);
    assert_eq!(c.sends(), 1);
    let mut changed = h.call("extract-1");
    changed.input_revision = InputRevision::parse("r-2").unwrap();
    assert!(matches!(
        runner.run(changed).await,
        Err(RunError::Conflict { .. })
    ));
}

pub async fn sr_6_preflight_runs_before_any_root_exists(h: H) {
    let mut config = structured_config();
    config.caps.daily_block = Some(money("0.000001"));
    let c = client(vec![tool_reply("{}")]);
    let runner =
        StructuredCallRunner::new(h.stores.clone(), c.clone(), h.settings(config)).unwrap();
    assert!(matches!(
        runner.run(h.call("x")).await,
        Err(RunError::CapBlocked(_))
    ));
    let root_key = rk(&derived_id("root", &scope("acme"), &key("x")));
    assert!(h
        .stores
        .root(&scope("acme"), &root_key)
        .await
        .unwrap()
        .is_none());
    assert_eq!(c.sends(), 0);
}

pub async fn sr_3_sr_7_tc_1_completed_view_is_the_step_view_and_root_is_closed(h: H) {
    let c = client(vec![tool_reply(r#"{"city":"Paris"}"#)]);
    let runner = h.structured(&c);
    let view = runner.run(h.call("extract-1")).await.unwrap();
    assert_eq!(view.outcome, Some(Outcome::Success));
    let step = view.step.clone().unwrap();
    assert_eq!(step.tool_calls[0].name, "get_weather");
    assert!(view.root_receipt.is_some());
    assert_eq!(
        c.last_request().unwrap().tool_choice,
        Some(ToolChoice::Tool {
            name: "get_weather".into()
        })
    );
    let root = h
        .root(&derived_id("root", &scope("acme"), &key("extract-1")))
        .await;
    assert_eq!(root.state, RootState::Closed);
    let read = runner
        .read(&scope("acme"), &key("extract-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.step, view.step);
}

pub async fn sr_8_failed_close_never_hides_a_completed_result(h: H) {
    h.faults.arm(FaultPoint::CloseRoot);
    let c = client(vec![tool_reply("{}")]);
    let runner = h.structured(&c);
    let view = runner.run(h.call("extract-1")).await.unwrap();
    assert_eq!(view.state, ViewState::Completed);
    let root = h
        .root(&derived_id("root", &scope("acme"), &key("extract-1")))
        .await;
    assert_eq!(
        root.state,
        RootState::Active,
        "unclosed: it expires and is reconciled"
    );
    h.faults.disarm(FaultPoint::CloseRoot);
    h.clock.advance_ms(3_600_000);
    let r = Reconciler::with_roots(h.stores.clone(), h.clock.clone());
    assert_eq!(
        r.reconcile_expired(&scope("acme"), 10, 1000)
            .await
            .unwrap()
            .roots,
        1
    );
    assert_eq!(
        r.reconcile_expired(&scope("acme"), 10, 1000)
            .await
            .unwrap()
            .roots,
        1,
        "expired → reconciled"
    );
    assert_eq!(
        h.root(&derived_id("root", &scope("acme"), &key("extract-1")))
            .await
            .state,
        RootState::Reconciled
    );
}

pub async fn sr_9_sc_32_read_without_record_is_decided_by_the_root(h: H) {
    let c = client(vec![]);
    let runner = h.structured(&c);
    assert!(runner
        .read(&scope("acme"), &key("none"))
        .await
        .unwrap()
        .is_none());
    // A root with no reserved call: active → in_progress; closed → not_dispatched.
    let steps = h.steps(structured_config(), &c);
    let root_key = derived_id("root", &scope("acme"), &key("k"));
    h.open(&steps, &root_key, 60_000).await;
    let v = runner
        .read(&scope("acme"), &key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.state, ViewState::InProgress);
    h.clock.advance_ms(120_000);
    let v = runner
        .read(&scope("acme"), &key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        v.state,
        ViewState::InProgress,
        "an active root reads in_progress whatever the clock"
    );
    steps
        .close_root(&scope("acme"), &rk(&root_key))
        .await
        .unwrap();
    let v = runner
        .read(&scope("acme"), &key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.state, ViewState::NotDispatched);
    assert!(
        v.execution_id.is_none() && v.not_dispatched_cause.is_none(),
        "SC-32"
    );
    // Reserved calls without a journal record: reconciliation_required.
    let root_key2 = derived_id("root", &scope("acme"), &key("k2"));
    h.open(&steps, &root_key2, 60_000).await;
    h.stores
        .reserve_slot(&scope("acme"), &rk(&root_key2), h.clock.now())
        .await
        .unwrap();
    steps
        .close_root(&scope("acme"), &rk(&root_key2))
        .await
        .unwrap();
    let v = runner
        .read(&scope("acme"), &key("k2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.state, ViewState::ReconciliationRequired);
}

pub async fn sr_10_one_key_one_outcome(h: H) {
    let c = client(vec![tool_reply(r#"{"city": "Par"#), tool_reply("{}")]);
    let runner = h.structured(&c);
    let first = runner.run(h.call("extract-1")).await.unwrap();
    let again = runner.run(h.call("extract-1")).await.unwrap();
    assert_eq!(again.step, first.step, "an unusable result is final");
    assert_eq!(c.sends(), 1);
}

pub async fn sr_11_recover_and_reconcile_usage_take_the_host_key(h: H) {
    let c = client(vec![tool_reply("{}"), tool_reply("{}")]);
    let runner = h.structured(&c);
    let a = runner.run(h.call("a")).await.unwrap();
    let b = runner.run(h.call("b")).await.unwrap();
    let r = Reconciler::with_roots(h.stores.clone(), h.clock.clone());
    // Their own evidence was acknowledged by their settlements (H-28): late reports equal to
    // the settlements are what reconciliation acknowledges.
    for view in [&a, &b] {
        r.record_late_evidence(
            &scope("acme"),
            view.execution_id.unwrap(),
            view.receipt.as_ref().unwrap().usage,
            None,
        )
        .await
        .unwrap();
    }
    let counts = runner
        .reconcile_usage(&r, &scope("acme"), &key("a"), None, None)
        .await
        .unwrap();
    assert_eq!(
        (counts.scanned, counts.acknowledged),
        (2, 1),
        "only a's evidence"
    );
    let v = runner
        .recover(&r, &scope("acme"), &key("a"), 1000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.state, ViewState::Completed);
}

/// N concurrent steps under one root with a root block cap: the inclusive cost equals the sum of
/// the receipts and the cap is never overrun.
pub async fn root_with_concurrent_steps_is_never_overrun(h: H) {
    let mut config = step_config();
    let hold = config.worst_case_hold().unwrap();
    let cap = Money::new(hold.decimal() * rust_decimal::Decimal::from(5), "t").unwrap();
    config.caps.root_block = Some(cap);
    let c = client((0..30).map(|_| tool_reply("{}")).collect());
    let runner = Arc::new(h.steps(config, &c));
    h.open(&runner, "turn-1", 60_000).await;
    let mut tasks = Vec::new();
    for i in 0..30 {
        let runner = runner.clone();
        let req = h.step("turn-1", &format!("s{i}"));
        tasks.push(tokio::spawn(async move { runner.run_step(req).await }));
    }
    let mut ok = 0u64;
    for t in tasks {
        match t.await.unwrap() {
            Ok(v) => {
                assert_eq!(v.state, ViewState::Completed);
                ok += 1;
            }
            Err(RunError::CapBlocked(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let root = h.root("turn-1").await;
    assert!(root.charged.checked_add(root.held).unwrap() <= cap);
    let receipts = h
        .stores
        .root_receipts(&scope("acme"), &rk("turn-1"), 100)
        .await
        .unwrap();
    assert_eq!(receipts.len() as u64, ok);
    let sum = receipts
        .iter()
        .fold(Money::ZERO, |a, r| a.checked_add(r.amount).unwrap());
    assert_eq!(sum, root.charged);
    assert_eq!(c.sends(), ok);
    assert!(ok >= 5);
}

pub async fn sr_2_tools_are_validated_and_copied_at_construction(h: H) {
    let c = client(vec![tool_reply("{}")]);
    let mut none = structured_config();
    none.tools.clear();
    none.tool_choice = None;
    assert!(StructuredCallRunner::new(h.stores.clone(), c.clone(), h.settings(none)).is_err());
    let mut dup = structured_config();
    dup.tools.push(weather());
    assert!(StructuredCallRunner::new(h.stores.clone(), c.clone(), h.settings(dup)).is_err());
    let mut config = structured_config();
    let runner =
        StructuredCallRunner::new(h.stores.clone(), c.clone(), h.settings(config.clone())).unwrap();
    config.tools[0].name = "changed_after_construction".into();
    runner.run(h.call("k")).await.unwrap();
    assert_eq!(c.last_request().unwrap().tools[0].name, "get_weather");
}

pub async fn st_31_completed_requires_both_receipts(h: H) {
    let c = client(vec![tool_reply("{}")]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    runner.run_step(h.step("turn-1", "s1")).await.unwrap();
    h.faults.arm(FaultPoint::HideRootReceipt);
    let v = runner
        .read(&scope("acme"), &rk("turn-1"), &key("s1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.state, ViewState::ReconciliationRequired);
    h.faults.disarm(FaultPoint::HideRootReceipt);
    let v = runner
        .read(&scope("acme"), &rk("turn-1"), &key("s1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.state, ViewState::Completed);
}

pub async fn st_32_st_4_recovery_sends_nothing_and_keeps_the_original_snapshot(h: H) {
    let c = client(vec![tool_reply("{}")]);
    // A store that stays down past the retry window (SC-202).
    let runner = h.steps_retrying(step_config(), &c, 300);
    h.open(&runner, "turn-1", 600_000).await;
    h.faults.arm(FaultPoint::Settle);
    assert!(runner.run_step(h.step("turn-1", "s1")).await.is_err());
    h.faults.disarm(FaultPoint::Settle);
    h.clock.advance_ms(30_001);
    let r = Reconciler::with_roots(h.stores.clone(), h.clock.clone());
    let v = runner
        .recover(&r, &scope("acme"), &rk("turn-1"), &key("s1"), 1000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.state, ViewState::Completed);
    assert_eq!(
        v.outcome,
        Some(Outcome::Unavailable),
        "lost output is never regenerated"
    );
    assert_eq!(
        v.receipt.clone().unwrap().amount,
        money("0.00002"),
        "original prices"
    );
    assert_eq!(v.root_receipt.unwrap().amount, money("0.00002"));
    assert_eq!(c.sends(), 1);
}

pub async fn st_1_a_step_takes_a_planned_conversation_with_tool_results(h: H) {
    let c = client(vec![tool_reply("{}")]);
    let runner = h.steps(step_config(), &c);
    h.open(&runner, "turn-1", 60_000).await;
    let mut req = h.step("turn-1", "s2");
    req.load_input = async {
        Ok(serde_json::from_value(serde_json::json!([
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_call", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "call_id": "c1", "content": "18C"}]}
        ]))
        .unwrap())
    }
    .boxed();
    let view = runner.run_step(req).await.unwrap();
    assert_eq!(view.state, ViewState::Completed);
    assert_eq!(c.last_request().unwrap().messages.len(), 3);
}

pub async fn st_2_step_runner_refuses_other_kinds_and_unbounded_limits(h: H) {
    let c = client(vec![]);
    let build = |config: CallConfig| {
        GovernedStepRunner::new(h.stores.clone(), c.clone(), h.settings(config))
    };
    assert!(build(text_config()).is_err(), "a text snapshot");
    let mut slow = step_config();
    slow.run_timeout_ms = 600_001;
    assert!(build(slow).is_err(), "run_timeout_ms above 10 minutes");
    let mut chatty = step_config();
    chatty.max_reasoning_chars = 1_000_001;
    assert!(
        build(chatty).is_err(),
        "max_reasoning_chars above 1,000,000"
    );
    assert!(build(step_config()).is_ok());
}

pub async fn tc_6_only_a_successful_parsed_expected_call_is_an_extraction(h: H) {
    use tollgate_runner::structured::valid_extraction;
    let c = client(vec![
        tool_reply(r#"{"city":"Paris"}"#),
        tool_reply(r#"{"city": "Par"#),
        ScriptedReply::Events(vec![
            E::ProviderRef { id: "r".into() },
            E::ToolCallStart {
                index: 0,
                id: "c".into(),
                name: "get_weather".into(),
            },
            E::ToolCallArgsDelta {
                index: 0,
                delta: "{}".into(),
            },
            E::Stop {
                reason: "max_tokens".into(),
            },
            E::Usage {
                usage: u(1, 1),
                terminal: true,
            },
            E::Done,
        ]),
    ]);
    let runner = h.structured(&c);
    let good = runner.run(h.call("good")).await.unwrap();
    assert_eq!(
        valid_extraction(&good, "get_weather").unwrap().input["city"],
        "Paris"
    );
    assert!(valid_extraction(&good, "other_tool").is_none());
    let malformed = runner.run(h.call("malformed")).await.unwrap();
    assert!(valid_extraction(&malformed, "get_weather").is_none());
    let truncated = runner.run(h.call("truncated")).await.unwrap();
    assert_eq!(truncated.outcome, Some(Outcome::Truncated));
    assert!(valid_extraction(&truncated, "get_weather").is_none());
}
