//! The general settlement transaction: every settlement of a call under an operation root, and
//! one outside a root that the function handed back. The execution, its root, the audit head and
//! the spend rows are locked in the crate's order, and the post-call caps judge the totals under
//! those locks.

use super::duplicate;
use crate::audit;
use crate::error::{is_unique_violation, DbResultExt};
use crate::limits;
use crate::locks;
use crate::roots;
use crate::rows::{
    execution_columns, result_columns, settlement_columns, to_json_text, ExecutionRow, ResultRow,
    SettlementRow,
};
use crate::settlements;
use crate::spend::{self, SpendKeys};
use crate::PgStores;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection};
use tollgate_core::caps::CurrencySpend;
use tollgate_core::caps::SpendTotals;
use tollgate_core::limits::{LimitEnd, LimitTokens};
use tollgate_core::state::ExecutionState;
use tollgate_store::rows::*;
use tollgate_store::rules;
use tollgate_store::{StoreError, StoreResult};

/// The common end of a settlement, one statement: both spend rows written, the result inserted,
/// the journal completed, the chain's head moved and the `settled` row appended. The spend rows,
/// the execution and the audit head are already locked by the transaction; the spend rows, which
/// every call of the consumer takes, are so held for this statement and the commit only (H-13).
macro_rules! finish_ctes {
    () => {
        concat!(
            "s AS (UPDATE spend_sessions SET settled = $6, held = $7 \
               WHERE scope = $1 AND consumer = $2 AND session_id = $3 AND currency = $4), \
             d AS (UPDATE spend_days SET settled = $8, held = $9 \
               WHERE scope = $1 AND consumer = $2 AND day = $5 AND currency = $4), \
             r AS (INSERT INTO execution_results (execution_id, outcome, stop, output, step, \
               warnings, retention_expires_at, erased_at) \
               VALUES ($10, $11, $12, $13::text::json, $14::text::json, $15, $16, $17) RETURNING ",
            result_columns!(),
            "), c AS (UPDATE executions SET state = $18, outcome = $19, hold = $20, \
               provider_ref = $21, updated_at = $22 WHERE id = $10 RETURNING ",
            execution_columns!(),
            "), h AS (UPDATE audit_heads SET last_seq = $24, last_hash = $29 \
               WHERE scope = $1 AND chain = $23), \
             a AS (INSERT INTO audit_log (scope, chain, seq, execution_id, kind, detail, at, \
               prev_hash, hash) VALUES ($1, $23, $24, $10, $25, $26, $27, $28, $29) \
               RETURNING seq) \
             SELECT c.*, r.execution_id AS r_execution_id, r.outcome AS r_outcome, \
               r.stop AS r_stop, r.output AS r_output, r.step AS r_step, \
               r.warnings AS r_warnings, r.retention_expires_at AS r_retention_expires_at, \
               r.erased_at AS r_erased_at"
        )
    };
}

/// The end of a settlement whose charge was inserted before (under a root, whose receipt needs
/// it): the completed row with the result's columns aliased `r_`.
pub(crate) const FINISH: &str = concat!("WITH ", finish_ctes!(), " FROM c, r, a");

/// The end of a settlement outside a root, with its charge (`$30`..`$50`, UNIQUE per execution)
/// in the same statement: the completed row, the result's columns aliased `r_` and the
/// charge's `s_`.
pub(crate) const FINISH_WITH_CHARGE: &str = concat!(
    "WITH st AS (INSERT INTO cost_settlements (",
    settlement_columns!(),
    ") VALUES ($30, $31, $32, $33, $34, $35, $36, $37, $38, $39, $40, $41, $42, $43, $44, $45, \
     $46, $47, $48, $49, $50) RETURNING ",
    settlement_columns!(),
    "), ",
    finish_ctes!(),
    ", st.settlement_id AS s_settlement_id, st.execution_id AS s_execution_id, \
     st.scope AS s_scope, st.operation_key AS s_operation_key, st.kind AS s_kind, \
     st.consumer AS s_consumer, st.session_id AS s_session_id, \
     st.accounting_day AS s_accounting_day, st.provider AS s_provider, st.model AS s_model, \
     st.price_version AS s_price_version, st.policy_version AS s_policy_version, \
     st.currency AS s_currency, st.input_tokens AS s_input_tokens, \
     st.output_tokens AS s_output_tokens, st.cache_read_tokens AS s_cache_read_tokens, \
     st.cache_write_tokens AS s_cache_write_tokens, st.reasoning_tokens AS s_reasoning_tokens, \
     st.amount AS s_amount, st.source AS s_source, st.settled_at AS s_settled_at \
     FROM c, r, a, st"
);

/// What [`FINISH`] writes besides the locked rows' keys.
struct Finish<'a> {
    keys: &'a SpendKeys<'a>,
    session: SpendTotals,
    daily: SpendTotals,
    result: &'a ResultRecord,
    done: &'a ExecutionRecord,
    audit: audit::Prepared,
    /// The charge to insert in the same statement (outside a root), or `None` when it was
    /// inserted before.
    charge: Option<&'a SettlementRecord>,
}

/// What a settlement's last statement stored, as committed.
struct Finished {
    done: ExecutionRecord,
    result: ResultRecord,
    charge: Option<SettlementRecord>,
}

