//! OpenAI Responses (`POST /v1/responses`, `stream: true`): the request body and the stream
//! decoder.
//!
//! The stream is a sequence of typed events (`response.created`, `response.output_item.added`,
//! `response.output_text.delta`, ...) ending with `response.completed`, `response.incomplete` or
//! `response.failed`; there is no `[DONE]`. Tool calls are indexed by their `output_index`.

use crate::client::ProviderRequest;
use crate::sse::decode::{
    at, error, guarded, index_u32, non_empty, provider_error, str_at, with_json, Lifecycle,
};
use crate::sse::decode::{plain_text, MapOnly};
use crate::sse::SseEvent;
use crate::support::{matrix, temperature_json};
use crate::Protocol;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::BTreeSet;
use tollgate_core::event::ProviderEvent;
use tollgate_core::message::{Part, Role, ToolChoice};

/// The streaming request body for `req`.
///
/// The response is stored at the provider (`store: true`) so that its usage can be fetched
/// later when the stream is lost (`GET /v1/responses/{id}`, SC-110); reasoning models are asked
/// for their encrypted reasoning (`include: ["reasoning.encrypted_content"]`), which other
/// models reject.
/// Function tools are sent with `strict: false` (the Responses default is strict, which demands
/// a restricted schema dialect).
pub fn request_body(req: &ProviderRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("input".into(), Value::Array(input(req)));
    body.insert("stream".into(), json!(true));
    body.insert("store".into(), json!(true));
    body.insert("max_output_tokens".into(), json!(req.max_tokens));
    if let Some(system) = &req.system {
        body.insert("instructions".into(), json!(system));
    }
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), temperature_json(t));
    }
    if !req.tools.is_empty() {
        let tools = req.tools.iter().map(|t| {
            let mut f = Map::new();
            f.insert("type".into(), json!("function"));
            f.insert("name".into(), json!(t.name));
            if !t.description.is_empty() {
                f.insert("description".into(), json!(t.description));
            }
            f.insert("parameters".into(), t.input_schema.clone());
            f.insert("strict".into(), json!(false));
            Value::Object(f)
        });
        body.insert("tools".into(), Value::Array(tools.collect()));
    }
    if let Some(choice) = &req.tool_choice {
        let c = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::Any => json!("required"),
            ToolChoice::None => json!("none"),
            ToolChoice::Tool { name } => json!({"type": "function", "name": name}),
        };
        body.insert("tool_choice".into(), c);
    }
    if let Some((name, schema)) = &req.json_schema {
        body.insert(
            "text".into(),
            json!({"format": {"type": "json_schema", "name": name, "schema": schema}}),
        );
    }
    if matrix(Protocol::OpenAiResponses, &req.model).reasoning {
        body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    }
    Value::Object(body)
}

fn input(req: &ProviderRequest) -> Vec<Value> {
    let mut items = Vec::new();
    for m in &req.messages {
        let role = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        for part in &m.content {
            items.push(match part {
                Part::Text { text } => json!({"role": role, "content": text}),
                Part::ToolCall { id, name, input } => json!({
                    "type": "function_call", "call_id": id, "name": name,
                    "arguments": input.to_string(),
                }),
                Part::ToolResult {
                    call_id, content, ..
                } => json!({"type": "function_call_output", "call_id": call_id, "output": content}),
            });
        }
    }
    items
}

/// A text, refusal or reasoning delta event, read into typed fields whose strings borrow from
/// the event, without a JSON tree: its event, if any. `None` for every other event, and for one
/// whose fields are not of their types, that is not an object or that has a key twice:
/// [`Decoder::decode`] then reads it as a tree. Where it answers, it answers as the tree reading
/// does, and such an event changes no decoder state (`h_42_a_plain_delta_decodes_as_its_tree`).
fn plain_delta(ev: &SseEvent) -> Option<Option<ProviderEvent>> {
    if ev.is_overflow() {
        return None;
    }
    let MapOnly(event) = serde_json::from_str::<MapOnly<PlainDelta<'_>>>(&ev.data).ok()?;
    let kind = match (event.kind, ev.event.as_deref()) {
        (Some(kind), _) => kind,
        (None, Some(name)) => DeltaKind::named(name)?,
        (None, None) => return None,
    };
    let text = plain_text(event.delta);
    Some(text.map(|text| match kind {
        DeltaKind::Text => ProviderEvent::TextDelta { text },
        DeltaKind::Refusal => ProviderEvent::RefusalDelta { text },
        DeltaKind::Reasoning => ProviderEvent::ReasoningDelta { text },
    }))
}

/// The event's `type` as the typed reading takes it: any other kind fails the reading where it
/// is met (the event is then read as a tree), so an event of another kind, a whole response
/// among them, costs little.
#[derive(Deserialize)]
enum DeltaKind {
    #[serde(rename = "response.output_text.delta")]
    Text,
    #[serde(rename = "response.refusal.delta")]
    Refusal,
    #[serde(
        rename = "response.reasoning_summary_text.delta",
        alias = "response.reasoning_text.delta"
    )]
    Reasoning,
}

