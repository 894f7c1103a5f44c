//! The mock provider: a real HTTP server on loopback speaking the three wire formats in their
//! real streaming shapes, scripted by model name (spec/mock-provider.md).
//!
//! `POST /v1/chat/completions`, `POST /v1/responses` and `POST /v1/messages` answer with
//! `content-type: text/event-stream` and a request id header (`x-request-id` on the OpenAI
//! paths, `request-id` on the Anthropic path). The `model` of the request body picks the
//! behaviour; a suffix `@N` sets the output size in characters where it applies:
//!
//! | model | behaviour |
//! |---|---|
//! | `mock-echo[@N]` | echoes the last user message's text (with `@N`: cycled or cut to exactly N chars); usage at the end |
//! | `mock-json[@N]` | the text `{"answer":"<echo>","ok":true}` (schema `{answer: string, ok: boolean}`); `@N` sizes the answer |
//! | `mock-tool` | one tool call to the `tool_choice`-named tool, else the first tool; arguments: each required property of its schema (`enum`'s first value, or `"mock"`, `1`, `true`, `[]`, `{}` by type); no tool at all → HTTP 400 |
//! | `mock-tool-malformed` | the same call with arguments `{"query": "unterminated` (not JSON) |
//! | `mock-reasoning[@N]` | reasoning (a fixed sentence, or N chars of it), then the echo as text |
//! | `mock-reasoning-loop` | reasoning deltas, one per millisecond, never text, until the client disconnects (cut after 600,000 events) |
//! | `mock-slow-MS[@N]` | waits MS ms (at most 600,000) before the response headers, then like `mock-echo` |
//! | `mock-hang` | response headers, then no body byte until the client disconnects |
//! | `mock-cut-before-usage[@N]` | the echo text (`echo` when empty), then the connection drops before any stop or usage |
//! | `mock-cut-after-usage[@N]` | the echo text, the terminal usage, then the connection drops before the stop / end marker |
//! | `mock-refuse-prestream` | response id, no content, no stop, zero usage, clean end marker (RF-2) |
//! | `mock-empty-refusal` | no content, a refusal stop, clean end (RF-1 on Anthropic) |
//! | `mock-429`, `mock-500` | that HTTP status with a small JSON error body in the protocol's error shape, no stream (429 adds `retry-after: 1`) |
//! | `mock-502-gateway` | HTTP 502 with a small HTML page, as a gateway answers: not the provider's error format, no stream |
//! | `mock-big[@N]` | N characters (default 10,000) of a repeated sentence, in 16-character deltas |
//!
//! Any other model → HTTP 404 JSON error; a body that is not JSON or has no model → HTTP 400.
//! `max_tokens` and `stream` are ignored: the mock always streams, and can overrun a cap.
//!
//! Usage is deterministic: input tokens = ceil(characters of the system prompt and messages / 4),
//! at least 1; output tokens = ceil(output characters (text and tool arguments) / 4); reasoning
//! tokens = ceil(reasoning characters / 4). Chat reports `prompt_tokens`, `completion_tokens`
//! (output + reasoning) and `completion_tokens_details.reasoning_tokens`; Responses
//! `input_tokens`, `input_tokens_details.cached_tokens` (0), `output_tokens` (output + reasoning)
//! and `output_tokens_details.reasoning_tokens`; Anthropic `input_tokens`, the two cache counts
//! (0) and `output_tokens` (output + reasoning) in `message_start` (early count, 1 output token)
//! and `message_delta` (final count).
//!
//! A cut is a real mid-body drop: the body stream fails, and the server closes the connection
//! without the chunked encoding's terminating chunk.
//!
//! # Wire shapes
//!
//! - **Chat** (`data: {chunk}` lines): a first chunk with `role: assistant`; reasoning as
//!   `delta.reasoning_content` (the OpenAI-compatible servers' convention); text as
//!   `delta.content`; a tool call as `delta.tool_calls[0]` (id, name, then 8-character
//!   `arguments` fragments); a finish chunk (`stop` / `tool_calls`); a `choices: []` usage chunk
//!   (always, as with `stream_options.include_usage`); `data: [DONE]`.
//!   Cut before usage: the content, then the cut. Cut after usage: the content and the usage
//!   chunk, no finish chunk, no `[DONE]`, cut. Pre-stream refusal: one chunk with the id, an
//!   empty delta and `finish_reason: null`, then `[DONE]` (no usage chunk). Empty refusal: role
//!   chunk with `content: null`, a finish chunk with `content_filter`, the usage chunk, `[DONE]`.
//! - **Responses** (`event: TYPE` + `data: {..., "sequence_number"}`): `response.created`,
//!   `response.in_progress`; a reasoning item (`output_item.added`,
//!   `reasoning_summary_part.added`, `reasoning_summary_text.delta`s, `…text.done`,
//!   `…part.done`, `output_item.done` with `encrypted_content` when the request's `include`
//!   asks for `reasoning.encrypted_content`); a message item (`output_item.added`,
//!   `content_part.added`, `output_text.delta`s, `output_text.done`, `content_part.done`,
//!   `output_item.done`); a function call item (`output_item.added`,
//!   `function_call_arguments.delta`s, `function_call_arguments.done`, `output_item.done`);
//!   `response.completed` with `status: completed`, the items and the usage. No `[DONE]`.
//!   Cut before usage: text deltas, then the cut. Cut after usage: Responses carries usage only
//!   in its terminal event, so the whole stream through `response.completed` is sent and the cut
//!   replaces the clean end of the body (a reader that stops at `response.completed` sees a
//!   complete stream). Pre-stream refusal: `response.created`, then `response.completed` with
//!   `output: []` and all-zero usage. Empty refusal: `response.created`, `response.in_progress`,
//!   `response.incomplete` with `incomplete_details.reason: content_filter`, `output: []`.
//! - **Anthropic** (`event: TYPE` + `data: {...}`): `message_start` (id, early usage),
//!   `ping`, per block `content_block_start` / `content_block_delta` (`thinking_delta` then one
//!   `signature_delta`; `text_delta`; `input_json_delta` starting with `""`) /
//!   `content_block_stop`, `message_delta` (`stop_reason` `end_turn` / `tool_use`, final usage),
//!   `message_stop`. Cut before usage: text deltas, then the cut (no `content_block_stop`). Cut
//!   after usage: `message_delta` with `stop_reason: null` and the final usage, then the cut
//!   before `message_stop`. Pre-stream refusal: `message_start` with all-zero usage, then
//!   `message_stop`. Empty refusal: `message_start` (output 0), `message_delta` with
//!   `stop_reason: refusal` and `output_tokens: 0`, `message_stop`; no content block, no ping.
//! - Reasoning loop: the role chunk / `response.created` + a reasoning item / `message_start` +
//!   a thinking block, then one reasoning delta per millisecond.
//!
//! `GET /v1/responses/{id}` answers the kept response of a Responses request sent with
//! `store: true` (id, status, usage, no output; finished even when its stream was cut), else 404.
//!
//! `GET /mock/requests` → `{"count": n, "by_prompt": {"<prompt>": n, …}, "untracked": n}`:
//! `count` counts every POST received on the three paths (counted on arrival, before any
//! behaviour, errors included); once a body is read, the request is also counted under its
//! prompt — the text of its last user message, the text the echo uses (`""` when there is none) —
//! or as `untracked` when the body is not a JSON object, the prompt is longer than
//! [`PROMPT_CHARS_MAX`] characters, or [`PROMPTS_TRACKED_MAX`] other prompts are already counted.
//! A test that gives each call its own prompt sees how often each call was sent
//! ([`MockProvider::request_count_for`]). `POST /mock/reset` sets all of it back to 0.
//!
//! The mock never logs request content.

