//! The HTTP client and the support matrix: single-shot construction (SC-7), refusals before any
//! network access (SC-5, TC-2), and streaming over a local raw HTTP/1.1 server.
#![cfg(test)]

use futures::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tollgate_core::event::ProviderEvent;
use tollgate_core::message::{Message, Role, Temperature, ToolChoice, ToolSpec};
use tollgate_provider::http::{HttpClient, HttpClientConfig, HttpClientError};
use tollgate_provider::parse::decode_all;
use tollgate_provider::support::check;
use tollgate_provider::{Protocol, ProviderClient, ProviderRequest, SendError, StatusClass};

const SECRET: &str = "SECRET-MESSAGE-CONTENT";

fn config(protocol: Protocol, base_url: &str) -> HttpClientConfig {
    HttpClientConfig {
        protocol,
        base_url: base_url.into(),
        api_key: Some("sk-test-key-123".into()),
        connect_timeout_ms: 2_000,
        read_timeout_ms: 2_000,
        max_attempts: 1,
    }
}

fn request(model: &str) -> ProviderRequest {
    ProviderRequest {
        model: model.into(),
        system: None,
        messages: vec![Message::text(Role::User, SECRET)],
        max_tokens: 64,
        temperature: None,
        tools: vec![ToolSpec {
            name: "get_weather".into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
        }],
        tool_choice: None,
        cache: None,
        json_schema: None,
    }
}

fn temperature(t: &str) -> Option<Temperature> {
    Some(Temperature::parse(t).unwrap())
}

/// A base URL on which nothing listens.
async fn closed_base_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// Sends `req` through an HttpClient pointed at a closed port: `Unsupported` proves the refusal
/// happened before the network (a network attempt would be `Connect`).
async fn send_to_closed_port(protocol: Protocol, req: ProviderRequest) -> SendError {
    let client = HttpClient::new(config(protocol, &closed_base_url().await)).unwrap();
    match client.send(req, CancellationToken::new()).await {
        Ok(_) => panic!("a closed port answered"),
        Err(e) => e,
    }
}

#[test]
fn sc_7_client_with_retries_is_rejected() {
    for attempts in [0, 2, 3] {
        let mut c = config(Protocol::OpenAiChat, "http://127.0.0.1:9");
        c.max_attempts = attempts;
        assert_eq!(
            HttpClient::new(c).err(),
            Some(HttpClientError::NotSingleShot(attempts))
        );
    }
    let client = HttpClient::new(config(Protocol::Anthropic, "http://127.0.0.1:9")).unwrap();
    let d = client.descriptor();
    assert!(d.is_single_shot());
    assert_eq!((d.max_attempts, d.fallback), (1, false));
}

#[test]
fn api_key_is_never_debug_printed() {
    let c = config(Protocol::OpenAiChat, "http://127.0.0.1:9");
    assert!(!format!("{c:?}").contains("sk-test-key-123"));
    let client = HttpClient::new(c).unwrap();
    assert!(!format!("{client:?}").contains("sk-test-key-123"));
}

#[test]
fn base_url_with_or_without_v1_reaches_the_protocol_path() {
    for base in ["https://api.openai.com", "https://api.openai.com/v1/"] {
        let client = HttpClient::new(config(Protocol::OpenAiResponses, base)).unwrap();
        assert_eq!(client.url(), "https://api.openai.com/v1/responses");
    }
    let bad = config(Protocol::Anthropic, "ftp://example.org");
    assert!(matches!(
        HttpClient::new(bad),
        Err(HttpClientError::InvalidBaseUrl(_))
    ));
}

#[tokio::test]
async fn sc_5_temperature_outside_range_is_refused_before_network() {
    let mut req = request("claude-sonnet-4-5");
    req.temperature = temperature("1.5");
    let err = send_to_closed_port(Protocol::Anthropic, req.clone()).await;
    assert!(
        matches!(&err, SendError::Unsupported(r) if r.contains("temperature")),
        "{err:?}"
    );
    assert!(!err.to_string().contains(SECRET));
    // The same request inside the range does reach the network (and finds the port closed).
    req.temperature = temperature("1");
    let err = send_to_closed_port(Protocol::Anthropic, req).await;
    assert!(matches!(err, SendError::Connect(_)), "{err:?}");
}

#[tokio::test]
async fn sc_5_temperature_on_a_reasoning_model_is_refused_before_network() {
    for (protocol, model) in [
        (Protocol::OpenAiChat, "o3-mini"),
        (Protocol::OpenAiResponses, "gpt-5"),
    ] {
        let mut req = request(model);
        req.temperature = temperature("0.2");
        let err = send_to_closed_port(protocol, req).await;
        assert!(matches!(err, SendError::Unsupported(_)), "{model}: {err:?}");
    }
}

