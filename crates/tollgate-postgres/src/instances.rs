//! The instances of a cluster (spec/performance.md, H-39): each instance of `tollgate serve`
//! with `[cluster] url` writes its row and reads the live members in one statement, and marks its
//! row as gone when it stops. The rows decide only which instance sends a call's statements.

use crate::error::DbResultExt;
use crate::PgStores;
use sqlx::Row;
use tollgate_store::StoreResult;
use uuid::Uuid;

/// A member of the cluster: its id, where the others reach it, and the proof of its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The instance's id, new at each start.
    pub id: Uuid,
    /// Its `[cluster] url`.
    pub url: String,
    /// The HMAC of its id, url and configuration digest under the members' secret, as it wrote
    /// it (hex).
    pub proof: String,
}

/// Writes the row of `url` seen now as instance `id`'s (with its configuration digest and
/// proof) and answers every instance of the same digest seen within `expiry_ms` (by the
/// database's clock), `id` included, ordered by id.
const SEEN: &str = "WITH seen AS ( \
        INSERT INTO instances (url, id, config_digest, proof, seen_at) \
        VALUES ($2, $1, $4, $5, now()) \
        ON CONFLICT (url) DO UPDATE SET id = EXCLUDED.id, \
            config_digest = EXCLUDED.config_digest, proof = EXCLUDED.proof, \
            seen_at = EXCLUDED.seen_at \
        RETURNING id, url, proof \
    ) \
    SELECT id, url, proof FROM seen \
    UNION ALL \
    SELECT id, url, proof FROM instances \
    WHERE url <> $2 AND config_digest = $4 \
        AND seen_at >= now() - $3::bigint * interval '1 millisecond' \
    ORDER BY id";

/// What a member writes in its row beside its id and url.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat<'a> {
    /// The member's id.
    pub id: Uuid,
    /// Its `[cluster] url`.
    pub url: &'a str,
    /// The SHA-256 (hex) of its profiles: members forward only to members of the same digest.
    pub config_digest: &'a str,
    /// The HMAC (hex) of its id, url and digest under the members' secret.
    pub proof: &'a str,
}

impl PgStores {
    /// Writes `beat`, a member's heartbeat, and answers the members of its configuration digest
    /// seen within `expiry_ms`, itself among them, ordered by id.
    ///
    /// # Errors
    /// The database's failure, as every statement's.
    pub async fn instance_seen(
        &self,
        beat: &Heartbeat<'_>,
        expiry_ms: u64,
    ) -> StoreResult<Vec<Instance>> {
        let expiry = i64::try_from(expiry_ms).unwrap_or(i64::MAX);
        self.bounded(async move {
            let rows = sqlx::query(SEEN)
                .bind(beat.id)
                .bind(beat.url)
                .bind(expiry)
                .bind(beat.config_digest)
                .bind(beat.proof)
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
                "SELECT id, url, proof FROM instances \
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
        proof: row.try_get("proof").store_err()?,
    })
}
