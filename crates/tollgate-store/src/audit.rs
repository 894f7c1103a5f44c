//! The audit hash chain: each row's hash covers the previous row's hash and the event, so an
//! edited, removed or reordered row breaks every later hash.

use crate::rows::{AuditEvent, AuditHead, AuditRow};
use chrono::{DateTime, SubsecRound, Utc};
use tollgate_core::digest::{canonical_json, domain_digest, Digest256};

/// Domain separator of audit rows.
pub const AUDIT_DOMAIN: &str = "tollgate/audit-row/v1";

/// Timestamps are kept at microsecond precision (Postgres `timestamptz`), so that every store
/// hashes the same value.
pub fn audit_time(at: DateTime<Utc>) -> DateTime<Utc> {
    at.trunc_subsecs(6)
}

/// The hash of a row at `seq` after `prev`.
pub fn row_hash(prev: &Digest256, seq: i64, event: &AuditEvent) -> Digest256 {
    let execution = event
        .execution_id
        .map(|e| e.to_string())
        .unwrap_or_default();
    let at = audit_time(event.at).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let detail = canonical_json(&event.detail);
    domain_digest(
        AUDIT_DOMAIN,
        &[
            &prev.0,
            &seq.to_be_bytes(),
            event.scope.as_str().as_bytes(),
            execution.as_bytes(),
            event.kind.as_bytes(),
            detail.as_bytes(),
            at.as_bytes(),
        ],
    )
}

/// The first row of a chain that does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("audit chain broken at seq {seq}: {reason}")]
pub struct ChainBroken {
    /// The row's seq.
    pub seq: i64,
    /// What is wrong.
    pub reason: &'static str,
}

/// Verifies a scope's chain one row at a time, so a scope of any length is checked page by page
/// in bounded memory, and finally against the head the store keeps apart from the rows.
#[derive(Debug, Clone)]
pub struct ChainVerifier {
    last_seq: i64,
    prev: Digest256,
}

impl Default for ChainVerifier {
    fn default() -> Self {
        Self {
            last_seq: 0,
            prev: Digest256([0; 32]),
        }
    }
}

impl ChainVerifier {
    /// The next row in seq order.
    ///
    /// # Errors
    /// The row is not the chain's next one.
    pub fn push(&mut self, row: &AuditRow) -> Result<(), ChainBroken> {
        let broken = |reason| {
            Err(ChainBroken {
                seq: row.seq,
                reason,
            })
        };
        if row.seq != self.last_seq + 1 {
            return broken("sequence gap");
        }
        if row.prev_hash != self.prev {
            return broken("previous hash mismatch");
        }
        if row_hash(&self.prev, row.seq, &row.event) != row.hash {
            return broken("row hash mismatch");
        }
        self.last_seq = row.seq;
        self.prev = row.hash;
        Ok(())
    }

    /// Rows verified so far.
    pub fn rows(&self) -> i64 {
        self.last_seq
    }

    /// Ends the walk: the last row must be the store's head (`None`: no row appended yet).
    ///
    /// # Errors
    /// The chain ends before or after its head, or at another row than the head.
    pub fn finish(self, head: Option<AuditHead>) -> Result<(), ChainBroken> {
        let (seq, hash) = head.map_or((0, Digest256([0; 32])), |h| (h.seq, h.hash));
        if self.last_seq < seq {
            return Err(ChainBroken {
                seq: self.last_seq + 1,
                reason: "rows missing before the chain head",
            });
        }
        if self.last_seq > seq || (seq > 0 && self.prev != hash) {
            return Err(ChainBroken {
                seq: self.last_seq,
                reason: "last row is not the chain head",
            });
        }
        Ok(())
    }
}

/// Verifies a scope's rows in seq order (without a head: see [`ChainVerifier`]).
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
    use tollgate_core::ids::Scope;

    fn chain(n: i64) -> Vec<AuditRow> {
        let mut prev = Digest256([0; 32]);
        (1..=n)
            .map(|seq| {
                let event = AuditEvent {
                    scope: Scope::parse("acme").unwrap(),
                    execution_id: None,
                    kind: "k".into(),
                    detail: serde_json::json!({"n": seq}),
                    at: Utc.timestamp_opt(1_700_000_000 + seq, 0).unwrap(),
                };
                let hash = row_hash(&prev, seq, &event);
                let row = AuditRow {
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

    fn walk(rows: &[AuditRow], head: Option<AuditHead>) -> Result<(), ChainBroken> {
        let mut verifier = ChainVerifier::default();
        rows.iter().try_for_each(|r| verifier.push(r))?;
        verifier.finish(head)
    }

    #[test]
    fn sc_97_the_chain_must_end_at_its_head() {
        let rows = chain(3);
        let head = |row: &AuditRow| {
            Some(AuditHead {
                seq: row.seq,
                hash: row.hash,
            })
        };
        assert_eq!(walk(&rows, head(&rows[2])), Ok(()));
        assert_eq!(walk(&[], None), Ok(()));
        let lost_tail = walk(&rows[..2], head(&rows[2])).unwrap_err();
        assert_eq!(
            (lost_tail.seq, lost_tail.reason),
            (3, "rows missing before the chain head")
        );
        let beyond = walk(&rows, head(&rows[1])).unwrap_err();
        assert_eq!(beyond.reason, "last row is not the chain head");
        let other = AuditHead {
            seq: 3,
            hash: Digest256([7; 32]),
        };
        assert_eq!(
            walk(&rows, Some(other)).unwrap_err().reason,
            "last row is not the chain head"
        );
    }
}
