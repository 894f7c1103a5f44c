//! The OpenAI-compatible front door, over HTTP with reqwest and with the official `openai`
//! Python and Node SDKs as real clients (`examples/openai_sdk.py`, `examples/openai_sdk.mjs`).
#![cfg(test)]

use tollgate_testkit::sdk_tour;
mod support;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{read_until, Server, SECRET};

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

    // Other messages under the same key: the default input revision differs, so a conflict,
    // 422 (SC-209): a retry of it cannot succeed.
    let (status, conflict, text) = post_chat(&s, &s.caller, &key, &chat("summarize", SECRET)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{conflict}");
    assert_eq!(conflict["error"]["code"], "conflict");
    assert_eq!(conflict["error"]["type"], "invalid_request_error");
    assert_eq!(conflict["error"]["fields"], json!(["input_revision"]));
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

    // A field the door does not take is refused by name (SC-211).
    let mut body = chat("summarize", "x");
    body["frequency_penalty"] = json!(0.5);
    let (status, unknown, _) =
        post_chat(&s, &s.caller, &[("idempotency-key", "chat-2")], &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{unknown}");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `frequency_penalty`"),
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

/// POSTs a chat body with `key`: status, the retry headers (`retry-after`, `x-should-retry`)
/// and the body.
async fn post_keyed(
    s: &Server,
    key: &str,
    body: &Value,
) -> (StatusCode, [Option<String>; 2], Value) {
    let response = s
        .http
        .post(format!("{}/v1/chat/completions", s.base))
        .bearer_auth(&s.caller)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let headers = [header("retry-after"), header("x-should-retry")];
    (status, headers, response.json().await.unwrap())
}

async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// SC-209: the front door answers a completion only for a completed call. A retry that arrives
/// while the first request runs is 409 `in_progress` (`conflict_error`) with `Retry-After`,
/// which the SDKs back off on and retry; the retry after it gets the stored completion, and the
/// provider saw one request. A call that may have been sent but whose cost is not proven is 502
/// `reconciliation_required` with `x-should-retry: false`, on its first answer and its replays,
/// never an empty completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_209_retries_get_statuses_the_sdks_understand() {
    let s = Server::memory().await;
    let body = chat("slow", "still running");
    let first = {
        let (http, base, caller, body) = (
            s.http.clone(),
            s.base.clone(),
            s.caller.clone(),
            body.clone(),
        );
        tokio::spawn(async move {
            let response = http
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(caller)
                .header("idempotency-key", "busy-chat")
                .json(&body)
                .send()
                .await
                .unwrap();
            (response.status(), response.json::<Value>().await.unwrap())
        })
    };
    wait_until("the mock receives the call", || s.mock.request_count() == 1).await;
    let (status, [retry_after, _], busy) = post_keyed(&s, "busy-chat", &body).await;
    assert_eq!(status, StatusCode::CONFLICT, "{busy}");
    assert_eq!(busy["error"]["code"], "in_progress");
    assert_eq!(busy["error"]["type"], "conflict_error");
    assert_eq!(busy["error"]["retry_after"], 1);
    assert_eq!(retry_after.as_deref(), Some("1"));
    let (status, done) = first.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{done}");
    let (status, [retry_after, _], replay) = post_keyed(&s, "busy-chat", &body).await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_eq!(retry_after, None);
    assert_eq!(replay["id"], done["id"]);
    assert_eq!(replay["choices"][0]["message"]["content"], "still running");
    assert_eq!(replay["tollgate"]["replayed"], true);
    assert_eq!(s.mock.request_count_for("still running"), 1);

    // The stream is cut before its usage: the call awaits an operator.
    for _ in 0..2 {
        let (status, [_, should_retry], cut) =
            post_keyed(&s, "cut-chat", &chat("cut", "cut words")).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{cut}");
        assert_eq!(cut["error"]["code"], "reconciliation_required");
        assert_eq!(cut["error"]["type"], "server_error");
        assert!(cut["error"]["execution_id"].is_string(), "{cut}");
        assert_eq!(should_retry.as_deref(), Some("false"));
    }
    assert_eq!(
        s.mock.request_count_for("cut words"),
        1,
        "the replay sent nothing"
    );
    let (status, view, _) = s.get("/v1/calls/cut-chat", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["state"], "reconciliation_required");
    s.stop().await;
}

