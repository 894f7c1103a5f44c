//! Journal writes: claim with holds, fenced transitions, and fence takeover (spec/journal.md).

use crate::audit;
use crate::error::{db, DbResultExt};
use crate::executions;
use crate::locks;
use crate::rows::{execution_columns, ExecutionRow, SpendRow};
use crate::spend::{self, SpendKeys};
use crate::PgStores;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection, Row};
use std::sync::atomic::Ordering;
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::{ExecutionId, OperationKey, Scope};
use tollgate_core::state::{ExecutionState, NotDispatchedCause, ReconciliationReason};
use tollgate_store::rows::*;
use tollgate_store::rules;
use tollgate_store::{StoreError, StoreResult};

/// Inserts the row unless the key has one; for a call outside a root, locks the head of its
/// audit chain (`$20`) in the same round trip and returns it as `seq:hash` (`NULL` under a root,
/// whose lock comes first, and before the scope's first append).
const INSERT: &str = concat!(
    "WITH e AS (INSERT INTO executions (",
    execution_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
     COALESCE($13, clock_timestamp()) + $19::bigint * interval '1 millisecond', \
     $14, $15, $16, $17, $18) ON CONFLICT (scope, operation_key) DO NOTHING RETURNING ",
    execution_columns!(),
    ") SELECT e.*, (SELECT h.last_seq::text || ':' || h.last_hash FROM audit_heads h \
     WHERE e.root_key IS NULL AND h.scope = e.scope AND h.chain = $20 FOR UPDATE) AS audit_head \
     FROM e"
);

/// A claim's audit rows (`$6`..: one or two, the head moved to the last), then its hold added to
/// both spend rows (upserted: the session row, then the day row), in one statement: the head is
/// already locked, so the spend rows are still the last locks taken (H-13), and they are held
/// for this statement and the commit only. Answers both rows' totals after the hold; the
/// caps are checked on the totals before it (after − hold), and a refusal rolls it all back.
macro_rules! append_then_hold {
    ($rows:literal, $hold:literal) => {
        concat!(
            "WITH h AS (UPDATE audit_heads SET last_seq = $6, last_hash = $7 \
               WHERE scope = $1 AND chain = $8), \
             a AS (INSERT INTO audit_log (scope, chain, seq, execution_id, kind, detail, at, \
               prev_hash, hash) VALUES ",
            $rows,
            "), s AS (INSERT INTO spend_sessions (scope, consumer, session_id, currency, held) \
               VALUES ($1, $2, $3, $4, ",
            $hold,
            ") ON CONFLICT (scope, consumer, session_id, currency) \
               DO UPDATE SET held = spend_sessions.held + EXCLUDED.held RETURNING settled, held), \
             d AS (INSERT INTO spend_days (scope, consumer, day, currency, held) \
               SELECT $1, $2, $5, $4, ",
            $hold,
            " FROM s \
               ON CONFLICT (scope, consumer, day, currency) \
               DO UPDATE SET held = spend_days.held + EXCLUDED.held RETURNING settled, held) \
             SELECT s.settled, s.held, d.settled AS day_settled, d.held AS day_held FROM s, d"
        )
    };
}

/// [`append_then_hold!`] with the `claimed` row.
const CLAIMED_THEN_HOLD: &str =
    append_then_hold!("($1, $8, $9, $10, $11, $12, $13, $14, $15)", "$16");

/// [`append_then_hold!`] with the `claimed` and `dispatched` rows (H-14).
const CLAIMED_DISPATCHED_THEN_HOLD: &str = append_then_hold!(
    "($1, $8, $9, $10, $11, $12, $13, $14, $15), ($1, $8, $16, $10, $17, $18, $19, $20, $21)",
    "$22"
);

