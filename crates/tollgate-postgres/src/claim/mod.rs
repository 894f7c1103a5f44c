//! The claim of a call, and the path it takes:
//!
//! - A claim of a key these stores have seen with a row reads first, and so does every claim under
//!   an operation root: most of them are replays, answered by that one read and no write.
//! - A new key outside a root is claimed by the `tollgate_claim` function ([`function`]): one
//!   statement and one commit, alone or in one batch with the claims that arrive while the queue is
//!   busy (`batch`).
//! - A new key under a root is claimed by the general transaction ([`transaction`]): its root lock
//!   and root cap checks come between the insert and the spend rows, which the function does not
//!   take.
//!
//! `claim.sql` is the source of `tollgate_claim`, applied by the definitions step
//! (`definitions.rs`).

mod function;
mod transaction;

pub(crate) use function::ClaimCall;

use crate::executions;
use crate::PgStores;
use std::sync::atomic::Ordering;
use tollgate_store::rules;
use tollgate_store::StoreResult;
use tollgate_store::{ClaimOutcome, ClaimRequest};

impl PgStores {
    /// [`ExecutionStore::claim`](tollgate_store::ExecutionStore::claim): the existing row of a
    /// replay, or the claim of a new key by the function (outside a root) or by the general
    /// transaction (under a root).
    pub(crate) async fn claim_tx(&self, request: ClaimRequest) -> StoreResult<ClaimOutcome> {
        // A key seen here with a row is most likely a replay: one read and no write answer it. Any
        // other key outside a root goes to the claim function at once, which answers a key that
        // has a row with nothing; the read follows then. A first call so costs one statement
        // (H-30).
        let seen = self
            .seen_keys
            .contains(&request.scope, &request.operation_key);
        if seen || request.root_key.is_some() {
            self.reads_first.fetch_add(1, Ordering::Relaxed);
            let held = (&request.binding, request.digest());
            let existing = Box::pin(executions::view_held(self, &request, held)).await?;
            if let Some(existing) = existing {
                self.seen_keys
                    .insert(&request.scope, &request.operation_key);
                return Ok(ClaimOutcome::Existing(Box::new(existing)));
            }
        }
        let record = rules::new_execution(&request);
        if request.root_key.is_none() && !self.general_only() {
            // Each path's state on the heap, only the one taken (as the settlement's).
            let outcome = Box::pin(self.claim_call(&request, &record)).await?;
            if matches!(
                outcome,
                ClaimOutcome::Claimed(_) | ClaimOutcome::Existing(_)
            ) {
                self.seen_keys
                    .insert(&request.scope, &request.operation_key);
            }
            return Ok(outcome);
        }
        Box::pin(self.claim_in_transaction(request, record)).await
    }
}
