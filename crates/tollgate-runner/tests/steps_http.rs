//! The governed step runner and the structured runner end to end over real HTTP against the mock
//! provider, for each protocol: tool calls (valid and malformed), a reasoning loop, cut streams,
//! refusal proofs. The mock's request counter proves one send per dispatched step.
#![cfg(test)]

use futures::FutureExt;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tollgate_core::config::CallConfig;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, RootKey, SessionId};
use tollgate_core::invalid::InvalidReason;
use tollgate_core::message::{Message, Role, ToolChoice, ToolSpec};
use tollgate_core::money::Money;
use tollgate_core::state::{CallKind, Outcome};
use tollgate_core::view::{View, ViewState};
use tollgate_mock_provider::MockProvider;
use tollgate_provider::http::{HttpClient, HttpClientConfig};
use tollgate_provider::Protocol;
use tollgate_runner::step::{GovernedStepRunner, OpenRoot, StepRequest};
use tollgate_runner::structured::StructuredCallRunner;
use tollgate_runner::{RunRequest, RunnerSettings};
use tollgate_store::{AllStores, MemoryStores};
use tollgate_testkit::conformance::{scope, text_config};

const ALL: [Protocol; 3] = [
    Protocol::OpenAiChat,
    Protocol::OpenAiResponses,
    Protocol::Anthropic,
];

fn tool() -> ToolSpec {
    ToolSpec {
        name: "extract_record".into(),
        description: "Extract the record".into(),
        input_schema: serde_json::json!({
            "type": "object",
            "required": ["city"],
            "properties": {"city": {"type": "string"}}
        }),
    }
}

fn config(model: &str, kind: CallKind) -> CallConfig {
    let mut c = text_config();
    c.kind = kind;
    c.model = model.into();
    c.tools = vec![tool()];
    c.max_consecutive_reasoning = Some(20);
    c
}

struct Rig {
    mock: MockProvider,
    stores: Arc<dyn AllStores>,
}

impl Rig {
    async fn new() -> Self {
        Self {
            mock: MockProvider::start(([127, 0, 0, 1], 0).into())
                .await
                .unwrap(),
            stores: Arc::new(MemoryStores::new()),
        }
    }

    fn client(&self, protocol: Protocol) -> Arc<HttpClient> {
        Arc::new(
            HttpClient::new(HttpClientConfig {
                protocol,
                base_url: self.mock.base_url(),
                api_key: None,
                connect_timeout_ms: 2_000,
                read_timeout_ms: 10_000,
                max_attempts: 1,
            })
            .unwrap(),
        )
    }

    async fn step(&self, protocol: Protocol, model: &str, key: &str) -> View {
        let runner = GovernedStepRunner::new(
            self.stores.clone(),
            self.client(protocol),
            RunnerSettings::new(config(model, CallKind::Step)),
        )
        .unwrap();
        let root = RootKey::parse(format!("turn-{key}")).unwrap();
        runner
            .open_root(OpenRoot {
                scope: scope("acme"),
                root_key: root.clone(),
                session_id: SessionId::parse("s").unwrap(),
                intent: Intent::parse("plan").unwrap(),
                input_revision: InputRevision::parse("r").unwrap(),
                deadline_ms: 60_000,
            })
            .await
            .unwrap();
        runner
            .run_step(StepRequest {
                scope: scope("acme"),
                root_key: root,
                operation_key: OperationKey::parse(key).unwrap(),
                load_input: async { Ok(vec![Message::text(Role::User, "Paris, please")]) }.boxed(),
                cancel: CancellationToken::new(),
                limits: Vec::new(),
            })
            .await
            .unwrap()
    }
}

fn both_receipts(view: &View) -> (Money, Money) {
    (
        view.receipt.as_ref().unwrap().amount,
        view.root_receipt.as_ref().unwrap().amount,
    )
}

#[tokio::test]
async fn st_8_tc_1_mock_tool_over_http_yields_one_valid_tool_call() {
    let rig = Rig::new().await;
    for (i, protocol) in ALL.into_iter().enumerate() {
        let view = rig.step(protocol, "mock-tool", &format!("tool-{i}")).await;
        assert_eq!(view.state, ViewState::Completed, "{protocol}");
        assert_eq!(view.outcome, Some(Outcome::Success), "{protocol}");
        let step = view.step.clone().unwrap();
        assert_eq!(step.tool_calls.len(), 1, "{protocol}");
        assert_eq!(step.tool_calls[0].name, "extract_record");
        assert!(!step.tool_calls[0].malformed);
        assert!(step.tool_calls[0].input.get("city").is_some(), "{protocol}");
        let (charge, root) = both_receipts(&view);
        assert!(charge > Money::ZERO);
        assert_eq!(charge, root, "ST-6: one charge, one equal root receipt");
        assert_eq!(rig.mock.request_count(), i as u64 + 1);
    }
}

#[tokio::test]
async fn st_9_mock_tool_malformed_over_http_is_flagged_with_empty_input() {
    let rig = Rig::new().await;
    for (i, protocol) in ALL.into_iter().enumerate() {
        let view = rig
            .step(protocol, "mock-tool-malformed", &format!("bad-{i}"))
            .await;
        let step = view.step.clone().unwrap();
        let call = &step.tool_calls[0];
        assert!(call.malformed, "{protocol}");
        assert_eq!(call.input, serde_json::json!({}));
        let text = serde_json::to_string(&view).unwrap();
        assert!(
            !text.contains("unterminated"),
            "{protocol}: raw arguments never kept"
        );
        assert!(view.root_receipt.is_some());
    }
    assert_eq!(rig.mock.request_count(), 3);
}

