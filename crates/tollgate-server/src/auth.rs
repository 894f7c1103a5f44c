//! API keys: `Authorization: Bearer <key>`. Keys are kept as SHA-256 hex only; a key maps to a
//! scope and a role. The scope always comes from the key (SC-10): request bodies never name one.
//!
//! Keys come from `[[keys]]` in the configuration, from an in-memory set (the embedded
//! default's generated keys), and on Postgres from the `api_keys` table.

use crate::config::KeyGrant;
use crate::error::ApiError;
use crate::secret::Secret;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::RwLock;
use tollgate_core::ids::Scope;
use tollgate_store::StoreError;

/// Longest bearer key accepted, in bytes (anything longer is not ours).
pub const KEY_LEN_MAX_BYTES: usize = 256;
/// Prefix of generated keys.
pub const KEY_PREFIX: &str = "tg_";

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Runs calls and roots, reads them.
    Caller,
    /// Reads, recovers, reconciles and resolves (spec/service.md — Auth and roles).
    Operator,
    /// Reads profiles; settlements are read from the finance view.
    Finance,
}

impl Role {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Caller => "caller",
            Self::Operator => "operator",
            Self::Finance => "finance",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "caller" => Ok(Self::Caller),
            "operator" => Ok(Self::Operator),
            "finance" => Ok(Self::Finance),
            other => Err(format!("role {other:?} is not caller, operator or finance")),
        }
    }
}

/// The authenticated principal of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key's scope: the only scope this request can read or touch.
    pub scope: Scope,
    /// The key's role.
    pub role: Role,
}

impl Principal {
    /// Passes when the role is one of `roles`.
    ///
    /// # Errors
    /// [`ApiError::Forbidden`].
    pub fn require(&self, roles: &[Role]) -> Result<(), ApiError> {
        if roles.contains(&self.role) {
            Ok(())
        } else {
            Err(ApiError::Forbidden)
        }
    }
}

/// SHA-256 of a key, lower-case hex: the only form in which keys are stored.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A new random key: the prefix and two v4 UUIDs in hex (244 random bits).
pub fn generate_key() -> Secret {
    Secret::new(format!(
        "{KEY_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    ))
}

/// Every key source.
#[derive(Debug, Default)]
pub struct KeyStore {
    local: RwLock<HashMap<String, Principal>>,
    pool: Option<PgPool>,
}

impl KeyStore {
    /// The static grants, plus the `api_keys` table when `pool` is given.
    pub fn new(grants: &[KeyGrant], pool: Option<PgPool>) -> Self {
        let local = grants
            .iter()
            .map(|g| {
                let principal = Principal {
                    scope: g.scope.clone(),
                    role: g.role,
                };
                (g.sha256.clone(), principal)
            })
            .collect();
        Self {
            local: RwLock::new(local),
            pool,
        }
    }

    /// Adds a key to the in-memory set (the embedded default's generated keys, tests).
    pub fn insert(&self, key: &Secret, principal: Principal) {
        let mut local = self.local.write().unwrap_or_else(|p| p.into_inner());
        local.insert(hash_key(key.expose()), principal);
    }

    /// Whether no static or in-memory key exists.
    pub fn is_empty(&self) -> bool {
        self.local
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Scopes of the static and in-memory keys (the scheduler's scopes on the in-memory stores).
    pub fn known_scopes(&self) -> BTreeSet<Scope> {
        let local = self.local.read().unwrap_or_else(|p| p.into_inner());
        local.values().map(|p| p.scope.clone()).collect()
    }

    /// The principal of an `Authorization` header value.
    ///
    /// # Errors
    /// `unauthenticated` for no, malformed or unknown keys; `unavailable` when the key table
    /// cannot be read.
    pub async fn authenticate(&self, header: Option<&str>) -> Result<Principal, ApiError> {
        let key = header.and_then(bearer).ok_or(ApiError::Unauthenticated)?;
        let hash = hash_key(key);
        let known = {
            let local = self.local.read().unwrap_or_else(|p| p.into_inner());
            local.get(&hash).cloned()
        };
        if let Some(principal) = known {
            return Ok(principal);
        }
        let Some(pool) = &self.pool else {
            return Err(ApiError::Unauthenticated);
        };
        lookup(pool, &hash)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "api key lookup failed");
                ApiError::Unavailable {
                    operation_key: None,
                }
            })?
            .ok_or(ApiError::Unauthenticated)
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

fn db(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(match e {
        sqlx::Error::Database(d) => format!("database error {}", d.code().unwrap_or_default()),
        other => other.to_string(),
    })
}

async fn lookup(pool: &PgPool, hash: &str) -> Result<Option<Principal>, StoreError> {
    let row: Option<(String, String)> =
        sqlx::query_as("SELECT scope, role FROM api_keys WHERE sha256 = $1")
            .bind(hash)
            .fetch_optional(pool)
            .await
            .map_err(db)?;
    row.map(|(scope, role)| {
        Ok(Principal {
            scope: Scope::parse(scope).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            role: role.parse().map_err(StoreError::Corrupt)?,
        })
    })
    .transpose()
}

/// Generates a key for `scope` and `role` and stores only its hash in `api_keys`. The key is
/// returned once; it cannot be read back.
///
/// # Errors
/// Store failure.
pub async fn create_key(pool: &PgPool, scope: &Scope, role: Role) -> Result<Secret, StoreError> {
    let key = generate_key();
    sqlx::query(
        "INSERT INTO api_keys (sha256, scope, role, created_at) VALUES ($1, $2, $3, now())",
    )
    .bind(hash_key(key.expose()))
    .bind(scope.as_str())
    .bind(role.as_str())
    .execute(pool)
    .await
    .map_err(db)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_long_and_hashed() {
        let a = generate_key();
        let b = generate_key();
        assert_ne!(a, b);
        assert!(a.expose().len() >= KEY_PREFIX.len() + 64);
        assert_eq!(hash_key("abc").len(), 64);
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[tokio::test]
    async fn sc_10_the_scope_comes_from_the_key() {
        let keys = KeyStore::default();
        let key = generate_key();
        let principal = Principal {
            scope: Scope::parse("acme").unwrap(),
            role: Role::Caller,
        };
        keys.insert(&key, principal.clone());
        let header = format!("Bearer {}", key.expose());
        assert_eq!(keys.authenticate(Some(&header)).await.unwrap(), principal);
        for bad in [None, Some("Bearer"), Some("Basic abc"), Some("Bearer nope")] {
            assert!(matches!(
                keys.authenticate(bad).await,
                Err(ApiError::Unauthenticated)
            ));
        }
    }
}
