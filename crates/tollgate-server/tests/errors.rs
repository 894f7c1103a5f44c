//! Errors that help: body errors name the field path and what was expected (never a value),
//! oversized bodies are 413, and generated input on every route never gets a 5xx other than
//! 503 nor stops the server.
#![cfg(test)]

mod support;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::{call, Server, SECRET};
use tollgate_server::routes::{BODY_BYTES_MAX, ROUTES};

/// SC-190: a request naming a profile that is not loaded is refused 422 without the name it sent,
/// on `/v1/calls`, `/v1/roots` and the front door.
#[tokio::test]
async fn sc_190_an_unknown_profile_is_refused_without_echoing_its_name() {
    let s = Server::memory().await;
    let body = call(SECRET, "p-1", "r-1", "hello");
    let (status, _, text) = s.post("/v1/calls", &s.caller, &body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(!text.contains(SECRET) && text.contains("profile"), "{text}");
    let root = json!({"profile": SECRET, "root_key": "root-p", "session_id": "s",
        "intent": "i", "input_revision": "r", "deadline_ms": 60000});
    let (status, _, text) = s.post("/v1/roots", &s.caller, &root).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(!text.contains(SECRET), "{text}");
    let chat = json!({"model": SECRET, "messages": [{"role": "user", "content": "hi"}]});
    let answer = s
        .http
        .post(format!("{}/v1/chat/completions", s.base))
        .bearer_auth(&s.caller)
        .header("Idempotency-Key", "p-2")
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let text = answer.text().await.unwrap();
    assert!(!text.contains(SECRET), "{text}");
}

/// SC-198: an identifier holding an invisible format character (a right-to-left override, a
/// zero-width space) is refused 422 `invalid_request` naming the field, never the value, on
/// `/v1/calls` and `/v1/roots`; nothing is claimed, audited or sent.
#[tokio::test]
async fn sc_198_identifiers_with_format_characters_are_refused_and_write_nothing() {
    let s = Server::memory().await;
    let rlo = "order-\u{202E}1gnp.exe";
    let zwsp = "s\u{200B}1";
    let mut bodies = Vec::new();
    bodies.push(("operation_key", call("summarize", rlo, "r-1", "hello")));
    for field in ["session_id", "intent", "input_revision"] {
        let mut body = call("summarize", "fmt-1", "r-1", "hello");
        body[field] = json!(zwsp);
        bodies.push((field, body));
    }
    for (field, body) in bodies {
        let (status, answer, text) = s.post("/v1/calls", &s.caller, &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {text}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{text}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
        assert!(!text.contains(rlo) && !text.contains(zwsp), "{text}");
    }
    let root = json!({"profile": "agent-step", "root_key": rlo, "session_id": "s",
        "intent": "i", "input_revision": "r", "deadline_ms": 60000});
    let (status, answer, text) = s.post("/v1/roots", &s.caller, &root).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert_eq!(answer["error"]["code"], "invalid_request", "{text}");
    assert!(!text.contains(rlo), "{text}");
    // Nothing was claimed: the scope's audit log has no row, and nothing reached the provider.
    let scope = tollgate_core::ids::Scope::parse("acme").unwrap();
    let heads = tollgate_store::AuditLog::audit_heads(&*s.backend.stores(), &scope)
        .await
        .unwrap();
    assert!(heads.is_empty(), "{heads:?}");
    assert_eq!(s.mock.request_count(), 0);
    // The same call without the override runs.
    let (status, _, text) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("summarize", "order-1", "r-1", "hello"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    s.stop().await;
}

/// SC-198: a profile whose consumer holds a format character stops start-up, naming the field
/// and never the value.
#[test]
fn sc_198_a_consumer_with_a_format_character_is_refused_at_start_up() {
    use tollgate_server::config::{Env, FileConfig};
    let consumer = "team-\u{202E}a";
    let text = format!(
        r#"
[[providers]]
name = "mock"
kind = "openai-chat"
base_url = "http://127.0.0.1:9"

[[prices]]
version = "prices-t"
currency = "USD"
[prices.models."mock-echo"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"

[[profiles]]
name = "summarize"
kind = "text"
provider = "mock"
model = "mock-echo"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "{consumer}"
"#
    );
    let env = Env::new();
    let refused = FileConfig::from_toml(&text, &env)
        .unwrap()
        .validate(&env)
        .unwrap_err();
    assert!(refused.0.contains("consumer"), "{refused}");
    assert!(refused.0.contains("format character"), "{refused}");
    assert!(!refused.0.contains(consumer), "{refused}");
    let fine = FileConfig::from_toml(&text.replace(consumer, "team-a"), &env)
        .unwrap()
        .validate(&env);
    assert!(fine.is_ok(), "{fine:?}");
}

#[tokio::test]
async fn sc_135_body_errors_name_the_path_and_the_expectation_never_the_value() {
    let s = Server::memory().await;
    let mut body = call("summarize", "e-1", "r-1", "hello");
    body["input"]["messages"][0]["role"] = json!(SECRET);
    let (status, answer, text) = s.post("/v1/calls", &s.caller, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("input.messages[0].role"), "{message}");
    assert!(
        message.contains("expected `user` or `assistant`"),
        "{message}"
    );
    assert!(!text.contains(SECRET), "{text}");

    let mut body = call("summarize", "e-2", "r-1", "hello");
    body["intent"] = json!([SECRET]);
    let (status, answer, text) = s.post("/v1/calls", &s.caller, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("field intent: wrong type, expected a string"),
        "{message}"
    );
    assert!(!text.contains(SECRET), "{text}");

    let mut body = call("summarize", "e-3", "r-1", "hello");
    body["sessionid"] = json!(SECRET);
    let (status, answer, text) = s.post("/v1/calls", &s.caller, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("unknown field `sessionid`"), "{message}");
    assert!(!text.contains(SECRET), "{text}");

    let mut body = call("summarize", "e-4", "r-1", "hello");
    body.as_object_mut().unwrap().remove("intent");
    let (_, answer, _) = s.post("/v1/calls", &s.caller, &body).await;
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("missing field `intent`"), "{message}");

    // Not JSON at all: the position, no value.
    let (status, answer, text) = s
        .send(
            Method::POST,
            "/v1/calls",
            Some(&s.caller),
            Some(&format!("{{\"profile\": {SECRET}")),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));
    assert!(!text.contains(SECRET), "{text}");
    assert_eq!(s.mock.request_count(), 0);
    s.stop().await;
}

#[tokio::test]
async fn sc_136_an_oversized_body_is_413() {
    let s = Server::memory().await;
    let body = format!("{{\"pad\": \"{}\"}}", "x".repeat(BODY_BYTES_MAX + 1));
    for path in ["/v1/calls", "/v1/chat/completions", "/v1/admin/recover"] {
        let (status, answer, _) = s
            .send(Method::POST, path, Some(&s.caller), Some(&body))
            .await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}: {answer}");
        assert_eq!(answer["error"]["code"], "payload_too_large");
    }
    s.stop().await;
}

#[derive(Debug, Clone)]
struct Probe {
    route: usize,
    other_method: bool,
    segments: Vec<String>,
    key: u8,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::from),
        prop_oneof![
            Just("summarize"),
            Just("agent-step"),
            Just("extract-tool"),
            Just("user"),
            Just("assistant"),
            Just("tool"),
            Just("text"),
            Just("tool_call")
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        let names = prop_oneof![
            Just("profile".to_string()),
            Just("operation_key".to_string()),
            Just("session_id".to_string()),
            Just("input_revision".to_string()),
            Just("intent".to_string()),
            Just("input".to_string()),
            Just("messages".to_string()),
            Just("role".to_string()),
            Just("content".to_string()),
            Just("model".to_string()),
            Just("stream".to_string()),
            Just("usage".to_string()),
            Just("limit".to_string()),
            Just("root_key".to_string()),
            Just("deadline_ms".to_string()),
            Just("lease_ms".to_string()),
            Just("execution_id".to_string()),
            "[a-z_]{1,8}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(names, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn probe() -> impl Strategy<Value = Probe> {
    let header_names = prop_oneof![
        Just("idempotency-key"),
        Just("tollgate-session"),
        Just("tollgate-intent"),
        Just("tollgate-input-revision"),
        Just("tollgate-root"),
        Just("content-type"),
        Just("x-request-id"),
        Just("accept")
    ];
    let body = prop_oneof![
        Just(None),
        json_value().prop_map(|v| Some(v.to_string().into_bytes())),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Some),
    ];
    (
        0..ROUTES.len(),
        prop::bool::weighted(0.1),
        prop::collection::vec("[A-Za-z0-9%._~-]{0,12}", 2),
        0u8..4,
        prop::collection::vec((header_names, "[ -~]{0,24}"), 0..4),
        body,
    )
        .prop_map(
            |(route, other_method, segments, key, headers, body)| Probe {
                route,
                other_method,
                segments,
                key,
                headers: headers
                    .into_iter()
                    .map(|(n, v)| (n.to_string(), v))
                    .collect(),
                body,
            },
        )
}

fn fill(path: &str, segments: &[String]) -> String {
    let mut out = String::new();
    let mut next = segments.iter();
    for part in path.split('/').skip(1) {
        out.push('/');
        if part.starts_with('{') {
            out.push_str(next.next().map(String::as_str).unwrap_or("x"));
        } else {
            out.push_str(part);
        }
    }
    out
}

#[test]
fn sc_137_generated_input_on_every_route_gets_no_5xx_but_503_and_the_server_lives() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let s = runtime.block_on(Server::memory());
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&probe(), |p| {
        let (method, path) = ROUTES[p.route];
        let method = match (method, p.other_method) {
            ("get", false) | ("post", true) => Method::GET,
            _ => Method::POST,
        };
        let url = format!("{}{}", s.base, fill(path, &p.segments));
        let status = runtime.block_on(async {
            let mut request = s.http.request(method, url);
            request = match p.key {
                0 => request.bearer_auth(&s.caller),
                1 => request.bearer_auth(&s.operator),
                2 => request.header("authorization", "Bearer tg_garbage"),
                _ => request,
            };
            for (name, value) in &p.headers {
                request = request.header(name.as_str(), value.as_str());
            }
            if let Some(body) = p.body.clone() {
                request = request.body(body);
            }
            request.send().await.map(|r| r.status())
        });
        let status = status.map_err(|e| TestCaseError::fail(format!("no answer: {e}")))?;
        prop_assert!(
            !status.is_server_error() || status == StatusCode::SERVICE_UNAVAILABLE,
            "{status} for {p:?}"
        );
        Ok(())
    });
    result.unwrap();
    // Still serving, and still running calls.
    runtime.block_on(async {
        let (status, _, _) = s.send(Method::GET, "/healthz", None, None).await;
        assert_eq!(status, StatusCode::OK);
        let (status, view, _) = s
            .post(
                "/v1/calls",
                &s.caller,
                &call("summarize", "after-fuzz", "r-1", "hi"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{view}");
        s.stop().await;
    });
}
