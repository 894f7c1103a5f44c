//! Whole-stream decoding: bytes → [`SseParser`] → the protocol's decoder → normalized events,
//! and `tollgate parse-stream` (spec/cli.md), which also runs the core step collector.

use crate::sse::{SseEvent, SseParser};
use crate::{anthropic, openai_chat, openai_responses, Protocol};
use serde_json::{json, Value};
use tollgate_core::collector::{Collector, CollectorLimits, Flow, MAX_REASONING_CHARS_CEILING};
use tollgate_core::event::ProviderEvent;
use tollgate_core::Usage;

/// The stream decoder of one protocol.
#[derive(Debug)]
pub enum ProtocolDecoder {
    /// OpenAI Chat Completions.
    OpenAiChat(openai_chat::Decoder),
    /// OpenAI Responses.
    OpenAiResponses(openai_responses::Decoder),
    /// Anthropic Messages.
    Anthropic(anthropic::Decoder),
}

impl ProtocolDecoder {
    /// A fresh decoder for `protocol`.
    pub fn new(protocol: Protocol) -> Self {
        match protocol {
            Protocol::OpenAiChat => Self::OpenAiChat(openai_chat::Decoder::new()),
            Protocol::OpenAiResponses => Self::OpenAiResponses(openai_responses::Decoder::new()),
            Protocol::Anthropic => Self::Anthropic(anthropic::Decoder::new()),
        }
    }

    /// Decodes one SSE event.
    pub fn push(&mut self, ev: &SseEvent) -> Vec<ProviderEvent> {
        match self {
            Self::OpenAiChat(d) => d.push(ev),
            Self::OpenAiResponses(d) => d.push(ev),
            Self::Anthropic(d) => d.push(ev),
        }
    }

    /// At end of input: `connection_closed` if the end marker never arrived.
    pub fn finish(&mut self) -> Vec<ProviderEvent> {
        match self {
            Self::OpenAiChat(d) => d.finish(),
            Self::OpenAiResponses(d) => d.finish(),
            Self::Anthropic(d) => d.finish(),
        }
    }
}

/// Bytes in, normalized events out: an SSE parser feeding a protocol decoder. Once the end
/// marker ([`ProviderEvent::Done`]) or an error went out, further input is ignored.
#[derive(Debug)]
pub struct StreamDecoder {
    sse: SseParser,
    decoder: ProtocolDecoder,
    closed: bool,
}

impl StreamDecoder {
    /// A decoder for a `protocol` stream.
    pub fn new(protocol: Protocol) -> Self {
        Self {
            sse: SseParser::new(),
            decoder: ProtocolDecoder::new(protocol),
            closed: false,
        }
    }

    /// Whether the end marker or an error was emitted (the stream is over).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Feeds a chunk of the response body.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<ProviderEvent> {
        if self.closed {
            return Vec::new();
        }
        let mut out = Vec::new();
        for ev in self.sse.push(bytes) {
            out.extend(self.decoder.push(&ev));
        }
        self.note(&out);
        out
    }

    /// Ends the input. An unterminated last event is decoded when its data is complete JSON (some
    /// servers omit the final blank line); a truncated one is a cut connection, reported by the
    /// decoder's `connection_closed`, not as a malformed event.
    pub fn finish(&mut self) -> Vec<ProviderEvent> {
        if self.closed {
            return Vec::new();
        }
        let mut out = Vec::new();
        for ev in self.sse.finish() {
            let complete = ev.is_overflow()
                || ev.data.trim() == "[DONE]"
                || serde_json::from_str::<serde::de::IgnoredAny>(&ev.data).is_ok();
            if complete {
                out.extend(self.decoder.push(&ev));
            }
        }
        out.extend(self.decoder.finish());
        self.note(&out);
        self.closed = true;
        out
    }

    fn note(&mut self, events: &[ProviderEvent]) {
        self.closed |= events
            .iter()
            .any(|e| matches!(e, ProviderEvent::Done | ProviderEvent::Error { .. }));
    }
}

/// Decodes a whole captured stream of `protocol`.
pub fn decode_all(protocol: Protocol, bytes: &[u8]) -> Vec<ProviderEvent> {
    let mut d = StreamDecoder::new(protocol);
    let mut out = d.push(bytes);
    out.extend(d.finish());
    out
}

/// What the event sequence itself says, as read by the runner (up to a collector stop).
#[derive(Debug, Default)]
struct Facts {
    usage: Option<Usage>,
    stop: Option<String>,
    provider_ref: Option<String>,
    error: Option<(String, String)>,
}

impl Facts {
    fn see(&mut self, e: &ProviderEvent) {
        match e {
            ProviderEvent::Usage { usage, .. } => self.usage = Some(*usage),
            ProviderEvent::Stop { reason } if self.stop.is_none() => {
                self.stop = Some(reason.clone());
            }
            ProviderEvent::ProviderRef { id } if self.provider_ref.is_none() => {
                self.provider_ref = Some(id.clone());
            }
            ProviderEvent::Error { kind, message } if self.error.is_none() => {
                self.error = Some((kind.clone(), message.clone()));
            }
            _ => {}
        }
    }
}

/// `tollgate parse-stream`: decodes `bytes` as a `protocol` stream, runs the events through the
/// step collector exactly as a runner does (stopping where the collector says stop), and returns
/// `{"step", "usage", "stop", "provider_ref", "invalid_reason", "stream_error"}`.
///
/// `usage` is the last usage seen (`{"input","output","cache_read","cache_write","reasoning"}`)
/// or null; `stop` the provider's first stop reason or null; `stream_error` null or
/// `{"type","message"}` (the first failure). A `max_reasoning_chars` above the ceiling is
/// clamped to [`MAX_REASONING_CHARS_CEILING`].
pub fn parse_stream(protocol: Protocol, bytes: &[u8], limits: CollectorLimits) -> Value {
    let limits = CollectorLimits {
        max_reasoning_chars: limits.max_reasoning_chars.min(MAX_REASONING_CHARS_CEILING),
        ..limits
    };
    let mut collector = match Collector::new(limits) {
        Ok(c) => c,
        Err(e) => return json!({"error": {"code": "invalid_limits", "message": e.to_string()}}),
    };
    let mut facts = Facts::default();
    for event in decode_all(protocol, bytes) {
        facts.see(&event);
        if collector.push(event) == Flow::Stop {
            break;
        }
    }
    let c = collector.finish();
    let stream_error = match (c.stream_error, facts.error) {
        (Some(e), _) => json!({"type": e.kind, "message": e.message}),
        (None, Some((kind, message))) => json!({"type": kind, "message": message}),
        (None, None) => Value::Null,
    };
    let stop = c.step.stop.clone().or(facts.stop);
    json!({
        "step": serde_json::to_value(&c.step).unwrap_or(Value::Null),
        "usage": c.usage.or(facts.usage),
        "stop": stop,
        "provider_ref": c.provider_ref.or(facts.provider_ref),
        "invalid_reason": c.invalid_reason,
        "stream_error": stream_error,
    })
}
