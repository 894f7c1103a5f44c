//! The ledger audit on Postgres ([`LedgerAudit`]): one read-only `REPEATABLE READ` transaction
//! per scope, so every query sees the same snapshot, and a few fixed queries streamed through
//! the shared checker ([`tollgate_store::ledger`]) — spend rows, roots, the executions joined
//! with their settlement and root receipt, settlements without an execution in their scope, the
//! roots' receipts, and acknowledged evidence. Memory grows with the scope's spend rows and
//! roots, not with its executions. Only ids, states, amounts, usage and the price snapshot are
//! read; never content.

use crate::error::{corrupt, DbResultExt};
use crate::rows::{money, settlement_columns, SettlementRow};
use crate::PgStores;
use async_trait::async_trait;
use chrono::NaiveDate;
use futures::TryStreamExt;
use rust_decimal::Decimal;
use sqlx::PgConnection;
use std::str::FromStr;
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::*;
use tollgate_core::money::{Currency, TokenPrices};
use tollgate_core::state::ExecutionState;
use tollgate_core::usage::Usage;
use tollgate_store::ledger::*;
use tollgate_store::traits::LedgerAudit;
use tollgate_store::StoreResult;
use uuid::Uuid;

/// Every scope any ledger table names.
const SCOPES: &str = "SELECT scope FROM executions UNION SELECT scope FROM cost_settlements \
     UNION SELECT scope FROM spend_sessions UNION SELECT scope FROM spend_days \
     UNION SELECT scope FROM roots UNION SELECT scope FROM usage_inbox ORDER BY scope";

const SNAPSHOT: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";

const SESSIONS: &str =
    "SELECT consumer, session_id, currency, settled, held FROM spend_sessions WHERE scope = $1";

const DAYS: &str = "SELECT consumer, day, currency, settled, held FROM spend_days WHERE scope = $1";

const ROOTS: &str = "SELECT id, root_key, charged, held FROM roots WHERE scope = $1";

/// One row per execution of the scope (settlements and root receipts are unique per
/// execution), with the price snapshot taken out of the binding's config (stored apart for a row
/// that names it by digest, H-40). `$2` is every journal state, so
/// the scope's rows are reached through `executions_state_scope_created_idx` (no index of
/// `executions` is led by the scope; H-12).
const EXECUTIONS: &str = "SELECT e.id, e.operation_key, e.state, e.hold, e.accounting_day, \
     e.root_key, e.binding->>'session_id' AS session_id, \
     c.config->>'consumer' AS consumer, c.config->>'currency' AS currency, \
     c.config->>'price_version' AS price_version, c.config->'prices' AS prices, \
     o.id AS root_id, \
     s.settlement_id, s.scope AS s_scope, s.operation_key AS s_operation_key, \
     s.consumer AS s_consumer, s.session_id AS s_session_id, s.accounting_day AS s_day, \
     s.price_version AS s_price_version, s.currency AS s_currency, \
     s.input_tokens AS s_input, s.output_tokens AS s_output, \
     s.cache_read_tokens AS s_cache_read, s.cache_write_tokens AS s_cache_write, \
     s.reasoning_tokens AS s_reasoning, s.amount AS s_amount, \
     r.root_id AS r_root_id, r.amount AS r_amount, r.currency AS r_currency \
     FROM executions e \
     LEFT JOIN binding_configs bc ON bc.digest = e.config_digest \
     CROSS JOIN LATERAL (SELECT COALESCE(bc.config::jsonb, e.binding->'config') AS config) c \
     LEFT JOIN roots o ON o.scope = e.scope AND o.root_key = e.root_key \
     LEFT JOIN cost_settlements s ON s.execution_id = e.id \
     LEFT JOIN root_receipts r ON r.execution_id = e.id \
     WHERE e.state = ANY($2) AND e.scope = $1";

/// Settlements written in the scope whose execution is not in it (index
/// `cost_settlements_feed_scope_idx`, led by the scope).
const FOREIGN_SETTLEMENTS: &str = concat!(
    "SELECT ",
    settlement_columns!(),
    " FROM cost_settlements s WHERE s.scope = $1 AND NOT EXISTS \
     (SELECT 1 FROM executions e WHERE e.id = s.execution_id AND e.scope = s.scope)"
);

