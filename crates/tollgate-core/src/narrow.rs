//! What a request may set within its profile (SC-211): the profile governs, and a request
//! narrows its snapshot, never widens it. A narrowed snapshot is a snapshot like any other: the
//! call is bound to it (a replay with other values is a conflict naming them), its hold is
//! fitted to it (a lower `max_tokens` lowers the hold) and it is what the provider is sent.

use crate::config::{CallConfig, STOP_SEQUENCES_MAX};
use crate::message::{Temperature, TopP};
use std::collections::BTreeMap;

/// Longest stop sequence, in characters.
pub const STOP_CHARS_MAX: usize = 256;
/// Longest `user`, in characters.
pub const USER_CHARS_MAX: usize = 256;
/// Most `metadata` pairs.
pub const METADATA_PAIRS_MAX: usize = 16;
/// Longest `metadata` key, in characters.
pub const METADATA_KEY_CHARS_MAX: usize = 64;
/// Longest `metadata` value, in characters.
pub const METADATA_VALUE_CHARS_MAX: usize = 512;

/// The values a request sets; `None` (or empty) leaves the profile's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Narrowing {
    /// The output token cap, at most the profile's.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<Temperature>,
    /// Nucleus sampling.
    pub top_p: Option<TopP>,
    /// Stop sequences (empty: none set).
    pub stop: Vec<String>,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// The end user.
    pub user: Option<String>,
    /// Metadata (empty: none set).
    pub metadata: BTreeMap<String, String>,
}

/// Why a request's value cannot narrow the profile. Names the field and the profile's bound,
/// never the value sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NarrowError {
    /// Above what the profile allows.
    #[error("{field}: at most the profile's {max}")]
    AboveProfile {
        /// The request field.
        field: &'static str,
        /// The profile's value.
        max: u64,
    },
    /// The profile sets it: a request may send only the profile's value.
    #[error("{field}: the profile fixes it; send the profile's value or leave it out")]
    Fixed {
        /// The request field.
        field: &'static str,
    },
    /// The profile does not let requests set it (`request_fields.sampling = false`).
    #[error("{field}: the profile does not let a request set it")]
    NotPermitted {
        /// The request field.
        field: &'static str,
    },
    /// Not a value the field takes.
    #[error("{field}: {reason}")]
    Invalid {
        /// The request field.
        field: &'static str,
        /// What is expected.
        reason: String,
    },
}

impl Narrowing {
    /// Whether the request sets nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> NarrowError {
    NarrowError::Invalid {
        field,
        reason: reason.into(),
    }
}

