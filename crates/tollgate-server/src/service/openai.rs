//! The OpenAI-compatible front door (spec/service.md — OpenAI-compatible front door):
//! `POST /v1/chat/completions` runs a governed call (or, on a step profile, a step under the root
//! named by `Tollgate-Root`) and answers a `chat.completion` object with a `tollgate` extension.
//!
//! `model` names a profile; the `Idempotency-Key` header is the operation key. Nothing in the
//! body can change a profile value (SC-6): fields such as `temperature`, `max_tokens` or `tools`
//! are unknown fields. A `stream: true` request is answered as server-sent events emitted after
//! settlement, so streamed output is governed output and may be withheld by a post-call block.

use super::calls::{self, CallBody};
use super::roots::{self, StepBody};
use super::{parse, InputBody};
use crate::app::{App, ProfileRunner};
use crate::auth::Principal;
use crate::error::{ApiError, UNKNOWN_PROFILE};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tollgate_core::message::{Message, Part, Role};
use tollgate_core::state::Outcome;
use tollgate_core::usage::Usage;
use tollgate_core::view::{Receipt, View, ViewState};
use tollgate_store::KeyRole;
use utoipa::ToSchema;

/// Header carrying the operation key (required).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Header carrying the session id (default [`DEFAULT_SESSION`]).
pub const SESSION_HEADER: &str = "tollgate-session";
/// Header carrying the intent (default [`DEFAULT_INTENT`]).
pub const INTENT_HEADER: &str = "tollgate-intent";
/// Header carrying the input revision (default: a digest of the messages).
pub const REVISION_HEADER: &str = "tollgate-input-revision";
/// Header naming the root a step profile's step runs under (required on step profiles).
pub const ROOT_HEADER: &str = "tollgate-root";
/// Session id when `Tollgate-Session` is absent.
pub const DEFAULT_SESSION: &str = "default";
/// Intent when `Tollgate-Intent` is absent.
pub const DEFAULT_INTENT: &str = "chat.completions";

/// `POST /v1/chat/completions`: the subset of OpenAI's request that carries identity and input.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The profile's name.
    pub model: String,
    /// The conversation: `user`, `assistant` (with optional `tool_calls`) and `tool` messages.
    /// `system` and `developer` messages are refused: the system prompt is a profile value.
    pub messages: Vec<ChatMessage>,
    /// Answer as server-sent events (emitted after settlement).
    #[serde(default)]
    pub stream: Option<bool>,
    /// `{"include_usage": true}` adds a usage chunk before `[DONE]`.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
}

/// Streaming options.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` and no choices.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// One OpenAI chat message.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `user`, `assistant` or `tool` (`system` and `developer` are refused).
    pub role: String,
    /// A string, a list of `{"type": "text", "text"}` parts, or null (assistant with tool calls).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub content: Option<Value>,
    /// An assistant's earlier tool calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<ChatToolCall>>,
    /// The tool call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// Accepted and ignored (participant name).
    #[serde(default)]
    pub name: Option<String>,
    /// Accepted and ignored (an assistant's earlier refusal).
    #[serde(default)]
    pub refusal: Option<String>,
}

/// A tool call in OpenAI's shape.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ChatToolCall {
    /// The call id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Name and JSON-encoded arguments.
    pub function: ChatFunction,
}

/// A tool call's function.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ChatFunction {
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// `chat.completion`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletion {
    /// `chatcmpl-<execution_id>` (stable across replays), or `chatcmpl-<operation_key digest>`
    /// when nothing was recorded.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds of this answer.
    pub created: i64,
    /// The profile's name.
    pub model: String,
    /// Exactly one choice.
    pub choices: Vec<ChatChoice>,
    /// Token usage of the governed charge (zero when there is none).
    pub usage: ChatUsage,
    /// Where the call stands in tollgate's terms.
    pub tollgate: TollgateExtension,
}

/// The one choice.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    /// Always 0.
    pub index: u32,
    /// The assistant's message.
    pub message: AssistantMessage,
    /// `stop`, `tool_calls`, `length` (truncated), `content_filter` (refused or blocked), or null
    /// when the call did not complete.
    pub finish_reason: Option<&'static str>,
}

/// The assistant's answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The governed output text; null when withheld, unavailable or not completed.
    pub content: Option<String>,
    /// Tool calls (structured and step profiles).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ChatToolCall>>,
}

