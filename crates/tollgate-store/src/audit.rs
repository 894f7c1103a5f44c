//! The audit hash chains: each row's hash covers the previous row's hash and the event, so an
//! edited, removed or reordered row breaks every later hash. A scope has [`AUDIT_CHAINS`]
//! chains, each with its own head; one execution's rows are all in one chain.

use crate::rows::{AuditChain, AuditEvent, AuditHead, AuditRow, AUDIT_CHAINS};
use chrono::{DateTime, SubsecRound, Utc};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use tollgate_core::digest::{canonical_json, push_framed, Digest256};

/// Domain separator of audit rows.
pub const AUDIT_DOMAIN: &str = "tollgate/audit-row/v1";

/// Timestamps are kept at microsecond precision (Postgres `timestamptz`), so that every store
/// hashes the same value.
pub fn audit_time(at: DateTime<Utc>) -> DateTime<Utc> {
    at.trunc_subsecs(6)
}

/// The hash of a row at `seq` of `chain` after `prev`. Chain 0 hashes exactly as the single
/// chain per scope did before a scope had several, so rows written then still verify; every
/// other chain's number is covered by the hash too.
pub fn row_hash(chain: AuditChain, prev: &Digest256, seq: i64, event: &AuditEvent) -> Digest256 {
    row_hash_frame(chain, event).hash(prev, seq)
}

/// The bytes a row's hash covers, around the two parts that only its chain's head decides (the
/// previous hash and the seq): `sha256(prefix ‖ prev ‖ mid ‖ seq ‖ tail)`, where `seq` is
/// big-endian. A store that locks the head inside one statement computes the hash there from
/// these bytes ([`RowHashFrame::hash`] is the same computation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowHashFrame {
    /// The domain and the previous hash's length.
    pub prefix: Vec<u8>,
    /// The seq's length.
    pub mid: Vec<u8>,
    /// The event's framed parts, after the seq.
    pub tail: Vec<u8>,
}

impl RowHashFrame {
    /// The hash of the row at `seq` after `prev`.
    pub fn hash(&self, prev: &Digest256, seq: i64) -> Digest256 {
        let mut h = Sha256::new();
        h.update(&self.prefix);
        h.update(prev.0);
        h.update(&self.mid);
        h.update(seq.to_be_bytes());
        h.update(&self.tail);
        Digest256(h.finalize().into())
    }
}

/// [`row_hash`]'s input for `event` in `chain`, framed as [`domain_digest`] frames it.
pub fn row_hash_frame(chain: AuditChain, event: &AuditEvent) -> RowHashFrame {
    let execution = event
        .execution_id
        .map(|e| e.to_string())
        .unwrap_or_default();
    let at = audit_time(event.at).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let detail = canonical_json(&event.detail);
    let mut prefix = Vec::new();
    push_framed(&mut prefix, AUDIT_DOMAIN.as_bytes());
    prefix.extend_from_slice(&(std::mem::size_of::<Digest256>() as u64).to_be_bytes());
    let mid = (std::mem::size_of::<i64>() as u64).to_be_bytes().to_vec();
    let mut tail = Vec::new();
    for part in [
        event.scope.as_str().as_bytes(),
        execution.as_bytes(),
        event.kind.as_bytes(),
        detail.as_bytes(),
        at.as_bytes(),
    ] {
        push_framed(&mut tail, part);
    }
    if chain.0 != 0 {
        push_framed(&mut tail, &chain.0.to_be_bytes());
    }
    RowHashFrame { prefix, mid, tail }
}

/// The first row of a scope's trail that does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("audit chain {chain} broken at seq {seq}: {reason}")]
pub struct ChainBroken {
    /// The chain.
    pub chain: AuditChain,
    /// The row's seq.
    pub seq: i64,
    /// What is wrong.
    pub reason: &'static str,
}

/// Where the walk of one chain stands.
#[derive(Debug, Clone, Copy)]
struct ChainTip {
    last_seq: i64,
    prev: Digest256,
}

impl Default for ChainTip {
    fn default() -> Self {
        Self {
            last_seq: 0,
            prev: Digest256([0; 32]),
        }
    }
}

/// Verifies a scope's chains one row at a time, so a scope of any length is checked page by
/// page in bounded memory (one tip per chain), and finally against the heads the store keeps
/// apart from the rows.
#[derive(Debug, Clone, Default)]
pub struct ChainVerifier {
    tips: BTreeMap<AuditChain, ChainTip>,
    rows: i64,
}