/// A provider that records every request body and answers one short completion.
struct Capture {
    base: String,
    bodies: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

const CAPTURED_STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,",
    "\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,",
    "\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"chatcmpl-c\",\"object\":\"chat.completion.chunk\",\"choices\":[],",
    "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"total_tokens\":6}}\n\n",
    "data: [DONE]\n\n"
);

impl Capture {
    async fn start() -> Self {
        let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let kept = kept.clone();
                async move {
                    kept.lock().unwrap().push(body);
                    ([("content-type", "text/event-stream")], CAPTURED_STREAM)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { base, bodies, task }
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }
}

/// Two text profiles on the capturing provider: `narrow`, under a session cap that its hold at
/// its own `max_tokens` (64) exceeds and a hold at 16 fits; `fixed`, which sets its temperature
/// and sends the request's user and metadata.
fn narrow_profiles(capture: &str) -> String {
    let profile = |name: &str, extra: &str| {
        format!(
            "[[profiles]]\nname = \"{name}\"\nkind = \"text\"\nprovider = \"capture\"\n\
             model = \"mock-capture\"\npolicy_version = \"policy-1\"\nprice_version = \"prices-c\"\n\
             consumer = \"team-n\"\nmax_tokens = 64\nmax_input_chars = 200\n{extra}\n"
        )
    };
    format!(
        "[[providers]]\nname = \"capture\"\nkind = \"openai-chat\"\nbase_url = \"{capture}\"\n\n\
         [[prices]]\nversion = \"prices-c\"\ncurrency = \"USD\"\n\
         [prices.models.\"mock-capture\"]\ninput = \"1.00\"\noutput = \"2.00\"\n\
         cache_read = \"0.10\"\ncache_write = \"1.25\"\nreasoning = \"2.00\"\n\n{}{}",
        profile("narrow", "[profiles.caps]\nsession_block = \"0.0001\""),
        profile(
            "fixed",
            "temperature = 0.2\n[profiles.request_fields]\nsend_user = true\nsend_metadata = true"
        ),
    )
}

fn message(body: &Value) -> String {
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// SC-211: the fields SDK code passes. `max_tokens` up to the profile's is sent and fits the hold
/// (the profile's own worst case exceeds the cap, the request's lower one fits); sampling the
/// profile leaves open passes through; `user` and `metadata` are recorded with the call and sent
/// only where the profile says; a replay with another `max_tokens` is a conflict naming it, and
/// sends nothing; a value above the profile's, a value the profile fixes, tools the profile does
/// not have and a field the door does not take are refused by name, writing and sending nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_211_the_fields_sdk_code_passes_narrow_the_profile() {
    let capture = Capture::start().await;
    let s = Server::start_with(
        tollgate_server::Backend::memory(),
        &narrow_profiles(&capture.base),
    )
    .await;
    let hi = chat("narrow", "hi");
    let (status, _, blocked) = post_keyed(&s, "wide", &hi).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{blocked}");
    assert_eq!(blocked["error"]["kind"], "exceeds_cap");

    let mut narrow = hi.clone();
    for (field, value) in [
        ("max_tokens", json!(16)),
        ("temperature", json!(0.3)),
        ("top_p", json!(0.9)),
        ("stop", json!("END")),
        ("seed", json!(7)),
        ("user", json!("end-user-1")),
        ("metadata", json!({"team": "checkout"})),
        ("response_format", json!({"type": "text"})),
    ] {
        narrow[field] = value;
    }
    let (status, _, done) = post_keyed(&s, "narrow-1", &narrow).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["choices"][0]["message"]["content"], "ok");
    let sent = capture.bodies();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["max_tokens"], 16);
    assert_eq!(sent[0]["temperature"].to_string(), "0.3");
    assert_eq!(sent[0]["top_p"].to_string(), "0.9");
    assert_eq!(sent[0]["stop"], json!(["END"]));
    assert_eq!(sent[0]["seed"], 7);
    assert!(
        sent[0].get("user").is_none() && sent[0].get("metadata").is_none(),
        "{}",
        sent[0]
    );
    let scope = tollgate_core::ids::Scope::parse("acme").unwrap();
    let key = tollgate_core::ids::OperationKey::parse("narrow-1").unwrap();
    let record = s
        .backend
        .stores()
        .execution(&scope, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.binding.config.max_tokens, 16);
    assert_eq!(record.binding.config.user.as_deref(), Some("end-user-1"));
    assert_eq!(record.binding.config.metadata["team"], "checkout");

    // The same request replays; another max_tokens under the key is a conflict naming it.
    let (status, _, replay) = post_keyed(&s, "narrow-1", &narrow).await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_eq!(replay["tollgate"]["replayed"], true);
    let mut other = narrow.clone();
    other["max_tokens"] = json!(8);
    let (status, _, conflict) = post_keyed(&s, "narrow-1", &other).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{conflict}");
    assert_eq!(conflict["error"]["code"], "conflict");
    assert_eq!(conflict["error"]["fields"], json!(["config.max_tokens"]));
    assert_eq!(capture.bodies().len(), 1, "neither sent anything");

    let tool = json!([{"type": "function", "function": {"name": "lookup", "parameters": {}}}]);
    for (i, (field, value, says)) in [
        (
            "max_tokens",
            json!(65),
            "max_tokens: at most the profile's 64",
        ),
        ("max_completion_tokens", json!(0), "max_tokens: at least 1"),
        ("tools", tool, "tools: the profile fixes it"),
        (
            "tool_choice",
            json!("required"),
            "tool_choice: the profile fixes it",
        ),
        (
            "response_format",
            json!({"type": "json_object"}),
            "response_format: the profile fixes it",
        ),
        (
            "temperature",
            json!(0.123),
            "temperature: temperature has more than 2 fraction digits",
        ),
        (
            "stop",
            json!(["a", "b", "c", "d", "e"]),
            "stop: at most 4 sequences",
        ),
        ("logprobs", json!(true), "unknown field `logprobs`"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut body = hi.clone();
        if !field.starts_with("max_") {
            body["max_tokens"] = json!(16);
        }
        body[field] = value;
        let key = format!("refused-{i}");
        let (status, _, refused) = post_keyed(&s, &key, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {refused}");
        assert_eq!(refused["error"]["code"], "invalid_request");
        assert!(message(&refused).contains(says), "{field}: {refused}");
        let (status, _, _) = s.get(&format!("/v1/calls/{key}"), &s.caller).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{field}: nothing written");
    }
    assert_eq!(capture.bodies().len(), 1, "nothing refused was sent");

    // A profile that sets its temperature fixes it; one that says so sends user and metadata.
    let mut warm = chat("fixed", "hi");
    warm["temperature"] = json!(0.5);
    let (status, _, refused) = post_keyed(&s, "fixed-0", &warm).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        message(&refused).starts_with("temperature: the profile fixes it"),
        "{refused}"
    );
    warm["temperature"] = json!(0.2);
    warm["user"] = json!("end-user-2");
    warm["metadata"] = json!({"team": "search"});
    let (status, _, done) = post_keyed(&s, "fixed-1", &warm).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let sent = capture.bodies();
    assert_eq!(sent[1]["temperature"].to_string(), "0.2");
    assert_eq!(sent[1]["user"], "end-user-2");
    assert_eq!(sent[1]["metadata"], json!({"team": "search"}));

    // A step runs under its root's snapshot: nothing in it can be narrowed.
    let mut step = chat("agent-step", "Paris");
    step["max_tokens"] = json!(16);
    let (status, _, refused) = post_keyed(&s, "step-narrow", &step).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(message(&refused).contains("root's snapshot"), "{refused}");
    s.stop().await;
    capture.task.abort();
}

