//! The reconciliation backlog (SC-110..SC-114): what awaits an operator and what evidence each
//! execution has, fetching usage of finished responses from the provider into the inbox as
//! `late` evidence, and the operator's settlement of executions from their stored exact
//! evidence.
//!
//! Nothing here settles on its own (SC-41): a fetch only appends evidence; a settlement from
//! evidence is an operator's action, one fenced and audited unit per execution.

use crate::recovery::{exact_usage, Reconciler, RECONCILE_PAGE_MAX};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::sync::Arc;
use tollgate_core::ids::{EvidenceId, ExecutionId, OperationKey, Scope};
use tollgate_core::money::Money;
use tollgate_core::state::{CallKind, ExecutionState, ReconciliationReason};
use tollgate_core::usage::Usage;
use tollgate_provider::fetch::UsageFetcher;
use tollgate_store::{Evidence, EvidenceSource, ExecutionRecord, NewEvidence, StoreResult};

/// Largest backlog page (executions listed per scope).
pub const BACKLOG_PAGE_MAX: u32 = 1_000;
/// Lease of the fence an operator's settlement takes.
const RESOLVE_LEASE_MS: u64 = 60_000;

/// What the inbox holds for an execution that awaits an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceStatus {
    /// No evidence at all.
    None,
    /// One consistent piece of exact usage, reported later (`late`, e.g. fetched from the
    /// provider): an operator can settle from it.
    LateExact,
    /// One consistent piece of exact usage from the stream or an operator (e.g. usage the price
    /// table could not price).
    Exact,
    /// Exact pieces that disagree: never chosen automatically.
    Conflicting,
    /// Inexact counts only.
    Inexact,
}

/// The status of `evidence` and its single consistent exact piece, if any.
pub fn evidence_status(evidence: &[Evidence]) -> (EvidenceStatus, Option<&Evidence>) {
    if evidence.is_empty() {
        return (EvidenceStatus::None, None);
    }
    if !evidence.iter().any(|e| e.exact) {
        return (EvidenceStatus::Inexact, None);
    }
    match exact_usage(evidence) {
        None => (EvidenceStatus::Conflicting, None),
        Some(piece) => {
            let late = evidence
                .iter()
                .any(|e| e.exact && e.source == EvidenceSource::Late);
            let status = match late {
                true => EvidenceStatus::LateExact,
                false => EvidenceStatus::Exact,
            };
            (status, Some(piece))
        }
    }
}

/// One execution awaiting an operator: metadata only, never content.
#[derive(Debug, Clone, Serialize)]
pub struct BacklogEntry {
    /// Scope.
    pub scope: Scope,
    /// Journal row id.
    pub execution_id: ExecutionId,
    /// The caller's key.
    pub operation_key: OperationKey,
    /// Call kind.
    pub kind: CallKind,
    /// Provider name of the snapshot.
    pub provider: String,
    /// Model of the snapshot.
    pub model: String,
    /// Why it awaits an operator.
    pub reconciliation_reason: Option<ReconciliationReason>,
    /// The provider's response or request id, when known.
    pub provider_ref: Option<String>,
    /// The hold it keeps.
    pub held: Money,
    /// Claimed at.
    pub created_at: DateTime<Utc>,
    /// Last transition (when it began to await an operator).
    pub awaiting_since: DateTime<Utc>,
    /// Milliseconds since the claim.
    pub age_ms: i64,
    /// What the inbox holds.
    pub evidence: EvidenceStatus,
    /// The usage of the consistent exact piece, when there is one.
    pub usage: Option<Usage>,
    /// What that usage costs at the snapshot's prices (`None`: no exact usage, or unpriceable).
    pub amount: Option<Money>,
}

/// Which executions an operator settles from evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These keys.
    Keys(Vec<OperationKey>),
    /// Every `reconciliation_required` execution of the scope, oldest first, at most this many.
    All(u32),
}

/// What happened to one execution of a resolve-from-evidence run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolveAction {
    /// Settled from its evidence.
    Settled,
    /// A dry run: would be settled with the amount shown; nothing changed.
    WouldSettle,
    /// Not settled; see the reason.
    Skipped,
}

/// One execution of a resolve-from-evidence run.
#[derive(Debug, Clone, Serialize)]
pub struct ResolveItem {
    /// The caller's key.
    pub operation_key: OperationKey,
    /// Journal row id, when the execution exists.
    pub execution_id: Option<ExecutionId>,
    /// What happened.
    pub action: ResolveAction,
    /// The evidence's usage.
    pub usage: Option<Usage>,
    /// The amount charged (or that would be).
    pub amount: Option<Money>,
    /// The evidence row the settlement rests on.
    pub evidence_id: Option<EvidenceId>,
    /// Why it was skipped: `not_found`, `not_awaiting_operator`, `no_evidence`,
    /// `inexact_evidence`, `conflicting_evidence`, `unpriced_usage`, `evidence_changed`.
    pub reason: Option<&'static str>,
}

