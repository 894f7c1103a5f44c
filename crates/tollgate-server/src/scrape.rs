//! The metrics address (`[server] metrics_listen`, spec/service.md — Observability): a second
//! listener that serves `GET /metrics` alone, without a key, for a scraper on a private
//! interface. Every other path is 404 there, so nothing else of the service is reachable through
//! it. It runs in the same accept loop as the main listener, with the same connection bounds
//! ([`crate::connections`]), and stops accepting when the server's shutdown fires.

use crate::app::App;
use crate::handlers as h;
use crate::limits::{span, REQUEST_ID};
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use std::future::Future;
use tokio::net::TcpListener;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

/// The path the metrics address serves.
pub const METRICS_PATH: &str = "/metrics";

async fn metrics(State(app): State<App>) -> Response {
    h::prometheus_text(&app)
}

/// The router of the metrics address: `GET /metrics` without a key, 404 for any other path,
/// with the request id and the request span of the main router.
pub fn router(app: App) -> Router {
    Router::new()
        .route(METRICS_PATH, get(metrics))
        .fallback(h::no_route)
        .method_not_allowed_fallback(h::no_method)
        .with_state(app)
        .layer(TraceLayer::new_for_http().make_span_with(span))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

/// Serves [`router`] of `app` on `listener` within the app's connection bounds until `shutdown`
/// completes, then drains its connections as the main listener does.
///
/// # Errors
/// The server failed.
pub async fn run(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let connections = app.limits.connections;
    crate::connections::serve(listener, router(app), connections, shutdown).await
}
