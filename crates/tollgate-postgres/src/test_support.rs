//! The seam the test kit (`tollgate-testkit`) builds on, behind the feature `test-support` that
//! only the test kit turns on: what its fresh test databases, the conformance suite's raw
//! settlement insert and the performance harness's plans need from inside this crate. The test
//! kit holds the test SQL itself; the product's statements stay here and are only named.

use crate::PgStores;

pub use crate::batch::faults::{
    BatchFault, BatchFaultKind, BatchFaults, BatchPoint, GATHER_QUIET_MS, GATHER_WAIT_MAX_MS,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tollgate_store::rows::SettlementRecord;
use tollgate_store::{StoreError, StoreResult};

/// Maps a sqlx error as the stores map theirs: codes and constraints only, never row content or
/// connection strings.
pub fn store_error(error: sqlx::Error) -> StoreError {
    crate::error::db(error)
}

/// Pool options with the stores' liveness check ([`crate::PING_AFTER_IDLE_MS`]).
pub fn pool_options() -> PgPoolOptions {
    crate::ping_when_idle(PgPoolOptions::new())
}

/// `max_connections` split as [`PgStores::connect`] splits it: `(pool, lane)` (H-27).
pub fn split_connections(max_connections: u32) -> (u32, u32) {
    crate::lane::split(max_connections)
}

/// `stores` with a call lane of `connections` connections made with `options` and the default
/// session settings, as [`PgStores::connect`] builds it (H-27); none with zero.
pub fn with_lane(stores: PgStores, options: PgConnectOptions, connections: u32) -> PgStores {
    let target = crate::hosts::Target::from_options(options, crate::SessionTimeouts::default());
    stores.with_lane(std::sync::Arc::new(target), connections)
}

/// The charge's `INSERT` as `settle` runs it (its `UNIQUE (execution_id)` violation mapped to
/// `Duplicate`), without the fence, state, spend or journal work around it.
///
/// # Errors
/// `Duplicate` when the execution already has a settlement; store failure.
pub async fn insert_settlement_unchecked(
    stores: &PgStores,
    settlement: &SettlementRecord,
) -> StoreResult<SettlementRecord> {
    let mut conn = stores.pool().acquire().await.map_err(store_error)?;
    crate::settlements::insert(&mut conn, settlement).await
}

/// The text of statements the stores send, as they send it, for the plan checks (H-12) and the
/// performance harness.
pub mod statements {
    /// An execution by `(scope, operation_key)`.
    pub const EXECUTION_BY_KEY: &str = crate::locks::EXECUTION_BY_KEY;
    /// An execution's view (row, result, settlement) by key.
    pub const VIEW_BY_KEY: &str = crate::executions::VIEW_BY_KEY;
    /// The views of several keys in one statement (H-37).
    pub const VIEWS_BY_KEYS: &str = crate::executions::VIEWS_BY_KEYS;
    /// An execution by id.
    pub const EXECUTION_BY_ID: &str = crate::executions::BY_ID;
    /// The execution row's lock.
    pub const EXECUTION_LOCK: &str = crate::locks::EXECUTION_LOCK;
    /// A fenced transition of the journal.
    pub const FENCED: &str = crate::journal::FENCED;
    /// A lease renewal.
    pub const RENEW_LEASE: &str = crate::journal::RENEW_LEASE;
    /// The expired leases of a scope.
    pub const EXPIRED: &str = crate::executions::EXPIRED;
    /// A scope's rows in one state.
    pub const BY_STATE: &str = crate::executions::BY_STATE;
    /// An execution's result.
    pub const RESULT_BY_ID: &str = crate::results::RESULT_BY_ID;
    /// An execution's settlement.
    pub const SETTLEMENT_BY_EXECUTION: &str = crate::settlements::SETTLEMENT_BY_EXECUTION;
    /// An execution's usage evidence.
    pub const EVIDENCE_OF: &str = crate::inbox::EVIDENCE_OF;
    /// A page of a scope's open usage evidence.
    pub const OPEN_EVIDENCE: &str = crate::inbox::OPEN;
    /// An evidence acknowledgement.
    pub const ACKNOWLEDGE: &str = crate::inbox::ACKNOWLEDGE;
    /// The write of a consumer's spend rows.
    pub const SPEND_WRITE: &str = crate::spend::WRITE;
    /// An audit chain head's lock.
    pub const AUDIT_HEAD_LOCK: &str = crate::audit::LOCK_HEAD;
    /// An API key by its digest.
    pub const API_KEY_BY_DIGEST: &str = crate::api_keys::BY_DIGEST;
    /// An API key's last use.
    pub const API_KEY_TOUCH: &str = crate::api_keys::TOUCH;
    /// The scheduler's scan for scopes with work (H-8).
    pub const SCOPES_WITH_WORK: &str = crate::work::SCOPES_WITH_WORK;
    /// The scan for scopes with work that reads every open row, for the harness's comparison
    /// with [`SCOPES_WITH_WORK`].
    pub const SCOPES_WITH_WORK_FULL_SCAN: &str = crate::work::SCOPES_WITH_WORK_FULL_SCAN;
}
