//! The instances of a cluster (spec/performance.md, H-39): each instance of `tollgate serve`
//! with `[cluster] url` writes its row and reads the live members in one statement, and marks its
//! row as gone when it stops. The rows decide only which instance sends a call's statements.

use crate::error::DbResultExt;
use crate::PgStores;
use sqlx::Row;
use tollgate_store::StoreResult;
use uuid::Uuid;

/// A member of the cluster: its id and where the others reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The instance's id, new at each start.
    pub id: Uuid,
    /// Its `[cluster] url`.
    pub url: String,
}

/// Writes the row of `url` seen now as instance `id`'s and answers every instance seen within
/// `expiry_ms` (by the database's clock), `id` included, ordered by id.
const SEEN: &str = "WITH seen AS ( \
        INSERT INTO instances (url, id, seen_at) VALUES ($2, $1, now()) \
        ON CONFLICT (url) DO UPDATE SET id = EXCLUDED.id, seen_at = EXCLUDED.seen_at \
        RETURNING id, url \
    ) \
    SELECT id, url FROM seen \
    UNION ALL \
    SELECT id, url FROM instances \
    WHERE url <> $2 AND seen_at >= now() - $3::bigint * interval '1 millisecond' \
    ORDER BY id";

impl PgStores {
    /// Writes the heartbeat of instance `id` reachable at `url` and answers the members seen
    /// within `expiry_ms`, `id` among them, ordered by id.
    ///
    /// # Errors
    /// The database's failure, as every statement's.
    pub async fn instance_seen(
        &self,
        id: Uuid,
        url: &str,
        expiry_ms: u64,
    ) -> StoreResult<Vec<Instance>> {
        let expiry = i64::try_from(expiry_ms).unwrap_or(i64::MAX);
        self.bounded(async move {
            let rows = sqlx::query(SEEN)
                .bind(id)
                .bind(url)
                .bind(expiry)
                .fetch_all(self.pool())
                .await
                .store_err()?;
            rows.iter().map(instance).collect()
        })
        .await
    }

    /// The members seen within `expiry_ms`, ordered by id, read without a heartbeat of this
    /// process.
    ///
    /// # Errors
    /// The database's failure.
    pub async fn instances(&self, expiry_ms: u64) -> StoreResult<Vec<Instance>> {
        let expiry = i64::try_from(expiry_ms).unwrap_or(i64::MAX);
        self.bounded(async move {
            let rows = sqlx::query(
                "SELECT id, url FROM instances \
                 WHERE seen_at >= now() - $1::bigint * interval '1 millisecond' ORDER BY id",
            )
            .bind(expiry)
            .fetch_all(self.pool())
            .await
            .store_err()?;
            rows.iter().map(instance).collect()
        })
        .await
    }

    /// Marks instance `id`'s row (at `url`) as not seen since the beginning of time, so that
    /// the others stop sending it calls at their next heartbeat; a row another instance at the
    /// same address has taken over is left as it is.
    ///
    /// # Errors
    /// The database's failure.
    pub async fn instance_left(&self, id: Uuid, url: &str) -> StoreResult<()> {
        self.bounded(async move {
            sqlx::query("UPDATE instances SET seen_at = '-infinity' WHERE url = $1 AND id = $2")
                .bind(url)
                .bind(id)
                .execute(self.pool())
                .await
                .store_err()?;
            Ok(())
        })
        .await
    }
}

fn instance(row: &sqlx::postgres::PgRow) -> StoreResult<Instance> {
    Ok(Instance {
        id: row.try_get("id").store_err()?,
        url: row.try_get("url").store_err()?,
    })
}
