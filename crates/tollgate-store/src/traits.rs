//! The store capabilities.
//!
//! Every mutating method is one atomic unit and writes its own audit row in the same unit, so an
//! audit write is awaited with the state change it describes (SC-50). Every write after a claim
//! carries a [`Fence`]; a stale fence changes nothing and returns [`StoreError::StaleFence`],
//! so an executor whose lease was taken over cannot write over its successor (H-3).
//!
//! [`StoreError::StaleFence`]: crate::StoreError::StaleFence

use crate::error::StoreResult;
use crate::rows::*;
use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::{
    ConsumerId, EvidenceId, ExecutionId, OperationKey, RootKey, Scope, SessionId, SettlementId,
};
use tollgate_core::limits::{LimitSubject, LimitWindow};
use tollgate_core::money::Currency;
use tollgate_core::state::{ExecutionState, NotDispatchedCause, ReconciliationReason};

/// The journal.
#[async_trait]
pub trait ExecutionStore: Send + Sync {
    /// Claims `(scope, operation_key)`: if a row exists, returns it untouched (replay or conflict
    /// is the caller's decision); otherwise, in one unit, checks every block cap of the binding's
    /// caps against the consumer's session and daily spend (`settled + held + hold`), and either
    /// refuses with nothing written, or inserts the `prepared` row with a new fence, adds `hold`
    /// to both spend rows' held totals, and audits `claimed`. A claim under a root takes the root
    /// lock in the same unit and is refused (`RootRefused`, nothing written) when the root is
    /// `reconciled` or past its deadline (ST-36); a missing root is `NotFound`. Caps and spend
    /// rows are in the snapshot's currency (SC-105); a root keeping its totals in another
    /// currency is `CurrencyMismatch` (SC-106).
    ///
    /// # Errors
    /// Store failure; `CurrencyMismatch` (nothing written).
    async fn claim(&self, request: ClaimRequest) -> StoreResult<ClaimOutcome>;

