//! Identifier newtypes. Every id that crosses a boundary is its own type.

use serde::{Deserialize, Serialize};
use std::fmt;
use uuid::Uuid;

/// Longest accepted textual identifier (scope, operation key, session, ...), in bytes.
pub const ID_LEN_MAX_BYTES: usize = 200;

/// Why a textual identifier was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The identifier was empty.
    #[error("{field} must not be empty")]
    Empty {
        /// Which identifier.
        field: &'static str,
    },
    /// The identifier was longer than [`ID_LEN_MAX_BYTES`].
    #[error("{field} is longer than {max} bytes")]
    TooLong {
        /// Which identifier.
        field: &'static str,
        /// The limit.
        max: usize,
    },
    /// The identifier held a control character.
    #[error("{field} contains a control character")]
    Control {
        /// Which identifier.
        field: &'static str,
    },
}

macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Parses and validates the identifier.
            ///
            /// # Errors
            /// Empty, longer than [`ID_LEN_MAX_BYTES`], or holding control characters.
            pub fn parse(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                if value.is_empty() {
                    return Err(IdError::Empty { field: $field });
                }
                if value.len() > ID_LEN_MAX_BYTES {
                    return Err(IdError::TooLong { field: $field, max: ID_LEN_MAX_BYTES });
                }
                if value.chars().any(char::is_control) {
                    return Err(IdError::Control { field: $field });
                }
                Ok(Self(value))
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::parse(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

text_id!(
    /// The tenant boundary. Always derived from the authenticated principal, never a request body.
    Scope, "scope");
text_id!(
    /// The caller's idempotency key, unique within a scope.
    OperationKey, "operation_key");
text_id!(
    /// The caller's session (the unit of session caps).
    SessionId, "session_id");
text_id!(
    /// Who is charged.
    ConsumerId, "consumer");
text_id!(
    /// Immutable revision of the input the host authorized.
    InputRevision, "input_revision");
text_id!(
    /// What the call is for.
    Intent, "intent");
text_id!(
    /// The key of an operation root, unique within a scope.
    RootKey, "root_key");
text_id!(
    /// A host-given identifier of an immutable policy, price table or output contract.
    VersionId, "version");

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh random id.
            pub fn new() -> Self {
                Self(Uuid::new_v4())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

uuid_id!(
    /// One journal row.
    ExecutionId);
uuid_id!(
    /// One governed charge.
    SettlementId);
uuid_id!(
    /// One piece of usage evidence in the inbox.
    EvidenceId);
uuid_id!(
    /// One operation root.
    RootId);

/// A fence token: the exclusive right to write an execution's journal row, bumped on each claim
/// and each recovery. A write carrying an older token affects nothing and fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FenceToken(pub i64);

/// The UTC calendar day a call is charged to; fixed at claim and never changed by recovery.
pub type AccountingDay = chrono::NaiveDate;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_ids_reject_empty_long_and_control() {
        assert!(Scope::parse("").is_err());
        assert!(Scope::parse("a".repeat(ID_LEN_MAX_BYTES + 1)).is_err());
        assert!(OperationKey::parse("a\nb").is_err());
        assert_eq!(
            OperationKey::parse("order-123").map(|k| k.to_string()),
            Ok("order-123".to_string())
        );
    }

    #[test]
    fn text_ids_validate_on_deserialize() {
        let bad: Result<Scope, _> = serde_json::from_str("\"\"");
        assert!(bad.is_err());
    }
}
