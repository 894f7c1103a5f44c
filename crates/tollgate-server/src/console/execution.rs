//! The execution page (operators): one operation key's journal row, settlement, evidence and
//! audit trail. Metadata only: the snapshot's prompt texts, inputs and outputs are never read
//! into this answer.

use super::audit::walk;
use super::session::{allow, Page};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::service::id;
use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use tollgate_core::ids::{ConsumerId, ExecutionId, OperationKey, RootKey, SessionId};
use tollgate_core::money::{Currency, Money};
use tollgate_core::state::{
    CallKind, ExecutionState, NotDispatchedCause, Outcome, ReconciliationReason,
};
use tollgate_store::{AuditChain, AuditPosition, Evidence, SettlementRecord};

/// Audit rows of the scope read to find an execution's trail, at most (newest kept).
pub const TRAIL_SCAN_ROWS_MAX: i64 = 100_000;

/// The journal row, metadata only.
#[derive(Debug, Serialize)]
pub struct JournalView {
    /// Row id.
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
    /// Why it waits for an operator.
    pub reconciliation_reason: Option<ReconciliationReason>,
    /// Outcome once completed.
    pub outcome: Option<Outcome>,
    /// Consumer charged.
    pub consumer: ConsumerId,
    /// Session.
    pub session_id: SessionId,
    /// Day charged.
    pub accounting_day: NaiveDate,
    /// Provider of the snapshot.
    pub provider: String,
    /// Model of the snapshot.
    pub model: String,
    /// Price version of the snapshot.
    pub price_version: String,
    /// Policy version of the snapshot.
    pub policy_version: String,
    /// Binding digest (hex).
    pub binding_digest: String,
    /// Fence token.
    pub fence: i64,
    /// Worst-case hold.
    pub hold: Money,
    /// Currency of the snapshot.
    pub currency: Currency,
    /// Provider reference.
    pub provider_ref: Option<String>,
    /// Claimed at.
    pub created_at: DateTime<Utc>,
    /// Last transition at.
    pub updated_at: DateTime<Utc>,
    /// Lease end.
    pub lease_expires_at: DateTime<Utc>,
}

/// One audit row of the trail.
#[derive(Debug, Serialize)]
pub struct TrailRow {
    /// Seq in the scope's chain.
    pub seq: i64,
    /// Kind.
    pub kind: String,
    /// At.
    pub at: DateTime<Utc>,
    /// Metadata (ids, states, amounts, digests).
    pub detail: serde_json::Value,
    /// Row hash (hex).
    pub hash: String,
}

/// `GET /v1/console/executions/{operation_key}` answer.
#[derive(Debug, Serialize)]
pub struct ExecutionView {
    /// The journal row.
    pub journal: JournalView,
    /// The governed charge, once settled.
    pub settlement: Option<SettlementRecord>,
    /// Usage evidence, in insertion order.
    pub evidence: Vec<Evidence>,
    /// Audit rows naming this execution, in chain order.
    pub audit: Vec<TrailRow>,
    /// Whether older audit rows of the scope were not searched.
    pub audit_partial: bool,
}

/// `GET /v1/console/executions/{operation_key}`.
///
/// # Errors
/// `invalid_request`, `not_found`, `forbidden` (not an operator), `unavailable`.
pub async fn execution(
    app: &App,
    who: &Principal,
    operation_key: String,
) -> Result<ExecutionView, ApiError> {
    allow(who, Page::Execution)?;
    let key = id(OperationKey::parse, operation_key)?;
    let stores = app.backend.stores();
    let r = stores
        .execution(&who.scope, &key)
        .await?
        .ok_or_else(|| ApiError::NotFound("operation".into()))?;
    let settlement = stores.settlement(r.id).await?;
    let evidence = stores.evidence_for(r.id).await?;
    // Every row of the execution is in its one chain; the newest rows of that chain are read.
    let chain = AuditChain::of_execution(r.id);
    let head = stores
        .audit_heads(&who.scope)
        .await?
        .into_iter()
        .find(|h| h.chain == chain)
        .map_or(0, |h| h.seq);
    let from = (head - TRAIL_SCAN_ROWS_MAX).max(0);
    let mut audit = Vec::new();
    let start = AuditPosition { chain, seq: from };
    walk(stores.as_ref(), &who.scope, start, true, |row| {
        if row.event.execution_id == Some(r.id) {
            audit.push(TrailRow {
                seq: row.seq,
                kind: row.event.kind.clone(),
                at: row.event.at,
                detail: row.event.detail.clone(),
                hash: row.hash.to_hex(),
            });
        }
        true
    })
    .await?;
    let config = &r.binding.config;
    let journal = JournalView {
        execution_id: r.id,
        operation_key: r.operation_key.clone(),
        kind: r.kind,
        root_key: r.root_key.clone(),
        state: r.state,
        not_dispatched_cause: r.not_dispatched_cause,
        reconciliation_reason: r.reconciliation_reason,
        outcome: r.outcome,
        consumer: config.consumer.clone(),
        session_id: r.binding.session_id.clone(),
        accounting_day: r.accounting_day,
        provider: config.provider.clone(),
        model: config.model.clone(),
        price_version: config.price_version.to_string(),
        policy_version: config.policy_version.to_string(),
        binding_digest: r.binding_digest.to_hex(),
        fence: r.fence.0,
        hold: r.hold,
        currency: config.currency.clone(),
        provider_ref: r.provider_ref.clone(),
        created_at: r.created_at,
        updated_at: r.updated_at,
        lease_expires_at: r.lease_expires_at,
    };
    Ok(ExecutionView {
        journal,
        settlement,
        evidence,
        audit,
        audit_partial: from > 0,
    })
}
