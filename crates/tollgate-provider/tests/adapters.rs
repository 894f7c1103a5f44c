//! The three stream adapters against their own streams (`tests/streams/`, written event by
//! event from the providers' published formats) and the shared captured fixtures
//! (found by `captured_streams`, compared with their `EXPECTED.json`; a missing folder fails).
#![cfg(test)]

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tollgate_core::event::ProviderEvent;
use tollgate_core::Usage;
use tollgate_provider::parse::{decode_all, StreamDecoder};
use tollgate_provider::Protocol;
use tollgate_testkit::captured::{captured_streams, captured_streams_in, REPOSITORY_ROOT};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn own_dir() -> PathBuf {
    crate_dir().join("tests/streams")
}

#[test]
fn sc_118_a_missing_captured_streams_folder_fails_naming_where_it_looked() {
    let nowhere = own_dir().join("no-such-folder");
    let err = captured_streams_in(Some(nowhere.clone()), &REPOSITORY_ROOT).unwrap_err();
    assert!(err.contains(&nowhere.display().to_string()), "{err}");
    assert!(err.contains("TOLLGATE_CAPTURED_STREAMS"), "{err}");
    let found = captured_streams_in(None, &REPOSITORY_ROOT).unwrap();
    assert!(found.join("EXPECTED.json").is_file());
}

fn protocol_of(name: &str) -> Protocol {
    if name.starts_with("openai-chat") {
        Protocol::OpenAiChat
    } else if name.starts_with("openai-responses") {
        Protocol::OpenAiResponses
    } else if name.starts_with("anthropic") {
        Protocol::Anthropic
    } else {
        panic!("stream file {name} does not name its protocol")
    }
}

