//! API keys over HTTP: operators list and revoke the keys of their scope; a key revoked through
//! the server or expired is refused on its next request. The key cache: one store read per key
//! within `[server] key_cache_ms`, unknown keys remembered too (bounded in number), and a
//! revocation made behind the server's back refused within the bound.
#![cfg(test)]

mod support;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::Server;
use tokio::sync::oneshot;
use tollgate_core::ids::Scope;
use tollgate_server::auth::{KeyStore, UNKNOWN_KEYS_CACHED_MAX};
use tollgate_server::config::KEY_CACHE_MS_MAX;
use tollgate_server::error::ApiError;
use tollgate_server::Backend;
use tollgate_store::{ApiKeyRecord, ApiKeyStore, KeyDigest, KeyRole, MemoryStores, StoreResult};

#[tokio::test]
async fn sc_140_operators_list_and_revoke_keys_and_a_revoked_key_is_refused_at_once() {
    let s = Server::memory().await;
    // A use stamps last_used_at.
    let (status, _, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::OK);

    let (status, list, text) = s.get("/v1/admin/keys", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let keys = list["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "own scope only: {list}");
    assert!(keys.iter().all(|k| k["scope"] == "acme"));
    assert!(
        !text.contains(&s.caller) && !text.contains(&s.operator),
        "never the key"
    );
    let caller_id = KeyDigest::of_key(&s.caller).to_hex();
    let caller = keys.iter().find(|k| k["id"] == caller_id.as_str()).unwrap();
    assert_eq!(caller["role"], "caller");
    assert_eq!(caller["revoked"], false);
    assert!(caller["last_used_at"].is_string(), "{caller}");

    // A caller may not list; another scope's key is not found.
    let (status, _, _) = s.get("/v1/admin/keys", &s.caller).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let stranger = KeyDigest::of_key(&s.stranger).to_hex();
    let (status, _, _) = s
        .post(
            &format!("/v1/admin/keys/{stranger}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = s
        .post("/v1/admin/keys/not-an-id/revoke", &s.operator, &Value::Null)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    let (status, revoked, _) = s
        .post(
            &format!("/v1/admin/keys/{caller_id}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert_eq!(revoked["revoked"], true);
    // Revoked through the server: the very next request with the key is refused.
    let (status, body, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _, _) = s.get("/v1/profiles", &s.stranger).await;
    assert_eq!(status, StatusCode::OK, "other keys still work");

    // An expired key is refused too.
    let expired = ApiKeyRecord {
        expires_at: Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
        ..ApiKeyRecord::new(
            KeyDigest::of_key(
                "tg_0000000000000000000000000000000000000000000000000000000000000003",
            ),
            Scope::parse("acme").unwrap(),
            KeyRole::Caller,
            chrono::Utc::now() - chrono::Duration::days(2),
        )
    };
    s.keys.store().insert_key(expired).await.unwrap();
    let (status, _, _) = s
        .get(
            "/v1/profiles",
            "tg_0000000000000000000000000000000000000000000000000000000000000003",
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    s.stop().await;
}

/// SC-161: keys of `[[keys]]` are listed beside the stored ones, marked `config` and not
/// revocable, never as the key; revoking one is a 409 `key_in_config` and the key keeps working.
#[tokio::test]
async fn sc_161_configured_keys_are_listed_and_refuse_revocation() {
    let configured = "tg_configured_operator_key_of_acme";
    let other = "tg_configured_caller_key_of_globex";
    let extra = format!(
        "\n[[keys]]\nscope = \"acme\"\nrole = \"caller\"\nsha256 = \"{}\"\n\
         \n[[keys]]\nscope = \"globex\"\nrole = \"caller\"\nsha256 = \"{}\"\n",
        KeyDigest::of_key(configured).to_hex(),
        KeyDigest::of_key(other).to_hex()
    );
    let s = Server::start_with(Backend::memory(), &extra).await;
    let id = KeyDigest::of_key(configured).to_hex();

    let (status, list, text) = s.get("/v1/admin/keys", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert!(!text.contains(configured), "never the key");
    let keys = list["keys"].as_array().unwrap();
    assert_eq!(
        keys.len(),
        3,
        "two stored and one configured key of acme: {list}"
    );
    let listed = keys.iter().find(|k| k["id"] == id.as_str()).unwrap();
    assert_eq!(listed["source"], "config", "{listed}");
    assert_eq!(listed["revocable"], false);
    assert_eq!(listed["role"], "caller");
    assert_eq!(listed["scope"], "acme");
    assert_eq!(listed["revoked"], false);
    assert!(listed["created_at"].is_null(), "{listed}");
    let stored: Vec<_> = keys.iter().filter(|k| k["source"] == "stored").collect();
    assert_eq!(stored.len(), 2, "{list}");
    assert!(stored
        .iter()
        .all(|k| k["revocable"] == true && k["created_at"].is_string()));

    let (status, body, _) = s
        .post(
            &format!("/v1/admin/keys/{id}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "key_in_config", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("[[keys]]"));
    let (status, _, _) = s.get("/v1/profiles", configured).await;
    assert_eq!(status, StatusCode::OK, "the configured key still works");

    // Another scope's configured key is neither listed nor revocable here: 404.
    let other_id = KeyDigest::of_key(other).to_hex();
    assert!(!text.contains(&other_id));
    let (status, _, _) = s
        .post(
            &format!("/v1/admin/keys/{other_id}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The key cache (`[server] key_cache_ms`)
// ---------------------------------------------------------------------------------------------

/// The stores' keys, counting reads; a read may be held after it has read (to stand for a
/// slow read that a revocation overtakes).
struct Counting {
    inner: MemoryStores,
    reads: AtomicUsize,
    hold: Mutex<Option<Hold>>,
}

/// Holds the next read after it has read: `read` fires once the record is in hand, the read
/// answers once `release` fires.
struct Hold {
    read: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
}

impl Counting {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryStores::new(),
            reads: AtomicUsize::new(0),
            hold: Mutex::new(None),
        })
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl ApiKeyStore for Counting {
    async fn insert_key(&self, key: ApiKeyRecord) -> StoreResult<()> {
        self.inner.insert_key(key).await
    }

    async fn key_by_digest(&self, digest: &KeyDigest) -> StoreResult<Option<ApiKeyRecord>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let record = self.inner.key_by_digest(digest).await;
        let hold = self.hold.lock().unwrap().take();
        if let Some(hold) = hold {
            hold.read.send(()).unwrap();
            hold.release.await.unwrap();
        }
        record
    }

    async fn list_keys(&self, scope: Option<&Scope>) -> StoreResult<Vec<ApiKeyRecord>> {
        self.inner.list_keys(scope).await
    }

    async fn revoke_key(
        &self,
        scope: Option<&Scope>,
        digest: &KeyDigest,
        at: DateTime<Utc>,
    ) -> StoreResult<Option<ApiKeyRecord>> {
        self.inner.revoke_key(scope, digest, at).await
    }

    async fn touch_key(&self, digest: &KeyDigest, at: DateTime<Utc>) -> StoreResult<()> {
        self.inner.touch_key(digest, at).await
    }
}

fn counted_keys(cache_ms: u64) -> (Arc<Counting>, KeyStore) {
    let store = Counting::new();
    let keys = KeyStore::new(&[], store.clone()).with_cache_ms(cache_ms);
    (store, keys)
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn acme() -> Scope {
    Scope::parse("acme").unwrap()
}

/// Polls `/v1/profiles` with `key` every 20 ms until it is refused; answers how many requests
/// were accepted before that and when the first answer came. Fails after `deadline`.
async fn poll_until_refused(s: &Server, key: &str, deadline: Duration) -> (usize, Instant) {
    let start = Instant::now();
    let mut accepted = 0;
    let mut first_answer = None;
    loop {
        let (status, body, _) = s.get("/v1/profiles", key).await;
        let first = *first_answer.get_or_insert_with(Instant::now);
        if status == StatusCode::UNAUTHORIZED {
            return (accepted, first);
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        accepted += 1;
        assert!(
            start.elapsed() < deadline,
            "the key was still accepted {deadline:?} after its revocation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SC-176: within the bound, N requests with one stored key read the store once; with the
/// cache off (0) every request reads it.
#[tokio::test]
async fn sc_176_requests_within_the_bound_read_the_store_once() {
    let (store, keys) = counted_keys(KEY_CACHE_MS_MAX);
    let key = keys.create(&acme(), KeyRole::Caller).await.unwrap();
    for _ in 0..50 {
        let principal = keys
            .authenticate(Some(&bearer(key.expose())))
            .await
            .unwrap();
        assert_eq!(principal.scope, acme());
    }
    assert_eq!(store.reads(), 1, "one read for 50 requests");

    let (store, keys) = counted_keys(0);
    let key = keys.create(&acme(), KeyRole::Caller).await.unwrap();
    for _ in 0..50 {
        keys.authenticate(Some(&bearer(key.expose())))
            .await
            .unwrap();
    }
    assert_eq!(store.reads(), 50, "no cache: one read per request");
    assert_eq!(keys.cache_sizes().unknown, 0);
}

/// SC-176: with `key_cache_ms = 0`, a key revoked in the store behind the server's back is
/// refused on the very next request.
#[tokio::test]
async fn sc_176_with_the_cache_off_a_key_revoked_in_the_store_is_refused_at_once() {
    let s = Server::start_with(Backend::memory(), "\n[server]\nkey_cache_ms = 0\n").await;
    assert_eq!(s.keys.cache_bound(), Duration::ZERO);
    let (status, _, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    let revoked = s
        .keys
        .store()
        .revoke_key(None, &KeyDigest::of_key(&s.caller), Utc::now())
        .await
        .unwrap();
    assert!(revoked.is_some());
    let (status, _, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    s.stop().await;
}

/// SC-189: a revocation that names another scope's key changes nothing: the key stays cached
/// and is served without a new store read.
#[tokio::test]
async fn sc_189_a_revocation_of_another_scopes_key_leaves_its_cache_entry() {
    let (store, keys) = counted_keys(KEY_CACHE_MS_MAX);
    let key = keys.create(&acme(), KeyRole::Caller).await.unwrap();
    keys.authenticate(Some(&bearer(key.expose())))
        .await
        .unwrap();
    let reads = store.reads();
    let other = Scope::parse("globex").unwrap();
    let digest = KeyDigest::of_key(key.expose());
    let revoked = keys
        .revoke(Some(&other), &digest, Utc::now())
        .await
        .unwrap();
    assert!(revoked.is_none(), "not a key of that scope");
    keys.authenticate(Some(&bearer(key.expose())))
        .await
        .unwrap();
    assert_eq!(store.reads(), reads, "still served from the cache");
    let revoked = keys
        .revoke(Some(&acme()), &digest, Utc::now())
        .await
        .unwrap();
    assert!(revoked.is_some());
    assert!(matches!(
        keys.authenticate(Some(&bearer(key.expose()))).await,
        Err(ApiError::Unauthenticated)
    ));
}

/// SC-177: a digest the store does not know is remembered for the bound (a flood of one bad
/// key is one read), and at most `UNKNOWN_KEYS_CACHED_MAX` of them are kept.
#[tokio::test]
async fn sc_177_unknown_keys_are_cached_for_the_bound_and_bounded_in_number() {
    let (store, keys) = counted_keys(KEY_CACHE_MS_MAX);
    for _ in 0..50 {
        assert!(matches!(
            keys.authenticate(Some(
                "Bearer tg_0000000000000000000000000000000000000000000000000000000000000001"
            ))
            .await,
            Err(ApiError::Unauthenticated)
        ));
    }
    assert_eq!(
        store.reads(),
        1,
        "one read for 50 requests with one bad key"
    );
    assert_eq!(keys.cache_sizes().unknown, 1);

    let flood = UNKNOWN_KEYS_CACHED_MAX + 500;
    for i in 0..flood {
        let header = bearer(&format!("tg_{:064x}", i + 1_000));
        assert!(matches!(
            keys.authenticate(Some(&header)).await,
            Err(ApiError::Unauthenticated)
        ));
        assert!(keys.cache_sizes().unknown <= UNKNOWN_KEYS_CACHED_MAX);
    }
    assert_eq!(store.reads(), 1 + flood, "each new bad key is read once");
    let sizes = keys.cache_sizes();
    assert!(
        sizes.unknown > 0 && sizes.unknown <= UNKNOWN_KEYS_CACHED_MAX,
        "{sizes:?}"
    );
    assert_eq!(sizes.stored, 0);

    // A key created through the key store is not shadowed by an earlier miss of its digest.
    let key = keys.create(&acme(), KeyRole::Caller).await.unwrap();
    keys.authenticate(Some(&bearer(key.expose())))
        .await
        .unwrap();
}

/// SC-178: expiry is checked against the cached record on every request: a key that expires
/// while it is cached is refused without reading the store again.
#[tokio::test]
async fn sc_178_a_cached_key_is_refused_once_it_expires() {
    let (store, keys) = counted_keys(KEY_CACHE_MS_MAX);
    let expires_at = Utc::now() + chrono::Duration::milliseconds(300);
    let record = ApiKeyRecord {
        expires_at: Some(expires_at),
        ..ApiKeyRecord::new(
            KeyDigest::of_key(
                "tg_0000000000000000000000000000000000000000000000000000000000000002",
            ),
            acme(),
            KeyRole::Caller,
            Utc::now(),
        )
    };
    store.insert_key(record).await.unwrap();
    keys.authenticate(Some(
        "Bearer tg_0000000000000000000000000000000000000000000000000000000000000002",
    ))
    .await
    .unwrap();
    assert_eq!(store.reads(), 1);
    while Utc::now() <= expires_at {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(
        keys.authenticate(Some(
            "Bearer tg_0000000000000000000000000000000000000000000000000000000000000002"
        ))
        .await,
        Err(ApiError::Unauthenticated)
    ));
    assert_eq!(store.reads(), 1, "refused from the cached record");
}

/// SC-179: a key revoked through the server's route is refused on the very next request, even
/// with a long cache bound.
#[tokio::test]
async fn sc_179_a_key_revoked_through_the_route_is_refused_on_the_next_request() {
    let extra = format!("\n[server]\nkey_cache_ms = {KEY_CACHE_MS_MAX}\n");
    let s = Server::start_with(Backend::memory(), &extra).await;
    for _ in 0..3 {
        let (status, _, _) = s.get("/v1/profiles", &s.caller).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert!(s.keys.cache_sizes().stored >= 1, "the key is cached");
    let id = KeyDigest::of_key(&s.caller).to_hex();
    let (status, body, _) = s
        .post(
            &format!("/v1/admin/keys/{id}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _, _) = s.get("/v1/profiles", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "other cached keys still work");
    s.stop().await;
}

/// SC-179: a store read that began before a revocation through this process answers its own
/// request but is not kept: the next request reads the store again and is refused.
#[tokio::test]
async fn sc_179_a_read_overtaken_by_a_revocation_is_not_kept() {
    let (store, keys) = counted_keys(KEY_CACHE_MS_MAX);
    let keys = Arc::new(keys);
    let key = keys.create(&acme(), KeyRole::Caller).await.unwrap();
    let header = bearer(key.expose());
    let (read_tx, read_rx) = oneshot::channel();
    let (release_tx, release_rx) = oneshot::channel();
    *store.hold.lock().unwrap() = Some(Hold {
        read: read_tx,
        release: release_rx,
    });
    let in_flight = tokio::spawn({
        let keys = keys.clone();
        let header = header.clone();
        async move { keys.authenticate(Some(&header)).await }
    });
    read_rx.await.unwrap();
    let revoked = keys
        .revoke(None, &KeyDigest::of_key(key.expose()), Utc::now())
        .await
        .unwrap();
    assert!(revoked.is_some());
    release_tx.send(()).unwrap();
    assert!(
        in_flight.await.unwrap().is_ok(),
        "the read began before the revocation"
    );
    assert!(matches!(
        keys.authenticate(Some(&header)).await,
        Err(ApiError::Unauthenticated)
    ));
    assert_eq!(store.reads(), 2, "the overtaken read was not kept");
}

/// SC-180: a key revoked in the store behind the server's back (as another server or the CLI
/// does) keeps working from the cache until the bound has passed since the server read it, then
/// is refused; never later than a generous deadline (10 × the bound).
#[tokio::test]
async fn sc_180_a_key_revoked_elsewhere_is_refused_within_the_bound() {
    const BOUND_MS: u64 = 300;
    let extra = format!("\n[server]\nkey_cache_ms = {BOUND_MS}\n");
    let s = Server::start_with(Backend::memory(), &extra).await;
    let bound = Duration::from_millis(BOUND_MS);
    assert_eq!(s.keys.cache_bound(), bound);
    // The server reads the key no earlier than `before_read`.
    let before_read = Instant::now();
    let (status, _, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    let revoked = s
        .keys
        .store()
        .revoke_key(None, &KeyDigest::of_key(&s.caller), Utc::now())
        .await
        .unwrap();
    assert!(revoked.is_some());
    let (accepted, first_answer) = poll_until_refused(&s, &s.caller, bound * 10).await;
    let refused_after = before_read.elapsed();
    // A refusal needs a new read, which happens only once the cached one is older than the
    // bound; the server read the key after `before_read`.
    assert!(
        refused_after >= bound,
        "refused {refused_after:?} after the read, within the bound"
    );
    // A poll answered within the bound was served from the cache.
    if first_answer.duration_since(before_read) < bound {
        assert!(accepted >= 1, "the first poll came within the bound");
    }
    let (status, _, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "and stays refused");
    s.stop().await;
}
