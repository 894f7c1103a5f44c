//! The usage inbox: append-only evidence, paged by `seq`, acknowledged once.

use crate::audit;
use crate::error::DbResultExt;
use crate::rows::{evidence_columns, token_columns, EvidenceRow};
use crate::PgStores;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgConnection};
use tollgate_core::ids::{EvidenceId, ExecutionId, Scope};
use tollgate_store::rows::{Evidence, NewEvidence};
use tollgate_store::rules;
use tollgate_store::traits::UsageInbox;
use tollgate_store::{StoreError, StoreResult};

const INSERT: &str = concat!(
    "INSERT INTO usage_inbox (id, scope, execution_id, operation_key, provider_ref, \
     input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, \
     exact, source, received_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING ",
    evidence_columns!()
);

/// A scope's open evidence after a cursor (index `usage_inbox_open_idx`), ordered by the
/// partial index's own `(scope, seq)` (the same order, the scope being fixed). No other index of
/// the inbox is led by `seq` (every index costs each insert, H-29), so no plan walks the scope's
/// acknowledged rows (H-12).
pub(crate) const OPEN: &str = concat!(
    "SELECT ",
    evidence_columns!(),
    " FROM usage_inbox WHERE scope = $1 AND seq > $2 AND acknowledged_at IS NULL \
     ORDER BY scope, seq LIMIT $3"
);

/// An execution's evidence (index `usage_inbox_execution_idx`).
pub(crate) const EVIDENCE_OF: &str = concat!(
    "SELECT ",
    evidence_columns!(),
    " FROM usage_inbox WHERE execution_id = $1 ORDER BY seq"
);

/// Acknowledges one open row of the scope. The row is found by its primary key in a subquery
/// that does not name `acknowledged_at`, so no plan can reach it through the partial open index
/// (which is led by the scope and would filter the scope's whole backlog; H-12).
pub(crate) const ACKNOWLEDGE: &str = concat!(
    "UPDATE usage_inbox SET acknowledged_at = $3 \
     WHERE id = (SELECT t.id FROM usage_inbox t WHERE t.id = $1 AND t.scope = $2) \
     AND acknowledged_at IS NULL RETURNING ",
    evidence_columns!()
);

/// Binds a new inbox row for `evidence`: a fresh id, then its columns (13 parameters, in the
/// order of [`INSERT`]'s).
///
/// # Errors
/// A token count out of the column's range.
pub(crate) fn bind_new<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    evidence: &'q NewEvidence,
) -> StoreResult<sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>> {
    let [input, output, cache_read, cache_write, reasoning] = token_columns(&evidence.usage)?;
    Ok(query
        .bind(EvidenceId::new().0)
        .bind(evidence.scope.as_str())
        .bind(evidence.execution_id.0)
        .bind(evidence.operation_key.as_str())
        .bind(evidence.provider_ref.as_deref())
        .bind(input)
        .bind(output)
        .bind(cache_read)
        .bind(cache_write)
        .bind(reasoning)
        .bind(evidence.exact)
        .bind(evidence.source.as_str())
        .bind(evidence.now))
}

/// Appends `evidence` to the inbox on `conn` (alone, or inside the settlement's transaction).
///
/// # Errors
/// Store failure; a token count out of the column's range.
pub(crate) async fn insert(
    conn: &mut PgConnection,
    evidence: &NewEvidence,
) -> StoreResult<Evidence> {
    let row = bind_new(sqlx::query(INSERT), evidence)?
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    EvidenceRow::from_row(&row).store_err()?.into_record()
}

#[async_trait]
impl UsageInbox for PgStores {
    async fn record_evidence(&self, evidence: NewEvidence) -> StoreResult<Evidence> {
        self.bounded(async move {
            let mut conn = self.pool().acquire().await.store_err()?;
            insert(&mut conn, &evidence).await
        })
        .await
    }

    async fn evidence_for(&self, execution_id: ExecutionId) -> StoreResult<Vec<Evidence>> {
        self.bounded(async move {
            let rows: Vec<EvidenceRow> = sqlx::query_as(EVIDENCE_OF)
                .bind(execution_id.0)
                .fetch_all(self.pool())
                .await
                .store_err()?;
            rows.into_iter().map(EvidenceRow::into_record).collect()
        })
        .await
    }

    async fn unacknowledged(
        &self,
        scope: &Scope,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<Evidence>> {
        self.bounded(async move {
            let rows: Vec<EvidenceRow> = sqlx::query_as(OPEN)
                .bind(scope.as_str())
                .bind(after)
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await
                .store_err()?;
            rows.into_iter().map(EvidenceRow::into_record).collect()
        })
        .await
    }

    async fn acknowledge(
        &self,
        scope: &Scope,
        id: EvidenceId,
        now: DateTime<Utc>,
    ) -> StoreResult<bool> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let acknowledged: Option<EvidenceRow> = sqlx::query_as(ACKNOWLEDGE)
                .bind(id.0)
                .bind(scope.as_str())
                .bind(now)
                .fetch_optional(&mut *tx)
                .await
                .store_err()?;
            let Some(acknowledged) = acknowledged else {
                let exists: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM usage_inbox WHERE id = $1 AND scope = $2)",
                )
                .bind(id.0)
                .bind(scope.as_str())
                .fetch_one(&mut *tx)
                .await
                .store_err()?;
                tx.rollback().await.store_err()?;
                return if exists {
                    Ok(false)
                } else {
                    Err(StoreError::NotFound(id.to_string()))
                };
            };
            let evidence = acknowledged.into_record()?;
            let event = rules::evidence_acknowledged_event(scope, &evidence, now);
            audit::append(&mut tx, event).await?;
            tx.commit().await.store_err()?;
            Ok(true)
        })
        .await
    }
}
