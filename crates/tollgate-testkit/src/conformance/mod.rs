//! The store conformance suite: one set of behaviours every store implementation must show.
//!
//! Each check is a public async function over a fresh store; [`store_conformance!`] instantiates
//! all of them as `#[tokio::test]`s for a factory, so the in-memory and Postgres stores run the
//! very same suite.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use chrono::{DateTime, Duration, Utc};
use std::sync::Arc;
use tollgate_core::caps::CapLevel;
use tollgate_core::config::CallConfig;
use tollgate_core::digest::Binding;
use tollgate_core::ids::*;
use tollgate_core::money::Money;
use tollgate_core::state::{
    CallKind, ExecutionState, NotDispatchedCause, Outcome, ReconciliationReason, SettlementSource,
};
use tollgate_core::usage::Usage;
use tollgate_core::view::Output;
use tollgate_store::audit::{verify_chain, ChainVerifier};
use tollgate_store::error::StoreError;
use tollgate_store::rows::*;
use tollgate_store::traits::*;

/// Instantiates the suite for `$factory`, an expression that evaluates to an async closure or
/// function returning `Arc<impl Stores + 'static>`.
#[macro_export]
macro_rules! store_conformance {
    ($factory:expr) => {
        $crate::store_conformance!(@tests $factory;
            sc_12_claim_inserts_prepared_row_and_holds,
            h_14_a_claim_with_its_input_in_hand_is_its_dispatch_mark,
            sc_13_second_claim_returns_existing_row_untouched,
            h_16_a_claim_of_a_settled_key_brings_its_result_and_settlement,
            h_10_execution_view_reads_row_result_and_settlement_together,
            sc_16_blocked_claim_writes_nothing,
            h_3_stale_fence_writes_nothing,
            sc_30_not_dispatched_releases_hold,
            settle_writes_charge_spend_result_and_completes,
            h_15_evidence_and_settlement_commit_together,
            h_28_a_settlement_acknowledges_its_own_exact_evidence,
            settlement_is_exactly_once,
            sc_119_a_second_settlement_is_refused_by_the_one_per_execution_constraint,
            sc_15_warning_keeps_output,
            sc_16_post_call_block_settles_then_suppresses_output,
            sc_94_reconciliation_required_keeps_its_reason_and_hold,
            sc_40_take_fence_only_after_lease_expiry,
            sc_100_renewed_lease_keeps_recovery_out,
            sc_101_stale_renewal_fails_and_changes_nothing,
            sc_41_expired_lists_only_expired_unfinished,
            sc_71_sc_73_retention_and_erasure_are_final,
            sc_42_inbox_pages_by_seq_and_acknowledges_once,
            audit_chain_verifies_and_never_holds_content,
            sc_98_audit_chains_page_and_end_at_their_heads,
            h_33_a_consumer_s_rows_append_to_its_group_s_chains,
            settlements_by_day,
            sc_192_scope_settlements_read_one_scope_by_day_within_the_limit,
            sc_207_a_charge_above_its_hold_is_recorded_on_its_audit_row,
            sc_10_scopes_are_isolated,
            no_overspend_under_concurrent_claims,
            h_13_one_consumers_transactions_in_parallel_never_deadlock,
            concurrent_claims_of_one_key_insert_once,
            sc_141_feed_pages_without_gaps_or_duplicates_under_concurrent_settles,
            sc_193_a_feed_position_is_found_for_a_settlement_of_its_own_scope_only,
        );
        $crate::ledger_conformance!($factory);
        $crate::money_conformance!($factory);
        $crate::limits_conformance!($factory);
    };
    (@tests $factory:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let stores = ($factory)().await;
                $crate::conformance::$name(stores).await;
            }
        )+
    };
}

pub fn money(s: &str) -> Money {
    Money::parse(s, "test").unwrap()
}

pub fn usd() -> tollgate_core::money::Currency {
    tollgate_core::money::Currency::parse("USD").unwrap()
}

pub fn scope(s: &str) -> Scope {
    Scope::parse(s).unwrap()
}

pub fn key(s: &str) -> OperationKey {
    OperationKey::parse(s).unwrap()
}

/// A valid text config: prices 1/2/0.1/1.25/2 per million, no caps.
pub fn text_config() -> CallConfig {
    tollgate_core::config::fixtures::text_config()
}

pub fn binding(session: &str, config: CallConfig) -> Binding {
    Binding {
        session_id: SessionId::parse(session).unwrap(),
        intent: Intent::parse("summarize").unwrap(),
        input_revision: InputRevision::parse("r-1").unwrap(),
        config,
    }
}

pub fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

pub fn claim_req(scope_: &str, key_: &str, config: CallConfig, hold: &str) -> ClaimRequest {
    ClaimRequest {
        scope: scope(scope_),
        operation_key: key(key_),
        root_key: None,
        binding: binding("s-1", config),
        hold: money(hold),
        now: t0(),
        lease_ms: 30_000,
        dispatch: false,
        limits: tollgate_core::limits::ClaimLimits::default(),
        binding_digest: None,
    }
}

async fn claimed<S: Stores>(s: &S, request: ClaimRequest) -> ExecutionRecord {
    match s.claim(request).await.unwrap() {
        ClaimOutcome::Claimed(r) => r,
        other => panic!("expected a claim, got {other:?}"),
    }
}

async fn dispatched<S: Stores>(s: &S, request: ClaimRequest) -> ExecutionRecord {
    let r = claimed(s, request).await;
    s.mark_dispatched(r.fence(), t0()).await.unwrap()
}

pub fn settle_req(record: &ExecutionRecord, amount: &str, text: &str) -> SettleRequest {
    SettleRequest {
        fence: record.fence(),
        usage: Usage {
            input: 10,
            output: 5,
            ..Usage::ZERO
        },
        amount: money(amount),
        source: SettlementSource::Stream,
        outcome: Outcome::Success,
        stop: Some("stop".into()),
        output: Some(Output {
            text: Some(text.into()),
            json: None,
        }),
        step: None,
        provider_ref: Some("req-1".into()),
        evidence_id: None,
        evidence: None,
        seen: Some(Box::new(record.clone())),
        now: t0(),
    }
}

async fn daily<S: Stores>(s: &S, r: &ExecutionRecord) -> tollgate_core::caps::SpendTotals {
    s.daily_spend(
        &r.scope,
        r.consumer(),
        r.accounting_day,
        &r.binding.config.currency,
    )
    .await
    .unwrap()
}

async fn session<S: Stores>(s: &S, r: &ExecutionRecord) -> tollgate_core::caps::SpendTotals {
    s.session_spend(
        &r.scope,
        r.consumer(),
        r.session_id(),
        &r.binding.config.currency,
    )
    .await
    .unwrap()
}

fn capped(block: &str) -> CallConfig {
    let mut c = text_config();
    c.caps.daily_block = Some(money(block));
    c
}