/// The receipts of the scope's roots, with their execution as found in the root's scope.
const RECEIPTS: &str = "SELECT r.root_id, o.root_key, r.execution_id, r.amount, \
     e.id IS NOT NULL AS in_scope, e.root_key AS execution_root_key \
     FROM root_receipts r JOIN roots o ON o.id = r.root_id \
     LEFT JOIN executions e ON e.id = r.execution_id AND e.scope = o.scope \
     WHERE o.scope = $1";

/// Acknowledged evidence of the scope (index `usage_inbox_acknowledged_scope_idx`), with its
/// execution in the scope and that execution's settled usage.
const EVIDENCE: &str = "SELECT u.id, u.execution_id, u.exact, u.input_tokens, \
     u.output_tokens, u.cache_read_tokens, u.cache_write_tokens, u.reasoning_tokens, \
     e.state, s.input_tokens AS s_input, s.output_tokens AS s_output, \
     s.cache_read_tokens AS s_cache_read, s.cache_write_tokens AS s_cache_write, \
     s.reasoning_tokens AS s_reasoning \
     FROM usage_inbox u \
     LEFT JOIN executions e ON e.id = u.execution_id AND e.scope = u.scope \
     LEFT JOIN cost_settlements s ON s.execution_id = e.id \
     WHERE u.scope = $1 AND u.acknowledged_at IS NOT NULL";

fn text_id<T, E>(
    text: Option<String>,
    field: &str,
    parse: fn(String) -> Result<T, E>,
) -> StoreResult<T> {
    text.and_then(|t| parse(t).ok())
        .ok_or_else(|| corrupt(field))
}

fn state(text: &str) -> StoreResult<ExecutionState> {
    ExecutionState::from_str(text).map_err(|_| corrupt("state"))
}

fn currency(text: Option<String>, field: &str) -> StoreResult<Currency> {
    text.and_then(|t| Currency::parse(&t).ok())
        .ok_or_else(|| corrupt(field))
}

/// Token counts from five nullable `bigint`s; `None` when the joined row is absent.
fn usage(columns: [Option<i64>; 5]) -> StoreResult<Option<Usage>> {
    let [Some(input), Some(output), Some(cache_read), Some(cache_write), Some(reasoning)] = columns
    else {
        return Ok(None);
    };
    let one = |n: i64| u64::try_from(n).map_err(|_| corrupt("token count"));
    Ok(Some(Usage {
        input: one(input)?,
        output: one(output)?,
        cache_read: one(cache_read)?,
        cache_write: one(cache_write)?,
        reasoning: one(reasoning)?,
    }))
}

#[derive(sqlx::FromRow)]
struct SessionRow {
    consumer: String,
    session_id: String,
    currency: String,
    settled: Decimal,
    held: Decimal,
}

#[derive(sqlx::FromRow)]
struct DayRow {
    consumer: String,
    day: NaiveDate,
    currency: String,
    settled: Decimal,
    held: Decimal,
}

fn totals(settled: Decimal, held: Decimal) -> StoreResult<SpendTotals> {
    Ok(SpendTotals {
        settled: money(settled, "settled")?,
        held: money(held, "held")?,
    })
}

#[derive(sqlx::FromRow)]
struct RootRow {
    id: Uuid,
    root_key: String,
    charged: Decimal,
    held: Decimal,
}

#[derive(sqlx::FromRow)]
struct ExecutionRow {
    id: Uuid,
    operation_key: String,
    state: String,
    hold: Decimal,
    accounting_day: NaiveDate,
    root_key: Option<String>,
    session_id: Option<String>,
    consumer: Option<String>,
    currency: Option<String>,
    price_version: Option<String>,
    prices: Option<serde_json::Value>,
    root_id: Option<Uuid>,
    settlement_id: Option<Uuid>,
    s_scope: Option<String>,
    s_operation_key: Option<String>,
    s_consumer: Option<String>,
    s_session_id: Option<String>,
    s_day: Option<NaiveDate>,
    s_price_version: Option<String>,
    s_currency: Option<String>,
    s_input: Option<i64>,
    s_output: Option<i64>,
    s_cache_read: Option<i64>,
    s_cache_write: Option<i64>,
    s_reasoning: Option<i64>,
    s_amount: Option<Decimal>,
    r_root_id: Option<Uuid>,
    r_amount: Option<Decimal>,
    r_currency: Option<String>,
}

