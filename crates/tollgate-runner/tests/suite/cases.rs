//! The cases. Each names the requirement it shows.

pub use super::races::*;
use super::*;
use tollgate_core::event::ProviderEvent as E;
use tollgate_core::message::Temperature;
use tollgate_core::state::ExecutionState;
use tollgate_core::state::{NotDispatchedCause, Outcome, ReconciliationReason};
use tollgate_core::view::ViewState;
use tollgate_provider::client::{ClientDescriptor, SendError};
use tollgate_provider::Protocol;
use tollgate_provider::StatusClass;
use tollgate_runner::Clock as _;
use tollgate_runner::RunError;
use tollgate_store::fault::FaultPoint;

/// The hold a text call of `text` keeps once dispatched: its own worst case (SC-122).
fn fitted_hold_of(text: &str) -> Money {
    tollgate_core::hold::fitted_hold(&text_config(), &[Message::text(Role::User, text)]).unwrap()
}

fn key(s: &str) -> OperationKey {
    OperationKey::parse(s).unwrap()
}

pub async fn sc_12_claim_happens_before_input_is_loaded(h: Harness) {
    let c = client(vec![ok_reply("hi")]);
    let runner = h.runner(text_config(), &c);
    let stores = h.stores.clone();
    let mut req = h.request("k1", "hello");
    req.load_input = async move {
        let row = stores.execution(&scope("acme"), &key("k1")).await.unwrap();
        assert_eq!(row.map(|r| r.state), Some(ExecutionState::Prepared));
        Ok(vec![Message::text(Role::User, "hello")])
    }
    .boxed();
    let view = runner.run(req).await.unwrap();
    assert_eq!(view.state, ViewState::Completed);
    assert_eq!(view.outcome, Some(Outcome::Success));
    assert_eq!(view.output.unwrap().text.as_deref(), Some("hi"));
    let receipt = view.receipt.unwrap();
    assert_eq!(receipt.amount, m("0.00002"));
    assert_eq!(receipt.usage, usage(10, 5));
    assert_eq!(c.sends(), 1);
    let d = h.daily().await;
    assert_eq!((d.settled, d.held), (m("0.00002"), Money::ZERO));
}

pub async fn sc_13_h_2_replay_loads_nothing_and_sends_nothing(h: Harness) {
    let c = client(vec![ok_reply("first")]);
    let runner = h.runner(text_config(), &c);
    let first = runner.run(h.request("k1", "x")).await.unwrap();
    let second = runner.run(h.request("k1", "x")).await.unwrap();
    assert!(second.replayed && !first.replayed);
    assert_eq!(second.receipt, first.receipt);
    assert_eq!(second.output, first.output);
    assert_eq!(second.execution_id, first.execution_id);
    assert_eq!((c.sends(), h.loads()), (1, 1));
}

pub async fn sc_13_replay_racing_the_first_call_never_sends_twice(h: Harness) {
    let c = client(vec![ScriptedReply::Delayed {
        delay_ms: 300,
        events: match ok_reply("slow") {
            ScriptedReply::Events(e) => e,
            _ => unreachable!(),
        },
    }]);
    let runner = Arc::new(h.runner(text_config(), &c));
    let first = tokio::spawn({
        let runner = runner.clone();
        let req = h.request("race", "x");
        async move { runner.run(req).await }
    });
    // The first call has claimed and sent (its reply is held for 300 ms): the racing call finds
    // the claim in flight.
    until_sent(&c, 1).await;
    let racing = runner.run(h.request("race", "x")).await.unwrap();
    assert!(racing.replayed);
    assert_eq!(racing.state, ViewState::InProgress);
    let done = first.await.unwrap().unwrap();
    assert_eq!(done.state, ViewState::Completed);
    let after = runner.run(h.request("race", "x")).await.unwrap();
    assert_eq!(after.receipt, done.receipt);
    assert_eq!(c.sends(), 1);
    let day = t0().date_naive();
    assert_eq!(h.stores.settlements(day, day, 10).await.unwrap().len(), 1);
}

