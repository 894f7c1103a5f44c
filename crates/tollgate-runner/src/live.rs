//! Live streaming (spec/service.md — Live streaming, SC-213): the text deltas of a call, handed
//! to its caller as the provider sends them while the drive collects and journals the same
//! bytes as ever. The sink never slows the drive (it is unbounded; what it carries is bounded by
//! the call's `max_output_chars`), and a caller that stops reading changes nothing: the call
//! completes and settles as any other.
//!
//! Only text goes out, and only as much as the call may answer: once the text forwarded would
//! pass `max_output_chars`, forwarding stops, and the answer's last chunk, sent after the
//! settlement, says how the call ended.

use tokio::sync::mpsc;
use tollgate_core::ids::ExecutionId;
use tollgate_core::message::utf16_len;

/// What a live reader receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Live {
    /// The call was sent: its journal row (first, before any text).
    Sent(ExecutionId),
    /// Text, as the provider sent it.
    Text(String),
    /// Usage the provider reported (a stream may report its input counts at its start, as
    /// Anthropic's does, and its totals at its end).
    Usage(tollgate_core::usage::Usage),
}

/// Where a live call's events go.
pub type LiveSink = mpsc::UnboundedSender<Live>;
/// What the caller reads them from; it ends when the provider's stream has been read.
pub type LiveDeltas = mpsc::UnboundedReceiver<Live>;

/// A sink and its reader.
pub fn channel() -> (LiveSink, LiveDeltas) {
    mpsc::unbounded_channel()
}

/// The drive's side: forwards text while the call's output stays within its limit.
pub(crate) struct Forward {
    sink: Option<LiveSink>,
    left_chars: u64,
}

impl Forward {
    /// Forwarding for the call `execution_id`, which is being sent: the reader learns it first.
    pub(crate) fn new(
        sink: Option<LiveSink>,
        execution_id: ExecutionId,
        max_output_chars: u64,
    ) -> Self {
        let sink = sink.filter(|s| s.send(Live::Sent(execution_id)).is_ok());
        Self {
            sink,
            left_chars: max_output_chars,
        }
    }

    /// Hands `text` to the caller, unless it would pass the output limit (then nothing more
    /// goes out) or the caller has gone.
    pub(crate) fn text(&mut self, text: &str) {
        let Some(sink) = &self.sink else {
            return;
        };
        let units = utf16_len(text);
        if units > self.left_chars || sink.send(Live::Text(text.to_owned())).is_err() {
            self.sink = None;
            return;
        }
        self.left_chars -= units;
    }

    /// Hands the usage the provider reported to the caller.
    pub(crate) fn usage(&mut self, usage: tollgate_core::usage::Usage) {
        if let Some(sink) = &self.sink {
            if sink.send(Live::Usage(usage)).is_err() {
                self.sink = None;
            }
        }
    }

    /// The provider's stream is read: the caller's reader ends.
    pub(crate) fn close(&mut self) {
        self.sink = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sc_213_text_goes_out_within_the_output_limit_only() {
        let (sink, mut deltas) = channel();
        let id = ExecutionId::new();
        let mut forward = Forward::new(Some(sink), id, 5);
        forward.text("abc");
        forward.text("def");
        forward.text("g");
        forward.close();
        assert_eq!(deltas.try_recv().ok(), Some(Live::Sent(id)));
        assert_eq!(deltas.try_recv().ok(), Some(Live::Text("abc".into())));
        // "def" would pass the limit: it and everything after stay in the journal only.
        assert!(deltas.try_recv().is_err());
    }
}