pub async fn sc_12_claim_inserts_prepared_row_and_holds<S: Stores>(s: Arc<S>) {
    let r = claimed(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    assert_eq!(r.state, ExecutionState::Prepared);
    assert_eq!(r.accounting_day, t0().date_naive());
    assert_eq!(r.binding_digest, r.binding.digest());
    let read = s.execution(&scope("a"), &key("k1")).await.unwrap().unwrap();
    assert_eq!(read, r);
    assert_eq!(daily(&*s, &r).await.held, money("0.5"));
    assert_eq!(session(&*s, &r).await.held, money("0.5"));
    assert_eq!(daily(&*s, &r).await.settled, Money::ZERO);
}

/// H-14: a claim whose input is in hand and checked is also its dispatch mark: the row starts
/// `dispatched` in the claim's commit, holding as a claim does, with the audit trail of a claim
/// and a dispatch mark (`claimed` as `prepared`, then `dispatched`, one chain, verified); no
/// second dispatch mark is possible, and it settles as a dispatched call does.
pub async fn h_14_a_claim_with_its_input_in_hand_is_its_dispatch_mark<S: Stores>(s: Arc<S>) {
    let mut request = claim_req("a", "k1", text_config(), "0.5");
    request.dispatch = true;
    let r = claimed(&*s, request).await;
    assert_eq!(r.state, ExecutionState::Dispatched);
    let read = s.execution(&scope("a"), &key("k1")).await.unwrap().unwrap();
    assert_eq!(read, r);
    assert_eq!(daily(&*s, &r).await.held, money("0.5"));
    assert_eq!(session(&*s, &r).await.held, money("0.5"));
    assert!(s.mark_dispatched(r.fence(), t0()).await.is_err());
    assert_eq!(
        s.execution(&scope("a"), &key("k1")).await.unwrap().unwrap(),
        r
    );
    let done = s.settle(settle_req(&r, "0.2", "x")).await.unwrap();
    assert_eq!(done.record.state, ExecutionState::Completed);
    assert_eq!(daily(&*s, &r).await.held, Money::ZERO);
    assert_eq!(daily(&*s, &r).await.settled, money("0.2"));
    let rows = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap();
    let trail: Vec<_> = rows
        .iter()
        .filter(|row| row.event.execution_id == Some(r.id))
        .map(|row| {
            let state = row.event.detail["state"].as_str().unwrap_or_default();
            (row.event.kind.clone(), state.to_string())
        })
        .collect();
    let expected = [
        ("claimed", "prepared"),
        ("dispatched", "dispatched"),
        ("settled", ""),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(k, st)| (k.to_string(), st.to_string()))
        .collect();
    assert_eq!(trail, expected);
    verify_chain(&rows).unwrap();
    let mut verifier = ChainVerifier::default();
    rows.iter().for_each(|row| verifier.push(row).unwrap());
    verifier
        .finish(&s.audit_heads(&scope("a")).await.unwrap())
        .unwrap();
}

pub async fn sc_13_second_claim_returns_existing_row_untouched<S: Stores>(s: Arc<S>) {
    let r = claimed(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let mut other = text_config();
    other.model = "other".into();
    match s.claim(claim_req("a", "k1", other, "0.7")).await.unwrap() {
        ClaimOutcome::Existing(e) => assert_eq!(e.execution, r),
        o => panic!("{o:?}"),
    }
    assert_eq!(daily(&*s, &r).await.held, money("0.5"), "no second hold");
}

/// H-16: the row a claim finds under its key comes with its result and settlement, as
/// `execution_view` reads them, so that a replay needs no read more.
pub async fn h_16_a_claim_of_a_settled_key_brings_its_result_and_settlement<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    match s
        .claim(claim_req("a", "k1", text_config(), "0.5"))
        .await
        .unwrap()
    {
        ClaimOutcome::Existing(found) => {
            assert_eq!(found.execution, r);
            assert!(found.result.is_none() && found.settlement.is_none());
        }
        o => panic!("{o:?}"),
    }
    s.settle(settle_req(&r, "0.2", "x")).await.unwrap();
    let view = s
        .execution_view(&scope("a"), &key("k1"))
        .await
        .unwrap()
        .unwrap();
    match s
        .claim(claim_req("a", "k1", text_config(), "0.5"))
        .await
        .unwrap()
    {
        ClaimOutcome::Existing(found) => {
            assert_eq!(*found, view);
            assert_eq!(found.settlement.unwrap().amount, money("0.2"));
            assert!(found.result.unwrap().output.is_some());
        }
        o => panic!("{o:?}"),
    }
}

pub async fn h_10_execution_view_reads_row_result_and_settlement_together<S: Stores>(s: Arc<S>) {
    assert!(s
        .execution_view(&scope("a"), &key("k1"))
        .await
        .unwrap()
        .is_none());
    let r = claimed(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let open = s
        .execution_view(&scope("a"), &key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(open.execution, r);
    assert!(open.result.is_none() && open.settlement.is_none() && open.root_receipt.is_none());
    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
    s.settle(settle_req(&d, "0.1", "x")).await.unwrap();
    let done = s
        .execution_view(&scope("a"), &key("k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        Some(done.execution.clone()),
        s.execution(&scope("a"), &key("k1")).await.unwrap()
    );
    assert_eq!(done.execution.state, ExecutionState::Completed);
    assert_eq!(done.result, s.result(r.id).await.unwrap());
    assert!(done.result.is_some());
    assert_eq!(done.settlement, s.settlement(r.id).await.unwrap());
    assert!(done.settlement.is_some());
    assert!(done.root_receipt.is_none(), "not under a root");
    // Another scope's key is another row.
    assert!(s
        .execution_view(&scope("b"), &key("k1"))
        .await
        .unwrap()
        .is_none());
}

pub async fn sc_16_blocked_claim_writes_nothing<S: Stores>(s: Arc<S>) {
    let r = claimed(&*s, claim_req("a", "k1", capped("1"), "0.6")).await;
    match s
        .claim(claim_req("a", "k2", capped("1"), "0.6"))
        .await
        .unwrap()
    {
        ClaimOutcome::Blocked(b) => {
            assert_eq!(b.limit, money("1"));
            assert_eq!(b.held, money("0.6"));
        }
        o => panic!("{o:?}"),
    }
    assert!(s
        .execution(&scope("a"), &key("k2"))
        .await
        .unwrap()
        .is_none());
    assert_eq!(daily(&*s, &r).await.held, money("0.6"));
}

pub async fn h_3_stale_fence_writes_nothing<S: Stores>(s: Arc<S>) {
    let r = claimed(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let stale = Fence {
        execution_id: r.id,
        token: FenceToken(r.fence.0 + 7),
    };
    assert!(matches!(
        s.mark_dispatched(stale, t0()).await,
        Err(StoreError::StaleFence(_))
    ));
    let mut req = settle_req(&r, "0.1", "x");
    req.fence = stale;
    assert!(matches!(
        s.settle(req).await,
        Err(StoreError::StaleFence(_))
    ));
    // Settling a prepared row (never dispatched) is refused too.
    assert!(matches!(
        s.settle(settle_req(&r, "0.1", "x")).await,
        Err(StoreError::StaleFence(_))
    ));
    let read = s.execution(&scope("a"), &key("k1")).await.unwrap().unwrap();
    assert_eq!(read.state, ExecutionState::Prepared);
    assert!(s.settlement(r.id).await.unwrap().is_none());
}

pub async fn sc_30_not_dispatched_releases_hold<S: Stores>(s: Arc<S>) {
    let r = claimed(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let nd = s
        .mark_not_dispatched(r.fence(), NotDispatchedCause::Input, t0())
        .await
        .unwrap();
    assert_eq!(nd.state, ExecutionState::NotDispatched);
    assert_eq!(nd.not_dispatched_cause, Some(NotDispatchedCause::Input));
    assert_eq!(daily(&*s, &r).await.held, Money::ZERO);
    // A dispatched row can no longer become not_dispatched.
    let d = dispatched(&*s, claim_req("a", "k2", text_config(), "0.5")).await;
    assert!(s
        .mark_not_dispatched(d.fence(), NotDispatchedCause::Store, t0())
        .await
        .is_err());
}

/// H-15: the stream's evidence given to `settle` is recorded in the settlement's unit: both are
/// there after it, and a settlement refused (a stale fence) leaves no evidence behind either.
pub async fn h_15_evidence_and_settlement_commit_together<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let mut stale = settle_req(&r, "0.2", "x");
    stale.fence.token = FenceToken(r.fence.0 + 1);
    stale.evidence = Some(evidence(&r, 10));
    assert!(s.settle(stale).await.is_err());
    assert!(s.evidence_for(r.id).await.unwrap().is_empty());
    assert!(s.settlement(r.id).await.unwrap().is_none());
    let mut request = settle_req(&r, "0.2", "x");
    request.evidence = Some(evidence(&r, 10));
    let done = s.settle(request).await.unwrap();
    assert_eq!(done.record.state, ExecutionState::Completed);
    let recorded = s.evidence_for(r.id).await.unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].usage.input, 10);
    assert!(recorded[0].exact);
    assert_eq!(recorded[0].acknowledged_at, None);
    assert_eq!(
        s.settlement(r.id).await.unwrap().unwrap().amount,
        money("0.2")
    );
}

/// H-28: a settlement acknowledges the call's own evidence in its unit when that evidence is
/// exact and its usage is the usage charged, and its `settled` audit row names the evidence and
/// says so; inexact evidence, or evidence of other usage, stays open for reconciliation. Both the
/// settlement from the row as last read (`seen`) and the general one.
pub async fn h_28_a_settlement_acknowledges_its_own_exact_evidence<S: Stores>(s: Arc<S>) {
    // (key, the row as last read given, evidence exact, evidence usage = charged) → acknowledged
    let cases = [
        ("k1", true, true, true, true),
        ("k2", false, true, true, true),
        ("k3", true, false, true, false),
        ("k4", false, false, true, false),
        ("k5", true, true, false, false),
        ("k6", false, true, false, false),
    ];
    for (k, seen, exact, equal, acknowledged) in cases {
        let r = dispatched(&*s, claim_req("a", k, text_config(), "0.5")).await;
        let mut request = settle_req(&r, "0.1", "x");
        if !seen {
            request.seen = None;
        }
        let charged = request.usage;
        let mut own = evidence(&r, 0);
        own.usage = if equal {
            charged
        } else {
            Usage {
                input: charged.input + 1,
                ..charged
            }
        };
        own.exact = exact;
        request.evidence = Some(own);
        s.settle(request).await.unwrap();
        let recorded = s.evidence_for(r.id).await.unwrap();
        assert_eq!(recorded.len(), 1, "{k}");
        assert_eq!(
            recorded[0].acknowledged_at,
            acknowledged.then_some(t0()),
            "{k}"
        );
        let trail = s
            .audit_rows(&scope("a"), AuditPosition::START, 100)
            .await
            .unwrap();
        let settled = trail
            .iter()
            .find(|row| row.event.kind == "settled" && row.event.execution_id == Some(r.id))
            .unwrap();
        assert_eq!(
            settled.event.detail["evidence_id"],
            recorded[0].id.to_string(),
            "{k}"
        );
        assert_eq!(
            settled.event.detail["evidence_acknowledged"], acknowledged,
            "{k}"
        );
        // What it acknowledged is never open again; what it left open is.
        let open = s.unacknowledged(&scope("a"), 0, 100).await.unwrap();
        assert_eq!(
            open.iter().any(|e| e.id == recorded[0].id),
            !acknowledged,
            "{k}"
        );
    }
    // No evidence acknowledged by a settlement shows up as an `evidence_acknowledged` row: the
    // `settled` row says it.
    let trail = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap();
    assert!(!trail
        .iter()
        .any(|row| row.event.kind == "evidence_acknowledged"));
}

pub async fn settle_writes_charge_spend_result_and_completes<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let out = s.settle(settle_req(&r, "0.000020", "hello")).await.unwrap();
    assert_eq!(out.record.state, ExecutionState::Completed);
    assert_eq!(out.record.outcome, Some(Outcome::Success));
    assert_eq!(out.record.hold, Money::ZERO);
    assert_eq!(out.record.provider_ref.as_deref(), Some("req-1"));
    let d = daily(&*s, &r).await;
    assert_eq!((d.settled, d.held), (money("0.00002"), Money::ZERO));
    assert_eq!(session(&*s, &r).await.settled, money("0.00002"));
    let st = s.settlement(r.id).await.unwrap().unwrap();
    assert_eq!(st, out.settlement);
    assert_eq!(st.amount, money("0.00002"));
    assert_eq!(st.price_version, "prices-1");
    let res = s.result(r.id).await.unwrap().unwrap();
    assert_eq!(res.output.and_then(|o| o.text).as_deref(), Some("hello"));
    assert_eq!(res.retention_expires_at, t0() + Duration::seconds(3600));
}

pub async fn settlement_is_exactly_once<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    s.settle(settle_req(&r, "0.1", "x")).await.unwrap();
    let again = s.settle(settle_req(&r, "0.1", "x")).await;
    assert!(again.is_err(), "second settlement must fail: {again:?}");
    // Even a fresh fence on the completed row cannot settle twice.
    let fenced = s
        .take_fence(
            &scope("a"),
            &key("k1"),
            &[ExecutionState::Completed],
            false,
            1000,
            t0(),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(s.settle(settle_req(&fenced, "0.1", "x")).await.is_err());
    assert_eq!(daily(&*s, &r).await.settled, money("0.1"));
    let all = s
        .settlements(t0().date_naive(), t0().date_naive(), 100)
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
}

/// Access below the store methods, for the one case that must reach the stores' own guard of
/// exactly-once settlement: the fence and state checks of `settle` stop every second settle
/// before it, so only a writer that skips them (a bug, a tool) can show that the guard itself
/// holds. Implemented for every store the suite runs on: the in-memory stores here (through
/// their `test-support` hook), the Postgres stores in [`crate::pg`].
#[async_trait::async_trait]
pub trait RawSettlementInsert {
    /// Inserts `settlement` as `settle` inserts its charge, without the fence, state, spend or
    /// journal work around it: on Postgres the row's `INSERT` (its `UNIQUE (execution_id)`
    /// refuses a second one), in memory the one-per-execution check and push.
    ///
    /// # Errors
    /// `Duplicate` when the execution already has a settlement; store failure.
    async fn insert_settlement_unchecked(
        &self,
        settlement: &SettlementRecord,
    ) -> Result<SettlementRecord, StoreError>;
}

/// SC-119: a second settlement that got past the fence (here: written straight to the table) is
/// stopped by the one-per-execution constraint itself, as `Duplicate`, and changes nothing.
pub async fn sc_119_a_second_settlement_is_refused_by_the_one_per_execution_constraint<
    S: Stores + RawSettlementInsert,
>(
    s: Arc<S>,
) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let first = s
        .settle(settle_req(&r, "0.1", "x"))
        .await
        .unwrap()
        .settlement;
    let mut second = first.clone();
    second.id = SettlementId(uuid::Uuid::new_v4());
    second.amount = money("0.2");
    let refused = s.insert_settlement_unchecked(&second).await;
    match refused {
        Err(StoreError::Duplicate(what)) => {
            assert!(what.contains(&r.id.to_string()), "{what}");
        }
        other => panic!("the constraint must refuse it: {other:?}"),
    }
    assert_eq!(s.settlement(r.id).await.unwrap(), Some(first));
    let all = s
        .settlements(t0().date_naive(), t0().date_naive(), 100)
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    // A first settlement of another execution goes through the same insert.
    let other = dispatched(&*s, claim_req("a", "k2", text_config(), "0.5")).await;
    let mut row = second.clone();
    row.id = SettlementId(uuid::Uuid::new_v4());
    row.execution_id = other.id;
    row.operation_key = other.operation_key.clone();
    s.insert_settlement_unchecked(&row).await.unwrap();
    assert_eq!(s.settlement(other.id).await.unwrap(), Some(row));
}

pub async fn sc_15_warning_keeps_output<S: Stores>(s: Arc<S>) {
    let mut c = text_config();
    c.caps.daily_warn = Some(money("0.1"));
    let r = dispatched(&*s, claim_req("a", "k1", c, "0.5")).await;
    let out = s.settle(settle_req(&r, "0.2", "kept")).await.unwrap();
    assert_eq!(out.result.outcome, Outcome::Success);
    assert_eq!(out.result.warnings.len(), 1);
    assert_eq!(out.result.warnings[0].level, CapLevel::Warn);
    assert!(out.result.output.is_some());
}

pub async fn sc_16_post_call_block_settles_then_suppresses_output<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", capped("1"), "0.5")).await;
    // The provider overran the worst case: 1.5 > block 1.
    let out = s.settle(settle_req(&r, "1.5", "secret")).await.unwrap();
    assert_eq!(out.result.outcome, Outcome::Blocked);
    assert!(out.result.output.is_none());
    assert_eq!(out.record.outcome, Some(Outcome::Blocked));
    assert_eq!(
        s.settlement(r.id).await.unwrap().unwrap().amount,
        money("1.5")
    );
    assert_eq!(daily(&*s, &r).await.settled, money("1.5"));
    let stored = s.result(r.id).await.unwrap().unwrap();
    assert!(stored.output.is_none());
}

