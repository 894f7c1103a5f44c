//! After the dispatch mark: one send, collection, evidence, settlement or reconciliation.
//! Shared by every runner.

use crate::clock::Clock;
use crate::error::RunError;
use crate::outcome::{decide, Decision, OutputPolicy};
use crate::retry::{Retried, Retry};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_core::collector::{Collected, Collector};
use tollgate_core::event::{error_kind, ProviderEvent};
use tollgate_core::invalid::InvalidReason;
use tollgate_core::money::Money;
use tollgate_core::state::ExecutionState;
use tollgate_core::state::{Outcome, ReconciliationReason, SettlementSource};
use tollgate_core::usage::Usage;
use tollgate_provider::{ProviderClient, ProviderRequest, SendError, StatusClass};
use tollgate_store::{
    EvidenceSource, ExecutionRecord, NewEvidence, SettleOutcome, SettleRequest, StoreError,
    StoreResult, Stores,
};

/// What a drive needs.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub stores: Arc<dyn Stores>,
    pub client: Arc<dyn ProviderClient>,
    pub clock: Arc<dyn Clock>,
    /// Longest time a finished call's last write is retried (`crate::retry`).
    pub settle_retry_ms: u64,
}

/// How a drive ended: the invalid reason for the run's response and, when the drive's last write
/// was its settlement, what that settlement committed (the completed row, its charge and result,
/// as the committing statement answered them), so the run's answer needs no read (H-22).
pub(crate) struct Driven {
    pub invalid_reason: Option<InvalidReason>,
    pub settled: Option<Box<SettleOutcome>>,
}

impl Driven {
    /// A drive that did not end in its own settlement: the answer is read from the store.
    fn of(invalid_reason: Option<InvalidReason>) -> Self {
        Self {
            invalid_reason,
            settled: None,
        }
    }
}

/// Sends once and finishes the journal, retrying its last writes with `retry` while the store is
/// unavailable. Returns the invalid reason for the run's response.
pub(crate) async fn drive(
    ctx: Ctx,
    record: ExecutionRecord,
    request: ProviderRequest,
    policy: Arc<dyn OutputPolicy>,
    read_ms: u64,
    retry: Retry,
    live: Option<crate::live::LiveSink>,
) -> Result<Driven, RunError> {
    let ctx = Call {
        ctx: &ctx,
        retry: &retry,
    };
    let limits = record.binding.config.collector_limits();
    let mut forward = crate::live::Forward::new(live, record.id, limits.max_output_chars);
    let send_cancel = CancellationToken::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(read_ms);
    let sent =
        tokio::time::timeout_at(deadline, ctx.ctx.client.send(request, send_cancel.clone())).await;
    let stream = match sent {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            return Box::pin(finish_send_error(&ctx, &record, error))
                .await
                .map(Driven::of)
        }
        Err(_) => {
            send_cancel.cancel();
            return Box::pin(finish_send_error(
                &ctx,
                &record,
                SendError::NoResponse("timeout".into()),
            ))
            .await
            .map(Driven::of);
        }
    };
    let mut collector =
        Collector::new(limits).map_err(|e| RunError::InvalidConfig(e.to_string()))?;
    let mut stream = stream;
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(event)) => {
                match &event {
                    ProviderEvent::TextDelta { text } => forward.text(text),
                    ProviderEvent::Usage { usage, .. } => forward.usage(*usage),
                    _ => {}
                }
                if collector.push(event) == tollgate_core::collector::Flow::Stop {
                    break;
                }
            }
            Ok(None) => break,
            Err(_) => {
                collector.push(ProviderEvent::Error {
                    kind: error_kind::TIMEOUT.into(),
                    message: "run timeout".into(),
                });
                break;
            }
        }
    }
    // Stop the transport: reading is over (end, reasoning loop or timeout).
    forward.close();
    send_cancel.cancel();
    drop(stream);
    let collected = collector.finish();
    // The finish's state on the heap, taken only once the stream is read: a call waiting for
    // its provider holds the drive's state, not room for its settlement's and retries'.
    Box::pin(finish_collected(&ctx, &record, &collected, policy.as_ref())).await
}

/// One call's drive: the runner's context and the retries of its last writes.
struct Call<'a> {
    ctx: &'a Ctx,
    retry: &'a Retry,
}

impl std::ops::Deref for Call<'_> {
    type Target = Ctx;

    fn deref(&self) -> &Ctx {
        self.ctx
    }
}

