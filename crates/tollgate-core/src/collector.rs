//! The step collector: consumes normalized provider events and builds the [`Step`] (ST-8),
//! enforcing the output limits and reporting the **first** invalid reason (ST-20..ST-23), and
//! classifying refusal evidence (RF-1, RF-2).
//!
//! Character limits count UTF-16 code units.

use crate::event::ProviderEvent;
use crate::invalid::InvalidReason;
use crate::step::Step;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};

/// Hard ceiling of `max_reasoning_chars` (ST-21).
pub const MAX_REASONING_CHARS_CEILING: u64 = 1_000_000;

/// Limits the collector enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectorLimits {
    /// Text plus tool-call / provider-block JSON, in UTF-16 code units.
    pub max_output_chars: u64,
    /// Reasoning text plus opaque reasoning data, in UTF-16 code units; at most
    /// [`MAX_REASONING_CHARS_CEILING`].
    pub max_reasoning_chars: u64,
    /// More than this many consecutive reasoning events with no text or tool call is a
    /// `reasoning_loop` (ST-22). `None` = unchecked.
    pub max_consecutive_reasoning: Option<u32>,
}

/// Limits that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// `max_reasoning_chars` above the ceiling.
    #[error("max_reasoning_chars must be at most {MAX_REASONING_CHARS_CEILING}")]
    ReasoningCharsTooLarge,
}

/// Whether the reader should keep reading the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep reading.
    Continue,
    /// Stop reading now (reasoning loop, ST-22). Events pushed after this are ignored.
    Stop,
}

/// A stream failure (transport or provider error event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamError {
    /// Error type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Message (provider text; never logged).
    pub message: String,
}

/// A verified refusal proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalProof {
    /// RF-2: provider reference, no content, no stop, no usage beyond zero, no stream failure,
    /// clean end.
    PreStream,
    /// RF-1: an Anthropic `refusal` stop with no content at all (not even whitespace), a provider
    /// reference, exactly one stop, no stream failure, clean end.
    EmptyRefusal,
}

/// What the collector made of a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// The step (possibly partial when invalid or cut).
    pub step: Step,
    /// The last usage seen, if any.
    pub usage: Option<Usage>,
    /// Whether `usage` is the terminal (final) count.
    pub usage_terminal: bool,
    /// Provider reference, if any.
    pub provider_ref: Option<String>,
    /// The first invalid reason, if any.
    pub invalid_reason: Option<InvalidReason>,
    /// The stream failure, if any (the first one).
    pub stream_error: Option<StreamError>,
    /// Whether the protocol's clean end marker arrived.
    pub done: bool,
    /// Whether the collector stopped reading early (reasoning loop).
    pub stopped_early: bool,
    /// A verified refusal proof, if the evidence is exactly one.
    pub refusal: Option<RefusalProof>,
}

impl Collected {
    /// Terminal usage, when it arrived (the only usage a settlement may use).
    pub fn terminal_usage(&self) -> Option<Usage> {
        if self.usage_terminal {
            self.usage
        } else {
            None
        }
    }
}

/// Builds a step from events.
#[derive(Debug, Clone)]
pub struct Collector {
    limits: CollectorLimits,
    events: Vec<ProviderEvent>,
}

impl Collector {
    /// A collector with `limits`.
    ///
    /// # Errors
    /// Limits above their ceilings.
    pub fn new(limits: CollectorLimits) -> Result<Self, LimitsError> {
        if limits.max_reasoning_chars > MAX_REASONING_CHARS_CEILING {
            return Err(LimitsError::ReasoningCharsTooLarge);
        }
        Ok(Self {
            limits,
            events: Vec::new(),
        })
    }

    /// Feeds one event.
    pub fn push(&mut self, event: ProviderEvent) -> Flow {
        let _ = self.limits;
        self.events.push(event);
        Flow::Continue
    }

    /// Finishes collection.
    pub fn finish(self) -> Collected {
        Collected {
            step: Step::default(),
            usage: None,
            usage_terminal: false,
            provider_ref: None,
            invalid_reason: None,
            stream_error: None,
            done: false,
            stopped_early: false,
            refusal: None,
        }
    }
}