pub async fn sc_94_reconciliation_required_keeps_its_reason_and_hold<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let rr = s
        .mark_reconciliation_required(
            r.fence(),
            ReconciliationReason::NoExactUsage,
            Some("req-9".into()),
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(rr.state, ExecutionState::ReconciliationRequired);
    assert_eq!(
        rr.reconciliation_reason,
        Some(ReconciliationReason::NoExactUsage)
    );
    let trail = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap();
    let marked = trail
        .iter()
        .find(|row| row.event.kind == "reconciliation_required")
        .unwrap();
    assert_eq!(
        marked.event.detail["reconciliation_reason"],
        "no_exact_usage"
    );
    assert_eq!(daily(&*s, &r).await.held, money("0.5"));
    let listed = s
        .by_state(&scope("a"), ExecutionState::ReconciliationRequired, 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    let op = s
        .take_fence(
            &scope("a"),
            &key("k1"),
            &[ExecutionState::ReconciliationRequired],
            false,
            1000,
            t0(),
        )
        .await
        .unwrap()
        .unwrap();
    let mut req = settle_req(&op, "0.3", "");
    req.source = SettlementSource::Operator;
    req.output = None;
    req.outcome = Outcome::Unavailable;
    s.settle(req).await.unwrap();
    let d = daily(&*s, &r).await;
    assert_eq!((d.settled, d.held), (money("0.3"), Money::ZERO));
    // The reason stays on the completed row: why an operator had to settle it.
    let done = s.execution(&scope("a"), &key("k1")).await.unwrap().unwrap();
    assert_eq!(done.state, ExecutionState::Completed);
    assert_eq!(
        done.reconciliation_reason,
        Some(ReconciliationReason::NoExactUsage)
    );
}

pub async fn sc_40_take_fence_only_after_lease_expiry<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let states = [ExecutionState::Prepared, ExecutionState::Dispatched];
    let early = s
        .take_fence(&scope("a"), &key("k1"), &states, true, 1000, t0())
        .await
        .unwrap();
    assert!(early.is_none(), "lease still live");
    let later = t0() + Duration::milliseconds(30_001);
    let taken = s
        .take_fence(&scope("a"), &key("k1"), &states, true, 1000, later)
        .await
        .unwrap()
        .unwrap();
    assert!(taken.fence > r.fence);
    // The old holder is now stale (H-3).
    let settled = s.settle(settle_req(&r, "0.1", "x")).await;
    assert!(
        matches!(settled, Err(StoreError::StaleFence(_))),
        "{settled:?}"
    );
    // A second recoverer cannot take the fresh fence.
    assert!(s
        .take_fence(&scope("a"), &key("k1"), &states, true, 1000, later)
        .await
        .unwrap()
        .is_none());
    assert!(s
        .take_fence(&scope("a"), &key("missing"), &states, true, 1000, later)
        .await
        .unwrap()
        .is_none());
}