#![warn(missing_docs)]

mod protocols;
mod scenario;
mod stored;
mod wire;

#[cfg(test)]
mod tests;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use scenario::{Behaviour, Plan};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tollgate_provider::Protocol;
use wire::{Frame, Sink};

/// Largest request body the mock reads.
const BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Frames buffered between a stream writer and the connection.
const FRAMES_BUFFERED: usize = 32;
/// How long [`MockProvider::shutdown`] waits for the server to stop before aborting it.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Longest prompt (last user message text), in characters, counted under its own name by
/// `GET /mock/requests`; longer ones count as `untracked`.
pub const PROMPT_CHARS_MAX: usize = 256;
/// Distinct prompts counted under their own name; requests with further new prompts count as
/// `untracked` (the per-prompt counts stay bounded in a long-running mock).
pub const PROMPTS_TRACKED_MAX: usize = 100_000;

/// Provider requests by prompt.
#[derive(Debug, Default)]
struct PromptCounts {
    by_prompt: HashMap<String, u64>,
    untracked: u64,
}

impl PromptCounts {
    fn add(&mut self, prompt: Option<String>) {
        match prompt {
            Some(prompt)
                if prompt.chars().count() <= PROMPT_CHARS_MAX
                    && (self.by_prompt.len() < PROMPTS_TRACKED_MAX
                        || self.by_prompt.contains_key(&prompt)) =>
            {
                *self.by_prompt.entry(prompt).or_insert(0) += 1;
            }
            _ => self.untracked += 1,
        }
    }
}

