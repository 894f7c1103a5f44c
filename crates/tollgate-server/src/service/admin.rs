//! Operator routes (spec/service.md — Routes), all in the key's scope and requiring the operator
//! role. None of them loads input or sends anything to a provider.

use super::{id, parse, store_failure};
use crate::app::App;
use crate::auth::Principal;
use crate::config::{LEASE_MS_MAX, LEASE_MS_MIN};
use crate::error::ApiError;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::ids::{ExecutionId, OperationKey, RootKey};
use tollgate_core::state::{
    CallKind, ExecutionState, NotDispatchedCause, Outcome, ReconciliationReason,
};
use tollgate_core::usage::Usage;
use tollgate_core::view::View;
use tollgate_runner::recovery::{ExpiredCounts, UsageCounts, RECONCILE_PAGE_MAX};
use tollgate_store::ledger::ledger_limit;
use tollgate_store::{Evidence, KeyRole, LedgerReport};

/// Default page of `reconcile/expired` and of the executions listing.
pub const PAGE_DEFAULT: u32 = 50;
/// Longest provider reference accepted with late evidence, in bytes.
pub const PROVIDER_REF_LEN_MAX_BYTES: usize = 200;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecoverBody {
    operation_key: String,
    lease_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageBody {
    limit: Option<u32>,
    after: Option<i64>,
}

/// Token counts as operators state them (missing classes are zero).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct UsageBody {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    reasoning: u64,
}

