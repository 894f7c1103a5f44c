//! Usage an operator states for an execution awaiting them (spec/journal.md — Operator
//! resolution): checked before anything is written, so a mistyped or hostile figure cannot put
//! an arbitrary amount into the finance tables.
//!
//! - every token count fits the stored range (a signed 64-bit count): a larger one is refused
//!   before the fence is taken;
//! - the amount it prices to is at most the execution's hold (the call's own worst case, held
//!   when it was claimed), unless the operator states `override_hold`, which is audited as an
//!   `operator_override` row beside the settlement.

use crate::recovery::Reconciler;
use crate::views;
use serde_json::json;
use tollgate_core::ids::{ExecutionId, Scope};
use tollgate_core::money::Money;
use tollgate_core::state::ExecutionState;
use tollgate_core::usage::Usage;
use tollgate_core::view::View;
use tollgate_store::{
    AuditEvent, EvidenceSource, ExecutionRecord, NewEvidence, StoreError, StoreResult,
};

/// The largest token count a store keeps (`tollgate_count` on Postgres is a `bigint` ≥ 0).
pub const USAGE_COUNT_MAX: u64 = i64::MAX as u64;

/// Why stated usage is refused, or the store failure that stopped the resolution.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResolveError {
    /// A token count above [`USAGE_COUNT_MAX`].
    #[error("usage.{class} is above {USAGE_COUNT_MAX}")]
    OutOfRange {
        /// The token class (`input`, `output`, …).
        class: &'static str,
    },
    /// The usage prices to more than the execution's hold, and no override was stated.
    #[error(
        "the stated usage costs {amount}, more than the execution's hold of {hold}; \
         state override_hold to settle it anyway (audited)"
    )]
    OverHold {
        /// What the usage prices to.
        amount: Money,
        /// The execution's hold.
        hold: Money,
    },
    /// The usage cannot be priced by the execution's price table.
    #[error("the stated usage cannot be priced: {0}")]
    Unpriced(String),
    /// A store failure (nothing was settled).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The amount `usage` charges for `record`, or why an operator may not state it.
///
/// # Errors
/// [`ResolveError::OutOfRange`], [`ResolveError::Unpriced`], and [`ResolveError::OverHold`]
/// unless `override_hold`.
pub fn stated_amount(
    record: &ExecutionRecord,
    usage: &Usage,
    override_hold: bool,
) -> Result<Money, ResolveError> {
    let classes = [
        ("input", usage.input),
        ("output", usage.output),
        ("cache_read", usage.cache_read),
        ("cache_write", usage.cache_write),
        ("reasoning", usage.reasoning),
    ];
    if let Some((class, _)) = classes.iter().find(|(_, n)| *n > USAGE_COUNT_MAX) {
        return Err(ResolveError::OutOfRange { class });
    }
    let amount = record
        .binding
        .config
        .prices
        .cost(usage)
        .map_err(|e| ResolveError::Unpriced(e.to_string()))?;
    if amount > record.hold && !override_hold {
        return Err(ResolveError::OverHold {
            amount,
            hold: record.hold,
        });
    }
    Ok(amount)
}

/// Which checks a resolution applies to the stated usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// [`stated_amount`]'s: the range, and the hold unless overridden.
    Checked {
        /// The operator states the amount may exceed the hold (audited).
        override_hold: bool,
    },
    /// Priced only: the library's [`Reconciler::resolve`], whose caller vouches for the usage.
    Unchecked,
}

impl Reconciler {
    /// Operator settlement of a `reconciliation_required` execution with stated usage (source
    /// `operator`), priced with the execution's original snapshot.
    ///
    /// # Errors
    /// `NotFound`, `StaleFence` when it is not awaiting an operator, store failure.
    pub async fn resolve(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        usage: Usage,
    ) -> StoreResult<View> {
        match self
            .resolve_with(scope, execution_id, usage, Rule::Unchecked)
            .await
        {
            Ok(view) => Ok(view),
            Err(ResolveError::Store(e)) => Err(e),
            Err(other) => Err(StoreError::Corrupt(other.to_string())),
        }
    }

    /// Settles an execution awaiting an operator at the stated `usage`: checked by
    /// [`stated_amount`] before the fence is taken, then one fenced settlement (source
    /// `operator`) backed by operator evidence; an override of the hold is audited first.
    ///
    /// # Errors
    /// The refusals of [`stated_amount`]; `NotFound`; `StaleFence` when the execution is not
    /// awaiting an operator; store failures.
    pub async fn resolve_stated(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        usage: Usage,
        override_hold: bool,
    ) -> Result<View, ResolveError> {
        self.resolve_with(scope, execution_id, usage, Rule::Checked { override_hold })
            .await
    }

    pub(crate) async fn resolve_with(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        usage: Usage,
        rule: Rule,
    ) -> Result<View, ResolveError> {
        let stores = &self.stores;
        let record = stores
            .execution_by_id(scope, execution_id)
            .await?
            .ok_or_else(|| StoreError::NotFound(execution_id.to_string()))?;
        // Only an execution awaiting an operator is resolved; any other is refused as the fence
        // would refuse it, before its usage is judged against a hold it no longer has.
        if record.state != ExecutionState::ReconciliationRequired {
            return Err(StoreError::StaleFence(execution_id).into());
        }
        let amount = match rule {
            Rule::Checked { override_hold } => stated_amount(&record, &usage, override_hold)?,
            Rule::Unchecked => record
                .binding
                .config
                .prices
                .cost(&usage)
                .map_err(|e| ResolveError::Unpriced(e.to_string()))?,
        };
        let now = self.clock.now();
        let states = [ExecutionState::ReconciliationRequired];
        let fenced = stores
            .take_fence(scope, &record.operation_key, &states, false, 60_000, now)
            .await?
            .ok_or(StoreError::StaleFence(execution_id))?;
        if matches!(rule, Rule::Checked { .. }) && amount > fenced.hold {
            stores
                .append_audit(AuditEvent {
                    scope: scope.clone(),
                    execution_id: Some(execution_id),
                    kind: "operator_override".into(),
                    detail: json!({
                        "hold": fenced.hold,
                        "amount": amount,
                        "fence": fenced.fence,
                    }),
                    at: now,
                })
                .await?;
        }
        let evidence = stores
            .record_evidence(NewEvidence {
                scope: scope.clone(),
                execution_id,
                operation_key: fenced.operation_key.clone(),
                provider_ref: fenced.provider_ref.clone(),
                usage,
                exact: true,
                source: EvidenceSource::Operator,
                now,
            })
            .await?;
        let settled = self
            .settle_by_operator(&fenced, usage, amount, None, evidence.id, now)
            .await?;
        Ok(views::view_of(stores.as_ref(), &settled.record, now).await?)
    }
}
