//! The HTTP bounds of a request (spec/service.md — Limits and request ids): the request-id span,
//! a concurrency limit (requests over it are answered 503 `unavailable` at once), a request
//! timeout (504 `interrupted`, cause `request_timeout`; a run the request started is told to stop
//! waiting, and a sent call settles in the background), and a body deadline (the whole body
//! within `body_read_timeout_ms`, else 408 `body_timeout`). `crate::gate` puts them in order
//! behind authentication.

use crate::connections::ConnectionLimits;
use crate::error::{ApiError, BODY_BYTES_MAX};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderName};
use axum::response::Response;
use std::time::Duration;

/// Default of `[server] concurrency_limit`: requests served at once.
pub const CONCURRENCY_LIMIT_DEFAULT: u64 = 1_024;
/// Largest `[server] concurrency_limit`.
pub const CONCURRENCY_LIMIT_MAX: u64 = 100_000;
/// Default of `[server] request_timeout_ms`: above the longest `run_timeout_ms` (600,000), so a
/// run's own timeout answers first.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 660_000;
/// Bounds of `[server] request_timeout_ms`.
pub const REQUEST_TIMEOUT_MS_MIN: u64 = 100;
/// Upper bound of `[server] request_timeout_ms`.
pub const REQUEST_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// Default of `[server] body_read_timeout_ms`: the longest a request body may take to arrive.
pub const BODY_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Bounds of `[server] body_read_timeout_ms`.
pub const BODY_READ_TIMEOUT_MS_MIN: u64 = 100;
/// Upper bound of `[server] body_read_timeout_ms`.
pub const BODY_READ_TIMEOUT_MS_MAX: u64 = 600_000;
/// The request-id header.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Paths served without a key: probes, the API document, the console's page and assets (which
/// hold no data; the console's reads are under `/v1/console/` and need a key), and `/metrics`
/// when `[server] metrics_public = true` opts out of its key. Every other route is answered 401
/// without a valid key before its body is read; a path no route serves is 404 for everyone.
pub const PUBLIC_PATHS: &[&str] = &[
    "/healthz",
    "/readyz",
    "/openapi.json",
    "/console",
    "/console/assets/console.js",
    "/console/assets/console.css",
];

/// The `[server]` bounds of a request and of the connections it arrives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests served at once.
    pub concurrency_limit: usize,
    /// Longest a request may take, in milliseconds.
    pub request_timeout_ms: u64,
    /// Longest a request's whole body may take to arrive, in milliseconds.
    pub body_read_timeout_ms: u64,
    /// Whether `GET /metrics` answers without a key on the main listener. `false` (the default)
    /// makes it an operator's route: its counters span every scope (spend totals included).
    pub metrics_public: bool,
    /// Connection bounds (`crate::connections`).
    pub connections: ConnectionLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            concurrency_limit: usize::try_from(CONCURRENCY_LIMIT_DEFAULT).unwrap_or(usize::MAX),
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
            body_read_timeout_ms: BODY_READ_TIMEOUT_MS_DEFAULT,
            metrics_public: false,
            connections: ConnectionLimits::default(),
        }
    }
}

/// Whether `path` is served without a key.
pub fn is_public(path: &str, limits: &Limits) -> bool {
    PUBLIC_PATHS.contains(&path) || (limits.metrics_public && path == "/metrics")
}

/// An answer sent before the request's body was read: the connection closes after it, so the
/// unread body is never read and never kept.
pub(crate) fn unread(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// The request with its whole body read within `timeout_ms` and at most [`BODY_BYTES_MAX`]
/// bytes (413 past it, 408 `body_timeout` when it does not arrive in time, 400 when the body
/// cannot be read).
pub(crate) async fn read_body(request: Request, timeout_ms: u64) -> Result<Request, ApiError> {
    let (parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, BODY_BYTES_MAX);
    let bytes = match tokio::time::timeout(Duration::from_millis(timeout_ms), read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return Err(if over {
                ApiError::TooLarge(BODY_BYTES_MAX)
            } else {
                ApiError::Malformed("cannot read the body".into())
            });
        }
        Err(_) => {
            tracing::warn!(timeout_ms, "request body did not arrive in time");
            return Err(ApiError::BodyTimeout(timeout_ms));
        }
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

pub(crate) fn span(request: &Request) -> tracing::Span {
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.uri().path()
    )
}
