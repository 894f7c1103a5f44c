//! The claim of a call outside an operation root in one round trip (H-17): one call of the
//! `tollgate_claim` function, outside an explicit transaction, so the claim costs one statement
//! and its commit, and its locks (the head of its audit chain, its two spend rows) are held for
//! the function and the commit only. Calls under a root take the multi-statement transaction
//! (`journal.rs`), whose root lock and root cap checks come between the insert and the spend rows.

use crate::error::{db, sqlstate, DbResultExt};
use crate::executions;
use crate::rows::{execution_columns_but_binding, ExecutionRow, SpendRow};
use crate::spend::{self, SpendKeys};
use crate::PgStores;
use rust_decimal::Decimal;
use sqlx::postgres::PgDatabaseError;
use sqlx::types::Json;
use sqlx::FromRow;
use std::str::FromStr;
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
     $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27)"
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
    let detail = match error {
        sqlx::Error::Database(e) => e
            .try_downcast_ref::<PgDatabaseError>()
            .and_then(PgDatabaseError::detail)
            .ok_or_else(bad)?,
        _ => return Err(bad()),
    };
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

impl PgStores {
    /// The claim of `record` (new, outside a root) by `tollgate_claim`: `Claimed`, `Existing`
    /// when the key already has a row, or `Blocked` when a block cap refuses the hold (nothing
    /// written).
    pub(crate) async fn claim_call(
        &self,
        request: &ClaimRequest,
        record: &ExecutionRecord,
    ) -> StoreResult<ClaimOutcome> {
        let chain = AuditChain::of_execution(record.id);
        let audit = claim_audit(record, chain, request);
        let keys = SpendKeys::of(record);
        let currency = rules::currency_of(record);
        let caps = &request.binding.config.caps;
        let mut call = self.call_connection().await?;
        let row = sqlx::query(CLAIM)
            .bind(record.id.0)
            .bind(record.scope.as_str())
            .bind(record.operation_key.as_str())
            .bind(record.kind.as_str())
            .bind(Json(&record.binding))
            .bind(record.binding_digest.to_hex())
            .bind(record.accounting_day)
            .bind(record.state.as_str())
            .bind(record.fence.0)
            .bind(self.lease_now(request.now))
            .bind(i64::try_from(request.lease_ms).unwrap_or(i64::MAX))
            .bind(record.hold.decimal())
            .bind(record.created_at)
            .bind(record.updated_at)
            .bind(i16::try_from(chain.0).map_err(|_| StoreError::Corrupt("audit chain".into()))?)
            .bind(i32::from(AUDIT_CHAINS))
            .bind(&audit.prefix)
            .bind(&audit.mid)
            .bind(&audit.kinds)
            .bind(Json(&audit.details))
            .bind(&audit.ats)
            .bind(&audit.tails)
            .bind(keys.consumer)
            .bind(keys.session)
            .bind(keys.currency)
            .bind(caps.session_block.map(|m| m.decimal()))
            .bind(caps.daily_block.map(|m| m.decimal()))
            .fetch_optional(call.conn()?)
            .await;
        match call.check(row) {
            // The row as inserted, with the binding this claim sent (H-19).
            Ok(Some(row)) => Ok(ClaimOutcome::Claimed(
                ExecutionRow::from_row(&row)
                    .store_err()?
                    .into_record_with(record.binding.clone(), Some(record.binding_digest))?,
            )),
            Ok(None) => {
                let held = (&record.binding, record.binding_digest);
                let existing = executions::view_held(&mut call, request, held)
                    .await?
                    .ok_or_else(|| StoreError::Corrupt("key without row".into()))?;
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
            Err(e) => Err(db(e)),
        }
    }
}
