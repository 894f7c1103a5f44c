//! The settlement of a call, and the path it takes: a call outside an operation root whose row
//! the settler read is settled by the `tollgate_settle` function ([`function`]), one statement and
//! one commit, alone or in one batch with the settlements that arrive while the queue is busy
//! (`batch`). Every other settlement, and one the function hands back because the row is no longer
//! the one the settler read, is settled by the general transaction ([`transaction`]).
//!
//! Either way the charge, the spend, the root totals and root receipt (under a root), the result,
//! the journal's completion and the audit row are one commit (spec/journal.md, SC-52, ST-6), with
//! the call's own usage evidence in it, acknowledged when it is what was charged (H-28); other
//! evidence is left to usage reconciliation, which compares it with the durable settlement.
//!
//! `settle.sql` is the source of `tollgate_settle`, `tollgate_charge_spend` and the type
//! `tollgate_settled`, applied by the definitions step (`definitions.rs`).

mod function;
mod transaction;

pub(crate) use function::SettleCall;

use crate::error::{db, is_unique_violation};
use crate::PgStores;
use tollgate_store::{ExecutionRecord, SettleOutcome, SettleRequest, StoreError, StoreResult};

/// A unique violation while settling means a settlement (or result) already exists.
fn duplicate(error: sqlx::Error, record: &ExecutionRecord) -> StoreError {
    if is_unique_violation(&error, None) {
        StoreError::Duplicate(format!("settlement of {}", record.id))
    } else {
        db(error)
    }
}

impl PgStores {
    /// [`ExecutionStore::settle`](tollgate_store::ExecutionStore::settle): by the function when
    /// the settler read the row and it is outside a root, else (or when the function hands the
    /// settlement back, having written nothing) by the general transaction.
    pub(crate) async fn settle_tx(&self, request: SettleRequest) -> StoreResult<SettleOutcome> {
        let function = request
            .seen
            .as_deref()
            .filter(|s| s.root_key.is_none() && !self.general_only());
        // Each path's state on the heap, only the one taken: thousands of settlements waiting
        // together hold the function's state, not room for the general transaction's.
        if let Some(seen) = function {
            if let Some(outcome) = Box::pin(self.settle_call(&request, seen)).await? {
                return Ok(outcome);
            }
        }
        Box::pin(self.settle_in_transaction(request)).await
    }
}
