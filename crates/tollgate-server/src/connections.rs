//! The HTTP accept loop (spec/service.md — Connections): every connection is bounded in time and
//! in number, so a client that opens sockets and sends nothing, half a header, or a body byte by
//! byte cannot hold the server's memory, tasks or file descriptors.
//!
//! A connection speaks HTTP/1.1, or HTTP/2 with prior knowledge (cleartext, as a proxy or a
//! load balancer in front of the service speaks it): its first bytes tell which, the HTTP/2
//! connection preface or anything else.
//!
//! - at most `connections_max` connections are served at once; past it the loop stops accepting
//!   (the kernel's backlog holds the next ones) until one closes;
//! - the first bytes, enough to tell the two apart, must arrive within `header_read_timeout_ms`
//!   of the accept; an HTTP/1.1 request's header then within `header_read_timeout_ms` of the
//!   connection being ready for it (hyper's own timer);
//! - an HTTP/2 connection carries at most `http2_max_streams` requests at once (its
//!   `SETTINGS_MAX_CONCURRENT_STREAMS`); each request is then admitted, authenticated and bounded
//!   as any other;
//! - a connection on which no byte is read or written for `idle_timeout_ms` is closed (after the
//!   answer in progress, if any: the close is graceful);
//! - on shutdown the listener closes at once, every connection closes after its answer in
//!   progress, and connections still open `http_drain_ms` later are dropped.
//!
//! The body's own deadline is a request layer (`crate::limits`), because it applies to a
//! request the server has accepted and authenticated.

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Default of `[server] header_read_timeout_ms`.
pub const HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default of `[server] idle_timeout_ms`.
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 60_000;
/// Default of `[server] connections_max`.
pub const CONNECTIONS_MAX_DEFAULT: u64 = 4_096;
/// Largest `[server] connections_max`.
pub const CONNECTIONS_MAX_MAX: u64 = 100_000;
/// Default of `[server] http_drain_ms`.
pub const HTTP_DRAIN_MS_DEFAULT: u64 = 10_000;
/// Default of `[server] http2_max_streams`.
pub const HTTP2_MAX_STREAMS_DEFAULT: u64 = 128;
/// Largest `[server] http2_max_streams`.
pub const HTTP2_MAX_STREAMS_MAX: u64 = 10_000;
/// The flow-control window of an HTTP/2 connection and of each of its streams, in bytes: the
/// protocol's own initial window (RFC 9113, section 6.9.2). A connection holds at most this much
/// request body that the service has not read yet, as an HTTP/1.1 connection leaves what it has
/// not read in the kernel's socket buffer.
const HTTP2_WINDOW_BYTES: u32 = 65_535;
/// The first bytes of every HTTP/2 connection with prior knowledge (RFC 9113, section 3.4).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Smallest header-read and idle timeout.
pub const CONNECTION_TIMEOUT_MS_MIN: u64 = 100;
/// Largest header-read and idle timeout, and largest `http_drain_ms`.
pub const CONNECTION_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// How long the loop waits after an accept error that is not about one connection (e.g. the
/// process is out of file descriptors) before it accepts again.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

/// `[server]` bounds of every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest wait for a request's complete header, in milliseconds.
    pub header_read_timeout_ms: u64,
    /// A connection with no byte read or written for this long is closed, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Connections served at once.
    pub connections_max: usize,
    /// On shutdown, the longest wait for open connections to finish their answers.
    pub http_drain_ms: u64,
    /// Requests one HTTP/2 connection carries at once.
    pub http2_max_streams: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: HEADER_READ_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
            connections_max: usize::try_from(CONNECTIONS_MAX_DEFAULT).unwrap_or(usize::MAX),
            http_drain_ms: HTTP_DRAIN_MS_DEFAULT,
            http2_max_streams: u32::try_from(HTTP2_MAX_STREAMS_DEFAULT).unwrap_or(u32::MAX),
        }
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes, then drains the
/// open connections for at most `limits.http_drain_ms` and drops what is left.
///
/// # Errors
/// None today: accept errors are logged and the loop goes on.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.connections_max.max(1)));
    let connections = TaskTracker::new();
    let closing = CancellationToken::new();
    let dropped = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) if one_connection(&e) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                continue;
            }
        };
        // A socket that refuses the option still works, only slower: without it every
        // keep-alive answer waits for the peer's delayed ACK between its header and body.
        let _ = tcp.set_nodelay(true);
        connections.spawn(connection(
            tcp,
            router.clone(),
            limits,
            permit,
            closing.clone(),
            dropped.clone(),
        ));
    }
    drop(listener);
    closing.cancel();
    connections.close();
    let open = connections.len();
    if open > 0 {
        tracing::info!(open, limits.http_drain_ms, "shutdown: closing connections");
        let bound = Duration::from_millis(limits.http_drain_ms);
        if tokio::time::timeout(bound, connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = connections.len(),
                "shutdown: connection drain bound reached; dropping the rest"
            );
            dropped.cancel();
            connections.wait().await;
        }
    }
    Ok(())
}

/// An accept error about the one connection being accepted (the peer left first): the next
/// accept may succeed at once.
fn one_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