/// `(file name, protocol, bytes)` of every `.sse` file in `dir`, sorted by name.
fn sse_files(dir: &Path) -> Vec<(String, Protocol, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sse"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let protocol = protocol_of(&name);
            (name, protocol, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

fn all_streams() -> Vec<(String, Protocol, Vec<u8>)> {
    let mut files = sse_files(&own_dir());
    assert!(files.len() >= 24, "own streams missing");
    files.extend(sse_files(&captured_streams()));
    files
}

fn own(name: &str) -> Vec<ProviderEvent> {
    let bytes = std::fs::read(own_dir().join(name)).unwrap();
    decode_all(protocol_of(name), &bytes)
}

fn text_of(events: &[ProviderEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn last_usage(events: &[ProviderEvent]) -> Option<(Usage, bool)> {
    events.iter().rev().find_map(|e| match e {
        ProviderEvent::Usage { usage, terminal } => Some((*usage, *terminal)),
        _ => None,
    })
}

fn stops(events: &[ProviderEvent]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Stop { reason } => Some(reason.as_str()),
            _ => None,
        })
        .collect()
}

fn error_kind(events: &[ProviderEvent]) -> Option<&str> {
    events.iter().find_map(|e| match e {
        ProviderEvent::Error { kind, .. } => Some(kind.as_str()),
        _ => None,
    })
}

fn usage(input: u64, output: u64, cache_read: u64, cache_write: u64, reasoning: u64) -> Usage {
    Usage {
        input,
        output,
        cache_read,
        cache_write,
        reasoning,
    }
}

// ---------------------------------------------------------------- own streams

#[test]
fn own_streams_decode_to_their_recorded_events() {
    for (name, protocol, bytes) in sse_files(&own_dir()) {
        let got = decode_all(protocol, &bytes);
        let path = own_dir().join(name.replace(".sse", ".events.json"));
        let want: Vec<ProviderEvent> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn every_stream_decodes_identically_however_it_is_chunked() {
    std::thread::scope(|s| {
        for (name, protocol, bytes) in all_streams() {
            s.spawn(move || rechunk(&name, protocol, &bytes));
        }
    });
}

/// Splits `bytes` in two at every offset, feeds it one byte at a time, and converts its line
/// endings to CRLF and CR: every variant decodes to the same events as the whole.
fn rechunk(name: &str, protocol: Protocol, bytes: &[u8]) {
    let whole = decode_all(protocol, bytes);
    assert!(!whole.is_empty(), "{name}");
    for cut in 0..=bytes.len() {
        let mut d = StreamDecoder::new(protocol);
        let mut got = d.push(&bytes[..cut]);
        got.extend(d.push(&bytes[cut..]));
        got.extend(d.finish());
        assert_eq!(got, whole, "{name} split at byte {cut}");
    }
    let mut d = StreamDecoder::new(protocol);
    let mut got: Vec<_> = bytes.iter().flat_map(|b| d.push(&[*b])).collect();
    got.extend(d.finish());
    assert_eq!(got, whole, "{name} one byte at a time");
    for ending in ["\r\n", "\r"] {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let converted = text.replace('\n', ending);
        assert_eq!(
            decode_all(protocol, converted.as_bytes()),
            whole,
            "{name} with {ending:?} line endings"
        );
    }
}

#[test]
fn chat_usage_is_split_into_disjoint_classes() {
    let events = own("openai-chat-text-cached-reasoning-usage.sse");
    // prompt 1304 of which 1024 cached; completion 250 of which 192 reasoning.
    let want = usage(280, 58, 1024, 0, 192);
    assert_eq!(last_usage(&events), Some((want, true)));
    assert_eq!(text_of(&events), "The capital of France is Paris 🇫🇷.");
    // Usage arrives only at the end, after the stop.
    let usage_at = events
        .iter()
        .position(|e| matches!(e, ProviderEvent::Usage { .. }));
    let stop_at = events
        .iter()
        .position(|e| matches!(e, ProviderEvent::Stop { .. }));
    assert!(stop_at < usage_at);
    assert_eq!(events.last(), Some(&ProviderEvent::Done));
}

#[test]
fn chat_compatible_reasoning_content_is_reasoning() {
    let events = own("openai-chat-compat-reasoning-content.sse");
    let reasoning: String = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::ReasoningDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reasoning, "The user asks 2+2. That is 4.");
    assert_eq!(text_of(&events), "4");
    // Usage on the finishing chunk is the final count.
    assert_eq!(last_usage(&events), Some((usage(20, 1, 0, 0, 14), true)));
}

#[test]
fn responses_usage_reasoning_and_encrypted_content() {
    let events = own("openai-responses-reasoning-text.sse");
    assert_eq!(
        last_usage(&events),
        Some((usage(1024, 172, 512, 0, 128), true))
    );
    assert!(events.contains(&ProviderEvent::ReasoningOpaque {
        data: "gAAAAABoq1ENCRYPTEDreasoningBLOB0123456789abcdef==".into()
    }));
    assert_eq!(stops(&events), vec!["completed"]);
    let incomplete = own("openai-responses-incomplete.sse");
    assert_eq!(stops(&incomplete), vec!["max_output_tokens"]);
    assert_eq!(incomplete.last(), Some(&ProviderEvent::Done));
}

#[test]
fn unknown_blocks_are_kept_verbatim() {
    let events = own("openai-responses-unknown-item.sse");
    assert!(events.iter().any(|e| matches!(e,
        ProviderEvent::ProviderBlock { block } if block["type"] == "web_search_call")));
    let events = own("anthropic-unknown-block.sse");
    let blocks: Vec<&Value> = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::ProviderBlock { block } => Some(block),
            _ => None,
        })
        .collect();
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0]["type"], "server_tool_use");
    assert_eq!(blocks[0]["input"], json!({"query": "bridge opening hours"}));
    assert_eq!(blocks[1]["type"], "web_search_tool_result");
    assert_eq!(text_of(&events), "Open 8-18.");
}

#[test]
fn anthropic_thinking_signature_redacted_and_cache_usage() {
    let events = own("anthropic-thinking-text-cache.sse");
    assert!(events.contains(&ProviderEvent::ReasoningSignature {
        signature: "EqQBCkYIBxgCKkBsig0123456789==".into()
    }));
    assert_eq!(
        events[1],
        ProviderEvent::Usage {
            usage: usage(25, 1, 2048, 512, 0),
            terminal: false
        }
    );
    assert_eq!(
        last_usage(&events),
        Some((usage(25, 87, 2048, 512, 0), true))
    );
    let events = own("anthropic-redacted-thinking.sse");
    assert!(
        matches!(&events[2], ProviderEvent::ReasoningOpaque { data } if data.starts_with("EmwK"))
    );
}

