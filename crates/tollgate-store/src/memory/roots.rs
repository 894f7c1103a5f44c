//! Operation roots in memory (the RootStore half of [`MemoryStores`]).

use super::{MemoryStores, Tables};
use crate::error::StoreResult;
use crate::rows::*;
use crate::rules;
use crate::traits::RootStore;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tollgate_core::ids::{ExecutionId, RootKey, Scope};
#[cfg(feature = "test-support")]
use tollgate_core::money::Money;
use tollgate_core::state::ExecutionState;

impl Tables {
    pub(super) fn root_mut(
        &mut self,
        scope: &Scope,
        root_key: &RootKey,
    ) -> Option<&mut RootRecord> {
        self.roots.get_mut(&(scope.clone(), root_key.clone()))
    }

    /// Whether the calls of a root are all accounted for at `now` ([`rules::root_calls_settled`]).
    pub(super) fn root_calls_final(&self, root: &RootRecord, now: DateTime<Utc>) -> bool {
        let calls: Vec<&ExecutionRecord> = self
            .executions
            .values()
            .filter(|r| r.scope == root.scope && r.root_key.as_ref() == Some(&root.root_key))
            .collect();
        let all_final = calls.iter().all(|r| r.state.is_final());
        rules::root_calls_settled(root, now, calls.len() as i64, all_final)
    }
}

#[async_trait]
impl RootStore for MemoryStores {
    async fn open_root(&self, request: OpenRootRequest) -> StoreResult<RootOpen> {
        let mut t = self.lock()?;
        let key = (request.scope.clone(), request.root_key.clone());
        if let Some(existing) = t.roots.get(&key) {
            return Ok(RootOpen::Existing(existing.clone()));
        }
        let root = rules::new_root(&request);
        t.roots.insert(key, root.clone());
        t.append(rules::root_event(&root, "root_opened", request.now));
        Ok(RootOpen::Opened(root))
    }

    async fn reserve_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Reservation> {
        let mut t = self.lock()?;
        let Some(root) = t.root_mut(scope, root_key) else {
            return Ok(Reservation::Missing);
        };
        if !rules::root_admits(root, now) {
            let refused = root.clone();
            return Ok(Reservation::Refused(refused));
        }
        root.reserved_calls += 1;
        root.updated_at = now;
        let root = root.clone();
        t.append(rules::root_event(&root, "root_slot_reserved", now));
        Ok(Reservation::Reserved(root))
    }

    async fn release_slot(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        let mut t = self.lock()?;
        if let Some(root) = t.root_mut(scope, root_key) {
            root.reserved_calls = (root.reserved_calls - 1).max(0);
            root.updated_at = now;
            let root = root.clone();
            t.append(rules::root_event(&root, "root_slot_released", now));
        }
        Ok(())
    }