impl ExecutionRow {
    fn settlement(&mut self, id: ExecutionId) -> StoreResult<Option<SettlementFacts>> {
        let Some(settlement_id) = self.settlement_id else {
            return Ok(None);
        };
        let usage = usage([
            self.s_input,
            self.s_output,
            self.s_cache_read,
            self.s_cache_write,
            self.s_reasoning,
        ])?
        .ok_or_else(|| corrupt("token count"))?;
        Ok(Some(SettlementFacts {
            id: SettlementId(settlement_id),
            execution_id: id,
            scope: text_id(self.s_scope.take(), "scope", Scope::from_stored)?,
            operation_key: text_id(
                self.s_operation_key.take(),
                "operation_key",
                OperationKey::from_stored,
            )?,
            consumer: text_id(self.s_consumer.take(), "consumer", ConsumerId::from_stored)?,
            session_id: text_id(
                self.s_session_id.take(),
                "session_id",
                SessionId::from_stored,
            )?,
            accounting_day: self.s_day.ok_or_else(|| corrupt("accounting_day"))?,
            price_version: self
                .s_price_version
                .take()
                .ok_or_else(|| corrupt("price_version"))?,
            currency: currency(self.s_currency.take(), "currency")?,
            usage,
            amount: money(self.s_amount.ok_or_else(|| corrupt("amount"))?, "amount")?,
        }))
    }

    fn into_facts(mut self) -> StoreResult<ExecutionFacts> {
        let id = ExecutionId(self.id);
        let settlement = self.settlement(id)?;
        let receipt = match (self.r_root_id, self.r_amount) {
            (Some(root_id), Some(amount)) => Some(ReceiptOfExecution {
                root_id: RootId(root_id),
                amount: money(amount, "amount")?,
                currency: currency(self.r_currency.take(), "currency")?,
            }),
            _ => None,
        };
        let prices: TokenPrices = self
            .prices
            .take()
            .and_then(|p| serde_json::from_value(p).ok())
            .ok_or_else(|| corrupt("binding"))?;
        Ok(ExecutionFacts {
            id,
            operation_key: text_id(
                Some(self.operation_key),
                "operation_key",
                OperationKey::from_stored,
            )?,
            state: state(&self.state)?,
            hold: money(self.hold, "hold")?,
            consumer: text_id(self.consumer, "binding", ConsumerId::from_stored)?,
            session_id: text_id(self.session_id, "binding", SessionId::from_stored)?,
            accounting_day: self.accounting_day,
            root_key: self
                .root_key
                .map(|k| text_id(Some(k), "root_key", RootKey::from_stored))
                .transpose()?,
            root_id: self.root_id.map(RootId),
            currency: currency(self.currency, "binding")?,
            price_version: self.price_version.ok_or_else(|| corrupt("binding"))?,
            prices,
            settlement,
            receipt,
        })
    }
}

#[derive(sqlx::FromRow)]
struct ReceiptRow {
    root_id: Uuid,
    root_key: String,
    execution_id: Uuid,
    amount: Decimal,
    in_scope: bool,
    execution_root_key: Option<String>,
}

#[derive(sqlx::FromRow)]
struct EvidenceRow {
    id: Uuid,
    execution_id: Uuid,
    exact: bool,
    input_tokens: i64,
    output_tokens: i64,
    cache_read_tokens: i64,
    cache_write_tokens: i64,
    reasoning_tokens: i64,
    state: Option<String>,
    s_input: Option<i64>,
    s_output: Option<i64>,
    s_cache_read: Option<i64>,
    s_cache_write: Option<i64>,
    s_reasoning: Option<i64>,
}

impl EvidenceRow {
    fn into_facts(self) -> StoreResult<EvidenceFacts> {
        let own = [
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
            self.reasoning_tokens,
        ];
        Ok(EvidenceFacts {
            id: EvidenceId(self.id),
            execution_id: ExecutionId(self.execution_id),
            exact: self.exact,
            usage: usage(own.map(Some))?.ok_or_else(|| corrupt("token count"))?,
            execution_state: self.state.as_deref().map(state).transpose()?,
            settlement_usage: usage([
                self.s_input,
                self.s_output,
                self.s_cache_read,
                self.s_cache_write,
                self.s_reasoning,
            ])?,
        })
    }
}

