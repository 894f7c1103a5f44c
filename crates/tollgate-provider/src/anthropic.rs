//! Anthropic Messages (`POST /v1/messages`, `stream: true`): the request body and the stream
//! decoder.
//!
//! The stream is `message_start`, then per content block `content_block_start`,
//! `content_block_delta`s and `content_block_stop`, then `message_delta` (stop reason and the
//! final usage) and `message_stop`; `ping` may appear anywhere and `error` ends the stream.

use crate::client::ProviderRequest;
use crate::sse::decode::{at, error, index_u32, non_empty, provider_error, str_at};
use crate::sse::decode::{guarded, plain_text, with_json, Lifecycle, MapOnly};
use crate::sse::SseEvent;
use crate::support::temperature_json;
use crate::usage::{split, Count};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;
use tollgate_core::event::ProviderEvent;
use tollgate_core::message::{Message, Part, Role, ToolChoice};
use tollgate_core::Usage;

/// The `anthropic-version` header value the adapter speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The streaming request body for `req`.
///
/// With `req.cache == Some(true)` the last tool, the system prompt and the last content block
/// get an ephemeral `cache_control` breakpoint. `req.json_schema` is not sent: the Messages API
/// has no generally available JSON-schema output mode; the caller validates the text.
pub fn request_body(req: &ProviderRequest) -> Value {
    let cache = req.cache == Some(true);
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("max_tokens".into(), json!(req.max_tokens));
    body.insert("stream".into(), json!(true));
    if let Some(system) = &req.system {
        let value = if cache {
            json!([{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}])
        } else {
            json!(system)
        };
        body.insert("system".into(), value);
    }
    let mut messages: Vec<Value> = req.messages.iter().filter_map(message).collect();
    if cache {
        let last = messages
            .last_mut()
            .and_then(|m| m.get_mut("content"))
            .and_then(Value::as_array_mut)
            .and_then(|blocks| blocks.last_mut());
        if let Some(Value::Object(block)) = last {
            block.insert("cache_control".into(), json!({"type": "ephemeral"}));
        }
    }
    body.insert("messages".into(), Value::Array(messages));
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), temperature_json(t));
    }
    if !req.tools.is_empty() {
        let mut tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut spec = Map::new();
                spec.insert("name".into(), json!(t.name));
                if !t.description.is_empty() {
                    spec.insert("description".into(), json!(t.description));
                }
                spec.insert("input_schema".into(), t.input_schema.clone());
                Value::Object(spec)
            })
            .collect();
        if let (true, Some(Value::Object(last))) = (cache, tools.last_mut()) {
            last.insert("cache_control".into(), json!({"type": "ephemeral"}));
        }
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = &req.tool_choice {
        let c = match choice {
            ToolChoice::Tool { name } => json!({"type": "tool", "name": name}),
            other => json!({"type": other.mode()}),
        };
        body.insert("tool_choice".into(), c);
    }
    Value::Object(body)
}

/// One message with its content blocks; `None` when it has none (empty text is dropped: the API
/// rejects empty text blocks).
fn message(m: &Message) -> Option<Value> {
    let blocks: Vec<Value> = m
        .content
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } if text.is_empty() => None,
            Part::Text { text } => Some(json!({"type": "text", "text": text})),
            Part::ToolCall { id, name, input } => {
                Some(json!({"type": "tool_use", "id": id, "name": name, "input": input}))
            }
            Part::ToolResult {
                call_id,
                content,
                is_error,
            } => {
                let mut r =
                    json!({"type": "tool_result", "tool_use_id": call_id, "content": content});
                if *is_error {
                    r["is_error"] = json!(true);
                }
                Some(r)
            }
        })
        .collect();
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    (!blocks.is_empty()).then(|| json!({"role": role, "content": blocks}))
}

/// An open content block.
#[derive(Debug, Clone)]
enum Block {
    Text,
    Thinking,
    RedactedThinking,
    ToolUse,
    /// A block type this adapter does not interpret, with its streamed `input` JSON.
    Other {
        block: Value,
        json: String,
    },
}

/// Usage fields as the provider reports them; `message_delta` values replace these field by
/// field (a field it does not send keeps its `message_start` value).
#[derive(Debug, Default, Clone, Copy)]
struct RawUsage {
    input: Count,
    cache_read: Count,
    cache_write: Count,
    output: Count,
    thinking: Count,
    /// Whether `message_delta` stated `output_tokens`: the final output count comes only from it.
    final_output: bool,
}

