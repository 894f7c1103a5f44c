//! The scheduler's work scan ([`WorkScan`]): one fixed query over the open rows of executions,
//! the usage inbox and roots, a skip scan over the partial indexes `executions_open_scope_idx`,
//! `usage_inbox_open_idx` and `roots_open_scope_idx` (one entry per scope, not per open row).

use crate::error::{corrupt, DbResultExt};
use crate::PgStores;
use async_trait::async_trait;
use tollgate_core::ids::Scope;
use tollgate_store::traits::WorkScan;
use tollgate_store::StoreResult;

/// Scopes with open work after a cursor (`''`: from the first): unfinished or operator-bound
/// executions, unacknowledged evidence, and roots that are not reconciled.
///
/// Each table is read as a skip scan over its partial index (a recursive step to the next scope
/// after the last one found), so a pass reads about one index entry per scope with work and
/// table, however many open rows each scope holds (H-8); the union of the first `$2` scopes of
/// each table holds the first `$2` scopes of all three.
pub(crate) const SCOPES_WITH_WORK: &str = "
WITH RECURSIVE
executions_open (scope, n) AS (
    (SELECT scope, 1::bigint FROM executions
      WHERE state IN ('prepared', 'dispatched', 'reconciliation_required') AND scope > $1::text
      ORDER BY scope LIMIT 1)
    UNION ALL
    SELECT (SELECT x.scope FROM executions x
             WHERE x.state IN ('prepared', 'dispatched', 'reconciliation_required')
               AND x.scope > o.scope
             ORDER BY x.scope LIMIT 1), o.n + 1
      FROM executions_open o WHERE o.scope IS NOT NULL AND o.n < $2::bigint
),
evidence_open (scope, n) AS (
    (SELECT scope, 1::bigint FROM usage_inbox
      WHERE acknowledged_at IS NULL AND scope > $1::text
      ORDER BY scope LIMIT 1)
    UNION ALL
    SELECT (SELECT x.scope FROM usage_inbox x
             WHERE x.acknowledged_at IS NULL AND x.scope > o.scope
             ORDER BY x.scope LIMIT 1), o.n + 1
      FROM evidence_open o WHERE o.scope IS NOT NULL AND o.n < $2::bigint
),
roots_open (scope, n) AS (
    (SELECT scope, 1::bigint FROM roots
      WHERE state IN ('active', 'closed', 'expired') AND scope > $1::text
      ORDER BY scope LIMIT 1)
    UNION ALL
    SELECT (SELECT x.scope FROM roots x
             WHERE x.state IN ('active', 'closed', 'expired') AND x.scope > o.scope
             ORDER BY x.scope LIMIT 1), o.n + 1
      FROM roots_open o WHERE o.scope IS NOT NULL AND o.n < $2::bigint
)
SELECT scope FROM (
    SELECT scope FROM executions_open
    UNION
    SELECT scope FROM evidence_open
    UNION
    SELECT scope FROM roots_open
) AS work
WHERE scope IS NOT NULL
ORDER BY scope
LIMIT $2::bigint";

/// The scan before H-8 (it read every open row), kept for the harness's before/after plans.
#[cfg(feature = "test-support")]
pub(crate) const SCOPES_WITH_WORK_FULL_SCAN: &str = "
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
        self.bounded(async move {
            // Scopes are never empty, so `''` is before every one of them.
            let names: Vec<String> = sqlx::query_scalar(SCOPES_WITH_WORK)
                .bind(after.map_or("", Scope::as_str))
                .bind(i64::from(limit))
                .fetch_all(self.pool())
                .await
                .store_err()?;
            names
                .into_iter()
                .map(|name| Scope::from_stored(name).map_err(|_| corrupt("scope")))
                .collect()
        })
        .await
    }
}
