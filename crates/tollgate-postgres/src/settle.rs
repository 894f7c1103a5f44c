//! Settlement: governed charge, spend, root totals and root receipt (under a root), result,
//! journal completion and audit in one transaction (spec/journal.md, SC-52, ST-6). Evidence is not
//! acknowledged here: reconcile usage compares it with the durable settlement.

use crate::audit;
use crate::error::{db, is_unique_violation, DbResultExt};
use crate::locks;
use crate::roots;
use crate::rows::{execution_columns, result_columns, to_json_text, ExecutionRow, ResultRow};
use crate::settlements;
use crate::spend::{self, SpendKeys};
use crate::PgStores;
use sqlx::types::Json;
use sqlx::PgConnection;
use tollgate_core::caps::CurrencySpend;
use tollgate_store::rows::*;
use tollgate_store::rules;
use tollgate_store::{StoreError, StoreResult};

const INSERT_RESULT: &str = concat!(
    "INSERT INTO execution_results (execution_id, outcome, stop, output, step, warnings, \
     retention_expires_at, erased_at) \
     VALUES ($1, $2, $3, $4::text::json, $5::text::json, $6, $7, $8) RETURNING ",
    result_columns!()
);

pub(crate) const COMPLETE: &str = concat!(
    "UPDATE executions SET state = $2, outcome = $3, hold = $4, provider_ref = $5, \
     updated_at = $6 WHERE id = $1 RETURNING ",
    execution_columns!()
);

/// A unique violation while settling means a settlement (or result) already exists.
fn duplicate(error: sqlx::Error, record: &ExecutionRecord) -> StoreError {
    if is_unique_violation(&error, None) {
        StoreError::Duplicate(format!("settlement of {}", record.id))
    } else {
        db(error)
    }
}

async fn insert_result(
    conn: &mut PgConnection,
    result: &ResultRecord,
    record: &ExecutionRecord,
) -> StoreResult<ResultRecord> {
    let row: ResultRow = sqlx::query_as(INSERT_RESULT)
        .bind(result.execution_id.0)
        .bind(result.outcome.as_str())
        .bind(result.stop.as_deref())
        .bind(to_json_text(result.output.as_ref(), "output")?)
        .bind(to_json_text(result.step.as_ref(), "step")?)
        .bind(Json(&result.warnings))
        .bind(result.retention_expires_at)
        .bind(result.erased_at)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| duplicate(e, record))?;
    row.into_record()
}

async fn complete(conn: &mut PgConnection, done: &ExecutionRecord) -> StoreResult<ExecutionRecord> {
    let row: ExecutionRow = sqlx::query_as(COMPLETE)
        .bind(done.id.0)
        .bind(done.state.as_str())
        .bind(done.outcome.map(|o| o.as_str()))
        .bind(done.hold.decimal())
        .bind(done.provider_ref.as_deref())
        .bind(done.updated_at)
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    row.into_record()
}

impl PgStores {
    /// [`ExecutionStore::settle`](tollgate_store::ExecutionStore::settle) as one transaction:
    /// lock the execution, check the fence, take the root lock (for a call under a root), lock
    /// the spend rows, insert the charge (UNIQUE per execution: a second one is `Duplicate`),
    /// move the hold to the settled totals of the spend rows and the root, store the result
    /// after the post-call block checks (spend caps, then the root block cap on the root's
    /// inclusive cost), insert the root receipt (UNIQUE per execution), complete the journal,
    /// audit `settled`.
    pub(crate) async fn settle_tx(&self, request: SettleRequest) -> StoreResult<SettleOutcome> {
        let mut tx = self.pool().begin().await.store_err()?;
        let chain = AuditChain::of_execution(request.fence.execution_id);
        // The crate's lock order: the execution, its root, the audit head, the spend rows. Outside
        // a root the execution and the head are locked by one statement.
        let (record, head) =
            locks::lock_execution_and_head(&mut tx, request.fence.execution_id, chain).await?;
        rules::check_fence(&record, request.fence, &rules::SETTLEABLE)?;
        let (root, head) = match &record.root_key {
            Some(root_key) => {
                let root = locks::lock_root(&mut tx, &record.scope, root_key).await?;
                (root, audit::lock_head(&mut tx, &record.scope, chain).await?)
            }
            None => match head {
                Some(head) => (None, head),
                None => (None, audit::lock_head(&mut tx, &record.scope, chain).await?),
            },
        };
        let settlement = rules::settlement_row(&record, &request);
        let settlement = settlements::insert(&mut tx, &settlement).await?;
        // The spend rows last: held for their write, the result, the completion, the audit row
        // and the commit.
        let keys = SpendKeys::of(&record);
        let (session, daily) = spend::lock(&mut tx, &keys).await?;
        let session = rules::apply_settlement(session, record.hold, request.amount)?;
        let daily = rules::apply_settlement(daily, record.hold, request.amount)?;
        spend::write(&mut tx, &keys, session, daily).await?;
        let mut result = rules::settled_result(&record, &request, session, daily)?;
        let mut root_receipt = None;
        if let Some(root) = root {
            // An over-release or a currency mismatch returns before the commit: the dropped
            // transaction writes nothing (SC-106, SC-107).
            rules::check_root_currency(&root, rules::currency_of(&record))?;
            let totals = rules::apply_settlement(root.totals(), record.hold, request.amount)?;
            locks::write_totals(&mut tx, root.id, totals, Some(request.now)).await?;
            let after = CurrencySpend::new(rules::root_currency(&root).clone(), totals);
            rules::apply_root_caps(&record, &mut result, &after)?;
            let receipt = rules::root_receipt(&root, &settlement);
            root_receipt = Some(roots::insert_receipt(&mut tx, &receipt).await?);
        }
        let result = insert_result(&mut tx, &result, &record).await?;
        let done = complete(
            &mut tx,
            &rules::completed(&record, &request, result.outcome),
        )
        .await?;
        audit::append_at(
            &mut tx,
            rules::settled_event(&done, &settlement, &result),
            head,
        )
        .await?;
        tx.commit().await.store_err()?;
        Ok(SettleOutcome {
            record: done,
            settlement,
            result,
            session,
            daily,
            root_receipt,
        })
    }
}
