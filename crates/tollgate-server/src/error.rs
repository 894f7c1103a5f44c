//! The one error type of the HTTP edge (spec/service.md — Errors). Each variant knows its code
//! and status; internals (store errors, runner messages) are logged here and never sent. No body
//! ever carries message content or secrets: every message is built from field names, limits and
//! ids.

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tollgate_core::caps::CapBlocked;
use tollgate_runner::{Interruption, RunError};
use tollgate_store::StoreError;

/// Largest request body, in bytes. Inputs are bounded per profile (`max_input_chars`, at most
/// ten million UTF-16 code units); this bounds what is read before that check.
pub const BODY_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Every error the HTTP API answers with; each variant has a stable code and status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// No or unknown key (401).
    #[error("a valid API key is required")]
    Unauthenticated,
    /// The key's role may not do this (403).
    #[error("this key's role may not do this")]
    Forbidden,
    /// Nothing under that key in this scope (404), also for another scope's keys.
    #[error("{0} not found")]
    NotFound(String),
    /// Same key, different binding (409).
    #[error("operation key is bound differently")]
    Conflict {
        /// The key.
        operation_key: String,
        /// Names of the differing fields.
        fields: Vec<String>,
    },
    /// Malformed body (400).
    #[error("{0}")]
    Malformed(String),
    /// A body larger than the route accepts (413).
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    /// A well-formed body that cannot be run (422): unknown profile, non-text message,
    /// oversized input, a bad identifier.
    #[error("{0}")]
    Invalid(String),
    /// A block cap refused the call before dispatch (402).
    #[error("a block cap refuses the call")]
    CapBlocked(CapBlocked),
    /// The root is closed (409).
    #[error("root {0} is closed")]
    RootClosed(String),
    /// The root is expired (409).
    #[error("root {0} is expired")]
    RootExpired(String),
    /// A key from `[[keys]]` of the configuration cannot be revoked (409): it stops working when
    /// removed from the configuration and the server restarts.
    #[error("key {0} is configured in [[keys]]: it cannot be revoked; remove it from the configuration and restart")]
    KeyInConfig(String),
    /// The execution is not in a state this operation applies to (409).
    #[error("{0}")]
    InvalidState(String),
    /// A store failed (503): read `operation_key` back later.
    #[error("a store is unavailable")]
    Unavailable {
        /// The key to read back, when the request had one.
        operation_key: Option<String>,
    },
    /// The run stopped waiting (504); a dispatched call finishes in the background.
    #[error("the call did not finish in time")]
    Interrupted {
        /// The key to read back.
        operation_key: String,
        /// Why.
        cause: &'static str,
    },
    /// The request took longer than `[server] request_timeout_ms` (504); a run it started
    /// was told to stop waiting (a sent call finishes in the background).
    #[error("the request took longer than {0} ms")]
    RequestTimeout(u64),
    /// The request's body did not arrive within `[server] body_read_timeout_ms` (408).
    #[error("the request body did not arrive within {0} ms")]
    BodyTimeout(u64),
    /// More requests in flight than `[server] concurrency_limit` (503): retry later.
    #[error("the server is at its concurrency limit; retry later")]
    Overloaded,
    /// No such route (404) or method (405).
    #[error("no such route")]
    NoRoute(StatusCode),
    /// A server bug (500); details are in the log only.
    #[error("internal error")]
    Internal,
}

