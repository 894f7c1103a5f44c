//! The row locks every transaction takes, in the crate's lock order (see the crate docs): the
//! execution row first, then its operation root's row, whose totals are written under that lock.

use crate::error::DbResultExt;
use crate::rows::{execution_columns, limit_columns, root_columns, ExecutionRow, RootRow};
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Row};
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::{EvidenceId, ExecutionId, OperationKey, RootId, RootKey, Scope};
use tollgate_store::rows::{AuditChain, NewEvidence};
use tollgate_store::rows::{ExecutionRecord, RootRecord};
use tollgate_store::{StoreError, StoreResult};

pub(crate) const EXECUTION_BY_KEY: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE scope = $1 AND operation_key = $2"
);

pub(crate) const EXECUTION_LOCK: &str = concat!(
    "SELECT ",
    execution_columns!(),
    " FROM executions WHERE id = $1 FOR UPDATE"
);

/// Locks the execution row, then, for an execution outside a root, the head of its audit chain
/// (`$2`), in one round trip; the head as `seq:hash`, `NULL` under a root (whose lock comes
/// between the two) and before the scope's first append (H-11). Answers the row's limit columns
/// too (what a limited call counted, for its settlement).
const EXECUTION_LOCK_WITH_HEAD: &str = concat!(
    "WITH e AS (SELECT ",
    execution_columns!(),
    ", ",
    limit_columns!(),
    " FROM executions WHERE id = $1 FOR UPDATE) \
     SELECT e.*, (SELECT h.last_seq::text || ':' || h.last_hash FROM audit_heads h \
     WHERE e.root_key IS NULL AND h.scope = e.scope AND h.chain = $2 FOR UPDATE) AS audit_head \
     FROM e"
);

/// [`EXECUTION_LOCK_WITH_HEAD`] that first appends the call's usage evidence (`$3`..`$15`) to
/// the inbox, in the same round trip (H-15): a new inbox row, which no other transaction waits
/// for. Answers the evidence's id as `evidence_id`.
const EXECUTION_LOCK_WITH_HEAD_AND_EVIDENCE: &str = concat!(
    "WITH ev AS (INSERT INTO usage_inbox (id, scope, execution_id, operation_key, provider_ref, \
     input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, \
     exact, source, received_at, acknowledged_at) \
     VALUES ($3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) RETURNING id), \
     e AS (SELECT ",
    execution_columns!(),
    ", ",
    limit_columns!(),
    " FROM executions WHERE id = $1 FOR UPDATE) \
     SELECT e.*, (SELECT h.last_seq::text || ':' || h.last_hash FROM audit_heads h \
     WHERE e.root_key IS NULL AND h.scope = e.scope AND h.chain = $2 FOR UPDATE) AS audit_head, \
     (SELECT ev.id FROM ev) AS evidence_id \
     FROM e"
);

/// Reads the root row `FOR UPDATE` by `(scope, root_key)`: second in the lock order.
const ROOT_LOCK: &str = concat!(
    "SELECT ",
    root_columns!(),
    " FROM roots WHERE scope = $1 AND root_key = $2 FOR UPDATE"
);

/// Writes the totals of a locked root; `updated_at` only when given.
const WRITE_TOTALS: &str = "UPDATE roots SET charged = $2, held = $3, \
     updated_at = COALESCE($4, updated_at) WHERE id = $1";

/// Reads the row under `(scope, key)`.
pub(crate) async fn execution_by_key(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &OperationKey,
) -> StoreResult<Option<ExecutionRecord>> {
    let row: Option<ExecutionRow> = sqlx::query_as(EXECUTION_BY_KEY)
        .bind(scope.as_str())
        .bind(key.as_str())
        .fetch_optional(&mut *conn)
        .await
        .store_err()?;
    row.map(ExecutionRow::into_record).transpose()
}

/// Locks the row `id` until the transaction ends.
///
/// # Errors
/// `NotFound` when there is no such row.
pub(crate) async fn lock_execution(
    conn: &mut PgConnection,
    id: ExecutionId,
) -> StoreResult<ExecutionRecord> {
    let row: Option<ExecutionRow> = sqlx::query_as(EXECUTION_LOCK)
        .bind(id.0)
        .fetch_optional(&mut *conn)
        .await
        .store_err()?;
    row.ok_or_else(|| StoreError::NotFound(id.to_string()))?
        .into_record()
}

