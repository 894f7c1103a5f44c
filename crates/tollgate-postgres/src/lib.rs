//! tollgate's stores on Postgres (sqlx): the traits of [`tollgate_store`] with one transaction
//! per operation, fence tokens checked in the `WHERE` clause, row locks taken in one fixed
//! order, and the invariants that matter most (one settlement per execution, an append-only
//! audit log) enforced by the schema itself.
//!
//! # Transactions and locks
//! Every mutating method is one transaction at `READ COMMITTED`. Rows are locked in this order,
//! everywhere, so that concurrent transactions cannot deadlock:
//!
//! 0. in the claim and settlement functions and their batches only, before any row: the
//!    advisory lock of each audit chain group the statement writes to, in ascending order
//!    (spec/performance.md, H-35), so that statements of one group from different instances
//!    run one after the other;
//! 1. the execution row (a fresh insert in `claim`, `SELECT … FOR UPDATE` or a fenced `UPDATE`
//!    elsewhere; result and evidence rows of that execution come with it);
//! 2. the operation root's row, "the root lock" (`SELECT … FOR UPDATE` in `claim`,
//!    `mark_not_dispatched` and `settle` of a call under a root, and in the root operations;
//!    root receipts come with it; `reconcile_roots` skips locked roots instead of waiting);
//! 3. the head of the audit chain the event goes to (`audit_heads`: 64 per scope, chosen by
//!    execution id), which serializes that chain's appends and makes its `seq` gapless;
//! 4. the consumer's session spend row, then its day spend row (upserted and locked in
//!    one statement, so they exist before they are locked). They are the hottest rows (every
//!    call of a consumer takes them), so they come last but for the limit windows: a transaction
//!    holding them has at most its writes (and a limited call's windows) and its commit left;
//! 5. after them, for a call under rate or concurrency limits only, its subjects' limit windows
//!    (`limit_windows`, spec/limits.md), in ascending order of the subjects' stored text: taken by
//!    its claim (`tollgate_limits_admit`) and by its end (`tollgate_limits_end`, in the
//!    transaction of `mark_not_dispatched`, `mark_reconciliation_required` and `settle`).
//!
//! A batch of calls (`batch/`) holds the locks of several calls in one transaction. Decided as a
//! whole (`tollgate_claim_together`, `tollgate_settle_together`), it takes each kind of row for
//! every call before the next kind, in this order, waiting for any lock at most
//! `BATCH_LOCK_TIMEOUT_MS`; past it, the whole is rolled back and the calls go one by one, each
//! in this order, and from the second call on a call that would wait longer is left out. So a
//! batch cannot deadlock.
//!
//! # Modules
//! The claim (`claim/`) and the settlement (`settle/`) each hold the path a call takes, the
//! general transaction (`transaction.rs`), the call of their SQL function and the decoding of its
//! answer (`function.rs`), and the function's source (`claim.sql`, `settle.sql`) side by side.
//! `batch/` sends the calls of either as batches; `journal.rs` holds the fenced transitions
//! between claim and settlement; `seen_keys.rs` the keys seen with a row, which decide the
//! claim's first statement; `configs.rs` the binding configs stored once, which the claim's row
//! names by digest (H-40); `hosts.rs` the hosts of the database URL, the one that accepts
//! writes (followed through a failover) and the settings every connection gets once it opens.
//!
//! # SQL functions and migrations
//! The schema (tables, domains, indexes, grants) is made by the versioned migrations, embedded
//! from the workspace's `migrations/` directory. The SQL functions and composite types are not:
//! each has one live source, a `.sql` file beside the Rust that calls it ([`DEFINITIONS`]: the
//! cap rule in `caps.sql`, the audit log's trigger function in `audit.sql`, the limits in
//! `limits.sql`, then the claim, the settlement and the batches). [`PgStores::migrate`] applies them after the migrations whenever
//! their digest differs from the one the database records (`definitions.rs`). The migrations up
//! to `20261202000000_call_batches.sql` that create functions hold the bodies they applied and
//! stay as they are (sqlx refuses an applied migration whose checksum changed); the sources
//! replace those bodies and are what runs.
//!
//! SQL is fixed text with bound parameters (never formatted values), checked at run time, so
//! building never needs a database.
#![warn(missing_docs)]

