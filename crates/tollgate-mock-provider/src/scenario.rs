//! What the mock provider does for one request: the model name picks a scenario, the request
//! body supplies the echoed text, the tools and the input size.

use serde_json::Value;
use tollgate_provider::Protocol;

/// Largest `@N` output size, in characters.
pub(crate) const SIZE_MAX: usize = 10_000_000;
/// Longest `mock-slow-MS` delay, in milliseconds.
pub(crate) const SLOW_MS_MAX: u64 = 600_000;
/// Default size of `mock-big`, in characters.
const BIG_DEFAULT: usize = 10_000;
/// Text `mock-big@N` repeats.
const BIG_PATTERN: &str = "The quick brown fox jumps over the lazy dog. ";
/// Filler cycled when an `@N` size applies to an empty echo.
const ECHO_FILLER: &str = "echo ";
/// Reasoning text of `mock-reasoning` (cycled to `@N` characters when a size is given).
pub(crate) const REASONING_TEXT: &str =
    "The user wants their message back. I will repeat it exactly. ";
/// Arguments of `mock-tool-malformed`: not JSON.
const MALFORMED_ARGS: &str = "{\"query\": \"unterminated";

/// How a stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Stop, usage and the protocol's end marker.
    Complete,
    /// The connection drops after the content, before any usage or stop.
    CutBeforeUsage,
    /// The connection drops after the terminal usage, before the stop / end marker.
    CutAfterUsage,
}

/// The shape of a streamed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Content, then `ending`.
    Normal(Content, Ending),
    /// Provider reference, no content, no stop, zero usage, clean end (RF-2).
    PreStream,
    /// No content, a refusal stop, clean end (RF-1).
    EmptyRefusal,
    /// Reasoning events until the client disconnects, never text.
    ReasoningLoop,
    /// Headers, then no body byte until the client disconnects.
    Hang,
}

/// A tool call the mock makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolOut {
    /// Tool name.
    pub name: String,
    /// Argument text (JSON, or not for `mock-tool-malformed`).
    pub args: String,
}

/// What a normal answer contains, in this order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Content {
    /// Reasoning text, if any.
    pub reasoning: Option<String>,
    /// Visible text (empty = none).
    pub text: String,
    /// One tool call, if any.
    pub tool: Option<ToolOut>,
}

/// Token counts the mock reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Tokens {
    /// Input tokens: `ceil(input chars / 4)`, at least 1 (0 for the pre-stream refusal).
    pub input: u64,
    /// Visible output tokens (text and tool arguments): `ceil(chars / 4)`.
    pub output: u64,
    /// Reasoning tokens: `ceil(reasoning chars / 4)`.
    pub reasoning: u64,
}

/// A streamed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Model name as requested.
    pub model: String,
    /// Delay before the response headers, in milliseconds.
    pub delay_ms: u64,
    /// What to stream.
    pub shape: Shape,
    /// Reported usage.
    pub tokens: Tokens,
    /// Whether a Responses request asked for `reasoning.encrypted_content`.
    pub encrypted_reasoning: bool,
    /// Whether a Responses request asked the provider to keep the response (`store: true`), so
    /// that `GET /v1/responses/{id}` finds it.
    pub store: bool,
}

/// What the mock answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Behaviour {
    /// A 200 event stream.
    Stream(Plan),
    /// An HTTP error status with a small JSON error body.
    Status {
        /// HTTP status: 400 bad request, 404 unknown model, or a status scenario's 429 / 500.
        status: u16,
        /// Provider error type.
        kind: &'static str,
        /// Human-readable text for the error body's `message` field.
        message: String,
    },
    /// An HTTP error status with an HTML body, as a gateway or load balancer in front of the
    /// provider answers: not the provider's error format.
    Gateway {
        /// HTTP status.
        status: u16,
    },
}

/// The scenario a model name names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Echo,
    Json,
    Tool,
    ToolMalformed,
    Reasoning,
    ReasoningLoop,
    Slow(u64),
    Hang,
    CutBeforeUsage,
    CutAfterUsage,
    RefusePrestream,
    EmptyRefusal,
    Status(u16),
    Gateway(u16),
    Big,
}

