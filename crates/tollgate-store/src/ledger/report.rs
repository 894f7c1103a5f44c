//! What a ledger audit reports (spec/storage.md — Ledger audit): counts of the rows checked and
//! the violations found, each naming its invariant and the rows involved by id and amount only,
//! never by content.

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use std::fmt;
use tollgate_core::ids::{
    ConsumerId, EvidenceId, ExecutionId, OperationKey, RootId, RootKey, Scope, SessionId,
    SettlementId,
};
use tollgate_core::money::{Currency, Money};

/// Violations a report carries by default.
pub const LEDGER_LIMIT_DEFAULT: u32 = 100;
/// Violations a report carries at most (more are counted, not listed).
pub const LEDGER_LIMIT_MAX: u32 = 1_000;

/// The invariants of the ledger. Their wire names are stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerInvariant {
    /// A spend row's `settled` equals the sum of the settlements charged to it (rule 1).
    SpendSettled,
    /// A spend row's `held` equals the holds of the open executions that count against it
    /// (rule 2).
    SpendHeld,
    /// A `completed` or `not_dispatched` execution holds nothing (rule 3).
    FinalHoldsNothing,
    /// A `completed` execution has exactly one settlement, any other none (rule 4).
    SettledExactlyOnce,
    /// A settlement names its execution's scope, key, consumer, session and accounting day.
    SettlementMatchesExecution,
    /// A settlement's amount is its usage priced by the execution's price snapshot, in its
    /// price version and currency (rule 5).
    SettlementPriced,
    /// Acknowledged usage evidence is exact and equals its execution's settlement, or is zero
    /// evidence of a `not_dispatched` execution (rule 6).
    EvidenceAcknowledged,
    /// A root's `charged` equals the sum of its root receipts (rule 7).
    RootCharged,
    /// A root's `held` equals the holds of its open calls (rule 7).
    RootHeld,
    /// A completed call under a root has one root receipt, on its root, equal to its
    /// settlement; nothing else has one (rule 7, ST-31).
    RootReceipt,
}

impl LedgerInvariant {
    /// Every invariant, in report order.
    pub const ALL: [LedgerInvariant; 10] = [
        Self::SpendSettled,
        Self::SpendHeld,
        Self::FinalHoldsNothing,
        Self::SettledExactlyOnce,
        Self::SettlementMatchesExecution,
        Self::SettlementPriced,
        Self::EvidenceAcknowledged,
        Self::RootCharged,
        Self::RootHeld,
        Self::RootReceipt,
    ];

    /// The stable wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::SpendSettled => "spend_settled",
            Self::SpendHeld => "spend_held",
            Self::FinalHoldsNothing => "final_holds_nothing",
            Self::SettledExactlyOnce => "settled_exactly_once",
            Self::SettlementMatchesExecution => "settlement_matches_execution",
            Self::SettlementPriced => "settlement_priced",
            Self::EvidenceAcknowledged => "evidence_acknowledged",
            Self::RootCharged => "root_charged",
            Self::RootHeld => "root_held",
            Self::RootReceipt => "root_receipt",
        }
    }
}

impl fmt::Display for LedgerInvariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which spend row: a consumer's session row or day row, in one currency (SC-105).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "window", rename_all = "snake_case")]
pub enum SpendRowKey {
    /// `spend_sessions (scope, consumer, session_id, currency)`.
    Session {
        /// Consumer charged.
        consumer: ConsumerId,
        /// Session.
        session_id: SessionId,
        /// Currency of the row.
        currency: Currency,
    },
    /// `spend_days (scope, consumer, day, currency)`.
    Day {
        /// Consumer charged.
        consumer: ConsumerId,
        /// Accounting day.
        day: NaiveDate,
        /// Currency of the row.
        currency: Currency,
    },
}

impl fmt::Display for SpendRowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Session {
                consumer,
                session_id,
                currency,
            } => write!(
                f,
                "consumer={consumer} session_id={session_id} currency={currency}"
            ),
            Self::Day {
                consumer,
                day,
                currency,
            } => write!(f, "consumer={consumer} day={day} currency={currency}"),
        }
    }
}

/// One violated invariant and the rows involved: ids, keys and amounts only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerViolation {
    /// The invariant.
    pub invariant: LedgerInvariant,
    /// What exactly disagrees, a fixed word (`mismatch`, `missing`, `unexpected`, `amount`,
    /// `currency`, `price_version`, `not_exact`, `usage`, `state`, `no_execution`, `other_root`,
    /// `root_missing`, `unpriceable`, `overflow`, a settlement field name, …).
    pub reason: String,
    /// Tenant.
    pub scope: Scope,
    /// The spend row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend: Option<SpendRowKey>,
    /// The execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<ExecutionId>,
    /// The execution's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_key: Option<OperationKey>,
    /// The settlement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settlement_id: Option<SettlementId>,
    /// The evidence row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence_id: Option<EvidenceId>,
    /// The root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_id: Option<RootId>,
    /// The root's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_key: Option<RootKey>,
    /// The amount the other rows imply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<Money>,
    /// The amount stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<Money>,
}

