//! Governed settlements (read side, and the insert used by settle). One row per execution,
//! enforced by `UNIQUE (execution_id)`.

use crate::error::{db, is_unique_violation, DbResultExt};
use crate::rows::{settlement_columns, token_columns, SettlementRow};
use crate::PgStores;
use async_trait::async_trait;
use chrono::NaiveDate;
use sqlx::PgConnection;
use tollgate_core::ids::ExecutionId;
use tollgate_store::rows::SettlementRecord;
use tollgate_store::traits::SettlementStore;
use tollgate_store::{StoreError, StoreResult};

/// The settlement of an execution (unique index `cost_settlements_execution_id_key`).
pub(crate) const SETTLEMENT_BY_EXECUTION: &str = concat!(
    "SELECT ",
    settlement_columns!(),
    " FROM cost_settlements WHERE execution_id = $1"
);

/// The constraint that makes settlement exactly-once.
const ONE_PER_EXECUTION: &str = "cost_settlements_execution_id_key";

const INSERT: &str = concat!(
    "INSERT INTO cost_settlements (",
    settlement_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
     $18, $19, $20, $21) RETURNING ",
    settlement_columns!()
);

/// Inserts a governed charge on `conn`.
///
/// # Errors
/// `Duplicate` when the execution already has one; store failure.
pub(crate) async fn insert(
    conn: &mut PgConnection,
    s: &SettlementRecord,
) -> StoreResult<SettlementRecord> {
    let [input, output, cache_read, cache_write, reasoning] = token_columns(&s.usage)?;
    let row: SettlementRow = sqlx::query_as(INSERT)
        .bind(s.id.0)
        .bind(s.execution_id.0)
        .bind(s.scope.as_str())
        .bind(s.operation_key.as_str())
        .bind(s.kind.as_str())
        .bind(s.consumer.as_str())
        .bind(s.session_id.as_str())
        .bind(s.accounting_day)
        .bind(&s.provider)
        .bind(&s.model)
        .bind(&s.price_version)
        .bind(&s.policy_version)
        .bind(s.currency.as_str())
        .bind(input)
        .bind(output)
        .bind(cache_read)
        .bind(cache_write)
        .bind(reasoning)
        .bind(s.amount.decimal())
        .bind(s.source.as_str())
        .bind(s.settled_at)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| {
            if is_unique_violation(&e, Some(ONE_PER_EXECUTION)) {
                StoreError::Duplicate(format!("settlement of {}", s.execution_id))
            } else {
                db(e)
            }
        })?;
    row.into_record()
}

#[async_trait]
impl SettlementStore for PgStores {
    async fn settlement(&self, execution_id: ExecutionId) -> StoreResult<Option<SettlementRecord>> {
        let row: Option<SettlementRow> = sqlx::query_as(SETTLEMENT_BY_EXECUTION)
            .bind(execution_id.0)
            .fetch_optional(self.pool())
            .await
            .store_err()?;
        row.map(SettlementRow::into_record).transpose()
    }

    async fn settlements(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>> {
        let rows: Vec<SettlementRow> = sqlx::query_as(concat!(
            "SELECT ",
            settlement_columns!(),
            " FROM cost_settlements WHERE accounting_day BETWEEN $1 AND $2 ORDER BY seq LIMIT $3"
        ))
        .bind(from)
        .bind(to)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .store_err()?;
        rows.into_iter().map(SettlementRow::into_record).collect()
    }
}

/// The settlement of an execution, read inside the caller's transaction.
///
/// # Errors
/// Store failure; a corrupt row.
pub(crate) async fn of(
    conn: &mut sqlx::PgConnection,
    execution_id: tollgate_core::ids::ExecutionId,
) -> tollgate_store::StoreResult<Option<tollgate_store::SettlementRecord>> {
    let row: Option<SettlementRow> = sqlx::query_as(concat!(
        "SELECT ",
        settlement_columns!(),
        " FROM cost_settlements WHERE execution_id = $1"
    ))
    .bind(execution_id.0)
    .fetch_optional(&mut *conn)
    .await
    .store_err()?;
    row.map(SettlementRow::into_record).transpose()
}
