//! The routes table (spec/service.md — Routes): nothing but paths, methods and handlers.

use crate::app::App;
use crate::console::handlers as c;
use crate::handlers as h;
use crate::service::anthropic;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

pub use crate::error::BODY_BYTES_MAX;

macro_rules! table {
    ($($method:ident $path:literal => $handler:path),* $(,)?) => {
        /// Every route as `(method, path)`: the OpenAPI test checks each is documented. The
        /// router registers routes here only ([`router`] adds no other), so this is the list
        /// of what it serves.
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        fn routes(router: Router<App>) -> Router<App> {
            router $(.route($path, $method($handler)))*
        }
    };
}

table! {
    get "/v1/profiles" => h::profiles,
    post "/v1/calls" => h::create_call,
    get "/v1/calls/{operation_key}" => h::read_call,
    post "/v1/chat/completions" => h::chat_completions,
    // The Anthropic Messages door (spec/anthropic.md).
    post "/v1/messages" => anthropic::messages_route,
    post "/v1/messages/count_tokens" => anthropic::count_tokens_route,
    post "/v1/roots" => h::open_root,
    get "/v1/roots/{root_key}" => h::read_root,
    post "/v1/roots/{root_key}/steps" => h::run_step,
    get "/v1/roots/{root_key}/steps/{operation_key}" => h::read_step,
    post "/v1/roots/{root_key}/close" => h::close_root,
    post "/v1/admin/recover" => h::recover,
    post "/v1/admin/reconcile/expired" => h::reconcile_expired,
    post "/v1/admin/reconcile/usage" => h::reconcile_usage,
    post "/v1/admin/reconcile/fetch-evidence" => h::fetch_evidence,
    post "/v1/admin/reconcile/resolve-from-evidence" => h::resolve_from_evidence,
    get "/v1/admin/backlog" => h::backlog,
    post "/v1/admin/usage-evidence" => h::usage_evidence,
    get "/v1/admin/executions" => h::executions,
    post "/v1/admin/executions/{execution_id}/resolve" => h::resolve,
    get "/v1/admin/audit/ledger" => h::audit_ledger,
    get "/v1/admin/keys" => h::list_keys,
    post "/v1/admin/keys/{id}/revoke" => h::revoke_key,
    get "/v1/finance/settlements" => h::finance_settlements,
    get "/openapi.json" => crate::openapi::openapi_json,
    get "/healthz" => h::healthz,
    get "/readyz" => h::readyz,
    get "/metrics" => h::metrics,
    // The console's page, assets and reads (spec/service.md — Console).
    get "/console" => c::index,
    get "/console/assets/console.js" => c::script,
    get "/console/assets/console.css" => c::stylesheet,
    get "/v1/console/session" => c::whoami,
    get "/v1/console/overview" => c::overview,
    get "/v1/console/backlog" => c::backlog,
    post "/v1/console/backlog/{execution_id}/quote" => c::quote,
    get "/v1/console/executions/{operation_key}" => c::execution,
    get "/v1/console/finance" => c::finance,
    get "/v1/console/finance/settlements.csv" => c::finance_csv,
    get "/v1/console/audit" => c::audit,
}

/// The router of the service, inside the authentication, limits and request-id layers
/// ([`crate::gate`]).
pub fn router(app: App) -> Router {
    let limits = app.limits;
    let keys = app.keys.clone();
    // Every route comes from the table: no `.route`, `.nest` or `.merge` beside it (the
    // OpenAPI test checks this file for them).
    let router = routes(Router::new())
        .fallback(h::no_route)
        .method_not_allowed_fallback(h::no_method)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(app);
    crate::gate::with_routes(router, limits, keys, ROUTES)
}
