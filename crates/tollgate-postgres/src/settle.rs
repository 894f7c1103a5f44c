//! Settlement: governed charge, spend, root totals and root receipt (under a root), result,
//! journal completion and audit in one transaction (spec/journal.md, SC-52, ST-6), with the call's
//! own evidence, acknowledged when it is what was charged (H-28); other evidence is left to
//! reconcile usage, which compares it with the durable settlement.

use crate::audit;
use crate::batch;
use crate::error::sqlstate;
use crate::error::{db, is_unique_violation, DbResultExt};
use crate::locks;
use crate::roots;
use crate::rows::{
    execution_columns, execution_columns_but_binding, result_columns, settlement_columns,
    to_json_text, token_columns, ExecutionRow, ResultRow, SettlementRow, SpendRow,
};
use crate::settlements;
use crate::spend::{self, SpendKeys};
use crate::PgStores;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection, Postgres, Row};
use std::sync::OnceLock;
use tollgate_core::caps::CurrencySpend;
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::EvidenceId;
use tollgate_core::state::{ExecutionState, Outcome};
use tollgate_store::audit::{audit_time, row_hash_frame};
use tollgate_store::rows::*;
use tollgate_store::rules;
use tollgate_store::{StoreError, StoreResult};

/// The common end of a settlement (H-13): both spend rows written, the result inserted, the
/// journal completed, the chain's head moved and the `settled` row appended. The spend rows, the
/// execution and the audit head are already locked by the transaction.
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

/// A unique violation while settling means a settlement (or result) already exists.
fn duplicate(error: sqlx::Error, record: &ExecutionRecord) -> StoreError {
    if is_unique_violation(&error, None) {
        StoreError::Duplicate(format!("settlement of {}", record.id))
    } else {
        db(error)
    }
}

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

/// One settlement, as one statement (the function's parameters in order).
const SETTLE: &str = concat!(
    "SELECT ",
    execution_columns_but_binding!(),
    ", session_settled, session_held, day_settled, day_held \
     FROM tollgate_settle($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
     $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, \
     $35, $36, $37, $38, $39, $40, $41, $42)"
);

/// SQLSTATE by which the function hands the settlement to the general transaction.
const GENERAL: &str = "TG002";

/// A settlement's parameters, as the function takes them, owned so that a batch can send them
/// (no `Debug`: they hold the call's output).
pub(crate) struct SettleCall {
    id: uuid::Uuid,
    fence: i64,
    states: Vec<&'static str>,
    binding_digest: String,
    hold: rust_decimal::Decimal,
    provider_ref: Option<String>,
    now: chrono::DateTime<chrono::Utc>,
    evidence_id: Option<uuid::Uuid>,
    evidence_provider_ref: Option<String>,
    evidence_tokens: Option<Vec<i64>>,
    evidence_exact: Option<bool>,
    evidence_source: Option<&'static str>,
    evidence_at: Option<chrono::DateTime<chrono::Utc>>,
    acknowledged_at: Option<chrono::DateTime<chrono::Utc>>,
    settlement_id: uuid::Uuid,
    consumer: String,
    session_id: String,
    provider: String,
    model: String,
    price_version: String,
    policy_version: String,
    currency: String,
    tokens: Vec<i64>,
    amount: rust_decimal::Decimal,
    source: &'static str,
    outcome: &'static str,
    stop: Option<String>,
    output: Option<String>,
    step: Option<String>,
    retention_expires_at: chrono::DateTime<chrono::Utc>,
    session_warn: Option<rust_decimal::Decimal>,
    session_block: Option<rust_decimal::Decimal>,
    daily_warn: Option<rust_decimal::Decimal>,
    daily_block: Option<rust_decimal::Decimal>,
    chain: i16,
    prefix: Vec<u8>,
    mid: Vec<u8>,
    at: chrono::DateTime<chrono::Utc>,
    detail: serde_json::Value,
    tail: Vec<u8>,
    blocked_detail: serde_json::Value,
    blocked_tail: Vec<u8>,
}

/// The types of the settlement function's parameters, in order (`tollgate_settle_call`'s
/// fields).
const SETTLE_TYPES: [&str; 42] = [
    "uuid",
    "bigint",
    "text[]",
    "text",
    "numeric",
    "text",
    "timestamptz",
    "uuid",
    "text",
    "bigint[]",
    "boolean",
    "text",
    "timestamptz",
    "timestamptz",
    "uuid",
    "text",
    "text",
    "text",
    "text",
    "text",
    "text",
    "text",
    "bigint[]",
    "numeric",
    "text",
    "text",
    "text",
    "text",
    "text",
    "timestamptz",
    "numeric",
    "numeric",
    "numeric",
    "numeric",
    "smallint",
    "bytea",
    "bytea",
    "timestamptz",
    "jsonb",
    "bytea",
    "jsonb",
    "bytea",
];

