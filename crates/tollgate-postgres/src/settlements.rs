//! Governed settlements (read side, and the insert used by settle). One row per execution,
//! enforced by `UNIQUE (execution_id)`.

use crate::error::{db, is_unique_violation, DbResultExt};
use crate::rows::{settlement_columns, token_columns, SettlementRow};
use crate::PgStores;
use async_trait::async_trait;
use chrono::NaiveDate;
use sqlx::{FromRow, PgConnection};
use tollgate_core::ids::{ExecutionId, Scope, SettlementId};
use tollgate_store::rows::{FeedEntry, FeedPosition, SettlementRecord};
use tollgate_store::traits::SettlementStore;
use tollgate_store::{StoreError, StoreResult};

/// The settlement of an execution (unique index `cost_settlements_execution_id_key`).
pub(crate) const SETTLEMENT_BY_EXECUTION: &str = concat!(
    "SELECT ",
    settlement_columns!(),
    " FROM cost_settlements WHERE execution_id = $1"
);

/// The constraint that makes settlement exactly-once.
pub(crate) const ONE_PER_EXECUTION: &str = "cost_settlements_execution_id_key";

const INSERT: &str = concat!(
    "INSERT INTO cost_settlements (",
    settlement_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
     $18, $19, $20, $21) RETURNING ",
    settlement_columns!()
);

/// Binds the columns of `s` as 21 parameters, in `settlement_columns!()` order.
///
/// # Errors
/// A token count out of the column's range.
pub(crate) fn bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    s: &'q SettlementRecord,
) -> StoreResult<sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>> {
    let [input, output, cache_read, cache_write, reasoning] = token_columns(&s.usage)?;
    Ok(query
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
        .bind(s.settled_at))
}

/// A unique violation of the one-settlement-per-execution constraint is `Duplicate`.
pub(crate) fn insert_error(e: sqlx::Error, s: &SettlementRecord) -> StoreError {
    if is_unique_violation(&e, Some(ONE_PER_EXECUTION)) {
        StoreError::Duplicate(format!("settlement of {}", s.execution_id))
    } else {
        db(e)
    }
}

/// Inserts a governed charge on `conn`.
///
/// # Errors
/// `Duplicate` when the execution already has one; store failure.
pub(crate) async fn insert(
    conn: &mut PgConnection,
    s: &SettlementRecord,
) -> StoreResult<SettlementRecord> {
    let row = bind(sqlx::query(INSERT), s)?
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| insert_error(e, s))?;
    SettlementRow::from_row(&row).store_err()?.into_record()
}

#[async_trait]
impl SettlementStore for PgStores {
    async fn settlement(&self, execution_id: ExecutionId) -> StoreResult<Option<SettlementRecord>> {
        self.bounded(async move {
            let row: Option<SettlementRow> = sqlx::query_as(SETTLEMENT_BY_EXECUTION)
                .bind(execution_id.0)
                .fetch_optional(self.pool())
                .await
                .store_err()?;
            row.map(SettlementRow::into_record).transpose()
        })
        .await
    }

    async fn settlements(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>> {
        self.bounded(async move {
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
        })
        .await
    }

    async fn scope_settlements(
        &self,
        scope: &Scope,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>> {
        self.bounded(async move {
            let rows: Vec<SettlementRow> = sqlx::query_as(SCOPE_SETTLEMENTS)
                .bind(scope.as_str())
                .bind(from)
                .bind(to)
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await
                .store_err()?;
            rows.into_iter().map(SettlementRow::into_record).collect()
        })
        .await
    }

    async fn feed_position(
        &self,
        scope: &Scope,
        id: SettlementId,
    ) -> StoreResult<Option<FeedPosition>> {
        self.bounded(async move {
            let row: Option<(String, i64, i64, bool)> = sqlx::query_as(FEED_POSITION)
                .bind(id.0)
                .fetch_optional(self.pool())
                .await
                .store_err()?;
            let Some((_, txid, seq, _)) =
                row.filter(|(of, _, _, listed)| *listed && of == scope.as_str())
            else {
                return Ok(None);
            };
            let txid = u64::try_from(txid)
                .map_err(|_| StoreError::Corrupt(format!("feed txid {txid}")))?;
            Ok(Some(FeedPosition { txid, seq }))
        })
        .await
    }

    async fn settlements_after(
        &self,
        scope: Option<&Scope>,
        after: FeedPosition,
        limit: u32,
    ) -> StoreResult<Vec<FeedEntry>> {
        self.bounded(async move {
            // A transaction id beyond i64 does not exist (xid8 grows by one per transaction).
            let Ok(txid) = i64::try_from(after.txid) else {
                return Ok(Vec::new());
            };
            let rows: Vec<FeedRow> = sqlx::query_as(FEED)
                .bind(scope.map(Scope::as_str))
                .bind(txid)
                .bind(after.seq)
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await
                .store_err()?;
            rows.into_iter().map(FeedRow::into_entry).collect()
        })
        .await
    }
}

/// A scope's settlements of a range of accounting days (SC-192), in the order of
/// `cost_settlements_day_idx (scope, accounting_day, seq)`: the index yields the rows in order,
/// so the limit ends the scan and no other scope's row is read.
const SCOPE_SETTLEMENTS: &str = concat!(
    "SELECT ",
    settlement_columns!(),
    " FROM cost_settlements WHERE scope = $1 AND accounting_day BETWEEN $2 AND $3 \
     ORDER BY accounting_day, seq LIMIT $4"
);

/// Settlement `$1`'s scope and feed position, and whether the scope's feed lists it (its
/// transaction is below the horizon of [`FEED`]), by primary key (SC-193). The scope is compared
/// by the caller: with it in the condition a generic plan on a table without statistics may
/// take an index led by the scope instead of the key.
const FEED_POSITION: &str = "SELECT scope, txid::text::bigint, seq, \
     txid < pg_snapshot_xmin(pg_current_snapshot()) FROM cost_settlements \
     WHERE settlement_id = $1";

/// The finance feed (SC-141): after `($2, $3)` in `(txid, seq)` order, of scope `$1` (all when
/// NULL), for one scope only rows inserted by transactions older than the oldest still running
/// (across scopes, for the operator's export, every committed row: a point-in-time listing). Such a row's
/// transaction has ended, and any row that commits later was inserted by a transaction at or
/// above that horizon, so it sorts after every row listed now. Serves the scope's feed from
/// `cost_settlements_feed_scope_idx`, the export across scopes from `cost_settlements_feed_key`
/// (unique: a feed position names one charge).
const FEED: &str = concat!(
    "SELECT ",
    settlement_columns!(),
    ", txid::text::bigint AS feed_txid, seq AS feed_seq FROM cost_settlements \
     WHERE ($1::text IS NULL OR scope = $1) \
       AND (txid, seq) > ($2::bigint::text::xid8, $3) \
       AND ($1::text IS NULL OR txid < pg_snapshot_xmin(pg_current_snapshot())) \
     ORDER BY txid, seq LIMIT $4"
);

/// A settlement with its feed position.
#[derive(sqlx::FromRow)]
struct FeedRow {
    #[sqlx(flatten)]
    settlement: SettlementRow,
    feed_txid: i64,
    feed_seq: i64,
}

impl FeedRow {
    fn into_entry(self) -> StoreResult<FeedEntry> {
        let txid = u64::try_from(self.feed_txid)
            .map_err(|_| StoreError::Corrupt(format!("feed txid {}", self.feed_txid)))?;
        Ok(FeedEntry {
            position: FeedPosition {
                txid,
                seq: self.feed_seq,
            },
            settlement: self.settlement.into_record()?,
        })
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
