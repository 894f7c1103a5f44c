//! An incremental `text/event-stream` (server-sent events) parser.
//!
//! Bytes arrive in arbitrary chunks; [`SseParser::push`] returns every event completed by a chunk.
//! Line endings may be LF, CRLF or CR (a CRLF split across two chunks is one line ending). Lines
//! are decoded as UTF-8 only once complete, so a code point split across chunks is intact. A BOM
//! at the very start is dropped. Comment lines (`:`) and unknown fields are ignored; one space
//! after a field's colon is dropped; a field without a colon has an empty value; several `data:`
//! lines are joined with `\n`.
//!
//! Memory is bounded: an event (its pending line plus its data) larger than
//! [`SSE_EVENT_BYTES_MAX`] is discarded and reported as one [`SseEvent::is_overflow`] event,
//! instead of growing the buffer.

pub(crate) mod decode;
#[cfg(test)]
pub(crate) mod strategies;

/// Largest event the parser buffers, in bytes (pending line plus accumulated data).
pub const SSE_EVENT_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The event name of the synthetic event the parser emits when an event exceeds
/// [`SSE_EVENT_BYTES_MAX`]. Providers never send it.
pub const SSE_OVERFLOW_EVENT: &str = "tollgate.sse_event_too_large";

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
    /// The last event id seen in the stream, if any.
    pub id: Option<String>,
}

impl SseEvent {
    /// Whether this is the parser's synthetic "event too large" event (the event was dropped).
    pub fn is_overflow(&self) -> bool {
        self.event.as_deref() == Some(SSE_OVERFLOW_EVENT)
    }
}

