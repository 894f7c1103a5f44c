//! The HTTP/1.1 accept loop (spec/service.md — Connections): every connection is bounded in
//! time and in number, so a client that opens sockets and sends nothing, half a header, or a
//! body byte by byte cannot hold the server's memory, tasks or file descriptors.
//!
//! - at most `connections_max` connections are served at once; past it the loop stops accepting
//!   (the kernel's backlog holds the next ones) until one closes;
//! - a request's header must arrive within `header_read_timeout_ms` of the connection being
//!   ready for it (hyper's own timer);
//! - a connection on which no byte is read or written for `idle_timeout_ms` is closed (after the
//!   answer in progress, if any: the close is graceful);
//! - on shutdown the listener closes at once, every connection closes after its answer in
//!   progress, and connections still open `http_drain_ms` later are dropped.
//!
//! The body's own deadline is a request layer (`crate::limits`), because it applies to a
//! request the server has accepted and authenticated.

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
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
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: HEADER_READ_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
            connections_max: usize::try_from(CONNECTIONS_MAX_DEFAULT).unwrap_or(usize::MAX),
            http_drain_ms: HTTP_DRAIN_MS_DEFAULT,
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

async fn connection(
    tcp: TcpStream,
    router: Router,
    limits: ConnectionLimits,
    _permit: OwnedSemaphorePermit,
    closing: CancellationToken,
    dropped: CancellationToken,
) {
    let activity = Activity::new();
    let io = TokioIo::new(Tracked {
        inner: tcp,
        activity: activity.clone(),
    });
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        router.clone().oneshot(request.map(axum::body::Body::new))
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms))
        .keep_alive(true);
    let served = builder.serve_connection(io, service);
    tokio::pin!(served);
    let idle = Duration::from_millis(limits.idle_timeout_ms);
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
                served.as_mut().graceful_shutdown();
                closing_now = true;
            }
            () = tokio::time::sleep_until(idle_at), if !closing_now => {
                if activity.last() + idle <= Instant::now() {
                    tracing::debug!(limits.idle_timeout_ms, "closing an idle connection");
                    served.as_mut().graceful_shutdown();
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
