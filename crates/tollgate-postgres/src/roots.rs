//! Operation roots ([`RootStore`]): the root row is the root lock (`SELECT … FOR UPDATE`),
//! taken after the execution row and before the spend rows (see the crate's lock order).
//! Root receipts are unique per execution, enforced by the schema (ST-6).

use crate::audit;
use crate::error::{db, is_unique_violation, DbResultExt};
use crate::locks;
use crate::rows::{receipt_columns, root_columns, ReceiptRow, RootRow};
use crate::PgStores;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::types::Json;
use sqlx::PgConnection;
use tollgate_core::ids::{ExecutionId, RootId, RootKey, Scope};
use tollgate_core::state::ExecutionState;
use tollgate_store::rows::*;
use tollgate_store::rules;
use tollgate_store::traits::RootStore;
use tollgate_store::{StoreError, StoreResult};

/// The constraint that makes root receipts exactly-once.
const ONE_RECEIPT_PER_EXECUTION: &str = "root_receipts_pkey";

const INSERT: &str = concat!(
    "INSERT INTO roots (",
    root_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
     ON CONFLICT (scope, root_key) DO NOTHING RETURNING ",
    root_columns!()
);

const BY_KEY: &str = concat!(
    "SELECT ",
    root_columns!(),
    " FROM roots WHERE scope = $1 AND root_key = $2"
);

/// A read under the root lock's shared mode: waits for a writer holding the lock.
const SHARE: &str = concat!(
    "SELECT ",
    root_columns!(),
    " FROM roots WHERE scope = $1 AND root_key = $2 FOR SHARE"
);

const RESERVE: &str = concat!(
    "UPDATE roots SET reserved_calls = reserved_calls + 1, updated_at = $2 WHERE id = $1 \
     RETURNING ",
    root_columns!()
);

const RELEASE: &str = concat!(
    "UPDATE roots SET reserved_calls = GREATEST(reserved_calls - 1, 0), updated_at = $3 \
     WHERE scope = $1 AND root_key = $2 RETURNING ",
    root_columns!()
);

const SET_STATE: &str = concat!(
    "UPDATE roots SET state = $2, updated_at = $3 WHERE id = $1 RETURNING ",
    root_columns!()
);

const INSERT_RECEIPT: &str = concat!(
    "INSERT INTO root_receipts (",
    receipt_columns!(),
    ") VALUES ($1, $2, $3, $4, $5) RETURNING ",
    receipt_columns!()
);

/// A root's receipts, oldest first (index `root_receipts_root_idx`).
const RECEIPTS: &str = "SELECT r.root_id, r.execution_id, r.amount, r.currency, r.created_at \
     FROM root_receipts r JOIN roots o ON o.id = r.root_id \
     WHERE o.scope = $1 AND o.root_key = $2 \
     ORDER BY r.created_at, r.execution_id LIMIT $3";

/// The sum of a root's receipts (index `root_receipts_root_idx`).
const RECEIPTS_SUM: &str = "SELECT COALESCE(sum(amount), 0) FROM root_receipts WHERE root_id = $1";

/// Roots of a scope that may change state (index `roots_scope_state_deadline_idx`): active past
/// their deadline, or closed/expired with no unfinished call and at least `reserved_calls` calls
/// — or past their deadline, when no claim can land any more (ST-36).
/// Locked rows are skipped, so concurrent reconcilers share the work; the decision is taken
/// again under the lock.
const CANDIDATES: &str = concat!(
    "SELECT ",
    root_columns!(),
    " FROM roots r WHERE r.scope = $1 AND (\
         (r.state = $2 AND r.deadline <= $3) \
         OR (r.state = ANY($4) \
             AND (r.deadline <= $3 OR (SELECT count(*) FROM executions e \
                  WHERE e.scope = r.scope AND e.root_key = r.root_key) >= r.reserved_calls) \
             AND NOT EXISTS (SELECT 1 FROM executions e \
                  WHERE e.scope = r.scope AND e.root_key = r.root_key \
                  AND NOT (e.state = ANY($5))))) \
     ORDER BY r.root_key LIMIT $6 FOR UPDATE OF r SKIP LOCKED"
);

/// The calls under one root, by state (index `executions_scope_root_key_idx`).
const CALL_STATES: &str = "SELECT state, count(*) FROM executions \
     WHERE scope = $1 AND root_key = $2 GROUP BY state";

fn record(row: Option<RootRow>) -> StoreResult<Option<RootRecord>> {
    row.map(RootRow::into_record).transpose()
}

/// Inserts a root receipt.
///
/// # Errors
/// `Duplicate` when the execution already has one; store failure.
pub(crate) async fn insert_receipt(
    conn: &mut PgConnection,
    receipt: &RootReceipt,
) -> StoreResult<RootReceipt> {
    let row: ReceiptRow = sqlx::query_as(INSERT_RECEIPT)
        .bind(receipt.root_id.0)
        .bind(receipt.execution_id.0)
        .bind(receipt.amount.decimal())
        .bind(receipt.currency.as_str())
        .bind(receipt.created_at)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| {
            if is_unique_violation(&e, Some(ONE_RECEIPT_PER_EXECUTION)) {
                StoreError::Duplicate(format!("root receipt of {}", receipt.execution_id))
            } else {
                db(e)
            }
        })?;
    row.into_record()
}

