//! In-process metrics in the Prometheus text format: counters and gauges kept with atomics
//! (settled spend, an exact decimal, under a mutex). Labels are fixed names — outcomes, error
//! codes, currencies — never content, keys or ids.

use crate::error::ApiError;
use rust_decimal::Decimal;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use tollgate_core::limits::LimitKind;
use tollgate_core::view::{View, ViewState};

/// Outcome labels of `tollgate_calls_total` (the view's outcome, or its state when not completed).
const OUTCOMES: [&str; 9] = [
    "success",
    "invalid",
    "refused",
    "blocked",
    "truncated",
    "unavailable",
    "in_progress",
    "not_dispatched",
    "reconciliation_required",
];

/// Code labels of `tollgate_call_errors_total`.
const CODES: [&str; 15] = [
    "unauthenticated",
    "forbidden",
    "not_found",
    "conflict",
    "invalid_request",
    "cap_blocked",
    "rate_limited",
    "root_closed",
    "root_expired",
    "invalid_state",
    "unavailable",
    "interrupted",
    "method_not_allowed",
    "internal",
    "other",
];

/// Subject labels of `tollgate_rate_limited_total` (`LimitSubject::kind`).
const LIMIT_SUBJECTS: [&str; 2] = ["consumer", "key"];

/// Unlabelled metrics: name, type, help (values from `Metrics::single_values`, same order).
const SINGLES: [(&str, &str, &str); 11] = [
    (
        "tollgate_replays_total",
        "counter",
        "Answers that replayed an earlier claim.",
    ),
    (
        "tollgate_settled_above_hold_total",
        "counter",
        "Calls of this process whose settlement charged more than their hold (SC-207).",
    ),
    (
        "tollgate_holds_in_flight",
        "gauge",
        "Calls of this process holding their worst case against caps.",
    ),
    (
        "tollgate_scheduler_passes_total",
        "counter",
        "Scheduler passes.",
    ),
    (
        "tollgate_scheduler_errors_total",
        "counter",
        "Failed scheduler tasks.",
    ),
    (
        "tollgate_scheduler_last_pass_duration_ms",
        "gauge",
        "Duration of the last pass.",
    ),
    (
        "tollgate_scheduler_last_pass_timestamp_seconds",
        "gauge",
        "End of the last pass (Unix time); scheduler lag = now - this.",
    ),
    (
        "tollgate_reconciled_executions_total",
        "counter",
        "Executions finished by reconcile_expired.",
    ),
    (
        "tollgate_reconciled_roots_total",
        "counter",
        "Roots changed by reconcile_expired.",
    ),
    (
        "tollgate_evidence_acknowledged_total",
        "counter",
        "Usage evidence acknowledged.",
    ),
    (
        "tollgate_results_erased_total",
        "counter",
        "Results erased after retention.",
    ),
];

/// Counts of one scheduler pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassCounts {
    /// Scopes visited.
    pub scopes: u64,
    /// Executions finished by `reconcile_expired`.
    pub executions: u64,
    /// Roots changed by `reconcile_expired`.
    pub roots: u64,
    /// Evidence rows acknowledged.
    pub acknowledged: u64,
    /// Evidence rows left unacknowledged in the pages scanned.
    pub evidence_pending: u64,
    /// Executions awaiting an operator (counted up to a bound per scope).
    pub awaiting_operator: u64,
    /// Results erased.
    pub erased: u64,
    /// Failed tasks (logged).
    pub errors: u64,
    /// Scopes whose ledger was audited (zero when no audit was due).
    pub ledger_audited: u64,
    /// Ledger violations found in those scopes.
    pub ledger_violations: u64,
}

/// The scheduler's health, read from the counters (see [`Metrics::scheduler_health`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SchedulerHealth {
    /// Passes run by this process.
    pub passes: u64,
    /// Failed tasks over those passes.
    pub failed_tasks: u64,
    /// End of the last pass; `None` before the first.
    pub last_pass_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Duration of the last pass, in milliseconds.
    pub last_pass_ms: u64,
    /// Scheduled ledger audits run.
    pub ledger_audit_runs: u64,
    /// Violations found by the last scheduled ledger audit.
    pub ledger_violations_last: u64,
}

