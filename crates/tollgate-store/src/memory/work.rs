//! The scheduler's work scan in memory (the [`WorkScan`] half of [`MemoryStores`]).

use super::MemoryStores;
use crate::error::StoreResult;
use crate::rows::RootState;
use crate::traits::WorkScan;
use async_trait::async_trait;
use std::collections::BTreeSet;
use tollgate_core::ids::Scope;
use tollgate_core::state::ExecutionState;

#[async_trait]
impl WorkScan for MemoryStores {
    async fn scopes_with_work(&self, after: Option<&Scope>, limit: u32) -> StoreResult<Vec<Scope>> {
        let t = self.lock()?;
        let executions = t
            .executions
            .values()
            .filter(|r| {
                matches!(
                    r.state,
                    ExecutionState::Prepared
                        | ExecutionState::Dispatched
                        | ExecutionState::ReconciliationRequired
                )
            })
            .map(|r| &r.scope);
        let evidence = t
            .evidence
            .iter()
            .filter(|e| e.acknowledged_at.is_none())
            .map(|e| &e.scope);
        let roots = t
            .roots
            .values()
            .filter(|r| {
                matches!(
                    r.state,
                    RootState::Active | RootState::Closed | RootState::Expired
                )
            })
            .map(|r| &r.scope);
        let scopes: BTreeSet<&Scope> = executions
            .chain(evidence)
            .chain(roots)
            .filter(|scope| after.is_none_or(|after| *scope > after))
            .collect();
        Ok(scopes.into_iter().take(limit as usize).cloned().collect())
    }
}