impl ApiError {
    /// The HTTP status.
    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict { .. }
            | Self::RootClosed(_)
            | Self::RootExpired(_)
            | Self::InvalidState(_)
            | Self::KeyInConfig(_) => StatusCode::CONFLICT,
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::CapBlocked(_) => StatusCode::PAYMENT_REQUIRED,
            Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Interrupted { .. } | Self::RequestTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::NoRoute(status) => *status,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::NotFound(_) => "not_found",
            Self::Conflict { .. } => "conflict",
            Self::Malformed(_) | Self::Invalid(_) => "invalid_request",
            Self::TooLarge(_) => "payload_too_large",
            Self::BodyTimeout(_) => "body_timeout",
            Self::CapBlocked(_) => "cap_blocked",
            Self::RootClosed(_) => "root_closed",
            Self::RootExpired(_) => "root_expired",
            Self::InvalidState(_) => "invalid_state",
            Self::KeyInConfig(_) => "key_in_config",
            Self::Unavailable { .. } | Self::Overloaded => "unavailable",
            Self::Interrupted { .. } | Self::RequestTimeout(_) => "interrupted",
            Self::NoRoute(s) if *s == StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            Self::NoRoute(_) => "not_found",
            Self::Internal => "internal",
        }
    }

    /// The JSON body: `{"error": {"code", "message", …}}`.
    pub fn body(&self) -> Value {
        let mut error = json!({"code": self.code(), "message": self.to_string()});
        match self {
            Self::Conflict {
                operation_key,
                fields,
            } => {
                error["operation_key"] = json!(operation_key);
                error["fields"] = json!(fields);
            }
            Self::CapBlocked(b) => {
                let currency = b
                    .currency
                    .as_ref()
                    .map(|c| format!(" {c}"))
                    .unwrap_or_default();
                error["message"] = json!(format!(
                    "the {} block cap refuses the call before dispatch: it needs a hold of \
                     {}{currency}, {}{currency} is left (cap {}, settled {}, held {})",
                    b.window.as_str(),
                    b.hold,
                    b.available(),
                    b.limit,
                    b.settled,
                    b.held
                ));
                error["cap"] = json!(b.window.as_str());
                error["level"] = json!("block");
                error["limit"] = json!(b.limit);
                error["settled"] = json!(b.settled);
                error["held"] = json!(b.held);
                error["hold"] = json!(b.hold);
                error["available"] = json!(b.available());
                if let Some(currency) = &b.currency {
                    error["currency"] = json!(currency);
                }
            }
            Self::Unavailable {
                operation_key: Some(key),
            } => {
                error["operation_key"] = json!(key);
                error["message"] = json!("a store is unavailable; read the operation back later");
            }
            Self::Interrupted {
                operation_key,
                cause,
            } => {
                error["operation_key"] = json!(operation_key);
                error["cause"] = json!(cause);
            }
            Self::RequestTimeout(_) => error["cause"] = json!("request_timeout"),
            _ => {}
        }
        json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status_code(), Json(self.body())).into_response()
    }
}

impl From<RunError> for ApiError {
    fn from(error: RunError) -> Self {
        match error {
            RunError::InvalidRequest(message) => Self::Invalid(message),
            RunError::Conflict {
                operation_key,
                fields,
            } => Self::Conflict {
                operation_key: operation_key.to_string(),
                fields,
            },
            RunError::CapBlocked(blocked) => Self::CapBlocked(blocked),
            RunError::Store {
                operation_key,
                source,
            } => {
                tracing::warn!(%operation_key, error = %source, "store failure");
                Self::Unavailable {
                    operation_key: Some(operation_key.to_string()),
                }
            }
            RunError::RootClosed(root) => Self::RootClosed(root),
            RunError::RootExpired(root) => Self::RootExpired(root),
            RunError::RootNotFound(root) => Self::NotFound(format!("root {root}")),
            RunError::Interrupted {
                operation_key,
                cause,
            } => Self::Interrupted {
                operation_key: operation_key.to_string(),
                cause: match cause {
                    Interruption::Timeout => "timeout",
                    Interruption::Aborted => "aborted",
                    Interruption::Deadline => "deadline",
                },
            },
            RunError::InvalidConfig(reason) => {
                tracing::error!(%reason, "runner configuration rejected at run time");
                Self::Internal
            }
        }
    }
}

/// The message of a request naming a profile that is not loaded: it names the field's meaning,
/// never the value sent (which could be anything a caller typed).
pub const UNKNOWN_PROFILE: &str = "no loaded profile has that name (GET /v1/profiles lists them)";

