//! The HTTP layers around every route (spec/service.md — Limits and request ids): a request id
//! (`x-request-id`, generated when absent) on every answer and on the `request` span every log
//! line of the request is written in; a concurrency limit (requests over it are answered 503
//! `unavailable` at once); a request timeout (504 `interrupted`, cause `request_timeout`; a run
//! the request started is told to stop waiting, and a sent call settles in the background).

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::HeaderName;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

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
/// The request-id header.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `[server] concurrency_limit` and `request_timeout_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests served at once.
    pub concurrency_limit: usize,
    /// Longest a request may take, in milliseconds.
    pub request_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            concurrency_limit: usize::try_from(CONCURRENCY_LIMIT_DEFAULT).unwrap_or(usize::MAX),
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
        }
    }
}

async fn bounded(
    State((permits, timeout_ms)): State<(Arc<Semaphore>, u64)>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = permits.try_acquire_owned() else {
        tracing::warn!("over the concurrency limit");
        return ApiError::Overloaded.into_response();
    };
    match tokio::time::timeout(Duration::from_millis(timeout_ms), next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(timeout_ms, "request timed out");
            ApiError::RequestTimeout(timeout_ms).into_response()
        }
    }
}

fn span(request: &Request) -> tracing::Span {
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

/// `router` inside the limits and the request-id layers.
pub fn apply(router: Router, limits: Limits) -> Router {
    let permits = Arc::new(Semaphore::new(limits.concurrency_limit.max(1)));
    router
        .layer(middleware::from_fn_with_state(
            (permits, limits.request_timeout_ms),
            bounded,
        ))
        .layer(TraceLayer::new_for_http().make_span_with(span))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::get;
    use tokio::sync::Notify;
    use tower::ServiceExt;

    fn held(gate: Arc<Notify>, entered: Arc<Notify>) -> Router {
        Router::new().route(
            "/hold",
            get(move || async move {
                entered.notify_one();
                gate.notified().await;
                "done"
            }),
        )
    }

    fn get_hold(id: Option<&str>) -> Request {
        let mut builder = Request::builder().uri("/hold");
        if let Some(id) = id {
            builder = builder.header(REQUEST_ID, id);
        }
        builder.body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn sc_139_over_the_concurrency_limit_is_503_and_a_slow_request_is_504() {
        let gate = Arc::new(Notify::new());
        let entered = Arc::new(Notify::new());
        let limits = Limits {
            concurrency_limit: 1,
            request_timeout_ms: 60_000,
        };
        let app = apply(held(gate.clone(), entered.clone()), limits);
        let first = tokio::spawn(app.clone().oneshot(get_hold(None)));
        entered.notified().await;
        let second = app.clone().oneshot(get_hold(None)).await.unwrap();
        assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
        gate.notify_one();
        let first = first.await.unwrap().unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        // The permit is back.
        let third = tokio::spawn(app.clone().oneshot(get_hold(None)));
        entered.notified().await;
        gate.notify_one();
        assert_eq!(third.await.unwrap().unwrap().status(), StatusCode::OK);

        let limits = Limits {
            concurrency_limit: 4,
            request_timeout_ms: 100,
        };
        let app = apply(held(gate, entered), limits);
        let late = app.oneshot(get_hold(None)).await.unwrap();
        assert_eq!(late.status(), StatusCode::GATEWAY_TIMEOUT);
        let body = axum::body::to_bytes(late.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "interrupted");
        assert_eq!(body["error"]["cause"], "request_timeout");
    }

    #[tokio::test]
    async fn sc_138_every_answer_carries_a_request_id() {
        let app = apply(
            Router::new().route("/ok", get(|| async { "ok" })),
            Limits::default(),
        );
        let request = |id: Option<&str>| {
            let mut builder = Request::builder().uri("/ok");
            if let Some(id) = id {
                builder = builder.header(REQUEST_ID, id);
            }
            builder.body(Body::empty()).unwrap()
        };
        let given = app.clone().oneshot(request(Some("req-42"))).await.unwrap();
        assert_eq!(given.headers()[REQUEST_ID], "req-42");
        let generated = app.clone().oneshot(request(None)).await.unwrap();
        let id = generated.headers()[REQUEST_ID].to_str().unwrap();
        assert_eq!(uuid::Uuid::parse_str(id).unwrap().get_version_num(), 4);
        let other = app.oneshot(request(None)).await.unwrap();
        assert_ne!(other.headers()[REQUEST_ID], generated.headers()[REQUEST_ID]);
    }
}
