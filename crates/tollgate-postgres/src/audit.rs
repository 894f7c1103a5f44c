//! The append-only audit log: per-scope hash chain, appended inside the transaction of the
//! state change it describes (SC-50).

use crate::error::{corrupt, unstorable, DbResultExt};
use crate::rows::{audit_columns, AuditDbRow};
use crate::PgStores;
use async_trait::async_trait;
use sqlx::types::Json;
use sqlx::PgConnection;
use tollgate_core::digest::Digest256;
use tollgate_core::ids::Scope;
use tollgate_store::audit::{audit_time, row_hash};
use tollgate_store::rows::{AuditEvent, AuditHead, AuditRow};
use tollgate_store::traits::AuditLog;
use tollgate_store::StoreResult;

/// Creates the scope's head if missing and locks it; returns the last seq and hash.
const LOCK_HEAD: &str = "INSERT INTO audit_heads (scope, last_seq, last_hash) VALUES ($1, 0, $2) \
     ON CONFLICT (scope) DO UPDATE SET last_seq = audit_heads.last_seq \
     RETURNING last_seq, last_hash";

/// Appends the row and moves the head, in one statement.
const APPEND: &str = concat!(
    "WITH head AS (UPDATE audit_heads SET last_seq = $2, last_hash = $8 WHERE scope = $1) \
     INSERT INTO audit_log (scope, seq, execution_id, kind, detail, at, prev_hash, hash) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ",
    audit_columns!()
);

/// Appends `event` to its scope's chain on `conn` (inside the caller's transaction). Locks the
/// scope's head until the transaction ends, so take it last.
///
/// # Errors
/// Store failure; a corrupt head.
pub(crate) async fn append(conn: &mut PgConnection, event: AuditEvent) -> StoreResult<AuditRow> {
    let mut event = event;
    event.at = audit_time(event.at);
    let zero = Digest256([0; 32]).to_hex();
    let (last_seq, last_hash): (i64, String) = sqlx::query_as(LOCK_HEAD)
        .bind(event.scope.as_str())
        .bind(&zero)
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    let prev = Digest256::from_hex(&last_hash).map_err(|_| corrupt("audit head hash"))?;
    let seq = last_seq
        .checked_add(1)
        .ok_or_else(|| unstorable("audit seq"))?;
    let hash = row_hash(&prev, seq, &event);
    let row: AuditDbRow = sqlx::query_as(APPEND)
        .bind(event.scope.as_str())
        .bind(seq)
        .bind(event.execution_id.map(|e| e.0))
        .bind(&event.kind)
        .bind(Json(&event.detail))
        .bind(event.at)
        .bind(prev.to_hex())
        .bind(hash.to_hex())
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    row.into_record()
}

#[async_trait]
impl AuditLog for PgStores {
    async fn append_audit(&self, event: AuditEvent) -> StoreResult<AuditRow> {
        let mut tx = self.pool().begin().await.store_err()?;
        let row = append(&mut tx, event).await?;
        tx.commit().await.store_err()?;
        Ok(row)
    }

    async fn audit_rows(
        &self,
        scope: &Scope,
        after_seq: i64,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>> {
        let rows: Vec<AuditDbRow> = sqlx::query_as(concat!(
            "SELECT ",
            audit_columns!(),
            " FROM audit_log WHERE scope = $1 AND seq > $2 ORDER BY seq LIMIT $3"
        ))
        .bind(scope.as_str())
        .bind(after_seq)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .store_err()?;
        rows.into_iter().map(AuditDbRow::into_record).collect()
    }

    async fn audit_head(&self, scope: &Scope) -> StoreResult<Option<AuditHead>> {
        let head: Option<(i64, String)> =
            sqlx::query_as("SELECT last_seq, last_hash FROM audit_heads WHERE scope = $1")
                .bind(scope.as_str())
                .fetch_optional(self.pool())
                .await
                .store_err()?;
        head.map(|(seq, hash)| {
            let hash = Digest256::from_hex(&hash).map_err(|_| corrupt("audit head hash"))?;
            Ok(AuditHead { seq, hash })
        })
        .transpose()
    }
}