    /// `prepared → dispatched`, durable before the first byte is sent. Audits `dispatched`.
    ///
    /// # Errors
    /// `StaleFence` when the fence is not current or the row is not `prepared`.
    async fn mark_dispatched(
        &self,
        fence: Fence,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord>;

    /// `prepared → dispatched` with the hold shrunk to `hold`, the loaded request's own worst
    /// case, in the same unit (SC-122): the difference leaves the held totals of both spend rows
    /// and of the root. Audits `dispatched` (with the new hold).
    ///
    /// # Errors
    /// `StaleFence` when the fence is not current or the row is not `prepared`; `HoldGrows`
    /// when `hold` is above the current hold. Nothing is written on error.
    async fn mark_dispatched_with_hold(
        &self,
        fence: Fence,
        hold: tollgate_core::money::Money,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord>;

    /// `prepared → not_dispatched(cause)`, releasing the hold. Audits `not_dispatched`.
    ///
    /// # Errors
    /// `StaleFence` when the fence is not current or the row is not `prepared`;
    /// `HoldUnderflow` when a spend row or the root holds less than the hold (nothing written,
    /// SC-107).
    async fn mark_not_dispatched(
        &self,
        fence: Fence,
        cause: NotDispatchedCause,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord>;

    /// `dispatched → reconciliation_required`; the hold stays until an operator settles.
    /// Audits `reconciliation_required`.
    ///
    /// # Errors
    /// `StaleFence` when the fence is not current or the row is not `dispatched`.
    async fn mark_reconciliation_required(
        &self,
        fence: Fence,
        reason: ReconciliationReason,
        provider_ref: Option<String>,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord>;

    /// Settles a `dispatched` (or, for operators, `reconciliation_required`) execution in one
    /// unit: inserts the governed charge (at most one per execution, enforced by the store),
    /// releases the hold and adds the amount to both spend rows, applies the post-call block
    /// check of the binding's caps on the settled totals (outcome `blocked`, output and step
    /// dropped, SC-16), stores the result, completes the journal and audits `settled`. The call's
    /// own evidence (`request.evidence`) goes into the inbox in the same unit, acknowledged when
    /// [`crate::rules::own_evidence_acknowledged_at`] says so, so no later pass has to (H-28);
    /// other evidence is left to
    /// `reconcile_usage`, which compares it with the durable settlement.
    ///
    /// # Errors
    /// `StaleFence`; `Duplicate` if a settlement exists; `HoldUnderflow` when a spend row or the
    /// root holds less than the hold (nothing written, SC-107).
    async fn settle(&self, request: SettleRequest) -> StoreResult<SettleOutcome>;

    /// Takes a new fence on `(scope, key)` when its state is one of `states` and either its lease
    /// has expired or `require_expired` is false. Returns `None` when not eligible. Audits
    /// `fence_taken`. The in-memory stores compare and set the lease with `now`; Postgres
    /// ignores `now` for the lease (it uses the database's clock) and keeps it as `updated_at`.
    ///
    /// # Errors
    /// Store failure.
    async fn take_fence(
        &self,
        scope: &Scope,
        key: &OperationKey,
        states: &[ExecutionState],
        require_expired: bool,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<ExecutionRecord>>;

    /// The heartbeat of a live call: extends the lease of a `prepared` or `dispatched`
    /// execution to `lease_ms` from now, fenced like every write after the claim. The runner
    /// renews while a call is in flight, so a recoverer can take over only once its process has
    /// stopped renewing (spec/journal.md, Fences). Changes nothing else and writes no audit row
    /// (a renewal is no transition). "Now" is the store's clock: the in-memory stores take
    /// `now`; Postgres ignores it and uses the database's clock, like every lease comparison.
    ///
    /// # Errors
    /// `StaleFence` when the fence is not current or the execution is finished (nothing
    /// changes); `NotFound` when there is no such execution.
    async fn renew_lease(
        &self,
        fence: Fence,
        lease_ms: u64,
        now: DateTime<Utc>,
    ) -> StoreResult<ExecutionRecord>;

    /// Reads one execution.
    ///
    /// # Errors
    /// Store failure.
    async fn execution(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionRecord>>;

    /// Reads one execution with its result, settlement and root receipt in one read: what a
    /// replay's or a read-back's view needs, in one round trip (H-10).
    ///
    /// # Errors
    /// Store failure.
    async fn execution_view(
        &self,
        scope: &Scope,
        key: &OperationKey,
    ) -> StoreResult<Option<ExecutionView>>;

    /// Reads one execution by id, within `scope`.
    ///
    /// # Errors
    /// Store failure.
    async fn execution_by_id(
        &self,
        scope: &Scope,
        id: ExecutionId,
    ) -> StoreResult<Option<ExecutionRecord>>;

    /// Up to `limit` `prepared`/`dispatched` executions of `scope` whose lease ended before
    /// `now`, oldest lease first. Postgres ignores `now` and compares with the database's
    /// clock.
    ///
    /// # Errors
    /// Store failure.
    async fn expired(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>>;

    /// Up to `limit` executions of `scope` in `state`, oldest first.
    ///
    /// # Errors
    /// Store failure.
    async fn by_state(
        &self,
        scope: &Scope,
        state: ExecutionState,
        limit: u32,
    ) -> StoreResult<Vec<ExecutionRecord>>;
}

/// Results under retention.
#[async_trait]
pub trait ResultStore: Send + Sync {
    /// The result of an execution.
    ///
    /// # Errors
    /// Store failure.
    async fn result(&self, execution_id: ExecutionId) -> StoreResult<Option<ResultRecord>>;

    /// Erases one result's content (output and step); erased content is never resurrected
    /// (SC-73). Idempotent. Audits `erased` once.
    ///
    /// # Errors
    /// `NotFound` when there is no result.
    async fn erase(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<()>;

    /// Erases up to `limit` results whose retention ended before `now`; returns how many.
    ///
    /// # Errors
    /// Store failure.
    async fn erase_expired(&self, now: DateTime<Utc>, limit: u32) -> StoreResult<u64>;
}

/// Append-only usage evidence of sent calls: recovery settles from it, `reconcile_usage`
/// acknowledges it.
#[async_trait]
pub trait UsageInbox: Send + Sync {
    /// Appends evidence.
    ///
    /// # Errors
    /// Store failure.
    async fn record_evidence(&self, evidence: NewEvidence) -> StoreResult<Evidence>;

    /// Evidence of one execution, in insertion order.
    ///
    /// # Errors
    /// Store failure.
    async fn evidence_for(&self, execution_id: ExecutionId) -> StoreResult<Vec<Evidence>>;

    /// Up to `limit` unacknowledged evidence rows of `scope` with `seq > after`, in seq order.
    ///
    /// # Errors
    /// Store failure.
    async fn unacknowledged(
        &self,
        scope: &Scope,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<Evidence>>;

    /// Marks evidence acknowledged (idempotent). Audits `evidence_acknowledged` once. Whether this
    /// call acknowledged it: `false` when it already was (another reconciler came first).
    ///
    /// # Errors
    /// `NotFound`.
    async fn acknowledge(
        &self,
        scope: &Scope,
        id: EvidenceId,
        now: DateTime<Utc>,
    ) -> StoreResult<bool>;
}

/// Governed settlements (read side; the write is [`ExecutionStore::settle`]).
#[async_trait]
pub trait SettlementStore: Send + Sync {
    /// The settlement of an execution.
    ///
    /// # Errors
    /// Store failure.
    async fn settlement(&self, execution_id: ExecutionId) -> StoreResult<Option<SettlementRecord>>;

    /// Settlements with `from ≤ accounting_day ≤ to`, across scopes, in settlement order.
    ///
    /// # Errors
    /// Store failure.
    async fn settlements(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>>;

    /// Settlements of `scope` with `from ≤ accounting_day ≤ to`, by accounting day and then
    /// settlement order, at most `limit`. Another scope's settlements are neither listed nor
    /// read, so how many there are changes nothing of the answer or its cost (SC-192); on
    /// Postgres the index `(scope, accounting_day, seq)` yields the scope's rows of the range in
    /// this order, so a scan in it ends at the limit.
    ///
    /// # Errors
    /// Store failure.
    async fn scope_settlements(
        &self,
        scope: &Scope,
        from: NaiveDate,
        to: NaiveDate,
        limit: u32,
    ) -> StoreResult<Vec<SettlementRecord>>;

    /// The feed position of settlement `id` when it is `scope`'s and the scope's feed
    /// ([`SettlementStore::settlements_after`]) lists it; `None` for another scope's settlement,
    /// one the feed does not list yet, or an unknown id. The HTTP feed's cursor is a
    /// settlement's id, resolved to its position here, so no cursor shows a position (SC-193).
    ///
    /// # Errors
    /// Store failure.
    async fn feed_position(
        &self,
        scope: &Scope,
        id: SettlementId,
    ) -> StoreResult<Option<FeedPosition>>;

    /// The finance feed: up to `limit` settlements of `scope` (all scopes when `None`) after
    /// `after`, in feed order ([`FeedPosition`]). For a scope, only settlements that no running
    /// transaction can still precede are listed, so a reader resuming after the last position it
    /// got never misses one that commits later (SC-141). Across scopes (`None`, the operator's
    /// export) every committed settlement is listed: a listing of what has committed, without
    /// that guarantee for rows committing while it pages.
    ///
    /// # Errors
    /// Store failure.
    async fn settlements_after(
        &self,
        scope: Option<&Scope>,
        after: FeedPosition,
        limit: u32,
    ) -> StoreResult<Vec<FeedEntry>>;
}

/// Spend totals, kept per currency (SC-105): a consumer charged in two currencies has one
/// session row and one day row in each, and a cap counts only the rows in its own currency.
#[async_trait]
pub trait SpendStore: Send + Sync {
    /// The consumer's totals in a session, in `currency` (zero when there is no such row).
    ///
    /// # Errors
    /// Store failure.
    async fn session_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        session: &SessionId,
        currency: &Currency,
    ) -> StoreResult<SpendTotals>;

    /// The consumer's totals on a day, in `currency` (zero when there is no such row).
    ///
    /// # Errors
    /// Store failure.
    async fn daily_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        day: NaiveDate,
        currency: &Currency,
    ) -> StoreResult<SpendTotals>;

    /// Every limited subject's window in `scope` as stored (a window that has closed still reads
    /// as it was; [`LimitWindow::open_at`] tells), by subject (SC-220).
    ///
    /// # Errors
    /// Store failure.
    async fn limit_windows(&self, scope: &Scope) -> StoreResult<Vec<(LimitSubject, LimitWindow)>>;
}

/// The append-only audit log.
#[async_trait]
pub trait AuditLog: Send + Sync {
    /// Appends an event outside a state change (replay, conflict, preflight block, ...).
    ///
    /// # Errors
    /// Store failure.
    async fn append_audit(&self, event: AuditEvent) -> StoreResult<AuditRow>;

    /// A scope's rows by chain, then seq within the chain, after `after` (exclusive), at most
    /// `limit`. The next page starts after the last row's [`AuditRow::position`].
    ///
    /// # Errors
    /// Store failure.
    async fn audit_rows(
        &self,
        scope: &Scope,
        after: AuditPosition,
        limit: u32,
    ) -> StoreResult<Vec<AuditRow>>;

    /// The heads of a scope's chains, kept apart from the rows, by chain: empty before the
    /// scope's first append, then one per chain (all created with the first append).
    ///
    /// # Errors
    /// Store failure.
    async fn audit_heads(&self, scope: &Scope) -> StoreResult<Vec<AuditHead>>;
}

/// Everything a runner needs.
pub trait Stores:
    ExecutionStore + ResultStore + UsageInbox + SettlementStore + SpendStore + AuditLog + Send + Sync
{
}

impl<T> Stores for T where
    T: ExecutionStore
        + ResultStore
        + UsageInbox
        + SettlementStore
        + SpendStore
        + AuditLog
        + Send
        + Sync
{
}

/// Operation roots (the RootStore). A call under a root is claimed with `ClaimRequest::root_key`
/// set: the claim then also holds its worst case against the root (root block cap on the
/// inclusive cost, ST-7), and its settlement writes the root receipt in the same unit (ST-6).
#[async_trait]
pub trait RootStore: Send + Sync {
    /// Opens a root, or returns the existing one untouched (the caller compares bindings).
    /// Audits `root_opened`.
    ///
    /// # Errors
    /// Store failure.
    async fn open_root(&self, request: OpenRootRequest) -> StoreResult<RootOpen>;

    /// Under the root lock: reserves one call slot if the root is active and `now` is before its
    /// deadline; an active root past its deadline becomes `expired` and refuses.
    ///
    /// # Errors
    /// Store failure.
    async fn reserve_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Reservation>;

    /// Gives back a slot whose claim provably wrote nothing (blocked, or lost a race to an
    /// existing key). Never below zero.
    ///
    /// # Errors
    /// Store failure.
    async fn release_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<()>;

    /// Closes an active root (no new admissions; reserved calls go on, ST-33). Idempotent;
    /// returns the root, or `None` when there is none. Audits `root_closed` once.
    ///
    /// # Errors
    /// Store failure.
    async fn close_root(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootRecord>>;

    /// Reads a root under its lock (a consistent view of state and reserved calls, SR-9).
    ///
    /// # Errors
    /// Store failure.
    async fn root(&self, scope: &Scope, root_key: &RootKey) -> StoreResult<Option<RootRecord>>;

    /// The root receipt of an execution.
    ///
    /// # Errors
    /// Store failure.
    async fn root_receipt(&self, execution_id: ExecutionId) -> StoreResult<Option<RootReceipt>>;

    /// The root receipts of a root, oldest first, at most `limit`.
    ///
    /// # Errors
    /// Store failure.
    async fn root_receipts(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        limit: u32,
    ) -> StoreResult<Vec<RootReceipt>>;

    /// Repairs a completed call under a root whose root receipt is missing (ST-31): in one unit,
    /// writes the receipt from the call's governed charge, sets the root's charged total to the
    /// sum of its receipts (so a charge the root already counted is never added again, SC-108),
    /// and audits `root_receipt_repaired`. Idempotent: an existing receipt is returned
    /// untouched. A charge in another currency than the root's is `CurrencyMismatch`. `None` when the execution is not a completed, settled call under a root in
    /// `scope`.
    ///
    /// # Errors
    /// Store failure.
    async fn repair_root_receipt(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootReceipt>>;

    /// Up to `limit` roots of `scope` that are active past their deadline (→ `expired`), or
    /// closed/expired with every call finished and at least `reserved_calls` calls — or, once the
    /// deadline has passed, whatever calls exist, since no claim lands after it (→ `reconciled`,
    /// ST-36). Returns the changed
    /// roots. Audits each change.
    ///
    /// # Errors
    /// Store failure.
    async fn reconcile_roots(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<RootRecord>>;
}

/// The ledger audit (spec/storage.md — Ledger audit): from the stored rows alone, checks that
/// spend totals, holds, settlements, acknowledged evidence and root totals agree. Read-only.
#[async_trait]
pub trait LedgerAudit: Send + Sync {
    /// Audits `scope`, or every scope when `None`, each scope from one consistent read of its
    /// rows, and lists at most `limit` violations (clamped to
    /// 1..=[`LEDGER_LIMIT_MAX`](crate::ledger::LEDGER_LIMIT_MAX); more are counted). Its work
    /// grows with the audited scope's rows; it writes nothing.
    ///
    /// # Errors
    /// Store failure; a stored row that cannot be read.
    async fn audit_ledger(
        &self,
        scope: Option<&Scope>,
        limit: u32,
    ) -> StoreResult<crate::ledger::LedgerReport>;
}

/// API keys of the HTTP service, by the SHA-256 of the key: the key itself is never stored, so
/// it cannot be read back. Keys belong to no execution and write no audit row.
#[async_trait]
pub trait ApiKeyStore: Send + Sync {
    /// Stores a key: its digest, scope, role and creation time. An existing key is never
    /// overwritten.
    ///
    /// # Errors
    /// `Duplicate` when a key with this digest is stored already (nothing changes); store
    /// failure.
    async fn insert_key(&self, key: ApiKeyRecord) -> StoreResult<()>;

    /// The key whose SHA-256 is `digest`; `None` when there is none.
    ///
    /// # Errors
    /// Store failure.
    async fn key_by_digest(&self, digest: &KeyDigest) -> StoreResult<Option<ApiKeyRecord>>;

    /// Every stored key of `scope` (all scopes when `None`), oldest first (then by digest).
    ///
    /// # Errors
    /// Store failure.
    async fn list_keys(&self, scope: Option<&Scope>) -> StoreResult<Vec<ApiKeyRecord>>;

    /// Revokes the key `digest` at `at` (of `scope` only, when given). Idempotent: a revoked key
    /// keeps its first revocation time. `None` when there is no such key (in that scope).
    ///
    /// # Errors
    /// Store failure.
    async fn revoke_key(
        &self,
        scope: Option<&Scope>,
        digest: &KeyDigest,
        at: DateTime<Utc>,
    ) -> StoreResult<Option<ApiKeyRecord>>;

    /// Records a use of the key `digest` at `at` (never moves `last_used_at` back). No key: no
    /// change.
    ///
    /// # Errors
    /// Store failure.
    async fn touch_key(&self, digest: &KeyDigest, at: DateTime<Utc>) -> StoreResult<()>;
}

/// Where the scheduler finds work.
#[async_trait]
pub trait WorkScan: Send + Sync {
    /// Up to `limit` scopes with open work, each once, in ascending order of name and strictly
    /// after `after` (`None`: from the first) — a rotating cursor, so that every scope gets its
    /// turn. A scope has open work when it has at least one of:
    ///
    /// - an execution in `prepared`, `dispatched` or `reconciliation_required`, whatever its
    ///   lease (an execution whose lease is still live counts);
    /// - usage evidence not yet acknowledged;
    /// - a root that is not `reconciled` (`active`, `closed` or `expired`), whatever its
    ///   deadline.
    ///
    /// Nothing else is work: completed and not-dispatched executions, acknowledged evidence,
    /// reconciled roots, results awaiting erasure (erasure is not per scope) and API keys. The
    /// list is a superset of what a scheduler pass will change; the per-scope tasks decide what
    /// is due. Names are compared as the store compares text: byte order in memory, the
    /// database's collation on Postgres (byte order under `C`).
    ///
    /// # Errors
    /// Store failure.
    async fn scopes_with_work(&self, after: Option<&Scope>, limit: u32) -> StoreResult<Vec<Scope>>;
}

/// Everything the HTTP service needs: the runners' stores, API keys and the work scan.
pub trait ServiceStores: AllStores + ApiKeyStore + WorkScan {}

impl<T> ServiceStores for T where T: AllStores + ApiKeyStore + WorkScan {}

/// Everything the root-fenced runners, the service and the operator commands need.
pub trait AllStores: Stores + RootStore + LedgerAudit {}

impl<T> AllStores for T where T: Stores + RootStore + LedgerAudit {}