/// Parses `mock-NAME[@N]`; `None` for an unknown name or a bad size.
fn parse_model(model: &str) -> Option<(Scenario, Option<usize>)> {
    let (base, size) = match model.split_once('@') {
        Some((base, n)) => {
            let n: usize = n.parse().ok()?;
            if n > SIZE_MAX {
                return None;
            }
            (base, Some(n))
        }
        None => (model, None),
    };
    let scenario = match base {
        "mock-echo" => Scenario::Echo,
        "mock-json" => Scenario::Json,
        "mock-tool" => Scenario::Tool,
        "mock-tool-malformed" => Scenario::ToolMalformed,
        "mock-reasoning" => Scenario::Reasoning,
        "mock-reasoning-loop" => Scenario::ReasoningLoop,
        "mock-hang" => Scenario::Hang,
        "mock-cut-before-usage" => Scenario::CutBeforeUsage,
        "mock-cut-after-usage" => Scenario::CutAfterUsage,
        "mock-refuse-prestream" => Scenario::RefusePrestream,
        "mock-empty-refusal" => Scenario::EmptyRefusal,
        "mock-429" => Scenario::Status(429),
        "mock-500" => Scenario::Status(500),
        "mock-502-gateway" => Scenario::Gateway(502),
        "mock-big" => Scenario::Big,
        other => {
            let ms: u64 = other.strip_prefix("mock-slow-")?.parse().ok()?;
            if ms > SLOW_MS_MAX {
                return None;
            }
            Scenario::Slow(ms)
        }
    };
    Some((scenario, size))
}

/// The parts of a request body the mock looks at. Nothing of it is ever logged.
#[derive(Debug, Clone, Default)]
struct Request {
    model: String,
    /// Text of the last user message.
    user_text: String,
    /// Characters of system prompt and messages.
    input_chars: u64,
    /// `(name, JSON schema)` of each tool.
    tools: Vec<(String, Value)>,
    /// The tool a `tool_choice` names.
    choice: Option<String>,
    /// Responses `include: ["reasoning.encrypted_content"]`.
    encrypted_reasoning: bool,
    /// `store: true`.
    store: bool,
}

/// The text of the last user message of a request body (the text the echo uses), or `None`
/// when the body is not a JSON object of `protocol`'s request shape.
pub(crate) fn prompt_of(protocol: Protocol, body: &[u8]) -> Option<String> {
    let value = serde_json::from_slice::<Value>(body).ok()?;
    if !value.is_object() {
        return None;
    }
    let (_, messages) = request_parts(protocol, &value);
    Some(messages.map(last_user_text).unwrap_or_default())
}

/// `(system prompt, messages)` of one protocol's request body.
fn request_parts(protocol: Protocol, body: &Value) -> (Option<&Value>, Option<&Value>) {
    match protocol {
        Protocol::OpenAiChat => (None, body.get("messages")),
        Protocol::OpenAiResponses => (body.get("instructions"), body.get("input")),
        Protocol::Anthropic => (body.get("system"), body.get("messages")),
    }
}

/// Decides the answer to one request body.
pub(crate) fn decide(protocol: Protocol, body: &[u8]) -> Behaviour {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return bad_request("request body is not JSON");
    };
    let Some(request) = inspect(protocol, &value) else {
        return bad_request("request has no model");
    };
    let Some((scenario, size)) = parse_model(&request.model) else {
        return Behaviour::Status {
            status: 404,
            kind: "not_found",
            message: format!("unknown mock model {:?}", request.model),
        };
    };
    let (status, kind, message) = match scenario {
        Scenario::Status(429) => (429, "rate_limit", "mock rate limit"),
        Scenario::Status(status) => (status, "server_error", "mock server error"),
        Scenario::Gateway(status) => return Behaviour::Gateway { status },
        _ => {
            let shape = match shape_for(scenario, size, &request) {
                Ok(shape) => shape,
                Err(message) => return bad_request(message),
            };
            let delay_ms = match scenario {
                Scenario::Slow(ms) => ms,
                _ => 0,
            };
            return Behaviour::Stream(Plan {
                tokens: tokens_for(&shape, request.input_chars),
                model: request.model,
                delay_ms,
                shape,
                encrypted_reasoning: request.encrypted_reasoning,
                store: request.store,
            });
        }
    };
    Behaviour::Status {
        status,
        kind,
        message: message.into(),
    }
}

