//! Mock provider tests: a real server on port 0, real HTTP requests, raw SSE bodies.

use super::*;
use serde_json::{json, Value};
use std::time::Instant;

const ALL: [Protocol; 3] = [
    Protocol::OpenAiChat,
    Protocol::OpenAiResponses,
    Protocol::Anthropic,
];
const SYSTEM: &str = "Be brief.";
const USER: &str = "hello world";
/// ceil((9 + 11) / 4).
const INPUT_TOKENS: u64 = 5;

async fn start() -> MockProvider {
    MockProvider::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn request(protocol: Protocol, model: &str) -> Value {
    match protocol {
        Protocol::OpenAiChat => json!({
            "model": model, "stream": true, "stream_options": {"include_usage": true},
            "max_tokens": 5,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
        }),
        Protocol::OpenAiResponses => json!({
            "model": model, "stream": true, "max_output_tokens": 5, "instructions": SYSTEM,
            "include": ["reasoning.encrypted_content"],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": USER}]}]
        }),
        Protocol::Anthropic => json!({
            "model": model, "stream": true, "max_tokens": 5, "system": SYSTEM,
            "messages": [{"role": "user", "content": USER}]
        }),
    }
}

/// The request with two tools (`weather` needs a string `city`), optionally forcing `choice`.
fn with_tools(protocol: Protocol, model: &str, choice: Option<&str>) -> Value {
    let mut body = request(protocol, model);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"]});
    let empty = json!({"type": "object", "properties": {}});
    let (tools, forced) = match protocol {
        Protocol::OpenAiChat => (
            json!([{"type": "function", "function": {"name": "weather", "parameters": schema}},
                {"type": "function", "function": {"name": "time", "parameters": empty}}]),
            choice.map(|n| json!({"type": "function", "function": {"name": n}})),
        ),
        Protocol::OpenAiResponses => (
            json!([{"type": "function", "name": "weather", "parameters": schema},
                {"type": "function", "name": "time", "parameters": empty}]),
            choice.map(|n| json!({"type": "function", "name": n})),
        ),
        Protocol::Anthropic => (
            json!([{"name": "weather", "input_schema": schema},
                {"name": "time", "input_schema": empty}]),
            choice.map(|n| json!({"type": "tool", "name": n})),
        ),
    };
    body["tools"] = tools;
    if let Some(forced) = forced {
        body["tool_choice"] = forced;
    }
    body
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
    /// Whether reading the body failed (a cut).
    body_error: bool,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `(event name or "", data)`; `[DONE]` becomes the string `"[DONE]"`.
    fn events(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for block in self.body.split("\n\n").filter(|b| !b.trim().is_empty()) {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.into()));
                }
            }
            out.push((name, data));
        }
        out
    }

    fn names(&self) -> Vec<String> {
        self.events().into_iter().map(|(n, _)| n).collect()
    }

    fn has(&self, name: &str) -> bool {
        self.names().iter().any(|n| n == name)
    }

    fn data_of(&self, name: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|(n, _)| n == name)
            .map(|(_, d)| d)
            .collect()
    }

    /// Visible text, joined from the protocol's text deltas.
    fn text(&self, protocol: Protocol) -> String {
        let mut text = String::new();
        for (name, data) in self.events() {
            let piece = match protocol {
                Protocol::OpenAiChat => data["choices"][0]["delta"]["content"].as_str(),
                Protocol::OpenAiResponses if name == "response.output_text.delta" => {
                    data["delta"].as_str()
                }
                Protocol::Anthropic if data["delta"]["type"] == "text_delta" => {
                    data["delta"]["text"].as_str()
                }
                _ => None,
            };
            text.push_str(piece.unwrap_or(""));
        }
        text
    }

    /// Tool arguments, joined from the protocol's argument deltas.
    fn args(&self, protocol: Protocol) -> String {
        let mut args = String::new();
        for (name, data) in self.events() {
            let piece = match protocol {
                Protocol::OpenAiChat => {
                    data["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
                }
                Protocol::OpenAiResponses if name == "response.function_call_arguments.delta" => {
                    data["delta"].as_str()
                }
                Protocol::Anthropic if data["delta"]["type"] == "input_json_delta" => {
                    data["delta"]["partial_json"].as_str()
                }
                _ => None,
            };
            args.push_str(piece.unwrap_or(""));
        }
        args
    }

    /// Chat chunks with a non-null `finish_reason`.
    fn finish_reasons(&self) -> Vec<String> {
        self.events()
            .iter()
            .filter_map(|(_, d)| d["choices"][0]["finish_reason"].as_str().map(String::from))
            .collect()
    }

    /// The chat usage chunk, if any.
    fn chat_usage(&self) -> Option<Value> {
        self.events()
            .into_iter()
            .find(|(_, d)| d["choices"] == json!([]))
            .map(|(_, d)| d["usage"].clone())
    }
}

