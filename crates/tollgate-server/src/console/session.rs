//! Who may see which console page: the key's role decides; a caller key may see none.

use crate::auth::Principal;
use crate::error::ApiError;
use serde::Serialize;
use tollgate_store::KeyRole;

/// A console page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Page {
    /// Calls, spend against caps, holds, backlog, scheduler and ledger health.
    Overview,
    /// Executions awaiting an operator, and their resolution.
    Backlog,
    /// One operation key's journal row, settlement, evidence and audit trail.
    Execution,
    /// Settlements by day, consumer and model; CSV; price versions.
    Finance,
    /// The audit chain and the ledger audit.
    Audit,
    /// The scope's API keys (metadata only) and their revocation.
    Keys,
}

/// The pages a role may open, in menu order.
pub fn pages_of(role: KeyRole) -> &'static [Page] {
    match role {
        KeyRole::Operator => &[
            Page::Overview,
            Page::Backlog,
            Page::Execution,
            Page::Audit,
            Page::Keys,
        ],
        KeyRole::Finance => &[Page::Overview, Page::Finance],
        KeyRole::Caller => &[],
    }
}

/// Passes when the key's role may open `page`.
///
/// # Errors
/// [`ApiError::Forbidden`] (a caller key, or a page of the other role).
pub fn allow(who: &Principal, page: Page) -> Result<(), ApiError> {
    if pages_of(who.role).contains(&page) {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

/// `GET /v1/console/session` answer.
#[derive(Debug, Serialize)]
pub struct SessionView {
    /// The key's scope.
    pub scope: String,
    /// The key's role.
    pub role: &'static str,
    /// The pages it may open.
    pub pages: &'static [Page],
}

/// `GET /v1/console/session`: the key's scope, role and pages.
///
/// # Errors
/// `forbidden` for keys that may open no page (callers).
pub fn session(who: &Principal) -> Result<SessionView, ApiError> {
    let pages = pages_of(who.role);
    if pages.is_empty() {
        return Err(ApiError::Forbidden);
    }
    Ok(SessionView {
        scope: who.scope.to_string(),
        role: who.role.as_str(),
        pages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::ids::Scope;

    fn principal(role: KeyRole) -> Principal {
        Principal {
            scope: Scope::parse("acme").unwrap(),
            role,
            key: tollgate_store::rows::KeyDigest::of_key("k"),
            limits: tollgate_core::limits::RateLimits::default(),
        }
    }

    #[test]
    fn sc_151_pages_follow_the_role_and_callers_get_none() {
        assert!(matches!(
            session(&principal(KeyRole::Caller)),
            Err(ApiError::Forbidden)
        ));
        let operator = principal(KeyRole::Operator);
        assert!(allow(&operator, Page::Backlog).is_ok());
        assert!(allow(&operator, Page::Finance).is_err());
        let finance = principal(KeyRole::Finance);
        assert!(allow(&finance, Page::Finance).is_ok());
        assert!(allow(&finance, Page::Backlog).is_err());
        assert!(allow(&finance, Page::Audit).is_err());
        assert!(allow(&operator, Page::Keys).is_ok());
        assert!(allow(&finance, Page::Keys).is_err());
        assert_eq!(session(&finance).unwrap().role, "finance");
    }
}
