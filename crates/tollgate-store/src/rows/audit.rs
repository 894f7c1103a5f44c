//! Audit events as written and as stored (metadata only, never content).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tollgate_core::digest::Digest256;
use tollgate_core::ids::{ExecutionId, Scope};

/// An audit event as written (metadata only, never content).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Tenant.
    pub scope: Scope,
    /// Execution, if any.
    pub execution_id: Option<ExecutionId>,
    /// Event kind (`claimed`, `dispatched`, `settled`, ...).
    pub kind: String,
    /// Metadata (ids, states, amounts, digests; never content).
    pub detail: serde_json::Value,
    /// Clock.
    pub at: DateTime<Utc>,
}

/// One of a scope's audit chains. A scope's rows are spread over [`AUDIT_CHAINS`] chains so that
/// appends for different executions do not wait for one another; every row of one execution is
/// in the same chain (see [`AuditEvent::chain`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct AuditChain(pub u16);

/// Chains per scope.
pub const AUDIT_CHAINS: u16 = 64;

/// The groups a scope's chains fall in: chain `c` is in group `c / (AUDIT_CHAINS / 8)`, so each
/// group holds [`AUDIT_CHAINS`]` / 8` chains (8 of 64). The executions of one consumer append to
/// one chain of one group, so the appends of consumers in different groups never meet on a
/// chain's head, and a batch of one consumer's calls moves one head (H-33).
pub const AUDIT_CHAIN_GROUPS: u16 = 8;

/// A chain's bits below its group: `AUDIT_CHAINS / AUDIT_CHAIN_GROUPS` chains per group.
const CHAIN_IN_GROUP_BITS: u32 = (AUDIT_CHAINS / AUDIT_CHAIN_GROUPS).trailing_zeros();

// The group's bits sit just above the chain's bits within it, inside the chain number: both
// counts are powers of two.
const _: () = assert!(
    AUDIT_CHAINS.is_power_of_two()
        && AUDIT_CHAIN_GROUPS.is_power_of_two()
        && AUDIT_CHAIN_GROUPS <= AUDIT_CHAINS
);

/// A stable hash of `(scope, consumer)`: FNV-1a over the two names with a separator, its high
/// bits folded in (FNV's low bits mix poorly). The same in every process and build.
fn consumer_hash(scope: &str, consumer: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in scope.bytes().chain([0xff]).chain(consumer.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash ^ (hash >> 32) ^ (hash >> 16)
}

impl AuditChain {
    /// The chain of every row of execution `id`.
    pub fn of_execution(id: ExecutionId) -> AuditChain {
        let bytes = id.0.as_bytes();
        // The uuid's last two bytes are random in every version we generate.
        let low = u16::from_be_bytes([bytes[14], bytes[15]]);
        AuditChain(low % AUDIT_CHAINS)
    }

    /// The group of the chains of `consumer`'s executions in `scope`: a stable hash of the two
    /// names, so every server puts a consumer's executions in the same group.
    pub fn group_of(scope: &str, consumer: &str) -> u16 {
        u16::try_from(consumer_hash(scope, consumer) % u64::from(AUDIT_CHAIN_GROUPS)).unwrap_or(0)
    }

    /// The chain of `consumer`'s executions in `scope`: in its group ([`AuditChain::group_of`]),
    /// and within the group the chain that more bits of the same hash name, so the consumers of
    /// one group spread over its chains while each consumer's executions append to one.
    pub fn of_consumer(scope: &str, consumer: &str) -> AuditChain {
        let hash = consumer_hash(scope, consumer);
        let groups = u64::from(AUDIT_CHAIN_GROUPS);
        // The group as `group_of` takes it (the hash's low residue), the chain in it above.
        let group = hash % groups;
        let in_group = (hash / groups) % u64::from(AUDIT_CHAINS / AUDIT_CHAIN_GROUPS);
        AuditChain(u16::try_from((group << CHAIN_IN_GROUP_BITS) | in_group).unwrap_or(0))
    }

    /// The group this chain is in.
    pub fn group(self) -> u16 {
        (self.0 >> CHAIN_IN_GROUP_BITS) % AUDIT_CHAIN_GROUPS
    }

    /// A fresh random execution id whose chain ([`AuditChain::of_execution`]) is `chain` (taken
    /// modulo [`AUDIT_CHAINS`]): a version 4 uuid with six of its random bits set to the chain.
    pub fn new_execution_in_chain(chain: AuditChain) -> ExecutionId {
        let mut bytes = *uuid::Uuid::new_v4().as_bytes();
        let low = u16::from_be_bytes([bytes[14], bytes[15]]);
        let chain_bits = AUDIT_CHAINS - 1;
        let low = (low & !chain_bits) | (chain.0 & chain_bits);
        [bytes[14], bytes[15]] = low.to_be_bytes();
        ExecutionId(uuid::Uuid::from_bytes(bytes))
    }

    /// Every chain of a scope, in order.
    pub fn all() -> impl Iterator<Item = AuditChain> {
        (0..AUDIT_CHAINS).map(AuditChain)
    }
}

impl std::fmt::Display for AuditChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl AuditEvent {
    /// The chain the event is appended to: chosen by the execution id, so one execution's rows
    /// stay in one chain in order; events of no execution (roots, operators) go to chain 0.
    pub fn chain(&self) -> AuditChain {
        self.execution_id
            .map_or(AuditChain(0), AuditChain::of_execution)
    }
}

/// A place in a scope's audit trail: rows are listed by chain, then by seq within the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct AuditPosition {
    /// The chain.
    pub chain: AuditChain,
    /// The seq within the chain (0: before its first row).
    pub seq: i64,
}

