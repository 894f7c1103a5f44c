//! `tollgate demo`: a scripted tour of the governed call path on the embedded default
//! (in-memory stores + the mock provider on loopback), or on Postgres when `DATABASE_URL` is set.

use crate::database::{connect_migrated, database_url};
use crate::error::CommandError;
use crate::print;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_core::caps::Caps;
use tollgate_core::config::CallConfig;
use tollgate_core::ids::*;
use tollgate_core::message::{Message, Role};
use tollgate_core::money::{Currency, Money, TokenPrices};
use tollgate_core::state::CallKind;
use tollgate_core::usage::Usage;
use tollgate_core::view::View;
use tollgate_mock_provider::MockProvider;
use tollgate_provider::http::{HttpClient, HttpClientConfig};
use tollgate_provider::Protocol;
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::{RunError, SystemClock};
use tollgate_runner::{RunRequest, RunnerSettings, SingleCallRunner};
use tollgate_store::fault::{FaultPoint, FaultyStores};
use tollgate_store::{MemoryStores, SettlementStore, SpendStore, Stores};

/// Lease of the demo's runners: short, so the recovery step need not wait long.
const DEMO_LEASE_MS: u64 = 300;
/// Run timeout of the demo's profiles; a claim's lease covers it (plus a second of slack).
const DEMO_RUN_TIMEOUT_MS: u64 = 500;
/// Run timeout of the post-call block's long answer: 40,000 characters take a while on a
/// loaded machine, and a timed-out read would end in reconciliation instead.
const DEMO_LONG_RUN_TIMEOUT_MS: u64 = 10_000;

fn money(text: &str) -> Result<Money, CommandError> {
    Money::parse(text, "demo amount").map_err(|e| CommandError::Demo(e.to_string()))
}

fn id<T>(parse: fn(String) -> Result<T, IdError>, text: &str) -> Result<T, CommandError> {
    Ok(parse(text.to_string())?)
}

fn profile(model: &str, consumer: &str, caps: Caps) -> Result<CallConfig, CommandError> {
    Ok(CallConfig {
        kind: CallKind::Text,
        provider: "mock".into(),
        model: model.into(),
        policy_version: id(VersionId::parse, "policy-1")?,
        price_version: id(VersionId::parse, "prices-2026-11")?,
        output_contract_version: id(VersionId::parse, "out-1")?,
        consumer: id(ConsumerId::parse, consumer)?,
        currency: Currency::parse("USD").map_err(|e| CommandError::Demo(e.to_string()))?,
        prices: TokenPrices {
            input: money("1.00")?,
            output: money("2.00")?,
            cache_read: money("0.10")?,
            cache_write: money("1.25")?,
            reasoning: money("2.00")?,
        },
        caps,
        system: Some("Be brief.".into()),
        max_tokens: 256,
        max_input_chars: 2000,
        max_output_chars: 50_000,
        max_request_chars: None,
        max_reasoning_chars: 10_000,
        max_consecutive_reasoning: Some(64),
        run_timeout_ms: DEMO_RUN_TIMEOUT_MS,
        result_retention_secs: 30 * 24 * 3600,
        cache: None,
        temperature: None,
        output: None,
        tools: vec![],
        tool_choice: None,
        context_window_tokens: Some(131_072),
        top_p: None,
        stop: Vec::new(),
        seed: None,
        user: None,
        metadata: Default::default(),
        request_fields: Default::default(),
    })
}

struct Tour {
    stores: Arc<FaultyStores>,
    mock: MockProvider,
    client: Arc<HttpClient>,
    suffix: String,
    json: bool,
    steps: Vec<Value>,
}

impl Tour {
    fn runner(&self, config: CallConfig) -> Result<SingleCallRunner, CommandError> {
        let mut settings = RunnerSettings::new(config);
        settings.lease_ms = DEMO_LEASE_MS;
        // The tour's scripted store failure stands for a store that stays down: the settlement
        // is tried once, and the call is left to recovery (a live server retries it for
        // `[runner] settle_retry_ms`).
        settings.settle_retry_ms = 0;
        let stores: Arc<dyn Stores> = self.stores.clone();
        Ok(SingleCallRunner::new(
            stores,
            self.client.clone(),
            settings,
        )?)
    }

