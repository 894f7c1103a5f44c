//! OpenAI Chat Completions (`POST /v1/chat/completions`, `stream: true`): the request body and
//! the stream decoder.
//!
//! The stream is a sequence of `data: {chunk}` events ending with `data: [DONE]`. With
//! `stream_options.include_usage` the last chunk before `[DONE]` has `choices: []` and the usage.
//! Only choice 0 is read (requests never ask for `n > 1`).

use crate::client::ProviderRequest;
use crate::sse::decode::{at, guarded, index_u32, json_data, non_empty, provider_error, Lifecycle};
use crate::sse::decode::{plain_text, MapOnly};
use crate::sse::SseEvent;
use crate::support::{is_openai_reasoning_model, temperature_json};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::BTreeSet;
use tollgate_core::event::ProviderEvent;
use tollgate_core::message::{Message, Part, Role, ToolChoice};
use tollgate_core::Usage;

/// The streaming request body for `req`.
///
/// OpenAI models (`gpt-*`, `chatgpt-*`, reasoning families) get `max_completion_tokens`; other
/// (OpenAI-compatible) models get `max_tokens`.
pub fn request_body(req: &ProviderRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("messages".into(), Value::Array(messages(req)));
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    let openai = is_openai_reasoning_model(&req.model)
        || req.model.starts_with("gpt-")
        || req.model.starts_with("chatgpt-");
    let max_key = if openai {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    body.insert(max_key.into(), json!(req.max_tokens));
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), temperature_json(t));
    }
    if !req.tools.is_empty() {
        let tools = req.tools.iter().map(|t| {
            let mut f = Map::new();
            f.insert("name".into(), json!(t.name));
            if !t.description.is_empty() {
                f.insert("description".into(), json!(t.description));
            }
            f.insert("parameters".into(), t.input_schema.clone());
            json!({"type": "function", "function": f})
        });
        body.insert("tools".into(), Value::Array(tools.collect()));
    }
    if let Some(choice) = &req.tool_choice {
        body.insert("tool_choice".into(), tool_choice(choice));
    }
    if let Some((name, schema)) = &req.json_schema {
        body.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema}}),
        );
    }
    Value::Object(body)
}

fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::Any => json!("required"),
        ToolChoice::None => json!("none"),
        ToolChoice::Tool { name } => json!({"type": "function", "function": {"name": name}}),
    }
}

fn messages(req: &ProviderRequest) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(system) = &req.system {
        out.push(json!({"role": "system", "content": system}));
    }
    for m in &req.messages {
        push_message(m, &mut out);
    }
    out
}

/// Tool results become `tool` messages (placed first: they answer the preceding assistant
/// message); tool calls go on an assistant message.
fn push_message(m: &Message, out: &mut Vec<Value>) {
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for part in &m.content {
        match part {
            Part::Text { text } => texts.push(text.as_str()),
            Part::ToolCall { id, name, input } => calls.push(json!({
                "id": id, "type": "function",
                "function": {"name": name, "arguments": input.to_string()},
            })),
            Part::ToolResult {
                call_id, content, ..
            } => out.push(json!({"role": "tool", "tool_call_id": call_id, "content": content})),
        }
    }
    match m.role {
        Role::Assistant if !texts.is_empty() || !calls.is_empty() => {
            let mut msg = json!({"role": "assistant", "content": text_content(&texts)});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        }
        Role::Assistant => {}
        Role::User => {
            if !calls.is_empty() {
                out.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
            }
            if !texts.is_empty() {
                out.push(json!({"role": "user", "content": text_content(&texts)}));
            }
        }
    }
}

fn text_content(texts: &[&str]) -> Value {
    match texts {
        [] => Value::Null,
        [one] => json!(one),
        many => Value::Array(
            many.iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect(),
        ),
    }
}

/// Decodes a Chat Completions stream into normalized events.
#[derive(Debug, Default)]
pub struct Decoder {
    life: Lifecycle,
    ref_sent: bool,
    started: BTreeSet<u32>,
    open: BTreeSet<u32>,
}

