//! The Anthropic Messages door (SC-212), over HTTP with reqwest and with the official
//! `anthropic` Python SDK and `@anthropic-ai/sdk` Node SDK as real clients
//! (`examples/anthropic_sdk.py`, `examples/anthropic_sdk.mjs`).
#![cfg(test)]

mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{read_until, Server, SECRET};
use tollgate_testkit::sdk_tour::repo_path;

fn ask(model: &str, text: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": text}]})
}

struct Answer {
    status: StatusCode,
    body: Value,
    text: String,
    headers: reqwest::header::HeaderMap,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// Checks Anthropic's error shape and returns `(type, code)`.
    fn error(&self) -> (String, String) {
        assert_eq!(self.body["type"], "error", "{}", self.text);
        assert!(self.body["error"]["message"].is_string(), "{}", self.text);
        let kind = self.body["error"]["type"].as_str().unwrap().to_string();
        let code = self.body["error"]["code"].as_str().unwrap().to_string();
        (kind, code)
    }
}

/// `POST path` with the key in `x-api-key`, as Anthropic's API takes it, and the SDKs' other
/// headers.
async fn post_as(
    s: &Server,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: &Value,
) -> Answer {
    let mut request = s
        .http
        .post(format!("{}{path}", s.base))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("x-stainless-lang", "python")
        .header("x-stainless-retry-count", "0")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
        headers,
    }
}

async fn post_messages(s: &Server, key: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    post_as(s, "/v1/messages", Some(key), headers, body).await
}