#[test]
fn anthropic_message_delta_usage_replaces_start_values() {
    let stream = concat!(
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":100,"cache_read_input_tokens":10,"cache_creation_input_tokens":5,"output_tokens":1}}}"#,
        "\n\nevent: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":120,"output_tokens":50,"output_tokens_details":{"thinking_tokens":20}}}"#,
        "\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let events = decode_all(Protocol::Anthropic, stream.as_bytes());
    assert_eq!(last_usage(&events), Some((usage(120, 30, 10, 5, 20), true)));
}

#[test]
fn parallel_tool_calls_keep_their_indexes() {
    for (name, first, second) in [
        ("openai-chat-parallel-tools.sse", 0, 1),
        ("openai-responses-parallel-tools.sse", 0, 1),
        ("anthropic-parallel-tools.sse", 1, 2),
    ] {
        let events = own(name);
        let calls = tool_calls(&events);
        assert_eq!(calls.len(), 2, "{name}");
        assert_eq!(calls[&first].1, "get_weather", "{name}");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[&first].2).unwrap(),
            json!({"city": "Oslo"})
        );
        assert_eq!(calls[&second].1, "get_time", "{name}");
        let ends = events
            .iter()
            .filter(|e| matches!(e, ProviderEvent::ToolCallEnd { .. }))
            .count();
        assert_eq!(ends, 2, "{name}");
    }
}

#[test]
fn refusals_and_truncation_keep_the_provider_stop() {
    let chat = own("openai-chat-refusal.sse");
    assert!(chat
        .iter()
        .any(|e| matches!(e, ProviderEvent::RefusalDelta { .. })));
    assert_eq!(text_of(&chat), "");
    assert!(own("openai-responses-refusal.sse")
        .iter()
        .any(|e| matches!(e, ProviderEvent::RefusalDelta { .. })));
    assert_eq!(stops(&own("anthropic-refusal.sse")), vec!["refusal"]);
    assert_eq!(stops(&own("openai-chat-length.sse")), vec!["length"]);
    assert_eq!(stops(&own("anthropic-max-tokens.sse")), vec!["max_tokens"]);
}

#[test]
fn provider_errors_keep_the_provider_type() {
    for (name, kind) in [
        ("openai-chat-error-midstream.sse", "server_error"),
        ("openai-responses-failed.sse", "server_error"),
        ("openai-responses-error-event.sse", "rate_limit_exceeded"),
        ("anthropic-overloaded.sse", "overloaded_error"),
    ] {
        let events = own(name);
        assert_eq!(error_kind(&events), Some(kind), "{name}");
        assert!(
            matches!(events.last(), Some(ProviderEvent::Error { .. })),
            "{name}"
        );
        assert!(!events.contains(&ProviderEvent::Done), "{name}");
    }
}

#[test]
fn streams_cut_before_the_end_marker_end_with_connection_closed() {
    for name in [
        "openai-chat-cut-before-usage.sse",
        "openai-chat-cut-after-usage.sse",
        "openai-responses-cut.sse",
        "anthropic-cut.sse",
    ] {
        let events = own(name);
        assert_eq!(error_kind(&events), Some("connection_closed"), "{name}");
        assert!(!events.contains(&ProviderEvent::Done), "{name}");
    }
    // Terminal usage that arrived before the cut is kept.
    let events = own("openai-chat-cut-after-usage.sse");
    assert_eq!(last_usage(&events), Some((usage(8, 1, 0, 0, 0), true)));
}

#[test]
fn malformed_and_oversized_events_are_errors_without_content() {
    let events = decode_all(Protocol::OpenAiChat, b"data: {\"secret prompt\n\n");
    assert_eq!(error_kind(&events), Some("malformed_event"));
    assert!(!format!("{events:?}").contains("secret"));
    let mut big = b"data: {\"x\":\"".to_vec();
    big.extend(std::iter::repeat_n(b'a', 9 * 1024 * 1024));
    big.extend(b"\"}\n\n");
    let events = decode_all(Protocol::Anthropic, &big);
    assert_eq!(error_kind(&events), Some("malformed_event"));
    assert_eq!(events.len(), 1);
}

