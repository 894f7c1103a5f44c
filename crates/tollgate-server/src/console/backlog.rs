//! The backlog page (operators): executions awaiting an operator, listed by the reconciler's
//! backlog (the call `GET /v1/admin/backlog` makes) with their age, hold, provider reference and
//! evidence status, and the quote of a resolution with stated usage — the amount it will charge,
//! priced with the execution's own snapshot, before anything is charged. The page settles with
//! the admin routes themselves: `POST /v1/admin/reconcile/resolve-from-evidence` (dry run first)
//! and `POST /v1/admin/executions/{execution_id}/resolve`.

use super::session::{allow, Page};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::service::parse;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::ids::{ConsumerId, ExecutionId, OperationKey};
use tollgate_core::money::{Currency, Money};
use tollgate_core::state::{ExecutionState, ReconciliationReason};
use tollgate_core::usage::Usage;
use tollgate_runner::backlog::EvidenceStatus;
use tollgate_store::{Evidence, EvidenceSource};

/// Executions listed, at most (oldest first).
pub const BACKLOG_ROWS_MAX: u32 = 200;

/// The latest usage evidence of an execution.
#[derive(Debug, Serialize)]
pub struct EvidenceBrief {
    /// Usage reported.
    pub usage: Usage,
    /// Whether it is exact.
    pub exact: bool,
    /// `stream`, `recovery`, `late`, `operator`.
    pub source: EvidenceSource,
    /// Received at.
    pub received_at: DateTime<Utc>,
    /// Whether reconciliation acknowledged it.
    pub acknowledged: bool,
    /// What it would charge, priced with the execution's snapshot.
    pub amount: Option<Money>,
}

/// One execution awaiting an operator: metadata only.
#[derive(Debug, Serialize)]
pub struct BacklogItem {
    /// What `resolve` takes.
    pub execution_id: ExecutionId,
    /// The caller's key (the execution page's address).
    pub operation_key: OperationKey,
    /// Consumer charged.
    pub consumer: ConsumerId,
    /// Model of the snapshot.
    pub model: String,
    /// Why it waits.
    pub reconciliation_reason: Option<ReconciliationReason>,
    /// Claimed at.
    pub created_at: DateTime<Utc>,
    /// Seconds since the claim.
    pub age_secs: i64,
    /// Its worst-case hold, still counted in spend.
    pub hold: Money,
    /// Currency of the hold.
    pub currency: Currency,
    /// Provider reference, when known.
    pub provider_ref: Option<String>,
    /// What the inbox holds: `none`, `late_exact`, `exact`, `conflicting`, `inexact` (the
    /// backlog's evidence status, SC-112).
    pub evidence: EvidenceStatus,
    /// The usage of the one consistent exact piece, when there is one.
    pub exact_usage: Option<Usage>,
    /// What settling from that piece charges, at the snapshot's prices.
    pub exact_amount: Option<Money>,
    /// Evidence rows recorded.
    pub evidence_rows: usize,
    /// The latest of them.
    pub latest_evidence: Option<EvidenceBrief>,
}

/// `GET /v1/console/backlog` answer.
#[derive(Debug, Serialize)]
pub struct BacklogView {
    /// Oldest first.
    pub items: Vec<BacklogItem>,
    /// More than [`BACKLOG_ROWS_MAX`] await.
    pub truncated: bool,
}

/// `GET /v1/console/backlog`.
///
/// # Errors
/// `forbidden` (not an operator), `unavailable`.
pub async fn backlog(app: &App, who: &Principal) -> Result<BacklogView, ApiError> {
    allow(who, Page::Backlog)?;
    let stores = app.backend.stores();
    let entries = app
        .reconciler
        .backlog(&who.scope, BACKLOG_ROWS_MAX + 1)
        .await?;
    let truncated = entries.len() > BACKLOG_ROWS_MAX as usize;
    let mut items = Vec::new();
    for entry in entries.into_iter().take(BACKLOG_ROWS_MAX as usize) {
        // Settled or gone since the listing: no longer part of the backlog.
        let Some(r) = stores
            .execution_by_id(&who.scope, entry.execution_id)
            .await?
        else {
            continue;
        };
        let evidence: Vec<Evidence> = stores.evidence_for(r.id).await?;
        let prices = &r.binding.config.prices;
        let latest_evidence = evidence.last().map(|e| EvidenceBrief {
            usage: e.usage,
            exact: e.exact,
            source: e.source,
            received_at: e.received_at,
            acknowledged: e.acknowledged_at.is_some(),
            amount: prices.cost(&e.usage).ok(),
        });
        items.push(BacklogItem {
            execution_id: entry.execution_id,
            consumer: r.binding.config.consumer.clone(),
            model: entry.model,
            reconciliation_reason: entry.reconciliation_reason,
            age_secs: entry.age_ms / 1000,
            created_at: entry.created_at,
            hold: entry.held,
            currency: r.binding.config.currency.clone(),
            provider_ref: entry.provider_ref,
            evidence: entry.evidence,
            exact_usage: entry.usage,
            exact_amount: entry.amount,
            evidence_rows: evidence.len(),
            latest_evidence,
            operation_key: entry.operation_key,
        });
    }
    Ok(BacklogView { items, truncated })
}

/// Token counts as an operator states them (missing classes are zero).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct UsageBody {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    reasoning: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuoteBody {
    usage: UsageBody,
    /// Quote an amount above the hold (what a resolution with `override_hold` would charge).
    #[serde(default)]
    override_hold: bool,
}

/// `POST /v1/console/backlog/{execution_id}/quote` answer: what resolving with `usage` will
/// charge. Nothing is written.
#[derive(Debug, Serialize)]
pub struct Quote {
    /// The execution.
    pub execution_id: ExecutionId,
    /// The stated usage.
    pub usage: Usage,
    /// The amount it will charge.
    pub amount: Money,
    /// Its currency.
    pub currency: Currency,
    /// The snapshot's price version.
    pub price_version: String,
    /// The hold the resolution releases.
    pub hold: Money,
}

/// `POST /v1/console/backlog/{execution_id}/quote` `{"usage"}`: the charge of a resolution with
/// stated usage, priced with the execution's original snapshot. Writes nothing.
///
/// # Errors
/// `invalid_request`, `not_found`, `invalid_state` (not awaiting an operator), `forbidden`,
/// `unavailable`.
pub async fn quote(
    app: &App,
    who: &Principal,
    execution_id: String,
    body: &[u8],
) -> Result<Quote, ApiError> {
    allow(who, Page::Backlog)?;
    let execution_id = uuid::Uuid::parse_str(&execution_id)
        .map(ExecutionId)
        .map_err(|_| ApiError::Invalid("execution_id is not a UUID".into()))?;
    let body: QuoteBody = parse(body)?;
    let u = body.usage;
    let usage = Usage {
        input: u.input,
        output: u.output,
        cache_read: u.cache_read,
        cache_write: u.cache_write,
        reasoning: u.reasoning,
    };
    let record = app
        .backend
        .stores()
        .execution_by_id(&who.scope, execution_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("execution".into()))?;
    if record.state != ExecutionState::ReconciliationRequired {
        return Err(ApiError::InvalidState(format!(
            "execution is {}, not awaiting an operator",
            record.state
        )));
    }
    let config = &record.binding.config;
    let amount = tollgate_runner::stated::stated_amount(&record, &usage, body.override_hold)?;
    Ok(Quote {
        execution_id,
        usage,
        amount,
        currency: config.currency.clone(),
        price_version: config.price_version.to_string(),
        hold: record.hold,
    })
}