    async fn close_root(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootRecord>> {
        let mut t = self.lock()?;
        let Some(root) = t.root_mut(scope, root_key) else {
            return Ok(None);
        };
        if root.state != RootState::Active {
            return Ok(Some(root.clone()));
        }
        root.state = RootState::Closed;
        root.updated_at = now;
        let root = root.clone();
        t.append(rules::root_event(&root, "root_closed", now));
        Ok(Some(root))
    }

    async fn root(&self, scope: &Scope, root_key: &RootKey) -> StoreResult<Option<RootRecord>> {
        Ok(self
            .lock()?
            .roots
            .get(&(scope.clone(), root_key.clone()))
            .cloned())
    }

    async fn root_receipt(&self, execution_id: ExecutionId) -> StoreResult<Option<RootReceipt>> {
        Ok(self.lock()?.root_receipts.get(&execution_id).cloned())
    }

    async fn root_receipts(
        &self,
        scope: &Scope,
        root_key: &RootKey,
        limit: u32,
    ) -> StoreResult<Vec<RootReceipt>> {
        let t = self.lock()?;
        let Some(root) = t.roots.get(&(scope.clone(), root_key.clone())) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<_> = t
            .root_receipts
            .values()
            .filter(|r| r.root_id == root.id)
            .cloned()
            .collect();
        out.sort_by_key(|r| (r.created_at, r.execution_id));
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn repair_root_receipt(
        &self,
        scope: &Scope,
        execution_id: ExecutionId,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<RootReceipt>> {
        let mut t = self.lock()?;
        if let Some(existing) = t.root_receipts.get(&execution_id) {
            return Ok(Some(existing.clone()));
        }
        let Some(record) = t
            .executions
            .get(&execution_id)
            .filter(|r| &r.scope == scope && r.state == ExecutionState::Completed)
            .cloned()
        else {
            return Ok(None);
        };
        let settlement = t
            .settlement_by_execution
            .get(&execution_id)
            .and_then(|i| t.settlements.get(*i))
            .cloned();
        let (Some(settlement), Some(root)) = (settlement, t.root_of(&record).cloned()) else {
            return Ok(None);
        };
        rules::check_root_currency(&root, &settlement.currency)?;
        let receipt = rules::root_receipt(&root, &settlement);
        // The root's charged total is the sum of its receipts: recomputed with the repaired one,
        // never added to, so a charge the root already counted is not counted twice (SC-108).
        let mut charged = receipt.amount;
        for other in t.root_receipts.values().filter(|r| r.root_id == root.id) {
            charged = charged.checked_add(other.amount)?;
        }
        let root = RootRecord {
            charged,
            updated_at: now,
            ..root
        };
        if let Some(stored) = t.root_of(&record) {
            *stored = root.clone();
        }
        t.root_receipts.insert(execution_id, receipt.clone());
        t.append(rules::root_receipt_repaired_event(&root, &receipt, now));
        Ok(Some(receipt))
    }

    async fn reconcile_roots(
        &self,
        scope: &Scope,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<RootRecord>> {
        let mut t = self.lock()?;
        let mut keys: Vec<RootKey> = t
            .roots
            .values()
            .filter(|r| &r.scope == scope)
            .map(|r| r.root_key.clone())
            .collect();
        keys.sort();
        let mut changed = Vec::new();
        for key in keys {
            if changed.len() >= limit as usize {
                break;
            }
            let Some(root) = t.roots.get(&(scope.clone(), key.clone())).cloned() else {
                continue;
            };
            let all_final = t.root_calls_final(&root, now);
            let Some(next) = rules::root_next_state(&root, now, all_final) else {
                continue;
            };
            if let Some(r) = t.root_mut(scope, &key) {
                r.state = next;
                r.updated_at = now;
                let r = r.clone();
                t.append(rules::root_event(&r, "root_reconciled", now));
                changed.push(r);
            }
        }
        Ok(changed)
    }
}

impl MemoryStores {
    /// Drops a root receipt and takes its amount off the root, as an older or damaged store might
    /// have left it: for tests of the ST-31 repair.
    #[cfg(feature = "test-support")]
    pub fn forget_root_receipt(&self, execution_id: ExecutionId) -> StoreResult<()> {
        let mut t = self.lock()?;
        let Some(receipt) = t.root_receipts.remove(&execution_id) else {
            return Ok(());
        };
        if let Some(root) = t.roots.values_mut().find(|r| r.id == receipt.root_id) {
            root.charged = root.charged.checked_sub(receipt.amount)?;
        }
        Ok(())
    }

    /// Drops a root receipt and leaves its amount on the root, as a partial write might have
    /// left it: for tests of the SC-108 repair.
    #[cfg(feature = "test-support")]
    pub fn drop_root_receipt(&self, execution_id: ExecutionId) -> StoreResult<()> {
        self.lock()?.root_receipts.remove(&execution_id);
        Ok(())
    }

    /// Sets the `held` of every spend row and root of `scope` to zero behind the stores' back,
    /// so that releasing a hold is an over-release: for tests of SC-107.
    #[cfg(feature = "test-support")]
    pub fn lose_holds(&self, scope: &Scope) -> StoreResult<()> {
        let mut t = self.lock()?;
        for (key, totals) in t.session_spend.iter_mut() {
            if &key.0 == scope {
                totals.held = Money::ZERO;
            }
        }
        for (key, totals) in t.daily_spend.iter_mut() {
            if &key.0 == scope {
                totals.held = Money::ZERO;
            }
        }
        for root in t.roots.values_mut().filter(|r| &r.scope == scope) {
            root.held = Money::ZERO;
        }
        Ok(())
    }
}
