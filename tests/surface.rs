//! The service surface on the wire, black-box against the built `tollgate serve` on the embedded
//! default: what a client without a key, a client that sends slowly and a client that only opens
//! sockets can hold of the server (spec/service.md — Threat model).
#![cfg(test)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};
use support::{serve_embedded, ServeChild, TempFile};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CALLER_KEY: &str = "surface-test-caller-key";
const OPERATOR_KEY: &str = "surface-test-operator-key";
/// The longest any bounded wait of these tests may take: far above every configured bound.
const WAIT: Duration = Duration::from_secs(15);

fn config(server: &str) -> String {
    let grant = |role: &str, key: &str| {
        format!(
            "[[keys]]\nscope = \"demo\"\nrole = \"{role}\"\nsha256 = \"{}\"\n",
            tollgate_store::KeyDigest::of_key(key).to_hex()
        )
    };
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{server}\n\n{}{}",
        grant("caller", CALLER_KEY),
        grant("operator", OPERATOR_KEY)
    )
}

struct Server {
    _config: TempFile,
    child: ServeChild,
    base: String,
}

impl Server {
    async fn start(server: &str) -> Self {
        let config = TempFile::new("surface.toml", &config(server));
        let (child, base) = serve_embedded(&config.0).await;
        Self {
            _config: config,
            child,
            base,
        }
    }

    fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr()).await.unwrap()
    }

    /// `GET /v1/profiles` with the caller key: its status.
    async fn profiles_status(&self) -> u16 {
        self.profiles().await.0
    }

    /// `GET /v1/profiles` with the caller key over HTTP/1.1: its status and body.
    async fn profiles(&self) -> (u16, String) {
        let answer = reqwest::Client::new()
            .get(format!("{}/v1/profiles", self.base))
            .bearer_auth(CALLER_KEY)
            .timeout(WAIT)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.text().await.unwrap())
    }
}

/// Reads what the server sends until it closes the connection (or `WAIT` passes): the bytes,
/// and whether it closed.
async fn read_to_close(stream: &mut TcpStream) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into(), true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&out).into(), false),
        }
    }
}

/// Reads one answer's status line and headers (up to the blank line).
async fn read_head(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while !out.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, stream.read(&mut byte))
            .await
            .expect("an answer within the bound")
            .unwrap();
        assert!(
            n > 0,
            "closed before an answer: {}",
            String::from_utf8_lossy(&out)
        );
        out.push(byte[0]);
    }
    String::from_utf8_lossy(&out).into()
}