impl ChainVerifier {
    /// The next row, in the order the store lists them (by chain, then seq).
    ///
    /// # Errors
    /// The row is not its chain's next one.
    pub fn push(&mut self, row: &AuditRow) -> Result<(), ChainBroken> {
        let broken = |reason| {
            Err(ChainBroken {
                chain: row.chain,
                seq: row.seq,
                reason,
            })
        };
        if row.chain.0 >= AUDIT_CHAINS {
            return broken("unknown chain");
        }
        let tip = self.tips.entry(row.chain).or_default();
        if row.seq != tip.last_seq + 1 {
            return broken("sequence gap");
        }
        if row.prev_hash != tip.prev {
            return broken("previous hash mismatch");
        }
        if row_hash(row.chain, &tip.prev, row.seq, &row.event) != row.hash {
            return broken("row hash mismatch");
        }
        tip.last_seq = row.seq;
        tip.prev = row.hash;
        self.rows += 1;
        Ok(())
    }

    /// Rows verified so far.
    pub fn rows(&self) -> i64 {
        self.rows
    }

    /// Ends the walk: each chain's last row must be the store's head of that chain. `heads` is
    /// empty for a scope with no row yet; otherwise it holds every chain's head, created
    /// together with the scope's first row.
    ///
    /// # Errors
    /// A chain ends before or after its head, or at another row than the head; a head is missing.
    pub fn finish(self, heads: &[AuditHead]) -> Result<(), ChainBroken> {
        let by_chain: BTreeMap<AuditChain, AuditHead> =
            heads.iter().map(|h| (h.chain, *h)).collect();
        if heads.is_empty() {
            return match self.tips.iter().next() {
                None => Ok(()),
                Some((chain, tip)) => Err(ChainBroken {
                    chain: *chain,
                    seq: tip.last_seq,
                    reason: "rows without a chain head",
                }),
            };
        }
        for chain in AuditChain::all() {
            let tip = self.tips.get(&chain).copied().unwrap_or_default();
            let Some(head) = by_chain.get(&chain) else {
                return Err(ChainBroken {
                    chain,
                    seq: tip.last_seq,
                    reason: "chain head missing",
                });
            };
            if tip.last_seq < head.seq {
                return Err(ChainBroken {
                    chain,
                    seq: tip.last_seq + 1,
                    reason: "rows missing before the chain head",
                });
            }
            if tip.last_seq > head.seq || (head.seq > 0 && tip.prev != head.hash) {
                return Err(ChainBroken {
                    chain,
                    seq: tip.last_seq,
                    reason: "last row is not the chain head",
                });
            }
        }
        if let Some(extra) = by_chain.keys().find(|c| c.0 >= AUDIT_CHAINS) {
            return Err(ChainBroken {
                chain: *extra,
                seq: 0,
                reason: "unknown chain",
            });
        }
        Ok(())
    }
}

/// Verifies a scope's rows in the store's order (without heads: see [`ChainVerifier`]).
///
/// # Errors
/// The first bad row.
pub fn verify_chain(rows: &[AuditRow]) -> Result<(), ChainBroken> {
    let mut verifier = ChainVerifier::default();
    rows.iter().try_for_each(|row| verifier.push(row))
}

#[cfg(test)]
mod chain_tests {
    use super::*;
    use chrono::TimeZone;
    use tollgate_core::digest::domain_digest;
    use tollgate_core::ids::Scope;

    fn chain_of(chain: AuditChain, n: i64) -> Vec<AuditRow> {
        let mut prev = Digest256([0; 32]);
        (1..=n)
            .map(|seq| {
                let event = AuditEvent {
                    scope: Scope::parse("acme").unwrap(),
                    execution_id: None,
                    kind: "k".into(),
                    detail: serde_json::json!({"n": seq, "chain": chain.0}),
                    at: Utc.timestamp_opt(1_700_000_000 + seq, 0).unwrap(),
                };
                let hash = row_hash(chain, &prev, seq, &event);
                let row = AuditRow {
                    chain,
                    seq,
                    event,
                    prev_hash: prev,
                    hash,
                };
                prev = hash;
                row
            })
            .collect()
    }

    /// Every chain's head, with `rows`' last row as the head of its chain.
    fn heads(rows: &[&AuditRow]) -> Vec<AuditHead> {
        AuditChain::all()
            .map(|chain| {
                let last = rows
                    .iter()
                    .filter(|r| r.chain == chain)
                    .max_by_key(|r| r.seq);
                AuditHead {
                    chain,
                    seq: last.map_or(0, |r| r.seq),
                    hash: last.map_or(Digest256([0; 32]), |r| r.hash),
                }
            })
            .collect()
    }