/// The stream a (non-status) scenario sends for `request`, or why the request is bad.
fn shape_for(
    scenario: Scenario,
    size: Option<usize>,
    request: &Request,
) -> Result<Shape, &'static str> {
    let echo = || sized(&request.user_text, size, ECHO_FILLER);
    let text_only = |text: String| Content {
        text,
        ..Content::default()
    };
    let shape = match scenario {
        Scenario::Echo | Scenario::Slow(_) => Shape::Normal(text_only(echo()), Ending::Complete),
        Scenario::Json => {
            let text = serde_json::json!({ "answer": echo(), "ok": true }).to_string();
            Shape::Normal(text_only(text), Ending::Complete)
        }
        Scenario::Tool | Scenario::ToolMalformed => {
            let Some((name, schema)) = pick_tool(request) else {
                return Err("mock-tool needs at least one tool or a tool_choice");
            };
            let args = if scenario == Scenario::Tool {
                arguments_for(&schema).to_string()
            } else {
                MALFORMED_ARGS.to_string()
            };
            let content = Content {
                tool: Some(ToolOut { name, args }),
                ..Content::default()
            };
            Shape::Normal(content, Ending::Complete)
        }
        Scenario::Reasoning => {
            let content = Content {
                reasoning: Some(sized(REASONING_TEXT, size, REASONING_TEXT)),
                text: request.user_text.clone(),
                tool: None,
            };
            Shape::Normal(content, Ending::Complete)
        }
        Scenario::Big => {
            let text = sized("", Some(size.unwrap_or(BIG_DEFAULT)), BIG_PATTERN);
            Shape::Normal(text_only(text), Ending::Complete)
        }
        Scenario::CutBeforeUsage | Scenario::CutAfterUsage => {
            // A cut needs some text before it even when the echo is empty.
            let mut text = echo();
            if text.is_empty() {
                text = ECHO_FILLER.trim_end().to_string();
            }
            let ending = if scenario == Scenario::CutBeforeUsage {
                Ending::CutBeforeUsage
            } else {
                Ending::CutAfterUsage
            };
            Shape::Normal(text_only(text), ending)
        }
        Scenario::ReasoningLoop => Shape::ReasoningLoop,
        Scenario::Hang => Shape::Hang,
        Scenario::RefusePrestream => Shape::PreStream,
        Scenario::EmptyRefusal => Shape::EmptyRefusal,
        Scenario::Status(_) | Scenario::Gateway(_) => {
            return Err("status scenarios have no stream")
        }
    };
    Ok(shape)
}

fn bad_request(message: &str) -> Behaviour {
    Behaviour::Status {
        status: 400,
        kind: "invalid_request",
        message: message.into(),
    }
}

/// `ceil(chars / 4)`.
fn quarter(chars: u64) -> u64 {
    chars.div_ceil(4)
}

fn char_count(s: &str) -> u64 {
    u64::try_from(s.chars().count()).unwrap_or(u64::MAX)
}

fn tokens_for(shape: &Shape, input_chars: u64) -> Tokens {
    let input = quarter(input_chars).max(1);
    match shape {
        Shape::PreStream => Tokens::default(),
        Shape::EmptyRefusal | Shape::ReasoningLoop | Shape::Hang => Tokens {
            input,
            ..Tokens::default()
        },
        Shape::Normal(content, _) => {
            let tool_chars = content.tool.as_ref().map_or(0, |t| char_count(&t.args));
            Tokens {
                input,
                output: quarter(char_count(&content.text).saturating_add(tool_chars)),
                reasoning: quarter(content.reasoning.as_deref().map_or(0, char_count)),
            }
        }
    }
}

/// `base`, or with a size: exactly `n` characters cycling `base` (or `filler` when `base` is
/// empty).
fn sized(base: &str, size: Option<usize>, filler: &str) -> String {
    let Some(n) = size else {
        return base.to_string();
    };
    let source = if base.is_empty() { filler } else { base };
    source.chars().cycle().take(n).collect()
}