/// Shared server state.
#[derive(Debug, Clone, Default)]
struct Shared {
    /// POSTs received on the three provider paths.
    requests: Arc<AtomicU64>,
    /// The same POSTs by prompt, once their body is read.
    prompts: Arc<Mutex<PromptCounts>>,
    /// Response bodies still being written (a writer task is alive).
    active_streams: Arc<AtomicU64>,
    /// Cancelled at shutdown: every writer stops (with a cut) and every hang ends.
    cancel: CancellationToken,
    /// Responses kept for `GET /v1/responses/{id}`.
    stored: stored::StoredResponses,
}

/// A running mock provider bound to a local address.
#[derive(Debug)]
pub struct MockProvider {
    addr: SocketAddr,
    shared: Shared,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl MockProvider {
    /// Binds `addr` (port 0 picks a free port) and serves on the current tokio runtime until
    /// [`MockProvider::shutdown`] or drop.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn start(addr: SocketAddr) -> std::io::Result<MockProvider> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Shared::default();
        let task = tokio::spawn(run(listener, shared.clone()));
        Ok(MockProvider {
            addr,
            shared,
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (the loopback address on the bound port).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.addr.port())
    }

    /// POSTs received on the provider paths since start or the last `POST /mock/reset`.
    pub fn request_count(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// POSTs whose last user message text is `prompt`, since start or the last reset (0 for a
    /// prompt longer than [`PROMPT_CHARS_MAX`] characters: those are not counted by prompt).
    pub fn request_count_for(&self, prompt: &str) -> u64 {
        self.shared
            .prompts()
            .by_prompt
            .get(prompt)
            .copied()
            .unwrap_or(0)
    }

    /// Every counted prompt with its number of POSTs, since start or the last reset.
    pub fn requests_by_prompt(&self) -> BTreeMap<String, u64> {
        self.shared
            .prompts()
            .by_prompt
            .iter()
            .map(|(prompt, n)| (prompt.clone(), *n))
            .collect()
    }

    /// Response bodies still being written; drops to 0 once clients disconnect.
    pub fn active_streams(&self) -> u64 {
        self.shared.active_streams.load(Ordering::SeqCst)
    }

    /// Stops the server: open streams are cut, hanging responses end, then it waits (bounded)
    /// for the server task.
    pub async fn shutdown(mut self) {
        self.shared.cancel.cancel();
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(SHUTDOWN_WAIT, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for MockProvider {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

/// Serves the mock provider on `listener` until `shutdown` completes (for
/// `tollgate mock-provider --listen ADDR`).
///
/// # Errors
/// The server failed to accept connections.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let shared = Shared::default();
    let cancel = shared.cancel.clone();
    let trigger = tokio::spawn(async move {
        shutdown.await;
        cancel.cancel();
    });
    let result = run(listener, shared).await;
    trigger.abort();
    result
}

async fn run(listener: TcpListener, shared: Shared) -> std::io::Result<()> {
    let cancel = shared.cancel.clone();
    let listener = listener.tap_io(|tcp| {
        // Each SSE event must leave at once; a socket that refuses the option still works.
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(shared))
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}

fn router(shared: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/responses", post(responses))
        .route("/v1/responses/{id}", get(stored_response))
        .route("/v1/messages", post(messages))
        .route("/mock/requests", get(requests))
        .route("/mock/reset", post(reset))
        .with_state(shared)
}

async fn chat(State(shared): State<Shared>, body: Body) -> Response {
    answer(shared, Protocol::OpenAiChat, body).await
}

async fn responses(State(shared): State<Shared>, body: Body) -> Response {
    answer(shared, Protocol::OpenAiResponses, body).await
}

async fn messages(State(shared): State<Shared>, body: Body) -> Response {
    answer(shared, Protocol::Anthropic, body).await
}

/// `GET /v1/responses/{id}`: the kept response of a `store: true` Responses request, or 404 in
/// OpenAI's error shape. Not counted as a request.
async fn stored_response(State(shared): State<Shared>, Path(id): Path<String>) -> Response {
    match shared.stored.get(&id) {
        Some(response) => Json(response).into_response(),
        None => error_response(
            Protocol::OpenAiResponses,
            404,
            "invalid_request",
            "no stored response with this id",
        ),
    }
}

impl Shared {
    /// The per-prompt counts (a panic elsewhere cannot leave them half-written: each update is
    /// one map entry).
    fn prompts(&self) -> std::sync::MutexGuard<'_, PromptCounts> {
        self.prompts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn requests(State(shared): State<Shared>) -> Json<serde_json::Value> {
    let count = shared.requests.load(Ordering::SeqCst);
    let prompts = shared.prompts();
    let by_prompt: serde_json::Map<String, serde_json::Value> = prompts
        .by_prompt
        .iter()
        .map(|(prompt, n)| (prompt.clone(), serde_json::Value::from(*n)))
        .collect();
    Json(serde_json::json!({
        "count": count,
        "by_prompt": by_prompt,
        "untracked": prompts.untracked,
    }))
}

async fn reset(State(shared): State<Shared>) -> Json<serde_json::Value> {
    shared.requests.store(0, Ordering::SeqCst);
    *shared.prompts() = PromptCounts::default();
    shared.stored.clear();
    Json(serde_json::json!({ "count": 0, "by_prompt": {}, "untracked": 0 }))
}

/// One provider request: counted first, then decided by its model name.
async fn answer(shared: Shared, protocol: Protocol, body: Body) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let request_id = format!("req_{}", uuid::Uuid::new_v4().simple());
    let behaviour = match axum::body::to_bytes(body, BODY_BYTES_MAX).await {
        Ok(bytes) => {
            shared.prompts().add(scenario::prompt_of(protocol, &bytes));
            scenario::decide(protocol, &bytes)
        }
        Err(_) => {
            shared.prompts().add(None);
            Behaviour::Status {
                status: 400,
                kind: "invalid_request",
                message: "request body unreadable or too large".into(),
            }
        }
    };
    let mut response = match behaviour {
        Behaviour::Status {
            status,
            kind,
            message,
        } => error_response(protocol, status, kind, &message),
        Behaviour::Gateway { status } => gateway_response(status),
        Behaviour::Stream(plan) => {
            if plan.delay_ms > 0 {
                let delay = tokio::time::sleep(Duration::from_millis(plan.delay_ms));
                tokio::select! {
                    () = delay => {}
                    () = shared.cancel.cancelled() => {
                        return StatusCode::SERVICE_UNAVAILABLE.into_response();
                    }
                }
            }
            stream_response(shared, protocol, plan)
        }
    };
    let name = match protocol {
        Protocol::Anthropic => "request-id",
        Protocol::OpenAiChat | Protocol::OpenAiResponses => "x-request-id",
    };
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(name, value);
    }
    response
}

/// Decrements the active-stream gauge when a writer task ends, however it ends.
struct ActiveGuard(Arc<AtomicU64>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A 200 event stream written by its own task through a channel, so that a cut is a body error
/// and a client disconnect closes the channel (which stops the writer).
fn stream_response(shared: Shared, protocol: Protocol, plan: Plan) -> Response {
    let (tx, rx) = mpsc::channel::<Frame>(FRAMES_BUFFERED);
    shared.active_streams.fetch_add(1, Ordering::SeqCst);
    let guard = ActiveGuard(shared.active_streams.clone());
    let cancel = shared.cancel.clone();
    tokio::spawn(async move {
        let _guard = guard;
        let sink = Sink::new(tx, cancel.clone());
        let rendered = protocols::render(protocol, &plan, &sink, &shared.stored).await;
        if rendered.is_err() && cancel.is_cancelled() {
            // Shutting down: end the body as a cut, not as a clean end.
            sink.cut().await;
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// An HTTP error in the protocol's error shape.
/// A gateway's error page: HTML, not the provider's error format.
fn gateway_response(status: u16) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = format!(
        "<html>\r\n<head><title>{code}</title></head>\r\n<body>\r\n<center><h1>{code}</h1></center>\r\n</body>\r\n</html>\r\n"
    );
    let mut response = (code, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}

fn error_response(protocol: Protocol, status: u16, kind: &str, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match protocol {
        Protocol::Anthropic => {
            let kind = match kind {
                "rate_limit" => "rate_limit_error",
                "server_error" => "api_error",
                "not_found" => "not_found_error",
                _ => "invalid_request_error",
            };
            serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        Protocol::OpenAiChat | Protocol::OpenAiResponses => {
            let (kind, code) = match kind {
                "rate_limit" => ("requests", Some("rate_limit_exceeded")),
                "server_error" => ("server_error", None),
                "not_found" => ("invalid_request_error", Some("model_not_found")),
                _ => ("invalid_request_error", None),
            };
            serde_json::json!({"error": {"message": message, "type": kind, "param": null,
                "code": code}})
        }
    };
    let mut response = (code, Json(body)).into_response();
    if status == 429 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}
