//! Conversation messages, tool specs and tool choice: what a provider request is made of.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The caller's side; a text or JSON call's last message must be the user's.
    User,
    /// The model.
    Assistant,
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Plain text: the only part text and JSON calls accept (SC-11).
    Text {
        /// The text as given; counted in UTF-16 code units against `max_input_chars`.
        text: String,
    },
    /// A tool call the assistant made earlier (step runner input only).
    ToolCall {
        /// Provider call id.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments.
        input: serde_json::Value,
    },
    /// The result of a tool call (step runner input only).
    ToolResult {
        /// The call id it answers.
        call_id: String,
        /// The result as text.
        content: String,
        /// Whether the tool failed.
        #[serde(default)]
        is_error: bool,
    },
}

/// One message: a role and its parts. Deserializes from `{"role", "content": "text"}` too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// What was said.
    #[serde(deserialize_with = "content::deserialize")]
    pub content: Vec<Part>,
}

mod content {
    use super::Part;
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Part>, D::Error> {
        Ok(match Content::deserialize(d)? {
            Content::Text(text) => vec![Part::Text { text }],
            Content::Parts(parts) => parts,
        })
    }
}

impl Message {
    /// A text message.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: vec![Part::Text { text: text.into() }],
        }
    }

    /// Whether every part is text (the text/JSON runner accepts nothing else, SC-11).
    pub fn is_text_only(&self) -> bool {
        self.content.iter().all(|p| matches!(p, Part::Text { .. }))
    }

    /// Characters of content, counted in UTF-16 code units (text, tool inputs as JSON, results).
    pub fn chars_utf16(&self) -> u64 {
        self.content
            .iter()
            .map(|p| match p {
                Part::Text { text } => utf16_len(text),
                Part::ToolCall { id, name, input } => {
                    utf16_len(id) + utf16_len(name) + utf16_len(&input.to_string())
                }
                Part::ToolResult {
                    call_id, content, ..
                } => utf16_len(call_id) + utf16_len(content),
            })
            .sum()
    }
}

/// Length of `s` in UTF-16 code units: the unit of every `max_*_chars` limit.
pub fn utf16_len(s: &str) -> u64 {
    s.chars().map(|c| c.len_utf16() as u64).sum()
}

/// A tool the host authorized for a step (ST-3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name (unique within a profile).
    pub name: String,
    /// Description for the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: serde_json::Value,
}

/// Explicit tool choice (TC-1). Absent and explicit `auto` are different bindings (TC-4).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The model must call some tool.
    Any,
    /// The model must not call a tool.
    None,
    /// The model must call this tool.
    Tool {
        /// The tool's name.
        name: String,
    },
}

impl ToolChoice {
    /// The choice's mode name, as used in support matrices.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Any => "any",
            Self::None => "none",
            Self::Tool { .. } => "tool",
        }
    }
}

/// Sampling temperature as an exact decimal (at most 2 fraction digits), so that it digests
/// canonically and round-trips unchanged through storage (SC-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value", into = "String")]
pub struct Temperature(Decimal);

/// Most fraction digits of a temperature.
pub const TEMPERATURE_SCALE_MAX: u32 = 2;

impl Temperature {
    /// Parses a temperature from its decimal text.
    ///
    /// # Errors
    /// Not a decimal, negative, or more than [`TEMPERATURE_SCALE_MAX`] fraction digits.
    pub fn parse(text: &str) -> Result<Self, String> {
        let d: Decimal = text
            .trim()
            .parse()
            .map_err(|_| "temperature is not a decimal number".to_string())?;
        Self::from_decimal(d)
    }

    fn from_decimal(d: Decimal) -> Result<Self, String> {
        let d = d.normalize();
        if d.is_sign_negative() && !d.is_zero() {
            return Err("temperature must not be negative".into());
        }
        if d.scale() > TEMPERATURE_SCALE_MAX {
            return Err(format!(
                "temperature has more than {TEMPERATURE_SCALE_MAX} fraction digits"
            ));
        }
        Ok(Self(d))
    }

