//! The driver's actions on processes, faults, the clock and the scheduler, and the final phase
//! that ends every run: quiesce, kill every process, move the clock past every lease and deadline,
//! and let a fresh scheduler finish what is left before the final checks.

use super::calls::{error_kind, view_summary, CallSpec};
use super::checks;
use super::driver::Driver;
use super::process::{Runners, FAULT_POINTS};
use super::shared::Shared;
use super::universe::*;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::ids::{OperationKey, RootKey};
use tollgate_core::state::ExecutionState;
use tollgate_core::usage::Usage;
use tollgate_store::fault::FaultPoint;
use tollgate_store::ExecutionStore;

impl Driver {
    pub(super) fn kill(&mut self) {
        if self.procs.is_empty() {
            return;
        }
        let i = self.rng.index(self.procs.len());
        let mut proc = self.procs.remove(i);
        self.shared
            .excuse_blips(&proc.gate.name, "its process was killed");
        proc.kill(&self.shared);
        self.stats.kills += 1;
    }

    pub(super) fn restart(&mut self) {
        let apps = self.procs.iter().filter(|p| !p.scheduler).count();
        let scheduler = apps >= 2 || (apps > 0 && self.rng.chance(50));
        if self.procs.len() < 4 {
            self.start(scheduler);
        }
    }

    pub(super) fn arm(&mut self) {
        if self.procs.is_empty() {
            return;
        }
        let p = self.rng.index(self.procs.len());
        let f = self.rng.index(FAULT_POINTS.len());
        self.procs[p].arm(f);
        let name = &self.procs[p].gate.name;
        // A fault that lasts on the writes and reads a settlement's retry makes may outlast the
        // retry window: the drive may then give the call up to recovery.
        if matches!(
            FAULT_POINTS[f],
            FaultPoint::Settle
                | FaultPoint::SettleAfterCommit
                | FaultPoint::RecordEvidence
                | FaultPoint::Read
        ) {
            self.shared.excuse_blips(name, "a lasting fault was armed");
        }
        self.shared
            .trace(format!("arm {name} {:?}", FAULT_POINTS[f]));
    }

    pub(super) fn disarm(&mut self) {
        let armed: Vec<usize> = (0..self.procs.len())
            .filter(|p| !self.procs[*p].armed.is_empty())
            .collect();
        if armed.is_empty() {
            return;
        }
        let p = armed[self.rng.index(armed.len())];
        let n = self.rng.index(self.procs[p].armed.len());
        self.procs[p].disarm(n);
        self.shared
            .trace(format!("disarm {}", self.procs[p].gate.name));
    }

    /// The wall clock leaps ahead: seconds (a lease may expire under a running call), past a
    /// recovery lease, or rarely a day (a new accounting day).
    pub(super) fn jump(&mut self) {
        let ms = match self.rng.below(100) {
            0..=59 => self.rng.grid_ms(1_000, 12_000),
            60..=96 => self.rng.grid_ms(12_000, 40_000),
            _ => 86_400_000,
        };
        self.shared.clock.jump(ms as i64);
        self.stats.jumps += 1;
        self.shared.trace(format!("jump {ms}"));
    }

