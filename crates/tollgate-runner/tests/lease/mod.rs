//! Leases under a live call (spec/journal.md, Fences): the heartbeat keeps a call whose store is
//! slow from being taken over, on every store; on Postgres, hosts whose clocks disagree cannot
//! make a live lease look expired. The calls here run on the real clock: what is shown is a
//! store that is slower than the lease, and clocks that disagree with the database's.
#![allow(dead_code)]

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use futures::FutureExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_core::config::CallConfig;
use tollgate_core::ids::*;
use tollgate_core::message::{Message, Role};
use tollgate_core::state::ExecutionState;
use tollgate_core::usage::Usage;
use tollgate_core::view::{View, ViewState};
use tollgate_provider::scripted::{ScriptedClient, ScriptedReply};
use tollgate_runner::recovery::{ExpiredCounts, Reconciler};
use tollgate_runner::{Clock, RunError, RunRequest, RunnerSettings, SingleCallRunner, SystemClock};
use tollgate_store::fault::{FaultyStores, StoreOp};
use tollgate_store::Stores;
use tollgate_testkit::conformance::{scope, text_config};

/// The runner's lease: short, so a slow store outlasts it.
pub const LEASE_MS: u64 = 300;
/// The run timeout of these calls.
pub const RUN_TIMEOUT_MS: u64 = 200;
/// The lease a claim takes: the runner's, whatever the run timeout.
pub const CLAIM_LEASE_MS: u64 = LEASE_MS;
/// How long the dispatch mark waits for the store: two claim leases.
pub const MARK_DELAY_MS: u64 = 2 * CLAIM_LEASE_MS;
/// How often the recoverer below runs a pass (a scheduler's tick).
const RECOVERER_TICK_MS: u64 = 50;

/// A clock a fixed offset away from the host's.
pub struct SkewedClock(pub ChronoDuration);

impl Clock for SkewedClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.0
    }
}

pub fn config() -> CallConfig {
    let mut c = text_config();
    c.run_timeout_ms = RUN_TIMEOUT_MS;
    c
}

pub fn runner(
    stores: Arc<dyn Stores>,
    clock: Arc<dyn Clock>,
    client: &Arc<ScriptedClient>,
) -> SingleCallRunner {
    let mut settings = RunnerSettings::new(config());
    settings.lease_ms = LEASE_MS;
    settings.clock = clock;
    SingleCallRunner::new(stores, client.clone(), settings).unwrap()
}

pub fn request(key: &str) -> RunRequest {
    RunRequest {
        scope: scope("acme"),
        session_id: SessionId::parse("s-1").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        input_revision: InputRevision::parse("r-1").unwrap(),
        intent: Intent::parse("summarize").unwrap(),
        load_input: async { Ok(vec![Message::text(Role::User, "hello")]) }.boxed(),
        cancel: CancellationToken::new(),
        limits: Vec::new(),
    }
}

pub fn client() -> Arc<ScriptedClient> {
    let usage = Usage {
        input: 10,
        output: 5,
        ..Usage::ZERO
    };
    Arc::new(ScriptedClient::new(vec![ScriptedReply::text(
        "the answer",
        usage,
    )]))
}

/// Runs `call` while a recoverer runs `reconcile_expired` (and `recover` of `key`) at every
/// tick until the call has answered; returns the call's answer and what the recoverer finished.
pub async fn with_recoverer(
    call: impl Future<Output = Result<View, RunError>>,
    recoverer: &Reconciler,
    key: &str,
) -> (Result<View, RunError>, ExpiredCounts) {
    let mut taken = ExpiredCounts::default();
    let key = OperationKey::parse(key).unwrap();
    let call = call.fuse();
    futures::pin_mut!(call);
    loop {
        tokio::select! {
            answer = &mut call => return (answer, taken),
            _ = tokio::time::sleep(Duration::from_millis(RECOVERER_TICK_MS)) => {
                let counts = recoverer
                    .reconcile_expired(&scope("acme"), 100, LEASE_MS)
                    .await
                    .unwrap();
                taken.executions += counts.executions;
                // Whether it took the fence shows in the row and the audit log afterwards.
                recoverer.recover(&scope("acme"), &key, LEASE_MS).await.unwrap();
            }
        }
    }
}

/// What every case checks after its call: it completed with its output, once, under the
/// claim's own fence, and no recoverer ever took a fence.
pub async fn assert_completed_untouched(
    stores: &dyn Stores,
    key: &str,
    answer: Result<View, RunError>,
    taken: ExpiredCounts,
    client: &ScriptedClient,
) {
    let view = answer.expect("the call answers with its stored outcome");
    assert_eq!(view.state, ViewState::Completed);
    assert!(view.output.is_some(), "the finished output is kept");
    assert_eq!(taken.executions, 0, "the recoverer took nothing over");
    assert_eq!(client.sends(), 1);
    let row = stores
        .execution(&scope("acme"), &OperationKey::parse(key).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, ExecutionState::Completed);
    assert_eq!(row.fence, FenceToken(1), "no fence was ever taken");
    let audit = stores
        .audit_rows(&scope("acme"), tollgate_store::AuditPosition::START, 100)
        .await
        .unwrap();
    assert!(
        audit.iter().all(|r| r.event.kind != "fence_taken"),
        "no fence_taken in the audit log"
    );
}

