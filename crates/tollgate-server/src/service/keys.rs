//! API keys for operators (spec/service.md — Keys): list the keys of the operator's scope and
//! revoke one. A key is shown by its id (the SHA-256 of the key, in hex), never the key itself.

use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tollgate_store::{ApiKeyRecord, KeyDigest, KeyRole};

/// One key as listed: everything but the key (which is never stored).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct KeySummary {
    /// The key's id: its SHA-256 in lower-case hex (what revoke takes).
    pub id: String,
    /// The scope it acts in.
    pub scope: String,
    /// `caller`, `operator` or `finance`.
    pub role: String,
    /// Created at.
    pub created_at: DateTime<Utc>,
    /// Last used at (updated at most once a minute per key and process).
    pub last_used_at: Option<DateTime<Utc>>,
    /// Stops working at, if ever.
    pub expires_at: Option<DateTime<Utc>>,
    /// Whether it was revoked.
    pub revoked: bool,
    /// Revoked at.
    pub revoked_at: Option<DateTime<Utc>>,
}

impl From<ApiKeyRecord> for KeySummary {
    fn from(k: ApiKeyRecord) -> Self {
        Self {
            id: k.digest.to_hex(),
            scope: k.scope.to_string(),
            role: k.role.as_str().to_string(),
            created_at: k.created_at,
            last_used_at: k.last_used_at,
            expires_at: k.expires_at,
            revoked: k.revoked_at.is_some(),
            revoked_at: k.revoked_at,
        }
    }
}

/// `GET /v1/admin/keys`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyList {
    /// The stored keys of the operator's scope, oldest first (configured `[[keys]]` are not
    /// listed: they live in the configuration).
    pub keys: Vec<KeySummary>,
}

/// Lists the keys of the operator's scope.
///
/// # Errors
/// `forbidden`, `unavailable`.
pub async fn list(app: &App, who: &Principal) -> Result<KeyList, ApiError> {
    who.require(&[KeyRole::Operator])?;
    let keys = app.keys.store().list_keys(Some(&who.scope)).await?;
    Ok(KeyList {
        keys: keys.into_iter().map(KeySummary::from).collect(),
    })
}

/// Revokes a key of the operator's scope (idempotent); another scope's key is 404.
///
/// # Errors
/// `forbidden`, `invalid_request` (422: not an id), `not_found`, `unavailable`.
pub async fn revoke(app: &App, who: &Principal, id: String) -> Result<KeySummary, ApiError> {
    who.require(&[KeyRole::Operator])?;
    let digest = KeyDigest::from_hex(&id).ok_or_else(|| {
        ApiError::Invalid("key id: expected 64 lower-case hex digits (the key's SHA-256)".into())
    })?;
    let key = app
        .keys
        .store()
        .revoke_key(Some(&who.scope), &digest, Utc::now())
        .await?
        .ok_or_else(|| ApiError::NotFound("key".into()))?;
    tracing::info!(key_id = %key.digest.to_hex(), "api key revoked");
    Ok(key.into())
}
