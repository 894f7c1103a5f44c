//! API keys: `Authorization: Bearer <key>` (on the Anthropic Messages door also `x-api-key:
//! <key>`, [`API_KEY_HEADER`]). A key is kept as its SHA-256 only ([`KeyDigest`]);
//! it maps to a scope and a role. The scope always comes from the key (SC-10): request bodies
//! never name one.
//!
//! Keys come from `[[keys]]` in the configuration and from the stores' [`ApiKeyStore`]: on
//! Postgres the `api_keys` table, in memory the embedded default's generated keys and any other
//! key created in the process.

use crate::config::{KeyGrant, KEY_CACHE_MS_DEFAULT};
use crate::error::ApiError;
use crate::secret::Secret;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tollgate_core::ids::Scope;
use tollgate_core::limits::{LimitCharge, LimitSubject, RateLimits};
use tollgate_store::{ApiKeyRecord, ApiKeyStore, KeyDigest, KeyRole, StoreError};

/// Longest bearer key accepted, in bytes (anything longer is not ours).
pub const KEY_LEN_MAX_BYTES: usize = 256;
/// Prefix of generated keys.
pub const KEY_PREFIX: &str = "tg_";
/// The header Anthropic's clients may send the bare key in, taken on the Anthropic Messages
/// door's paths only (`crate::gate`); every other route reads `Authorization: Bearer` alone.
pub const API_KEY_HEADER: &str = "x-api-key";

/// The authenticated principal of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key's scope: the only scope this request can read or touch.
    pub scope: Scope,
    /// The key's role.
    pub role: KeyRole,
    /// The key's digest, which names it as a limit subject.
    pub key: KeyDigest,
    /// The key's rate and concurrency limits (SC-220); empty: none.
    pub limits: RateLimits,
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

    /// The limits of calls made with this key, beside the profile consumer's: none when the
    /// key has none.
    pub fn limit_charges(&self) -> Vec<LimitCharge> {
        if self.limits.is_empty() {
            return Vec::new();
        }
        vec![LimitCharge {
            subject: LimitSubject::Key(self.key.to_hex()),
            limits: self.limits,
        }]
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

/// Most unknown digests remembered at once (negative entries, SC-177).
pub const UNKNOWN_KEYS_CACHED_MAX: usize = 10_000;
/// Most stored keys remembered at once.
pub const STORED_KEYS_CACHED_MAX: usize = 100_000;

/// How many digests the cache holds (for tests and diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSizes {
    /// Stored keys (usable or not) as last read.
    pub stored: usize,
    /// Digests the store did not know (negative entries).
    pub unknown: usize,
}