impl Decoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one SSE event. Nothing is decoded after `[DONE]` or an error.
    pub fn push(&mut self, ev: &SseEvent) -> Vec<ProviderEvent> {
        guarded(self, |d| &mut d.life, |d| d.decode(ev))
    }

    /// At end of input: `connection_closed` if `[DONE]` never arrived (and no error did).
    pub fn finish(&mut self) -> Vec<ProviderEvent> {
        self.life.finish()
    }

    fn decode(&mut self, ev: &SseEvent) -> Vec<ProviderEvent> {
        if !ev.is_overflow() && ev.data.trim() == "[DONE]" {
            return vec![ProviderEvent::Done];
        }
        if let Some(out) = self.decode_plain(ev) {
            return out;
        }
        self.decode_value(ev)
    }

    /// A chunk of the usual shape, read without building a JSON tree: the fields this decoder
    /// reads, typed, the rest skipped. `None` for any other chunk (an error, usage, tool calls,
    /// a field of another type, a repeated key): [`Decoder::decode_value`] then reads it. Where
    /// it answers, it answers as `decode_value` does (`h_42_a_plain_chunk_decodes_as_its_tree`).
    fn decode_plain(&mut self, ev: &SseEvent) -> Option<Vec<ProviderEvent>> {
        if ev.is_overflow() {
            return None;
        }
        let MapOnly(chunk) = serde_json::from_str::<MapOnly<PlainChunk<'_>>>(&ev.data).ok()?;
        let choices = chunk.choices.unwrap_or_default();
        let mut out = Vec::new();
        if !self.ref_sent {
            if let Some(id) = plain_text(chunk.id) {
                self.ref_sent = true;
                out.push(ProviderEvent::ProviderRef { id });
            }
        }
        for MapOnly(choice) in choices {
            if choice.index() != 0 {
                continue;
            }
            if let Some(MapOnly(delta)) = choice.delta {
                push_texts(
                    plain_text(delta.reasoning_content).or_else(|| plain_text(delta.reasoning)),
                    plain_text(delta.content),
                    plain_text(delta.refusal),
                    &mut out,
                );
            }
            if let Some(reason) = plain_text(choice.finish_reason) {
                self.stop(reason, &mut out);
            }
        }
        Some(out)
    }

    /// Any chunk, read as a JSON tree.
    fn decode_value(&mut self, ev: &SseEvent) -> Vec<ProviderEvent> {
        let chunk = match json_data(ev) {
            Ok(v) => v,
            Err(e) => return vec![e],
        };
        if let Some(err) = at(&chunk, &["error"]) {
            return vec![provider_error(err, "error")];
        }
        let mut out = Vec::new();
        if !self.ref_sent {
            if let Some(id) = non_empty(&chunk, &["id"]) {
                self.ref_sent = true;
                out.push(ProviderEvent::ProviderRef { id });
            }
        }
        let choices = chunk.get("choices").and_then(Value::as_array);
        let mut finished = false;
        for choice in choices.into_iter().flatten() {
            if index_u32(choice, "index").unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = at(choice, &["delta"]) {
                self.delta(delta, &mut out);
            }
            if let Some(reason) = non_empty(choice, &["finish_reason"]) {
                self.stop(reason, &mut out);
                finished = true;
            }
        }
        if let Some(u) = at(&chunk, &["usage"]) {
            // The final usage chunk has no choices; a server that puts usage on the finishing
            // chunk also reports its final count. Usage on any other chunk is a running count.
            // An inexact count is never final (SC-95).
            let last = finished || choices.is_none_or(|c| c.is_empty());
            let (usage, exact) = usage(u);
            out.push(ProviderEvent::Usage {
                usage,
                terminal: last && exact,
            });
        }
        out
    }

    /// The end of choice 0: every open tool call ends, then the stop.
    fn stop(&mut self, reason: String, out: &mut Vec<ProviderEvent>) {
        out.extend(
            self.open
                .iter()
                .map(|&index| ProviderEvent::ToolCallEnd { index }),
        );
        self.open.clear();
        out.push(ProviderEvent::Stop { reason });
    }

    fn delta(&mut self, delta: &Value, out: &mut Vec<ProviderEvent>) {
        push_texts(
            non_empty(delta, &["reasoning_content"]).or_else(|| non_empty(delta, &["reasoning"])),
            non_empty(delta, &["content"]),
            non_empty(delta, &["refusal"]),
            out,
        );
        let calls = delta.get("tool_calls").and_then(Value::as_array);
        for (pos, call) in calls.into_iter().flatten().enumerate() {
            let index = index_u32(call, "index").unwrap_or(u32::try_from(pos).unwrap_or(u32::MAX));
            self.tool_call(index, call, out);
        }
    }

    fn tool_call(&mut self, index: u32, call: &Value, out: &mut Vec<ProviderEvent>) {
        if !self.started.contains(&index) {
            let id = non_empty(call, &["id"]);
            let name = non_empty(call, &["function", "name"]);
            if id.is_some() || name.is_some() {
                self.started.insert(index);
                self.open.insert(index);
                out.push(ProviderEvent::ToolCallStart {
                    index,
                    id: id.unwrap_or_default(),
                    name: name.unwrap_or_default(),
                });
            }
        }
        if let Some(delta) = non_empty(call, &["function", "arguments"]) {
            out.push(ProviderEvent::ToolCallArgsDelta { index, delta });
        }
    }
}