/// The statements of batches of settlements, by size (H-32).
fn settle_batches() -> &'static [String] {
    static STATEMENTS: OnceLock<Vec<String>> = OnceLock::new();
    STATEMENTS.get_or_init(|| {
        batch::statements(
            "tollgate_settle_batch",
            "tollgate_settle_call",
            &SETTLE_TYPES,
            concat!(
                execution_columns_but_binding!(),
                ", session_settled, session_held, day_settled, day_held"
            ),
        )
    })
}

impl batch::Call for SettleCall {
    fn bind<'q>(
        &'q self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        query
            .bind(self.id)
            .bind(self.fence)
            .bind(&self.states)
            .bind(&self.binding_digest)
            .bind(self.hold)
            .bind(self.provider_ref.as_deref())
            .bind(self.now)
            .bind(self.evidence_id)
            .bind(self.evidence_provider_ref.as_deref())
            .bind(self.evidence_tokens.as_deref())
            .bind(self.evidence_exact)
            .bind(self.evidence_source)
            .bind(self.evidence_at)
            .bind(self.acknowledged_at)
            .bind(self.settlement_id)
            .bind(&self.consumer)
            .bind(&self.session_id)
            .bind(&self.provider)
            .bind(&self.model)
            .bind(&self.price_version)
            .bind(&self.policy_version)
            .bind(&self.currency)
            .bind(&self.tokens)
            .bind(self.amount)
            .bind(self.source)
            .bind(self.outcome)
            .bind(self.stop.as_deref())
            .bind(self.output.as_deref())
            .bind(self.step.as_deref())
            .bind(self.retention_expires_at)
            .bind(self.session_warn)
            .bind(self.session_block)
            .bind(self.daily_warn)
            .bind(self.daily_block)
            .bind(self.chain)
            .bind(&self.prefix)
            .bind(&self.mid)
            .bind(self.at)
            .bind(Json(&self.detail))
            .bind(&self.tail)
            .bind(Json(&self.blocked_detail))
            .bind(&self.blocked_tail)
    }
}