#[tokio::test]
async fn sc_212_a_message_its_replay_a_conflict_and_anthropic_shaped_errors() {
    let s = Server::memory().await;
    let key = [("idempotency-key", "msg-1")];
    let first = post_messages(&s, &s.caller, &key, &ask("summarize", "hello")).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    let m = &first.body;
    assert!(m["id"].as_str().unwrap().starts_with("msg_"), "{m}");
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["model"], "summarize");
    assert_eq!(m["content"], json!([{"type": "text", "text": "hello"}]));
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["stop_sequence"], Value::Null);
    // The usage is the receipt's, class by class.
    let receipt = &m["tollgate"]["receipt"]["usage"];
    assert!(receipt["input"].as_u64().unwrap() > 0, "{m}");
    assert!(receipt["output"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["usage"]["input_tokens"], receipt["input"]);
    assert_eq!(m["usage"]["output_tokens"], receipt["output"]);
    assert_eq!(m["usage"]["cache_read_input_tokens"], receipt["cache_read"]);
    assert_eq!(
        m["usage"]["cache_creation_input_tokens"],
        receipt["cache_write"]
    );
    assert_eq!(m["tollgate"]["state"], "completed");
    assert_eq!(m["tollgate"]["outcome"], "success");
    assert_eq!(m["tollgate"]["replayed"], false);
    assert!(m["tollgate"]["receipt"]["amount"].is_string(), "{m}");
    assert_eq!(first.header("request-id"), first.header("x-request-id"));
    assert!(first.header("request-id").is_some());
    assert_eq!(s.mock.request_count(), 1);

    // The headers' defaults: the call reads back under its key.
    let (status, view, _) = s.get("/v1/calls/msg-1", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["execution_id"], m["tollgate"]["execution_id"]);

    // The same key and body: the stored message, nothing sent. `Authorization: Bearer` works
    // as well as `x-api-key`, and the same key in both is one key.
    let replay = s
        .http
        .post(format!("{}/v1/messages", s.base))
        .bearer_auth(&s.caller)
        .header("x-api-key", &s.caller)
        .header("idempotency-key", "msg-1")
        .json(&ask("summarize", "hello"))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::OK);
    let replay: Value = replay.json().await.unwrap();
    assert_eq!(replay["id"], m["id"]);
    assert_eq!(replay["content"], m["content"]);
    assert_eq!(replay["usage"], m["usage"]);
    assert_eq!(replay["tollgate"]["replayed"], true);
    assert_eq!(s.mock.request_count(), 1, "a replay sends nothing");

    // Other messages under the same key: a conflict (422, which the SDKs do not retry, and
    // `x-should-retry: false`), never quoting the body.
    let conflict = post_messages(&s, &s.caller, &key, &ask("summarize", SECRET)).await;
    assert_eq!(
        conflict.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        conflict.text
    );
    assert_eq!(
        conflict.error(),
        ("invalid_request_error".into(), "conflict".into())
    );
    assert_eq!(conflict.body["error"]["fields"], json!(["input_revision"]));
    assert_eq!(conflict.header("x-should-retry"), Some("false"));
    assert!(!conflict.text.contains(SECRET), "{}", conflict.text);
    // The same messages with another max_tokens: the narrowed snapshot is the binding.
    let mut lower = ask("summarize", "hello");
    lower["max_tokens"] = json!(16);
    let conflict = post_messages(&s, &s.caller, &key, &lower).await;
    assert_eq!(
        conflict.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        conflict.text
    );
    assert_eq!(
        conflict.body["error"]["fields"],
        json!(["config.max_tokens"])
    );

    // No Idempotency-Key: 400, nothing written or sent.
    let missing = post_messages(&s, &s.caller, &[], &ask("summarize", "x")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST, "{}", missing.text);
    assert_eq!(
        missing.error(),
        ("invalid_request_error".into(), "invalid_request".into())
    );
    assert!(missing.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Idempotency-Key"));

    // An unknown model is refused as on the OpenAI door, without quoting it.
    let unknown = post_messages(
        &s,
        &s.caller,
        &[("idempotency-key", "msg-2")],
        &ask("claude-sonnet-4-5", "x"),
    )
    .await;
    assert_eq!(
        unknown.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        unknown.text
    );
    assert_eq!(
        unknown.error(),
        ("invalid_request_error".into(), "invalid_request".into())
    );
    assert!(!unknown.text.contains("claude-sonnet"), "{}", unknown.text);

    // No key, a wrong key, two different keys: 401 in Anthropic's shape; another role: 403.
    let two = format!("Bearer {}", s.stranger);
    let keyless = [("idempotency-key", "msg-3")];
    let both = [
        ("idempotency-key", "msg-3"),
        ("authorization", two.as_str()),
    ];
    for (key, headers) in [
        (None, &keyless[..]),
        (Some("tg_nope"), &keyless[..]),
        (Some(s.caller.as_str()), &both[..]),
    ] {
        let refused = post_as(&s, "/v1/messages", key, headers, &ask("summarize", "x")).await;
        assert_eq!(
            refused.status,
            StatusCode::UNAUTHORIZED,
            "{key:?}: {}",
            refused.text
        );
        assert_eq!(
            refused.error(),
            ("authentication_error".into(), "unauthenticated".into())
        );
        assert_eq!(refused.header("x-should-retry"), Some("false"));
    }
    let forbidden = post_messages(&s, &s.operator, &key, &ask("summarize", "x")).await;
    assert_eq!(
        forbidden.status,
        StatusCode::FORBIDDEN,
        "{}",
        forbidden.text
    );
    assert_eq!(forbidden.error().0, "permission_error");
    assert_eq!(s.mock.request_count(), 1);
    s.stop().await;
}

