//! The audit hash chain: each row's hash covers the previous row's hash and the event, so an
//! edited, removed or reordered row breaks every later hash.

use crate::rows::{AuditEvent, AuditRow};
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

/// Verifies a scope's rows in seq order.
///
/// # Errors
/// The first bad row.
pub fn verify_chain(rows: &[AuditRow]) -> Result<(), ChainBroken> {
    let mut prev = Digest256([0; 32]);
    for (i, row) in rows.iter().enumerate() {
        let expected_seq = i as i64 + 1;
        if row.seq != expected_seq {
            return Err(ChainBroken {
                seq: row.seq,
                reason: "sequence gap",
            });
        }
        if row.prev_hash != prev {
            return Err(ChainBroken {
                seq: row.seq,
                reason: "previous hash mismatch",
            });
        }
        if row_hash(&prev, row.seq, &row.event) != row.hash {
            return Err(ChainBroken {
                seq: row.seq,
                reason: "row hash mismatch",
            });
        }
        prev = row.hash;
    }
    Ok(())
}
