//! Stored results.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::caps::CapWarning;
use tollgate_core::ids::ExecutionId;
use tollgate_core::state::Outcome;
use tollgate_core::step::Step;
use tollgate_core::view::Output;

/// A stored result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    /// Execution.
    pub execution_id: ExecutionId,
    /// How the call completed, after the post-call block check; kept when content is erased.
    pub outcome: Outcome,
    /// Provider stop reason.
    pub stop: Option<String>,
    /// Output (none when unavailable, blocked or erased).
    pub output: Option<Output>,
    /// Step (structured / step calls; none when erased).
    pub step: Option<Step>,
    /// Caps crossed by the settlement.
    pub warnings: Vec<CapWarning>,
    /// When the content expires.
    pub retention_expires_at: DateTime<Utc>,
    /// When the content was erased.
    pub erased_at: Option<DateTime<Utc>>,
}
