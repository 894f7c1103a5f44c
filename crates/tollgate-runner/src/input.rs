//! Loaded input: its checks (`max_input_chars`, `max_request_chars`, SC-11, and the context
//! window, so that a request the provider would reject is never sent, H-6) and the provider
//! request built from it and the config snapshot.

use tollgate_core::config::{CallConfig, MESSAGES_MAX};
use tollgate_core::message::{Message, Role};
use tollgate_core::request_fit;
use tollgate_core::state::CallKind;
use tollgate_provider::ProviderRequest;

/// Average characters per token used to estimate whether a request fits the context window.
/// An estimate, not a bound: holds use the worst case instead.
pub const CHARS_PER_TOKEN_ESTIMATE: u64 = 4;

/// Why loaded input cannot be sent. Names the check, never the content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// No messages.
    #[error("input has no messages")]
    Empty,
    /// More than [`MESSAGES_MAX`] messages, the count the worst-case hold assumes.
    #[error("input has more than {MESSAGES_MAX} messages")]
    TooManyMessages,
    /// A non-text message on a text/JSON call (SC-11).
    #[error("only text user/assistant messages are supported")]
    NonText,
    /// The last message is not the user's.
    #[error("the last message must be the user's")]
    LastNotUser,
    /// Over `max_input_chars`.
    #[error("input has {chars} chars, more than max_input_chars {max}")]
    InputChars {
        /// Counted.
        chars: u64,
        /// Limit.
        max: u64,
    },
    /// Over `max_request_chars`.
    #[error("request has {chars} chars, more than max_request_chars {max}")]
    RequestChars {
        /// Counted.
        chars: u64,
        /// Limit.
        max: u64,
    },
    /// Does not fit the context window: the provider would reject it (H-6).
    #[error("request of about {tokens} tokens does not fit the context window (limit {limit})")]
    ContextWindow {
        /// Estimate.
        tokens: u64,
        /// Most input tokens the request-fit budget leaves for this window and `max_tokens`.
        limit: u64,
    },
}

/// Checks loaded input against the snapshot.
///
/// # Errors
/// The first failed check.
pub fn check_input(config: &CallConfig, messages: &[Message]) -> Result<(), InputError> {
    if messages.is_empty() {
        return Err(InputError::Empty);
    }
    if messages.len() as u64 > MESSAGES_MAX {
        return Err(InputError::TooManyMessages);
    }
    let text_only = matches!(config.kind, CallKind::Text | CallKind::Json);
    if text_only && !messages.iter().all(Message::is_text_only) {
        return Err(InputError::NonText);
    }
    if text_only && messages.last().map(|m| m.role) != Some(Role::User) {
        return Err(InputError::LastNotUser);
    }
    let chars: u64 = messages.iter().map(Message::chars_utf16).sum();
    if chars > config.max_input_chars {
        return Err(InputError::InputChars {
            chars,
            max: config.max_input_chars,
        });
    }
    let request_chars = chars + config.fixed_request_chars();
    if let Some(max) = config.max_request_chars {
        if request_chars > max {
            return Err(InputError::RequestChars {
                chars: request_chars,
                max,
            });
        }
    }
    if let Some(window) = config.context_window_tokens {
        let tokens = request_chars.div_ceil(CHARS_PER_TOKEN_ESTIMATE);
        let fit = request_fit::request_fit(window, u64::from(config.max_tokens));
        if tokens > fit.input_tokens_max {
            return Err(InputError::ContextWindow {
                tokens,
                limit: fit.input_tokens_max,
            });
        }
    }
    Ok(())
}

/// The provider request of a snapshot and its input.
pub fn provider_request(config: &CallConfig, messages: Vec<Message>) -> ProviderRequest {
    ProviderRequest {
        model: config.model.clone(),
        system: config.system.clone(),
        messages,
        max_tokens: config.max_tokens,
        temperature: config.temperature,
        tools: config.tools.clone(),
        tool_choice: config.tool_choice.clone(),
        cache: config.cache,
        json_schema: config
            .output
            .as_ref()
            .map(|o| (o.name.clone(), o.schema.clone())),
    }
}

/// A request with one placeholder message: used to check the snapshot against the client's
/// support matrix before any claim (SC-5, TC-2).
pub fn probe_request(config: &CallConfig) -> ProviderRequest {
    provider_request(config, vec![Message::text(Role::User, "")])
}
