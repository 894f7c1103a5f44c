//! Where the mock provider's streams are written: the response body sink (with real connection
//! cuts), and the pieces the three wire formats share.

use bytes::Bytes;
use serde_json::Value;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Characters per text / reasoning delta.
pub(crate) const TEXT_DELTA_CHARS: usize = 16;
/// Characters per tool-argument delta (small, so that readers must join fragments).
pub(crate) const ARGS_DELTA_CHARS: usize = 8;
/// Pause between two events of the endless reasoning loop.
const LOOP_PACE: Duration = Duration::from_millis(1);
/// The "endless" reasoning loop still ends (with a cut) after this many events, about ten
/// minutes at [`LOOP_PACE`].
pub(crate) const LOOP_EVENTS_MAX: u64 = 600_000;
/// Pause before a cut, so that the frames already queued reach the client first.
const CUT_FLUSH: Duration = Duration::from_millis(20);
/// Anthropic thinking signature of the mock (base64 of `mock-signature`).
pub(crate) const SIGNATURE: &str = "bW9jay1zaWduYXR1cmU=";
/// Responses `encrypted_content` of the mock (opaque to every reader).
pub(crate) const ENCRYPTED: &str = "gAAAAABtb2NrLWVuY3J5cHRlZC1yZWFzb25pbmc=";

/// One body frame: bytes, or an error that aborts the body (hyper then closes the connection
/// without the terminating chunk: a real mid-body drop).
pub(crate) type Frame = Result<Bytes, std::io::Error>;

/// The client went away, or the server is shutting down: stop writing.
#[derive(Debug)]
pub(crate) struct Gone;

/// Where a response body is written.
pub(crate) struct Sink {
    tx: mpsc::Sender<Frame>,
    cancel: CancellationToken,
}

impl Sink {
    /// A sink writing into `tx` until `cancel`.
    pub(crate) fn new(tx: mpsc::Sender<Frame>, cancel: CancellationToken) -> Self {
        Self { tx, cancel }
    }

    pub(crate) async fn send(&self, text: String) -> Result<(), Gone> {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(Gone),
            sent = self.tx.send(Ok(Bytes::from(text))) => sent.map_err(|_| Gone),
        }
    }

    /// `data: {json}` (OpenAI Chat Completions).
    pub(crate) async fn data(&self, value: &Value) -> Result<(), Gone> {
        self.send(format!("data: {value}\n\n")).await
    }

    /// `event: NAME` + `data: {json}` (Anthropic, OpenAI Responses).
    pub(crate) async fn event(&self, name: &str, value: &Value) -> Result<(), Gone> {
        self.send(format!("event: {name}\ndata: {value}\n\n")).await
    }

    /// Waits [`LOOP_PACE`], or fails when the client has gone.
    pub(crate) async fn pace(&self) -> Result<(), Gone> {
        tokio::select! {
            () = self.cancel.cancelled() => Err(Gone),
            () = self.tx.closed() => Err(Gone),
            () = tokio::time::sleep(LOOP_PACE) => Ok(()),
        }
    }

    /// Drops the connection mid-body.
    pub(crate) async fn cut(&self) {
        tokio::time::sleep(CUT_FLUSH).await;
        let error = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "mock cut");
        // The client may be gone already; nothing more to do then.
        let _ = self.tx.try_send(Err(error));
    }

    /// Sends nothing until the client disconnects or the server shuts down.
    pub(crate) async fn hold(&self) -> Result<(), Gone> {
        tokio::select! {
            () = self.cancel.cancelled() => {}
            () = self.tx.closed() => {}
        }
        Err(Gone)
    }
}

/// Splits `s` into pieces of at most `n` characters.
pub(crate) fn pieces(s: &str, n: usize) -> impl Iterator<Item = &str> + Send {
    let mut rest = s;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.char_indices().nth(n).map_or(rest.len(), |(i, _)| i);
        let (head, tail) = rest.split_at(end);
        rest = tail;
        Some(head)
    })
}

pub(crate) fn simple_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Text of the `n`-th event of the endless reasoning loop.
pub(crate) fn loop_thought(n: u64) -> String {
    format!("Still thinking ({n}). ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mock_pieces_split_on_char_boundaries() {
        let parts: Vec<&str> = pieces("ab😀cd𝄞", 2).collect();
        assert_eq!(parts, ["ab", "😀c", "d𝄞"]);
        assert_eq!(pieces("", 3).count(), 0);
    }
}
