//! The settlement of a call outside an operation root by the `tollgate_settle` function
//! (`settle.sql`): one statement outside an explicit transaction, so the settlement costs one
//! round trip and one commit (H-18), and decoding its answer.

use super::duplicate;
use crate::batch;
use crate::error::sqlstate;
use crate::error::{is_unique_violation, DbResultExt};
use crate::rows::{
    execution_columns_but_binding, to_json_text, token_columns, ExecutionRow, SpendRow,
};
use crate::settlements;
use crate::PgStores;
use crate::ShardCall;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::PgRecordEncoder;
use sqlx::postgres::{PgArgumentBuffer, PgArguments, PgHasArrayType, PgTypeInfo};
use sqlx::query::Query;
use sqlx::types::Json;
use sqlx::{FromRow, Postgres, Row};
use std::sync::OnceLock;
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::EvidenceId;
use tollgate_core::state::{ExecutionState, Outcome};
use tollgate_store::audit::{audit_time, row_hash_frame};
use tollgate_store::rows::*;
use tollgate_store::rules;
use tollgate_store::{StoreError, StoreResult};

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

/// The statements of batches of settlements, one per batch size, built once so that a batch only
/// binds its calls.
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

/// A settlement as one `tollgate_settle_call` value, its fields in the type's order (a shard
/// batch binds its settlements as one array, H-43).
impl sqlx::Type<Postgres> for SettleCall {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_name("tollgate_settle_call")
    }
}

impl PgHasArrayType for SettleCall {
    fn array_type_info() -> PgTypeInfo {
        PgTypeInfo::array_of("tollgate_settle_call")
    }
}

impl sqlx::Encode<'_, Postgres> for SettleCall {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        PgRecordEncoder::new(buf)
            .encode(self.id)?
            .encode(self.fence)?
            .encode(&self.states)?
            .encode(&self.binding_digest)?
            .encode(self.hold)?
            .encode(self.provider_ref.as_deref())?
            .encode(self.now)?
            .encode(self.evidence_id)?
            .encode(self.evidence_provider_ref.as_deref())?
            .encode(self.evidence_tokens.as_deref())?
            .encode(self.evidence_exact)?
            .encode(self.evidence_source)?
            .encode(self.evidence_at)?
            .encode(self.acknowledged_at)?
            .encode(self.settlement_id)?
            .encode(&self.consumer)?
            .encode(&self.session_id)?
            .encode(&self.provider)?
            .encode(&self.model)?
            .encode(&self.price_version)?
            .encode(&self.policy_version)?
            .encode(&self.currency)?
            .encode(&self.tokens)?
            .encode(self.amount)?
            .encode(self.source)?
            .encode(self.outcome)?
            .encode(self.stop.as_deref())?
            .encode(self.output.as_deref())?
            .encode(self.step.as_deref())?
            .encode(self.retention_expires_at)?
            .encode(self.session_warn)?
            .encode(self.session_block)?
            .encode(self.daily_warn)?
            .encode(self.daily_block)?
            .encode(self.chain)?
            .encode(&self.prefix)?
            .encode(&self.mid)?
            .encode(self.at)?
            .encode(Json(&self.detail))?
            .encode(&self.tail)?
            .encode(Json(&self.blocked_detail))?
            .encode(&self.blocked_tail)?
            .finish();
        Ok(IsNull::No)
    }
}

impl PgStores {
    /// Settlements alone, as the settlement batch (or the single function for one), answered in
    /// order.
    pub(crate) async fn send_settles(
        &self,
        calls: Vec<SettleCall>,
    ) -> (Vec<batch::Answer>, Vec<SettleCall>) {
        self.send_batch(SETTLE, settle_batches(), calls).await
    }

    /// The settlement of a call outside a root by `tollgate_settle`, from the row as the
    /// settler last read it (`seen`); `None` when the function hands it to [`Self::settle_tx`]
    /// (the stored row is no longer that one, or a spend row does not hold the hold): nothing
    /// was written.
    pub(super) async fn settle_call(
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
                seen.hold,
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
                let queue = batches.shard(seen.scope.as_str(), &call.consumer);
                match self.submit_to_shard(queue, ShardCall::Settle(call)).await? {
                    (answer, ShardCall::Settle(call)) => (answer, call),
                    (_, ShardCall::Claim(_)) => {
                        return Err(StoreError::Corrupt(
                            "a settlement given back as another call".into(),
                        ))
                    }
                }
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
        // The completed row, with the binding the settler holds: the function answers the row
        // without it, which spares sending it back (H-19), and checked that the row's digest is
        // that binding's.
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
}