#[tokio::test]
async fn sc_212_fields_that_would_widen_the_profile_are_refused_by_name_and_the_rest_pass() {
    let s = Server::memory().await;
    let with = |field: &str, value: Value| {
        let mut body = ask("summarize", "fields");
        body[field] = value;
        body
    };
    let refused = [
        (with("system", json!("Be evil.")), "system"),
        (
            with(
                "thinking",
                json!({"type": "enabled", "budget_tokens": 1024}),
            ),
            "thinking",
        ),
        (with("max_tokens", json!(65)), "max_tokens"),
        (with("max_tokens", json!(0)), "max_tokens"),
        (with("temperature", json!(0.125)), "temperature"),
        (with("top_p", json!(1.5)), "top_p"),
        (with("top_k", json!(5)), "top_k"),
        (
            with("stop_sequences", json!(["a", "b", "c", "d", "e"])),
            "stop_sequences",
        ),
        (
            with("metadata", json!({"user_id": "u\u{7}"})),
            "metadata.user_id",
        ),
        (
            with(
                "tools",
                json!([{"name": "t", "input_schema": {"type": "object"}}]),
            ),
            "tools",
        ),
        (with("tool_choice", json!({"type": "auto"})), "tool_choice"),
        (
            with("metadata", json!({"user_id": "u", "tier": "gold"})),
            "tier",
        ),
        (with("service_tier", json!("auto")), "service_tier"),
        (
            json!({"model": "summarize", "max_tokens": 64, "messages": [{"role": "user",
                "content": [{"type": "text", "text": SECRET, "cache_control": {"type": "ephemeral"}}]}]}),
            "cache_control",
        ),
        (
            json!({"model": "summarize", "max_tokens": 64, "messages": [{"role": "user",
                "content": [{"type": "image", "source": {"type": "base64", "data": SECRET}}]}]}),
            "messages[0].content[0]",
        ),
        (
            json!({"model": "summarize", "messages": [{"role": "user", "content": "x"}]}),
            "max_tokens",
        ),
    ];
    for (i, (body, field)) in refused.iter().enumerate() {
        let op = format!("fields-{i}");
        let answer = post_messages(&s, &s.caller, &[("idempotency-key", &op)], body).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{field}: {}",
            answer.text
        );
        let (kind, code) = answer.error();
        assert_eq!(
            (kind.as_str(), code.as_str()),
            ("invalid_request_error", "invalid_request")
        );
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{field}: {message}");
        assert!(!answer.text.contains(SECRET), "{}", answer.text);
        assert!(!answer.text.contains("Be evil"), "{}", answer.text);
    }
    assert_eq!(s.mock.request_count(), 0, "nothing refused was sent");
    // What SDK code passes narrows the profile: a lower max_tokens, sampling the profile leaves
    // open, stop sequences, the end user; the tool choice the provider makes without tools; an
    // empty tool list, a null system and Anthropic's `citations: null` on text.
    let body = json!({
        "model": "summarize", "max_tokens": 16, "temperature": 0.7, "top_p": 0.9,
        "stop_sequences": ["END"], "stream": false, "metadata": {"user_id": "user-7"},
        "tools": [], "tool_choice": {"type": "none"}, "system": null,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "fine", "citations": null}]}]
    });
    let answer = post_messages(&s, &s.caller, &[("idempotency-key", "fields-ok")], &body).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert_eq!(answer.body["content"][0]["text"], "fine");
    // The call is bound to the narrowed snapshot: the same key with another temperature is a
    // conflict naming it.
    let mut warmer = body.clone();
    warmer["temperature"] = json!(0.8);
    let conflict = post_messages(&s, &s.caller, &[("idempotency-key", "fields-ok")], &warmer).await;
    assert_eq!(
        conflict.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        conflict.text
    );
    assert_eq!(
        conflict.body["error"]["fields"],
        json!(["config.temperature"])
    );
    assert_eq!(s.mock.request_count(), 1);
    s.stop().await;
}

/// Parses Anthropic's server-sent events into `(event name, data)`.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut lines = e.lines();
            let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
            let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
            let data: Value = serde_json::from_str(data).unwrap();
            assert_eq!(data["type"], name, "{data}");
            (name.to_string(), data)
        })
        .collect()
}

