//! Store traits of tollgate, their in-memory implementation and a fault-injecting wrapper. The
//! conformance suite every implementation must pass is in the test kit (`tollgate-testkit`).
//!
//! The traits are split by capability (SC-50): the journal ([`ExecutionStore`]), results
//! ([`ResultStore`]), the usage inbox ([`UsageInbox`]), governed settlements
//! ([`SettlementStore`]), spend totals ([`SpendStore`]) and the append-only audit log
//! ([`AuditLog`]); beside them, operation roots ([`RootStore`]) and, for the HTTP service, API
//! keys ([`ApiKeyStore`]) and the scheduler's work scan ([`WorkScan`]). Operations that must be
//! atomic across tables — claim with holds, settlement with spend, result and journal — are
//! single methods, so each implementation can make them one transaction.
#![warn(missing_docs)]

pub mod audit;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod ledger;
pub mod memory;
pub mod rows;
pub mod rules;
pub mod traits;

pub use error::{StoreError, StoreResult};
pub use ledger::{LedgerCounts, LedgerInvariant, LedgerReport, LedgerViolation, SpendRowKey};
pub use memory::MemoryStores;
pub use rows::*;
pub use traits::*;