async fn finish_collected(
    ctx: &Call<'_>,
    record: &ExecutionRecord,
    collected: &Collected,
    policy: &dyn OutputPolicy,
) -> Result<Driven, RunError> {
    let key = &record.operation_key;
    let provider_ref = collected.provider_ref.clone();
    match decide(collected, policy) {
        Decision::Settle {
            usage,
            outcome,
            output,
            step,
            invalid_reason,
        } => {
            let Ok(amount) = record.binding.config.prices.cost(&usage) else {
                let reason = ReconciliationReason::UnpricedUsage;
                reconcile(ctx, record, reason, provider_ref, Some(usage)).await?;
                return Ok(Driven::of(invalid_reason));
            };
            // The stream's evidence goes in with the settlement, so one commit records both (H-15). When the
            // settlement fails, the evidence is written alone so that the inbox still holds what
            // the provider reported; a process that dies before the commit leaves neither.
            let evidence = stream_evidence(ctx, record, provider_ref.clone(), usage, true);
            let request = SettleRequest {
                fence: record.fence(),
                usage,
                amount,
                source: SettlementSource::Stream,
                outcome,
                stop: collected.step.stop.clone(),
                output,
                step: step.map(|s| *s),
                provider_ref,
                evidence_id: None,
                evidence: Some(evidence.clone()),
                now: ctx.clock.now(),
                seen: Some(Box::new(record.clone())),
            };
            // A store that is briefly unavailable does not lose the output: the settlement is
            // retried while the fence holds (SC-202). After its first failure the evidence is
            // written alone at once, so that the inbox holds what the provider reported should
            // this process die or lose its fence while it retries; the retries then name it.
            let mut request = request;
            let first = ctx.stores.settle(attempt(ctx, &request)).await;
            let mut alone = false;
            // The deliberate defect of feature `mutation-no-settle-retry`: the first failure
            // is the answer.
            let retries = !cfg!(feature = "mutation-no-settle-retry");
            let settled = match first {
                Err(StoreError::Unavailable(_)) if retries => {
                    if let Ok(recorded) = ctx.stores.record_evidence(evidence.clone()).await {
                        alone = true;
                        request.evidence = None;
                        request.evidence_id = Some(recorded.id);
                    }
                    let retried = ctx
                        .retry
                        .run(|| ctx.stores.settle(attempt(ctx, &request)))
                        .await;
                    Retried {
                        result: retried.result,
                        after_unavailable: true,
                    }
                }
                result => Retried {
                    result,
                    after_unavailable: false,
                },
            };
            match settled.result {
                Ok(settled) => Ok(Driven {
                    invalid_reason,
                    settled: Some(Box::new(settled)),
                }),
                Err(StoreError::StaleFence(_))
                    if settled.after_unavailable
                        && written_by_this_fence(ctx, record, ExecutionState::Completed).await =>
                {
                    // An attempt committed and its answer was lost: the view is read back.
                    Ok(Driven::of(invalid_reason))
                }
                Err(settle_error) => {
                    if !alone {
                        let recorded = ctx
                            .retry
                            .run(|| ctx.stores.record_evidence(evidence.clone()))
                            .await;
                        if let Err(e) = recorded.result {
                            tracing::warn!(
                                scope = %record.scope,
                                operation_key = %key,
                                execution_id = %record.id,
                                error = %e,
                                "evidence not recorded after a failed settlement"
                            );
                        }
                    }
                    Err(RunError::store(key, settle_error))
                }
            }
        }
        Decision::ZeroSettle { outcome, .. } => {
            let stop = match outcome {
                Outcome::Refused => collected.step.stop.clone(),
                _ => None,
            };
            settle_zero(ctx, record, outcome, stop, provider_ref).await?;
            Ok(Driven::of(None))
        }
        Decision::Reconcile { invalid_reason } => {
            let reason = ReconciliationReason::NoExactUsage;
            reconcile(ctx, record, reason, provider_ref, collected.usage).await?;
            Ok(Driven::of(invalid_reason))
        }
    }
}

/// One attempt of `request`, stamped with the time it is sent.
fn attempt(ctx: &Call<'_>, request: &SettleRequest) -> SettleRequest {
    let mut attempt = request.clone();
    attempt.now = ctx.clock.now();
    attempt
}

/// Whether the execution is in `state` under `record`'s fence: a last write of this call
/// committed although its answer was lost. A recoverer that took over holds a later fence.
async fn written_by_this_fence(
    ctx: &Call<'_>,
    record: &ExecutionRecord,
    state: ExecutionState,
) -> bool {
    let read = ctx
        .retry
        .run(|| ctx.stores.execution(&record.scope, &record.operation_key))
        .await;
    matches!(
        read.result,
        Ok(Some(row)) if row.state == state && row.fence() == record.fence()
    )
}

