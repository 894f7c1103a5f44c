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
    /// The identifier held an invisible format character (Unicode general category Cf), such
    /// as a bidirectional override that shows the text around it reversed.
    #[error("{field} contains an invisible format character")]
    Format {
        /// Which identifier.
        field: &'static str,
    },
}

/// Unicode's general category Cf (format characters), Unicode 15.0, as inclusive ranges in
/// code point order. They are invisible, and the bidirectional ones (U+202A..U+202E,
/// U+2066..U+2069) reorder the text shown after them, so an identifier holding one reads as
/// another in the console, a CSV or a log.
const FORMAT_CHARS: &[(char, char)] = &[
    ('\u{00AD}', '\u{00AD}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{180E}', '\u{180E}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{202A}', '\u{202E}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFF9}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0001}', '\u{E0001}'),
    ('\u{E0020}', '\u{E007F}'),
];

/// Whether `c` is a format character (general category Cf, [`FORMAT_CHARS`]).
pub fn is_format_char(c: char) -> bool {
    FORMAT_CHARS
        .binary_search_by(|&(low, high)| {
            if high < c {
                std::cmp::Ordering::Less
            } else if low > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Parses and validates an identifier given to the service (a request, the
            /// configuration, a command's argument).
            ///
            /// # Errors
            /// Empty, longer than [`ID_LEN_MAX_BYTES`], or holding control or format
            /// characters (Unicode Cc and Cf).
            pub fn parse(value: impl Into<String>) -> Result<Self, IdError> {
                let value = Self::from_stored(value)?;
                if value.0.chars().any(is_format_char) {
                    return Err(IdError::Format { field: $field });
                }
                Ok(value)
            }

            /// An identifier read back from a store (a column or stored JSON): the checks of
            /// [`Self::parse`] but the format characters, since a row written before they were
            /// refused still reads as it was written.
            ///
            /// # Errors
            /// Empty, longer than [`ID_LEN_MAX_BYTES`], or holding control characters.
            pub fn from_stored(value: impl Into<String>) -> Result<Self, IdError> {
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

        /// Deserialization reads stored JSON (bindings, snapshots, audit details), so it takes
        /// [`Self::from_stored`]; request fields arrive as text and go through [`Self::parse`].
        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::from_stored(value)
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

    /// One character of every range of Unicode 15's Cf, its ends included.
    const CF_SAMPLES: &[char] = &[
        '\u{00AD}',
        '\u{0600}',
        '\u{0605}',
        '\u{061C}',
        '\u{06DD}',
        '\u{070F}',
        '\u{0890}',
        '\u{0891}',
        '\u{08E2}',
        '\u{180E}',
        '\u{200B}',
        '\u{200C}',
        '\u{200D}',
        '\u{200E}',
        '\u{200F}',
        '\u{202A}',
        '\u{202B}',
        '\u{202C}',
        '\u{202D}',
        '\u{202E}',
        '\u{2060}',
        '\u{2064}',
        '\u{2066}',
        '\u{2069}',
        '\u{206F}',
        '\u{FEFF}',
        '\u{FFF9}',
        '\u{FFFB}',
        '\u{110BD}',
        '\u{110CD}',
        '\u{13430}',
        '\u{1343F}',
        '\u{1BCA0}',
        '\u{1BCA3}',
        '\u{1D173}',
        '\u{1D17A}',
        '\u{E0001}',
        '\u{E0020}',
        '\u{E007F}',
    ];

    #[test]
    fn sc_198_request_ids_refuse_every_format_character_naming_the_field() {
        for &c in CF_SAMPLES {
            assert!(is_format_char(c), "U+{:04X}", u32::from(c));
            let text = format!("order{c}-123");
            let refused = OperationKey::parse(text.clone()).unwrap_err();
            assert_eq!(
                refused,
                IdError::Format {
                    field: "operation_key"
                },
                "U+{:04X}",
                u32::from(c)
            );
            assert!(!refused.to_string().contains(&text));
            assert_eq!(
                ConsumerId::parse(text.clone()).unwrap_err(),
                IdError::Format { field: "consumer" }
            );
            for refused in [
                Scope::parse(text.clone()).err(),
                SessionId::parse(text.clone()).err(),
                InputRevision::parse(text.clone()).err(),
                Intent::parse(text.clone()).err(),
                RootKey::parse(text.clone()).err(),
                VersionId::parse(text.clone()).err(),
            ] {
                assert!(
                    matches!(refused, Some(IdError::Format { .. })),
                    "{refused:?}"
                );
            }
        }
        // Neighbours of the ranges and visible non-ASCII text stay identifiers.
        for c in [
            '\u{00AC}',
            '\u{00AE}',
            '\u{0606}',
            '\u{200A}',
            '\u{2010}',
            '\u{2065}',
            '\u{2070}',
            '\u{FEFE}',
            '\u{FFFC}',
            '\u{E0080}',
            'é',
            '東',
        ] {
            assert!(!is_format_char(c), "U+{:04X}", u32::from(c));
            assert!(OperationKey::parse(format!("order{c}")).is_ok());
        }
    }

    #[test]
    fn sc_198_stored_ids_with_a_format_character_still_read() {
        let written = "team\u{202E}a".to_string();
        let stored = ConsumerId::from_stored(written.clone()).unwrap();
        assert_eq!(stored.as_str(), written);
        let json = serde_json::to_string(&stored).unwrap();
        let back: ConsumerId = serde_json::from_str(&json).unwrap();
        assert_eq!(back, stored);
        // A control character was never accepted, stored or not.
        assert!(ConsumerId::from_stored("a\nb").is_err());
        assert!(ConsumerId::from_stored("").is_err());
    }

    #[test]
    fn text_ids_validate_on_deserialize() {
        let bad: Result<Scope, _> = serde_json::from_str("\"\"");
        assert!(bad.is_err());
    }
}
