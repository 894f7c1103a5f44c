//! The ledger audit's rules (spec/storage.md — Ledger audit), pure and shared by every store.
//!
//! A store feeds one scope's stored rows to a [`LedgerChecker`] as narrow facts — ids, states,
//! amounts, usage, the price snapshot; never content — in any order, and [`LedgerChecker::finish`]
//! compares what the rows imply with what the totals say. The checker keeps one entry per spend
//! row and per root, not per execution, so a store can stream a large scope through it.
//!
//! What the runners write, and so what the rules expect:
//!
//! - a claim adds its hold to the session and day spend rows of the snapshot's consumer in the
//!   snapshot's currency (the day is the UTC date of the claim, the execution's accounting day;
//!   spend is kept per currency, SC-105, SC-109) and, under a root, to the
//!   root's `held`; `not_dispatched` and settlement take exactly that hold off again, and
//!   `reconciliation_required` keeps it until an operator settles;
//! - a settlement copies scope, key, consumer, session and accounting day from its execution,
//!   adds its amount to the spend rows of its consumer, session and day in its currency (and to the root's `charged`, with a root
//!   receipt of the same amount and currency), and its amount is its usage priced with the
//!   execution's snapshot — zero usage at zero for refusal proofs and rejected requests;
//! - reconcile usage acknowledges only exact evidence equal to the settlement's usage of a
//!   completed execution, or zero evidence of a `not_dispatched` one, in the same scope.

pub mod report;

use crate::rows::{ExecutionRecord, RootReceipt, SettlementRecord};
use chrono::NaiveDate;
pub use report::*;
use std::collections::{BTreeMap, BTreeSet};
use tollgate_core::caps::SpendTotals;
use tollgate_core::ids::{
    ConsumerId, EvidenceId, ExecutionId, OperationKey, RootId, RootKey, Scope, SessionId,
    SettlementId,
};
use tollgate_core::money::{Currency, Money, TokenPrices};
use tollgate_core::state::ExecutionState;
use tollgate_core::usage::Usage;

/// A settlement as the audit sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SettlementFacts {
    /// Row id.
    pub id: SettlementId,
    /// Execution it charges.
    pub execution_id: ExecutionId,
    /// Tenant written on the row.
    pub scope: Scope,
    /// Key written on the row.
    pub operation_key: OperationKey,
    /// Consumer charged.
    pub consumer: ConsumerId,
    /// Session.
    pub session_id: SessionId,
    /// Day charged.
    pub accounting_day: NaiveDate,
    /// Price version written on the row.
    pub price_version: String,
    /// Currency.
    pub currency: Currency,
    /// Usage charged.
    pub usage: Usage,
    /// Amount charged.
    pub amount: Money,
}

impl SettlementFacts {
    /// The facts of a stored settlement.
    pub fn of(s: &SettlementRecord) -> Self {
        Self {
            id: s.id,
            execution_id: s.execution_id,
            scope: s.scope.clone(),
            operation_key: s.operation_key.clone(),
            consumer: s.consumer.clone(),
            session_id: s.session_id.clone(),
            accounting_day: s.accounting_day,
            price_version: s.price_version.clone(),
            currency: s.currency.clone(),
            usage: s.usage,
            amount: s.amount,
        }
    }
}

/// A root receipt as seen from its execution.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptOfExecution {
    /// Root the receipt is on.
    pub root_id: RootId,
    /// Amount.
    pub amount: Money,
    /// Currency.
    pub currency: Currency,
}

impl ReceiptOfExecution {
    /// The facts of a stored receipt.
    pub fn of(r: &RootReceipt) -> Self {
        Self {
            root_id: r.root_id,
            amount: r.amount,
            currency: r.currency.clone(),
        }
    }
}