pub async fn sc_14_changed_binding_conflicts_naming_fields(h: Harness) {
    let c = client(vec![ok_reply("a")]);
    h.runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    let mut changed = text_config();
    changed.temperature = Some(Temperature::parse("0.3").unwrap());
    changed.price_version = VersionId::parse("prices-2").unwrap();
    let mut req = h.request("k1", "x");
    req.session_id = SessionId::parse("s-2").unwrap();
    match h.runner(changed, &c).run(req).await {
        Err(RunError::Conflict { fields, .. }) => assert_eq!(
            fields,
            ["session_id", "config.price_version", "config.temperature"]
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!((c.sends(), h.loads()), (1, 1));
}

pub async fn sc_15_warning_keeps_output(h: Harness) {
    let mut config = text_config();
    config.caps.daily_warn = Some(m("0.00001"));
    let c = client(vec![ok_reply("kept")]);
    let view = h
        .runner(config, &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    assert_eq!(view.outcome, Some(Outcome::Success));
    assert_eq!(view.output.unwrap().text.as_deref(), Some("kept"));
    assert_eq!(view.warnings.len(), 1);
    assert_eq!(view.warnings[0].spent, m("0.00002"));
}

pub async fn sc_16_preflight_block_writes_nothing_and_sends_nothing(h: Harness) {
    let mut config = text_config();
    config.caps.session_block = Some(m("0.001"));
    let c = client(vec![ok_reply("never")]);
    match h.runner(config, &c).run(h.request("k1", "x")).await {
        Err(RunError::CapBlocked(b)) => assert_eq!(b.limit, m("0.001")),
        other => panic!("{other:?}"),
    }
    assert_eq!((c.sends(), h.loads()), (0, 0));
    assert!(h
        .stores
        .execution(&scope("acme"), &key("k1"))
        .await
        .unwrap()
        .is_none());
}

pub async fn sc_16_post_call_block_settles_known_cost_then_suppresses(h: Harness) {
    let mut config = text_config();
    // Hold is 0.00654375; the provider overruns it with 10,000 output tokens (0.02).
    config.caps.daily_block = Some(m("0.01"));
    let c = client(vec![ScriptedReply::text("too much", usage(10, 10_000))]);
    let view = h
        .runner(config, &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    assert_eq!(view.state, ViewState::Completed);
    assert_eq!(view.outcome, Some(Outcome::Blocked));
    assert!(view.output.is_none());
    assert_eq!(view.receipt.unwrap().amount, m("0.02001"));
    assert_eq!(h.daily().await.settled, m("0.02001"));
}

pub async fn sc_17_dispatch_mark_failure_sends_nothing(h: Harness) {
    h.faults.arm(FaultPoint::MarkDispatched);
    let c = client(vec![ok_reply("never")]);
    let err = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Store { .. }) && !err.is_interruption());
    assert_eq!(c.sends(), 0);
    let row = h
        .stores
        .execution(&scope("acme"), &key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.not_dispatched_cause, Some(NotDispatchedCause::Store));
    assert_eq!(h.daily().await.held, Money::ZERO);
}

pub async fn sc_17_settle_failure_rejects_and_recovery_settles_without_resend(h: Harness) {
    h.faults.arm(FaultPoint::Settle);
    let c = client(vec![ok_reply("lost")]);
    // A store that stays down past the retry window (SC-202).
    let runner = h.runner_retrying(text_config(), &c, 300);
    let err = runner.run(h.request("k1", "x")).await.unwrap_err();
    assert!(matches!(err, RunError::Store { .. }));
    h.faults.disarm(FaultPoint::Settle);
    // The journal tells what happened: dispatched, with evidence in the inbox.
    let view = runner
        .read(&scope("acme"), &key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.state, ViewState::InProgress);
    // A replay does not resend either.
    assert!(runner.run(h.request("k1", "x")).await.unwrap().replayed);
    h.clock.advance_ms(30_001);
    let recovered = h
        .reconciler()
        .recover(&scope("acme"), &key("k1"), 10_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recovered.state, ViewState::Completed);
    assert_eq!(recovered.outcome, Some(Outcome::Unavailable));
    assert_eq!(recovered.receipt.unwrap().amount, m("0.00002"));
    assert_eq!((c.sends(), h.loads()), (1, 1));
    let settled = h
        .stores
        .settlement(recovered.execution_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(settled.source.as_str(), "recovery");
}

pub async fn sc_17_h_1_lost_settle_acknowledgement_is_read_back(h: Harness) {
    h.faults.arm(FaultPoint::SettleAfterCommit);
    let c = client(vec![ok_reply("done")]);
    let runner = h.runner(text_config(), &c);
    // The retry is refused (the row is completed) and finds the settlement under its own fence
    // (SC-202): the call answers what was committed.
    let answered = runner.run(h.request("k1", "x")).await.unwrap();
    assert_eq!(answered.outcome, Some(Outcome::Success));
    assert_eq!(answered.output.unwrap().text.as_deref(), Some("done"));
    h.faults.disarm(FaultPoint::SettleAfterCommit);
    let view = runner
        .read(&scope("acme"), &key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.outcome, Some(Outcome::Success));
    assert_eq!(c.sends(), 1);
}

pub async fn sc_202_a_settlement_outlives_a_store_outage_shorter_than_its_retries(h: Harness) {
    h.faults.arm(FaultPoint::Settle);
    h.faults.arm(FaultPoint::RecordEvidence);
    let c = client(vec![ok_reply("kept")]);
    let runner = h.runner(text_config(), &c);
    let faults = h.faults.clone();
    let outage = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        faults.disarm(FaultPoint::Settle);
        faults.disarm(FaultPoint::RecordEvidence);
    });
    let view = runner.run(h.request("k1", "x")).await.unwrap();
    outage.await.unwrap();
    // The output and the usage the provider answered were kept through the outage: one send,
    // one settlement from the stream, the output stored.
    assert_eq!(view.state, ViewState::Completed);
    assert_eq!(view.outcome, Some(Outcome::Success));
    assert_eq!(view.output.unwrap().text.as_deref(), Some("kept"));
    assert_eq!(c.sends(), 1);
    let id = view.execution_id.unwrap();
    let settled = h.stores.settlement(id).await.unwrap().unwrap();
    assert_eq!(
        settled.source,
        tollgate_core::state::SettlementSource::Stream
    );
    assert!(h.faults.calls()[&tollgate_store::fault::StoreOp::Settle] >= 2);
}

pub async fn sc_207_a_settlement_above_the_hold_is_told_to_the_settling_run(h: Harness) {
    // The provider bills more output than the profile's `max_tokens` (100): the hold, the cost
    // of the worst case, is no bound of it.
    let c = client(vec![ScriptedReply::text("long", usage(10, 5_000))]);
    let runner = h.runner(text_config(), &c);
    let view = runner.run(h.request("k1", "x")).await.unwrap();
    assert_eq!(view.state, ViewState::Completed);
    assert!(
        view.above_hold,
        "the settling run is told the charge is above its hold"
    );
    // A replay reads the rows: the flag belongs to the settling run's answer only.
    let replayed = runner.run(h.request("k1", "x")).await.unwrap();
    assert!(replayed.replayed && !replayed.above_hold);
    // An ordinary call is within its hold.
    let c = client(vec![ok_reply("fine")]);
    let within = h
        .runner(text_config(), &c)
        .run(h.request("k2", "x"))
        .await
        .unwrap();
    assert!(!within.above_hold);
}

pub async fn sc_20_read_reports_each_state(h: Harness) {
    let c = client(vec![
        ok_reply("a"),
        ScriptedReply::Events(events_without_usage("cut")),
    ]);
    let runner = h.runner(text_config(), &c);
    assert!(runner
        .read(&scope("acme"), &key("none"))
        .await
        .unwrap()
        .is_none());
    runner.run(h.request("done", "x")).await.unwrap();
    runner.run(h.request("cut", "x")).await.unwrap();
    let mut bad = h.request("bad", "x");
    bad.load_input = async { Err("loader failed".to_string()) }.boxed();
    runner.run(bad).await.unwrap();
    let state = |k: &'static str| {
        let runner = &runner;
        async move {
            runner
                .read(&scope("acme"), &key(k))
                .await
                .unwrap()
                .unwrap()
                .state
        }
    };
    assert_eq!(state("done").await, ViewState::Completed);
    assert_eq!(state("cut").await, ViewState::ReconciliationRequired);
    assert_eq!(state("bad").await, ViewState::NotDispatched);
}