    fn request(&self, key: &str, revision: &str, text: &str) -> Result<RunRequest, CommandError> {
        let messages = vec![Message::text(Role::User, text)];
        Ok(RunRequest {
            scope: id(Scope::parse, "demo")?,
            session_id: id(SessionId::parse, &format!("session-{}", self.suffix))?,
            operation_key: id(OperationKey::parse, &format!("{key}-{}", self.suffix))?,
            input_revision: id(InputRevision::parse, revision)?,
            intent: id(Intent::parse, "summarize")?,
            load_input: Box::pin(async move { Ok(messages) }),
            cancel: CancellationToken::new(),
            limits: Vec::new(),
        })
    }

    fn report(&mut self, step: &str, result: &Result<View, RunError>) {
        let requests = self.mock.request_count();
        let (summary, detail) = match result {
            Ok(view) => (
                describe(view),
                serde_json::to_value(view).unwrap_or(Value::Null),
            ),
            Err(e) => (format!("error: {e}"), json!({"error": e.to_string()})),
        };
        if !self.json {
            print::line(&format!(
                "{step:<16} {summary}  [provider requests so far: {requests}]"
            ));
        }
        self.steps
            .push(json!({"step": step, "result": detail, "provider_requests": requests}));
    }
}

fn describe(view: &View) -> String {
    let mut parts = vec![serde_json::to_value(view.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()];
    if let Some(outcome) = view.outcome {
        parts.push(outcome.to_string());
    }
    if view.replayed {
        parts.push("replayed".into());
    }
    if let Some(receipt) = &view.receipt {
        parts.push(format!("charged {} {}", receipt.amount, receipt.currency));
    }
    for w in &view.warnings {
        parts.push(
            format!(
                "{:?} {} cap {} crossed (spent {})",
                w.level,
                w.cap.as_str(),
                w.limit,
                w.spent
            )
            .to_lowercase(),
        );
    }
    if view.output.is_none() && view.state == tollgate_core::view::ViewState::Completed {
        parts.push("output withheld".into());
    }
    parts.join(", ")
}

/// Runs the tour.
pub async fn run(json_out: bool) -> Result<(), CommandError> {
    let (base, on): (Arc<dyn Stores>, &str) = match database_url() {
        Some(url) => (Arc::new(connect_migrated(&url).await?), "postgres"),
        None => (Arc::new(MemoryStores::new()), "embedded in-memory stores"),
    };
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .map_err(|source| CommandError::Io {
            action: "start the mock provider".into(),
            source,
        })?;
    let client = HttpClient::new(HttpClientConfig {
        protocol: Protocol::OpenAiChat,
        base_url: mock.base_url(),
        api_key: None,
        connect_timeout_ms: 2_000,
        read_timeout_ms: 10_000,
        max_attempts: 1,
    })
    .map_err(|e| CommandError::Demo(e.to_string()))?;
    if !json_out {
        print::line(&format!(
            "tollgate demo on {on}, mock provider at {}",
            mock.base_url()
        ));
    }
    let mut tour = Tour {
        stores: Arc::new(FaultyStores::new(base)),
        client: Arc::new(client),
        mock,
        suffix: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
        json: json_out,
        steps: Vec::new(),
    };
    tour_calls(&mut tour).await?;
    tour_recovery(&mut tour).await?;
    ledger(&tour).await?;
    tour.mock.shutdown().await;
    Ok(())
}

async fn tour_calls(tour: &mut Tour) -> Result<(), CommandError> {
    let plain = tour.runner(profile("mock-echo", "team-a", Caps::default())?)?;
    let first = plain
        .run(tour.request("order-1", "r-1", "Summarize order 1")?)
        .await;
    tour.report("call", &first);
    let replay = plain
        .run(tour.request("order-1", "r-1", "Summarize order 1")?)
        .await;
    tour.report("replay", &replay);
    let conflict = plain
        .run(tour.request("order-1", "r-2", "Summarize order 1, v2")?)
        .await;
    tour.report("conflict", &conflict);

    let warned = tour.runner(profile(
        "mock-echo",
        "team-b",
        Caps {
            daily_warn: Some(money("0.00001")?),
            ..Caps::default()
        },
    )?)?;
    let warning = warned
        .run(tour.request("order-2", "r-1", "Summarize order 2")?)
        .await;
    tour.report("warning", &warning);

    let tight = tour.runner(profile(
        "mock-echo",
        "team-c",
        Caps {
            session_block: Some(money("0.005")?),
            ..Caps::default()
        },
    )?)?;
    let preflight = tight
        .run(tour.request("order-3", "r-1", "Summarize order 3")?)
        .await;
    tour.report("preflight block", &preflight);

    // The mock ignores max_tokens: 40,000 chars of output cost more than the worst case held.
    let mut big = profile(
        "mock-big@40000",
        "team-d",
        Caps {
            daily_block: Some(money("0.015")?),
            ..Caps::default()
        },
    )?;
    big.max_tokens = 64;
    big.run_timeout_ms = DEMO_LONG_RUN_TIMEOUT_MS;
    let post = tour
        .runner(big)?
        .run(tour.request("order-4", "r-1", "Write a lot")?)
        .await;
    tour.report("post-call block", &post);
    Ok(())
}

async fn tour_recovery(tour: &mut Tour) -> Result<(), CommandError> {
    let plain = tour.runner(profile("mock-echo", "team-a", Caps::default())?)?;
    // The settlement write fails after the provider answered: the caller gets an error, the
    // journal says dispatched and the inbox holds the usage.
    tour.stores.arm(FaultPoint::Settle);
    let crashed = plain
        .run(tour.request("order-5", "r-1", "Summarize order 5")?)
        .await;
    tour.stores.disarm(FaultPoint::Settle);
    tour.report("store failure", &crashed);
    // The call's lease ends once nothing renews it; wait it out, as after a crashed process.
    tokio::time::sleep(Duration::from_millis(DEMO_LEASE_MS + 100)).await;
    let stores: Arc<dyn Stores> = tour.stores.clone();
    let reconciler = Reconciler::new(stores, Arc::new(SystemClock));
    let scope = id(Scope::parse, "demo")?;
    let key = id(OperationKey::parse, &format!("order-5-{}", tour.suffix))?;
    let recovered = reconciler
        .recover(&scope, &key, DEMO_LEASE_MS)
        .await?
        .ok_or_else(|| CommandError::Demo("recovered execution vanished".into()))?;
    tour.report("recover", &Ok(recovered));

    let cut = tour.runner(profile("mock-cut-before-usage", "team-a", Caps::default())?)?;
    let unproven = cut
        .run(tour.request("order-6", "r-1", "Summarize order 6")?)
        .await;
    tour.report("cut stream", &unproven);
    if let Ok(View {
        execution_id: Some(execution),
        ..
    }) = unproven
    {
        let stated = Usage {
            input: 12,
            output: 40,
            ..Usage::ZERO
        };
        let resolved = reconciler.resolve(&scope, execution, stated).await;
        tour.report(
            "operator resolve",
            &resolved.map_err(|e| RunError::InvalidRequest(e.to_string())),
        );
    }
    Ok(())
}

async fn ledger(tour: &Tour) -> Result<(), CommandError> {
    let today = chrono::Utc::now().date_naive();
    let rows = tour.stores.settlements(today, today, 1000).await?;
    let scope = id(Scope::parse, "demo")?;
    let mine: Vec<_> = rows
        .iter()
        .filter(|r| r.scope == scope && r.operation_key.as_str().ends_with(&tour.suffix))
        .collect();
    let mut spend = Vec::new();
    let demo_currency = Currency::parse("USD").map_err(|e| CommandError::Demo(e.to_string()))?;
    for consumer in ["team-a", "team-b", "team-c", "team-d"] {
        let consumer = id(ConsumerId::parse, consumer)?;
        // Spend is kept per currency: one line for each currency the consumer was charged in.
        let mut currencies: std::collections::BTreeSet<Currency> = mine
            .iter()
            .filter(|r| r.consumer == consumer)
            .map(|r| r.currency.clone())
            .collect();
        if currencies.is_empty() {
            currencies.insert(demo_currency.clone());
        }
        for currency in currencies {
            let totals = tour
                .stores
                .daily_spend(&scope, &consumer, today, &currency)
                .await?;
            spend.push(json!({"consumer": consumer, "day": today, "currency": currency, "settled": totals.settled, "held": totals.held}));
        }
    }
    if tour.json {
        print::json(&json!({"steps": tour.steps, "settlements": mine, "spend": spend}));
        return Ok(());
    }
    print::line("\nsettlement ledger (finance rows):");
    for r in &mine {
        print::line(&format!(
            "  {:<24} {:<8} {:<16} in={:<5} out={:<6} {:>16} {} source={}",
            r.operation_key.as_str(),
            r.consumer.as_str(),
            r.model,
            r.usage.input,
            r.usage.output,
            r.amount.to_string(),
            r.currency,
            r.source.as_str()
        ));
    }
    print::line("\nspend today (settled / held):");
    for s in &spend {
        let text = |k: &str| s[k].as_str().unwrap_or_default().to_string();
        print::line(&format!(
            "  {:<8} {} / {} {}",
            text("consumer"),
            text("settled"),
            text("held"),
            text("currency")
        ));
    }
    Ok(())
}
