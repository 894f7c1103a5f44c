//! API keys in memory (the [`ApiKeyStore`] half of [`MemoryStores`]).

use super::MemoryStores;
use crate::error::{StoreError, StoreResult};
use crate::rows::{ApiKeyRecord, KeyDigest};
use crate::traits::ApiKeyStore;
use async_trait::async_trait;
use std::collections::hash_map::Entry;

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
}
