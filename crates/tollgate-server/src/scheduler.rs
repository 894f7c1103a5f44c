//! The scheduler (spec/service.md — Scheduler): every `interval_ms` (± 20 % jitter) it visits
//! the scopes that have work and runs, in bounded batches, `reconcile_expired` (executions, then
//! roots: expiry and reconciliation), `reconcile_usage`, and retention erasure. Every
//! `ledger_audit_interval_ms` it also audits the ledger of the pass's scopes (read-only) and
//! reports drift as metrics and warnings naming invariants and ids only. With
//! `[scheduler] fetch_evidence = true` (default off) it also fetches usage of finished responses
//! for executions awaiting an operator into the inbox as `late` evidence (SC-113); that never
//! settles anything.
//!
//! Many instances may run at once (inside each `serve` and as `tollgate scheduler`): every
//! finishing write goes through a fence, so two instances can never finish one execution twice —
//! the loser of a race finds no eligible fence and skips. A failed task is logged and counted;
//! the pass goes on with the next one. Shutdown is checked between tasks and during the sleep.

use crate::app::Fetchers;
use crate::backend::Backend;
use crate::config::SchedulerSettings;
use crate::metrics::{Metrics, PassCounts};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::{OperationKey, Scope};
use tollgate_core::state::ExecutionState;
use tollgate_runner::recovery::Reconciler;
use tollgate_store::{LedgerViolation, ServiceStores, StoreError};

/// Scopes visited per pass at most (the rest get their turn in the next passes).
pub const SCOPES_PER_PASS_MAX: u32 = 1_000;
/// Erasure batches per pass at most.
pub const ERASE_BATCHES_PER_PASS_MAX: u32 = 10;
/// Executions awaiting an operator counted per scope for the backlog gauge.
pub const BACKLOG_COUNT_PER_SCOPE_MAX: u32 = 100;
/// Violations listed (and logged) per scope by a scheduled ledger audit; all are counted.
pub const LEDGER_AUDIT_LIMIT: u32 = 20;
/// Shortest time between two evidence fetches of one scheduler: executions whose response
/// cannot be fetched stay in the backlog and would otherwise be asked for every pass.
pub const FETCH_EVIDENCE_INTERVAL_MS: u64 = 60_000;
/// Jitter of the period, in percent either way.
const JITTER_PERCENT: u64 = 20;

/// Periodic recovery, reconciliation and erasure over the scopes with work; many may run at once.
pub struct Scheduler {
    stores: Arc<dyn ServiceStores>,
    reconciler: Reconciler,
    settings: SchedulerSettings,
    lease_ms: u64,
    metrics: Arc<Metrics>,
    /// Where each scope's usage scan continues (its unacknowledged rows may stay pending).
    usage_cursors: HashMap<Scope, i64>,
    /// The last scope visited when a pass stopped at [`SCOPES_PER_PASS_MAX`].
    scope_cursor: Option<Scope>,
    /// Period of the ledger audit; `None` = off.
    ledger_audit_every: Option<Duration>,
    /// When the last ledger audit ran.
    last_ledger_audit: Option<Instant>,
    /// Usage fetchers when the evidence fetch is on; `None` = off.
    fetchers: Option<Arc<Fetchers>>,
    /// When the last pass with an evidence fetch started.
    last_fetch: Option<Instant>,
    /// Whether this pass fetches evidence.
    fetch_now: bool,
}

