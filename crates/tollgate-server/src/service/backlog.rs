//! The reconciliation backlog routes (spec/service.md — Routes; SC-110..SC-114): the backlog
//! listing, the evidence fetch and the operator's settlement from stored evidence. All in the
//! key's scope and for the operator role only; none of them loads input or sends a call.

use super::{id, parse};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use serde::{Deserialize, Serialize};
use tollgate_core::ids::OperationKey;
use tollgate_runner::backlog::{
    BacklogEntry, FetchReport, ResolveReport, Selection, BACKLOG_PAGE_MAX,
};
use tollgate_runner::recovery::RECONCILE_PAGE_DEFAULT;
use tollgate_store::KeyRole;

/// Default page of the backlog listing and of `all` settlements.
pub const BACKLOG_PAGE_DEFAULT: u32 = 100;

/// Query of `GET /v1/admin/backlog`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BacklogQuery {
    /// Executions listed at most (default 100, 1..=1000).
    pub limit: Option<u32>,
}

/// `GET /v1/admin/backlog` answer.
#[derive(Debug, Serialize)]
pub struct Backlog {
    /// Oldest first.
    pub backlog: Vec<BacklogEntry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FetchBody {
    limit: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveFromEvidenceBody {
    #[serde(default)]
    keys: Vec<String>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    dry_run: bool,
    limit: Option<u32>,
}

fn operator(who: &Principal) -> Result<(), ApiError> {
    who.require(&[KeyRole::Operator])
}

/// `GET /v1/admin/backlog?limit=…` (SC-112).
///
/// # Errors
/// `unavailable`, `forbidden`.
pub async fn backlog(app: &App, who: &Principal, query: BacklogQuery) -> Result<Backlog, ApiError> {
    operator(who)?;
    let limit = query
        .limit
        .unwrap_or(BACKLOG_PAGE_DEFAULT)
        .clamp(1, BACKLOG_PAGE_MAX);
    let backlog = app.reconciler.backlog(&who.scope, limit).await?;
    Ok(Backlog { backlog })
}

/// `POST /v1/admin/reconcile/fetch-evidence` `{"limit"}` (SC-110): late evidence from the
/// provider for executions awaiting an operator; it never settles.
///
/// # Errors
/// `invalid_request`, `unavailable`, `forbidden`.
pub async fn fetch_evidence(
    app: &App,
    who: &Principal,
    body: &[u8],
) -> Result<FetchReport, ApiError> {
    operator(who)?;
    let body: FetchBody = parse(body)?;
    let limit = body.limit.unwrap_or(RECONCILE_PAGE_DEFAULT);
    let fetchers = app.fetchers.clone();
    let fetcher_for = move |name: &str| fetchers.get(name).cloned();
    Ok(app
        .reconciler
        .fetch_evidence(&who.scope, limit, &fetcher_for)
        .await?)
}

/// `POST /v1/admin/reconcile/resolve-from-evidence` `{"keys" | "all", "dry_run", "limit"}`
/// (SC-111, SC-114): settles executions from their stored exact evidence, or with `dry_run`
/// lists what would be charged.
///
/// # Errors
/// `invalid_request` (neither or both of `keys` and `all`, a bad key, too many keys),
/// `unavailable`, `forbidden`.
pub async fn resolve_from_evidence(
    app: &App,
    who: &Principal,
    body: &[u8],
) -> Result<ResolveReport, ApiError> {
    operator(who)?;
    let body: ResolveFromEvidenceBody = parse(body)?;
    let selection = match (body.all, body.keys.is_empty()) {
        (true, true) => Selection::All(
            body.limit
                .unwrap_or(BACKLOG_PAGE_DEFAULT)
                .clamp(1, BACKLOG_PAGE_MAX),
        ),
        (false, false) if body.keys.len() <= BACKLOG_PAGE_MAX as usize => {
            let keys = body
                .keys
                .into_iter()
                .map(|k| id(OperationKey::parse, k))
                .collect::<Result<Vec<_>, _>>()?;
            Selection::Keys(keys)
        }
        (false, false) => {
            return Err(ApiError::Invalid(format!(
                "at most {BACKLOG_PAGE_MAX} keys per request"
            )))
        }
        _ => {
            return Err(ApiError::Invalid(
                "name either keys or all: true, not both".into(),
            ))
        }
    };
    Ok(app
        .reconciler
        .resolve_from_evidence(&who.scope, &selection, body.dry_run)
        .await?)
}