/// A fenced state change: only the current fence, only from an allowed state. In the same round
/// trip, after the row, it locks the head of the row's audit chain (`$8`) and returns it as
/// `seq:hash` (`NULL` before the scope's first append), so the transition's audit append needs
/// one statement more, not two (H-11). Row, then head: the crate's lock order.
pub(crate) const FENCED: &str = concat!(
    "WITH e AS (UPDATE executions SET state = $4, provider_ref = COALESCE($5, provider_ref), \
     updated_at = $6, reconciliation_reason = COALESCE($7, reconciliation_reason) \
     WHERE id = $1 AND fence = $2 AND state = ANY($3) RETURNING ",
    execution_columns!(),
    ") SELECT e.*, (SELECT h.last_seq::text || ':' || h.last_hash FROM audit_heads h \
     WHERE h.scope = e.scope AND h.chain = $8 FOR UPDATE) AS audit_head FROM e"
);

const NOT_DISPATCHED: &str = concat!(
    "UPDATE executions SET state = $2, not_dispatched_cause = $3, hold = 0, updated_at = $4 \
     WHERE id = $1 RETURNING ",
    execution_columns!()
);

const DISPATCHED_WITH_HOLD: &str = concat!(
    "UPDATE executions SET state = $2, hold = $3, updated_at = $4 WHERE id = $1 RETURNING ",
    execution_columns!()
);

/// A new fence when eligible; the lease is compared and set with the database's clock (`$7` is
/// `NULL` outside tests, see `PgStores::lease_now`).
const TAKE_FENCE: &str = concat!(
    "UPDATE executions SET fence = fence + 1, \
     lease_expires_at = COALESCE($7, clock_timestamp()) + $4::bigint * interval '1 millisecond', \
     updated_at = $5 \
     WHERE scope = $1 AND operation_key = $2 AND state = ANY($3) \
     AND (NOT $6 OR lease_expires_at <= COALESCE($7, clock_timestamp())) RETURNING ",
    execution_columns!()
);

/// The heartbeat: a fenced lease extension of an unfinished row, from the database's clock.
pub(crate) const RENEW_LEASE: &str = concat!(
    "UPDATE executions \
     SET lease_expires_at = COALESCE($4, clock_timestamp()) + $3::bigint * interval '1 millisecond' \
     WHERE id = $1 AND fence = $2 AND state = ANY($5) RETURNING ",
    execution_columns!()
);

/// A lease in milliseconds as the database's `bigint` (a lease past its range fails there).
fn lease_millis(lease_ms: u64) -> i64 {
    i64::try_from(lease_ms).unwrap_or(i64::MAX)
}

fn state_names(states: &[ExecutionState]) -> Vec<&'static str> {
    states.iter().map(ExecutionState::as_str).collect()
}

/// Why a fenced write changed nothing: `StaleFence` when the row exists, else `NotFound`.
async fn refused(conn: &mut PgConnection, id: ExecutionId) -> StoreError {
    let exists: Result<bool, _> =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM executions WHERE id = $1)")
            .bind(id.0)
            .fetch_one(&mut *conn)
            .await;
    match exists {
        Ok(true) => StoreError::StaleFence(id),
        Ok(false) => StoreError::NotFound(id.to_string()),
        Err(e) => db(e),
    }
}

