//! The claim of a new key outside an operation root by the `tollgate_claim` function
//! (`claim.sql`), and decoding its answer. The function is called outside an explicit
//! transaction, so the claim costs one statement and its commit, and its locks (the head of its
//! audit chain, its two spend rows) are held for the function and the commit only (H-17).

use crate::batch;
use crate::configs;
use crate::error::{db, sqlstate, DbResultExt};
use crate::executions;
use crate::limits;
use crate::rows::{execution_columns_but_binding, ExecutionRow, SpendRow};
use crate::spend::{self, SpendKeys};
use crate::PgStores;
use crate::ShardCall;
use rust_decimal::Decimal;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::PgRecordEncoder;
use sqlx::postgres::{PgArgumentBuffer, PgArguments, PgHasArrayType, PgTypeInfo};
use sqlx::query::Query;
use sqlx::types::Json;
use sqlx::{FromRow, Postgres};
use std::str::FromStr;
use std::sync::OnceLock;
use tollgate_core::caps::SpendTotals;
use tollgate_store::audit::{audit_time, row_hash_frame};
use tollgate_store::rows::*;
use tollgate_store::rules;
use tollgate_store::{StoreError, StoreResult};

/// One claim, as one statement (the function's parameters in order).
pub(crate) const CLAIM: &str = concat!(
    "SELECT ",
    execution_columns_but_binding!(),
    " FROM tollgate_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
     $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31)"
);

/// SQLSTATE of the function's cap refusal; its detail is the totals before the hold.
const CAP_REFUSED: &str = "TG001";

/// The audit rows of a claim, as the function takes them: kinds, details (one JSON array), times,
/// and each row's hash input around its seq and previous hash.
struct ClaimAudit {
    kinds: Vec<String>,
    details: serde_json::Value,
    ats: Vec<chrono::DateTime<chrono::Utc>>,
    prefix: Vec<u8>,
    mid: Vec<u8>,
    tails: Vec<Vec<u8>>,
}

fn claim_audit(record: &ExecutionRecord, chain: AuditChain, request: &ClaimRequest) -> ClaimAudit {
    let mut audit = ClaimAudit {
        kinds: Vec::new(),
        details: serde_json::Value::Array(Vec::new()),
        ats: Vec::new(),
        prefix: Vec::new(),
        mid: Vec::new(),
        tails: Vec::new(),
    };
    let mut details = Vec::new();
    for mut event in rules::claim_events(record, request.now) {
        event.at = audit_time(event.at);
        let frame = row_hash_frame(chain, &event);
        audit.prefix = frame.prefix;
        audit.mid = frame.mid;
        audit.tails.push(frame.tail);
        audit.kinds.push(event.kind);
        audit.ats.push(event.at);
        details.push(event.detail);
    }
    audit.details = serde_json::Value::Array(details);
    audit
}

/// The totals before the hold, from the refusal's detail
/// (`session_settled session_held day_settled day_held`).
fn refused_totals(error: &sqlx::Error) -> StoreResult<(SpendTotals, SpendTotals)> {
    let bad = || StoreError::Corrupt("cap refusal without totals".into());
    let detail = crate::error::detail(error).ok_or_else(bad)?;
    let numbers = detail
        .split(' ')
        .map(Decimal::from_str)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad())?;
    let [session_settled, session_held, day_settled, day_held] = numbers[..] else {
        return Err(bad());
    };
    Ok((
        SpendRow::totals(session_settled, session_held)?,
        SpendRow::totals(day_settled, day_held)?,
    ))
}

/// A claim's parameters, as the function takes them, owned so that a batch can send them (no
/// `Debug`: they hold the binding).
pub(crate) struct ClaimCall {
    id: uuid::Uuid,
    scope: String,
    operation_key: String,
    kind: &'static str,
    /// The binding without its config, which `config_digest` names (H-40).
    binding: Json<configs::BindingRest>,
    binding_digest: String,
    accounting_day: chrono::NaiveDate,
    state: &'static str,
    fence: i64,
    lease_now: Option<chrono::DateTime<chrono::Utc>>,
    lease_ms: i64,
    hold: Decimal,
    created_at: chrono::DateTime<chrono::Utc>,
    updated_at: chrono::DateTime<chrono::Utc>,
    chain: i16,
    chains: i32,
    audit: ClaimAudit,
    consumer: String,
    session: String,
    currency: String,
    session_block: Option<Decimal>,
    daily_block: Option<Decimal>,
    /// The limits the claim is admitted under (`None`: none).
    limits: Option<limits::ClaimLimitArgs>,
    /// The SHA-256 of the binding's config as stored in `binding_configs` (H-40).
    config_digest: String,
}

