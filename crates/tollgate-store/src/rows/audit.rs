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

/// One of a scope's audit chains. A scope's rows are spread over [`AUDIT_CHAINS`] chains so that
/// appends for different executions do not wait for one another; every row of one execution is
/// in the same chain (see [`AuditEvent::chain`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct AuditChain(pub u16);

/// Chains per scope.
pub const AUDIT_CHAINS: u16 = 64;

impl AuditChain {
    /// The chain of every row of execution `id`.
    pub fn of_execution(id: ExecutionId) -> AuditChain {
        let bytes = id.0.as_bytes();
        // The uuid's last two bytes are random in every version we generate.
        let low = u16::from_be_bytes([bytes[14], bytes[15]]);
        AuditChain(low % AUDIT_CHAINS)
    }

    /// Every chain of a scope, in order.
    pub fn all() -> impl Iterator<Item = AuditChain> {
        (0..AUDIT_CHAINS).map(AuditChain)
    }
}

impl std::fmt::Display for AuditChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl AuditEvent {
    /// The chain the event is appended to: chosen by the execution id, so one execution's rows
    /// stay in one chain in order; events of no execution (roots, operators) go to chain 0.
    pub fn chain(&self) -> AuditChain {
        self.execution_id
            .map_or(AuditChain(0), AuditChain::of_execution)
    }
}

/// A place in a scope's audit trail: rows are listed by chain, then by seq within the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct AuditPosition {
    /// The chain.
    pub chain: AuditChain,
    /// The seq within the chain (0: before its first row).
    pub seq: i64,
}

impl AuditPosition {
    /// Before every row of the scope.
    pub const START: AuditPosition = AuditPosition {
        chain: AuditChain(0),
        seq: 0,
    };
}

/// A stored audit row, chained per scope and chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRow {
    /// The chain the row belongs to.
    pub chain: AuditChain,
    /// Position in its chain, from 1.
    pub seq: i64,
    /// The event as appended; all of its fields are covered by `hash`.
    pub event: AuditEvent,
    /// Hash of the previous row (zeros for the first).
    pub prev_hash: Digest256,
    /// This row's hash.
    pub hash: Digest256,
}

impl AuditRow {
    /// Where the row is in its scope's trail (the cursor for the next page).
    pub fn position(&self) -> AuditPosition {
        AuditPosition {
            chain: self.chain,
            seq: self.seq,
        }
    }
}

/// The head of one of a scope's chains as the store keeps it: the last row's seq and hash. A
/// chain whose last row differs from its head has lost its tail. A scope's heads are created all
/// together with its first row, so a missing head is itself a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditHead {
    /// The chain.
    pub chain: AuditChain,
    /// Seq of the last row appended (0: none yet).
    pub seq: i64,
    /// Hash of the last row appended.
    pub hash: Digest256,
}