/// One execution with its settlement and root receipt, as the audit sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionFacts {
    /// Row id.
    pub id: ExecutionId,
    /// Caller key.
    pub operation_key: OperationKey,
    /// Journal state.
    pub state: ExecutionState,
    /// Amount held against caps.
    pub hold: Money,
    /// Consumer of the snapshot.
    pub consumer: ConsumerId,
    /// Session of the binding.
    pub session_id: SessionId,
    /// Day charged.
    pub accounting_day: NaiveDate,
    /// Root key, for calls under a root.
    pub root_key: Option<RootKey>,
    /// The id of the root row `(scope, root_key)`, when it exists.
    pub root_id: Option<RootId>,
    /// Currency of the snapshot.
    pub currency: Currency,
    /// Price version of the snapshot.
    pub price_version: String,
    /// The model's prices in the snapshot.
    pub prices: TokenPrices,
    /// Its settlement (at most one: unique per execution in every store).
    pub settlement: Option<SettlementFacts>,
    /// Its root receipt (at most one, likewise).
    pub receipt: Option<ReceiptOfExecution>,
}

impl ExecutionFacts {
    /// The facts of a stored execution.
    pub fn of(
        r: &ExecutionRecord,
        root_id: Option<RootId>,
        settlement: Option<&SettlementRecord>,
        receipt: Option<&RootReceipt>,
    ) -> Self {
        let config = &r.binding.config;
        Self {
            id: r.id,
            operation_key: r.operation_key.clone(),
            state: r.state,
            hold: r.hold,
            consumer: config.consumer.clone(),
            session_id: r.binding.session_id.clone(),
            accounting_day: r.accounting_day,
            root_key: r.root_key.clone(),
            root_id,
            currency: config.currency.clone(),
            price_version: config.price_version.to_string(),
            prices: config.prices.clone(),
            settlement: settlement.map(SettlementFacts::of),
            receipt: receipt.map(ReceiptOfExecution::of),
        }
    }
}

/// One operation root's totals.
#[derive(Debug, Clone, PartialEq)]
pub struct RootFacts {
    /// Row id.
    pub id: RootId,
    /// Root key.
    pub root_key: RootKey,
    /// Charged total.
    pub charged: Money,
    /// Held total.
    pub held: Money,
}

/// One root receipt of a root in the scope, with what its execution says about its root.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptFacts {
    /// The receipt's root.
    pub root_id: RootId,
    /// That root's key.
    pub root_key: RootKey,
    /// The receipt's execution.
    pub execution_id: ExecutionId,
    /// Amount.
    pub amount: Money,
    /// The receipt's execution as found in the root's scope: `None` when it is not there,
    /// `Some(None)` when it is not under a root, else its root key.
    pub execution_root_key: Option<Option<RootKey>>,
}

/// One acknowledged piece of usage evidence, with what it was acknowledged against.
#[derive(Debug, Clone, PartialEq)]
pub struct EvidenceFacts {
    /// Row id.
    pub id: EvidenceId,
    /// Execution it is about.
    pub execution_id: ExecutionId,
    /// Whether the counts are exact.
    pub exact: bool,
    /// Counts.
    pub usage: Usage,
    /// The state of its execution in the evidence's scope; `None` when there is none there.
    pub execution_state: Option<ExecutionState>,
    /// The usage of that execution's settlement, if any.
    pub settlement_usage: Option<Usage>,
}

/// A sum the rows imply for one spend row or root.
#[derive(Debug, Clone, Default)]
struct Implied {
    settled: Money,
    held: Money,
    overflow: bool,
}

impl Implied {
    fn add_settled(&mut self, amount: Money) {
        match self.settled.checked_add(amount) {
            Ok(total) => self.settled = total,
            Err(_) => self.overflow = true,
        }
    }

    fn add_held(&mut self, amount: Money) {
        match self.held.checked_add(amount) {
            Ok(total) => self.held = total,
            Err(_) => self.overflow = true,
        }
    }
}

fn is_open(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Prepared
            | ExecutionState::Dispatched
            | ExecutionState::ReconciliationRequired
    )
}

/// Checks one scope's ledger from facts fed in any order.
#[derive(Debug)]
pub struct LedgerChecker {
    scope: Scope,
    limit: u32,
    checked: LedgerCounts,
    violations: Vec<LedgerViolation>,
    total: u64,
    spend: BTreeMap<SpendRowKey, SpendTotals>,
    spend_implied: BTreeMap<SpendRowKey, Implied>,
    roots: BTreeMap<RootId, RootFacts>,
    roots_implied: BTreeMap<RootId, Implied>,
}