/// Runs [`FINISH`] or [`FINISH_WITH_CHARGE`].
async fn finish(conn: &mut PgConnection, f: Finish<'_>) -> StoreResult<Finished> {
    let (result, done, audit) = (f.result, f.done, &f.audit);
    let sql = if f.charge.is_some() {
        FINISH_WITH_CHARGE
    } else {
        FINISH
    };
    let query = sqlx::query(sql)
        .bind(f.keys.scope)
        .bind(f.keys.consumer)
        .bind(f.keys.session)
        .bind(f.keys.currency)
        .bind(f.keys.day)
        .bind(f.session.settled.decimal())
        .bind(f.session.held.decimal())
        .bind(f.daily.settled.decimal())
        .bind(f.daily.held.decimal())
        .bind(done.id.0)
        .bind(result.outcome.as_str())
        .bind(result.stop.as_deref())
        .bind(to_json_text(result.output.as_ref(), "output")?)
        .bind(to_json_text(result.step.as_ref(), "step")?)
        .bind(Json(&result.warnings))
        .bind(result.retention_expires_at)
        .bind(result.erased_at)
        .bind(done.state.as_str())
        .bind(done.outcome.map(|o| o.as_str()))
        .bind(done.hold.decimal())
        .bind(done.provider_ref.as_deref())
        .bind(done.updated_at)
        .bind(audit.chain)
        .bind(audit.seq)
        .bind(&audit.event.kind)
        .bind(Json(&audit.event.detail))
        .bind(audit.event.at)
        .bind(audit.prev.to_hex())
        .bind(audit.hash.to_hex());
    let query = match f.charge {
        Some(charge) => settlements::bind(query, charge)?,
        None => query,
    };
    let row: PgRow = query
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| match f.charge {
            Some(charge) if is_unique_violation(&e, Some(settlements::ONE_PER_EXECUTION)) => {
                settlements::insert_error(e, charge)
            }
            _ => duplicate(e, done),
        })?;
    let stored = ResultRow::joined(&row)
        .store_err()?
        .ok_or_else(|| StoreError::Corrupt("settled without a result".into()))?
        .into_record()?;
    let charge = match f.charge {
        Some(_) => Some(
            SettlementRow::joined(&row)
                .store_err()?
                .ok_or_else(|| StoreError::Corrupt("settled without a charge".into()))?
                .into_record()?,
        ),
        None => None,
    };
    Ok(Finished {
        done: ExecutionRow::from_row(&row).store_err()?.into_record()?,
        result: stored,
        charge,
    })
}

impl PgStores {
    /// The settlement as one transaction: lock the execution, check the fence, take the root lock
    /// (for a call under a root), lock the spend rows, insert the charge (UNIQUE per execution: a
    /// second one is `Duplicate`), move the hold to the settled totals of the spend rows and the
    /// root, store the result after the post-call block checks (spend caps, then the root block
    /// cap on the root's inclusive cost), insert the root receipt (UNIQUE per execution),
    /// complete the journal, audit `settled`, and, for a call admitted under limits, correct its
    /// windows to the settled tokens.
    pub(super) async fn settle_in_transaction(
        &self,
        request: SettleRequest,
    ) -> StoreResult<SettleOutcome> {
        let mut tx = self.begin().await?;
        let chain = AuditChain::of_execution(request.fence.execution_id);
        // The crate's lock order: the execution, its root, the audit head, the spend rows. Outside
        // a root the execution and the head are locked by one statement.
        // The call's own evidence goes in with that statement (H-15): a new inbox row, which
        // nothing waits for.
        let mut request = request;
        let acknowledged_at = rules::own_evidence_acknowledged_at(&request);
        let evidence = request.evidence.take();
        let locked = locks::lock_execution_and_head(
            &mut tx,
            request.fence.execution_id,
            chain,
            evidence.as_ref().map(|e| (e, acknowledged_at)),
        )
        .await?;
        let (record, head, held) = (locked.record, locked.head, locked.limits);
        let named =
            rules::SettledEvidence::named(locked.evidence_id, acknowledged_at, request.evidence_id);
        request.evidence_id = named.id;
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
        // Under a root the charge goes in first (its receipt names it); outside one it goes in
        // with the settlement's last statement.
        let mut settlement = rules::settlement_row(&record, &request);
        if root.is_some() {
            settlement = settlements::insert(&mut tx, &settlement).await?;
        }
        // The spend rows last: held for their write, the result, the completion, the audit row
        // and the commit.
        let keys = SpendKeys::of(&record);
        let (session, daily) = spend::lock(&mut tx, &keys).await?;
        let session = rules::apply_settlement(session, record.hold, request.amount)?;
        let daily = rules::apply_settlement(daily, record.hold, request.amount)?;
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
        let done = rules::completed(&record, &request, result.outcome);
        let audit = audit::prepare(
            rules::settled_event(&done, &settlement, &result, named, record.hold),
            head,
        )?;
        let finished = finish(
            &mut tx,
            Finish {
                keys: &keys,
                session,
                daily,
                result: &result,
                done: &done,
                audit,
                charge: root_receipt.is_none().then_some(&settlement),
            },
        )
        .await?;
        let (done, result) = (finished.done, finished.result);
        let settlement = finished.charge.unwrap_or(settlement);
        // A call admitted under limits: its windows corrected to the settled tokens, after the
        // spend rows (the windows are the last locks).
        if let Some(held) = &held {
            let end = LimitEnd::Settled {
                tokens: LimitTokens::of_usage(&request.usage),
                from_flight: record.state == ExecutionState::Dispatched,
            };
            limits::end(&mut tx, record.scope.as_str(), held, end).await?;
        }
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
