//! A shard's one queue of claims and settlements (H-43): what its runner takes at once goes as
//! one statement and one commit. Claims alone go as the claim batch (or the single function),
//! settlements alone as the settlement batch; both together as `tollgate_shard_batch`, which
//! decides the settlements as their batch does, then the claims as theirs, in one transaction,
//! so a shard whose calls both start and end at once pays one commit for each round of them
//! instead of two.

use crate::batch::{Answer, Batcher, BATCH_LOCK_TIMEOUT_MS};
use crate::claim::ClaimCall;
use crate::rows::execution_columns_but_binding;
use crate::settle::SettleCall;
use crate::PgStores;
use std::sync::{Arc, OnceLock};
use tollgate_store::{StoreError, StoreResult};

/// A call of a shard's queue.
pub(crate) enum ShardCall {
    /// A claim of a call outside a root (`tollgate_claim`).
    Claim(ClaimCall),
    /// A settlement of a call outside a root (`tollgate_settle`).
    Settle(SettleCall),
}

impl ShardCall {
    /// The call's kind in its queue (`Batcher::of_kinds`): claims 0, settlements 1.
    pub(crate) fn kind(&self) -> usize {
        match self {
            Self::Claim(_) => 0,
            Self::Settle(_) => 1,
        }
    }

    /// The batch point of the fault matrix this call's statements count at.
    #[cfg(feature = "test-support")]
    pub(crate) fn point(&self) -> crate::batch::faults::BatchPoint {
        match self {
            Self::Claim(_) => crate::batch::faults::BatchPoint::Claim,
            Self::Settle(_) => crate::batch::faults::BatchPoint::Settle,
        }
    }
}

/// The columns a settlement's row answers (the execution's, the binding aside, then its spend
/// totals); a claim's row in a shard batch has the same shape, its totals NULL.
const SETTLED_COLUMNS: &str = concat!(
    execution_columns_but_binding!(),
    ", session_settled, session_held, day_settled, day_held"
);

/// The shard batch's statement: the settlements as one array, the claims as another.
fn shard_statement() -> &'static str {
    static STATEMENT: OnceLock<String> = OnceLock::new();
    STATEMENT.get_or_init(|| {
        let mut sql = String::from("SELECT b.call_index, b.call_state");
        for column in SETTLED_COLUMNS.split(',').map(str::trim) {
            sql.push_str(&format!(", (b.call_row).{column}"));
        }
        sql.push_str(&format!(
            " FROM tollgate_shard_batch($1, $2, {}) b ORDER BY b.call_index",
            BATCH_LOCK_TIMEOUT_MS
        ));
        sql
    })
}

impl PgStores {
    /// Sends `call` in its shard's next statement (`queue`); answers how it went, with the call
    /// given back.
    ///
    /// # Errors
    /// As [`Batcher::submit`].
    pub(crate) async fn submit_to_shard(
        &self,
        queue: &Arc<Batcher<ShardCall>>,
        call: ShardCall,
    ) -> StoreResult<(Answer, ShardCall)> {
        let stores = self.clone();
        queue
            .submit(call, move |calls| {
                let stores = stores.clone();
                async move { stores.send_shard(calls).await }
            })
            .await
    }

    /// `calls` of one shard in one statement, answered in their order, with the calls given
    /// back.
    pub(crate) async fn send_shard(&self, calls: Vec<ShardCall>) -> (Vec<Answer>, Vec<ShardCall>) {
        // Each call's kind, in order (true: a settlement).
        let mut kinds = Vec::with_capacity(calls.len());
        let mut claims = Vec::new();
        let mut settles = Vec::new();
        for call in calls {
            match call {
                ShardCall::Claim(c) => {
                    kinds.push(false);
                    claims.push(c);
                }
                ShardCall::Settle(c) => {
                    kinds.push(true);
                    settles.push(c);
                }
            }
        }
        let (settle_answers, claim_answers) = if settles.is_empty() {
            let (answers, given) = self.send_claims(claims).await;
            claims = given;
            (Vec::new(), answers)
        } else if claims.is_empty() {
            let (answers, given) = self.send_settles(settles).await;
            settles = given;
            (answers, Vec::new())
        } else {
            let mut answers = self.send_both(&settles, &claims).await;
            let claim_answers = answers.split_off(settles.len().min(answers.len()));
            (answers, claim_answers)
        };
        let (mut claims, mut claim_answers) = (claims.into_iter(), claim_answers.into_iter());
        let (mut settles, mut settle_answers) = (settles.into_iter(), settle_answers.into_iter());
        let mut answered = Vec::with_capacity(kinds.len());
        let mut given = Vec::with_capacity(kinds.len());
        for settle in kinds {
            let (answer, call) = if settle {
                (settle_answers.next(), settles.next().map(ShardCall::Settle))
            } else {
                (claim_answers.next(), claims.next().map(ShardCall::Claim))
            };
            if let Some(call) = call {
                answered.push(answer.unwrap_or_else(|| {
                    let e = StoreError::Corrupt("batch answered another number of calls".into());
                    Answer::Failed(e)
                }));
                given.push(call);
            }
        }
        (answered, given)
    }

    /// Settlements, then claims, as one `tollgate_shard_batch` statement: their answers in that
    /// order.
    async fn send_both(&self, settles: &[SettleCall], claims: &[ClaimCall]) -> Vec<Answer> {
        let query = sqlx::query(shard_statement()).bind(settles).bind(claims);
        self.batch_statement(query, settles.len() + claims.len())
            .await
    }
}
