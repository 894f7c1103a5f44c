//! Audit events as written and as stored (metadata only, never content).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::digest::Digest256;
use tollgate_core::ids::{ExecutionId, Scope};

/// An audit event as written (metadata only, never content).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Tenant.
    pub scope: Scope,
    /// Execution, if any.
    pub execution_id: Option<ExecutionId>,
    /// Event kind (`claimed`, `dispatched`, `settled`, ...).
    pub kind: String,
    /// Metadata (ids, states, amounts, digests; never content).
    pub detail: serde_json::Value,
    /// Clock.
    pub at: DateTime<Utc>,
}

/// A stored audit row, chained per scope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRow {
    /// Position in the scope's chain, from 1.
    pub seq: i64,
    /// The event as appended; all of its fields are covered by `hash`.
    pub event: AuditEvent,
    /// Hash of the previous row (zeros for the first).
    pub prev_hash: Digest256,
    /// This row's hash.
    pub hash: Digest256,
}

/// The head of a scope's chain as the store keeps it: the last row's seq and hash. A chain whose
/// last row differs from its head has lost its tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditHead {
    /// Seq of the last row appended (0: none yet).
    pub seq: i64,
    /// Hash of the last row appended.
    pub hash: Digest256,
}