impl RawUsage {
    fn update(&mut self, u: &Value, from_delta: bool) {
        let fields: [(&[&str], &mut Count); 5] = [
            (&["input_tokens"], &mut self.input),
            (&["cache_read_input_tokens"], &mut self.cache_read),
            (&["cache_creation_input_tokens"], &mut self.cache_write),
            (&["output_tokens"], &mut self.output),
            (
                &["output_tokens_details", "thinking_tokens"],
                &mut self.thinking,
            ),
        ];
        for (path, slot) in fields {
            let count = Count::read(u, path);
            if count != Count::Absent {
                *slot = count;
            }
        }
        if from_delta && Count::read(u, &["output_tokens"]) != Count::Absent {
            self.final_output = true;
        }
    }

    /// Disjoint classes: Anthropic's `input_tokens` already excludes cache reads and writes;
    /// `output_tokens` includes thinking, split out when the provider reports it.
    ///
    /// Exact (SC-95) only with a valid `input_tokens` (from `message_start`, or restated by
    /// `message_delta`), a valid `output_tokens` stated by `message_delta`, readable cache counts
    /// and thinking at most the output; only exact usage is sent as terminal.
    fn event(&self, terminal: bool) -> ProviderEvent {
        let (output, reasoning, output_exact) = split(self.output, self.thinking);
        let exact = output_exact
            && self.final_output
            && self.input.required().is_some()
            && self.cache_read.optional().is_some()
            && self.cache_write.optional().is_some();
        ProviderEvent::Usage {
            usage: Usage {
                input: self.input.or_zero(),
                output,
                cache_read: self.cache_read.or_zero(),
                cache_write: self.cache_write.or_zero(),
                reasoning,
            },
            terminal: terminal && exact,
        }
    }
}

/// A `content_block_delta` event with a text or thinking delta, read into typed fields whose
/// strings borrow from the event, without a JSON tree: its event, if any. `None` for every other
/// event, and for one whose fields are not of their types, an array where an object goes or a
/// key twice among them: [`Decoder::decode`] then reads it as a tree. Where it answers, it answers
/// as the tree reading does, and such an event changes no decoder state
/// (`h_42_a_plain_delta_decodes_as_its_tree`).
fn plain_delta(ev: &SseEvent) -> Option<Option<ProviderEvent>> {
    if ev.is_overflow() {
        return None;
    }
    let MapOnly(event) = serde_json::from_str::<MapOnly<PlainBlockDelta<'_>>>(&ev.data).ok()?;
    if event.kind.is_none() && ev.event.as_deref() != Some("content_block_delta") {
        return None;
    }
    let (Some(index), Some(MapOnly(delta))) = (event.index, event.delta) else {
        // The tree reading answers nothing for these, or reads a delta of another shape.
        return None;
    };
    match delta.kind? {
        // An index out of `u32`'s range is no index: the tree reading answers nothing.
        _ if u32::try_from(index).is_err() => Some(None),
        TextDeltaKind::Text => {
            Some(plain_text(delta.text).map(|text| ProviderEvent::TextDelta { text }))
        }
        TextDeltaKind::Thinking => {
            Some(plain_text(delta.thinking).map(|text| ProviderEvent::ReasoningDelta { text }))
        }
    }
}

/// The event's `type` as the typed reading takes it: any other kind fails the reading where it
/// is met (the event is then read as a tree), so an event of another kind costs little.
#[derive(Deserialize)]
enum BlockDeltaKind {
    #[serde(rename = "content_block_delta")]
    ContentBlockDelta,
}

/// A delta's `type` as the typed reading takes it; any other kind fails the reading.
#[derive(Deserialize)]
enum TextDeltaKind {
    #[serde(rename = "text_delta")]
    Text,
    #[serde(rename = "thinking_delta")]
    Thinking,
}

#[derive(Deserialize)]
struct PlainBlockDelta<'a> {
    #[serde(rename = "type", default)]
    kind: Option<BlockDeltaKind>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<MapOnly<PlainDelta<'a>>>,
}

#[derive(Deserialize)]
struct PlainDelta<'a> {
    #[serde(rename = "type", default)]
    kind: Option<TextDeltaKind>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
}

/// Decodes a Messages stream into normalized events.
#[derive(Debug, Default)]
pub struct Decoder {
    life: Lifecycle,
    ref_sent: bool,
    usage: RawUsage,
    blocks: BTreeMap<u32, Block>,
}