/// The service's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    calls: [AtomicU64; OUTCOMES.len()],
    replays: AtomicU64,
    above_hold: AtomicU64,
    errors: [AtomicU64; CODES.len()],
    /// Refusals by limit: subject kind × limit kind (`LimitKind::ALL` order).
    rate_limited: [[AtomicU64; 4]; 2],
    spend: Mutex<BTreeMap<String, Decimal>>,
    holds_in_flight: AtomicI64,
    backlog_executions: AtomicU64,
    backlog_evidence: AtomicU64,
    passes: AtomicU64,
    pass_errors: AtomicU64,
    last_pass_ms: AtomicU64,
    last_pass_unix_secs: AtomicU64,
    reconciled_executions: AtomicU64,
    reconciled_roots: AtomicU64,
    acknowledged: AtomicU64,
    erased: AtomicU64,
    ledger_audit_runs: AtomicU64,
    ledger_violations: AtomicU64,
}

/// Counts a call in flight (it holds its worst case against the caps) until dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.holds_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Marks a call in flight until the guard drops.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.holds_in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// Records the answer of a call or step run.
    pub fn observe(&self, result: &Result<View, ApiError>) {
        match result {
            Ok(view) => self.observe_view(view),
            Err(e) => {
                let at = CODES.iter().position(|c| *c == e.code());
                let at = at.unwrap_or(CODES.len() - 1);
                self.errors[at].fetch_add(1, Ordering::Relaxed);
                if let ApiError::RateLimited(r) = e {
                    let subject = LIMIT_SUBJECTS.iter().position(|s| *s == r.subject.kind());
                    let kind = LimitKind::ALL.iter().position(|k| *k == r.kind);
                    if let (Some(s), Some(k)) = (subject, kind) {
                        self.rate_limited[s][k].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    fn observe_view(&self, view: &View) {
        let label = match (view.state, view.outcome) {
            (ViewState::Completed, Some(outcome)) => outcome.as_str(),
            (ViewState::Completed, None) => "unavailable",
            (ViewState::InProgress, _) => "in_progress",
            (ViewState::NotDispatched, _) => "not_dispatched",
            (ViewState::ReconciliationRequired, _) => "reconciliation_required",
        };
        if let Some(at) = OUTCOMES.iter().position(|o| *o == label) {
            self.calls[at].fetch_add(1, Ordering::Relaxed);
        }
        if view.replayed {
            self.replays.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if view.above_hold {
            self.above_hold.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(receipt) = &view.receipt {
            let mut spend = self.spend.lock().unwrap_or_else(|p| p.into_inner());
            let total = spend
                .entry(receipt.currency.as_str().to_string())
                .or_default();
            *total = total.saturating_add(receipt.amount.decimal());
        }
    }

    /// Records a scheduler pass.
    pub fn observe_pass(&self, counts: &PassCounts, duration_ms: u64) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.pass_errors.fetch_add(counts.errors, Ordering::Relaxed);
        self.last_pass_ms.store(duration_ms, Ordering::Relaxed);
        let now = chrono::Utc::now().timestamp();
        self.last_pass_unix_secs
            .store(u64::try_from(now).unwrap_or(0), Ordering::Relaxed);
        self.reconciled_executions
            .fetch_add(counts.executions, Ordering::Relaxed);
        self.reconciled_roots
            .fetch_add(counts.roots, Ordering::Relaxed);
        self.acknowledged
            .fetch_add(counts.acknowledged, Ordering::Relaxed);
        self.erased.fetch_add(counts.erased, Ordering::Relaxed);
        self.backlog_executions
            .store(counts.awaiting_operator, Ordering::Relaxed);
        self.backlog_evidence
            .store(counts.evidence_pending, Ordering::Relaxed);
        if counts.ledger_audited > 0 {
            self.ledger_audit_runs.fetch_add(1, Ordering::Relaxed);
            self.ledger_violations
                .store(counts.ledger_violations, Ordering::Relaxed);
        }
    }

    /// The scheduler's health as the console shows it: passes, failed tasks, the last pass and
    /// the last scheduled ledger audit (this process's counters).
    pub fn scheduler_health(&self) -> SchedulerHealth {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let last = load(&self.last_pass_unix_secs);
        SchedulerHealth {
            passes: load(&self.passes),
            failed_tasks: load(&self.pass_errors),
            last_pass_at: (last > 0)
                .then(|| i64::try_from(last).ok())
                .flatten()
                .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0)),
            last_pass_ms: load(&self.last_pass_ms),
            ledger_audit_runs: load(&self.ledger_audit_runs),
            ledger_violations_last: load(&self.ledger_violations),
        }
    }

    /// Values of [`SINGLES`], in its order.
    fn single_values(&self) -> [u64; SINGLES.len()] {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            load(&self.replays),
            load(&self.above_hold),
            self.holds_in_flight
                .load(Ordering::Relaxed)
                .max(0)
                .unsigned_abs(),
            load(&self.passes),
            load(&self.pass_errors),
            load(&self.last_pass_ms),
            load(&self.last_pass_unix_secs),
            load(&self.reconciled_executions),
            load(&self.reconciled_roots),
            load(&self.acknowledged),
            load(&self.erased),
        ]
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let help = "Call and step answers by outcome (or state when not completed).";
        header(&mut out, "tollgate_calls_total", "counter", help);
        for (label, count) in OUTCOMES.iter().zip(&self.calls) {
            let value = load(count);
            let _ = writeln!(out, "tollgate_calls_total{{outcome=\"{label}\"}} {value}");
        }
        let help = "Call and step errors by code.";
        header(&mut out, "tollgate_call_errors_total", "counter", help);
        for (label, count) in CODES.iter().zip(&self.errors) {
            let value = load(count);
            let _ = writeln!(
                out,
                "tollgate_call_errors_total{{code=\"{label}\"}} {value}"
            );
        }
        let help = "Calls refused by a rate or concurrency limit, by subject and limit (SC-224).";
        header(&mut out, "tollgate_rate_limited_total", "counter", help);
        for (subject, counts) in LIMIT_SUBJECTS.iter().zip(&self.rate_limited) {
            for (kind, count) in LimitKind::ALL.iter().zip(counts) {
                let value = load(count);
                let _ = writeln!(
                    out,
                    "tollgate_rate_limited_total{{subject=\"{subject}\",limit=\"{}\"}} {value}",
                    kind.as_str()
                );
            }
        }
        let help = "Settled spend of calls run by this process, by currency.";
        header(&mut out, "tollgate_settled_spend_total", "counter", help);
        let spend = self.spend.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (currency, amount) in spend {
            let amount = amount.normalize();
            let _ = writeln!(
                out,
                "tollgate_settled_spend_total{{currency=\"{currency}\"}} {amount}"
            );
        }
        let help = "Work left after the last scheduler pass.";
        header(&mut out, "tollgate_reconciliation_backlog", "gauge", help);
        for (kind, gauge) in [
            ("awaiting_operator", &self.backlog_executions),
            ("evidence_pending", &self.backlog_evidence),
        ] {
            let value = load(gauge);
            let _ = writeln!(
                out,
                "tollgate_reconciliation_backlog{{kind=\"{kind}\"}} {value}"
            );
        }
        for ((name, kind, help), value) in SINGLES.iter().zip(self.single_values()) {
            header(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {value}");
        }
        self.render_ledger(&mut out);
        out
    }

    /// The scheduler's ledger audit: rounds run, and violations found by the last one.
    fn render_ledger(&self, out: &mut String) {
        for (name, kind, help, value) in [
            (
                "tollgate_ledger_audit_runs_total",
                "counter",
                "Scheduled ledger audits (each over the scopes of one pass).",
                &self.ledger_audit_runs,
            ),
            (
                "tollgate_ledger_violations",
                "gauge",
                "Ledger invariant violations found by the last scheduled ledger audit.",
                &self.ledger_violations,
            ),
        ] {
            header(out, name, kind, help);
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::ids::OperationKey;

    fn completed(above_hold: bool, replayed: bool) -> View {
        let mut view =
            tollgate_runner::views::bare(OperationKey::parse("k").unwrap(), ViewState::Completed);
        view.outcome = Some(tollgate_core::state::Outcome::Success);
        view.above_hold = above_hold;
        view.replayed = replayed;
        view
    }

    #[test]
    fn sc_207_settlements_above_their_hold_are_counted() {
        let metrics = Metrics::default();
        metrics.observe(&Ok(completed(true, false)));
        metrics.observe(&Ok(completed(false, false)));
        metrics.observe(&Ok(completed(false, true)));
        let text = metrics.render();
        assert!(
            text.contains("\ntollgate_settled_above_hold_total 1\n"),
            "{text}"
        );
    }
}
