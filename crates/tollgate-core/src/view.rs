//! The view every call, step and read answers with (spec/service.md — The view).

use crate::caps::CapWarning;
use crate::ids::{ExecutionId, OperationKey};
use crate::invalid::InvalidReason;
use crate::money::{Currency, Money};
use crate::state::{NotDispatchedCause, Outcome, ReconciliationReason};
use crate::step::Step;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};

/// The state as callers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViewState {
    /// Settled and stored.
    Completed,
    /// Claimed or dispatched, not yet finished.
    InProgress,
    /// Never sent.
    NotDispatched,
    /// Sent; cost unproven; an operator settles it.
    ReconciliationRequired,
}

/// A financial receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// Exact amount.
    pub amount: Money,
    /// Currency of `amount`: the snapshot's price-table currency.
    pub currency: Currency,
    /// Price table used.
    pub price_version: String,
    /// Usage charged.
    pub usage: Usage,
}

/// Output of a completed call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Output {
    /// Visible text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Parsed JSON (json calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
}

/// What every call, step, read, recover and resolve answers with; built from committed rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct View {
    /// Where the call stands for the caller; decides which other fields are present.
    pub state: ViewState,
    /// Whether this answer is a replay of an earlier claim.
    pub replayed: bool,
    /// The caller's key.
    pub operation_key: OperationKey,
    /// Journal row id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<ExecutionId>,
    /// Outcome (completed only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// First invalid reason; on the run's own response only, never on reads (ST-20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_reason: Option<InvalidReason>,
    /// Why it was not dispatched (not_dispatched only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_dispatched_cause: Option<NotDispatchedCause>,
    /// Why it waits (or waited) for an operator (`reconciliation_required`, and completed by an
    /// operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciliation_reason: Option<ReconciliationReason>,
    /// Output; null when unavailable, erased or blocked.
    pub output: Option<Output>,
    /// The step (structured and step calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Step>,
    /// The governed charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Receipt>,
    /// The root receipt (calls under a root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_receipt: Option<Receipt>,
    /// Caps crossed by this call's settlement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<CapWarning>,
    /// The answer of the call's own settlement, which charged more than the call held (the
    /// provider billed above the hold's bound; SC-207). Only the settling run's answer knows it
    /// (the settled audit row keeps it for good); never serialized, it feeds this process's
    /// metric.
    #[serde(skip)]
    pub above_hold: bool,
}
