//! Row ↔ record conversion. Every decoding problem is [`StoreError::Corrupt`] naming the
//! field, never its value.
//!
//! [`StoreError::Corrupt`]: tollgate_store::StoreError::Corrupt

use crate::error::{corrupt, unstorable};
use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::de::DeserializeOwned;
use std::str::FromStr;
use tollgate_core::caps::SpendTotals;
use tollgate_core::digest::Digest256;
use tollgate_core::ids::*;
use tollgate_core::money::{Currency, Money};
use tollgate_core::usage::Usage;
use tollgate_store::rows::*;
use tollgate_store::StoreResult;
use uuid::Uuid;

/// Columns of `executions` as written, in [`ExecutionRow`] order.
macro_rules! execution_insert_columns {
    () => {
        "id, scope, operation_key, kind, root_key, binding, binding_digest, accounting_day, \
         state, not_dispatched_cause, outcome, fence, lease_expires_at, hold, provider_ref, \
         created_at, updated_at, reconciliation_reason"
    };
}
pub(crate) use execution_insert_columns;

/// An execution's `binding` as read, the columns qualified by `$t` (the table's name or alias):
/// whole, its config joined back from `binding_configs` for a row that names it by digest (H-40).
macro_rules! stored_binding {
    ($t:literal) => {
        concat!(
            "CASE WHEN ",
            $t,
            ".config_digest IS NULL THEN ",
            $t,
            ".binding ELSE ",
            $t,
            ".binding || jsonb_build_object('config', (SELECT bc.config FROM binding_configs bc \
             WHERE bc.digest = ",
            $t,
            ".config_digest)) END"
        )
    };
}
pub(crate) use stored_binding;

/// Columns of `executions` as read from the table unaliased (a `SELECT`, or the `RETURNING` of
/// an `INSERT` or `UPDATE`), in [`ExecutionRow`] order, the binding whole.
macro_rules! execution_columns {
    () => {
        concat!(
            "id, scope, operation_key, kind, root_key, ",
            crate::rows::stored_binding!("executions"),
            " AS binding, binding_digest, accounting_day, \
             state, not_dispatched_cause, outcome, fence, lease_expires_at, hold, provider_ref, \
             created_at, updated_at, reconciliation_reason"
        )
    };
}
pub(crate) use execution_columns;

/// [`execution_columns`] without `binding`, for a statement whose caller holds the binding.
macro_rules! execution_columns_but_binding {
    () => {
        "id, scope, operation_key, kind, root_key, binding_digest, accounting_day, \
         state, not_dispatched_cause, outcome, fence, lease_expires_at, hold, provider_ref, \
         created_at, updated_at, reconciliation_reason"
    };
}
pub(crate) use execution_columns_but_binding;

/// What a call admitted under limits counted, kept on its row for its end (all `NULL` for a call
/// under none; read by `limits::limits_of`).
macro_rules! limit_columns {
    () => {
        "limit_subjects, limit_input_tokens, limit_output_tokens, limit_admitted_at"
    };
}
pub(crate) use limit_columns;

/// Columns of `execution_results`, content as JSON text.
macro_rules! result_columns {
    () => {
        "execution_id, outcome, stop, output::text AS output, step::text AS step, warnings, \
         retention_expires_at, erased_at"
    };
}
pub(crate) use result_columns;

/// Columns of `usage_inbox`.
macro_rules! evidence_columns {
    () => {
        "id, seq, scope, execution_id, operation_key, provider_ref, input_tokens, \
         output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, exact, source, \
         received_at, acknowledged_at"
    };
}
pub(crate) use evidence_columns;

/// Columns of `cost_settlements` (without the internal `seq`).
macro_rules! settlement_columns {
    () => {
        "settlement_id, execution_id, scope, operation_key, kind, consumer, session_id, \
         accounting_day, provider, model, price_version, policy_version, currency, input_tokens, \
         output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, amount, source, \
         settled_at"
    };
}
pub(crate) use settlement_columns;

/// Columns of `audit_log`.
macro_rules! audit_columns {
    () => {
        "scope, chain, seq, execution_id, kind, detail, at, prev_hash, hash"
    };
}
pub(crate) use audit_columns;

/// Columns of `roots`, in [`RootRow`] order.
macro_rules! root_columns {
    () => {
        "id, scope, root_key, binding, binding_digest, deadline, state, reserved_calls, \
         charged, held, created_at, updated_at"
    };
}
pub(crate) use root_columns;

