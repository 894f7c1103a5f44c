//! The reconciliation backlog end to end over real HTTP (SC-110..SC-113): a Responses call whose
//! stream the mock cuts after the response id is known ends `reconciliation_required`; the
//! backlog lists it; a fetch stores the finished response's usage once as `late` evidence; a dry
//! run shows the amount and changes nothing; the operator's settlement from evidence charges
//! exactly that amount once (settlement row, spend, audit row); replaying it does nothing. On
//! the in-memory stores and on Postgres.
#![cfg(test)]

use futures::FutureExt;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tollgate_core::config::CallConfig;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, SessionId};
use tollgate_core::message::{Message, Role};
use tollgate_core::money::Money;
use tollgate_core::state::{ExecutionState, ReconciliationReason, SettlementSource};
use tollgate_core::usage::Usage;
use tollgate_core::view::ViewState;
use tollgate_mock_provider::MockProvider;
use tollgate_provider::fetch::UsageFetcher;
use tollgate_provider::http::{HttpClient, HttpClientConfig};
use tollgate_provider::Protocol;
use tollgate_runner::backlog::{EvidenceStatus, ResolveAction, Selection};
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::{ManualClock, RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::{EvidenceSource, MemoryStores, Stores};
use tollgate_testkit::conformance::{scope, t0, text_config};

/// The user message (15 characters).
const TEXT: &str = "Hello over HTTP";
/// `text_config()`'s system prompt; the mock counts it as input.
const SYSTEM: &str = "Be brief.";

/// The exact amount of `input` tokens at 1 and `output` tokens at 2 per million
/// (`text_config()`'s prices).
fn amount(input: u64, output: u64) -> Money {
    let millionths = input + 2 * output;
    Money::parse(
        &format!("{}.{:06}", millionths / 1_000_000, millionths % 1_000_000),
        "test",
    )
    .unwrap()
}

/// The usage the mock reports for [`TEXT`]: `ceil(chars / 4)` of input and of output.
fn mock_usage() -> Usage {
    Usage {
        input: (SYSTEM.chars().count() as u64 + TEXT.chars().count() as u64).div_ceil(4),
        output: (TEXT.chars().count() as u64).div_ceil(4),
        cache_read: 0,
        cache_write: 0,
        reasoning: 0,
    }
}

fn client(mock: &MockProvider, protocol: Protocol) -> Arc<HttpClient> {
    Arc::new(
        HttpClient::new(HttpClientConfig {
            protocol,
            base_url: mock.base_url(),
            api_key: Some("test-key".into()),
            connect_timeout_ms: 2_000,
            read_timeout_ms: 10_000,
            max_attempts: 1,
        })
        .unwrap(),
    )
}

fn cut_config() -> CallConfig {
    let mut c = text_config();
    c.model = "mock-cut-before-usage".into();
    c
}

fn request(key: &str) -> RunRequest {
    RunRequest {
        scope: scope("acme"),
        session_id: SessionId::parse("s-1").unwrap(),
        operation_key: OperationKey::parse(key).unwrap(),
        input_revision: InputRevision::parse("r-1").unwrap(),
        intent: Intent::parse("summarize").unwrap(),
        load_input: async { Ok(vec![Message::text(Role::User, TEXT)]) }.boxed(),
        cancel: CancellationToken::new(),
        limits: Vec::new(),
    }
}

async fn cut_call(
    stores: &Arc<dyn Stores>,
    mock: &MockProvider,
    clock: &Arc<ManualClock>,
    protocol: Protocol,
    key: &str,
) {
    let mut settings = RunnerSettings::new(cut_config());
    settings.clock = clock.clone();
    let runner = SingleCallRunner::new(stores.clone(), client(mock, protocol), settings).unwrap();
    let view = runner.run(request(key)).await.unwrap();
    assert_eq!(view.state, ViewState::ReconciliationRequired, "{view:?}");
}

async fn settled_rows(stores: &Arc<dyn Stores>) -> usize {
    let day = t0().date_naive();
    stores.settlements(day, day, 1000).await.unwrap().len()
}

async fn the_backlog_settles_from_fetched_evidence(stores: Arc<dyn Stores>) {
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::new(t0()));
    let acme = scope("acme");
    cut_call(
        &stores,
        &mock,
        &clock,
        Protocol::OpenAiResponses,
        "resp-cut",
    )
    .await;
    cut_call(&stores, &mock, &clock, Protocol::OpenAiChat, "chat-cut").await;
    let key = OperationKey::parse("resp-cut").unwrap();
    let record = stores.execution(&acme, &key).await.unwrap().unwrap();
    let reconciler = Reconciler::new(stores.clone(), clock.clone());
    clock.advance_ms(5_000);

    // SC-112: the backlog before any fetch.
    let backlog = reconciler.backlog(&acme, 100).await.unwrap();
    assert_eq!(backlog.len(), 2, "{backlog:?}");
    let entry = backlog.iter().find(|e| e.operation_key == key).unwrap();
    assert_eq!(entry.execution_id, record.id);
    assert_eq!(entry.held, record.hold);
    assert!(entry.held > Money::ZERO, "the hold is kept");
    assert_eq!(
        entry.reconciliation_reason,
        Some(ReconciliationReason::NoExactUsage)
    );
    let provider_ref = entry.provider_ref.clone().unwrap();
    assert!(provider_ref.starts_with("resp_"), "{provider_ref}");
    assert_eq!(entry.evidence, EvidenceStatus::None);
    assert_eq!(entry.usage, None);
    assert_eq!(entry.amount, None);
    assert_eq!(entry.age_ms, 5_000);

    // SC-110: fetch stores one late, exact row; a second fetch stores nothing.
    let responses: Arc<dyn UsageFetcher> = client(&mock, Protocol::OpenAiResponses);
    let fetcher_for = |_: &str| Some(responses.clone());
    let first = reconciler
        .fetch_evidence(&acme, 50, &fetcher_for)
        .await
        .unwrap();
    assert_eq!((first.scanned, first.stored, first.duplicate), (2, 1, 0));
    // The chat call's reference is no Responses id the provider knows.
    assert_eq!(first.skipped.len(), 1, "{first:?}");
    assert_eq!(first.skipped[0].operation_key.as_str(), "chat-cut");
    assert_eq!(first.skipped[0].reason, "not_found");
    let again = reconciler
        .fetch_evidence(&acme, 50, &fetcher_for)
        .await
        .unwrap();
    assert_eq!(again.stored, 0, "{again:?}");
    let evidence = stores.evidence_for(record.id).await.unwrap();
    let late: Vec<_> = evidence
        .iter()
        .filter(|e| e.source == EvidenceSource::Late)
        .collect();
    assert_eq!(late.len(), 1, "one late row: {evidence:?}");
    assert!(late[0].exact);
    assert_eq!(late[0].usage, mock_usage());
    assert_eq!(late[0].provider_ref.as_deref(), Some(provider_ref.as_str()));
    // Chat Completions cannot fetch: typed, before any network access.
    let chat: Arc<dyn UsageFetcher> = client(&mock, Protocol::OpenAiChat);
    let chat_for = |_: &str| Some(chat.clone());
    let unsupported = reconciler
        .fetch_evidence(&acme, 50, &chat_for)
        .await
        .unwrap();
    let chat_skip = unsupported
        .skipped
        .iter()
        .find(|s| s.operation_key.as_str() == "chat-cut")
        .unwrap();
    assert_eq!(chat_skip.reason, "unsupported");
    // Nothing was settled by fetching (SC-41).
    assert_eq!(settled_rows(&stores).await, 0);

    // SC-112: the backlog now shows the late exact evidence and its price.
    let expected = amount(mock_usage().input, mock_usage().output);
    let backlog = reconciler.backlog(&acme, 100).await.unwrap();
    let entry = backlog.iter().find(|e| e.operation_key == key).unwrap();
    assert_eq!(entry.evidence, EvidenceStatus::LateExact);
    assert_eq!(entry.usage, Some(mock_usage()));
    assert_eq!(entry.amount, Some(expected));

    // SC-111: the dry run lists the amount and changes nothing.
    let consumer = record.consumer().clone();
    let session = record.session_id().clone();
    let usd = record.binding.config.currency.clone();
    let before = stores
        .session_spend(&acme, &consumer, &session, &usd)
        .await
        .unwrap();
    let audit_before = stores
        .audit_rows(&acme, tollgate_store::AuditPosition::START, 10_000)
        .await
        .unwrap()
        .len();
    let dry = reconciler
        .resolve_from_evidence(&acme, &Selection::All(100), true)
        .await
        .unwrap();
    assert!(dry.dry_run);
    let item = dry.items.iter().find(|i| i.operation_key == key).unwrap();
    assert_eq!(item.action, ResolveAction::WouldSettle);
    assert_eq!(item.amount, Some(expected));
    assert_eq!(item.usage, Some(mock_usage()));
    let chat_item = dry
        .items
        .iter()
        .find(|i| i.operation_key.as_str() == "chat-cut")
        .unwrap();
    assert_eq!(chat_item.action, ResolveAction::Skipped);
    assert_eq!(chat_item.reason, Some("no_evidence"));
    assert_eq!(settled_rows(&stores).await, 0);
    assert_eq!(
        stores
            .session_spend(&acme, &consumer, &session, &usd)
            .await
            .unwrap(),
        before
    );
    assert_eq!(
        stores
            .audit_rows(&acme, tollgate_store::AuditPosition::START, 10_000)
            .await
            .unwrap()
            .len(),
        audit_before
    );

    // SC-111: the settlement charges exactly that amount, once.
    let done = reconciler
        .resolve_from_evidence(&acme, &Selection::All(100), false)
        .await
        .unwrap();
    let item = done.items.iter().find(|i| i.operation_key == key).unwrap();
    assert_eq!(item.action, ResolveAction::Settled);
    assert_eq!(item.amount, Some(expected));
    let skipped = done
        .items
        .iter()
        .find(|i| i.operation_key.as_str() == "chat-cut")
        .unwrap();
    assert_eq!(skipped.action, ResolveAction::Skipped, "never charged");
    let settlement = stores.settlement(record.id).await.unwrap().unwrap();
    assert_eq!(settlement.amount, expected);
    assert_eq!(settlement.usage, mock_usage());
    assert_eq!(settlement.source, SettlementSource::Operator);
    assert_eq!(settled_rows(&stores).await, 1);
    let after = stores
        .session_spend(&acme, &consumer, &session, &usd)
        .await
        .unwrap();
    assert_eq!(after.settled, before.settled.checked_add(expected).unwrap());
    assert_eq!(
        after.held.decimal(),
        before.held.decimal() - record.hold.decimal()
    );
    let audit = stores
        .audit_rows(&acme, tollgate_store::AuditPosition::START, 10_000)
        .await
        .unwrap();
    let settled_audit: Vec<_> = audit
        .iter()
        .filter(|r| r.event.execution_id == Some(record.id) && r.event.kind == "settled")
        .collect();
    assert_eq!(settled_audit.len(), 1, "one settled audit row");
    let now = stores.execution(&acme, &key).await.unwrap().unwrap();
    assert_eq!(now.state, ExecutionState::Completed);

    // Replaying the settlement does nothing.
    let replay = reconciler
        .resolve_from_evidence(&acme, &Selection::Keys(vec![key.clone()]), false)
        .await
        .unwrap();
    assert_eq!(replay.items.len(), 1);
    assert_eq!(replay.items[0].action, ResolveAction::Skipped);
    assert_eq!(replay.items[0].reason, Some("not_awaiting_operator"));
    assert_eq!(settled_rows(&stores).await, 1);
    assert_eq!(
        stores
            .session_spend(&acme, &consumer, &session, &usd)
            .await
            .unwrap(),
        after
    );
    assert_eq!(
        stores
            .audit_rows(&acme, tollgate_store::AuditPosition::START, 10_000)
            .await
            .unwrap()
            .len(),
        audit.len()
    );
    // The late row now matches the durable settlement: usage reconciliation acknowledges it.
    let none = |_: &OperationKey| false;
    let usage = reconciler
        .reconcile_usage(&acme, None, None, &none)
        .await
        .unwrap();
    assert!(usage.acknowledged >= 1, "{usage:?}");
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_110_sc_111_sc_112_backlog_fetch_and_resolve_on_memory() {
    the_backlog_settles_from_fetched_evidence(Arc::new(MemoryStores::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_110_sc_111_sc_112_backlog_fetch_and_resolve_on_postgres() {
    let url = std::env::var("TOLLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let stores = tollgate_testkit::pg::fresh_test_database(&url)
        .await
        .unwrap();
    the_backlog_settles_from_fetched_evidence(Arc::new(stores)).await;
}