/// Inserts `r`; its lease ends `lease_ms` after `lease_now` (`None`: the database's clock).
/// `None` when the key already has a row; else the row and, outside a root, the locked head of
/// `chain` (`None` before the scope's first append).
async fn insert(
    conn: &mut PgConnection,
    r: &ExecutionRecord,
    lease_now: Option<DateTime<Utc>>,
    lease_ms: u64,
) -> StoreResult<Option<(ExecutionRecord, Option<(i64, String)>)>> {
    let chain = i16::try_from(AuditChain::of_execution(r.id).0)
        .map_err(|_| StoreError::Corrupt("audit chain".into()))?;
    let row: Option<PgRow> = sqlx::query(INSERT)
        .bind(r.id.0)
        .bind(r.scope.as_str())
        .bind(r.operation_key.as_str())
        .bind(r.kind.as_str())
        .bind(r.root_key.as_ref().map(|k| k.as_str()))
        .bind(Json(&r.binding))
        .bind(r.binding_digest.to_hex())
        .bind(r.accounting_day)
        .bind(r.state.as_str())
        .bind(r.not_dispatched_cause.map(|c| c.as_str()))
        .bind(r.outcome.map(|o| o.as_str()))
        .bind(r.fence.0)
        .bind(lease_now)
        .bind(r.hold.decimal())
        .bind(r.provider_ref.as_deref())
        .bind(r.created_at)
        .bind(r.updated_at)
        .bind(r.reconciliation_reason.map(|c| c.as_str()))
        .bind(lease_millis(lease_ms))
        .bind(chain)
        .fetch_optional(&mut *conn)
        .await
        .store_err()?;
    let Some(row) = row else {
        return Ok(None);
    };
    let head: Option<String> = row.try_get("audit_head").store_err()?;
    let record = ExecutionRow::from_row(&row).store_err()?.into_record()?;
    Ok(Some((
        record,
        head.as_deref().map(locks::parse_head).transpose()?,
    )))
}

/// Appends a claim's audit rows after `head` (locked) and adds its hold to both spend rows, in
/// one round trip; both rows' totals after the hold.
async fn append_then_hold(
    conn: &mut PgConnection,
    keys: &SpendKeys<'_>,
    record: &ExecutionRecord,
    head: (i64, String),
    now: DateTime<Utc>,
    hold: tollgate_core::money::Money,
) -> StoreResult<(SpendTotals, SpendTotals)> {
    let mut rows: Vec<audit::Prepared> = Vec::new();
    for event in rules::claim_events(record, now) {
        let after = match rows.last() {
            Some(last) => (last.seq, last.hash.to_hex()),
            None => head.clone(),
        };
        rows.push(audit::prepare(event, after)?);
    }
    let (first, last) = match (rows.first(), rows.last()) {
        (Some(first), Some(last)) => (first, last),
        _ => return Err(StoreError::Corrupt("claim without audit rows".into())),
    };
    let sql = match rows.len() {
        1 => CLAIMED_THEN_HOLD,
        2 => CLAIMED_DISPATCHED_THEN_HOLD,
        _ => return Err(StoreError::Corrupt("claim audit rows".into())),
    };
    let mut query = sqlx::query_as::<_, (Decimal, Decimal, Decimal, Decimal)>(sql)
        .bind(keys.scope)
        .bind(keys.consumer)
        .bind(keys.session)
        .bind(keys.currency)
        .bind(keys.day)
        .bind(last.seq)
        .bind(last.hash.to_hex())
        .bind(first.chain)
        .bind(first.seq)
        .bind(record.id.0);
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            query = query.bind(row.seq);
        }
        query = query
            .bind(row.event.kind.clone())
            .bind(Json(row.event.detail.clone()))
            .bind(row.event.at)
            .bind(row.prev.to_hex())
            .bind(row.hash.to_hex());
    }
    query = query.bind(hold.decimal());
    let (session_settled, session_held, day_settled, day_held) =
        query.fetch_one(&mut *conn).await.store_err()?;
    Ok((
        SpendRow::totals(session_settled, session_held)?,
        SpendRow::totals(day_settled, day_held)?,
    ))
}