/// The protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// The longest pause between two looks at a connection's first bytes while they are a part of
/// the HTTP/2 preface, in milliseconds.
const PREFACE_LOOK_PAUSE_MS_MAX: u64 = 50;

/// Looks at a connection's first bytes, without taking them, until they tell its protocol: the
/// whole HTTP/2 preface, or the first byte that departs from it. While they are a part of the
/// preface, it looks again after a pause that doubles up to [`PREFACE_LOOK_PAUSE_MS_MAX`] (a
/// look does not wait for more bytes than it saw). No byte for `idle`, or a preface still
/// incomplete `idle` after its last look found more, ends the connection (`TimedOut`), as the
/// idle bound ends any connection.
async fn protocol(tcp: &TcpStream, idle: Duration) -> io::Result<Protocol> {
    let mut buf = [0u8; HTTP2_PREFACE.len()];
    let mut seen = 0;
    let mut pause = Duration::from_millis(1);
    let mut last_more = Instant::now();
    loop {
        let n = tokio::time::timeout(idle, tcp.peek(&mut buf))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if !HTTP2_PREFACE.starts_with(&buf[..n]) {
            return Ok(Protocol::Http1);
        }
        if n == HTTP2_PREFACE.len() {
            return Ok(Protocol::Http2);
        }
        if n > seen {
            seen = n;
            last_more = Instant::now();
        } else if last_more.elapsed() >= idle {
            return Err(io::ErrorKind::TimedOut.into());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(PREFACE_LOOK_PAUSE_MS_MAX));
    }
}

async fn connection(
    tcp: TcpStream,
    router: Router,
    limits: ConnectionLimits,
    _permit: OwnedSemaphorePermit,
    closing: CancellationToken,
    dropped: CancellationToken,
) {
    let header_read_timeout = Duration::from_millis(limits.header_read_timeout_ms);
    let idle = Duration::from_millis(limits.idle_timeout_ms);
    let protocol = tokio::select! {
        first = tokio::time::timeout(header_read_timeout, protocol(&tcp, idle)) => match first {
            Ok(Ok(protocol)) => protocol,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "connection ended before its first bytes");
                return;
            }
            Err(_) => {
                tracing::debug!(limits.header_read_timeout_ms, "no first bytes in time");
                return;
            }
        },
        () = closing.cancelled() => return,
    };
    let activity = Activity::new();
    let io = TokioIo::new(Tracked {
        inner: tcp,
        activity: activity.clone(),
    });
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        router.clone().oneshot(request.map(axum::body::Body::new))
    });
    let ending = Ending {
        activity: &activity,
        idle,
        closing: &closing,
        dropped: &dropped,
    };
    match protocol {
        Protocol::Http1 => {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .keep_alive(true);
            let served = builder.serve_connection(io, service);
            serve_until_closed(served, |c| c.graceful_shutdown(), &ending).await;
        }
        Protocol::Http2 => {
            let mut builder = http2::Builder::new(TokioExecutor::new());
            builder
                .timer(TokioTimer::new())
                .max_concurrent_streams(limits.http2_max_streams)
                .initial_connection_window_size(HTTP2_WINDOW_BYTES)
                .initial_stream_window_size(HTTP2_WINDOW_BYTES);
            let served = builder.serve_connection(io, service);
            // Boxed: an HTTP/2 connection's state is far larger than an HTTP/1.1 one's, and
            // inline it would size every connection's task.
            Box::pin(serve_until_closed(
                served,
                |c| c.graceful_shutdown(),
                &ending,
            ))
            .await;
        }
    }
}

/// What ends a connection being served: no byte read or written (`activity`) for `idle`, or
/// shutdown (`closing`), both gracefully; `dropped`, at once.
struct Ending<'a> {
    activity: &'a Activity,
    idle: Duration,
    closing: &'a CancellationToken,
    dropped: &'a CancellationToken,
}

/// Serves `served` until it ends; closes it gracefully (`close`) on shutdown or once it was idle
/// for `ending.idle`, and drops it when `ending.dropped` fires.
async fn serve_until_closed<F, C>(served: F, close: C, ending: &Ending<'_>)
where
    F: Future<Output = Result<(), hyper::Error>>,
    C: Fn(Pin<&mut F>),
{
    let Ending {
        activity,
        idle,
        closing,
        dropped,
    } = ending;
    let idle = *idle;
    tokio::pin!(served);
    let mut closing_now = false;
    loop {
        let idle_at = activity.last() + idle;
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended");
                }
                return;
            }
            () = dropped.cancelled() => return,
            () = closing.cancelled(), if !closing_now => {
                close(served.as_mut());
                closing_now = true;
            }
            () = tokio::time::sleep_until(idle_at), if !closing_now => {
                if activity.last() + idle <= Instant::now() {
                    tracing::debug!(idle_ms = idle.as_millis(), "closing an idle connection");
                    close(served.as_mut());
                    closing_now = true;
                }
            }
        }
    }
}

/// When a connection last read or wrote a byte, as milliseconds since its start.
#[derive(Clone)]
struct Activity {
    start: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A socket that records its activity.
struct Tracked {
    inner: TcpStream,
    activity: Activity,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
