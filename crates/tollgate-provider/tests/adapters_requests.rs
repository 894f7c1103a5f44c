//! The adapters' request bodies, and `parse_stream` (the `tollgate parse-stream` output) over
//! the crate's own streams.
#![cfg(test)]

use serde_json::{json, Value};
use std::path::PathBuf;
use tollgate_core::collector::CollectorLimits;
use tollgate_core::message::{Message, Part, Role, Temperature, ToolChoice, ToolSpec};
use tollgate_provider::parse::parse_stream;
use tollgate_provider::{anthropic, openai_chat, openai_responses, Protocol, ProviderRequest};

fn own_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/streams")
}

// ---------------------------------------------------------------- parse_stream

const LIMITS: CollectorLimits = CollectorLimits {
    max_output_chars: 1_000_000,
    max_reasoning_chars: 1_000_000,
    max_consecutive_reasoning: None,
};

#[test]
fn parse_stream_reports_usage_stop_reference_and_stream_error() {
    let bytes =
        std::fs::read(own_dir().join("openai-chat-text-cached-reasoning-usage.sse")).unwrap();
    let out = parse_stream(Protocol::OpenAiChat, &bytes, LIMITS);
    assert_eq!(
        out["usage"],
        json!({"input": 280, "output": 58, "cache_read": 1024, "cache_write": 0, "reasoning": 192})
    );
    assert_eq!(out["stop"], "stop");
    assert_eq!(out["provider_ref"], "chatcmpl-Cx1ReasonCached0001");
    assert_eq!(out["stream_error"], Value::Null);
    for key in ["step", "invalid_reason"] {
        assert!(out.get(key).is_some(), "{key}");
    }

    let bytes = std::fs::read(own_dir().join("anthropic-overloaded.sse")).unwrap();
    let out = parse_stream(Protocol::Anthropic, &bytes, LIMITS);
    assert_eq!(out["stream_error"]["type"], "overloaded_error");
    assert_eq!(out["stop"], Value::Null);
    assert_eq!(out["provider_ref"], "msg_01Overloaded0006");

    let bytes = std::fs::read(own_dir().join("openai-responses-cut.sse")).unwrap();
    let out = parse_stream(Protocol::OpenAiResponses, &bytes, LIMITS);
    assert_eq!(out["stream_error"]["type"], "connection_closed");
    assert_eq!(out["usage"], Value::Null);
}

// ---------------------------------------------------------------- request bodies

fn request(model: &str) -> ProviderRequest {
    ProviderRequest {
        model: model.into(),
        system: Some("Be brief.".into()),
        messages: vec![
            Message::text(Role::User, "Weather in Oslo?"),
            Message {
                role: Role::Assistant,
                content: vec![Part::ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    input: json!({"city": "Oslo"}),
                }],
            },
            Message {
                role: Role::User,
                content: vec![Part::ToolResult {
                    call_id: "call_1".into(),
                    content: "12C".into(),
                    is_error: false,
                }],
            },
        ],
        max_tokens: 256,
        temperature: Some(Temperature::parse("0.7").unwrap()),
        tools: vec![ToolSpec {
            name: "get_weather".into(),
            description: "Current weather".into(),
            input_schema: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }],
        tool_choice: Some(ToolChoice::Tool {
            name: "get_weather".into(),
        }),
        cache: None,
        json_schema: None,
    }
}

#[test]
fn chat_request_body_streams_with_usage() {
    let mut req = request("gpt-4o");
    req.json_schema = Some(("answer".into(), json!({"type": "object"})));
    let body = openai_chat::request_body(&req);
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(body["max_completion_tokens"], 256);
    assert_eq!(body["temperature"].to_string(), "0.7");
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(
        body["messages"][2]["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Oslo\"}"
    );
    assert_eq!(
        body["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "12C"})
    );
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["parameters"]["type"], "object");
    assert_eq!(
        body["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(body["response_format"]["json_schema"]["name"], "answer");
    let mut req = request("mock-echo");
    req.tool_choice = Some(ToolChoice::Any);
    let body = openai_chat::request_body(&req);
    assert_eq!(body["max_tokens"], 256);
    assert_eq!(body["tool_choice"], "required");
}

#[test]
fn responses_request_body_streams_with_encrypted_reasoning() {
    let mut req = request("o4-mini");
    req.temperature = None;
    req.json_schema = Some(("answer".into(), json!({"type": "object"})));
    let body = openai_responses::request_body(&req);
    assert_eq!(body["stream"], true);
    assert_eq!(body["instructions"], "Be brief.");
    assert_eq!(body["max_output_tokens"], 256);
    assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(
        body["input"][0],
        json!({"role": "user", "content": "Weather in Oslo?"})
    );
    assert_eq!(body["input"][1]["type"], "function_call");
    assert_eq!(body["input"][1]["call_id"], "call_1");
    assert_eq!(
        body["input"][2],
        json!({"type": "function_call_output", "call_id": "call_1", "output": "12C"})
    );
    assert_eq!(body["tools"][0]["name"], "get_weather");
    assert_eq!(
        body["tool_choice"],
        json!({"type": "function", "name": "get_weather"})
    );
    assert_eq!(body["text"]["format"]["type"], "json_schema");
    assert!(body.get("temperature").is_none());
    let body = openai_responses::request_body(&request("gpt-4o"));
    assert!(
        body.get("include").is_none(),
        "non-reasoning models reject encrypted reasoning"
    );
}

#[test]
fn anthropic_request_body_maps_tools_and_cache() {
    let mut req = request("claude-sonnet-4-5");
    req.cache = Some(true);
    let body = anthropic::request_body(&req);
    assert_eq!(body["stream"], true);
    assert_eq!(body["max_tokens"], 256);
    assert_eq!(body["system"][0]["text"], "Be brief.");
    assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral");
    assert_eq!(body["messages"][1]["content"][0]["type"], "tool_use");
    assert_eq!(
        body["messages"][1]["content"][0]["input"],
        json!({"city": "Oslo"})
    );
    let result = &body["messages"][2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "call_1");
    assert_eq!(result["cache_control"]["type"], "ephemeral");
    assert_eq!(body["tools"][0]["input_schema"]["type"], "object");
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "get_weather"})
    );
    req.tool_choice = Some(ToolChoice::None);
    req.cache = None;
    let body = anthropic::request_body(&req);
    assert_eq!(body["tool_choice"], json!({"type": "none"}));
    assert_eq!(body["system"], "Be brief.");
}