pub async fn sc_21_completed_read_has_original_receipt_and_no_invalid_reason(h: Harness) {
    let mut config = text_config();
    config.max_output_chars = 3;
    let c = client(vec![ScriptedReply::text("too long", usage(10, 5))]);
    let runner = h.runner(config, &c);
    let run = runner.run(h.request("k1", "x")).await.unwrap();
    assert_eq!(run.outcome, Some(Outcome::Invalid));
    assert_eq!(run.invalid_reason.map(|r| r.as_str()), Some("output_chars"));
    assert!(run.output.is_none());
    let read = runner
        .read(&scope("acme"), &key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.invalid_reason, None, "ST-20: never on reads");
    assert_eq!(read.receipt, run.receipt);
    assert_eq!(read.receipt.unwrap().amount, m("0.00002"));
}

pub async fn sc_22_erased_or_expired_output_is_unavailable(h: Harness) {
    let c = client(vec![ok_reply("a"), ok_reply("b")]);
    let runner = h.runner(text_config(), &c);
    let v = runner.run(h.request("k1", "x")).await.unwrap();
    runner.run(h.request("k2", "x")).await.unwrap();
    h.stores
        .erase(&scope("acme"), v.execution_id.unwrap(), h.clock.now())
        .await
        .unwrap();
    let erased = runner
        .read(&scope("acme"), &key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(erased.state, ViewState::Completed);
    assert_eq!(erased.outcome, Some(Outcome::Unavailable));
    assert!(erased.output.is_none());
    assert!(erased.receipt.is_some(), "the receipt outlives the content");
    h.clock.advance_ms(3_600_001);
    let expired = runner
        .read(&scope("acme"), &key("k2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(expired.outcome, Some(Outcome::Unavailable));
    assert!(expired.output.is_none());
}

pub async fn sc_30_not_dispatched_causes(h: Harness) {
    let c = client(vec![]);
    let runner = h.runner(text_config(), &c);
    let mut failing = h.request("input", "x");
    failing.load_input = async { Err("boom".to_string()) }.boxed();
    let v = runner.run(failing).await.unwrap();
    assert_eq!(v.not_dispatched_cause, Some(NotDispatchedCause::Input));
    let v = runner
        .run(h.request("invalid", &"x".repeat(1001)))
        .await
        .unwrap();
    assert_eq!(v.not_dispatched_cause, Some(NotDispatchedCause::Invalid));
    let aborted = h.request("aborted", "x");
    aborted.cancel.cancel();
    let v = runner.run(aborted).await.unwrap();
    assert_eq!(v.not_dispatched_cause, Some(NotDispatchedCause::Aborted));
    assert_eq!(c.sends(), 0);
    assert_eq!(h.daily().await.held, Money::ZERO, "holds released");
}

pub async fn sc_11_only_text_user_assistant_messages(h: Harness) {
    let c = client(vec![]);
    let runner = h.runner(text_config(), &c);
    let mut req = h.request("k1", "x");
    req.load_input = async {
        Ok(vec![serde_json::from_value(serde_json::json!({
            "role": "user",
            "content": [{"type": "tool_result", "call_id": "c", "content": "r"}]
        }))
        .unwrap()])
    }
    .boxed();
    let v = runner.run(req).await.unwrap();
    assert_eq!(v.not_dispatched_cause, Some(NotDispatchedCause::Invalid));
    assert_eq!(c.sends(), 0);
}

pub async fn h_6_request_that_cannot_fit_is_never_sent(h: Harness) {
    let mut config = text_config();
    config.context_window_tokens = Some(100);
    config.max_tokens = 50;
    let c = client(vec![ok_reply("never")]);
    let v = h
        .runner(config, &c)
        .run(h.request("k1", "four"))
        .await
        .unwrap();
    assert_eq!(v.state, ViewState::NotDispatched);
    assert_eq!(v.not_dispatched_cause, Some(NotDispatchedCause::Invalid));
    assert_eq!(c.sends(), 0);
}

pub async fn sc_4_json_output_is_validated_by_schema_and_host(h: Harness) {
    let c = client(vec![
        ok_reply(r#"{"answer":"yes","ok":true}"#),
        ok_reply(r#"{"answer":1}"#),
        ok_reply("not json"),
        ok_reply(r#"{"answer":"no","ok":false}"#),
    ]);
    let mut settings = RunnerSettings::new(json_config());
    settings.clock = h.clock.clone();
    settings.validate = Some(Arc::new(|v: &serde_json::Value| v["ok"] == true));
    let runner = SingleCallRunner::new(h.stores.clone(), c.clone(), settings).unwrap();
    let good = runner.run(h.request("k1", "x")).await.unwrap();
    assert_eq!(good.outcome, Some(Outcome::Success));
    assert_eq!(good.output.unwrap().json.unwrap()["answer"], "yes");
    for k in ["k2", "k3", "k4"] {
        let bad = runner.run(h.request(k, "x")).await.unwrap();
        assert_eq!(bad.outcome, Some(Outcome::Invalid), "{k}");
        assert_eq!(
            bad.invalid_reason.map(|r| r.as_str()),
            Some("text_malformed")
        );
        assert!(bad.receipt.is_some(), "invalid output is still charged");
    }
}

pub async fn sc_5_temperature_is_checked_before_any_claim_and_persisted(h: Harness) {
    let mut hot = text_config();
    hot.temperature = Some(Temperature::parse("9").unwrap());
    let c = client(vec![ok_reply("a")]);
    let mut settings = RunnerSettings::new(hot);
    settings.clock = h.clock.clone();
    assert!(matches!(
        SingleCallRunner::new(h.stores.clone(), c.clone(), settings),
        Err(RunError::InvalidConfig(_))
    ));
    let mut warm = text_config();
    warm.temperature = Some(Temperature::parse("0.7").unwrap());
    let view = h.runner(warm, &c).run(h.request("k1", "x")).await.unwrap();
    assert_eq!(view.outcome, Some(Outcome::Success));
    assert_eq!(
        c.last_request()
            .unwrap()
            .temperature
            .map(|t| t.to_string())
            .as_deref(),
        Some("0.7")
    );
    let row = h
        .stores
        .execution(&scope("acme"), &key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.binding
            .config
            .temperature
            .map(|t| t.to_string())
            .as_deref(),
        Some("0.7")
    );
}

pub async fn sc_7_client_with_retries_is_rejected(h: Harness) {
    let retrying = Arc::new(ScriptedClient::with_descriptor(
        vec![],
        ClientDescriptor {
            protocol: Protocol::OpenAiChat,
            max_attempts: 3,
            fallback: false,
        },
    ));
    let settings = RunnerSettings::new(text_config());
    assert!(matches!(
        SingleCallRunner::new(h.stores.clone(), retrying, settings),
        Err(RunError::InvalidConfig(_))
    ));
}

pub async fn sc_8_tc_5_tool_choice_is_rejected(h: Harness) {
    let mut config = text_config();
    config.tool_choice = Some(tollgate_core::message::ToolChoice::Auto);
    let c = client(vec![]);
    let settings = RunnerSettings::new(config);
    assert!(matches!(
        SingleCallRunner::new(h.stores.clone(), c, settings),
        Err(RunError::InvalidConfig(_))
    ));
}

pub async fn st_23_cut_before_usage_needs_reconciliation(h: Harness) {
    let c = client(vec![ScriptedReply::Events(events_without_usage("partial"))]);
    let v = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    assert_eq!(v.state, ViewState::ReconciliationRequired);
    assert_eq!(
        v.reconciliation_reason,
        Some(ReconciliationReason::NoExactUsage)
    );
    assert!(v.receipt.is_none());
    let id = v.execution_id.unwrap();
    assert!(h.stores.settlement(id).await.unwrap().is_none());
    assert_eq!(
        h.daily().await.held,
        fitted_hold_of("x"),
        "hold kept (as the dispatch mark fitted it, SC-122)"
    );
}

/// SC-95: an OpenAI Chat stream whose final usage lacks `completion_tokens` ends cleanly, but its
/// usage is not exact: operator reconciliation (`no_exact_usage`), no settlement, the hold kept,
/// the partial count kept as inexact evidence only.
pub async fn sc_95_inexact_provider_usage_needs_reconciliation(h: Harness) {
    let stream = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":10}}\n\n",
        "data: [DONE]\n\n",
    );
    let events = tollgate_provider::parse::decode_all(Protocol::OpenAiChat, stream.as_bytes());
    let c = client(vec![ScriptedReply::Events(events)]);
    let v = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    assert_eq!(v.state, ViewState::ReconciliationRequired);
    assert!(v.receipt.is_none());
    let id = v.execution_id.unwrap();
    let row = h
        .stores
        .execution(&scope("acme"), &key("k1"))
        .await
        .unwrap();
    assert_eq!(
        row.unwrap().reconciliation_reason,
        Some(tollgate_core::state::ReconciliationReason::NoExactUsage)
    );
    assert!(
        h.stores.settlement(id).await.unwrap().is_none(),
        "no settlement"
    );
    assert_eq!(
        h.daily().await.held,
        fitted_hold_of("x"),
        "hold kept (as the dispatch mark fitted it, SC-122)"
    );
    let evidence = h.stores.evidence_for(id).await.unwrap();
    assert_eq!(evidence.len(), 1);
    assert!(!evidence[0].exact, "partial counts are inexact evidence");
    assert_eq!(evidence[0].usage, usage(10, 0));
    assert_eq!(c.sends(), 1);
}

pub async fn st_23_cut_after_usage_is_invalid_with_its_cost(h: Harness) {
    let c = client(vec![ScriptedReply::Events(vec![
        E::ProviderRef { id: "r".into() },
        E::TextDelta {
            text: "part".into(),
        },
        E::Usage {
            usage: usage(10, 5),
            terminal: true,
        },
        E::Error {
            kind: "connection_closed".into(),
            message: "eof".into(),
        },
    ])]);
    let v = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    assert_eq!(v.state, ViewState::Completed);
    assert_eq!(v.outcome, Some(Outcome::Invalid));
    assert!(v.invalid_reason.is_some());
    assert_eq!(v.receipt.unwrap().amount, m("0.00002"));
}

pub async fn rf_2_prestream_refusal_settles_zero(h: Harness) {
    let c = client(vec![ScriptedReply::Events(vec![
        E::ProviderRef {
            id: "req-refused".into(),
        },
        E::Done,
    ])]);
    let v = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    assert_eq!(v.state, ViewState::Completed);
    assert_eq!(v.outcome, Some(Outcome::Unavailable));
    assert!(v.output.is_none());
    assert_eq!(v.receipt.unwrap().amount, Money::ZERO);
    assert_eq!(h.daily().await, SpendTotals::default());
}

pub async fn http_status_rejection_settles_zero(h: Harness) {
    let c = client(vec![ScriptedReply::Fail(SendError::Status {
        status: 429,
        provider_ref: Some("req-429".into()),
        class: StatusClass::NotProcessed,
    })]);
    let v = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    assert_eq!(v.outcome, Some(Outcome::Unavailable));
    assert_eq!(v.receipt.unwrap().amount, Money::ZERO);
    assert_eq!(c.sends(), 1);
}

pub async fn sc_96_ambiguous_status_goes_to_operators_with_its_reason(h: Harness) {
    // A gateway's 502 (no provider error body): the provider may have processed the request.
    let c = client(vec![ScriptedReply::Fail(SendError::Status {
        status: 502,
        provider_ref: Some("req-502".into()),
        class: StatusClass::Ambiguous,
    })]);
    let v = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    assert_eq!(v.state, ViewState::ReconciliationRequired);
    assert_eq!(
        v.reconciliation_reason,
        Some(ReconciliationReason::AmbiguousStatus)
    );
    assert!(v.receipt.is_none());
    assert_eq!(c.sends(), 1);
    let id = v.execution_id.unwrap();
    assert!(
        h.stores.settlement(id).await.unwrap().is_none(),
        "no settlement"
    );
    assert_eq!(
        h.daily().await.held,
        fitted_hold_of("x"),
        "hold kept (as the dispatch mark fitted it, SC-122)"
    );
    // The request id is kept as inexact evidence: it proves nothing about the cost.
    let evidence = h.stores.evidence_for(id).await.unwrap();
    assert_eq!(evidence.len(), 1);
    assert_eq!(evidence[0].provider_ref.as_deref(), Some("req-502"));
    assert!(!evidence[0].exact);

    // Without a request id there is no evidence to record.
    let c = client(vec![ScriptedReply::Fail(SendError::Status {
        status: 504,
        provider_ref: None,
        class: StatusClass::Ambiguous,
    })]);
    let v = h
        .runner(text_config(), &c)
        .run(h.request("k2", "x"))
        .await
        .unwrap();
    assert_eq!(
        v.reconciliation_reason,
        Some(ReconciliationReason::AmbiguousStatus)
    );
    let evidence = h.stores.evidence_for(v.execution_id.unwrap()).await;
    assert!(evidence.unwrap().is_empty());
}

pub async fn sc_94_no_response_goes_to_operators_with_its_reason(h: Harness) {
    let c = client(vec![ScriptedReply::Fail(SendError::NoResponse(
        "reset".into(),
    ))]);
    let v = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    assert_eq!(v.state, ViewState::ReconciliationRequired);
    assert_eq!(
        v.reconciliation_reason,
        Some(ReconciliationReason::NoResponse)
    );
    let stored = h
        .stores
        .execution(&scope("acme"), &key("k1"))
        .await
        .unwrap();
    assert_eq!(
        stored.unwrap().reconciliation_reason,
        Some(ReconciliationReason::NoResponse)
    );
}

pub async fn sc_40_h_4_recover_finishes_expired_claims_without_sending(h: Harness) {
    // A claim whose process died before dispatch.
    let mut claim =
        tollgate_testkit::conformance::claim_req("acme", "dead", text_config(), "0.001");
    claim.now = h.clock.now();
    h.stores.claim(claim).await.unwrap();
    let r = h.reconciler();
    let live = r
        .recover(&scope("acme"), &key("dead"), 1000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        live.state,
        ViewState::InProgress,
        "lease still live: not eligible"
    );
    h.clock.advance_ms(30_001);
    let v = r
        .recover(&scope("acme"), &key("dead"), 1000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.state, ViewState::NotDispatched);
    assert_eq!(v.not_dispatched_cause, Some(NotDispatchedCause::Expired));
    assert!(r
        .recover(&scope("acme"), &key("missing"), 1000)
        .await
        .unwrap()
        .is_none());
}

pub async fn sc_41_sc_61_reconcile_expired_counts_and_routes(h: Harness) {
    // One dispatched without evidence (→ operator), one prepared (→ not dispatched).
    for k in ["a", "b"] {
        let mut claim = tollgate_testkit::conformance::claim_req("acme", k, text_config(), "0.001");
        claim.now = h.clock.now();
        h.stores.claim(claim).await.unwrap();
    }
    let a = h
        .stores
        .execution(&scope("acme"), &key("a"))
        .await
        .unwrap()
        .unwrap();
    h.stores
        .mark_dispatched(a.fence(), h.clock.now())
        .await
        .unwrap();
    h.clock.advance_ms(30_001);
    let counts = h
        .reconciler()
        .reconcile_expired(&scope("acme"), 10, 1000)
        .await
        .unwrap();
    assert_eq!((counts.roots, counts.executions), (0, 2));
    let state = |k| {
        let s = h.stores.clone();
        async move {
            s.execution(&scope("acme"), &key(k))
                .await
                .unwrap()
                .unwrap()
                .state
        }
    };
    assert_eq!(state("a").await, ExecutionState::ReconciliationRequired);
    assert_eq!(state("b").await, ExecutionState::NotDispatched);
    let again = h
        .reconciler()
        .reconcile_expired(&scope("acme"), 10, 1000)
        .await
        .unwrap();
    assert_eq!(again.executions, 0);
}

pub async fn sc_42_reconcile_usage_acknowledges_only_exact_settled_evidence(h: Harness) {
    let c = client(vec![
        ok_reply("a"),
        ScriptedReply::Events(events_without_usage("cut")),
    ]);
    let runner = h.runner(text_config(), &c);
    let done = runner.run(h.request("done", "x")).await.unwrap();
    runner.run(h.request("cut", "x")).await.unwrap();
    let r = h.reconciler();
    let never = |_: &OperationKey| false;
    // The call's own exact evidence was acknowledged by its settlement (H-28): nothing is open.
    let before = r
        .reconcile_usage(&scope("acme"), None, None, &never)
        .await
        .unwrap();
    assert_eq!((before.scanned, before.acknowledged), (0, 0));
    // Late evidence equal to the settlement is acknowledged; evidence that disagrees with it
    // stays pending.
    let charged = done.receipt.as_ref().unwrap().usage;
    for late in [charged, usage(99, 1)] {
        r.record_late_evidence(&scope("acme"), done.execution_id.unwrap(), late, None)
            .await
            .unwrap();
    }
    let counts = r
        .reconcile_usage(&scope("acme"), None, None, &never)
        .await
        .unwrap();
    assert_eq!((counts.scanned, counts.acknowledged), (2, 1));
    assert!(counts.cursor.is_some());
    // Each pass starts from the beginning and sees what is still pending.
    let again = r
        .reconcile_usage(&scope("acme"), Some(500), None, &never)
        .await
        .unwrap();
    assert_eq!((again.scanned, again.acknowledged), (1, 0));
    let past = r
        .reconcile_usage(&scope("acme"), Some(1), counts.cursor, &never)
        .await
        .unwrap();
    assert_eq!(past.scanned, 0);
}

pub async fn sc_44_skip_leaves_rows_pending(h: Harness) {
    let c = client(vec![ok_reply("a")]);
    let done = h
        .runner(text_config(), &c)
        .run(h.request("control", "x"))
        .await
        .unwrap();
    let r = h.reconciler();
    // A late report equal to the settlement (the call's own evidence was acknowledged by it).
    r.record_late_evidence(
        &scope("acme"),
        done.execution_id.unwrap(),
        done.receipt.as_ref().unwrap().usage,
        None,
    )
    .await
    .unwrap();
    let skip = |k: &OperationKey| k.as_str() == "control";
    let counts = r
        .reconcile_usage(&scope("acme"), None, None, &skip)
        .await
        .unwrap();
    assert_eq!((counts.scanned, counts.acknowledged), (1, 0));
    let none = |_: &OperationKey| false;
    let counts = r
        .reconcile_usage(&scope("acme"), None, None, &none)
        .await
        .unwrap();
    assert_eq!(counts.acknowledged, 1);
}

pub async fn operator_resolves_reconciliation_with_stated_usage(h: Harness) {
    let c = client(vec![ScriptedReply::Events(events_without_usage("cut"))]);
    let v = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    let id = v.execution_id.unwrap();
    let resolved = h
        .reconciler()
        .resolve(&scope("acme"), id, usage(100, 50))
        .await
        .unwrap();
    assert_eq!(resolved.state, ViewState::Completed);
    assert_eq!(resolved.receipt.unwrap().amount, m("0.0002"));
    let d = h.daily().await;
    assert_eq!((d.settled, d.held), (m("0.0002"), Money::ZERO));
    assert!(
        h.reconciler()
            .resolve(&scope("acme"), id, usage(1, 1))
            .await
            .is_err(),
        "once"
    );
    assert!(h
        .reconciler()
        .resolve(&scope("other"), id, usage(1, 1))
        .await
        .is_err());
}

pub async fn sc_60_abort_after_dispatch_still_drains_and_settles(h: Harness) {
    let events = match ok_reply("late") {
        ScriptedReply::Events(e) => e,
        _ => unreachable!(),
    };
    let c = client(vec![ScriptedReply::Delayed {
        delay_ms: 300,
        events,
    }]);
    let runner = h.runner(text_config(), &c);
    let req = h.request("k1", "x");
    let cancel = req.cancel.clone();
    let sent = c.clone();
    tokio::spawn(async move {
        // The caller leaves once the request is out (after the dispatch mark).
        until_sent(&sent, 1).await;
        cancel.cancel();
    });
    let err = runner.run(req).await.unwrap_err();
    assert!(
        err.is_interruption(),
        "ST-35: the runner's own interruption"
    );
    let mut view = None;
    for _ in 0..200 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let v = runner
            .read(&scope("acme"), &key("k1"))
            .await
            .unwrap()
            .unwrap();
        if v.state == ViewState::Completed {
            view = Some(v);
            break;
        }
    }
    let view = view.expect("drained in the background");
    assert_eq!(view.receipt.unwrap().amount, m("0.00002"));
    assert_eq!(c.sends(), 1);
}

pub async fn st_34_run_timeout_bounds_a_hanging_stream(h: Harness) {
    let mut config = text_config();
    config.run_timeout_ms = 200;
    let c = client(vec![ScriptedReply::EventsThenHang(events_without_usage(
        "hang",
    ))]);
    let runner = h.runner(config, &c);
    let v = runner.run(h.request("k1", "x")).await.unwrap();
    assert_eq!(v.state, ViewState::ReconciliationRequired);
    let evidence = h
        .stores
        .evidence_for(v.execution_id.unwrap())
        .await
        .unwrap();
    assert!(evidence.is_empty(), "no usage arrived, none invented");
}

pub async fn no_overspend_with_200_parallel_runs(h: Harness) {
    let mut config = text_config();
    // Hold 0.00654375 each: at most 15 fit under 0.1 at once.
    config.caps.daily_block = Some(m("0.1"));
    let replies: Vec<_> = (0..200).map(|_| ok_reply("x")).collect();
    let c = client(replies);
    let runner = Arc::new(h.runner(config, &c));
    let mut tasks = Vec::new();
    for i in 0..200 {
        let runner = runner.clone();
        let mut req = h.request(&format!("p{i}"), "x");
        req.session_id = SessionId::parse(format!("s{}", i % 5)).unwrap();
        tasks.push(tokio::spawn(async move { runner.run(req).await }));
    }
    let (mut admitted, mut blocked) = (0u64, 0u64);
    for t in tasks {
        match t.await.unwrap() {
            Ok(v) => {
                assert_eq!(v.outcome, Some(Outcome::Success));
                admitted += 1;
            }
            Err(RunError::CapBlocked(_)) => blocked += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(admitted + blocked, 200);
    assert_eq!(c.sends(), admitted);
    let d = h.daily().await;
    assert_eq!(d.held, Money::ZERO);
    assert!(d.settled <= m("0.1"));
    assert_eq!(
        d.settled,
        Money::parse(&(admitted * 20).to_string(), "t")
            .unwrap()
            .decimal()
            .checked_div(1_000_000.into())
            .map(|x| Money::new(x, "t").unwrap())
            .unwrap()
    );
}

pub async fn sc_1_version_ids_are_bound_to_the_execution(h: Harness) {
    let c = client(vec![ok_reply("a")]);
    h.runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    for field in ["policy", "output"] {
        let mut changed = text_config();
        match field {
            "policy" => changed.policy_version = VersionId::parse("policy-2").unwrap(),
            _ => changed.output_contract_version = VersionId::parse("out-2").unwrap(),
        }
        let err = h
            .runner(changed, &c)
            .run(h.request("k1", "x"))
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::Conflict { .. }), "{field}: {err}");
    }
    assert_eq!(c.sends(), 1);
}

pub async fn sc_2_settlement_uses_the_snapshot_prices_consumer_and_day(h: Harness) {
    let mut config = text_config();
    config.consumer = ConsumerId::parse("team-z").unwrap();
    config.prices.output = m("3");
    let c = client(vec![ok_reply("a")]);
    let v = h
        .runner(config, &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap();
    let s = h
        .stores
        .settlement(v.execution_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.consumer.as_str(), "team-z");
    assert_eq!(s.amount, m("0.000025"), "10 × 1 + 5 × 3 per million");
    assert_eq!(
        (s.price_version.as_str(), s.policy_version.as_str()),
        ("prices-1", "policy-1")
    );
    assert_eq!(s.accounting_day, t0().date_naive());
}

pub async fn sc_3_cache_choice_is_snapshotted_and_sent(h: Harness) {
    let mut off = text_config();
    off.cache = Some(false);
    let c = client(vec![ok_reply("a"), ok_reply("b")]);
    h.runner(off, &c).run(h.request("k1", "x")).await.unwrap();
    assert_eq!(c.last_request().unwrap().cache, Some(false));
    h.runner(text_config(), &c)
        .run(h.request("k2", "x"))
        .await
        .unwrap();
    assert_eq!(
        c.last_request().unwrap().cache,
        None,
        "omitted: the policy decides"
    );
    let err = h
        .runner(text_config(), &c)
        .run(h.request("k1", "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Conflict { fields, .. } if fields == ["config.cache"]));
}

pub async fn sc_31_an_unusable_key_is_final_retry_needs_a_new_key(h: Harness) {
    let c = client(vec![ok_reply("ok")]);
    let runner = h.runner(text_config(), &c);
    let first = runner
        .run(h.request("k1", &"x".repeat(1001)))
        .await
        .unwrap();
    assert_eq!(
        first.not_dispatched_cause,
        Some(NotDispatchedCause::Invalid)
    );
    let same = runner.run(h.request("k1", "short")).await.unwrap();
    assert!(same.replayed);
    assert_eq!(same.state, ViewState::NotDispatched);
    assert_eq!(c.sends(), 0);
    let fresh = runner.run(h.request("k1-retry-1", "short")).await.unwrap();
    assert_eq!(fresh.outcome, Some(Outcome::Success));
    assert_eq!(c.sends(), 1);
}

pub async fn sc_52_only_governed_settlement_writes_finance_rows(h: Harness) {
    let c = client(vec![
        ok_reply("a"),
        ScriptedReply::Events(events_without_usage("cut")),
    ]);
    let runner = h.runner(text_config(), &c);
    runner.run(h.request("settled", "x")).await.unwrap();
    runner.run(h.request("settled", "x")).await.unwrap();
    runner.run(h.request("cut", "x")).await.unwrap();
    runner
        .run(h.request("invalid", &"x".repeat(1001)))
        .await
        .unwrap();
    let mut blocked = text_config();
    blocked.caps.daily_block = Some(m("0.0001"));
    assert!(h
        .runner(blocked, &c)
        .run(h.request("blocked", "x"))
        .await
        .is_err());
    let day = t0().date_naive();
    let rows = h.stores.settlements(day, day, 100).await.unwrap();
    assert_eq!(
        rows.len(),
        1,
        "replays, cut streams, not-dispatched and blocked calls write none"
    );
    let audit = serde_json::to_string(
        &h.stores
            .audit_rows(&scope("acme"), tollgate_store::AuditPosition::START, 1000)
            .await
            .unwrap(),
    )
    .unwrap();
    for legacy in ["run_id", "turn_id", "attempt_id", "call_id"] {
        assert!(!audit.contains(legacy));
    }
}

/// The holds in the `claimed` and `dispatched` audit rows of `key`.
async fn audited_holds(h: &Harness, key_: &str) -> Vec<(String, Money)> {
    let rows = h
        .stores
        .audit_rows(&scope("acme"), tollgate_store::AuditPosition::START, 1000)
        .await
        .unwrap();
    rows.into_iter()
        .filter(|r| r.event.detail["operation_key"] == key_)
        .filter(|r| matches!(r.event.kind.as_str(), "claimed" | "dispatched"))
        .map(|r| {
            let hold = r.event.detail["hold"].as_str().unwrap().to_string();
            (r.event.kind, m(&hold))
        })
        .collect()
}

/// SC-120, SC-122, H-14: input in hand is claimed at its own worst case, and the claim is its
/// dispatch mark (the loader is not consulted: the input in hand is what is sent); loaded input is
/// claimed at the profile's and shrunk to its own in the dispatch mark's unit; input in hand that
/// fails the input checks is not sent, and its hold is released.
pub async fn sc_120_sc_122_holds_fit_the_request(h: Harness) {
    let config = text_config();
    let input = [Message::text(Role::User, "hello")];
    let fitted = tollgate_core::hold::fitted_hold(&config, &input).unwrap();
    let worst = config.worst_case_hold().unwrap();
    assert!(fitted < worst);
    let c = client(vec![ok_reply("a"), ok_reply("b")]);
    let runner = h.runner(config, &c);
    runner.run(h.request("loaded", "hello")).await.unwrap();
    assert_eq!(
        audited_holds(&h, "loaded").await,
        vec![("claimed".into(), worst), ("dispatched".into(), fitted)]
    );
    runner
        .run_inline(h.request("inline", "hello"), &input)
        .await
        .unwrap();
    assert_eq!(
        audited_holds(&h, "inline").await,
        vec![("claimed".into(), fitted), ("dispatched".into(), fitted)]
    );
    let long = "x".repeat(1_001);
    let too_long = [Message::text(Role::User, long.clone())];
    let view = runner
        .run_inline(h.request("too-long", &long), &too_long)
        .await
        .unwrap();
    assert_eq!(view.state, ViewState::NotDispatched);
    assert_eq!(view.not_dispatched_cause, Some(NotDispatchedCause::Invalid));
    assert_eq!(c.sends(), 2);
    let d = h.daily().await;
    assert_eq!((d.settled, d.held), (m("0.00004"), Money::ZERO));
}

/// Waits until `c` has received `n` sends, polling every 5 ms for at most 10 s.
async fn until_sent(c: &ScriptedClient, n: u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while c.sends() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} sends expected, {} seen",
            c.sends()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