/// A renewal extends the lease from the store's "now": a recoverer that would have found the
/// claim's lease expired finds nothing, until the renewed lease ends too.
pub async fn sc_100_renewed_lease_keeps_recovery_out<S: Stores>(s: Arc<S>) {
    let r = claimed(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let states = [ExecutionState::Prepared, ExecutionState::Dispatched];
    let renewed_at = t0() + Duration::milliseconds(20_000);
    let renewed = s.renew_lease(r.fence(), 30_000, renewed_at).await.unwrap();
    assert_eq!(renewed.fence, r.fence, "a renewal keeps the fence");
    assert_eq!(renewed.state, ExecutionState::Prepared);
    assert!(renewed.lease_expires_at > r.lease_expires_at);
    let stored = s.execution(&scope("a"), &key("k1")).await.unwrap().unwrap();
    assert_eq!(stored.lease_expires_at, renewed.lease_expires_at);
    // Past the claim's lease, inside the renewed one: nothing to take over.
    let past_claim = t0() + Duration::milliseconds(30_001);
    assert!(s
        .expired(&scope("a"), past_claim, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(s
        .take_fence(&scope("a"), &key("k1"), &states, true, 1000, past_claim)
        .await
        .unwrap()
        .is_none());
    // The dispatched row renews too, and its writes still hold the fence.
    let d = s.mark_dispatched(r.fence(), past_claim).await.unwrap();
    s.renew_lease(d.fence(), 30_000, past_claim).await.unwrap();
    // Once renewals stop, the lease ends.
    let past_renewal = past_claim + Duration::milliseconds(30_001);
    let taken = s
        .take_fence(&scope("a"), &key("k1"), &states, true, 1000, past_renewal)
        .await
        .unwrap()
        .unwrap();
    assert!(taken.fence > r.fence);
}

/// A renewal with a stale fence, or of a finished execution, fails and changes nothing (H-3).
pub async fn sc_101_stale_renewal_fails_and_changes_nothing<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let states = [ExecutionState::Prepared, ExecutionState::Dispatched];
    let taken = s
        .take_fence(&scope("a"), &key("k1"), &states, false, 30_000, t0())
        .await
        .unwrap()
        .unwrap();
    let audit_before = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap()
        .len();
    let later = t0() + Duration::milliseconds(10_000);
    assert!(matches!(
        s.renew_lease(r.fence(), 60_000, later).await,
        Err(StoreError::StaleFence(id)) if id == r.id
    ));
    let stored = s.execution(&scope("a"), &key("k1")).await.unwrap().unwrap();
    assert_eq!(stored, taken, "a stale renewal changes nothing");
    // A finished execution renews nothing either, even with its current fence.
    let done = s
        .settle(settle_req(&taken, "0.1", "x"))
        .await
        .unwrap()
        .record;
    assert!(matches!(
        s.renew_lease(done.fence(), 60_000, later).await,
        Err(StoreError::StaleFence(_))
    ));
    let stored = s.execution(&scope("a"), &key("k1")).await.unwrap().unwrap();
    assert_eq!(stored, done);
    // Renewals write no audit row: the settlement is the only new one.
    let audit_after = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap()
        .len();
    assert_eq!(audit_after, audit_before + 1);
    let missing = Fence {
        execution_id: ExecutionId::new(),
        token: FenceToken(1),
    };
    assert!(matches!(
        s.renew_lease(missing, 60_000, later).await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn sc_41_expired_lists_only_expired_unfinished<S: Stores>(s: Arc<S>) {
    claimed(&*s, claim_req("a", "p", text_config(), "0.1")).await;
    dispatched(&*s, claim_req("a", "d", text_config(), "0.1")).await;
    let done = dispatched(&*s, claim_req("a", "c", text_config(), "0.1")).await;
    s.settle(settle_req(&done, "0.1", "x")).await.unwrap();
    claimed(&*s, claim_req("b", "other-scope", text_config(), "0.1")).await;
    assert!(s.expired(&scope("a"), t0(), 10).await.unwrap().is_empty());
    let later = t0() + Duration::seconds(31);
    let mut keys: Vec<String> = s
        .expired(&scope("a"), later, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.operation_key.to_string())
        .collect();
    keys.sort();
    assert_eq!(keys, ["d", "p"]);
    assert_eq!(s.expired(&scope("a"), later, 1).await.unwrap().len(), 1);
}

pub async fn sc_71_sc_73_retention_and_erasure_are_final<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    s.settle(settle_req(&r, "0.1", "x")).await.unwrap();
    assert!(
        s.erase(&scope("b"), r.id, t0()).await.is_err(),
        "other scope"
    );
    s.erase(&scope("a"), r.id, t0()).await.unwrap();
    s.erase(&scope("a"), r.id, t0()).await.unwrap();
    let res = s.result(r.id).await.unwrap().unwrap();
    assert!(res.output.is_none() && res.erased_at.is_some());
    assert_eq!(res.outcome, Outcome::Success, "history keeps its outcome");
    let erased = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.event.kind == "erased")
        .count();
    assert_eq!(erased, 1);
    // Retention expiry.
    let r2 = dispatched(&*s, claim_req("a", "k2", text_config(), "0.5")).await;
    s.settle(settle_req(&r2, "0.1", "y")).await.unwrap();
    assert_eq!(s.erase_expired(t0(), 10).await.unwrap(), 0);
    let after = t0() + Duration::seconds(3601);
    assert_eq!(s.erase_expired(after, 10).await.unwrap(), 1);
    assert!(s.result(r2.id).await.unwrap().unwrap().output.is_none());
    assert_eq!(s.erase_expired(after, 10).await.unwrap(), 0);
}

fn evidence(r: &ExecutionRecord, input: u64) -> NewEvidence {
    NewEvidence {
        scope: r.scope.clone(),
        execution_id: r.id,
        operation_key: r.operation_key.clone(),
        provider_ref: Some("req".into()),
        usage: Usage {
            input,
            ..Usage::ZERO
        },
        exact: true,
        source: EvidenceSource::Stream,
        now: t0(),
    }
}

pub async fn sc_42_inbox_pages_by_seq_and_acknowledges_once<S: Stores>(s: Arc<S>) {
    let r = claimed(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let e1 = s.record_evidence(evidence(&r, 1)).await.unwrap();
    let e2 = s.record_evidence(evidence(&r, 2)).await.unwrap();
    let e3 = s.record_evidence(evidence(&r, 3)).await.unwrap();
    assert!(e1.seq < e2.seq && e2.seq < e3.seq);
    let page = s.unacknowledged(&scope("a"), 0, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|e| e.id).collect::<Vec<_>>(),
        [e1.id, e2.id]
    );
    let next = s.unacknowledged(&scope("a"), e2.seq, 2).await.unwrap();
    assert_eq!(next.iter().map(|e| e.id).collect::<Vec<_>>(), [e3.id]);
    assert!(s.acknowledge(&scope("a"), e2.id, t0()).await.unwrap());
    assert!(!s.acknowledge(&scope("a"), e2.id, t0()).await.unwrap());
    assert!(s.acknowledge(&scope("b"), e1.id, t0()).await.is_err());
    let left: Vec<_> = s
        .unacknowledged(&scope("a"), 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(left, [e1.id, e3.id]);
    assert!(s
        .unacknowledged(&scope("b"), 0, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(s.evidence_for(r.id).await.unwrap().len(), 3);
}

pub async fn audit_chain_verifies_and_never_holds_content<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    s.settle(settle_req(&r, "0.1", "TOP-SECRET-OUTPUT"))
        .await
        .unwrap();
    s.append_audit(AuditEvent {
        scope: scope("a"),
        execution_id: None,
        kind: "replayed".into(),
        detail: serde_json::json!({"operation_key": "k1"}),
        at: t0(),
    })
    .await
    .unwrap();
    let rows = s
        .audit_rows(&scope("a"), AuditPosition::START, 100)
        .await
        .unwrap();
    let kinds: Vec<_> = rows
        .iter()
        .filter(|row| row.event.execution_id == Some(r.id))
        .map(|r| r.event.kind.as_str())
        .collect();
    assert_eq!(kinds, ["claimed", "dispatched", "settled"]);
    assert!(rows.iter().any(|r| r.event.kind == "replayed"));
    assert!(
        rows.windows(2).all(|w| w[0].position() < w[1].position()),
        "listed by chain, then seq"
    );
    verify_chain(&rows).unwrap();
    let mut verifier = ChainVerifier::default();
    rows.iter().for_each(|row| verifier.push(row).unwrap());
    verifier
        .finish(&s.audit_heads(&scope("a")).await.unwrap())
        .unwrap();
    let text = serde_json::to_string(&rows).unwrap();
    assert!(!text.contains("TOP-SECRET-OUTPUT"));
    assert!(!text.contains("Be brief."), "system prompt never audited");
    let dispatched_at = rows
        .iter()
        .position(|r| r.event.kind == "dispatched")
        .unwrap();
    let mut tampered = rows.clone();
    tampered[dispatched_at].event.kind = "settled".into();
    assert_eq!(
        verify_chain(&tampered).unwrap_err().seq,
        rows[dispatched_at].seq
    );
    let first = rows[dispatched_at - 1].position();
    assert_eq!(
        s.audit_rows(&scope("a"), first, 100).await.unwrap(),
        rows[dispatched_at..].to_vec()
    );
    assert!(s
        .audit_rows(&scope("zzz"), AuditPosition::START, 100)
        .await
        .unwrap()
        .is_empty());
}

pub async fn sc_98_audit_chains_page_and_end_at_their_heads<S: Stores>(s: Arc<S>) {
    assert!(s.audit_heads(&scope("a")).await.unwrap().is_empty());
    let mut ids = Vec::new();
    for n in 0..48 {
        // Eight consumers: each consumer's executions append to its own chain (H-33).
        let mut config = text_config();
        config.consumer = ConsumerId::parse(format!("team-{}", n % 8)).unwrap();
        let r = dispatched(&*s, claim_req("a", &format!("k{n}"), config, "0.01")).await;
        ids.push(r.id);
    }
    let heads = s.audit_heads(&scope("a")).await.unwrap();
    assert_eq!(
        heads.iter().map(|h| h.chain).collect::<Vec<_>>(),
        AuditChain::all().collect::<Vec<_>>(),
        "every chain's head exists once the scope has a row"
    );
    assert!(
        heads.iter().filter(|h| h.seq > 0).count() > 1,
        "executions spread over several chains"
    );
    // Page by page, small pages, bounded memory.
    let mut verifier = ChainVerifier::default();
    let mut after = AuditPosition::START;
    let mut listed = Vec::new();
    loop {
        let page = s.audit_rows(&scope("a"), after, 7).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.position();
        for row in &page {
            verifier.push(row).unwrap();
            listed.push(row.clone());
        }
    }
    assert_eq!(listed.len(), 96, "claimed + dispatched for each");
    verifier.finish(&heads).unwrap();
    for id in ids {
        let own: Vec<&AuditRow> = listed
            .iter()
            .filter(|r| r.event.execution_id == Some(id))
            .collect();
        assert_eq!(own.len(), 2);
        assert_eq!(own[0].chain, own[1].chain, "one execution, one chain");
        assert_eq!(own[0].seq + 1, own[1].seq);
    }
    let sum: i64 = heads.iter().map(|h| h.seq).sum();
    assert_eq!(sum, 96);
}

pub async fn h_33_a_consumer_s_rows_append_to_its_group_s_chains<S: Stores>(s: Arc<S>) {
    // Executions of one consumer take one chain of its group (so that batches of consumers in
    // other groups never meet on a head, and one consumer's calls move one head), and every
    // chain still verifies.
    let mut groups = std::collections::BTreeMap::new();
    let mut chains = std::collections::BTreeMap::new();
    for c in 0..6 {
        let consumer = format!("team-{c}");
        let mut config = text_config();
        config.consumer = ConsumerId::parse(consumer.clone()).unwrap();
        for n in 0..8 {
            let key = format!("{consumer}-{n}");
            let r = dispatched(&*s, claim_req("a", &key, config.clone(), "0.01")).await;
            groups.insert(r.id, AuditChain::group_of("a", &consumer));
            chains.insert(r.id, AuditChain::of_consumer("a", &consumer));
        }
    }
    let rows = s
        .audit_rows(&scope("a"), AuditPosition::START, 1000)
        .await
        .unwrap();
    assert_eq!(rows.len(), 2 * groups.len());
    for row in &rows {
        let id = row.event.execution_id.unwrap();
        assert_eq!(row.chain.group(), groups[&id], "{id:?}");
        assert_eq!(row.chain, chains[&id], "{id:?}");
        assert_eq!(row.chain, AuditChain::of_execution(id));
    }
    let mut verifier = ChainVerifier::default();
    rows.iter().for_each(|row| verifier.push(row).unwrap());
    verifier
        .finish(&s.audit_heads(&scope("a")).await.unwrap())
        .unwrap();
}

pub async fn settlements_by_day<S: Stores>(s: Arc<S>) {
    let r = dispatched(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    s.settle(settle_req(&r, "0.1", "x")).await.unwrap();
    let day = t0().date_naive();
    assert_eq!(s.settlements(day, day, 10).await.unwrap().len(), 1);
    let next = day.succ_opt().unwrap();
    assert!(s.settlements(next, next, 10).await.unwrap().is_empty());
}

/// SC-207: a settlement's `settled` audit row names the hold it released and says when the
/// charge is above it, on every settlement path of the store.
pub async fn sc_207_a_charge_above_its_hold_is_recorded_on_its_audit_row<S: Stores>(s: Arc<S>) {
    for (k, amount, above) in [("within", "0.004", false), ("above", "0.03", true)] {
        let r = claimed(&*s, claim_req("a", k, text_config(), "0.005")).await;
        let r = s.mark_dispatched(r.fence(), t0()).await.unwrap();
        s.settle(settle_req(&r, amount, "x")).await.unwrap();
        let trail = s
            .audit_rows(&scope("a"), AuditPosition::START, 100)
            .await
            .unwrap();
        let settled = trail
            .iter()
            .find(|row| row.event.kind == "settled" && row.event.execution_id == Some(r.id))
            .unwrap();
        assert_eq!(settled.event.detail["above_hold"], above, "{k}");
        assert_eq!(
            settled.event.detail["hold"],
            money("0.005").to_string(),
            "{k}"
        );
    }
}

/// SC-192: a scope's settlements of a range come by day, then settlement order, and the limit
/// counts that scope's rows only: another scope's settlements, made before and between them,
/// neither appear nor use up the limit.
pub async fn sc_192_scope_settlements_read_one_scope_by_day_within_the_limit<S: Stores>(s: Arc<S>) {
    let day0 = t0().date_naive();
    let day1 = day0.succ_opt().unwrap();
    let settle_at = |scope_: &str, key_: &str, at: DateTime<Utc>| {
        let s = Arc::clone(&s);
        let (scope_, key_) = (scope_.to_string(), key_.to_string());
        async move {
            let mut req = claim_req(&scope_, &key_, text_config(), "0.5");
            req.binding.session_id = SessionId::parse(format!("s-{key_}")).unwrap();
            req.now = at;
            let r = claimed(&*s, req).await;
            let r = s.mark_dispatched(r.fence(), at).await.unwrap();
            let mut settle = settle_req(&r, "0.01", "x");
            settle.now = at;
            s.settle(settle).await.unwrap().settlement.id
        }
    };
    for i in 0..5 {
        settle_at("b", &format!("b{i}"), t0()).await;
    }
    // The later day settles first: the order is by day before settlement order.
    let late = settle_at("a", "a-late", t0() + Duration::days(1)).await;
    settle_at("b", "b5", t0()).await;
    let early = settle_at("a", "a-early", t0()).await;
    settle_at("b", "b6", t0() + Duration::days(1)).await;

    let ids = |rows: Vec<SettlementRecord>| -> Vec<SettlementId> {
        assert!(rows.iter().all(|r| r.scope == scope("a")), "{rows:?}");
        rows.into_iter().map(|r| r.id).collect()
    };
    let both = s
        .scope_settlements(&scope("a"), day0, day1, 10)
        .await
        .unwrap();
    assert_eq!(ids(both), [early, late], "the scope's rows only, by day");
    let limited = s
        .scope_settlements(&scope("a"), day0, day1, 2)
        .await
        .unwrap();
    assert_eq!(
        ids(limited),
        [early, late],
        "other scopes' rows use none of the limit"
    );
    let first = s
        .scope_settlements(&scope("a"), day0, day1, 1)
        .await
        .unwrap();
    assert_eq!(ids(first), [early]);
    let second_day = s
        .scope_settlements(&scope("a"), day1, day1, 10)
        .await
        .unwrap();
    assert_eq!(ids(second_day), [late]);
    let b = s
        .scope_settlements(&scope("b"), day0, day0, 100)
        .await
        .unwrap();
    assert_eq!(b.len(), 6);
    assert!(b.iter().all(|r| r.scope == scope("b")));
    assert!(s
        .scope_settlements(&scope("c"), day0, day1, 10)
        .await
        .unwrap()
        .is_empty());
}

pub async fn sc_10_scopes_are_isolated<S: Stores>(s: Arc<S>) {
    let a = claimed(&*s, claim_req("a", "k1", text_config(), "0.5")).await;
    let b = claimed(&*s, claim_req("b", "k1", text_config(), "0.5")).await;
    assert_ne!(a.id, b.id);
    assert!(s
        .execution_by_id(&scope("b"), a.id)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        s.execution_by_id(&scope("a"), a.id)
            .await
            .unwrap()
            .map(|r| r.id),
        Some(a.id)
    );
    assert_eq!(
        daily(&*s, &a).await.held,
        money("0.5"),
        "spend is per scope"
    );
}

/// 200 claims in parallel against one daily block cap of 1.00 with holds of 0.03: at most 33
/// are admitted, and settled + held never exceeds the cap, also while half of the admitted
/// calls settle concurrently.
/// H-13: every transaction that takes a consumer's spend rows takes them last, in one order, so
/// one consumer's claims (plain and dispatched at the claim), dispatch marks that shrink the
/// hold, not-dispatched releases and settlements, all at once on one session, never deadlock
/// (a deadlock would surface as a store error) and leave the spend rows exact.
pub async fn h_13_one_consumers_transactions_in_parallel_never_deadlock<S: Stores + 'static>(
    s: Arc<S>,
) {
    let mut tasks = Vec::new();
    for i in 0..60u32 {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let mut req = claim_req("a", &format!("k{i}"), text_config(), "0.03");
            req.dispatch = i % 4 == 3;
            let ClaimOutcome::Claimed(r) = s.claim(req).await.unwrap() else {
                panic!("no cap: every claim is admitted");
            };
            match i % 4 {
                0 => {
                    let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
                    s.settle(settle_req(&d, "0.02", "x")).await.unwrap();
                    money("0.02")
                }
                1 => {
                    let d = s
                        .mark_dispatched_with_hold(r.fence(), money("0.01"), t0())
                        .await
                        .unwrap();
                    s.settle(settle_req(&d, "0.01", "x")).await.unwrap();
                    money("0.01")
                }
                2 => {
                    s.mark_not_dispatched(r.fence(), NotDispatchedCause::Aborted, t0())
                        .await
                        .unwrap();
                    Money::ZERO
                }
                _ => {
                    let mut settle = settle_req(&r, "0.03", "x");
                    settle.evidence = Some(evidence(&r, 10));
                    s.settle(settle).await.unwrap();
                    money("0.03")
                }
            }
        }));
    }
    let mut settled = Money::ZERO;
    for t in tasks {
        settled = settled.checked_add(t.await.unwrap()).unwrap();
    }
    let r = s.execution(&scope("a"), &key("k0")).await.unwrap().unwrap();
    let (d, se) = (daily(&*s, &r).await, session(&*s, &r).await);
    assert_eq!((d.settled, d.held), (settled, Money::ZERO));
    assert_eq!((se.settled, se.held), (settled, Money::ZERO));
}

pub async fn no_overspend_under_concurrent_claims<S: Stores + 'static>(s: Arc<S>) {
    let cap = money("1.00");
    let consumer = ConsumerId::parse("team-a").unwrap();
    // Samples settled + held while the claims run: the cap holds at every moment observed.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (s, done, consumer) = (Arc::clone(&s), Arc::clone(&done), consumer.clone());
        tokio::spawn(async move {
            let mut samples = 0u32;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let d = s
                    .daily_spend(&scope("a"), &consumer, t0().date_naive(), &usd())
                    .await
                    .unwrap();
                let total = d.settled.checked_add(d.held).unwrap();
                assert!(
                    total <= cap,
                    "mid-run: settled {} + held {}",
                    d.settled,
                    d.held
                );
                samples += 1;
                tokio::task::yield_now().await;
            }
            samples
        })
    };
    let mut tasks = Vec::new();
    for i in 0..200 {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let mut req = claim_req("a", &format!("k{i}"), capped("1.00"), "0.03");
            req.binding.session_id = SessionId::parse(format!("s{}", i % 7)).unwrap();
            match s.claim(req).await.unwrap() {
                ClaimOutcome::Claimed(r) => {
                    if i % 2 == 0 {
                        let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
                        s.settle(settle_req(&d, "0.02", "x")).await.unwrap();
                    }
                    1u32
                }
                ClaimOutcome::Blocked(_) => 0,
                ClaimOutcome::Existing(_) => panic!("fresh keys"),
                ClaimOutcome::RootRefused(_) => panic!("no root"),
                ClaimOutcome::Limited(_) => panic!("no limits"),
            }
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(sampler.await.unwrap() > 0, "the sampler observed the run");
    let d = s
        .daily_spend(&scope("a"), &consumer, t0().date_naive(), &usd())
        .await
        .unwrap();
    let total = d.settled.checked_add(d.held).unwrap();
    assert!(
        total <= cap,
        "settled {} + held {} > cap",
        d.settled,
        d.held
    );
    assert!(
        admitted >= 33,
        "admitted {admitted}: the cap allows at least 33"
    );
    // Each admitted call holds 0.03 until settled at 0.02, so at most 50 fit.
    assert!(admitted <= 50, "admitted {admitted}");
}

