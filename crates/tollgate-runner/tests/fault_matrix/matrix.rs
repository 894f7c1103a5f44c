//! Running every combination of a case, printing the matrix, and the totals with the write
//! coverage check.

use super::*;
use futures::StreamExt;
use std::collections::BTreeSet;
use std::time::Instant;
use tollgate_store::fault::FaultKind;

/// Combinations that show a product defect, reported and kept failing on purpose (see
/// `KNOWN_FAILURES` in `tests/faults.rs`): `(case, op, kind, nth)`.
pub type Known = (Case, StoreOp, FaultKind, u64);

/// Combinations of one case that run at once.
pub const COMBINATIONS_IN_FLIGHT: usize = 4;

/// One combination's result.
pub struct Cell {
    pub op: StoreOp,
    pub kind: FaultKind,
    pub nth: u64,
    pub hit: bool,
    pub life: Life,
    pub violations: Vec<String>,
    pub known: bool,
}

/// A case's matrix.
pub struct CaseReport {
    pub case: Case,
    /// Calls of each operation in the unfaulted probe.
    pub calls: BTreeMap<StoreOp, u64>,
    /// Broken checks of the unfaulted probe (must be none).
    pub probe: Vec<String>,
    pub cells: Vec<Cell>,
    pub elapsed: Duration,
}

/// The calls of an operation that get a fault: every one the probe made.
pub fn nths(count: u64) -> Vec<u64> {
    (1..=count).collect()
}

