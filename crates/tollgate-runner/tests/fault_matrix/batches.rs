//! The batch points of the fault matrix, on Postgres: the claim batch and the settlement batch
//! of one shard, each statement of two calls or more × every way a batch statement ends
//! (`BatchFaultKind`: refused, not sent, the process dying before it or after its commit, the
//! connection lost before or after the commit with the outcome unknown to the client).
//!
//! A combination runs a batch case ([`Case::BATCHES`]) over stores of its own (its own pool, lane
//! and batch queues, gathered by the hook so its concurrent calls form batches every time), then
//! process 2 on other fresh stores, and the checks of every combination ([`after_setup`]).

use super::*;
use futures::StreamExt;
use std::time::Instant;
use tollgate_postgres::test_support::{BatchFault, BatchFaultKind, BatchFaults, BatchPoint};
use tollgate_testkit::pg::{TestDatabase, TEST_POOL_CONNECTIONS};

/// How long closing a combination's stores may take (their connections are all idle by then).
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// One combination's result.
pub struct BatchCell {
    pub fault: BatchFault,
    pub hit: bool,
    pub life: Life,
    pub violations: Vec<String>,
}

/// A batch case's matrix.
pub struct BatchReport {
    pub case: Case,
    /// Batch statements (two calls or more) at each point in the unfaulted probe.
    pub batches: BTreeMap<BatchPoint, u64>,
    /// Their sizes.
    pub sizes: Vec<(BatchPoint, usize)>,
    pub probe: Vec<String>,
    pub cells: Vec<BatchCell>,
    pub elapsed: Duration,
}

struct BatchRun {
    run: Run,
    batches: BTreeMap<BatchPoint, u64>,
    sizes: Vec<(BatchPoint, usize)>,
}

/// Runs `case` once in scope `scope` of `database`, with `fault` (none: the probe).
async fn run_batch_combination(
    case: Case,
    database: &TestDatabase,
    scope: &str,
    fault: Option<BatchFault>,
) -> BatchRun {
    let hook = BatchFaults::new(cases::BATCH_CALLS);
    if let Some(fault) = fault {
        hook.inject(fault);
    }
    let stores = |hooked: bool| {
        let hook = Arc::clone(&hook);
        async move {
            let stores = database
                .stores(TEST_POOL_CONNECTIONS)
                .await
                .expect("the combination's stores")
                .with_caller_lease_clock();
            if hooked {
                stores.with_batch_faults(&hook)
            } else {
                stores
            }
        }
    };
    let (first, second) = (stores(true).await, stores(false).await);
    let world = Arc::new(World::new(
        (Arc::new(first.clone()), Arc::new(second.clone())),
        Scope::parse(scope).unwrap(),
    ));
    case.setup(&world).await;
    let process_1 = world.process();
    let dying = Arc::downgrade(&process_1);
    hook.on_death(move || {
        if let Some(process) = dying.upgrade() {
            process.kill();
        }
    });
    let transient = fault.is_some_and(|f| f.kind.lives());
    let (life, violations) = after_setup(case, &world, &process_1, transient).await;
    for stores in [&first, &second] {
        // Cleanup only: a pool that does not close in time is left to the test process's end.
        let _ = tokio::time::timeout(CLOSE_WAIT, stores.close()).await;
    }
    BatchRun {
        run: Run {
            calls: process_1.calls(),
            hit: !hook.fired().is_empty(),
            life,
            violations,
        },
        batches: hook.batches(),
        sizes: hook.sizes(),
    }
}

/// The probe of `case`, then every batch statement it sent × every kind.
pub async fn run_batch_case(case: Case, database: Arc<TestDatabase>) -> BatchReport {
    let started = Instant::now();
    let probe =
        run_batch_combination(case, &database, &format!("{}-probe", case.name()), None).await;
    let mut probe_violations = probe.run.violations;
    if probe.run.life != Life::Finished {
        probe_violations.push(format!("the probe ended {:?}", probe.run.life));
    }
    for point in BatchPoint::ALL {
        if probe.batches.get(&point).copied().unwrap_or(0) == 0 {
            probe_violations.push(format!(
                "the probe sent no {} of two calls or more (sizes {:?})",
                point.as_str(),
                probe.sizes
            ));
        }
    }
    let mut faults = Vec::new();
    for point in BatchPoint::ALL {
        let count = probe.batches.get(&point).copied().unwrap_or(0);
        for kind in BatchFaultKind::ALL {
            for nth in 1..=count {
                faults.push(BatchFault { point, nth, kind });
            }
        }
    }
    let cells = futures::stream::iter(faults.into_iter().enumerate())
        .map(|(n, fault)| {
            let database = Arc::clone(&database);
            async move {
                let scope = format!("{}-b{n}", case.name());
                let run = run_batch_combination(case, &database, &scope, Some(fault)).await;
                BatchCell {
                    fault,
                    hit: run.run.hit,
                    life: run.run.life,
                    violations: run.run.violations,
                }
            }
        })
        .buffered(matrix::COMBINATIONS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    BatchReport {
        case,
        batches: probe.batches,
        sizes: probe.sizes,
        probe: probe_violations,
        cells,
        elapsed: started.elapsed(),
    }
}

/// Prints a batch case's matrix (one line per batch point, one column per kind) and returns
/// its failures: broken checks, a probe that broke one or formed no batch, a fault that never
/// struck.
pub fn print_batch_case(report: &BatchReport) -> Vec<String> {
    let mut text = format!(
        "\n== fault matrix on postgres, batch points: case `{}` ({} combinations, {:.1} s; \
         probe batches {:?}) ==\n{:<14} {:>7}",
        report.case.name(),
        report.cells.len(),
        report.elapsed.as_secs_f64(),
        report.sizes,
        "point",
        "batches"
    );
    for kind in BatchFaultKind::ALL {
        text.push_str(&format!(" {:<19}", kind.as_str()));
    }
    text.push('\n');
    let mut failures: Vec<String> = report
        .probe
        .iter()
        .map(|v| format!("probe of {}: {v}", report.case.name()))
        .collect();
    for point in BatchPoint::ALL {
        text.push_str(&format!(
            "{:<14} {:>7}",
            point.as_str(),
            report.batches.get(&point).copied().unwrap_or(0)
        ));
        for kind in BatchFaultKind::ALL {
            let cells: Vec<&BatchCell> = report
                .cells
                .iter()
                .filter(|c| c.fault.point == point && c.fault.kind == kind)
                .collect();
            let hit = cells.iter().filter(|c| c.hit).count();
            let failed = cells.iter().filter(|c| !c.violations.is_empty()).count();
            let mut cell = if cells.is_empty() {
                "-".to_string()
            } else {
                format!("hit {hit}/{}", cells.len())
            };
            if failed > 0 {
                cell.push_str(&format!(" FAIL {failed}"));
            }
            text.push_str(&format!(" {cell:<19}"));
        }
        text.push('\n');
    }
    for cell in &report.cells {
        let at = format!(
            "({}, {}, {}, nth {}) [{:?}]",
            report.case.name(),
            cell.fault.point.as_str(),
            cell.fault.kind.as_str(),
            cell.fault.nth,
            cell.life
        );
        if !cell.hit {
            failures.push(format!("{at}: the fault never struck"));
        }
        if !cell.violations.is_empty() {
            let line = format!("{at}: {}", cell.violations.join("; "));
            text.push_str(&format!("FAILED {line}\n"));
            failures.push(line);
        }
    }
    for v in &report.probe {
        text.push_str(&format!("PROBE FAILED: {v}\n"));
    }
    eprint!("{text}");
    failures
}
