//! The OpenAPI 3.1 document of the HTTP API (SC-134), generated with `utoipa` from the handlers'
//! annotations ([`crate::handlers`]) and the request and answer types of the service modules.
//! Served at `GET /openapi.json` and checked in as `spec/openapi.json`; the `openapi` test of
//! this crate fails when the two differ or when a route of [`crate::routes::ROUTES`] is missing
//! (regenerate: `TOLLGATE_UPDATE_OPENAPI=1 cargo test -p tollgate-server --test openapi`).
//!
//! Types of the lower crates (the view, evidence, the ledger report, reconciliation counts) are
//! described here by hand, as components named after them: those crates do not depend on
//! `utoipa`.

use crate::console::handlers as c;
use crate::handlers as h;
use crate::schemas::{
    BacklogDoc, ErrorBody, ErrorDetail, EvidenceDoc, ExecutionListDoc, ExpiredCountsDoc,
    FeedPageDoc, FetchBodyDoc, FetchReportDoc, LedgerReportDoc, ResolveFromEvidenceBodyDoc,
    ResolveReportDoc, StatusDoc, UsageCountsDoc, ViewDoc,
};
use crate::service::admin::{EvidenceBody, PageBody, RecoverBody, ResolveBody, UsageBody};
use crate::service::calls::{CallBody, ProfileList};
use crate::service::keys::{KeyList, KeySummary};
use crate::service::openai::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatFunction, ChatMessage, ChatRequest,
    ChatToolCall, ChatUsage, StreamOptions, TollgateExtension,
};
use crate::service::roots::{OpenBody, RootView, StepBody};
use crate::service::InputBody;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi as Document;
use utoipa::{Modify, OpenApi};

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut Document) {
        let scheme = SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("An API key: `Authorization: Bearer tg_…`"))
                .build(),
        );
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("api_key", scheme);
    }
}

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "tollgate",
        description = "A governed LLM call service (spec/service.md).",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    modifiers(&Security),
    security(("api_key" = [])),
    paths(
        h::profiles, h::create_call, h::read_call, h::chat_completions, h::open_root,
        h::read_root, h::run_step, h::read_step, h::close_root, h::recover,
        h::reconcile_expired, h::reconcile_usage, h::fetch_evidence, h::resolve_from_evidence,
        h::backlog, h::usage_evidence, h::executions, h::resolve,
        h::audit_ledger, h::list_keys, h::revoke_key, h::finance_settlements, openapi_json, h::healthz, h::readyz, h::metrics,
        c::index, c::script, c::stylesheet, c::whoami, c::overview, c::backlog, c::quote,
        c::execution, c::finance, c::finance_csv, c::audit
    ),
    components(schemas(
        ErrorBody, ErrorDetail, CallBody, InputBody, OpenBody, StepBody, RootView, ProfileList,
        RecoverBody, PageBody, UsageBody, EvidenceBody, ResolveBody, ChatRequest, ChatMessage,
        StreamOptions, ChatToolCall, ChatFunction, ChatCompletion, ChatChoice, AssistantMessage,
        ChatUsage, TollgateExtension, ViewDoc, EvidenceDoc, LedgerReportDoc, ExpiredCountsDoc,
        UsageCountsDoc, ExecutionListDoc, StatusDoc, KeyList, KeySummary, BacklogDoc, FetchBodyDoc,
        FetchReportDoc, ResolveFromEvidenceBodyDoc, ResolveReportDoc, FeedPageDoc
    ))
)]
pub struct ApiDoc;

/// The document as pretty JSON with a final newline (what `spec/openapi.json` holds).
pub fn document_json() -> String {
    let mut doc = ApiDoc::openapi();
    doc.merge(crate::service::anthropic::AnthropicApi::openapi());
    let mut text = doc.to_pretty_json().unwrap_or_else(|_| "{}".into());
    text.push('\n');
    text
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "health",
    security(()),
    responses((status = 200, description = "this document", content_type = "application/json", body = Object))
)]
/// `GET /openapi.json`: the OpenAPI 3.1 document (spec/openapi.json).
pub async fn openapi_json() -> Response {
    let content_type = [(header::CONTENT_TYPE, "application/json")];
    (content_type, document_json()).into_response()
}
