//! Journal writes after the claim: fenced transitions of an execution, the heartbeat, and fence
//! takeover (spec/journal.md). The claim is in `claim/`, the settlement in `settle/`.

use crate::audit;
use crate::batch::Answer;
use crate::error::{db, DbResultExt};
use crate::limits;
use crate::locks;
use crate::rows::{execution_columns, limit_columns, ExecutionRow};
use crate::spend::{self, SpendKeys};
use crate::PgStores;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Row};
use tollgate_core::ids::{ExecutionId, OperationKey, Scope};
use tollgate_core::limits::LimitEnd;
use tollgate_core::state::{ExecutionState, NotDispatchedCause, ReconciliationReason};
use tollgate_store::rows::*;
use tollgate_store::rules;
use tollgate_store::{StoreError, StoreResult};

/// A fenced state change: only the current fence, only from an allowed state. In the same round
/// trip, after the row, it locks the head of the row's audit chain (`$8`) and returns it as
/// `seq:hash` (`NULL` before the scope's first append), so the transition's audit append needs
/// one statement more, not two (H-11). Row, then head: the crate's lock order. Answers the row's
/// limit columns too (what a limited call counted, for the end of its flight).
pub(crate) const FENCED: &str = concat!(
    "WITH e AS (UPDATE executions SET state = $4, provider_ref = COALESCE($5, provider_ref), \
     updated_at = $6, reconciliation_reason = COALESCE($7, reconciliation_reason) \
     WHERE id = $1 AND fence = $2 AND state = ANY($3) RETURNING ",
    execution_columns!(),
    ", ",
    limit_columns!(),
    ") SELECT e.*, (SELECT h.last_seq::text || ':' || h.last_hash FROM audit_heads h \
     WHERE h.scope = e.scope AND h.chain = $8 FOR UPDATE) AS audit_head FROM e"
);

