//! API keys for operators (spec/service.md — Auth and roles): list the keys of the operator's
//! scope — stored and configured — and revoke a stored one. A key is shown by its id (the
//! SHA-256 of the key, in hex), never the key itself.

use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tollgate_core::ids::Scope;
use tollgate_core::limits::RateLimits;
use tollgate_store::{ApiKeyRecord, KeyDigest, KeyRole};

/// Where a stored key lives: the key store (`tollgate keys create`).
pub const SOURCE_STORED: &str = "stored";
/// Where a configured key lives: `[[keys]]` of the configuration.
pub const SOURCE_CONFIG: &str = "config";

/// One key as listed: everything but the key (which is never stored).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct KeySummary {
    /// The key's id: its SHA-256 in lower-case hex (what revoke takes).
    pub id: String,
    /// The scope it acts in.
    pub scope: String,
    /// `caller`, `operator` or `finance`.
    pub role: String,
    /// `stored` (created with `tollgate keys create`, in the database) or `config` (a
    /// `[[keys]]` entry of the configuration).
    pub source: String,
    /// Whether it can be revoked: stored keys only. A configured key stops working when it is
    /// removed from the configuration and the server restarts.
    pub revocable: bool,
    /// Created at (none for a configured key).
    pub created_at: Option<DateTime<Utc>>,
    /// Last used at (updated at most once a minute per key and process).
    pub last_used_at: Option<DateTime<Utc>>,
    /// Stops working at, if ever.
    pub expires_at: Option<DateTime<Utc>>,
    /// Whether it was revoked.
    pub revoked: bool,
    /// Revoked at.
    pub revoked_at: Option<DateTime<Utc>>,
    /// The pace of calls made with the key (SC-220); omitted when it has none.
    #[serde(skip_serializing_if = "RateLimits::is_empty")]
    #[schema(value_type = Object)]
    pub limits: RateLimits,
}

impl From<ApiKeyRecord> for KeySummary {
    fn from(k: ApiKeyRecord) -> Self {
        Self {
            id: k.digest.to_hex(),
            scope: k.scope.to_string(),
            role: k.role.as_str().to_string(),
            source: SOURCE_STORED.into(),
            revocable: true,
            created_at: Some(k.created_at),
            last_used_at: k.last_used_at,
            expires_at: k.expires_at,
            revoked: k.revoked_at.is_some(),
            revoked_at: k.revoked_at,
            limits: k.limits,
        }
    }
}

impl KeySummary {
    /// A configured key (`[[keys]]`): no dates, never revoked, not revocable.
    pub fn configured(
        digest: &KeyDigest,
        scope: &Scope,
        role: KeyRole,
        limits: RateLimits,
    ) -> Self {
        Self {
            id: digest.to_hex(),
            scope: scope.to_string(),
            role: role.as_str().to_string(),
            source: SOURCE_CONFIG.into(),
            revocable: false,
            created_at: None,
            last_used_at: None,
            expires_at: None,
            revoked: false,
            revoked_at: None,
            limits,
        }
    }
}

/// `GET /v1/admin/keys`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyList {
    /// The keys of the operator's scope: the configured ones (`[[keys]]`, by id), then the
    /// stored ones, oldest first.
    pub keys: Vec<KeySummary>,
}

/// Lists the keys of the operator's scope.
///
/// # Errors
/// `forbidden`, `unavailable`.
pub async fn list(app: &App, who: &Principal) -> Result<KeyList, ApiError> {
    who.require(&[KeyRole::Operator])?;
    let stored = app.keys.store().list_keys(Some(&who.scope)).await?;
    let configured = app.keys.grants(Some(&who.scope));
    let keys = configured
        .iter()
        .map(|(digest, p)| KeySummary::configured(digest, &p.scope, p.role, p.limits))
        .chain(stored.into_iter().map(KeySummary::from))
        .collect();
    Ok(KeyList { keys })
}

/// Revokes a key of the operator's scope (idempotent); another scope's key is 404, a configured
/// key of the scope `key_in_config` (409: it is removed from the configuration instead).
///
/// # Errors
/// `forbidden`, `invalid_request` (422: not an id), `not_found`, `key_in_config`,
/// `unavailable`.
pub async fn revoke(app: &App, who: &Principal, id: String) -> Result<KeySummary, ApiError> {
    who.require(&[KeyRole::Operator])?;
    let digest = KeyDigest::from_hex(&id).ok_or_else(|| {
        ApiError::Invalid("key id: expected 64 lower-case hex digits (the key's SHA-256)".into())
    })?;
    if app
        .keys
        .grants(Some(&who.scope))
        .iter()
        .any(|(d, _)| *d == digest)
    {
        return Err(ApiError::KeyInConfig(id));
    }
    let key = app
        .keys
        .revoke(Some(&who.scope), &digest, Utc::now())
        .await?
        .ok_or_else(|| ApiError::NotFound("key".into()))?;
    tracing::info!(key_id = %key.digest.to_hex(), "api key revoked");
    Ok(key.into())
}