/// SC-181: with `concurrency_limit = 4`, four connections that announce a 29 MiB body without a
/// key get 401 at once, without sending their bodies, and a caller's request is served
/// meanwhile: nobody without a key holds a permit or a body buffer.
#[tokio::test]
async fn sc_181_requests_without_a_key_are_refused_before_their_bodies_and_hold_no_permit() {
    let server = Server::start("concurrency_limit = 4").await;
    let mut slow = Vec::new();
    for auth in [
        "",
        "Authorization: Bearer tg_not-a-key\r\n",
        "Authorization: Basic eA==\r\n",
        "",
    ] {
        let mut stream = server.connect().await;
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"model\"",
            29 * 1024 * 1024
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let answer = read_head(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        slow.push(stream);
    }
    // The four connections stay open on the client's side; the server serves a caller.
    assert_eq!(server.profiles_status().await, 200);
    // And it closes the refused connections instead of reading their bodies.
    for mut stream in slow {
        let (_, closed) = read_to_close(&mut stream).await;
        assert!(closed, "a refused connection is closed");
    }
}

/// SC-182: a caller's body that does not arrive within `body_read_timeout_ms` is answered 408
/// `body_timeout`, and the permit it held is free again.
#[tokio::test]
async fn sc_182_a_body_sent_too_slowly_is_408() {
    let server = Server::start("concurrency_limit = 1\nbody_read_timeout_ms = 300").await;
    let mut stream = server.connect().await;
    let head = format!(
        "POST /v1/calls HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CALLER_KEY}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"profile\""
    );
    let started = Instant::now();
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_head(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    let (rest, _) = read_to_close(&mut stream).await;
    assert!(rest.contains("body_timeout"), "{rest}");
    assert_eq!(server.profiles_status().await, 200);
}

/// SC-184: a connection that sends half a header is closed after `header_read_timeout_ms`.
#[tokio::test]
async fn sc_184_half_sent_headers_are_closed_after_the_header_read_timeout() {
    let server = Server::start("header_read_timeout_ms = 300").await;
    let mut stream = server.connect().await;
    let started = Instant::now();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let (_, closed) = read_to_close(&mut stream).await;
    assert!(
        closed,
        "the server closes a connection whose header does not end"
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
}

/// SC-185: a keep-alive connection with nothing to do is closed after `idle_timeout_ms`, and
/// so is one that never sends anything.
#[tokio::test]
async fn sc_185_idle_connections_are_closed() {
    let server = Server::start("idle_timeout_ms = 300\nheader_read_timeout_ms = 60000").await;
    let mut used = server.connect().await;
    used.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_head(&mut used).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut silent = server.connect().await;
    let started = Instant::now();
    let (_, closed) = read_to_close(&mut used).await;
    assert!(closed, "an idle keep-alive connection is closed");
    let (_, closed) = read_to_close(&mut silent).await;
    assert!(closed, "a connection that never sends is closed");
    assert!(started.elapsed() >= Duration::from_millis(250));
}

/// SC-186: past `connections_max` open connections the server accepts no more until one closes.
#[tokio::test]
async fn sc_186_connections_past_the_cap_wait_until_one_closes() {
    let server = Server::start(
        "connections_max = 2\nidle_timeout_ms = 60000\nheader_read_timeout_ms = 60000",
    )
    .await;
    // Two connections, each served once and kept alive.
    let mut first = server.connect().await;
    let mut second = server.connect().await;
    for stream in [&mut first, &mut second] {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = read_head(stream).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let length: usize = answer
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .expect("a content-length");
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.unwrap();
    }
    let mut third = server.connect().await;
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let waited = tokio::time::timeout(Duration::from_millis(500), third.read(&mut byte)).await;
    assert!(
        waited.is_err(),
        "the third connection is not served while two are open"
    );
    drop(first);
    let answer = read_head(&mut third).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// `work` on an HTTP/2 connection, which is driven meanwhile; it must end within `WAIT`, before
/// the connection does.
async fn driven<T>(
    connection: &mut h2::client::Connection<TcpStream>,
    work: impl std::future::Future<Output = T>,
) -> T {
    tokio::time::timeout(WAIT, async {
        tokio::select! {
            done = work => done,
            ended = connection => panic!("the connection ended first: {ended:?}"),
        }
    })
    .await
    .expect("done within the bound")
}

/// SC-226: a connection that opens with the HTTP/2 preface is served HTTP/2 (cleartext, prior
/// knowledge): the server's settings announce `http2_max_streams` streams at once, a request gets
/// the answer it gets over HTTP/1.1, a request without a key the same 401 before its body, and a
/// stream may send 65,535 bytes of body before the service reads them. A connection whose
/// preface stops half-way is closed after `header_read_timeout_ms`, as a half-sent HTTP/1.1
/// header is.
#[tokio::test]
async fn sc_226_http2_with_prior_knowledge_is_served_with_its_streams_bounded() {
    let server = Server::start("http2_max_streams = 3\nheader_read_timeout_ms = 300").await;
    let (_, over_http1) = server.profiles().await;

    let (mut send, mut connection) = h2::client::handshake(server.connect().await).await.unwrap();
    let request = http::Request::get(format!("{}/v1/profiles", server.base))
        .header("authorization", format!("Bearer {CALLER_KEY}"))
        .body(())
        .unwrap();
    let (answer, _) = send.send_request(request, true).unwrap();
    let answer = driven(&mut connection, answer).await.unwrap();
    assert_eq!(answer.status(), 200);
    // The server's SETTINGS frame came before its answer.
    assert_eq!(connection.max_concurrent_send_streams(), 3);
    let mut body = answer.into_body();
    let mut text = Vec::new();
    let read = async {
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            text.extend_from_slice(&chunk);
        }
    };
    driven(&mut connection, read).await;
    assert_eq!(String::from_utf8(text).unwrap(), over_http1);

    // A request without a key on the same connection is refused as on HTTP/1.1.
    let keyless = http::Request::post(format!("{}/v1/calls", server.base))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (refused, _) = send.send_request(keyless, false).unwrap();
    let refused = driven(&mut connection, refused).await.unwrap();
    assert_eq!(refused.status(), 401);

    // The body a stream may send before the service reads it is the protocol's initial window.
    let upload = http::Request::post(format!("{}/v1/calls", server.base))
        .header("authorization", format!("Bearer {CALLER_KEY}"))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (_, mut upload) = send.send_request(upload, false).unwrap();
    upload.reserve_capacity(1 << 20);
    let granted = driven(
        &mut connection,
        futures::future::poll_fn(|cx| upload.poll_capacity(cx)),
    )
    .await
    .expect("capacity")
    .unwrap();
    assert_eq!(granted, 65_535);
    upload.send_reset(h2::Reason::CANCEL);

    let mut half = server.connect().await;
    let started = Instant::now();
    half.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let (_, closed) = read_to_close(&mut half).await;
    assert!(closed, "a preface that stops half-way is closed");
    assert!(started.elapsed() >= Duration::from_millis(250));
}

/// SC-187: on SIGTERM the server stops within `http_drain_ms` (plus its drive drain) even while
/// a client keeps a request half-sent.
#[tokio::test]
async fn sc_187_shutdown_does_not_wait_for_a_half_sent_request() {
    let mut server = Server::start(
        "http_drain_ms = 500\nshutdown_drain_ms = 0\nheader_read_timeout_ms = 60000\nidle_timeout_ms = 60000",
    )
    .await;
    let mut stream = server.connect().await;
    stream
        .write_all(b"POST /v1/calls HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // The request reached the server: a second connection is served, so the first was accepted.
    assert_eq!(server.profiles_status().await, 200);
    let pid = server.child.0.id().to_string();
    let started = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = server.child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "serve still runs {WAIT:?} after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped after {:?}",
        started.elapsed()
    );
}

/// `GET {url}` with `key` (none when `None`): the status and the body.
async fn get(url: &str, key: Option<&str>) -> (u16, String) {
    let mut request = reqwest::Client::new().get(url).timeout(WAIT);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap())
}

/// SC-197: `/metrics` carries counters of every scope, spend totals included, so on the main
/// listener it answers an operator key only: no key is 401, a caller key 403, an operator key
/// 200 with the Prometheus text.
#[tokio::test]
async fn sc_197_metrics_on_the_main_listener_need_an_operator_key() {
    let server = Server::start("").await;
    let url = format!("{}/metrics", server.base);
    let (status, body) = get(&url, None).await;
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("tollgate_"), "{body}");
    let (status, body) = get(&url, Some(CALLER_KEY)).await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains("tollgate_"), "{body}");
    let (status, body) = get(&url, Some(OPERATOR_KEY)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("# TYPE tollgate_settled_spend_total counter"),
        "{body}"
    );
    // `metrics_public = true` is the explicit opt-out.
    let open = Server::start("metrics_public = true").await;
    let (status, body) = get(&format!("{}/metrics", open.base), None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("tollgate_calls_total"), "{body}");
}

/// SC-197: with `metrics_listen` set, that address serves `GET /metrics` without a key and
/// nothing else (404), while the main listener still asks for an operator key; the second
/// listener stops with the server on SIGTERM.
#[tokio::test]
async fn sc_197_the_metrics_address_serves_metrics_alone_without_a_key() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Server::start(&format!("metrics_listen = \"127.0.0.1:{port}\"")).await;
    let scrape = format!("http://127.0.0.1:{port}");
    let (status, body) = get(&format!("{scrape}/metrics"), None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("tollgate_calls_total"), "{body}");
    for path in ["/v1/profiles", "/healthz", "/console", "/openapi.json"] {
        let (status, body) = get(&format!("{scrape}{path}"), Some(CALLER_KEY)).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, _) = get(&format!("{}/metrics", server.base), None).await;
    assert_eq!(status, 401);
    assert_eq!(server.profiles_status().await, 200);
    let pid = server.child.0.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = server.child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "serve still runs after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(
        TcpStream::connect(("127.0.0.1", port)).await.is_err(),
        "the metrics address is closed with the server"
    );
}
