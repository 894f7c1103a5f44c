//! The ledger audit on the in-memory stores (the [`LedgerAudit`] part of [`MemoryStores`]): a
//! scope's rows read under the one mutex, so the audit sees one consistent state.

use super::{MemoryStores, Tables};
use crate::error::StoreResult;
use crate::ledger::*;
use crate::rows::*;
use crate::traits::LedgerAudit;
use async_trait::async_trait;
use std::collections::{BTreeSet, HashMap};
use tollgate_core::ids::{ExecutionId, RootId, Scope};

impl Tables {
    /// Every scope any table names.
    fn ledger_scopes(&self) -> BTreeSet<Scope> {
        let mut scopes: BTreeSet<Scope> =
            self.executions.values().map(|r| r.scope.clone()).collect();
        scopes.extend(self.settlements.iter().map(|s| s.scope.clone()));
        scopes.extend(self.session_spend.keys().map(|k| k.0.clone()));
        scopes.extend(self.daily_spend.keys().map(|k| k.0.clone()));
        scopes.extend(self.roots.keys().map(|k| k.0.clone()));
        scopes.extend(self.evidence.iter().map(|e| e.scope.clone()));
        scopes
    }

    fn settlement_of(&self, id: ExecutionId) -> Option<&SettlementRecord> {
        self.settlement_by_execution
            .get(&id)
            .and_then(|i| self.settlements.get(*i))
    }

    fn execution_in(&self, scope: &Scope, id: ExecutionId) -> Option<&ExecutionRecord> {
        self.executions.get(&id).filter(|r| &r.scope == scope)
    }

    fn audit_scope(&self, scope: &Scope, limit: u32) -> LedgerReport {
        let mut checker = LedgerChecker::new(scope.clone(), limit);
        for ((s, consumer, session_id, currency), totals) in &self.session_spend {
            if s == scope {
                let key = SpendRowKey::Session {
                    consumer: consumer.clone(),
                    session_id: session_id.clone(),
                    currency: currency.clone(),
                };
                checker.spend_row(key, *totals);
            }
        }
        for ((s, consumer, day, currency), totals) in &self.daily_spend {
            if s == scope {
                let key = SpendRowKey::Day {
                    consumer: consumer.clone(),
                    day: *day,
                    currency: currency.clone(),
                };
                checker.spend_row(key, *totals);
            }
        }
        let mut roots: HashMap<RootId, &RootRecord> = HashMap::new();
        for ((s, _), root) in &self.roots {
            if s == scope {
                roots.insert(root.id, root);
                checker.root(RootFacts {
                    id: root.id,
                    root_key: root.root_key.clone(),
                    charged: root.charged,
                    held: root.held,
                });
            }
        }
        for record in self.executions.values().filter(|r| &r.scope == scope) {
            let root_id = record
                .root_key
                .as_ref()
                .and_then(|k| self.roots.get(&(scope.clone(), k.clone())))
                .map(|root| root.id);
            checker.execution(ExecutionFacts::of(
                record,
                root_id,
                self.settlement_of(record.id),
                self.root_receipts.get(&record.id),
            ));
        }
        for settlement in self.settlements.iter().filter(|s| &s.scope == scope) {
            if self.execution_in(scope, settlement.execution_id).is_none() {
                checker.foreign_settlement(SettlementFacts::of(settlement));
            }
        }
        for receipt in self.root_receipts.values() {
            let Some(root) = roots.get(&receipt.root_id) else {
                continue;
            };
            checker.receipt(ReceiptFacts {
                root_id: root.id,
                root_key: root.root_key.clone(),
                execution_id: receipt.execution_id,
                amount: receipt.amount,
                execution_root_key: self
                    .execution_in(scope, receipt.execution_id)
                    .map(|r| r.root_key.clone()),
            });
        }
        for evidence in &self.evidence {
            if &evidence.scope != scope || evidence.acknowledged_at.is_none() {
                continue;
            }
            let record = self.execution_in(scope, evidence.execution_id);
            checker.evidence(EvidenceFacts {
                id: evidence.id,
                execution_id: evidence.execution_id,
                exact: evidence.exact,
                usage: evidence.usage,
                execution_state: record.map(|r| r.state),
                settlement_usage: record
                    .and_then(|r| self.settlement_of(r.id))
                    .map(|s| s.usage),
            });
        }
        checker.finish()
    }
}

