//! Every mock-provider scenario (spec/mock-provider.md) end to end through the
//! `SingleCallRunner` over real HTTP: a `MockProvider` on 127.0.0.1 port 0, a single-shot
//! `HttpClient`, the in-memory stores, for each protocol where the scenario means something.
//!
//! Each case checks the view's state and outcome, the receipt (exact amounts from the mock's
//! usage rule `ceil(chars / 4)` and the prices 1 / 2 / 0.1 / 1.25 / 2 per million of
//! `text_config()`), the run's `invalid_reason` where one applies, and the mock's request counter:
//! **exactly one request per dispatched call, none for a call refused before the network**.
#![cfg(test)]

use futures::FutureExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tollgate_core::config::{CallConfig, OutputContract};
use tollgate_core::ids::{ConsumerId, InputRevision, Intent, OperationKey, SessionId};
use tollgate_core::invalid::InvalidReason;
use tollgate_core::message::{Message, Role, Temperature};
use tollgate_core::money::Money;
use tollgate_core::state::{CallKind, Outcome, ReconciliationReason};
use tollgate_core::view::{View, ViewState};
use tollgate_mock_provider::MockProvider;
use tollgate_provider::http::{HttpClient, HttpClientConfig};
use tollgate_provider::Protocol;
use tollgate_runner::{ManualClock, RunError};
use tollgate_runner::{RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::{MemoryStores, SettlementStore, SpendStore, Stores, UsageInbox};
use tollgate_testkit::conformance::{scope, t0, text_config};

const ALL: [Protocol; 3] = [
    Protocol::OpenAiChat,
    Protocol::OpenAiResponses,
    Protocol::Anthropic,
];
/// The user message every case sends (15 characters).
const TEXT: &str = "Hello over HTTP";
/// `text_config()`'s system prompt; the mock counts it as input.
const SYSTEM: &str = "Be brief.";
/// The reasoning text of `mock-reasoning` (the mock's documented fixed sentence).
const REASONING: &str = "The user wants their message back. I will repeat it exactly. ";

/// `ceil(chars / 4)`, the mock's token rule.
fn quarter(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

/// Input tokens the mock reports for [`TEXT`] under `text_config()`'s system prompt.
fn input_tokens() -> u64 {
    (SYSTEM.chars().count() as u64 + TEXT.chars().count() as u64)
        .div_ceil(4)
        .max(1)
}

/// The exact amount of `input` tokens at 1 and `output_and_reasoning` tokens at 2 per million.
fn amount(input: u64, output_and_reasoning: u64) -> Money {
    let millionths = input + 2 * output_and_reasoning;
    Money::parse(
        &format!("{}.{:06}", millionths / 1_000_000, millionths % 1_000_000),
        "test",
    )
    .unwrap()
}

fn json_config() -> CallConfig {
    let mut c = text_config();
    c.kind = CallKind::Json;
    c.model = "mock-json".into();
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

fn model(name: &str) -> CallConfig {
    let mut c = text_config();
    c.model = name.into();
    c
}

/// One mock provider and one set of in-memory stores per test, so that counter deltas are
/// this test's own.
struct Rig {
    mock: MockProvider,
    stores: Arc<MemoryStores>,
    clock: Arc<ManualClock>,
}

/// One finished run.
struct Ran {
    protocol: Protocol,
    result: Result<View, RunError>,
    /// Requests the mock received during the run.
    sent: u64,
    elapsed: Duration,
}

impl Ran {
    fn view(&self) -> &View {
        match &self.result {
            Ok(view) => view,
            Err(e) => panic!("{}: expected a view, got {e}", self.protocol),
        }
    }

    /// Completed with `outcome`, sent exactly once.
    fn completed(&self, outcome: Outcome) -> &View {
        let p = self.protocol;
        let view = self.view();
        assert_eq!(self.sent, 1, "{p}: one dispatched call, one request");
        assert_eq!(view.state, ViewState::Completed, "{p}: {view:?}");
        assert_eq!(view.outcome, Some(outcome), "{p}: {view:?}");
        view
    }

    /// The receipt's amount, which must equal `expected`.
    fn charged(&self, expected: &Money) {
        let p = self.protocol;
        let receipt = self.view().receipt.as_ref();
        let receipt = receipt.unwrap_or_else(|| panic!("{p}: completed without a receipt"));
        assert_eq!(&receipt.amount, expected, "{p}: {receipt:?}");
        assert_eq!(receipt.currency.as_str(), "USD");
        assert_eq!(receipt.price_version, "prices-1");
    }

    /// Sent once, cost unknown: reconciliation, no receipt.
    fn unsettled(&self) -> &View {
        let p = self.protocol;
        let view = self.view();
        assert_eq!(self.sent, 1, "{p}: one dispatched call, one request");
        assert_eq!(
            view.state,
            ViewState::ReconciliationRequired,
            "{p}: {view:?}"
        );
        assert_eq!(view.outcome, None, "{p}");
        assert!(view.receipt.is_none(), "{p}: no receipt: {view:?}");
        assert!(view.output.is_none(), "{p}: no output: {view:?}");
        view
    }
}

impl Rig {
    async fn new() -> Self {
        Self {
            mock: MockProvider::start(([127, 0, 0, 1], 0).into())
                .await
                .unwrap(),
            stores: Arc::new(MemoryStores::new()),
            clock: Arc::new(ManualClock::new(t0())),
        }
    }

    fn client(&self, protocol: Protocol) -> Arc<HttpClient> {
        Arc::new(
            HttpClient::new(HttpClientConfig {
                protocol,
                base_url: self.mock.base_url(),
                api_key: Some("test-key".into()),
                connect_timeout_ms: 2_000,
                read_timeout_ms: 10_000,
                max_attempts: 1,
            })
            .unwrap(),
        )
    }

    fn runner(&self, protocol: Protocol, config: CallConfig) -> Result<SingleCallRunner, RunError> {
        let mut settings = RunnerSettings::new(config);
        settings.clock = self.clock.clone();
        let stores: Arc<dyn Stores> = self.stores.clone();
        SingleCallRunner::new(stores, self.client(protocol), settings)
    }

    fn request(key: &str) -> RunRequest {
        RunRequest {
            scope: scope("acme"),
            session_id: SessionId::parse("s-1").unwrap(),
            operation_key: OperationKey::parse(key).unwrap(),
            input_revision: InputRevision::parse("r-1").unwrap(),
            intent: Intent::parse("summarize").unwrap(),
            load_input: async { Ok(vec![Message::text(Role::User, TEXT)]) }.boxed(),
            cancel: CancellationToken::new(),
            limits: Vec::new(),
        }
    }

    /// Runs `key` on a fresh runner for `config`, measuring the mock's counter around it.
    async fn run(&self, protocol: Protocol, config: CallConfig, key: &str) -> Ran {
        let runner = self.runner(protocol, config).unwrap();
        self.run_on(&runner, protocol, key).await
    }

    async fn run_on(&self, runner: &SingleCallRunner, protocol: Protocol, key: &str) -> Ran {
        let before = self.mock.request_count();
        let started = Instant::now();
        let result = runner
            .run(Self::request(&format!("{key}-{protocol}")))
            .await;
        Ran {
            protocol,
            result,
            sent: self.mock.request_count() - before,
            elapsed: started.elapsed(),
        }
    }

    /// Whether the stores hold a settlement for the run's execution.
    async fn settled(&self, ran: &Ran) -> bool {
        let id = ran.view().execution_id.expect("an execution id");
        self.stores.settlement(id).await.unwrap().is_some()
    }

    async fn settlement_count(&self) -> usize {
        let day = t0().date_naive();
        self.stores.settlements(day, day, 1000).await.unwrap().len()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_echo_over_http_succeeds_with_the_echo_and_its_exact_cost() {
    let rig = Rig::new().await;
    for p in ALL {
        let ran = rig.run(p, model("mock-echo"), "echo").await;
        let view = ran.completed(Outcome::Success);
        assert_eq!(view.output.as_ref().unwrap().text.as_deref(), Some(TEXT));
        assert_eq!(view.invalid_reason, None);
        ran.charged(&amount(input_tokens(), quarter(TEXT)));
        let usage = view.receipt.as_ref().unwrap().usage;
        assert_eq!((usage.input, usage.output), (input_tokens(), quarter(TEXT)));
        assert_eq!(usage.cache_read + usage.cache_write + usage.reasoning, 0);
    }
    assert_eq!(rig.settlement_count().await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_4_mock_json_over_http_succeeds_with_schema_valid_json() {
    let rig = Rig::new().await;
    let expected = serde_json::json!({"answer": TEXT, "ok": true});
    for p in ALL {
        let ran = rig.run(p, json_config(), "json").await;
        let view = ran.completed(Outcome::Success);
        let output = view.output.as_ref().unwrap();
        assert_eq!(output.json.as_ref(), Some(&expected), "{p}");
        ran.charged(&amount(input_tokens(), quarter(&expected.to_string())));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_reasoning_over_http_succeeds_and_charges_reasoning() {
    let rig = Rig::new().await;
    for p in ALL {
        let ran = rig.run(p, model("mock-reasoning"), "reasoning").await;
        let view = ran.completed(Outcome::Success);
        assert_eq!(view.output.as_ref().unwrap().text.as_deref(), Some(TEXT));
        let usage = view.receipt.as_ref().unwrap().usage;
        assert_eq!(usage.input, input_tokens(), "{p}");
        assert_eq!(
            usage.output + usage.reasoning,
            quarter(TEXT) + quarter(REASONING),
            "{p}: {usage:?}"
        );
        if p != Protocol::Anthropic {
            // The OpenAI paths report reasoning tokens apart; Anthropic folds thinking into
            // output_tokens (same price here, so the amount is the same).
            assert_eq!(usage.reasoning, quarter(REASONING), "{p}: {usage:?}");
        }
        ran.charged(&amount(input_tokens(), quarter(TEXT) + quarter(REASONING)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st_22_reasoning_loop_over_http_stops_reading_unsettled() {
    let rig = Rig::new().await;
    for p in ALL {
        let mut config = model("mock-reasoning-loop");
        config.max_consecutive_reasoning = Some(20);
        let ran = rig.run(p, config, "loop").await;
        let view = ran.unsettled();
        assert_eq!(
            view.invalid_reason,
            Some(InvalidReason::ReasoningLoop),
            "{p}"
        );
        assert!(!rig.settled(&ran).await, "{p}: loop-abort-unsettled");
        // The runner stopped reading at event 21 (the mock sends one per millisecond, for ten
        // minutes): it returns before the 10 s run timeout (a generous bound for loaded machines).
        assert!(
            ran.elapsed < Duration::from_secs(9),
            "{p}: {:?}",
            ran.elapsed
        );
    }
    // Stopping reading drops the connection: the mock's writers end.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.mock.active_streams() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rig.mock.active_streams(), 0, "the loops were disconnected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_slow_over_http_waits_then_succeeds() {
    let rig = Rig::new().await;
    for p in ALL {
        let ran = rig.run(p, model("mock-slow-300"), "slow").await;
        let view = ran.completed(Outcome::Success);
        assert_eq!(view.output.as_ref().unwrap().text.as_deref(), Some(TEXT));
        assert!(
            ran.elapsed >= Duration::from_millis(300),
            "{p}: {:?}",
            ran.elapsed
        );
        ran.charged(&amount(input_tokens(), quarter(TEXT)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_60_hang_over_http_times_out_into_reconciliation() {
    let rig = Rig::new().await;
    for p in ALL {
        let mut config = model("mock-hang");
        config.run_timeout_ms = 500;
        let ran = rig.run(p, config, "hang").await;
        ran.unsettled();
        assert!(!rig.settled(&ran).await, "{p}");
        assert!(
            ran.elapsed >= Duration::from_millis(500),
            "{p}: {:?}",
            ran.elapsed
        );
        // Bounded by the run timeout, not the mock (which never answers); generous for load.
        assert!(
            ran.elapsed < Duration::from_secs(8),
            "{p}: {:?}",
            ran.elapsed
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st_23_cut_before_usage_over_http_needs_reconciliation() {
    let rig = Rig::new().await;
    for p in ALL {
        let ran = rig
            .run(p, model("mock-cut-before-usage"), "cut-before")
            .await;
        ran.unsettled();
        assert!(!rig.settled(&ran).await, "{p}: no settlement");
    }
    assert_eq!(rig.settlement_count().await, 0);
}

/// ST-23: "the run's view carries `invalidReason`". The runner names a cut after usage
/// `event_type` (the stream ended where the protocol allows no end); a cut before usage is the
/// same defect, but `outcome::decide` hands the collector's own reason (none: a transport
/// failure is a `stream_error`, not a rejection) to the reconciliation path, so the run's view
/// has no `invalid_reason` at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st_23_cut_before_usage_over_http_run_view_carries_invalid_reason() {
    let rig = Rig::new().await;
    for p in ALL {
        let ran = rig
            .run(p, model("mock-cut-before-usage"), "cut-before")
            .await;
        let view = ran.unsettled();
        assert_eq!(view.invalid_reason, Some(InvalidReason::EventType), "{p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st_23_cut_after_usage_over_http_settles_invalid_with_its_cost() {
    let rig = Rig::new().await;
    for p in [Protocol::OpenAiChat, Protocol::Anthropic] {
        let ran = rig.run(p, model("mock-cut-after-usage"), "cut-after").await;
        let view = ran.completed(Outcome::Invalid);
        // Usage arrived, then the stream failed before its stop: `event_type`.
        assert_eq!(view.invalid_reason, Some(InvalidReason::EventType), "{p}");
        assert!(view.output.is_none(), "{p}");
        ran.charged(&amount(input_tokens(), quarter(TEXT)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st_23_cut_after_usage_over_http_on_responses() {
    // On Responses the usage exists only in the terminal `response.completed` event, so the mock
    // sends the whole answer through `response.completed` and cuts in place of the clean end of
    // the body. The reader ends at `response.completed` (the protocol's terminal event) and never
    // sees the cut: the answer is complete and settles as a success with its cost.
    let rig = Rig::new().await;
    let p = Protocol::OpenAiResponses;
    let ran = rig.run(p, model("mock-cut-after-usage"), "cut-after").await;
    let view = ran.completed(Outcome::Success);
    assert_eq!(view.output.as_ref().unwrap().text.as_deref(), Some(TEXT));
    ran.charged(&amount(input_tokens(), quarter(TEXT)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rf_2_prestream_refusal_over_http_settles_zero() {
    let rig = Rig::new().await;
    for p in [Protocol::OpenAiChat, Protocol::Anthropic] {
        let ran = rig
            .run(p, model("mock-refuse-prestream"), "prestream")
            .await;
        let view = ran.completed(Outcome::Unavailable);
        assert!(view.output.is_none(), "{p}");
        ran.charged(&Money::ZERO);
        assert!(view.receipt.as_ref().unwrap().usage.is_zero(), "{p}");
        assert!(
            rig.settled(&ran).await,
            "{p}: the zero settlement is written"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rf_2_prestream_refusal_over_http_on_responses() {
    // The Responses mock has no stop-less shape: it sends `response.created`, then
    // `response.completed` (a stop) with `output: []` and all-zero usage. A stop means it is no
    // pre-stream proof (RF-2); the exact zero usage settles it at zero all the same.
    let rig = Rig::new().await;
    let p = Protocol::OpenAiResponses;
    let ran = rig
        .run(p, model("mock-refuse-prestream"), "prestream")
        .await;
    let view = ran.completed(Outcome::Success);
    assert_eq!(view.output.as_ref().unwrap().text.as_deref(), Some(""));
    ran.charged(&Money::ZERO);
    assert!(view.receipt.as_ref().unwrap().usage.is_zero());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rf_1_empty_refusal_over_http_on_anthropic_settles_zero() {
    let rig = Rig::new().await;
    let p = Protocol::Anthropic;
    let ran = rig
        .run(p, model("mock-empty-refusal"), "empty-refusal")
        .await;
    let view = ran.completed(Outcome::Refused);
    assert!(view.output.is_none());
    ran.charged(&Money::ZERO);
    assert!(rig.settled(&ran).await, "the zero settlement is written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_filter_refusal_over_http_on_openai_settles_refused_with_its_cost() {
    // Not RF-1 (Anthropic only): the OpenAI paths report `content_filter` with the input
    // tokens, so the refusal is settled with that known cost.
    let rig = Rig::new().await;
    for p in [Protocol::OpenAiChat, Protocol::OpenAiResponses] {
        let ran = rig
            .run(p, model("mock-empty-refusal"), "empty-refusal")
            .await;
        let view = ran.completed(Outcome::Refused);
        assert!(view.output.is_none(), "{p}");
        ran.charged(&amount(input_tokens(), 0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_96_provider_rejection_over_http_settles_unavailable_at_zero() {
    let rig = Rig::new().await;
    for p in ALL {
        let ran = rig.run(p, model("mock-429"), "mock-429").await;
        let view = ran.completed(Outcome::Unavailable);
        assert!(view.output.is_none(), "{p}");
        assert_eq!(view.reconciliation_reason, None, "{p}");
        ran.charged(&Money::ZERO);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_96_gateway_and_server_errors_over_http_go_to_operators_holding() {
    let rig = Rig::new().await;
    for name in ["mock-502-gateway", "mock-500"] {
        for p in ALL {
            let key = format!("{name}-{p}");
            let ran = rig.run(p, model(name), &key).await;
            let view = ran.unsettled();
            assert_eq!(
                view.reconciliation_reason,
                Some(ReconciliationReason::AmbiguousStatus),
                "{p} {name}"
            );
            assert!(!rig.settled(&ran).await, "{p} {name}: no settlement");
            let evidence = rig.stores.evidence_for(view.execution_id.unwrap()).await;
            let evidence = evidence.unwrap();
            assert_eq!(evidence.len(), 1, "{p} {name}: the request id as evidence");
            assert!(!evidence[0].exact, "{p} {name}");
            assert!(evidence[0].provider_ref.is_some(), "{p} {name}");
        }
    }
    // Every hold is kept: six calls, each the worst case of its request, to which the dispatch
    // mark shrank it (SC-122).
    let daily = rig
        .stores
        .daily_spend(
            &scope("acme"),
            &ConsumerId::parse("team-a").unwrap(),
            t0().date_naive(),
            &tollgate_core::money::Currency::parse("USD").unwrap(),
        )
        .await
        .unwrap();
    let input = [Message::text(Role::User, TEXT)];
    let hold = tollgate_core::hold::fitted_hold(&text_config(), &input).unwrap();
    assert_eq!(daily.settled, Money::ZERO);
    let six = (1..6).fold(hold, |sum, _| sum.checked_add(hold).unwrap());
    assert_eq!(daily.held, six);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_big_over_http_succeeds_with_every_character() {
    let rig = Rig::new().await;
    for p in ALL {
        let mut config = model("mock-big@5000");
        config.max_output_chars = 10_000;
        let ran = rig.run(p, config, "big").await;
        let view = ran.completed(Outcome::Success);
        let text = view.output.as_ref().unwrap().text.as_deref().unwrap();
        assert_eq!(text.chars().count(), 5000, "{p}");
        ran.charged(&amount(input_tokens(), 5000 / 4));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st_24_output_cap_over_http_reads_to_the_end_and_settles_invalid_with_its_cost() {
    let rig = Rig::new().await;
    for p in ALL {
        let mut config = model("mock-big@5000");
        config.max_output_chars = 100;
        let ran = rig.run(p, config, "big-capped").await;
        let view = ran.completed(Outcome::Invalid);
        assert_eq!(view.invalid_reason, Some(InvalidReason::OutputChars), "{p}");
        assert!(view.output.is_none(), "{p}");
        ran.charged(&amount(input_tokens(), 5000 / 4));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_13_replay_over_http_sends_nothing() {
    let rig = Rig::new().await;
    for p in ALL {
        let runner = rig.runner(p, model("mock-echo")).unwrap();
        let first = rig.run_on(&runner, p, "replay").await;
        first.completed(Outcome::Success);
        let again = rig.run_on(&runner, p, "replay").await;
        assert_eq!(again.sent, 0, "{p}: a replay never sends");
        let (a, b) = (first.view(), again.view());
        assert!(b.replayed && !a.replayed, "{p}");
        assert_eq!(b.receipt, a.receipt, "{p}");
        assert_eq!(b.output, a.output, "{p}");
        assert_eq!(b.execution_id, a.execution_id, "{p}");
    }
    assert_eq!(rig.mock.request_count(), 3);
    assert_eq!(rig.settlement_count().await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_5_temperature_outside_the_matrix_fails_construction_before_any_request() {
    let rig = Rig::new().await;
    for p in ALL {
        let mut config = model("mock-echo");
        config.temperature = Some(Temperature::parse("5").unwrap());
        match rig.runner(p, config) {
            Err(RunError::InvalidConfig(reason)) => {
                assert!(reason.contains("temperature"), "{p}: {reason}");
            }
            Err(other) => panic!("{p}: expected invalid config, got {other}"),
            Ok(_) => panic!("{p}: a temperature of 5 was accepted"),
        }
    }
    assert_eq!(rig.mock.request_count(), 0);
    assert_eq!(rig.settlement_count().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_calls_over_http_send_and_settle_once_each() {
    let rig = Rig::new().await;
    let runner = Arc::new(
        rig.runner(Protocol::OpenAiChat, model("mock-echo"))
            .unwrap(),
    );
    let runs = (0..20).map(|i| {
        let runner = runner.clone();
        tokio::spawn(async move { runner.run(Rig::request(&format!("concurrent-{i}"))).await })
    });
    for joined in futures::future::join_all(runs).await {
        let view = joined.unwrap().unwrap();
        assert_eq!(view.state, ViewState::Completed);
        assert_eq!(view.outcome, Some(Outcome::Success));
        assert_eq!(
            view.receipt.unwrap().amount,
            amount(input_tokens(), quarter(TEXT))
        );
    }
    assert_eq!(rig.mock.request_count(), 20);
    assert_eq!(rig.settlement_count().await, 20);
}
