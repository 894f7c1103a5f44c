//! The provider client trait the runners call.

use crate::protocol::Protocol;
use crate::status::StatusClass;
use async_trait::async_trait;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use tollgate_core::event::ProviderEvent;
use tollgate_core::message::{Message, Temperature, ToolChoice, ToolSpec};

/// A stream of normalized events. Transport and protocol failures arrive as
/// [`ProviderEvent::Error`]; the stream then ends.
pub type EventStream = BoxStream<'static, ProviderEvent>;

/// What a client says about itself; checked when a runner is constructed (SC-7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientDescriptor {
    /// Wire protocol.
    pub protocol: Protocol,
    /// Attempts per send the client may make. Runners accept exactly 1.
    pub max_attempts: u32,
    /// Whether the client may fall back to another model or endpoint. Runners accept only false.
    pub fallback: bool,
}

impl ClientDescriptor {
    /// Whether this client is an explicit single-shot client (one attempt, no fallback).
    pub fn is_single_shot(&self) -> bool {
        self.max_attempts == 1 && !self.fallback
    }
}

/// One provider request, fully resolved from the host's immutable config snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderRequest {
    /// Model name.
    pub model: String,
    /// System prompt.
    pub system: Option<String>,
    /// Conversation.
    pub messages: Vec<Message>,
    /// Output token cap.
    pub max_tokens: u32,
    /// Sampling temperature, when the profile sets one.
    pub temperature: Option<Temperature>,
    /// Host-authorized tools.
    pub tools: Vec<ToolSpec>,
    /// Explicit tool choice.
    pub tool_choice: Option<ToolChoice>,
    /// Prompt-cache override (`None` = the policy decides).
    pub cache: Option<bool>,
    /// JSON output contract `(name, schema)` for JSON calls.
    pub json_schema: Option<(String, serde_json::Value)>,
}

/// Why a send failed before any event was produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Refused before network access: the request is outside the adapter's support matrix.
    /// Nothing was sent.
    #[error("unsupported request: {0}")]
    Unsupported(String),
    /// The connection could not be established; nothing reached the provider.
    #[error("connect failed: {0}")]
    Connect(String),
    /// An HTTP error status answered before any stream. `class` says whether it proves the
    /// request was not processed (a provider's rejection, settled at zero) or is ambiguous (a
    /// gateway's answer or a server error: the provider may have billed it) — see
    /// [`crate::status::classify`]. `provider_ref` is the request id header when present.
    #[error("provider returned HTTP {status}")]
    Status {
        /// HTTP status.
        status: u16,
        /// Provider request id, if any.
        provider_ref: Option<String>,
        /// What the status proves about the request.
        class: StatusClass,
    },
    /// The request may have been sent but no response arrived (timeout, reset, abort).
    #[error("no response: {0}")]
    NoResponse(String),
}

/// A single-shot provider client.
#[async_trait]
pub trait ProviderClient: Send + Sync {
    /// What the client is (checked at runner construction).
    fn descriptor(&self) -> ClientDescriptor;

    /// Checks the request against the adapter's support matrix. Must be called, and is called by
    /// [`ProviderClient::send`], before any network access.
    ///
    /// # Errors
    /// [`SendError::Unsupported`] with the reason.
    fn check(&self, request: &ProviderRequest) -> Result<(), SendError>;

    /// Sends the request once. Cancelling `cancel` stops reading; events already produced stay.
    ///
    /// # Errors
    /// See [`SendError`]; errors after the stream started arrive as events.
    async fn send(
        &self,
        request: ProviderRequest,
        cancel: CancellationToken,
    ) -> Result<EventStream, SendError>;
}
