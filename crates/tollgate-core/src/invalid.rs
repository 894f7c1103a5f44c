//! The closed set of reasons an output is invalid (spec: invalid-output-reason).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why the collector rejected a step. Only the **first** reason is reported (ST-20). It names a
/// check, never content, and is carried only by the run's own response: it is not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidReason {
    /// Text and tool/provider-block JSON exceeded `max_output_chars`.
    OutputChars,
    /// Reasoning exceeded `max_reasoning_chars`.
    ReasoningChars,
    /// Text could not be assembled (e.g. JSON output that does not parse or match its schema).
    TextMalformed,
    /// A tool call was inconsistent (unknown index, missing name, arguments after end, ...).
    ToolCall,
    /// A content block was malformed.
    BlockMalformed,
    /// More than one, or a contradictory, stop.
    StopConflict,
    /// An event arrived that the protocol does not allow at that point.
    EventType,
    /// More than `max_consecutive_reasoning` reasoning events with no text or tool call.
    ReasoningLoop,
}

/// Every reason, in declaration order (`INVALID_OUTPUT_REASONS`).
pub const INVALID_OUTPUT_REASONS: [InvalidReason; 8] = [
    InvalidReason::OutputChars,
    InvalidReason::ReasoningChars,
    InvalidReason::TextMalformed,
    InvalidReason::ToolCall,
    InvalidReason::BlockMalformed,
    InvalidReason::StopConflict,
    InvalidReason::EventType,
    InvalidReason::ReasoningLoop,
];

impl InvalidReason {
    /// The reason's wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::OutputChars => "output_chars",
            Self::ReasoningChars => "reasoning_chars",
            Self::TextMalformed => "text_malformed",
            Self::ToolCall => "tool_call",
            Self::BlockMalformed => "block_malformed",
            Self::StopConflict => "stop_conflict",
            Self::EventType => "event_type",
            Self::ReasoningLoop => "reasoning_loop",
        }
    }
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn st_20_reason_names_are_the_closed_set() {
        let names: Vec<_> = INVALID_OUTPUT_REASONS.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "output_chars",
                "reasoning_chars",
                "text_malformed",
                "tool_call",
                "block_malformed",
                "stop_conflict",
                "event_type",
                "reasoning_loop"
            ]
        );
        for r in INVALID_OUTPUT_REASONS {
            assert_eq!(
                serde_json::to_value(r).ok(),
                Some(serde_json::Value::String(r.as_str().into()))
            );
        }
    }
}