/// A chunk's fields as [`Decoder::decode_plain`] reads them: strings borrowed from the event
/// where they have no escapes; a field that is present and not null but not of its type fails the
/// whole chunk (then read as a tree). Other fields are skipped.
#[derive(Deserialize)]
struct PlainChunk<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Option<Vec<MapOnly<PlainChoice<'a>>>>,
    #[serde(default, rename = "error")]
    _error: Option<TreeOnly>,
    #[serde(default, rename = "usage")]
    _usage: Option<TreeOnly>,
}

/// A field that is read as a tree whenever it is present and not null: its typed reading fails
/// at once, so the chunk's typed reading stops where it meets it instead of reading the rest.
struct TreeOnly;

impl<'de> Deserialize<'de> for TreeOnly {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(serde::de::Error::custom("read as a tree"))
    }
}

#[derive(Deserialize)]
struct PlainChoice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<MapOnly<PlainDelta<'a>>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

impl PlainChoice<'_> {
    /// The choice's index as the tree reading takes it: a number out of `u32`'s range, or none,
    /// is 0.
    fn index(&self) -> u32 {
        self.index.and_then(|i| u32::try_from(i).ok()).unwrap_or(0)
    }
}

#[derive(Deserialize)]
struct PlainDelta<'a> {
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default, rename = "tool_calls")]
    _tool_calls: Option<TreeOnly>,
}

/// A delta's texts as events, in this order: reasoning, text, refusal.
fn push_texts(
    reasoning: Option<String>,
    text: Option<String>,
    refusal: Option<String>,
    out: &mut Vec<ProviderEvent>,
) {
    if let Some(text) = reasoning {
        out.push(ProviderEvent::ReasoningDelta { text });
    }
    if let Some(text) = text {
        out.push(ProviderEvent::TextDelta { text });
    }
    if let Some(text) = refusal {
        out.push(ProviderEvent::RefusalDelta { text });
    }
}