impl Scheduler {
    /// A scheduler over `backend`.
    pub fn new(
        backend: Backend,
        settings: SchedulerSettings,
        lease_ms: u64,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            reconciler: crate::app::reconciler(&backend),
            stores: backend.stores(),
            settings,
            lease_ms,
            metrics,
            usage_cursors: HashMap::new(),
            scope_cursor: None,
            ledger_audit_every: Some(Duration::from_millis(
                crate::config::LEDGER_AUDIT_INTERVAL_MS_DEFAULT,
            )),
            last_ledger_audit: None,
            fetchers: None,
            last_fetch: None,
            fetch_now: false,
        }
    }

    /// Fetches usage of finished responses for `reconciliation_required` executions with a
    /// provider reference, at most `batch` per scope, in at most one pass every
    /// [`FETCH_EVIDENCE_INTERVAL_MS`] (SC-113); `None` turns it off.
    pub fn with_evidence_fetch(mut self, fetchers: Option<Arc<Fetchers>>) -> Self {
        self.fetchers = fetchers;
        self
    }

    /// Audits the ledger of the scopes with work every `interval_ms` (0 = never); the first pass
    /// audits at once.
    pub fn with_ledger_audit_interval(mut self, interval_ms: u64) -> Self {
        self.ledger_audit_every = (interval_ms > 0).then(|| Duration::from_millis(interval_ms));
        self
    }

    /// Runs passes until `shutdown` fires; a pass in progress stops at its next task.
    pub async fn run(mut self, shutdown: CancellationToken) {
        tracing::info!(interval_ms = self.settings.interval_ms, "scheduler started");
        loop {
            let started = Instant::now();
            let counts = self.pass(&shutdown).await;
            let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.metrics.observe_pass(&counts, took);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.period()) => {}
            }
        }
        tracing::info!("scheduler stopped");
    }

    fn period(&self) -> Duration {
        let base = self.settings.interval_ms;
        let spread = base * JITTER_PERCENT / 100;
        // Random enough to spread instances apart; no cryptographic need.
        let draw =
            u64::try_from(uuid::Uuid::new_v4().as_u128() % u128::from(2 * spread + 1)).unwrap_or(0);
        Duration::from_millis(base - spread + draw)
    }

    /// One pass over the scopes with work, then erasure.
    pub async fn pass(&mut self, shutdown: &CancellationToken) -> PassCounts {
        let mut counts = PassCounts::default();
        let scopes = match self
            .stores
            .scopes_with_work(self.scope_cursor.as_ref(), SCOPES_PER_PASS_MAX)
            .await
        {
            Ok(scopes) => scopes,
            Err(e) => {
                failed(&mut counts, "scopes", &e);
                Vec::new()
            }
        };
        self.scope_cursor = match scopes.last() {
            Some(last) if scopes.len() >= SCOPES_PER_PASS_MAX as usize => Some(last.clone()),
            _ => None,
        };
        self.fetch_now = self.fetchers.is_some()
            && self.last_fetch.is_none_or(|last| {
                last.elapsed() >= Duration::from_millis(FETCH_EVIDENCE_INTERVAL_MS)
            });
        if self.fetch_now {
            self.last_fetch = Some(Instant::now());
        }
        for scope in &scopes {
            if shutdown.is_cancelled() {
                return counts;
            }
            counts.scopes += 1;
            self.scope_pass(scope, &mut counts).await;
        }
        if self.ledger_audit_due() {
            self.last_ledger_audit = Some(Instant::now());
            self.ledger_audit(&scopes, &mut counts, shutdown).await;
        }
        self.erase(&mut counts, shutdown).await;
        counts
    }

    fn ledger_audit_due(&self) -> bool {
        match (self.ledger_audit_every, self.last_ledger_audit) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(every), Some(last)) => last.elapsed() >= every,
        }
    }

    /// The ledger audit of each scope (spec/storage.md — Ledger audit): read-only, one scope at a
    /// time, at most [`LEDGER_AUDIT_LIMIT`] violations listed per scope. Drift becomes a
    /// warning per listed violation (invariant and ids only) and the pass's counts.
    async fn ledger_audit(
        &self,
        scopes: &[Scope],
        counts: &mut PassCounts,
        shutdown: &CancellationToken,
    ) {
        let stores = &self.stores;
        for scope in scopes {
            if shutdown.is_cancelled() {
                return;
            }
            match stores.audit_ledger(Some(scope), LEDGER_AUDIT_LIMIT).await {
                Ok(report) => {
                    counts.ledger_audited += 1;
                    counts.ledger_violations += report.violations_total;
                    report.violations.iter().for_each(drift);
                }
                Err(e) => failed(counts, "ledger_audit", &e),
            }
        }
    }

    async fn scope_pass(&mut self, scope: &Scope, counts: &mut PassCounts) {
        let batch = self.settings.batch;
        match self
            .reconciler
            .reconcile_expired(scope, batch, self.lease_ms)
            .await
        {
            Ok(done) => {
                counts.executions += done.executions;
                counts.roots += done.roots;
            }
            Err(e) => failed(counts, "reconcile_expired", &e),
        }
        let after = self.usage_cursors.get(scope).copied();
        let none = |_: &OperationKey| false;
        match self
            .reconciler
            .reconcile_usage(scope, Some(batch), after, &none)
            .await
        {
            Ok(usage) => {
                counts.acknowledged += usage.acknowledged;
                counts.evidence_pending += usage.scanned - usage.acknowledged;
                // A short page reached the end: start over next pass; otherwise continue.
                match usage.cursor {
                    Some(cursor) if usage.scanned >= u64::from(batch) => {
                        self.usage_cursors.insert(scope.clone(), cursor);
                    }
                    _ => {
                        self.usage_cursors.remove(scope);
                    }
                }
            }
            Err(e) => failed(counts, "reconcile_usage", &e),
        }
        if let Some(fetchers) = self.fetchers.as_ref().filter(|_| self.fetch_now) {
            let fetcher_for = |name: &str| fetchers.get(name).cloned();
            match self
                .reconciler
                .fetch_evidence(scope, batch, &fetcher_for)
                .await
            {
                Ok(report) if report.stored > 0 => {
                    tracing::info!(scope = %scope, stored = report.stored, "late evidence fetched");
                }
                Ok(_) => {}
                Err(e) => failed(counts, "fetch_evidence", &e),
            }
        }
        match self
            .stores
            .by_state(
                scope,
                ExecutionState::ReconciliationRequired,
                BACKLOG_COUNT_PER_SCOPE_MAX,
            )
            .await
        {
            Ok(rows) => counts.awaiting_operator += rows.len() as u64,
            Err(e) => failed(counts, "backlog", &e),
        }
    }

    async fn erase(&self, counts: &mut PassCounts, shutdown: &CancellationToken) {
        let batch = self.settings.batch;
        for _ in 0..ERASE_BATCHES_PER_PASS_MAX {
            if shutdown.is_cancelled() {
                return;
            }
            match self.reconciler.erase_expired(batch).await {
                Ok(erased) => {
                    counts.erased += erased;
                    if erased < u64::from(batch) {
                        return;
                    }
                }
                Err(e) => {
                    failed(counts, "erase_expired", &e);
                    return;
                }
            }
        }
    }
}

/// One violation as a warning: the invariant and the ids of the rows, no amounts, no content.
fn drift(v: &LedgerViolation) {
    tracing::warn!(
        invariant = v.invariant.as_str(),
        reason = %v.reason,
        scope = %v.scope,
        spend = ?v.spend,
        execution_id = ?v.execution_id,
        operation_key = ?v.operation_key,
        settlement_id = ?v.settlement_id,
        evidence_id = ?v.evidence_id,
        root_id = ?v.root_id,
        root_key = ?v.root_key,
        "ledger drift"
    );
}

fn failed(counts: &mut PassCounts, task: &'static str, error: &StoreError) {
    counts.errors += 1;
    tracing::warn!(task, error = %error, "scheduler task failed");
}
