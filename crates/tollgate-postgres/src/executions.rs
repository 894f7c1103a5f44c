//! [`ExecutionStore`] for [`PgStores`]: the writes live in `journal` and `settle`; the reads
//! are here. Every read is scoped and bounded by an index.

use crate::batch::{by_place, failed, failed_statement, Answer};
use crate::error::DbResultExt;
use crate::locks;
use crate::rows::{execution_columns, ExecutionRow, ReceiptRow, ResultRow, SettlementRow};
use crate::PgStores;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection};
use std::sync::atomic::Ordering;
use tollgate_core::digest::{Binding, Digest256};
use tollgate_core::ids::{ExecutionId, OperationKey, Scope};
use tollgate_core::state::{ExecutionState, NotDispatchedCause, ReconciliationReason};
use tollgate_store::rows::*;
use tollgate_store::traits::ExecutionStore;
use tollgate_store::{StoreError, StoreResult};

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
pub(crate) const VIEW_BY_KEY: &str = concat!(
    "SELECT ",
    view_columns!("$3"),
    " FROM executions e ",
    view_joins!(),
    " WHERE e.scope = $1 AND e.operation_key = $2"
);

/// The columns of [`VIEW_BY_KEY`], the binding left out when its digest is `$digest`.
macro_rules! view_columns {
    ($digest:literal) => {
        concat!(
            "e.id, e.scope, e.operation_key, e.kind, e.root_key, \
             CASE WHEN e.binding_digest = ",
            $digest,
            " THEN NULL ELSE ",
            crate::rows::stored_binding!("e"),
            " END AS binding, \
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
     rr.currency AS rr_currency, rr.created_at AS rr_created_at"
        )
    };
}
use view_columns;

/// The joins of [`VIEW_BY_KEY`] to the execution `e`.
macro_rules! view_joins {
    () => {
        "LEFT JOIN execution_results r ON r.execution_id = e.id \
         LEFT JOIN cost_settlements s ON s.execution_id = e.id \
         LEFT JOIN root_receipts rr ON rr.execution_id = e.id"
    };
}
use view_joins;

/// The reads of [`VIEW_BY_KEY`] for several keys in one statement (H-37): `$1`, `$2` and `$3`
/// are arrays of the scopes, keys and held digests (a digest `NULL` when the reader holds no
/// binding), and each row found answers [`VIEW_BY_KEY`]'s columns after `k_n`, its read's place
/// in the arrays counted from 1. A key without a row answers no row. Each key is one probe of
/// the unique index of `(scope, operation_key)` and its joins, as alone: the lateral subquery's
/// `LIMIT` (a key is unique in its scope) keeps it the read alone per key, where a join could be
/// planned as a hash of a whole table on a database without statistics (H-12).
pub(crate) const VIEWS_BY_KEYS: &str = concat!(
    "SELECT k.k_n, v.* \
     FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY \
     AS k(k_scope, k_key, k_digest, k_n) \
     CROSS JOIN LATERAL (SELECT ",
    view_columns!("k.k_digest"),
    " FROM executions e ",
    view_joins!(),
    " WHERE e.scope = k.k_scope AND e.operation_key = k.k_key LIMIT 1) v"
);

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

/// [`view_row`], in one statement with the reads that arrive while one is in flight (H-37) when
/// these stores have the reads' queue, else alone on a call connection; read once more,
/// alone, on a fresh connection when the first one's was ended by the database (a terminated
/// backend, a restart): a read changes nothing, so it is safe to repeat (spec/storage.md —
/// Connections the database ends).
async fn view_once_more(
    stores: &PgStores,
    scope: &Scope,
    key: &OperationKey,
    digest: Option<Digest256>,
) -> StoreResult<Option<PgRow>> {
    let Some(queue) = &stores.reads else {
        return view_alone(stores, scope, key, digest, true).await;
    };
    let read = ViewRead {
        scope: scope.clone(),
        key: key.clone(),
        digest,
    };
    let together = stores.clone();
    let (answer, _) = queue
        .submit(read, move |reads| {
            let stores = together.clone();
            async move { stores.send_reads(reads).await }
        })
        .await?;
    match answer {
        Answer::Row(row) => Ok(Some(row)),
        Answer::NoRow => Ok(None),
        Answer::Failed(e) => Err(e),
        Answer::Lost(_) => view_alone(stores, scope, key, digest, false).await,
        Answer::Alone | Answer::Single(_) => view_alone(stores, scope, key, digest, true).await,
    }
}

/// [`view_row`] alone on a call connection; with `once_more`, read again on a fresh connection
/// when the first one's was ended by the database.
async fn view_alone(
    stores: &PgStores,
    scope: &Scope,
    key: &OperationKey,
    digest: Option<Digest256>,
    once_more: bool,
) -> StoreResult<Option<PgRow>> {
    let mut call = stores.call_connection().await?;
    let first = view_row(call.conn()?, scope, key, digest).await;
    match call.check(first) {
        Err(e) if once_more && crate::error::ends_connection(&e) => {
            drop(call);
            let mut call = stores.call_connection().await?;
            let second = view_row(call.conn()?, scope, key, digest).await;
            call.check(second).store_err()
        }
        result => result.store_err(),
    }
}

/// One read of a call's view by key waiting in the reads' queue (H-37).
pub(crate) struct ViewRead {
    scope: Scope,
    key: OperationKey,
    /// The digest of the binding the reader holds.
    digest: Option<Digest256>,
}

impl PgStores {
    /// The reads waiting together, in one statement of [`VIEWS_BY_KEYS`] on a call connection
    /// (one read alone is [`VIEW_BY_KEY`]): each answered its row, or `NoRow` when its key has
    /// none; a failed statement answers every read `Failed`, or `Lost` when it ended its
    /// connection.
    async fn send_reads(&self, reads: Vec<ViewRead>) -> (Vec<Answer>, Vec<ViewRead>) {
        let answered = async {
            let mut call = self.call_connection().await?;
            let rows = if let [read] = reads.as_slice() {
                view_row(call.conn()?, &read.scope, &read.key, read.digest)
                    .await
                    .map(|row| row.into_iter().collect::<Vec<_>>())
            } else {
                self.views_read_together.fetch_add(
                    u64::try_from(reads.len()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                let scopes: Vec<&str> = reads.iter().map(|r| r.scope.as_str()).collect();
                let keys: Vec<&str> = reads.iter().map(|r| r.key.as_str()).collect();
                let digests: Vec<Option<String>> =
                    reads.iter().map(|r| r.digest.map(|d| d.to_hex())).collect();
                sqlx::query(VIEWS_BY_KEYS)
                    .bind(&scopes)
                    .bind(&keys)
                    .bind(&digests)
                    .fetch_all(call.conn()?)
                    .await
            };
            Ok::<_, StoreError>(call.check(rows))
        }
        .await;
        let rows = match answered {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) => return (failed_statement(e, reads.len()), reads),
            Err(e) => return (failed(&e, reads.len()), reads),
        };
        if let [_] = reads.as_slice() {
            let answer = rows.into_iter().next().map_or(Answer::NoRow, Answer::Row);
            return (vec![answer], reads);
        }
        // A key is unique in its scope, so a read finds one row at most.
        let answers = by_place(rows, "k_n", reads.len())
            .into_iter()
            .map(|row| row.map_or(Answer::NoRow, Answer::Row))
            .collect();
        (answers, reads)
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