impl DeltaKind {
    /// The kind an event's name gives, when its data has no `type`.
    fn named(name: &str) -> Option<Self> {
        serde_json::from_value(Value::from(name)).ok()
    }
}

#[derive(Deserialize)]
struct PlainDelta<'a> {
    #[serde(rename = "type", default)]
    kind: Option<DeltaKind>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
}

/// Decodes a Responses stream into normalized events.
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

    /// Decodes one SSE event. Nothing is decoded after the terminal event or an error.
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

    /// At end of input: `connection_closed` if no terminal event (and no error) arrived.
    pub fn finish(&mut self) -> Vec<ProviderEvent> {
        self.life.finish()
    }

    fn decode(&mut self, ev: &SseEvent, data: &Value) -> Vec<ProviderEvent> {
        let kind = str_at(data, &["type"])
            .or(ev.event.as_deref())
            .unwrap_or_default();
        let mut out = Vec::new();
        let index = index_u32(data, "output_index");
        let delta = || non_empty(data, &["delta"]);
        match kind {
            "response.created" | "response.in_progress" => self.reference(data, &mut out),
            "response.output_item.added" => self.item_added(index, data, &mut out),
            "response.output_item.done" => self.item_done(index, data, &mut out),
            "response.output_text.delta" => {
                out.extend(delta().map(|text| ProviderEvent::TextDelta { text }))
            }
            "response.refusal.delta" => {
                out.extend(delta().map(|text| ProviderEvent::RefusalDelta { text }))
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                out.extend(delta().map(|text| ProviderEvent::ReasoningDelta { text }));
            }
            "response.function_call_arguments.delta" => {
                if let (Some(index), Some(delta)) = (index, delta()) {
                    out.push(ProviderEvent::ToolCallArgsDelta { index, delta });
                }
            }
            "response.function_call_arguments.done" => self.end_call(index, &mut out),
            "response.completed" | "response.incomplete" => self.terminal(kind, data, &mut out),
            "response.failed" => {
                self.reference(data, &mut out);
                if let Some(u) = at(data, &["response", "usage"]) {
                    out.push(usage_event(u));
                }
                out.push(match at(data, &["response", "error"]) {
                    Some(err) => provider_error(err, "response_failed"),
                    None => error(
                        "response_failed",
                        "the provider reported the response failed",
                    ),
                });
            }
            "error" => {
                let kind = str_at(data, &["code"])
                    .filter(|c| !c.is_empty())
                    .unwrap_or("error");
                let message = str_at(data, &["message"]).unwrap_or("provider reported an error");
                out.push(error(kind, message));
            }
            // Forward-compatible: unknown events are ignored unless they carry an error.
            _ => out.extend(at(data, &["error"]).map(|err| provider_error(err, "error"))),
        }
        out
    }

    fn reference(&mut self, data: &Value, out: &mut Vec<ProviderEvent>) {
        if self.ref_sent {
            return;
        }
        if let Some(id) = non_empty(data, &["response", "id"]) {
            self.ref_sent = true;
            out.push(ProviderEvent::ProviderRef { id });
        }
    }

    fn item_added(&mut self, index: Option<u32>, data: &Value, out: &mut Vec<ProviderEvent>) {
        let (Some(index), Some(item)) = (index, at(data, &["item"])) else {
            return;
        };
        if str_at(item, &["type"]) == Some("function_call") {
            self.start_call(index, item, out);
        }
    }

    fn start_call(&mut self, index: u32, item: &Value, out: &mut Vec<ProviderEvent>) {
        if !self.started.insert(index) {
            return;
        }
        self.open.insert(index);
        let id = non_empty(item, &["call_id"]).or_else(|| non_empty(item, &["id"]));
        out.push(ProviderEvent::ToolCallStart {
            index,
            id: id.unwrap_or_default(),
            name: non_empty(item, &["name"]).unwrap_or_default(),
        });
    }

    fn end_call(&mut self, index: Option<u32>, out: &mut Vec<ProviderEvent>) {
        if let Some(index) = index {
            if self.open.remove(&index) {
                out.push(ProviderEvent::ToolCallEnd { index });
            }
        }
    }

    fn item_done(&mut self, index: Option<u32>, data: &Value, out: &mut Vec<ProviderEvent>) {
        let Some(item) = at(data, &["item"]) else {
            return;
        };
        match str_at(item, &["type"]) {
            Some("message") => {}
            Some("reasoning") => {
                if let Some(data) = non_empty(item, &["encrypted_content"]) {
                    out.push(ProviderEvent::ReasoningOpaque { data });
                }
            }
            Some("function_call") => {
                let Some(index) = index else { return };
                if !self.started.contains(&index) {
                    // The item arrived whole: no `added` event and no argument deltas.
                    self.start_call(index, item, out);
                    if let Some(delta) = non_empty(item, &["arguments"]) {
                        out.push(ProviderEvent::ToolCallArgsDelta { index, delta });
                    }
                }
                self.end_call(Some(index), out);
            }
            _ => out.push(ProviderEvent::ProviderBlock {
                block: item.clone(),
            }),
        }
    }

    fn terminal(&mut self, kind: &str, data: &Value, out: &mut Vec<ProviderEvent>) {
        self.reference(data, out);
        out.extend(
            self.open
                .iter()
                .map(|&index| ProviderEvent::ToolCallEnd { index }),
        );
        self.open.clear();
        if let Some(u) = at(data, &["response", "usage"]) {
            out.push(usage_event(u));
        }
        let reason = non_empty(data, &["response", "incomplete_details", "reason"])
            .or_else(|| non_empty(data, &["response", "status"]))
            .unwrap_or_else(|| kind.trim_start_matches("response.").to_string());
        out.push(ProviderEvent::Stop { reason });
        out.push(ProviderEvent::Done);
    }
}