/// A resolve-from-evidence run.
#[derive(Debug, Clone, Serialize)]
pub struct ResolveReport {
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// One item per execution looked at.
    pub items: Vec<ResolveItem>,
}

/// One execution a fetch pass did not store evidence for.
#[derive(Debug, Clone, Serialize)]
pub struct FetchSkip {
    /// The caller's key.
    pub operation_key: OperationKey,
    /// `has_exact_evidence`, `no_provider_ref`, `no_fetcher`, or the fetch failure's code
    /// (`unsupported`, `not_found`, `not_finished`, `no_usage`, `status`, `no_response`,
    /// `malformed`, `invalid_ref`).
    pub reason: &'static str,
}

/// A fetch-evidence pass.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FetchReport {
    /// `reconciliation_required` executions looked at.
    pub scanned: u64,
    /// Evidence rows stored (exact or not).
    pub stored: u64,
    /// Fetched usage equal to a row stored before: nothing new stored.
    pub duplicate: u64,
    /// Executions without a stored row, with the reason.
    pub skipped: Vec<FetchSkip>,
}

/// The usage fetcher for a provider name of the snapshot, if that provider can be reached.
pub type FetcherFor<'a> = dyn Fn(&str) -> Option<Arc<dyn UsageFetcher>> + Send + Sync + 'a;

fn priced(record: &ExecutionRecord, usage: &Usage) -> Option<Money> {
    record.binding.config.prices.cost(usage).ok()
}

impl Reconciler {
    /// The `reconciliation_required` executions of `scope`, oldest first, at most `limit`
    /// (1..=[`BACKLOG_PAGE_MAX`]), each with its age, hold, provider reference, reason and
    /// evidence status (SC-112). Read-only.
    ///
    /// # Errors
    /// Store failure.
    pub async fn backlog(&self, scope: &Scope, limit: u32) -> StoreResult<Vec<BacklogEntry>> {
        let limit = limit.clamp(1, BACKLOG_PAGE_MAX);
        let rows = self
            .stores()
            .by_state(scope, ExecutionState::ReconciliationRequired, limit)
            .await?;
        let now = self.clock().now();
        let mut entries = Vec::with_capacity(rows.len());
        for r in rows {
            let evidence = self.stores().evidence_for(r.id).await?;
            let (status, piece) = evidence_status(&evidence);
            let usage = piece.map(|e| e.usage);
            let provider_ref = r
                .provider_ref
                .clone()
                .or_else(|| evidence.iter().find_map(|e| e.provider_ref.clone()));
            entries.push(BacklogEntry {
                scope: r.scope.clone(),
                execution_id: r.id,
                amount: usage.as_ref().and_then(|u| priced(&r, u)),
                usage,
                operation_key: r.operation_key.clone(),
                kind: r.kind,
                provider: r.binding.config.provider.clone(),
                model: r.binding.config.model.clone(),
                reconciliation_reason: r.reconciliation_reason,
                provider_ref,
                held: r.hold,
                created_at: r.created_at,
                awaiting_since: r.updated_at,
                age_ms: (now - r.created_at).num_milliseconds().max(0),
                evidence: status,
            });
        }
        Ok(entries)
    }

    /// Fetches the usage of finished responses for up to `limit` (1..=100)
    /// `reconciliation_required` executions of `scope` that have a provider reference and no
    /// exact evidence yet, and appends each answer to the inbox as `late` evidence (exact or
    /// not, as the provider's counts are, SC-95). Idempotent: an answer equal to a row already
    /// stored for the execution stores nothing. It never settles (SC-41).
    ///
    /// # Errors
    /// Store failure (a provider failure only skips its execution).
    pub async fn fetch_evidence(
        &self,
        scope: &Scope,
        limit: u32,
        fetcher_for: &FetcherFor<'_>,
    ) -> StoreResult<FetchReport> {
        let limit = limit.clamp(1, RECONCILE_PAGE_MAX);
        let rows = self
            .stores()
            .by_state(scope, ExecutionState::ReconciliationRequired, limit)
            .await?;
        let mut report = FetchReport::default();
        for record in rows {
            report.scanned += 1;
            let skip = |reason| FetchSkip {
                operation_key: record.operation_key.clone(),
                reason,
            };
            let evidence = self.stores().evidence_for(record.id).await?;
            if exact_usage(&evidence).is_some() {
                report.skipped.push(skip("has_exact_evidence"));
                continue;
            }
            let provider_ref = record
                .provider_ref
                .clone()
                .or_else(|| evidence.iter().find_map(|e| e.provider_ref.clone()));
            let Some(provider_ref) = provider_ref else {
                report.skipped.push(skip("no_provider_ref"));
                continue;
            };
            let Some(fetcher) = fetcher_for(&record.binding.config.provider) else {
                report.skipped.push(skip("no_fetcher"));
                continue;
            };
            let fetched = match fetcher.fetch_usage(&provider_ref).await {
                Ok(fetched) => fetched,
                Err(e) => {
                    tracing::info!(
                        execution_id = %record.id,
                        reason = e.code(),
                        "no usage fetched"
                    );
                    report.skipped.push(skip(e.code()));
                    continue;
                }
            };
            let same = |e: &Evidence| {
                e.source == EvidenceSource::Late
                    && e.exact == fetched.exact
                    && e.usage == fetched.usage
                    && e.provider_ref.as_deref() == Some(fetched.provider_ref.as_str())
            };
            if evidence.iter().any(same) {
                report.duplicate += 1;
                continue;
            }
            self.stores()
                .record_evidence(NewEvidence {
                    scope: scope.clone(),
                    execution_id: record.id,
                    operation_key: record.operation_key.clone(),
                    provider_ref: Some(fetched.provider_ref),
                    usage: fetched.usage,
                    exact: fetched.exact,
                    source: EvidenceSource::Late,
                    now: self.clock().now(),
                })
                .await?;
            report.stored += 1;
        }
        Ok(report)
    }