impl LedgerChecker {
    /// A checker of `scope` listing at most `limit` violations (more are counted).
    pub fn new(scope: Scope, limit: u32) -> Self {
        Self {
            scope,
            limit,
            checked: LedgerCounts {
                scopes: 1,
                ..LedgerCounts::default()
            },
            violations: Vec::new(),
            total: 0,
            spend: BTreeMap::new(),
            spend_implied: BTreeMap::new(),
            roots: BTreeMap::new(),
            roots_implied: BTreeMap::new(),
        }
    }

    /// The scope checked.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    fn report(&mut self, violation: LedgerViolation) {
        self.total += 1;
        if self.violations.len() < self.limit as usize {
            self.violations.push(violation);
        }
    }

    fn violation(&self, invariant: LedgerInvariant, reason: &str) -> LedgerViolation {
        LedgerViolation::new(invariant, reason, &self.scope)
    }

    /// A stored spend row.
    pub fn spend_row(&mut self, key: SpendRowKey, totals: SpendTotals) {
        self.checked.spend_rows += 1;
        self.spend.insert(key, totals);
    }

    /// A stored root.
    pub fn root(&mut self, root: RootFacts) {
        self.checked.roots += 1;
        self.roots.insert(root.id, root);
    }

    fn spend_keys(
        consumer: &ConsumerId,
        session_id: &SessionId,
        day: NaiveDate,
        currency: &Currency,
    ) -> [SpendRowKey; 2] {
        [
            SpendRowKey::Session {
                consumer: consumer.clone(),
                session_id: session_id.clone(),
                currency: currency.clone(),
            },
            SpendRowKey::Day {
                consumer: consumer.clone(),
                day,
                currency: currency.clone(),
            },
        ]
    }

    /// Adds a settlement to the spend rows it names (rule 1: the settlement's own consumer,
    /// session, accounting day and currency, as the finance view shows it).
    fn charge(&mut self, s: &SettlementFacts) {
        self.checked.settlements += 1;
        for key in Self::spend_keys(&s.consumer, &s.session_id, s.accounting_day, &s.currency) {
            self.spend_implied
                .entry(key)
                .or_default()
                .add_settled(s.amount);
        }
    }

    /// A journal row with its settlement and root receipt (rules 2–5 and the per-call half of
    /// rule 7).
    pub fn execution(&mut self, e: ExecutionFacts) {
        self.checked.executions += 1;
        let of_execution = |v: LedgerViolation| LedgerViolation {
            execution_id: Some(e.id),
            operation_key: Some(e.operation_key.clone()),
            ..v
        };
        if is_open(e.state) {
            for key in Self::spend_keys(&e.consumer, &e.session_id, e.accounting_day, &e.currency) {
                self.spend_implied.entry(key).or_default().add_held(e.hold);
            }
            if let Some(root_key) = &e.root_key {
                match e.root_id {
                    Some(root_id) => self
                        .roots_implied
                        .entry(root_id)
                        .or_default()
                        .add_held(e.hold),
                    None => {
                        let v = self.violation(LedgerInvariant::RootHeld, "root_missing");
                        let v = LedgerViolation {
                            root_key: Some(root_key.clone()),
                            found: Some(e.hold),
                            ..of_execution(v)
                        };
                        self.report(v);
                    }
                }
            }
        } else if e.hold != Money::ZERO {
            let v = self
                .violation(LedgerInvariant::FinalHoldsNothing, e.state.as_str())
                .amounts(Money::ZERO, e.hold);
            self.report(of_execution(v));
        }
        let completed = e.state == ExecutionState::Completed;
        match (&e.settlement, completed) {
            (None, true) => {
                let v = self.violation(LedgerInvariant::SettledExactlyOnce, "missing");
                self.report(of_execution(v));
            }
            (Some(s), false) => {
                let v = self.violation(LedgerInvariant::SettledExactlyOnce, "unexpected");
                let v = LedgerViolation {
                    settlement_id: Some(s.id),
                    found: Some(s.amount),
                    ..of_execution(v)
                };
                self.report(v);
            }
            _ => {}
        }
        if let Some(s) = &e.settlement {
            self.settlement_of(&e, s);
        }
        self.receipt_of(&e);
    }

    fn settlement_of(&mut self, e: &ExecutionFacts, s: &SettlementFacts) {
        let of_settlement = |v: LedgerViolation| LedgerViolation {
            execution_id: Some(e.id),
            operation_key: Some(e.operation_key.clone()),
            settlement_id: Some(s.id),
            ..v
        };
        // A settlement written in another scope is charged there (see `foreign_settlement`).
        if s.scope == self.scope {
            self.charge(s);
        }
        let mismatch = [
            ("scope", s.scope != self.scope),
            ("operation_key", s.operation_key != e.operation_key),
            ("consumer", s.consumer != e.consumer),
            ("session_id", s.session_id != e.session_id),
            ("accounting_day", s.accounting_day != e.accounting_day),
        ];
        for (field, differs) in mismatch {
            if differs {
                let v = self.violation(LedgerInvariant::SettlementMatchesExecution, field);
                self.report(of_settlement(v));
            }
        }
        if s.price_version != e.price_version {
            let v = self.violation(LedgerInvariant::SettlementPriced, "price_version");
            self.report(of_settlement(v));
        }
        if s.currency != e.currency {
            let v = self.violation(LedgerInvariant::SettlementPriced, "currency");
            self.report(of_settlement(v));
        }
        match e.prices.cost(&s.usage) {
            Ok(cost) if cost == s.amount => {}
            Ok(cost) => {
                let v = self
                    .violation(LedgerInvariant::SettlementPriced, "amount")
                    .amounts(cost, s.amount);
                self.report(of_settlement(v));
            }
            Err(_) => {
                let v = LedgerViolation {
                    found: Some(s.amount),
                    ..self.violation(LedgerInvariant::SettlementPriced, "unpriceable")
                };
                self.report(of_settlement(v));
            }
        }
    }

    fn receipt_of(&mut self, e: &ExecutionFacts) {
        let of_execution = |v: LedgerViolation| LedgerViolation {
            execution_id: Some(e.id),
            operation_key: Some(e.operation_key.clone()),
            root_key: e.root_key.clone(),
            ..v
        };
        let settled = e
            .settlement
            .as_ref()
            .filter(|_| e.state == ExecutionState::Completed);
        match (&e.root_key, settled, &e.receipt) {
            // A completed call under a root: one receipt equal to its charge (that it is on the
            // call's own root is checked with the root's receipts, see `receipt`).
            (Some(_), Some(s), Some(r)) => {
                let reason = if r.currency != s.currency {
                    Some("currency")
                } else if r.amount != s.amount {
                    Some("amount")
                } else {
                    None
                };
                if let Some(reason) = reason {
                    let v = LedgerViolation {
                        root_id: Some(r.root_id),
                        settlement_id: Some(s.id),
                        ..self
                            .violation(LedgerInvariant::RootReceipt, reason)
                            .amounts(s.amount, r.amount)
                    };
                    self.report(of_execution(v));
                }
            }
            (Some(_), Some(s), None) => {
                let v = LedgerViolation {
                    root_id: e.root_id,
                    settlement_id: Some(s.id),
                    expected: Some(s.amount),
                    ..self.violation(LedgerInvariant::RootReceipt, "missing")
                };
                self.report(of_execution(v));
            }
            // Not a completed call under a root: no receipt.
            (_, _, Some(r)) => {
                let v = LedgerViolation {
                    root_id: Some(r.root_id),
                    found: Some(r.amount),
                    ..self.violation(LedgerInvariant::RootReceipt, "unexpected")
                };
                self.report(of_execution(v));
            }
            _ => {}
        }
    }

    /// A settlement written in this scope whose execution is not in this scope (rules 1 and 4):
    /// it is still charged to the spend rows it names.
    pub fn foreign_settlement(&mut self, s: SettlementFacts) {
        self.charge(&s);
        let v = LedgerViolation {
            execution_id: Some(s.execution_id),
            operation_key: Some(s.operation_key.clone()),
            settlement_id: Some(s.id),
            found: Some(s.amount),
            ..self.violation(LedgerInvariant::SettledExactlyOnce, "no_execution")
        };
        self.report(v);
    }

    /// A root receipt of a root in this scope (rule 7: the sum of a root's receipts).
    pub fn receipt(&mut self, r: ReceiptFacts) {
        self.checked.root_receipts += 1;
        self.roots_implied
            .entry(r.root_id)
            .or_default()
            .add_settled(r.amount);
        let reason = match &r.execution_root_key {
            None => Some("no_execution"),
            Some(key) if key.as_ref() != Some(&r.root_key) => Some("other_root"),
            Some(_) => None,
        };
        if let Some(reason) = reason {
            let v = LedgerViolation {
                execution_id: Some(r.execution_id),
                root_id: Some(r.root_id),
                root_key: Some(r.root_key),
                found: Some(r.amount),
                ..self.violation(LedgerInvariant::RootReceipt, reason)
            };
            self.report(v);
        }
    }

    /// An acknowledged piece of usage evidence of this scope (rule 6).
    pub fn evidence(&mut self, ev: EvidenceFacts) {
        self.checked.evidence += 1;
        let reason = if !ev.exact {
            Some("not_exact")
        } else {
            match ev.execution_state {
                None => Some("no_execution"),
                Some(ExecutionState::Completed) => match ev.settlement_usage {
                    Some(usage) if usage == ev.usage => None,
                    Some(_) => Some("usage"),
                    None => Some("no_settlement"),
                },
                Some(ExecutionState::NotDispatched) if ev.usage.is_zero() => None,
                Some(ExecutionState::NotDispatched) => Some("usage"),
                Some(_) => Some("state"),
            }
        };
        if let Some(reason) = reason {
            let v = LedgerViolation {
                execution_id: Some(ev.execution_id),
                evidence_id: Some(ev.id),
                ..self.violation(LedgerInvariant::EvidenceAcknowledged, reason)
            };
            self.report(v);
        }
    }

    /// Compares the totals with what the rows imply and returns the scope's report.
    pub fn finish(mut self) -> LedgerReport {
        let spend = std::mem::take(&mut self.spend);
        let mut implied = std::mem::take(&mut self.spend_implied);
        let mut keys: BTreeSet<SpendRowKey> = spend.keys().cloned().collect();
        keys.extend(implied.keys().cloned());
        for key in keys {
            let stored = spend.get(&key).copied().unwrap_or_default();
            let want = implied.remove(&key).unwrap_or_default();
            let of_row = |v: LedgerViolation| LedgerViolation {
                spend: Some(key.clone()),
                ..v
            };
            if want.overflow {
                let v = self.violation(LedgerInvariant::SpendSettled, "overflow");
                self.report(of_row(v));
                continue;
            }
            if stored.settled != want.settled {
                let v = self
                    .violation(LedgerInvariant::SpendSettled, "mismatch")
                    .amounts(want.settled, stored.settled);
                self.report(of_row(v));
            }
            if stored.held != want.held {
                let v = self
                    .violation(LedgerInvariant::SpendHeld, "mismatch")
                    .amounts(want.held, stored.held);
                self.report(of_row(v));
            }
        }
        let roots = std::mem::take(&mut self.roots);
        let mut implied = std::mem::take(&mut self.roots_implied);
        for (id, root) in &roots {
            let want = implied.remove(id).unwrap_or_default();
            let of_root = |v: LedgerViolation| LedgerViolation {
                root_id: Some(root.id),
                root_key: Some(root.root_key.clone()),
                ..v
            };
            if want.overflow {
                let v = self.violation(LedgerInvariant::RootCharged, "overflow");
                self.report(of_root(v));
                continue;
            }
            if root.charged != want.settled {
                let v = self
                    .violation(LedgerInvariant::RootCharged, "mismatch")
                    .amounts(want.settled, root.charged);
                self.report(of_root(v));
            }
            if root.held != want.held {
                let v = self
                    .violation(LedgerInvariant::RootHeld, "mismatch")
                    .amounts(want.held, root.held);
                self.report(of_root(v));
            }
        }
        // Receipts or holds naming a root this scope does not have.
        for (id, want) in implied {
            let v = LedgerViolation {
                root_id: Some(id),
                ..self
                    .violation(LedgerInvariant::RootCharged, "root_missing")
                    .amounts(want.settled, Money::ZERO)
            };
            self.report(v);
        }
        LedgerReport {
            ok: self.total == 0,
            scope: Some(self.scope),
            checked: self.checked,
            truncated: self.total > self.violations.len() as u64,
            violations: self.violations,
            violations_total: self.total,
        }
    }
}

#[cfg(test)]
mod tests;