async fn insert(conn: &mut PgConnection, root: &RootRecord) -> StoreResult<Option<RootRecord>> {
    let row: Option<RootRow> = sqlx::query_as(INSERT)
        .bind(root.id.0)
        .bind(root.scope.as_str())
        .bind(root.root_key.as_str())
        .bind(Json(&root.binding))
        .bind(root.binding_digest.to_hex())
        .bind(root.deadline)
        .bind(root.state.as_str())
        .bind(root.reserved_calls)
        .bind(root.charged.decimal())
        .bind(root.held.decimal())
        .bind(root.created_at)
        .bind(root.updated_at)
        .fetch_optional(&mut *conn)
        .await
        .store_err()?;
    record(row)
}

async fn set_state(
    conn: &mut PgConnection,
    id: RootId,
    state: RootState,
    now: DateTime<Utc>,
) -> StoreResult<RootRecord> {
    let row: RootRow = sqlx::query_as(SET_STATE)
        .bind(id.0)
        .bind(state.as_str())
        .bind(now)
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    row.into_record()
}

/// Whether the calls of a (locked) root are all accounted for at `now`: every call is final and
/// at least `reserved_calls` exist, or the deadline has passed ([`rules::root_calls_settled`],
/// the in-memory store's rule).
async fn calls_final(
    conn: &mut PgConnection,
    root: &RootRecord,
    now: DateTime<Utc>,
) -> StoreResult<bool> {
    let counts: Vec<(String, i64)> = sqlx::query_as(CALL_STATES)
        .bind(root.scope.as_str())
        .bind(root.root_key.as_str())
        .fetch_all(&mut *conn)
        .await
        .store_err()?;
    let mut calls = 0i64;
    for (state, count) in counts {
        let state: ExecutionState = state.parse().map_err(|_| crate::error::corrupt("state"))?;
        if !state.is_final() {
            return Ok(false);
        }
        calls = calls.saturating_add(count);
    }
    Ok(rules::root_calls_settled(root, now, calls, true))
}