impl PgStores {
    /// [`ExecutionStore::claim`](tollgate_store::ExecutionStore::claim): one transaction that
    /// inserts the row (or finds the existing one), takes the root lock when the call is under a
    /// root, audits `claimed`, locks both spend rows, admits the hold against the block caps
    /// (then against the root block cap on the root's inclusive cost) and adds it to the spend
    /// rows and the root. A refusal rolls everything back — a root that is `reconciled` or past its
    /// deadline refuses (ST-36); a missing root is `NotFound`.
    ///
    /// Locks in the crate's order: the new execution row (the insert), the root row, the audit
    /// head, the session spend row, the day spend row.
    ///
    /// A replay is a plain read first (H-9): when the key already has a row, it is returned
    /// without a write transaction, with its result, settlement and root receipt from the same
    /// statement (H-16). Only an absent key takes the insert path, where a claimer
    /// racing on the same key is settled by `ON CONFLICT`.
    pub(crate) async fn claim_tx(&self, request: ClaimRequest) -> StoreResult<ClaimOutcome> {
        // A key seen here with a row is most likely a replay: read it first, one read and no
        // write. Any other key outside a root goes to the claim function at once, which answers
        // a key that has a row with nothing; the read follows then (H-30).
        let known = self.known.contains(&request.scope, &request.operation_key);
        if known || request.root_key.is_some() {
            self.reads_first.fetch_add(1, Ordering::Relaxed);
            let mut call = self.call_connection().await?;
            let held = (&request.binding, request.digest());
            let existing = executions::view_held(&mut call, &request, held).await?;
            if let Some(existing) = existing {
                self.known.insert(&request.scope, &request.operation_key);
                return Ok(ClaimOutcome::Existing(Box::new(existing)));
            }
        }
        let record = rules::new_execution(&request);
        if request.root_key.is_none() {
            let outcome = self.claim_call(&request, &record).await?;
            if matches!(
                outcome,
                ClaimOutcome::Claimed(_) | ClaimOutcome::Existing(_)
            ) {
                self.known.insert(&request.scope, &request.operation_key);
            }
            return Ok(outcome);
        }
        let mut tx = self.pool().begin().await.store_err()?;
        let lease_now = self.lease_now(request.now);
        let Some((record, head)) = insert(&mut tx, &record, lease_now, request.lease_ms).await?
        else {
            // The insert waited for any concurrent claimer of the key, so the row is committed.
            let held = Some((&record.binding, record.binding_digest));
            let existing =
                executions::view_by_key(&mut tx, &request.scope, &request.operation_key, held)
                    .await?
                    .ok_or_else(|| StoreError::Corrupt("key without row".into()))?;
            tx.rollback().await.store_err()?;
            return Ok(ClaimOutcome::Existing(Box::new(existing)));
        };
        let currency = rules::currency_of(&record);
        let caps = &request.binding.config.caps;
        // The root lock before the audit head and the spend rows (the crate's lock order); its
        // verdicts come after the spend caps', as in the in-memory store.
        let root = match &request.root_key {
            Some(root_key) => Some((
                root_key,
                locks::lock_root(&mut tx, &request.scope, root_key).await?,
            )),
            None => None,
        };
        let head = match head {
            Some(head) => head,
            None => {
                let chain = AuditChain::of_execution(record.id);
                audit::lock_head(&mut tx, &record.scope, chain).await?
            }
        };
        // `claimed` (then `dispatched` when the claim is also the dispatch mark), then the hold
        // on the spend rows, the last locks (H-13): held for this statement and the commit. The
        // caps judge the totals before the hold; a refusal rolls everything back.
        let keys = SpendKeys::of(&record);
        let (session_after, daily_after) =
            append_then_hold(&mut tx, &keys, &record, head, request.now, request.hold).await?;
        let session = rules::release_hold(session_after, request.hold)?;
        let daily = rules::release_hold(daily_after, request.hold)?;
        // The spend rows are the snapshot's currency's (SC-105); a mismatch returns before the
        // commit, so the dropped transaction writes nothing (SC-106).
        let admitted = spend::admit(caps, currency, session, daily, request.hold)?;
        if let Err(blocked) = admitted {
            tx.rollback().await.store_err()?;
            return Ok(ClaimOutcome::Blocked(blocked));
        }
        if let Some((root_key, root)) = root {
            let Some(root) = root else {
                tx.rollback().await.store_err()?;
                return Err(StoreError::NotFound(format!("root {root_key}")));
            };
            // Decided under the root lock, in the unit that inserts the row (ST-36).
            if !rules::root_takes_claim(&root, request.now) {
                tx.rollback().await.store_err()?;
                return Ok(ClaimOutcome::RootRefused(root));
            }
            if let Err(blocked) =
                caps.admit_root(currency, &rules::root_spend(&root), request.hold)?
            {
                tx.rollback().await.store_err()?;
                return Ok(ClaimOutcome::Blocked(blocked));
            }
            let totals = rules::add_hold(root.totals(), request.hold)?;
            locks::write_totals(&mut tx, root.id, totals, Some(request.now)).await?;
        }
        // The hold is already on both spend rows: the commit makes it so.
        tx.commit().await.store_err()?;
        Ok(ClaimOutcome::Claimed(record))
    }

