//! Journal rows: an execution, its fence, a claim and what the claim did.

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::caps::CapBlocked;
use tollgate_core::digest::{Binding, Digest256};
use tollgate_core::ids::{
    ConsumerId, ExecutionId, FenceToken, OperationKey, RootKey, Scope, SessionId,
};
use tollgate_core::limits::{ClaimLimits, LimitRefused};
use tollgate_core::money::Money;
use tollgate_core::state::{
    CallKind, ExecutionState, NotDispatchedCause, Outcome, ReconciliationReason,
};

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
    /// Why it waits (or waited) for an operator; set on `reconciliation_required`, kept once
    /// an operator settles it.
    pub reconciliation_reason: Option<ReconciliationReason>,
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
    /// The token this writer holds; once a recovery takes a newer one, writes fail (`StaleFence`).
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
    /// Session, intent, input revision and snapshot, stored with its digest.
    pub binding: Binding,
    /// `binding`'s digest when the caller has it (a runner digests bindings of its own snapshot
    /// without serializing the snapshot again, H-24); `None`: the store digests `binding`. When
    /// given it must be `binding.digest()` (see [`ClaimRequest::digest`]).
    pub binding_digest: Option<Digest256>,
    /// Worst-case cost to hold against every block cap of `binding.config.caps`.
    pub hold: Money,
    /// Clock reading (the accounting day is `now`'s UTC date).
    pub now: DateTime<Utc>,
    /// Fence lease.
    pub lease_ms: u64,
    /// The input is in hand and was checked before the claim: the new row starts `dispatched`,
    /// so the claim is also the dispatch mark (one commit; the audit trail still reads `claimed`
    /// then `dispatched`). `false`: the row starts `prepared` and the input is loaded after.
    pub dispatch: bool,
    /// The rate and concurrency limits the claim is admitted under, in its own unit, after the
    /// key is known to be new (a replay is never limited) and after the caps (SC-220).
    pub limits: ClaimLimits,
}

impl ClaimRequest {
    /// The digest of the binding: the caller's when it has one (so the store does not serialize
    /// the snapshot again), else computed here.
    pub fn digest(&self) -> Digest256 {
        match self.binding_digest {
            Some(digest) => {
                debug_assert_eq!(digest, self.binding.digest(), "a claim's binding digest");
                digest
            }
            None => self.binding.digest(),
        }
    }
}

/// What a claim did.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// A new journal row, holding its cost; the caller owns the fence.
    Claimed(ExecutionRecord),
    /// A row already exists under the key: the caller compares bindings (replay or conflict).
    /// It comes with its result, settlement and root receipt, read together, so that a
    /// replay is answered from the claim's one read (H-16).
    Existing(Box<ExecutionView>),
    /// A block cap refused; nothing was written.
    Blocked(CapBlocked),
    /// The call's root takes no more claims: it is `reconciled` or past its deadline (ST-36).
    /// Nothing was written.
    RootRefused(super::RootRecord),
    /// A rate or concurrency limit refused (SC-220..SC-223); nothing was written.
    Limited(LimitRefused),
}

/// One journal row with what its view needs: its result, its settlement and, for a call under
/// a root, its root receipt, read together so a view is one store read (H-10).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionView {
    /// The journal row.
    pub execution: ExecutionRecord,
    /// Its result, once settled.
    pub result: Option<super::ResultRecord>,
    /// Its settlement, once settled.
    pub settlement: Option<super::SettlementRecord>,
    /// Its root receipt, once settled under a root.
    pub root_receipt: Option<super::RootReceipt>,
}
