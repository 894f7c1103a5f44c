//! The service functions behind the routes. They know nothing of HTTP: each takes the app, the
//! authenticated principal and plain values (body bytes, path strings) and returns a value to
//! serialize or an [`ApiError`].
//!
//! Every body and every message is validated before any runner is called, so a bad request
//! writes nothing.

pub mod admin;
pub mod anthropic;
pub mod backlog;
pub mod calls;
pub(crate) mod door;
pub mod finance;
pub mod keys;
pub mod openai;
pub(crate) mod owner;
pub mod roots;

use crate::error::{malformed_json, ApiError};
use futures::FutureExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::future::Future;
use tokio_util::sync::CancellationToken;
use tollgate_core::config::CallConfig;
use tollgate_core::ids::{IdError, OperationKey};
use tollgate_core::message::Message;
use tollgate_runner::input::check_input;
use tollgate_runner::structured::STRUCTURED_PREFIX;
use tollgate_runner::InputLoader;
use tollgate_runner::RunError;
use tollgate_store::StoreError;

/// The `input` of a call or step body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputBody {
    /// The conversation: `{role, content}` with `role` `user` or `assistant` and `content` a
    /// string or a list of parts.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Message>,
}

/// Parses a JSON body; an empty body reads as `{}`. Errors name the field path, what was
/// expected and the position, never a value (SC-135).
///
/// # Errors
/// `invalid_request` (400).
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    let mut reader = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut reader)
        .map_err(|e| malformed_json(&e.path().to_string(), e.inner()))?;
    reader.end().map_err(|e| malformed_json(".", &e))?;
    Ok(value)
}

/// Parses an identifier (422 naming the field on failure).
///
/// # Errors
/// `invalid_request` (422).
pub fn id<T>(parse: fn(String) -> Result<T, IdError>, text: String) -> Result<T, ApiError> {
    parse(text).map_err(|e| ApiError::Invalid(e.to_string()))
}

/// Parses a caller's key: identifiers under the structured runner's reserved prefix are not
/// the caller's to use (SR-4).
///
/// # Errors
/// `invalid_request` (422).
pub fn caller_id<T>(parse: fn(String) -> Result<T, IdError>, text: String) -> Result<T, ApiError> {
    if text.starts_with(STRUCTURED_PREFIX) {
        return Err(ApiError::Invalid(format!(
            "keys starting with {STRUCTURED_PREFIX} are reserved"
        )));
    }
    id(parse, text)
}

/// Checks messages against a profile's snapshot (kind, count, sizes, context window) and wraps
/// them as the runner's input loader, which then only hands back what was checked.
///
/// # Errors
/// `invalid_request` (422) naming the check, never the content.
pub fn checked_input(config: &CallConfig, messages: Vec<Message>) -> Result<InputLoader, ApiError> {
    check_input(config, &messages).map_err(|e| ApiError::Invalid(e.to_string()))?;
    Ok(async move { Ok(messages) }.boxed())
}

/// A store failure while working on `key`: 503 carrying the key to read back (the store's
/// message goes to the log only).
pub fn store_failure(key: &OperationKey, source: StoreError) -> ApiError {
    ApiError::from(RunError::Store {
        operation_key: key.clone(),
        source,
    })
}

/// Runs `work` in its own task, so that a caller that hangs up does not cut a run in the
/// middle: the dropped request fires `cancel` instead, and the runner stops waiting the way it
/// does for any caller signal (a call not yet sent is not sent; a sent one drains and settles in
/// the background, SC-60).
///
/// The task is spawned here, before the answer is awaited, so the future the caller awaits holds
/// the task's handle and `cancel`'s guard only: a call's run (tens of KiB of state) lives once,
/// in its task, and not a second time in the request's future while it waits.
///
/// # Errors
/// `work`'s error; `internal` if the task panicked.
pub fn detached<T: Send + 'static>(
    work: impl Future<Output = Result<T, ApiError>> + Send + 'static,
    cancel: CancellationToken,
) -> impl Future<Output = Result<T, ApiError>> + Send {
    let cancel_on_drop = cancel.drop_guard();
    // Boxed before it is spawned, so the run's state is written once, into the box, and the
    // spawn moves a pointer instead of the whole future through each of its layers.
    let task = tokio::spawn(Box::pin(work));
    async move {
        let _cancel_on_drop = cancel_on_drop;
        task.await.map_err(|e| {
            tracing::error!(error = %e, "run task failed");
            ApiError::Internal
        })?
    }
}

/// Readiness: the stores answer and, on Postgres, every migration is applied.
///
/// # Errors
/// `unavailable` (the reason goes to the log).
pub async fn ready(app: &crate::app::App) -> Result<serde_json::Value, ApiError> {
    app.backend.ready().await.map_err(|e| {
        tracing::warn!(error = %e, "not ready");
        ApiError::Unavailable {
            operation_key: None,
        }
    })?;
    Ok(serde_json::json!({"status": "ready", "stores": app.backend.name()}))
}