#[tokio::test]
async fn sc_212_stream_true_answers_anthropic_events_after_settlement_with_the_real_usage() {
    let s = Server::memory().await;
    let mut body = ask("summarize", "streamed words");
    body["stream"] = json!(true);
    let answer = post_messages(&s, &s.caller, &[("idempotency-key", "msg-stream-1")], &body).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert!(answer
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = events(&answer.text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let start = &events[0].1["message"];
    let delta = &events[5].1;
    let receipt = &delta["tollgate"]["receipt"]["usage"];
    // Emitted after settlement: the settled call reads back with the same receipt.
    let (_, view, _) = s.get("/v1/calls/msg-stream-1", &s.caller).await;
    assert_eq!(view["receipt"], delta["tollgate"]["receipt"]);
    // The real counts where Anthropic sends them: the input at the start, the output at the end.
    assert!(receipt["input"].as_u64().unwrap() > 0);
    assert!(receipt["output"].as_u64().unwrap() > 0);
    assert_eq!(start["usage"]["input_tokens"], receipt["input"]);
    assert_eq!(
        start["usage"]["cache_read_input_tokens"],
        receipt["cache_read"]
    );
    assert_eq!(
        start["usage"]["cache_creation_input_tokens"],
        receipt["cache_write"]
    );
    assert_eq!(delta["usage"]["output_tokens"], receipt["output"]);
    assert_eq!(delta["usage"]["input_tokens"], receipt["input"]);
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["id"].as_str().unwrap().len(), "msg_".len() + 32);
    assert_eq!(
        events[2].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert_eq!(
        events[3].1["delta"],
        json!({"type": "text_delta", "text": "streamed words"})
    );

    // A replay of the stream streams the stored message; nothing is sent again.
    let again = post_messages(&s, &s.caller, &[("idempotency-key", "msg-stream-1")], &body).await;
    let replayed = self::events(&again.text);
    assert_eq!(replayed[0].1["message"]["id"], start["id"]);
    assert_eq!(replayed[5].1["usage"], delta["usage"]);
    assert_eq!(replayed[5].1["tollgate"]["replayed"], true);
    assert_eq!(s.mock.request_count(), 1);
    s.stop().await;
}

async fn open_root(s: &Server, root: &str) {
    let (status, answer, _) = s
        .post(
            "/v1/roots",
            &s.caller,
            &json!({"root_key": root, "profile": "agent-step", "session_id": "s-1",
                    "intent": "agent", "input_revision": "r-1", "deadline_ms": 60000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// The step profile's tools as Anthropic's request carries them (from `GET /v1/profiles`).
async fn profile_tools(s: &Server) -> Value {
    let (_, profiles, _) = s.get("/v1/profiles", &s.caller).await;
    let profile = profiles["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "agent-step")
        .unwrap()
        .clone();
    let tools: Vec<Value> = profile["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| json!({"name": t["name"], "input_schema": t["input_schema"]}))
        .collect();
    json!(tools)
}

#[tokio::test]
async fn sc_212_a_step_profiles_tool_calls_are_tool_use_blocks_under_the_named_root() {
    let s = Server::memory().await;
    open_root(&s, "msg-root").await;
    let tools = profile_tools(&s).await;
    let mut body = ask("agent-step", "Paris");
    body["tools"] = tools.clone();

    // Without the root header a step profile is refused; other tools than the profile's too.
    let no_root = post_messages(&s, &s.caller, &[("idempotency-key", "step-0")], &body).await;
    assert_eq!(
        no_root.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        no_root.text
    );
    assert!(no_root.text.contains("Tollgate-Root"), "{}", no_root.text);
    let mut other = body.clone();
    other["tools"][0]["description"] = json!("something else");
    let headers = [("idempotency-key", "step-1"), ("tollgate-root", "msg-root")];
    let other = post_messages(&s, &s.caller, &headers, &other).await;
    assert_eq!(other.status, StatusCode::BAD_REQUEST, "{}", other.text);
    assert!(
        other.text.contains("the profile fixes the tools"),
        "{}",
        other.text
    );
    assert_eq!(s.mock.request_count(), 0);

    let step = post_messages(&s, &s.caller, &headers, &body).await;
    assert_eq!(step.status, StatusCode::OK, "{}", step.text);
    let m = &step.body;
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let uses: Vec<&Value> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{m}");
    assert_eq!(uses[0]["name"], "extract_record");
    assert!(uses[0]["input"].is_object(), "{m}");
    assert!(uses[0]["id"].is_string(), "{m}");
    // The step ran under the root: it reads back there.
    let (status, view, _) = s.get("/v1/roots/msg-root/steps/step-1", &s.caller).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["execution_id"], m["tollgate"]["execution_id"]);

    // The tool's result goes back as a tool_result block and is the next step's input; the
    // next step streams its tool call as an input_json_delta.
    let next = json!({"model": "agent-step", "max_tokens": 64, "tools": tools, "stream": true,
    "messages": [
        {"role": "user", "content": "Paris"},
        {"role": "assistant", "content": [uses[0]]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"],
                                      "content": "stored"}]}
    ]});
    let headers = [("idempotency-key", "step-2"), ("tollgate-root", "msg-root")];
    let second = post_messages(&s, &s.caller, &headers, &next).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.text);
    let events = events(&second.text);
    let block = events
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .unwrap();
    assert_eq!(block.1["content_block"]["input"], json!({}));
    let partial: String = events
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    let input: Value = serde_json::from_str(&partial).unwrap();
    assert!(input.is_object(), "{partial}");
    let end = &events.iter().find(|(n, _)| n == "message_delta").unwrap().1;
    assert_eq!(end["delta"]["stop_reason"], "tool_use");
    assert_eq!(end["tollgate"]["state"], "completed");
    assert_eq!(s.mock.request_count(), 2);
    s.stop().await;
}

#[tokio::test]
async fn sc_212_a_retry_while_the_first_call_runs_finds_it_and_sends_nothing() {
    let s = Server::memory().await;
    let body = ask("slow", "slow words");
    let headers = [("idempotency-key", "msg-slow")];
    let first = {
        let (http, base, key, body) = (
            s.http.clone(),
            s.base.clone(),
            s.caller.clone(),
            body.clone(),
        );
        tokio::spawn(async move {
            http.post(format!("{base}/v1/messages"))
                .header("x-api-key", key)
                .header("idempotency-key", "msg-slow")
                .json(&body)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The retry an SDK sends after its own timeout, while the first call runs: 409 with
    // Retry-After, which the SDKs wait out and retry (SC-209); nothing is sent.
    let retry = post_messages(&s, &s.caller, &headers, &body).await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{}", retry.text);
    assert_eq!(
        retry.error(),
        ("conflict_error".into(), "in_progress".into())
    );
    assert!(retry.header("retry-after").is_some(), "{:?}", retry.headers);
    assert_eq!(retry.header("x-should-retry"), Some("true"));
    let first = first.await.unwrap();
    assert_eq!(first["tollgate"]["state"], "completed", "{first}");
    // Once it is done, the same key answers the stored message; one provider request in all.
    let done = post_messages(&s, &s.caller, &headers, &body).await;
    assert_eq!(done.body["id"], first["id"]);
    assert_eq!(done.body["content"][0]["text"], "slow words");
    assert_eq!(done.body["tollgate"]["replayed"], true);
    assert_eq!(s.mock.request_count(), 1);
    s.stop().await;
}

#[tokio::test]
async fn sc_212_a_cap_that_the_call_can_never_fit_is_a_billing_error_not_retried() {
    let s = Server::memory().await;
    let answer = post_messages(
        &s,
        &s.caller,
        &[("idempotency-key", "msg-tight")],
        &ask("tight", "x"),
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::PAYMENT_REQUIRED,
        "{}",
        answer.text
    );
    assert_eq!(
        answer.error(),
        ("billing_error".into(), "cap_blocked".into())
    );
    assert_eq!(answer.body["error"]["cap"], "session");
    assert!(answer.body["error"]["hold"].is_string(), "{}", answer.text);
    assert_eq!(answer.header("x-should-retry"), Some("false"));
    assert_eq!(s.mock.request_count(), 0);
    s.stop().await;
}

#[tokio::test]
async fn sc_212_a_call_awaiting_an_operator_is_an_error_the_sdks_do_not_retry() {
    let s = Server::memory().await;
    // The provider's stream is cut before its usage: the cost is not proven.
    let headers = [("idempotency-key", "msg-cut")];
    let first = post_messages(&s, &s.caller, &headers, &ask("cut", "cut short")).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY, "{}", first.text);
    assert_eq!(
        first.error(),
        ("api_error".into(), "reconciliation_required".into())
    );
    assert_eq!(first.header("x-should-retry"), Some("false"));
    assert!(
        first.body["error"]["execution_id"].is_string(),
        "{}",
        first.text
    );
    // A retry answers the same and sends nothing.
    let again = post_messages(&s, &s.caller, &headers, &ask("cut", "cut short")).await;
    assert_eq!(again.status, StatusCode::BAD_GATEWAY, "{}", again.text);
    assert_eq!(
        again.body["error"]["execution_id"],
        first.body["error"]["execution_id"]
    );
    assert_eq!(s.mock.request_count(), 1);
    s.stop().await;
}

/// A slow profile whose session cap holds one call in flight and not two.
const CAPPED: &str = r#"
[[profiles]]
name = "capped-slow"
kind = "text"
provider = "mock"
model = "mock-slow-1500"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-c"
max_tokens = 64
max_input_chars = 200
run_timeout_ms = 10000
[profiles.caps]
session_block = "0.0002"
"#;

#[tokio::test]
async fn sc_212_a_cap_full_of_holds_in_flight_is_a_rate_limit_retried_after_its_wait() {
    assert_eq!(support::SLOW_MS, 1500, "CAPPED names the slow model");
    let s = Server::start_with(tollgate_server::Backend::memory(), CAPPED).await;
    let first = {
        let (http, base, key) = (s.http.clone(), s.base.clone(), s.caller.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/v1/messages"))
                .header("x-api-key", key)
                .header("idempotency-key", "capped-1")
                .header("tollgate-session", "capped")
                .json(&ask("capped-slow", "first"))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The first call's hold fills the cap while it runs: the second is told to come back.
    let headers = [
        ("idempotency-key", "capped-2"),
        ("tollgate-session", "capped"),
    ];
    let body = ask("capped-slow", "second");
    let wait = post_messages(&s, &s.caller, &headers, &body).await;
    assert_eq!(wait.status, StatusCode::TOO_MANY_REQUESTS, "{}", wait.text);
    assert_eq!(
        wait.error(),
        ("rate_limit_error".into(), "cap_blocked".into())
    );
    assert_eq!(
        wait.body["error"]["kind"], "holds_in_flight",
        "{}",
        wait.text
    );
    assert!(wait.header("retry-after").is_some(), "{:?}", wait.headers);
    assert_eq!(wait.header("x-should-retry"), Some("true"));
    // Once the first settles (below its hold), the retry fits.
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    let retried = post_messages(&s, &s.caller, &headers, &body).await;
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.text);
    assert_eq!(retried.body["content"][0]["text"], "second");
    assert_eq!(s.mock.request_count(), 2);
    s.stop().await;
}

#[tokio::test]
async fn sc_212_count_tokens_answers_the_bound_the_hold_is_fitted_from_and_sends_nothing() {
    let s = Server::memory().await;
    let body = json!({"model": "summarize", "messages": [{"role": "user", "content": "count me"}]});
    let count = post_as(&s, "/v1/messages/count_tokens", Some(&s.caller), &[], &body).await;
    assert_eq!(count.status, StatusCode::OK, "{}", count.text);
    let bound = count.body["input_tokens"].as_u64().unwrap();
    assert_eq!(count.body["tollgate"]["input_tokens_kind"], "upper_bound");
    assert_eq!(count.body["tollgate"]["currency"], "USD");
    assert!(count.body["tollgate"]["hold"].is_string(), "{}", count.text);
    assert_eq!(s.mock.request_count(), 0, "counting sends nothing");
    // The bound is never below what the provider bills for the same messages.
    let call = post_messages(
        &s,
        &s.caller,
        &[("idempotency-key", "msg-counted")],
        &ask("summarize", "count me"),
    )
    .await;
    let billed = call.body["usage"]["input_tokens"].as_u64().unwrap();
    assert!(bound >= billed, "{bound} < {billed}");
    // Its refusals are the door's.
    let mut system = body.clone();
    system["system"] = json!("x");
    let refused = post_as(
        &s,
        "/v1/messages/count_tokens",
        Some(&s.caller),
        &[],
        &system,
    )
    .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.text);
    assert_eq!(refused.error().0, "invalid_request_error");
    let keyless = post_as(&s, "/v1/messages/count_tokens", None, &[], &body).await;
    assert_eq!(keyless.status, StatusCode::UNAUTHORIZED);
    assert_eq!(keyless.error().0, "authentication_error");
    s.stop().await;
}

#[tokio::test]
async fn sc_212_x_api_key_is_read_before_the_body_and_on_the_messages_door_only() {
    let s = Server::memory().await;
    // A keyless request is refused before its body is read: the connection closes.
    let refused = post_as(&s, "/v1/messages", None, &[], &ask("summarize", "x")).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.header("connection"), Some("close"));
    // Other routes read `Authorization: Bearer` alone.
    let response = s
        .http
        .get(format!("{}/v1/profiles", s.base))
        .header("x-api-key", &s.caller)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthenticated");
    s.stop().await;
}

// ---- the official SDKs --------------------------------------------------------------------------

/// The python of `target/pyenv` (or `TOLLGATE_PYTHON`) with the `anthropic` package.
/// # Panics
/// When it or the package is missing, naming how to install them.
fn anthropic_python() -> PathBuf {
    let python = tollgate_testkit::sdk_tour::sdk_python();
    let found = std::process::Command::new(&python)
        .args(["-c", "import anthropic"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "the anthropic Python package is not installed for {}: run `target/pyenv/bin/pip install \
         -r examples/requirements.txt` (as .ci/run does)",
        python.display()
    );
    python
}

/// `node` with `@anthropic-ai/sdk` installed in `examples/node_modules`.
/// # Panics
/// When it or the package is missing, naming how to install them.
fn anthropic_node() -> PathBuf {
    let package = repo_path("examples/node_modules/@anthropic-ai/sdk/package.json");
    assert!(
        package.exists(),
        "the @anthropic-ai/sdk npm package is not installed at {}: run `npm ci --prefix examples` \
         (as .ci/run does)",
        package.display()
    );
    tollgate_testkit::sdk_tour::sdk_node()
}

/// Runs `program script` against the door at `s` and checks its tour: a call, its replay, a
/// retry under the SDK's own timeout and retries, a conflict, a stream with the real usage, a
/// step's tool call, `x-api-key`, no `Idempotency-Key`, no key; one provider request for the call,
/// one for the slow call, one for the stream and two for the steps.
async fn tour(program: &Path, script: &str, s: Server) {
    // The SDKs read credentials and a base URL from the environment: none of them may take
    // part (the tours pass the key and the base URL explicitly).
    let output = tokio::process::Command::new(program)
        .arg(repo_path(script))
        .env("TOLLGATE_BASE_URL", &s.base)
        .env("TOLLGATE_API_KEY", &s.caller)
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("ANTHROPIC_PROFILE")
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{out}\n{err}");
    let steps: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = steps.iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "call",
            "replay",
            "retry",
            "conflict",
            "stream",
            "tools",
            "x_api_key",
            "no_idempotency_key",
            "no_key"
        ]
    );
    let step = |name: &str| steps.iter().find(|s| s["step"] == name).unwrap();
    assert_eq!(
        step("call")["id"],
        step("replay")["id"],
        "the replay is the call"
    );
    assert_eq!(step("call")["id"], step("x_api_key")["id"]);
    // The SDK's own retry after its timeout found the running call (409 in_progress), waited
    // out its Retry-After and got the stored message; the slow call was sent once.
    let retry = step("retry");
    let statuses: Vec<u64> = retry["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert!(
        statuses.first() == Some(&409) && statuses.last() == Some(&200),
        "{retry}"
    );
    assert_eq!(retry["replayed"], true, "{retry}");
    assert_eq!(step("conflict")["status"], 422);
    assert_eq!(step("conflict")["type"], "invalid_request_error");
    assert_eq!(step("conflict")["code"], "conflict");
    let stream = step("stream");
    assert!(stream["input_tokens"].as_u64().unwrap() > 0, "{stream}");
    assert!(stream["output_tokens"].as_u64().unwrap() > 0, "{stream}");
    assert_eq!(stream["input_tokens"], stream["receipt_input"]);
    assert_eq!(stream["output_tokens"], stream["receipt_output"]);
    assert_eq!(step("tools")["name"], "extract_record");
    assert_eq!(step("tools")["stop_reason"], "tool_use");
    assert_eq!(step("no_idempotency_key")["code"], "invalid_request");
    assert_eq!(step("no_key")["status"], 401);
    assert_eq!(step("no_key")["code"], "unauthenticated");
    // The call, the slow call (once, whatever the SDK retried), the stream and two steps.
    assert_eq!(s.mock.request_count(), 5);
    s.stop().await;
}

async fn postgres_server() -> Server {
    let admin = tollgate_testkit::pg::test_admin_url();
    let stores = std::sync::Arc::new(
        tollgate_testkit::pg::fresh_test_database(&admin)
            .await
            .unwrap(),
    );
    Server::start(tollgate_server::Backend::Postgres(stores)).await
}

#[tokio::test]
async fn sc_212_the_official_anthropic_python_sdk_is_a_working_client() {
    tour(
        &anthropic_python(),
        "examples/anthropic_sdk.py",
        Server::memory().await,
    )
    .await;
}

#[tokio::test]
async fn sc_212_the_official_anthropic_python_sdk_is_a_working_client_on_postgres() {
    tour(
        &anthropic_python(),
        "examples/anthropic_sdk.py",
        postgres_server().await,
    )
    .await;
}

#[tokio::test]
async fn sc_212_the_official_anthropic_node_sdk_is_a_working_client_on_postgres() {
    tour(
        &anthropic_node(),
        "examples/anthropic_sdk.mjs",
        postgres_server().await,
    )
    .await;
}

/// An Anthropic-protocol provider that reports its input counts, sends its first delta, then
/// holds its stream open until `release`.
struct HeldAnthropic {
    base: String,
    release: std::sync::Arc<tokio::sync::Notify>,
    _task: tokio::task::JoinHandle<()>,
}

impl HeldAnthropic {
    async fn start() -> Self {
        use futures::StreamExt;
        let release = std::sync::Arc::new(tokio::sync::Notify::new());
        let held = release.clone();
        let app = axum::Router::new().route(
            "/v1/messages",
            axum::routing::post(move || {
                let held = held.clone();
                async move {
                    let event =
                        |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
                    let first = [
                        event(
                            "message_start",
                            json!({"type": "message_start", "message": {
                            "id": "msg_up", "type": "message", "role": "assistant", "content": [],
                            "model": "claude-held", "stop_reason": null, "stop_sequence": null,
                            "usage": {"input_tokens": 12, "output_tokens": 1}}}),
                        ),
                        event(
                            "content_block_start",
                            json!({"type": "content_block_start",
                            "index": 0, "content_block": {"type": "text", "text": ""}}),
                        ),
                        event(
                            "content_block_delta",
                            json!({"type": "content_block_delta",
                            "index": 0, "delta": {"type": "text_delta", "text": "first "}}),
                        ),
                    ]
                    .concat();
                    let rest = [
                        event(
                            "content_block_delta",
                            json!({"type": "content_block_delta",
                            "index": 0, "delta": {"type": "text_delta", "text": "second"}}),
                        ),
                        event(
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": 0}),
                        ),
                        event(
                            "message_delta",
                            json!({"type": "message_delta",
                            "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                            "usage": {"output_tokens": 2}}),
                        ),
                        event("message_stop", json!({"type": "message_stop"})),
                    ]
                    .concat();
                    let body = futures::stream::once(async move { first })
                        .chain(futures::stream::once(async move {
                            held.notified().await;
                            rest
                        }))
                        .map(|s| Ok::<_, std::convert::Infallible>(s.into_bytes()));
                    (
                        [("content-type", "text/event-stream")],
                        axum::body::Body::from_stream(body),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            base,
            release,
            _task: task,
        }
    }
}

/// SC-213 on the Messages door: a provider that reports its input counts before its text
/// streams live — `message_start` with the real input count, the first delta while the
/// provider still holds its stream, the output count after the settlement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_213_the_messages_door_streams_live_with_the_real_input_count_first() {
    let provider = HeldAnthropic::start().await;
    let profiles = format!(
        "[[providers]]\nname = \"held\"\nkind = \"anthropic\"\nbase_url = \"{}\"\n\n\
         [[prices]]\nversion = \"prices-h\"\ncurrency = \"USD\"\n\
         [prices.models.\"claude-held\"]\ninput = \"1.00\"\noutput = \"2.00\"\n\
         cache_read = \"0.10\"\ncache_write = \"1.25\"\nreasoning = \"2.00\"\n\n\
         [[profiles]]\nname = \"held\"\nkind = \"text\"\nprovider = \"held\"\n\
         model = \"claude-held\"\npolicy_version = \"policy-1\"\nprice_version = \"prices-h\"\n\
         consumer = \"team-h\"\nmax_tokens = 64\nmax_input_chars = 200\n",
        provider.base
    );
    let s = Server::start_with(tollgate_server::Backend::memory(), &profiles).await;
    let mut body = ask("held", "hi");
    body["stream"] = json!(true);
    let mut response = s
        .http
        .post(format!("{}/v1/messages", s.base))
        .header("x-api-key", &s.caller)
        .header("anthropic-version", "2023-06-01")
        .header("idempotency-key", "msg-live-1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["tollgate-stream"], "live");
    let mut seen = String::new();
    read_until(&mut response, &mut seen, "first ").await;
    assert!(
        seen.contains("first ") && !seen.contains("second"),
        "{seen}"
    );
    provider.release.notify_one();
    read_until(&mut response, &mut seen, "message_stop").await;
    let events = events(&seen);
    assert_eq!(events[0].0, "message_start");
    assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 12);
    let text: String = events
        .iter()
        .filter(|(name, _)| name == "content_block_delta")
        .filter_map(|(_, e)| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "first second");
    let delta = events
        .iter()
        .find(|(name, _)| name == "message_delta")
        .expect("a message_delta");
    assert_eq!(delta.1["usage"]["output_tokens"], 2);
    assert_eq!(delta.1["usage"]["input_tokens"], 12);
    assert_eq!(delta.1["tollgate"]["state"], "completed");
    assert_eq!(events.last().unwrap().0, "message_stop");
    s.stop().await;
}