#[test]
fn sc_5_support_matrix_ranges() {
    let cases = [
        (Protocol::OpenAiChat, "gpt-4o", "2", true),
        (Protocol::OpenAiChat, "gpt-4o", "2.01", false),
        (Protocol::OpenAiResponses, "gpt-4.1", "0", true),
        (Protocol::Anthropic, "claude-opus-4-1", "1", true),
        (Protocol::Anthropic, "claude-opus-4-1", "1.01", false),
        (Protocol::Anthropic, "mock-echo", "2", true),
        (Protocol::OpenAiChat, "mock-echo", "2.5", false),
    ];
    for (protocol, model, t, ok) in cases {
        let mut req = request(model);
        req.temperature = temperature(t);
        assert_eq!(check(protocol, &req).is_ok(), ok, "{protocol} {model} {t}");
    }
}

#[tokio::test]
async fn tc_2_unknown_forced_tool_is_refused_before_network() {
    for protocol in [
        Protocol::OpenAiChat,
        Protocol::OpenAiResponses,
        Protocol::Anthropic,
    ] {
        let mut req = request("mock-tool");
        req.tool_choice = Some(ToolChoice::Tool {
            name: "delete_everything".into(),
        });
        let err = send_to_closed_port(protocol, req).await;
        assert!(matches!(&err, SendError::Unsupported(r) if !r.contains("delete_everything")));
        assert!(!err.to_string().contains(SECRET));
    }
}

#[test]
fn tc_2_tool_choice_needs_tools_and_a_supported_mode() {
    let mut req = request("gpt-4o");
    req.tool_choice = Some(ToolChoice::Any);
    assert!(check(Protocol::OpenAiChat, &req).is_ok());
    req.tools.clear();
    assert!(matches!(
        check(Protocol::OpenAiChat, &req),
        Err(SendError::Unsupported(_))
    ));
    let mut req = request("claude-haiku-4-5");
    for choice in [ToolChoice::Auto, ToolChoice::Any, ToolChoice::None] {
        req.tool_choice = Some(choice);
        assert!(check(Protocol::Anthropic, &req).is_ok());
    }
    req.tool_choice = Some(ToolChoice::Tool {
        name: "get_weather".into(),
    });
    assert!(check(Protocol::Anthropic, &req).is_ok());
}

// ---------------------------------------------------------------- a raw local server

/// What the server does after writing its response chunks.
#[derive(Clone, Copy)]
enum After {
    Close,
    Hang,
}

/// Serves one connection: reads the request, answers with `head` then `chunks` (a pause before
/// each), then closes or hangs. Returns the base URL and the captured request text.
async fn serve_once(
    head: String,
    chunks: Vec<Vec<u8>>,
    pause_ms: u64,
    after: After,
) -> (String, tokio::task::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let request = read_request(&mut sock).await;
        sock.write_all(head.as_bytes()).await.unwrap();
        for chunk in chunks {
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            if sock.write_all(&chunk).await.is_err() {
                break;
            }
        }
        if let After::Hang = after {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        request
    });
    (base, task)
}

async fn read_request(sock: &mut tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let n = sock.read(&mut tmp).await.unwrap();
        buf.extend_from_slice(&tmp[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length || n == 0 {
                return text;
            }
        }
        if n == 0 {
            return text;
        }
    }
}

fn ok_head(request_id_header: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{request_id_header}connection: close\r\n\r\n"
    )
}