    /// A fenced transition to `to` (keeping the provider reference unless one is given),
    /// audited as `kind`.
    pub(crate) async fn fenced_tx(
        &self,
        fence: Fence,
        allowed: &[ExecutionState],
        (to, reason): (ExecutionState, Option<ReconciliationReason>),
        provider_ref: Option<String>,
        kind: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut tx = self.pool().begin().await.store_err()?;
        let chain = AuditChain::of_execution(fence.execution_id);
        let chain_number =
            i16::try_from(chain.0).map_err(|_| StoreError::Corrupt("audit chain".into()))?;
        let row: Option<PgRow> = sqlx::query(FENCED)
            .bind(fence.execution_id.0)
            .bind(fence.token.0)
            .bind(state_names(allowed))
            .bind(to.as_str())
            .bind(provider_ref)
            .bind(now)
            .bind(reason.map(|r| r.as_str()))
            .bind(chain_number)
            .fetch_optional(&mut *tx)
            .await
            .store_err()?;
        let Some(row) = row else {
            return Err(refused(&mut tx, fence.execution_id).await);
        };
        let head: Option<String> = row.try_get("audit_head").store_err()?;
        let record = ExecutionRow::from_row(&row).store_err()?.into_record()?;
        let event = rules::transition_event(&record, kind, now);
        match head {
            Some(head) if event.chain() == chain => {
                audit::append_at(&mut tx, event, locks::parse_head(&head)?).await?;
            }
            // The scope's heads do not exist yet (or another chain): the usual lock.
            _ => {
                audit::append(&mut tx, event).await?;
            }
        }
        tx.commit().await.store_err()?;
        Ok(record)
    }

    /// `prepared → not_dispatched(cause)`, releasing the hold from the root (under the root
    /// lock, for a call under a root) and from both spend rows.
    pub(crate) async fn not_dispatched_tx(
        &self,
        fence: Fence,
        cause: NotDispatchedCause,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut tx = self.pool().begin().await.store_err()?;
        let before = locks::lock_execution(&mut tx, fence.execution_id).await?;
        rules::check_fence(&before, fence, &[ExecutionState::Prepared])?;
        if let Some(root_key) = &before.root_key {
            if let Some(root) = locks::lock_root(&mut tx, &before.scope, root_key).await? {
                // Like the in-memory store: the hold goes, `updated_at` stays.
                let totals = rules::release_hold(root.totals(), before.hold)?;
                locks::write_totals(&mut tx, root.id, totals, None).await?;
            }
        }
        let row: ExecutionRow = sqlx::query_as(NOT_DISPATCHED)
            .bind(before.id.0)
            .bind(ExecutionState::NotDispatched.as_str())
            .bind(cause.as_str())
            .bind(now)
            .fetch_one(&mut *tx)
            .await
            .store_err()?;
        let record = row.into_record()?;
        audit::append(
            &mut tx,
            rules::transition_event(&record, "not_dispatched", now),
        )
        .await?;
        let keys = SpendKeys::of(&before);
        let (session, daily) = spend::lock(&mut tx, &keys).await?;
        // An over-release returns before the commit: the dropped transaction writes nothing
        // (SC-107).
        let session = rules::release_hold(session, before.hold)?;
        let daily = rules::release_hold(daily, before.hold)?;
        spend::write(&mut tx, &keys, session, daily).await?;
        tx.commit().await.store_err()?;
        Ok(record)
    }

