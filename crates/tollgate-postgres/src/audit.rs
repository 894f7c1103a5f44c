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
use tollgate_store::rows::{
    AuditChain, AuditEvent, AuditHead, AuditPosition, AuditRow, AUDIT_CHAINS,
};
use tollgate_store::traits::AuditLog;
use tollgate_store::StoreResult;

/// Locks the head of one chain of a scope; returns its last seq and hash.
pub(crate) const LOCK_HEAD: &str = "SELECT last_seq, last_hash FROM audit_heads \
     WHERE scope = $1 AND chain = $2 FOR UPDATE";

/// Creates every head of a new scope, in chain order (so two first appends of one scope wait for
/// one another instead of deadlocking).
const CREATE_HEADS: &str = "INSERT INTO audit_heads (scope, chain, last_seq, last_hash) \
     SELECT $1, c, 0, $2 FROM generate_series(0, $3::int - 1) AS c ORDER BY c \
     ON CONFLICT DO NOTHING";

/// Appends the row and moves the head, in one statement.
const APPEND: &str = concat!(
    "WITH head AS (UPDATE audit_heads SET last_seq = $3, last_hash = $9 \
     WHERE scope = $1 AND chain = $2) \
     INSERT INTO audit_log (scope, chain, seq, execution_id, kind, detail, at, prev_hash, hash) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING ",
    audit_columns!()
);

/// Locks the head of `chain` of `scope`, creating the scope's heads on its first append.
pub(crate) async fn lock_head(
    conn: &mut PgConnection,
    scope: &Scope,
    chain: AuditChain,
) -> StoreResult<(i64, String)> {
    let chain_number = i16::try_from(chain.0).map_err(|_| unstorable("audit chain"))?;
    let lock = sqlx::query_as::<_, (i64, String)>(LOCK_HEAD)
        .bind(scope.as_str())
        .bind(chain_number);
    if let Some(head) = lock.fetch_optional(&mut *conn).await.store_err()? {
        return Ok(head);
    }
    sqlx::query(CREATE_HEADS)
        .bind(scope.as_str())
        .bind(Digest256([0; 32]).to_hex())
        .bind(i32::from(AUDIT_CHAINS))
        .execute(&mut *conn)
        .await
        .store_err()?;
    sqlx::query_as::<_, (i64, String)>(LOCK_HEAD)
        .bind(scope.as_str())
        .bind(chain_number)
        .fetch_optional(&mut *conn)
        .await
        .store_err()?
        .ok_or_else(|| corrupt("audit head"))
}

/// Appends `event` to its chain of its scope on `conn` (inside the caller's transaction). Locks
/// that chain's head until the transaction ends, so take it last.
///
/// # Errors
/// Store failure; a corrupt head.
pub(crate) async fn append(conn: &mut PgConnection, event: AuditEvent) -> StoreResult<AuditRow> {
    let head = lock_head(conn, &event.scope, event.chain()).await?;
    append_at(conn, event, head).await
}

/// An audit row ready to insert after a locked head: its place in the chain and its hash.
pub(crate) struct Prepared {
    pub(crate) event: AuditEvent,
    pub(crate) chain: i16,
    pub(crate) seq: i64,
    pub(crate) prev: Digest256,
    pub(crate) hash: Digest256,
}

/// Places `event` after its chain's head `(last_seq, last_hash)` and hashes it.
///
/// # Errors
/// A corrupt head; a chain or seq out of range.
pub(crate) fn prepare(
    event: AuditEvent,
    (last_seq, last_hash): (i64, String),
) -> StoreResult<Prepared> {
    let mut event = event;
    event.at = audit_time(event.at);
    let chain = event.chain();
    let prev = Digest256::from_hex(&last_hash).map_err(|_| corrupt("audit head hash"))?;
    let seq = last_seq
        .checked_add(1)
        .ok_or_else(|| unstorable("audit seq"))?;
    let hash = row_hash(chain, &prev, seq, &event);
    Ok(Prepared {
        chain: i16::try_from(chain.0).map_err(|_| unstorable("audit chain"))?,
        event,
        seq,
        prev,
        hash,
    })
}

/// Appends `event` after its chain's head `(last_seq, last_hash)`, which the caller has locked
/// in this transaction (by [`append`]'s lock or in its own statement).
///
/// # Errors
/// Store failure; a corrupt head.
pub(crate) async fn append_at(
    conn: &mut PgConnection,
    event: AuditEvent,
    head: (i64, String),
) -> StoreResult<AuditRow> {
    let p = prepare(event, head)?;
    let row: AuditDbRow = sqlx::query_as(APPEND)
        .bind(p.event.scope.as_str())
        .bind(p.chain)
        .bind(p.seq)
        .bind(p.event.execution_id.map(|e| e.0))
        .bind(&p.event.kind)
        .bind(Json(&p.event.detail))
        .bind(p.event.at)
        .bind(p.prev.to_hex())
        .bind(p.hash.to_hex())
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    row.into_record()
}

#[async_trait]
impl AuditLog for PgStores {
    async fn append_audit(&self, event: AuditEvent) -> StoreResult<AuditRow> {
        self.bounded(async move {
            let mut tx = self.begin().await?;
            let row = append(&mut tx, event).await?;
            tx.commit().await.store_err()?;
            Ok(row)
        })
        .await
    }

    async fn audit_rows(
        &self,
        scope: &Scope,
        after: AuditPosition,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>> {
        self.bounded(async move {
            let rows: Vec<AuditDbRow> = sqlx::query_as(concat!(
                "SELECT ",
                audit_columns!(),
                " FROM audit_log WHERE scope = $1 AND (chain, seq) > ($2, $3) \
                 ORDER BY chain, seq LIMIT $4"
            ))
            .bind(scope.as_str())
            .bind(i16::try_from(after.chain.0).map_err(|_| unstorable("audit chain"))?)
            .bind(after.seq)
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .store_err()?;
            rows.into_iter().map(AuditDbRow::into_record).collect()
        })
        .await
    }

    async fn audit_heads(&self, scope: &Scope) -> StoreResult<Vec<AuditHead>> {
        self.bounded(async move {
            let heads: Vec<(i16, i64, String)> = sqlx::query_as(
                "SELECT chain, last_seq, last_hash FROM audit_heads WHERE scope = $1 ORDER BY chain",
            )
            .bind(scope.as_str())
            .fetch_all(self.pool())
            .await
            .store_err()?;
            heads
                .into_iter()
                .map(|(chain, seq, hash)| {
                    let chain = AuditChain(u16::try_from(chain).map_err(|_| corrupt("audit chain"))?);
                    let hash = Digest256::from_hex(&hash).map_err(|_| corrupt("audit head hash"))?;
                    Ok(AuditHead { chain, seq, hash })
                })
                .collect()
        })
        .await
    }
}
