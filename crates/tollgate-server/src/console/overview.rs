//! The overview page (operators and finance): calls per minute by outcome, today's spend per
//! consumer against its daily caps (settled and held apart), open holds, the backlog, the
//! scheduler's health and the ledger audit of the scope (from this process's last audit of the
//! scope when it began less than `AUDIT_CHECK_CACHE_MS` ago, SC-194).

use super::audit::walk;
use super::charts::{self, Series};
use super::session::{allow, Page};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::metrics::SchedulerHealth;
use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use tollgate_core::caps::Caps;
use tollgate_core::ids::{ConsumerId, Scope};
use tollgate_core::limits::{LimitKind, LimitSubject, LimitWindow, RateLimits};
use tollgate_core::money::{Currency, Money};
use tollgate_core::state::ExecutionState;
use tollgate_store::{
    AuditPosition, AuditRow, ExecutionRecord, LedgerCounts, ServiceStores, AUDIT_CHAINS,
};

/// Minutes the calls chart covers.
pub const CALLS_WINDOW_MINUTES: u32 = 180;
/// Audit rows read back from the chain head for the calls chart, at most.
pub const CALLS_AUDIT_ROWS_MAX: i64 = 50_000;
/// Open executions read per state, at most (more are reported as truncated).
pub const OPEN_ROWS_MAX: u32 = 1000;

/// The outcome an audit row ends a call with, if it ends one.
fn call_end(row: &AuditRow) -> Option<String> {
    match row.event.kind.as_str() {
        "settled" => row.event.detail["outcome"].as_str().map(str::to_string),
        "not_dispatched" | "reconciliation_required" => Some(row.event.kind.clone()),
        _ => None,
    }
}

/// Calls per minute by outcome.
#[derive(Debug, Serialize)]
pub struct CallsView {
    /// Minutes covered, ending now.
    pub window_minutes: u32,
    /// Calls that ended in the window, by outcome.
    pub by_outcome: BTreeMap<String, u64>,
    /// The chart.
    pub chart_svg: String,
    /// Whether older rows of the window were not read (more than the bound).
    pub partial: bool,
}

/// Today's spend of one consumer against its daily caps.
#[derive(Debug, Serialize)]
pub struct ConsumerSpend {
    /// Consumer.
    pub consumer: ConsumerId,
    /// Currency of the amounts.
    pub currency: Currency,
    /// Settled today.
    pub settled: Money,
    /// Held by calls in flight or awaiting an operator.
    pub held: Money,
    /// The strictest daily warn level of the profiles charging this consumer.
    pub daily_warn: Option<Money>,
    /// The strictest daily block level.
    pub daily_block: Option<Money>,
    /// `ok`, `warn` (settled + held reached the warn level) or `block` (reached the block level).
    pub level: &'static str,
}

/// Holds of open executions (prepared, dispatched, awaiting an operator).
#[derive(Debug, Serialize)]
pub struct HoldsView {
    /// Open executions.
    pub count: usize,
    /// Their holds, summed per currency.
    pub held: BTreeMap<String, Money>,
    /// More open executions than were read.
    pub truncated: bool,
}

/// The ledger audit in brief.
#[derive(Debug, Serialize)]
pub struct LedgerBrief {
    /// No violation.
    pub ok: bool,
    /// Rows checked.
    pub checked: LedgerCounts,
    /// Violations found.
    pub violations_total: u64,
    /// The first one, as text.
    pub first_violation: Option<String>,
    /// When the audit began.
    pub checked_at: DateTime<Utc>,
    /// Whether it is this process's last audit of the scope rather than one of this request.
    pub cached: bool,
    /// How long an audit is served from memory.
    pub cache_ms: u64,
}

/// One consumer's use against its limits (SC-225): the profiles that limit it, its current
/// window (empty once the window has closed) and its calls in flight.
#[derive(Debug, Serialize)]
pub struct ConsumerLimits {
    /// The consumer.
    pub consumer: ConsumerId,
    /// Its limits: for each kind, the strictest of the profiles that set it.
    pub limits: RateLimits,
    /// Calls admitted in the current window.
    pub requests: u64,
    /// Input tokens counted in the current window.
    pub input_tokens: u64,
    /// Output tokens counted in the current window.
    pub output_tokens: u64,
    /// Calls in flight now.
    pub in_flight: u64,
    /// When the current window closes (none when no window is open).
    pub window_ends_at: Option<DateTime<Utc>>,
    /// `limited` when a count has reached its limit, else `ok`.
    pub level: &'static str,
}

