//! [`ExecutionStore`] for [`PgStores`]: the writes live in `journal` and `settle`; the reads
//! are here. Every read is scoped and bounded by an index.

use crate::error::DbResultExt;
use crate::locks;
use crate::rows::{execution_columns, ExecutionRow, ReceiptRow, ResultRow, SettlementRow};
use crate::PgStores;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection};
use tollgate_core::digest::{Binding, Digest256};
use tollgate_core::ids::{ExecutionId, OperationKey, Scope};
use tollgate_core::state::{ExecutionState, NotDispatchedCause, ReconciliationReason};
use tollgate_store::rows::*;
use tollgate_store::traits::ExecutionStore;
use tollgate_store::StoreResult;

pub(crate) const BY_ID: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE id = $1 AND scope = $2"
);

/// Unfinished rows whose lease ended by the database's clock (`$2` is `NULL` outside tests).
/// The states are written out so that the plan reads the scope's open rows only, through the
/// partial index `executions_open_scope_idx` (H-12).
pub(crate) const EXPIRED: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE scope = $1 AND state IN ('prepared', 'dispatched') \
     AND lease_expires_at <= COALESCE($2, clock_timestamp()) \
     ORDER BY lease_expires_at, id LIMIT $3"
);

/// Rows in one state, oldest first (index `executions_state_scope_created_idx`).
pub(crate) const BY_STATE: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE scope = $1 AND state = $2 ORDER BY created_at, id LIMIT $3"
);

/// A journal row with its result, settlement and root receipt in one statement, so a replay is
/// one round trip (H-10): the
/// execution's columns by name, the others aliased `r_`, `s_` and `rr_` (each join is on a
/// unique index of `execution_id`). The binding comes only when its digest is not `$3` (H-26):
/// a reader that holds a binding with the row's digest already has it.
pub(crate) const VIEW_BY_KEY: &str = "SELECT e.id, e.scope, e.operation_key, e.kind, e.root_key, \
     CASE WHEN e.binding_digest = $3 THEN NULL ELSE e.binding END AS binding, \
     e.binding_digest, e.accounting_day, e.state, e.not_dispatched_cause, e.outcome, e.fence, \
     e.lease_expires_at, e.hold, e.provider_ref, e.created_at, e.updated_at, \
     e.reconciliation_reason, \
     r.execution_id AS r_execution_id, r.outcome AS r_outcome, r.stop AS r_stop, \
     r.output::text AS r_output, r.step::text AS r_step, r.warnings AS r_warnings, \
     r.retention_expires_at AS r_retention_expires_at, r.erased_at AS r_erased_at, \
     s.settlement_id AS s_settlement_id, s.execution_id AS s_execution_id, s.scope AS s_scope, \
     s.operation_key AS s_operation_key, s.kind AS s_kind, s.consumer AS s_consumer, \
     s.session_id AS s_session_id, s.accounting_day AS s_accounting_day, \
     s.provider AS s_provider, s.model AS s_model, s.price_version AS s_price_version, \
     s.policy_version AS s_policy_version, s.currency AS s_currency, \
     s.input_tokens AS s_input_tokens, s.output_tokens AS s_output_tokens, \
     s.cache_read_tokens AS s_cache_read_tokens, s.cache_write_tokens AS s_cache_write_tokens, \
     s.reasoning_tokens AS s_reasoning_tokens, s.amount AS s_amount, s.source AS s_source, \
     s.settled_at AS s_settled_at, \
     rr.root_id AS rr_root_id, rr.execution_id AS rr_execution_id, rr.amount AS rr_amount, \
     rr.currency AS rr_currency, rr.created_at AS rr_created_at \
     FROM executions e \
     LEFT JOIN execution_results r ON r.execution_id = e.id \
     LEFT JOIN cost_settlements s ON s.execution_id = e.id \
     LEFT JOIN root_receipts rr ON rr.execution_id = e.id \
     WHERE e.scope = $1 AND e.operation_key = $2";

/// The row under `(scope, key)` with its result, settlement and root receipt, in one statement
/// ([`VIEW_BY_KEY`]) on `conn`. With `held` (a binding and its digest, as a claimer holds
/// them), the row's binding is read only when its digest differs (a conflict); otherwise the
/// record carries `held` (H-26).
///
/// # Errors
/// Store failure; a corrupt row.
pub(crate) async fn view_by_key(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &OperationKey,
    held: Option<(&Binding, Digest256)>,
) -> StoreResult<Option<ExecutionView>> {
    let row = view_row(conn, scope, key, held.map(|(_, digest)| digest))
        .await
        .store_err()?;
    view_of_row(row, held)
}

/// The row of [`VIEW_BY_KEY`] under `(scope, key)`, its binding left out when its digest is
/// `digest`.
pub(crate) async fn view_row(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &OperationKey,
    digest: Option<Digest256>,
) -> Result<Option<PgRow>, sqlx::Error> {
    sqlx::query(VIEW_BY_KEY)
        .bind(scope.as_str())
        .bind(key.as_str())
        .bind(digest.map(|d| d.to_hex()))
        .fetch_optional(conn)
        .await
}

/// The view under a claim's key on a call connection, read as a claimer holding `held` reads it
/// (see [`view_by_key`]).
///
/// # Errors
/// Store failure; a corrupt row.
pub(crate) async fn view_held(
    stores: &PgStores,
    request: &ClaimRequest,
    held: (&Binding, Digest256),
) -> StoreResult<Option<ExecutionView>> {
    let (scope, key) = (&request.scope, &request.operation_key);
    let row = view_once_more(stores, scope, key, Some(held.1)).await?;
    view_of_row(row, Some(held))
}

