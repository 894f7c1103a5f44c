//! The audit page (operators): the scope's hash chain verified row by row against its head, and
//! the ledger audit, each with its first violation when there is one. Also the page-by-page walk
//! over a scope's audit rows that the overview and the execution page use.

use super::session::{allow, Page};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use serde::Serialize;
use tollgate_core::ids::Scope;
use tollgate_store::audit::ChainVerifier;
use tollgate_store::{AuditPosition, AuditRow, LedgerReport, ServiceStores};

/// Audit rows read per store call.
pub const AUDIT_PAGE_ROWS: u32 = 1000;
/// Violations the ledger audit lists on the page (all are counted).
pub const LEDGER_LIST_MAX: u32 = 20;

/// Calls `visit` on the scope's audit rows after `after` (by chain, then seq), until the rows
/// end, `visit` answers `false`, or — with `one_chain` — the chain of `after` ends. Returns the
/// rows visited.
///
/// # Errors
/// `unavailable`.
pub async fn walk(
    stores: &dyn ServiceStores,
    scope: &Scope,
    after: AuditPosition,
    one_chain: bool,
    mut visit: impl FnMut(&AuditRow) -> bool,
) -> Result<u64, ApiError> {
    let chain = after.chain;
    let mut after = after;
    let mut seen = 0u64;
    loop {
        let rows = stores.audit_rows(scope, after, AUDIT_PAGE_ROWS).await?;
        let Some(last) = rows.last() else {
            return Ok(seen);
        };
        after = last.position();
        for row in &rows {
            if one_chain && row.chain != chain {
                return Ok(seen);
            }
            seen += 1;
            if !visit(row) {
                return Ok(seen);
            }
        }
    }
}

/// The first row that does not verify.
#[derive(Debug, Clone, Serialize)]
pub struct ChainViolation {
    /// Its chain.
    pub chain: u16,
    /// Its seq in the chain.
    pub seq: i64,
    /// What is wrong.
    pub reason: &'static str,
}

/// The chain verification of one scope.
#[derive(Debug, Clone, Serialize)]
pub struct ChainReport {
    /// Every row verifies and the last one is the head.
    pub ok: bool,
    /// Rows verified before the first violation (all of them when `ok`).
    pub rows_verified: i64,
    /// Rows the chains' heads account for, as the store keeps them (0: no row yet).
    pub head_seq: i64,
    /// The first violation.
    pub first_violation: Option<ChainViolation>,
}

/// `GET /v1/console/audit` answer.
#[derive(Debug, Serialize)]
pub struct AuditView {
    /// The key's scope.
    pub scope: String,
    /// The audit chain.
    pub chain: ChainReport,
    /// The ledger audit (at most [`LEDGER_LIST_MAX`] violations listed, the first first).
    pub ledger: LedgerReport,
}

/// Verifies the scope's chain from its first row to its head.
///
/// # Errors
/// `unavailable`.
pub async fn verify(stores: &dyn ServiceStores, scope: &Scope) -> Result<ChainReport, ApiError> {
    let heads = stores.audit_heads(scope).await?;
    let mut verifier = ChainVerifier::default();
    let mut broken = None;
    walk(
        stores,
        scope,
        AuditPosition::START,
        false,
        |row| match verifier.push(row) {
            Ok(()) => true,
            Err(e) => {
                broken = Some(e);
                false
            }
        },
    )
    .await?;
    let rows_verified = verifier.rows();
    let broken = match broken {
        Some(e) => Some(e),
        None => verifier.finish(&heads).err(),
    };
    Ok(ChainReport {
        ok: broken.is_none(),
        rows_verified,
        head_seq: heads.iter().map(|h| h.seq).sum(),
        first_violation: broken.map(|e| ChainViolation {
            chain: e.chain.0,
            seq: e.seq,
            reason: e.reason,
        }),
    })
}

/// `GET /v1/console/audit`.
///
/// # Errors
/// `forbidden` (not an operator), `unavailable`.
pub async fn audit(app: &App, who: &Principal) -> Result<AuditView, ApiError> {
    allow(who, Page::Audit)?;
    let stores = app.backend.stores();
    let chain = verify(stores.as_ref(), &who.scope).await?;
    let ledger = stores
        .audit_ledger(Some(&who.scope), LEDGER_LIST_MAX)
        .await?;
    Ok(AuditView {
        scope: who.scope.to_string(),
        chain,
        ledger,
    })
}