/// Runs one of the call's last fenced writes, which leaves the execution in `state`, with its
/// retries; a refusal that follows an unavailable attempt means that attempt committed when the
/// execution is in `state` under this fence.
async fn last_write<T, F, Fut>(
    ctx: &Call<'_>,
    record: &ExecutionRecord,
    state: ExecutionState,
    write: F,
) -> StoreResult<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StoreResult<T>>,
{
    let written = ctx.retry.run(write).await;
    match written.result {
        Ok(_) => Ok(()),
        Err(StoreError::StaleFence(_))
            if written.after_unavailable && written_by_this_fence(ctx, record, state).await =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The call's own usage evidence, from its stream.
fn stream_evidence(
    ctx: &Ctx,
    record: &ExecutionRecord,
    provider_ref: Option<String>,
    usage: Usage,
    exact: bool,
) -> NewEvidence {
    NewEvidence {
        scope: record.scope.clone(),
        execution_id: record.id,
        operation_key: record.operation_key.clone(),
        provider_ref,
        usage,
        exact,
        source: EvidenceSource::Stream,
        now: ctx.clock.now(),
    }
}

async fn record_evidence(
    ctx: &Call<'_>,
    record: &ExecutionRecord,
    provider_ref: Option<String>,
    usage: Usage,
    exact: bool,
) -> Result<tollgate_core::ids::EvidenceId, RunError> {
    let evidence = stream_evidence(ctx, record, provider_ref, usage, exact);
    ctx.retry
        .run(|| ctx.stores.record_evidence(evidence.clone()))
        .await
        .result
        .map(|e| e.id)
        .map_err(|e| RunError::store(&record.operation_key, e))
}

/// Zero settlement: a verified refusal proof, or a provider that provably did not take the
/// request (HTTP error status, connection never established).
async fn settle_zero(
    ctx: &Call<'_>,
    record: &ExecutionRecord,
    outcome: Outcome,
    stop: Option<String>,
    provider_ref: Option<String>,
) -> Result<(), RunError> {
    let request = SettleRequest {
        fence: record.fence(),
        usage: Usage::ZERO,
        amount: Money::ZERO,
        source: SettlementSource::Stream,
        outcome,
        stop,
        output: None,
        step: None,
        provider_ref,
        evidence_id: None,
        evidence: None,
        now: ctx.clock.now(),
        seen: Some(Box::new(record.clone())),
    };
    last_write(ctx, record, ExecutionState::Completed, || {
        ctx.stores.settle(attempt(ctx, &request))
    })
    .await
    .map_err(|e| RunError::store(&record.operation_key, e))
}

/// Cost unknown: keep any partial usage as inexact evidence and hand the call to an operator.
async fn reconcile(
    ctx: &Call<'_>,
    record: &ExecutionRecord,
    reason: ReconciliationReason,
    provider_ref: Option<String>,
    partial: Option<Usage>,
) -> Result<(), RunError> {
    if let Some(usage) = partial {
        record_evidence(ctx, record, provider_ref.clone(), usage, false).await?;
    }
    last_write(ctx, record, ExecutionState::ReconciliationRequired, || {
        ctx.stores.mark_reconciliation_required(
            record.fence(),
            reason,
            provider_ref.clone(),
            ctx.clock.now(),
        )
    })
    .await
    .map_err(|e| RunError::store(&record.operation_key, e))
}

async fn finish_send_error(
    ctx: &Call<'_>,
    record: &ExecutionRecord,
    error: SendError,
) -> Result<Option<InvalidReason>, RunError> {
    match error {
        // The provider rejected the request with an HTTP status before any stream: providers do
        // not bill rejected requests. The status and request id are the evidence.
        SendError::Status {
            provider_ref,
            class: StatusClass::NotProcessed,
            ..
        } => {
            record_evidence(ctx, record, provider_ref.clone(), Usage::ZERO, true).await?;
            settle_zero(ctx, record, Outcome::Unavailable, None, provider_ref).await?;
        }
        // A status that does not prove the request went unprocessed (a gateway's answer, a server
        // error): the provider may have billed it. The request id, when there is one, is kept as
        // inexact evidence for the operator.
        SendError::Status {
            provider_ref,
            class: StatusClass::Ambiguous,
            ..
        } => {
            let evidence = provider_ref.as_ref().map(|_| Usage::ZERO);
            let reason = ReconciliationReason::AmbiguousStatus;
            reconcile(ctx, record, reason, provider_ref, evidence).await?;
        }
        // Nothing reached the provider.
        SendError::Connect(_) | SendError::Unsupported(_) => {
            settle_zero(ctx, record, Outcome::Unavailable, None, None).await?;
        }
        // The request may have been taken: cost unknown.
        SendError::NoResponse(_) => {
            reconcile(ctx, record, ReconciliationReason::NoResponse, None, None).await?
        }
    }
    Ok(None)
}