/// `prepared → not_dispatched`; answers the row's limit columns too (what a limited call counted, to
/// give back).
const NOT_DISPATCHED: &str = concat!(
    "UPDATE executions SET state = $2, not_dispatched_cause = $3, hold = 0, updated_at = $4 \
     WHERE id = $1 RETURNING ",
    execution_columns!(),
    ", ",
    limit_columns!()
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

/// The renewals of several executions in one statement (H-36): each is the `UPDATE` of
/// [`RENEW_LEASE`] for its own `(id, fence)` and lease, and answers its row (`r_n`, the
/// renewal's place in the arrays, then the row) only when it renewed.
pub(crate) const RENEW_LEASES: &str = concat!(
    "UPDATE executions \
     SET lease_expires_at = COALESCE(r.r_now, clock_timestamp()) + r.r_ms * interval '1 millisecond' \
     FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::timestamptz[]) WITH ORDINALITY \
     AS r(r_id, r_fence, r_ms, r_now, r_n) \
     WHERE id = r.r_id AND fence = r.r_fence AND state = ANY($5) RETURNING r.r_n, ",
    execution_columns!()
);

/// The most lease renewals one statement carries (H-36): its arrays take any number, and with
/// thousands of calls in flight, renewals that wait go in a few statements rather than in
/// hundreds, each holding the renewals' one connection.
pub(crate) const RENEWALS_PER_STATEMENT_MAX: usize = 1_024;

/// One lease renewal waiting in the renewals' queue.
pub(crate) struct Renewal {
    fence: Fence,
    lease_ms: i64,
    now: Option<DateTime<Utc>>,
}

/// A lease in milliseconds as the database's `bigint` (a lease past its range fails there).
pub(crate) fn lease_millis(lease_ms: u64) -> i64 {
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

impl PgStores {
    /// A fenced transition to `to` (keeping the provider reference unless one is given),
    /// audited as `kind`; to `reconciliation_required`, a call under limits leaves flight.
    pub(crate) async fn fenced_tx(
        &self,
        fence: Fence,
        allowed: &[ExecutionState],
        (to, reason): (ExecutionState, Option<ReconciliationReason>),
        provider_ref: Option<String>,
        kind: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut tx = self.begin().await?;
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
        let held = limits::limits_of(&row)?;
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
        // A limited call parked for an operator is no longer in flight (SC-222); its windows are
        // the last locks.
        if let (ExecutionState::ReconciliationRequired, Some(held)) = (to, &held) {
            limits::end(&mut tx, record.scope.as_str(), held, LimitEnd::Parked).await?;
        }
        tx.commit().await.store_err()?;
        Ok(record)
    }

    /// `prepared → not_dispatched(cause)`, releasing the hold from the root (under the root
    /// lock, for a call under a root) and from both spend rows, and, for a call under limits,
    /// giving back what it counted.
    pub(crate) async fn not_dispatched_tx(
        &self,
        fence: Fence,
        cause: NotDispatchedCause,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        let mut tx = self.begin().await?;
        let before = locks::lock_execution(&mut tx, fence.execution_id).await?;
        rules::check_fence(&before, fence, &[ExecutionState::Prepared])?;
        if let Some(root_key) = &before.root_key {
            if let Some(root) = locks::lock_root(&mut tx, &before.scope, root_key).await? {
                // Like the in-memory store: the hold goes, `updated_at` stays.
                let totals = rules::release_hold(root.totals(), before.hold)?;
                locks::write_totals(&mut tx, root.id, totals, None).await?;
            }
        }
        let row: PgRow = sqlx::query(NOT_DISPATCHED)
            .bind(before.id.0)
            .bind(ExecutionState::NotDispatched.as_str())
            .bind(cause.as_str())
            .bind(now)
            .fetch_one(&mut *tx)
            .await
            .store_err()?;
        let held = limits::limits_of(&row)?;
        let record = ExecutionRow::from_row(&row).store_err()?.into_record()?;
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
        // A limited call never sent gives its request and tokens back (SC-223), after the spend
        // rows: the windows are the last locks.
        if let Some(held) = &held {
            limits::end(&mut tx, before.scope.as_str(), held, LimitEnd::NotSent).await?;
        }
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
        let mut tx = self.begin().await?;
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
        let mut tx = self.begin().await?;
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
        if let Some(queue) = &self.renewals {
            let renewal = Renewal {
                fence,
                lease_ms: lease_millis(lease_ms),
                now: self.lease_now(now),
            };
            let stores = self.clone();
            let (answer, _) = queue
                .submit(renewal, move |renewals| {
                    let stores = stores.clone();
                    async move { stores.renew_together(renewals).await }
                })
                .await?;
            match answer {
                Answer::Row(row) => return ExecutionRow::from_row(&row).store_err()?.into_record(),
                Answer::Failed(e) | Answer::Lost(e) => return Err(e),
                // Not renewed (the fence or the state moved on), or left to go alone: the single
                // statement says which, as for any renewal.
                Answer::NoRow | Answer::Alone | Answer::Single(_) => {}
            }
        }
        self.renew_alone(fence, lease_ms, now).await
    }

    /// The renewals waiting together (H-36) in one statement on the renewals' connection: each
    /// answered its row, or `NoRow` when its fence or state moved on; a second renewal of one
    /// execution in the same statement goes alone.
    async fn renew_together(&self, renewals: Vec<Renewal>) -> (Vec<Answer>, Vec<Renewal>) {
        let mut first = std::collections::HashSet::new();
        let once: Vec<bool> = renewals
            .iter()
            .map(|r| first.insert(r.fence.execution_id))
            .collect();
        let sent: Vec<&Renewal> = renewals
            .iter()
            .zip(&once)
            .filter_map(|(r, once)| once.then_some(r))
            .collect();
        let ids: Vec<uuid::Uuid> = sent.iter().map(|r| r.fence.execution_id.0).collect();
        let fences: Vec<i64> = sent.iter().map(|r| r.fence.token.0).collect();
        let leases: Vec<i64> = sent.iter().map(|r| r.lease_ms).collect();
        let nows: Vec<Option<DateTime<Utc>>> = sent.iter().map(|r| r.now).collect();
        if sent.len() > 1 {
            self.renewed_together.fetch_add(
                u64::try_from(sent.len()).unwrap_or(u64::MAX),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        let answered = async {
            let mut call = self.lease_connection().await?;
            let rows = sqlx::query(RENEW_LEASES)
                .bind(&ids)
                .bind(&fences)
                .bind(&leases)
                .bind(&nows)
                .bind(state_names(&rules::LEASED))
                .fetch_all(call.conn()?)
                .await;
            Ok::<_, StoreError>(call.check(rows))
        }
        .await;
        let rows = match answered {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) => return (crate::batch::failed_statement(e, renewals.len()), renewals),
            Err(e) => return (crate::batch::failed(&e, renewals.len()), renewals),
        };
        // `r_n` counts from 1 over the renewals sent (the first of each execution).
        let by_place = crate::batch::by_place(rows, "r_n", ids.len());
        let mut sent = by_place.into_iter();
        let answers = once
            .iter()
            .map(|once| match once {
                true => sent.next().flatten().map_or(Answer::NoRow, Answer::Row),
                false => Answer::Alone,
            })
            .collect();
        (answers, renewals)
    }

    /// One renewal as its own statement; a renewal that changed nothing says why.
    async fn renew_alone(
        &self,
        fence: Fence,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord> {
        // The renewals' own connection: a pool saturated by calls does not starve them.
        let mut call = self.lease_connection().await?;
        let row = sqlx::query_as::<_, ExecutionRow>(RENEW_LEASE)
            .bind(fence.execution_id.0)
            .bind(fence.token.0)
            .bind(lease_millis(lease_ms))
            .bind(self.lease_now(now))
            .bind(state_names(&rules::LEASED))
            .fetch_optional(call.conn()?)
            .await;
        match call.check(row).store_err()? {
            Some(row) => row.into_record(),
            None => Err(refused(call.conn()?, fence.execution_id).await),
        }
    }
}
