//! The canonical binding digest (SC-13, SC-14, SR-5, TC-4).
//!
//! The digest is sha256 over a domain-separated, length-prefixed encoding of the binding's
//! fields, where the config snapshot is encoded as canonical JSON (object keys sorted, no
//! whitespace, numbers as serde_json prints them). Any change to session, intent, input
//! revision, a version id, or any config value (temperature and tool choice included) changes
//! the digest.

use crate::config::CallConfig;
use crate::ids::{InputRevision, Intent, SessionId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// Domain separator of execution bindings.
pub const BINDING_DOMAIN: &str = "tollgate/execution-binding/v1";
/// Domain separator of operation-root bindings.
pub const ROOT_BINDING_DOMAIN: &str = "tollgate/root-binding/v1";

/// A sha256 digest, shown as lower-case hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest256(pub [u8; 32]);

impl Digest256 {
    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses lower- or upper-case hex.
    ///
    /// # Errors
    /// Not 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, String> {
        if text.len() != 64 {
            // Odd lengths are not hex; even ones are hex of another size, or not hex.
            return Err(if text.len() % 2 == 1 || hex::decode(text).is_err() {
                "digest is not hex".to_string()
            } else {
                "digest is not 32 bytes".to_string()
            });
        }
        let mut arr = [0u8; 32];
        hex::decode_to_slice(text, &mut arr).map_err(|_| "digest is not hex".to_string())?;
        Ok(Self(arr))
    }
}

impl fmt::Display for Digest256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for Digest256 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Digest256 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// Appends `part` to `out` as [`domain_digest`] frames it: its length (`u64`, big-endian), then
/// its bytes. A hash whose middle parts only a database knows can be computed there from the
/// framed bytes around them (see the audit chains' `row_hash_frame`).
pub fn push_framed(out: &mut Vec<u8>, part: &[u8]) {
    out.extend_from_slice(&(part.len() as u64).to_be_bytes());
    out.extend_from_slice(part);
}