/// Each limited consumer of the loaded profiles with its use now.
async fn consumer_limits(
    app: &App,
    stores: &dyn ServiceStores,
    scope: &Scope,
    now: DateTime<Utc>,
) -> Result<Vec<ConsumerLimits>, ApiError> {
    let mut limits: BTreeMap<ConsumerId, RateLimits> = BTreeMap::new();
    for loaded in app.profiles.values() {
        let profile = &loaded.profile;
        if profile.limits.is_empty() {
            continue;
        }
        let entry = limits.entry(profile.config.consumer.clone()).or_default();
        *entry = strictest(*entry, profile.limits);
    }
    if limits.is_empty() {
        return Ok(Vec::new());
    }
    let windows: BTreeMap<LimitSubject, LimitWindow> =
        stores.limit_windows(scope).await?.into_iter().collect();
    Ok(limits
        .into_iter()
        .map(|(consumer, limits)| {
            let window = windows
                .get(&LimitSubject::Consumer(consumer.clone()))
                .copied();
            let in_flight = window.map_or(0, |w| w.in_flight);
            let open = window.filter(|w| w.open_at(now));
            let used = |kind: LimitKind| match kind {
                LimitKind::InFlight => in_flight,
                _ => open.map_or(0, |w| w.used(kind)),
            };
            let reached = LimitKind::ALL
                .into_iter()
                .any(|k| limits.of(k).is_some_and(|limit| used(k) >= limit));
            ConsumerLimits {
                limits,
                requests: used(LimitKind::Requests),
                input_tokens: used(LimitKind::InputTokens),
                output_tokens: used(LimitKind::OutputTokens),
                in_flight,
                window_ends_at: open.map(|w| w.ends_at()),
                level: if reached { "limited" } else { "ok" },
                consumer,
            }
        })
        .collect())
}

/// For each kind, the smaller of two limits (either alone when the other is unset).
fn strictest(a: RateLimits, b: RateLimits) -> RateLimits {
    let min = |x: Option<u64>, y: Option<u64>| match (x, y) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    };
    RateLimits {
        requests_per_minute: min(a.requests_per_minute, b.requests_per_minute),
        input_tokens_per_minute: min(a.input_tokens_per_minute, b.input_tokens_per_minute),
        output_tokens_per_minute: min(a.output_tokens_per_minute, b.output_tokens_per_minute),
        in_flight: min(a.in_flight, b.in_flight),
    }
}

/// `GET /v1/console/overview` answer.
#[derive(Debug, Serialize)]
pub struct OverviewView {
    /// The key's scope.
    pub scope: String,
    /// The accounting day shown (UTC).
    pub day: NaiveDate,
    /// When this was read.
    pub generated_at: DateTime<Utc>,
    /// Calls per minute by outcome.
    pub calls: CallsView,
    /// Today's spend per consumer.
    pub spend: Vec<ConsumerSpend>,
    /// Each limited consumer's use against its limits.
    pub limits: Vec<ConsumerLimits>,
    /// Open holds.
    pub holds: HoldsView,
    /// Executions awaiting an operator.
    pub backlog: usize,
    /// Whether the backlog count is a lower bound.
    pub backlog_truncated: bool,
    /// The scheduler of this process.
    pub scheduler: SchedulerHealth,
    /// The ledger audit of the scope, run now or at most `cache_ms` before.
    pub ledger: LedgerBrief,
}

fn stricter(a: Option<Money>, b: Option<Money>) -> Option<Money> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.decimal() < a.decimal() { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Consumers with their currency and strictest daily caps: every profile's, then every open
/// execution's (a binding made under an older configuration).
/// Each consumer's caps per currency (caps and spend are per currency).
fn consumers<'a>(
    app: &App,
    open: impl Iterator<Item = &'a ExecutionRecord>,
) -> BTreeMap<(ConsumerId, Currency), Caps> {
    let configs = app
        .profiles
        .values()
        .map(|l| &l.profile.config)
        .chain(open.map(|r| &r.binding.config));
    let mut out: BTreeMap<(ConsumerId, Currency), Caps> = BTreeMap::new();
    for config in configs {
        let entry = out
            .entry((config.consumer.clone(), config.currency.clone()))
            .or_default();
        entry.daily_warn = stricter(entry.daily_warn, config.caps.daily_warn);
        entry.daily_block = stricter(entry.daily_block, config.caps.daily_block);
    }
    out
}

fn level(settled: Money, held: Money, caps: &Caps) -> &'static str {
    let total = settled.decimal() + held.decimal();
    let reached = |cap: Option<Money>| cap.is_some_and(|c| total >= c.decimal());
    if reached(caps.daily_block) {
        "block"
    } else if reached(caps.daily_warn) {
        "warn"
    } else {
        "ok"
    }
}

