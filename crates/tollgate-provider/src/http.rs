//! The HTTP provider client: one POST per send, streaming, no retry, no redirect, no fallback
//! (SC-7). The request is checked against the support matrix before any network access.

use crate::client::{ClientDescriptor, EventStream, ProviderClient, ProviderRequest, SendError};
use crate::fetch::{self, FetchError, FetchedUsage, UsageFetcher, FETCH_BODY_BYTES_MAX};
use crate::options::{self, RequestOptions};
use crate::parse::StreamDecoder;
use crate::sse::decode::error;
use crate::status::{classify, is_provider_error_body};
use crate::{anthropic, openai_chat, openai_responses, support, Protocol};
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_core::event::{error_kind, ProviderEvent};

/// Most bytes of an error response body read (to classify it) before giving up on it; a longer
/// body is not taken for the provider's error format.
pub const ERROR_BODY_BYTES_MAX: usize = 64 * 1024;

/// How to reach one provider endpoint.
#[derive(Clone)]
pub struct HttpClientConfig {
    /// Wire protocol.
    pub protocol: Protocol,
    /// Base URL, e.g. `https://api.openai.com` (a trailing `/v1` is accepted too).
    pub base_url: String,
    /// API key. Never printed: `Debug` redacts it.
    pub api_key: Option<String>,
    /// Connect timeout.
    pub connect_timeout_ms: u64,
    /// Longest wait for the response headers and for each body chunk.
    pub read_timeout_ms: u64,
    /// Attempts per send. Must be 1 (SC-7).
    pub max_attempts: u32,
}

impl fmt::Debug for HttpClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClientConfig")
            .field("protocol", &self.protocol)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("read_timeout_ms", &self.read_timeout_ms)
            .field("max_attempts", &self.max_attempts)
            .finish()
    }
}

/// Why an [`HttpClient`] cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpClientError {
    /// The client would retry: provider clients are single-shot (SC-7).
    #[error("provider clients are single-shot: max_attempts must be 1, got {0}")]
    NotSingleShot(u32),
    /// The base URL is not an absolute http(s) URL.
    #[error("invalid provider base URL: {0}")]
    InvalidBaseUrl(String),
    /// A timeout of zero.
    #[error("{0} must be greater than zero")]
    ZeroTimeout(&'static str),
    /// The API key cannot be sent as a header value.
    #[error("the API key is not a valid header value")]
    InvalidApiKey,
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
}

/// A single-shot streaming provider client over HTTP.
#[derive(Debug, Clone)]
pub struct HttpClient {
    config: HttpClientConfig,
    url: reqwest::Url,
    client: reqwest::Client,
    /// Added to every request body (SC-211).
    options: RequestOptions,
}

impl HttpClient {
    /// Builds the client: no redirects, no automatic retries, `TCP_NODELAY`, the connect timeout,
    /// and the auth headers (marked sensitive).
    ///
    /// # Errors
    /// `max_attempts != 1` (SC-7), an invalid base URL or API key, a zero timeout.
    pub fn new(config: HttpClientConfig) -> Result<Self, HttpClientError> {
        if config.max_attempts != 1 {
            return Err(HttpClientError::NotSingleShot(config.max_attempts));
        }
        if config.connect_timeout_ms == 0 {
            return Err(HttpClientError::ZeroTimeout("connect_timeout_ms"));
        }
        if config.read_timeout_ms == 0 {
            return Err(HttpClientError::ZeroTimeout("read_timeout_ms"));
        }
        let url = endpoint(&config.base_url, config.protocol)?;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .tcp_nodelay(true)
            .default_headers(headers(&config)?)
            .build()
            .map_err(|e| HttpClientError::Build(e.to_string()))?;
        Ok(Self {
            config,
            url,
            client,
            options: RequestOptions::default(),
        })
    }

    /// The same client, adding `options` to every request body it sends and checking them with
    /// every request (SC-211); the connection pool is shared.
    pub fn with_options(&self, options: RequestOptions) -> Self {
        Self {
            options,
            ..self.clone()
        }
    }

    /// The endpoint this client posts to.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    fn read_timeout(&self) -> Duration {
        Duration::from_millis(self.config.read_timeout_ms)
    }
}

