//! The one error type of the HTTP edge (spec/service.md — Errors). Each variant knows its code
//! and status; internals (store errors, runner messages) are logged here and never sent. No body
//! ever carries message content or secrets: every message is built from field names, limits and
//! ids.

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tollgate_core::caps::CapBlocked;
use tollgate_core::limits::{LimitKind, LimitRefused};
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
    /// Same key, different binding (422): the request is not the one the key was first used
    /// for, so no retry of it can succeed (SC-209).
    #[error("the operation key was first used with another request")]
    Conflict {
        /// The key.
        operation_key: String,
        /// Names of the differing fields.
        fields: Vec<String>,
    },
    /// Same key, same binding, and the first request is still being processed (409, with
    /// `Retry-After`): a retry after it gets the stored answer (SC-209).
    #[error("a request with this operation key is still being processed; retry after the Retry-After delay")]
    InProgress {
        /// The key.
        operation_key: String,
        /// The journal row, when one exists.
        execution_id: Option<String>,
    },
    /// The key's call provably never reached the provider (422 on the OpenAI-compatible door,
    /// whose success answer is a completion): nothing was sent or charged, and the key keeps
    /// this outcome, so only a new key runs the call (SC-209).
    #[error("the call under this operation key was not dispatched: nothing was sent or charged; send it again under a new Idempotency-Key")]
    NotDispatched {
        /// The key.
        operation_key: String,
        /// The journal row.
        execution_id: Option<String>,
        /// Why it never went out (`invalid`, `input`, `aborted`, `audit`, `store`, `expired`),
        /// when a journal row says.
        cause: Option<&'static str>,
    },
    /// The key's call may have reached the provider but its cost is not proven (502 on the
    /// OpenAI-compatible door): it waits for an operator, and a retry answers the same (SC-209).
    #[error("the call under this operation key may have reached the provider but its cost is not proven; it waits for an operator")]
    ReconciliationRequired {
        /// The key.
        operation_key: String,
        /// The journal row.
        execution_id: Option<String>,
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
    /// A rate or concurrency limit refused the call before dispatch (429, SC-220..SC-224).
    #[error("a rate limit refuses the call")]
    RateLimited(LimitRefused),
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
            Self::InProgress { .. }
            | Self::RootClosed(_)
            | Self::RootExpired(_)
            | Self::InvalidState(_)
            | Self::KeyInConfig(_) => StatusCode::CONFLICT,
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Invalid(_) | Self::Conflict { .. } | Self::NotDispatched { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            Self::ReconciliationRequired { .. } => StatusCode::BAD_GATEWAY,
            Self::CapBlocked(_) => StatusCode::PAYMENT_REQUIRED,
            Self::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
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
            Self::InProgress { .. } => "in_progress",
            Self::NotDispatched { .. } => "not_dispatched",
            Self::ReconciliationRequired { .. } => "reconciliation_required",
            Self::Malformed(_) | Self::Invalid(_) => "invalid_request",
            Self::TooLarge(_) => "payload_too_large",
            Self::BodyTimeout(_) => "body_timeout",
            Self::CapBlocked(_) => "cap_blocked",
            Self::RateLimited(_) => "rate_limited",
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
                error["message"] = json!(format!(
                    "the operation key was first used with another request; it differs in: {}",
                    fields.join(", ")
                ));
                error["operation_key"] = json!(operation_key);
                error["fields"] = json!(fields);
            }
            Self::InProgress {
                operation_key,
                execution_id,
            } => {
                error["operation_key"] = json!(operation_key);
                if let Some(id) = execution_id {
                    error["execution_id"] = json!(id);
                }
                error["retry_after"] = json!(RETRY_AFTER_S);
            }
            Self::NotDispatched {
                operation_key,
                execution_id,
                cause,
            } => {
                error["operation_key"] = json!(operation_key);
                if let Some(id) = execution_id {
                    error["execution_id"] = json!(id);
                }
                if let Some(cause) = cause {
                    error["cause"] = json!(cause);
                }
            }
            Self::ReconciliationRequired {
                operation_key,
                execution_id,
            } => {
                error["operation_key"] = json!(operation_key);
                if let Some(id) = execution_id {
                    error["execution_id"] = json!(id);
                }
            }
            Self::CapBlocked(b) => {
                let currency = b
                    .currency
                    .as_ref()
                    .map(|c| format!(" {c}"))
                    .unwrap_or_default();
                let kind = CapRefusal::of(b);
                let why = match kind {
                    CapRefusal::HoldsInFlight => {
                        "holds of calls in flight fill it now; room comes as they settle \
                         (retry after the Retry-After delay)"
                    }
                    CapRefusal::ExceedsCap => {
                        "the call's own hold is more than the cap leaves after settled spend; no retry \
                         helps within this cap's window"
                    }
                };
                error["message"] = json!(format!(
                    "the {} block cap refuses the call before dispatch: it needs a hold of \
                     {}{currency}, {}{currency} is left (cap {}, settled {}, held {}); {why}",
                    b.window.as_str(),
                    b.hold,
                    b.available(),
                    b.limit,
                    b.settled,
                    b.held
                ));
                error["kind"] = json!(kind.as_str());
                error["retryable"] = json!(kind == CapRefusal::HoldsInFlight);
                if kind == CapRefusal::HoldsInFlight {
                    error["retry_after"] = json!(RETRY_AFTER_S);
                }
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
            Self::RateLimited(r) => {
                let wait = if r.retryable() {
                    format!("retry after {} ms (Retry-After)", r.reset_ms)
                } else {
                    "the call alone asks more than the limit; no wait lets it in".to_string()
                };
                let counted = if r.kind == LimitKind::InFlight {
                    "calls in flight"
                } else {
                    "used in this minute's window"
                };
                error["message"] = json!(format!(
                    "the {} {} limit refuses the call before dispatch: {} of {} {counted}, the call \
                     asks {}; {wait}",
                    r.subject.kind(),
                    r.kind.field(),
                    r.used,
                    r.limit,
                    r.asked
                ));
                error["subject"] = json!(r.subject.kind());
                error["limit_kind"] = json!(r.kind.as_str());
                error["limit"] = json!(r.limit);
                error["used"] = json!(r.used);
                error["remaining"] = json!(r.remaining());
                error["asked"] = json!(r.asked);
                error["reset_ms"] = json!(r.reset_ms);
                error["retryable"] = json!(r.retryable());
                if r.retryable() {
                    error["retry_after"] = json!(r.reset_ms.div_ceil(1_000));
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

    /// The headers that tell a client whether and when to retry (SC-209, SC-210):
    /// `Retry-After` (seconds) where a retry after a short wait can succeed — a request still
    /// being processed, a cap full of other calls' holds, an unavailable store or server, a run
    /// that stopped waiting — and `x-should-retry: false` (read by the official OpenAI SDKs)
    /// where a retry of the same request answers the same: a call awaiting an operator.
    pub fn retry_headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let after = || {
            (
                axum::http::header::RETRY_AFTER,
                HeaderValue::from(RETRY_AFTER_S),
            )
        };
        match self {
            Self::InProgress { .. }
            | Self::Unavailable { .. }
            | Self::Overloaded
            | Self::Interrupted { .. }
            | Self::RequestTimeout(_) => vec![after()],
            Self::CapBlocked(b) if CapRefusal::of(b) == CapRefusal::HoldsInFlight => {
                vec![after()]
            }
            Self::ReconciliationRequired { .. } => vec![(
                HeaderName::from_static(SHOULD_RETRY),
                HeaderValue::from_static("false"),
            )],
            Self::RateLimited(r) => rate_limit_headers(r),
            _ => Vec::new(),
        }
    }

    /// The answer: status, the retry headers and `body` (tollgate's body, or a door's shape of
    /// it).
    pub fn response_with(&self, body: Value) -> Response {
        let mut response = (self.status_code(), Json(body)).into_response();
        response.headers_mut().extend(self.retry_headers());
        response
    }
}

/// The headers of a limit's refusal (SC-224), as the provider APIs send them so that the official
/// SDKs back off: `Retry-After` (whole seconds, rounded up) and `retry-after-ms` until the
/// refusing count can fall, `x-should-retry`, and the refusing limit's
/// `x-ratelimit-{limit,remaining,reset}-{requests,tokens,input-tokens,output-tokens,in-flight}`
/// (`reset` as a duration, `59.2s`). A call that alone asks more than its limit gets
/// `x-should-retry: false` and no wait.
pub fn rate_limit_headers(r: &LimitRefused) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    let mut push = |name: String, value: String| {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            out.push((name, value));
        }
    };
    if r.retryable() {
        push("retry-after".into(), r.reset_ms.div_ceil(1_000).to_string());
        push("retry-after-ms".into(), r.reset_ms.to_string());
    }
    push(SHOULD_RETRY.into(), r.retryable().to_string());
    let suffixes: &[&str] = match r.kind {
        LimitKind::Requests => &["requests"],
        LimitKind::InputTokens => &["tokens", "input-tokens"],
        LimitKind::OutputTokens => &["tokens", "output-tokens"],
        LimitKind::InFlight => &["in-flight"],
    };
    for suffix in suffixes {
        push(format!("x-ratelimit-limit-{suffix}"), r.limit.to_string());
        push(
            format!("x-ratelimit-remaining-{suffix}"),
            r.remaining().to_string(),
        );
        push(
            format!("x-ratelimit-reset-{suffix}"),
            reset_text(r.reset_ms),
        );
    }
    out
}

