//! Fetching a finished response's usage after the stream was lost (spec/providers.md — Evidence
//! fetch, SC-110).
//!
//! Only OpenAI Responses can return a finished response later: `GET /v1/responses/{id}` answers
//! the stored response object (the request is sent with `store: true`). Its `usage` is read with
//! the same exact-usage rules as the stream's terminal event (SC-95). Chat Completions and
//! Anthropic Messages have no such lookup: a fetch there is [`FetchError::Unsupported`] before
//! any network access.
//!
//! A fetch is one GET: no retry, no redirect, the client's connect and read timeouts. Only the
//! status and the usage of the answer are read; its output is never kept, logged or returned.

use crate::Protocol;
use async_trait::async_trait;
use serde_json::Value;
use tollgate_core::usage::Usage;

/// Longest provider reference that is looked up, in bytes.
pub const PROVIDER_REF_LEN_MAX_BYTES: usize = 200;
/// Largest answer body read, in bytes (the stored response carries the output too).
pub const FETCH_BODY_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Usage read from a finished response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedUsage {
    /// The response id that was looked up.
    pub provider_ref: String,
    /// The provider's status of the response (`completed`, `incomplete`, `failed`, ...).
    pub status: String,
    /// Usage in disjoint classes.
    pub usage: Usage,
    /// Whether the counts are exact (SC-95); inexact counts are never settled.
    pub exact: bool,
}

/// Why no usage was fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The protocol has no way to look a response up later.
    #[error("{0} cannot fetch a finished response: evidence must come from an operator")]
    Unsupported(Protocol),
    /// The reference cannot be a response id of this provider (empty, too long, odd characters).
    #[error("the provider reference is not a response id")]
    InvalidRef,
    /// The provider does not know the response (not stored, expired, or another id).
    #[error("the provider has no stored response with this id")]
    NotFound,
    /// The response has not finished (still `queued` or `in_progress`): no final usage yet.
    #[error("the response is not finished (status {0})")]
    NotFinished(String),
    /// The response carries no usage object.
    #[error("the stored response carries no usage")]
    NoUsage,
    /// Another HTTP status.
    #[error("the provider answered HTTP {0}")]
    Status(u16),
    /// No answer (connect failure, timeout, reset).
    #[error("no answer from the provider: {0}")]
    NoResponse(String),
    /// The answer is not a response object.
    #[error("the provider's answer is not a response object: {0}")]
    Malformed(String),
}

impl FetchError {
    /// A stable name for reports: `unsupported`, `invalid_ref`, `not_found`, `not_finished`,
    /// `no_usage`, `status`, `no_response`, `malformed`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unsupported(_) => "unsupported",
            Self::InvalidRef => "invalid_ref",
            Self::NotFound => "not_found",
            Self::NotFinished(_) => "not_finished",
            Self::NoUsage => "no_usage",
            Self::Status(_) => "status",
            Self::NoResponse(_) => "no_response",
            Self::Malformed(_) => "malformed",
        }
    }
}

/// Looks up the usage of a finished response by its provider reference.
#[async_trait]
pub trait UsageFetcher: Send + Sync {
    /// The protocol this fetcher speaks.
    fn protocol(&self) -> Protocol;

    /// One lookup of `provider_ref`.
    ///
    /// # Errors
    /// [`FetchError`]; `Unsupported` before any network access.
    async fn fetch_usage(&self, provider_ref: &str) -> Result<FetchedUsage, FetchError>;
}

/// Whether `id` may be put into the lookup path: 1..=200 bytes of ASCII letters, digits, `_`
/// and `-` (what OpenAI response ids are made of), so nothing can change the path.
pub fn is_response_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= PROVIDER_REF_LEN_MAX_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Reads a Responses response object: its status and its usage under the exact-usage rules.
///
/// # Errors
/// `Malformed` (not an object, no status), `NotFinished`, `NoUsage`.
pub fn responses_usage(provider_ref: &str, body: &Value) -> Result<FetchedUsage, FetchError> {
    if !body.is_object() {
        return Err(FetchError::Malformed("not a JSON object".into()));
    }
    let status = body
        .get("status")
        .and_then(Value::as_str)
        .ok_or_else(|| FetchError::Malformed("no status".into()))?;
    if matches!(status, "queued" | "in_progress") {
        return Err(FetchError::NotFinished(status.to_string()));
    }
    let usage = body
        .get("usage")
        .filter(|u| !u.is_null())
        .ok_or(FetchError::NoUsage)?;
    let (usage, exact) = crate::usage::openai(usage, "input", "output");
    Ok(FetchedUsage {
        provider_ref: provider_ref.to_string(),
        status: status.to_string(),
        usage,
        exact,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sc_110_response_ids_are_checked_before_they_reach_a_path() {
        assert!(is_response_id("resp_0123abc-DEF"));
        for bad in ["", "../x", "a/b", "a?b", "a b", "é", &"x".repeat(201)] {
            assert!(!is_response_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn sc_110_stored_responses_are_read_with_the_exact_usage_rules() {
        let body = json!({"id": "resp_1", "status": "completed", "usage": {
            "input_tokens": 10, "input_tokens_details": {"cached_tokens": 4},
            "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 2}}});
        let got = responses_usage("resp_1", &body).unwrap();
        assert!(got.exact);
        assert_eq!(got.status, "completed");
        assert_eq!(
            got.usage,
            Usage {
                input: 6,
                output: 5,
                cache_read: 4,
                cache_write: 0,
                reasoning: 2
            }
        );
        let inexact = json!({"status": "completed", "usage": {"input_tokens": 3}});
        assert!(!responses_usage("r", &inexact).unwrap().exact);
        let running = json!({"status": "in_progress", "usage": null});
        assert_eq!(
            responses_usage("r", &running),
            Err(FetchError::NotFinished("in_progress".into()))
        );
        let no_usage = json!({"status": "failed", "usage": null});
        assert_eq!(responses_usage("r", &no_usage), Err(FetchError::NoUsage));
        assert!(matches!(
            responses_usage("r", &json!([1])),
            Err(FetchError::Malformed(_))
        ));
    }
}
