//! The oracle: what the store wrapper reports right after each commit, checked against the model
//! of what was committed before it.
//!
//! - H-3: a fenced write (`mark_*`, `settle`) that commits must carry the token last issued for
//!   its execution, by its claim or by the last `take_fence`.
//! - SC-16, ST-7: after every commit, settled + held of each spend row it touched (session, day,
//!   root) stays within the row's block cap, plus whatever was settled above a call's worst case
//!   (the only way past a block cap, spec/money.md).
//! - SC-13, ST-6: at most one settlement commits per execution.

use super::shared::{root_row, Known, Row, Shared};
use super::universe::{caps, currency, id, CONSUMERS};
use std::sync::Arc;
use tollgate_core::ids::{ExecutionId, OperationKey, Scope};
use tollgate_core::money::Money;
use tollgate_store::*;

/// A store error's kind, without ids (the trace must not depend on random ids).
pub fn err_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Unavailable(_) => "unavailable",
        StoreError::StaleFence(_) => "stale_fence",
        StoreError::NotFound(_) => "not_found",
        StoreError::Duplicate(_) => "duplicate",
        StoreError::Corrupt(_) => "corrupt",
        StoreError::HoldGrows(_) => "hold_grows",
        StoreError::HoldUnderflow { .. } => "hold_underflow",
        StoreError::CurrencyMismatch { .. } => "currency_mismatch",
    }
}

fn rows_of(record: &ExecutionRecord) -> Vec<Row> {
    let scope = record.scope.to_string();
    let consumer = record.consumer().to_string();
    let mut rows = vec![
        Row::Session(
            scope.clone(),
            consumer.clone(),
            record.session_id().to_string(),
        ),
        Row::Daily(scope, consumer, record.accounting_day),
    ];
    if let Some(root) = &record.root_key {
        rows.push(root_row(&record.scope, root));
    }
    rows
}

impl Shared {
    /// The scope of an execution the oracle saw claimed.
    pub fn scope_of(&self, id: ExecutionId) -> Option<Scope> {
        self.model().executions.get(&id).map(|k| k.scope.clone())
    }

    fn key_of(&self, id: ExecutionId) -> String {
        self.model()
            .executions
            .get(&id)
            .map(|k| format!("{}/{}", k.scope, k.key))
            .unwrap_or_else(|| "?".into())
    }
}

/// After `claim`.
pub async fn on_claim(
    shared: &Arc<Shared>,
    proc: &str,
    request: &ClaimRequest,
    out: &StoreResult<ClaimOutcome>,
) {
    let what = format!("{}/{}", request.scope, request.operation_key);
    let record = match out {
        Ok(ClaimOutcome::Claimed(record)) => record,
        Ok(ClaimOutcome::Existing(r)) => {
            return shared.trace(format!(
                "{proc} claim {what} -> existing {}",
                r.execution.state
            ));
        }
        Ok(ClaimOutcome::Blocked(b)) => {
            return shared.trace(format!(
                "{proc} claim {what} -> blocked {}",
                b.window.as_str()
            ));
        }
        Ok(ClaimOutcome::Limited(r)) => {
            return shared.trace(format!("{proc} claim {what} -> limited {}", r.kind));
        }
        Ok(ClaimOutcome::RootRefused(r)) => {
            return shared.trace(format!(
                "{proc} claim {what} -> root refused {}",
                r.state.as_str()
            ));
        }
        Err(e) => return shared.trace(format!("{proc} claim {what} -> {}", err_kind(e))),
    };
    let rows = rows_of(record);
    {
        let mut model = shared.model();
        model.commits += 1;
        model.rows.extend(rows.iter().cloned());
        model.executions.insert(
            record.id,
            Known {
                scope: record.scope.clone(),
                key: record.operation_key.to_string(),
                token: record.fence.0,
                hold: record.hold,
                rows: rows.clone(),
                settlements: 0,
                fences: Default::default(),
                reconciled: None,
            },
        );
    }
    shared.trace(format!(
        "{proc} claim {what} -> claimed hold {}",
        record.hold
    ));
    check_rows(shared, &rows).await;
}

/// Checks the writer's token against the one last issued; returns the execution's rows.
fn check_token(shared: &Shared, op: &str, fence: Fence) -> Vec<Row> {
    let mut model = shared.model();
    model.commits += 1;
    let commit = model.commits;
    let Some(known) = model.executions.get_mut(&fence.execution_id) else {
        drop(model);
        shared.violation(format!("{op} committed for an execution never claimed"));
        return Vec::new();
    };
    if op == "mark_reconciliation_required" {
        known.reconciled = Some((fence.token.0, commit));
    }
    let (current, rows, key) = (known.token, known.rows.clone(), known.key.clone());
    drop(model);
    if current != fence.token.0 {
        shared.violation(format!(
            "H-3: {op} of {key} committed with stale fence token {} (current {current})",
            fence.token.0
        ));
    }
    rows
}

/// After a dispatch mark that shrank the hold: the model's hold follows (SC-122).
pub fn on_hold_shrunk(shared: &Shared, fence: Fence, out: &StoreResult<ExecutionRecord>) {
    if let Ok(record) = out {
        if let Some(known) = shared.model().executions.get_mut(&fence.execution_id) {
            known.hold = record.hold;
        }
    }
}