impl PgStores {
    /// The settlement of a call outside a root by `tollgate_settle` (H-18), from the row as the
    /// settler last read it (`seen`); `None` when the function hands it to [`Self::settle_tx`]
    /// (the stored row is no longer that one, or a spend row does not hold the hold): nothing
    /// was written.
    async fn settle_call(
        &self,
        request: &SettleRequest,
        seen: &ExecutionRecord,
    ) -> StoreResult<Option<SettleOutcome>> {
        let chain = AuditChain::of_execution(seen.id);
        let settlement = rules::settlement_row(seen, request);
        // The call's own evidence: its id is drawn here, since the audit row names it (H-28).
        let acknowledged_at = rules::own_evidence_acknowledged_at(request);
        let named = rules::SettledEvidence::named(
            request.evidence.as_ref().map(|_| EvidenceId::new()),
            acknowledged_at,
            request.evidence_id,
        );
        // The result before the post-call block check: its content, stop and retention.
        let planned = rules::settled_result(
            seen,
            request,
            SpendTotals::default(),
            SpendTotals::default(),
        )?;
        let settled = |outcome| {
            let done = rules::completed(seen, request, outcome);
            let mut event = rules::settled_event(
                &done,
                &settlement,
                &ResultRecord {
                    outcome,
                    ..planned.clone()
                },
                named,
            );
            event.at = audit_time(event.at);
            let frame = row_hash_frame(chain, &event);
            (event, frame)
        };
        let (event, frame) = settled(request.outcome);
        let (blocked_event, blocked_frame) = settled(Outcome::Blocked);
        let caps = &seen.binding.config.caps;
        let evidence_tokens = match &request.evidence {
            Some(evidence) => Some(token_columns(&evidence.usage)?.to_vec()),
            None => None,
        };
        let call = SettleCall {
            id: seen.id.0,
            fence: request.fence.token.0,
            states: rules::SETTLEABLE
                .iter()
                .map(ExecutionState::as_str)
                .collect(),
            binding_digest: seen.binding_digest.to_hex(),
            hold: seen.hold.decimal(),
            provider_ref: request.provider_ref.clone(),
            now: request.now,
            evidence_id: request.evidence.as_ref().and(named.id).map(|id| id.0),
            evidence_provider_ref: request
                .evidence
                .as_ref()
                .and_then(|e| e.provider_ref.clone()),
            evidence_tokens,
            evidence_exact: request.evidence.as_ref().map(|e| e.exact),
            evidence_source: request.evidence.as_ref().map(|e| e.source.as_str()),
            evidence_at: request.evidence.as_ref().map(|e| e.now),
            acknowledged_at,
            settlement_id: settlement.id.0,
            consumer: settlement.consumer.as_str().to_owned(),
            session_id: settlement.session_id.as_str().to_owned(),
            provider: settlement.provider.clone(),
            model: settlement.model.clone(),
            price_version: settlement.price_version.clone(),
            policy_version: settlement.policy_version.clone(),
            currency: settlement.currency.as_str().to_owned(),
            tokens: token_columns(&settlement.usage)?.to_vec(),
            amount: settlement.amount.decimal(),
            source: settlement.source.as_str(),
            outcome: request.outcome.as_str(),
            stop: planned.stop.clone(),
            output: to_json_text(planned.output.as_ref(), "output")?,
            step: to_json_text(planned.step.as_ref(), "step")?,
            retention_expires_at: planned.retention_expires_at,
            session_warn: caps.session_warn.map(|m| m.decimal()),
            session_block: caps.session_block.map(|m| m.decimal()),
            daily_warn: caps.daily_warn.map(|m| m.decimal()),
            daily_block: caps.daily_block.map(|m| m.decimal()),
            chain: i16::try_from(chain.0).map_err(|_| StoreError::Corrupt("audit chain".into()))?,
            prefix: frame.prefix,
            mid: frame.mid,
            at: event.at,
            detail: event.detail,
            tail: frame.tail,
            blocked_detail: blocked_event.detail,
            blocked_tail: blocked_frame.tail,
        };
        let answer = match &self.batches {
            Some(batches) => {
                let stores = self.clone();
                let queue = batches.settles(seen.scope.as_str(), &call.consumer);
                queue
                    .submit(call, move |calls| {
                        let stores = stores.clone();
                        async move { stores.send_batch(SETTLE, settle_batches(), calls).await }
                    })
                    .await?
            }
            None => {
                let answer = self.send_alone(SETTLE, &call).await;
                (answer, call)
            }
        };
        let (answer, call) = answer;
        let row = match answer.single()? {
            Some(row) => row,
            // Left out of its batch: nothing of it was written; it goes alone.
            None => self
                .send_alone(SETTLE, &call)
                .await
                .single()?
                .ok_or_else(|| StoreError::Corrupt("a settlement alone left out".into()))?,
        };
        let row = match row {
            Ok(Some(row)) => row,
            Ok(None) => return Err(StoreError::Corrupt("settled without a row".into())),
            Err(e) if sqlstate(&e).as_deref() == Some(GENERAL) => return Ok(None),
            Err(e) if is_unique_violation(&e, Some(settlements::ONE_PER_EXECUTION)) => {
                return Err(settlements::insert_error(e, &settlement))
            }
            Err(e) => return Err(duplicate(e, seen)),
        };
        // The completed row, with the binding the settler holds: the function checked that the
        // row's digest is that binding's (H-19).
        let record = ExecutionRow::from_row(&row)
            .store_err()?
            .into_record_with(seen.binding.clone(), Some(seen.binding_digest))?;
        let totals = |settled: &str, held: &str| -> StoreResult<SpendTotals> {
            SpendRow::totals(
                row.try_get(settled).store_err()?,
                row.try_get(held).store_err()?,
            )
        };
        let session = totals("session_settled", "session_held")?;
        let daily = totals("day_settled", "day_held")?;
        // The same rules, on the totals the function settled against, give the stored result.
        let result = rules::settled_result(seen, request, session, daily)?;
        if record.outcome != Some(result.outcome) {
            return Err(StoreError::Corrupt(
                "the stored outcome differs from the post-call caps' verdict".into(),
            ));
        }
        Ok(Some(SettleOutcome {
            record,
            settlement,
            result,
            session,
            daily,
            root_receipt: None,
        }))
    }

    /// [`ExecutionStore::settle`](tollgate_store::ExecutionStore::settle) as one transaction:
    /// lock the execution, check the fence, take the root lock (for a call under a root), lock
    /// the spend rows, insert the charge (UNIQUE per execution: a second one is `Duplicate`),
    /// move the hold to the settled totals of the spend rows and the root, store the result
    /// after the post-call block checks (spend caps, then the root block cap on the root's
    /// inclusive cost), insert the root receipt (UNIQUE per execution), complete the journal,
    /// audit `settled`.
    pub(crate) async fn settle_tx(&self, request: SettleRequest) -> StoreResult<SettleOutcome> {
        if let Some(seen) = request.seen.as_deref().filter(|s| s.root_key.is_none()) {
            if let Some(outcome) = self.settle_call(&request, seen).await? {
                return Ok(outcome);
            }
        }
        let mut tx = self.pool().begin().await.store_err()?;
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
        let (record, head) = (locked.record, locked.head);
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
            rules::settled_event(&done, &settlement, &result, named),
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
