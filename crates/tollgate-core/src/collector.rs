//! The step collector: consumes normalized provider events and builds the [`Step`] (ST-8),
//! enforcing the output limits and reporting the **first** invalid reason (ST-20..ST-23), and
//! classifying refusal evidence (RF-1, RF-2).
//!
//! Character limits count UTF-16 code units.
//!
//! # What the collector decides
//!
//! - Blocks are ordered by arrival; `order` is the index in [`Step::blocks`]. Adjacent text deltas
//!   form one text block whose range points into [`Step::text`]; adjacent refusal deltas form one
//!   refusal block; reasoning deltas (and the signature that follows them) form one reasoning
//!   block; opaque reasoning is its own block; tool calls take their place at their start event
//!   and collect their argument fragments by index, so parallel calls may interleave.
//! - **Empty** deltas (`""`) carry no content: they create no block and do not count as content
//!   for the refusal proofs (a real Anthropic empty refusal opens an empty text block). An empty
//!   reasoning delta is still a reasoning *event* for the loop check (ST-22). Whitespace is
//!   content.
//! - Content past a limit is dropped (memory stays bounded) and the step is invalid; the reader
//!   keeps reading to collect usage (ST-24), except after a reasoning loop (ST-22), where
//!   [`Collector::push`] returns [`Flow::Stop`] and ignores everything afterwards.
//! - Malformed tool arguments are **not** an invalid reason: the call keeps `input: {}` and
//!   `malformed: true`, and the raw text is dropped (ST-9). A consumer checks the flag (TC-6).
//!   Arguments cut short by `max_output_chars` are malformed too, even if the kept prefix parses.

use crate::event::ProviderEvent;
use crate::invalid::InvalidReason;
use crate::message::utf16_len;
use crate::step::{Block, Step, ToolCall, Utf16Range};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Hard ceiling of `max_reasoning_chars` (ST-21).
pub const MAX_REASONING_CHARS_CEILING: u64 = 1_000_000;

/// Most blocks one step may hold; a block past it makes the step invalid with
/// `block_malformed` and is dropped.
pub const BLOCKS_MAX: usize = 10_000;

/// The stop reason of an Anthropic context refusal (RF-1).
pub const REFUSAL_STOP: &str = "refusal";

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
    /// A refusal before the stream: provider reference, no content, no stop, no usage beyond
    /// zero, no stream failure, clean end (RF-2).
    PreStream,
    /// An empty refusal: an Anthropic `refusal` stop with no content at all (not even
    /// whitespace), a provider reference, exactly one stop, no stream failure, clean end (RF-1).
    EmptyRefusal,
}

/// What the collector made of a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// The step (possibly partial when invalid or cut).
    pub step: Step,
    /// The last usage seen, if any.
    pub usage: Option<Usage>,
    /// Whether `usage` is the terminal (final and exact) count; otherwise `usage` is inexact
    /// evidence only (SC-95).
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

/// A tool call whose arguments are still arriving.
#[derive(Debug, Clone)]
struct ToolSlot {
    /// Index of its block in `Collector::blocks`.
    block: usize,
    /// The joined argument fragments (dropped once parsed).
    args: String,
    /// Whether a fragment was dropped by the output limit: such arguments never parse.
    truncated: bool,
    /// Whether `ToolCallEnd` arrived (the arguments are parsed then).
    ended: bool,
}