#[tokio::test]
async fn st_22_mock_reasoning_loop_over_http_is_unsettled_on_both_receipts() {
    let rig = Rig::new().await;
    for (i, protocol) in ALL.into_iter().enumerate() {
        let view = rig
            .step(protocol, "mock-reasoning-loop", &format!("loop-{i}"))
            .await;
        assert_eq!(view.state, ViewState::ReconciliationRequired, "{protocol}");
        assert_eq!(view.invalid_reason, Some(InvalidReason::ReasoningLoop));
        assert!(view.receipt.is_none() && view.root_receipt.is_none());
    }
    assert_eq!(rig.mock.request_count(), 3);
}

#[tokio::test]
async fn st_23_mock_cuts_over_http_on_the_step_runner() {
    let rig = Rig::new().await;
    for (i, protocol) in [Protocol::OpenAiChat, Protocol::Anthropic]
        .into_iter()
        .enumerate()
    {
        let before = rig
            .step(protocol, "mock-cut-before-usage", &format!("cb-{i}"))
            .await;
        assert_eq!(
            before.state,
            ViewState::ReconciliationRequired,
            "{protocol}"
        );
        assert!(before.receipt.is_none() && before.root_receipt.is_none());
        let after = rig
            .step(protocol, "mock-cut-after-usage", &format!("ca-{i}"))
            .await;
        assert_eq!(after.outcome, Some(Outcome::Invalid), "{protocol}");
        let (charge, root) = both_receipts(&after);
        assert!(charge > Money::ZERO && charge == root);
    }
    assert_eq!(rig.mock.request_count(), 4);
}

#[tokio::test]
async fn rf_1_rf_2_refusal_proofs_over_http_settle_zero_on_both_receipts() {
    let rig = Rig::new().await;
    let pre = rig
        .step(Protocol::OpenAiChat, "mock-refuse-prestream", "pre-chat")
        .await;
    assert_eq!(pre.outcome, Some(Outcome::Unavailable));
    assert!(
        pre.step.as_ref().is_none_or(|s| s.stop.is_none()),
        "stop: null"
    );
    assert_eq!(both_receipts(&pre), (Money::ZERO, Money::ZERO));
    let pre = rig
        .step(
            Protocol::Anthropic,
            "mock-refuse-prestream",
            "pre-anthropic",
        )
        .await;
    assert_eq!(pre.outcome, Some(Outcome::Unavailable));
    assert_eq!(both_receipts(&pre), (Money::ZERO, Money::ZERO));
    let empty = rig
        .step(Protocol::Anthropic, "mock-empty-refusal", "empty")
        .await;
    assert_eq!(empty.outcome, Some(Outcome::Refused));
    assert_eq!(both_receipts(&empty), (Money::ZERO, Money::ZERO));
    assert!(empty.output.is_none());
    assert_eq!(rig.mock.request_count(), 3);
}

#[tokio::test]
async fn sr_1_tc_1_tc_3_structured_call_over_http_forces_the_tool_never_executes_it_and_replays() {
    let rig = Rig::new().await;
    for (i, protocol) in ALL.into_iter().enumerate() {
        let mut c = config("mock-tool", CallKind::Structured);
        c.tool_choice = Some(ToolChoice::Tool {
            name: "extract_record".into(),
        });
        let runner = StructuredCallRunner::new(
            rig.stores.clone(),
            rig.client(protocol),
            RunnerSettings::new(c),
        )
        .unwrap();
        let request = || RunRequest {
            scope: scope("acme"),
            session_id: SessionId::parse("s").unwrap(),
            operation_key: OperationKey::parse(format!("extract-{i}")).unwrap(),
            input_revision: InputRevision::parse("r").unwrap(),
            intent: Intent::parse("extract").unwrap(),
            load_input: async { Ok(vec![Message::text(Role::User, "Paris")]) }.boxed(),
            cancel: CancellationToken::new(),
            limits: Vec::new(),
        };
        let view = runner.run(request()).await.unwrap();
        assert_eq!(view.outcome, Some(Outcome::Success), "{protocol}");
        let call = &view.step.as_ref().unwrap().tool_calls[0];
        assert_eq!(
            (call.name.as_str(), call.malformed),
            ("extract_record", false)
        );
        let again = runner.run(request()).await.unwrap();
        assert!(again.replayed);
        assert_eq!(
            rig.mock.request_count(),
            i as u64 + 1,
            "{protocol}: one send"
        );
    }
}

/// Every runner's future can be spawned on a multi-threaded runtime (an HTTP handler does).
#[test]
fn every_run_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let stores: Arc<dyn AllStores> = Arc::new(MemoryStores::new());
    let client = Arc::new(
        HttpClient::new(HttpClientConfig {
            protocol: Protocol::OpenAiChat,
            base_url: "http://127.0.0.1:9".into(),
            api_key: None,
            connect_timeout_ms: 100,
            read_timeout_ms: 100,
            max_attempts: 1,
        })
        .unwrap(),
    );
    let mut c = config("mock-tool", CallKind::Structured);
    c.tool_choice = None;
    let runner = StructuredCallRunner::new(stores, client, RunnerSettings::new(c)).unwrap();
    let request = RunRequest {
        scope: scope("acme"),
        session_id: SessionId::parse("s").unwrap(),
        operation_key: OperationKey::parse("k").unwrap(),
        input_revision: InputRevision::parse("r").unwrap(),
        intent: Intent::parse("extract").unwrap(),
        load_input: async { Ok(vec![Message::text(Role::User, "x")]) }.boxed(),
        cancel: CancellationToken::new(),
        limits: Vec::new(),
    };
    let future = runner.run(request);
    assert_send(&future);
}