    /// A scheduler pass: `reconcile_expired` (with roots) and `reconcile_usage` on every scope.
    pub(super) fn pass(&mut self) {
        let p = self.proc_of(true);
        let (shared, runners) = (self.shared.clone(), self.procs[p].runners.clone());
        let skip = self.rng.chance(20);
        let name = self.procs[p].gate.name.clone();
        self.procs[p].tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            pass(&shared, &runners, &name, skip).await;
        });
        self.stats.passes += 1;
    }

    /// Recovers one key through the runner that owns its kind.
    pub(super) fn recover(&mut self) {
        if self.calls.is_empty() {
            return;
        }
        let spec = self.calls[self.rng.index(self.calls.len())].clone();
        let p = self.proc_of(true);
        let (shared, runners) = (self.shared.clone(), self.procs[p].runners.clone());
        let name = self.procs[p].gate.name.clone();
        self.procs[p].tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let out = recover(&runners, &spec).await;
            shared.trace(format!("{name} recover {} -> {out}", spec.describe()));
        });
    }

    /// An operator settles one `reconciliation_required` execution with stated usage.
    pub(super) async fn resolve(&mut self) {
        let s = self.rng.index(SCOPES.len());
        let state = ExecutionState::ReconciliationRequired;
        let waiting = self.shared.truth.by_state(&scope(s), state, 100).await;
        let waiting = waiting.unwrap_or_default();
        if waiting.is_empty() {
            return;
        }
        let record = waiting[self.rng.index(waiting.len())].clone();
        let usage = Usage {
            input: self.rng.range(1, 2_000),
            output: self.rng.range(1, 100),
            ..Usage::ZERO
        };
        let p = self.proc_of(true);
        let (shared, runners) = (self.shared.clone(), self.procs[p].runners.clone());
        let name = self.procs[p].gate.name.clone();
        self.procs[p].tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let out = runners
                .reconciler
                .resolve(&scope(s), record.id, usage)
                .await;
            let out = out.map_or_else(|e| super::oracle::err_kind(&e).into(), |v| view_summary(&v));
            shared.trace(format!("{name} resolve {} -> {out}", record.operation_key));
        });
    }

    /// The final phase: every in-flight call ends or is killed, the clock passes every lease and
    /// deadline, and a fresh scheduler recovers and reconciles until nothing changes (H-4).
    pub async fn finish(&mut self) {
        self.shared.trace("final: quiesce");
        for proc in &mut self.procs {
            proc.disarm_all();
        }
        tokio::time::sleep(Duration::from_millis(40_000)).await;
        for proc in &mut self.procs {
            proc.reap(&self.shared);
            proc.kill(&self.shared);
        }
        self.procs.clear();
        self.shared.calm_down();
        self.shared.clock.jump(3_600_000);
        let p = self.start(true);
        let runners = self.procs[p].runners.clone();
        for _ in 0..10 {
            let mut changed = 0;
            for s in 0..SCOPES.len() {
                let counts = runners
                    .reconciler
                    .reconcile_expired(&scope(s), 100, RECOVERY_LEASE_MS)
                    .await;
                changed += counts.map_or(1, |c| c.roots + c.executions);
            }
            if changed == 0 {
                break;
            }
        }
        for s in 0..SCOPES.len() {
            drain_usage(&self.shared, &runners, s).await;
        }
        checks::ledger(&self.shared).await;
        checks::final_checks(&self.shared, &self.provider).await;
    }
}

async fn drain_usage(shared: &Shared, runners: &Runners, s: usize) {
    let mut after = None;
    for _ in 0..1_000 {
        let out = runners
            .reconciler
            .reconcile_usage(&scope(s), Some(100), after, &|_| false)
            .await;
        match out {
            Ok(counts) if counts.scanned > 0 => after = counts.cursor,
            Ok(_) => return,
            Err(e) => {
                shared.violation(format!("final reconcile_usage failed: {e}"));
                return;
            }
        }
    }
}

/// One scheduler pass over every scope; `skip` leaves keys ending in 3 pending (SC-44).
async fn pass(shared: &Shared, runners: &Runners, name: &str, skip: bool) {
    for s in 0..SCOPES.len() {
        let scope = scope(s);
        let expired = runners
            .reconciler
            .reconcile_expired(&scope, 100, RECOVERY_LEASE_MS)
            .await;
        let expired = expired.map_or_else(
            |e| super::oracle::err_kind(&e).to_string(),
            |c| format!("roots {} executions {}", c.roots, c.executions),
        );
        let skipping = move |k: &OperationKey| skip && k.as_str().ends_with('3');
        let usage = runners
            .reconciler
            .reconcile_usage(&scope, Some(50), None, &skipping)
            .await;
        let usage = usage.map_or_else(
            |e| super::oracle::err_kind(&e).to_string(),
            |c| format!("scanned {} acknowledged {}", c.scanned, c.acknowledged),
        );
        shared.trace(format!("{name} pass {scope}: {expired}; {usage}"));
    }
}

async fn recover(runners: &Arc<Runners>, spec: &CallSpec) -> String {
    let (s, c) = (scope(spec.scope), spec.consumer);
    let key = OperationKey::parse(spec.key.as_str()).unwrap();
    let r = &runners.reconciler;
    let lease = RECOVERY_LEASE_MS;
    let out = match spec.kind {
        Kind::Text | Kind::Json => r
            .recover(&s, &key, lease)
            .await
            .map_err(|e| super::oracle::err_kind(&e).to_string()),
        Kind::Structured => runners.structured[c]
            .recover(r, &s, &key, lease)
            .await
            .map_err(|e| error_kind(&e)),
        Kind::Step => {
            let root = RootKey::parse(spec.root.clone().unwrap_or_default()).unwrap();
            runners.steps[c]
                .recover(r, &s, &root, &key, lease)
                .await
                .map_err(|e| error_kind(&e))
        }
    };
    match out {
        Ok(Some(view)) => view_summary(&view),
        Ok(None) => "none".into(),
        Err(e) => e,
    }
}