/// Columns of `api_keys`, in [`ApiKeyRow`] order.
macro_rules! api_key_columns {
    () => {
        "sha256, scope, role, created_at, expires_at, revoked_at, last_used_at, limits"
    };
}
pub(crate) use api_key_columns;

/// Columns of `root_receipts`.
macro_rules! receipt_columns {
    () => {
        "root_id, execution_id, amount, currency, created_at"
    };
}
pub(crate) use receipt_columns;

fn parse<T: FromStr>(text: &str, field: &str) -> StoreResult<T> {
    text.parse().map_err(|_| corrupt(field))
}

fn id<T, E>(
    text: String,
    field: &str,
    make: impl FnOnce(String) -> Result<T, E>,
) -> StoreResult<T> {
    make(text).map_err(|_| corrupt(field))
}

fn json<T: DeserializeOwned>(value: serde_json::Value, field: &str) -> StoreResult<T> {
    serde_json::from_value(value).map_err(|_| corrupt(field))
}

fn json_text<T: DeserializeOwned>(text: Option<String>, field: &str) -> StoreResult<Option<T>> {
    text.map(|t| serde_json::from_str(&t).map_err(|_| corrupt(field)))
        .transpose()
}

/// Serializes content for a `json` column (kept as written).
pub(crate) fn to_json_text<T: serde::Serialize>(
    value: Option<&T>,
    field: &str,
) -> StoreResult<Option<String>> {
    value
        .map(|v| serde_json::to_string(v).map_err(|_| unstorable(field)))
        .transpose()
}

/// A stored amount, normalized like every [`Money`].
pub(crate) fn money(value: Decimal, field: &'static str) -> StoreResult<Money> {
    Money::new(value, field).map_err(|_| corrupt(field))
}

/// Token counts as `bigint`s: input, output, cache read, cache write, reasoning.
pub(crate) fn token_columns(usage: &Usage) -> StoreResult<[i64; 5]> {
    let one = |n: u64| i64::try_from(n).map_err(|_| unstorable("token count"));
    Ok([
        one(usage.input)?,
        one(usage.output)?,
        one(usage.cache_read)?,
        one(usage.cache_write)?,
        one(usage.reasoning)?,
    ])
}

fn usage(columns: [i64; 5]) -> StoreResult<Usage> {
    let one = |n: i64| u64::try_from(n).map_err(|_| corrupt("token count"));
    Ok(Usage {
        input: one(columns[0])?,
        output: one(columns[1])?,
        cache_read: one(columns[2])?,
        cache_write: one(columns[3])?,
        reasoning: one(columns[4])?,
    })
}

/// A row of `executions`.
#[derive(sqlx::FromRow)]
pub(crate) struct ExecutionRow {
    id: Uuid,
    scope: String,
    operation_key: String,
    kind: String,
    root_key: Option<String>,
    /// Absent when the statement leaves it out ([`execution_columns_but_binding`]): the caller
    /// holds the binding (the row's digest vouches for it) and passes it to
    /// [`ExecutionRow::into_record_with`].
    #[sqlx(default)]
    binding: Option<serde_json::Value>,
    binding_digest: String,
    accounting_day: NaiveDate,
    state: String,
    not_dispatched_cause: Option<String>,
    outcome: Option<String>,
    fence: i64,
    lease_expires_at: DateTime<Utc>,
    hold: Decimal,
    provider_ref: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    reconciliation_reason: Option<String>,
}

impl ExecutionRow {
    /// Whether the statement read the binding (see [`ExecutionRow::into_record_with`]).
    pub(crate) fn has_binding(&self) -> bool {
        self.binding.is_some()
    }

    /// The record.
    pub(crate) fn into_record(mut self) -> StoreResult<ExecutionRecord> {
        let binding = json(
            self.binding.take().ok_or_else(|| corrupt("binding"))?,
            "binding",
        )?;
        self.into_record_with(binding, None)
    }