async fn calls(
    stores: &dyn ServiceStores,
    scope: &Scope,
    now: DateTime<Utc>,
) -> Result<CallsView, ApiError> {
    let window = CALLS_WINDOW_MINUTES;
    let start = now - Duration::minutes(i64::from(window));
    let mut minutes: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut partial = false;
    // The newest rows of each chain, an equal share of the rows read per chain.
    let per_chain = CALLS_AUDIT_ROWS_MAX / i64::from(AUDIT_CHAINS);
    for head in stores.audit_heads(scope).await? {
        let from = (head.seq - per_chain).max(0);
        let mut first_at = None;
        let after = AuditPosition {
            chain: head.chain,
            seq: from,
        };
        walk(stores, scope, after, true, |row| {
            first_at.get_or_insert(row.event.at);
            if row.event.at < start || row.event.at > now {
                return true;
            }
            if let Some(outcome) = call_end(row) {
                let minute = (row.event.at - start).num_minutes();
                let values = minutes
                    .entry(outcome)
                    .or_insert_with(|| vec![0; window as usize]);
                if let Some(slot) = usize::try_from(minute).ok().and_then(|m| values.get_mut(m)) {
                    *slot += 1;
                }
            }
            true
        })
        .await?;
        partial |= from > 0 && first_at.is_some_and(|at| at > start);
    }
    let by_outcome = minutes
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().sum()))
        .collect();
    let series: Vec<Series<u64>> = minutes
        .into_iter()
        .map(|(label, values)| Series { label, values })
        .collect();
    let chart_svg = charts::calls_per_minute(&series, window).map_err(|e| {
        tracing::error!(error = %e, "overview chart");
        ApiError::Internal
    })?;
    Ok(CallsView {
        window_minutes: window,
        by_outcome,
        chart_svg,
        partial,
    })
}

/// `GET /v1/console/overview`.
///
/// # Errors
/// `forbidden` (a caller key), `unavailable`.
pub async fn overview(app: &App, who: &Principal) -> Result<OverviewView, ApiError> {
    allow(who, Page::Overview)?;
    let stores = app.backend.stores();
    let scope = &who.scope;
    let now = Utc::now();
    let day = now.date_naive();
    let mut open = Vec::new();
    let mut truncated = false;
    let mut backlog = 0;
    for state in [
        ExecutionState::Prepared,
        ExecutionState::Dispatched,
        ExecutionState::ReconciliationRequired,
    ] {
        let rows = stores.by_state(scope, state, OPEN_ROWS_MAX).await?;
        truncated |= rows.len() >= OPEN_ROWS_MAX as usize;
        if state == ExecutionState::ReconciliationRequired {
            backlog = rows.len();
        }
        open.extend(rows);
    }
    let mut held: BTreeMap<String, Money> = BTreeMap::new();
    for r in &open {
        let currency = r.binding.config.currency.as_str().to_string();
        let sum = held.entry(currency).or_insert(Money::ZERO);
        *sum = sum.checked_add(r.hold).map_err(|_| ApiError::Internal)?;
    }
    let mut spend = Vec::new();
    for ((consumer, currency), caps) in consumers(app, open.iter()) {
        let totals = stores.daily_spend(scope, &consumer, day, &currency).await?;
        spend.push(ConsumerSpend {
            level: level(totals.settled, totals.held, &caps),
            consumer,
            currency,
            settled: totals.settled,
            held: totals.held,
            daily_warn: caps.daily_warn,
            daily_block: caps.daily_block,
        });
    }
    let ledger = app.audit_checks.ledger(stores.as_ref(), scope).await?;
    Ok(OverviewView {
        scope: scope.to_string(),
        day,
        generated_at: now,
        calls: calls(stores.as_ref(), scope, now).await?,
        spend,
        limits: consumer_limits(app, stores.as_ref(), scope, now).await?,
        holds: HoldsView {
            count: open.len(),
            held,
            truncated,
        },
        backlog,
        backlog_truncated: backlog >= OPEN_ROWS_MAX as usize,
        scheduler: app.metrics.scheduler_health(),
        ledger: LedgerBrief {
            ok: ledger.report.ok,
            first_violation: ledger.report.first().map(ToString::to_string),
            checked: ledger.report.checked,
            violations_total: ledger.report.violations_total,
            checked_at: ledger.checked_at,
            cached: ledger.cached,
            cache_ms: ledger.cache_ms,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn money(text: &str) -> Money {
        Money::parse(text, "test").unwrap()
    }

    #[test]
    fn sc_152_spend_level_counts_held_with_settled() {
        let caps = Caps {
            daily_warn: Some(money("1.00")),
            daily_block: Some(money("2.00")),
            ..Caps::default()
        };
        assert_eq!(level(money("0.50"), money("0.40"), &caps), "ok");
        assert_eq!(level(money("0.50"), money("0.50"), &caps), "warn");
        assert_eq!(level(money("1.50"), money("0.50"), &caps), "block");
        assert_eq!(
            stricter(Some(money("2")), Some(money("1"))),
            Some(money("1"))
        );
        assert_eq!(stricter(None, Some(money("1"))), Some(money("1")));
    }
}
