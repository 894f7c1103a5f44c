//! What the OpenAI-compatible door and the Anthropic Messages door share: the run of one
//! request, once each door has read its wire format into messages, a call's identity and the
//! profile's snapshot narrowed by the request (SC-211). Governance is the native API's: a text,
//! JSON or structured call through `calls`, a step under its root through `roots`.

use super::calls::{self, CallBody};
use super::roots::{self, StepBody};
use super::InputBody;
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use sha2::{Digest, Sha256};
use tollgate_core::config::CallConfig;
use tollgate_core::message::Message;
use tollgate_core::view::View;
use tracing::Instrument;

/// One door request, read.
pub(crate) struct DoorCall {
    /// The profile the request names.
    pub model: String,
    /// The `Idempotency-Key`.
    pub operation_key: String,
    /// The session (`Tollgate-Session`, or the door's default).
    pub session_id: String,
    /// The intent (`Tollgate-Intent`, or the door's default).
    pub intent: String,
    /// `Tollgate-Input-Revision`; by default a digest of the messages ([`revision_of`]).
    pub input_revision: Option<String>,
    /// `Tollgate-Root`: the root a step profile's step runs under.
    pub root_key: Option<String>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// The profile's snapshot narrowed by the request (a text, JSON or structured call).
    pub config: CallConfig,
    /// Whether the profile is a step profile.
    pub step: bool,
}

/// Runs `call` as the native API does, handing a streamed text call's events to `live`
/// (SC-213), and answers its view when it completed (any other state is the error a client's
/// retry rules understand, SC-209).
///
/// # Errors
/// As `calls::create_live` and `roots::step_checked`, and `calls::completed_answer`'s; a step
/// profile without `Tollgate-Root` is `invalid_request` (422).
pub(crate) async fn run(
    app: &App,
    who: &Principal,
    call: DoorCall,
    live: Option<tollgate_runner::live::LiveSink>,
    span: tracing::Span,
) -> Result<View, ApiError> {
    let DoorCall {
        model,
        operation_key,
        session_id,
        intent,
        input_revision,
        root_key,
        messages,
        config,
        step,
    } = call;
    let result = if step {
        let root = root_key.ok_or_else(|| {
            ApiError::Invalid(format!(
                "profile {model:?} is a step profile: name its root in the Tollgate-Root header"
            ))
        })?;
        let body = StepBody {
            operation_key,
            input: InputBody { messages },
        };
        roots::step_checked(app, who, root, body)
            .instrument(span)
            .await
    } else {
        let input_revision = input_revision.unwrap_or_else(|| revision_of(&messages));
        let body = CallBody {
            profile: model,
            operation_key,
            session_id,
            input_revision,
            intent,
            input: InputBody { messages },
        };
        calls::create_live(app, who, body, Some(config), live)
            .instrument(span)
            .await
    };
    app.metrics.observe(&result);
    calls::completed_answer(result?)
}

/// The `model` (the profile) and `stream` of a door's request, read without the rest of it. A
/// body that does not parse reads as naming no model and no stream, and is left to the door,
/// which names what is wrong.
#[derive(Debug, Default)]
pub(crate) struct Peek {
    /// The profile the request names.
    pub model: Option<String>,
    /// Whether it asks for a stream.
    pub stream: bool,
}

/// Reads a door request's [`Peek`].
pub(crate) fn peek(body: &[u8]) -> Peek {
    #[derive(serde::Deserialize)]
    struct Fields {
        #[serde(default)]
        stream: Option<bool>,
        #[serde(default)]
        model: Option<String>,
    }
    serde_json::from_slice::<Fields>(body)
        .map(|f| Peek {
            model: f.model,
            stream: f.stream.unwrap_or(false),
        })
        .unwrap_or_default()
}

/// The header that says how a stream was answered: `live` (its text as the provider sent it,
/// its end after the settlement) or `governed` (all of it after the settlement).
pub const STREAM_MODE_HEADER: &str = "tollgate-stream";

/// A stream of server-sent events, answered in `mode` (`live` or `governed`).
pub(crate) fn event_stream(mode: &'static str, body: axum::body::Body) -> axum::response::Response {
    use axum::http::{header, HeaderName};
    use axum::response::IntoResponse;
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
            (HeaderName::from_static(STREAM_MODE_HEADER), mode),
        ],
        body,
    )
        .into_response()
}

/// The body of a live stream: `opening`, then each text delta as `text` writes it (the other
/// events carry nothing for the caller), then, once the provider's stream is read and the
/// call's task answered (after its settlement), `end` of that answer. A caller that hangs up
/// drops only this body: the task goes on.
pub(crate) fn live_body<A: Send + 'static>(
    opening: String,
    events: tollgate_runner::live::LiveDeltas,
    task: tokio::task::JoinHandle<Result<A, ApiError>>,
    text: impl Fn(String) -> String + Send + 'static,
    end: impl FnOnce(Result<A, ApiError>) -> String + Send + 'static,
) -> axum::body::Body {
    use futures::StreamExt;
    use tollgate_runner::live::Live;
    let rest = futures::stream::unfold(
        (events, text, Some((task, end))),
        |(mut events, text, pending)| async move {
            let (task, end) = pending?;
            match events.recv().await {
                Some(Live::Text(delta)) => {
                    let chunk = text(delta);
                    Some((chunk, (events, text, Some((task, end)))))
                }
                Some(Live::Sent(_) | Live::Usage(_)) => {
                    Some((String::new(), (events, text, Some((task, end)))))
                }
                None => {
                    let answered = task.await.unwrap_or(Err(ApiError::Internal));
                    Some((end(answered), (events, text, None)))
                }
            }
        },
    );
    let body = futures::stream::once(async move { opening })
        .chain(rest)
        .map(|text| Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(text)));
    axum::body::Body::from_stream(body)
}

/// The default input revision: a digest of the messages, so that the same key with other
/// messages is a conflict rather than a replay of the first answer.
pub(crate) fn revision_of(messages: &[Message]) -> String {
    let text = serde_json::to_vec(messages).unwrap_or_default();
    format!("sha256-{}", short_digest(&text))
}

/// The first 16 bytes of the SHA-256 of `bytes`, in hex.
pub(crate) fn short_digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::message::Role;

    #[test]
    fn the_default_revision_follows_the_messages() {
        let a = revision_of(&[Message::text(Role::User, "a")]);
        let b = revision_of(&[Message::text(Role::User, "b")]);
        assert_ne!(a, b);
        assert!(a.len() <= 200);
    }
}
