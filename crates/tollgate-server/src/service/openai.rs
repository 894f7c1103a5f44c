//! The OpenAI-compatible front door (spec/service.md — OpenAI-compatible front door):
//! `POST /v1/chat/completions` runs a governed call (or, on a step profile, a step under the root
//! named by `Tollgate-Root`) and answers a `chat.completion` object with a `tollgate` extension.
//!
//! `model` names a profile; the `Idempotency-Key` header is the operation key. The profile
//! governs and a request may narrow it, never widen it (SC-211): `max_tokens` up to the
//! profile's, sampling where the profile permits, `user` and `metadata` recorded; `tools`,
//! `tool_choice` and `response_format` only as the profile has them; any other field is refused
//! by name. Only a completed call is a `chat.completion`: a call still being processed, not
//! dispatched or awaiting an operator is an error a client's retry rules understand (SC-209).
//! A `stream: true` request on a text profile streams live (`live_response`, SC-213): its text
//! as the provider sends it, its finishing chunk after the settlement; every other stream is
//! emitted after settlement, so that its output is governed output a post-call block may
//! withhold.

use super::door::{self, short_digest};
use super::parse;
use crate::app::{App, ProfileRunner};
use crate::auth::Principal;
use crate::error::{ApiError, UNKNOWN_PROFILE};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tollgate_core::config::CallConfig;
use tollgate_core::message::{Message, Part, Role};
use tollgate_core::message::{Temperature, ToolChoice, TopP};
use tollgate_core::narrow::Narrowing;
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

/// `POST /v1/chat/completions`: the subset of OpenAI's request that carries identity, input and
/// what a request may narrow within its profile (SC-211). Any other field is refused by name.
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
    /// The output token cap, 1 up to the profile's `max_tokens`; a lower one lowers the hold.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The same as `max_tokens` (equal to it when both are sent).
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// Sampling temperature (at most two fraction digits), where the profile sets none and
    /// permits it; equal to the profile's otherwise.
    #[serde(default)]
    #[schema(value_type = Option<f64>)]
    pub temperature: Option<serde_json::Number>,
    /// Nucleus sampling, 0 to 1 (at most four fraction digits), as `temperature`.
    #[serde(default)]
    #[schema(value_type = Option<f64>)]
    pub top_p: Option<serde_json::Number>,
    /// Stop sequences: a string or up to four strings, as `temperature`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub stop: Option<Value>,
    /// Sampling seed, as `temperature`.
    #[serde(default)]
    pub seed: Option<i64>,
    /// The end user: recorded with the call; sent to the provider when the profile says.
    #[serde(default)]
    pub user: Option<String>,
    /// Up to 16 string pairs: recorded with the call; sent when the profile says.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Accepted when equal to the profile's tools (the profile fixes them).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub tools: Option<Value>,
    /// Accepted when equal to the profile's tool choice.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub tool_choice: Option<Value>,
    /// Accepted when equal to the profile's output: `{"type": "text"}` on a profile without an
    /// output schema, `{"type": "json_schema", "json_schema": {"schema": …}}` with the schema
    /// of a json profile.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub response_format: Option<Value>,
}

fn fixed(field: &str) -> ApiError {
    ApiError::Malformed(format!(
        "{field}: the profile fixes it; send the profile's value or leave it out \
         (GET /v1/profiles lists the profile)"
    ))
}

/// The request's `tools` against the profile's, in OpenAI's shape: the same functions (name,
/// description, parameters), in any order.
fn check_tools(config: &CallConfig, tools: Option<&Value>) -> Result<(), ApiError> {
    let Some(tools) = tools else {
        return Ok(());
    };
    let Some(list) = tools.as_array() else {
        return Err(ApiError::Malformed("tools: expected a list".into()));
    };
    if list.len() != config.tools.len() {
        return Err(fixed("tools"));
    }
    let same = |tool: &Value| {
        let f = &tool["function"];
        let strict = f
            .get("strict")
            .is_none_or(|s| s == &json!(false) || s.is_null());
        tool["type"] == "function"
            && strict
            && config.tools.iter().any(|t| {
                f["name"] == json!(t.name)
                    && f.get("description").and_then(Value::as_str).unwrap_or("") == t.description
                    && f.get("parameters").unwrap_or(&json!({})) == &t.input_schema
            })
    };
    if list.iter().all(same) {
        Ok(())
    } else {
        Err(fixed("tools"))
    }
}

/// The request's `tool_choice` against the profile's: `auto`, `required` (the profile's `any`),
/// `none` or a named function; with no choice in the profile, `auto` when it has tools and
/// `none` when it has none (what the provider does then).
fn check_tool_choice(config: &CallConfig, choice: Option<&Value>) -> Result<(), ApiError> {
    let Some(choice) = choice else {
        return Ok(());
    };
    let wanted = match &config.tool_choice {
        Some(ToolChoice::Auto) => json!("auto"),
        Some(ToolChoice::Any) => json!("required"),
        Some(ToolChoice::None) => json!("none"),
        Some(ToolChoice::Tool { name }) => {
            json!({"type": "function", "function": {"name": name}})
        }
        None if config.tools.is_empty() => json!("none"),
        None => json!("auto"),
    };
    if choice == &wanted {
        Ok(())
    } else {
        Err(fixed("tool_choice"))
    }
}