/// Reads the fields of one protocol's request body.
fn inspect(protocol: Protocol, body: &Value) -> Option<Request> {
    let model = body.get("model")?.as_str()?.to_string();
    let (system, messages) = request_parts(protocol, body);
    let input_chars = system
        .map_or(0, text_chars)
        .saturating_add(messages.map_or(0, text_chars));
    let tools = body
        .get("tools")
        .and_then(Value::as_array)
        .map(|tools| tools.iter().filter_map(tool_of).collect())
        .unwrap_or_default();
    let choice = body.get("tool_choice").and_then(|c| {
        c.get("name")
            .or_else(|| c.get("function").and_then(|f| f.get("name")))
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    let encrypted_reasoning = body
        .get("include")
        .and_then(Value::as_array)
        .is_some_and(|items| {
            items
                .iter()
                .any(|i| i.as_str() == Some("reasoning.encrypted_content"))
        });
    Some(Request {
        model,
        user_text: messages.map(last_user_text).unwrap_or_default(),
        input_chars,
        tools,
        choice,
        encrypted_reasoning,
        store: body.get("store").and_then(Value::as_bool) == Some(true),
    })
}

/// `(name, schema)` of a tool in any of the three shapes (chat `function`, Responses flat
/// `parameters`, Anthropic `input_schema`).
fn tool_of(tool: &Value) -> Option<(String, Value)> {
    let function = tool.get("function").unwrap_or(tool);
    let name = function.get("name")?.as_str()?.to_string();
    let schema = function
        .get("parameters")
        .or_else(|| tool.get("input_schema"))
        .cloned()
        .unwrap_or(Value::Null);
    Some((name, schema))
}

/// The `tool_choice`-named tool, or else the first tool.
fn pick_tool(request: &Request) -> Option<(String, Value)> {
    match &request.choice {
        Some(name) => {
            let schema = request
                .tools
                .iter()
                .find(|(n, _)| n == name)
                .map_or(Value::Null, |(_, s)| s.clone());
            Some((name.clone(), schema))
        }
        None => request.tools.first().cloned(),
    }
}

/// Valid arguments for `schema`: each required property gets its `enum`'s first value or a
/// plain value of its type (`"mock"`, `1`, `true`, `[]`, `{}`).
fn arguments_for(schema: &Value) -> Value {
    let mut args = serde_json::Map::new();
    let required = schema.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        let property = schema.get("properties").and_then(|p| p.get(name));
        let first_enum = property
            .and_then(|p| p.get("enum"))
            .and_then(Value::as_array)
            .and_then(|e| e.first())
            .cloned();
        let kind = property.and_then(|p| p.get("type")).and_then(Value::as_str);
        let value = first_enum.unwrap_or_else(|| match kind {
            Some("integer") | Some("number") => Value::from(1),
            Some("boolean") => Value::Bool(true),
            Some("array") => Value::Array(Vec::new()),
            Some("object") => Value::Object(serde_json::Map::new()),
            Some("null") => Value::Null,
            _ => Value::from("mock"),
        });
        args.insert(name.to_string(), value);
    }
    Value::Object(args)
}

/// Keys whose string values are metadata, not text.
const METADATA_KEYS: [&str; 7] = [
    "role",
    "type",
    "id",
    "tool_use_id",
    "call_id",
    "status",
    "cache_control",
];

/// Characters of every text string in `value`, skipping metadata keys.
fn text_chars(value: &Value) -> u64 {
    match value {
        Value::String(s) => char_count(s),
        Value::Array(items) => items.iter().map(text_chars).fold(0, u64::saturating_add),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !METADATA_KEYS.contains(&k.as_str()))
            .map(|(_, v)| text_chars(v))
            .fold(0, u64::saturating_add),
        _ => 0,
    }
}