    /// `prepared → dispatched` with the hold shrunk to `hold` (SC-122): the difference leaves
    /// the root (under the root lock, for a call under a root) and both spend rows, in the
    /// crate's lock order. A hold that would grow is refused with nothing written.
    pub(crate) async fn dispatched_with_hold_tx(
        &self,
        fence: Fence,
        hold: tollgate_core::money::Money,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut tx = self.pool().begin().await.store_err()?;
        let before = locks::lock_execution(&mut tx, fence.execution_id).await?;
        rules::check_fence(&before, fence, &[ExecutionState::Prepared])?;
        let shrink = rules::hold_shrink(&before, hold)?;
        if let Some(root_key) = &before.root_key {
            if let Some(root) = locks::lock_root(&mut tx, &before.scope, root_key).await? {
                let totals = rules::release_hold(root.totals(), shrink)?;
                locks::write_totals(&mut tx, root.id, totals, None).await?;
            }
        }
        let row: ExecutionRow = sqlx::query_as(DISPATCHED_WITH_HOLD)
            .bind(before.id.0)
            .bind(ExecutionState::Dispatched.as_str())
            .bind(hold.decimal())
            .bind(now)
            .fetch_one(&mut *tx)
            .await
            .store_err()?;
        let record = row.into_record()?;
        audit::append(&mut tx, rules::transition_event(&record, "dispatched", now)).await?;
        let keys = SpendKeys::of(&before);
        let (session, daily) = spend::lock(&mut tx, &keys).await?;
        let session = rules::release_hold(session, shrink)?;
        let daily = rules::release_hold(daily, shrink)?;
        spend::write(&mut tx, &keys, session, daily).await?;
        tx.commit().await.store_err()?;
        Ok(record)
    }

    /// Takes a new fence when eligible; audits `fence_taken`.
    pub(crate) async fn take_fence_tx(
        &self,
        scope: &Scope,
        key: &OperationKey,
        states: &[ExecutionState],
        require_expired: bool,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ExecutionRecord>> {
        let mut tx = self.pool().begin().await.store_err()?;
        let row: Option<ExecutionRow> = sqlx::query_as(TAKE_FENCE)
            .bind(scope.as_str())
            .bind(key.as_str())
            .bind(state_names(states))
            .bind(lease_millis(lease_ms))
            .bind(now)
            .bind(require_expired)
            .bind(self.lease_now(now))
            .fetch_optional(&mut *tx)
            .await
            .store_err()?;
        let Some(row) = row else {
            tx.rollback().await.store_err()?;
            return Ok(None);
        };
        let record = row.into_record()?;
        audit::append(
            &mut tx,
            rules::transition_event(&record, "fence_taken", now),
        )
        .await?;
        tx.commit().await.store_err()?;
        Ok(Some(record))
    }

    /// The heartbeat (`ExecutionStore::renew_lease`): one fenced statement, no audit row.
    pub(crate) async fn renew_lease_tx(
        &self,
        fence: Fence,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut conn = self.pool().acquire().await.store_err()?;
        let row: Option<ExecutionRow> = sqlx::query_as(RENEW_LEASE)
            .bind(fence.execution_id.0)
            .bind(fence.token.0)
            .bind(lease_millis(lease_ms))
            .bind(self.lease_now(now))
            .bind(state_names(&rules::LEASED))
            .fetch_optional(&mut *conn)
            .await
            .store_err()?;
        match row {
            Some(row) => row.into_record(),
            None => Err(refused(&mut conn, fence.execution_id).await),
        }
    }
}
