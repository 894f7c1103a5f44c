//! The audit page (operators): the scope's hash chain and its ledger audit, each with its first
//! violation when there is one, from this process's last check of the scope when it began less
//! than [`AUDIT_CHECK_CACHE_MS`] ago (SC-194; the checks are [`crate::audit_checks`]).

use super::session::{allow, Page};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use serde::Serialize;
use tollgate_store::LedgerReport;

pub use crate::audit_checks::{
    verify, walk, AuditChecks, ChainReport, ChainViolation, Checked, AUDIT_CHECK_CACHE_MS,
    AUDIT_CHECK_SCOPES_MAX, AUDIT_PAGE_ROWS, LEDGER_LIST_MAX,
};

/// `GET /v1/console/audit` answer.
#[derive(Debug, Serialize)]
pub struct AuditView {
    /// The key's scope.
    pub scope: String,
    /// The audit chain, with when it was verified.
    pub chain: Checked<ChainReport>,
    /// The ledger audit (at most [`LEDGER_LIST_MAX`] violations listed, the first first), with
    /// when it ran.
    pub ledger: Checked<LedgerReport>,
}

/// `GET /v1/console/audit`: both checks, each from this process's last one of the scope when it
/// began less than [`AUDIT_CHECK_CACHE_MS`] ago (SC-194).
///
/// # Errors
/// `forbidden` (not an operator), `unavailable`.
pub async fn audit(app: &App, who: &Principal) -> Result<AuditView, ApiError> {
    allow(who, Page::Audit)?;
    let stores = app.backend.stores();
    let chain = app.audit_checks.chain(stores.as_ref(), &who.scope).await?;
    let ledger = app.audit_checks.ledger(stores.as_ref(), &who.scope).await?;
    Ok(AuditView {
        scope: who.scope.to_string(),
        chain,
        ledger,
    })
}