#[test]
fn nothing_is_decoded_after_the_end_marker() {
    let mut bytes = std::fs::read(own_dir().join("openai-chat-length.sse")).unwrap();
    bytes.extend(
        b"data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"late\"}}]}\n\n",
    );
    let events = decode_all(Protocol::OpenAiChat, &bytes);
    assert_eq!(events, own("openai-chat-length.sse"));
}

// ---------------------------------------------------------------- usage exactness (SC-95)

/// A Chat stream whose final `choices: []` chunk carries `usage`.
fn chat_with_usage(usage: &str) -> Vec<ProviderEvent> {
    let stream = format!(
        concat!(
            "data: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"hi\"}}}}]}}\n\n",
            "data: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n",
            "data: {{\"id\":\"c1\",\"choices\":[],\"usage\":{}}}\n\n",
            "data: [DONE]\n\n",
        ),
        usage
    );
    decode_all(Protocol::OpenAiChat, stream.as_bytes())
}

/// A Responses stream ending with `response.completed` carrying `usage`.
fn responses_with_usage(usage: &str) -> Vec<ProviderEvent> {
    let stream = format!(
        concat!(
            "event: response.created\n",
            "data: {{\"type\":\"response.created\",\"response\":{{\"id\":\"resp_1\"}}}}\n\n",
            "event: response.output_text.delta\n",
            "data: {{\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"hi\"}}\n\n",
            "event: response.completed\n",
            "data: {{\"type\":\"response.completed\",\"response\":{{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{}}}}}\n\n",
        ),
        usage
    );
    decode_all(Protocol::OpenAiResponses, stream.as_bytes())
}

/// An Anthropic stream with `start` as the `message_start` usage and `end` as the
/// `message_delta` usage.
fn anthropic_with_usage(start: &str, end: &str) -> Vec<ProviderEvent> {
    let stream = format!(
        concat!(
            "event: message_start\n",
            "data: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"usage\":{}}}}}\n\n",
            "event: content_block_start\n",
            "data: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n",
            "event: content_block_delta\n",
            "data: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"hi\"}}}}\n\n",
            "event: content_block_stop\n",
            "data: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n",
            "event: message_delta\n",
            "data: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{}}}\n\n",
            "event: message_stop\n",
            "data: {{\"type\":\"message_stop\"}}\n\n",
        ),
        start, end
    );
    decode_all(Protocol::Anthropic, stream.as_bytes())
}

/// The stream's last usage is not terminal (inexact) and the stream otherwise ended cleanly.
fn assert_inexact(name: &str, events: &[ProviderEvent], partial: Usage) {
    assert_eq!(last_usage(events), Some((partial, false)), "{name}");
    assert_eq!(text_of(events), "hi", "{name}");
    assert_eq!(events.last(), Some(&ProviderEvent::Done), "{name}");
}