fn endpoint(base_url: &str, protocol: Protocol) -> Result<reqwest::Url, HttpClientError> {
    let base = base_url.trim_end_matches('/');
    let path = match base.ends_with("/v1") {
        true => protocol.path().trim_start_matches("/v1"),
        false => protocol.path(),
    };
    let url = reqwest::Url::parse(&format!("{base}{path}"))
        .map_err(|e| HttpClientError::InvalidBaseUrl(e.to_string()))?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(HttpClientError::InvalidBaseUrl(format!(
            "scheme {other:?} is not http or https"
        ))),
    }
}

fn headers(config: &HttpClientConfig) -> Result<HeaderMap, HttpClientError> {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
    let secret = |v: String| {
        let mut value = HeaderValue::from_str(&v).map_err(|_| HttpClientError::InvalidApiKey)?;
        value.set_sensitive(true);
        Ok::<_, HttpClientError>(value)
    };
    match config.protocol {
        Protocol::OpenAiChat | Protocol::OpenAiResponses => {
            if let Some(key) = &config.api_key {
                h.insert(AUTHORIZATION, secret(format!("Bearer {key}"))?);
            }
        }
        Protocol::Anthropic => {
            if let Some(key) = &config.api_key {
                h.insert(HeaderName::from_static("x-api-key"), secret(key.clone())?);
            }
            h.insert(
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static(anthropic::ANTHROPIC_VERSION),
            );
        }
    }
    Ok(h)
}

/// The provider's request id header (`x-request-id` for OpenAI, `request-id` for Anthropic).
fn header_ref(headers: &HeaderMap) -> Option<String> {
    ["x-request-id", "request-id"]
        .iter()
        .filter_map(|name| headers.get(*name))
        .filter_map(|v| v.to_str().ok())
        .find(|v| !v.is_empty())
        .map(str::to_string)
}

fn send_error(e: &reqwest::Error) -> SendError {
    if e.is_connect() {
        SendError::Connect(e.to_string())
    } else {
        SendError::NoResponse(e.to_string())
    }
}

#[async_trait]
impl ProviderClient for HttpClient {
    fn descriptor(&self) -> ClientDescriptor {
        ClientDescriptor {
            protocol: self.config.protocol,
            max_attempts: 1,
            fallback: false,
        }
    }

    fn check(&self, request: &ProviderRequest) -> Result<(), SendError> {
        support::check(self.config.protocol, request)?;
        options::check(self.config.protocol, &request.model, &self.options)
    }

    async fn send(
        &self,
        request: ProviderRequest,
        cancel: CancellationToken,
    ) -> Result<EventStream, SendError> {
        self.check(&request)?;
        let mut body = match self.config.protocol {
            Protocol::OpenAiChat => openai_chat::request_body(&request),
            Protocol::OpenAiResponses => openai_responses::request_body(&request),
            Protocol::Anthropic => anthropic::request_body(&request),
        };
        options::apply(self.config.protocol, &self.options, &mut body);
        let pending = self.client.post(self.url.clone()).json(&body).send();
        let response = tokio::select! {
            biased;
            () = cancel.cancelled() => {
                return Err(SendError::NoResponse("aborted before the response arrived".into()));
            }
            r = tokio::time::timeout(self.read_timeout(), pending) => match r {
                Err(_) => {
                    return Err(SendError::NoResponse(
                        "no response headers within read_timeout_ms".into(),
                    ));
                }
                Ok(Err(e)) => return Err(send_error(&e)),
                Ok(Ok(response)) => response,
            },
        };
        let provider_ref = header_ref(response.headers());
        let status = response.status();
        if !status.is_success() {
            let status = status.as_u16();
            let provider_body = match read_error_body(response, self.read_timeout()).await {
                Some(body) => is_provider_error_body(self.config.protocol, &body),
                None => false,
            };
            return Err(SendError::Status {
                status,
                provider_ref,
                class: classify(self.config.protocol, status, provider_body),
            });
        }
        let reader = Reader {
            body: response.bytes_stream().boxed(),
            decoder: StreamDecoder::new(self.config.protocol),
            pending: VecDeque::new(),
            header_ref: provider_ref,
            cancel,
            read_timeout: self.read_timeout(),
            ended: false,
        };
        Ok(futures::stream::unfold(reader, Reader::next_event).boxed())
    }
}

#[async_trait]
impl UsageFetcher for HttpClient {
    fn protocol(&self) -> Protocol {
        self.config.protocol
    }

