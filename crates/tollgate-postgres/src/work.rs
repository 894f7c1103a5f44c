//! The scheduler's work scan ([`WorkScan`]): one fixed query over the open rows of executions,
//! the usage inbox and roots (partial indexes `executions_open_scope_idx`,
//! `usage_inbox_open_idx` and `roots_open_scope_idx` keep it to open rows).

use crate::error::{corrupt, DbResultExt};
use crate::PgStores;
use async_trait::async_trait;
use tollgate_core::ids::Scope;
use tollgate_store::traits::WorkScan;
use tollgate_store::StoreResult;

/// Scopes with open work after a cursor (`''`: from the first): unfinished or operator-bound
/// executions, unacknowledged evidence, and roots that are not reconciled.
const SCOPES_WITH_WORK: &str = "
SELECT scope FROM (
    SELECT scope FROM executions
     WHERE state IN ('prepared', 'dispatched', 'reconciliation_required')
    UNION
    SELECT scope FROM usage_inbox WHERE acknowledged_at IS NULL
    UNION
    SELECT scope FROM roots WHERE state IN ('active', 'closed', 'expired')
) AS work
WHERE scope > $1
ORDER BY scope
LIMIT $2";

#[async_trait]
impl WorkScan for PgStores {
    async fn scopes_with_work(&self, after: Option<&Scope>, limit: u32) -> StoreResult<Vec<Scope>> {
        // Scopes are never empty, so `''` is before every one of them.
        let names: Vec<String> = sqlx::query_scalar(SCOPES_WITH_WORK)
            .bind(after.map_or("", Scope::as_str))
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .store_err()?;
        names
            .into_iter()
            .map(|name| Scope::parse(name).map_err(|_| corrupt("scope")))
            .collect()
    }
}