/// A stored key as last read from the store.
#[derive(Debug, Clone)]
struct Cached {
    principal: Principal,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    revoked: bool,
    /// When the store read that produced this entry began.
    read_at: Instant,
    /// The last `last_used_at` update this process made (the touch throttle).
    touched_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Cached {
    fn usable_at(&self, now: chrono::DateTime<chrono::Utc>) -> bool {
        !self.revoked && self.expires_at.is_none_or(|at| now < at)
    }

    /// Whether a `last_used_at` update is due at `now`; when it is, records it.
    fn touch_due(&mut self, now: chrono::DateTime<chrono::Utc>) -> bool {
        let due = self
            .touched_at
            .is_none_or(|at| (now - at).num_seconds() >= TOUCH_INTERVAL_S);
        if due {
            self.touched_at = Some(now);
        }
        due
    }
}

/// What the cache answers for a digest.
enum Lookup {
    /// A fresh, usable entry; `touch`: a `last_used_at` update is due.
    Usable { principal: Principal, touch: bool },
    /// A fresh entry of a key that is unknown, revoked or expired.
    Refused,
    /// Nothing fresh: read the store. `generation` is the cache's revocation count now.
    Read { generation: u64 },
}

/// The cache of stored keys: one lock, taken once on a fresh hit and twice on a read (before
/// and after it), never across an await.
#[derive(Debug, Default)]
struct Cache {
    stored: HashMap<KeyDigest, Cached>,
    unknown: HashMap<KeyDigest, Instant>,
    /// Counts the entries dropped by a revocation through this process: a store read that
    /// began before one is not kept.
    generation: u64,
}

impl Cache {
    fn lookup(
        &mut self,
        digest: &KeyDigest,
        at: Instant,
        ttl: Duration,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Lookup {
        let fresh = |read_at: Instant| at.saturating_duration_since(read_at) < ttl;
        if let Some(entry) = self.stored.get_mut(digest) {
            if fresh(entry.read_at) {
                if !entry.usable_at(now) {
                    return Lookup::Refused;
                }
                let touch = entry.touch_due(now);
                return Lookup::Usable {
                    principal: entry.principal.clone(),
                    touch,
                };
            }
        } else if self
            .unknown
            .get(digest)
            .is_some_and(|read_at| fresh(*read_at))
        {
            return Lookup::Refused;
        }
        Lookup::Read {
            generation: self.generation,
        }
    }

    /// Drops every entry of `digest` and makes store reads in flight forgettable.
    fn forget(&mut self, digest: &KeyDigest) {
        self.stored.remove(digest);
        self.unknown.remove(digest);
        self.generation = self.generation.wrapping_add(1);
    }
}

/// Inserts into a map of at most `max` entries: when full, drops the stale entries first and,
/// when more than half remain, all of them (so a full map costs one pass per `max / 2`
/// inserts, never one per insert).
fn insert_bounded<V>(
    map: &mut HashMap<KeyDigest, V>,
    digest: KeyDigest,
    value: V,
    max: usize,
    stale: impl Fn(&V) -> bool,
) {
    if map.len() >= max && !map.contains_key(&digest) {
        map.retain(|_, v| !stale(v));
        if map.len() > max / 2 {
            map.clear();
        }
    }
    map.insert(digest, value);
}

/// Every key source: the static grants, then the stores. A stored key, once read, is kept in
/// memory for at most the cache bound (`[server] key_cache_ms`) from the start of that read;
/// a digest the store does not know is remembered as unknown for the same bound. Expiry is
/// checked against the cached record on every request. A revocation through this process drops
/// the entry at once; one made elsewhere takes effect within the bound (SC-140, SC-176..SC-180).
pub struct KeyStore {
    grants: HashMap<KeyDigest, Principal>,
    store: Arc<dyn ApiKeyStore>,
    ttl: Duration,
    cache: Mutex<Cache>,
    lookups: tokio::sync::Semaphore,
}

/// Store reads of keys in flight at once: a key not in memory is read from the store before
/// any permit of the concurrency limit is taken, so this bounds what unauthenticated requests
/// can ask of the database. A request beyond it waits up to [`KEY_LOOKUP_WAIT_MS`] for a read to
/// finish (the key it needs may be read meanwhile by another request), then is answered 503.
pub const KEY_LOOKUPS_IN_FLIGHT_MAX: usize = 64;
/// Longest a request waits for one of the [`KEY_LOOKUPS_IN_FLIGHT_MAX`] reads, in milliseconds.
pub const KEY_LOOKUP_WAIT_MS: u64 = 5_000;

/// Whether `key` has the form of a generated key ([`generate_key`]): the prefix and 64
/// lower-case hex digits. Stored keys are only ever generated, so a token of any other form
/// is refused without a store read.
pub fn has_generated_form(key: &str) -> bool {
    key.strip_prefix(KEY_PREFIX).is_some_and(|rest| {
        rest.len() == 64 && rest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

impl fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyStore")
            .field("grants", &self.grants.len())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl KeyStore {
    /// The static grants, then the keys of `store`, cached for the default bound
    /// ([`KEY_CACHE_MS_DEFAULT`]; see [`KeyStore::with_cache_ms`]).
    pub fn new(grants: &[KeyGrant], store: Arc<dyn ApiKeyStore>) -> Self {
        let grants = grants
            .iter()
            .map(|g| {
                let principal = Principal {
                    scope: g.scope.clone(),
                    role: g.role,
                    key: g.digest,
                    limits: g.limits,
                };
                (g.digest, principal)
            })
            .collect();
        Self {
            grants,
            store,
            ttl: Duration::from_millis(KEY_CACHE_MS_DEFAULT),
            cache: Mutex::new(Cache::default()),
            lookups: tokio::sync::Semaphore::new(KEY_LOOKUPS_IN_FLIGHT_MAX),
        }
    }

    /// Keeps stored keys in memory for at most `ms` milliseconds from their read; 0 reads the
    /// store on every request.
    #[must_use]
    pub fn with_cache_ms(mut self, ms: u64) -> Self {
        self.ttl = Duration::from_millis(ms);
        self
    }

    /// The cache bound.
    pub fn cache_bound(&self) -> Duration {
        self.ttl
    }

    /// How many digests the cache holds now.
    pub fn cache_sizes(&self) -> CacheSizes {
        let cache = self.lock();
        CacheSizes {
            stored: cache.stored.len(),
            unknown: cache.unknown.len(),
        }
    }

    /// The stored keys. Reads through it bypass the cache; revoke through
    /// [`KeyStore::revoke`] so that this process refuses the key at once.
    pub fn store(&self) -> &Arc<dyn ApiKeyStore> {
        &self.store
    }

    /// The cache; a poisoned lock still holds a consistent map (nothing panics while holding
    /// it), so it is used as it is.
    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a use of `digest`; a failure is logged and never fails the request.
    /// The answer the cache holds for `digest` at `at`, if it holds a fresh one: the principal
    /// of a usable key (its `last_used_at` touched when due), or `unauthenticated`.
    async fn cached(
        &self,
        digest: &KeyDigest,
        at: Instant,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<Result<Principal, ApiError>> {
        let lookup = self.lock().lookup(digest, at, self.ttl, now);
        match lookup {
            Lookup::Usable { principal, touch } => {
                if touch {
                    self.touch(digest, now).await;
                }
                Some(Ok(principal))
            }
            Lookup::Refused => Some(Err(ApiError::Unauthenticated)),
            Lookup::Read { .. } => None,
        }
    }

    async fn touch(&self, digest: &KeyDigest, now: chrono::DateTime<chrono::Utc>) {
        if let Err(e) = self.store.touch_key(digest, now).await {
            tracing::warn!(error = %e, "api key last-use update failed");
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

    /// Generates a key for `scope` and `role` in the stores (see [`create_key`]); an entry of
    /// its digest is dropped from the cache.
    ///
    /// # Errors
    /// Store failure.
    pub async fn create(&self, scope: &Scope, role: KeyRole) -> Result<Secret, StoreError> {
        let key = create_key(&*self.store, scope, role).await?;
        self.lock().forget(&KeyDigest::of_key(key.expose()));
        Ok(key)
    }

    /// Revokes the stored key `digest` at `at` (of `scope` only, when given; see
    /// [`ApiKeyStore::revoke_key`]) and drops it from the cache: this process refuses it from
    /// the next request on (SC-179).
    ///
    /// # Errors
    /// Store failure.
    pub async fn revoke(
        &self,
        scope: Option<&Scope>,
        digest: &KeyDigest,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        let revoked = self.store.revoke_key(scope, digest, at).await;
        // Forget the cached entry only when the key may now be revoked: a revocation that found
        // no such key of this scope leaves the cache (and other scopes' entries) as they were.
        if !matches!(revoked, Ok(None)) {
            self.lock().forget(digest);
        }
        revoked
    }

    /// The principal of an `Authorization` header value.
    ///
    /// # Errors
    /// `unauthenticated` for no, malformed, unknown, revoked or expired keys; `unavailable`
    /// when the stored keys cannot be read.
    pub async fn authenticate(&self, header: Option<&str>) -> Result<Principal, ApiError> {
        self.authenticate_either(header, None).await
    }

    /// The principal of a request's key, from its `Authorization: Bearer` header value or, where
    /// the route takes it (the Anthropic Messages door), the bare key of its `x-api-key` header
    /// ([`API_KEY_HEADER`]). When both are sent they must hold the same key.
    ///
    /// # Errors
    /// As [`KeyStore::authenticate`]; also `unauthenticated` for a malformed header of either
    /// kind and for two headers holding different keys.
    pub async fn authenticate_either(
        &self,
        authorization: Option<&str>,
        api_key: Option<&str>,
    ) -> Result<Principal, ApiError> {
        let bearer_key = authorization.map(bearer);
        let plain_key = api_key.map(plain);
        let key = match (bearer_key, plain_key) {
            (Some(Some(a)), Some(Some(b))) if a != b => None,
            (Some(Some(key)), None | Some(Some(_))) | (None, Some(Some(key))) => Some(key),
            _ => None,
        };
        self.authenticate_key(key.ok_or(ApiError::Unauthenticated)?)
            .await
    }

    async fn authenticate_key(&self, key: &str) -> Result<Principal, ApiError> {
        let digest = KeyDigest::of_key(key);
        if let Some(principal) = self.grants.get(&digest) {
            return Ok(principal.clone());
        }
        if !has_generated_form(key) {
            return Err(ApiError::Unauthenticated);
        }
        let now = chrono::Utc::now();
        if let Some(cached) = self.cached(&digest, Instant::now(), now).await {
            return cached;
        }
        // A burst of requests with one key not yet in memory waits for a few reads, not one
        // each: once a read is done, the waiting requests find the key in memory.
        let wait = Duration::from_millis(KEY_LOOKUP_WAIT_MS);
        let Ok(Ok(_lookup)) = tokio::time::timeout(wait, self.lookups.acquire()).await else {
            tracing::warn!("over the key lookups in flight");
            return Err(ApiError::Overloaded);
        };
        let started = Instant::now();
        let lookup = self.lock().lookup(&digest, started, self.ttl, now);
        let generation = match lookup {
            Lookup::Read { generation } => generation,
            _ => {
                // Read by another request while this one waited.
                return self
                    .cached(&digest, started, now)
                    .await
                    .unwrap_or(Err(ApiError::Unauthenticated));
            }
        };
        let stored = self.store.key_by_digest(&digest).await.map_err(|e| {
            tracing::warn!(error = %e, "api key lookup failed");
            ApiError::Unavailable {
                operation_key: None,
            }
        })?;
        let ttl = self.ttl;
        let read = Instant::now();
        let stale = |read_at: Instant| read.saturating_duration_since(read_at) >= ttl;
        let Some(record) = stored else {
            let mut cache = self.lock();
            cache.stored.remove(&digest);
            if !ttl.is_zero() && cache.generation == generation {
                insert_bounded(
                    &mut cache.unknown,
                    digest,
                    started,
                    UNKNOWN_KEYS_CACHED_MAX,
                    |read_at| stale(*read_at),
                );
            }
            return Err(ApiError::Unauthenticated);
        };
        let mut entry = Cached {
            principal: Principal {
                scope: record.scope,
                role: record.role,
                key: record.digest,
                limits: record.limits,
            },
            expires_at: record.expires_at,
            revoked: record.revoked_at.is_some(),
            read_at: started,
            touched_at: None,
        };
        let usable = entry.usable_at(now);
        let principal = entry.principal.clone();
        let touch = {
            let mut cache = self.lock();
            cache.unknown.remove(&digest);
            if cache.generation == generation {
                entry.touched_at = cache.stored.get(&digest).and_then(|c| c.touched_at);
                let touch = usable && entry.touch_due(now);
                insert_bounded(
                    &mut cache.stored,
                    digest,
                    entry,
                    STORED_KEYS_CACHED_MAX,
                    |c| stale(c.read_at),
                );
                touch
            } else {
                // A revocation through this process ran during the read: answer this request
                // from what was read, keep nothing of it.
                usable
                    && cache
                        .stored
                        .get_mut(&digest)
                        .is_none_or(|c| c.touch_due(now))
            }
        };
        if !usable {
            return Err(ApiError::Unauthenticated);
        }
        if touch {
            self.touch(&digest, now).await;
        }
        Ok(principal)
    }
}

fn bearer(header: &str) -> Option<&str> {
    let (scheme, key) = header.trim().split_once(' ')?;
    plain(key).filter(|_| scheme.eq_ignore_ascii_case("bearer"))
}

/// A bare key (an `x-api-key` value, or what follows `Bearer`): visible ASCII, at most
/// [`KEY_LEN_MAX_BYTES`].
fn plain(key: &str) -> Option<&str> {
    let key = key.trim();
    let ok = !key.is_empty()
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
            key: KeyDigest::of_key(key.expose()),
            limits: RateLimits::default(),
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
    async fn sc_212_the_key_may_come_in_x_api_key_and_two_different_keys_are_refused() {
        let keys = memory_keys(&[]);
        let scope = Scope::parse("acme").unwrap();
        let key = keys.create(&scope, KeyRole::Caller).await.unwrap();
        let other = keys.create(&scope, KeyRole::Caller).await.unwrap();
        let bearer = format!("Bearer {}", key.expose());
        let plain = Some(key.expose());
        let ok = |r: Result<Principal, ApiError>| r.is_ok_and(|p| p.scope == scope);
        assert!(ok(keys.authenticate_either(None, plain).await));
        assert!(ok(keys.authenticate_either(Some(&bearer), plain).await));
        assert!(ok(keys.authenticate_either(Some(&bearer), None).await));
        for (authorization, api_key) in [
            (Some(bearer.as_str()), Some(other.expose())),
            (Some("Basic abc"), plain),
            (None, Some("")),
            (None, Some("tg_nope")),
            (None, None),
        ] {
            assert!(matches!(
                keys.authenticate_either(authorization, api_key).await,
                Err(ApiError::Unauthenticated)
            ));
        }
    }

    #[test]
    fn sc_177_a_full_cache_drops_stale_entries_first_then_all() {
        let digest = |i: u32| KeyDigest::of_key(&format!("tg_{i}"));
        let mut map: HashMap<KeyDigest, bool> = HashMap::new();
        // Entries are `true` when stale.
        for i in 0..4 {
            insert_bounded(&mut map, digest(i), i < 3, 4, |stale| *stale);
        }
        assert_eq!(map.len(), 4);
        // Full: the three stale entries go, the fresh one stays.
        insert_bounded(&mut map, digest(4), false, 4, |stale| *stale);
        assert_eq!(map.len(), 2);
        assert!(map.contains_key(&digest(3)) && map.contains_key(&digest(4)));
        // Replacing a present entry never evicts.
        insert_bounded(&mut map, digest(4), false, 2, |stale| *stale);
        assert_eq!(map.len(), 2);
        // Full of fresh entries: all go.
        insert_bounded(&mut map, digest(5), false, 2, |stale| *stale);
        assert_eq!(map.len(), 1);
        assert!(map.contains_key(&digest(5)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sc_181_a_burst_with_one_new_key_waits_for_its_read_instead_of_503() {
        let faulty = Arc::new(FaultyStores::with_service(Arc::new(MemoryStores::new())));
        let keys = Arc::new(KeyStore::new(&[], faulty.clone()));
        let scope = Scope::parse("acme").unwrap();
        let key = keys.create(&scope, KeyRole::Caller).await.unwrap();
        // Every read is slow: more requests than reads in flight arrive while the first read runs.
        faulty.delay(tollgate_store::fault::StoreOp::KeyByDigest, 300);
        let header = format!("Bearer {}", key.expose());
        let burst: Vec<_> = (0..KEY_LOOKUPS_IN_FLIGHT_MAX * 2)
            .map(|_| {
                let (keys, header) = (keys.clone(), header.clone());
                tokio::spawn(async move { keys.authenticate(Some(&header)).await })
            })
            .collect();
        for request in burst {
            assert_eq!(request.await.unwrap().unwrap().scope, scope);
        }
    }

    #[tokio::test]
    async fn static_grants_come_first_and_a_failed_lookup_is_unavailable() {
        let faulty = Arc::new(FaultyStores::with_service(Arc::new(MemoryStores::new())));
        let grant = KeyGrant {
            digest: KeyDigest::of_key("tg_static"),
            scope: Scope::parse("acme").unwrap(),
            role: KeyRole::Operator,
            limits: RateLimits::default(),
        };
        let keys = KeyStore::new(std::slice::from_ref(&grant), faulty.clone());
        assert!(keys.has_grants());
        faulty.arm(FaultPoint::KeyLookup);
        let principal = keys.authenticate(Some("Bearer tg_static")).await.unwrap();
        assert_eq!(principal.role, KeyRole::Operator);
        let other = format!("Bearer {}", generate_key().expose());
        assert!(matches!(
            keys.authenticate(Some(&other)).await,
            Err(ApiError::Unavailable {
                operation_key: None
            })
        ));
        faulty.disarm(FaultPoint::KeyLookup);
        assert!(matches!(
            keys.authenticate(Some(&other)).await,
            Err(ApiError::Unauthenticated)
        ));
    }

    #[tokio::test]
    async fn sc_183_a_token_that_cannot_be_a_key_is_refused_without_a_store_read() {
        let faulty = Arc::new(FaultyStores::with_service(Arc::new(MemoryStores::new())));
        let keys = KeyStore::new(&[], faulty.clone()).with_cache_ms(0);
        let reads = || {
            faulty
                .calls()
                .get(&tollgate_store::fault::StoreOp::KeyByDigest)
                .copied()
                .unwrap_or(0)
        };
        let generated = generate_key();
        assert!(has_generated_form(generated.expose()));
        for token in [
            "tg_short",
            "sk-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            &format!("{}X", generated.expose()),
            &generated.expose().to_uppercase(),
        ] {
            assert!(!has_generated_form(token), "{token}");
            let refused = keys.authenticate(Some(&format!("Bearer {token}"))).await;
            assert!(matches!(refused, Err(ApiError::Unauthenticated)));
        }
        assert_eq!(reads(), 0, "no store read for a token of the wrong form");
        let unknown = keys
            .authenticate(Some(&format!("Bearer {}", generated.expose())))
            .await;
        assert!(matches!(unknown, Err(ApiError::Unauthenticated)));
        assert_eq!(reads(), 1, "a token of the generated form is read");
    }
}