/// After a fenced journal transition.
pub async fn on_fenced(
    shared: &Arc<Shared>,
    proc: &str,
    op: &str,
    fence: Fence,
    out: &StoreResult<ExecutionRecord>,
) {
    let what = shared.key_of(fence.execution_id);
    let token = fence.token.0;
    match out {
        Ok(record) => {
            let rows = check_token(shared, op, fence);
            shared.trace(format!("{proc} {op} {what} #{token} -> {}", record.state));
            check_rows(shared, &rows).await;
        }
        Err(e) => shared.trace(format!("{proc} {op} {what} #{token} -> {}", err_kind(e))),
    }
}

/// After `settle`.
pub async fn on_settle(
    shared: &Arc<Shared>,
    proc: &str,
    fence: Fence,
    out: &StoreResult<SettleOutcome>,
) {
    let what = shared.key_of(fence.execution_id);
    let token = fence.token.0;
    let settled = match out {
        Ok(settled) => settled,
        Err(e) => return shared.trace(format!("{proc} settle {what} #{token} -> {}", err_kind(e))),
    };
    let rows = check_token(shared, "settle", fence);
    let amount = settled.settlement.amount;
    let second = {
        let mut model = shared.model();
        let known = model.executions.get_mut(&fence.execution_id);
        let (count, hold) = known
            .map(|k| {
                k.settlements += 1;
                (k.settlements, k.hold)
            })
            .unwrap_or((1, Money::ZERO));
        // What was settled above the call's worst case (zero when it stayed within it).
        let excess = amount.checked_sub(hold).unwrap_or(Money::ZERO);
        for row in &rows {
            let total = model.excess.entry(row.clone()).or_insert(Money::ZERO);
            *total = total.checked_add(excess).unwrap_or(*total);
        }
        count > 1
    };
    if second {
        shared.violation(format!("SC-13: a second settlement of {what} committed"));
    }
    shared.trace(format!(
        "{proc} settle {what} #{token} -> {} {} {}",
        amount,
        settled.result.outcome.as_str(),
        settled.settlement.source.as_str()
    ));
    check_rows(shared, &rows).await;
}

/// After `take_fence`.
pub fn on_take_fence(
    shared: &Shared,
    proc: &str,
    key: &OperationKey,
    out: &StoreResult<Option<ExecutionRecord>>,
) {
    match out {
        Ok(Some(record)) => {
            let mut model = shared.model();
            model.commits += 1;
            let commit = model.commits;
            if let Some(known) = model.executions.get_mut(&record.id) {
                known.token = record.fence.0;
                known.fences.insert(record.fence.0, commit);
            }
            drop(model);
            shared.fence_taken(record.id);
            shared.trace(format!("{proc} take_fence {key} -> #{}", record.fence.0));
        }
        Ok(None) => shared.trace(format!("{proc} take_fence {key} -> none")),
        Err(e) => shared.trace(format!("{proc} take_fence {key} -> {}", err_kind(e))),
    }
}

/// After `record_evidence`.
pub fn on_evidence(shared: &Shared, proc: &str, out: &StoreResult<Evidence>) {
    match out {
        Ok(e) => {
            let mut model = shared.model();
            model.commits += 1;
            let commit = model.commits;
            model.evidence.insert(e.id, commit);
            drop(model);
            shared.trace(format!(
                "{proc} evidence {} exact={} total={}",
                e.operation_key,
                e.exact,
                e.usage.total()
            ));
        }
        Err(e) => shared.trace(format!("{proc} evidence -> {}", err_kind(e))),
    }
}

/// After any other write.
pub fn on_write<T>(shared: &Shared, proc: &str, op: &str, scope: &Scope, out: &StoreResult<T>) {
    match out {
        Ok(_) => {
            shared.model().commits += 1;
            shared.trace(format!("{proc} {op} {scope} -> ok"));
        }
        Err(e) => shared.trace(format!("{proc} {op} {scope} -> {}", err_kind(e))),
    }
}

/// The block cap of a row, if it has one, and its current totals.
async fn row_state(shared: &Shared, row: &Row) -> Option<(Money, Money, Money)> {
    let truth = &shared.truth;
    let consumer_cap = |name: &str| CONSUMERS.iter().position(|c| *c == name).map(caps);
    let (limit, totals) = match row {
        Row::Session(scope, consumer, session) => {
            let limit = consumer_cap(consumer)?.session_block?;
            let (s, c, n) = (id::<Scope>(scope), id(consumer), id(session));
            let totals = truth.session_spend(&s, &c, &n, &currency()).await;
            (limit, totals.ok()?)
        }
        Row::Daily(scope, consumer, day) => {
            let limit = consumer_cap(consumer)?.daily_block?;
            let (s, c) = (id::<Scope>(scope), id(consumer));
            let totals = truth.daily_spend(&s, &c, *day, &currency()).await;
            (limit, totals.ok()?)
        }
        Row::Root(scope, key) => {
            let root = truth.root(&id::<Scope>(scope), &id(key)).await.ok()??;
            (root.binding.config.caps.root_block?, root.totals())
        }
    };
    Some((limit, totals.settled, totals.held))
}

/// SC-16 / ST-7 on `rows`.
pub async fn check_rows(shared: &Shared, rows: &[Row]) {
    for row in rows {
        let Some((limit, settled, held)) = row_state(shared, row).await else {
            continue;
        };
        let excess = shared
            .model()
            .excess
            .get(row)
            .copied()
            .unwrap_or(Money::ZERO);
        let used = settled.checked_add(held).unwrap_or(settled);
        let allowed = limit.checked_add(excess).unwrap_or(limit);
        if used > allowed {
            shared.violation(format!(
                "SC-16: {row:?} settled {settled} + held {held} above block {limit} \
                 (+ {excess} settled above worst cases)"
            ));
        }
    }
}
