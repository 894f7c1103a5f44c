//! The console's handlers: the page shell and assets, and one line per `/v1/console/…` read.
//! Every answer carries the console's security headers.

use super::assets::{self, security_headers};
use super::{audit, backlog, execution, finance, overview, session};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::schemas::ErrorBody;
use crate::service::admin::ResolveBody;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

type Answer = Result<Response, ApiError>;
type FinanceQuery = Result<Query<finance::FinanceQuery>, QueryRejection>;

fn json<T: Serialize>(value: T) -> Response {
    (security_headers(), Json(value)).into_response()
}

#[utoipa::path(
    get,
    path = "/console",
    tag = "console",
    security(()),
    responses((status = 200, description = "the console's page shell (no key needed; the page asks for one)", content_type = "text/html", body = String))
)]
/// `GET /console`: the page shell.
pub async fn index() -> Response {
    assets::file("text/html; charset=utf-8", assets::INDEX_HTML)
}

#[utoipa::path(
    get,
    path = "/console/assets/console.js",
    tag = "console",
    security(()),
    responses((status = 200, description = "the console's script", content_type = "text/javascript", body = String))
)]
/// `GET /console/assets/console.js`.
pub async fn script() -> Response {
    assets::file("text/javascript; charset=utf-8", assets::CONSOLE_JS)
}

#[utoipa::path(
    get,
    path = "/console/assets/console.css",
    tag = "console",
    security(()),
    responses((status = 200, description = "the console's stylesheet", content_type = "text/css", body = String))
)]
/// `GET /console/assets/console.css`.
pub async fn stylesheet() -> Response {
    assets::file("text/css; charset=utf-8", assets::CONSOLE_CSS)
}

#[utoipa::path(
    get,
    path = "/v1/console/session",
    tag = "console",
    responses(
        (status = 200, description = "{scope, role, pages}: the pages this key's role sees", body = Object),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: a caller key (operator or finance only)", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `GET /v1/console/session`.
pub async fn whoami(who: Principal) -> Answer {
    session::session(&who).map(json)
}

#[utoipa::path(
    get,
    path = "/v1/console/overview",
    tag = "console",
    responses(
        (status = 200, description = "the overview: calls by outcome, spend by consumer, holds, backlog, scheduler, ledger audit", body = Object),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: a caller key (operator or finance only)", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `GET /v1/console/overview`.
pub async fn overview(State(app): State<App>, who: Principal) -> Answer {
    overview::overview(&app, &who).await.map(json)
}

#[utoipa::path(
    get,
    path = "/v1/console/backlog",
    tag = "console",
    responses(
        (status = 200, description = "the backlog page: executions awaiting an operator with their evidence", body = Object),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not an operator key", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `GET /v1/console/backlog`.
pub async fn backlog(State(app): State<App>, who: Principal) -> Answer {
    backlog::backlog(&app, &who).await.map(json)
}

#[utoipa::path(
    post,
    path = "/v1/console/backlog/{execution_id}/quote",
    tag = "console",
    request_body = ResolveBody,
    params(("execution_id" = String, Path, description = "the execution awaiting an operator")),
    responses(
        (status = 200, description = "the amount resolving with this usage would charge, at the execution's own prices; nothing is written", body = Object),
        (status = 400, description = "invalid_request: unreadable or malformed body, unknown field (the message names the field path)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not an operator key", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 409, description = "invalid_state: not awaiting an operator", body = ErrorBody),
        (status = 422, description = "invalid_request: not a UUID", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `POST /v1/console/backlog/{execution_id}/quote`.
pub async fn quote(
    State(app): State<App>,
    who: Principal,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    backlog::quote(&app, &who, id?.0, &body?).await.map(json)
}

#[utoipa::path(
    get,
    path = "/v1/console/executions/{operation_key}",
    tag = "console",
    params(("operation_key" = String, Path, description = "the operation key")),
    responses(
        (status = 200, description = "one execution's journal row, settlement, evidence and audit rows (metadata only)", body = Object),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not an operator key", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 422, description = "invalid_request: bad identifier", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `GET /v1/console/executions/{operation_key}`.
pub async fn execution(
    State(app): State<App>,
    who: Principal,
    key: Result<Path<String>, PathRejection>,
) -> Answer {
    execution::execution(&app, &who, key?.0).await.map(json)
}

#[utoipa::path(
    get,
    path = "/v1/console/finance",
    tag = "console",
    params(("from" = Option<String>, Query, description = "first day, YYYY-MM-DD"), ("to" = Option<String>, Query, description = "last day, YYYY-MM-DD (default today, UTC)"), ("page" = Option<u32>, Query, description = "table page, from 1"), ("page_size" = Option<u32>, Query, description = "table rows per page (default 50, at most 500)")),
    responses(
        (status = 200, description = "settlements of a range by day, consumer and model, with charts and the price versions in force", body = Object),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not a finance key", body = ErrorBody),
        (status = 400, description = "invalid_request: unknown query field", body = ErrorBody),
        (status = 422, description = "invalid_request: not a day, from after to, a range over 366 days or over 100,000 settlements", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `GET /v1/console/finance`.
pub async fn finance(State(app): State<App>, who: Principal, query: FinanceQuery) -> Answer {
    finance::finance(&app, &who, query?.0).await.map(json)
}

#[utoipa::path(
    get,
    path = "/v1/console/finance/settlements.csv",
    tag = "console",
    params(("from" = Option<String>, Query, description = "first day, YYYY-MM-DD"), ("to" = Option<String>, Query, description = "last day, YYYY-MM-DD (default today, UTC)")),
    responses(
        (status = 200, description = "the range's settlements as CSV (the columns of finance.settlements)", content_type = "text/csv", body = String),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not a finance key", body = ErrorBody),
        (status = 400, description = "invalid_request: unknown query field", body = ErrorBody),
        (status = 422, description = "invalid_request: not a day, from after to, a range over 366 days or over 100,000 settlements", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `GET /v1/console/finance/settlements.csv`.
pub async fn finance_csv(State(app): State<App>, who: Principal, query: FinanceQuery) -> Answer {
    let (name, text) = finance::csv(&app, &who, query?.0).await?;
    let disposition = HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
        .map_err(|_| ApiError::Internal)?;
    Ok((
        security_headers(),
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/csv; charset=utf-8"),
            ),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        text,
    )
        .into_response())
}

#[utoipa::path(
    get,
    path = "/v1/console/audit",
    tag = "console",
    responses(
        (status = 200, description = "the scope's audit chain verified and its ledger audit", body = Object),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not an operator key", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `GET /v1/console/audit`.
pub async fn audit(State(app): State<App>, who: Principal) -> Answer {
    audit::audit(&app, &who).await.map(json)
}
