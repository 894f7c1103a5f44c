//! The Anthropic Messages door (spec/anthropic.md — Anthropic Messages door, SC-212):
//! `POST /v1/messages` runs a governed call (or, on a step profile, a step under the root named by
//! `Tollgate-Root`) in Anthropic's Messages API wire format and answers a `message` object with a
//! `tollgate` extension; `POST /v1/messages/count_tokens` answers the input-token bound the call's
//! hold is fitted from, without sending or writing anything.
//!
//! The door is only a wire format: the call goes through the same service functions as
//! `/v1/calls`, `/v1/roots/{root_key}/steps` and the OpenAI-compatible front door
//! ([`calls::create_narrowed`], [`roots::step_checked`], [`calls::completed_answer`]), so its
//! claim, hold, once-only send and settlement are theirs. `model` names a profile; the
//! `Idempotency-Key` header is the operation key. The profile governs and a request may narrow
//! it, never widen it (SC-211): `max_tokens` is required and at most the profile's (a lower one
//! lowers the hold), `temperature`, `top_p` and `stop_sequences` pass where the profile permits,
//! `metadata.user_id` is the end user (recorded with the call); `system` is refused (the system
//! prompt is a profile value, SC-6); `tools` and `tool_choice` are accepted only as the profile
//! has them; any other field is refused by name. Only a completed call is a `message`: one still
//! being processed, not dispatched or awaiting an operator is an error (SC-209). Errors are in
//! Anthropic's shape, `{"type": "error", "error": {"type", "message", …}}`, mapped from each
//! [`ApiError`]'s status, code and headers ([`error_response`]).
//!
//! The HTTP handlers live here, beside the wire types they answer with; [`crate::routes`] names
//! them and [`AnthropicApi`] documents them.

use super::door::{self, short_digest};
use super::parse;
use crate::app::{App, ProfileRunner};
use crate::auth::Principal;
use crate::error::{ApiError, UNKNOWN_PROFILE};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Number, Value};
use std::collections::{BTreeMap, BTreeSet};
use tollgate_core::config::CallConfig;
use tollgate_core::hold::{fitted_hold, request_input_tokens_bound};
use tollgate_core::message::{Message, Part, Role, Temperature, ToolChoice, TopP};
use tollgate_core::narrow::{NarrowError, Narrowing};
use tollgate_core::state::Outcome;
use tollgate_core::step::Block;
use tollgate_core::usage::Usage;
use tollgate_core::view::{Receipt, View, ViewState};
use tollgate_runner::input::check_input;
use tollgate_store::KeyRole;
use utoipa::ToSchema;

/// The paths of this door: their errors are in Anthropic's shape, and their key may come in the
/// `x-api-key` header as well as in `Authorization: Bearer` (`crate::gate`).
pub const PATHS: &[&str] = &["/v1/messages", "/v1/messages/count_tokens"];

/// Header carrying the operation key (required on `POST /v1/messages`).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Header carrying the session id (default [`DEFAULT_SESSION`]).
pub const SESSION_HEADER: &str = "tollgate-session";
/// Header carrying the intent (default [`DEFAULT_INTENT`]).
pub const INTENT_HEADER: &str = "tollgate-intent";
/// Header carrying the input revision (default: a digest of the messages).
pub const REVISION_HEADER: &str = "tollgate-input-revision";
/// Header naming the root a step profile's step runs under (required on step profiles).
pub const ROOT_HEADER: &str = "tollgate-root";
/// Anthropic's API version header: accepted whatever its value, recorded in the request's span,
/// and changes nothing.
pub const VERSION_HEADER: &str = "anthropic-version";
/// Anthropic's beta-features header: accepted, recorded in the request's span, and changes
/// nothing (the body's fields are checked the same either way).
pub const BETA_HEADER: &str = "anthropic-beta";
/// Session id when `Tollgate-Session` is absent.
pub const DEFAULT_SESSION: &str = "default";
/// Intent when `Tollgate-Intent` is absent.
pub const DEFAULT_INTENT: &str = "messages";
/// Header the official SDKs obey over their own retry rules.
const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
/// Anthropic's request-id header, echoing tollgate's `x-request-id`.
const ANTHROPIC_REQUEST_ID: HeaderName = HeaderName::from_static("request-id");

// ---- requests ---------------------------------------------------------------------------------

/// `POST /v1/messages`: Anthropic's request, limited to what a governed call can honour.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    /// The profile's name.
    pub model: String,
    /// The conversation: `user` and `assistant` turns, each a string or a list of `text`,
    /// `tool_use` (assistant) and `tool_result` (user) blocks.
    pub messages: Vec<InputMessage>,
    /// Required, as on Anthropic's API: 1 up to the profile's `max_tokens`; the provider is sent
    /// it and the hold is fitted to it (a step runs under its root's snapshot, which sends the
    /// profile's).
    pub max_tokens: u64,
    /// Refused: the system prompt is a profile value (SC-6).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    /// Accepted when equal to the profile's tools (name, description, input schema).
    #[serde(default)]
    pub tools: Option<Vec<ToolParam>>,
    /// Accepted when equal to the profile's tool choice.
    #[serde(default)]
    pub tool_choice: Option<ToolChoiceParam>,
    /// Up to four stop sequences, where the profile sets none and permits it; equal to the
    /// profile's otherwise.
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    /// `user_id`: the end user, recorded with the call; sent to the provider when the profile
    /// says.
    #[serde(default)]
    pub metadata: Option<MetadataParam>,
    /// Answer as server-sent events (emitted after settlement).
    #[serde(default)]
    pub stream: Option<bool>,
    /// Sampling temperature (at most two fraction digits), where the profile sets none and
    /// permits it; equal to the profile's otherwise.
    #[serde(default)]
    #[schema(value_type = Option<f64>)]
    pub temperature: Option<Number>,
    /// Nucleus sampling, 0 to 1 (at most four fraction digits), as `temperature`.
    #[serde(default)]
    #[schema(value_type = Option<f64>)]
    pub top_p: Option<Number>,
    /// Refused: no profile sets `top_k`, so a request cannot narrow it.
    #[serde(default)]
    pub top_k: Option<u64>,
}

/// `POST /v1/messages/count_tokens`: the request's input part.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CountTokensRequest {
    /// The profile's name.
    pub model: String,
    /// The conversation, as on `POST /v1/messages`.
    pub messages: Vec<InputMessage>,
    /// Refused: the system prompt is a profile value (SC-6).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    /// Accepted when equal to the profile's tools.
    #[serde(default)]
    pub tools: Option<Vec<ToolParam>>,
    /// Accepted when equal to the profile's tool choice.
    #[serde(default)]
    pub tool_choice: Option<ToolChoiceParam>,
}

