//! The stores behind the service: Postgres, or the embedded in-memory stores. Adds what the
//! service needs beside the store traits (readiness, the scopes that have work) without
//! changing them.

use std::collections::BTreeSet;
use std::sync::Arc;
use tollgate_core::ids::Scope;
use tollgate_postgres::PgStores;
use tollgate_store::{AllStores, MemoryStores, StoreError};

/// The stores.
#[derive(Clone)]
pub enum Backend {
    /// The embedded default (lost on exit).
    Memory(Arc<MemoryStores>),
    /// Postgres at `[database] url` / `DATABASE_URL`: durable and shared between processes.
    Postgres(Arc<PgStores>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Scopes with open work on Postgres, after a cursor: unfinished or operator-bound executions,
/// unacknowledged evidence, and roots that are not reconciled. Fixed SQL, bound values only.
const SCOPES_WITH_WORK_SQL: &str = "
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

impl Backend {
    /// Fresh in-memory stores.
    pub fn memory() -> Self {
        Self::Memory(Arc::new(MemoryStores::new()))
    }

    /// `memory` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Postgres(_) => "postgres",
        }
    }

    /// The stores as the runners use them.
    pub fn stores(&self) -> Arc<dyn AllStores> {
        match self {
            Self::Memory(m) => m.clone(),
            Self::Postgres(p) => p.clone(),
        }
    }

    /// The Postgres pool, when on Postgres.
    pub fn pool(&self) -> Option<sqlx::PgPool> {
        match self {
            Self::Memory(_) => None,
            Self::Postgres(p) => Some(p.pool().clone()),
        }
    }

    /// Readiness: always for memory; on Postgres the database answers and migrations are
    /// current.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`].
    pub async fn ready(&self) -> Result<(), StoreError> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Postgres(p) => p.ready().await,
        }
    }

    /// Up to `limit` scopes that may have scheduler work, in name order after `after` (a
    /// rotating cursor, so that every scope gets its turn). On memory: the `known` scopes (those
    /// of the configured and generated keys — the only scopes requests can act in).
    ///
    /// # Errors
    /// Store failure.
    pub async fn scopes_with_work(
        &self,
        known: &BTreeSet<Scope>,
        after: &str,
        limit: u32,
    ) -> Result<Vec<Scope>, StoreError> {
        let Self::Postgres(p) = self else {
            let after = after.to_string();
            return Ok(known
                .iter()
                .filter(|s| s.as_str() > after.as_str())
                .take(limit as usize)
                .cloned()
                .collect());
        };
        let names: Vec<String> = sqlx::query_scalar(SCOPES_WITH_WORK_SQL)
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(p.pool())
            .await
            .map_err(|e| StoreError::Unavailable(format!("scopes with work: {e}")))?;
        names
            .into_iter()
            .map(|n| Scope::parse(n).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect()
    }
}