/// Runs the probe of `case`, then every (op it calls) × kind × nth.
pub async fn run_case(case: Case, base: Base, known: &[Known]) -> CaseReport {
    let started = Instant::now();
    let probe = run_combination(case, &base, &format!("{}-probe", case.name()), None).await;
    let mut probe_violations = probe.violations;
    if probe.life != Life::Finished {
        probe_violations.push(format!("the probe ended {:?}", probe.life));
    }
    let mut faults = Vec::new();
    for op in StoreOp::ALL {
        let Some(&count) = probe.calls.get(op) else {
            continue;
        };
        for kind in FaultKind::ALL {
            for nth in nths(count) {
                faults.push(Fault { op: *op, nth, kind });
            }
        }
    }
    // Each combination has a world (and on Postgres a scope) of its own, so several run at once.
    let cells = futures::stream::iter(faults.into_iter().enumerate())
        .map(|(n, fault)| {
            let base = base.clone();
            async move {
                let scope = format!("{}-{n}", case.name());
                let run = run_combination(case, &base, &scope, Some(fault)).await;
                Cell {
                    op: fault.op,
                    kind: fault.kind,
                    nth: fault.nth,
                    hit: run.hit,
                    life: run.life,
                    known: known.contains(&(case, fault.op, fault.kind, fault.nth)),
                    violations: run.violations,
                }
            }
        })
        .buffered(COMBINATIONS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    CaseReport {
        case,
        calls: probe.calls,
        probe: probe_violations,
        cells,
        elapsed: started.elapsed(),
    }
}

fn cell_text(cells: &[&Cell]) -> String {
    if cells.is_empty() {
        return "-".into();
    }
    let hit = cells.iter().filter(|c| c.hit).count();
    let mut text = if hit == cells.len() {
        format!("hit {hit}")
    } else {
        format!("hit {hit}/{}", cells.len())
    };
    let failed = cells.iter().filter(|c| !c.violations.is_empty()).count();
    let known = cells
        .iter()
        .filter(|c| c.known && !c.violations.is_empty())
        .count();
    if failed > known {
        text.push_str(&format!(" FAIL {}", failed - known));
    }
    if known > 0 {
        text.push_str(&format!(" known {known}"));
    }
    text
}

/// Prints a case's matrix: one line per operation, one column per kind ("hit n" = the fault struck
/// at each of the n calls tried; "-" = the case never calls it).
pub fn print_case(store: &str, report: &CaseReport) {
    let mut text = format!(
        "\n== fault matrix on {store}: case `{}` ({} combinations, {:.1} s) ==\n",
        report.case.name(),
        report.cells.len(),
        report.elapsed.as_secs_f64()
    );
    text.push_str(&format!(
        "{:<44} {:<5} {:>5}  {:<18} {:<18} {:<18}\n",
        "operation", "rw", "calls", "fail", "die_before", "die_after"
    ));
    for op in StoreOp::ALL {
        let calls = report.calls.get(op).copied().unwrap_or(0);
        let column = |kind: FaultKind| {
            let cells: Vec<&Cell> = report
                .cells
                .iter()
                .filter(|c| c.op == *op && c.kind == kind)
                .collect();
            cell_text(&cells)
        };
        text.push_str(&format!(
            "{:<44} {:<5} {:>5}  {:<18} {:<18} {:<18}\n",
            format!("{}::{}", op.store(), op.name()),
            if op.is_write() { "write" } else { "read" },
            calls,
            column(FaultKind::Fail),
            column(FaultKind::DieBefore),
            column(FaultKind::DieAfter),
        ));
    }
    for v in &report.probe {
        text.push_str(&format!("PROBE FAILED: {v}\n"));
    }
    for cell in report.cells.iter().filter(|c| !c.violations.is_empty()) {
        text.push_str(&format!(
            "{} ({}, {}, {}, nth {}) [{:?}]: {}\n",
            if cell.known { "KNOWN" } else { "FAILED" },
            report.case.name(),
            cell.op.name(),
            cell.kind.as_str(),
            cell.nth,
            cell.life,
            cell.violations.join("; ")
        ));
    }
    eprint!("{text}");
}

/// Prints the totals and returns every failure: broken checks outside the known list, a known
/// failure that passes now, a probe that broke a check, and a store write no case exercised.
pub fn totals(store: &str, reports: &[CaseReport], elapsed: Duration) -> Vec<String> {
    let cells: Vec<&Cell> = reports.iter().flat_map(|r| &r.cells).collect();
    let hit = cells.iter().filter(|c| c.hit).count();
    let died = cells.iter().filter(|c| c.life == Life::Died).count();
    let failed: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.cells
                .iter()
                .filter(|c| !c.violations.is_empty() && !c.known)
                .map(move |c| {
                    format!(
                        "({}, {}, {}, nth {}): {}",
                        r.case.name(),
                        c.op.name(),
                        c.kind.as_str(),
                        c.nth,
                        c.violations.join("; ")
                    )
                })
        })
        .collect();
    let known_failing = cells
        .iter()
        .filter(|c| c.known && !c.violations.is_empty())
        .count();
    let mut out = failed;
    for r in reports {
        for c in r
            .cells
            .iter()
            .filter(|c| c.known && c.violations.is_empty())
        {
            out.push(format!(
                "known failure ({}, {}, {}, nth {}) passes now: take it off the list",
                r.case.name(),
                c.op.name(),
                c.kind.as_str(),
                c.nth
            ));
        }
        out.extend(
            r.probe
                .iter()
                .map(|v| format!("probe of {}: {v}", r.case.name())),
        );
    }
    let mut text = format!(
        "\n== fault matrix totals on {store} ({:.1} s) ==\n\
         cases {}, operations {} ({} writes) x kinds {}; combinations run {}, \
         fault hit {hit}, not hit {}, process died {died}, failed {}, \
         known failures {known_failing}\n",
        elapsed.as_secs_f64(),
        reports.len(),
        StoreOp::ALL.len(),
        StoreOp::ALL.iter().filter(|op| op.is_write()).count(),
        FaultKind::ALL.len(),
        cells.len(),
        cells.len() - hit,
        out.len(),
    );
    text.push_str("write coverage (cases whose fault struck each store write):\n");
    let mut uncovered = BTreeSet::new();
    for op in StoreOp::ALL.iter().filter(|op| op.is_write()) {
        let cases: BTreeSet<&str> = reports
            .iter()
            .filter(|r| r.cells.iter().any(|c| c.op == *op && c.hit))
            .map(|r| r.case.name())
            .collect();
        if cases.is_empty() {
            uncovered.insert(*op);
        }
        text.push_str(&format!(
            "  {:<44} {}\n",
            format!("{}::{}", op.store(), op.name()),
            if cases.is_empty() {
                "NONE".to_string()
            } else {
                cases.into_iter().collect::<Vec<_>>().join(", ")
            }
        ));
    }
    let reads_unused: Vec<&str> = StoreOp::ALL
        .iter()
        .filter(|op| !op.is_write())
        .filter(|op| !reports.iter().any(|r| r.calls.contains_key(op)))
        .map(|op| op.name())
        .collect();
    text.push_str(&format!(
        "reads no case calls (skipped): {}\n",
        if reads_unused.is_empty() {
            "none".to_string()
        } else {
            reads_unused.join(", ")
        }
    ));
    eprint!("{text}");
    for op in uncovered {
        out.push(format!(
            "store write {}::{} has no fault coverage: \
             add a case in tests/fault_matrix/cases.rs that calls it",
            op.store(),
            op.name()
        ));
    }
    out
}