/// [`view_row`] on a call connection, read once more on a fresh connection when the first
/// one's was ended by the database (a terminated backend, a restart): a read changes nothing, so
/// it is safe to repeat (spec/storage.md — Connections the database ends).
async fn view_once_more(
    stores: &PgStores,
    scope: &Scope,
    key: &OperationKey,
    digest: Option<Digest256>,
) -> StoreResult<Option<PgRow>> {
    let mut call = stores.call_connection().await?;
    let first = view_row(call.conn()?, scope, key, digest).await;
    match call.check(first) {
        Err(e) if crate::error::ends_connection(&e) => {
            drop(call);
            let mut call = stores.call_connection().await?;
            let second = view_row(call.conn()?, scope, key, digest).await;
            call.check(second).store_err()
        }
        result => result.store_err(),
    }
}

/// The view a [`view_row`] answer holds (see [`view_by_key`] for `held`).
///
/// # Errors
/// A corrupt row.
pub(crate) fn view_of_row(
    row: Option<PgRow>,
    held: Option<(&Binding, Digest256)>,
) -> StoreResult<Option<ExecutionView>> {
    let Some(row) = row else {
        return Ok(None);
    };
    let execution = ExecutionRow::from_row(&row).store_err()?;
    let execution = match held {
        Some((binding, digest)) if !execution.has_binding() => {
            execution.into_record_with(binding.clone(), Some(digest))?
        }
        _ => execution.into_record()?,
    };
    let result = ResultRow::joined(&row).store_err()?;
    let settlement = SettlementRow::joined(&row).store_err()?;
    let root_receipt = ReceiptRow::joined(&row).store_err()?;
    Ok(Some(ExecutionView {
        execution,
        result: result.map(ResultRow::into_record).transpose()?,
        settlement: settlement.map(SettlementRow::into_record).transpose()?,
        root_receipt: root_receipt.map(ReceiptRow::into_record).transpose()?,
    }))
}

fn records(rows: Vec<ExecutionRow>) -> StoreResult<Vec<ExecutionRecord>> {
    rows.into_iter().map(ExecutionRow::into_record).collect()
}

#[async_trait]
impl ExecutionStore for PgStores {
    async fn claim(&self, request: ClaimRequest) -> StoreResult<ClaimOutcome> {
        self.bounded(async move { self.claim_tx(request).await })
            .await
    }

    async fn mark_dispatched(
        &self,
        fence: Fence,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.bounded(async move {
            self.fenced_tx(
                fence,
                &[ExecutionState::Prepared],
                (ExecutionState::Dispatched, None),
                None,
                "dispatched",
                now,
            )
            .await
        })
        .await
    }

    async fn mark_dispatched_with_hold(
        &self,
        fence: Fence,
        hold: tollgate_core::money::Money,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.bounded(async move { self.dispatched_with_hold_tx(fence, hold, now).await })
            .await
    }

    async fn mark_not_dispatched(
        &self,
        fence: Fence,
        cause: NotDispatchedCause,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.bounded(async move { self.not_dispatched_tx(fence, cause, now).await })
            .await
    }

    async fn mark_reconciliation_required(
        &self,
        fence: Fence,
        reason: ReconciliationReason,
        provider_ref: Option<String>,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.bounded(async move {
            self.fenced_tx(
                fence,
                &[ExecutionState::Dispatched],
                (ExecutionState::ReconciliationRequired, Some(reason)),
                provider_ref,
                "reconciliation_required",
                now,
            )
            .await
        })
        .await
    }

    async fn settle(&self, request: SettleRequest) -> StoreResult<SettleOutcome> {
        self.bounded(async move { self.settle_tx(request).await })
            .await
    }

    async fn take_fence(
        &self,
        scope: &Scope,
        key: &OperationKey,
        states: &[ExecutionState],
        require_expired: bool,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.bounded(async move {
            self.take_fence_tx(scope, key, states, require_expired, lease_ms, now)
                .await
        })
        .await
    }

    async fn renew_lease(
        &self,
        fence: Fence,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        self.bounded(async move { self.renew_lease_tx(fence, lease_ms, now).await })
            .await
    }

    async fn execution(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.bounded(async move {
            let mut conn = self.pool().acquire().await.store_err()?;
            locks::execution_by_key(&mut conn, scope, key).await
        })
        .await
    }

    async fn execution_view(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionView>> {
        self.bounded(async move {
            let row = view_once_more(self, scope, key, None).await?;
            view_of_row(row, None)
        })
        .await
    }

    async fn execution_by_id(
        &self,
        scope: &Scope,
        id: ExecutionId,
    ) -> StoreResult<Option<ExecutionRecord>> {
        self.bounded(async move {
            let row: Option<ExecutionRow> = sqlx::query_as(BY_ID)
                .bind(id.0)
                .bind(scope.as_str())
                .fetch_optional(self.pool())
                .await
                .store_err()?;
            row.map(ExecutionRow::into_record).transpose()
        })
        .await
    }

    async fn expired(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>> {
        self.bounded(async move {
            let rows: Vec<ExecutionRow> = sqlx::query_as(EXPIRED)
                .bind(scope.as_str())
                .bind(self.lease_now(now))
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await
                .store_err()?;
            records(rows)
        })
        .await
    }

    async fn by_state(
        &self,
        scope: &Scope,
        state: ExecutionState,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>> {
        self.bounded(async move {
            let rows: Vec<ExecutionRow> = sqlx::query_as(BY_STATE)
                .bind(scope.as_str())
                .bind(state.as_str())
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await
                .store_err()?;
            records(rows)
        })
        .await
    }
}