/// Responses usage in disjoint classes: cached input and reasoning tokens are split out.
/// `input_tokens` and `output_tokens` are required; the details are optional and at most their
/// totals. Only exact usage is terminal (SC-95).
fn usage_event(u: &Value) -> ProviderEvent {
    let (usage, exact) = crate::usage::openai(u, "input", "output");
    ProviderEvent::Usage {
        usage,
        terminal: exact,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::strategies::{object, or_odd, plain_as_tree, scalar, sse_event as event};
    use proptest::prelude::*;

    /// Whether the typed reading of `ev` answers, and, where it does, whether it gives what the
    /// tree reading gives, leaving the decoder as it was.
    fn same_as_tree(ev: &SseEvent) -> bool {
        let mut tree = Decoder::new();
        let before = format!("{tree:?}");
        let answered = plain_as_tree(ev, plain_delta, |ev, data| tree.decode(ev, data));
        assert_eq!(format!("{tree:?}"), before, "{}", ev.data);
        answered
    }

    #[test]
    fn h_42_a_plain_delta_is_read_without_a_tree() {
        for data in [
            r#"{"type":"response.output_text.delta","output_index":0,"delta":"Hel\"lo"}"#,
            r#"{"type":"response.refusal.delta","delta":"no"}"#,
            r#"{"type":"response.reasoning_summary_text.delta","delta":""}"#,
        ] {
            assert!(same_as_tree(&event(None, data)), "{data}");
        }
        assert!(same_as_tree(&event(
            Some("response.output_text.delta"),
            r#"{"delta":"x"}"#
        )));
    }

    #[test]
    fn h_42_other_events_are_read_as_a_tree() {
        for data in [
            r#"{"type":"response.created","response":{"id":"r"}}"#,
            r#"{"type":"response.function_call_arguments.delta","output_index":0,"delta":"{"}"#,
            r#"{"type":"response.output_text.delta","delta":7}"#,
            r#"{"type":"response.output_text.delta","delta":"a","delta":"b"}"#,
            r#"["response.output_text.delta","x"]"#,
        ] {
            assert!(
                !same_as_tree(&event(None, data)),
                "{data} is read as a tree"
            );
        }
    }

    fn delta_event() -> impl Strategy<Value = Value> {
        let kind = || {
            or_odd(
                prop_oneof![
                    Just("response.output_text.delta"),
                    Just("response.refusal.delta"),
                    Just("response.reasoning_text.delta"),
                    Just("response.reasoning_summary_text.delta"),
                    Just("response.function_call_arguments.delta"),
                    Just("response.completed")
                ]
                .prop_map(Value::from),
            )
            .boxed()
        };
        object(vec![
            ("type", 0.8, kind()),
            ("delta", 0.8, or_odd(scalar()).boxed()),
            ("output_index", 0.5, or_odd(scalar()).boxed()),
            ("error", 0.1, or_odd(Just(json!({"message": "m"}))).boxed()),
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn h_42_a_plain_delta_decodes_as_its_tree(
            data in or_odd(delta_event()),
            name in prop::option::of(prop_oneof![Just("response.output_text.delta"), Just("ping")]),
        ) {
            same_as_tree(&event(name, &data.to_string()));
        }

        #[test]
        fn h_42_every_plain_delta_is_read_without_a_tree(
            kind in prop_oneof![
                Just("output_text"),
                Just("refusal"),
                Just("reasoning_text"),
                Just("reasoning_summary_text")
            ],
            text in prop_oneof![Just(""), Just("a"), Just("é\"\\\n\u{1}")],
        ) {
            let data = json!({"type": format!("response.{kind}.delta"), "output_index": 0, "delta": text});
            prop_assert!(same_as_tree(&event(None, &data.to_string())), "{data}");
        }
    }
}
