//! Operation roots: the root row, opening a root, slot reservations and root receipts.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::caps::SpendTotals;
use tollgate_core::digest::{Binding, Digest256};
use tollgate_core::ids::{ExecutionId, RootKey, Scope};
use tollgate_core::money::{Currency, Money};

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
    /// The caller's key of the root, unique within `scope`.
    pub root_key: RootKey,
    /// Immutable binding (session, intent, revision, whole snapshot; no deadline: SR-5).
    pub binding: Binding,
    /// Digest of the binding (root domain).
    pub binding_digest: Digest256,
    /// Admission deadline.
    pub deadline: DateTime<Utc>,
    /// Lifecycle state; only `active` admits new calls.
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
    /// Key to open under; an existing root there is returned, never replaced.
    pub root_key: RootKey,
    /// Immutable binding, digested under the root domain; the deadline is not part of it.
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
    /// Currency of `amount`: the snapshot's price-table currency.
    pub currency: Currency,
    /// Written at.
    pub created_at: DateTime<Utc>,
}