/// The request's `response_format` against the profile's output.
fn check_response_format(config: &CallConfig, format: Option<&Value>) -> Result<(), ApiError> {
    let Some(format) = format else {
        return Ok(());
    };
    let equal = match (&config.output, format["type"].as_str()) {
        (None, Some("text")) => true,
        (Some(contract), Some("json_schema")) => format["json_schema"]["schema"] == contract.schema,
        _ => false,
    };
    if equal {
        Ok(())
    } else {
        Err(fixed("response_format"))
    }
}

/// What the request sets within its profile (SC-211), read from the body.
fn narrowing_of(request: &ChatRequest) -> Result<Narrowing, ApiError> {
    let bad = |field: &str, why: String| ApiError::Malformed(format!("{field}: {why}"));
    let max_tokens = match (request.max_tokens, request.max_completion_tokens) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::Malformed(
                "max_tokens, max_completion_tokens: send one, or both equal".into(),
            ))
        }
        (a, b) => a.or(b),
    };
    let temperature = request
        .temperature
        .as_ref()
        .map(|n| Temperature::parse(&n.to_string()).map_err(|e| bad("temperature", e)))
        .transpose()?;
    let top_p = request
        .top_p
        .as_ref()
        .map(|n| TopP::parse(&n.to_string()).map_err(|e| bad("top_p", e)))
        .transpose()?;
    let stop = match &request.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(one)) => vec![one.clone()],
        Some(Value::Array(many)) => many
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("stop", "expected a string or a list of strings".into()))?,
        Some(_) => return Err(bad("stop", "expected a string or a list of strings".into())),
    };
    Ok(Narrowing {
        max_tokens,
        temperature,
        top_p,
        stop,
        seed: request.seed,
        user: request.user.clone(),
        metadata: request.metadata.clone().unwrap_or_default(),
    })
}