#[test]
fn sc_95_exact_usage_in_every_protocol_stays_terminal() {
    let chat = chat_with_usage(
        r#"{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":10},"completion_tokens_details":{"reasoning_tokens":5}}"#,
    );
    assert_eq!(last_usage(&chat), Some((usage(0, 0, 10, 0, 5), true)));
    // Details are optional, and `null` details are not sent.
    let chat = chat_with_usage(
        r#"{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":null}"#,
    );
    assert_eq!(last_usage(&chat), Some((usage(10, 5, 0, 0, 0), true)));
    let responses = responses_with_usage(r#"{"input_tokens":10,"output_tokens":5}"#);
    assert_eq!(last_usage(&responses), Some((usage(10, 5, 0, 0, 0), true)));
    // The older Anthropic format: message_delta states only the output.
    let anthropic = anthropic_with_usage(
        r#"{"input_tokens":10,"cache_read_input_tokens":null,"output_tokens":1}"#,
        r#"{"output_tokens":5}"#,
    );
    assert_eq!(last_usage(&anthropic), Some((usage(10, 5, 0, 0, 0), true)));
    // message_delta may restate the input.
    let anthropic = anthropic_with_usage(
        r#"{"output_tokens":1}"#,
        r#"{"input_tokens":12,"output_tokens":5}"#,
    );
    assert_eq!(last_usage(&anthropic), Some((usage(12, 5, 0, 0, 0), true)));
}

#[test]
fn sc_95_chat_usage_missing_a_required_field_is_inexact() {
    let events = chat_with_usage(r#"{"prompt_tokens":10}"#);
    assert_inexact("no completion_tokens", &events, usage(10, 0, 0, 0, 0));
    let events = chat_with_usage(r#"{"completion_tokens":5,"total_tokens":15}"#);
    assert_inexact("no prompt_tokens", &events, usage(0, 5, 0, 0, 0));
    let events = chat_with_usage(r#"{"prompt_tokens":null,"completion_tokens":5}"#);
    assert_inexact("null prompt_tokens", &events, usage(0, 5, 0, 0, 0));
    let events = chat_with_usage(r#"{"prompt_tokens":-3,"completion_tokens":5}"#);
    assert_inexact("negative prompt_tokens", &events, usage(0, 5, 0, 0, 0));
    let events = chat_with_usage(r#"{"prompt_tokens":10,"completion_tokens":"5"}"#);
    assert_inexact("string completion_tokens", &events, usage(10, 0, 0, 0, 0));
    let events = chat_with_usage(r#"{"prompt_tokens":10.5,"completion_tokens":5}"#);
    assert_inexact("fractional prompt_tokens", &events, usage(0, 5, 0, 0, 0));
}

#[test]
fn sc_95_chat_usage_with_inconsistent_counts_is_inexact() {
    let events = chat_with_usage(
        r#"{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":11}}"#,
    );
    assert_inexact("cached > prompt", &events, usage(10, 5, 11, 0, 0));
    let events = chat_with_usage(
        r#"{"prompt_tokens":10,"completion_tokens":5,"completion_tokens_details":{"reasoning_tokens":6}}"#,
    );
    assert_inexact("reasoning > completion", &events, usage(10, 5, 0, 0, 6));
    let events = chat_with_usage(
        r#"{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":-1}}"#,
    );
    assert_inexact("negative cached", &events, usage(10, 5, 0, 0, 0));
}

#[test]
fn sc_95_responses_usage_missing_a_required_field_is_inexact() {
    let events = responses_with_usage(r#"{"input_tokens":10}"#);
    assert_inexact("no output_tokens", &events, usage(10, 0, 0, 0, 0));
    let events = responses_with_usage(
        r#"{"output_tokens":5,"output_tokens_details":{"reasoning_tokens":2}}"#,
    );
    assert_inexact("no input_tokens", &events, usage(0, 3, 0, 0, 2));
    let events = responses_with_usage(r#"{"input_tokens":10,"output_tokens":-5}"#);
    assert_inexact("negative output_tokens", &events, usage(10, 0, 0, 0, 0));
}

#[test]
fn sc_95_responses_usage_with_inconsistent_counts_is_inexact() {
    let events = responses_with_usage(
        r#"{"input_tokens":10,"input_tokens_details":{"cached_tokens":12},"output_tokens":5}"#,
    );
    assert_inexact("cached > input", &events, usage(10, 5, 12, 0, 0));
    let events = responses_with_usage(
        r#"{"input_tokens":10,"output_tokens":5,"output_tokens_details":{"reasoning_tokens":9}}"#,
    );
    assert_inexact("reasoning > output", &events, usage(10, 5, 0, 0, 9));
}

#[test]
fn sc_95_anthropic_usage_missing_a_required_field_is_inexact() {
    // No output_tokens in message_delta: message_start's early count is not the final one.
    let events = anthropic_with_usage(r#"{"input_tokens":10,"output_tokens":1}"#, r#"{}"#);
    assert_inexact("no final output_tokens", &events, usage(10, 1, 0, 0, 0));
    // No input_tokens anywhere.
    let events = anthropic_with_usage(r#"{"output_tokens":1}"#, r#"{"output_tokens":5}"#);
    assert_inexact("no input_tokens", &events, usage(0, 5, 0, 0, 0));
    let events = anthropic_with_usage(
        r#"{"input_tokens":10,"output_tokens":1}"#,
        r#"{"output_tokens":null}"#,
    );
    assert_inexact("null final output_tokens", &events, usage(10, 1, 0, 0, 0));
    let events = anthropic_with_usage(
        r#"{"input_tokens":10,"cache_read_input_tokens":-2,"output_tokens":1}"#,
        r#"{"output_tokens":5}"#,
    );
    assert_inexact("negative cache read", &events, usage(10, 5, 0, 0, 0));
    let events = anthropic_with_usage(
        r#"{"input_tokens":10,"output_tokens":1}"#,
        r#"{"input_tokens":"ten","output_tokens":5}"#,
    );
    assert_inexact("restated input unreadable", &events, usage(0, 5, 0, 0, 0));
}

#[test]
fn sc_95_anthropic_usage_with_inconsistent_counts_is_inexact() {
    let events = anthropic_with_usage(
        r#"{"input_tokens":10,"output_tokens":1}"#,
        r#"{"output_tokens":5,"output_tokens_details":{"thinking_tokens":8}}"#,
    );
    assert_inexact("thinking > output", &events, usage(10, 5, 0, 0, 8));
}

// ---------------------------------------------------------------- shared fixtures

/// Tool calls by index: `(id, name, joined arguments)`.
fn tool_calls(events: &[ProviderEvent]) -> BTreeMap<u32, (String, String, String)> {
    let mut calls = BTreeMap::new();
    for e in events {
        match e {
            ProviderEvent::ToolCallStart { index, id, name } => {
                calls.insert(*index, (id.clone(), name.clone(), String::new()));
            }
            ProviderEvent::ToolCallArgsDelta { index, delta } => {
                calls.get_mut(index).unwrap().2.push_str(delta);
            }
            _ => {}
        }
    }
    calls
}

fn check_chat(name: &str, events: &[ProviderEvent], want: &Value) {
    let choice = &want["choices"]["0"];
    assert_eq!(text_of(events), choice["text"].as_str().unwrap(), "{name}");
    let refusal: String = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::RefusalDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(refusal, choice["refusal"].as_str().unwrap(), "{name}");
    let calls = tool_calls(events);
    let want_tools = choice["tools"].as_object().unwrap();
    assert_eq!(calls.len(), want_tools.len(), "{name}");
    for (index, tool) in want_tools {
        let (id, tool_name, args) = &calls[&index.parse::<u32>().unwrap()];
        assert_eq!(id, tool["id"].as_str().unwrap(), "{name}");
        assert_eq!(tool_name, tool["name"].as_str().unwrap(), "{name}");
        assert_eq!(args, tool["args"].as_str().unwrap(), "{name}");
        assert_eq!(serde_json::from_str::<Value>(args).unwrap(), tool["parsed"]);
    }
    assert_eq!(
        stops(events),
        vec![choice["finish"].as_str().unwrap()],
        "{name}"
    );
    let u = &want["usage"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let cached = n(&u["prompt_tokens_details"]["cached_tokens"]);
    let reasoning = n(&u["completion_tokens_details"]["reasoning_tokens"]);
    let disjoint = usage(
        n(&u["prompt_tokens"]) - cached,
        n(&u["completion_tokens"]) - reasoning,
        cached,
        0,
        reasoning,
    );
    assert_eq!(last_usage(events), Some((disjoint, true)), "{name}");
    assert_eq!(
        events.contains(&ProviderEvent::Done),
        want["done_sentinel"] == true
    );
}

/// Content blocks rebuilt from events: `(type, text or tool json, id, name, signature)`.
fn anthropic_blocks(
    events: &[ProviderEvent],
) -> Vec<(&'static str, String, String, String, String)> {
    let mut blocks: Vec<(&'static str, String, String, String, String)> = Vec::new();
    for e in events {
        let last_kind = blocks.last().map(|b| b.0);
        match e {
            ProviderEvent::TextDelta { text } if last_kind == Some("text") => {
                blocks.last_mut().unwrap().1.push_str(text);
            }
            ProviderEvent::TextDelta { text } => {
                blocks.push((
                    "text",
                    text.clone(),
                    String::new(),
                    String::new(),
                    String::new(),
                ));
            }
            ProviderEvent::ReasoningDelta { text } if last_kind == Some("thinking") => {
                blocks.last_mut().unwrap().1.push_str(text);
            }
            ProviderEvent::ReasoningDelta { text } => {
                blocks.push((
                    "thinking",
                    text.clone(),
                    String::new(),
                    String::new(),
                    String::new(),
                ));
            }
            ProviderEvent::ReasoningSignature { signature } => {
                blocks.last_mut().unwrap().4.push_str(signature);
            }
            ProviderEvent::ToolCallStart { id, name, .. } => {
                blocks.push((
                    "tool_use",
                    String::new(),
                    id.clone(),
                    name.clone(),
                    String::new(),
                ));
            }
            ProviderEvent::ToolCallArgsDelta { delta, .. } => {
                blocks.last_mut().unwrap().1.push_str(delta);
            }
            _ => {}
        }
    }
    blocks
}

fn check_anthropic(name: &str, events: &[ProviderEvent], want: &Value) {
    // An empty text block produces no event (it is no content): compare the others.
    let want_blocks: Vec<&Value> = want["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| !(b["type"] == "text" && b["text"] == ""))
        .collect();
    let got = anthropic_blocks(events);
    assert_eq!(got.len(), want_blocks.len(), "{name}");
    for (g, w) in got.iter().zip(want_blocks) {
        assert_eq!(g.0, w["type"].as_str().unwrap(), "{name}");
        match g.0 {
            "text" => assert_eq!(g.1, w["text"].as_str().unwrap(), "{name}"),
            "thinking" => {
                assert_eq!(g.1, w["thinking"].as_str().unwrap(), "{name}");
                assert_eq!(
                    g.4.len() as u64,
                    w["signature_len"].as_u64().unwrap(),
                    "{name}"
                );
            }
            _ => {
                assert_eq!(g.2, w["id"].as_str().unwrap(), "{name}");
                assert_eq!(g.3, w["name"].as_str().unwrap(), "{name}");
                assert_eq!(g.1, w["raw_json"].as_str().unwrap(), "{name}");
                let parsed = serde_json::from_str::<Value>(&g.1);
                match w["input"].as_str() {
                    Some(invalid) => {
                        assert!(
                            invalid.starts_with("INVALID_JSON") && parsed.is_err(),
                            "{name}"
                        )
                    }
                    None => assert_eq!(parsed.unwrap(), w["input"], "{name}"),
                }
            }
        }
    }
    assert_eq!(
        stops(events),
        vec![want["stop_reason"].as_str().unwrap()],
        "{name}"
    );
    let u = &want["usage"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let thinking = n(&u["output_tokens_details"]["thinking_tokens"]);
    let disjoint = usage(
        n(&u["input_tokens"]),
        n(&u["output_tokens"]) - thinking,
        n(&u["cache_read_input_tokens"]),
        n(&u["cache_creation_input_tokens"]),
        thinking,
    );
    assert_eq!(last_usage(events), Some((disjoint, true)), "{name}");
    assert_eq!(
        events.contains(&ProviderEvent::Done),
        want["message_stop"] == true
    );
    let refs = events
        .iter()
        .filter(|e| matches!(e, ProviderEvent::ProviderRef { .. }))
        .count();
    assert_eq!(
        refs as u64,
        want["message_start_count"].as_u64().unwrap(),
        "{name}"
    );
}

#[test]
fn sc_118_shared_fixtures_match_expected() {
    let dir = captured_streams();
    let expected: Value =
        serde_json::from_slice(&std::fs::read(dir.join("EXPECTED.json")).unwrap()).unwrap();
    let files = sse_files(&dir);
    assert_eq!(files.len(), expected.as_object().unwrap().len());
    for (name, protocol, bytes) in files {
        let events = decode_all(protocol, &bytes);
        let want = &expected[name.as_str()];
        assert!(want.is_object(), "{name} has no expectation");
        assert_eq!(
            error_kind(&events).is_some(),
            want["errors"] != json!([]),
            "{name}"
        );
        match protocol {
            Protocol::OpenAiChat => check_chat(&name, &events, want),
            _ => check_anthropic(&name, &events, want),
        }
    }
}