/// SC-100: a dispatch mark that waits for the store twice as long as the claim's lease (a pool
/// with no free connection) does not let a recoverer running meanwhile take the call over: the
/// heartbeat renews the lease from the claim on, and the call completes with its output.
pub async fn sc_100_slow_dispatch_mark_keeps_its_lease(base: Arc<dyn Stores>) {
    let faults = Arc::new(FaultyStores::new(base.clone()));
    // Loaded input: the dispatch mark shrinks the hold (`mark_dispatched_with_hold`).
    faults.delay(StoreOp::MarkDispatched, MARK_DELAY_MS);
    faults.delay(StoreOp::MarkDispatchedWithHold, MARK_DELAY_MS);
    let client = client();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let runner = runner(faults.clone(), clock.clone(), &client);
    let recoverer = Reconciler::new(base.clone(), clock);
    let (answer, taken) =
        with_recoverer(runner.run(request("slow-mark")), &recoverer, "slow-mark").await;
    assert_completed_untouched(base.as_ref(), "slow-mark", answer, taken, &client).await;
    let renewals = faults
        .calls()
        .get(&StoreOp::RenewLease)
        .copied()
        .unwrap_or(0);
    assert!(
        renewals >= 2,
        "the heartbeat renewed through the wait ({renewals} renewals)"
    );
}

/// SC-103: the heartbeat ends with the call. Run under paused time: a renewal task left behind
/// would tick (and call the store) while the test waits ten leases after the answer.
pub async fn sc_103_heartbeat_ends_with_the_call(base: Arc<dyn Stores>) {
    let faults = Arc::new(FaultyStores::new(base.clone()));
    // Loaded input: the dispatch mark shrinks the hold (`mark_dispatched_with_hold`).
    faults.delay(StoreOp::MarkDispatched, MARK_DELAY_MS);
    faults.delay(StoreOp::MarkDispatchedWithHold, MARK_DELAY_MS);
    let client = client();
    let runner = runner(faults.clone(), Arc::new(SystemClock), &client);
    let view = runner.run(request("ends")).await.unwrap();
    assert_eq!(view.state, ViewState::Completed);
    let renewals = || {
        faults
            .calls()
            .get(&StoreOp::RenewLease)
            .copied()
            .unwrap_or(0)
    };
    let during = renewals();
    let every = tollgate_runner::lease::renew_every_ms(CLAIM_LEASE_MS);
    assert!(
        during >= MARK_DELAY_MS / every - 1,
        "{during} renewals during the call"
    );
    tokio::time::sleep(Duration::from_millis(10 * CLAIM_LEASE_MS)).await;
    assert_eq!(renewals(), during, "no renewal after the call finished");
}

/// SC-102 (Postgres): lease ends and lease comparisons use the database's clock. A runner whose
/// clock runs an hour behind claims a lease that a recoverer whose clock runs an hour ahead
/// still sees live while the call is in flight; neither `reconcile_expired`, `recover` nor a
/// direct `take_fence` takes it over, and the call completes.
pub async fn sc_102_skewed_host_clocks_do_not_expire_a_live_lease(base: Arc<dyn Stores>) {
    let faults = Arc::new(FaultyStores::new(base.clone()));
    // In flight long enough for several recoverer passes, well inside the lease.
    faults.delay(StoreOp::MarkDispatched, CLAIM_LEASE_MS / 2);
    let client = client();
    let behind: Arc<dyn Clock> = Arc::new(SkewedClock(ChronoDuration::hours(-1)));
    let ahead = Arc::new(SkewedClock(ChronoDuration::hours(1)));
    let runner = runner(faults.clone(), behind, &client);
    let recoverer = Reconciler::new(base.clone(), ahead.clone());
    let (answer, taken) = with_recoverer(runner.run(request("skewed")), &recoverer, "skewed").await;
    assert_completed_untouched(base.as_ref(), "skewed", answer, taken, &client).await;

    // A live claim seen by a host an hour ahead: not expired, not taken.
    let hold = config().worst_case_hold().unwrap();
    let binding = tollgate_testkit::conformance::binding("s-1", config());
    let claim = tollgate_store::ClaimRequest {
        scope: scope("acme"),
        operation_key: OperationKey::parse("claimed-behind").unwrap(),
        root_key: None,
        binding,
        hold,
        now: Utc::now() - ChronoDuration::hours(1),
        lease_ms: 30_000,
        dispatch: false,
        limits: tollgate_core::limits::ClaimLimits::default(),
        binding_digest: None,
    };
    let tollgate_store::ClaimOutcome::Claimed(record) = base.claim(claim).await.unwrap() else {
        panic!("a fresh key claims");
    };
    let later = ahead.now();
    assert!(base
        .expired(&scope("acme"), later, 10)
        .await
        .unwrap()
        .is_empty());
    let states = [ExecutionState::Prepared, ExecutionState::Dispatched];
    let taken = base
        .take_fence(
            &scope("acme"),
            &record.operation_key,
            &states,
            true,
            30_000,
            later,
        )
        .await
        .unwrap();
    assert!(
        taken.is_none(),
        "a live lease is not taken by a host an hour ahead"
    );
    // The lease the database set runs from its own clock, not the claimer's.
    let lease_left = record.lease_expires_at - Utc::now();
    assert!(
        lease_left > ChronoDuration::seconds(20) && lease_left <= ChronoDuration::seconds(31),
        "the lease ends 30 s after the database's now ({lease_left})"
    );
}