/// One input message.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string, or a list of `{"type": "text", "text"}`, `{"type": "tool_use", "id", "name",
    /// "input"}` (assistant) and `{"type": "tool_result", "tool_use_id", "content", "is_error"?}`
    /// (user) blocks.
    #[schema(value_type = Object)]
    pub content: Value,
}

/// A tool definition (a custom tool: name, description, input schema).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolParam {
    /// The tool's name.
    pub name: String,
    /// Its description (the profile's, or none when it has none).
    #[serde(default)]
    pub description: Option<String>,
    /// The JSON Schema of its input.
    #[schema(value_type = Object)]
    pub input_schema: Value,
    /// `custom` or absent.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

/// A tool choice: `auto`, `any`, `none`, or `tool` with a `name`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolChoiceParam {
    /// `auto`, `any`, `none` or `tool`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool (`tool` only).
    #[serde(default)]
    pub name: Option<String>,
    /// Accepted when false or absent: the profile does not turn parallel tool use off.
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

/// Request metadata.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetadataParam {
    /// The end user (1 to 256 characters, no control characters): recorded with the call, sent
    /// to the provider when the profile says (as the OpenAI door's `user`).
    #[serde(default)]
    pub user_id: Option<String>,
}

// ---- answers ----------------------------------------------------------------------------------

/// Anthropic's `message` object, with a `tollgate` extension.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessageObject {
    /// `msg_<execution_id>` (stable across replays), or `msg_<operation_key digest>` when
    /// nothing was recorded.
    pub id: String,
    /// `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `assistant`.
    pub role: &'static str,
    /// `text` and `tool_use` blocks in the order the model produced them; empty when the output
    /// is withheld, unavailable or not completed.
    pub content: Vec<ContentBlock>,
    /// The profile's name.
    pub model: String,
    /// `end_turn`, `tool_use`, `max_tokens` (truncated), `stop_sequence`, `refusal` (refused or
    /// withheld by a block cap), or null when the call did not complete.
    pub stop_reason: Option<&'static str>,
    /// Always null: tollgate's step keeps that the provider stopped at a stop sequence
    /// (`stop_reason: stop_sequence`), not which one.
    pub stop_sequence: Option<String>,
    /// Token usage of the governed charge (the receipt's counts; zero when there is none).
    pub usage: MessageUsage,
    /// Where the call stands in tollgate's terms.
    pub tollgate: TollgateMessageExtension,
}

/// One content block of an answer.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Visible text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call of a structured or step profile (never executed here).
    ToolUse {
        /// The call id.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments.
        #[schema(value_type = Object)]
        input: Value,
    },
}

/// Anthropic's usage, from the receipt: `input_tokens` excludes the cache classes, and
/// `output_tokens` includes reasoning (`output_tokens_details.thinking_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct MessageUsage {
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Output tokens, reasoning included.
    pub output_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// Reasoning tokens, when there were any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens_details: Option<OutputTokensDetails>,
}

/// The reasoning part of `output_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    /// Reasoning tokens.
    pub thinking_tokens: u64,
}

/// The `tollgate` extension of a message (the same fields as the OpenAI-compatible front
/// door's).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TollgateMessageExtension {
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

/// `POST /v1/messages/count_tokens`'s answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenCount {
    /// The most input tokens the request can be billed for under the profile: the bound the
    /// call's hold is fitted from (one token per UTF-8 byte of everything sent as text, plus the
    /// framing of its messages and tools), never below what the provider bills, usually above.
    pub input_tokens: u64,
    /// What a call with these messages would hold.
    pub tollgate: CountExtension,
}

/// The `tollgate` extension of a token count.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CountExtension {
    /// `upper_bound`: `input_tokens` is a bound, not the provider's count.
    pub input_tokens_kind: &'static str,
    /// The fitted hold of a call with these messages (the profile's `max_tokens` of output at
    /// the dearest output class, the input bound at the dearest input class), a decimal string.
    #[schema(value_type = String)]
    pub hold: tollgate_core::money::Money,
    /// The hold's currency.
    #[schema(value_type = String)]
    pub currency: tollgate_core::money::Currency,
}

/// An error in Anthropic's shape (OpenAPI description).
#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorBody {
    /// `error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The error.
    pub error: AnthropicErrorDetail,
}

/// One error: Anthropic's `type`, the message, tollgate's `code` and that code's extra fields
/// (spec/service.md — Errors).
#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorDetail {
    /// Anthropic's error type.
    #[serde(rename = "type")]
    pub kind: String,
    /// What is wrong, by field names, limits and ids.
    pub message: String,
    /// tollgate's stable code (the error table).
    pub code: String,
}

// ---- identity and fields ------------------------------------------------------------------------

/// Identity of a request, from its headers.
struct Identity {
    operation_key: Option<String>,
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
    Ok(Identity {
        operation_key: header(headers, IDEMPOTENCY_KEY)?,
        session_id: header(headers, SESSION_HEADER)?.unwrap_or_else(|| DEFAULT_SESSION.into()),
        intent: header(headers, INTENT_HEADER)?.unwrap_or_else(|| DEFAULT_INTENT.into()),
        input_revision: header(headers, REVISION_HEADER)?,
        root_key: header(headers, ROOT_HEADER)?,
    })
}

/// A span recording the request's Anthropic headers (the version is accepted whatever it is);
/// the call's and the step's spans open inside it.
fn door_span(headers: &HeaderMap) -> Result<tracing::Span, ApiError> {
    let version = header(headers, VERSION_HEADER)?;
    let beta = header(headers, BETA_HEADER)?;
    Ok(tracing::info_span!(
        "anthropic",
        anthropic_version = version.as_deref().unwrap_or("-"),
        anthropic_beta = beta.as_deref().unwrap_or("-")
    ))
}

fn refused(field: &str, why: &str) -> ApiError {
    ApiError::Malformed(format!("{field}: {why}"))
}

fn check_system(system: Option<&Value>) -> Result<(), ApiError> {
    match system {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(refused(
            "system",
            "the system prompt is fixed by the profile (SC-6); omit the field",
        )),
    }
}