#[async_trait]
impl LedgerAudit for MemoryStores {
    async fn audit_ledger(&self, scope: Option<&Scope>, limit: u32) -> StoreResult<LedgerReport> {
        let limit = ledger_limit(Some(limit));
        let t = self.lock()?;
        if let Some(scope) = scope {
            return Ok(t.audit_scope(scope, limit));
        }
        let mut report = LedgerReport::empty(None);
        for scope in t.ledger_scopes() {
            report.absorb(t.audit_scope(&scope, limit), limit);
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    //! Rows damaged behind the stores' back, as the Postgres suite damages them with SQL.
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::traits::{ExecutionStore, RootStore};
    use crate::ClaimOutcome;
    use chrono::{DateTime, Duration, Utc};
    use tollgate_core::config::fixtures::text_config;
    use tollgate_core::config::CallConfig;
    use tollgate_core::digest::Binding;
    use tollgate_core::ids::{InputRevision, Intent, OperationKey, RootKey, SessionId};
    use tollgate_core::money::Money;
    use tollgate_core::state::{CallKind, Outcome, SettlementSource};
    use tollgate_core::usage::Usage;

    // The few fixtures these tests need, as the conformance suite (`tollgate-testkit`) builds
    // them: unit tests of this crate cannot use the test kit, which is built on this crate.
    fn money(s: &str) -> Money {
        Money::parse(s, "test").unwrap()
    }

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn root_key(s: &str) -> RootKey {
        RootKey::parse(s).unwrap()
    }

    fn binding(config: CallConfig) -> Binding {
        Binding {
            session_id: SessionId::parse("s-1").unwrap(),
            intent: Intent::parse("summarize").unwrap(),
            input_revision: InputRevision::parse("r-1").unwrap(),
            config,
        }
    }

    fn claim_req(scope: &str, key: &str, config: CallConfig, hold: &str) -> ClaimRequest {
        ClaimRequest {
            scope: Scope::parse(scope).unwrap(),
            operation_key: OperationKey::parse(key).unwrap(),
            root_key: None,
            binding: binding(config),
            hold: money(hold),
            now: t0(),
            lease_ms: 30_000,
            dispatch: false,
            limits: tollgate_core::limits::ClaimLimits::default(),
            binding_digest: None,
        }
    }

    async fn open_root(s: &MemoryStores, key: &str, config: CallConfig) {
        let request = OpenRootRequest {
            scope: Scope::parse("a").unwrap(),
            root_key: root_key(key),
            binding: binding(config),
            deadline: t0() + Duration::seconds(60),
            now: t0(),
        };
        let RootOpen::Opened(_) = s.open_root(request).await.unwrap() else {
            panic!("expected a new root");
        };
    }

    fn settle_req(record: &ExecutionRecord, amount: &str) -> SettleRequest {
        SettleRequest {
            fence: record.fence(),
            usage: Usage::ZERO,
            amount: money(amount),
            source: SettlementSource::Stream,
            outcome: Outcome::Success,
            stop: Some("stop".into()),
            output: Some(tollgate_core::view::Output {
                text: Some("x".into()),
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

    /// A settled call (10 input + 5 output = 0.00002), under root `r1` when `root` is set.
    async fn settled(s: &MemoryStores, key: &str, root: bool) -> ExecutionRecord {
        let mut config = text_config();
        let mut req = claim_req("a", key, config.clone(), "0.5");
        if root {
            config.kind = CallKind::Step;
            req = claim_req("a", key, config.clone(), "0.5");
            open_root(s, "r1", config).await;
            req.root_key = Some(root_key("r1"));
        }
        let ClaimOutcome::Claimed(r) = s.claim(req).await.unwrap() else {
            panic!("expected a claim");
        };
        let d = s.mark_dispatched(r.fence(), t0()).await.unwrap();
        let mut settle = settle_req(&d, "0.00002");
        settle.usage = Usage {
            input: 10,
            output: 5,
            ..Usage::ZERO
        };
        s.settle(settle).await.unwrap().record
    }

    async fn first(s: &MemoryStores) -> LedgerViolation {
        let report = s.audit_ledger(None, 10).await.unwrap();
        assert!(!report.ok);
        report.first().cloned().unwrap()
    }

    #[tokio::test]
    async fn sc_91_a_damaged_spend_row_is_named() {
        let s = MemoryStores::new();
        let r = settled(&s, "k1", false).await;
        assert!(s.audit_ledger(None, 10).await.unwrap().ok);
        {
            let mut t = s.lock().unwrap();
            let currency = r.binding.config.currency.clone();
            let key = (
                r.scope.clone(),
                r.consumer().clone(),
                r.accounting_day,
                currency,
            );
            let row = t.daily_spend.get_mut(&key).unwrap();
            row.settled = row.settled.checked_add(money("0.01")).unwrap();
        }
        let v = first(&s).await;
        assert_eq!(v.invariant, LedgerInvariant::SpendSettled);
        assert_eq!(
            v.spend,
            Some(SpendRowKey::Day {
                consumer: r.consumer().clone(),
                day: r.accounting_day,
                currency: r.binding.config.currency.clone(),
            })
        );
        assert_eq!(
            (v.expected, v.found),
            (Some(money("0.00002")), Some(money("0.01002")))
        );
    }

    #[tokio::test]
    async fn sc_91_a_damaged_settlement_amount_is_named() {
        let s = MemoryStores::new();
        let r = settled(&s, "k1", false).await;
        s.lock().unwrap().settlements[0].amount = money("0.5");
        let report = s.audit_ledger(None, 10).await.unwrap();
        let priced = report
            .violations
            .iter()
            .find(|v| v.invariant == LedgerInvariant::SettlementPriced)
            .unwrap();
        assert_eq!(priced.execution_id, Some(r.id));
        assert_eq!(priced.found, Some(money("0.5")));
    }

    #[tokio::test]
    async fn sc_91_st_31_a_lost_root_receipt_is_named_until_repaired() {
        let s = MemoryStores::new();
        let r = settled(&s, "c1", true).await;
        assert!(s.audit_ledger(None, 10).await.unwrap().ok);
        s.lock().unwrap().root_receipts.remove(&r.id);
        let report = s.audit_ledger(None, 10).await.unwrap();
        let named: Vec<_> = report.violations.iter().map(|v| v.invariant).collect();
        assert_eq!(
            named,
            [LedgerInvariant::RootReceipt, LedgerInvariant::RootCharged]
        );
        // Damage that took the amount off the root too is what the ST-31 repair mends.
        {
            let mut t = s.lock().unwrap();
            let root = t.roots.values_mut().next().unwrap();
            root.charged = Money::ZERO;
        }
        s.repair_root_receipt(&r.scope, r.id, t0()).await.unwrap();
        assert!(s.audit_ledger(None, 10).await.unwrap().ok);
    }
}