mod api_keys;
mod audit;
mod batch;
pub mod check;
mod claim;
mod configs;
mod definitions;
mod error;
mod executions;
pub mod hosts;
mod inbox;
pub mod instances;
mod journal;
mod lane;
mod ledger;
mod limits;
mod locks;
mod results;
mod roots;
mod rows;
mod seen_keys;
mod settle;
mod settlements;
mod shard;
mod spend;
#[cfg(feature = "test-support")]
pub mod test_support;
mod work;

pub use definitions::{Definition, DEFINITIONS};
use error::{db, sqlstate, DbResultExt, UNDEFINED_TABLE};
use lane::{CallConnection, Lane};
pub(crate) use shard::ShardCall;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;
use tollgate_store::rows::AuditChain;
use tollgate_store::{StoreError, StoreResult};

/// The embedded migrations (`migrations/` at the workspace root).
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// Bounds every connection of the pool sets on its session, so that one stalled client cannot
/// stop a scope: a statement, a lock wait or an idle open transaction that runs past its bound is
/// ended by the server, and the store operation fails with [`StoreError::Unavailable`] like any
/// other store failure (nothing of it was committed). `0` leaves a bound off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionTimeouts {
    /// `statement_timeout`: the longest one statement may run.
    pub statement_timeout_ms: u64,
    /// `lock_timeout`: the longest a statement may wait for a row lock (a spend row, an audit
    /// head) held by another transaction.
    pub lock_timeout_ms: u64,
    /// `idle_in_transaction_session_timeout`: the longest a session may sit idle inside an open
    /// transaction before the server ends it and releases its locks.
    pub idle_in_transaction_timeout_ms: u64,
}

impl Default for SessionTimeouts {
    fn default() -> Self {
        Self {
            statement_timeout_ms: STATEMENT_TIMEOUT_MS_DEFAULT,
            lock_timeout_ms: LOCK_TIMEOUT_MS_DEFAULT,
            idle_in_transaction_timeout_ms: IDLE_IN_TRANSACTION_TIMEOUT_MS_DEFAULT,
        }
    }
}

/// A pooled connection idle for at least this long is pinged before it is handed out (one that
/// no longer answers is closed and another one taken); one used more recently is handed out as
/// is. A busy pool then spends no round trip on pings, which the pool's own check before every
/// acquire would (H-23).
pub const PING_AFTER_IDLE_MS: u64 = 1_000;