/// Passes when the request's tools are absent or exactly the profile's (name, description and
/// input schema of each, in any order).
fn check_tools(config: &CallConfig, tools: Option<&[ToolParam]>) -> Result<(), ApiError> {
    let Some(tools) = tools else {
        return Ok(());
    };
    let same = |asked: &ToolParam| {
        asked.kind.as_deref().is_none_or(|k| k == "custom")
            && config.tools.iter().any(|fixed| {
                asked.name == fixed.name
                    && asked.description.as_deref().unwrap_or("") == fixed.description
                    && asked.input_schema == fixed.input_schema
            })
    };
    let names: BTreeSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    if tools.len() == config.tools.len() && names.len() == tools.len() && tools.iter().all(same) {
        Ok(())
    } else {
        Err(refused(
            "tools",
            "the profile fixes the tools: send exactly the profile's tools (GET /v1/profiles \
             lists them) or leave the field out",
        ))
    }
}

/// The tool choice a request may name: the profile's, or with none in the profile what the
/// provider does then (`auto` with tools, `none` without).
fn profile_choice(config: &CallConfig) -> ToolChoice {
    match &config.tool_choice {
        Some(choice) => choice.clone(),
        None if config.tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
    }
}

/// Passes when the request's tool choice is absent or the profile's ([`profile_choice`]), with
/// parallel tool use left on.
fn check_tool_choice(
    config: &CallConfig,
    choice: Option<&ToolChoiceParam>,
) -> Result<(), ApiError> {
    let Some(choice) = choice else {
        return Ok(());
    };
    let asked = match (choice.kind.as_str(), choice.name.as_ref()) {
        ("auto", None) => Some(ToolChoice::Auto),
        ("any", None) => Some(ToolChoice::Any),
        ("none", None) => Some(ToolChoice::None),
        ("tool", Some(name)) => Some(ToolChoice::Tool { name: name.clone() }),
        _ => None,
    };
    let parallel_on = !choice.disable_parallel_tool_use.unwrap_or(false);
    let wanted = profile_choice(config);
    if asked.as_ref() == Some(&wanted) && parallel_on {
        return Ok(());
    }
    let shape = match &wanted {
        ToolChoice::Tool { name } => format!("{{\"type\": \"tool\", \"name\": {name:?}}}"),
        other => format!("{{\"type\": {:?}}}", other.mode()),
    };
    Err(refused(
        "tool_choice",
        &format!("the profile fixes the tool choice: send {shape} or leave the field out"),
    ))
}

/// What the request sets within its profile (SC-211): `max_tokens` (left out on a step, whose
/// root's snapshot fixes it), `temperature`, `top_p`, `stop_sequences`, and `metadata.user_id`
/// as the end user. `top_k` is refused: no profile sets it.
fn narrowing_of(request: &MessagesRequest, step: bool) -> Result<Narrowing, ApiError> {
    if request.top_k.is_some() {
        return Err(refused(
            "top_k",
            "the profile does not let a request set it; leave the field out",
        ));
    }
    let max_tokens = u32::try_from(request.max_tokens).unwrap_or(u32::MAX);
    let temperature = request
        .temperature
        .as_ref()
        .map(|n| Temperature::parse(&n.to_string()).map_err(|e| refused("temperature", &e)))
        .transpose()?;
    let top_p = request
        .top_p
        .as_ref()
        .map(|n| TopP::parse(&n.to_string()).map_err(|e| refused("top_p", &e)))
        .transpose()?;
    Ok(Narrowing {
        max_tokens: (!step).then_some(max_tokens),
        temperature,
        top_p,
        stop: request.stop_sequences.clone().unwrap_or_default(),
        seed: None,
        user: request.metadata.as_ref().and_then(|m| m.user_id.clone()),
        metadata: BTreeMap::new(),
    })
}

/// A narrowing refusal with the field named as this door names it (`stop_sequences`,
/// `metadata.user_id`).
fn named(error: &NarrowError) -> ApiError {
    let text = error.to_string();
    let text = match text.split_once(':') {
        Some(("stop", rest)) => format!("stop_sequences:{rest}"),
        Some(("user", rest)) => format!("metadata.user_id:{rest}"),
        _ => text,
    };
    ApiError::Malformed(text)
}

/// The profile's snapshot narrowed by the request. On a step profile the snapshot is the
/// root's: a request may send `max_tokens` up to the profile's (the step is sent the profile's)
/// and nothing else that would narrow it.
///
/// # Errors
/// `invalid_request` (400) naming the first field that would widen the profile.
fn narrowed(
    config: &CallConfig,
    request: &MessagesRequest,
    step: bool,
) -> Result<CallConfig, ApiError> {
    let out = config
        .narrowed(&narrowing_of(request, step)?)
        .map_err(|e| named(&e))?;
    if step {
        let max = u64::from(config.max_tokens);
        if request.max_tokens == 0 || request.max_tokens > max {
            return Err(refused(
                "max_tokens",
                &format!("1 up to the profile's {max}"),
            ));
        }
        if out != *config {
            return Err(refused(
                "temperature, top_p, stop_sequences, metadata.user_id",
                "a step runs under its root's snapshot, which the profile fixes; leave them \
                 out or send the profile's values",
            ));
        }
    }
    Ok(out)
}

// ---- messages ---------------------------------------------------------------------------------

fn malformed_at(path: &str, what: &str) -> ApiError {
    ApiError::Malformed(format!("{path}: {what}"))
}

/// The keys of a block other than `allowed`, as an error naming the first (cache control is the
/// profile's, so it gets its own reason).
fn only_keys(path: &str, block: &Map<String, Value>, allowed: &[&str]) -> Result<(), ApiError> {
    match block.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) if key == "cache_control" => Err(malformed_at(
            path,
            "cache_control: prompt caching is the profile's (its `cache` setting); omit the field",
        )),
        Some(key) => {
            let name: String = key.chars().take(64).filter(|c| !c.is_control()).collect();
            Err(malformed_at(
                path,
                &format!(
                    "unknown field `{name}`, expected one of {}",
                    allowed.join(", ")
                ),
            ))
        }
    }
}

fn string_at(path: &str, block: &Map<String, Value>, key: &str) -> Result<String, ApiError> {
    match block.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(malformed_at(path, &format!("{key}: expected a string"))),
    }
}

/// A tool result's content: a string, or a list of text blocks.
fn result_text(path: &str, content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (i, part) in parts.iter().enumerate() {
                let at = format!("{path}.content[{i}]");
                let Some(block) = part.as_object() else {
                    return Err(malformed_at(&at, "expected a text block"));
                };
                if block.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(malformed_at(
                        &at,
                        "type: a tool result holds text blocks only",
                    ));
                }
                only_keys(&at, block, &["type", "text"])?;
                text.push_str(&string_at(&at, block, "text")?);
            }
            Ok(text)
        }
        Some(_) => Err(malformed_at(
            path,
            "content: expected a string or a list of text blocks",
        )),
    }
}

