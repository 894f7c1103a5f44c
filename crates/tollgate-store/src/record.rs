//! Rows the stores keep.

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::caps::{CapBlocked, CapWarning, SpendTotals};
use tollgate_core::digest::{Binding, Digest256};
use tollgate_core::ids::{
    ConsumerId, EvidenceId, ExecutionId, FenceToken, OperationKey, RootKey, Scope, SessionId,
    SettlementId,
};
use tollgate_core::money::{Currency, Money};
use tollgate_core::state::{
    CallKind, ExecutionState, NotDispatchedCause, Outcome, SettlementSource,
};
use tollgate_core::step::Step;
use tollgate_core::usage::Usage;
use tollgate_core::view::Output;

/// One journal row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRecord {
    /// Row id.
    pub id: ExecutionId,
    /// Tenant.
    pub scope: Scope,
    /// Caller key.
    pub operation_key: OperationKey,
    /// Call kind.
    pub kind: CallKind,
    /// Root, for calls under an operation root.
    pub root_key: Option<RootKey>,
    /// Binding (session, intent, revision, config snapshot).
    pub binding: Binding,
    /// Digest of `binding`.
    pub binding_digest: Digest256,
    /// Day charged; fixed at claim.
    pub accounting_day: NaiveDate,
    /// Journal state.
    pub state: ExecutionState,
    /// Why not dispatched.
    pub not_dispatched_cause: Option<NotDispatchedCause>,
    /// Outcome, once completed.
    pub outcome: Option<Outcome>,
    /// Current fence token.
    pub fence: FenceToken,
    /// When the current fence's lease ends.
    pub lease_expires_at: DateTime<Utc>,
    /// Amount currently held against caps (zero once released).
    pub hold: Money,
    /// Provider reference, when known.
    pub provider_ref: Option<String>,
    /// Claimed at.
    pub created_at: DateTime<Utc>,
    /// Last transition at.
    pub updated_at: DateTime<Utc>,
}

impl ExecutionRecord {
    /// The fence this record carries.
    pub fn fence(&self) -> Fence {
        Fence {
            execution_id: self.id,
            token: self.fence,
        }
    }

    /// The consumer charged.
    pub fn consumer(&self) -> &ConsumerId {
        &self.binding.config.consumer
    }

    /// The session.
    pub fn session_id(&self) -> &SessionId {
        &self.binding.session_id
    }
}

/// The right to write one execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// Execution.
    pub execution_id: ExecutionId,
    /// Token.
    pub token: FenceToken,
}

/// A claim (SC-12).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRequest {
    /// Tenant.
    pub scope: Scope,
    /// Caller key.
    pub operation_key: OperationKey,
    /// Root, when under one.
    pub root_key: Option<RootKey>,
    /// Binding.
    pub binding: Binding,
    /// Worst-case cost to hold against every block cap of `binding.config.caps`.
    pub hold: Money,
    /// Clock reading (the accounting day is `now`'s UTC date).
    pub now: DateTime<Utc>,
    /// Fence lease.
    pub lease_ms: u64,
}

/// What a claim did.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// A new journal row, holding its cost; the caller owns the fence.
    Claimed(ExecutionRecord),
    /// A row already exists under the key: the caller compares bindings (replay or conflict).
    Existing(ExecutionRecord),
    /// A block cap refused; nothing was written.
    Blocked(CapBlocked),
}

/// A stored result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    /// Execution.
    pub execution_id: ExecutionId,
    /// Outcome.
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
    /// Source.
    pub source: EvidenceSource,
    /// Received at.
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
    /// Source.
    pub source: EvidenceSource,
    /// Clock.
    pub now: DateTime<Utc>,
}

/// One governed charge: the only writer of finance rows (SC-52).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettlementRecord {
    /// Row id.
    pub id: SettlementId,
    /// Execution (unique).
    pub execution_id: ExecutionId,
    /// Tenant.
    pub scope: Scope,
    /// Caller key.
    pub operation_key: OperationKey,
    /// Call kind.
    pub kind: CallKind,
    /// Consumer charged.
    pub consumer: ConsumerId,
    /// Session.
    pub session_id: SessionId,
    /// Day charged.
    pub accounting_day: NaiveDate,
    /// Provider name.
    pub provider: String,
    /// Model.
    pub model: String,
    /// Price table.
    pub price_version: String,
    /// Policy.
    pub policy_version: String,
    /// Currency.
    pub currency: Currency,
    /// Usage charged.
    pub usage: Usage,
    /// Exact amount.
    pub amount: Money,
    /// Source.
    pub source: SettlementSource,
    /// Settled at.
    pub settled_at: DateTime<Utc>,
}

