//! API keys in memory (the [`ApiKeyStore`] half of [`MemoryStores`]).

use super::MemoryStores;
use crate::error::{StoreError, StoreResult};
use crate::rows::{ApiKeyRecord, KeyDigest};
use crate::traits::ApiKeyStore;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::hash_map::Entry;
use tollgate_core::ids::Scope;

#[async_trait]
impl ApiKeyStore for MemoryStores {
    async fn insert_key(&self, key: ApiKeyRecord) -> StoreResult<()> {
        match self.lock()?.api_keys.entry(key.digest) {
            Entry::Occupied(_) => Err(StoreError::Duplicate("api key".into())),
            Entry::Vacant(slot) => {
                slot.insert(key);
                Ok(())
            }
        }
    }

    async fn key_by_digest(&self, digest: &KeyDigest) -> StoreResult<Option<ApiKeyRecord>> {
        Ok(self.lock()?.api_keys.get(digest).cloned())
    }

    async fn list_keys(&self, scope: Option<&Scope>) -> StoreResult<Vec<ApiKeyRecord>> {
        let mut keys: Vec<ApiKeyRecord> = self
            .lock()?
            .api_keys
            .values()
            .filter(|k| scope.is_none_or(|s| &k.scope == s))
            .cloned()
            .collect();
        keys.sort_by(|a, b| {
            (a.created_at, a.digest.to_hex()).cmp(&(b.created_at, b.digest.to_hex()))
        });
        Ok(keys)
    }

    async fn revoke_key(
        &self,
        scope: Option<&Scope>,
        digest: &KeyDigest,
        at: DateTime<Utc>,
    ) -> StoreResult<Option<ApiKeyRecord>> {
        let mut state = self.lock()?;
        let Some(key) = state
            .api_keys
            .get_mut(digest)
            .filter(|k| scope.is_none_or(|s| &k.scope == s))
        else {
            return Ok(None);
        };
        key.revoked_at.get_or_insert(at);
        Ok(Some(key.clone()))
    }

    async fn touch_key(&self, digest: &KeyDigest, at: DateTime<Utc>) -> StoreResult<()> {
        if let Some(key) = self.lock()?.api_keys.get_mut(digest) {
            key.last_used_at = Some(key.last_used_at.map_or(at, |t| t.max(at)));
        }
        Ok(())
    }
}