/// One content block of a `role` turn as a tollgate part.
fn part(path: &str, role: Role, value: &Value) -> Result<Part, ApiError> {
    let Some(block) = value.as_object() else {
        return Err(malformed_at(path, "expected a content block object"));
    };
    match (block.get("type").and_then(Value::as_str), role) {
        (Some("text"), _) => {
            // Citations come back from Anthropic as `null` on plain text.
            let citations = block.get("citations").is_some_and(|c| !c.is_null());
            if citations {
                return Err(malformed_at(
                    path,
                    "citations: not supported; omit the field",
                ));
            }
            only_keys(path, block, &["type", "text", "citations"])?;
            Ok(Part::Text {
                text: string_at(path, block, "text")?,
            })
        }
        (Some("tool_use"), Role::Assistant) => {
            only_keys(path, block, &["type", "id", "name", "input"])?;
            let input = block
                .get("input")
                .filter(|i| i.is_object())
                .cloned()
                .ok_or_else(|| malformed_at(path, "input: expected an object"))?;
            Ok(Part::ToolCall {
                id: string_at(path, block, "id")?,
                name: string_at(path, block, "name")?,
                input,
            })
        }
        (Some("tool_result"), Role::User) => {
            only_keys(path, block, &["type", "tool_use_id", "content", "is_error"])?;
            let is_error = match block.get("is_error") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(malformed_at(path, "is_error: expected a boolean")),
            };
            Ok(Part::ToolResult {
                call_id: string_at(path, block, "tool_use_id")?,
                content: result_text(path, block.get("content"))?,
                is_error,
            })
        }
        (Some("tool_use"), Role::User) => Err(malformed_at(
            path,
            "type: tool_use blocks belong to assistant turns",
        )),
        (Some("tool_result"), Role::Assistant) => Err(malformed_at(
            path,
            "type: tool_result blocks belong to user turns",
        )),
        _ => Err(malformed_at(
            path,
            "type: expected one of text, tool_use (assistant), tool_result (user)",
        )),
    }
}

/// Anthropic's messages as tollgate messages, one for one.
fn messages(input: Vec<InputMessage>) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::with_capacity(input.len());
    for (index, m) in input.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            _ => {
                return Err(malformed_at(
                    &format!("messages[{index}].role"),
                    "expected user or assistant (the system prompt is the profile's)",
                ))
            }
        };
        let content = match m.content {
            Value::String(text) => vec![Part::Text { text }],
            Value::Array(blocks) => blocks
                .iter()
                .enumerate()
                .map(|(i, b)| part(&format!("messages[{index}].content[{i}]"), role, b))
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(malformed_at(
                    &format!("messages[{index}].content"),
                    "expected a string or a list of content blocks",
                ))
            }
        };
        out.push(Message { role, content });
    }
    Ok(out)
}

// ---- the door ---------------------------------------------------------------------------------

/// A request answered: the message and whether to stream it.
pub struct Answered {
    /// The message.
    pub message: MessageObject,
    /// Whether to answer as server-sent events.
    pub stream: bool,
}