/// `options` with the liveness check of [`PING_AFTER_IDLE_MS`] instead of a ping before every
/// acquire.
pub(crate) fn ping_when_idle(options: PgPoolOptions) -> PgPoolOptions {
    options
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= std::time::Duration::from_millis(PING_AFTER_IDLE_MS) {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Default `statement_timeout`.
pub const STATEMENT_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default `lock_timeout`.
pub const LOCK_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default `idle_in_transaction_session_timeout`.
pub const IDLE_IN_TRANSACTION_TIMEOUT_MS_DEFAULT: u64 = 60_000;

/// The server's TCP keepalive on every connection of the stores (`tcp_keepalives_idle`, over TCP;
/// a Unix socket ignores it): a connection whose peer is gone without a word (a tollgate host
/// that vanished, a dropped route) is found dead by the server after about
/// `idle + interval × count` seconds of silence (25 s), which ends its backend and releases
/// whatever it held, where the system's default waits two hours. The client side of the same
/// connection has deadlines instead (SC-206): sqlx sets no keepalive on its sockets.
pub const TCP_KEEPALIVES_IDLE_S: u64 = 10;
/// `tcp_keepalives_interval`: seconds between the server's unanswered probes.
pub const TCP_KEEPALIVES_INTERVAL_S: u64 = 5;
/// `tcp_keepalives_count`: unanswered probes before the server drops the connection.
pub const TCP_KEEPALIVES_COUNT: u64 = 3;

/// How far past the server's `statement_timeout` the client gives up a statement: the server
/// ends a statement at its bound, so a statement still unanswered a little later is on a
/// connection that no longer answers.
pub const STATEMENT_DEADLINE_SLACK_MS: u64 = 2_000;

impl SessionTimeouts {
    /// The client-side deadline of a batch statement: the server's `statement_timeout` plus
    /// [`STATEMENT_DEADLINE_SLACK_MS`] (its default when the server's bound is off).
    pub fn statement_deadline(self) -> std::time::Duration {
        let server_ms = match self.statement_timeout_ms {
            0 => STATEMENT_TIMEOUT_MS_DEFAULT,
            ms => ms,
        };
        std::time::Duration::from_millis(server_ms.saturating_add(STATEMENT_DEADLINE_SLACK_MS))
    }

    /// The statement that gives a new connection the bounds and the server's TCP keepalive
    /// ([`TCP_KEEPALIVES_IDLE_S`]), once, right after it opens. It is plain `SET`s in the simple
    /// protocol, so that a pooler in session mode passes them on as they are (pgbouncer refuses
    /// them as the startup parameter `options`).
    fn session_sql(self) -> String {
        format!(
            "SET statement_timeout = {}; SET lock_timeout = {}; \
             SET idle_in_transaction_session_timeout = {}; SET tcp_keepalives_idle = {}; \
             SET tcp_keepalives_interval = {}; SET tcp_keepalives_count = {}",
            self.statement_timeout_ms,
            self.lock_timeout_ms,
            self.idle_in_transaction_timeout_ms,
            TCP_KEEPALIVES_IDLE_S,
            TCP_KEEPALIVES_INTERVAL_S,
            TCP_KEEPALIVES_COUNT
        )
    }

    /// Gives `conn` the session settings of [`SessionTimeouts::session_sql`].
    pub(crate) async fn prepare(self, conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
        let sql = self.session_sql();
        sqlx::Executor::execute(conn, sql.as_str())
            .await
            .map(|_| ())
    }
}

/// All tollgate stores on one Postgres pool. Implements every trait of
/// [`tollgate_store::traits`].
///
/// # Leases and the database's clock
/// Every lease end and every lease comparison (`claim`, `renew_lease`, `take_fence`, `expired`)
/// is computed by the database (`clock_timestamp()` plus the lease), never from a host's `now`:
/// hosts whose clocks disagree cannot make a live lease look expired (spec/journal.md, Fences).
/// The `now` those methods take is kept only for `updated_at` and the audit rows. Test suites
/// that move a manual clock past leases opt into the caller's clock instead
/// (`with_caller_lease_clock`, feature `test-support`).
#[derive(Debug, Clone)]
pub struct PgStores {
    pool: PgPool,
    /// The connections of a call's own single statements, one round trip each where the pool
    /// costs two (H-27), when `max_connections` allows
    /// one; without it they take the pool.
    lane: Option<Arc<Lane>>,
    /// The connection of the lease renewals alone ([`LEASE_CONNECTIONS`]), taken from the
    /// lane's share, so that a pool or a lane saturated by calls cannot starve the heartbeat
    /// and let a live call's lease lapse (SC-205); without it renewals take the pool.
    leases: Option<Arc<Lane>>,
    /// The queues that batch the claims and settlements of calls arriving together into one
    /// statement and one commit (H-32), with
    /// the lane.
    batches: Option<Arc<Batches>>,
    /// The queue that sends the lease renewals waiting at once as one statement (H-36), with
    /// the renewals' own connection.
    renewals: Option<Arc<batch::Batcher<journal::Renewal>>>,
    /// How many renewals went in a statement with others, for tests and the harness.
    renewed_together: Arc<AtomicU64>,
    /// The queue that sends the reads of calls' views by key waiting at once as one statement
    /// (H-37), with the lane.
    reads: Option<Arc<batch::Batcher<executions::ViewRead>>>,
    /// How many reads of a view went in a statement with others, for tests and the harness.
    views_read_together: Arc<AtomicU64>,
    /// The keys these stores have seen with a row: they decide which statement a claim sends
    /// first.
    seen_keys: Arc<seen_keys::SeenKeys>,
    /// How many claims read their key before claiming it, for tests and the harness.
    reads_first: Arc<AtomicU64>,
    /// The binding configs these stores have stored (H-40).
    stored_configs: Arc<configs::StoredConfigs>,
    /// The JSON texts and digests of the configs claims named last (H-40).
    config_texts: Arc<configs::ConfigTexts>,
    /// Whether leases follow the caller's `now` (tests only) instead of the database's clock.
    caller_lease_clock: bool,
    /// The client-side deadline of one batch statement ([`SessionTimeouts::statement_deadline`]).
    statement_deadline: std::time::Duration,
    /// Every claim and settlement by the general transaction (tests only).
    #[cfg(feature = "test-support")]
    general_only: bool,
}

/// A transaction on a connection of `pool`, its `BEGIN` sent by a task of its own.
///
/// sqlx counts a transaction only once `BEGIN`'s answer is in: a caller dropped while `BEGIN` is
/// in flight (a deadline, a client that left) would hand the connection back to the pool inside
/// a transaction the server has open and sqlx does not know of, and the next single statements
/// on it would run inside that transaction, never committed. The task finishes the `BEGIN`; a
/// transaction its caller no longer awaits is then dropped, and rolled back, as any other.
pub(crate) async fn begin(
    pool: &PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let pool = pool.clone();
    tokio::spawn(async move { pool.begin().await })
        .await
        .map_err(|_| StoreError::Unavailable("database transaction lost".into()))?
        .store_err()
}

/// The batch queues of a lane (H-32), in [`BATCH_SHARDS`] shards of the consumers (H-34): one
/// queue a shard, of its claims and settlements together, whose runner sends what it holds as one
/// statement (H-43), so one statement of the shard is in flight and its claims and settlements
/// never hold locks the other waits for. A consumer's executions append to one audit chain of one
/// group (H-33) and a group is in one shard, so the statements of two shards never take one
/// chain's head or one consumer's spend rows.
#[derive(Debug)]
pub(crate) struct Batches {
    shards: Vec<Arc<batch::Batcher<ShardCall>>>,
}

/// Connections a lane gives to the lease renewals alone (SC-205): one statement each, a few per
/// second per process even with a thousand calls in flight, so one is enough.
pub(crate) const LEASE_CONNECTIONS: u32 = 1;

/// The shards of a lane's batches (H-34), at most one per lane connection: few, so that each
/// shard's batches are large, and more than one, so that a second statement is in flight while
/// the first one's commit is flushed (the runs are in docs/performance-log.md).
pub(crate) const BATCH_SHARDS: usize = 2;

impl Batches {
    /// The queues of a lane of `connections` connections, each statement given up after
    /// `deadline`.
    fn new(connections: u32, deadline: std::time::Duration) -> Self {
        let shards = usize::try_from(connections)
            .unwrap_or(1)
            .clamp(1, BATCH_SHARDS);
        Self {
            shards: (0..shards)
                .map(|_| {
                    batch::Batcher::of_kinds(
                        &Arc::new(Semaphore::new(1)),
                        deadline,
                        Some(ShardCall::kind),
                    )
                })
                .collect(),
        }
    }

    /// Queues like `self`'s (as many shards, the same deadline) whose statements go through
    /// the fault matrix's `hook`.
    #[cfg(feature = "test-support")]
    fn hooked(
        &self,
        deadline: std::time::Duration,
        hook: &Arc<batch::faults::BatchFaults>,
    ) -> Self {
        Self {
            shards: (0..self.shards.len())
                .map(|_| {
                    batch::Batcher::hooked(
                        &Arc::new(Semaphore::new(1)),
                        deadline,
                        Some(ShardCall::kind),
                        ShardCall::point,
                        hook,
                    )
                })
                .collect(),
        }
    }

    /// The shard of `consumer` in `scope`: the one its audit chain group (H-33) is in, so that
    /// batches of different shards never append to one chain.
    fn shard_index(&self, scope: &str, consumer: &str) -> usize {
        usize::from(AuditChain::group_of(scope, consumer)) % self.shards.len().max(1)
    }

    /// The queue of `consumer`'s shard.
    pub(crate) fn shard(&self, scope: &str, consumer: &str) -> &Arc<batch::Batcher<ShardCall>> {
        &self.shards[self.shard_index(scope, consumer)]
    }
}

impl PgStores {
    /// Connects a pool of at most `max_connections` to `url` (one connection is opened now, so
    /// a wrong URL or an unreachable server fails here).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database cannot be reached; the message never holds
    /// the URL.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_with(url, max_connections, SessionTimeouts::default()).await
    }

    /// Like [`PgStores::connect`], with the session bounds `timeouts` on every connection.
    ///
    /// `url` may name several hosts (`postgres://user@db-1,db-2/tollgate`): the stores connect
    /// to the first that accepts writes and follow a promoted standby ([`hosts`]). Either way
    /// two open connections must not share one server session (a pooler per transaction), or
    /// the connect fails naming the setting to change.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the URL is not valid, the database cannot be reached,
    /// no host accepts writes or the connections are pooled per transaction; the message never
    /// holds the URL.
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        timeouts: SessionTimeouts,
    ) -> Result<Self, StoreError> {
        let target = Arc::new(hosts::Target::new(url, timeouts)?);
        let mut first = target.find_writable().await?;
        let shared = hosts::refuse_shared_sessions(&mut first, &target).await;
        hosts::close_quickly(first).await;
        shared?;
        let (pool_connections, lane_connections) = lane::split(max_connections);
        let pool = ping_when_idle(PgPoolOptions::new())
            .max_connections(pool_connections)
            .after_connect(move |conn, _| Box::pin(timeouts.prepare(conn)))
            .connect_with(target.options())
            .await
            .store_err()?;
        target.watch(pool.clone());
        let stores = Self {
            statement_deadline: timeouts.statement_deadline(),
            ..Self::new(pool)
        };
        Ok(stores.with_lane(target, lane_connections))
    }

    /// Stores over an existing pool; every statement takes it (no lane, so no batches either).
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            lane: None,
            leases: None,
            batches: None,
            renewals: None,
            renewed_together: Arc::new(AtomicU64::new(0)),
            reads: None,
            views_read_together: Arc::new(AtomicU64::new(0)),
            seen_keys: Arc::new(seen_keys::SeenKeys::new(
                seen_keys::SEEN_KEYS_PER_GENERATION,
            )),
            reads_first: Arc::new(AtomicU64::new(0)),
            stored_configs: Arc::new(configs::StoredConfigs::default()),
            config_texts: Arc::new(configs::ConfigTexts::default()),
            caller_lease_clock: false,
            statement_deadline: SessionTimeouts::default().statement_deadline(),
            #[cfg(feature = "test-support")]
            general_only: false,
        }
    }

    /// How many lease renewals went in one statement with others (H-36).
    pub fn renewed_together(&self) -> u64 {
        self.renewed_together.load(Ordering::Relaxed)
    }

    /// How many reads of a call's view by key went in one statement with others (H-37).
    pub fn views_read_together(&self) -> u64 {
        self.views_read_together.load(Ordering::Relaxed)
    }

    /// How many claims read their key before claiming it: claims of keys these stores have seen
    /// with a row (H-30). A claim of any other key outside a root is the claim function
    /// first.
    pub fn claims_read_first(&self) -> u64 {
        self.reads_first.load(Ordering::Relaxed)
    }

    /// These stores with a lane of `connections` connections to `target`'s host for a call's
    /// own single statements; none with zero. Its connections wait for a free one as long
    /// as the pool's acquire does.
    ///
    /// A lane of two connections or more gives [`LEASE_CONNECTIONS`] of them to the lease
    /// renewals alone.
    pub(crate) fn with_lane(self, target: Arc<hosts::Target>, connections: u32) -> Self {
        let acquire_timeout = self.pool.options().get_acquire_timeout();
        let (calls, leases) = if connections > LEASE_CONNECTIONS {
            (connections - LEASE_CONNECTIONS, LEASE_CONNECTIONS)
        } else {
            (connections, 0)
        };
        let lane = (calls > 0).then(|| Arc::new(Lane::new(target.clone(), calls, acquire_timeout)));
        let leases = (leases > 0).then(|| Arc::new(Lane::new(target, leases, acquire_timeout)));
        let batches = lane
            .as_ref()
            .map(|_| Arc::new(Batches::new(calls, self.statement_deadline)));
        // One renewal statement in flight; the renewals that arrive meanwhile go together.
        let renewals = leases.as_ref().map(|_| {
            batch::Batcher::with_most_calls(
                &Arc::new(Semaphore::new(1)),
                self.statement_deadline,
                journal::RENEWALS_PER_STATEMENT_MAX,
            )
        });
        // One read statement in flight; the reads that arrive meanwhile go together.
        let reads = lane
            .as_ref()
            .map(|_| batch::Batcher::new(&Arc::new(Semaphore::new(1)), self.statement_deadline));
        Self {
            lane,
            leases,
            batches,
            renewals,
            reads,
            ..self
        }
    }

    /// A connection for a lease renewal: the renewals' own, else the pool's.
    ///
    /// When the renewals' own connection is busy with another renewal, the pool's is taken,
    /// so that many calls' renewals due at once do not queue behind one connection.
    pub(crate) async fn lease_connection(&self) -> Result<CallConnection, StoreError> {
        if let Some(leases) = &self.leases {
            if let Some(conn) = leases.try_acquire().await? {
                return Ok(CallConnection::Lane(conn));
            }
        }
        CallConnection::acquire(None, &self.pool).await
    }

    /// A connection for one of a call's own single statements (the lane's, else the pool's).
    pub(crate) async fn call_connection(&self) -> Result<CallConnection, StoreError> {
        CallConnection::acquire(self.lane.as_ref(), &self.pool).await
    }

    /// The batch queue that the claims and settlements of `consumer` in `scope` take, or
    /// `None` for stores without batches (no lane). For tests that need two consumers in one
    /// queue.
    #[cfg(feature = "test-support")]
    pub fn batch_shard(&self, scope: &str, consumer: &str) -> Option<usize> {
        self.batches
            .as_ref()
            .map(|b| b.shard_index(scope, consumer))
    }

    /// These stores with batch queues of their own whose statements go through `hook` (the
    /// fault matrix's batch points: gathered batches, planned faults). Stores without batches
    /// stay without.
    #[cfg(feature = "test-support")]
    pub fn with_batch_faults(self, hook: &Arc<batch::faults::BatchFaults>) -> Self {
        let batches = self
            .batches
            .as_ref()
            .map(|b| Arc::new(b.hooked(self.statement_deadline, hook)));
        Self { batches, ..self }
    }

    /// These stores claiming and settling every call by the general transaction (no claim or
    /// settlement function, no batches), for the test that compares the paths' rows.
    #[cfg(feature = "test-support")]
    pub fn with_general_transactions(self) -> Self {
        Self {
            general_only: true,
            ..self
        }
    }

    /// Closes the pool and the lanes' idle connections (a test's stores, once it is done with
    /// them).
    #[cfg(feature = "test-support")]
    pub async fn close(&self) {
        for lane in [&self.lane, &self.leases].into_iter().flatten() {
            lane.close();
        }
        self.pool.close().await;
    }

    /// Whether every claim and settlement takes the general transaction (tests only).
    pub(crate) fn general_only(&self) -> bool {
        #[cfg(feature = "test-support")]
        return self.general_only;
        #[cfg(not(feature = "test-support"))]
        false
    }

    /// These stores with leases computed from the caller's `now` instead of the database's
    /// clock, for test suites that move a manual clock past leases. Never in production.
    #[cfg(feature = "test-support")]
    pub fn with_caller_lease_clock(self) -> Self {
        Self {
            caller_lease_clock: true,
            ..self
        }
    }

    /// The time lease SQL binds as its "now": `None` — the database's `clock_timestamp()` —
    /// unless the stores were built for tests with the caller's clock.
    fn lease_now(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        self.caller_lease_clock.then_some(now)
    }

    /// `work`, one store operation, given up when it has not answered within the client-side
    /// deadline of a statement (the server's `statement_timeout` plus
    /// [`STATEMENT_DEADLINE_SLACK_MS`]): the server ends any statement at its bound, so an
    /// operation still unanswered past it is on a connection that stopped answering (a
    /// half-open route, a stopped server). It fails with `Unavailable`, whose commit is as
    /// unknown as any lost answer's (SC-206). The ledger audit is not bounded so: it reads a
    /// scope in many statements.
    ///
    /// `work` is boxed here, once: the future this returns holds a pointer to it, so the store
    /// method's own (boxed) future and the deadline's wrapper are a few words each instead of
    /// copies of the whole operation's state.
    pub(crate) fn bounded<'a, T: 'a>(
        &self,
        work: impl std::future::Future<Output = StoreResult<T>> + Send + 'a,
    ) -> impl std::future::Future<Output = StoreResult<T>> + Send + 'a {
        let deadline = self.statement_deadline;
        let work = Box::pin(work);
        async move {
            match tokio::time::timeout(deadline, work).await {
                Ok(answered) => answered,
                Err(_) => {
                    tracing::warn!(
                        deadline_ms = deadline.as_millis(),
                        "a store operation was given up at its deadline"
                    );
                    Err(StoreError::Unavailable(
                        "the database did not answer in time".into(),
                    ))
                }
            }
        }
    }

    /// A transaction on a connection of the pool ([`begin`]).
    pub(crate) async fn begin(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        begin(&self.pool).await
    }

    /// The connection pool every store transaction begins on; the server's key store shares it.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies the pending versioned migrations, then the definitions step: the SQL functions and
    /// composite types from their `.sql` sources when the digest recorded in the database differs
    /// from theirs ([`DEFINITIONS`]). Idempotent; concurrent callers serialize on advisory locks
    /// (sqlx's for the migrations, the step's own for the definitions).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when a migration or a definition fails (e.g. the role may not
    /// create functions, SQLSTATE 42501) or an applied migration was modified.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(migrate_error)?;
        definitions::apply(&self.pool).await
    }

    /// Applies the migrations and the definitions only when some are pending, each part only
    /// when it is. With nothing pending it changes nothing and needs no schema rights, so the
    /// server may run as a member of `tollgate_app` (spec/storage.md, Database roles) against a
    /// database the owner role migrated.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database cannot be read, or a pending migration or
    /// definition fails (e.g. the role may not change the schema, SQLSTATE 42501: run
    /// `tollgate migrate` as the owner).
    pub async fn migrate_if_pending(&self) -> Result<(), StoreError> {
        let pending = self.pending().await?;
        if pending.migrations {
            MIGRATOR.run(&self.pool).await.map_err(migrate_error)?;
        }
        if pending.migrations || pending.definitions {
            definitions::apply(&self.pool).await?;
        }
        Ok(())
    }

    /// What is pending: an embedded migration that is not applied (no migrations table: all of
    /// them), and whether the definitions' recorded digest differs from the embedded sources' (no
    /// table or no row: it does). One statement.
    async fn pending(&self) -> Result<Pending, StoreError> {
        let (applied, recorded): (Vec<i64>, Option<String>) = match sqlx::query_as(
            "SELECT ARRAY(SELECT version FROM _sqlx_migrations WHERE success), \
             (SELECT digest FROM tollgate_definitions WHERE singleton)",
        )
        .fetch_one(&self.pool)
        .await
        {
            Ok(state) => state,
            Err(e) if sqlstate(&e).as_deref() == Some(UNDEFINED_TABLE) => {
                return Ok(Pending {
                    migrations: true,
                    definitions: true,
                })
            }
            Err(e) => return Err(db(e)),
        };
        let migrations = MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .any(|m| !applied.contains(&m.version));
        Ok(Pending {
            migrations,
            definitions: definitions::is_pending(recorded.as_deref()),
        })
    }

    /// Readiness: the database answers, every embedded migration is applied and the definitions
    /// are the embedded sources'.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when unreachable or when migrations or definitions are
    /// pending.
    pub async fn ready(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .store_err()?;
        let pending = self.pending().await?;
        if pending.migrations {
            return Err(StoreError::Unavailable("migrations pending".into()));
        }
        if pending.definitions {
            return Err(StoreError::Unavailable("definitions pending".into()));
        }
        Ok(())
    }
}

/// What [`PgStores::migrate`] would apply.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Some embedded migration is not applied.
    migrations: bool,
    /// The recorded digest of the definitions is not the embedded sources'.
    definitions: bool,
}

fn migrate_error(error: MigrateError) -> StoreError {
    match error {
        MigrateError::Execute(e) => db(e),
        MigrateError::ExecuteMigration(e, version) => {
            let StoreError::Unavailable(reason) = db(e) else {
                return StoreError::Unavailable(format!("migration {version} failed"));
            };
            StoreError::Unavailable(format!("migration {version} failed: {reason}"))
        }
        other => StoreError::Unavailable(format!("migrations: {other}")),
    }
}
