//! The routes table (spec/service.md — Routes): nothing but paths, methods and handlers.

use crate::app::App;
use crate::handlers as h;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

/// Largest request body, in bytes. Inputs are bounded per profile (`max_input_chars`, at most
/// ten million UTF-16 code units); this bounds what is read before that check.
pub const BODY_BYTES_MAX: usize = 32 * 1024 * 1024;

/// The router of the service.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/v1/profiles", get(h::profiles))
        .route("/v1/calls", post(h::create_call))
        .route("/v1/calls/{operation_key}", get(h::read_call))
        .route("/v1/chat/completions", post(h::chat_completions))
        .route("/v1/roots", post(h::open_root))
        .route("/v1/roots/{root_key}", get(h::read_root))
        .route("/v1/roots/{root_key}/steps", post(h::run_step))
        .route(
            "/v1/roots/{root_key}/steps/{operation_key}",
            get(h::read_step),
        )
        .route("/v1/roots/{root_key}/close", post(h::close_root))
        .route("/v1/admin/recover", post(h::recover))
        .route("/v1/admin/reconcile/expired", post(h::reconcile_expired))
        .route("/v1/admin/reconcile/usage", post(h::reconcile_usage))
        .route("/v1/admin/usage-evidence", post(h::usage_evidence))
        .route("/v1/admin/executions", get(h::executions))
        .route(
            "/v1/admin/executions/{execution_id}/resolve",
            post(h::resolve),
        )
        .route("/v1/admin/audit/ledger", get(h::audit_ledger))
        .route("/healthz", get(h::healthz))
        .route("/readyz", get(h::readyz))
        .route("/metrics", get(h::metrics))
        .fallback(h::no_route)
        .method_not_allowed_fallback(h::no_method)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(app)
}