/// Runs a Messages request.
///
/// # Errors
/// `invalid_request` (400: no `Idempotency-Key`, malformed body, unknown field, a field that
/// would widen the profile; 422: unknown profile, bad identifier or input, no `Tollgate-Root` on
/// a step profile), `conflict` (422), `in_progress` (409), `not_dispatched` (422),
/// `reconciliation_required` (502), `cap_blocked`, `root_closed`, `root_expired`,
/// `invalid_state`, `not_found` (root), `unavailable`, `interrupted`, `forbidden`.
pub async fn create(
    app: &App,
    who: &Principal,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Answered, ApiError> {
    create_with(app, who, headers, body, None).await
}

/// [`create`], handing a streamed text call's events to `live` as the provider sends them
/// (SC-213); `live` ends with nothing for every other request.
///
/// # Errors
/// As [`create`].
pub async fn create_with(
    app: &App,
    who: &Principal,
    headers: &HeaderMap,
    body: &[u8],
    live: Option<tollgate_runner::live::LiveSink>,
) -> Result<Answered, ApiError> {
    who.require(&[KeyRole::Caller])?;
    let request: MessagesRequest = parse(body)?;
    let ident = identity(headers)?;
    let operation_key = ident.operation_key.ok_or_else(|| {
        ApiError::Malformed(
            "the Idempotency-Key header is required: it is the call's operation key".into(),
        )
    })?;
    let model = request.model.clone();
    let loaded = app
        .profiles
        .get(&model)
        .ok_or_else(|| ApiError::Invalid(format!("model: {UNKNOWN_PROFILE}")))?;
    let profile = &loaded.profile.config;
    let step = matches!(loaded.runner, ProfileRunner::Step(_));
    check_system(request.system.as_ref())?;
    check_tools(profile, request.tools.as_deref())?;
    check_tool_choice(profile, request.tool_choice.as_ref())?;
    let config = narrowed(profile, &request, step)?;
    let span = door_span(headers)?;
    let stream = request.stream.unwrap_or(false);
    let messages = messages(request.messages)?;
    let call = door::DoorCall {
        model: model.clone(),
        operation_key,
        session_id: ident.session_id,
        intent: ident.intent,
        input_revision: ident.input_revision,
        root_key: ident.root_key,
        messages,
        config,
        step,
    };
    let live = live.filter(|_| stream);
    let view = door::run(app, who, call, live, span).await?;
    Ok(Answered {
        message: message(&model, view),
        stream,
    })
}

/// Counts a request's input tokens the way its hold is fitted: nothing is sent or written.
///
/// # Errors
/// `invalid_request` (400: malformed body, unknown field, a field the profile fixes; 422:
/// unknown profile, bad input), `forbidden`.
pub fn count(app: &App, who: &Principal, body: &[u8]) -> Result<TokenCount, ApiError> {
    who.require(&[KeyRole::Caller])?;
    let request: CountTokensRequest = parse(body)?;
    let loaded = app
        .profiles
        .get(&request.model)
        .ok_or_else(|| ApiError::Invalid(format!("model: {UNKNOWN_PROFILE}")))?;
    let config = &loaded.profile.config;
    check_system(request.system.as_ref())?;
    check_tools(config, request.tools.as_deref())?;
    check_tool_choice(config, request.tool_choice.as_ref())?;
    let messages = messages(request.messages)?;
    check_input(config, &messages).map_err(|e| ApiError::Invalid(e.to_string()))?;
    let hold = fitted_hold(config, &messages).map_err(|e| ApiError::Invalid(e.to_string()))?;
    Ok(TokenCount {
        input_tokens: request_input_tokens_bound(config, &messages),
        tollgate: CountExtension {
            input_tokens_kind: "upper_bound",
            hold,
            currency: config.currency.clone(),
        },
    })
}

fn usage_of(receipt: Option<&Receipt>) -> MessageUsage {
    let u = receipt.map(|r| r.usage).unwrap_or(Usage::ZERO);
    MessageUsage {
        input_tokens: u.input,
        output_tokens: u.output.saturating_add(u.reasoning),
        cache_creation_input_tokens: u.cache_write,
        cache_read_input_tokens: u.cache_read,
        output_tokens_details: (u.reasoning > 0).then_some(OutputTokensDetails {
            thinking_tokens: u.reasoning,
        }),
    }
}

/// The content blocks of a view whose output is shown: the step's text and tool calls in their
/// order (structured and step profiles), else the output text.
fn content_of(view: &View) -> Vec<ContentBlock> {
    if let Some(step) = &view.step {
        return step
            .blocks
            .iter()
            .filter_map(|b| match b {
                Block::Text { text, .. } if !text.is_empty() => {
                    Some(ContentBlock::Text { text: text.clone() })
                }
                Block::ToolCall { call, .. } => Some(ContentBlock::ToolUse {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    input: call.input.clone(),
                }),
                _ => None,
            })
            .collect();
    }
    view.output
        .as_ref()
        .and_then(|o| o.text.clone())
        .filter(|t| !t.is_empty())
        .map(|text| vec![ContentBlock::Text { text }])
        .unwrap_or_default()
}

/// The message of a view.
pub fn message(model: &str, view: View) -> MessageObject {
    let completed = view.state == ViewState::Completed;
    // A blocked call's output (and tool calls) are withheld: it shows nothing it produced.
    let shown = completed && view.outcome != Some(Outcome::Blocked);
    let content = if shown { content_of(&view) } else { Vec::new() };
    let calls_tools = content
        .iter()
        .any(|b| matches!(b, ContentBlock::ToolUse { .. }));
    let provider_stop = view.step.as_ref().and_then(|s| s.stop.as_deref());
    let stop_reason = match (completed, view.outcome) {
        (false, _) => None,
        (true, Some(Outcome::Refused | Outcome::Blocked)) => Some("refusal"),
        (true, Some(Outcome::Truncated)) => Some("max_tokens"),
        (true, _) if calls_tools => Some("tool_use"),
        (true, _) if provider_stop == Some("stop_sequence") => Some("stop_sequence"),
        (true, _) => Some("end_turn"),
    };
    let id = match view.execution_id {
        Some(id) => format!("msg_{}", id.0.simple()),
        None => format!(
            "msg_{}",
            short_digest(view.operation_key.as_str().as_bytes())
        ),
    };
    MessageObject {
        id,
        kind: "message",
        role: "assistant",
        content,
        model: model.to_string(),
        stop_reason,
        stop_sequence: None,
        usage: usage_of(view.receipt.as_ref()),
        tollgate: TollgateMessageExtension {
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

fn event(body: &mut String, name: &str, data: &Value) {
    body.push_str("event: ");
    body.push_str(name);
    body.push_str("\ndata: ");
    body.push_str(&data.to_string());
    body.push_str("\n\n");
}

/// The message as Anthropic's server-sent events, emitted after settlement: `message_start`
/// (the message without content, its usage carrying the input counts and no output yet),
/// `ping`, per block `content_block_start`, one `content_block_delta` (`text_delta` or
/// `input_json_delta`) and `content_block_stop`, then `message_delta` (the stop reason, the
/// whole usage with the output count, and the `tollgate` extension) and `message_stop`.
pub fn sse_body(message: &MessageObject) -> String {
    let usage = message.usage;
    let mut start = json!({
        "id": message.id, "type": "message", "role": "assistant", "content": [],
        "model": message.model, "stop_reason": null, "stop_sequence": null,
        "usage": {
            "input_tokens": usage.input_tokens,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens,
            "output_tokens": 0
        }
    });
    if message.tollgate.replayed {
        start["tollgate"] = json!({"replayed": true});
    }
    let mut body = String::new();
    event(
        &mut body,
        "message_start",
        &json!({"type": "message_start", "message": start}),
    );
    event(&mut body, "ping", &json!({"type": "ping"}));
    for (index, block) in message.content.iter().enumerate() {
        let (opened, delta) = match block {
            ContentBlock::Text { text } => (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": text}),
            ),
            ContentBlock::ToolUse { id, name, input } => (
                json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                json!({"type": "input_json_delta", "partial_json": input.to_string()}),
            ),
        };
        event(
            &mut body,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": opened}),
        );
        event(
            &mut body,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        );
        event(
            &mut body,
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        );
    }
    message_end(&mut body, message);
    body
}

/// A streamed Messages request (SC-213). The call runs in a task of its own. `message_start`
/// carries the input counts, so the stream goes out live only when the provider reports them
/// before its first text, as Anthropic's own stream does (`tollgate-stream: live`): then each
/// text delta goes out as the provider sends it, and `content_block_stop`, `message_delta` (the
/// stop reason, the whole usage, the `tollgate` extension) and `message_stop` once the
/// settlement committed. Otherwise — a provider that reports usage only at its end, a replay, a
/// refusal, an error before the send, a profile that is not text — the whole stream is emitted
/// after the settlement (`tollgate-stream: governed`), its `message_start` with the real counts.
/// A caller that hangs up drops only its stream: the call completes and settles.
pub async fn live_response(
    app: App,
    who: Principal,
    headers: HeaderMap,
    body: Bytes,
    model: String,
) -> Response {
    use tollgate_runner::live::Live;
    let (sink, mut events) = tollgate_runner::live::channel();
    let task =
        tokio::spawn(async move { create_with(&app, &who, &headers, &body, Some(sink)).await });
    let governed = |task: tokio::task::JoinHandle<Result<Answered, ApiError>>| async move {
        match task.await.unwrap_or(Err(ApiError::Internal)) {
            Ok(answer) => door::event_stream("governed", sse_body(&answer.message).into()),
            Err(e) => error_response(&e),
        }
    };
    let Some(Live::Sent(sent)) = events.recv().await else {
        return governed(task).await;
    };
    // The input counts first, or the stream waits for the settlement.
    let Some(Live::Usage(usage)) = events.recv().await else {
        drop(events);
        return governed(task).await;
    };
    let mut opening = String::new();
    let start = json!({
        "id": format!("msg_{}", sent.0.simple()), "type": "message", "role": "assistant",
        "content": [], "model": model, "stop_reason": null, "stop_sequence": null,
        "usage": {
            "input_tokens": usage.input,
            "cache_creation_input_tokens": usage.cache_write,
            "cache_read_input_tokens": usage.cache_read,
            "output_tokens": usage.output.saturating_add(usage.reasoning)
        }
    });
    event(
        &mut opening,
        "message_start",
        &json!({"type": "message_start", "message": start}),
    );
    event(&mut opening, "ping", &json!({"type": "ping"}));
    event(
        &mut opening,
        "content_block_start",
        &json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
    );
    let text = |delta: String| {
        let mut chunk = String::new();
        event(
            &mut chunk,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": delta}}),
        );
        chunk
    };
    let end = |answered: Result<Answered, ApiError>| {
        let mut end = String::new();
        match answered {
            Ok(answer) => live_end(&mut end, &answer.message),
            Err(e) => event(&mut end, "error", &error_body(&e).1),
        }
        end
    };
    door::event_stream("live", door::live_body(opening, events, task, text, end))
}

/// The end of a live stream: the text block closed, then `message_delta` and `message_stop` as
/// [`sse_body`] ends a stream.
fn live_end(body: &mut String, message: &MessageObject) {
    event(
        body,
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    );
    message_end(body, message);
}

/// `message_delta` (the stop reason, the whole usage with the output count, the `tollgate`
/// extension) and `message_stop`.
fn message_end(body: &mut String, message: &MessageObject) {
    let mut delta = json!({
        "type": "message_delta",
        "delta": {"stop_reason": message.stop_reason, "stop_sequence": message.stop_sequence},
        "usage": message.usage,
    });
    delta["tollgate"] = serde_json::to_value(&message.tollgate).unwrap_or(Value::Null);
    event(body, "message_delta", &delta);
    event(body, "message_stop", &json!({"type": "message_stop"}));
}

// ---- errors -----------------------------------------------------------------------------------

/// Anthropic's status and error type for a tollgate error answered with `status`, and whether
/// the official SDKs should retry it. A 402 whose answer carries `Retry-After` (the cap is full of
/// other calls' holds, which settle) becomes 429 `rate_limit_error`, which the SDKs retry after
/// the header's wait; a 402 without it (the call's own hold exceeds what the cap allows) stays 402
/// `billing_error`, never retried. Everything else keeps its status.
fn anthropic_kind(status: StatusCode, retry_after: bool) -> (StatusCode, &'static str) {
    match status.as_u16() {
        402 if retry_after => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
        402 => (status, "billing_error"),
        401 => (status, "authentication_error"),
        403 => (status, "permission_error"),
        404 => (status, "not_found_error"),
        408 | 504 => (status, "timeout_error"),
        409 => (status, "conflict_error"),
        413 => (status, "request_too_large"),
        429 => (status, "rate_limit_error"),
        503 => (status, "overloaded_error"),
        s if s >= 500 => (status, "api_error"),
        _ => (status, "invalid_request_error"),
    }
}

/// tollgate's own answer to `error`, and its body in Anthropic's shape: `{"type": "error",
/// "error": {"type", "message", "code", …}}`, Anthropic's error type beside tollgate's code
/// and extra fields.
fn error_body(error: &ApiError) -> (Response, Value) {
    let own = error.clone().into_response();
    let retry_after = own.headers().contains_key(header::RETRY_AFTER);
    let (_, kind) = anthropic_kind(own.status(), retry_after);
    let mut detail = match error.body().get("error") {
        Some(Value::Object(fields)) => fields.clone(),
        _ => Map::new(),
    };
    detail.insert("type".into(), json!(kind));
    (own, json!({"type": "error", "error": detail}))
}

/// `error` in Anthropic's shape, `{"type": "error", "error": {"type", "message", "code", …}}`:
/// the status, headers (`Retry-After`, `x-should-retry` and any other) and extra fields of
/// tollgate's own answer, with Anthropic's error type. Where tollgate's answer does not say
/// `x-should-retry` itself, the door adds it, since the SDKs' status rules alone would get it
/// wrong: `true` when tollgate says when to retry (`Retry-After`) or the status is 408 or 5xx (a
/// retry with the same `Idempotency-Key` replays or waits, never sends twice); `false`
/// otherwise, so a conflict or a closed root is not sent again in vain.
pub fn error_response(error: &ApiError) -> Response {
    let (own, body) = error_body(error);
    let retry_after = own.headers().contains_key(header::RETRY_AFTER);
    let (status, _) = anthropic_kind(own.status(), retry_after);
    let retry = retry_after || status == StatusCode::REQUEST_TIMEOUT || status.is_server_error();
    let mut response = (status, axum::Json(body)).into_response();
    for (name, value) in own.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    response
        .headers_mut()
        .entry(SHOULD_RETRY)
        .or_insert(HeaderValue::from_static(if retry {
            "true"
        } else {
            "false"
        }));
    if let ApiError::RateLimited(refused) = error {
        response
            .headers_mut()
            .extend(anthropic_rate_limit_headers(refused, chrono::Utc::now()));
    }
    response
}

/// Anthropic's own rate-limit headers of a limit's refusal (SC-224), beside the
/// `x-ratelimit-*` ones every door sends: `anthropic-ratelimit-{requests,input-tokens,
/// output-tokens}-{limit,remaining,reset}`, `reset` as the RFC 3339 time the window ends. A
/// refusal by calls in flight has no Anthropic counterpart and adds none.
pub fn anthropic_rate_limit_headers(
    refused: &tollgate_core::limits::LimitRefused,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<(HeaderName, HeaderValue)> {
    use tollgate_core::limits::LimitKind;
    let name = match refused.kind {
        LimitKind::Requests => "requests",
        LimitKind::InputTokens => "input-tokens",
        LimitKind::OutputTokens => "output-tokens",
        LimitKind::InFlight => return Vec::new(),
    };
    let reset =
        now + chrono::Duration::milliseconds(i64::try_from(refused.reset_ms).unwrap_or(i64::MAX));
    [
        ("limit", refused.limit.to_string()),
        ("remaining", refused.remaining().to_string()),
        (
            "reset",
            reset.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        ),
    ]
    .into_iter()
    .filter_map(|(part, value)| {
        Some((
            HeaderName::try_from(format!("anthropic-ratelimit-{name}-{part}")).ok()?,
            HeaderValue::try_from(value).ok()?,
        ))
    })
    .collect()
}

/// `response` with Anthropic's `request-id` header, the request's `x-request-id`.
fn with_request_id(mut response: Response, headers: &HeaderMap) -> Response {
    if let Some(id) = headers.get(crate::limits::REQUEST_ID) {
        response
            .headers_mut()
            .insert(ANTHROPIC_REQUEST_ID, id.clone());
    }
    response
}

// ---- handlers ---------------------------------------------------------------------------------

/// `POST /v1/messages`: Anthropic's Messages API; errors in Anthropic's shape.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "anthropic",
    request_body = MessagesRequest,
    params(
        ("Idempotency-Key" = String, Header, description = "the operation key (required)"),
        ("x-api-key" = Option<String>, Header, description = "the API key, as an alternative to `Authorization: Bearer` (the same key when both are sent)"),
        ("anthropic-version" = Option<String>, Header, description = "accepted whatever its value; recorded in the log, changes nothing"),
        ("Tollgate-Session" = Option<String>, Header, description = "session id (default `default`)"),
        ("Tollgate-Intent" = Option<String>, Header, description = "intent (default `messages`)"),
        ("Tollgate-Input-Revision" = Option<String>, Header, description = "input revision (default: a digest of the messages)"),
        ("Tollgate-Root" = Option<String>, Header, description = "the root of a step profile's step (required on step profiles)")
    ),
    responses(
        (status = 200, description = "a message, or with `stream: true` Anthropic's server-sent events (message_start … message_stop): live when the provider reports its input counts before its text (`tollgate-stream: live`), else after settlement (`governed`)", body = MessageObject),
        (status = 400, description = "invalid_request (invalid_request_error): no Idempotency-Key, malformed body, a field refused by name, a value above the profile's or a field the profile fixes (system, tools, tool_choice, top_k)", body = AnthropicErrorBody),
        (status = 401, description = "unauthenticated (authentication_error)", body = AnthropicErrorBody),
        (status = 402, description = "cap_blocked (billing_error): `kind` exceeds_cap, the call's own hold exceeds what the cap allows; no retry helps", body = AnthropicErrorBody),
        (status = 403, description = "forbidden (permission_error)", body = AnthropicErrorBody),
        (status = 404, description = "not_found (not_found_error): the root", body = AnthropicErrorBody),
        (status = 408, description = "body_timeout (timeout_error): the body did not arrive within [server] body_read_timeout_ms", body = AnthropicErrorBody),
        (status = 409, description = "in_progress (conflict_error, Retry-After: the SDKs retry and get the stored message), root_closed, root_expired, invalid_state", body = AnthropicErrorBody),
        (status = 413, description = "payload_too_large (request_too_large)", body = AnthropicErrorBody),
        (status = 422, description = "invalid_request (invalid_request_error): unknown profile, bad identifier or input, no Tollgate-Root on a step profile; conflict: the Idempotency-Key was first used with another request (x-should-retry: false); not_dispatched: the key's call never went out, nothing charged", body = AnthropicErrorBody),
        (status = 429, description = "cap_blocked (rate_limit_error): `kind` holds_in_flight, the cap is full of other calls' holds now; the SDKs retry after Retry-After. rate_limited (rate_limit_error): a rate or concurrency limit, with Retry-After, retry-after-ms, x-ratelimit-* and anthropic-ratelimit-* headers", body = AnthropicErrorBody),
        (status = 500, description = "internal (api_error)", body = AnthropicErrorBody),
        (status = 502, description = "reconciliation_required (api_error): the key's call may have been sent, its cost is not proven; it waits for an operator (x-should-retry: false)", body = AnthropicErrorBody),
        (status = 503, description = "unavailable (overloaded_error, Retry-After)", body = AnthropicErrorBody),
        (status = 504, description = "interrupted (timeout_error, Retry-After)", body = AnthropicErrorBody)
    )
)]
pub async fn messages_route(
    State(app): State<App>,
    who: Result<Principal, ApiError>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = match (who, body) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(ApiError::from(e)),
        (Ok(who), Ok(body)) => {
            let (peek, elsewhere) =
                crate::service::owner::door_elsewhere(&app, &who, &uri, &headers, &body).await;
            if let Some(answer) = elsewhere {
                return answer;
            }
            if peek.stream {
                let model = peek.model.unwrap_or_default();
                let response = live_response(app, who, headers.clone(), body, model).await;
                return with_request_id(response, &headers);
            }
            create(&app, &who, &headers, &body).await
        }
    };
    // A stream went to `live_response` above.
    let response = match result {
        Ok(answer) => axum::Json(answer.message).into_response(),
        Err(e) => error_response(&e),
    };
    with_request_id(response, &headers)
}

/// `POST /v1/messages/count_tokens`: the input-token bound a call's hold is fitted from.
#[utoipa::path(
    post,
    path = "/v1/messages/count_tokens",
    tag = "anthropic",
    request_body = CountTokensRequest,
    params(
        ("x-api-key" = Option<String>, Header, description = "the API key, as an alternative to `Authorization: Bearer`"),
        ("anthropic-version" = Option<String>, Header, description = "accepted whatever its value; changes nothing")
    ),
    responses(
        (status = 200, description = "`input_tokens`: an upper bound of the input tokens the request can be billed for, the one its hold is fitted from; nothing is sent or written", body = TokenCount),
        (status = 400, description = "invalid_request (invalid_request_error): malformed body, unknown field, a field the profile fixes", body = AnthropicErrorBody),
        (status = 401, description = "unauthenticated (authentication_error)", body = AnthropicErrorBody),
        (status = 403, description = "forbidden (permission_error)", body = AnthropicErrorBody),
        (status = 408, description = "body_timeout (timeout_error)", body = AnthropicErrorBody),
        (status = 413, description = "payload_too_large (request_too_large)", body = AnthropicErrorBody),
        (status = 422, description = "invalid_request (invalid_request_error): unknown profile, bad input", body = AnthropicErrorBody),
        (status = 500, description = "internal (api_error)", body = AnthropicErrorBody),
        (status = 503, description = "unavailable (overloaded_error)", body = AnthropicErrorBody)
    )
)]
pub async fn count_tokens_route(
    State(app): State<App>,
    who: Result<Principal, ApiError>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = match (who, body) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(ApiError::from(e)),
        (Ok(who), Ok(body)) => count(&app, &who, &body),
    };
    let response = match result {
        Ok(count) => axum::Json(count).into_response(),
        Err(e) => error_response(&e),
    };
    with_request_id(response, &headers)
}