/// Appends `evidence` (when given, with its acknowledgement time when the settlement
/// acknowledges it) to the inbox, then locks the row `id` and, outside a root,
/// the head of the audit chain `chain` of its scope, until the transaction ends, in one round
/// trip. The head is `None` under a root (the root lock comes between the
/// two: take it, then the head) and before the scope's first append.
///
/// # Errors
/// `NotFound` when there is no such row; a corrupt row or head.
pub(crate) async fn lock_execution_and_head(
    conn: &mut PgConnection,
    id: ExecutionId,
    chain: AuditChain,
    evidence: Option<(&NewEvidence, Option<DateTime<Utc>>)>,
) -> StoreResult<Locked> {
    let chain = i16::try_from(chain.0).map_err(|_| StoreError::Corrupt("audit chain".into()))?;
    let query = match evidence {
        None => sqlx::query(EXECUTION_LOCK_WITH_HEAD).bind(id.0).bind(chain),
        Some((evidence, acknowledged_at)) => crate::inbox::bind_new(
            sqlx::query(EXECUTION_LOCK_WITH_HEAD_AND_EVIDENCE)
                .bind(id.0)
                .bind(chain),
            evidence,
        )?
        .bind(acknowledged_at),
    };
    let row: Option<PgRow> = query.fetch_optional(&mut *conn).await.store_err()?;
    let row = row.ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    let head: Option<String> = row.try_get("audit_head").store_err()?;
    let evidence_id: Option<uuid::Uuid> = match evidence {
        Some(_) => row.try_get("evidence_id").store_err()?,
        None => None,
    };
    Ok(Locked {
        limits: crate::limits::limits_of(&row)?,
        record: ExecutionRow::from_row(&row).store_err()?.into_record()?,
        head: head.as_deref().map(parse_head).transpose()?,
        evidence_id: evidence_id.map(EvidenceId),
    })
}

/// What [`lock_execution_and_head`] locked and wrote.
pub(crate) struct Locked {
    /// The execution row, locked.
    pub(crate) record: ExecutionRecord,
    /// Its audit chain's head, locked (outside a root, once the scope has heads).
    pub(crate) head: Option<(i64, String)>,
    /// The evidence appended, when some was given.
    pub(crate) evidence_id: Option<EvidenceId>,
    /// What the call counted against its limits (`None`: it was admitted under none).
    pub(crate) limits: Option<crate::limits::HeldLimits>,
}

/// A locked audit head as `seq:hash` (see [`lock_execution_and_head`]).
pub(crate) fn parse_head(head: &str) -> StoreResult<(i64, String)> {
    let (seq, hash) = head
        .split_once(':')
        .ok_or_else(|| StoreError::Corrupt("audit head".into()))?;
    let seq = seq
        .parse()
        .map_err(|_| StoreError::Corrupt("audit head seq".into()))?;
    Ok((seq, hash.to_string()))
}

/// Takes the root lock on `(scope, root_key)` until the transaction ends; `None` when there is
/// no such root. Lock it after the execution row and before the spend rows.
///
/// # Errors
/// Store failure; a corrupt row.
pub(crate) async fn lock_root(
    conn: &mut PgConnection,
    scope: &Scope,
    root_key: &RootKey,
) -> StoreResult<Option<RootRecord>> {
    let row: Option<RootRow> = sqlx::query_as(ROOT_LOCK)
        .bind(scope.as_str())
        .bind(root_key.as_str())
        .fetch_optional(&mut *conn)
        .await
        .store_err()?;
    row.map(RootRow::into_record).transpose()
}

/// Writes new totals to a root the caller has locked with [`lock_root`]; moves `updated_at` only
/// when `now` is given.
///
/// # Errors
/// Store failure (including a total out of the column's range).
pub(crate) async fn write_totals(
    conn: &mut PgConnection,
    id: RootId,
    totals: SpendTotals,
    now: Option<DateTime<Utc>>,
) -> StoreResult<()> {
    sqlx::query(WRITE_TOTALS)
        .bind(id.0)
        .bind(totals.settled.decimal())
        .bind(totals.held.decimal())
        .bind(now)
        .execute(&mut *conn)
        .await
        .store_err()?;
    Ok(())
}
