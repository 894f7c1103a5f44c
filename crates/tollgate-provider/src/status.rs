//! What an HTTP error status before any stream proves about the request (SC-96).
//!
//! A status settles at zero only when it proves the provider did not process the request: the
//! provider's own error body with a status that providers use to reject a request before any
//! work. Anything else — a gateway's HTML or empty body, or a provider status that may come after
//! the request was taken (500, 502, 504) — is ambiguous: the provider may have processed and
//! billed it, so an operator decides. The table is in `spec/providers.md` (Send failures).

use crate::protocol::Protocol;
use serde_json::Value;

/// What an HTTP error status proves about the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusClass {
    /// The provider rejected the request before processing it: it settles at zero.
    NotProcessed,
    /// The request may have been processed (and billed): its cost is unknown.
    Ambiguous,
}

/// Statuses with which every provider rejects a request before any work: bad request,
/// authentication, permission, not found, conflict, too large, unprocessable, rate limit.
const REJECTED: [u16; 8] = [400, 401, 403, 404, 409, 413, 422, 429];

/// Classifies an HTTP error status answered before any stream.
///
/// `provider_body` says whether the body is the provider's own error format
/// ([`is_provider_error_body`]); without it the answer came from something in between (a gateway,
/// a load balancer, a proxy) and proves nothing about the provider.
pub fn classify(protocol: Protocol, status: u16, provider_body: bool) -> StatusClass {
    if !provider_body {
        return StatusClass::Ambiguous;
    }
    if REJECTED.contains(&status) {
        return StatusClass::NotProcessed;
    }
    let overloaded = match protocol {
        // Anthropic's `overloaded_error`: the API turned the request away under load.
        Protocol::Anthropic => status == 529,
        // OpenAI's "engine overloaded / slow down": the request was turned away under load.
        Protocol::OpenAiChat | Protocol::OpenAiResponses => status == 503,
    };
    if overloaded {
        StatusClass::NotProcessed
    } else {
        StatusClass::Ambiguous
    }
}

/// Whether `body` is the provider's own error body: OpenAI `{"error": {"type" or "code": …}}`,
/// Anthropic `{"type": "error", "error": {"type": …}}`. HTML, empty, truncated or other JSON is
/// not.
pub fn is_provider_error_body(protocol: Protocol, body: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let error = value.get("error");
    let string = |v: Option<&Value>, key: &str| {
        v.and_then(|e| e.get(key))
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    match protocol {
        Protocol::OpenAiChat | Protocol::OpenAiResponses => {
            error.is_some_and(Value::is_object) && (string(error, "type") || string(error, "code"))
        }
        Protocol::Anthropic => {
            value.get("type").and_then(Value::as_str) == Some("error")
                && error.is_some_and(Value::is_object)
                && string(error, "type")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use StatusClass::{Ambiguous, NotProcessed};

    const ALL: [Protocol; 3] = [
        Protocol::OpenAiChat,
        Protocol::OpenAiResponses,
        Protocol::Anthropic,
    ];

    #[test]
    fn sc_96_rejections_with_a_provider_body_were_not_processed() {
        for protocol in ALL {
            for status in [400, 401, 403, 404, 409, 413, 422, 429] {
                assert_eq!(
                    classify(protocol, status, true),
                    NotProcessed,
                    "{protocol:?} {status}"
                );
            }
        }
    }

    #[test]
    fn sc_96_overload_with_a_provider_body_was_not_processed() {
        assert_eq!(classify(Protocol::Anthropic, 529, true), NotProcessed);
        assert_eq!(classify(Protocol::OpenAiChat, 503, true), NotProcessed);
        assert_eq!(classify(Protocol::OpenAiResponses, 503, true), NotProcessed);
        // Not each other's overload status.
        assert_eq!(classify(Protocol::Anthropic, 503, true), Ambiguous);
        assert_eq!(classify(Protocol::OpenAiChat, 529, true), Ambiguous);
        assert_eq!(classify(Protocol::OpenAiResponses, 529, true), Ambiguous);
    }

    #[test]
    fn sc_96_server_errors_with_a_provider_body_are_ambiguous() {
        for protocol in ALL {
            for status in [500, 502, 504] {
                assert_eq!(
                    classify(protocol, status, true),
                    Ambiguous,
                    "{protocol:?} {status}"
                );
            }
        }
    }

    #[test]
    fn sc_96_other_statuses_with_a_provider_body_are_ambiguous() {
        for protocol in ALL {
            for status in [300, 307, 402, 405, 408, 410, 418, 451, 501, 599] {
                assert_eq!(
                    classify(protocol, status, true),
                    Ambiguous,
                    "{protocol:?} {status}"
                );
            }
        }
    }

    #[test]
    fn sc_96_any_status_without_a_provider_body_is_ambiguous() {
        for protocol in ALL {
            for status in [
                300, 307, 400, 401, 403, 404, 409, 413, 422, 429, 500, 502, 503, 504, 529,
            ] {
                assert_eq!(
                    classify(protocol, status, false),
                    Ambiguous,
                    "{protocol:?} {status}"
                );
            }
        }
    }

    #[test]
    fn sc_96_openai_error_bodies_are_recognized() {
        let yes: [&[u8]; 4] = [
            br#"{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
            br#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#,
            br#"{"error":{"code":"invalid_api_key","message":"bad key"}}"#,
            br#"{"error":{"type":"invalid_request_error"}}"#,
        ];
        let no: [&[u8]; 7] = [
            b"",
            b"<html><body><h1>502 Bad Gateway</h1></body></html>",
            b"Bad Gateway",
            br#"{"error":"upstream connect error"}"#,
            br#"{"error":{"message":"no type or code"}}"#,
            br#"{"message":"Internal server error"}"#,
            br#"{"error":{"type":"server_error""#,
        ];
        for protocol in [Protocol::OpenAiChat, Protocol::OpenAiResponses] {
            for body in yes {
                assert!(
                    is_provider_error_body(protocol, body),
                    "{protocol:?} {body:?}"
                );
            }
            for body in no {
                assert!(
                    !is_provider_error_body(protocol, body),
                    "{protocol:?} {body:?}"
                );
            }
        }
    }

    #[test]
    fn sc_96_anthropic_error_bodies_are_recognized() {
        let yes: [&[u8]; 3] = [
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"x"},"request_id":"req_1"}"#,
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"x"}}"#,
        ];
        let no: [&[u8]; 7] = [
            b"",
            b"<html><body>504 Gateway Time-out</body></html>",
            br#"{"error":{"type":"server_error","message":"x"}}"#,
            br#"{"type":"error","error":{"message":"no type"}}"#,
            br#"{"type":"error","error":"overloaded"}"#,
            br#"{"type":"message","error":{"type":"api_error"}}"#,
            br#"{"type":"error","error":{"type":"overloaded_error""#,
        ];
        for body in yes {
            assert!(
                is_provider_error_body(Protocol::Anthropic, body),
                "{body:?}"
            );
        }
        for body in no {
            assert!(
                !is_provider_error_body(Protocol::Anthropic, body),
                "{body:?}"
            );
        }
    }
}