/// The door's part of the OpenAPI document: its two routes and their types
/// (`crate::openapi::ApiDoc` takes them in).
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(messages_route, count_tokens_route),
    components(schemas(
        MessagesRequest,
        CountTokensRequest,
        InputMessage,
        ToolParam,
        ToolChoiceParam,
        MetadataParam,
        MessageObject,
        ContentBlock,
        MessageUsage,
        OutputTokensDetails,
        TollgateMessageExtension,
        TokenCount,
        CountExtension,
        AnthropicErrorBody,
        AnthropicErrorDetail
    ))
)]
pub struct AnthropicApi;

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::caps::{CapBlocked, CapWindow};
    use tollgate_core::money::{Currency, Money};

    fn input(role: &str, content: Value) -> InputMessage {
        InputMessage {
            role: role.into(),
            content,
        }
    }

    #[test]
    fn tool_use_and_tool_result_blocks_become_tool_parts() {
        let out = messages(vec![
            input("user", json!("Paris")),
            input(
                "assistant",
                json!([{"type": "text", "text": "calling"},
                       {"type": "tool_use", "id": "t1", "name": "extract_record", "input": {"city": "Paris"}}]),
            ),
            input(
                "user",
                json!([{"type": "tool_result", "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "stored"}]},
                       {"type": "tool_result", "tool_use_id": "t2", "content": "x", "is_error": true}]),
            ),
        ])
        .unwrap();
        assert_eq!(out.len(), 3);
        assert!(
            matches!(&out[1].content[1], Part::ToolCall { input, .. } if input["city"] == "Paris")
        );
        assert_eq!(
            out[2].content[0],
            Part::ToolResult {
                call_id: "t1".into(),
                content: "stored".into(),
                is_error: false
            }
        );
        assert!(matches!(
            &out[2].content[1],
            Part::ToolResult { is_error: true, .. }
        ));
    }

    #[test]
    fn unsupported_blocks_and_roles_are_refused_by_path_without_the_value() {
        let cases = [
            (
                input("user", json!([{"type": "image", "source": "sk-secret"}])),
                "messages[0].content[0]: type",
            ),
            (
                input(
                    "user",
                    json!([{"type": "text", "text": "sk-secret", "cache_control": {"type": "ephemeral"}}]),
                ),
                "messages[0].content[0]: cache_control",
            ),
            (
                input(
                    "user",
                    json!([{"type": "tool_use", "id": "a", "name": "b", "input": {}}]),
                ),
                "messages[0].content[0]: type: tool_use blocks belong to assistant",
            ),
            (input("system", json!("sk-secret")), "messages[0].role"),
            (input("user", json!(7)), "messages[0].content"),
        ];
        for (message, expected) in cases {
            let e = messages(vec![message]).unwrap_err();
            let text = e.to_string();
            assert!(text.starts_with(expected), "{text}");
            assert!(!text.contains("sk-secret"), "{text}");
            assert_eq!(e.status_code(), StatusCode::BAD_REQUEST);
        }
    }

    async fn status_and_kind(error: &ApiError) -> (u16, Value, Option<String>) {
        let response = error_response(error);
        let status = response.status().as_u16();
        let retry = response
            .headers()
            .get("x-should-retry")
            .map(|v| v.to_str().unwrap().to_string());
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["type"], "error", "{body}");
        assert!(body["error"]["message"].is_string(), "{body}");
        assert_eq!(body["error"]["code"], error.code(), "{body}");
        (status, body["error"]["type"].clone(), retry)
    }

    #[test]
    fn the_doors_openapi_part_documents_both_routes_and_their_errors() {
        use utoipa::OpenApi;
        let doc = serde_json::to_value(AnthropicApi::openapi()).unwrap();
        for path in PATHS {
            let responses = &doc["paths"][path]["post"]["responses"];
            for status in [
                "200", "400", "401", "403", "408", "413", "422", "500", "503",
            ] {
                assert!(responses[status].is_object(), "{path} {status}");
            }
            assert!(
                doc["paths"][path]["post"]["requestBody"].is_object(),
                "{path}"
            );
        }
        for status in ["402", "409", "429", "504"] {
            assert!(
                doc["paths"]["/v1/messages"]["post"]["responses"][status].is_object(),
                "{status}"
            );
        }
        for schema in [
            "MessagesRequest",
            "MessageObject",
            "TokenCount",
            "AnthropicErrorBody",
        ] {
            assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
        }
    }

    fn blocked(held: &str, hold: &str) -> ApiError {
        let m = |s: &str| Money::parse(s, "t").unwrap();
        ApiError::CapBlocked(CapBlocked {
            window: CapWindow::Session,
            limit: m("1"),
            settled: m("0"),
            held: m(held),
            hold: m(hold),
            currency: Some(Currency::parse("USD").unwrap()),
        })
    }

    #[tokio::test]
    async fn errors_keep_their_status_and_code_with_anthropic_types() {
        let conflict = ApiError::Conflict {
            operation_key: "k".into(),
            fields: vec!["input_revision".into()],
        };
        let in_progress = ApiError::InProgress {
            operation_key: "k".into(),
            execution_id: None,
        };
        let awaiting = ApiError::ReconciliationRequired {
            operation_key: "k".into(),
            execution_id: None,
        };
        for (error, status, kind, retry) in [
            (
                ApiError::Unauthenticated,
                401,
                "authentication_error",
                "false",
            ),
            (ApiError::Forbidden, 403, "permission_error", "false"),
            (
                ApiError::NotFound("root".into()),
                404,
                "not_found_error",
                "false",
            ),
            (
                ApiError::Malformed("x".into()),
                400,
                "invalid_request_error",
                "false",
            ),
            (
                ApiError::Invalid("x".into()),
                422,
                "invalid_request_error",
                "false",
            ),
            (ApiError::TooLarge(1), 413, "request_too_large", "false"),
            (ApiError::BodyTimeout(1), 408, "timeout_error", "true"),
            (ApiError::Overloaded, 503, "overloaded_error", "true"),
            (ApiError::RequestTimeout(1), 504, "timeout_error", "true"),
            (ApiError::Internal, 500, "api_error", "true"),
            (conflict, 422, "invalid_request_error", "false"),
            (in_progress, 409, "conflict_error", "true"),
            // tollgate's own `x-should-retry: false` is kept: a retry answers the same.
            (awaiting, 502, "api_error", "false"),
            // Holds of calls in flight fill the cap: a rate limit the SDKs retry after the wait.
            (blocked("0.9", "0.5"), 429, "rate_limit_error", "true"),
            // The call's own hold exceeds the cap: no retry helps.
            (blocked("0", "2"), 402, "billing_error", "false"),
        ] {
            let retry_after = error
                .clone()
                .into_response()
                .headers()
                .contains_key(header::RETRY_AFTER);
            let response = error_response(&error);
            assert_eq!(
                response.headers().contains_key(header::RETRY_AFTER),
                retry_after,
                "{error:?}: tollgate's Retry-After is kept"
            );
            let (got, got_kind, got_retry) = status_and_kind(&error).await;
            assert_eq!(
                (got, got_kind, got_retry.as_deref()),
                (status, json!(kind), Some(retry)),
                "{error:?}"
            );
        }
    }
}