    fn walk(rows: &[AuditRow], heads: &[AuditHead]) -> Result<(), ChainBroken> {
        let mut verifier = ChainVerifier::default();
        rows.iter().try_for_each(|r| verifier.push(r))?;
        verifier.finish(heads)
    }

    #[test]
    fn sc_97_the_chain_must_end_at_its_head() {
        let rows = chain_of(AuditChain(0), 3);
        let all: Vec<&AuditRow> = rows.iter().collect();
        assert_eq!(walk(&rows, &heads(&all)), Ok(()));
        assert_eq!(walk(&[], &[]), Ok(()));
        let lost_tail = walk(&rows[..2], &heads(&all)).unwrap_err();
        assert_eq!(
            (lost_tail.seq, lost_tail.reason),
            (3, "rows missing before the chain head")
        );
        let beyond = walk(&rows, &heads(&all[..2])).unwrap_err();
        assert_eq!(beyond.reason, "last row is not the chain head");
        let mut other = heads(&all);
        other[0].hash = Digest256([7; 32]);
        assert_eq!(
            walk(&rows, &other).unwrap_err().reason,
            "last row is not the chain head"
        );
        assert_eq!(
            walk(&rows, &[]).unwrap_err().reason,
            "rows without a chain head"
        );
    }

    #[test]
    fn sc_98_every_chain_of_a_scope_is_checked_against_its_own_head() {
        let zero = chain_of(AuditChain(0), 2);
        let five = chain_of(AuditChain(5), 3);
        let rows: Vec<AuditRow> = zero.iter().chain(five.iter()).cloned().collect();
        let all: Vec<&AuditRow> = rows.iter().collect();
        assert_eq!(walk(&rows, &heads(&all)), Ok(()));
        // Chain 5 lost its tail while chain 0 is whole.
        let cut: Vec<AuditRow> = rows[..4].to_vec();
        let broken = walk(&cut, &heads(&all)).unwrap_err();
        assert_eq!(
            (broken.chain, broken.seq, broken.reason),
            (AuditChain(5), 3, "rows missing before the chain head")
        );
        // A whole chain and its head removed: the other heads name it.
        let without_five: Vec<AuditHead> = heads(&all)
            .into_iter()
            .filter(|h| h.chain != AuditChain(5))
            .collect();
        let broken = walk(&zero, &without_five).unwrap_err();
        assert_eq!(
            (broken.chain, broken.reason),
            (AuditChain(5), "chain head missing")
        );
    }

    #[test]
    fn sc_98_a_row_is_bound_to_its_chain() {
        let five = chain_of(AuditChain(5), 1);
        let mut moved = five[0].clone();
        moved.chain = AuditChain(6);
        let broken = verify_chain(&[moved]).unwrap_err();
        assert_eq!(broken.reason, "row hash mismatch");
        // Chain 0 hashes as the single chain did: the chain number is not part of its input.
        let zero = chain_of(AuditChain(0), 1);
        let legacy = domain_digest(
            AUDIT_DOMAIN,
            &[
                &[0u8; 32],
                &1i64.to_be_bytes(),
                b"acme",
                b"",
                b"k",
                canonical_json(&zero[0].event.detail).as_bytes(),
                audit_time(zero[0].event.at)
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                    .as_bytes(),
            ],
        );
        assert_eq!(zero[0].hash, legacy);
    }

    #[test]
    fn sc_98_the_frame_hashes_as_the_parts_do() {
        let five = chain_of(AuditChain(5), 2);
        let event = &five[1].event;
        let parts = domain_digest(
            AUDIT_DOMAIN,
            &[
                &five[0].hash.0,
                &2i64.to_be_bytes(),
                b"acme",
                b"",
                event.kind.as_bytes(),
                canonical_json(&event.detail).as_bytes(),
                audit_time(event.at)
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                    .as_bytes(),
                &5u16.to_be_bytes(),
            ],
        );
        assert_eq!(five[1].hash, parts);
        assert_eq!(
            row_hash_frame(AuditChain(5), event).hash(&five[0].hash, 2),
            parts
        );
    }

    #[test]
    fn sc_98_chains_follow_the_execution() {
        use tollgate_core::ids::ExecutionId;
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2_000 {
            let event = AuditEvent {
                scope: Scope::parse("acme").unwrap(),
                execution_id: Some(ExecutionId::new()),
                kind: "claimed".into(),
                detail: serde_json::json!({}),
                at: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
            };
            let chain = event.chain();
            assert!(chain.0 < AUDIT_CHAINS);
            let mut later = event.clone();
            later.kind = "settled".into();
            assert_eq!(later.chain(), chain);
            seen.insert(chain);
        }
        assert_eq!(seen.len(), usize::from(AUDIT_CHAINS));
    }
}