    /// The value.
    pub fn decimal(&self) -> Decimal {
        self.0
    }
}

impl TryFrom<serde_json::Value> for Temperature {
    type Error = String;
    fn try_from(value: serde_json::Value) -> Result<Self, Self::Error> {
        match value {
            // A JSON/TOML float is read through its shortest decimal text (0.2 → "0.2").
            serde_json::Value::Number(n) => Self::parse(&n.to_string()),
            serde_json::Value::String(s) => Self::parse(&s),
            _ => Err("temperature must be a number".into()),
        }
    }
}

impl From<Temperature> for String {
    fn from(value: Temperature) -> String {
        value.0.to_string()
    }
}

impl std::fmt::Display for Temperature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Nucleus sampling (`top_p`) as an exact decimal from 0 to 1 with at most
/// [`TOP_P_SCALE_MAX`] fraction digits, so that it digests canonically (SC-211).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value", into = "String")]
pub struct TopP(Decimal);

/// Most fraction digits of a `top_p`.
pub const TOP_P_SCALE_MAX: u32 = 4;

impl TopP {
    /// Parses a `top_p` from its decimal text.
    ///
    /// # Errors
    /// Not a decimal, outside 0..=1, or more than [`TOP_P_SCALE_MAX`] fraction digits.
    pub fn parse(text: &str) -> Result<Self, String> {
        let d: Decimal = text
            .trim()
            .parse()
            .map_err(|_| "top_p is not a decimal number".to_string())?;
        let d = d.normalize();
        if d.is_sign_negative() && !d.is_zero() || d > Decimal::ONE {
            return Err("top_p must be between 0 and 1".into());
        }
        if d.scale() > TOP_P_SCALE_MAX {
            return Err(format!(
                "top_p has more than {TOP_P_SCALE_MAX} fraction digits"
            ));
        }
        Ok(Self(d))
    }

    /// The value.
    pub fn decimal(&self) -> Decimal {
        self.0
    }
}

impl TryFrom<serde_json::Value> for TopP {
    type Error = String;
    fn try_from(value: serde_json::Value) -> Result<Self, Self::Error> {
        match value {
            serde_json::Value::Number(n) => Self::parse(&n.to_string()),
            serde_json::Value::String(s) => Self::parse(&s),
            _ => Err("top_p must be a number".into()),
        }
    }
}

impl From<TopP> for String {
    fn from(value: TopP) -> String {
        value.0.to_string()
    }
}

impl std::fmt::Display for TopP {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_content_accepts_string_or_parts() {
        let m: Message = serde_json::from_str(r#"{"role":"user","content":"hi"}"#)
            .unwrap_or_else(|_| Message::text(Role::Assistant, "wrong"));
        assert_eq!(m, Message::text(Role::User, "hi"));
        let m: Result<Message, _> = serde_json::from_str(
            r#"{"role":"assistant","content":[{"type":"tool_call","id":"c1","name":"f","input":{}}]}"#,
        );
        assert!(m.is_ok_and(|m| !m.is_text_only()));
    }

    #[test]
    fn top_p_is_an_exact_fraction() {
        assert_eq!(TopP::parse("0.95").unwrap().to_string(), "0.95");
        assert_eq!(TopP::parse("1.0").unwrap().to_string(), "1");
        assert!(TopP::parse("1.01").is_err());
        assert!(TopP::parse("-0.1").is_err());
        assert!(TopP::parse("0.12345").is_err());
        let t: TopP = serde_json::from_str("0.9").unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"0.9\"");
    }

    #[test]
    fn utf16_counts_astral_as_two() {
        assert_eq!(utf16_len("a😀"), 3);
    }

    #[test]
    fn temperature_is_exact() {
        let t: Result<Temperature, _> = serde_json::from_str("0.2");
        assert_eq!(t.map(|t| t.to_string()).ok(), Some("0.2".into()));
        assert!(Temperature::parse("0.123").is_err());
        assert!(Temperature::parse("-1").is_err());
    }
}
