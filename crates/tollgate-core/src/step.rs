//! The step: what one model response became, as stored and shown (ST-8).
//!
//! This is backend data, not a public reply: a loop that adopts it must hide reasoning and
//! authorize tools itself.

use serde::{Deserialize, Serialize};

/// A half-open range of UTF-16 code units `[start, end)` into [`Step::text`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Utf16Range {
    /// First code unit.
    pub start: u64,
    /// One past the last code unit.
    pub end: u64,
}

/// One ordered block of a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Visible text; adjacent text deltas are concatenated into one block.
    Text {
        /// Position among all blocks.
        order: u32,
        /// This block's text: the characters of [`Step::text`] at `range`.
        text: String,
        /// Where the text lies in [`Step::text`], in UTF-16 code units.
        range: Utf16Range,
    },
    /// A refusal message (OpenAI `refusal`).
    Refusal {
        /// Position among all blocks.
        order: u32,
        /// The refusal text.
        text: String,
    },
    /// Reasoning: readable text and/or opaque (encrypted, redacted) data, with a signature.
    Reasoning {
        /// Position among all blocks.
        order: u32,
        /// Readable reasoning text, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// Opaque data (encrypted content, redacted thinking), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        opaque: Option<String>,
        /// Signature, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// A tool call the model asked for. Never executed here.
    ToolCall {
        /// Position among all blocks.
        order: u32,
        /// Id, name and parsed arguments, flattened into the block's JSON.
        #[serde(flatten)]
        call: ToolCall,
    },
    /// A provider block kept verbatim.
    Provider {
        /// Position among all blocks.
        order: u32,
        /// The block exactly as the provider sent it, never interpreted.
        block: serde_json::Value,
    },
}

impl Block {
    /// The block's order index.
    pub fn order(&self) -> u32 {
        match self {
            Block::Text { order, .. }
            | Block::Refusal { order, .. }
            | Block::Reasoning { order, .. }
            | Block::ToolCall { order, .. }
            | Block::Provider { order, .. } => *order,
        }
    }
}

/// A tool call with parsed arguments. Malformed arguments become `{}` with `malformed: true`;
/// the raw text is never kept (ST-9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider call id.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Parsed JSON arguments, or `{}` when malformed.
    pub input: serde_json::Value,
    /// Whether the arguments failed to parse as a JSON object.
    pub malformed: bool,
}

/// One structured model response.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Step {
    /// Ordered blocks, `order` = index in this vector.
    pub blocks: Vec<Block>,
    /// Visible text only, concatenated.
    pub text: String,
    /// Tool calls in block order.
    pub tool_calls: Vec<ToolCall>,
    /// Reasoning blocks (copies of the `Reasoning` blocks).
    pub reasoning: Vec<Block>,
    /// Provider blocks (copies of the `Provider` blocks).
    pub provider_blocks: Vec<Block>,
    /// The provider's stop reason, verbatim, or none.
    pub stop: Option<String>,
}