/// The text of the last user message: a plain string input (Responses), or the last message
/// with `role: "user"` whose content is a string or parts carrying `text`.
fn last_user_text(messages: &Value) -> String {
    if let Some(s) = messages.as_str() {
        return s.to_string();
    }
    let Some(last) = messages.as_array().and_then(|items| {
        items
            .iter()
            .rev()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
    }) else {
        return String::new();
    };
    match last.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mock_model_names_parse() {
        assert_eq!(parse_model("mock-echo"), Some((Scenario::Echo, None)));
        assert_eq!(parse_model("mock-big@12"), Some((Scenario::Big, Some(12))));
        assert_eq!(
            parse_model("mock-slow-250"),
            Some((Scenario::Slow(250), None))
        );
        assert_eq!(parse_model("mock-slow-x"), None);
        assert_eq!(parse_model("mock-echo@x"), None);
        assert_eq!(parse_model("gpt-4o"), None);
        assert_eq!(parse_model(&format!("mock-big@{}", SIZE_MAX + 1)), None);
    }

    #[test]
    fn mock_sizes_cycle_and_truncate_by_chars() {
        assert_eq!(sized("ab😀", Some(5), "x"), "ab😀ab");
        assert_eq!(sized("abc", Some(2), "x"), "ab");
        assert_eq!(sized("", Some(3), "xy"), "xyx");
        assert_eq!(sized("abc", None, "x"), "abc");
    }

    #[test]
    fn mock_arguments_follow_required_properties() {
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "optional": {"type": "string"}
            },
            "required": ["city", "days", "unit"]
        });
        assert_eq!(
            arguments_for(&schema),
            json!({"city": "mock", "days": 1, "unit": "c"})
        );
        assert_eq!(arguments_for(&Value::Null), json!({}));
    }

    #[test]
    fn mock_reads_each_protocol_request() {
        let chat = json!({
            "model": "mock-echo",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "reply"},
                {"role": "user", "content": [{"type": "text", "text": "last"}]}
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}
        });
        let r = inspect(Protocol::OpenAiChat, &chat).unwrap();
        assert_eq!(r.user_text, "last");
        assert_eq!(r.input_chars, 3 + 5 + 5 + 4);
        assert_eq!(r.choice.as_deref(), Some("f"));
        assert_eq!(r.tools.len(), 1);

        let responses = json!({"model": "m", "instructions": "be", "input": "hello",
            "include": ["reasoning.encrypted_content"],
            "tools": [{"type": "function", "name": "g", "parameters": {}}]});
        let r = inspect(Protocol::OpenAiResponses, &responses).unwrap();
        assert_eq!(r.user_text, "hello");
        assert_eq!(r.input_chars, 7);
        assert!(r.encrypted_reasoning);
        assert_eq!(r.tools[0].0, "g");

        let anthropic = json!({"model": "m", "system": [{"type": "text", "text": "s"}],
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "h", "input_schema": {}}],
            "tool_choice": {"type": "tool", "name": "h"}});
        let r = inspect(Protocol::Anthropic, &anthropic).unwrap();
        assert_eq!((r.user_text.as_str(), r.input_chars), ("hi", 3));
        assert_eq!(r.choice.as_deref(), Some("h"));
    }

    #[test]
    fn mock_usage_is_a_quarter_of_the_characters() {
        let body = json!({"model": "mock-reasoning@9", "messages": [
            {"role": "user", "content": "abcde"}
        ]});
        let Behaviour::Stream(plan) = decide(Protocol::OpenAiChat, body.to_string().as_bytes())
        else {
            panic!("expected a stream");
        };
        assert_eq!(
            plan.tokens,
            Tokens {
                input: 2,
                output: 2,
                reasoning: 3
            }
        );
    }

    #[test]
    fn mock_unknown_models_and_bad_bodies_are_errors() {
        let status = |body: &[u8]| match decide(Protocol::Anthropic, body) {
            Behaviour::Status { status, .. } | Behaviour::Gateway { status } => status,
            Behaviour::Stream(_) => 200,
        };
        assert_eq!(status(br#"{"model": "claude"}"#), 404);
        assert_eq!(status(b"not json"), 400);
        assert_eq!(status(br#"{"messages": []}"#), 400);
        assert_eq!(status(br#"{"model": "mock-tool"}"#), 400);
        assert_eq!(status(br#"{"model": "mock-429"}"#), 429);
        assert_eq!(status(br#"{"model": "mock-500"}"#), 500);
        assert!(matches!(
            decide(Protocol::OpenAiChat, br#"{"model": "mock-502-gateway"}"#),
            Behaviour::Gateway { status: 502 }
        ));
        assert_eq!(status(br#"{"model": "mock-echo"}"#), 200);
    }
}