/// Hashes `parts` under `domain` with length prefixes, so no two part lists collide.
pub fn domain_digest(domain: &str, parts: &[&[u8]]) -> Digest256 {
    let mut h = Sha256::new();
    h.update((domain.len() as u64).to_be_bytes());
    h.update(domain.as_bytes());
    for part in parts {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    Digest256(h.finalize().into())
}

/// Canonical JSON: keys sorted at every level, no insignificant whitespace, strings and numbers
/// as `serde_json` writes them. Written into one buffer, with no string made per key or per
/// value: the audit trail's rows and the binding digests compute it for every call.
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = Vec::with_capacity(128);
    write_canonical(value, &mut out);
    // Only `serde_json`'s output and ASCII punctuation were written: the bytes are UTF-8, and
    // the buffer becomes the text without a copy (the lossy reading is never reached).
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(key, out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

/// A string, number, boolean or null as `serde_json` writes it, appended to `out`. Writing a
/// scalar into a `Vec` cannot fail.
fn write_scalar<T: Serialize + ?Sized>(scalar: &T, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(out, scalar);
}

/// What an execution is bound to. Same key + same binding = replay; different = conflict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// Session.
    pub session_id: SessionId,
    /// The declared purpose of the call; a different intent under the same key conflicts.
    pub intent: Intent,
    /// Immutable revision of the input the host authorized; a different one under the same key
    /// conflicts.
    pub input_revision: InputRevision,
    /// The whole config snapshot (versions, prices, caps, limits, temperature, tools, choice).
    pub config: CallConfig,
}

impl Binding {
    /// The config snapshot as a JSON value.
    pub fn config_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).unwrap_or(serde_json::Value::Null)
    }

    /// The binding digest.
    pub fn digest(&self) -> Digest256 {
        self.digest_in(BINDING_DOMAIN)
    }

    /// The binding digest under another domain (roots use [`ROOT_BINDING_DOMAIN`]).
    pub fn digest_in(&self, domain: &str) -> Digest256 {
        self.digest_in_with(domain, &canonical_json(&self.config_json()))
    }

    /// [`Binding::digest`] from the canonical JSON of the config snapshot, computed once by a
    /// caller that digests many bindings of one config, so that the snapshot is serialized once
    /// instead of once per call (H-24). `config` must be
    /// `canonical_json(&self.config_json())`.
    pub fn digest_with(&self, config: &str) -> Digest256 {
        self.digest_in_with(BINDING_DOMAIN, config)
    }

    fn digest_in_with(&self, domain: &str, config: &str) -> Digest256 {
        domain_digest(
            domain,
            &[
                self.session_id.as_str().as_bytes(),
                self.intent.as_str().as_bytes(),
                self.input_revision.as_str().as_bytes(),
                config.as_bytes(),
            ],
        )
    }

    /// Names of the fields that differ from `other` (SC-14): `session_id`, `intent`,
    /// `input_revision`, and `config.<key>` for each differing top-level config key (the
    /// version ids appear as `config.policy_version` and so on).
    pub fn differing_fields(&self, other: &Binding) -> Vec<String> {
        let mut out = Vec::new();
        if self.session_id != other.session_id {
            out.push("session_id".to_string());
        }
        if self.intent != other.intent {
            out.push("intent".to_string());
        }
        if self.input_revision != other.input_revision {
            out.push("input_revision".to_string());
        }
        let (a, b) = (self.config_json(), other.config_json());
        if let (Some(a), Some(b)) = (a.as_object(), b.as_object()) {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                if a.get(key) != b.get(key) {
                    out.push(format!("config.{key}"));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fixtures::text_config;
    use crate::message::{Temperature, ToolChoice};

    fn binding() -> Binding {
        Binding {
            session_id: SessionId::parse("s-1").unwrap_or_else(|_| unreachable!()),
            intent: Intent::parse("summarize").unwrap_or_else(|_| unreachable!()),
            input_revision: InputRevision::parse("r-1").unwrap_or_else(|_| unreachable!()),
            config: text_config(),
        }
    }

    /// Canonical JSON as `serde_json` writes each part: every key and scalar made a string of
    /// its own, keys sorted. `canonical_json` must write the same bytes without those strings.
    fn canonical_by_parts(value: &serde_json::Value) -> String {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                let parts: Vec<String> = keys
                    .iter()
                    .map(|k| {
                        format!(
                            "{}:{}",
                            serde_json::Value::String((*k).clone()),
                            canonical_by_parts(&map[k.as_str()])
                        )
                    })
                    .collect();
                format!("{{{}}}", parts.join(","))
            }
            serde_json::Value::Array(items) => {
                let parts: Vec<String> = items.iter().map(canonical_by_parts).collect();
                format!("[{}]", parts.join(","))
            }
            other => other.to_string(),
        }
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            // Any characters, control characters, quotes and backslashes among them.
            any::<String>().prop_map(serde_json::Value::String),
            "[\\x00-\\x1f\"\\\\/a\\u{7f}\\u{e9}\\u{2028}\\u{1f600}]{0,12}"
                .prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                proptest::collection::btree_map(
                    "[\\x00-\\x1f\"\\\\a-zA-Z_\\u{e9}]{0,8}",
                    inner,
                    0..6
                )
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn h_41_canonical_json_is_serde_json_part_by_part(value in json_value()) {
            proptest::prop_assert_eq!(canonical_json(&value), canonical_by_parts(&value));
            // It is JSON.
            proptest::prop_assert!(
                serde_json::from_str::<serde_json::Value>(&canonical_json(&value)).is_ok()
            );
        }
    }

    #[test]
    fn h_41_canonical_json_escapes_as_serde_json() {
        let value = serde_json::json!({
            "z": "a\"b\\c/d\u{0}\u{1f}\u{8}\t\n\u{c}\r\u{7f}é\u{2028}😀",
            "a": [1, -2, 1.5, null, true, false, {"k": {}}],
            "é": "",
        });
        assert_eq!(
            canonical_json(&value),
            "{\"a\":[1,-2,1.5,null,true,false,{\"k\":{}}],\"z\":\"a\\\"b\\\\c/d\\u0000\\u001f\\b\\t\\n\\f\\r\u{7f}é\u{2028}😀\",\"é\":\"\"}"
        );
        assert_eq!(canonical_json(&value), canonical_by_parts(&value));
    }

    #[test]
    fn h_24_the_digest_from_a_canonical_snapshot_is_the_digest() {
        let b = binding();
        let canonical = canonical_json(&b.config_json());
        assert_eq!(b.digest_with(&canonical), b.digest());
        // Another session under the same snapshot: still the same computation.
        let mut other = binding();
        other.session_id = SessionId::parse("s-2").unwrap_or_else(|_| unreachable!());
        assert_eq!(other.digest_with(&canonical), other.digest());
        assert_ne!(other.digest(), b.digest());
    }

    #[test]
    fn sc_14_any_binding_change_changes_the_digest_and_is_named() {
        let base = binding();
        let mut changed = base.clone();
        changed.config.temperature = Temperature::parse("0.2").ok();
        assert_ne!(base.digest(), changed.digest());
        assert_eq!(base.differing_fields(&changed), ["config.temperature"]);

        let mut changed = base.clone();
        changed.input_revision = InputRevision::parse("r-2").unwrap_or_else(|_| unreachable!());
        changed.config.policy_version =
            crate::ids::VersionId::parse("policy-2").unwrap_or_else(|_| unreachable!());
        assert_ne!(base.digest(), changed.digest());
        assert_eq!(
            base.differing_fields(&changed),
            ["input_revision", "config.policy_version"]
        );
    }

    #[test]
    fn tc_4_absent_and_explicit_auto_tool_choice_differ() {
        let mut a = binding();
        a.config.kind = crate::state::CallKind::Step;
        let mut b = a.clone();
        b.config.tool_choice = Some(ToolChoice::Auto);
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn sc_13_equal_bindings_digest_equally() {
        assert_eq!(binding().digest(), binding().digest());
        let d = binding().digest();
        assert_eq!(Digest256::from_hex(&d.to_hex()), Ok(d));
        assert_eq!(Digest256::from_hex(&d.to_hex().to_uppercase()), Ok(d));
    }

    #[test]
    fn a_digest_reads_only_from_64_hex_digits() {
        let not_hex = Err("digest is not hex".to_string());
        let not_32 = Err("digest is not 32 bytes".to_string());
        assert_eq!(Digest256::from_hex("abc"), not_hex);
        assert_eq!(Digest256::from_hex(&"g".repeat(64)), not_hex);
        assert_eq!(Digest256::from_hex(&"g".repeat(62)), not_hex);
        assert_eq!(Digest256::from_hex(""), not_32);
        assert_eq!(Digest256::from_hex(&"ab".repeat(31)), not_32);
        assert_eq!(Digest256::from_hex(&"ab".repeat(33)), not_32);
        assert_eq!(
            Digest256::from_hex(&"ab".repeat(32)),
            Ok(Digest256([0xab; 32]))
        );
    }

    #[test]
    fn canonical_json_sorts_keys_and_is_domain_separated() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"b":1,"a":{"d":[1,{"z":1,"y":2}],"c":null}}"#)
                .unwrap_or_default();
        assert_eq!(
            canonical_json(&v),
            r#"{"a":{"c":null,"d":[1,{"y":2,"z":1}]},"b":1}"#
        );
        assert_ne!(
            domain_digest("a", &[b"bc"]),
            domain_digest("a", &[b"b", b"c"])
        );
        assert_ne!(domain_digest("a", &[b"x"]), domain_digest("b", &[b"x"]));
    }
}