/// Feeds one scope's rows to a checker, on a connection inside the snapshot transaction.
async fn audit_scope(
    conn: &mut PgConnection,
    scope: &Scope,
    limit: u32,
) -> StoreResult<LedgerReport> {
    let mut checker = LedgerChecker::new(scope.clone(), limit);
    let name = scope.as_str();
    let sessions: Vec<SessionRow> = sqlx::query_as(SESSIONS)
        .bind(name)
        .fetch_all(&mut *conn)
        .await
        .store_err()?;
    for row in sessions {
        let key = SpendRowKey::Session {
            consumer: text_id(Some(row.consumer), "consumer", ConsumerId::from_stored)?,
            session_id: text_id(Some(row.session_id), "session_id", SessionId::from_stored)?,
            currency: currency(Some(row.currency), "currency")?,
        };
        checker.spend_row(key, totals(row.settled, row.held)?);
    }
    let days: Vec<DayRow> = sqlx::query_as(DAYS)
        .bind(name)
        .fetch_all(&mut *conn)
        .await
        .store_err()?;
    for row in days {
        let key = SpendRowKey::Day {
            consumer: text_id(Some(row.consumer), "consumer", ConsumerId::from_stored)?,
            day: row.day,
            currency: currency(Some(row.currency), "currency")?,
        };
        checker.spend_row(key, totals(row.settled, row.held)?);
    }
    let roots: Vec<RootRow> = sqlx::query_as(ROOTS)
        .bind(name)
        .fetch_all(&mut *conn)
        .await
        .store_err()?;
    for row in roots {
        checker.root(RootFacts {
            id: RootId(row.id),
            root_key: text_id(Some(row.root_key), "root_key", RootKey::from_stored)?,
            charged: money(row.charged, "charged")?,
            held: money(row.held, "held")?,
        });
    }
    {
        let mut rows = sqlx::query_as::<_, ExecutionRow>(EXECUTIONS)
            .bind(name)
            .bind(ExecutionState::ALL.map(|s| s.as_str()).to_vec())
            .fetch(&mut *conn);
        while let Some(row) = rows.try_next().await.store_err()? {
            checker.execution(row.into_facts()?);
        }
    }
    {
        let mut rows = sqlx::query_as::<_, SettlementRow>(FOREIGN_SETTLEMENTS)
            .bind(name)
            .fetch(&mut *conn);
        while let Some(row) = rows.try_next().await.store_err()? {
            checker.foreign_settlement(SettlementFacts::of(&row.into_record()?));
        }
    }
    {
        let mut rows = sqlx::query_as::<_, ReceiptRow>(RECEIPTS)
            .bind(name)
            .fetch(&mut *conn);
        while let Some(row) = rows.try_next().await.store_err()? {
            let execution_root_key = match (row.in_scope, row.execution_root_key) {
                (false, _) => None,
                (true, key) => Some(
                    key.map(|k| text_id(Some(k), "root_key", RootKey::from_stored))
                        .transpose()?,
                ),
            };
            checker.receipt(ReceiptFacts {
                root_id: RootId(row.root_id),
                root_key: text_id(Some(row.root_key), "root_key", RootKey::from_stored)?,
                execution_id: ExecutionId(row.execution_id),
                amount: money(row.amount, "amount")?,
                execution_root_key,
            });
        }
    }
    {
        let mut rows = sqlx::query_as::<_, EvidenceRow>(EVIDENCE)
            .bind(name)
            .fetch(&mut *conn);
        while let Some(row) = rows.try_next().await.store_err()? {
            checker.evidence(row.into_facts()?);
        }
    }
    Ok(checker.finish())
}

impl PgStores {
    /// One scope's audit in its own read-only snapshot.
    async fn audit_ledger_scope(&self, scope: &Scope, limit: u32) -> StoreResult<LedgerReport> {
        let mut tx = self.begin().await?;
        sqlx::query(SNAPSHOT).execute(&mut *tx).await.store_err()?;
        let report = audit_scope(&mut tx, scope, limit).await?;
        tx.rollback().await.store_err()?;
        Ok(report)
    }
}

#[async_trait]
impl LedgerAudit for PgStores {
    async fn audit_ledger(&self, scope: Option<&Scope>, limit: u32) -> StoreResult<LedgerReport> {
        let limit = ledger_limit(Some(limit));
        if let Some(scope) = scope {
            return self.audit_ledger_scope(scope, limit).await;
        }
        let names: Vec<String> = sqlx::query_scalar(SCOPES)
            .fetch_all(self.pool())
            .await
            .store_err()?;
        let mut report = LedgerReport::empty(None);
        for name in names {
            let scope = text_id(Some(name), "scope", Scope::from_stored)?;
            report.absorb(self.audit_ledger_scope(&scope, limit).await?, limit);
        }
        Ok(report)
    }
}