    /// Settles the selected `reconciliation_required` executions of `scope` from their stored
    /// exact evidence (SC-111): each in one fenced, audited unit (the operator's settlement,
    /// source `operator`, the evidence's usage at the snapshot's versioned prices). An
    /// execution without one consistent, priceable piece of exact evidence is skipped with the
    /// reason and never charged. `dry_run` reads only: it lists what would be charged.
    ///
    /// # Errors
    /// Store failure.
    pub async fn resolve_from_evidence(
        &self,
        scope: &Scope,
        selection: &Selection,
        dry_run: bool,
    ) -> StoreResult<ResolveReport> {
        let records: Vec<(OperationKey, Option<ExecutionRecord>)> = match selection {
            Selection::All(limit) => self
                .stores()
                .by_state(
                    scope,
                    ExecutionState::ReconciliationRequired,
                    (*limit).clamp(1, BACKLOG_PAGE_MAX),
                )
                .await?
                .into_iter()
                .map(|r| (r.operation_key.clone(), Some(r)))
                .collect(),
            Selection::Keys(keys) => {
                let mut found = Vec::with_capacity(keys.len());
                for key in keys {
                    found.push((key.clone(), self.stores().execution(scope, key).await?));
                }
                found
            }
        };
        let mut items = Vec::with_capacity(records.len());
        for (key, record) in records {
            items.push(self.resolve_one(scope, key, record, dry_run).await?);
        }
        Ok(ResolveReport { dry_run, items })
    }

    async fn resolve_one(
        &self,
        scope: &Scope,
        key: OperationKey,
        record: Option<ExecutionRecord>,
        dry_run: bool,
    ) -> StoreResult<ResolveItem> {
        let mut item = ResolveItem {
            operation_key: key,
            execution_id: record.as_ref().map(|r| r.id),
            action: ResolveAction::Skipped,
            usage: None,
            amount: None,
            evidence_id: None,
            reason: None,
        };
        let Some(record) = record else {
            item.reason = Some("not_found");
            return Ok(item);
        };
        if record.state != ExecutionState::ReconciliationRequired {
            item.reason = Some("not_awaiting_operator");
            return Ok(item);
        }
        let evidence = self.stores().evidence_for(record.id).await?;
        let (status, piece) = evidence_status(&evidence);
        let Some(piece) = piece else {
            item.reason = Some(match status {
                EvidenceStatus::Conflicting => "conflicting_evidence",
                EvidenceStatus::Inexact => "inexact_evidence",
                _ => "no_evidence",
            });
            return Ok(item);
        };
        item.usage = Some(piece.usage);
        item.evidence_id = Some(piece.id);
        let Some(amount) = priced(&record, &piece.usage) else {
            item.reason = Some("unpriced_usage");
            return Ok(item);
        };
        item.amount = Some(amount);
        if dry_run {
            item.action = ResolveAction::WouldSettle;
            return Ok(item);
        }
        let now = self.clock().now();
        let states = [ExecutionState::ReconciliationRequired];
        let Some(fenced) = self
            .stores()
            .take_fence(
                scope,
                &item.operation_key,
                &states,
                false,
                RESOLVE_LEASE_MS,
                now,
            )
            .await?
        else {
            item.reason = Some("not_awaiting_operator");
            return Ok(item);
        };
        // Evidence that arrived between the read and the fence may disagree: read it again.
        let again = self.stores().evidence_for(fenced.id).await?;
        let still = exact_usage(&again).map(|e| (e.id, e.usage));
        if still != Some((piece.id, piece.usage)) {
            item.reason = Some("evidence_changed");
            return Ok(item);
        }
        let settled = self
            .settle_by_operator(
                &fenced,
                piece.usage,
                amount,
                piece.provider_ref.clone(),
                piece.id,
                now,
            )
            .await?;
        item.amount = Some(settled.settlement.amount);
        item.action = ResolveAction::Settled;
        Ok(item)
    }
}
