//! Results under retention, and their erasure (SC-73): erased content is set to NULL in the
//! same row and never written again (a CHECK keeps erased rows empty).

use crate::audit;
use crate::error::DbResultExt;
use crate::rows::{result_columns, ResultRow};
use crate::PgStores;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use tollgate_core::ids::{ExecutionId, Scope};
use tollgate_store::rows::ResultRecord;
use tollgate_store::rules;
use tollgate_store::traits::ResultStore;
use tollgate_store::{StoreError, StoreResult};
use uuid::Uuid;

/// A result by its execution (primary key).
pub(crate) const RESULT_BY_ID: &str = concat!(
    "SELECT ",
    result_columns!(),
    " FROM execution_results WHERE execution_id = $1"
);

/// Erases one result of the scope, unless already erased.
const ERASE: &str = "UPDATE execution_results r SET output = NULL, step = NULL, erased_at = $3 \
     FROM executions e \
     WHERE r.execution_id = $1 AND e.id = r.execution_id AND e.scope = $2 \
     AND r.erased_at IS NULL \
     RETURNING r.execution_id";

const EXISTS_IN_SCOPE: &str = "SELECT EXISTS (SELECT 1 FROM execution_results r \
     JOIN executions e ON e.id = r.execution_id \
     WHERE r.execution_id = $1 AND e.scope = $2)";

/// Erases up to `$2` expired results; rows another eraser holds are skipped.
const ERASE_EXPIRED: &str = "WITH due AS (\
         SELECT execution_id FROM execution_results \
         WHERE erased_at IS NULL AND retention_expires_at <= $1 \
         ORDER BY retention_expires_at, execution_id LIMIT $2 \
         FOR UPDATE SKIP LOCKED) \
     UPDATE execution_results r SET output = NULL, step = NULL, erased_at = $1 \
     FROM due, executions e \
     WHERE r.execution_id = due.execution_id AND e.id = r.execution_id \
     RETURNING e.scope, r.execution_id";

async fn audit_erased(
    conn: &mut PgConnection,
    erased: Vec<(String, Uuid)>,
    now: DateTime<Utc>,
) -> StoreResult<()> {
    let mut erased = erased;
    // Heads are locked in scope order, so concurrent erasers cannot deadlock.
    erased.sort();
    for (scope, id) in erased {
        let scope = Scope::from_stored(scope).map_err(|_| crate::error::corrupt("scope"))?;
        audit::append(conn, rules::erased_event(&scope, ExecutionId(id), now)).await?;
    }
    Ok(())
}

#[async_trait]
impl ResultStore for PgStores {
    async fn result(&self, execution_id: ExecutionId) -> StoreResult<Option<ResultRecord>> {
        self.bounded(async move {
            let row: Option<ResultRow> = sqlx::query_as(RESULT_BY_ID)
                .bind(execution_id.0)
                .fetch_optional(self.pool())
                .await
                .store_err()?;
            row.map(ResultRow::into_record).transpose()
        })
        .await
    }

    async fn erase(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let erased: Option<Uuid> = sqlx::query_scalar(ERASE)
                .bind(execution_id.0)
                .bind(scope.as_str())
                .bind(now)
                .fetch_optional(&mut *tx)
                .await
                .store_err()?;
            if erased.is_none() {
                let exists: bool = sqlx::query_scalar(EXISTS_IN_SCOPE)
                    .bind(execution_id.0)
                    .bind(scope.as_str())
                    .fetch_one(&mut *tx)
                    .await
                    .store_err()?;
                tx.rollback().await.store_err()?;
                return if exists {
                    Ok(())
                } else {
                    Err(StoreError::NotFound(execution_id.to_string()))
                };
            }
            audit::append(&mut tx, rules::erased_event(scope, execution_id, now)).await?;
            tx.commit().await.store_err()?;
            Ok(())
        })
        .await
    }

    async fn erase_expired(&self, now: DateTime<Utc>, limit: u32) -> StoreResult<u64> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let erased: Vec<(String, Uuid)> = sqlx::query_as(ERASE_EXPIRED)
                .bind(now)
                .bind(i64::from(limit))
                .fetch_all(&mut *tx)
                .await
                .store_err()?;
            let count = erased.len() as u64;
            audit_erased(&mut tx, erased, now).await?;
            tx.commit().await.store_err()?;
            Ok(count)
        })
        .await
    }
}
