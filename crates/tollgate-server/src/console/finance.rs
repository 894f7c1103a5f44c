//! The finance page (finance role): the scope's settlements by day × consumer × model as a chart
//! and a paged table, the CSV of any range (the finance view's columns), and the price versions
//! in force.

use super::charts::{self, Series};
use super::csv::settlements_csv;
use super::session::{allow, Page};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use chrono::{Days, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tollgate_core::ids::Scope;
use tollgate_core::money::{Money, TokenPrices};
use tollgate_store::{ServiceStores, SettlementRecord};

/// Settlements of the scope in one range read at most; a larger range is refused, never cut
/// short. Other scopes' settlements are not read and do not count (SC-192).
pub const FINANCE_ROWS_MAX: u32 = 100_000;
/// Longest range, in days.
pub const RANGE_DAYS_MAX: u64 = 366;
/// Default range, in days, ending today.
pub const RANGE_DAYS_DEFAULT: u64 = 14;
/// Default table page size.
pub const PAGE_ROWS_DEFAULT: u32 = 50;
/// Largest table page size.
pub const PAGE_ROWS_MAX: u32 = 500;

/// Query of the finance reads.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinanceQuery {
    /// First day (`YYYY-MM-DD`, default: 13 days before `to`).
    pub from: Option<String>,
    /// Last day (default: today, UTC).
    pub to: Option<String>,
    /// Table page, from 1.
    pub page: Option<u32>,
    /// Table rows per page (default 50, at most 500).
    pub page_size: Option<u32>,
}

/// One table row: a day, consumer and model.
#[derive(Debug, Clone, Serialize)]
pub struct DayRow {
    /// Accounting day.
    pub day: NaiveDate,
    /// Consumer.
    pub consumer: String,
    /// Model.
    pub model: String,
    /// Currency.
    pub currency: String,
    /// Settlements.
    pub settlements: u64,
    /// Their sum.
    pub amount: Money,
}

/// One chart per currency.
#[derive(Debug, Serialize)]
pub struct CurrencyChart {
    /// Currency.
    pub currency: String,
    /// Total in the range.
    pub total: Money,
    /// The SVG.
    pub svg: String,
}

/// A price version in force (a loaded profile's snapshot).
#[derive(Debug, Serialize)]
pub struct PriceInForce {
    /// Price table version.
    pub price_version: String,
    /// Model.
    pub model: String,
    /// Currency.
    pub currency: String,
    /// Per million tokens.
    pub prices: TokenPrices,
    /// Profiles charging with it.
    pub profiles: Vec<String>,
}

/// `GET /v1/console/finance` answer.
#[derive(Debug, Serialize)]
pub struct FinanceView {
    /// First day.
    pub from: NaiveDate,
    /// Last day.
    pub to: NaiveDate,
    /// Settlements of the scope in the range.
    pub settlements: usize,
    /// Charts by currency.
    pub charts: Vec<CurrencyChart>,
    /// This page of day × consumer × model rows (newest day first).
    pub rows: Vec<DayRow>,
    /// Page shown.
    pub page: u32,
    /// Rows per page.
    pub page_size: u32,
    /// Rows in all pages.
    pub rows_total: usize,
    /// Price versions in force.
    pub prices: Vec<PriceInForce>,
}

fn day(text: Option<&str>, field: &str) -> Result<Option<NaiveDate>, ApiError> {
    text.map(|t| {
        NaiveDate::parse_from_str(t, "%Y-%m-%d")
            .map_err(|_| ApiError::Invalid(format!("{field} is not a day (YYYY-MM-DD)")))
    })
    .transpose()
}