    /// `GET {base}/v1/responses/{id}` on OpenAI Responses (SC-110): one attempt, the client's
    /// timeouts, `Accept: application/json`. Only the status and the usage are read.
    async fn fetch_usage(&self, provider_ref: &str) -> Result<FetchedUsage, FetchError> {
        if self.config.protocol != Protocol::OpenAiResponses {
            return Err(FetchError::Unsupported(self.config.protocol));
        }
        if !fetch::is_response_id(provider_ref) {
            return Err(FetchError::InvalidRef);
        }
        let url = reqwest::Url::parse(&format!("{}/{provider_ref}", self.url))
            .map_err(|_| FetchError::InvalidRef)?;
        let pending = self
            .client
            .get(url)
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .send();
        let response = match tokio::time::timeout(self.read_timeout(), pending).await {
            Err(_) => {
                return Err(FetchError::NoResponse(
                    "no response headers within read_timeout_ms".into(),
                ))
            }
            Ok(Err(e)) => return Err(FetchError::NoResponse(e.to_string())),
            Ok(Ok(response)) => response,
        };
        match response.status().as_u16() {
            200 => {}
            404 => return Err(FetchError::NotFound),
            other => return Err(FetchError::Status(other)),
        }
        let body = read_body(response, self.read_timeout(), FETCH_BODY_BYTES_MAX)
            .await
            .ok_or_else(|| FetchError::NoResponse("the answer body was not read whole".into()))?;
        let value: serde_json::Value =
            serde_json::from_slice(&body).map_err(|_| FetchError::Malformed("not JSON".into()))?;
        fetch::responses_usage(provider_ref, &value)
    }
}

/// Reads an error body of at most [`ERROR_BODY_BYTES_MAX`] bytes, only to classify it (it is
/// never logged or stored: it may echo the request). `None` when it is longer, fails or stalls.
async fn read_error_body(response: reqwest::Response, read_timeout: Duration) -> Option<Vec<u8>> {
    read_body(response, read_timeout, ERROR_BODY_BYTES_MAX).await
}

/// Reads a body of at most `bytes_max` bytes, each chunk within `read_timeout`; `None` when it
/// is longer, fails or stalls.
async fn read_body(
    mut response: reqwest::Response,
    read_timeout: Duration,
    bytes_max: usize,
) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout(read_timeout, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                if body.len() + chunk.len() > bytes_max {
                    return None;
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Ok(None)) => return Some(body),
            _ => return None,
        }
    }
}

/// The state of one response stream.
struct Reader {
    body: BoxStream<'static, reqwest::Result<Bytes>>,
    decoder: StreamDecoder,
    pending: VecDeque<ProviderEvent>,
    /// The request id header, until the body supplies a reference or another event goes out.
    header_ref: Option<String>,
    cancel: CancellationToken,
    read_timeout: Duration,
    ended: bool,
}

impl Reader {
    async fn next_event(mut self) -> Option<(ProviderEvent, Self)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some((event, self));
            }
            if self.ended {
                return None;
            }
            let batch = self.read_batch().await;
            self.enqueue(batch);
        }
    }

    async fn read_batch(&mut self) -> Vec<ProviderEvent> {
        let next = tokio::select! {
            biased;
            () = self.cancel.cancelled() => {
                self.ended = true;
                return vec![error(error_kind::ABORTED, "the caller aborted while reading")];
            }
            next = tokio::time::timeout(self.read_timeout, self.body.next()) => next,
        };
        match next {
            Err(_) => {
                self.ended = true;
                vec![error(error_kind::TIMEOUT, "no data within read_timeout_ms")]
            }
            Ok(Some(Ok(chunk))) => self.decoder.push(&chunk),
            Ok(Some(Err(_))) => {
                self.ended = true;
                vec![error(
                    error_kind::CONNECTION_CLOSED,
                    "the connection failed while reading the stream",
                )]
            }
            Ok(None) => {
                self.ended = true;
                self.decoder.finish()
            }
        }
    }

    /// Queues a batch, led by the header's request id when the body has not supplied one.
    fn enqueue(&mut self, batch: Vec<ProviderEvent>) {
        if !batch.is_empty() {
            if let Some(id) = self.header_ref.take() {
                let body_ref = batch
                    .iter()
                    .any(|e| matches!(e, ProviderEvent::ProviderRef { .. }));
                if !body_ref {
                    self.pending.push_back(ProviderEvent::ProviderRef { id });
                }
            }
        }
        self.ended |= self.decoder.is_closed();
        self.pending.extend(batch);
    }
}
