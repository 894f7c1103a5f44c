//! Calls served by their consumer group's instance (spec/performance.md, H-39).
//!
//! Instances of `tollgate serve` with `[cluster] url` write a row in `instances` every
//! [`INSTANCE_HEARTBEAT_MS`] and read the members seen within [`INSTANCE_EXPIRY_MS`], ordered by
//! id, so every instance counts the same members in the same order. A consumer's audit chain group
//! (H-33) then has one owner, the member at `group % members`, and a call request that arrives at
//! another instance is sent on to it as it came (its method, path, headers and body) and its answer
//! is relayed as the owner gave it, streams included. The owner batches the claims and settlements
//! of every call of its groups (H-32, H-34), whichever instance the client reached, so two
//! instances batch as one.
//!
//! Members forward only to members of the same configuration digest (the SHA-256 of their
//! profiles: call snapshots, prices and caps), so a call goes only to a member that serves its
//! profile as this one does, and during a rolling deploy each version forwards among its own. A
//! row is a member only with a valid proof: the HMAC-SHA256 of its id, url and digest under the
//! members' shared secret (`[cluster] secret_env`), so an address written into the table by
//! anyone without the secret receives no request and no API key.
//!
//! Ownership decides only which instance sends a call's statements: every answer is the database's
//! as before (idempotency claim, caps, fences, the group lock of H-35), so two instances that
//! disagree for a heartbeat on who owns a group are still correct, and a call an owner could not
//! be reached for is served here. A request that arrives forwarded ([`FORWARDED_HEADER`]) is always
//! served where it arrives, so a request is forwarded at most once.

use crate::secret::Secret;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, Method, Request, Response, Uri};
use hmac::{Hmac, Mac};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tollgate_postgres::instances::{Heartbeat, Instance};
use tollgate_postgres::PgStores;
use tollgate_store::AuditChain;
use uuid::Uuid;

/// How often an instance writes its row and reads the members.
pub const INSTANCE_HEARTBEAT_MS: u64 = 1_000;

/// A member not seen for this long (by the database's clock) is no longer counted: its groups
/// go to the members left.
pub const INSTANCE_EXPIRY_MS: u64 = 3_000;

/// After a forward that reached no answer, the owner's groups are served here for this long.
pub const PEER_DOWN_MS: u64 = 3_000;

/// The longest wait for a connection to an owner; past it the call is served here.
pub const FORWARD_CONNECT_TIMEOUT_MS: u64 = 1_000;

/// Idle time before the first TCP keepalive probe on a connection to an owner, and the time
/// between probes: an owner whose host stops answering (gone from the network, with no reset) is
/// found dead within about `FORWARD_KEEPALIVE_MS × (1 + FORWARD_KEEPALIVE_RETRIES)` while its
/// answer is awaited, and the call is served here.
pub const FORWARD_KEEPALIVE_MS: u64 = 1_000;

/// Unanswered keepalive probes after which a connection to an owner is dead.
pub const FORWARD_KEEPALIVE_RETRIES: u32 = 3;

/// The header a forwarded request carries (the forwarding instance's id): it is served where it
/// arrives.
pub const FORWARDED_HEADER: &str = "tollgate-forwarded";

