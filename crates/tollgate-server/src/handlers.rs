//! HTTP handlers: one line each, from extracted values to a service function. Authentication is
//! the [`Principal`] extractor; every rejection becomes an [`ApiError`].

use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::service::admin::{self, ExecutionList, ExecutionsQuery, LedgerQuery};
use crate::service::calls::{self, ProfileList};
use crate::service::openai;
use crate::service::roots::{self, RootView};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tollgate_core::view::View;
use tollgate_runner::recovery::{ExpiredCounts, UsageCounts};
use tollgate_store::{Evidence, LedgerReport};

type Body = Result<Bytes, BytesRejection>;
type One = Result<Path<String>, PathRejection>;
type Two = Result<Path<(String, String)>, PathRejection>;
type Answer<T> = Result<Json<T>, ApiError>;

impl FromRequestParts<App> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, ApiError> {
        let header = parts.headers.get(header::AUTHORIZATION);
        app.keys
            .authenticate(header.and_then(|h| h.to_str().ok()))
            .await
    }
}

/// `GET /v1/profiles`.
pub async fn profiles(State(app): State<App>, who: Principal) -> Answer<ProfileList> {
    calls::profiles(&app, &who).map(Json)
}

/// `POST /v1/calls`.
pub async fn create_call(State(app): State<App>, who: Principal, body: Body) -> Answer<View> {
    calls::create(&app, &who, &body?).await.map(Json)
}

/// `GET /v1/calls/{operation_key}`.
pub async fn read_call(State(app): State<App>, who: Principal, key: One) -> Answer<View> {
    calls::read(&app, &who, key?.0).await.map(Json)
}

/// `POST /v1/roots`.
pub async fn open_root(State(app): State<App>, who: Principal, body: Body) -> Answer<RootView> {
    roots::open(&app, &who, &body?).await.map(Json)
}

/// `POST /v1/roots/{root_key}/steps`.
pub async fn run_step(
    State(app): State<App>,
    who: Principal,
    root: One,
    body: Body,
) -> Answer<View> {
    roots::step(&app, &who, root?.0, &body?).await.map(Json)
}

/// `GET /v1/roots/{root_key}/steps/{operation_key}`.
pub async fn read_step(State(app): State<App>, who: Principal, keys: Two) -> Answer<View> {
    let Path((root, key)) = keys?;
    roots::read_step(&app, &who, root, key).await.map(Json)
}

/// `GET /v1/roots/{root_key}`.
pub async fn read_root(State(app): State<App>, who: Principal, root: One) -> Answer<RootView> {
    roots::read(&app, &who, root?.0).await.map(Json)
}

/// `POST /v1/roots/{root_key}/close`.
pub async fn close_root(State(app): State<App>, who: Principal, root: One) -> Answer<RootView> {
    roots::close(&app, &who, root?.0).await.map(Json)
}

/// `POST /v1/admin/recover`.
pub async fn recover(State(app): State<App>, who: Principal, body: Body) -> Answer<View> {
    admin::recover(&app, &who, &body?).await.map(Json)
}

/// `POST /v1/admin/reconcile/expired`.
pub async fn reconcile_expired(
    State(app): State<App>,
    who: Principal,
    body: Body,
) -> Answer<ExpiredCounts> {
    admin::reconcile_expired(&app, &who, &body?).await.map(Json)
}

/// `POST /v1/admin/reconcile/usage`.
pub async fn reconcile_usage(
    State(app): State<App>,
    who: Principal,
    body: Body,
) -> Answer<UsageCounts> {
    admin::reconcile_usage(&app, &who, &body?).await.map(Json)
}

/// `POST /v1/admin/usage-evidence`.
pub async fn usage_evidence(
    State(app): State<App>,
    who: Principal,
    body: Body,
) -> Answer<Evidence> {
    admin::usage_evidence(&app, &who, &body?).await.map(Json)
}

/// `GET /v1/admin/executions`.
pub async fn executions(
    State(app): State<App>,
    who: Principal,
    query: Result<Query<ExecutionsQuery>, QueryRejection>,
) -> Answer<ExecutionList> {
    admin::executions(&app, &who, query?.0).await.map(Json)
}

/// `POST /v1/admin/executions/{execution_id}/resolve`.
pub async fn resolve(State(app): State<App>, who: Principal, id: One, body: Body) -> Answer<View> {
    admin::resolve(&app, &who, id?.0, &body?).await.map(Json)
}

/// `GET /v1/admin/audit/ledger`.
pub async fn audit_ledger(
    State(app): State<App>,
    who: Principal,
    query: Result<Query<LedgerQuery>, QueryRejection>,
) -> Answer<LedgerReport> {
    admin::audit_ledger(&app, &who, query?.0).await.map(Json)
}

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz`: the stores answer (and on Postgres, migrations are current).
pub async fn readyz(State(app): State<App>) -> Result<Json<Value>, ApiError> {
    crate::service::ready(&app).await.map(Json)
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(app): State<App>) -> Response {
    let content_type = [(header::CONTENT_TYPE, "text/plain; version=0.0.4")];
    (content_type, app.metrics.render()).into_response()
}

/// Unknown routes.
pub async fn no_route() -> ApiError {
    ApiError::NoRoute(StatusCode::NOT_FOUND)
}

/// Known routes, wrong method.
pub async fn no_method() -> ApiError {
    ApiError::NoRoute(StatusCode::METHOD_NOT_ALLOWED)
}

/// `POST /v1/chat/completions`: the OpenAI-compatible front door; errors in OpenAI's shape.
pub async fn chat_completions(
    State(app): State<App>,
    who: Result<Principal, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = match (who, body) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(ApiError::from(e)),
        (Ok(who), Ok(body)) => openai::complete(&app, &who, &headers, &body).await,
    };
    match result {
        Ok(answer) if answer.stream => {
            let content_type = [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ];
            (content_type, openai::sse_body(&answer)).into_response()
        }
        Ok(answer) => Json(answer.completion).into_response(),
        Err(e) => (e.status_code(), Json(openai::error_body(&e))).into_response(),
    }
}