#[tokio::test]
async fn sc_133_sc_209_the_official_openai_sdk_is_a_working_client() {
    sdk_tour(Server::memory().await).await;
}

#[tokio::test]
async fn sc_133_sc_209_the_official_openai_sdk_is_a_working_client_on_postgres() {
    let admin = tollgate_testkit::pg::test_admin_url();
    let stores = std::sync::Arc::new(
        tollgate_testkit::pg::fresh_test_database(&admin)
            .await
            .unwrap(),
    );
    sdk_tour(Server::start(tollgate_server::Backend::Postgres(stores)).await).await;
}

/// The slow profile of the test server (`support::SLOW_MS`).
const SLOW: sdk_tour::Slow = sdk_tour::Slow {
    profile: "slow",
    ms: support::SLOW_MS,
};

/// The SDK's tour against `s` at its default retry settings (SC-209, SC-211): one provider
/// request each for the call, the common fields, the retried call and the stream, none for the
/// rest.
async fn sdk_tour(s: Server) {
    let python = sdk_tour::sdk_python();
    sdk_tour::run_tour(&python, "examples/openai_sdk.py", &s.base, &s.caller, SLOW).await;
    sent_once_each(&s);
    s.stop().await;
}

/// The tour's provider requests: the retried call once among four.
fn sent_once_each(s: &Server) {
    assert_eq!(s.mock.request_count_for(sdk_tour::RETRIED_PROMPT), 1);
    assert_eq!(s.mock.request_count(), 4);
}