fn own_stream(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/streams/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

async fn collect(
    client: &HttpClient,
    req: ProviderRequest,
    cancel: CancellationToken,
) -> Vec<ProviderEvent> {
    let stream = client.send(req, cancel).await.unwrap();
    stream.collect().await
}

#[tokio::test]
async fn http_stream_decodes_like_the_captured_bytes_and_sends_auth() {
    let bytes = own_stream("anthropic-parallel-tools.sse");
    let chunks: Vec<Vec<u8>> = bytes.chunks(97).map(<[u8]>::to_vec).collect();
    let head = ok_head("request-id: req_011CAnthropic\r\n");
    let (base, server) = serve_once(head, chunks, 1, After::Close).await;
    let client = HttpClient::new(config(Protocol::Anthropic, &base)).unwrap();
    let events = collect(
        &client,
        request("claude-sonnet-4-5"),
        CancellationToken::new(),
    )
    .await;
    // The body supplies the message id, so the header id is not added.
    assert_eq!(events, decode_all(Protocol::Anthropic, &bytes));
    let seen = server.await.unwrap();
    assert!(seen.starts_with("POST /v1/messages HTTP/1.1"));
    let lower = seen.to_ascii_lowercase();
    assert!(lower.contains("x-api-key: sk-test-key-123"));
    assert!(lower.contains("anthropic-version: 2023-06-01"));
    let body: Value = serde_json::from_str(&seen[seen.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(body["stream"], true);
}

#[tokio::test]
async fn http_header_request_id_leads_when_the_body_has_none() {
    let head = ok_head("x-request-id: req_abc123\r\n");
    let (base, server) = serve_once(head, vec![], 0, After::Close).await;
    let client = HttpClient::new(config(Protocol::OpenAiChat, &base)).unwrap();
    let events = collect(&client, request("gpt-4o"), CancellationToken::new()).await;
    assert_eq!(
        events[0],
        ProviderEvent::ProviderRef {
            id: "req_abc123".into()
        }
    );
    assert!(matches!(&events[1], ProviderEvent::Error { kind, .. } if kind == "connection_closed"));
    let seen = server.await.unwrap().to_ascii_lowercase();
    assert!(seen.starts_with("post /v1/chat/completions"));
    assert!(seen.contains("authorization: bearer sk-test-key-123"));
}

#[tokio::test]
async fn http_error_status_carries_the_request_id() {
    let head = "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nx-request-id: req_429\r\ncontent-length: 51\r\nconnection: close\r\n\r\n{\"error\":{\"message\":\"slow down\",\"type\":\"requests\"}}".to_string();
    let (base, _server) = serve_once(head, vec![], 0, After::Close).await;
    let client = HttpClient::new(config(Protocol::OpenAiResponses, &base)).unwrap();
    let err = client
        .send(request("gpt-4o"), CancellationToken::new())
        .await
        .err();
    assert_eq!(
        err,
        Some(SendError::Status {
            status: 429,
            provider_ref: Some("req_429".into()),
            class: StatusClass::NotProcessed,
        })
    );
}

#[tokio::test]
async fn sc_96_gateway_status_without_a_provider_body_is_ambiguous() {
    let body = "<html><body><h1>502 Bad Gateway</h1></body></html>";
    let head = format!("HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
    let (base, _server) = serve_once(head, vec![], 0, After::Close).await;
    let client = HttpClient::new(config(Protocol::Anthropic, &base)).unwrap();
    let err = client
        .send(request("claude-sonnet-4-5"), CancellationToken::new())
        .await
        .err();
    assert_eq!(
        err,
        Some(SendError::Status {
            status: 502,
            provider_ref: None,
            class: StatusClass::Ambiguous,
        })
    );
}

#[tokio::test]
async fn http_read_timeout_ends_the_stream_with_timeout() {
    let bytes = own_stream("openai-chat-length.sse");
    let first = bytes[..bytes.iter().position(|b| *b == b'\n').unwrap() + 2].to_vec();
    let (base, _server) = serve_once(ok_head(""), vec![first], 0, After::Hang).await;
    let mut c = config(Protocol::OpenAiChat, &base);
    c.read_timeout_ms = 200;
    let client = HttpClient::new(c).unwrap();
    let events = collect(&client, request("gpt-4o"), CancellationToken::new()).await;
    assert!(matches!(&events[0], ProviderEvent::ProviderRef { .. }));
    assert!(matches!(events.last(), Some(ProviderEvent::Error { kind, .. }) if kind == "timeout"));
}

#[tokio::test]
async fn http_cancellation_ends_the_stream_with_aborted() {
    let bytes = own_stream("openai-chat-length.sse");
    let first = bytes[..bytes.iter().position(|b| *b == b'\n').unwrap() + 2].to_vec();
    let (base, _server) = serve_once(ok_head(""), vec![first], 0, After::Hang).await;
    let client = HttpClient::new(config(Protocol::OpenAiChat, &base)).unwrap();
    let cancel = CancellationToken::new();
    let mut stream = client
        .send(request("gpt-4o"), cancel.clone())
        .await
        .unwrap();
    let first = stream.next().await;
    assert!(matches!(first, Some(ProviderEvent::ProviderRef { .. })));
    cancel.cancel();
    let rest: Vec<ProviderEvent> = tokio::time::timeout(Duration::from_secs(5), stream.collect())
        .await
        .unwrap();
    assert!(matches!(rest.last(), Some(ProviderEvent::Error { kind, .. }) if kind == "aborted"));
}
