//! API keys of the HTTP service ([`ApiKeyStore`]): one row per key, its SHA-256 the primary key.
//! The key itself never reaches the database.

use crate::error::{db, is_unique_violation, DbResultExt};
use crate::rows::{api_key_columns, ApiKeyRow};
use crate::PgStores;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tollgate_core::ids::Scope;
use tollgate_store::rows::{ApiKeyRecord, KeyDigest};
use tollgate_store::traits::ApiKeyStore;
use tollgate_store::{StoreError, StoreResult};

/// The constraint that keeps one row per key.
const ONE_ROW_PER_KEY: &str = "api_keys_pkey";

const INSERT: &str = concat!(
    "INSERT INTO api_keys (",
    api_key_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
);

const LIST: &str = concat!(
    "SELECT ",
    api_key_columns!(),
    " FROM api_keys WHERE ($1::text IS NULL OR scope = $1) ORDER BY created_at, sha256"
);

const REVOKE: &str = concat!(
    "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $3) ",
    "WHERE sha256 = $1 AND ($2::text IS NULL OR scope = $2) RETURNING ",
    api_key_columns!()
);

pub(crate) const TOUCH: &str = "UPDATE api_keys SET last_used_at = GREATEST(last_used_at, $2) \
     WHERE sha256 = $1 AND (last_used_at IS NULL OR last_used_at < $2)";

pub(crate) const BY_DIGEST: &str = concat!(
    "SELECT ",
    api_key_columns!(),
    " FROM api_keys WHERE sha256 = $1"
);

#[async_trait]
impl ApiKeyStore for PgStores {
    async fn insert_key(&self, key: ApiKeyRecord) -> StoreResult<()> {
        self.bounded(async move {
            sqlx::query(INSERT)
                .bind(key.digest.to_hex())
                .bind(key.scope.as_str())
                .bind(key.role.as_str())
                .bind(key.created_at)
                .bind(key.expires_at)
                .bind(key.revoked_at)
                .bind(key.last_used_at)
                .bind((!key.limits.is_empty()).then_some(sqlx::types::Json(key.limits)))
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
        })
        .await
    }

    async fn key_by_digest(&self, digest: &KeyDigest) -> StoreResult<Option<ApiKeyRecord>> {
        self.bounded(async move {
            let row: Option<ApiKeyRow> = sqlx::query_as(BY_DIGEST)
                .bind(digest.to_hex())
                .fetch_optional(self.pool())
                .await
                .store_err()?;
            row.map(ApiKeyRow::into_record).transpose()
        })
        .await
    }

    async fn list_keys(&self, scope: Option<&Scope>) -> StoreResult<Vec<ApiKeyRecord>> {
        self.bounded(async move {
            let rows: Vec<ApiKeyRow> = sqlx::query_as(LIST)
                .bind(scope.map(Scope::as_str))
                .fetch_all(self.pool())
                .await
                .store_err()?;
            rows.into_iter().map(ApiKeyRow::into_record).collect()
        })
        .await
    }

    async fn revoke_key(
        &self,
        scope: Option<&Scope>,
        digest: &KeyDigest,
        at: DateTime<Utc>,
    ) -> StoreResult<Option<ApiKeyRecord>> {
        self.bounded(async move {
            let row: Option<ApiKeyRow> = sqlx::query_as(REVOKE)
                .bind(digest.to_hex())
                .bind(scope.map(Scope::as_str))
                .bind(at)
                .fetch_optional(self.pool())
                .await
                .store_err()?;
            row.map(ApiKeyRow::into_record).transpose()
        })
        .await
    }

    async fn touch_key(&self, digest: &KeyDigest, at: DateTime<Utc>) -> StoreResult<()> {
        self.bounded(async move {
            sqlx::query(TOUCH)
                .bind(digest.to_hex())
                .bind(at)
                .execute(self.pool())
                .await
                .store_err()?;
            Ok(())
        })
        .await
    }
}
