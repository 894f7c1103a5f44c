//! Spend totals: settled charges and in-flight holds per (scope, consumer, session, currency)
//! and per (scope, consumer, day, currency) (SC-105). Writers lock the session row, then the day
//! row.

use crate::error::DbResultExt;
use crate::rows::SpendRow;
use crate::PgStores;
use async_trait::async_trait;
use chrono::NaiveDate;
use rust_decimal::Decimal;
use sqlx::PgConnection;
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::{ConsumerId, Scope, SessionId};
use tollgate_core::money::Currency;
use tollgate_store::rows::ExecutionRecord;
use tollgate_store::rules;
use tollgate_store::traits::SpendStore;
use tollgate_store::StoreResult;

/// Creates the session row and then the day row if missing and locks them, returning both rows'
/// totals, in one statement (one round trip). The day's insert reads from the session's, so the
/// session row is locked before the day row whatever plan the join takes (the crate's lock
/// order, spec/journal.md).
pub(crate) const LOCK_BOTH: &str = "WITH s AS (\
       INSERT INTO spend_sessions (scope, consumer, session_id, currency) \
       VALUES ($1, $2, $3, $4) \
       ON CONFLICT (scope, consumer, session_id, currency) \
       DO UPDATE SET held = spend_sessions.held \
       RETURNING settled, held), \
     d AS (\
       INSERT INTO spend_days (scope, consumer, day, currency) \
       SELECT $1, $2, $5, $4 FROM s \
       ON CONFLICT (scope, consumer, day, currency) DO UPDATE SET held = spend_days.held \
       RETURNING settled, held) \
     SELECT s.settled, s.held, d.settled AS day_settled, d.held AS day_held FROM s, d";

/// Writes both (already locked) rows.
pub(crate) const WRITE: &str = "WITH s AS (UPDATE spend_sessions SET settled = $4, held = $5 \
         WHERE scope = $1 AND consumer = $2 AND session_id = $3 AND currency = $9) \
     UPDATE spend_days SET settled = $7, held = $8 \
     WHERE scope = $1 AND consumer = $2 AND day = $6 AND currency = $9";

/// The two spend rows an execution is charged to.
pub(crate) struct SpendKeys<'a> {
    pub(crate) scope: &'a str,
    pub(crate) consumer: &'a str,
    pub(crate) session: &'a str,
    pub(crate) day: NaiveDate,
    pub(crate) currency: &'a str,
}

impl<'a> SpendKeys<'a> {
    /// The rows of `record`.
    pub(crate) fn of(record: &'a ExecutionRecord) -> Self {
        Self {
            scope: record.scope.as_str(),
            consumer: record.consumer().as_str(),
            session: record.session_id().as_str(),
            day: record.accounting_day,
            currency: rules::currency_of(record).as_str(),
        }
    }
}

/// Locks the session row, then the day row (creating them at zero when missing), and returns
/// their totals. The locks last until the transaction ends.
///
/// # Errors
/// Store failure; corrupt totals.
pub(crate) async fn lock(
    conn: &mut PgConnection,
    keys: &SpendKeys<'_>,
) -> StoreResult<(SpendTotals, SpendTotals)> {
    let (session_settled, session_held, day_settled, day_held): (
        Decimal,
        Decimal,
        Decimal,
        Decimal,
    ) = sqlx::query_as(LOCK_BOTH)
        .bind(keys.scope)
        .bind(keys.consumer)
        .bind(keys.session)
        .bind(keys.currency)
        .bind(keys.day)
        .fetch_one(&mut *conn)
        .await
        .store_err()?;
    Ok((
        SpendRow::totals(session_settled, session_held)?,
        SpendRow::totals(day_settled, day_held)?,
    ))
}

/// Writes new totals to both rows, which the caller has locked with [`lock`].
///
/// # Errors
/// Store failure (including a total out of the column's range).
pub(crate) async fn write(
    conn: &mut PgConnection,
    keys: &SpendKeys<'_>,
    session: SpendTotals,
    daily: SpendTotals,
) -> StoreResult<()> {
    sqlx::query(WRITE)
        .bind(keys.scope)
        .bind(keys.consumer)
        .bind(keys.session)
        .bind(session.settled.decimal())
        .bind(session.held.decimal())
        .bind(keys.day)
        .bind(daily.settled.decimal())
        .bind(daily.held.decimal())
        .bind(keys.currency)
        .execute(&mut *conn)
        .await
        .store_err()?;
    Ok(())
}

#[async_trait]
impl SpendStore for PgStores {
    async fn session_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        session: &SessionId,
        currency: &Currency,
    ) -> StoreResult<SpendTotals> {
        self.bounded(async move {
            let row: Option<SpendRow> = sqlx::query_as(
                "SELECT settled, held FROM spend_sessions \
                 WHERE scope = $1 AND consumer = $2 AND session_id = $3 AND currency = $4",
            )
            .bind(scope.as_str())
            .bind(consumer.as_str())
            .bind(session.as_str())
            .bind(currency.as_str())
            .fetch_optional(self.pool())
            .await
            .store_err()?;
            row.map_or(Ok(SpendTotals::default()), SpendRow::into_totals)
        })
        .await
    }

    async fn daily_spend(
        &self,
        scope: &Scope,
        consumer: &ConsumerId,
        day: NaiveDate,
        currency: &Currency,
    ) -> StoreResult<SpendTotals> {
        self.bounded(async move {
            let row: Option<SpendRow> = sqlx::query_as(
                "SELECT settled, held FROM spend_days \
                 WHERE scope = $1 AND consumer = $2 AND day = $3 AND currency = $4",
            )
            .bind(scope.as_str())
            .bind(consumer.as_str())
            .bind(day)
            .bind(currency.as_str())
            .fetch_optional(self.pool())
            .await
            .store_err()?;
            row.map_or(Ok(SpendTotals::default()), SpendRow::into_totals)
        })
        .await
    }

    async fn limit_windows(
        &self,
        scope: &Scope,
    ) -> StoreResult<
        Vec<(
            tollgate_core::limits::LimitSubject,
            tollgate_core::limits::LimitWindow,
        )>,
    > {
        self.bounded(self.limit_windows_of(scope)).await
    }
}

/// The block caps' verdict on a hold of `hold` over the totals before it of a call's session
/// and day rows, which are kept in its snapshot's `currency` (SC-105).
///
/// # Errors
/// `CurrencyMismatch` (never on rows picked by the call's currency).
pub(crate) fn admit(
    caps: &tollgate_core::caps::Caps,
    currency: &tollgate_core::money::Currency,
    session: SpendTotals,
    daily: SpendTotals,
    hold: tollgate_core::money::Money,
) -> StoreResult<Result<(), tollgate_core::caps::CapBlocked>> {
    use tollgate_core::caps::CurrencySpend;
    Ok(caps.admit(
        currency,
        &CurrencySpend::new(currency.clone(), session),
        &CurrencySpend::new(currency.clone(), daily),
        hold,
    )?)
}