/// The range of a query: both ends inclusive, `from ≤ to`, at most [`RANGE_DAYS_MAX`] days.
///
/// # Errors
/// `invalid_request`.
pub fn range(query: &FinanceQuery) -> Result<(NaiveDate, NaiveDate), ApiError> {
    let to = day(query.to.as_deref(), "to")?.unwrap_or_else(|| Utc::now().date_naive());
    let from = match day(query.from.as_deref(), "from")? {
        Some(from) => from,
        None => to
            .checked_sub_days(Days::new(RANGE_DAYS_DEFAULT - 1))
            .unwrap_or(to),
    };
    if from > to {
        return Err(ApiError::Invalid("from is after to".into()));
    }
    let days = u64::try_from((to - from).num_days()).unwrap_or(u64::MAX);
    if days >= RANGE_DAYS_MAX {
        return Err(ApiError::Invalid(format!(
            "a range is at most {RANGE_DAYS_MAX} days"
        )));
    }
    Ok((from, to))
}

/// `scope`'s settlements in the range, by day and then settlement order, when there are at
/// most `rows_max` of them. The store reads the scope's rows only, at most `rows_max + 1`, so
/// whether a range is refused depends on this scope's settlements alone, and the refusal names
/// the bound, never a count (SC-192).
///
/// # Errors
/// `invalid_request` (more than `rows_max`), `unavailable`.
pub async fn scope_settlements(
    stores: &dyn ServiceStores,
    scope: &Scope,
    from: NaiveDate,
    to: NaiveDate,
    rows_max: u32,
) -> Result<Vec<SettlementRecord>, ApiError> {
    let rows = stores
        .scope_settlements(scope, from, to, rows_max.saturating_add(1))
        .await?;
    if rows.len() > rows_max as usize {
        return Err(ApiError::Invalid(format!(
            "the range holds more than {rows_max} settlements: choose a shorter one"
        )));
    }
    Ok(rows)
}

fn add(sum: &mut Money, amount: Money) -> Result<(), ApiError> {
    *sum = sum.checked_add(amount).map_err(|_| ApiError::Internal)?;
    Ok(())
}

/// Day × consumer × model sums, newest day first.
fn day_rows(rows: &[SettlementRecord]) -> Result<Vec<DayRow>, ApiError> {
    let mut groups: BTreeMap<(NaiveDate, String, String, String), (u64, Money)> = BTreeMap::new();
    for r in rows {
        let key = (
            r.accounting_day,
            r.consumer.to_string(),
            r.model.clone(),
            r.currency.to_string(),
        );
        let entry = groups.entry(key).or_insert((0, Money::ZERO));
        entry.0 += 1;
        add(&mut entry.1, r.amount)?;
    }
    Ok(groups
        .into_iter()
        .rev()
        .map(|((day, consumer, model, currency), (n, amount))| DayRow {
            day,
            consumer,
            model,
            currency,
            settlements: n,
            amount,
        })
        .collect())
}

fn chart_of(
    from: NaiveDate,
    to: NaiveDate,
    currency: &str,
    rows: &[DayRow],
) -> Result<CurrencyChart, ApiError> {
    let days: Vec<NaiveDate> = from.iter_days().take_while(|d| *d <= to).collect();
    let mut series: BTreeMap<String, Vec<Decimal>> = BTreeMap::new();
    let mut total = Money::ZERO;
    for row in rows.iter().filter(|r| r.currency == currency) {
        let values = series
            .entry(format!("{} / {}", row.consumer, row.model))
            .or_insert_with(|| vec![Decimal::ZERO; days.len()]);
        let at = usize::try_from((row.day - from).num_days()).unwrap_or(usize::MAX);
        if let Some(slot) = values.get_mut(at) {
            *slot += row.amount.decimal();
        }
        add(&mut total, row.amount)?;
    }
    let series: Vec<Series<Decimal>> = series
        .into_iter()
        .map(|(label, values)| Series { label, values })
        .collect();
    let svg = charts::settlements_by_day(&days, &series, currency).map_err(|e| {
        tracing::error!(error = %e, "finance chart");
        ApiError::Internal
    })?;
    Ok(CurrencyChart {
        currency: currency.to_string(),
        total,
        svg,
    })
}