/// A wait as the provider APIs write it in `x-ratelimit-reset-*`: `250ms`, `1s`, `59.2s`.
pub fn reset_text(ms: u64) -> String {
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let (s, rest) = (ms / 1_000, ms % 1_000);
    if rest == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{rest:03}").trim_end_matches('0'))
    }
}

/// Seconds a client waits before retrying a request that can succeed later (`Retry-After`).
pub const RETRY_AFTER_S: u16 = 1;

/// The header the official OpenAI SDKs read before their own retry rule (`true` or `false`).
pub const SHOULD_RETRY: &str = "x-should-retry";

/// Which kind of block a cap refusal is (SC-210), decided from what the refusal knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapRefusal {
    /// Settled spend and the call's hold fit the cap: holds of calls in flight fill it now, and
    /// room comes as they settle at their real cost instead of their worst case.
    HoldsInFlight,
    /// Settled spend and the call's hold exceed the cap: no wait within the cap's window (the
    /// session, the accounting day, the root) lets this call in.
    ExceedsCap,
}

impl CapRefusal {
    /// The kind of `blocked`: `settled + hold ≤ limit` means only holds stand in the way.
    pub fn of(blocked: &CapBlocked) -> Self {
        match blocked.settled.checked_add(blocked.hold) {
            Ok(needed) if needed <= blocked.limit => Self::HoldsInFlight,
            _ => Self::ExceedsCap,
        }
    }