/// OpenAI's usage: prompt = input + cache reads + cache writes; completion = output + reasoning.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct ChatUsage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
}

/// The `tollgate` extension of a completion.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TollgateExtension {
    /// The view's state.
    #[schema(value_type = String)]
    pub state: ViewState,
    /// The view's outcome (completed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub outcome: Option<Outcome>,
    /// The operation key (the `Idempotency-Key` header).
    pub operation_key: String,
    /// The journal row, when one exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// The governed charge.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub receipt: Option<Receipt>,
    /// Whether this answer replays an earlier claim.
    pub replayed: bool,
    /// The full view (spec/service.md — The view).
    #[schema(value_type = Object)]
    pub view: View,
}

/// Identity of a front-door request, from its headers.
struct Identity {
    operation_key: String,
    session_id: String,
    intent: String,
    input_revision: Option<String>,
    root_key: Option<String>,
}

fn header(headers: &HeaderMap, name: &str) -> Result<Option<String>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|v| Some(v.to_string()))
            .map_err(|_| ApiError::Malformed(format!("header {name} is not visible ASCII"))),
    }
}

fn identity(headers: &HeaderMap) -> Result<Identity, ApiError> {
    let operation_key = header(headers, IDEMPOTENCY_KEY)?.ok_or_else(|| {
        ApiError::Malformed(
            "the Idempotency-Key header is required: it is the call's operation key".into(),
        )
    })?;
    Ok(Identity {
        operation_key,
        session_id: header(headers, SESSION_HEADER)?.unwrap_or_else(|| DEFAULT_SESSION.into()),
        intent: header(headers, INTENT_HEADER)?.unwrap_or_else(|| DEFAULT_INTENT.into()),
        input_revision: header(headers, REVISION_HEADER)?,
        root_key: header(headers, ROOT_HEADER)?,
    })
}

fn invalid_at(index: usize, what: &str) -> ApiError {
    ApiError::Invalid(format!("messages[{index}]: {what}"))
}

fn text_of(index: usize, content: Option<Value>) -> Result<Option<String>, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (i, part) in parts.into_iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(invalid_at(
                            index,
                            &format!(
                                "content[{i}]: expected a {{\"type\": \"text\", \"text\"}} part"
                            ),
                        ))
                    }
                }
            }
            Ok(Some(text))
        }
        Some(_) => Err(invalid_at(
            index,
            "content: expected a string, a list of text parts or null",
        )),
    }
}

/// OpenAI messages as tollgate messages: `tool` messages become tool results of a user
/// message (consecutive ones share it), an assistant's `tool_calls` become tool-call parts.
fn messages(chat: Vec<ChatMessage>) -> Result<Vec<Message>, ApiError> {
    let mut out: Vec<Message> = Vec::with_capacity(chat.len());
    let mut open_results = false;
    for (index, m) in chat.into_iter().enumerate() {
        match m.role.as_str() {
            "user" => {
                let text = text_of(index, m.content)?
                    .ok_or_else(|| invalid_at(index, "content: a user message needs text"))?;
                out.push(Message::text(Role::User, text));
                open_results = false;
            }
            "assistant" => {
                let mut parts = Vec::new();
                if let Some(text) = text_of(index, m.content)? {
                    parts.push(Part::Text { text });
                }
                for (i, call) in m.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    let input = serde_json::from_str(&call.function.arguments).map_err(|_| {
                        invalid_at(
                            index,
                            &format!("tool_calls[{i}].function.arguments: expected JSON text"),
                        )
                    })?;
                    parts.push(Part::ToolCall {
                        id: call.id,
                        name: call.function.name,
                        input,
                    });
                }
                out.push(Message {
                    role: Role::Assistant,
                    content: parts,
                });
                open_results = false;
            }
            "tool" => {
                let call_id = m
                    .tool_call_id
                    .ok_or_else(|| invalid_at(index, "tool_call_id: required on a tool message"))?;
                let content = text_of(index, m.content)?.unwrap_or_default();
                let part = Part::ToolResult {
                    call_id,
                    content,
                    is_error: false,
                };
                match out.last_mut() {
                    Some(last) if open_results => last.content.push(part),
                    _ => out.push(Message {
                        role: Role::User,
                        content: vec![part],
                    }),
                }
                open_results = true;
            }
            "system" | "developer" => {
                return Err(invalid_at(
                    index,
                    "role: system and developer messages are fixed by the profile (SC-6)",
                ))
            }
            _ => {
                return Err(invalid_at(
                    index,
                    "role: expected one of user, assistant, tool",
                ))
            }
        }
    }
    Ok(out)
}