fn prices_in_force(app: &App) -> Vec<PriceInForce> {
    let mut out: Vec<PriceInForce> = Vec::new();
    for loaded in app.profiles.values() {
        let c = &loaded.profile.config;
        let same = |p: &&mut PriceInForce| {
            p.price_version == c.price_version.as_str()
                && p.model == c.model
                && p.currency == c.currency.as_str()
        };
        match out.iter_mut().find(|p| same(p)) {
            Some(p) => p.profiles.push(loaded.profile.name.clone()),
            None => out.push(PriceInForce {
                price_version: c.price_version.to_string(),
                model: c.model.clone(),
                currency: c.currency.to_string(),
                prices: c.prices.clone(),
                profiles: vec![loaded.profile.name.clone()],
            }),
        }
    }
    out
}

/// `GET /v1/console/finance?from=&to=&page=&page_size=`.
///
/// # Errors
/// `invalid_request` (days, a range too long or holding too many settlements), `forbidden`
/// (not finance), `unavailable`.
pub async fn finance(
    app: &App,
    who: &Principal,
    query: FinanceQuery,
) -> Result<FinanceView, ApiError> {
    allow(who, Page::Finance)?;
    let (from, to) = range(&query)?;
    let page_size = query
        .page_size
        .unwrap_or(PAGE_ROWS_DEFAULT)
        .clamp(1, PAGE_ROWS_MAX);
    let page = query.page.unwrap_or(1).max(1);
    let stores = app.backend.stores();
    let settlements =
        scope_settlements(stores.as_ref(), &who.scope, from, to, FINANCE_ROWS_MAX).await?;
    let rows = day_rows(&settlements)?;
    let mut currencies: Vec<&str> = rows.iter().map(|r| r.currency.as_str()).collect();
    currencies.sort_unstable();
    currencies.dedup();
    let charts = currencies
        .into_iter()
        .map(|c| chart_of(from, to, c, &rows))
        .collect::<Result<Vec<_>, _>>()?;
    let skip = usize::try_from(u64::from(page - 1) * u64::from(page_size)).unwrap_or(usize::MAX);
    Ok(FinanceView {
        from,
        to,
        settlements: settlements.len(),
        charts,
        rows_total: rows.len(),
        rows: rows
            .into_iter()
            .skip(skip)
            .take(page_size as usize)
            .collect(),
        page,
        page_size,
        prices: prices_in_force(app),
    })
}

/// `GET /v1/console/finance/settlements.csv?from=&to=`: the scope's settlements of the range in
/// the finance view's columns, by day and then settlement order. Returns the file name and the text.
///
/// # Errors
/// As [`finance`].
pub async fn csv(
    app: &App,
    who: &Principal,
    query: FinanceQuery,
) -> Result<(String, String), ApiError> {
    allow(who, Page::Finance)?;
    let (from, to) = range(&query)?;
    let stores = app.backend.stores();
    let rows = scope_settlements(stores.as_ref(), &who.scope, from, to, FINANCE_ROWS_MAX).await?;
    Ok((
        format!("settlements-{}-{from}-{to}.csv", who.scope),
        settlements_csv(&rows),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(from: Option<&str>, to: Option<&str>) -> FinanceQuery {
        FinanceQuery {
            from: from.map(str::to_string),
            to: to.map(str::to_string),
            ..FinanceQuery::default()
        }
    }

    #[test]
    fn sc_157_ranges_are_checked() {
        let (from, to) = range(&query(None, Some("2026-12-01"))).unwrap();
        assert_eq!((to - from).num_days(), 13);
        assert!(range(&query(Some("2026-12-02"), Some("2026-12-01"))).is_err());
        assert!(range(&query(Some("2025-01-01"), Some("2026-12-01"))).is_err());
        assert!(range(&query(Some("yesterday"), None)).is_err());
    }
}