impl LedgerViolation {
    /// A violation of `invariant` in `scope` naming no row yet.
    pub fn new(invariant: LedgerInvariant, reason: &str, scope: &Scope) -> Self {
        Self {
            invariant,
            reason: reason.to_string(),
            scope: scope.clone(),
            spend: None,
            execution_id: None,
            operation_key: None,
            settlement_id: None,
            evidence_id: None,
            root_id: None,
            root_key: None,
            expected: None,
            found: None,
        }
    }

    /// Names the amounts that disagree.
    pub fn amounts(mut self, expected: Money, found: Money) -> Self {
        self.expected = Some(expected);
        self.found = Some(found);
        self
    }
}

impl fmt::Display for LedgerViolation {
    /// `invariant (reason): scope=… <row ids> expected=… found=…`, ids and amounts only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): scope={}",
            self.invariant, self.reason, self.scope
        )?;
        if let Some(spend) = &self.spend {
            let window = match spend {
                SpendRowKey::Session { .. } => "session",
                SpendRowKey::Day { .. } => "day",
            };
            write!(f, " spend={window} {spend}")?;
        }
        if let Some(id) = &self.execution_id {
            write!(f, " execution_id={id}")?;
        }
        if let Some(key) = &self.operation_key {
            write!(f, " operation_key={key}")?;
        }
        if let Some(id) = &self.settlement_id {
            write!(f, " settlement_id={id}")?;
        }
        if let Some(id) = &self.evidence_id {
            write!(f, " evidence_id={id}")?;
        }
        if let Some(id) = &self.root_id {
            write!(f, " root_id={id}")?;
        }
        if let Some(key) = &self.root_key {
            write!(f, " root_key={key}")?;
        }
        if let Some(amount) = &self.expected {
            write!(f, " expected={amount}")?;
        }
        if let Some(amount) = &self.found {
            write!(f, " found={amount}")?;
        }
        Ok(())
    }
}

/// How many rows an audit checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerCounts {
    /// Scopes audited.
    pub scopes: u64,
    /// Journal rows.
    pub executions: u64,
    /// Governed settlements.
    pub settlements: u64,
    /// Spend rows (session and day).
    pub spend_rows: u64,
    /// Operation roots.
    pub roots: u64,
    /// Root receipts.
    pub root_receipts: u64,
    /// Acknowledged usage evidence rows.
    pub evidence: u64,
}

impl LedgerCounts {
    fn add(&mut self, other: &LedgerCounts) {
        self.scopes += other.scopes;
        self.executions += other.executions;
        self.settlements += other.settlements;
        self.spend_rows += other.spend_rows;
        self.roots += other.roots;
        self.root_receipts += other.root_receipts;
        self.evidence += other.evidence;
    }
}

/// The result of a ledger audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerReport {
    /// `true` when no invariant is violated.
    pub ok: bool,
    /// The scope audited; `None` when every scope was.
    pub scope: Option<Scope>,
    /// Rows checked.
    pub checked: LedgerCounts,
    /// Violations found, in the order found, at most the audit's limit.
    pub violations: Vec<LedgerViolation>,
    /// Violations found in all, listed or not.
    pub violations_total: u64,
    /// Whether violations were left off the list (`violations_total` > listed).
    pub truncated: bool,
}

impl LedgerReport {
    /// An empty, clean report (no scope checked yet).
    pub fn empty(scope: Option<Scope>) -> Self {
        Self {
            ok: true,
            scope,
            checked: LedgerCounts::default(),
            violations: Vec::new(),
            violations_total: 0,
            truncated: false,
        }
    }

    /// Adds another scope's report, listing at most `limit` violations in all.
    pub fn absorb(&mut self, other: LedgerReport, limit: u32) {
        self.checked.add(&other.checked);
        self.violations_total += other.violations_total;
        let room = (limit as usize).saturating_sub(self.violations.len());
        self.violations
            .extend(other.violations.into_iter().take(room));
        self.truncated = self.violations_total > self.violations.len() as u64;
        self.ok = self.violations_total == 0;
    }

    /// The first violation, if any.
    pub fn first(&self) -> Option<&LedgerViolation> {
        self.violations.first()
    }
}

/// Clamps a requested violation limit to `1..=`[`LEDGER_LIMIT_MAX`].
pub fn ledger_limit(requested: Option<u32>) -> u32 {
    requested
        .unwrap_or(LEDGER_LIMIT_DEFAULT)
        .clamp(1, LEDGER_LIMIT_MAX)
}
