//! OpenAI Chat Completions (`POST /v1/chat/completions`, `stream: true`): the request body and
//! the stream decoder.
//!
//! The stream is a sequence of `data: {chunk}` events ending with `data: [DONE]`. With
//! `stream_options.include_usage` the last chunk before `[DONE]` has `choices: []` and the usage.
//! Only choice 0 is read (requests never ask for `n > 1`).

use crate::client::ProviderRequest;
use crate::sse::decode::{at, guarded, index_u32, json_data, non_empty, provider_error, Lifecycle};
use crate::sse::SseEvent;
use crate::support::{is_openai_reasoning_model, temperature_json};
use serde_json::{json, Map, Value};
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
                out.extend(
                    self.open
                        .iter()
                        .map(|&index| ProviderEvent::ToolCallEnd { index }),
                );
                self.open.clear();
                out.push(ProviderEvent::Stop { reason });
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

    fn delta(&mut self, delta: &Value, out: &mut Vec<ProviderEvent>) {
        let reasoning =
            non_empty(delta, &["reasoning_content"]).or_else(|| non_empty(delta, &["reasoning"]));
        if let Some(text) = reasoning {
            out.push(ProviderEvent::ReasoningDelta { text });
        }
        if let Some(text) = non_empty(delta, &["content"]) {
            out.push(ProviderEvent::TextDelta { text });
        }
        if let Some(text) = non_empty(delta, &["refusal"]) {
            out.push(ProviderEvent::RefusalDelta { text });
        }
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

/// Chat usage in disjoint classes: cached prompt tokens and reasoning tokens are split out.
/// `prompt_tokens` and `completion_tokens` are required; the details are optional and at most
/// their totals. Returns the classes and whether they are exact (SC-95).
fn usage(u: &Value) -> (Usage, bool) {
    crate::usage::openai(u, "prompt", "completion")
}