/// Chat usage in disjoint classes: cached prompt tokens and reasoning tokens are split out.
/// `prompt_tokens` and `completion_tokens` are required; the details are optional and at most
/// their totals. Returns the classes and whether they are exact (SC-95).
fn usage(u: &Value) -> (Usage, bool) {
    crate::usage::openai(u, "prompt", "completion")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::strategies::{object, or_odd, scalar};
    use proptest::prelude::*;

    fn event(data: &str) -> SseEvent {
        SseEvent {
            event: None,
            data: data.to_string(),
            id: None,
        }
    }

    /// Two decoders in one state: no provider ref sent yet, or sent, and tool call 3 open.
    fn pair(ref_sent: bool) -> (Decoder, Decoder) {
        let make = || {
            let mut d = Decoder::new();
            d.ref_sent = ref_sent;
            d.started.insert(3);
            d.open.insert(3);
            d
        };
        (make(), make())
    }

    /// Whether `data` read without a tree, where that answers, gives the events and the state
    /// that the tree reading gives; and whether it answered.
    fn same_as_tree(data: &str, ref_sent: bool) -> bool {
        let (mut plain, mut tree) = pair(ref_sent);
        let ev = event(data);
        let Some(out) = plain.decode_plain(&ev) else {
            return false;
        };
        assert_eq!(out, tree.decode_value(&ev), "{data}");
        assert_eq!(plain.ref_sent, tree.ref_sent, "{data}");
        assert_eq!(plain.open, tree.open, "{data}");
        assert_eq!(plain.started, tree.started, "{data}");
        true
    }

    #[test]
    fn h_42_a_plain_chunk_is_read_without_a_tree() {
        let text = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel\"lo"},"logprobs":null,"finish_reason":null}]}"#;
        assert!(same_as_tree(text, false));
        assert!(same_as_tree(text, true));
        let stop =
            r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#;
        assert!(same_as_tree(stop, false));
        let reasoning = r#"{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"think","content":""}}]}"#;
        assert!(same_as_tree(reasoning, false));
    }

    #[test]
    fn h_42_other_chunks_are_read_as_a_tree() {
        for data in [
            // usage, an error, tool calls: read as a tree.
            r#"{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
            r#"{"error":{"type":"overloaded","message":"busy"}}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":"{}"}}]}}]}"#,
            // A field of another type, an array for an object, a repeated key.
            r#"{"id":7,"choices":[]}"#,
            r#"{"id":"c","choices":[[0,{"content":"x"},"stop"]]}"#,
            r#"["c",[]]"#,
            r#"{"id":"a","id":"b","choices":[]}"#,
            r#"{"id":"c","choices":[{"index":-1,"delta":{"content":"x"}}]}"#,
        ] {
            assert!(!same_as_tree(data, false), "{data} is read as a tree");
            let mut d = Decoder::new();
            let _ = d.decode(&event(data));
        }
        // What a tree reading gives for them is what the decoder gives.
        let repeated = r#"{"id":"a","id":"b","choices":[]}"#;
        let mut d = Decoder::new();
        assert_eq!(
            d.decode(&event(repeated)),
            vec![ProviderEvent::ProviderRef { id: "b".into() }]
        );
    }

    /// A delta's text fields, each of `text`.
    fn delta_texts(
        text: impl Fn() -> BoxedStrategy<Value>,
    ) -> Vec<(&'static str, f64, BoxedStrategy<Value>)> {
        vec![
            ("content", 0.6, text()),
            ("reasoning", 0.3, text()),
            ("reasoning_content", 0.3, text()),
            ("refusal", 0.2, text()),
            ("role", 0.3, text()),
        ]
    }

    fn chunk() -> impl Strategy<Value = Value> {
        let text = || or_odd(scalar()).boxed();
        let mut delta = delta_texts(text);
        delta.push((
            "tool_calls",
            0.1,
            or_odd(Just(json!([{"index": 0, "id": "t"}]))).boxed(),
        ));
        let delta = object(delta);
        let choice = object(vec![
            ("index", 0.7, text()),
            ("delta", 0.8, or_odd(delta).boxed()),
            ("finish_reason", 0.5, text()),
            ("logprobs", 0.2, text()),
        ]);
        object(vec![
            ("id", 0.8, text()),
            (
                "choices",
                0.9,
                or_odd(prop::collection::vec(or_odd(choice), 0..3).prop_map(Value::Array)).boxed(),
            ),
            (
                "usage",
                0.1,
                or_odd(Just(json!({"prompt_tokens": 1}))).boxed(),
            ),
            ("error", 0.1, or_odd(Just(json!({"message": "m"}))).boxed()),
            ("model", 0.3, text()),
        ])
    }

    /// A chunk of the usual shape: strings (or null) where strings go, objects where objects go,
    /// no usage, error or tool calls.
    fn plain_chunk() -> impl Strategy<Value = Value> {
        let text = || {
            prop_oneof![
                Just(Value::Null),
                prop_oneof![Just(""), Just("a"), Just("stop"), Just("é\"\\\n\u{1}")]
                    .prop_map(Value::from)
            ]
            .boxed()
        };
        let index = prop_oneof![Just(Value::Null), (0u64..3).prop_map(Value::from)].boxed();
        let delta = object(delta_texts(text));
        let choice = object(vec![
            ("index", 0.7, index),
            ("delta", 0.8, delta),
            ("finish_reason", 0.5, text()),
        ]);
        object(vec![
            ("id", 0.8, text()),
            (
                "choices",
                0.9,
                prop::collection::vec(choice, 0..3)
                    .prop_map(Value::Array)
                    .boxed(),
            ),
            ("usage", 0.2, Just(Value::Null).boxed()),
            ("object", 0.5, text()),
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn h_42_every_plain_chunk_is_read_without_a_tree(chunk in plain_chunk(), ref_sent in any::<bool>()) {
            prop_assert!(same_as_tree(&chunk.to_string(), ref_sent), "{chunk}");
        }

        #[test]
        fn h_42_a_plain_chunk_decodes_as_its_tree(chunk in or_odd(chunk()), ref_sent in any::<bool>()) {
            same_as_tree(&chunk.to_string(), ref_sent);
        }
    }
}
