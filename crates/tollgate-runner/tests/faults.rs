//! Every store fault point, on the in-memory stores and on Postgres (spec/journal.md — Fault
//! points): each case × every operation it calls × {fail, die before, die after} × its calls,
//! followed by a second process that recovers and runs the scheduler, then the checks (SC-17,
//! SC-40, SC-41, SC-42, SC-61, H-3, H-4). The matrix and its totals go to stderr:
//! `cargo test -p tollgate-runner --test faults -- --nocapture`.
//!
//! The Postgres run uses one fresh database per case (each combination in a scope of its own);
//! `TOLLGATE_TEST_DATABASE_URL` names the server (default: the local trust-auth server). The
//! batch points (the claim and settlement batches of one shard, SC-203, H-32) are faulted on
//! Postgres only, where the batches are: `sc_17_sc_203_every_batch_point_on_postgres`.
#![cfg(test)]

mod fault_matrix;

use fault_matrix::batches::{print_batch_case, run_batch_case};
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

/// The two Postgres runs take turns: each opens pools of its own per case or combination, and
/// together they would pass the server's `max_connections`.
static POSTGRES_RUNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _turn = POSTGRES_RUNS.lock().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_17_sc_203_every_batch_point_on_postgres() {
    let _turn = POSTGRES_RUNS.lock().await;
    let started = Instant::now();
    let url = tollgate_testkit::pg::test_admin_url();
    // One case at a time, each on a database of its own; its combinations run concurrently.
    let mut reports = Vec::new();
    for case in Case::BATCHES {
        let database = tollgate_testkit::pg::TestDatabase::create(&url)
            .await
            .unwrap();
        let stores = database.stores(1).await.unwrap();
        stores.migrate().await.unwrap();
        stores.close().await;
        reports.push(run_batch_case(case, Arc::new(database)).await);
    }
    let mut failures = Vec::new();
    for r in &reports {
        failures.extend(print_batch_case(r));
    }
    let cells: usize = reports.iter().map(|r| r.cells.len()).sum();
    eprintln!(
        "\n== batch points on postgres ({:.1} s): cases {}, combinations {cells}, failed {} ==",
        started.elapsed().as_secs_f64(),
        reports.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failure(s) at the batch points:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
