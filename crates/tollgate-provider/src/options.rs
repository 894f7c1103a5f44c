//! Request options of a snapshot that a provider request carries beside the
//! [`ProviderRequest`]: nucleus sampling, stop sequences, a seed, the end user and metadata
//! (SC-211). An [`crate::http::HttpClient`] built for a snapshot carries them
//! ([`crate::http::HttpClient::with_options`]), checks them against the protocol before any
//! network access, and adds them to every request body it sends.
//!
//! | option | openai-chat | openai-responses | anthropic |
//! |---|---|---|---|
//! | `top_p` | `top_p` (not on reasoning models) | `top_p` (not on reasoning models) | `top_p` |
//! | `stop` | `stop` (not on reasoning models) | refused | `stop_sequences` |
//! | `seed` | `seed` | refused | refused |
//! | `user` | `user` | `user` | `metadata.user_id` |
//! | `metadata` | `metadata` | `metadata` | refused |
//!
//! Mock models (`mock-*`) take every option. Reasons never contain a value.

use crate::client::SendError;
use crate::support::{is_mock_model, is_openai_reasoning_model};
use crate::Protocol;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use tollgate_core::config::CallConfig;
use tollgate_core::message::TopP;

/// What a request body carries beside the [`ProviderRequest`](crate::ProviderRequest).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestOptions {
    /// Nucleus sampling.
    pub top_p: Option<TopP>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// The end user, when the snapshot sends it.
    pub user: Option<String>,
    /// Metadata, when the snapshot sends it.
    pub metadata: BTreeMap<String, String>,
}

impl RequestOptions {
    /// The options a snapshot sends: its sampling always, its `user` and `metadata` only when
    /// its `request_fields` say so (otherwise they are recorded with the call and not sent).
    pub fn of(config: &CallConfig) -> Self {
        let fields = config.request_fields;
        Self {
            top_p: config.top_p,
            stop: config.stop.clone(),
            seed: config.seed,
            user: config.user.clone().filter(|_| fields.send_user),
            metadata: if fields.send_metadata {
                config.metadata.clone()
            } else {
                BTreeMap::new()
            },
        }
    }

    /// Whether there is nothing to add.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

fn refused(option: &str, protocol: Protocol) -> SendError {
    SendError::Unsupported(format!(
        "{option} is not accepted by this {protocol} model family"
    ))
}

/// Checks `options` for `model` on `protocol`, before any network access.
///
/// # Errors
/// [`SendError::Unsupported`] naming the first option the protocol or model family does not take.
pub fn check(protocol: Protocol, model: &str, options: &RequestOptions) -> Result<(), SendError> {
    if is_mock_model(model) {
        return Ok(());
    }
    let reasoning = is_openai_reasoning_model(model);
    let (top_p, stop, seed, metadata) = match protocol {
        Protocol::OpenAiChat => (!reasoning, !reasoning, true, true),
        Protocol::OpenAiResponses => (!reasoning, false, false, true),
        Protocol::Anthropic => (true, true, false, false),
    };
    if options.top_p.is_some() && !top_p {
        return Err(refused("top_p", protocol));
    }
    if !options.stop.is_empty() && !stop {
        return Err(refused("stop", protocol));
    }
    if options.seed.is_some() && !seed {
        return Err(refused("seed", protocol));
    }
    if !options.metadata.is_empty() && !metadata {
        return Err(refused("metadata", protocol));
    }
    Ok(())
}

/// `top_p` as a JSON number, through its exact decimal text.
fn top_p_json(t: TopP) -> Value {
    serde_json::from_str::<Value>(&t.to_string())
        .ok()
        .filter(Value::is_number)
        .unwrap_or(Value::Null)
}

/// Adds `options` to a request `body` of `protocol` (a body the protocol's adapter built).
pub fn apply(protocol: Protocol, options: &RequestOptions, body: &mut Value) {
    let Value::Object(body) = body else {
        return;
    };
    if let Some(t) = options.top_p {
        body.insert("top_p".into(), top_p_json(t));
    }
    let insert = |body: &mut Map<String, Value>, key: &str, value: Value| {
        body.insert(key.into(), value);
    };
    match protocol {
        Protocol::OpenAiChat | Protocol::OpenAiResponses => {
            if !options.stop.is_empty() {
                insert(body, "stop", json!(options.stop));
            }
            if let Some(seed) = options.seed {
                insert(body, "seed", json!(seed));
            }
            if let Some(user) = &options.user {
                insert(body, "user", json!(user));
            }
            if !options.metadata.is_empty() {
                insert(body, "metadata", json!(options.metadata));
            }
        }
        Protocol::Anthropic => {
            if !options.stop.is_empty() {
                insert(body, "stop_sequences", json!(options.stop));
            }
            if let Some(user) = &options.user {
                insert(body, "metadata", json!({"user_id": user}));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> RequestOptions {
        RequestOptions {
            top_p: Some(TopP::parse("0.9").unwrap()),
            stop: vec!["END".into()],
            seed: Some(7),
            user: Some("u-1".into()),
            metadata: BTreeMap::from([("team".to_string(), "a".to_string())]),
        }
    }

    #[test]
    fn sc_211_options_per_protocol() {
        let o = options();
        assert!(check(Protocol::OpenAiChat, "gpt-4o", &o).is_ok());
        assert!(check(Protocol::OpenAiChat, "o3-mini", &o).is_err());
        assert!(check(Protocol::OpenAiResponses, "gpt-4o", &o).is_err());
        assert!(check(Protocol::Anthropic, "claude-sonnet-4-5", &o).is_err());
        let anthropic = RequestOptions {
            seed: None,
            metadata: BTreeMap::new(),
            ..options()
        };
        assert!(check(Protocol::Anthropic, "claude-sonnet-4-5", &anthropic).is_ok());
        assert!(check(Protocol::Anthropic, "mock-echo", &o).is_ok());

        let mut body = json!({"model": "gpt-4o"});
        apply(Protocol::OpenAiChat, &o, &mut body);
        assert_eq!(body["top_p"].to_string(), "0.9");
        assert_eq!(body["stop"], json!(["END"]));
        assert_eq!(body["seed"], 7);
        assert_eq!(body["user"], "u-1");
        assert_eq!(body["metadata"], json!({"team": "a"}));
        let mut body = json!({"model": "claude"});
        apply(Protocol::Anthropic, &anthropic, &mut body);
        assert_eq!(body["stop_sequences"], json!(["END"]));
        assert_eq!(body["metadata"], json!({"user_id": "u-1"}));
        assert!(body.get("seed").is_none());
    }

    #[test]
    fn sc_211_user_and_metadata_are_sent_only_when_the_snapshot_says() {
        let mut c = tollgate_core::config::fixtures::text_config();
        c.user = Some("u-1".into());
        c.metadata = BTreeMap::from([("k".to_string(), "v".to_string())]);
        assert!(RequestOptions::of(&c).is_empty());
        c.request_fields.send_user = true;
        assert_eq!(RequestOptions::of(&c).user.as_deref(), Some("u-1"));
        assert!(RequestOptions::of(&c).metadata.is_empty());
        c.request_fields.send_metadata = true;
        assert_eq!(RequestOptions::of(&c).metadata.len(), 1);
    }
}