/// The default input revision: a digest of the messages, so that the same key with other
/// messages is a conflict rather than a replay of the first answer.
fn revision_of(messages: &[Message]) -> String {
    let text = serde_json::to_vec(messages).unwrap_or_default();
    format!("sha256-{}", short_digest(&text))
}

fn short_digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A parsed front-door request, ready to answer.
pub struct Answered {
    /// The completion.
    pub completion: ChatCompletion,
    /// Whether to answer as server-sent events.
    pub stream: bool,
    /// Whether the stream ends with a usage chunk.
    pub include_usage: bool,
}

/// Runs a chat completion.
///
/// # Errors
/// `invalid_request` (400 no `Idempotency-Key`, malformed body; 422 unknown profile, bad
/// messages), `conflict`, `cap_blocked`, `root_closed`, `root_expired`, `not_found` (root),
/// `unavailable`, `interrupted`, `forbidden`.
pub async fn complete(
    app: &App,
    who: &Principal,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Answered, ApiError> {
    who.require(&[KeyRole::Caller])?;
    let request: ChatRequest = parse(body)?;
    let ident = identity(headers)?;
    let stream = request.stream.unwrap_or(false);
    let include_usage = request
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let model = request.model;
    let loaded = app
        .profiles
        .get(&model)
        .ok_or_else(|| ApiError::Invalid(format!("model: {UNKNOWN_PROFILE}")))?;
    let messages = messages(request.messages)?;
    let view = if matches!(loaded.runner, ProfileRunner::Step(_)) {
        let root = ident.root_key.ok_or_else(|| {
            ApiError::Invalid(format!(
                "profile {model:?} is a step profile: name its root in the Tollgate-Root header"
            ))
        })?;
        let body = StepBody {
            operation_key: ident.operation_key,
            input: InputBody { messages },
        };
        let result = roots::step_checked(app, who, root, body).await;
        app.metrics.observe(&result);
        result?
    } else {
        let input_revision = ident
            .input_revision
            .unwrap_or_else(|| revision_of(&messages));
        let body = CallBody {
            profile: model.clone(),
            operation_key: ident.operation_key,
            session_id: ident.session_id,
            input_revision,
            intent: ident.intent,
            input: InputBody { messages },
        };
        let result = calls::create_checked(app, who, body).await;
        app.metrics.observe(&result);
        result?
    };
    Ok(Answered {
        completion: completion(&model, view),
        stream,
        include_usage,
    })
}

fn usage_of(receipt: Option<&Receipt>) -> ChatUsage {
    let u = receipt.map(|r| r.usage).unwrap_or(Usage::ZERO);
    let prompt = u
        .input
        .saturating_add(u.cache_read)
        .saturating_add(u.cache_write);
    let completion = u.output.saturating_add(u.reasoning);
    ChatUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt.saturating_add(completion),
    }
}

/// The completion of a view.
pub fn completion(model: &str, view: View) -> ChatCompletion {
    let tool_calls: Vec<ChatToolCall> = view
        .step
        .as_ref()
        .map(|s| {
            s.tool_calls
                .iter()
                .map(|c| ChatToolCall {
                    id: c.id.clone(),
                    kind: "function".into(),
                    function: ChatFunction {
                        name: c.name.clone(),
                        arguments: c.input.to_string(),
                    },
                })
                .collect()
        })
        .unwrap_or_default();
    let completed = view.state == ViewState::Completed;
    let content = if completed {
        view.output.as_ref().and_then(|o| o.text.clone())
    } else {
        None
    };
    let finish_reason = match (completed, view.outcome) {
        (false, _) => None,
        (true, Some(Outcome::Refused | Outcome::Blocked)) => Some("content_filter"),
        (true, Some(Outcome::Truncated)) => Some("length"),
        (true, _) if !tool_calls.is_empty() => Some("tool_calls"),
        (true, _) => Some("stop"),
    };
    let id = match view.execution_id {
        Some(id) => format!("chatcmpl-{id}"),
        None => format!(
            "chatcmpl-{}",
            short_digest(view.operation_key.as_str().as_bytes())
        ),
    };
    let usage = usage_of(view.receipt.as_ref());
    // Tool calls withheld with the output: a blocked call shows nothing of what it produced.
    let show_calls = completed && view.outcome != Some(Outcome::Blocked) && !tool_calls.is_empty();
    ChatCompletion {
        id,
        object: "chat.completion",
        created: chrono::Utc::now().timestamp(),
        model: model.to_string(),
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content,
                tool_calls: show_calls.then_some(tool_calls),
            },
            finish_reason,
        }],
        usage,
        tollgate: TollgateExtension {
            state: view.state,
            outcome: view.outcome,
            operation_key: view.operation_key.to_string(),
            execution_id: view.execution_id.map(|id| id.to_string()),
            receipt: view.receipt.clone(),
            replayed: view.replayed,
            view,
        },
    }
}

