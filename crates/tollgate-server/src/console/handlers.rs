//! The console's handlers: the page shell and assets, and one line per `/v1/console/…` read.
//! Every answer carries the console's security headers.

use super::assets::{self, security_headers};
use super::{audit, backlog, execution, finance, overview, session};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
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

/// `GET /console`: the page shell.
pub async fn index() -> Response {
    assets::file("text/html; charset=utf-8", assets::INDEX_HTML)
}

/// `GET /console/assets/console.js`.
pub async fn script() -> Response {
    assets::file("text/javascript; charset=utf-8", assets::CONSOLE_JS)
}

/// `GET /console/assets/console.css`.
pub async fn stylesheet() -> Response {
    assets::file("text/css; charset=utf-8", assets::CONSOLE_CSS)
}

/// `GET /v1/console/session`.
pub async fn whoami(who: Principal) -> Answer {
    session::session(&who).map(json)
}

/// `GET /v1/console/overview`.
pub async fn overview(State(app): State<App>, who: Principal) -> Answer {
    overview::overview(&app, &who).await.map(json)
}

/// `GET /v1/console/backlog`.
pub async fn backlog(State(app): State<App>, who: Principal) -> Answer {
    backlog::backlog(&app, &who).await.map(json)
}

/// `POST /v1/console/backlog/{execution_id}/quote`.
pub async fn quote(
    State(app): State<App>,
    who: Principal,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    backlog::quote(&app, &who, id?.0, &body?).await.map(json)
}

/// `GET /v1/console/executions/{operation_key}`.
pub async fn execution(
    State(app): State<App>,
    who: Principal,
    key: Result<Path<String>, PathRejection>,
) -> Answer {
    execution::execution(&app, &who, key?.0).await.map(json)
}

/// `GET /v1/console/finance`.
pub async fn finance(State(app): State<App>, who: Principal, query: FinanceQuery) -> Answer {
    finance::finance(&app, &who, query?.0).await.map(json)
}

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

/// `GET /v1/console/audit`.
pub async fn audit(State(app): State<App>, who: Principal) -> Answer {
    audit::audit(&app, &who).await.map(json)
}
