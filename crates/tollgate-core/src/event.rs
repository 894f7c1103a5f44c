//! The normalized provider event model every adapter produces and the step collector consumes.
//!
//! Adapters translate each wire format (OpenAI Chat Completions, OpenAI Responses, Anthropic
//! Messages) into this one sequence. Events carry content; they must never be logged.

use crate::usage::Usage;
use serde::{Deserialize, Serialize};

/// One normalized event of a provider stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProviderEvent {
    /// The provider's own id of this response (request id, message id, response id).
    ProviderRef {
        /// The provider's id as sent; the first one seen becomes the call's provider reference.
        id: String,
    },
    /// A piece of visible text.
    TextDelta {
        /// The next piece of visible text; counts toward `max_output_chars`.
        text: String,
    },
    /// A piece of a refusal message (OpenAI `refusal` deltas). Counts as content.
    RefusalDelta {
        /// The next piece of the refusal; counts toward `max_output_chars`.
        text: String,
    },
    /// A piece of readable reasoning (thinking) text.
    ReasoningDelta {
        /// The next piece of reasoning; counts toward `max_reasoning_chars`.
        text: String,
    },
    /// The signature of the current reasoning block (Anthropic `signature_delta`).
    ReasoningSignature {
        /// Opaque, kept verbatim on the open reasoning block; counts toward `max_reasoning_chars`.
        signature: String,
    },
    /// A reasoning block whose content is opaque: Anthropic `redacted_thinking` data or an OpenAI
    /// reasoning item's `encrypted_content`. Counts toward `max_reasoning_chars`.
    ReasoningOpaque {
        /// The opaque data.
        data: String,
    },
    /// A tool call starts. `index` identifies it among parallel calls of the same response.
    ToolCallStart {
        /// Position among the response's tool calls (provider index).
        index: u32,
        /// The provider's call id.
        id: String,
        /// The tool's name.
        name: String,
    },
    /// A fragment of a tool call's JSON arguments.
    ToolCallArgsDelta {
        /// The call's index.
        index: u32,
        /// The fragment.
        delta: String,
    },
    /// A tool call is complete.
    ToolCallEnd {
        /// The call's index.
        index: u32,
    },
    /// A content block of a type this adapter does not interpret, kept verbatim.
    ProviderBlock {
        /// The block as the provider sent it.
        block: serde_json::Value,
    },
    /// The provider's stop / finish reason, verbatim (`stop`, `end_turn`, `tool_calls`, ...).
    Stop {
        /// The reason exactly as sent; a second `Stop` in one stream is `stop_conflict`.
        reason: String,
    },
    /// Token usage. `terminal` is true only for the final, complete and exact count (OpenAI's last
    /// chunk, `response.completed`, Anthropic's `message_delta`); an early partial count is not
    /// terminal, and neither is a final count that is inexact — a required count missing, a count
    /// that is not a non-negative integer, a detail larger than its total (SC-95). Only terminal
    /// usage is settled. A later usage event replaces an earlier one.
    Usage {
        /// The counts.
        usage: Usage,
        /// Whether this is the final count.
        terminal: bool,
    },
    /// The provider reported an error inside the stream (e.g. Anthropic `overloaded_error`,
    /// OpenAI `response.failed`), or the transport failed mid-stream.
    Error {
        /// Error type (provider's own, or `connection_closed`, `timeout`, `malformed_event`).
        kind: String,
        /// Human-readable message (provider text; not echoed into logs).
        message: String,
    },
    /// The stream ended cleanly (`[DONE]`, `message_stop`, `response.completed`).
    Done,
}

/// Error kinds the transport and adapters produce themselves.
pub mod error_kind {
    /// The connection closed before the protocol's end marker.
    pub const CONNECTION_CLOSED: &str = "connection_closed";
    /// The run timeout or deadline expired while reading.
    pub const TIMEOUT: &str = "timeout";
    /// The caller aborted while reading.
    pub const ABORTED: &str = "aborted";
    /// An event could not be parsed.
    pub const MALFORMED_EVENT: &str = "malformed_event";
}
