//! The adapters' support matrix: what each protocol and model family accepts. A request outside
//! it is refused with [`SendError::Unsupported`] **before any network access** (SC-5, TC-2).
//!
//! The matrix is deliberately bounded: it admits only what the providers document.
//!
//! | protocol | model family | temperature | tool choice modes | reasoning |
//! |---|---|---|---|---|
//! | any | `mock-*` | 0..=2 | auto, any, none, tool | yes |
//! | openai-chat, openai-responses | `o1*`, `o3*`, `o4*`, `gpt-5*` | not accepted | auto, any, none, tool | yes |
//! | openai-chat, openai-responses | other | 0..=2 | auto, any, none, tool | no |
//! | anthropic | `claude-3-*` except `claude-3-7*` | 0..=1 | auto, any, none, tool | no |
//! | anthropic | other | 0..=1 | auto, any, none, tool | yes |
//!
//! Reasons never contain message content.

use crate::client::{ProviderRequest, SendError};
use crate::protocol::Protocol;
use rust_decimal::Decimal;
use serde_json::Value;
use tollgate_core::message::{Temperature, ToolChoice};

/// Every tool choice mode (`ToolChoice::mode` names).
pub const TOOL_CHOICE_MODES_ALL: &[&str] = &["auto", "any", "none", "tool"];

/// What one protocol and model family accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupportMatrix {
    /// Inclusive temperature range, or `None` when the family accepts no temperature.
    pub temperature: Option<(Decimal, Decimal)>,
    /// Accepted tool choice modes ([`ToolChoice::mode`] names).
    pub tool_choice_modes: &'static [&'static str],
    /// Whether the family produces reasoning (thinking) output.
    pub reasoning: bool,
}

/// Whether `model` is a mock provider model (`mock-*`).
pub fn is_mock_model(model: &str) -> bool {
    model.starts_with("mock-")
}

/// Whether `model` is an OpenAI reasoning model (`o1*`, `o3*`, `o4*`, `gpt-5*`): no temperature,
/// `max_completion_tokens` only.
pub fn is_openai_reasoning_model(model: &str) -> bool {
    ["o1", "o3", "o4", "gpt-5"]
        .iter()
        .any(|p| model.starts_with(p))
}

/// The support matrix of `protocol` for `model`.
pub fn matrix(protocol: Protocol, model: &str) -> SupportMatrix {
    let zero_to_two = Some((Decimal::ZERO, Decimal::TWO));
    if is_mock_model(model) {
        return SupportMatrix {
            temperature: zero_to_two,
            tool_choice_modes: TOOL_CHOICE_MODES_ALL,
            reasoning: true,
        };
    }
    match protocol {
        Protocol::OpenAiChat | Protocol::OpenAiResponses => {
            let reasoning = is_openai_reasoning_model(model);
            SupportMatrix {
                temperature: if reasoning { None } else { zero_to_two },
                tool_choice_modes: TOOL_CHOICE_MODES_ALL,
                reasoning,
            }
        }
        Protocol::Anthropic => SupportMatrix {
            temperature: Some((Decimal::ZERO, Decimal::ONE)),
            tool_choice_modes: TOOL_CHOICE_MODES_ALL,
            reasoning: !model.starts_with("claude-3-") || model.starts_with("claude-3-7"),
        },
    }
}

/// Checks `req` against the support matrix of `protocol`, before any network access.
///
/// # Errors
/// [`SendError::Unsupported`] when the temperature is outside the family's range (or not
/// accepted at all), when a tool choice is set without tools, when its mode is not supported, or
/// when a forced tool is not among `req.tools` (TC-2).
pub fn check(protocol: Protocol, req: &ProviderRequest) -> Result<(), SendError> {
    let m = matrix(protocol, &req.model);
    if let Some(t) = req.temperature {
        check_temperature(protocol, t, &m)?;
    }
    if let Some(choice) = &req.tool_choice {
        check_tool_choice(protocol, choice, req, &m)?;
    }
    Ok(())
}

fn check_temperature(
    protocol: Protocol,
    t: Temperature,
    m: &SupportMatrix,
) -> Result<(), SendError> {
    match m.temperature {
        None => Err(SendError::Unsupported(format!(
            "temperature is not accepted by this {protocol} model family"
        ))),
        Some((min, max)) if t.decimal() < min || t.decimal() > max => Err(SendError::Unsupported(
            format!("temperature {t} is outside the supported range {min}..={max} for {protocol}"),
        )),
        Some(_) => Ok(()),
    }
}

fn check_tool_choice(
    protocol: Protocol,
    choice: &ToolChoice,
    req: &ProviderRequest,
    m: &SupportMatrix,
) -> Result<(), SendError> {
    if req.tools.is_empty() {
        return Err(SendError::Unsupported(
            "tool_choice is set but the request has no tools".into(),
        ));
    }
    if !m.tool_choice_modes.contains(&choice.mode()) {
        return Err(SendError::Unsupported(format!(
            "tool_choice mode {} is not supported by {protocol}",
            choice.mode()
        )));
    }
    if let ToolChoice::Tool { name } = choice {
        if !req.tools.iter().any(|t| &t.name == name) {
            return Err(SendError::Unsupported(
                "tool_choice names a tool that is not among the request's tools".into(),
            ));
        }
    }
    Ok(())
}

/// A temperature as a JSON number, through its exact decimal text (`0.7` stays `0.7`).
pub(crate) fn temperature_json(t: Temperature) -> Value {
    serde_json::from_str::<Value>(&t.to_string())
        .ok()
        .filter(Value::is_number)
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_families() {
        assert!(is_openai_reasoning_model("o3-mini"));
        assert!(is_openai_reasoning_model("gpt-5.1"));
        assert!(!is_openai_reasoning_model("gpt-4o"));
        assert!(matrix(Protocol::OpenAiChat, "o4-mini")
            .temperature
            .is_none());
        assert!(matrix(Protocol::Anthropic, "claude-3-7-sonnet-latest").reasoning);
        assert!(!matrix(Protocol::Anthropic, "claude-3-5-haiku-latest").reasoning);
    }

    #[test]
    fn temperature_json_is_exact() {
        let t = Temperature::parse("0.7").unwrap();
        assert_eq!(temperature_json(t).to_string(), "0.7");
        let t = Temperature::parse("1").unwrap();
        assert_eq!(temperature_json(t).to_string(), "1");
    }
}
