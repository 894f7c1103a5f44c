//! Building the view from stored rows (SC-20..SC-22). The view is always read back from the
//! stores, so callers see what was committed, not what a runner meant to write (H-1).

use chrono::{DateTime, Utc};
use tollgate_core::ids::{OperationKey, Scope};
use tollgate_core::state::{ExecutionState, Outcome};
use tollgate_core::view::{Receipt, View, ViewState};
use tollgate_store::{ExecutionRecord, SettlementRecord, StoreResult, Stores};

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
    }
}

/// The view of a journal row, reading its result and settlement.
///
/// # Errors
/// Store failure.
pub async fn view_of(
    stores: &dyn Stores,
    record: &ExecutionRecord,
    now: DateTime<Utc>,
) -> StoreResult<View> {
    let view = match record.state {
        ExecutionState::Prepared | ExecutionState::Dispatched => {
            base(record, ViewState::InProgress)
        }
        ExecutionState::ReconciliationRequired => base(record, ViewState::ReconciliationRequired),
        ExecutionState::NotDispatched => View {
            not_dispatched_cause: record.not_dispatched_cause,
            ..base(record, ViewState::NotDispatched)
        },
        ExecutionState::Completed => completed_view(stores, record, now).await?,
    };
    Ok(view)
}

async fn completed_view(
    stores: &dyn Stores,
    record: &ExecutionRecord,
    now: DateTime<Utc>,
) -> StoreResult<View> {
    let mut view = base(record, ViewState::Completed);
    view.outcome = record.outcome;
    view.receipt = stores.settlement(record.id).await?.as_ref().map(receipt);
    if let Some(result) = stores.result(record.id).await? {
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
    Ok(view)
}

/// `read(scope, key)`: nothing, or the view.
///
/// # Errors
/// Store failure.
pub async fn read(
    stores: &dyn Stores,
    scope: &Scope,
    key: &OperationKey,
    now: DateTime<Utc>,
) -> StoreResult<Option<View>> {
    match stores.execution(scope, key).await? {
        Some(record) => Ok(Some(view_of(stores, &record, now).await?)),
        None => Ok(None),
    }
}
