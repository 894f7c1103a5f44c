//! HTTP handlers: one line each, from extracted values to a service function. Authentication is
//! the [`Principal`] extractor; every rejection becomes an [`ApiError`].

use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::schemas::ErrorBody;
use crate::schemas::{
    BacklogDoc, EvidenceDoc, ExecutionListDoc, ExpiredCountsDoc, FeedPageDoc, FetchBodyDoc,
    FetchReportDoc, LedgerReportDoc, ResolveFromEvidenceBodyDoc, ResolveReportDoc, StatusDoc,
    UsageCountsDoc, ViewDoc,
};
use crate::service::admin::{self, ExecutionList, ExecutionsQuery, LedgerQuery};
use crate::service::admin::{EvidenceBody, PageBody, RecoverBody, ResolveBody};
use crate::service::backlog::{self, Backlog, BacklogQuery};
use crate::service::calls::CallBody;
use crate::service::calls::{self, ProfileList};
use crate::service::finance::{self, FeedPage, FeedQuery};
use crate::service::keys::{self, KeyList, KeySummary};
use crate::service::openai::{self, ChatCompletion, ChatRequest};
use crate::service::roots::{self, RootView};
use crate::service::roots::{OpenBody, StepBody};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tollgate_core::view::View;
use tollgate_runner::backlog::{FetchReport, ResolveReport};
use tollgate_runner::recovery::{ExpiredCounts, UsageCounts};
use tollgate_store::{Evidence, LedgerReport};

type Body = Result<Bytes, BytesRejection>;
type One = Result<Path<String>, PathRejection>;
type Two = Result<Path<(String, String)>, PathRejection>;
type Answer<T> = Result<Json<T>, ApiError>;

impl FromRequestParts<App> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, ApiError> {
        // The authentication layer (`crate::limits`) has read the key before the body.
        if let Some(principal) = parts.extensions.get::<Principal>() {
            return Ok(principal.clone());
        }
        let header = parts.headers.get(header::AUTHORIZATION);
        app.keys
            .authenticate(header.and_then(|h| h.to_str().ok()))
            .await
    }
}

