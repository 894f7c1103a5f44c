//! API keys of the HTTP service ([`ApiKeyStore`]): one row per key, its SHA-256 the primary key.
//! The key itself never reaches the database.

use crate::error::{db, is_unique_violation, DbResultExt};
use crate::rows::{api_key_columns, ApiKeyRow};
use crate::PgStores;
use async_trait::async_trait;
use tollgate_store::rows::{ApiKeyRecord, KeyDigest};
use tollgate_store::traits::ApiKeyStore;
use tollgate_store::{StoreError, StoreResult};

/// The constraint that keeps one row per key.
const ONE_ROW_PER_KEY: &str = "api_keys_pkey";

const INSERT: &str = concat!(
    "INSERT INTO api_keys (",
    api_key_columns!(),
    ") VALUES ($1, $2, $3, $4)"
);

const BY_DIGEST: &str = concat!(
    "SELECT ",
    api_key_columns!(),
    " FROM api_keys WHERE sha256 = $1"
);

#[async_trait]
impl ApiKeyStore for PgStores {
    async fn insert_key(&self, key: ApiKeyRecord) -> StoreResult<()> {
        sqlx::query(INSERT)
            .bind(key.digest.to_hex())
            .bind(key.scope.as_str())
            .bind(key.role.as_str())
            .bind(key.created_at)
            .execute(self.pool())
            .await
            .map_err(|e| {
                if is_unique_violation(&e, Some(ONE_ROW_PER_KEY)) {
                    StoreError::Duplicate("api key".into())
                } else {
                    db(e)
                }
            })?;
        Ok(())
    }

    async fn key_by_digest(&self, digest: &KeyDigest) -> StoreResult<Option<ApiKeyRecord>> {
        let row: Option<ApiKeyRow> = sqlx::query_as(BY_DIGEST)
            .bind(digest.to_hex())
            .fetch_optional(self.pool())
            .await
            .store_err()?;
        row.map(ApiKeyRow::into_record).transpose()
    }
}
