//! Building the view from stored rows (SC-20..SC-22). The view is always read back from the
//! stores, so callers see what was committed, not what a runner meant to write (H-1).

use chrono::{DateTime, Utc};
use tollgate_core::ids::{OperationKey, Scope};
use tollgate_core::state::{ExecutionState, Outcome};
use tollgate_core::view::{Receipt, View, ViewState};
use tollgate_store::{
    ExecutionRecord, ExecutionView, ResultRecord, SettleOutcome, SettlementRecord, StoreResult,
    Stores,
};

/// The receipt of a settlement.
pub fn receipt(settlement: &SettlementRecord) -> Receipt {
    Receipt {
        amount: settlement.amount,
        currency: settlement.currency.clone(),
        price_version: settlement.price_version.clone(),
        usage: settlement.usage,
    }
}

fn base(record: &ExecutionRecord, state: ViewState) -> View {
    View {
        execution_id: Some(record.id),
        reconciliation_reason: record.reconciliation_reason,
        ..bare(record.operation_key.clone(), state)
    }
}

/// A view with no journal record behind it (e.g. a structured call decided by its root).
pub fn bare(operation_key: OperationKey, state: ViewState) -> View {
    View {
        state,
        replayed: false,
        operation_key,
        execution_id: None,
        outcome: None,
        invalid_reason: None,
        not_dispatched_cause: None,
        reconciliation_reason: None,
        output: None,
        step: None,
        receipt: None,
        root_receipt: None,
        warnings: Vec::new(),
        above_hold: false,
    }
}

/// The view of a journal row; a `completed` row's result and settlement come from the same
/// read, one round trip per view (H-10).
///
/// # Errors
/// Store failure.
pub async fn view_of(
    stores: &dyn Stores,
    record: &ExecutionRecord,
    now: DateTime<Utc>,
) -> StoreResult<View> {
    if record.state != ExecutionState::Completed {
        return Ok(view_from(record, None, None, now));
    }
    let joined = stores
        .execution_view(&record.scope, &record.operation_key)
        .await?
        .filter(|v| v.execution.id == record.id);
    let (result, settlement) = joined.map_or((None, None), |v| (v.result, v.settlement));
    Ok(view_from(record, result, settlement, now))
}

/// The view of a row read together with its result and settlement (a claim's `Existing`).
pub fn of_found(found: &ExecutionView, now: DateTime<Utc>) -> View {
    view_from(
        &found.execution,
        found.result.clone(),
        found.settlement.clone(),
        now,
    )
}

/// The view of a call from what its settlement's commit answered: the completed row, its
/// result and its charge, as stored, so the answer needs no read after the commit (H-22).
pub fn of_settled(settled: &SettleOutcome, now: DateTime<Utc>) -> View {
    view_from(
        &settled.record,
        Some(settled.result.clone()),
        Some(settled.settlement.clone()),
        now,
    )
}

/// The view of a journal row given its result and settlement.
fn view_from(
    record: &ExecutionRecord,
    result: Option<ResultRecord>,
    settlement: Option<SettlementRecord>,
    now: DateTime<Utc>,
) -> View {
    match record.state {
        ExecutionState::Prepared | ExecutionState::Dispatched => {
            base(record, ViewState::InProgress)
        }
        ExecutionState::ReconciliationRequired => base(record, ViewState::ReconciliationRequired),
        ExecutionState::NotDispatched => View {
            not_dispatched_cause: record.not_dispatched_cause,
            ..base(record, ViewState::NotDispatched)
        },
        ExecutionState::Completed => completed_view(record, result, settlement, now),
    }
}

fn completed_view(
    record: &ExecutionRecord,
    result: Option<ResultRecord>,
    settlement: Option<SettlementRecord>,
    now: DateTime<Utc>,
) -> View {
    let mut view = base(record, ViewState::Completed);
    view.outcome = record.outcome;
    view.receipt = settlement.as_ref().map(receipt);
    if let Some(result) = result {
        view.outcome = Some(result.outcome);
        view.warnings = result.warnings;
        // Erased or expired content is unavailable, even after a successful history (SC-22).
        let gone = result.erased_at.is_some() || result.retention_expires_at <= now;
        if gone {
            if result.output.is_some() || result.step.is_some() || result.erased_at.is_some() {
                view.outcome = Some(Outcome::Unavailable);
            }
        } else {
            view.output = result.output;
            view.step = result.step;
        }
    }
    view
}

/// `read(scope, key)`: nothing, or the view, from one read of the row with its result,
/// settlement and root receipt (H-10).
///
/// # Errors
/// Store failure.
pub async fn read(
    stores: &dyn Stores,
    scope: &Scope,
    key: &OperationKey,
    now: DateTime<Utc>,
) -> StoreResult<Option<View>> {
    Ok(stores
        .execution_view(scope, key)
        .await?
        .map(|v| view_from(&v.execution, v.result, v.settlement, now)))
}