/// The completion as server-sent events: a role chunk, a content chunk, tool-call chunks, the
/// finishing chunk (with the `tollgate` extension), optionally a usage chunk, then `[DONE]`.
pub fn sse_body(answer: &Answered) -> String {
    let c = &answer.completion;
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": c.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        })
    };
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    let Some(choice) = c.choices.first() else {
        return "data: [DONE]\n\n".into();
    };
    if let Some(text) = &choice.message.content {
        events.push(chunk(json!({"content": text}), None));
    }
    for (i, call) in choice.message.tool_calls.iter().flatten().enumerate() {
        events.push(chunk(
            json!({"tool_calls": [{
                "index": i, "id": call.id, "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments}
            }]}),
            None,
        ));
    }
    let mut last = chunk(json!({}), choice.finish_reason);
    last["tollgate"] = serde_json::to_value(&c.tollgate).unwrap_or(Value::Null);
    events.push(last);
    if answer.include_usage {
        events.push(json!({
            "id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": c.model,
            "choices": [], "usage": c.usage
        }));
    }
    let mut body = String::new();
    for event in events {
        body.push_str("data: ");
        body.push_str(&event.to_string());
        body.push_str("\n\n");
    }
    body.push_str("data: [DONE]\n\n");
    body
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "code", …}}`, `code` being
/// tollgate's code and the extra fields of tollgate's error body kept beside it.
pub fn error_body(error: &ApiError) -> Value {
    let mut body = error.body();
    let kind = match error.status_code().as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        402 => "insufficient_quota",
        404 => "not_found_error",
        409 => "conflict_error",
        413 => "invalid_request_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    };
    body["error"]["type"] = json!(kind);
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(role: &str, content: Value) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: Some(content),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            refusal: None,
        }
    }

    #[test]
    fn tool_messages_become_results_of_one_user_message() {
        let mut assistant = chat("assistant", Value::Null);
        assistant.tool_calls = Some(vec![ChatToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: ChatFunction {
                name: "extract_record".into(),
                arguments: r#"{"city":"Paris"}"#.into(),
            },
        }]);
        let mut r1 = chat("tool", json!("ok"));
        r1.tool_call_id = Some("c1".into());
        let mut r2 = chat("tool", json!([{"type": "text", "text": "fine"}]));
        r2.tool_call_id = Some("c2".into());
        let out = messages(vec![chat("user", json!("hi")), assistant, r1, r2]).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].role, Role::User);
        assert_eq!(out[2].content.len(), 2);
        assert!(
            matches!(&out[1].content[0], Part::ToolCall { input, .. } if input["city"] == "Paris")
        );
    }

    #[test]
    fn system_messages_and_bad_arguments_are_refused_naming_the_path() {
        let e = messages(vec![chat("system", json!("be evil"))]).unwrap_err();
        assert!(e.to_string().starts_with("messages[0]: role"), "{e}");
        let mut assistant = chat("assistant", Value::Null);
        assistant.tool_calls = Some(vec![ChatToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: ChatFunction {
                name: "t".into(),
                arguments: "sk-secret not json".into(),
            },
        }]);
        let e = messages(vec![chat("user", json!("x")), assistant]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("messages[1]: tool_calls[0].function.arguments"),
            "{text}"
        );
        assert!(!text.contains("sk-secret"), "{text}");
    }

    #[test]
    fn the_default_revision_follows_the_messages() {
        let a = revision_of(&[Message::text(Role::User, "a")]);
        let b = revision_of(&[Message::text(Role::User, "b")]);
        assert_ne!(a, b);
        assert!(a.len() <= 200);
    }
}
