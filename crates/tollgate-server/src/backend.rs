//! The stores behind the service: Postgres, or the embedded in-memory stores. Either way the
//! service uses them through the store traits only ([`ServiceStores`]: the runners' stores, API
//! keys and the scheduler's work scan); beside them it needs readiness, which only Postgres can
//! lack.

use std::sync::Arc;
use tollgate_postgres::PgStores;
use tollgate_store::{MemoryStores, ServiceStores, StoreError};

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

    /// The stores, as the runners, the key store and the scheduler use them.
    pub fn stores(&self) -> Arc<dyn ServiceStores> {
        match self {
            Self::Memory(m) => m.clone(),
            Self::Postgres(p) => p.clone(),
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
}