    /// The wire name (`kind` of the 402 body).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HoldsInFlight => "holds_in_flight",
            Self::ExceedsCap => "exceeds_cap",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.response_with(self.body())
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
            RunError::RateLimited(refused) => Self::RateLimited(refused),
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

    fn blocked(settled: &str, held: &str, hold: &str) -> ApiError {
        let m = |s: &str| tollgate_core::Money::parse(s, "t").unwrap();
        ApiError::CapBlocked(CapBlocked {
            window: tollgate_core::caps::CapWindow::Daily,
            limit: m("1.00"),
            settled: m(settled),
            held: m(held),
            hold: m(hold),
            currency: None,
        })
    }

    fn header<'a>(headers: &'a [(HeaderName, HeaderValue)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .and_then(|(_, v)| v.to_str().ok())
    }

    #[test]
    fn sc_210_a_cap_refusal_says_whether_waiting_helps() {
        // Settled 0.40 and the hold 0.50 fit the cap of 1.00: only the holds fill it.
        let full = blocked("0.40", "0.30", "0.50");
        assert_eq!(full.body()["error"]["kind"], "holds_in_flight");
        assert_eq!(full.body()["error"]["retryable"], true);
        assert_eq!(header(&full.retry_headers(), "retry-after"), Some("1"));
        // Settled 0.60 and the hold 0.50 exceed it: no settlement of other calls lets it in.
        let never = blocked("0.60", "0.00", "0.50");
        assert_eq!(never.body()["error"]["kind"], "exceeds_cap");
        assert_eq!(never.body()["error"]["retryable"], false);
        assert!(never.retry_headers().is_empty());
        // Exactly at the cap still fits.
        assert_eq!(
            blocked("0.50", "0.10", "0.50").body()["error"]["kind"],
            "holds_in_flight"
        );
    }