impl AuditPosition {
    /// Before every row of the scope.
    pub const START: AuditPosition = AuditPosition {
        chain: AuditChain(0),
        seq: 0,
    };
}

/// A stored audit row, chained per scope and chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRow {
    /// The chain the row belongs to.
    pub chain: AuditChain,
    /// Position in its chain, from 1.
    pub seq: i64,
    /// The event as appended; all of its fields are covered by `hash`.
    pub event: AuditEvent,
    /// Hash of the previous row (zeros for the first).
    pub prev_hash: Digest256,
    /// This row's hash.
    pub hash: Digest256,
}

impl AuditRow {
    /// Where the row is in its scope's trail (the cursor for the next page).
    pub fn position(&self) -> AuditPosition {
        AuditPosition {
            chain: self.chain,
            seq: self.seq,
        }
    }
}

/// The head of one of a scope's chains as the store keeps it: the last row's seq and hash. A
/// chain whose last row differs from its head has lost its tail. A scope's heads are created all
/// together with its first row, so a missing head is itself a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditHead {
    /// The chain.
    pub chain: AuditChain,
    /// Seq of the last row appended (0: none yet).
    pub seq: i64,
    /// Hash of the last row appended.
    pub hash: Digest256,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn h_33_an_execution_minted_in_a_chain_has_that_chain() {
        for n in 0..AUDIT_CHAINS * 2 {
            let chain = AuditChain(n);
            let mut ids = BTreeSet::new();
            for _ in 0..200 {
                let id = AuditChain::new_execution_in_chain(chain);
                assert_eq!(AuditChain::of_execution(id), AuditChain(n % AUDIT_CHAINS));
                // Still a random version 4 uuid of the RFC 4122 variant.
                assert_eq!(id.0.get_version_num(), 4);
                assert_eq!(id.0.get_variant(), uuid::Variant::RFC4122);
                ids.insert(id.0);
            }
            assert_eq!(ids.len(), 200, "ids stay random");
        }
    }

    #[test]
    fn h_33_a_consumer_s_chain_is_in_its_group_and_consumers_use_every_chain() {
        let mut chains = BTreeSet::new();
        for i in 0..1024 {
            let consumer = format!("team-{i}");
            let chain = AuditChain::of_consumer("scope-a", &consumer);
            assert!(chain.0 < AUDIT_CHAINS);
            assert_eq!(chain.group(), AuditChain::group_of("scope-a", &consumer));
            assert_eq!(chain, AuditChain::of_consumer("scope-a", &consumer));
            chains.insert(chain);
        }
        // Every chain of every group serves some consumers.
        assert_eq!(chains.len(), usize::from(AUDIT_CHAINS));
    }

    #[test]
    fn h_33_every_chain_is_in_exactly_one_group() {
        let mut per_group = [0_u16; AUDIT_CHAIN_GROUPS as usize];
        for chain in AuditChain::all() {
            per_group[usize::from(chain.group())] += 1;
        }
        assert!(per_group
            .iter()
            .all(|n| *n == AUDIT_CHAINS / AUDIT_CHAIN_GROUPS));
    }

    #[test]
    fn h_33_a_consumer_s_group_depends_only_on_its_scope_and_name() {
        let groups: Vec<u16> = (0..256)
            .map(|i| AuditChain::group_of("scope-a", &format!("team-{i}")))
            .collect();
        let again: Vec<u16> = (0..256)
            .map(|i| AuditChain::group_of("scope-a", &format!("team-{i}")))
            .collect();
        assert_eq!(groups, again);
        assert!(groups.iter().all(|g| *g < AUDIT_CHAIN_GROUPS));
        // Consumers spread over every group.
        let used: BTreeSet<u16> = groups.iter().copied().collect();
        assert_eq!(used.len(), usize::from(AUDIT_CHAIN_GROUPS));
        // The scope takes part: the same consumer names fall elsewhere in another scope.
        let other: Vec<u16> = (0..256)
            .map(|i| AuditChain::group_of("scope-b", &format!("team-{i}")))
            .collect();
        assert_ne!(groups, other);
        // The separator keeps ("ab", "c") apart from ("a", "bc").
        let pairs = (0..64).filter(|i| {
            AuditChain::group_of(&format!("s{i}x"), "y")
                != AuditChain::group_of(&format!("s{i}"), "xy")
        });
        assert!(pairs.count() > 0);
    }
}
