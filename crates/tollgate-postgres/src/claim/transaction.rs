//! The general claim transaction: the claim of a new key under an operation root, in several
//! statements, because the root lock and the root cap checks come between the insert and the
//! spend rows (spec/journal.md).

use crate::audit;
use crate::error::DbResultExt;
use crate::executions;
use crate::journal::lease_millis;
use crate::limits;
use crate::locks;
use crate::rows::{
    execution_columns, execution_insert_columns, limit_columns, ExecutionRow, SpendRow,
};
use crate::spend::{self, SpendKeys};
use crate::PgStores;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection, Row};
use tollgate_core::caps::SpendTotals;
use tollgate_store::rows::*;
use tollgate_store::rules;
use tollgate_store::{StoreError, StoreResult};

/// Inserts the row unless the key has one; for a call outside a root, locks the head of its
/// audit chain (`$20`) in the same round trip and returns it as `seq:hash` (`NULL` under a root,
/// whose lock comes first, and before the scope's first append). The lease runs from its "now"
/// (`$13`, `NULL`: the database's clock), and a call under limits (its subjects `$21` and tokens
/// `$22`) keeps them with that "now" as its admission time, so the admission writes only the
/// window rows.
const INSERT: &str = concat!(
    "WITH e AS (INSERT INTO executions (",
    execution_insert_columns!(),
    ", ",
    limit_columns!(),
    ") SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
     n.now + $19::bigint * interval '1 millisecond', $14, $15, $16, $17, $18, \
     $21::text[], ($22::bigint[])[1], ($22::bigint[])[2], \
     CASE WHEN $21::text[] IS NOT NULL THEN n.now END \
     FROM (SELECT COALESCE($13, clock_timestamp()) AS now) n \
     ON CONFLICT (scope, operation_key) DO NOTHING RETURNING ",
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

/// [`append_then_hold!`] with the `claimed` and `dispatched` rows, for a claim that is also the
/// dispatch mark: one commit instead of two (H-14).
const CLAIMED_DISPATCHED_THEN_HOLD: &str = append_then_hold!(
    "($1, $8, $9, $10, $11, $12, $13, $14, $15), ($1, $8, $16, $10, $17, $18, $19, $20, $21)",
    "$22"
);

/// Inserts `r`; its lease ends `lease_ms` after `lease_now` (`None`: the database's clock), and
/// under `limits` it keeps them with that time as its admission's.
/// `None` when the key already has a row; else the row and, outside a root, the locked head of
/// `chain` (`None` before the scope's first append).
async fn insert(
    conn: &mut PgConnection,
    r: &ExecutionRecord,
    lease_now: Option<DateTime<Utc>>,
    lease_ms: u64,
    limits: Option<&limits::ClaimLimitArgs>,
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
        .bind(limits.map(|l| l.subjects.as_slice()))
        .bind(limits.map(|l| l.tokens.as_slice()))
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
    /// The general claim transaction: inserts the row (or finds the existing one), takes the root
    /// lock, audits `claimed`, locks both spend rows, admits the hold against the block caps (then
    /// against the root block cap on the root's inclusive cost) and adds it to the spend rows and
    /// the root, then admits the call under its limits. A refusal rolls everything back: a root
    /// that is `reconciled` or past its deadline refuses (ST-36), a limit refuses (`Limited`); a
    /// missing root is `NotFound`.
    ///
    /// Locks in the crate's order: the new execution row (the insert), the root row, the audit
    /// head, the session spend row, the day spend row, the limit windows. A claimer racing on the same key is settled
    /// by `ON CONFLICT`: the insert waits for it, and the row it committed is answered.
    pub(super) async fn claim_in_transaction(
        &self,
        request: ClaimRequest,
        record: ExecutionRecord,
    ) -> StoreResult<ClaimOutcome> {
        let mut tx = self.begin().await?;
        let lease_now = self.lease_now(request.now);
        let limits = limits::ClaimLimitArgs::of(&request.limits);
        let inserted = insert(
            &mut tx,
            &record,
            lease_now,
            request.lease_ms,
            limits.as_ref(),
        )
        .await?;
        let Some((record, head)) = inserted else {
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
        // The limits after the caps and the root, their windows the last locks; a refusal rolls
        // everything back (SC-220).
        if let Some(limits) = &limits {
            let admitted =
                limits::admit(&mut tx, record.id.0, record.scope.as_str(), limits).await?;
            if let Err(refused) = admitted {
                tx.rollback().await.store_err()?;
                return Ok(ClaimOutcome::Limited(refused));
            }
        }
        // The hold is already on both spend rows: the commit makes it so.
        tx.commit().await.store_err()?;
        Ok(ClaimOutcome::Claimed(record))
    }
}