/// Builds a step from events.
#[derive(Debug, Clone)]
pub struct Collector {
    limits: CollectorLimits,
    blocks: Vec<Block>,
    /// All visible text, and its length in UTF-16 code units.
    text: String,
    text_utf16: u64,
    /// Tool calls by provider index.
    tools: BTreeMap<u32, ToolSlot>,
    output_used: u64,
    reasoning_used: u64,
    /// Set at the first overflow: later content of that kind is dropped.
    output_full: bool,
    reasoning_full: bool,
    consecutive_reasoning: u64,
    stop: Option<String>,
    stops_seen: u32,
    usage: Option<Usage>,
    usage_terminal: bool,
    provider_ref: Option<String>,
    invalid: Option<InvalidReason>,
    stream_error: Option<StreamError>,
    done: bool,
    stopped_early: bool,
    /// Whether any non-empty content event arrived (kept or not).
    content_seen: bool,
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
            blocks: Vec::new(),
            text: String::new(),
            text_utf16: 0,
            tools: BTreeMap::new(),
            output_used: 0,
            reasoning_used: 0,
            output_full: false,
            reasoning_full: false,
            consecutive_reasoning: 0,
            stop: None,
            stops_seen: 0,
            usage: None,
            usage_terminal: false,
            provider_ref: None,
            invalid: None,
            stream_error: None,
            done: false,
            stopped_early: false,
            content_seen: false,
        })
    }

    /// The first invalid reason so far (ST-20). Once set it never changes.
    pub fn invalid_reason(&self) -> Option<InvalidReason> {
        self.invalid
    }

    /// Whether the collector stopped reading (reasoning loop, ST-22).
    pub fn stopped_early(&self) -> bool {
        self.stopped_early
    }

    /// Feeds one event.
    pub fn push(&mut self, event: ProviderEvent) -> Flow {
        if self.stopped_early {
            return Flow::Stop;
        }
        if self.loop_detected(&event) {
            self.reject(InvalidReason::ReasoningLoop);
            self.stopped_early = true;
            return Flow::Stop;
        }
        match event {
            ProviderEvent::ProviderRef { id } => {
                if self.provider_ref.is_none() {
                    self.provider_ref = Some(id);
                }
            }
            ProviderEvent::Usage { usage, terminal } => {
                self.usage = Some(usage);
                self.usage_terminal = terminal;
            }
            ProviderEvent::Error { kind, message } => {
                if self.stream_error.is_none() {
                    self.stream_error = Some(StreamError { kind, message });
                }
            }
            ProviderEvent::Done => self.done = true,
            ProviderEvent::Stop { reason } => self.on_stop(reason),
            ProviderEvent::ToolCallEnd { index } => self.on_tool_end(index),
            ProviderEvent::ToolCallArgsDelta { index, delta } => self.on_tool_args(index, delta),
            content => self.on_content(content),
        }
        Flow::Continue
    }

    /// Finishes collection.
    pub fn finish(mut self) -> Collected {
        let open: Vec<u32> = self
            .tools
            .iter()
            .filter(|(_, slot)| !slot.ended)
            .map(|(index, _)| *index)
            .collect();
        for index in open {
            self.close_tool(index);
        }
        let refusal = self.refusal_proof();
        let step = Step {
            tool_calls: self
                .blocks
                .iter()
                .filter_map(|b| match b {
                    Block::ToolCall { call, .. } => Some(call.clone()),
                    _ => None,
                })
                .collect(),
            reasoning: self
                .blocks
                .iter()
                .filter(|b| matches!(b, Block::Reasoning { .. }))
                .cloned()
                .collect(),
            provider_blocks: self
                .blocks
                .iter()
                .filter(|b| matches!(b, Block::Provider { .. }))
                .cloned()
                .collect(),
            blocks: self.blocks,
            text: self.text,
            stop: self.stop,
        };
        Collected {
            step,
            usage: self.usage,
            usage_terminal: self.usage_terminal,
            provider_ref: self.provider_ref,
            invalid_reason: self.invalid,
            stream_error: self.stream_error,
            done: self.done,
            stopped_early: self.stopped_early,
            refusal,
        }
    }

    /// Records `reason` unless an earlier one exists (ST-20: only the first is reported).
    fn reject(&mut self, reason: InvalidReason) {
        if self.invalid.is_none() {
            self.invalid = Some(reason);
        }
    }

    /// Updates the consecutive-reasoning count and says whether `event` is the first one past
    /// `max_consecutive_reasoning` (ST-22). Text (non-empty) and tool-call events reset it.
    fn loop_detected(&mut self, event: &ProviderEvent) -> bool {
        match event {
            ProviderEvent::ReasoningDelta { .. }
            | ProviderEvent::ReasoningSignature { .. }
            | ProviderEvent::ReasoningOpaque { .. } => {
                self.consecutive_reasoning = self.consecutive_reasoning.saturating_add(1);
                match self.limits.max_consecutive_reasoning {
                    Some(max) => self.consecutive_reasoning > u64::from(max),
                    None => false,
                }
            }
            ProviderEvent::TextDelta { text } if !text.is_empty() => {
                self.consecutive_reasoning = 0;
                false
            }
            ProviderEvent::ToolCallStart { .. } | ProviderEvent::ToolCallArgsDelta { .. } => {
                self.consecutive_reasoning = 0;
                false
            }
            _ => false,
        }
    }

    /// Whether content may still arrive: not after the stop or the end marker.
    fn content_allowed(&mut self) -> bool {
        if self.done || self.stop.is_some() {
            self.reject(InvalidReason::EventType);
            return false;
        }
        true
    }

    fn on_stop(&mut self, reason: String) {
        if self.done {
            self.reject(InvalidReason::EventType);
            return;
        }
        self.stops_seen = self.stops_seen.saturating_add(1);
        if self.stop.is_some() {
            // A second stop, equal or not, is a conflict; the first one stays.
            self.reject(InvalidReason::StopConflict);
        } else {
            self.stop = Some(reason);
        }
    }

    /// Text, refusal, reasoning, tool-call start and provider-block events.
    fn on_content(&mut self, event: ProviderEvent) {
        let empty = match &event {
            ProviderEvent::TextDelta { text }
            | ProviderEvent::RefusalDelta { text }
            | ProviderEvent::ReasoningDelta { text } => text.is_empty(),
            ProviderEvent::ReasoningSignature { signature } => signature.is_empty(),
            ProviderEvent::ReasoningOpaque { data } => data.is_empty(),
            _ => false,
        };
        if empty {
            return;
        }
        self.content_seen = true;
        if !self.content_allowed() {
            return;
        }
        match event {
            ProviderEvent::TextDelta { text } => self.on_text(text),
            ProviderEvent::RefusalDelta { text } => self.on_refusal(text),
            ProviderEvent::ReasoningDelta { text } => self.on_reasoning_text(text),
            ProviderEvent::ReasoningSignature { signature } => self.on_signature(signature),
            ProviderEvent::ReasoningOpaque { data } => self.on_opaque(data),
            ProviderEvent::ToolCallStart { index, id, name } => self.on_tool_start(index, id, name),
            ProviderEvent::ProviderBlock { block } => self.on_provider_block(block),
            // Routed elsewhere by `push`.
            ProviderEvent::ProviderRef { .. }
            | ProviderEvent::Usage { .. }
            | ProviderEvent::Error { .. }
            | ProviderEvent::Done
            | ProviderEvent::Stop { .. }
            | ProviderEvent::ToolCallArgsDelta { .. }
            | ProviderEvent::ToolCallEnd { .. } => {}
        }
    }

    /// Whether one more block fits; past [`BLOCKS_MAX`] the step is `block_malformed`.
    fn room_for_block(&mut self) -> bool {
        if self.blocks.len() >= BLOCKS_MAX {
            self.reject(InvalidReason::BlockMalformed);
            return false;
        }
        true
    }

    /// The next block's order index.
    fn next_order(&self) -> u32 {
        // `blocks.len() < BLOCKS_MAX`, far below `u32::MAX`.
        u32::try_from(self.blocks.len()).unwrap_or(u32::MAX)
    }

    /// Charges `n` output code units; false (and `output_chars`) past the limit.
    fn charge_output(&mut self, n: u64) -> bool {
        if self.output_full {
            return false;
        }
        match self.output_used.checked_add(n) {
            Some(total) if total <= self.limits.max_output_chars => {
                self.output_used = total;
                true
            }
            _ => {
                self.output_full = true;
                self.reject(InvalidReason::OutputChars);
                false
            }
        }
    }

    /// Charges `n` reasoning code units; false (and `reasoning_chars`) past the limit.
    fn charge_reasoning(&mut self, n: u64) -> bool {
        if self.reasoning_full {
            return false;
        }
        match self.reasoning_used.checked_add(n) {
            Some(total) if total <= self.limits.max_reasoning_chars => {
                self.reasoning_used = total;
                true
            }
            _ => {
                self.reasoning_full = true;
                self.reject(InvalidReason::ReasoningChars);
                false
            }
        }
    }

    fn on_text(&mut self, delta: String) {
        let n = utf16_len(&delta);
        let extend = matches!(self.blocks.last(), Some(Block::Text { .. }));
        if !extend && !self.room_for_block() {
            return;
        }
        if !self.charge_output(n) {
            return;
        }
        let start = self.text_utf16;
        let end = start.saturating_add(n);
        self.text.push_str(&delta);
        self.text_utf16 = end;
        if let Some(Block::Text { text, range, .. }) = self.blocks.last_mut() {
            // The last text block always ends where `self.text` ends.
            text.push_str(&delta);
            range.end = end;
        } else {
            let order = self.next_order();
            self.blocks.push(Block::Text {
                order,
                text: delta,
                range: Utf16Range { start, end },
            });
        }
    }

    fn on_refusal(&mut self, delta: String) {
        let extend = matches!(self.blocks.last(), Some(Block::Refusal { .. }));
        if !extend && !self.room_for_block() {
            return;
        }
        if !self.charge_output(utf16_len(&delta)) {
            return;
        }
        if let Some(Block::Refusal { text, .. }) = self.blocks.last_mut() {
            text.push_str(&delta);
        } else {
            let order = self.next_order();
            self.blocks.push(Block::Refusal { order, text: delta });
        }
    }

    /// Whether the last block is a reasoning block that still takes text and a signature:
    /// readable reasoning without opaque data and not yet signed.
    fn open_reasoning(&self) -> bool {
        matches!(
            self.blocks.last(),
            Some(Block::Reasoning {
                opaque: None,
                signature: None,
                ..
            })
        )
    }

    fn on_reasoning_text(&mut self, delta: String) {
        let extend = self.open_reasoning();
        if !extend && !self.room_for_block() {
            return;
        }
        if !self.charge_reasoning(utf16_len(&delta)) {
            return;
        }
        if let (true, Some(Block::Reasoning { text, .. })) = (extend, self.blocks.last_mut()) {
            text.get_or_insert_with(String::new).push_str(&delta);
        } else {
            let order = self.next_order();
            self.blocks.push(Block::Reasoning {
                order,
                text: Some(delta),
                opaque: None,
                signature: None,
            });
        }
    }

    fn on_signature(&mut self, value: String) {
        let extend = self.open_reasoning();
        if !extend && !self.room_for_block() {
            return;
        }
        if !self.charge_reasoning(utf16_len(&value)) {
            return;
        }
        if let (true, Some(Block::Reasoning { signature, .. })) = (extend, self.blocks.last_mut()) {
            *signature = Some(value);
        } else {
            let order = self.next_order();
            self.blocks.push(Block::Reasoning {
                order,
                text: None,
                opaque: None,
                signature: Some(value),
            });
        }
    }

    fn on_opaque(&mut self, data: String) {
        if !self.room_for_block() || !self.charge_reasoning(utf16_len(&data)) {
            return;
        }
        let order = self.next_order();
        self.blocks.push(Block::Reasoning {
            order,
            text: None,
            opaque: Some(data),
            signature: None,
        });
    }

    fn on_provider_block(&mut self, block: serde_json::Value) {
        if !block.is_object() {
            self.reject(InvalidReason::BlockMalformed);
            return;
        }
        if !self.room_for_block() || !self.charge_output(utf16_len(&block.to_string())) {
            return;
        }
        let order = self.next_order();
        self.blocks.push(Block::Provider { order, block });
    }

    fn on_tool_start(&mut self, index: u32, id: String, name: String) {
        if self.tools.contains_key(&index) || name.is_empty() {
            // A duplicate start or a nameless call is inconsistent; the event is dropped.
            self.reject(InvalidReason::ToolCall);
            return;
        }
        if !self.room_for_block() {
            return;
        }
        let block = self.blocks.len();
        let order = self.next_order();
        self.blocks.push(Block::ToolCall {
            order,
            call: ToolCall {
                id,
                name,
                input: empty_object(),
                malformed: false,
            },
        });
        self.tools.insert(
            index,
            ToolSlot {
                block,
                args: String::new(),
                truncated: false,
                ended: false,
            },
        );
    }

    fn on_tool_args(&mut self, index: u32, delta: String) {
        let ended = match self.tools.get(&index) {
            None => true,
            Some(slot) => slot.ended,
        };
        if ended {
            // Arguments for an unknown call, or after its end.
            self.reject(InvalidReason::ToolCall);
            return;
        }
        if delta.is_empty() {
            return;
        }
        self.content_seen = true;
        if !self.content_allowed() {
            return;
        }
        let charged = self.charge_output(utf16_len(&delta));
        if let Some(slot) = self.tools.get_mut(&index) {
            if charged {
                slot.args.push_str(&delta);
            } else {
                slot.truncated = true;
            }
        }
    }

    fn on_tool_end(&mut self, index: u32) {
        if self.done {
            self.reject(InvalidReason::EventType);
            return;
        }
        match self.tools.get(&index) {
            Some(slot) if !slot.ended => self.close_tool(index),
            // An end for an unknown call, or a second end.
            _ => self.reject(InvalidReason::ToolCall),
        }
    }

    /// Parses the call's joined arguments into its block and drops the raw text (ST-9).
    fn close_tool(&mut self, index: u32) {
        let Some(slot) = self.tools.get_mut(&index) else {
            return;
        };
        let raw = std::mem::take(&mut slot.args);
        let (input, malformed) = parse_arguments(&raw, slot.truncated);
        slot.ended = true;
        let block = slot.block;
        if let Some(Block::ToolCall { call, .. }) = self.blocks.get_mut(block) {
            call.input = input;
            call.malformed = malformed;
        }
    }

    /// The refusal proof the stream gives, on which the call settles at zero: exactly one kind,
    /// or none; any other stream with evidence is unknown usage (RF-1, RF-2).
    fn refusal_proof(&self) -> Option<RefusalProof> {
        let clean = self.provider_ref.is_some()
            && self.blocks.is_empty()
            && !self.content_seen
            && self.stream_error.is_none()
            && self.done
            && self.invalid.is_none()
            && !self.stopped_early;
        if !clean {
            return None;
        }
        match &self.stop {
            None if self.stops_seen == 0 && self.usage.is_none_or(|u| u.is_zero()) => {
                Some(RefusalProof::PreStream)
            }
            Some(stop) if self.stops_seen == 1 && stop == REFUSAL_STOP => {
                Some(RefusalProof::EmptyRefusal)
            }
            _ => None,
        }
    }
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// A JSON object → itself; empty (or blank) → `{}`; anything else, or arguments cut by the
/// output limit → `{}` and malformed. The raw text is never returned (ST-9).
fn parse_arguments(raw: &str, truncated: bool) -> (serde_json::Value, bool) {
    if truncated {
        return (empty_object(), true);
    }
    if raw.trim().is_empty() {
        return (empty_object(), false);
    }
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(value @ serde_json::Value::Object(_)) => (value, false),
        _ => (empty_object(), true),
    }
}
