//! API keys: `Authorization: Bearer <key>`. A key is kept as its SHA-256 only ([`KeyDigest`]);
//! it maps to a scope and a role. The scope always comes from the key (SC-10): request bodies
//! never name one.
//!
//! Keys come from `[[keys]]` in the configuration and from the stores' [`ApiKeyStore`]: on
//! Postgres the `api_keys` table, in memory the embedded default's generated keys and any other
//! key created in the process.

use crate::config::KeyGrant;
use crate::error::ApiError;
use crate::secret::Secret;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use tollgate_core::ids::Scope;
use tollgate_store::{ApiKeyRecord, ApiKeyStore, KeyDigest, KeyRole, StoreError};

/// Longest bearer key accepted, in bytes (anything longer is not ours).
pub const KEY_LEN_MAX_BYTES: usize = 256;
/// Prefix of generated keys.
pub const KEY_PREFIX: &str = "tg_";

/// The authenticated principal of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key's scope: the only scope this request can read or touch.
    pub scope: Scope,
    /// The key's role.
    pub role: KeyRole,
}

impl Principal {
    /// Passes when the role is one of `roles`.
    ///
    /// # Errors
    /// [`ApiError::Forbidden`].
    pub fn require(&self, roles: &[KeyRole]) -> Result<(), ApiError> {
        if roles.contains(&self.role) {
            Ok(())
        } else {
            Err(ApiError::Forbidden)
        }
    }
}

/// A new random key: the prefix and two v4 UUIDs in hex (244 random bits).
pub fn generate_key() -> Secret {
    Secret::new(format!(
        "{KEY_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    ))
}

/// Generates a key for `scope` and `role` and stores only its digest in `store`. The key is
/// returned once; it cannot be read back.
///
/// # Errors
/// Store failure.
pub async fn create_key(
    store: &dyn ApiKeyStore,
    scope: &Scope,
    role: KeyRole,
) -> Result<Secret, StoreError> {
    let key = generate_key();
    store
        .insert_key(ApiKeyRecord::new(
            KeyDigest::of_key(key.expose()),
            scope.clone(),
            role,
            chrono::Utc::now(),
        ))
        .await?;
    Ok(key)
}

/// Least time between two `last_used_at` updates of one key by one process, in seconds.
pub const TOUCH_INTERVAL_S: i64 = 60;

/// Every key source: the static grants, then the stores. Stored keys are read on every request
/// (no cache), so a revocation takes effect on the next request (SC-140).
pub struct KeyStore {
    grants: HashMap<KeyDigest, Principal>,
    store: Arc<dyn ApiKeyStore>,
    touched: std::sync::Mutex<HashMap<KeyDigest, chrono::DateTime<chrono::Utc>>>,
}

impl fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyStore")
            .field("grants", &self.grants.len())
            .finish_non_exhaustive()
    }
}