/// The types of the claim function's parameters, in order (`tollgate_claim_call`'s fields).
const CLAIM_TYPES: [&str; 31] = [
    "uuid",
    "text",
    "text",
    "text",
    "jsonb",
    "text",
    "date",
    "text",
    "bigint",
    "timestamptz",
    "bigint",
    "numeric",
    "timestamptz",
    "timestamptz",
    "smallint",
    "integer",
    "bytea",
    "bytea",
    "text[]",
    "jsonb",
    "timestamptz[]",
    "bytea[]",
    "text",
    "text",
    "text",
    "numeric",
    "numeric",
    "text[]",
    "bigint[]",
    "bigint[]",
    "text",
];

/// The statements of batches of claims, one per batch size, built once so that a batch only binds
/// its calls.
fn claim_batches() -> &'static [String] {
    static STATEMENTS: OnceLock<Vec<String>> = OnceLock::new();
    STATEMENTS.get_or_init(|| {
        batch::statements(
            "tollgate_claim_batch",
            "tollgate_claim_call",
            &CLAIM_TYPES,
            execution_columns_but_binding!(),
        )
    })
}

impl batch::Call for ClaimCall {
    fn bind<'q>(
        &'q self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        let (subjects, values, tokens) = limits::ClaimLimitArgs::binds(self.limits.as_ref());
        query
            .bind(self.id)
            .bind(&self.scope)
            .bind(&self.operation_key)
            .bind(self.kind)
            .bind(&self.binding)
            .bind(&self.binding_digest)
            .bind(self.accounting_day)
            .bind(self.state)
            .bind(self.fence)
            .bind(self.lease_now)
            .bind(self.lease_ms)
            .bind(self.hold)
            .bind(self.created_at)
            .bind(self.updated_at)
            .bind(self.chain)
            .bind(self.chains)
            .bind(&self.audit.prefix)
            .bind(&self.audit.mid)
            .bind(&self.audit.kinds)
            .bind(Json(&self.audit.details))
            .bind(&self.audit.ats)
            .bind(&self.audit.tails)
            .bind(&self.consumer)
            .bind(&self.session)
            .bind(&self.currency)
            .bind(self.session_block)
            .bind(self.daily_block)
            .bind(subjects)
            .bind(values)
            .bind(tokens)
            .bind(&self.config_digest)
    }
}

/// A claim as one `tollgate_claim_call` value, its fields in the type's order (a shard batch binds
/// its claims as one array, H-43).
impl sqlx::Type<Postgres> for ClaimCall {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_name("tollgate_claim_call")
    }
}

impl PgHasArrayType for ClaimCall {
    fn array_type_info() -> PgTypeInfo {
        PgTypeInfo::array_of("tollgate_claim_call")
    }
}

impl sqlx::Encode<'_, Postgres> for ClaimCall {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        let (subjects, values, tokens) = limits::ClaimLimitArgs::binds(self.limits.as_ref());
        PgRecordEncoder::new(buf)
            .encode(self.id)?
            .encode(&self.scope)?
            .encode(&self.operation_key)?
            .encode(self.kind)?
            .encode(&self.binding)?
            .encode(&self.binding_digest)?
            .encode(self.accounting_day)?
            .encode(self.state)?
            .encode(self.fence)?
            .encode(self.lease_now)?
            .encode(self.lease_ms)?
            .encode(self.hold)?
            .encode(self.created_at)?
            .encode(self.updated_at)?
            .encode(self.chain)?
            .encode(self.chains)?
            .encode(&self.audit.prefix)?
            .encode(&self.audit.mid)?
            .encode(&self.audit.kinds)?
            .encode(Json(&self.audit.details))?
            .encode(&self.audit.ats)?
            .encode(&self.audit.tails)?
            .encode(&self.consumer)?
            .encode(&self.session)?
            .encode(&self.currency)?
            .encode(self.session_block)?
            .encode(self.daily_block)?
            .encode(subjects)?
            .encode(values)?
            .encode(tokens)?
            .encode(&self.config_digest)?
            .finish();
        Ok(IsNull::No)
    }
}

impl PgStores {
    /// Claims alone, as the claim batch (or the single function for one), answered in order.
    pub(crate) async fn send_claims(
        &self,
        calls: Vec<ClaimCall>,
    ) -> (Vec<batch::Answer>, Vec<ClaimCall>) {
        self.send_batch(CLAIM, claim_batches(), calls).await
    }

