//! The OpenAI-compatible front door, over HTTP with reqwest and with the official `openai`
//! Python and Node SDKs as real clients (`examples/openai_sdk.py`, `examples/openai_sdk.mjs`).
#![cfg(test)]

use tollgate_testkit::sdk_tour;
mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{Server, SECRET};

fn chat(model: &str, text: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": text}]})
}

async fn post_chat(
    s: &Server,
    key: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (StatusCode, Value, String) {
    let mut request = s
        .http
        .post(format!("{}/v1/chat/completions", s.base))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    )
}

#[tokio::test]
async fn sc_130_a_completion_its_replay_a_conflict_and_openai_shaped_errors() {
    let s = Server::memory().await;
    let key = [("idempotency-key", "chat-1")];
    let (status, first, _) = post_chat(&s, &s.caller, &key, &chat("summarize", "hello")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["model"], "summarize");
    assert_eq!(first["choices"][0]["message"]["role"], "assistant");
    assert_eq!(first["choices"][0]["message"]["content"], "hello");
    assert_eq!(first["choices"][0]["finish_reason"], "stop");
    assert!(
        first["usage"]["total_tokens"].as_u64().unwrap() > 0,
        "{first}"
    );
    assert_eq!(first["tollgate"]["state"], "completed");
    assert_eq!(first["tollgate"]["outcome"], "success");
    assert_eq!(first["tollgate"]["replayed"], false);
    assert!(
        first["tollgate"]["receipt"]["amount"].is_string(),
        "{first}"
    );
    assert_eq!(s.mock.request_count(), 1);

    // The headers' defaults are the documented ones: the call reads back under its key.
    let (status, view, _) = s.get("/v1/calls/chat-1", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["execution_id"], first["tollgate"]["execution_id"]);

    let (status, replay, _) = post_chat(&s, &s.caller, &key, &chat("summarize", "hello")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(replay["id"], first["id"]);
    assert_eq!(replay["choices"][0]["message"]["content"], "hello");
    assert_eq!(replay["tollgate"]["replayed"], true);
    assert_eq!(s.mock.request_count(), 1, "a replay sends nothing");

    // Other messages under the same key: the default input revision differs, so a conflict.
    let (status, conflict, text) = post_chat(&s, &s.caller, &key, &chat("summarize", SECRET)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    assert_eq!(conflict["error"]["code"], "conflict");
    assert!(conflict["error"]["type"].is_string());
    assert!(conflict["error"]["message"].is_string());
    assert!(!text.contains(SECRET), "{text}");

    // No Idempotency-Key: 400, nothing written or sent.
    let (status, missing, _) = post_chat(&s, &s.caller, &[], &chat("summarize", "x")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{missing}");
    assert_eq!(missing["error"]["code"], "invalid_request");
    assert_eq!(missing["error"]["type"], "invalid_request_error");
    assert!(missing["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Idempotency-Key"));

    // A profile value in the body is an unknown field (SC-6), named.
    let mut body = chat("summarize", "x");
    body["temperature"] = json!(0.5);
    let (status, unknown, _) =
        post_chat(&s, &s.caller, &[("idempotency-key", "chat-2")], &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{unknown}");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("temperature"),
        "{unknown}"
    );

    // A system message is a profile value too; an unknown model is 422.
    let body = json!({"model": "summarize", "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]});
    let (status, system, _) =
        post_chat(&s, &s.caller, &[("idempotency-key", "chat-3")], &body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{system}");
    let (status, model, _) = post_chat(
        &s,
        &s.caller,
        &[("idempotency-key", "chat-4")],
        &chat("gpt-4o", "x"),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{model}");
    assert_eq!(model["error"]["code"], "invalid_request");

    // Authentication failures are in OpenAI's shape too.
    let (status, unauth, _) = post_chat(&s, "tg_nope", &key, &chat("summarize", "x")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(unauth["error"]["code"], "unauthenticated");
    assert_eq!(unauth["error"]["type"], "authentication_error");
    let (status, forbidden, _) = post_chat(&s, &s.operator, &key, &chat("summarize", "x")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{forbidden}");
    assert_eq!(forbidden["error"]["type"], "permission_error");
    assert_eq!(s.mock.request_count(), 1);
    s.stop().await;
}

#[tokio::test]
async fn sc_131_stream_true_answers_chunks_after_settlement_then_done() {
    let s = Server::memory().await;
    let mut body = chat("summarize", "streamed");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let response = s
        .http
        .post(format!("{}/v1/chat/completions", s.base))
        .bearer_auth(&s.caller)
        .header("idempotency-key", "chat-stream-1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = response.text().await.unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "streamed");
    let finish = chunks
        .iter()
        .find(|c| c["choices"][0]["finish_reason"].is_string())
        .unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert_eq!(finish["tollgate"]["state"], "completed");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["total_tokens"].as_u64().unwrap() > 0);
    // Emitted after settlement: the settled call is already readable with its receipt.
    let (_, view, _) = s.get("/v1/calls/chat-stream-1", &s.caller).await;
    assert_eq!(view["receipt"], finish["tollgate"]["receipt"]);
    s.stop().await;
}

#[tokio::test]
async fn sc_132_tool_calls_of_a_step_profile_map_to_tool_calls() {
    let s = Server::memory().await;
    let (status, root, _) = s
        .post(
            "/v1/roots",
            &s.caller,
            &json!({"root_key": "chat-root", "profile": "agent-step", "session_id": "s-1",
                    "intent": "agent", "input_revision": "r-1", "deadline_ms": 60000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{root}");
    // Without the root header a step profile is refused.
    let (status, _, _) = post_chat(
        &s,
        &s.caller,
        &[("idempotency-key", "step-0")],
        &chat("agent-step", "Paris"),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let headers = [
        ("idempotency-key", "step-1"),
        ("tollgate-root", "chat-root"),
    ];
    let (status, step, _) = post_chat(&s, &s.caller, &headers, &chat("agent-step", "Paris")).await;
    assert_eq!(status, StatusCode::OK, "{step}");
    let call = &step["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "extract_record");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args.is_object(), "{args}");
    assert_eq!(step["choices"][0]["finish_reason"], "tool_calls");

    // The tool's result goes back as a `tool` message and is accepted as the next step's input.
    let call_id = call["id"].as_str().unwrap();
    let next = json!({"model": "agent-step", "messages": [
        {"role": "user", "content": "Paris"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "stored"}
    ]});
    let headers = [
        ("idempotency-key", "step-2"),
        ("tollgate-root", "chat-root"),
    ];
    let (status, second, _) = post_chat(&s, &s.caller, &headers, &next).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["tollgate"]["state"], "completed", "{second}");
    s.stop().await;
}

#[tokio::test]
async fn sc_133_the_official_openai_sdk_is_a_working_client() {
    sdk_tour(Server::memory().await).await;
}

#[tokio::test]
async fn sc_133_the_official_openai_sdk_is_a_working_client_on_postgres() {
    let admin = tollgate_testkit::pg::test_admin_url();
    let stores = std::sync::Arc::new(
        tollgate_testkit::pg::fresh_test_database(&admin)
            .await
            .unwrap(),
    );
    sdk_tour(Server::start(tollgate_server::Backend::Postgres(stores)).await).await;
}

/// The SDK's tour (call, replay, conflict, stream, no key) against `s`: one provider request for
/// the call and one for the stream, none for the rest.
async fn sdk_tour(s: Server) {
    let python = sdk_tour::sdk_python();
    sdk_tour::run_tour(&python, "examples/openai_sdk.py", &s.base, &s.caller).await;
    // One send for the call, one for the stream: the replay, the conflict and the keyless
    // request sent nothing.
    assert_eq!(s.mock.request_count(), 2);
    s.stop().await;
}

/// SC-162: the official `openai` npm package as a client of the front door: the same tour as
/// the Python SDK's (call, replay, conflict, stream, no key), one provider request per call.
#[tokio::test]
async fn sc_162_the_official_openai_node_sdk_is_a_working_client() {
    let node = sdk_tour::sdk_node();
    let s = Server::memory().await;
    sdk_tour::run_tour(&node, "examples/openai_sdk.mjs", &s.base, &s.caller).await;
    assert_eq!(s.mock.request_count(), 2);
    s.stop().await;
}