impl KeyStore {
    /// The static grants, then the keys of `store`.
    pub fn new(grants: &[KeyGrant], store: Arc<dyn ApiKeyStore>) -> Self {
        let grants = grants
            .iter()
            .map(|g| {
                let principal = Principal {
                    scope: g.scope.clone(),
                    role: g.role,
                };
                (g.digest, principal)
            })
            .collect();
        Self {
            grants,
            store,
            touched: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The stored keys.
    pub fn store(&self) -> &Arc<dyn ApiKeyStore> {
        &self.store
    }

    /// Records a use of `digest` at most once per [`TOUCH_INTERVAL_S`]; a failure is logged and
    /// never fails the request.
    async fn touch(&self, digest: &KeyDigest, now: chrono::DateTime<chrono::Utc>) {
        let due = {
            let Ok(mut touched) = self.touched.lock() else {
                return;
            };
            let due = touched
                .get(digest)
                .is_none_or(|at| (now - *at).num_seconds() >= TOUCH_INTERVAL_S);
            if due {
                touched.insert(*digest, now);
            }
            due
        };
        if due {
            if let Err(e) = self.store.touch_key(digest, now).await {
                tracing::warn!(error = %e, "api key last-use update failed");
            }
        }
    }

    /// The static grants (`[[keys]]`) of `scope` (all when `None`), by id.
    pub fn grants(&self, scope: Option<&Scope>) -> Vec<(KeyDigest, Principal)> {
        let mut grants: Vec<_> = self
            .grants
            .iter()
            .filter(|(_, p)| scope.is_none_or(|s| p.scope == *s))
            .map(|(d, p)| (*d, p.clone()))
            .collect();
        grants.sort_by_key(|(d, _)| d.to_hex());
        grants
    }

    /// Whether any static key is configured.
    pub fn has_grants(&self) -> bool {
        !self.grants.is_empty()
    }

    /// Generates a key for `scope` and `role` in the stores (see [`create_key`]).
    ///
    /// # Errors
    /// Store failure.
    pub async fn create(&self, scope: &Scope, role: KeyRole) -> Result<Secret, StoreError> {
        create_key(&*self.store, scope, role).await
    }

    /// The principal of an `Authorization` header value.
    ///
    /// # Errors
    /// `unauthenticated` for no, malformed or unknown keys; `unavailable` when the stored keys
    /// cannot be read.
    pub async fn authenticate(&self, header: Option<&str>) -> Result<Principal, ApiError> {
        let key = header.and_then(bearer).ok_or(ApiError::Unauthenticated)?;
        let digest = KeyDigest::of_key(key);
        if let Some(principal) = self.grants.get(&digest) {
            return Ok(principal.clone());
        }
        let stored = self.store.key_by_digest(&digest).await.map_err(|e| {
            tracing::warn!(error = %e, "api key lookup failed");
            ApiError::Unavailable {
                operation_key: None,
            }
        })?;
        let record = stored.ok_or(ApiError::Unauthenticated)?;
        let now = chrono::Utc::now();
        if !record.usable_at(now) {
            return Err(ApiError::Unauthenticated);
        }
        self.touch(&digest, now).await;
        Ok(Principal {
            scope: record.scope,
            role: record.role,
        })
    }
}

fn bearer(header: &str) -> Option<&str> {
    let (scheme, key) = header.trim().split_once(' ')?;
    let key = key.trim();
    let ok = scheme.eq_ignore_ascii_case("bearer")
        && !key.is_empty()
        && key.len() <= KEY_LEN_MAX_BYTES
        && key.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_store::fault::{FaultPoint, FaultyStores};
    use tollgate_store::MemoryStores;

    fn memory_keys(grants: &[KeyGrant]) -> KeyStore {
        KeyStore::new(grants, Arc::new(MemoryStores::new()))
    }

    #[test]
    fn keys_are_random_long_and_hashed() {
        let a = generate_key();
        let b = generate_key();
        assert_ne!(a, b);
        assert!(a.expose().len() >= KEY_PREFIX.len() + 64);
        let digest = KeyDigest::of_key(a.expose());
        assert_eq!(digest.to_hex().len(), 64);
        assert!(!digest.to_hex().contains(a.expose()));
    }

    #[tokio::test]
    async fn sc_10_the_scope_comes_from_the_key() {
        let keys = memory_keys(&[]);
        let scope = Scope::parse("acme").unwrap();
        let key = keys.create(&scope, KeyRole::Caller).await.unwrap();
        let header = format!("Bearer {}", key.expose());
        let principal = Principal {
            scope,
            role: KeyRole::Caller,
        };
        assert_eq!(keys.authenticate(Some(&header)).await.unwrap(), principal);
        for bad in [None, Some("Bearer"), Some("Basic abc"), Some("Bearer nope")] {
            assert!(matches!(
                keys.authenticate(bad).await,
                Err(ApiError::Unauthenticated)
            ));
        }
    }

    #[tokio::test]
    async fn static_grants_come_first_and_a_failed_lookup_is_unavailable() {
        let faulty = Arc::new(FaultyStores::with_service(Arc::new(MemoryStores::new())));
        let grant = KeyGrant {
            digest: KeyDigest::of_key("tg_static"),
            scope: Scope::parse("acme").unwrap(),
            role: KeyRole::Operator,
        };
        let keys = KeyStore::new(std::slice::from_ref(&grant), faulty.clone());
        assert!(keys.has_grants());
        faulty.arm(FaultPoint::KeyLookup);
        let principal = keys.authenticate(Some("Bearer tg_static")).await.unwrap();
        assert_eq!(principal.role, KeyRole::Operator);
        assert!(matches!(
            keys.authenticate(Some("Bearer tg_other")).await,
            Err(ApiError::Unavailable {
                operation_key: None
            })
        ));
        faulty.disarm(FaultPoint::KeyLookup);
        assert!(matches!(
            keys.authenticate(Some("Bearer tg_other")).await,
            Err(ApiError::Unauthenticated)
        ));
    }
}