/// A settlement request: governed charge + spend + result + journal completion, one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleRequest {
    /// The writer's fence.
    pub fence: Fence,
    /// Usage charged.
    pub usage: Usage,
    /// Its exact amount (computed from the execution's snapshotted prices).
    pub amount: Money,
    /// Source.
    pub source: SettlementSource,
    /// Outcome before the post-call block check.
    pub outcome: Outcome,
    /// Provider stop.
    pub stop: Option<String>,
    /// Output (dropped if the post-call block check suppresses it).
    pub output: Option<Output>,
    /// Step (dropped if suppressed).
    pub step: Option<Step>,
    /// Provider reference.
    pub provider_ref: Option<String>,
    /// Evidence this settlement is based on (recorded in the settlement's audit row).
    pub evidence_id: Option<EvidenceId>,
    /// Clock.
    pub now: DateTime<Utc>,
}

/// What a settlement did.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleOutcome {
    /// The completed journal row.
    pub record: ExecutionRecord,
    /// The settlement row.
    pub settlement: SettlementRecord,
    /// The stored result (outcome `blocked` and no output when a block cap was exceeded).
    pub result: ResultRecord,
    /// Session spend after settlement.
    pub session: SpendTotals,
    /// Daily spend after settlement.
    pub daily: SpendTotals,
    /// The root receipt, for calls under a root.
    pub root_receipt: Option<RootReceipt>,
}

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
    /// The event.
    pub event: AuditEvent,
    /// Hash of the previous row (zeros for the first).
    pub prev_hash: Digest256,
    /// This row's hash.
    pub hash: Digest256,
}

/// The lifecycle of an operation root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootState {
    /// Admits new calls until its deadline.
    Active,
    /// Closed by its owner: no new admissions; reserved calls go on (ST-33).
    Closed,
    /// Its deadline passed while active: no new admissions.
    Expired,
    /// Every reserved call finished and its accounting is durable.
    Reconciled,
}

impl RootState {
    /// Wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Closed => "closed",
            Self::Expired => "expired",
            Self::Reconciled => "reconciled",
        }
    }
}

impl std::str::FromStr for RootState {
    type Err = tollgate_core::state::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "active" => Ok(Self::Active),
            "closed" => Ok(Self::Closed),
            "expired" => Ok(Self::Expired),
            "reconciled" => Ok(Self::Reconciled),
            _ => Err(tollgate_core::state::UnknownName("RootState")),
        }
    }
}

/// One operation root.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RootRecord {
    /// Row id.
    pub id: tollgate_core::ids::RootId,
    /// Tenant.
    pub scope: Scope,
    /// Root key.
    pub root_key: RootKey,
    /// Immutable binding (session, intent, revision, whole snapshot; no deadline: SR-5).
    pub binding: Binding,
    /// Digest of the binding (root domain).
    pub binding_digest: Digest256,
    /// Admission deadline.
    pub deadline: DateTime<Utc>,
    /// State.
    pub state: RootState,
    /// Calls reserved under the root (slots taken before each child claim, ST-5).
    pub reserved_calls: i64,
    /// Inclusive charged cost: the sum of its root receipts.
    pub charged: Money,
    /// Worst-case holds of its calls in flight.
    pub held: Money,
    /// Opened at.
    pub created_at: DateTime<Utc>,
    /// Last change at.
    pub updated_at: DateTime<Utc>,
}

impl RootRecord {
    /// Inclusive cost as spend totals (for root caps).
    pub fn totals(&self) -> SpendTotals {
        SpendTotals {
            settled: self.charged,
            held: self.held,
        }
    }
}

/// Opening a root.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenRootRequest {
    /// Tenant.
    pub scope: Scope,
    /// Root key.
    pub root_key: RootKey,
    /// Binding.
    pub binding: Binding,
    /// Admission deadline.
    pub deadline: DateTime<Utc>,
    /// Clock.
    pub now: DateTime<Utc>,
}

/// What opening a root did.
#[derive(Debug, Clone, PartialEq)]
pub enum RootOpen {
    /// A new active root.
    Opened(RootRecord),
    /// A root exists under the key (the caller compares bindings).
    Existing(RootRecord),
}

/// What a slot reservation did (under the root lock).
#[derive(Debug, Clone, PartialEq)]
pub enum Reservation {
    /// A slot was reserved.
    Reserved(RootRecord),
    /// The root refuses admissions (closed, expired, reconciled, or past its deadline).
    Refused(RootRecord),
    /// No such root.
    Missing,
}

/// One send under a root: its governed charge mirrored on the root (ST-6), unique per execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RootReceipt {
    /// Root.
    pub root_id: tollgate_core::ids::RootId,
    /// Execution (unique).
    pub execution_id: ExecutionId,
    /// Amount (zero for proven refusals).
    pub amount: Money,
    /// Currency.
    pub currency: Currency,
    /// Written at.
    pub created_at: DateTime<Utc>,
}
