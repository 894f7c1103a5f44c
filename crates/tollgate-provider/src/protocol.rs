//! The wire protocols tollgate speaks.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A provider wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Protocol {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`).
    #[serde(rename = "openai-chat")]
    OpenAiChat,
    /// OpenAI Responses (`POST /v1/responses`).
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    /// Anthropic Messages (`POST /v1/messages`).
    #[serde(rename = "anthropic")]
    Anthropic,
}

impl Protocol {
    /// The protocol's name as used in config and on the command line.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::OpenAiChat => "openai-chat",
            Self::OpenAiResponses => "openai-responses",
            Self::Anthropic => "anthropic",
        }
    }

    /// The request path below the base URL.
    pub fn path(&self) -> &'static str {
        match self {
            Self::OpenAiChat => "/v1/chat/completions",
            Self::OpenAiResponses => "/v1/responses",
            Self::Anthropic => "/v1/messages",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "openai-chat" => Ok(Self::OpenAiChat),
            "openai-responses" => Ok(Self::OpenAiResponses),
            "anthropic" => Ok(Self::Anthropic),
            other => Err(format!(
                "unknown protocol {other:?} (openai-chat, openai-responses, anthropic)"
            )),
        }
    }
}