    fn refusal(kind: LimitKind, asked: u64, reset_ms: u64) -> LimitRefused {
        LimitRefused {
            subject: tollgate_core::limits::LimitSubject::Key("ab".into()),
            kind,
            limit: 100,
            used: 97,
            asked,
            reset_ms,
        }
    }

    #[test]
    fn sc_224_a_limit_s_refusal_is_429_with_the_provider_s_headers() {
        let requests = ApiError::RateLimited(refusal(LimitKind::Requests, 5, 59_201));
        assert_eq!(requests.status_code(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(requests.code(), "rate_limited");
        let h = requests.retry_headers();
        assert_eq!(header(&h, "retry-after"), Some("60"));
        assert_eq!(header(&h, "retry-after-ms"), Some("59201"));
        assert_eq!(header(&h, SHOULD_RETRY), Some("true"));
        assert_eq!(header(&h, "x-ratelimit-limit-requests"), Some("100"));
        assert_eq!(header(&h, "x-ratelimit-remaining-requests"), Some("3"));
        assert_eq!(header(&h, "x-ratelimit-reset-requests"), Some("59.201s"));
        let body = requests.body();
        assert_eq!(body["error"]["retry_after"], 60);
        assert_eq!(body["error"]["subject"], "key");
        assert!(!body.to_string().contains("\"ab\""), "no key in the body");
        // Tokens: the generic and the specific headers.
        let tokens =
            ApiError::RateLimited(refusal(LimitKind::OutputTokens, 5, 250)).retry_headers();
        assert_eq!(header(&tokens, "x-ratelimit-limit-tokens"), Some("100"));
        assert_eq!(
            header(&tokens, "x-ratelimit-reset-output-tokens"),
            Some("250ms")
        );
        assert_eq!(header(&tokens, "retry-after"), Some("1"));
        // A call that alone asks more than the limit: no wait, no retry.
        let never = ApiError::RateLimited(refusal(LimitKind::InputTokens, 101, 1_000));
        let h = never.retry_headers();
        assert_eq!(header(&h, "retry-after"), None);
        assert_eq!(header(&h, SHOULD_RETRY), Some("false"));
        assert_eq!(never.body()["error"]["retryable"], false);
        assert_eq!(reset_text(1_000), "1s");
        assert_eq!(reset_text(61_500), "61.5s");
    }

    #[test]
    fn sc_209_statuses_and_retry_headers_of_the_call_states() {
        let busy = ApiError::InProgress {
            operation_key: "k".into(),
            execution_id: None,
        };
        assert_eq!(busy.status_code(), StatusCode::CONFLICT);
        assert_eq!(busy.code(), "in_progress");
        assert_eq!(header(&busy.retry_headers(), "retry-after"), Some("1"));
        let conflict = ApiError::Conflict {
            operation_key: "k".into(),
            fields: vec!["config.max_tokens".into()],
        };
        assert_eq!(conflict.status_code(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(conflict.retry_headers().is_empty());
        let waiting = ApiError::ReconciliationRequired {
            operation_key: "k".into(),
            execution_id: None,
        };
        assert_eq!(waiting.status_code(), StatusCode::BAD_GATEWAY);
        assert_eq!(
            header(&waiting.retry_headers(), SHOULD_RETRY),
            Some("false")
        );
        let never = ApiError::NotDispatched {
            operation_key: "k".into(),
            execution_id: None,
            cause: Some("expired"),
        };
        assert_eq!(never.status_code(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(never.body()["error"]["cause"], "expired");
        let response = busy.clone().into_response();
        assert_eq!(response.headers()["retry-after"], "1");
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