    /// The claim of `record` (new, outside a root) by `tollgate_claim`: `Claimed`, `Existing`
    /// when the key already has a row, `Blocked` when a block cap refuses the hold, or `Limited`
    /// when a rate or concurrency limit refuses the call (nothing written either way). With batches, claims that arrive together share one statement and one commit.
    pub(super) async fn claim_call(
        &self,
        request: &ClaimRequest,
        record: &ExecutionRecord,
    ) -> StoreResult<ClaimOutcome> {
        let chain = AuditChain::of_execution(record.id);
        let keys = SpendKeys::of(record);
        let currency = rules::currency_of(record);
        let caps = &request.binding.config.caps;
        let configs::SplitBinding {
            rest,
            config,
            digest,
        } = self.config_texts.split(&record.binding)?;
        self.store_config(&digest, &config, false).await?;
        let call = ClaimCall {
            id: record.id.0,
            scope: record.scope.as_str().to_owned(),
            operation_key: record.operation_key.as_str().to_owned(),
            kind: record.kind.as_str(),
            binding: Json(rest),
            binding_digest: record.binding_digest.to_hex(),
            accounting_day: record.accounting_day,
            state: record.state.as_str(),
            fence: record.fence.0,
            lease_now: self.lease_now(request.now),
            lease_ms: i64::try_from(request.lease_ms).unwrap_or(i64::MAX),
            hold: record.hold.decimal(),
            created_at: record.created_at,
            updated_at: record.updated_at,
            chain: i16::try_from(chain.0).map_err(|_| StoreError::Corrupt("audit chain".into()))?,
            chains: i32::from(AUDIT_CHAINS),
            audit: claim_audit(record, chain, request),
            consumer: keys.consumer.to_owned(),
            session: keys.session.to_owned(),
            currency: keys.currency.to_owned(),
            session_block: caps.session_block.map(|m| m.decimal()),
            daily_block: caps.daily_block.map(|m| m.decimal()),
            limits: limits::ClaimLimitArgs::of(&request.limits),
            config_digest: digest,
        };
        let (answer, call) = match &self.batches {
            Some(batches) => {
                let queue = batches.shard(&call.scope, &call.consumer);
                match self.submit_to_shard(queue, ShardCall::Claim(call)).await? {
                    (answer, ShardCall::Claim(call)) => (answer, call),
                    (_, ShardCall::Settle(_)) => {
                        return Err(StoreError::Corrupt(
                            "a claim given back as another call".into(),
                        ))
                    }
                }
            }
            None => (self.send_alone(CLAIM, &call).await, call),
        };
        // A statement that lost its connection (a terminated backend, a restarted server, a
        // stale pooled connection) is sent once more, alone, on a fresh connection. That is safe
        // for a claim: if the first one committed, the second finds the row it inserted, by its
        // execution id (below), and claims nothing twice.
        let answer = if answer.lost_its_connection() {
            self.send_alone(CLAIM, &call).await
        } else {
            answer
        };
        let row = match answer.single()? {
            Some(row) => row,
            // Left out of its batch: nothing of it was written; it goes alone.
            None => self
                .send_alone(CLAIM, &call)
                .await
                .single()?
                .ok_or_else(|| StoreError::Corrupt("a claim alone left out".into()))?,
        };
        let row = match row {
            // The config is not stored (a restore or a failover lost its commit, which these
            // stores remembered): nothing was written; it is stored again and the claim sent
            // again, alone.
            Err(e) if sqlstate(&e).as_deref() == Some(configs::CONFIG_MISSING) => {
                self.store_config(&call.config_digest, &config, true)
                    .await?;
                self.send_alone(CLAIM, &call)
                    .await
                    .single()?
                    .ok_or_else(|| StoreError::Corrupt("a claim alone left out".into()))?
            }
            row => row,
        };
        match row {
            // The row as inserted, with the binding this claim holds: the function answers the
            // row without it, which spares sending it back (H-19).
            Ok(Some(row)) => Ok(ClaimOutcome::Claimed(
                ExecutionRow::from_row(&row)
                    .store_err()?
                    .into_record_with(record.binding.clone(), Some(record.binding_digest))?,
            )),
            Ok(None) => {
                let held = (&record.binding, record.binding_digest);
                let existing = executions::view_held(self, request, held)
                    .await?
                    .ok_or_else(|| StoreError::Corrupt("key without row".into()))?;
                // The row this claim's own earlier attempt inserted (its answer was lost with
                // its connection): the claim is this one's.
                if existing.execution.id.0 == call.id {
                    return Ok(ClaimOutcome::Claimed(existing.execution));
                }
                Ok(ClaimOutcome::Existing(Box::new(existing)))
            }
            Err(e) if sqlstate(&e).as_deref() == Some(CAP_REFUSED) => {
                let (session, daily) = refused_totals(&e)?;
                match spend::admit(caps, currency, session, daily, request.hold)? {
                    Err(blocked) => Ok(ClaimOutcome::Blocked(blocked)),
                    Ok(()) => Err(StoreError::Corrupt(
                        "the database refused a hold the caps admit".into(),
                    )),
                }
            }
            // Nothing was written: the caps admitted the hold, a limit refused the call.
            Err(e) if sqlstate(&e).as_deref() == Some(limits::LIMITED) => {
                Ok(ClaimOutcome::Limited(limits::refused(&e)?))
            }
            Err(e) => Err(db(e)),
        }
    }
}