/// Incremental SSE parser. Feed bytes with [`SseParser::push`], then call [`SseParser::finish`]
/// at end of input.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, unterminated line.
    line: Vec<u8>,
    /// The previous byte was a CR: a following LF belongs to the same line ending.
    after_cr: bool,
    /// No line completed yet (a BOM may still lead the first line).
    first_line_pending_bom: bool,
    started: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    last_id: Option<String>,
    /// The current event exceeded the limit: skip its lines until the blank line.
    overflowed: bool,
    /// The current line had bytes (possibly discarded after an overflow): it is not blank.
    line_seen: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk; returns the events it completed, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        if !self.started {
            self.started = true;
            self.first_line_pending_bom = true;
        }
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
                Some(pos) => {
                    self.append_line_bytes(&rest[..pos], &mut out);
                    self.after_cr = rest[pos] == b'\r';
                    rest = &rest[pos + 1..];
                    self.end_line(&mut out);
                }
                None => {
                    self.append_line_bytes(rest, &mut out);
                    rest = &[];
                }
            }
        }
        out
    }

    /// Ends the input: an unterminated last line is processed, and a pending event with data is
    /// dispatched (lenient: some servers omit the final blank line).
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.line_seen {
            self.end_line(&mut out);
        }
        self.after_cr = false;
        self.dispatch(&mut out);
        out
    }

    fn append_line_bytes(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) {
        self.line_seen |= !bytes.is_empty();
        if self.overflowed {
            return;
        }
        if self.line.len() + self.data.len() + bytes.len() > SSE_EVENT_BYTES_MAX {
            self.overflow(out);
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn overflow(&mut self, out: &mut Vec<SseEvent>) {
        self.overflowed = true;
        self.line = Vec::new();
        self.data = String::new();
        self.has_data = false;
        self.event = None;
        out.push(SseEvent {
            event: Some(SSE_OVERFLOW_EVENT.to_string()),
            data: String::new(),
            id: self.last_id.clone(),
        });
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let mut line = std::mem::take(&mut self.line);
        let blank = !std::mem::take(&mut self.line_seen);
        if std::mem::take(&mut self.first_line_pending_bom) && line.starts_with(BOM) {
            line.drain(..BOM.len());
        }
        if blank || (line.is_empty() && !self.overflowed) {
            if std::mem::take(&mut self.overflowed) {
                return;
            }
            self.dispatch(out);
            return;
        }
        if self.overflowed {
            return;
        }
        self.field(&line, out);
    }

    fn field(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(0) => return, // comment
            Some(pos) => {
                let value = &line[pos + 1..];
                (&line[..pos], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match name {
            b"data" => {
                if self.data.len() + value.len() + 1 > SSE_EVENT_BYTES_MAX {
                    self.overflow(out);
                    return;
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"event" => self.event = Some(value.into_owned()),
            b"id" if !value.contains('\0') => self.last_id = Some(value.into_owned()),
            _ => {} // `retry` and unknown fields
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if !std::mem::take(&mut self.has_data) {
            return;
        }
        out.push(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(p.push(c));
        }
        out.extend(p.finish());
        out
    }

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_string),
            data: data.to_string(),
            id: None,
        }
    }

    #[test]
    fn lf_crlf_and_cr_endings_give_the_same_events() {
        let want = vec![ev(Some("a"), "1"), ev(None, "2")];
        assert_eq!(all(&[b"event: a\ndata: 1\n\ndata: 2\n\n"]), want);
        assert_eq!(all(&[b"event: a\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n"]), want);
        assert_eq!(all(&[b"event: a\rdata: 1\r\rdata: 2\r\r"]), want);
    }

    #[test]
    fn crlf_split_across_chunks_is_one_line_ending() {
        let got = all(&[b"data: 1\r", b"\n\r", b"\ndata: 2\r\n\r\n"]);
        assert_eq!(got, vec![ev(None, "1"), ev(None, "2")]);
    }

    #[test]
    fn multiline_data_is_joined_with_newline() {
        let got = all(&[b"data: a\ndata:b\ndata\ndata:  c\n\n"]);
        assert_eq!(got, vec![ev(None, "a\nb\n\n c")]);
    }

    #[test]
    fn comments_and_unknown_fields_are_ignored() {
        let got = all(&[b": keep-alive\nretry: 10\nfoo: bar\ndata: x\n\n:\n\n"]);
        assert_eq!(got, vec![ev(None, "x")]);
    }

    #[test]
    fn event_without_data_is_not_dispatched() {
        assert_eq!(all(&[b"event: ping\n\n"]), vec![]);
        assert_eq!(all(&[b"data:\n\n"]), vec![ev(None, "")]);
    }

    #[test]
    fn bom_at_start_is_dropped_even_when_split() {
        let got = all(&[b"\xEF", b"\xBB", b"\xBFdata: x\n\n"]);
        assert_eq!(got, vec![ev(None, "x")]);
        // A BOM later in the stream is data.
        let got = all(&[b"data: \xEF\xBB\xBFx\n\n"]);
        assert_eq!(got, vec![ev(None, "\u{feff}x")]);
    }

    #[test]
    fn utf8_split_across_chunks_is_intact() {
        let text = "data: é😀\n\n".as_bytes();
        for cut in 0..text.len() {
            let got = all(&[&text[..cut], &text[cut..]]);
            assert_eq!(got, vec![ev(None, "é😀")], "cut at {cut}");
        }
    }

    #[test]
    fn id_is_remembered() {
        let got = all(&[b"id: 7\ndata: a\n\ndata: b\n\n"]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].id.as_deref(), Some("7"));
    }

    #[test]
    fn unterminated_last_event_is_dispatched_at_finish() {
        assert_eq!(all(&[b"data: [DONE]"]), vec![ev(None, "[DONE]")]);
    }

    #[test]
    fn oversized_event_is_reported_once_and_skipped() {
        let mut p = SseParser::new();
        let mut out = p.push(b"data: ");
        let block = vec![b'x'; 1024 * 1024];
        for _ in 0..10 {
            out.extend(p.push(&block));
        }
        assert!(p.line.len() <= SSE_EVENT_BYTES_MAX);
        out.extend(p.push(b"\ndata: rest of the same event\n\ndata: ok\n\n"));
        out.extend(p.finish());
        assert_eq!(out.len(), 2);
        assert!(out[0].is_overflow());
        assert_eq!(out[1], ev(None, "ok"));
    }

    #[test]
    fn many_data_lines_are_bounded_too() {
        let mut p = SseParser::new();
        let line = format!("data: {}\n", "y".repeat(64 * 1024));
        let mut out = Vec::new();
        for _ in 0..200 {
            out.extend(p.push(line.as_bytes()));
        }
        assert!(p.data.len() <= SSE_EVENT_BYTES_MAX);
        out.extend(p.push(b"\n"));
        assert_eq!(out.len(), 1);
        assert!(out[0].is_overflow());
    }
}