pub async fn concurrent_claims_of_one_key_insert_once<S: Stores + 'static>(s: Arc<S>) {
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            s.claim(claim_req("a", "same", text_config(), "0.1"))
                .await
                .unwrap()
        }));
    }
    let mut claimed_n = 0;
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        match t.await.unwrap() {
            ClaimOutcome::Claimed(r) => {
                claimed_n += 1;
                ids.insert(r.id);
            }
            ClaimOutcome::Existing(r) => {
                ids.insert(r.execution.id);
            }
            ClaimOutcome::Blocked(_) => panic!("no caps"),
            ClaimOutcome::RootRefused(_) => panic!("no root"),
            ClaimOutcome::Limited(_) => panic!("no limits"),
        }
    }
    assert_eq!(claimed_n, 1);
    assert_eq!(ids.len(), 1);
    let r = s
        .execution(&scope("a"), &key("same"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(daily(&*s, &r).await.held, money("0.1"));
}

mod roots;
mod service;
pub use roots::*;
pub use service::*;

mod ledger_audit;
pub use ledger_audit::*;

mod money;
pub use money::*;

mod limits;
pub use limits::*;

/// The in-memory stores' insert below the store methods: the one-per-execution check and the
/// push `settle` makes (`MemoryStores::insert_settlement_unchecked`, feature `test-support` of
/// `tollgate-store`).
#[async_trait::async_trait]
impl RawSettlementInsert for tollgate_store::MemoryStores {
    async fn insert_settlement_unchecked(
        &self,
        settlement: &SettlementRecord,
    ) -> Result<SettlementRecord, StoreError> {
        tollgate_store::MemoryStores::insert_settlement_unchecked(self, settlement)
    }
}

/// The finance feed while 40 calls settle in parallel (20 in another scope): a reader paging
/// with a small limit and resuming after its last position gets every settlement of its scope
/// exactly once, in strictly increasing positions, and none of the other scope.
pub async fn sc_141_feed_pages_without_gaps_or_duplicates_under_concurrent_settles<
    S: Stores + 'static,
>(
    s: Arc<S>,
) {
    const CALLS: usize = 60;
    const PAGE: u32 = 3;
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let scope_ = if i % 3 == 2 { "b" } else { "a" };
            let mut req = claim_req(scope_, &format!("k{i}"), text_config(), "0.5");
            req.binding.session_id = SessionId::parse(format!("s{i}")).unwrap();
            let r = dispatched(&*s, req).await;
            s.settle(settle_req(&r, "0.01", "x")).await.unwrap();
            (scope_, r.id)
        }));
    }
    let mut seen = Vec::new();
    let mut after = FeedPosition::START;
    fn read(page: Vec<FeedEntry>, after: &mut FeedPosition, seen: &mut Vec<ExecutionId>) {
        for e in page {
            assert!(e.position > *after, "{:?} after {:?}", e.position, after);
            assert_eq!(e.settlement.scope, scope("a"));
            *after = e.position;
            seen.push(e.settlement.execution_id);
        }
    }
    while !tasks.iter().all(|t| t.is_finished()) {
        let page = s
            .settlements_after(Some(&scope("a")), after, PAGE)
            .await
            .unwrap();
        read(page, &mut after, &mut seen);
        tokio::task::yield_now().await;
    }
    let mut expected = std::collections::BTreeSet::new();
    for t in tasks {
        let (scope_, id) = t.await.unwrap();
        if scope_ == "a" {
            expected.insert(id);
        }
    }
    // The feed shows a row once every older transaction has ended (on Postgres, in the whole
    // cluster): drain until the reader holds as many as were settled, within a bound.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while seen.len() < expected.len() && std::time::Instant::now() < deadline {
        let page = s
            .settlements_after(Some(&scope("a")), after, PAGE)
            .await
            .unwrap();
        if page.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        read(page, &mut after, &mut seen);
    }
    let unique: std::collections::BTreeSet<_> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "no settlement twice");
    assert_eq!(
        unique, expected,
        "every settlement of the scope, none of another"
    );
    assert!(s
        .settlements_after(Some(&scope("a")), after, PAGE)
        .await
        .unwrap()
        .is_empty());
    let mut all = Vec::new();
    while all.len() < CALLS && std::time::Instant::now() < deadline {
        all = s
            .settlements_after(None, FeedPosition::START, 1000)
            .await
            .unwrap();
    }
    assert_eq!(all.len(), CALLS, "across scopes");
    assert!(all.windows(2).all(|w| w[0].position < w[1].position));
}