impl Decoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one SSE event. Nothing is decoded after `message_stop` or an error.
    pub fn push(&mut self, ev: &SseEvent) -> Vec<ProviderEvent> {
        guarded(
            self,
            |d| &mut d.life,
            |d| {
                plain_delta(ev).map_or_else(
                    || with_json(ev, |data| d.decode(ev, data)),
                    |event| event.into_iter().collect(),
                )
            },
        )
    }

    /// At end of input: `connection_closed` if `message_stop` never arrived (and no error did).
    pub fn finish(&mut self) -> Vec<ProviderEvent> {
        self.life.finish()
    }

    fn decode(&mut self, ev: &SseEvent, data: &Value) -> Vec<ProviderEvent> {
        let kind = str_at(data, &["type"])
            .or(ev.event.as_deref())
            .unwrap_or_default();
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                if let (false, Some(id)) = (self.ref_sent, non_empty(data, &["message", "id"])) {
                    self.ref_sent = true;
                    out.push(ProviderEvent::ProviderRef { id });
                }
                if let Some(u) = at(data, &["message", "usage"]) {
                    self.usage.update(u, false);
                    out.push(self.usage.event(false));
                }
            }
            "content_block_start" => self.block_start(data, &mut out),
            "content_block_delta" => self.block_delta(data, &mut out),
            "content_block_stop" => {
                if let Some(index) = index_u32(data, "index") {
                    self.close_block(index, &mut out);
                }
            }
            "message_delta" => {
                let open: Vec<u32> = self.blocks.keys().copied().collect();
                for index in open {
                    self.close_block(index, &mut out);
                }
                if let Some(reason) = non_empty(data, &["delta", "stop_reason"]) {
                    out.push(ProviderEvent::Stop { reason });
                }
                if let Some(u) = at(data, &["usage"]) {
                    self.usage.update(u, true);
                    out.push(self.usage.event(true));
                }
            }
            "message_stop" => out.push(ProviderEvent::Done),
            "ping" => {}
            "error" => out.push(match at(data, &["error"]) {
                Some(err) => provider_error(err, "error"),
                None => error("error", "provider reported an error"),
            }),
            _ => {
                if let Some(err) = at(data, &["error"]) {
                    out.push(provider_error(err, "error"));
                }
            }
        }
        out
    }

    fn block_start(&mut self, data: &Value, out: &mut Vec<ProviderEvent>) {
        let (Some(index), Some(cb)) = (index_u32(data, "index"), at(data, &["content_block"]))
        else {
            return;
        };
        let block = match str_at(cb, &["type"]).unwrap_or_default() {
            "text" => {
                out.extend(non_empty(cb, &["text"]).map(|text| ProviderEvent::TextDelta { text }));
                Block::Text
            }
            "thinking" => {
                out.extend(
                    non_empty(cb, &["thinking"]).map(|text| ProviderEvent::ReasoningDelta { text }),
                );
                out.extend(
                    non_empty(cb, &["signature"])
                        .map(|signature| ProviderEvent::ReasoningSignature { signature }),
                );
                Block::Thinking
            }
            "redacted_thinking" => {
                out.extend(
                    non_empty(cb, &["data"]).map(|data| ProviderEvent::ReasoningOpaque { data }),
                );
                Block::RedactedThinking
            }
            "tool_use" => {
                out.push(ProviderEvent::ToolCallStart {
                    index,
                    id: non_empty(cb, &["id"]).unwrap_or_default(),
                    name: non_empty(cb, &["name"]).unwrap_or_default(),
                });
                // Streaming sends `input: {}` and the arguments as deltas; a proxy may send the
                // whole input up front instead.
                if let Some(input) =
                    at(cb, &["input"]).filter(|i| i.as_object().is_some_and(|o| !o.is_empty()))
                {
                    out.push(ProviderEvent::ToolCallArgsDelta {
                        index,
                        delta: input.to_string(),
                    });
                }
                Block::ToolUse
            }
            _ => Block::Other {
                block: cb.clone(),
                json: String::new(),
            },
        };
        self.blocks.insert(index, block);
    }

    fn block_delta(&mut self, data: &Value, out: &mut Vec<ProviderEvent>) {
        let (Some(index), Some(delta)) = (index_u32(data, "index"), at(data, &["delta"])) else {
            return;
        };
        let text = |key: &str| non_empty(delta, &[key]);
        match str_at(delta, &["type"]).unwrap_or_default() {
            "text_delta" => out.extend(text("text").map(|text| ProviderEvent::TextDelta { text })),
            "thinking_delta" => {
                out.extend(text("thinking").map(|text| ProviderEvent::ReasoningDelta { text }));
            }
            "signature_delta" => out.extend(
                text("signature").map(|signature| ProviderEvent::ReasoningSignature { signature }),
            ),
            "input_json_delta" => {
                let Some(part) = text("partial_json") else {
                    return;
                };
                match self.blocks.get_mut(&index) {
                    Some(Block::Other { json, .. }) => json.push_str(&part),
                    // Arguments for an unknown index still go out: the collector judges them.
                    _ => out.push(ProviderEvent::ToolCallArgsDelta { index, delta: part }),
                }
            }
            _ => {} // e.g. `citations_delta`: nothing we map
        }
    }

    fn close_block(&mut self, index: u32, out: &mut Vec<ProviderEvent>) {
        match self.blocks.remove(&index) {
            Some(Block::ToolUse) => out.push(ProviderEvent::ToolCallEnd { index }),
            Some(Block::Other { mut block, json }) => {
                if let (Ok(input), Value::Object(map)) =
                    (serde_json::from_str::<Value>(&json), &mut block)
                {
                    map.insert("input".into(), input);
                }
                out.push(ProviderEvent::ProviderBlock { block });
            }
            Some(Block::Text | Block::Thinking | Block::RedactedThinking) | None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::strategies::{object, or_odd, plain_as_tree, scalar, sse_event as event};
    use proptest::prelude::*;

    /// Whether the typed reading of `ev` answers, and, where it does, whether it gives what the
    /// tree reading gives (a decoder in the middle of a stream, a tool call's block open) and
    /// leaves the decoder as it was.
    fn same_as_tree(ev: &SseEvent) -> bool {
        let mut tree = Decoder::new();
        tree.blocks.insert(1, Block::ToolUse);
        let answered = plain_as_tree(ev, plain_delta, |ev, data| tree.decode(ev, data));
        assert!(!tree.ref_sent, "{}", ev.data);
        assert_eq!(tree.blocks.len(), 1, "{}", ev.data);
        answered
    }

    #[test]
    fn h_42_a_plain_delta_is_read_without_a_tree() {
        let text = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel\"lo"}}"#;
        assert!(same_as_tree(&event(Some("content_block_delta"), text)));
        let thinking = r#"{"type":"content_block_delta","index":1,"delta":{"type":"thinking_delta","thinking":"hm"}}"#;
        assert!(same_as_tree(&event(None, thinking)));
        let named = r#"{"index":0,"delta":{"type":"text_delta","text":"x"}}"#;
        assert!(same_as_tree(&event(Some("content_block_delta"), named)));
    }

    #[test]
    fn h_42_other_events_are_read_as_a_tree() {
        for (name, data) in [
            (
                None,
                r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":1}}}"#,
            ),
            (
                None,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}"#,
            ),
            (
                None,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":7}}"#,
            ),
            (
                None,
                r#"{"type":"content_block_delta","index":-1,"delta":{"type":"text_delta","text":"x"}}"#,
            ),
            (
                None,
                r#"{"type":"content_block_delta","index":0,"delta":["text_delta","x"]}"#,
            ),
            (
                None,
                r#"{"type":"content_block_delta","index":0,"index":1,"delta":{"type":"text_delta","text":"x"}}"#,
            ),
            (Some("content_block_delta"), r#"["content_block_delta",0]"#),
            (
                None,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
            ),
        ] {
            assert!(
                !same_as_tree(&event(name, data)),
                "{data} is read as a tree"
            );
        }
    }

    fn block_delta() -> impl Strategy<Value = Value> {
        let text = || or_odd(scalar()).boxed();
        let kind = || {
            or_odd(
                prop_oneof![
                    Just("text_delta"),
                    Just("thinking_delta"),
                    Just("input_json_delta"),
                    Just("content_block_delta"),
                    Just("message_delta")
                ]
                .prop_map(Value::from),
            )
            .boxed()
        };
        let delta = object(vec![
            ("type", 0.9, kind()),
            ("text", 0.6, text()),
            ("thinking", 0.4, text()),
            ("partial_json", 0.2, text()),
        ]);
        object(vec![
            ("type", 0.8, kind()),
            ("index", 0.9, text()),
            ("delta", 0.9, or_odd(delta).boxed()),
            ("error", 0.1, or_odd(Just(json!({"message": "m"}))).boxed()),
        ])
    }

    fn plain_block_delta() -> impl Strategy<Value = Value> {
        (
            prop_oneof![Just("text"), Just("thinking")],
            0u64..4,
            prop_oneof![Just(""), Just("a"), Just("é\"\\\n\u{1}")],
        )
            .prop_map(|(kind, index, text)| {
                json!({
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": format!("{kind}_delta"), kind: text},
                })
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn h_42_a_plain_delta_decodes_as_its_tree(
            data in or_odd(block_delta()),
            name in prop::option::of(prop_oneof![Just("content_block_delta"), Just("ping")]),
        ) {
            same_as_tree(&event(name, &data.to_string()));
        }

        #[test]
        fn h_42_every_plain_delta_is_read_without_a_tree(data in plain_block_delta()) {
            prop_assert!(same_as_tree(&event(None, &data.to_string())), "{data}");
        }
    }
}