    /// The record, with `binding` for a row read without its binding (a statement that answers
    /// the row leaves the binding out, since the caller holds it, H-19): the caller's binding,
    /// whose digest (`digest`, when given) must be the row's.
    pub(crate) fn into_record_with(
        self,
        binding: tollgate_core::digest::Binding,
        digest: Option<Digest256>,
    ) -> StoreResult<ExecutionRecord> {
        if digest.is_some_and(|d| Some(d) != Digest256::from_hex(&self.binding_digest).ok()) {
            return Err(corrupt("binding_digest"));
        }
        Ok(ExecutionRecord {
            id: ExecutionId(self.id),
            scope: id(self.scope, "scope", Scope::from_stored)?,
            operation_key: id(
                self.operation_key,
                "operation_key",
                OperationKey::from_stored,
            )?,
            kind: parse(&self.kind, "kind")?,
            root_key: self
                .root_key
                .map(|k| id(k, "root_key", RootKey::from_stored))
                .transpose()?,
            binding,
            binding_digest: Digest256::from_hex(&self.binding_digest)
                .map_err(|_| corrupt("binding_digest"))?,
            accounting_day: self.accounting_day,
            state: parse(&self.state, "state")?,
            not_dispatched_cause: self
                .not_dispatched_cause
                .map(|c| parse(&c, "not_dispatched_cause"))
                .transpose()?,
            reconciliation_reason: self
                .reconciliation_reason
                .map(|r| parse(&r, "reconciliation_reason"))
                .transpose()?,
            outcome: self.outcome.map(|o| parse(&o, "outcome")).transpose()?,
            fence: FenceToken(self.fence),
            lease_expires_at: self.lease_expires_at,
            hold: money(self.hold, "hold")?,
            provider_ref: self.provider_ref,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// A row of `execution_results`.
#[derive(sqlx::FromRow)]
pub(crate) struct ResultRow {
    execution_id: Uuid,
    outcome: String,
    stop: Option<String>,
    output: Option<String>,
    step: Option<String>,
    warnings: serde_json::Value,
    retention_expires_at: DateTime<Utc>,
    erased_at: Option<DateTime<Utc>>,
}

impl ResultRow {
    /// The record.
    pub(crate) fn into_record(self) -> StoreResult<ResultRecord> {
        Ok(ResultRecord {
            execution_id: ExecutionId(self.execution_id),
            outcome: parse(&self.outcome, "outcome")?,
            stop: self.stop,
            output: json_text(self.output, "output")?,
            step: json_text(self.step, "step")?,
            warnings: json(self.warnings, "warnings")?,
            retention_expires_at: self.retention_expires_at,
            erased_at: self.erased_at,
        })
    }
}

/// A row of `usage_inbox`.
#[derive(sqlx::FromRow)]
pub(crate) struct EvidenceRow {
    id: Uuid,
    seq: i64,
    scope: String,
    execution_id: Uuid,
    operation_key: String,
    provider_ref: Option<String>,
    input_tokens: i64,
    output_tokens: i64,
    cache_read_tokens: i64,
    cache_write_tokens: i64,
    reasoning_tokens: i64,
    exact: bool,
    source: String,
    received_at: DateTime<Utc>,
    acknowledged_at: Option<DateTime<Utc>>,
}

impl EvidenceRow {
    /// The record.
    pub(crate) fn into_record(self) -> StoreResult<Evidence> {
        Ok(Evidence {
            id: EvidenceId(self.id),
            seq: self.seq,
            scope: id(self.scope, "scope", Scope::from_stored)?,
            execution_id: ExecutionId(self.execution_id),
            operation_key: id(
                self.operation_key,
                "operation_key",
                OperationKey::from_stored,
            )?,
            provider_ref: self.provider_ref,
            usage: usage([
                self.input_tokens,
                self.output_tokens,
                self.cache_read_tokens,
                self.cache_write_tokens,
                self.reasoning_tokens,
            ])?,
            exact: self.exact,
            // The enum's own serde names, so the wire names cannot drift.
            source: json(serde_json::Value::String(self.source), "source")?,
            received_at: self.received_at,
            acknowledged_at: self.acknowledged_at,
        })
    }
}

/// A row of `cost_settlements`.
#[derive(sqlx::FromRow)]
pub(crate) struct SettlementRow {
    settlement_id: Uuid,
    execution_id: Uuid,
    scope: String,
    operation_key: String,
    kind: String,
    consumer: String,
    session_id: String,
    accounting_day: NaiveDate,
    provider: String,
    model: String,
    price_version: String,
    policy_version: String,
    currency: String,
    input_tokens: i64,
    output_tokens: i64,
    cache_read_tokens: i64,
    cache_write_tokens: i64,
    reasoning_tokens: i64,
    amount: Decimal,
    source: String,
    settled_at: DateTime<Utc>,
}

impl SettlementRow {
    /// The record.
    pub(crate) fn into_record(self) -> StoreResult<SettlementRecord> {
        Ok(SettlementRecord {
            id: SettlementId(self.settlement_id),
            execution_id: ExecutionId(self.execution_id),
            scope: id(self.scope, "scope", Scope::from_stored)?,
            operation_key: id(
                self.operation_key,
                "operation_key",
                OperationKey::from_stored,
            )?,
            kind: parse(&self.kind, "kind")?,
            consumer: id(self.consumer, "consumer", ConsumerId::from_stored)?,
            session_id: id(self.session_id, "session_id", SessionId::from_stored)?,
            accounting_day: self.accounting_day,
            provider: self.provider,
            model: self.model,
            price_version: self.price_version,
            policy_version: self.policy_version,
            currency: Currency::parse(&self.currency).map_err(|_| corrupt("currency"))?,
            usage: usage([
                self.input_tokens,
                self.output_tokens,
                self.cache_read_tokens,
                self.cache_write_tokens,
                self.reasoning_tokens,
            ])?,
            amount: money(self.amount, "amount")?,
            source: parse(&self.source, "source")?,
            settled_at: self.settled_at,
        })
    }
}

/// A row of `audit_log`.
#[derive(sqlx::FromRow)]
pub(crate) struct AuditDbRow {
    scope: String,
    chain: i16,
    seq: i64,
    execution_id: Option<Uuid>,
    kind: String,
    detail: serde_json::Value,
    at: DateTime<Utc>,
    prev_hash: String,
    hash: String,
}

impl AuditDbRow {
    /// The record.
    pub(crate) fn into_record(self) -> StoreResult<AuditRow> {
        Ok(AuditRow {
            chain: AuditChain(u16::try_from(self.chain).map_err(|_| corrupt("chain"))?),
            seq: self.seq,
            event: AuditEvent {
                scope: id(self.scope, "scope", Scope::from_stored)?,
                execution_id: self.execution_id.map(ExecutionId),
                kind: self.kind,
                detail: self.detail,
                at: self.at,
            },
            prev_hash: Digest256::from_hex(&self.prev_hash).map_err(|_| corrupt("prev_hash"))?,
            hash: Digest256::from_hex(&self.hash).map_err(|_| corrupt("hash"))?,
        })
    }
}

/// A row of `spend_sessions` / `spend_days`.
#[derive(sqlx::FromRow)]
pub(crate) struct SpendRow {
    settled: Decimal,
    held: Decimal,
}

impl SpendRow {
    /// The totals of a `settled` and a `held` column read without this struct.
    pub(crate) fn totals(settled: Decimal, held: Decimal) -> StoreResult<SpendTotals> {
        Self { settled, held }.into_totals()
    }

    /// The totals.
    pub(crate) fn into_totals(self) -> StoreResult<SpendTotals> {
        Ok(SpendTotals {
            settled: money(self.settled, "settled")?,
            held: money(self.held, "held")?,
        })
    }
}

/// A row of `roots`.
#[derive(sqlx::FromRow)]
pub(crate) struct RootRow {
    id: Uuid,
    scope: String,
    root_key: String,
    binding: serde_json::Value,
    binding_digest: String,
    deadline: DateTime<Utc>,
    state: String,
    reserved_calls: i64,
    charged: Decimal,
    held: Decimal,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl RootRow {
    /// The record.
    pub(crate) fn into_record(self) -> StoreResult<RootRecord> {
        Ok(RootRecord {
            id: RootId(self.id),
            scope: id(self.scope, "scope", Scope::from_stored)?,
            root_key: id(self.root_key, "root_key", RootKey::from_stored)?,
            binding: json(self.binding, "binding")?,
            binding_digest: Digest256::from_hex(&self.binding_digest)
                .map_err(|_| corrupt("binding_digest"))?,
            deadline: self.deadline,
            state: parse(&self.state, "root state")?,
            reserved_calls: self.reserved_calls,
            charged: money(self.charged, "charged")?,
            held: money(self.held, "held")?,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// A row of `root_receipts`.
#[derive(sqlx::FromRow)]
pub(crate) struct ReceiptRow {
    root_id: Uuid,
    execution_id: Uuid,
    amount: Decimal,
    currency: String,
    created_at: DateTime<Utc>,
}

impl ReceiptRow {
    /// The record.
    pub(crate) fn into_record(self) -> StoreResult<RootReceipt> {
        Ok(RootReceipt {
            root_id: RootId(self.root_id),
            execution_id: ExecutionId(self.execution_id),
            amount: money(self.amount, "amount")?,
            currency: Currency::parse(&self.currency).map_err(|_| corrupt("currency"))?,
            created_at: self.created_at,
        })
    }
}

/// A row of `api_keys`.
#[derive(sqlx::FromRow)]
pub(crate) struct ApiKeyRow {
    sha256: String,
    scope: String,
    role: String,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    last_used_at: Option<DateTime<Utc>>,
    limits: Option<sqlx::types::Json<tollgate_core::limits::RateLimits>>,
}

impl ApiKeyRow {
    /// The record.
    pub(crate) fn into_record(self) -> StoreResult<ApiKeyRecord> {
        Ok(ApiKeyRecord {
            digest: KeyDigest::from_hex(&self.sha256).ok_or_else(|| corrupt("sha256"))?,
            scope: id(self.scope, "scope", Scope::from_stored)?,
            role: parse(&self.role, "role")?,
            created_at: self.created_at,
            expires_at: self.expires_at,
            revoked_at: self.revoked_at,
            last_used_at: self.last_used_at,
            limits: self.limits.map(|l| l.0).unwrap_or_default(),
        })
    }
}

/// Reads the column of a row of another table that a join aliased as `{prefix}{column}` (a
/// name made at compile time: a replay's view reads some forty of them); a `LEFT JOIN` that
/// found no row reads its first column `NULL`.
macro_rules! joined {
    ($row:expr, $prefix:literal, $column:literal) => {
        sqlx::Row::try_get($row, concat!($prefix, $column))
    };
    ($row:expr, $prefix:literal, $column:literal, $t:ty) => {
        sqlx::Row::try_get::<$t, _>($row, concat!($prefix, $column))
    };
}

impl ResultRow {
    /// The `r_`-aliased result columns of a joined row (see `executions::VIEW_BY_KEY`).
    pub(crate) fn joined(row: &sqlx::postgres::PgRow) -> sqlx::Result<Option<Self>> {
        let Some(execution_id) = joined!(row, "r_", "execution_id", Option<Uuid>)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            execution_id,
            outcome: joined!(row, "r_", "outcome")?,
            stop: joined!(row, "r_", "stop")?,
            output: joined!(row, "r_", "output")?,
            step: joined!(row, "r_", "step")?,
            warnings: joined!(row, "r_", "warnings")?,
            retention_expires_at: joined!(row, "r_", "retention_expires_at")?,
            erased_at: joined!(row, "r_", "erased_at")?,
        }))
    }
}

impl SettlementRow {
    /// The `s_`-aliased settlement columns of a joined row (see `executions::VIEW_BY_KEY`).
    pub(crate) fn joined(row: &sqlx::postgres::PgRow) -> sqlx::Result<Option<Self>> {
        let Some(settlement_id) = joined!(row, "s_", "settlement_id", Option<Uuid>)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            settlement_id,
            execution_id: joined!(row, "s_", "execution_id")?,
            scope: joined!(row, "s_", "scope")?,
            operation_key: joined!(row, "s_", "operation_key")?,
            kind: joined!(row, "s_", "kind")?,
            consumer: joined!(row, "s_", "consumer")?,
            session_id: joined!(row, "s_", "session_id")?,
            accounting_day: joined!(row, "s_", "accounting_day")?,
            provider: joined!(row, "s_", "provider")?,
            model: joined!(row, "s_", "model")?,
            price_version: joined!(row, "s_", "price_version")?,
            policy_version: joined!(row, "s_", "policy_version")?,
            currency: joined!(row, "s_", "currency")?,
            input_tokens: joined!(row, "s_", "input_tokens")?,
            output_tokens: joined!(row, "s_", "output_tokens")?,
            cache_read_tokens: joined!(row, "s_", "cache_read_tokens")?,
            cache_write_tokens: joined!(row, "s_", "cache_write_tokens")?,
            reasoning_tokens: joined!(row, "s_", "reasoning_tokens")?,
            amount: joined!(row, "s_", "amount")?,
            source: joined!(row, "s_", "source")?,
            settled_at: joined!(row, "s_", "settled_at")?,
        }))
    }
}

impl ReceiptRow {
    /// The `rr_`-aliased root receipt columns of a joined row (see `executions::VIEW_BY_KEY`).
    pub(crate) fn joined(row: &sqlx::postgres::PgRow) -> sqlx::Result<Option<Self>> {
        let Some(root_id) = joined!(row, "rr_", "root_id", Option<Uuid>)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            root_id,
            execution_id: joined!(row, "rr_", "execution_id")?,
            amount: joined!(row, "rr_", "amount")?,
            currency: joined!(row, "rr_", "currency")?,
            created_at: joined!(row, "rr_", "created_at")?,
        }))
    }
}