/// The profile's snapshot narrowed by the request (SC-211): the fixed fields checked, then the
/// request's values applied.
///
/// # Errors
/// `invalid_request` (400) naming the first field that would widen the profile.
fn narrowed(config: &CallConfig, request: &ChatRequest) -> Result<CallConfig, ApiError> {
    check_tools(config, request.tools.as_ref())?;
    check_tool_choice(config, request.tool_choice.as_ref())?;
    check_response_format(config, request.response_format.as_ref())?;
    config
        .narrowed(&narrowing_of(request)?)
        .map_err(|e| ApiError::Malformed(e.to_string()))
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
/// `invalid_request` (400 no `Idempotency-Key`, malformed body, a field that would widen the
/// profile; 422 unknown profile, bad messages), `conflict` (422), `in_progress` (409),
/// `not_dispatched` (422), `reconciliation_required` (502), `cap_blocked`, `root_closed`,
/// `root_expired`, `not_found` (root), `unavailable`, `interrupted`, `forbidden`.
pub async fn complete(
    app: &App,
    who: &Principal,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Answered, ApiError> {
    complete_with(app, who, headers, body, None).await
}

/// [`complete`], handing a streamed text call's deltas to `live` as the provider sends them
/// (Live streaming, SC-213); `live` ends with nothing for every other request.
///
/// # Errors
/// As [`complete`].
pub async fn complete_with(
    app: &App,
    who: &Principal,
    headers: &HeaderMap,
    body: &[u8],
    live: Option<tollgate_runner::live::LiveSink>,
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
    let loaded = app
        .profiles
        .get(&request.model)
        .ok_or_else(|| ApiError::Invalid(format!("model: {UNKNOWN_PROFILE}")))?;
    let config = narrowed(&loaded.profile.config, &request)?;
    let model = request.model;
    let messages = messages(request.messages)?;
    let step = matches!(loaded.runner, ProfileRunner::Step(_));
    if step && config != loaded.profile.config {
        return Err(ApiError::Malformed(
            "max_tokens, sampling, user and metadata: a step runs under its root's \
             snapshot, which the profile fixes; leave them out or send the profile's values"
                .into(),
        ));
    }
    let call = door::DoorCall {
        model: model.clone(),
        operation_key: ident.operation_key,
        session_id: ident.session_id,
        intent: ident.intent,
        input_revision: ident.input_revision,
        root_key: ident.root_key,
        messages,
        config,
        step,
    };
    let live = live.filter(|_| stream);
    let view = door::run(app, who, call, live, tracing::Span::current()).await?;
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

/// A streamed chat completion (Live streaming, SC-213). The call runs in a task of its own; the
/// first thing it reports decides the answer. A call sent live opens the stream at once
/// (`tollgate-stream: live`): each text delta goes out as the provider sends it, and the
/// finishing chunk, with the receipt, once the settlement committed. Anything else — a replay,
/// a refusal, an error before the send, a call that is not text — is answered as without live
/// streaming (`tollgate-stream: governed`). A caller that hangs up drops only its stream: the
/// call completes and settles.
pub async fn live_response(
    app: App,
    who: Principal,
    headers: HeaderMap,
    body: axum::body::Bytes,
    model: String,
) -> axum::response::Response {
    use tollgate_runner::live::Live;
    let (sink, mut events) = tollgate_runner::live::channel();
    let task =
        tokio::spawn(async move { complete_with(&app, &who, &headers, &body, Some(sink)).await });
    let Some(Live::Sent(sent)) = events.recv().await else {
        // Not sent live: the answer as ever.
        return match task.await.unwrap_or(Err(ApiError::Internal)) {
            Ok(answer) => door::event_stream("governed", sse_body(&answer).into()),
            Err(e) => error_response(&e),
        };
    };
    let id = format!("chatcmpl-{sent}");
    let created = chrono::Utc::now().timestamp();
    let opening = live_chunk(
        &id,
        &model,
        created,
        json!({"role": "assistant", "content": ""}),
    );
    let text = move |delta: String| live_chunk(&id, &model, created, json!({"content": delta}));
    let end = |answered: Result<Answered, ApiError>| match answered {
        Ok(answer) => live_end(&answer),
        Err(e) => format!("{}data: [DONE]\n\n", live_error(&e)),
    };
    door::event_stream("live", door::live_body(opening, events, task, text, end))
}

/// The opening chunk of a live stream (its role) and one text delta, as server-sent events.
pub fn live_chunk(id: &str, model: &str, created: i64, delta: Value) -> String {
    let chunk = json!({
        "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": null}]
    });
    format!("data: {chunk}\n\n")
}

/// The end of a live stream, after the settlement: the finishing chunk with `finish_reason` and
/// the `tollgate` extension, the usage chunk when asked for, `[DONE]`. The text went out live.
pub fn live_end(answer: &Answered) -> String {
    let mut end = sse_body(answer);
    // The governed body's opening and content chunks are what went out live: keep from the
    // finishing chunk on.
    let c = &answer.completion;
    let keep = c.choices.first().map_or(0, |choice| {
        usize::from(choice.message.content.is_some()) + 1
    });
    let events: Vec<&str> = end.split_inclusive("\n\n").skip(keep).collect();
    end = events.concat();
    end
}

/// An error after a live stream began, as OpenAI streams one: a last `data` event holding the
/// error body (the SDKs raise it), then the end of the stream.
pub fn live_error(error: &ApiError) -> String {
    format!("data: {}\n\n", error_body(error))
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
    if let ApiError::RateLimited(r) = error {
        // OpenAI's type of a rate-limit answer: which budget ran out.
        let budget = match r.kind {
            tollgate_core::limits::LimitKind::InputTokens
            | tollgate_core::limits::LimitKind::OutputTokens => "tokens",
            _ => "requests",
        };
        body["error"]["type"] = json!(budget);
        return body;
    }
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

/// The answer of an error in OpenAI's shape, with its retry headers (SC-209, SC-210).
pub fn error_response(error: &ApiError) -> axum::response::Response {
    error.response_with(error_body(error))
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

    fn step_config() -> CallConfig {
        let mut c = tollgate_core::config::fixtures::text_config();
        c.kind = tollgate_core::state::CallKind::Step;
        c.tools = vec![tollgate_core::message::ToolSpec {
            name: "lookup".into(),
            description: "Finds it.".into(),
            input_schema: json!({"type": "object"}),
        }];
        c
    }

    #[test]
    fn sc_211_tools_and_tool_choice_are_accepted_only_as_the_profile_has_them() {
        let c = step_config();
        let same = json!([{"type": "function", "function": {
            "name": "lookup", "description": "Finds it.", "parameters": {"type": "object"}}}]);
        assert!(check_tools(&c, Some(&same)).is_ok());
        let mut other = same.clone();
        other[0]["function"]["parameters"] = json!({"type": "object", "required": ["q"]});
        let e = check_tools(&c, Some(&other)).unwrap_err().to_string();
        assert!(e.starts_with("tools: the profile fixes it"), "{e}");
        assert!(check_tools(&c, Some(&json!([]))).is_err());
        assert!(check_tool_choice(&c, Some(&json!("auto"))).is_ok());
        assert!(check_tool_choice(&c, Some(&json!("required"))).is_err());
        let text = tollgate_core::config::fixtures::text_config();
        assert!(check_tools(&text, Some(&json!([]))).is_ok());
        assert!(check_tool_choice(&text, Some(&json!("none"))).is_ok());
        assert!(check_response_format(&text, Some(&json!({"type": "text"}))).is_ok());
        assert!(check_response_format(&text, Some(&json!({"type": "json_object"}))).is_err());
    }
}