impl From<tollgate_runner::stated::ResolveError> for ApiError {
    fn from(e: tollgate_runner::stated::ResolveError) -> Self {
        use tollgate_runner::stated::ResolveError as R;
        match e {
            R::Store(e) => e.into(),
            refused @ (R::OutOfRange { .. } | R::OverHold { .. } | R::Unpriced(_)) => {
                Self::Invalid(refused.to_string())
            }
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound(what) => Self::NotFound(what),
            StoreError::StaleFence(id) => Self::InvalidState(format!(
                "execution {id} is not in a state this operation applies to"
            )),
            other => {
                tracing::warn!(error = %other, "store failure");
                Self::Unavailable {
                    operation_key: None,
                }
            }
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return Self::TooLarge(BODY_BYTES_MAX);
        }
        Self::Malformed(format!("cannot read the body: {}", rejection.body_text()))
    }
}

impl From<PathRejection> for ApiError {
    fn from(_: PathRejection) -> Self {
        Self::Malformed("invalid path parameter".into())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(_: QueryRejection) -> Self {
        Self::Malformed("invalid query string".into())
    }
}

/// Longest field name quoted back in an error, in characters.
const FIELD_NAME_MAX_CHARS: usize = 64;

/// A JSON body error by field path, expectation and position only (SC-135): serde's own
/// messages can quote values, so only the parts that never hold one are kept — the path (made of
/// field names and indexes), an unknown field's name, a missing field's name, and the text after
/// the last ", expected " (serde builds it from type and variant names).
pub fn malformed_json(path: &str, error: &serde_json::Error) -> ApiError {
    let position = format!("line {}, column {}", error.line(), error.column());
    if !matches!(error.classify(), serde_json::error::Category::Data) {
        return ApiError::Malformed(format!("the request body is not valid JSON ({position})"));
    }
    let message = error.to_string();
    let at = if path == "." || path.is_empty() {
        "the request body".to_string()
    } else {
        format!("field {}", printable(path, 200))
    };
    let detail = if let Some(rest) = message.strip_prefix("unknown field `") {
        let name = rest.split('`').next().unwrap_or_default();
        format!(
            "unknown field `{}`{}",
            printable(name, FIELD_NAME_MAX_CHARS),
            expected(&message)
        )
    } else if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or_default();
        format!("missing field `{}`", printable(name, FIELD_NAME_MAX_CHARS))
    } else if message.starts_with("unknown variant") {
        format!("unknown variant{}", expected(&message))
    } else if message.starts_with("invalid type") {
        format!("wrong type{}", expected(&message))
    } else if message.starts_with("invalid length") || message.starts_with("invalid value") {
        format!("invalid value{}", expected(&message))
    } else {
        "does not have the expected shape".to_string()
    };
    ApiError::Malformed(format!("{at}: {detail} ({position})"))
}

/// ", expected …" of a serde message, when it carries no quoted value.
fn expected(message: &str) -> String {
    let Some(at) = message.rfind(", expected ") else {
        return String::new();
    };
    let tail = &message[at + ", expected ".len()..];
    let tail = tail.split(" at line ").next().unwrap_or_default();
    if tail.contains('"') || tail.len() > 200 {
        return String::new();
    }
    format!(", expected {tail}")
}

/// `text` cut to `max` characters, control characters replaced.
fn printable(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_errors_never_quote_the_value() {
        let e = serde_json::from_str::<Vec<u32>>(r#"["sk-secret-123"]"#).unwrap_err();
        let body = malformed_json("[0]", &e).body().to_string();
        assert!(!body.contains("sk-secret"), "{body}");
        assert!(body.contains("invalid_request"), "{body}");
    }

    #[test]
    fn store_failures_hide_internals_and_carry_the_key() {
        let e = ApiError::from(RunError::Store {
            operation_key: tollgate_core::ids::OperationKey::parse("k-1").unwrap(),
            source: StoreError::Unavailable("connection refused to 10.0.0.1".into()),
        });
        assert_eq!(e.status_code(), StatusCode::SERVICE_UNAVAILABLE);
        let body = e.body().to_string();
        assert!(body.contains("\"operation_key\":\"k-1\""), "{body}");
        assert!(!body.contains("10.0.0.1"), "{body}");
    }
}