fn printable(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// A sampling value: the profile's fixes it; else the request sets it when sampling is open.
fn sampled<T: PartialEq + Copy>(
    field: &'static str,
    profile: Option<T>,
    request: Option<T>,
    open: bool,
) -> Result<Option<T>, NarrowError> {
    match (profile, request) {
        (_, None) => Ok(profile),
        (Some(p), Some(r)) if p == r => Ok(profile),
        (Some(_), Some(_)) => Err(NarrowError::Fixed { field }),
        (None, Some(_)) if !open => Err(NarrowError::NotPermitted { field }),
        (None, Some(r)) => Ok(Some(r)),
    }
}

impl CallConfig {
    /// This snapshot narrowed by a request's values (SC-211): `max_tokens` at most the
    /// profile's; `temperature`, `top_p`, `stop` and `seed` set only where the profile sets none
    /// and `request_fields.sampling` allows (a value equal to the profile's is no change);
    /// `user` and `metadata` recorded. Equal to `self` when the request changes nothing.
    ///
    /// # Errors
    /// The first field that would widen the profile or is not a value it takes.
    pub fn narrowed(&self, n: &Narrowing) -> Result<CallConfig, NarrowError> {
        let mut out = self.clone();
        if let Some(max) = n.max_tokens {
            if max == 0 {
                return Err(invalid("max_tokens", "at least 1"));
            }
            if max > self.max_tokens {
                return Err(NarrowError::AboveProfile {
                    field: "max_tokens",
                    max: self.max_tokens.into(),
                });
            }
            out.max_tokens = max;
        }
        let open = self.request_fields.sampling;
        out.temperature = sampled("temperature", self.temperature, n.temperature, open)?;
        out.top_p = sampled("top_p", self.top_p, n.top_p, open)?;
        out.seed = sampled("seed", self.seed, n.seed, open)?;
        if !n.stop.is_empty() && n.stop != self.stop {
            if !self.stop.is_empty() {
                return Err(NarrowError::Fixed { field: "stop" });
            }
            if !open {
                return Err(NarrowError::NotPermitted { field: "stop" });
            }
            if n.stop.len() > STOP_SEQUENCES_MAX {
                return Err(invalid(
                    "stop",
                    format!("at most {STOP_SEQUENCES_MAX} sequences"),
                ));
            }
            let fits = |s: &String| !s.is_empty() && s.chars().count() <= STOP_CHARS_MAX;
            if !n.stop.iter().all(fits) {
                return Err(invalid(
                    "stop",
                    format!("each sequence 1 to {STOP_CHARS_MAX} characters"),
                ));
            }
            out.stop = n.stop.clone();
        }
        if let Some(user) = &n.user {
            if user.is_empty() || user.chars().count() > USER_CHARS_MAX || !printable(user) {
                return Err(invalid(
                    "user",
                    format!("1 to {USER_CHARS_MAX} characters, no control characters"),
                ));
            }
            out.user = Some(user.clone());
        }
        if !n.metadata.is_empty() {
            if n.metadata.len() > METADATA_PAIRS_MAX {
                return Err(invalid(
                    "metadata",
                    format!("at most {METADATA_PAIRS_MAX} pairs"),
                ));
            }
            let fits = |(k, v): (&String, &String)| {
                !k.is_empty()
                    && k.chars().count() <= METADATA_KEY_CHARS_MAX
                    && v.chars().count() <= METADATA_VALUE_CHARS_MAX
                    && printable(k)
            };
            if !n.metadata.iter().all(fits) {
                return Err(invalid(
                    "metadata",
                    format!(
                        "keys 1 to {METADATA_KEY_CHARS_MAX} characters without control \
                         characters, values at most {METADATA_VALUE_CHARS_MAX}"
                    ),
                ));
            }
            out.metadata = n.metadata.clone();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fixtures::text_config;
    use crate::digest::Binding;
    use crate::hold::fitted_hold;
    use crate::ids::{InputRevision, Intent, SessionId};
    use crate::message::{Message, Role};

    fn t(text: &str) -> Temperature {
        Temperature::parse(text).unwrap()
    }

    #[test]
    fn sc_211_nothing_set_is_the_profile() {
        let c = text_config();
        assert_eq!(c.narrowed(&Narrowing::default()).unwrap(), c);
        let same = Narrowing {
            max_tokens: Some(c.max_tokens),
            ..Narrowing::default()
        };
        assert_eq!(c.narrowed(&same).unwrap(), c);
    }

    #[test]
    fn sc_211_a_lower_max_tokens_lowers_the_fitted_hold_and_a_higher_one_is_refused() {
        let c = text_config();
        let lower = c
            .narrowed(&Narrowing {
                max_tokens: Some(10),
                ..Narrowing::default()
            })
            .unwrap();
        let input = [Message::text(Role::User, "hi")];
        assert!(fitted_hold(&lower, &input).unwrap() < fitted_hold(&c, &input).unwrap());
        let higher = Narrowing {
            max_tokens: Some(c.max_tokens + 1),
            ..Narrowing::default()
        };
        assert_eq!(
            c.narrowed(&higher),
            Err(NarrowError::AboveProfile {
                field: "max_tokens",
                max: 100
            })
        );
    }

    #[test]
    fn sc_211_sampling_passes_where_the_profile_sets_none_and_is_fixed_where_it_does() {
        let mut c = text_config();
        let warm = Narrowing {
            temperature: Some(t("0.7")),
            seed: Some(7),
            stop: vec!["END".into()],
            ..Narrowing::default()
        };
        let narrowed = c.narrowed(&warm).unwrap();
        assert_eq!(narrowed.temperature, Some(t("0.7")));
        assert_eq!(narrowed.seed, Some(7));
        assert_eq!(narrowed.stop, ["END"]);
        c.temperature = Some(t("0.2"));
        assert_eq!(
            c.narrowed(&warm),
            Err(NarrowError::Fixed {
                field: "temperature"
            })
        );
        let same = Narrowing {
            temperature: Some(t("0.20")),
            ..Narrowing::default()
        };
        assert_eq!(c.narrowed(&same).unwrap(), c);
        c.temperature = None;
        c.request_fields.sampling = false;
        assert_eq!(
            c.narrowed(&warm),
            Err(NarrowError::NotPermitted {
                field: "temperature"
            })
        );
    }

    #[test]
    fn sc_211_a_narrowed_snapshot_is_another_binding_named_by_its_fields() {
        let c = text_config();
        let binding = |config: CallConfig| Binding {
            session_id: SessionId::parse("s").unwrap(),
            intent: Intent::parse("i").unwrap(),
            input_revision: InputRevision::parse("r").unwrap(),
            config,
        };
        let narrowed = c
            .narrowed(&Narrowing {
                max_tokens: Some(10),
                user: Some("end-user-1".into()),
                ..Narrowing::default()
            })
            .unwrap();
        let fields = binding(c.clone()).differing_fields(&binding(narrowed));
        assert_eq!(fields, ["config.max_tokens", "config.user"]);
        // A snapshot that sets none of the new values digests as it did without them.
        let json = serde_json::to_value(&c).unwrap();
        for key in [
            "top_p",
            "stop",
            "seed",
            "user",
            "metadata",
            "request_fields",
        ] {
            assert!(json.get(key).is_none(), "{key}");
        }
    }

    #[test]
    fn sc_211_bad_values_are_named_never_quoted() {
        let c = text_config();
        let bad = Narrowing {
            user: Some("x\u{7}sk-secret".into()),
            ..Narrowing::default()
        };
        let e = c.narrowed(&bad).unwrap_err().to_string();
        assert!(e.starts_with("user:") && !e.contains("sk-secret"), "{e}");
        let many = Narrowing {
            stop: vec!["a".into(); 5],
            ..Narrowing::default()
        };
        assert!(c
            .narrowed(&many)
            .unwrap_err()
            .to_string()
            .starts_with("stop:"));
    }
}