/// SC-162: the official `openai` npm package as a client of the front door: the same tour as
/// the Python SDK's, one provider request per call.
#[tokio::test]
async fn sc_162_sc_209_the_official_openai_node_sdk_is_a_working_client() {
    let node = sdk_tour::sdk_node();
    let s = Server::memory().await;
    sdk_tour::run_tour(&node, "examples/openai_sdk.mjs", &s.base, &s.caller, SLOW).await;
    sent_once_each(&s);
    s.stop().await;
}

/// A provider that sends its first delta, then holds its stream open until `release`.
struct HeldProvider {
    base: String,
    release: std::sync::Arc<tokio::sync::Notify>,
    _task: tokio::task::JoinHandle<()>,
}

impl HeldProvider {
    async fn start() -> Self {
        let release = std::sync::Arc::new(tokio::sync::Notify::new());
        let held = release.clone();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move || {
                let held = held.clone();
                async move {
                    let chunk = |delta: &str, finish: &str| {
                        format!(
                            "data: {{\"id\":\"chatcmpl-h\",\"object\":\"chat.completion.chunk\",\
                             \"choices\":[{{\"index\":0,\"delta\":{delta},\
                             \"finish_reason\":{finish}}}]}}\n\n"
                        )
                    };
                    let first = chunk(r#"{"role":"assistant","content":"first "}"#, "null");
                    let rest = format!(
                        "{}{}data: {{\"id\":\"chatcmpl-h\",\"object\":\"chat.completion.chunk\",\
                         \"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":2,\
                         \"total_tokens\":7}}}}\n\ndata: [DONE]\n\n",
                        chunk(r#"{"content":"second"}"#, "null"),
                        chunk("{}", "\"stop\""),
                    );
                    let body = futures::stream::once(async move { first }).chain(
                        futures::stream::once(async move {
                            held.notified().await;
                            rest
                        }),
                    );
                    let body = body.map(|s| Ok::<_, std::convert::Infallible>(s.into_bytes()));
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

fn held_profiles(base: &str) -> String {
    format!(
        "[[providers]]\nname = \"held\"\nkind = \"openai-chat\"\nbase_url = \"{base}\"\n\n\
         [[prices]]\nversion = \"prices-h\"\ncurrency = \"USD\"\n\
         [prices.models.\"mock-held\"]\ninput = \"1.00\"\noutput = \"2.00\"\n\
         cache_read = \"0.10\"\ncache_write = \"1.25\"\nreasoning = \"2.00\"\n\n\
         [[profiles]]\nname = \"held\"\nkind = \"text\"\nprovider = \"held\"\n\
         model = \"mock-held\"\npolicy_version = \"policy-1\"\nprice_version = \"prices-h\"\n\
         consumer = \"team-h\"\nmax_tokens = 64\nmax_input_chars = 200\n\
         [profiles.caps]\nsession_block = \"1.00\"\n"
    )
}

/// SC-213: a streamed text call reaches the client as the provider sends it: the client reads
/// the first delta while the provider still holds its stream open before the second; the last
/// chunk, with the receipt, follows the settlement. A replay streams the stored answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_213_a_streamed_call_reaches_the_client_as_the_provider_sends_it() {
    let provider = HeldProvider::start().await;
    let s = Server::start_with(
        tollgate_server::Backend::memory(),
        &held_profiles(&provider.base),
    )
    .await;
    let mut body = chat("held", "hi");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let post = || {
        s.http
            .post(format!("{}/v1/chat/completions", s.base))
            .bearer_auth(&s.caller)
            .header("idempotency-key", "live-1")
            .json(&body)
            .send()
    };
    let mut response = post().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["tollgate-stream"], "live");
    let mut seen = String::new();
    read_until(&mut response, &mut seen, "first ").await;
    assert!(!seen.contains("second"), "{seen}");
    provider.release.notify_one();
    read_until(&mut response, &mut seen, "data: [DONE]").await;
    let events: Vec<Value> = seen
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "first second");
    let ids: std::collections::BTreeSet<&str> =
        events.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), 1, "one id for the whole stream: {ids:?}");
    let last = events
        .iter()
        .find(|e| e["choices"][0]["finish_reason"] == "stop")
        .expect("a finishing chunk");
    assert_eq!(last["tollgate"]["state"], "completed");
    assert!(last["tollgate"]["receipt"]["amount"].is_string(), "{last}");
    let usage = events.last().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    // A replay of the streamed call streams the stored answer, governed, sending nothing.
    let replay = post().await.unwrap();
    assert_eq!(replay.headers()["tollgate-stream"], "governed");
    let replayed = replay.text().await.unwrap();
    assert!(replayed.contains("first second"), "{replayed}");
    assert!(replayed.contains("\"replayed\":true"), "{replayed}");
}

/// SC-213: a client that hangs up in the middle of a live stream changes nothing: the call
/// completes, settles and stores its whole output, and a replay answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_213_a_client_that_hangs_up_mid_stream_changes_nothing() {
    let provider = HeldProvider::start().await;
    let s = Server::start_with(
        tollgate_server::Backend::memory(),
        &held_profiles(&provider.base),
    )
    .await;
    let mut body = chat("held", "hi");
    body["stream"] = json!(true);
    let mut response = s
        .http
        .post(format!("{}/v1/chat/completions", s.base))
        .bearer_auth(&s.caller)
        .header("idempotency-key", "live-gone")
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    read_until(&mut response, &mut seen, "first ").await;
    // The client goes away while the provider still holds its stream.
    drop(response);
    provider.release.notify_one();
    let mut view = Value::Null;
    for _ in 0..100 {
        let (status, answer, _) = s.get("/v1/calls/live-gone", &s.caller).await;
        if status == StatusCode::OK && answer["state"] == "completed" {
            view = answer;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        view["state"], "completed",
        "the call did not complete: {view}"
    );
    assert_eq!(view["output"]["text"], "first second");
    assert!(view["receipt"]["amount"].is_string(), "{view}");
}