/// Headers of one connection (RFC 9110 §7.6.1), never sent on; `host` and `content-length` are
/// set for the request sent, and `expect` was answered by this instance as it read the body.
const NOT_FORWARDED: [HeaderName; 9] = [
    header::EXPECT,
    header::CONNECTION,
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// The shortest shared secret a member accepts, in bytes.
pub const CLUSTER_SECRET_MIN_BYTES: usize = 32;

/// The instance's view of its cluster.
pub struct Cluster {
    id: Uuid,
    url: String,
    secret: Secret,
    /// SHA-256 (hex) of this member's profiles.
    config_digest: String,
    /// This member's proof (hex).
    proof: String,
    /// Ids of rows whose proof failed, each logged once.
    refused: Mutex<HashSet<Uuid>>,
    /// The members seen by the last heartbeat, ordered by id (this instance among them); empty
    /// before the first heartbeat and after one that failed.
    members: RwLock<Arc<[Instance]>>,
    /// Members a forward reached no answer from, with the instant their groups go back to them.
    down: Mutex<HashMap<Uuid, Instant>>,
    client: Client<HttpConnector, Body>,
    sent: AtomicU64,
    unreachable: AtomicU64,
    received: AtomicU64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("id", &self.id)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A new member reachable at `url` (an `http://` URL without a path), with a fresh id, the
    /// members' shared `secret` and `config_digest`, the digest of its profiles
    /// ([`config_digest`]).
    pub fn new(url: String, secret: Secret, config_digest: String) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(FORWARD_CONNECT_TIMEOUT_MS)));
        connector.set_keepalive(Some(Duration::from_millis(FORWARD_KEEPALIVE_MS)));
        connector.set_keepalive_interval(Some(Duration::from_millis(FORWARD_KEEPALIVE_MS)));
        connector.set_keepalive_retries(Some(FORWARD_KEEPALIVE_RETRIES));
        let id = Uuid::new_v4();
        let proof = proof(&secret, id, &url, &config_digest);
        Self {
            id,
            url,
            secret,
            config_digest,
            proof,
            refused: Mutex::new(HashSet::new()),
            members: RwLock::new(Arc::from([])),
            down: Mutex::new(HashMap::new()),
            client: Client::builder(TokioExecutor::new()).build(connector),
            sent: AtomicU64::new(0),
            unreachable: AtomicU64::new(0),
            received: AtomicU64::new(0),
        }
    }

    /// This instance's id.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The members as last seen.
    pub fn members(&self) -> Arc<[Instance]> {
        Arc::clone(&self.members.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn set_members(&self, members: Arc<[Instance]>) {
        *self.members.write().unwrap_or_else(PoisonError::into_inner) = members;
    }

    /// The rows of `seen` whose proof holds under this member's secret and digest; each row
    /// refused is logged once.
    fn proven(&self, seen: Vec<Instance>) -> Vec<Instance> {
        seen.into_iter()
            .filter(|row| {
                let holds = verify(&self.secret, row, &self.config_digest);
                if !holds {
                    let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
                    if refused.insert(row.id) {
                        tracing::warn!(
                            instance = %row.id,
                            "a cluster row's proof does not hold under this member's secret; it is no member"
                        );
                    }
                }
                holds
            })
            .collect()
    }

    /// The member that serves the calls of `consumer` in `scope`, when it is another live
    /// member than this one; `None` when they are served here.
    pub fn owner(&self, scope: &str, consumer: &str) -> Option<Instance> {
        let members = self.members();
        let owner = owner_of(&members, AuditChain::group_of(scope, consumer))?;
        if owner.id == self.id || self.is_down(owner.id) {
            return None;
        }
        Some(owner.clone())
    }

    fn is_down(&self, id: Uuid) -> bool {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        match down.get(&id) {
            Some(until) if Instant::now() < *until => true,
            Some(_) => {
                down.remove(&id);
                false
            }
            None => false,
        }
    }

    fn mark_down(&self, id: Uuid) {
        let until = Instant::now() + Duration::from_millis(PEER_DOWN_MS);
        self.down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, until);
    }

    /// Counts a request that arrived forwarded.
    pub fn received(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends the request (`method`, `uri`'s path and query, `headers`, `body`) to `owner` and
    /// answers its response, status, headers and body as it streams. `None` when no response
    /// came (the owner refused the connection, did not accept it within
    /// [`FORWARD_CONNECT_TIMEOUT_MS`], or closed it before answering): the owner's groups are then
    /// served here for [`PEER_DOWN_MS`] and the caller serves this request itself, which is sound
    /// whatever the owner did with it, since a call's key decides its answer wherever it runs.
    pub async fn forward(
        &self,
        owner: &Instance,
        method: Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Option<Response<Body>> {
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let target: Uri = format!("{}{path}", owner.url.trim_end_matches('/'))
            .parse()
            .ok()?;
        let mut request = Request::builder().method(method).uri(target);
        for (name, value) in headers {
            if !NOT_FORWARDED.contains(name) && name.as_str() != FORWARDED_HEADER {
                request = request.header(name, value);
            }
        }
        let request = request
            .header(FORWARDED_HEADER, self.id.to_string())
            .body(Body::from(body))
            .ok()?;
        match self.client.request(request).await {
            Ok(response) => {
                self.sent.fetch_add(1, Ordering::Relaxed);
                let (mut parts, body) = response.into_parts();
                for name in &NOT_FORWARDED {
                    if *name != header::CONTENT_LENGTH {
                        parts.headers.remove(name);
                    }
                }
                Some(Response::from_parts(parts, Body::new(body)))
            }
            Err(e) => {
                self.unreachable.fetch_add(1, Ordering::Relaxed);
                self.mark_down(owner.id);
                tracing::warn!(
                    instance = %owner.id,
                    error = %e,
                    "the owner of a call's group gave no answer; the call is served here"
                );
                None
            }
        }
    }

    /// Writes this instance's heartbeat every [`INSTANCE_HEARTBEAT_MS`] and keeps the members
    /// it reads, until `stop`; then marks its row as gone, so the others stop sending it calls. A
    /// heartbeat that fails leaves no members: every call is served here until one succeeds.
    pub async fn run(self: Arc<Self>, stores: Arc<PgStores>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(INSTANCE_HEARTBEAT_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let beat = Heartbeat {
                id: self.id,
                url: &self.url,
                config_digest: &self.config_digest,
                proof: &self.proof,
            };
            match stores.instance_seen(&beat, INSTANCE_EXPIRY_MS).await {
                Ok(seen) => self.set_members(self.proven(seen).into()),
                Err(e) => {
                    self.set_members(Arc::from([]));
                    tracing::warn!(error = %e, "the cluster heartbeat failed; every call is served here");
                }
            }
        }
        self.set_members(Arc::from([]));
        if let Err(e) = stores.instance_left(self.id, &self.url).await {
            tracing::warn!(error = %e, "this instance's cluster row could not be marked as gone; it expires");
        }
    }

    /// The cluster's lines of the Prometheus text.
    pub fn render(&self, out: &mut String) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP tollgate_cluster_members Members of the cluster seen by the last heartbeat.\n\
             # TYPE tollgate_cluster_members gauge\ntollgate_cluster_members {}",
            self.members().len()
        );
        let _ = writeln!(
            out,
            "# HELP tollgate_forwarded_calls_total Call requests sent to their group's owner, by \
             whether it answered.\n# TYPE tollgate_forwarded_calls_total counter\n\
             tollgate_forwarded_calls_total{{outcome=\"answered\"}} {}\n\
             tollgate_forwarded_calls_total{{outcome=\"unreachable\"}} {}",
            load(&self.sent),
            load(&self.unreachable)
        );
        let _ = writeln!(
            out,
            "# HELP tollgate_forwarded_calls_received_total Call requests served here for \
             another member.\n# TYPE tollgate_forwarded_calls_received_total counter\n\
             tollgate_forwarded_calls_received_total {}",
            load(&self.received)
        );
    }
}

/// The owner of chain group `group` among `members` (ordered by id): the member at
/// `group % members`; `None` for a cluster of fewer than two.
fn owner_of(members: &[Instance], group: u16) -> Option<&Instance> {
    if members.len() < 2 {
        return None;
    }
    members.get(usize::from(group) % members.len())
}

/// The SHA-256 (hex) of `profiles` as JSON: members of equal digests serve every profile alike.
pub fn config_digest<T: serde::Serialize>(profiles: &T) -> String {
    let json = serde_json::to_vec(profiles).unwrap_or_default();
    hex::encode(Sha256::digest(json))
}

fn mac(secret: &Secret, id: Uuid, url: &str, config_digest: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    for part in [
        "tollgate-instance".as_bytes(),
        id.as_bytes(),
        url.as_bytes(),
        config_digest.as_bytes(),
    ] {
        mac.update(&u64::try_from(part.len()).unwrap_or(u64::MAX).to_be_bytes());
        mac.update(part);
    }
    mac
}

/// The proof of a member's row: HMAC-SHA256 under `secret` of its id, url and digest (hex).
fn proof(secret: &Secret, id: Uuid, url: &str, config_digest: &str) -> String {
    hex::encode(mac(secret, id, url, config_digest).finalize().into_bytes())
}

/// Whether `row`'s proof holds under `secret` for `config_digest` (compared in constant time).
fn verify(secret: &Secret, row: &Instance, config_digest: &str) -> bool {
    let Ok(given) = hex::decode(&row.proof) else {
        return false;
    };
    mac(secret, row.id, &row.url, config_digest)
        .verify_slice(&given)
        .is_ok()
}

/// Whether `headers` say the request was forwarded by another member.
pub fn was_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED_HEADER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const SECRET: &str = "a shared secret of the test cluster, 32+ bytes";

    fn member(n: u128) -> Instance {
        let (id, url) = (Uuid::from_u128(n), format!("http://127.0.0.1:{}", 9000 + n));
        let proof = proof(&Secret::new(SECRET), id, &url, "digest");
        Instance { id, url, proof }
    }

    fn cluster() -> Cluster {
        Cluster::new(
            "http://127.0.0.1:9000".into(),
            Secret::new(SECRET),
            "digest".into(),
        )
    }

    #[test]
    fn h_39_a_group_s_owner_is_the_member_at_group_modulo_members() {
        let two = [member(1), member(2)];
        for group in 0..8u16 {
            let owner = owner_of(&two, group).unwrap();
            assert_eq!(owner.id, two[usize::from(group % 2)].id);
        }
        let three = [member(1), member(2), member(3)];
        assert_eq!(owner_of(&three, 5).unwrap().id, three[2].id);
        assert!(owner_of(&[member(1)], 3).is_none());
        assert!(owner_of(&[], 3).is_none());
    }

    #[test]
    fn h_39_calls_are_served_here_for_own_groups_alone_and_down_owners() {
        let cluster = cluster();
        let here = Instance {
            id: cluster.id(),
            url: cluster.url.clone(),
            proof: cluster.proof.clone(),
        };
        let other = member(7);
        let mut members = vec![here.clone(), other.clone()];
        members.sort_by_key(|m| m.id);
        let (scope, consumers) = ("perf-0", ["team-0", "team-1", "team-2", "team-3"]);
        // Alone: everything here.
        for consumer in consumers {
            assert!(cluster.owner(scope, consumer).is_none());
        }
        cluster.set_members(members.clone().into());
        let mut others = 0;
        for consumer in consumers {
            let group = AuditChain::group_of(scope, consumer);
            let expected = &members[usize::from(group) % 2];
            match cluster.owner(scope, consumer) {
                Some(owner) => {
                    assert_eq!(owner.id, other.id);
                    assert_eq!(expected.id, other.id);
                    others += 1;
                }
                None => assert_eq!(expected.id, here.id),
            }
        }
        assert!(others > 0 && others < consumers.len(), "{others}");
        // An owner that gave no answer: its groups are served here until PEER_DOWN_MS pass.
        cluster.mark_down(other.id);
        for consumer in consumers {
            assert!(cluster.owner(scope, consumer).is_none());
        }
        cluster
            .down
            .lock()
            .unwrap()
            .insert(other.id, Instant::now() - Duration::from_millis(1));
        assert!(consumers.iter().any(|c| cluster.owner(scope, c).is_some()));
    }

    #[test]
    fn h_39_a_row_is_a_member_only_with_a_proof_of_the_secret_and_the_digest() {
        let cluster = cluster();
        let good = member(3);
        let mut forged = member(4);
        forged.url = "http://attacker.example:80".into();
        let other_secret = {
            let (id, url) = (Uuid::from_u128(5), "http://127.0.0.1:9005".to_string());
            let proof = proof(
                &Secret::new("another secret, also 32 bytes or more"),
                id,
                &url,
                "digest",
            );
            Instance { id, url, proof }
        };
        let other_digest = {
            let (id, url) = (Uuid::from_u128(6), "http://127.0.0.1:9006".to_string());
            let proof = proof(&Secret::new(SECRET), id, &url, "another digest");
            Instance { id, url, proof }
        };
        let mut garbled = member(7);
        garbled.proof = "not hex".into();
        let kept = cluster.proven(vec![
            good.clone(),
            forged,
            other_secret,
            other_digest,
            garbled,
        ]);
        assert_eq!(kept, vec![good]);
        // The digest is of the profiles: equal profiles, equal digests.
        let a = BTreeMap::from([("p", 1)]);
        assert_eq!(config_digest(&a), config_digest(&a.clone()));
        assert_ne!(
            config_digest(&a),
            config_digest(&BTreeMap::from([("p", 2)]))
        );
    }

    #[test]
    fn h_39_a_forwarded_request_is_known_by_its_header() {
        let mut headers = HeaderMap::new();
        assert!(!was_forwarded(&headers));
        headers.insert(FORWARDED_HEADER, "x".parse().unwrap());
        assert!(was_forwarded(&headers));
    }
}
