//! The HTTP API end to end: the app on a port-0 listener over in-memory stores (and once over a
//! fresh Postgres database), a real mock provider on loopback, driven with reqwest. The mock's
//! request counter proves "sent once" and "never sent".
#![cfg(test)]

mod support;

use reqwest::StatusCode;
use serde_json::json;
use std::sync::Arc;
use support::{admin_url, call, Server, SECRET, SLOW_MS};
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::Scope;
use tollgate_postgres::SessionTimeouts;
use tollgate_server::auth;
use tollgate_server::metrics::Metrics;
use tollgate_server::scheduler::Scheduler;
use tollgate_server::secret::Secret;
use tollgate_server::Backend;
use tollgate_store::{ApiKeyStore, KeyDigest, KeyRole};
use tollgate_testkit::pg::{fresh_test_database, Tamper, TestDatabase};

#[tokio::test]
async fn sc_13_a_call_then_its_replay_sends_once() {
    let s = Server::memory().await;
    let (status, view, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("summarize", "order-1", "r-1", "hello"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["state"], "completed");
    assert_eq!(view["outcome"], "success");
    assert_eq!(view["replayed"], false);
    assert_eq!(view["output"]["text"], "hello");
    assert!(view["receipt"]["amount"].is_string(), "{view}");
    assert_eq!(s.mock.request_count(), 1);

    let (status, replay, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("summarize", "order-1", "r-1", "hello"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(replay["replayed"], true);
    assert_eq!(replay["execution_id"], view["execution_id"]);
    assert_eq!(s.mock.request_count(), 1, "a replay sends nothing");

    let (status, read, _) = s.get("/v1/calls/order-1", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["output"]["text"], "hello");

    // A structured call answers under the host's key and reads back under it.
    let (status, structured, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("extract-tool", "rec-1", "r-1", "Paris"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{structured}");
    assert_eq!(structured["operation_key"], "rec-1");
    assert_eq!(
        structured["step"]["tool_calls"][0]["name"],
        "extract_record"
    );
    let (status, read, _) = s.get("/v1/calls/rec-1", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["execution_id"], structured["execution_id"]);
    assert_eq!(s.mock.request_count(), 2);
    s.stop().await;
}

#[tokio::test]
async fn sc_14_sc_209_conflict_is_422_with_the_differing_fields() {
    let s = Server::memory().await;
    let (status, _, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("summarize", "order-2", "r-1", "hello"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body, text) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("summarize", "order-2", "r-2", SECRET),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    assert_eq!(body["error"]["fields"], json!(["input_revision"]));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with("differs in: input_revision"),
        "{body}"
    );
    assert!(!text.contains(SECRET), "{text}");
    assert_eq!(s.mock.request_count(), 1);
    s.stop().await;
}

#[tokio::test]
async fn sc_16_a_preflight_block_is_402_naming_the_cap_and_writes_nothing() {
    let s = Server::memory().await;
    let (status, body, text) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("tight", "order-3", "r-1", SECRET),
        )
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body}");
    assert_eq!(body["error"]["code"], "cap_blocked");
    assert_eq!(body["error"]["cap"], "session");
    assert_eq!(body["error"]["limit"], "0.000001");
    assert!(!text.contains(SECRET));
    let (status, _, _) = s.get("/v1/calls/order-3", &s.caller).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(s.mock.request_count(), 0);
    s.stop().await;
}

/// POSTs a `/v1/calls` body: status, the `Retry-After` header and the body.
async fn post_call(
    s: &Server,
    body: &serde_json::Value,
) -> (StatusCode, Option<String>, serde_json::Value) {
    let response = s
        .http
        .post(format!("{}/v1/calls", s.base))
        .bearer_auth(&s.caller)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, retry_after, response.json().await.unwrap())
}

/// SC-209: the native API answers a key whose first request is still being processed with 409
/// `in_progress` and `Retry-After`, and the retry after it with the stored view; nothing is sent
/// twice. A read of the key is no retry: it answers the view, in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_209_a_key_still_being_processed_is_409_with_retry_after() {
    let s = Server::memory().await;
    let body = call("slow", "busy-1", "r-1", "busy words");
    let first = {
        let (http, base, caller, body) = (
            s.http.clone(),
            s.base.clone(),
            s.caller.clone(),
            body.clone(),
        );
        tokio::spawn(async move {
            let response = http
                .post(format!("{base}/v1/calls"))
                .bearer_auth(caller)
                .json(&body)
                .send()
                .await
                .unwrap();
            (
                response.status(),
                response.json::<serde_json::Value>().await.unwrap(),
            )
        })
    };
    wait_until("the mock receives the call", || s.mock.request_count() == 1).await;
    let (status, retry_after, busy) = post_call(&s, &body).await;
    assert_eq!(status, StatusCode::CONFLICT, "{busy}");
    assert_eq!(busy["error"]["code"], "in_progress");
    assert_eq!(busy["error"]["operation_key"], "busy-1");
    assert!(busy["error"]["execution_id"].is_string(), "{busy}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    let (status, read, _) = s.get("/v1/calls/busy-1", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["state"], "in_progress");

    let (status, view) = first.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{view}");
    let (status, retry_after, replay) = post_call(&s, &body).await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_eq!(retry_after, None);
    assert_eq!(replay["replayed"], true);
    assert_eq!(replay["execution_id"], view["execution_id"]);
    assert_eq!(replay["output"]["text"], "busy words");
    assert_eq!(s.mock.request_count_for("busy words"), 1, "sent once");
    s.stop().await;
}

/// A profile whose session cap fits one call's hold and not two: a `slow` call holding it fills
/// the cap for a second call of the session.
const ONE_HOLD: &str = r#"
[[profiles]]
name = "one-hold"
kind = "text"
provider = "mock"
model = "mock-slow-1500"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-h"
max_tokens = 64
max_input_chars = 200
run_timeout_ms = 10000
[profiles.caps]
session_block = "0.0002"
"#;

/// SC-210: a 402 says which block it is. The call's own hold above what settled spend leaves
/// (the `tight` cap is below any hold) is `exceeds_cap`, not retryable, without `Retry-After`;
/// a cap that only the holds of calls in flight fill is `holds_in_flight`, with `Retry-After`,
/// and the same call fits once they settled. Neither writes or sends anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_210_a_402_says_whether_holds_in_flight_or_the_call_itself_fill_the_cap() {
    let s = Server::start_with(Backend::memory(), ONE_HOLD).await;
    let (status, retry_after, never) = post_call(&s, &call("tight", "cap-1", "r-1", "x")).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{never}");
    assert_eq!(never["error"]["code"], "cap_blocked");
    assert_eq!(never["error"]["kind"], "exceeds_cap");
    assert_eq!(never["error"]["retryable"], false);
    assert!(never["error"].get("retry_after").is_none(), "{never}");
    assert_eq!(retry_after, None);

    let holding = {
        let (http, base, caller) = (s.http.clone(), s.base.clone(), s.caller.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/v1/calls"))
                .bearer_auth(caller)
                .json(&call("one-hold", "hold-1", "r-1", "x"))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    wait_until("the first call holds the cap", || {
        s.mock.request_count() == 1
    })
    .await;
    let second = call("one-hold", "hold-2", "r-1", "y");
    let (status, retry_after, full) = post_call(&s, &second).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{full}");
    assert_eq!(full["error"]["kind"], "holds_in_flight");
    assert_eq!(full["error"]["retryable"], true);
    assert_eq!(full["error"]["retry_after"], 1);
    assert_eq!(retry_after.as_deref(), Some("1"));
    let (status, _, _) = s.get("/v1/calls/hold-2", &s.caller).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing written");
    assert_eq!(s.mock.request_count(), 1, "nothing sent");

    assert_eq!(holding.await.unwrap(), StatusCode::OK);
    let (status, _, fits) = post_call(&s, &second).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "room came as the hold settled: {fits}"
    );
    s.stop().await;
}

#[tokio::test]
async fn sc_6_callers_cannot_override_profile_values() {
    let s = Server::memory().await;
    for (i, field) in [
        "model",
        "temperature",
        "system",
        "max_tokens",
        "tool_choice",
        "caps",
    ]
    .iter()
    .enumerate()
    {
        let key = format!("override-{i}");
        let mut body = call("summarize", &key, "r", "hello");
        body[*field] = json!("mock-500");
        let (status, answer, _) = s.post("/v1/calls", &s.caller, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request");
        let (status, _, _) = s.get(&format!("/v1/calls/{key}"), &s.caller).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{field}: nothing written");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_11_invalid_input_is_refused_before_anything_is_written() {
    let s = Server::memory().await;
    let non_text = json!({
        "profile": "summarize", "operation_key": "bad-1", "session_id": "s",
        "input_revision": "r", "intent": "i",
        "input": {"messages": [{"role": "user", "content": [
            {"type": "tool_result", "call_id": "c1", "content": SECRET}]}]}
    });
    let oversized = call(
        "summarize",
        "bad-2",
        "r",
        &format!("{SECRET}{}", "x".repeat(300)),
    );
    let unknown = call("no-such-profile", "bad-3", "r", SECRET);
    let scoped = {
        let mut body = call("summarize", "bad-4", "r", SECRET);
        body["scope"] = json!("globex");
        body
    };
    let step_profile = call("agent-step", "bad-5", "r", SECRET);
    for (body, expected) in [
        (&non_text, StatusCode::UNPROCESSABLE_ENTITY),
        (&oversized, StatusCode::UNPROCESSABLE_ENTITY),
        (&unknown, StatusCode::UNPROCESSABLE_ENTITY),
        (&scoped, StatusCode::BAD_REQUEST),
        (&step_profile, StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let (status, answer, text) = s.post("/v1/calls", &s.caller, body).await;
        assert_eq!(status, expected, "{answer}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
        assert!(!text.contains(SECRET), "{text}");
    }
    for key in ["bad-1", "bad-2", "bad-3", "bad-4", "bad-5"] {
        let (status, _, _) = s.get(&format!("/v1/calls/{key}"), &s.caller).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{key} was written");
    }
    // Malformed JSON and a wrong type holding a secret-looking value.
    let wrong_type = format!(
        r#"{{"profile": "summarize", "operation_key": "bad-6", "session_id": "s", "input_revision": "r", "intent": "i", "input": {{"messages": "{SECRET}"}}}}"#
    );
    for raw in [format!("{{\"profile\": \"{SECRET}"), wrong_type] {
        let (status, answer, text) = s
            .send(
                reqwest::Method::POST,
                "/v1/calls",
                Some(&s.caller),
                Some(&raw),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(answer["error"]["code"], "invalid_request");
        assert!(!text.contains(SECRET), "{text}");
    }
    assert_eq!(s.mock.request_count(), 0, "nothing was sent");
    s.stop().await;
}

#[tokio::test]
async fn sc_10_another_scopes_key_gets_404() {
    let s = Server::memory().await;
    let (status, _, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("summarize", "order-a", "r-1", "hello"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body, _) = s.get("/v1/calls/order-a", &s.stranger).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    // The same key in scope B is a different operation: it runs, it does not replay A's.
    let (status, other, _) = s
        .post(
            "/v1/calls",
            &s.stranger,
            &call("summarize", "order-a", "r-9", "other"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(other["replayed"], false);
    assert_eq!(other["output"]["text"], "other");
    s.stop().await;
}

#[tokio::test]
async fn auth_no_key_is_401_and_a_caller_on_an_operator_route_is_403() {
    let s = Server::memory().await;
    let body = call("summarize", "order-x", "r", "hi").to_string();
    let (status, answer, _) = s
        .send(reqwest::Method::POST, "/v1/calls", None, Some(&body))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(answer["error"]["code"], "unauthenticated");
    let (status, _, _) = s
        .send(
            reqwest::Method::GET,
            "/v1/profiles",
            Some("tg_unknown"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, answer, _) = s
        .post("/v1/admin/reconcile/expired", &s.caller, &json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(answer["error"]["code"], "forbidden");
    let (status, _, _) = s
        .post(
            "/v1/calls",
            &s.operator,
            &call("summarize", "order-x", "r", "hi"),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "operators do not run calls");
    let (status, profiles, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<_> = profiles["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "agent-step",
            "cut",
            "extract-tool",
            "slow",
            "summarize",
            "tight"
        ]
    );
    assert_eq!(s.mock.request_count(), 0);
    s.stop().await;
}

#[tokio::test]
async fn st_33_a_root_with_two_steps_then_close_refuses_new_steps() {
    let s = Server::memory().await;
    let open = json!({"root_key": "turn-1", "profile": "agent-step", "session_id": "s",
                      "intent": "plan", "input_revision": "r", "deadline_ms": 60000});
    let (status, root, _) = s.post("/v1/roots", &s.caller, &open).await;
    assert_eq!(status, StatusCode::OK, "{root}");
    assert_eq!(root["state"], "active");
    assert_eq!(root["profile"], "agent-step");
    let step = |key: &str| {
        json!({"operation_key": key, "input": {"messages": [
            {"role": "user", "content": "Paris, please"}]}})
    };
    for key in ["step-1", "step-2"] {
        let (status, view, _) = s
            .post("/v1/roots/turn-1/steps", &s.caller, &step(key))
            .await;
        assert_eq!(status, StatusCode::OK, "{view}");
        assert_eq!(view["state"], "completed");
        assert!(view["root_receipt"]["amount"].is_string(), "{view}");
        assert_eq!(view["step"]["tool_calls"][0]["name"], "extract_record");
    }
    let (status, read, _) = s.get("/v1/roots/turn-1/steps/step-2", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["operation_key"], "step-2");
    let (status, root, _) = s.get("/v1/roots/turn-1", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(root["reserved_calls"], 2);
    let (status, closed, _) = s
        .post("/v1/roots/turn-1/close", &s.caller, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(closed["state"], "closed");
    let (status, refused, _) = s
        .post("/v1/roots/turn-1/steps", &s.caller, &step("step-3"))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "root_closed");
    // A known step still replays after the close; another scope sees no root.
    let (status, replay, _) = s
        .post("/v1/roots/turn-1/steps", &s.caller, &step("step-1"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(replay["replayed"], true);
    let (status, _, _) = s.get("/v1/roots/turn-1", &s.stranger).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(s.mock.request_count(), 2);
    s.stop().await;
}

#[tokio::test]
async fn sc_40_sc_42_operator_recover_reconcile_and_resolve() {
    let s = Server::memory().await;
    let (_, done, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("summarize", "order-r", "r", "hello"),
        )
        .await;
    let recover = json!({"operation_key": "order-r", "lease_ms": 1000});
    let (status, view, _) = s.post("/v1/admin/recover", &s.operator, &recover).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(
        view["state"], "completed",
        "nothing to recover: the current view"
    );
    let missing = json!({"operation_key": "nope"});
    let (status, _, _) = s.post("/v1/admin/recover", &s.operator, &missing).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, counts, _) = s
        .post(
            "/v1/admin/reconcile/expired",
            &s.operator,
            &json!({"limit": 10}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(counts, json!({"roots": 0, "executions": 0}));
    // The call's own evidence was acknowledged by its settlement (H-28); a late report equal to
    // the settlement is what reconciliation acknowledges.
    let late = json!({"execution_id": done["execution_id"], "usage": done["receipt"]["usage"]});
    let (status, row, _) = s.post("/v1/admin/usage-evidence", &s.operator, &late).await;
    assert_eq!(status, StatusCode::OK, "{row}");
    let (status, usage, _) = s
        .post("/v1/admin/reconcile/usage", &s.operator, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{usage}");
    assert_eq!(usage["acknowledged"], 1);

    // A cut stream leaves an unproven cost: an operator lists and resolves it.
    let (status, cut, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("cut", "order-cut", "r", "hello"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{cut}");
    assert_eq!(cut["state"], "reconciliation_required");
    let (status, list, _) = s
        .get(
            "/v1/admin/executions?state=reconciliation_required",
            &s.operator,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["executions"][0]["operation_key"], "order-cut");
    let id = list["executions"][0]["execution_id"].as_str().unwrap();
    let resolve = json!({"usage": {"input": 10, "output": 20}});
    let path = format!("/v1/admin/executions/{id}/resolve");
    let (status, resolved, _) = s.post(&path, &s.operator, &resolve).await;
    assert_eq!(status, StatusCode::OK, "{resolved}");
    assert_eq!(resolved["state"], "completed");
    assert_eq!(resolved["receipt"]["amount"], "0.00005");
    let (status, again, _) = s.post(&path, &s.operator, &resolve).await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    let (status, _, _) = s.post(&path, &s.caller, &resolve).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let evidence = json!({"execution_id": done["execution_id"], "usage": {"input": 1}});
    let (status, row, _) = s
        .post("/v1/admin/usage-evidence", &s.operator, &evidence)
        .await;
    assert_eq!(status, StatusCode::OK, "{row}");
    assert_eq!(row["source"], "late");
    s.stop().await;
}

/// SC-188: stated usage is checked before anything is written: counts above the stored range and
/// amounts above the execution's hold are refused 422 (the quote too), and the execution still
/// awaits an operator; `override_hold` settles above the hold and audits `operator_override`.
#[tokio::test]
async fn sc_188_stated_usage_beyond_the_hold_or_the_range_is_refused() {
    let s = Server::memory().await;
    let (status, cut, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("cut", "order-big", "r", "hello"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{cut}");
    assert_eq!(cut["state"], "reconciliation_required");
    let id = cut["execution_id"].as_str().unwrap();
    let resolve = format!("/v1/admin/executions/{id}/resolve");
    let quote = format!("/v1/console/backlog/{id}/quote");
    let max = json!({"usage": {"input": u64::MAX, "output": u64::MAX}});
    let big = json!({"usage": {"input": 1_000_000_000u64, "output": 1_000_000_000u64}});
    for path in [&resolve, &quote] {
        let (status, refused, _) = s.post(path, &s.operator, &max).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path} {refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains("usage.input"),
            "{refused}"
        );
        let (status, refused, _) = s.post(path, &s.operator, &big).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path} {refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains("hold"),
            "{refused}"
        );
    }
    let (_, list, _) = s
        .get(
            "/v1/admin/executions?state=reconciliation_required",
            &s.operator,
        )
        .await;
    assert_eq!(list["executions"][0]["execution_id"], id, "still awaiting");
    let over = json!({"usage": big["usage"], "override_hold": true});
    let (status, quoted, _) = s.post(&quote, &s.operator, &over).await;
    assert_eq!(status, StatusCode::OK, "{quoted}");
    let (status, resolved, _) = s.post(&resolve, &s.operator, &over).await;
    assert_eq!(status, StatusCode::OK, "{resolved}");
    assert_eq!(resolved["state"], "completed");
    assert_eq!(resolved["receipt"]["amount"], quoted["amount"]);
    let (status, page, _) = s.get("/v1/console/executions/order-big", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.to_string().contains("operator_override"), "{page}");
    s.stop().await;
}

#[tokio::test]
async fn sc_62_scheduler_pass_acknowledges_settled_evidence() {
    let s = Server::memory().await;
    let (status, done, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("summarize", "order-s", "r", "hello"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let settings = tollgate_server::config::SchedulerSettings {
        interval_ms: 1000,
        batch: 10,
    };
    let metrics = Arc::new(Metrics::default());
    let mut scheduler = Scheduler::new(s.backend.clone(), settings, 1000, metrics);
    // The call's own evidence was acknowledged by its settlement (H-28): no work.
    let idle = scheduler.pass(&CancellationToken::new()).await;
    assert_eq!((idle.scopes, idle.acknowledged), (0, 0));
    // A late report equal to the settlement is work for the next pass.
    let late = json!({"execution_id": done["execution_id"], "usage": done["receipt"]["usage"]});
    let (status, row, _) = s.post("/v1/admin/usage-evidence", &s.operator, &late).await;
    assert_eq!(status, StatusCode::OK, "{row}");
    let counts = scheduler.pass(&CancellationToken::new()).await;
    assert_eq!(counts.errors, 0);
    assert_eq!(counts.scopes, 1, "acme has work, globex none");
    assert_eq!(counts.acknowledged, 1);
    let again = scheduler.pass(&CancellationToken::new()).await;
    assert_eq!(again.acknowledged, 0, "acknowledged once");
    assert_eq!(again.scopes, 0, "no work left");
    s.stop().await;
}

#[tokio::test]
async fn health_readiness_and_metrics_carry_no_content() {
    let s = Server::memory().await;
    let (status, body, _) = s.send(reqwest::Method::GET, "/healthz", None, None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let (status, body, _) = s.send(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["stores"], "memory");
    s.post(
        "/v1/calls",
        &s.caller,
        &call("summarize", "m-1", "r", SECRET),
    )
    .await;
    s.post(
        "/v1/calls",
        &s.caller,
        &call("summarize", "m-1", "r2", SECRET),
    )
    .await;
    // The counters span every scope: an operator's read (SC-197).
    let (status, _, text) = s.get("/metrics", &s.operator).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains("tollgate_calls_total{outcome=\"success\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_call_errors_total{code=\"conflict\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_settled_spend_total{currency=\"USD\"}"),
        "{text}"
    );
    assert!(text.contains("tollgate_scheduler_passes_total"), "{text}");
    assert!(
        !text.contains(SECRET) && !text.contains(&s.caller) && !text.contains(&s.operator),
        "{text}"
    );
    let (status, body, _) = s
        .send(reqwest::Method::GET, "/v1/nothing", None, None)
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("not_found"))
    );
    s.stop().await;
}

#[tokio::test]
async fn postgres_a_call_and_its_replay_through_the_api() {
    let stores = Arc::new(fresh_test_database(&admin_url()).await.unwrap());
    let s = Server::start(Backend::Postgres(stores.clone())).await;
    // A key in the api_keys table, stored under its digest only.
    let acme = Scope::parse("acme").unwrap();
    let key = auth::create_key(&*stores, &acme, KeyRole::Caller)
        .await
        .unwrap();
    let stored = stores
        .key_by_digest(&KeyDigest::of_key(key.expose()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((&stored.scope, stored.role), (&acme, KeyRole::Caller));
    let body = call("summarize", "pg-1", "r-1", "hello postgres");
    let (status, first, _) = s.post("/v1/calls", key.expose(), &body).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["state"], "completed");
    let (status, replay, _) = s.post("/v1/calls", key.expose(), &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(replay["replayed"], true);
    assert_eq!(replay["receipt"], first["receipt"]);
    assert_eq!(s.mock.request_count(), 1);
    let (status, ready, _) = s.send(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!(
        (status, &ready["stores"]),
        (StatusCode::OK, &json!("postgres"))
    );
    let (status, _, _) = s.get("/v1/calls/pg-1", &s.stranger).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    s.stop().await;
}

/// Polls `done` every 10 ms for at most 10 s.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Starts a `slow` call under `key`, waits until the mock holds its request (the call is
/// dispatched; the mock answers after `SLOW_MS`), then hangs up.
async fn hang_up_on_a_slow_call(s: &Server, key: &str) {
    let request = s
        .http
        .post(format!("{}/v1/calls", s.base))
        .bearer_auth(&s.caller)
        .header("content-type", "application/json")
        .body(call("slow", key, "r-1", "hello").to_string())
        .send();
    let client = tokio::spawn(request);
    wait_until("the mock receives the call", || s.mock.request_count() == 1).await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
}

/// The view of `key`, read through a new server over `backend`.
async fn view_after(backend: Backend, key: &str) -> serde_json::Value {
    let t = Server::start(backend).await;
    let (status, view, _) = t.get(&format!("/v1/calls/{key}"), &t.caller).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    t.stop().await;
    view
}

/// SC-116: a caller hangs up on a dispatched call, then shutdown begins; the server waits for the
/// call's drive (its own task) to settle before it exits.
#[tokio::test]
async fn sc_116_shutdown_waits_for_a_call_whose_caller_left() {
    let s = Server::memory().await;
    hang_up_on_a_slow_call(&s, "slow-1").await;
    let backend = s.backend.clone();
    s.stop().await;
    let view = view_after(backend, "slow-1").await;
    assert_eq!(view["state"], "completed", "{view}");
    assert_eq!(view["outcome"], "success", "{view}");
    assert_eq!(view["output"]["text"], "hello", "{view}");
}

/// SC-116: the wait is bounded by `[server] shutdown_drain_ms`: with 0 the server exits at once,
/// leaving the call open (recovery finishes it after its lease).
#[tokio::test]
async fn sc_116_shutdown_stops_waiting_at_the_drain_bound() {
    let s = Server::start_with(Backend::memory(), "[server]\nshutdown_drain_ms = 0\n").await;
    hang_up_on_a_slow_call(&s, "slow-2").await;
    let backend = s.backend.clone();
    let stopped = tokio::time::Instant::now();
    s.stop().await;
    let waited = stopped.elapsed();
    let view = view_after(backend, "slow-2").await;
    assert!(
        waited < std::time::Duration::from_millis(SLOW_MS),
        "{waited:?}"
    );
    assert_ne!(view["state"], "completed", "{view}");
}

/// SC-115: the server runs as a login role in `tollgate_app` on a database the owner migrated: a
/// full call and its read back work, while the role cannot change or remove an audit row, truncate
/// the log, disable its triggers or change the schema (refused by privileges, 42501, not by the
/// triggers, which an owner could disable).
#[tokio::test]
async fn sc_115_the_application_role_serves_calls_but_cannot_tamper_with_the_audit_log() {
    let db = TestDatabase::create(&admin_url()).await.unwrap();
    db.stores(2).await.unwrap().migrate().await.unwrap();
    let app_url = db.app_role_url().await.unwrap();
    // `serve`'s connect: nothing is pending, so nothing needs schema rights.
    let stores = tollgate_server::start::connect(
        &Secret::new(app_url.clone()),
        4,
        SessionTimeouts::default(),
    )
    .await
    .unwrap();
    let s = Server::start(Backend::Postgres(stores)).await;
    let body = call("summarize", "role-1", "r-1", "hello role");
    let (status, view, _) = s.post("/v1/calls", &s.caller, &body).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["state"], "completed", "{view}");
    let (status, read, _) = s.get("/v1/calls/role-1", &s.caller).await;
    assert_eq!(
        (status, &read["receipt"]),
        (StatusCode::OK, &view["receipt"])
    );
    let (status, _, _) = s.send(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, audit, _) = s.get("/v1/admin/audit/ledger", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    s.stop().await;

    for tamper in Tamper::ALL {
        let refused = db.refusal_as(&app_url, tamper).await.unwrap();
        assert_eq!(refused.as_deref(), Some("42501"), "{tamper:?}");
    }
    // The owner can disable the triggers: what stops the application role is its privileges.
    let owner = db.refusal_as(db.url(), Tamper::DisableAuditTriggers).await;
    assert_eq!(owner.unwrap(), None);
}

/// SC-93: the operator's ledger audit route on the key's scope, and the scheduler's ledger
/// audit reporting drift as metrics.
#[tokio::test]
async fn sc_93_ledger_audit_route_and_scheduled_drift() {
    use tollgate_core::config::fixtures::text_config;
    use tollgate_core::digest::Binding;
    use tollgate_core::ids::{InputRevision, Intent, OperationKey, SessionId};
    use tollgate_core::money::Money;
    use tollgate_core::state::{Outcome, SettlementSource};
    use tollgate_core::usage::Usage;
    use tollgate_store::{ClaimOutcome, ClaimRequest, SettleRequest};

    let s = Server::memory().await;
    // A call, a root with a step, and a cut stream awaiting an operator.
    let (status, _, _) = s
        .post("/v1/calls", &s.caller, &call("summarize", "l-1", "r", "hi"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let open = json!({"root_key": "turn-l", "profile": "agent-step", "session_id": "s",
                      "intent": "plan", "input_revision": "r", "deadline_ms": 60000});
    assert_eq!(
        s.post("/v1/roots", &s.caller, &open).await.0,
        StatusCode::OK
    );
    let step = json!({"operation_key": "l-step", "input": {"messages": [
        {"role": "user", "content": "Paris, please"}]}});
    let (status, view, _) = s.post("/v1/roots/turn-l/steps", &s.caller, &step).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    let (_, cut, _) = s
        .post("/v1/calls", &s.caller, &call("cut", "l-cut", "r", "hi"))
        .await;
    assert_eq!(cut["state"], "reconciliation_required");

    let (status, report, _) = s.get("/v1/admin/audit/ledger", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["scope"], "acme");
    assert_eq!(report["checked"]["executions"], 3);
    assert_eq!(report["checked"]["roots"], 1);
    assert_eq!(report["checked"]["root_receipts"], 1);
    let (status, _, _) = s
        .get("/v1/admin/audit/ledger?scope=acme&limit=5", &s.operator)
        .await;
    assert_eq!(status, StatusCode::OK);
    // Scoped like every admin route: another scope is not found, other roles are refused.
    let (status, body, _) = s
        .get("/v1/admin/audit/ledger?scope=globex", &s.operator)
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("not_found"))
    );
    let (status, _, _) = s.get("/v1/admin/audit/ledger", &s.caller).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = s
        .send(reqwest::Method::GET, "/v1/admin/audit/ledger", None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = s.get("/v1/admin/audit/ledger?bogus=1", &s.operator).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // A writer that breaks the settle contract: the store takes an amount that is not the
    // usage's price.
    let stores = s.backend.stores();
    let binding = Binding {
        session_id: SessionId::parse("s-x").unwrap(),
        intent: Intent::parse("summarize").unwrap(),
        input_revision: InputRevision::parse("r").unwrap(),
        config: text_config(),
    };
    let claim = ClaimRequest {
        scope: Scope::parse("acme").unwrap(),
        operation_key: OperationKey::parse("l-bad").unwrap(),
        root_key: None,
        binding,
        hold: Money::parse("0.5", "hold").unwrap(),
        now: chrono::Utc::now(),
        lease_ms: 30_000,
        dispatch: false,
        limits: tollgate_core::limits::ClaimLimits::default(),
        binding_digest: None,
    };
    let ClaimOutcome::Claimed(r) = stores.claim(claim).await.unwrap() else {
        panic!("expected a claim");
    };
    let d = stores
        .mark_dispatched(r.fence(), chrono::Utc::now())
        .await
        .unwrap();
    stores
        .settle(SettleRequest {
            fence: d.fence(),
            usage: Usage {
                input: 10,
                output: 5,
                ..Usage::ZERO
            },
            amount: Money::parse("1", "amount").unwrap(),
            source: SettlementSource::Stream,
            outcome: Outcome::Success,
            stop: None,
            output: None,
            step: None,
            provider_ref: None,
            evidence_id: None,
            evidence: None,
            seen: Some(Box::new(d.clone())),
            now: chrono::Utc::now(),
        })
        .await
        .unwrap();
    let (status, report, _) = s.get("/v1/admin/audit/ledger", &s.operator).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an audit that finds drift still answers 200"
    );
    assert_eq!(report["ok"], false);
    assert_eq!(report["violations_total"], 1, "{report}");
    let v = &report["violations"][0];
    assert_eq!(v["invariant"], "settlement_priced");
    assert_eq!(v["reason"], "amount");
    assert_eq!(v["execution_id"], json!(r.id));
    assert_eq!(
        (&v["expected"], &v["found"]),
        (&json!("0.00002"), &json!("1"))
    );

    // The scheduler audits the scopes with work and reports the drift.
    let settings = tollgate_server::config::SchedulerSettings {
        interval_ms: 1000,
        batch: 10,
    };
    let metrics = Arc::new(Metrics::default());
    let mut scheduler = Scheduler::new(s.backend.clone(), settings, 1000, metrics.clone())
        .with_ledger_audit_interval(3_600_000);
    let counts = scheduler.pass(&CancellationToken::new()).await;
    assert_eq!(counts.errors, 0);
    assert_eq!((counts.ledger_audited, counts.ledger_violations), (1, 1));
    metrics.observe_pass(&counts, 1);
    let text = metrics.render();
    assert!(
        text.contains("\ntollgate_ledger_audit_runs_total 1\n"),
        "{text}"
    );
    assert!(text.contains("\ntollgate_ledger_violations 1\n"), "{text}");
    // Not due again within the interval.
    let again = scheduler.pass(&CancellationToken::new()).await;
    assert_eq!(again.ledger_audited, 0);
    s.stop().await;
}

/// SC-111, SC-112, SC-114 over HTTP: a cut call awaits an operator; the backlog lists it; the
/// fetch says the chat protocol cannot fetch; late evidence (the operator's route) makes it
/// settleable; the dry run shows the amount and changes nothing; the settlement charges it once;
/// a replay does nothing; callers are refused every backlog route.
async fn backlog_routes(s: Server) {
    let (status, cut, _) = s
        .post("/v1/calls", &s.caller, &call("cut", "bk-cut", "r", "hello"))
        .await;
    assert_eq!(status, StatusCode::OK, "{cut}");
    assert_eq!(cut["state"], "reconciliation_required");
    let id = cut["execution_id"].clone();

    // SC-114: the caller's key is refused, nothing changes.
    let (status, _, _) = s.get("/v1/admin/backlog", &s.caller).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = s
        .post("/v1/admin/reconcile/fetch-evidence", &s.caller, &json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let all = json!({"all": true});
    let (status, _, _) = s
        .post("/v1/admin/reconcile/resolve-from-evidence", &s.caller, &all)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // SC-112: the backlog.
    let (status, list, _) = s.get("/v1/admin/backlog", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let entry = &list["backlog"][0];
    assert_eq!(list["backlog"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(entry["operation_key"], "bk-cut");
    assert_eq!(entry["execution_id"], id);
    assert_eq!(entry["reconciliation_reason"], "no_exact_usage");
    assert_eq!(entry["evidence"], "none");
    assert!(entry["provider_ref"].is_string(), "{entry}");
    assert!(entry["held"].is_string(), "{entry}");
    assert!(entry["age_ms"].is_i64(), "{entry}");

    // SC-110: the chat protocol cannot fetch (typed, per execution).
    let (status, fetched, _) = s
        .post(
            "/v1/admin/reconcile/fetch-evidence",
            &s.operator,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{fetched}");
    assert_eq!(fetched["stored"], 0);
    assert_eq!(fetched["skipped"][0]["reason"], "unsupported");

    // Neither or both of keys and all: 422, nothing changes.
    for bad in [json!({}), json!({"all": true, "keys": ["bk-cut"]})] {
        let (status, _, _) = s
            .post(
                "/v1/admin/reconcile/resolve-from-evidence",
                &s.operator,
                &bad,
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
    // Without exact evidence it is skipped, never charged.
    let keys = json!({"keys": ["bk-cut"]});
    let (status, none, _) = s
        .post(
            "/v1/admin/reconcile/resolve-from-evidence",
            &s.operator,
            &keys,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{none}");
    assert_eq!(none["items"][0]["action"], "skipped");
    assert_eq!(none["items"][0]["reason"], "no_evidence");

    let evidence = json!({"execution_id": id, "usage": {"input": 10, "output": 20}});
    let (status, _, _) = s
        .post("/v1/admin/usage-evidence", &s.operator, &evidence)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, list, _) = s.get("/v1/admin/backlog", &s.operator).await;
    assert_eq!(list["backlog"][0]["evidence"], "late_exact");
    assert_eq!(list["backlog"][0]["amount"], "0.00005");

    let dry = json!({"keys": ["bk-cut"], "dry_run": true});
    let (status, report, _) = s
        .post(
            "/v1/admin/reconcile/resolve-from-evidence",
            &s.operator,
            &dry,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["dry_run"], true);
    assert_eq!(report["items"][0]["action"], "would_settle");
    assert_eq!(report["items"][0]["amount"], "0.00005");
    let (_, view, _) = s.get("/v1/calls/bk-cut", &s.caller).await;
    assert_eq!(
        view["state"], "reconciliation_required",
        "a dry run changes nothing"
    );

    let (status, report, _) = s
        .post(
            "/v1/admin/reconcile/resolve-from-evidence",
            &s.operator,
            &all,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["items"][0]["action"], "settled");
    assert_eq!(report["items"][0]["amount"], "0.00005");
    let (_, view, _) = s.get("/v1/calls/bk-cut", &s.caller).await;
    assert_eq!(view["state"], "completed");
    assert_eq!(view["receipt"]["amount"], "0.00005");

    // Replays change nothing.
    let (status, replay, _) = s
        .post(
            "/v1/admin/reconcile/resolve-from-evidence",
            &s.operator,
            &keys,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(replay["items"][0]["reason"], "not_awaiting_operator");
    let (_, all_again, _) = s
        .post(
            "/v1/admin/reconcile/resolve-from-evidence",
            &s.operator,
            &all,
        )
        .await;
    assert_eq!(all_again["items"], json!([]));
    let (_, list, _) = s.get("/v1/admin/backlog", &s.operator).await;
    assert_eq!(list["backlog"], json!([]));
    s.stop().await;
}

#[tokio::test]
async fn sc_111_sc_112_sc_114_backlog_routes_on_memory() {
    backlog_routes(Server::memory().await).await;
}

#[tokio::test]
async fn sc_111_sc_112_sc_114_backlog_routes_on_postgres() {
    let stores = Arc::new(fresh_test_database(&admin_url()).await.unwrap());
    backlog_routes(Server::start(Backend::Postgres(stores)).await).await;
}

/// SC-113: off by default, the scheduler fetches nothing; on, a pass stores the finished
/// response's usage once as late evidence and settles nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_113_the_scheduler_fetches_evidence_only_when_on() {
    use futures::FutureExt;
    use tollgate_provider::http::{HttpClient, HttpClientConfig};
    use tollgate_provider::Protocol;
    use tollgate_runner::{RunRequest, RunnerSettings, SingleCallRunner};
    use tollgate_store::EvidenceSource;
    let s = Server::memory().await;
    let responses = Arc::new(
        HttpClient::new(HttpClientConfig {
            protocol: Protocol::OpenAiResponses,
            base_url: s.mock.base_url(),
            api_key: None,
            connect_timeout_ms: 2_000,
            read_timeout_ms: 10_000,
            max_attempts: 1,
        })
        .unwrap(),
    );
    let mut config = tollgate_core::config::fixtures::text_config();
    config.model = "mock-cut-before-usage".into();
    config.provider = "mock".into();
    let runner = SingleCallRunner::new(
        s.backend.stores(),
        responses.clone(),
        RunnerSettings::new(config),
    )
    .unwrap();
    let acme = Scope::parse("acme").unwrap();
    let view = runner
        .run(RunRequest {
            scope: acme.clone(),
            session_id: tollgate_core::ids::SessionId::parse("s-1").unwrap(),
            operation_key: tollgate_core::ids::OperationKey::parse("sched-cut").unwrap(),
            input_revision: tollgate_core::ids::InputRevision::parse("r").unwrap(),
            intent: tollgate_core::ids::Intent::parse("summarize").unwrap(),
            load_input: async {
                Ok(vec![tollgate_core::message::Message::text(
                    tollgate_core::message::Role::User,
                    "hello",
                )])
            }
            .boxed(),
            cancel: CancellationToken::new(),
            limits: Vec::new(),
        })
        .await
        .unwrap();
    assert_eq!(
        view.state,
        tollgate_core::view::ViewState::ReconciliationRequired
    );
    let id = view.execution_id.unwrap();
    let settings = tollgate_server::config::SchedulerSettings {
        interval_ms: 1000,
        batch: 10,
    };
    let metrics = Arc::new(Metrics::default());
    let mut off = Scheduler::new(s.backend.clone(), settings, 60_000, metrics.clone());
    assert_eq!(off.pass(&CancellationToken::new()).await.errors, 0);
    assert!(s
        .backend
        .stores()
        .evidence_for(id)
        .await
        .unwrap()
        .is_empty());
    let mut fetchers = tollgate_server::app::Fetchers::new();
    fetchers.insert("mock".into(), responses);
    let mut on = Scheduler::new(s.backend.clone(), settings, 60_000, metrics)
        .with_evidence_fetch(Some(Arc::new(fetchers)));
    for _ in 0..2 {
        assert_eq!(on.pass(&CancellationToken::new()).await.errors, 0);
    }
    let evidence = s.backend.stores().evidence_for(id).await.unwrap();
    assert_eq!(evidence.len(), 1, "{evidence:?}");
    assert_eq!(evidence[0].source, EvidenceSource::Late);
    assert!(evidence[0].exact);
    let (_, read, _) = s.get("/v1/calls/sched-cut", &s.caller).await;
    assert_eq!(read["state"], "reconciliation_required", "never settled");
    s.stop().await;
}

/// The finance feed over HTTP: finance keys only, the key's scope only, pages resumed from
/// `next` without repeats, an empty page keeps the cursor, a foreign cursor is refused.
#[tokio::test]
async fn sc_142_finance_feed_pages_the_scope_for_finance_keys() {
    let s = Server::memory().await;
    let finance = s
        .keys
        .create(&Scope::parse("acme").unwrap(), KeyRole::Finance)
        .await
        .unwrap()
        .expose()
        .to_string();
    let mut keys = Vec::new();
    for i in 0..3 {
        let key = format!("feed-{i}");
        let (status, view, _) = s
            .post("/v1/calls", &s.caller, &call("summarize", &key, "r", "hi"))
            .await;
        assert_eq!(status, StatusCode::OK, "{view}");
        keys.push(key);
    }
    let (status, _, _) = s
        .post(
            "/v1/calls",
            &s.stranger,
            &call("summarize", "feed-x", "r", "hi"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    let (status, answer, _) = s.get("/v1/finance/settlements", &s.caller).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (status, answer, _) = s.get("/v1/finance/settlements", &s.operator).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");

    let mut seen = Vec::new();
    let mut path = "/v1/finance/settlements?limit=2".to_string();
    let mut pages = 0;
    loop {
        let (status, page, _) = s.get(&path, &finance).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let rows = page["settlements"].as_array().unwrap();
        for row in rows {
            assert_eq!(row["scope"], "acme");
            assert!(row["amount"].is_string(), "{row}");
            seen.push(row["operation_key"].as_str().unwrap().to_string());
        }
        let next = page["next"].as_str().unwrap().to_string();
        if rows.is_empty() {
            assert!(
                path.ends_with(&format!("after={next}")),
                "an empty page keeps the cursor"
            );
            break;
        }
        assert_eq!(rows.last().unwrap()["cursor"].as_str(), Some(next.as_str()));
        path = format!("/v1/finance/settlements?limit=2&after={next}");
        pages += 1;
    }
    assert_eq!(pages, 2);
    assert_eq!(
        seen, keys,
        "every settlement of the scope once, in settlement order"
    );

    for bad in ["junk", "1", "-1.2", "1.2.3"] {
        let (status, answer, _) = s
            .get(&format!("/v1/finance/settlements?after={bad}"), &finance)
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request");
    }
    let (status, _, _) = s.get("/v1/finance/settlements?since=1", &finance).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "unknown query field");
    s.stop().await;
}