#[async_trait]
impl RootStore for PgStores {
    async fn open_root(&self, request: OpenRootRequest) -> StoreResult<RootOpen> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let Some(root) = insert(&mut tx, &rules::new_root(&request)).await? else {
                // The insert waited for any concurrent opener of the key, so the row is committed.
                let row: Option<RootRow> = sqlx::query_as(BY_KEY)
                    .bind(request.scope.as_str())
                    .bind(request.root_key.as_str())
                    .fetch_optional(&mut *tx)
                    .await
                    .store_err()?;
                let existing = record(row)?
                    .ok_or_else(|| StoreError::Corrupt("root key without row".into()))?;
                tx.rollback().await.store_err()?;
                return Ok(RootOpen::Existing(existing));
            };
            audit::append(
                &mut tx,
                rules::root_event(&root, "root_opened", request.now),
            )
            .await?;
            tx.commit().await.store_err()?;
            Ok(RootOpen::Opened(root))
        })
        .await
    }

    async fn reserve_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Reservation> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let Some(root) = locks::lock_root(&mut tx, scope, root_key).await? else {
                tx.rollback().await.store_err()?;
                return Ok(Reservation::Missing);
            };
            if !rules::root_admits(&root, now) {
                tx.rollback().await.store_err()?;
                return Ok(Reservation::Refused(root));
            }
            let row: RootRow = sqlx::query_as(RESERVE)
                .bind(root.id.0)
                .bind(now)
                .fetch_one(&mut *tx)
                .await
                .store_err()?;
            let root = row.into_record()?;
            audit::append(&mut tx, rules::root_event(&root, "root_slot_reserved", now)).await?;
            tx.commit().await.store_err()?;
            Ok(Reservation::Reserved(root))
        })
        .await
    }

    async fn release_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let row: Option<RootRow> = sqlx::query_as(RELEASE)
                .bind(scope.as_str())
                .bind(root_key.as_str())
                .bind(now)
                .fetch_optional(&mut *tx)
                .await
                .store_err()?;
            let Some(root) = record(row)? else {
                tx.rollback().await.store_err()?;
                return Ok(());
            };
            audit::append(&mut tx, rules::root_event(&root, "root_slot_released", now)).await?;
            tx.commit().await.store_err()?;
            Ok(())
        })
        .await
    }

    async fn close_root(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootRecord>> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let Some(root) = locks::lock_root(&mut tx, scope, root_key).await? else {
                tx.rollback().await.store_err()?;
                return Ok(None);
            };
            if root.state != RootState::Active {
                tx.rollback().await.store_err()?;
                return Ok(Some(root));
            }
            let root = set_state(&mut tx, root.id, RootState::Closed, now).await?;
            audit::append(&mut tx, rules::root_event(&root, "root_closed", now)).await?;
            tx.commit().await.store_err()?;
            Ok(Some(root))
        })
        .await
    }

    async fn root(&self, scope: &Scope, root_key: &RootKey) -> StoreResult<Option<RootRecord>> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let row: Option<RootRow> = sqlx::query_as(SHARE)
                .bind(scope.as_str())
                .bind(root_key.as_str())
                .fetch_optional(&mut *tx)
                .await
                .store_err()?;
            tx.commit().await.store_err()?;
            record(row)
        })
        .await
    }

    async fn repair_root_receipt(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootReceipt>> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let record = match crate::locks::lock_execution(&mut tx, execution_id).await {
                Ok(r) => r,
                Err(StoreError::NotFound(_)) => return Ok(None),
                Err(e) => return Err(e),
            };
            let Some(root_key) = record
                .root_key
                .clone()
                .filter(|_| &record.scope == scope && record.state == ExecutionState::Completed)
            else {
                return Ok(None);
            };
            if let Some(existing) = receipt_of(&mut tx, execution_id).await? {
                return Ok(Some(existing));
            }
            let Some(settlement) = crate::settlements::of(&mut tx, execution_id).await? else {
                return Ok(None);
            };
            let Some(root) = locks::lock_root(&mut tx, scope, &root_key).await? else {
                return Ok(None);
            };
            rules::check_root_currency(&root, &settlement.currency)?;
            let receipt = insert_receipt(&mut tx, &rules::root_receipt(&root, &settlement)).await?;
            // The root's charged total is the sum of its receipts: recomputed with the repaired one
            // under the root lock, never added to, so a charge the root already counted is not
            // counted twice (SC-108).
            let charged: Decimal = sqlx::query_scalar(RECEIPTS_SUM)
                .bind(root.id.0)
                .fetch_one(&mut *tx)
                .await
                .store_err()?;
            let mut totals = root.totals();
            totals.settled = crate::rows::money(charged, "charged")?;
            locks::write_totals(&mut tx, root.id, totals, Some(now)).await?;
            let repaired = RootRecord {
                charged: totals.settled,
                ..root
            };
            audit::append(
                &mut tx,
                rules::root_receipt_repaired_event(&repaired, &receipt, now),
            )
            .await?;
            tx.commit().await.store_err()?;
            Ok(Some(receipt))
        })
        .await
    }

    async fn root_receipt(&self, execution_id: ExecutionId) -> StoreResult<Option<RootReceipt>> {
        self.bounded(async move {
            let row: Option<ReceiptRow> = sqlx::query_as(concat!(
                "SELECT ",
                receipt_columns!(),
                " FROM root_receipts WHERE execution_id = $1"
            ))
            .bind(execution_id.0)
            .fetch_optional(self.pool())
            .await
            .store_err()?;
            row.map(ReceiptRow::into_record).transpose()
        })
        .await
    }

    async fn root_receipts(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        limit: u32,
    ) -> StoreResult<Vec<RootReceipt>> {
        self.bounded(async move {
            let rows: Vec<ReceiptRow> = sqlx::query_as(RECEIPTS)
                .bind(scope.as_str())
                .bind(root_key.as_str())
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await
                .store_err()?;
            rows.into_iter().map(ReceiptRow::into_record).collect()
        })
        .await
    }

    async fn reconcile_roots(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<RootRecord>> {
        self.bounded(async move {
            let waiting = [RootState::Closed.as_str(), RootState::Expired.as_str()];
            let finals: Vec<&str> = ExecutionState::ALL
                .iter()
                .filter(|s| s.is_final())
                .map(ExecutionState::as_str)
                .collect();
            let mut tx = self.begin().await?;
            let rows: Vec<RootRow> = sqlx::query_as(CANDIDATES)
                .bind(scope.as_str())
                .bind(RootState::Active.as_str())
                .bind(now)
                .bind(&waiting[..])
                .bind(&finals)
                .bind(i64::from(limit))
                .fetch_all(&mut *tx)
                .await
                .store_err()?;
            let mut changed = Vec::new();
            for row in rows {
                // Decided again under the root lock, with the current calls.
                let root = row.into_record()?;
                let all_final = calls_final(&mut tx, &root, now).await?;
                if let Some(next) = rules::root_next_state(&root, now, all_final) {
                    changed.push(set_state(&mut tx, root.id, next, now).await?);
                }
            }
            // The audit head last.
            for root in &changed {
                audit::append(&mut tx, rules::root_event(root, "root_reconciled", now)).await?;
            }
            if changed.is_empty() {
                tx.rollback().await.store_err()?;
            } else {
                tx.commit().await.store_err()?;
            }
            Ok(changed)
        })
        .await
    }
}

async fn receipt_of(
    conn: &mut PgConnection,
    execution_id: ExecutionId,
) -> StoreResult<Option<RootReceipt>> {
    let row: Option<ReceiptRow> = sqlx::query_as(concat!(
        "SELECT ",
        receipt_columns!(),
        " FROM root_receipts WHERE execution_id = $1"
    ))
    .bind(execution_id.0)
    .fetch_optional(&mut *conn)
    .await
    .store_err()?;
    row.map(ReceiptRow::into_record).transpose()
}