/// SC-193: a settlement's feed position is found by its id within its own scope only, and it is
/// the position the scope's feed lists the settlement at.
pub async fn sc_193_a_feed_position_is_found_for_a_settlement_of_its_own_scope_only<S: Stores>(
    s: Arc<S>,
) {
    let mut ids = Vec::new();
    for (scope_, key_) in [("a", "k1"), ("b", "k1"), ("a", "k2")] {
        let mut req = claim_req(scope_, key_, text_config(), "0.5");
        req.binding.session_id = SessionId::parse(format!("s-{key_}")).unwrap();
        let r = dispatched(&*s, req).await;
        ids.push(
            s.settle(settle_req(&r, "0.01", "x"))
                .await
                .unwrap()
                .settlement
                .id,
        );
    }
    // The feed lists a row once every older transaction has ended (on Postgres, in the whole
    // cluster): wait for both of scope a's, within a bound.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut feed = Vec::new();
    while feed.len() < 2 && std::time::Instant::now() < deadline {
        feed = s
            .settlements_after(Some(&scope("a")), FeedPosition::START, 10)
            .await
            .unwrap();
        if feed.len() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    assert_eq!(feed.len(), 2, "{feed:?}");
    for entry in &feed {
        assert_eq!(
            s.feed_position(&scope("a"), entry.settlement.id)
                .await
                .unwrap(),
            Some(entry.position)
        );
        assert_eq!(
            s.feed_position(&scope("b"), entry.settlement.id)
                .await
                .unwrap(),
            None,
            "another scope's settlement"
        );
    }
    assert_eq!(s.feed_position(&scope("a"), ids[1]).await.unwrap(), None);
    assert_eq!(
        s.feed_position(&scope("a"), SettlementId::new())
            .await
            .unwrap(),
        None
    );
}