impl From<UsageBody> for Usage {
    fn from(u: UsageBody) -> Self {
        Usage {
            input: u.input,
            output: u.output,
            cache_read: u.cache_read,
            cache_write: u.cache_write,
            reasoning: u.reasoning,
        }
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EvidenceBody {
    execution_id: uuid::Uuid,
    usage: UsageBody,
    provider_ref: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResolveBody {
    usage: UsageBody,
    /// Settle even when the usage prices above the execution's hold (audited as
    /// `operator_override`).
    #[serde(default)]
    override_hold: bool,
}

/// Query of `GET /v1/admin/executions`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExecutionsQuery {
    /// State (default `reconciliation_required`).
    pub state: Option<String>,
    /// Page size (default 50, at most 100).
    pub limit: Option<u32>,
}

/// One execution in a listing: metadata only, never the snapshot's prompt or any content.
#[derive(Debug, Clone, Serialize)]
pub struct ExecutionSummary {
    /// Journal row id (what `resolve` takes).
    pub execution_id: ExecutionId,
    /// The caller's key.
    pub operation_key: OperationKey,
    /// Call kind.
    pub kind: CallKind,
    /// Root, for steps.
    pub root_key: Option<RootKey>,
    /// Journal state.
    pub state: ExecutionState,
    /// Why not dispatched.
    pub not_dispatched_cause: Option<NotDispatchedCause>,
    /// Why it waits for an operator (`reconciliation_required` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconciliation_reason: Option<ReconciliationReason>,
    /// Outcome, once completed.
    pub outcome: Option<Outcome>,
    /// Provider name from the execution's snapshot.
    pub provider: String,
    /// Model name from the execution's snapshot.
    pub model: String,
    /// Provider reference, when known.
    pub provider_ref: Option<String>,
    /// Claimed at.
    pub created_at: DateTime<Utc>,
    /// Last transition at.
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/admin/executions` answer.
#[derive(Debug, Serialize)]
pub struct ExecutionList {
    /// Oldest first.
    pub executions: Vec<ExecutionSummary>,
}

fn operator(who: &Principal) -> Result<(), ApiError> {
    who.require(&[KeyRole::Operator])
}

/// `POST /v1/admin/recover` (SC-40, ST-30, SR-11): finishes an execution whose fence expired;
/// otherwise answers with its current view.
///
/// # Errors
/// `not_found`, `invalid_request`, `unavailable`, `forbidden`.
pub async fn recover(app: &App, who: &Principal, body: &[u8]) -> Result<View, ApiError> {
    operator(who)?;
    let body: RecoverBody = parse(body)?;
    let key = id(OperationKey::parse, body.operation_key)?;
    let lease_ms = body.lease_ms.unwrap_or(app.lease_ms);
    if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
        return Err(ApiError::Invalid(format!(
            "lease_ms must be between {LEASE_MS_MIN} and {LEASE_MS_MAX}"
        )));
    }
    let stores = app.backend.stores();
    let record = stores
        .execution(&who.scope, &key)
        .await
        .map_err(|e| store_failure(&key, e))?;
    let found = match (record.and_then(|r| r.root_key), app.any_step_runner()) {
        (Some(root_key), Some(steps)) => {
            steps
                .recover(&app.reconciler, &who.scope, &root_key, &key, lease_ms)
                .await?
        }
        _ => app
            .reconciler
            .recover(&who.scope, &key, lease_ms)
            .await
            .map_err(|e| store_failure(&key, e))?,
    };
    if let Some(view) = found {
        return Ok(view);
    }
    if let Some(structured) = app.structured_runner() {
        if let Some(view) = structured
            .recover(&app.reconciler, &who.scope, &key, lease_ms)
            .await?
        {
            return Ok(view);
        }
    }
    Err(ApiError::NotFound("operation".into()))
}

/// `POST /v1/admin/reconcile/expired` `{"limit"}` (SC-41): executions whose fences expired,
/// then roots.
///
/// # Errors
/// `unavailable`, `forbidden`.
pub async fn reconcile_expired(
    app: &App,
    who: &Principal,
    body: &[u8],
) -> Result<ExpiredCounts, ApiError> {
    operator(who)?;
    let body: PageBody = parse(body)?;
    let limit = body.limit.unwrap_or(PAGE_DEFAULT);
    Ok(app
        .reconciler
        .reconcile_expired(&who.scope, limit, app.lease_ms)
        .await?)
}

/// `POST /v1/admin/reconcile/usage` `{"limit", "after"}` (SC-42).
///
/// # Errors
/// `unavailable`, `forbidden`.
pub async fn reconcile_usage(
    app: &App,
    who: &Principal,
    body: &[u8],
) -> Result<UsageCounts, ApiError> {
    operator(who)?;
    let body: PageBody = parse(body)?;
    let none = |_: &OperationKey| false;
    Ok(app
        .reconciler
        .reconcile_usage(&who.scope, body.limit, body.after, &none)
        .await?)
}

/// `POST /v1/admin/usage-evidence` `{"execution_id", "usage", "provider_ref"}`: late evidence
/// into the inbox. It never rewrites a settlement; reconciliation compares it.
///
/// # Errors
/// `not_found` (no such execution in this scope), `invalid_request`, `unavailable`.
pub async fn usage_evidence(app: &App, who: &Principal, body: &[u8]) -> Result<Evidence, ApiError> {
    operator(who)?;
    let body: EvidenceBody = parse(body)?;
    if body
        .provider_ref
        .as_ref()
        .is_some_and(|r| r.len() > PROVIDER_REF_LEN_MAX_BYTES)
    {
        return Err(ApiError::Invalid(format!(
            "provider_ref is longer than {PROVIDER_REF_LEN_MAX_BYTES} bytes"
        )));
    }
    Ok(app
        .reconciler
        .record_late_evidence(
            &who.scope,
            ExecutionId(body.execution_id),
            body.usage.into(),
            body.provider_ref,
        )
        .await?)
}

/// `GET /v1/admin/executions?state=…&limit=…`.
///
/// # Errors
/// `invalid_request`, `unavailable`, `forbidden`.
pub async fn executions(
    app: &App,
    who: &Principal,
    query: ExecutionsQuery,
) -> Result<ExecutionList, ApiError> {
    operator(who)?;
    let state: ExecutionState = query
        .state
        .as_deref()
        .unwrap_or(ExecutionState::ReconciliationRequired.as_str())
        .parse()
        .map_err(|_| ApiError::Invalid("unknown state".into()))?;
    let limit = query
        .limit
        .unwrap_or(PAGE_DEFAULT)
        .clamp(1, RECONCILE_PAGE_MAX);
    let rows = app
        .backend
        .stores()
        .by_state(&who.scope, state, limit)
        .await?;
    let executions = rows
        .into_iter()
        .map(|r| ExecutionSummary {
            execution_id: r.id,
            kind: r.kind,
            root_key: r.root_key,
            state: r.state,
            not_dispatched_cause: r.not_dispatched_cause,
            reconciliation_reason: r.reconciliation_reason,
            outcome: r.outcome,
            provider: r.binding.config.provider,
            model: r.binding.config.model,
            provider_ref: r.provider_ref,
            created_at: r.created_at,
            updated_at: r.updated_at,
            operation_key: r.operation_key,
        })
        .collect();
    Ok(ExecutionList { executions })
}

/// `POST /v1/admin/executions/{execution_id}/resolve` `{"usage"}`: operator settlement of a
/// `reconciliation_required` execution, priced with its original snapshot (source `operator`).
///
/// # Errors
/// `not_found`, `invalid_state` (not awaiting an operator), `unavailable`, `forbidden`.
pub async fn resolve(
    app: &App,
    who: &Principal,
    execution_id: String,
    body: &[u8],
) -> Result<View, ApiError> {
    operator(who)?;
    let execution_id = uuid::Uuid::parse_str(&execution_id)
        .map(ExecutionId)
        .map_err(|_| ApiError::Invalid("execution_id is not a UUID".into()))?;
    let body: ResolveBody = parse(body)?;
    Ok(app
        .reconciler
        .resolve_stated(
            &who.scope,
            execution_id,
            body.usage.into(),
            body.override_hold,
        )
        .await?)
}

/// Query of `GET /v1/admin/audit/ledger`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LedgerQuery {
    /// The key's own scope, optional: the audit is always of the key's scope, and naming another
    /// scope finds nothing (404).
    pub scope: Option<String>,
    /// Violations listed at most (default 100, clamped to 1..=1000; all are counted).
    pub limit: Option<u32>,
}

/// `GET /v1/admin/audit/ledger?scope=…&limit=…` (SC-93): the ledger audit of the key's scope
/// (spec/storage.md — Ledger audit). Answers 200 with the report whether or not it is clean.
///
/// # Errors
/// `not_found` (another scope), `unavailable`, `forbidden`.
pub async fn audit_ledger(
    app: &App,
    who: &Principal,
    query: LedgerQuery,
) -> Result<LedgerReport, ApiError> {
    operator(who)?;
    if query
        .scope
        .as_deref()
        .is_some_and(|s| s != who.scope.as_str())
    {
        return Err(ApiError::NotFound("scope".into()));
    }
    Ok(app
        .backend
        .stores()
        .audit_ledger(Some(&who.scope), ledger_limit(query.limit))
        .await?)
}
