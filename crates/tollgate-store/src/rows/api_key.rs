//! API keys of the HTTP service: a key is kept as its SHA-256 only, with the scope it acts in
//! and its role. The key itself is never stored or logged.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;
use tollgate_core::ids::Scope;
use tollgate_core::limits::RateLimits;

/// The SHA-256 of an API key: the only form in which a key is kept. Not a secret (it cannot be
/// turned back into the key), so it prints as lower-case hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyDigest([u8; 32]);

impl KeyDigest {
    /// The digest of `key`.
    pub fn of_key(key: &str) -> Self {
        Self(Sha256::digest(key.as_bytes()).into())
    }

    /// Parses the stored and configured form: exactly 64 lower-case hex digits. `None`
    /// otherwise (upper-case digits included).
    pub fn from_hex(text: &str) -> Option<Self> {
        let lower_hex = text.len() == 64
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !lower_hex {
            return None;
        }
        let bytes = hex::decode(text).ok()?;
        bytes.try_into().ok().map(Self)
    }

    /// Lower-case hex, 64 digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyDigest({})", self.to_hex())
    }
}

impl Serialize for KeyDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for KeyDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::from_hex(&text)
            .ok_or_else(|| serde::de::Error::custom("not 64 lower-case hex digits"))
    }
}

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyRole {
    /// Runs calls and roots, reads them.
    Caller,
    /// Reads, recovers, reconciles and resolves (spec/service.md — Auth and roles).
    Operator,
    /// Reads profiles; settlements are read from the finance view.
    Finance,
}

impl KeyRole {
    /// The wire and stored name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Caller => "caller",
            Self::Operator => "operator",
            Self::Finance => "finance",
        }
    }
}

impl fmt::Display for KeyRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KeyRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "caller" => Ok(Self::Caller),
            "operator" => Ok(Self::Operator),
            "finance" => Ok(Self::Finance),
            other => Err(format!("role {other:?} is not caller, operator or finance")),
        }
    }
}

/// One stored API key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    /// SHA-256 of the key (the primary key).
    pub digest: KeyDigest,
    /// The only scope the key acts in (SC-10).
    pub scope: Scope,
    /// What the key may do.
    pub role: KeyRole,
    /// When the key was stored.
    pub created_at: DateTime<Utc>,
    /// When the key stops working, if ever (SC-140).
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// When the key was revoked; a revoked key never works again (SC-140).
    #[serde(default)]
    pub revoked_at: Option<DateTime<Utc>>,
    /// When the key was last used, to within the toucher's granularity (the service: a minute).
    #[serde(default)]
    pub last_used_at: Option<DateTime<Utc>>,
    /// The pace of calls made with the key (SC-220); empty: none.
    #[serde(default)]
    pub limits: RateLimits,
}

impl ApiKeyRecord {
    /// A key stored now that never expires and was never used.
    pub fn new(digest: KeyDigest, scope: Scope, role: KeyRole, created_at: DateTime<Utc>) -> Self {
        Self {
            digest,
            scope,
            role,
            created_at,
            expires_at: None,
            revoked_at: None,
            last_used_at: None,
            limits: RateLimits::default(),
        }
    }

    /// Whether the key authenticates at `now`: not revoked and not expired.
    pub fn usable_at(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| now < at)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn key_digest_is_sha256_in_lower_case_hex() {
        let digest = KeyDigest::of_key("abc");
        assert_eq!(
            digest.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(KeyDigest::from_hex(&digest.to_hex()), Some(digest));
        assert_eq!(KeyDigest::from_hex(&digest.to_hex().to_uppercase()), None);
        assert_eq!(KeyDigest::from_hex("abc"), None);
        assert_eq!(KeyDigest::from_hex(&"g".repeat(64)), None);
    }

    #[test]
    fn roles_round_trip_their_names() {
        for role in [KeyRole::Caller, KeyRole::Operator, KeyRole::Finance] {
            assert_eq!(role.as_str().parse::<KeyRole>(), Ok(role));
        }
        let e = "admin".parse::<KeyRole>().unwrap_err();
        assert_eq!(e, "role \"admin\" is not caller, operator or finance");
    }
}
