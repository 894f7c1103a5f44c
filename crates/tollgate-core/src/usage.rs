//! Token usage by class. The classes are disjoint: `input` excludes cached tokens and `output`
//! excludes reasoning tokens, so a price per class can be applied to each count exactly once.

use serde::{Deserialize, Serialize};

/// Token counts by disjoint class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Uncached input tokens.
    pub input: u64,
    /// Visible output tokens (excluding reasoning).
    pub output: u64,
    /// Input tokens read from the provider's prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the provider's prompt cache.
    pub cache_write: u64,
    /// Reasoning (thinking) tokens.
    pub reasoning: u64,
}

impl Usage {
    /// All classes zero.
    pub const ZERO: Usage = Usage {
        input: 0,
        output: 0,
        cache_read: 0,
        cache_write: 0,
        reasoning: 0,
    };

    /// Whether every class is zero.
    pub fn is_zero(&self) -> bool {
        *self == Self::ZERO
    }

    /// Sum of all classes (saturating).
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
            .saturating_add(self.reasoning)
    }
}