async fn post_to(base: &str, protocol: Protocol, body: &Value) -> Reply {
    let mut response = client()
        .post(format!("{base}{}", protocol.path()))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut bytes = Vec::new();
    let mut body_error = false;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(_) => {
                body_error = true;
                break;
            }
        }
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(bytes).unwrap(),
        body_error,
    }
}

async fn post(mock: &MockProvider, protocol: Protocol, body: &Value) -> Reply {
    post_to(&mock.base_url(), protocol, body).await
}

fn request_id_header(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Anthropic => "request-id",
        _ => "x-request-id",
    }
}

/// Waits (bounded) until no response body is being written.
async fn streams_drain(mock: &MockProvider) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while mock.active_streams() > 0 {
        assert!(Instant::now() < deadline, "streams still active");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn mock_echo_streams_each_protocol_with_usage() {
    let mock = start().await;
    for protocol in ALL {
        let reply = post(&mock, protocol, &request(protocol, "mock-echo")).await;
        assert_eq!(reply.status, 200, "{protocol}");
        assert!(!reply.body_error, "{protocol}");
        assert_eq!(reply.header("content-type"), Some("text/event-stream"));
        assert!(reply
            .header(request_id_header(protocol))
            .is_some_and(|id| id.starts_with("req_")));
        assert_eq!(reply.text(protocol), USER, "{protocol}");
        // ceil(11 / 4) output tokens.
        match protocol {
            Protocol::OpenAiChat => {
                let events = reply.events();
                assert!(events[0].1["id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("chatcmpl-")));
                assert_eq!(events[0].1["object"], "chat.completion.chunk");
                assert_eq!(reply.finish_reasons(), ["stop"]);
                let usage = reply.chat_usage().unwrap();
                assert_eq!(usage["prompt_tokens"], INPUT_TOKENS);
                assert_eq!(usage["completion_tokens"], 3);
                assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 0);
                assert_eq!(events.last().unwrap().1, json!("[DONE]"));
            }
            Protocol::OpenAiResponses => {
                for name in [
                    "response.created",
                    "response.in_progress",
                    "response.output_item.added",
                    "response.content_part.added",
                    "response.output_text.delta",
                    "response.output_text.done",
                    "response.output_item.done",
                    "response.completed",
                ] {
                    assert!(reply.has(name), "{name}");
                }
                let completed = &reply.data_of("response.completed")[0]["response"];
                assert_eq!(completed["status"], "completed");
                assert_eq!(completed["usage"]["input_tokens"], INPUT_TOKENS);
                assert_eq!(completed["usage"]["output_tokens"], 3);
                assert_eq!(
                    completed["usage"]["input_tokens_details"]["cached_tokens"],
                    0
                );
                assert_eq!(
                    completed["usage"]["output_tokens_details"]["reasoning_tokens"],
                    0
                );
                assert_eq!(reply.names().last().unwrap(), "response.completed");
                let sequence: Vec<u64> = reply
                    .events()
                    .iter()
                    .map(|(_, d)| d["sequence_number"].as_u64().unwrap())
                    .collect();
                assert_eq!(sequence, (0..sequence.len() as u64).collect::<Vec<_>>());
            }
            Protocol::Anthropic => {
                let names = reply.names();
                assert_eq!(names[0], "message_start");
                for name in [
                    "ping",
                    "content_block_start",
                    "content_block_delta",
                    "content_block_stop",
                    "message_delta",
                ] {
                    assert!(reply.has(name), "{name}");
                }
                assert_eq!(names.last().unwrap(), "message_stop");
                let start = &reply.data_of("message_start")[0]["message"];
                assert!(start["id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("msg_")));
                assert_eq!(start["usage"]["input_tokens"], INPUT_TOKENS);
                let delta = &reply.data_of("message_delta")[0];
                assert_eq!(delta["delta"]["stop_reason"], "end_turn");
                assert_eq!(delta["usage"]["output_tokens"], 3);
            }
        }
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_size_suffix_sets_echo_and_big_lengths() {
    let mock = start().await;
    for protocol in ALL {
        let reply = post(&mock, protocol, &request(protocol, "mock-echo@25")).await;
        assert_eq!(reply.text(protocol), "hello worldhello worldhel");
        let reply = post(&mock, protocol, &request(protocol, "mock-big@1000")).await;
        let text = reply.text(protocol);
        assert_eq!(text.chars().count(), 1000, "{protocol}");
        assert!(text.starts_with("The quick brown fox"));
        let deltas = match protocol {
            Protocol::OpenAiChat => reply.events().len(),
            Protocol::OpenAiResponses => reply.data_of("response.output_text.delta").len(),
            Protocol::Anthropic => reply.data_of("content_block_delta").len(),
        };
        assert!(deltas >= 60, "{protocol}: {deltas} deltas");
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_json_is_an_object_with_answer_and_ok() {
    let mock = start().await;
    for protocol in ALL {
        let reply = post(&mock, protocol, &request(protocol, "mock-json")).await;
        let value: Value = serde_json::from_str(&reply.text(protocol)).unwrap();
        assert_eq!(value, json!({"answer": USER, "ok": true}), "{protocol}");
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_tool_calls_the_chosen_or_first_tool_with_valid_arguments() {
    let mock = start().await;
    for protocol in ALL {
        let reply = post(&mock, protocol, &with_tools(protocol, "mock-tool", None)).await;
        let args: Value = serde_json::from_str(&reply.args(protocol)).unwrap();
        assert_eq!(args, json!({"city": "mock"}), "{protocol}");
        let name = match protocol {
            Protocol::OpenAiChat => {
                assert_eq!(reply.finish_reasons(), ["tool_calls"]);
                reply
                    .events()
                    .iter()
                    .find_map(|(_, d)| {
                        d["choices"][0]["delta"]["tool_calls"][0]["function"]["name"]
                            .as_str()
                            .map(String::from)
                    })
                    .unwrap()
            }
            Protocol::OpenAiResponses => {
                let added = reply.data_of("response.output_item.added");
                assert_eq!(added[0]["item"]["type"], "function_call");
                assert!(reply.has("response.function_call_arguments.done"));
                added[0]["item"]["name"].as_str().unwrap().to_string()
            }
            Protocol::Anthropic => {
                assert_eq!(
                    reply.data_of("message_delta")[0]["delta"]["stop_reason"],
                    "tool_use"
                );
                let start = &reply.data_of("content_block_start")[0]["content_block"];
                assert_eq!(start["type"], "tool_use");
                start["name"].as_str().unwrap().to_string()
            }
        };
        assert_eq!(name, "weather", "{protocol}");

        let forced = with_tools(protocol, "mock-tool", Some("time"));
        let reply = post(&mock, protocol, &forced).await;
        assert_eq!(reply.args(protocol), "{}", "{protocol}");
        assert!(reply.body.contains("\"time\""), "{protocol}");

        let no_tools = post(&mock, protocol, &request(protocol, "mock-tool")).await;
        assert_eq!(no_tools.status, 400, "{protocol}");
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_tool_malformed_arguments_are_not_json() {
    let mock = start().await;
    for protocol in ALL {
        let body = with_tools(protocol, "mock-tool-malformed", None);
        let reply = post(&mock, protocol, &body).await;
        assert!(!reply.body_error);
        let args = reply.args(protocol);
        assert!(!args.is_empty(), "{protocol}");
        assert!(serde_json::from_str::<Value>(&args).is_err(), "{protocol}");
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_reasoning_comes_before_text() {
    let mock = start().await;
    for protocol in ALL {
        let reply = post(&mock, protocol, &request(protocol, "mock-reasoning@40")).await;
        assert_eq!(reply.text(protocol), USER, "{protocol}");
        // ceil(40 / 4) reasoning tokens.
        match protocol {
            Protocol::OpenAiChat => {
                let events = reply.events();
                let first_reasoning = events
                    .iter()
                    .position(|(_, d)| d["choices"][0]["delta"]["reasoning_content"].is_string())
                    .unwrap();
                let first_text = events
                    .iter()
                    .position(|(_, d)| {
                        d["choices"][0]["delta"]["content"]
                            .as_str()
                            .is_some_and(|t| !t.is_empty())
                    })
                    .unwrap();
                assert!(first_reasoning < first_text);
                let usage = reply.chat_usage().unwrap();
                assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 10);
                assert_eq!(usage["completion_tokens"], 13);
            }
            Protocol::OpenAiResponses => {
                let names = reply.names();
                let reasoning = names
                    .iter()
                    .position(|n| n == "response.reasoning_summary_text.delta")
                    .unwrap();
                let text = names
                    .iter()
                    .position(|n| n == "response.output_text.delta")
                    .unwrap();
                assert!(reasoning < text);
                let done = reply.data_of("response.output_item.done");
                assert_eq!(done[0]["item"]["type"], "reasoning");
                assert!(done[0]["item"]["encrypted_content"].is_string());
                let usage = &reply.data_of("response.completed")[0]["response"]["usage"];
                assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 10);
            }
            Protocol::Anthropic => {
                let starts = reply.data_of("content_block_start");
                assert_eq!(starts[0]["content_block"]["type"], "thinking");
                assert_eq!(starts[1]["content_block"]["type"], "text");
                let kinds: Vec<Value> = reply
                    .data_of("content_block_delta")
                    .iter()
                    .map(|d| d["delta"]["type"].clone())
                    .collect();
                assert!(kinds.contains(&json!("thinking_delta")));
                assert!(kinds.contains(&json!("signature_delta")));
                let usage = &reply.data_of("message_delta")[0]["usage"];
                assert_eq!(usage["output_tokens"], 13);
            }
        }
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_cut_before_usage_drops_the_connection_mid_body() {
    let mock = start().await;
    for protocol in ALL {
        let reply = post(&mock, protocol, &request(protocol, "mock-cut-before-usage")).await;
        assert_eq!(reply.status, 200);
        assert!(reply.body_error, "{protocol}: the body must fail");
        assert_eq!(reply.text(protocol), USER, "{protocol}");
        assert!(!reply.body.contains("usage\":{\"output"), "{protocol}");
        assert!(!reply.body.contains("[DONE]"));
        assert!(!reply.has("message_delta") && !reply.has("message_stop"));
        assert!(!reply.has("response.completed"));
        assert!(reply.chat_usage().is_none());
        assert!(reply.finish_reasons().is_empty());
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_cut_after_usage_drops_after_the_terminal_usage() {
    let mock = start().await;
    for protocol in ALL {
        let reply = post(&mock, protocol, &request(protocol, "mock-cut-after-usage")).await;
        assert!(reply.body_error, "{protocol}: the body must fail");
        assert_eq!(reply.text(protocol), USER, "{protocol}");
        match protocol {
            Protocol::OpenAiChat => {
                assert_eq!(reply.chat_usage().unwrap()["completion_tokens"], 3);
                assert!(reply.finish_reasons().is_empty());
                assert!(!reply.body.contains("[DONE]"));
            }
            Protocol::OpenAiResponses => {
                let usage = &reply.data_of("response.completed")[0]["response"]["usage"];
                assert_eq!(usage["output_tokens"], 3);
            }
            Protocol::Anthropic => {
                let delta = &reply.data_of("message_delta")[0];
                assert_eq!(delta["delta"]["stop_reason"], Value::Null);
                assert_eq!(delta["usage"]["output_tokens"], 3);
                assert!(!reply.has("message_stop"));
            }
        }
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_refuse_prestream_has_an_id_and_nothing_else() {
    let mock = start().await;
    for protocol in ALL {
        let reply = post(&mock, protocol, &request(protocol, "mock-refuse-prestream")).await;
        assert_eq!(reply.status, 200);
        assert!(!reply.body_error, "{protocol}");
        assert_eq!(reply.text(protocol), "");
        let events = reply.events();
        match protocol {
            Protocol::OpenAiChat => {
                assert_eq!(events.len(), 2);
                assert!(events[0].1["id"].is_string());
                assert_eq!(events[0].1["choices"][0]["delta"], json!({}));
                assert_eq!(events[0].1["choices"][0]["finish_reason"], Value::Null);
                assert_eq!(events[1].1, json!("[DONE]"));
            }
            Protocol::OpenAiResponses => {
                assert_eq!(reply.names(), ["response.created", "response.completed"]);
                let response = &events[1].1["response"];
                assert_eq!(response["output"], json!([]));
                assert_eq!(response["usage"]["input_tokens"], 0);
                assert_eq!(response["usage"]["output_tokens"], 0);
            }
            Protocol::Anthropic => {
                assert_eq!(reply.names(), ["message_start", "message_stop"]);
                let usage = &events[0].1["message"]["usage"];
                assert_eq!(usage["input_tokens"], 0);
                assert_eq!(usage["output_tokens"], 0);
            }
        }
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_empty_refusal_has_a_refusal_stop_and_no_content() {
    let mock = start().await;
    for protocol in ALL {
        let reply = post(&mock, protocol, &request(protocol, "mock-empty-refusal")).await;
        assert!(!reply.body_error, "{protocol}");
        assert_eq!(reply.text(protocol), "");
        match protocol {
            Protocol::OpenAiChat => {
                assert_eq!(reply.finish_reasons(), ["content_filter"]);
                assert_eq!(reply.chat_usage().unwrap()["completion_tokens"], 0);
            }
            Protocol::OpenAiResponses => {
                let incomplete = &reply.data_of("response.incomplete")[0]["response"];
                assert_eq!(incomplete["incomplete_details"]["reason"], "content_filter");
                assert_eq!(incomplete["output"], json!([]));
            }
            Protocol::Anthropic => {
                assert_eq!(
                    reply.names(),
                    ["message_start", "message_delta", "message_stop"]
                );
                let delta = &reply.data_of("message_delta")[0];
                assert_eq!(delta["delta"]["stop_reason"], "refusal");
                assert_eq!(delta["usage"]["output_tokens"], 0);
            }
        }
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_http_errors_have_their_status_and_no_stream() {
    let mock = start().await;
    for protocol in ALL {
        for (model, status) in [("mock-429", 429), ("mock-500", 500), ("gpt-nope", 404)] {
            let reply = post(&mock, protocol, &request(protocol, model)).await;
            assert_eq!(reply.status, status, "{protocol} {model}");
            assert_eq!(reply.header("content-type"), Some("application/json"));
            assert!(reply.header(request_id_header(protocol)).is_some());
            let body: Value = serde_json::from_str(&reply.body).unwrap();
            match protocol {
                Protocol::Anthropic => assert_eq!(body["type"], "error"),
                _ => assert!(body["error"]["message"].is_string()),
            }
            if status == 429 {
                assert_eq!(reply.header("retry-after"), Some("1"));
            }
        }
        let bad = client()
            .post(format!("{}{}", mock.base_url(), protocol.path()))
            .body("not json")
            .send()
            .await
            .unwrap();
        assert_eq!(bad.status().as_u16(), 400);
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_slow_waits_before_the_first_byte() {
    let mock = start().await;
    let began = Instant::now();
    let response = client()
        .post(format!("{}/v1/messages", mock.base_url()))
        .json(&request(Protocol::Anthropic, "mock-slow-200"))
        .send()
        .await
        .unwrap();
    assert!(began.elapsed() >= Duration::from_millis(200));
    assert_eq!(response.status().as_u16(), 200);
    assert!(response.text().await.unwrap().contains("hello world"));
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_hang_sends_no_body_byte_and_ends_on_disconnect() {
    let mock = start().await;
    for protocol in ALL {
        let mut response = client()
            .post(format!("{}{}", mock.base_url(), protocol.path()))
            .json(&request(protocol, "mock-hang"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let first = tokio::time::timeout(Duration::from_millis(150), response.chunk()).await;
        assert!(first.is_err(), "{protocol}: no body byte expected");
        assert_eq!(mock.active_streams(), 1);
        drop(response);
        streams_drain(&mock).await;
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_reasoning_loop_is_paced_and_stops_on_disconnect() {
    let mock = start().await;
    for protocol in ALL {
        let mut response = client()
            .post(format!("{}{}", mock.base_url(), protocol.path()))
            .json(&request(protocol, "mock-reasoning-loop"))
            .send()
            .await
            .unwrap();
        let mut body = String::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        while body.matches("Still thinking").count() < 20 {
            assert!(Instant::now() < deadline, "{protocol}: too slow");
            let chunk = response.chunk().await.unwrap().unwrap();
            body.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        assert!(!body.contains("text_delta") && !body.contains("output_text"));
        assert!(!body.contains("\"content\":\"S"));
        drop(response);
        streams_drain(&mock).await;
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_counts_each_post_exactly_once() {
    let mock = start().await;
    let base = mock.base_url();
    for protocol in ALL {
        post(&mock, protocol, &request(protocol, "mock-echo")).await;
    }
    post(
        &mock,
        Protocol::OpenAiChat,
        &request(Protocol::OpenAiChat, "mock-429"),
    )
    .await;
    post(
        &mock,
        Protocol::Anthropic,
        &request(Protocol::Anthropic, "unknown"),
    )
    .await;
    post(&mock, Protocol::OpenAiResponses, &json!("not an object")).await;
    let count = |base: String| async move {
        let value: Value = client()
            .get(format!("{base}/mock/requests"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        value["count"].as_u64().unwrap()
    };
    assert_eq!(count(base.clone()).await, 6);
    // Reading the counter is not a provider request.
    assert_eq!(count(base.clone()).await, 6);
    assert_eq!(mock.request_count(), 6);
    let reset = client()
        .post(format!("{base}/mock/reset"))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status().as_u16(), 200);
    assert_eq!(count(base.clone()).await, 0);
    assert_eq!(mock.request_count(), 0);
    mock.shutdown().await;
}

/// `request` with `text` as its only user message.
fn request_saying(protocol: Protocol, model: &str, text: &str) -> Value {
    let mut body = request(protocol, model);
    match protocol {
        Protocol::OpenAiChat => body["messages"][1]["content"] = json!(text),
        Protocol::OpenAiResponses => body["input"][0]["content"][0]["text"] = json!(text),
        Protocol::Anthropic => body["messages"][0]["content"] = json!(text),
    }
    body
}

#[tokio::test]
async fn mock_counts_each_post_by_its_prompt() {
    let mock = start().await;
    let base = mock.base_url();
    for protocol in ALL {
        post(
            &mock,
            protocol,
            &request_saying(protocol, "mock-echo", "key-1"),
        )
        .await;
    }
    // Errors count under their prompt too; a non-object body and an oversized prompt do not.
    post(
        &mock,
        Protocol::OpenAiChat,
        &request_saying(Protocol::OpenAiChat, "mock-500", "key-2"),
    )
    .await;
    post(&mock, Protocol::OpenAiResponses, &json!("not an object")).await;
    let long = "x".repeat(PROMPT_CHARS_MAX + 1);
    post(
        &mock,
        Protocol::Anthropic,
        &request_saying(Protocol::Anthropic, "mock-echo", &long),
    )
    .await;
    // A plain string input (Responses) is its own prompt.
    let mut plain = request(Protocol::OpenAiResponses, "mock-echo");
    plain["input"] = json!("key-3");
    post(&mock, Protocol::OpenAiResponses, &plain).await;

    assert_eq!(mock.request_count(), 7);
    assert_eq!(mock.request_count_for("key-1"), 3);
    assert_eq!(mock.request_count_for("key-2"), 1);
    assert_eq!(mock.request_count_for("key-3"), 1);
    assert_eq!(mock.request_count_for("never sent"), 0);
    assert_eq!(mock.request_count_for(&long), 0);
    let expected: BTreeMap<String, u64> = [("key-1", 3), ("key-2", 1), ("key-3", 1)]
        .into_iter()
        .map(|(p, n)| (p.to_string(), n))
        .collect();
    assert_eq!(mock.requests_by_prompt(), expected);

    let read = || async {
        client()
            .get(format!("{base}/mock/requests"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    assert_eq!(
        read().await,
        json!({"count": 7, "by_prompt": {"key-1": 3, "key-2": 1, "key-3": 1}, "untracked": 2})
    );
    let reset = client()
        .post(format!("{base}/mock/reset"))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status().as_u16(), 200);
    assert_eq!(
        read().await,
        json!({"count": 0, "by_prompt": {}, "untracked": 0})
    );
    assert!(mock.requests_by_prompt().is_empty());
    mock.shutdown().await;
}

#[test]
fn mock_prompt_counts_stay_bounded() {
    let mut counts = PromptCounts::default();
    for i in 0..PROMPTS_TRACKED_MAX {
        counts.add(Some(format!("p-{i}")));
    }
    // A known prompt still counts under its name; a new one is untracked.
    counts.add(Some("p-0".into()));
    counts.add(Some("one too many".into()));
    counts.add(None);
    assert_eq!(counts.by_prompt.len(), PROMPTS_TRACKED_MAX);
    assert_eq!(counts.by_prompt.get("p-0"), Some(&2));
    assert_eq!(counts.untracked, 2);
}

#[tokio::test]
async fn mock_shutdown_ends_open_streams() {
    let mock = start().await;
    let base = mock.base_url();
    let hang = client()
        .post(format!("{base}/v1/messages"))
        .json(&request(Protocol::Anthropic, "mock-hang"))
        .send()
        .await
        .unwrap();
    let looping = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&request(Protocol::OpenAiChat, "mock-reasoning-loop"))
        .send()
        .await
        .unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(3), mock.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown must not wait for open streams");
    // Open bodies end as cuts, not as clean ends.
    assert!(hang.bytes().await.is_err());
    assert!(looping.bytes().await.is_err());
}

#[tokio::test]
async fn mock_serve_runs_until_its_shutdown_future() {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, async move {
        let _ = stopped.await;
    }));
    let base = format!("http://{addr}");
    let reply = post_to(
        &base,
        Protocol::OpenAiChat,
        &request(Protocol::OpenAiChat, "mock-echo"),
    )
    .await;
    assert_eq!(reply.text(Protocol::OpenAiChat), USER);
    stop.send(()).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(3), server)
        .await
        .unwrap()
        .unwrap();
    assert!(result.is_ok());
}

/// Runs a received body through the protocol's decoder and the step collector, as a runner does.
fn collected(protocol: Protocol, reply: &Reply) -> tollgate_core::collector::Collected {
    use tollgate_core::collector::{Collector, CollectorLimits};
    let limits = CollectorLimits {
        max_output_chars: 100_000,
        max_reasoning_chars: 100_000,
        max_consecutive_reasoning: None,
    };
    let mut collector = Collector::new(limits).unwrap();
    for event in tollgate_provider::parse::decode_all(protocol, reply.body.as_bytes()) {
        collector.push(event);
    }
    collector.finish()
}

#[tokio::test]
async fn mock_scenarios_decode_to_their_collector_outcomes() {
    use tollgate_core::collector::RefusalProof;
    let mock = start().await;
    for protocol in ALL {
        let run = |model: &'static str| {
            let body = with_tools(protocol, model, None);
            let mock = &mock;
            async move { collected(protocol, &post(mock, protocol, &body).await) }
        };
        let echo = run("mock-echo").await;
        assert_eq!(echo.step.text, USER);
        assert!(echo.done && echo.usage_terminal && echo.invalid_reason.is_none());
        assert_eq!(echo.terminal_usage().map(|u| u.input), Some(INPUT_TOKENS));

        let malformed = run("mock-tool-malformed").await;
        assert!(malformed.step.tool_calls[0].malformed, "{protocol}");
        assert_eq!(malformed.step.tool_calls[0].input, json!({}));

        let cut = run("mock-cut-before-usage").await;
        assert!(cut.stream_error.is_some() && !cut.done, "{protocol}");
        assert_eq!(cut.terminal_usage(), None, "{protocol}");

        if protocol != Protocol::OpenAiResponses {
            // Responses carries usage only in its terminal event (see the module docs).
            let cut = run("mock-cut-after-usage").await;
            assert!(cut.stream_error.is_some() && !cut.done, "{protocol}");
            assert_eq!(cut.step.stop, None);
            assert_eq!(
                cut.terminal_usage().map(|u| u.output),
                Some(3),
                "{protocol}"
            );
        }

        let refused = run("mock-empty-refusal").await;
        let expected = (protocol == Protocol::Anthropic).then_some(RefusalProof::EmptyRefusal);
        assert_eq!(refused.refusal, expected, "{protocol}");
        assert!(refused.step.blocks.is_empty());
    }
    for protocol in [Protocol::OpenAiChat, Protocol::Anthropic] {
        let body = request(protocol, "mock-refuse-prestream");
        let prestream = collected(protocol, &post(&mock, protocol, &body).await);
        assert_eq!(
            prestream.refusal,
            Some(RefusalProof::PreStream),
            "{protocol}"
        );
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_reasoning_loop_trips_the_collector_loop_check() {
    use tollgate_core::collector::{Collector, CollectorLimits, Flow};
    use tollgate_core::invalid::InvalidReason;
    let mock = start().await;
    for protocol in ALL {
        let mut response = client()
            .post(format!("{}{}", mock.base_url(), protocol.path()))
            .json(&request(protocol, "mock-reasoning-loop"))
            .send()
            .await
            .unwrap();
        let limits = CollectorLimits {
            max_output_chars: 1_000,
            max_reasoning_chars: 100_000,
            max_consecutive_reasoning: Some(25),
        };
        let mut collector = Collector::new(limits).unwrap();
        let mut decoder = tollgate_provider::parse::StreamDecoder::new(protocol);
        let deadline = Instant::now() + Duration::from_secs(15);
        'read: loop {
            assert!(Instant::now() < deadline, "{protocol}: loop not detected");
            let chunk = response.chunk().await.unwrap().unwrap();
            for event in decoder.push(&chunk) {
                if collector.push(event) == Flow::Stop {
                    break 'read;
                }
            }
        }
        drop(response);
        let out = collector.finish();
        assert_eq!(out.invalid_reason, Some(InvalidReason::ReasoningLoop));
        assert!(out.stopped_early && out.step.text.is_empty());
        streams_drain(&mock).await;
    }
    mock.shutdown().await;
}

/// SC-110: a `store: true` Responses request is kept; `GET /v1/responses/{id}` answers the
/// finished response with its usage even after the stream was cut, and nothing (404) for a
/// request without `store` or an unknown id.
#[tokio::test]
async fn sc_110_stored_responses_are_fetchable_after_a_cut() {
    let mock = start().await;
    let p = Protocol::OpenAiResponses;
    let mut body = request(p, "mock-cut-before-usage");
    body["store"] = json!(true);
    let reply = post(&mock, p, &body).await;
    assert!(reply.body_error, "the stream is cut");
    let id = reply.data_of("response.created")[0]["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let get = |id: String| {
        let url = format!("{}/v1/responses/{id}", mock.base_url());
        async move { client().get(url).send().await.unwrap() }
    };
    let found = get(id.clone()).await;
    assert_eq!(found.status().as_u16(), 200);
    let stored: Value = found.json().await.unwrap();
    assert_eq!(stored["id"], json!(id));
    assert_eq!(stored["status"], json!("completed"));
    let input = (SYSTEM.chars().count() + USER.chars().count()).div_ceil(4) as u64;
    let output = USER.chars().count().div_ceil(4) as u64;
    assert_eq!(stored["usage"]["input_tokens"], json!(input));
    assert_eq!(stored["usage"]["output_tokens"], json!(output));
    assert_eq!(stored["output"], json!([]), "no content is kept");
    // Through the provider crate's fetch: the same usage, exact.
    let fetcher =
        tollgate_provider::http::HttpClient::new(tollgate_provider::http::HttpClientConfig {
            protocol: p,
            base_url: mock.base_url(),
            api_key: None,
            connect_timeout_ms: 2_000,
            read_timeout_ms: 5_000,
            max_attempts: 1,
        })
        .unwrap();
    use tollgate_provider::fetch::{FetchError, UsageFetcher};
    let fetched = fetcher.fetch_usage(&id).await.unwrap();
    assert!(fetched.exact);
    assert_eq!((fetched.usage.input, fetched.usage.output), (input, output));
    assert_eq!(
        fetcher.fetch_usage("resp_unknown").await,
        Err(FetchError::NotFound)
    );
    assert_eq!(
        fetcher.fetch_usage("../x").await,
        Err(FetchError::InvalidRef)
    );
    // Without `store: true` nothing is kept.
    let reply = post(&mock, p, &request(p, "mock-echo")).await;
    let id = reply.data_of("response.created")[0]["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(get(id).await.status().as_u16(), 404);
    mock.shutdown().await;
}
