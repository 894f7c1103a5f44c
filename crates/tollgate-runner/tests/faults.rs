//! Every store fault point, on the in-memory stores and on Postgres (spec/journal.md — Fault
//! points): each case × every operation it calls × {fail, die before, die after} × its calls,
//! followed by a second process that recovers and runs the scheduler, then the checks (SC-17,
//! SC-40, SC-41, SC-42, SC-61, H-3, H-4). The matrix and its totals go to stderr:
//! `cargo test -p tollgate-runner --test faults -- --nocapture`.
//!
//! The Postgres run uses one fresh database per case (each combination in a scope of its own);
//! `TOLLGATE_TEST_DATABASE_URL` names the server (default: the local trust-auth server).
#![cfg(test)]

mod fault_matrix;

use fault_matrix::cases::Case;
use fault_matrix::matrix::{print_case, run_case, totals, CaseReport, Known};
use fault_matrix::Base;
use std::sync::Arc;
use std::time::Instant;
use tollgate_store::ServiceStores;

/// Combinations that reveal a product defect, listed so the rest of the matrix stays green; the
/// suite fails when one of them starts passing (take it off the list then).
///
/// None today. The orphan root slot (a slot reserved for a claim that failed, or whose process
/// died between `reserve_slot` and the claim, or whose give-back failed) no longer holds its root:
/// past its deadline a root takes no claim and is reconciled on the calls it has (ST-36).
const KNOWN_FAILURES: &[Known] = &[];

fn report(store: &str, reports: &[CaseReport], started: Instant) {
    for r in reports {
        print_case(store, r);
    }
    let failures = totals(store, reports, started.elapsed());
    assert!(
        failures.is_empty(),
        "{} failure(s) on {store}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_17_sc_61_h_4_every_store_fault_point_on_memory() {
    let started = Instant::now();
    let mut reports = Vec::new();
    for case in Case::ALL {
        reports.push(run_case(case, Base::Memory, KNOWN_FAILURES).await);
    }
    report("memory", &reports, started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_17_sc_61_h_4_every_store_fault_point_on_postgres() {
    let started = Instant::now();
    let url = tollgate_testkit::pg::test_admin_url();
    // The cases run concurrently, each on a database of its own.
    let reports = futures::future::join_all(Case::ALL.into_iter().map(|case| {
        let url = url.clone();
        async move {
            let (first, second) = tollgate_testkit::pg::fresh_test_database_pair(&url)
                .await
                .unwrap();
            let (first, second): (Arc<dyn ServiceStores>, Arc<dyn ServiceStores>) =
                (Arc::new(first), Arc::new(second));
            run_case(case, Base::Postgres(first, second), KNOWN_FAILURES).await
        }
    }))
    .await;
    report("postgres", &reports, started);
}