/// `GET /v1/profiles`.
#[utoipa::path(
    get,
    path = "/v1/profiles",
    tag = "calls",
    responses(
        (status = 200, description = "the loaded profiles", body = ProfileList),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn profiles(State(app): State<App>, who: Principal) -> Answer<ProfileList> {
    calls::profiles(&app, &who).map(Json)
}

/// `POST /v1/calls`.
#[utoipa::path(
    post,
    path = "/v1/calls",
    tag = "calls",
    request_body = CallBody,
    responses(
        (status = 200, description = "the view", body = ViewDoc),
        (status = 400, description = "invalid_request: unreadable or malformed body, unknown field (the message names the field path)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 402, description = "cap_blocked: `kind` holds_in_flight (Retry-After: room comes as other calls settle) or exceeds_cap (no retry helps)", body = ErrorBody),
        (status = 429, description = "rate_limited: a rate or concurrency limit of the consumer or the key (Retry-After, retry-after-ms, x-ratelimit-* headers); nothing written or sent", body = ErrorBody),
        (status = 422, description = "invalid_request: unknown profile, wrong kind, bad identifier or input; conflict: the key was first used with another request (`fields` names what differs; no retry helps)", body = ErrorBody),
        (status = 409, description = "in_progress: the key's first request is still being processed; retry after Retry-After for the stored answer", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later (Retry-After)", body = ErrorBody),
        (status = 504, description = "interrupted: the run stopped waiting; a sent call finishes in the background (Retry-After)", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn create_call(
    State(app): State<App>,
    who: Principal,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let call: Result<CallBody, ApiError> = crate::service::parse(&body);
    if let Ok(call) = &call {
        let profile = Some(call.profile.as_str());
        if let Some(answer) =
            crate::service::owner::call_elsewhere(&app, &who, profile, &uri, &headers, &body).await
        {
            return answer;
        }
    }
    calls::create(&app, &who, call)
        .await
        .map(Json)
        .into_response()
}

/// `GET /v1/calls/{operation_key}`.
#[utoipa::path(
    get,
    path = "/v1/calls/{operation_key}",
    tag = "calls",
    params(("operation_key" = String, Path, description = "the caller's key")),
    responses(
        (status = 200, description = "the view", body = ViewDoc),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 422, description = "invalid_request: bad identifier", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn read_call(State(app): State<App>, who: Principal, key: One) -> Answer<View> {
    calls::read(&app, &who, key?.0).await.map(Json)
}

/// `POST /v1/roots`.
#[utoipa::path(
    post,
    path = "/v1/roots",
    tag = "roots",
    request_body = OpenBody,
    responses(
        (status = 200, description = "the root view", body = RootView),
        (status = 400, description = "invalid_request: unreadable or malformed body, unknown field (the message names the field path)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 422, description = "invalid_request: unknown profile, wrong kind, bad identifier or input; conflict: the root key is bound differently", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn open_root(State(app): State<App>, who: Principal, body: Body) -> Answer<RootView> {
    roots::open(&app, &who, &body?).await.map(Json)
}

/// `POST /v1/roots/{root_key}/steps`.
#[utoipa::path(
    post,
    path = "/v1/roots/{root_key}/steps",
    tag = "roots",
    request_body = StepBody,
    params(("root_key" = String, Path, description = "the root")),
    responses(
        (status = 200, description = "the view", body = ViewDoc),
        (status = 400, description = "invalid_request: unreadable or malformed body, unknown field (the message names the field path)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 402, description = "cap_blocked: `kind` holds_in_flight (Retry-After) or exceeds_cap", body = ErrorBody),
        (status = 429, description = "rate_limited: a rate or concurrency limit of the consumer or the key (Retry-After, retry-after-ms, x-ratelimit-* headers); nothing written or sent", body = ErrorBody),
        (status = 422, description = "invalid_request: unknown profile, wrong kind, bad identifier or input; conflict: the key was first used with another request or under another root", body = ErrorBody),
        (status = 409, description = "root_closed, root_expired, invalid_state", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later (Retry-After)", body = ErrorBody),
        (status = 504, description = "interrupted (Retry-After)", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn run_step(
    State(app): State<App>,
    who: Principal,
    root: One,
    body: Body,
) -> Answer<View> {
    roots::step(&app, &who, root?.0, &body?).await.map(Json)
}

/// `GET /v1/roots/{root_key}/steps/{operation_key}`.
#[utoipa::path(
    get,
    path = "/v1/roots/{root_key}/steps/{operation_key}",
    tag = "roots",
    params(("root_key" = String, Path, description = "the root"), ("operation_key" = String, Path, description = "the step's key")),
    responses(
        (status = 200, description = "the view", body = ViewDoc),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 422, description = "invalid_request: bad identifier", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn read_step(State(app): State<App>, who: Principal, keys: Two) -> Answer<View> {
    let Path((root, key)) = keys?;
    roots::read_step(&app, &who, root, key).await.map(Json)
}

/// `GET /v1/roots/{root_key}`.
#[utoipa::path(
    get,
    path = "/v1/roots/{root_key}",
    tag = "roots",
    params(("root_key" = String, Path, description = "the root")),
    responses(
        (status = 200, description = "the root view", body = RootView),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 422, description = "invalid_request: bad identifier", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn read_root(State(app): State<App>, who: Principal, root: One) -> Answer<RootView> {
    roots::read(&app, &who, root?.0).await.map(Json)
}

/// `POST /v1/roots/{root_key}/close`.
#[utoipa::path(
    post,
    path = "/v1/roots/{root_key}/close",
    tag = "roots",
    params(("root_key" = String, Path, description = "the root")),
    responses(
        (status = 200, description = "the root view (idempotent)", body = RootView),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 422, description = "invalid_request: bad identifier", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn close_root(State(app): State<App>, who: Principal, root: One) -> Answer<RootView> {
    roots::close(&app, &who, root?.0).await.map(Json)
}

/// `POST /v1/admin/recover`.
#[utoipa::path(
    post,
    path = "/v1/admin/recover",
    tag = "admin",
    request_body = RecoverBody,
    responses(
        (status = 200, description = "the view (the current one when nothing was eligible)", body = ViewDoc),
        (status = 400, description = "invalid_request: unreadable or malformed body, unknown field (the message names the field path)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 422, description = "invalid_request: unknown profile, wrong kind, bad identifier or input", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn recover(State(app): State<App>, who: Principal, body: Body) -> Answer<View> {
    admin::recover(&app, &who, &body?).await.map(Json)
}

/// `POST /v1/admin/reconcile/expired`.
#[utoipa::path(
    post,
    path = "/v1/admin/reconcile/expired",
    tag = "admin",
    request_body = PageBody,
    responses(
        (status = 200, description = "counts", body = ExpiredCountsDoc),
        (status = 400, description = "invalid_request: unreadable or malformed body, unknown field (the message names the field path)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn reconcile_expired(
    State(app): State<App>,
    who: Principal,
    body: Body,
) -> Answer<ExpiredCounts> {
    admin::reconcile_expired(&app, &who, &body?).await.map(Json)
}

/// `POST /v1/admin/reconcile/usage`.
#[utoipa::path(
    post,
    path = "/v1/admin/reconcile/usage",
    tag = "admin",
    request_body = PageBody,
    responses(
        (status = 200, description = "counts and cursor", body = UsageCountsDoc),
        (status = 400, description = "invalid_request: unreadable or malformed body, unknown field (the message names the field path)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn reconcile_usage(
    State(app): State<App>,
    who: Principal,
    body: Body,
) -> Answer<UsageCounts> {
    admin::reconcile_usage(&app, &who, &body?).await.map(Json)
}

/// `POST /v1/admin/usage-evidence`.
#[utoipa::path(
    post,
    path = "/v1/admin/usage-evidence",
    tag = "admin",
    request_body = EvidenceBody,
    responses(
        (status = 200, description = "the evidence row (source late)", body = EvidenceDoc),
        (status = 400, description = "invalid_request: unreadable or malformed body, unknown field (the message names the field path)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 422, description = "invalid_request: unknown profile, wrong kind, bad identifier or input", body = ErrorBody),
        (status = 409, description = "invalid_state", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn usage_evidence(
    State(app): State<App>,
    who: Principal,
    body: Body,
) -> Answer<Evidence> {
    admin::usage_evidence(&app, &who, &body?).await.map(Json)
}

/// `GET /v1/admin/executions`.
#[utoipa::path(
    get,
    path = "/v1/admin/executions",
    tag = "admin",
    params(ExecutionsQuery),
    responses(
        (status = 200, description = "executions, oldest first", body = ExecutionListDoc),
        (status = 400, description = "invalid_request: unknown or malformed query field", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 422, description = "invalid_request: unknown profile, wrong kind, bad identifier or input", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn executions(
    State(app): State<App>,
    who: Principal,
    query: Result<Query<ExecutionsQuery>, QueryRejection>,
) -> Answer<ExecutionList> {
    admin::executions(&app, &who, query?.0).await.map(Json)
}

/// `POST /v1/admin/executions/{execution_id}/resolve`.
#[utoipa::path(
    post,
    path = "/v1/admin/executions/{execution_id}/resolve",
    tag = "admin",
    request_body = ResolveBody,
    params(("execution_id" = String, Path, description = "the journal row")),
    responses(
        (status = 200, description = "the view (source operator)", body = ViewDoc),
        (status = 400, description = "invalid_request: unreadable or malformed body, unknown field (the message names the field path)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 422, description = "invalid_request: unknown profile, wrong kind, bad identifier or input", body = ErrorBody),
        (status = 409, description = "invalid_state", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn resolve(State(app): State<App>, who: Principal, id: One, body: Body) -> Answer<View> {
    admin::resolve(&app, &who, id?.0, &body?).await.map(Json)
}

/// `GET /v1/admin/audit/ledger`.
#[utoipa::path(
    get,
    path = "/v1/admin/audit/ledger",
    tag = "admin",
    params(LedgerQuery),
    responses(
        (status = 200, description = "the ledger audit report, clean or not", body = LedgerReportDoc),
        (status = 400, description = "invalid_request: unknown or malformed query field", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn audit_ledger(
    State(app): State<App>,
    who: Principal,
    query: Result<Query<LedgerQuery>, QueryRejection>,
) -> Answer<LedgerReport> {
    admin::audit_ledger(&app, &who, query?.0).await.map(Json)
}

/// `GET /v1/admin/backlog`.
#[utoipa::path(
    get,
    path = "/v1/admin/backlog",
    tag = "admin",
    params(("limit" = Option<u32>, Query, description = "listed at most (default 100, 1..=1000)")),
    responses(
        (status = 200, description = "the scope's reconciliation backlog, oldest first", body = BacklogDoc),
        (status = 400, description = "invalid_request: unknown or malformed query field", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not an operator key", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn backlog(
    State(app): State<App>,
    who: Principal,
    query: Result<Query<BacklogQuery>, QueryRejection>,
) -> Answer<Backlog> {
    backlog::backlog(&app, &who, query?.0).await.map(Json)
}

/// `GET /v1/finance/settlements`.
#[utoipa::path(
    get,
    path = "/v1/finance/settlements",
    tag = "finance",
    params(
        ("after" = Option<String>, Query, description = "resume after this cursor (a `cursor` or `next` of an earlier page); from the start when absent"),
        ("limit" = Option<u32>, Query, description = "listed at most (default 100, 1..=1000)")
    ),
    responses(
        (status = 200, description = "the scope's settlements after the cursor, in feed order; a row that commits later never sorts before a cursor already handed out", body = FeedPageDoc),
        (status = 400, description = "invalid_request: unknown or malformed query field", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not a finance key", body = ErrorBody),
        (status = 422, description = "invalid_request: not a cursor of this feed", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn finance_settlements(
    State(app): State<App>,
    who: Principal,
    query: Result<Query<FeedQuery>, QueryRejection>,
) -> Answer<FeedPage> {
    finance::settlements(&app, &who, query?.0).await.map(Json)
}

/// `POST /v1/admin/reconcile/fetch-evidence`.
#[utoipa::path(
    post,
    path = "/v1/admin/reconcile/fetch-evidence",
    tag = "admin",
    request_body = FetchBodyDoc,
    responses(
        (status = 200, description = "what the fetch stored; it never settles", body = FetchReportDoc),
        (status = 400, description = "invalid_request: malformed body or unknown field", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 422, description = "invalid_request", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not an operator key", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn fetch_evidence(
    State(app): State<App>,
    who: Principal,
    body: Body,
) -> Answer<FetchReport> {
    backlog::fetch_evidence(&app, &who, &body?).await.map(Json)
}

/// `POST /v1/admin/reconcile/resolve-from-evidence`.
#[utoipa::path(
    post,
    path = "/v1/admin/reconcile/resolve-from-evidence",
    tag = "admin",
    request_body = ResolveFromEvidenceBodyDoc,
    responses(
        (status = 200, description = "each execution settled, listed (dry run) or skipped", body = ResolveReportDoc),
        (status = 400, description = "invalid_request: malformed body or unknown field", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 422, description = "invalid_request: neither or both of keys and all", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden: not an operator key", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
pub async fn resolve_from_evidence(
    State(app): State<App>,
    who: Principal,
    body: Body,
) -> Answer<ResolveReport> {
    backlog::resolve_from_evidence(&app, &who, &body?)
        .await
        .map(Json)
}

#[utoipa::path(
    get,
    path = "/v1/admin/keys",
    tag = "admin",
    responses(
        (status = 200, description = "the keys of the operator's scope, configured and stored (never a key)", body = KeyList),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `GET /v1/admin/keys`.
pub async fn list_keys(State(app): State<App>, who: Principal) -> Answer<KeyList> {
    keys::list(&app, &who).await.map(Json)
}

#[utoipa::path(
    post,
    path = "/v1/admin/keys/{id}/revoke",
    tag = "admin",
    params(("id" = String, Path, description = "the key's id (its SHA-256 in hex)")),
    responses(
        (status = 200, description = "the revoked key (idempotent)", body = KeySummary),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found: no such key in the operator's scope", body = ErrorBody),
        (status = 409, description = "key_in_config: a key of [[keys]] in the configuration, which cannot be revoked", body = ErrorBody),
        (status = 422, description = "invalid_request: not a key id", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody)
    )
)]
/// `POST /v1/admin/keys/{id}/revoke`.
pub async fn revoke_key(State(app): State<App>, who: Principal, id: One) -> Answer<KeySummary> {
    keys::revoke(&app, &who, id?.0).await.map(Json)
}

/// `GET /healthz`: the process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    responses(
        (status = 200, description = "up", body = StatusDoc)
    ),
    security(())
)]
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz`: the stores answer (and on Postgres, migrations are current).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    responses(
        (status = 200, description = "ready", body = StatusDoc),
        (status = 503, description = "unavailable: read the operation back later", body = ErrorBody)
    ),
    security(())
)]
pub async fn readyz(State(app): State<App>) -> Result<Json<Value>, ApiError> {
    crate::service::ready(&app).await.map(Json)
}

/// `GET /metrics`: Prometheus text, an operator's read.
///
/// The counters span every scope (spend totals included), so the route takes an operator key
/// unless `[server] metrics_public = true`; `[server] metrics_listen` serves it without a key on
/// an address of its own.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "health",
    responses(
        (status = 200, description = "Prometheus text", content_type = "text/plain", body = String),
        (status = 401, description = "unauthenticated (not with `[server] metrics_public = true`)", body = ErrorBody),
        (status = 403, description = "forbidden: not an operator key", body = ErrorBody),
        (status = 503, description = "unavailable: too many key reads in flight", body = ErrorBody)
    )
)]
pub async fn metrics(State(app): State<App>, mut parts: Parts) -> Result<Response, ApiError> {
    if !app.limits.metrics_public {
        // The authentication layer has put the principal in, or answered 401 already.
        let who = Principal::from_request_parts(&mut parts, &app).await?;
        who.require(&[tollgate_store::KeyRole::Operator])?;
    }
    Ok(prometheus_text(&app))
}

/// The metrics as a Prometheus text answer, whoever asked.
pub fn prometheus_text(app: &App) -> Response {
    let content_type = [(header::CONTENT_TYPE, "text/plain; version=0.0.4")];
    let mut text = app.metrics.render();
    if let Some(cluster) = &app.cluster {
        cluster.render(&mut text);
    }
    (content_type, text).into_response()
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
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    request_body = ChatRequest,
    params(
        ("Idempotency-Key" = String, Header, description = "the operation key (required)"),
        ("Tollgate-Session" = Option<String>, Header, description = "session id (default `default`)"),
        ("Tollgate-Intent" = Option<String>, Header, description = "intent (default `chat.completions`)"),
        ("Tollgate-Input-Revision" = Option<String>, Header, description = "input revision (default: a digest of the messages)"),
        ("Tollgate-Root" = Option<String>, Header, description = "the root of a step profile's step (required on step profiles)")
    ),
    responses(
        (status = 200, description = "a chat.completion, or with `stream: true` server-sent chat.completion.chunk events then `data: [DONE]`", body = ChatCompletion),
        (status = 400, description = "invalid_request: no Idempotency-Key, malformed body, a field refused by name, a value above the profile's or a field the profile fixes (OpenAI error shape)", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 402, description = "cap_blocked: `kind` holds_in_flight (Retry-After) or exceeds_cap (no retry helps)", body = ErrorBody),
        (status = 429, description = "rate_limited: a rate or concurrency limit of the consumer or the key (Retry-After, retry-after-ms, x-ratelimit-* headers); nothing written or sent", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found: the root", body = ErrorBody),
        (status = 409, description = "in_progress (Retry-After: the SDKs retry and get the stored completion), root_closed, root_expired, invalid_state", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within [server] body_read_timeout_ms", body = ErrorBody),
        (status = 422, description = "invalid_request: unknown profile, system message, bad identifier or input; conflict: the Idempotency-Key was first used with another request (the SDKs do not retry); not_dispatched: the key's call never went out, nothing charged", body = ErrorBody),
        (status = 500, description = "internal", body = ErrorBody),
        (status = 502, description = "reconciliation_required: the key's call may have been sent, its cost is not proven; it waits for an operator (x-should-retry: false)", body = ErrorBody),
        (status = 503, description = "unavailable (Retry-After)", body = ErrorBody),
        (status = 504, description = "interrupted (Retry-After)", body = ErrorBody)
    )
)]
pub async fn chat_completions(
    State(app): State<App>,
    who: Result<Principal, ApiError>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = match (who, body) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(ApiError::from(e)),
        (Ok(who), Ok(body)) => {
            let (peek, elsewhere) =
                crate::service::owner::door_elsewhere(&app, &who, &uri, &headers, &body).await;
            if let Some(answer) = elsewhere {
                return answer;
            }
            if peek.stream {
                let model = peek.model.unwrap_or_default();
                return openai::live_response(app, who, headers, body, model).await;
            }
            openai::complete(&app, &who, &headers, &body).await
        }
    };
    // A stream went to `live_response` above.
    match result {
        Ok(answer) => Json(answer.completion).into_response(),
        Err(e) => openai::error_response(&e),
    }
}
