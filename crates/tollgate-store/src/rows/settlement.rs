//! Governed settlements: the stored charge, the settle request and what it did.

use super::*;
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::{
    ConsumerId, EvidenceId, ExecutionId, OperationKey, Scope, SessionId, SettlementId,
};
use tollgate_core::money::{Currency, Money};
use tollgate_core::state::{CallKind, Outcome, SettlementSource};
use tollgate_core::step::Step;
use tollgate_core::usage::Usage;
use tollgate_core::view::Output;

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
    /// Model charged for, from the execution's snapshot.
    pub model: String,
    /// Price table.
    pub price_version: String,
    /// Policy.
    pub policy_version: String,
    /// Currency of `amount`: the snapshot's price-table currency.
    pub currency: Currency,
    /// Usage charged.
    pub usage: Usage,
    /// Exact amount.
    pub amount: Money,
    /// Where the charged usage came from: `stream`, `recovery` or `operator`.
    pub source: SettlementSource,
    /// When the settlement was written (the settler's clock).
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
    /// Where `usage` came from: the call's stream, inbox evidence in recovery, or an operator.
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
    /// The call's own usage evidence (its stream's), recorded in the settlement's unit, so
    /// one commit records both (H-15). `None` when the evidence is already in the inbox (recovery,
    /// operators) or there is none.
    pub evidence: Option<NewEvidence>,
    /// The row as the settler last read it (its claim), when it has it. A store may settle in
    /// one round trip from it once it has checked, under the row's lock, that the stored row is
    /// still that one (same fence, a settleable state, the same binding digest and hold); the
    /// result is the same as without it.
    pub seen: Option<Box<ExecutionRecord>>,
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

/// A position in the finance feed (spec/service.md — Finance feed): the inserting transaction's
/// id, then the settlement's insert sequence. Feed order is the order of these pairs; a position
/// once handed out is never preceded by a row that commits later (SC-141). The HTTP feed hands
/// out no position: its cursor is a settlement's id (SC-193).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FeedPosition {
    /// The inserting transaction (on Postgres the `xid8`; in memory the insert number).
    pub txid: u64,
    /// The settlement's insert sequence.
    pub seq: i64,
}

impl FeedPosition {
    /// Before every settlement.
    pub const START: FeedPosition = FeedPosition { txid: 0, seq: 0 };
}

/// One settlement of the finance feed with its position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedEntry {
    /// Where it sits in the feed (resume after it).
    pub position: FeedPosition,
    /// The settlement.
    pub settlement: SettlementRecord,
}
