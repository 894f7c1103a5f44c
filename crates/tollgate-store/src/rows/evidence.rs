//! Usage evidence: where it came from, a stored piece and a new one.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::ids::{EvidenceId, ExecutionId, OperationKey, Scope};
use tollgate_core::usage::Usage;

/// Where a piece of usage evidence came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceSource {
    /// The call's own stream.
    Stream,
    /// Reported later (provider usage export, webhook).
    Late,
    /// Stated by an operator.
    Operator,
}

impl EvidenceSource {
    /// Wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Stream => "stream",
            Self::Late => "late",
            Self::Operator => "operator",
        }
    }
}

/// One piece of usage evidence (append-only; only `acknowledged_at` is ever set later).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Row id.
    pub id: EvidenceId,
    /// Insertion order within the store (the scan cursor).
    pub seq: i64,
    /// Tenant.
    pub scope: Scope,
    /// Execution it is about.
    pub execution_id: ExecutionId,
    /// Caller key of that execution.
    pub operation_key: OperationKey,
    /// Provider reference.
    pub provider_ref: Option<String>,
    /// Token counts.
    pub usage: Usage,
    /// Whether the counts are the provider's terminal counts (exact).
    pub exact: bool,
    /// Who reported it: the call's stream, a late report, or an operator.
    pub source: EvidenceSource,
    /// When the store accepted it (the writer's clock).
    pub received_at: DateTime<Utc>,
    /// Acknowledged at (by reconcile usage).
    pub acknowledged_at: Option<DateTime<Utc>>,
}

/// New evidence (the store assigns `seq`).
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvidence {
    /// Tenant.
    pub scope: Scope,
    /// Execution.
    pub execution_id: ExecutionId,
    /// Caller key.
    pub operation_key: OperationKey,
    /// Provider reference.
    pub provider_ref: Option<String>,
    /// Counts.
    pub usage: Usage,
    /// Terminal counts?
    pub exact: bool,
    /// Who reports it: the call's stream, a late report, or an operator.
    pub source: EvidenceSource,
    /// Clock.
    pub now: DateTime<Utc>,
}
