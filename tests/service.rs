//! The HTTP service, black-box on Postgres (spec/service.md): the built `tollgate serve` on a
//! fresh database of its own per test, with the mock provider running in the test process, driven
//! over HTTP with reqwest (and by the official OpenAI Python SDK), its keys made and revoked with
//! the `tollgate keys` commands. The tests judge the server by its answers, the mock's request
//! counter and what the binary's own commands read from the database; the one write beside the
//! server is a key that has already expired (the CLI makes none).
#![cfg(test)]

use tollgate_testkit::sdk_tour;
mod support;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use support::{
    fresh_database, json_ok, normalized, run, serve_on, stderr, stdout, tollgate, TempFile,
};
use tollgate_mock_provider::MockProvider;
use tollgate_server::config::KEY_CACHE_MS_DEFAULT;
use tollgate_testkit::pg::TestDatabase;

/// A key configured in `[[keys]]` (scope `acme`, caller): only its SHA-256 is in the file.
const CONFIG_KEY: &str = "tg_configured_caller_key_of_scope_acme";

/// Where the project's files are.
fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn sha256_hex(key: &str) -> String {
    tollgate_store::KeyDigest::of_key(key).to_hex()
}

/// A configuration on the mock: `summarize` (echo), `slow` (the mock waits 2 s before its
/// headers), one configured caller key; `server` is extra `[server]` lines.
fn service_config(mock_url: &str, server: &str) -> String {
    let config_sha = sha256_hex(CONFIG_KEY);
    let price = |model: &str| {
        format!(
            "[prices.models.\"{model}\"]\ninput = \"1.00\"\noutput = \"2.00\"\n\
             cache_read = \"0.10\"\ncache_write = \"1.25\"\nreasoning = \"2.00\"\n"
        )
    };
    let profile = |name: &str, model: &str| {
        format!(
            "[[profiles]]\nname = \"{name}\"\nkind = \"text\"\nprovider = \"mock\"\n\
             model = \"{model}\"\npolicy_version = \"policy-1\"\nprice_version = \"prices-service\"\n\
             consumer = \"team-a\"\nmax_tokens = 64\nmax_input_chars = 2000\n\
             run_timeout_ms = 10000\n"
        )
    };
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{server}\n\n\
         [[providers]]\nname = \"mock\"\nkind = \"openai-chat\"\nbase_url = \"{mock_url}\"\n\n\
         [[prices]]\nversion = \"prices-service\"\ncurrency = \"USD\"\n{}{}\n{}\n{}\n\
         [[keys]]\nscope = \"acme\"\nrole = \"caller\"\nsha256 = \"{config_sha}\"\n",
        price("mock-echo"),
        price("mock-slow-2000"),
        profile("summarize", "mock-echo"),
        profile("slow", "mock-slow-2000"),
    )
}

/// A fresh database, the mock, `tollgate serve` on both, and keys made by `tollgate keys
/// create`: a caller, an operator and a finance key of scope `acme`.
struct Service {
    db: TestDatabase,
    mock: MockProvider,
    config: TempFile,
    _serve: support::ServeChild,
    base: String,
    http: reqwest::Client,
    caller: String,
    operator: String,
    finance: String,
}

/// `tollgate keys create` on `url`: `(key, id)`.
fn create_key(url: &str, scope: &str, role: &str, extra: &[&str]) -> (String, String) {
    let created = json_ok(&run(tollgate()
        .args(["--json", "keys", "create", "--scope", scope, "--role", role])
        .args(extra)
        .env("DATABASE_URL", url)));
    (
        created["key"].as_str().unwrap().to_string(),
        created["id"].as_str().unwrap().to_string(),
    )
}

impl Service {
    async fn start(server: &str) -> Self {
        let db = fresh_database().await;
        let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
            .await
            .unwrap();
        let config = TempFile::new("service.toml", &service_config(&mock.base_url(), server));
        let (caller, _) = create_key(db.url(), "acme", "caller", &[]);
        let (operator, _) = create_key(db.url(), "acme", "operator", &[]);
        let (finance, _) = create_key(db.url(), "acme", "finance", &[]);
        let (serve, base) = serve_on(&config.0, db.url()).await;
        Self {
            db,
            mock,
            config,
            _serve: serve,
            base,
            http: reqwest::Client::new(),
            caller,
            operator,
            finance,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> (StatusCode, Value, reqwest::header::HeaderMap) {
        let mut request = self.http.request(method, self.url(path));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.unwrap();
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::Null),
            headers,
        )
    }

    async fn get(&self, path: &str, key: &str) -> (StatusCode, Value) {
        let (status, value, _) = self.send(Method::GET, path, Some(key), None).await;
        (status, value)
    }

    async fn post(&self, path: &str, key: &str, body: &Value) -> (StatusCode, Value) {
        let (status, value, _) = self.send(Method::POST, path, Some(key), Some(body)).await;
        (status, value)
    }

    /// A `tollgate` command on this service's database and configuration.
    fn command(&self, args: &[&str]) -> std::process::Output {
        run(tollgate()
            .args(args)
            .env("DATABASE_URL", self.db.url())
            .current_dir(std::env::temp_dir()))
    }

    async fn stop(self) {
        drop(self._serve);
        self.mock.shutdown().await;
        drop(self.config);
        drop(self.db);
    }
}

fn call(profile: &str, key: &str, text: &str) -> Value {
    json!({
        "profile": profile, "operation_key": key, "session_id": "s-1",
        "input_revision": "r-1", "intent": "summarize",
        "input": {"messages": [{"role": "user", "content": text}]}
    })
}

/// A path of the document with its parameters filled in.
fn concrete(route: &str) -> String {
    route
        .split('/')
        .map(|s| {
            if s.starts_with('{') {
                "00000000-0000-4000-8000-000000000000"
            } else {
                s
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Every `(method, path)` of a document.
fn operations(doc: &Value) -> Vec<(String, String)> {
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The document
// ---------------------------------------------------------------------------------------------

/// SC-134, SC-160: the Postgres-backed server serves the checked-in document, and every route
/// of it answers its method with something other than the router's 404 or 405.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_134_sc_160_the_server_on_postgres_serves_the_checked_in_document_and_every_route() {
    let s = Service::start("").await;
    let (status, served, _) = s.send(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let checked_in: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file("spec/openapi.json")).unwrap())
            .unwrap();
    assert!(
        served == checked_in,
        "the served document differs from spec/openapi.json: regenerate it with \
         TOLLGATE_UPDATE_OPENAPI=1 cargo test -p tollgate-server --test openapi"
    );
    let ops = operations(&served);
    assert!(ops.len() >= 30, "{} operations", ops.len());
    for (method, path) in ops {
        let method: Method = method.to_uppercase().parse().unwrap();
        let body = (method == Method::POST).then(|| json!({}));
        let response = s
            .http
            .request(method.clone(), s.url(&concrete(&path)))
            .bearer_auth(&s.operator)
            .json(&body.unwrap_or(Value::Null))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert!(
            !text.contains("no such route"),
            "{method} {path} is not served: {status} {text}"
        );
    }
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Error shapes and generated requests
// ---------------------------------------------------------------------------------------------

/// SC-135, SC-136: a missing field names its path, an unknown field its name, a body over the
/// limit is 413; nothing is sent to the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_135_sc_136_body_errors_on_postgres_name_the_field_and_oversized_is_413() {
    let s = Service::start("").await;
    let mut body = call("summarize", "e-1", "hello");
    body["input"]["messages"][0]
        .as_object_mut()
        .unwrap()
        .remove("role");
    let (status, answer) = s.post("/v1/calls", &s.caller, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_request");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("input.messages[0]"), "{message}");
    assert!(message.contains("missing field `role`"), "{message}");

    let mut body = call("summarize", "e-2", "hello");
    body["temperature"] = json!(0.5);
    let (status, answer) = s.post("/v1/calls", &s.caller, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("unknown field `temperature`"), "{message}");

    let big = format!(
        "{{\"pad\": \"{}\"}}",
        "x".repeat(tollgate_server::routes::BODY_BYTES_MAX + 1)
    );
    for path in ["/v1/calls", "/v1/chat/completions", "/v1/admin/recover"] {
        let response = s
            .http
            .post(s.url(path))
            .bearer_auth(&s.caller)
            .header("content-type", "application/json")
            .body(big.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE, "{path}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["error"]["code"], "payload_too_large", "{path}");
    }
    assert_eq!(s.mock.request_count(), 0, "nothing was sent");
    s.stop().await;
}

#[derive(Debug, Clone)]
struct Probe {
    route: usize,
    other_method: bool,
    segment: String,
    key: u8,
    headers: Vec<(&'static str, String)>,
    body: Option<Vec<u8>>,
}

fn probe(routes: usize) -> impl Strategy<Value = Probe> {
    let header = prop_oneof![
        Just("idempotency-key"),
        Just("tollgate-session"),
        Just("tollgate-root"),
        Just("content-type"),
        Just("x-request-id"),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::from),
        "\\PC{0,10}".prop_map(Value::from),
        Just(json!("summarize")),
    ];
    let value = leaf.prop_recursive(2, 12, 4, |inner| {
        let name = prop_oneof![
            Just("profile".to_string()),
            Just("operation_key".to_string()),
            Just("input".to_string()),
            Just("messages".to_string()),
            Just("usage".to_string()),
            Just("limit".to_string()),
            "[a-z_]{1,8}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map(name, inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    let body = prop_oneof![
        Just(None),
        value.prop_map(|v| Some(v.to_string().into_bytes())),
        prop::collection::vec(any::<u8>(), 0..48).prop_map(Some),
    ];
    (
        0..routes,
        prop::bool::weighted(0.1),
        "[A-Za-z0-9%._~-]{0,12}",
        0u8..4,
        prop::collection::vec((header, "[ -~]{0,20}"), 0..3),
        body,
    )
        .prop_map(|(route, other_method, segment, key, headers, body)| Probe {
            route,
            other_method,
            segment,
            key,
            headers,
            body,
        })
}

/// SC-137: 64 generated requests over every route of the document (random bodies, headers,
/// path segments, keys, methods) against the Postgres-backed server: no 5xx but 503, and the
/// server still serves and runs calls afterwards.
#[test]
fn sc_137_generated_requests_on_postgres_get_no_5xx_but_503_and_the_server_lives() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let s = runtime.block_on(Service::start(""));
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file("spec/openapi.json")).unwrap())
            .unwrap();
    let ops = operations(&doc);
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&probe(ops.len()), |p| {
        let (method, path) = &ops[p.route];
        let method = match (method.as_str(), p.other_method) {
            ("get", false) | ("post", true) => Method::GET,
            _ => Method::POST,
        };
        let path: String = path
            .split('/')
            .map(|part| {
                if part.starts_with('{') {
                    p.segment.as_str()
                } else {
                    part
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        let status = runtime.block_on(async {
            let mut request = s.http.request(method, s.url(&path));
            request = match p.key {
                0 => request.bearer_auth(&s.caller),
                1 => request.bearer_auth(&s.operator),
                2 => request.header("authorization", "Bearer tg_garbage"),
                _ => request,
            };
            for (name, value) in &p.headers {
                request = request.header(*name, value.as_str());
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
    runtime.block_on(async {
        let (status, _, _) = s.send(Method::GET, "/readyz", None, None).await;
        assert_eq!(status, StatusCode::OK);
        let (status, view) = s
            .post(
                "/v1/calls",
                &s.caller,
                &call("summarize", "after-fuzz", "hi"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{view}");
        assert_eq!(view["state"], "completed", "{view}");
        s.stop().await;
    });
}

// ---------------------------------------------------------------------------------------------
// The OpenAI Python SDK
// ---------------------------------------------------------------------------------------------

/// The `slow` profile of [`service_config`]: its mock answers after 2 s.
const SLOW: sdk_tour::Slow = sdk_tour::Slow {
    profile: "slow",
    ms: 2000,
};

/// SC-133, SC-209: `examples/openai_sdk.py` at the SDK's default retry settings against
/// `tollgate serve` on Postgres: call, replay, common fields, the SDK's own retries of a call
/// still being processed (409 `in_progress`, then the stored completion), a reused key with
/// another body (422), stream, no key; the mock saw one request per call that ran (the call,
/// the fields, the retried call and the stream), none for the replay, the retries, the conflict
/// or the refused request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_133_sc_209_the_openai_python_sdk_against_tollgate_serve_on_postgres() {
    let python = sdk_tour::sdk_python();
    let s = Service::start("").await;
    sdk_tour::run_tour(&python, "examples/openai_sdk.py", &s.base, &s.caller, SLOW).await;
    assert_eq!(s.mock.request_count_for(sdk_tour::RETRIED_PROMPT), 1);
    assert_eq!(s.mock.request_count(), 4, "one provider request per call");
    s.stop().await;
}

/// SC-162, SC-209: `examples/openai_sdk.mjs` (the official `openai` npm package) against
/// `tollgate serve` on Postgres: the same tour; one provider request per call that ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_162_sc_209_the_openai_node_sdk_against_tollgate_serve_on_postgres() {
    let node = sdk_tour::sdk_node();
    let s = Service::start("").await;
    sdk_tour::run_tour(&node, "examples/openai_sdk.mjs", &s.base, &s.caller, SLOW).await;
    assert_eq!(s.mock.request_count_for(sdk_tour::RETRIED_PROMPT), 1);
    assert_eq!(s.mock.request_count(), 4, "one provider request per call");
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

/// SC-140, SC-161, SC-180: keys made with the CLI are listed by the CLI and over HTTP (id, role,
/// created, last used; never the key), beside the configured key; revoked over HTTP the key is
/// refused on its next request, revoked with the CLI (outside the server) within the default key
/// cache bound; an expired key is refused; the configured key cannot be revoked either way and
/// keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_140_sc_161_sc_180_keys_made_listed_and_revoked_from_the_cli_and_over_http() {
    let s = Service::start("").await;
    let url = s.db.url().to_string();
    let (by_http, by_http_id) = create_key(&url, "acme", "caller", &[]);
    let (by_cli, by_cli_id) = create_key(&url, "acme", "caller", &[]);
    let soon = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let (expiring, expiring_id) = create_key(&url, "acme", "caller", &["--expires-at", &soon]);
    let (other, _) = create_key(&url, "globex", "caller", &[]);
    let config = s.config.0.to_str().unwrap().to_string();

    // Every key works; a use stamps last_used_at. The server reads `by_cli` no earlier than
    // `by_cli_first_use`.
    let by_cli_first_use = Instant::now();
    for key in [
        by_http.as_str(),
        &by_cli,
        &expiring,
        &other,
        &s.caller,
        CONFIG_KEY,
    ] {
        let (status, _) = s.get("/v1/profiles", key).await;
        assert_eq!(status, StatusCode::OK);
    }

    // The CLI's listing: ids, roles, dates, sources; never a key.
    let output = s.command(&[
        "keys", "list", "--scope", "acme", "--config", &config, "--json",
    ]);
    let text = stdout(&output);
    for key in [
        by_http.as_str(),
        &by_cli,
        &expiring,
        &s.caller,
        &s.operator,
        CONFIG_KEY,
    ] {
        assert!(!text.contains(key), "never the key");
    }
    let listed = json_ok(&output);
    let keys = listed["keys"].as_array().unwrap();
    assert_eq!(
        keys.len(),
        7,
        "six stored and one configured key of acme: {listed}"
    );
    let find = |id: &str| keys.iter().find(|k| k["id"] == id).cloned().unwrap();
    let mine = find(&by_http_id);
    assert_eq!(mine["role"], "caller");
    assert_eq!(mine["source"], "stored");
    assert_eq!(mine["revocable"], true);
    assert!(mine["created_at"].is_string(), "{mine}");
    assert!(mine["last_used_at"].is_string(), "{mine}");
    assert_eq!(mine["revoked"], false);
    assert!(find(&expiring_id)["expires_at"].is_string());
    let configured = find(&sha256_hex(CONFIG_KEY));
    assert_eq!(configured["source"], "config", "{configured}");
    assert_eq!(configured["revocable"], false);
    assert_eq!(configured["role"], "caller");
    // The plain listing: one line per key, the id first, never the key.
    let plain = s.command(&["keys", "list", "--scope", "acme", "--config", &config]);
    let plain = stdout(&plain);
    assert_eq!(plain.lines().count(), 7, "{plain}");
    assert!(plain.contains("source=config revocable=false"), "{plain}");
    assert!(plain
        .lines()
        .any(|l| l.starts_with(&by_http_id) && l.contains(" caller ") && l.contains("created=")));
    assert!(!plain.contains(&by_http));

    // The same over HTTP, for the operator's scope only.
    let (status, http_list) = s.get("/v1/admin/keys", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{http_list}");
    let http_ids: BTreeSet<&str> = http_list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap())
        .collect();
    let cli_ids: BTreeSet<&str> = keys.iter().map(|k| k["id"].as_str().unwrap()).collect();
    assert_eq!(http_ids, cli_ids);

    // Revoked over HTTP: refused on the next request.
    let (status, revoked) = s
        .post(
            &format!("/v1/admin/keys/{by_http_id}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert_eq!(revoked["revoked"], true);
    let (status, refused) = s.get("/v1/profiles", &by_http).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
    assert_eq!(refused["error"]["code"], "unauthenticated");

    // Revoked with the CLI, which writes the database behind the server's back: the server may
    // serve the key from its cache until its read is older than `[server] key_cache_ms` (the
    // default, 1 s), then refuses it. Polled with a deadline of ten times the bound.
    let (status, _) = s.get("/v1/profiles", &by_cli).await;
    assert_eq!(status, StatusCode::OK);
    let revoked = json_ok(&s.command(&["keys", "revoke", &by_cli_id, "--json"]));
    assert_eq!(revoked["revoked"], true, "{revoked}");
    let bound = Duration::from_millis(KEY_CACHE_MS_DEFAULT);
    let revoked_at = Instant::now();
    loop {
        let (status, body) = s.get("/v1/profiles", &by_cli).await;
        if status == StatusCode::UNAUTHORIZED {
            break;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            revoked_at.elapsed() < bound * 10,
            "a key revoked with the CLI still works {:?} later",
            bound * 10
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        by_cli_first_use.elapsed() >= bound,
        "refused before any cached read of the key could be stale"
    );
    let (status, _) = s.get("/v1/profiles", &by_cli).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "and stays refused");

    // An expired key is refused. The CLI only makes keys expiring in the future, so this one is
    // written to the key store with an expiry a second ago.
    let expired = store_expired_key(&url, "acme").await;
    let (status, _) = s.get("/v1/profiles", &expired).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "an expired key is refused"
    );

    // The configured key: not revocable over HTTP (409 key_in_config) nor with the CLI.
    let configured_id = sha256_hex(CONFIG_KEY);
    let (status, answer) = s
        .post(
            &format!("/v1/admin/keys/{configured_id}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["error"]["code"], "key_in_config");
    let refused = s.command(&["keys", "revoke", &configured_id, "--config", &config]);
    assert!(!refused.status.success(), "{}", stdout(&refused));
    assert!(
        stderr(&refused).contains("[[keys]]"),
        "{}",
        stderr(&refused)
    );
    let (status, _) = s.get("/v1/profiles", CONFIG_KEY).await;
    assert_eq!(status, StatusCode::OK, "the configured key still works");
    let (status, _) = s.get("/v1/profiles", &other).await;
    assert_eq!(status, StatusCode::OK, "other keys still work");
    s.stop().await;
}

/// Stores a caller key of `scope` in the database at `url` that expired a second ago (the CLI
/// refuses an expiry in the past) and answers the key.
async fn store_expired_key(url: &str, scope: &str) -> String {
    use tollgate_store::{ApiKeyRecord, ApiKeyStore, KeyDigest, KeyRole};
    let stores = tollgate_postgres::PgStores::connect(url, 1).await.unwrap();
    // Of the generated form, so that it is refused for its expiry and not for its form.
    let key = format!(
        "tg_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let now = chrono::Utc::now();
    let mut expired = ApiKeyRecord::new(
        KeyDigest::of_key(&key),
        tollgate_core::ids::Scope::parse(scope).unwrap(),
        KeyRole::Caller,
        now - chrono::Duration::days(2),
    );
    expired.expires_at = Some(now - chrono::Duration::seconds(1));
    stores.insert_key(expired).await.unwrap();
    key
}

// ---------------------------------------------------------------------------------------------
// The finance feed
// ---------------------------------------------------------------------------------------------

/// Calls run in parallel while the finance feed is read.
const FEED_CALLS: usize = 40;
/// The feed's page size: small, so the reader pages many times while the calls run.
const FEED_PAGE: u32 = 3;

async fn feed_page(s: &Service, after: Option<&str>) -> (Vec<Value>, String) {
    let path = match after {
        Some(after) => format!("/v1/finance/settlements?limit={FEED_PAGE}&after={after}"),
        None => format!("/v1/finance/settlements?limit={FEED_PAGE}"),
    };
    let (status, page) = s.get(&path, &s.finance).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let rows = page["settlements"].as_array().unwrap().clone();
    assert!(rows.len() <= FEED_PAGE as usize, "{page}");
    (rows, page["next"].as_str().unwrap_or_default().to_string())
}

/// SC-141, SC-142: a finance consumer pages `GET /v1/finance/settlements?after=` with a small
/// limit while 40 calls run in parallel, then drains: it sees every settlement exactly once, in
/// the feed's order, and what it saw is what `finance.settlements` holds (read with SQL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_141_sc_142_a_feed_reader_paging_during_40_parallel_calls_sees_each_once() {
    let s = std::sync::Arc::new(Service::start("").await);
    let calls: Vec<_> = (0..FEED_CALLS)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let (status, view) = s
                    .post(
                        "/v1/calls",
                        &s.caller,
                        &call("summarize", &format!("feed-{i}"), "hello"),
                    )
                    .await;
                assert_eq!(status, StatusCode::OK, "{view}");
                assert_eq!(view["state"], "completed", "{view}");
            })
        })
        .collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (s, done) = (s.clone(), done.clone());
        tokio::spawn(async move {
            let mut seen: Vec<Value> = Vec::new();
            let mut after: Option<String> = None;
            let mut pages_while_running = 0u32;
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let (rows, next) = feed_page(&s, after.as_deref()).await;
                if !finished {
                    pages_while_running += 1;
                }
                if let Some(last) = rows.last() {
                    assert_eq!(last["cursor"].as_str(), Some(next.as_str()));
                }
                let empty = rows.is_empty();
                seen.extend(rows);
                after = Some(next).filter(|n| !n.is_empty()).or(after);
                if finished && empty && seen.len() >= FEED_CALLS {
                    break;
                }
                if empty {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
            (seen, pages_while_running)
        })
    };
    for c in calls {
        c.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (seen, pages_while_running) =
        tokio::time::timeout(std::time::Duration::from_secs(120), reader)
            .await
            .expect("the feed drains")
            .unwrap();
    assert!(pages_while_running > 0);

    // Exactly once.
    let ids: Vec<&str> = seen.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "a settlement was seen twice");
    assert_eq!(ids.len(), FEED_CALLS);
    // In order: what was paged while the calls ran is the feed read afresh once they ended.
    let mut again: Vec<Value> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let (rows, next) = feed_page(&s, after.as_deref()).await;
        if rows.is_empty() {
            break;
        }
        again.extend(rows);
        after = Some(next);
    }
    let again_ids: Vec<&str> = again.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, again_ids, "paged order differs from the feed's order");
    // The union is `finance.settlements` (this test's database holds one scope).
    let view: BTreeSet<(String, String, String)> =
        s.db.finance_rows()
            .await
            .unwrap()
            .into_iter()
            .map(|(execution, amount, source)| (execution, normalized(&amount), source))
            .collect();
    let seen_rows: BTreeSet<(String, String, String)> = seen
        .iter()
        .map(|r| {
            (
                r["execution_id"].as_str().unwrap().to_string(),
                normalized(r["amount"].as_str().unwrap()),
                r["source"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(view.len(), FEED_CALLS);
    assert_eq!(seen_rows, view);
    assert_eq!(s.mock.request_count(), FEED_CALLS as u64);
    std::sync::Arc::into_inner(s)
        .expect("no task holds the service")
        .stop()
        .await;
}

// ---------------------------------------------------------------------------------------------
// Limits and request ids
// ---------------------------------------------------------------------------------------------

/// A request and the status it must get: method, path, key, body.
type Case<'a> = (Method, &'a str, Option<&'a str>, Option<Value>, StatusCode);

/// SC-138: every answer carries `x-request-id` — the one sent, echoed, else a generated v4
/// UUID — errors included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_138_every_answer_on_postgres_carries_a_request_id() {
    let s = Service::start("").await;
    let cases: Vec<Case> = vec![
        (Method::GET, "/healthz", None, None, StatusCode::OK),
        (
            Method::GET,
            "/v1/profiles",
            Some(&s.caller),
            None,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/v1/profiles",
            None,
            None,
            StatusCode::UNAUTHORIZED,
        ),
        (
            Method::GET,
            "/v1/nowhere",
            None,
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::DELETE,
            "/v1/calls",
            None,
            None,
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::POST,
            "/v1/calls",
            Some(&s.caller),
            Some(json!({"profile": 1})),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            "/v1/calls",
            Some(&s.caller),
            Some(call("summarize", "rid-1", "hello")),
            StatusCode::OK,
        ),
    ];
    for (method, path, key, body, expected) in cases {
        for given in [None, Some("req-given-42")] {
            let mut request = s.http.request(method.clone(), s.url(path));
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            if let Some(body) = &body {
                request = request.json(body);
            }
            if let Some(given) = given {
                request = request.header("x-request-id", given);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), expected, "{method} {path}");
            let id = response
                .headers()
                .get("x-request-id")
                .unwrap_or_else(|| panic!("{method} {path}: no x-request-id"))
                .to_str()
                .unwrap()
                .to_string();
            match given {
                Some(given) => assert_eq!(id, given, "{method} {path}"),
                None => {
                    let uuid = uuid::Uuid::parse_str(&id).unwrap();
                    assert_eq!(uuid.get_version_num(), 4, "{method} {path}: {id}");
                }
            }
        }
    }
    s.stop().await;
}

/// SC-139: with `concurrency_limit = 1`, a request arriving while another is served is answered
/// 503 `unavailable` at once; with `request_timeout_ms = 1000`, a call to a provider that waits
/// 2 s is answered 504 `interrupted`, cause `request_timeout`, and still settles in the
/// background (sent once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_139_the_concurrency_limit_and_the_request_timeout_on_postgres() {
    let s = std::sync::Arc::new(
        Service::start("concurrency_limit = 1\nrequest_timeout_ms = 1000").await,
    );
    // While the slow call holds the only slot, other requests are turned away with a 503. A
    // probe that holds the slot when the slow call arrives turns the slow call away instead
    // (nothing written): then it is sent again.
    let mut turned_away = 0;
    let (overloaded, slow) = loop {
        let slow = {
            let s = s.clone();
            tokio::spawn(async move {
                let (status, answer, headers) = s
                    .send(
                        Method::POST,
                        "/v1/calls",
                        Some(&s.caller),
                        Some(&call("slow", "slow-1", "hello")),
                    )
                    .await;
                (status, answer, headers.contains_key("x-request-id"))
            })
        };
        let mut overloaded = None;
        while !slow.is_finished() {
            let (status, answer, headers) = s.send(Method::GET, "/healthz", None, None).await;
            if status == StatusCode::SERVICE_UNAVAILABLE {
                assert!(headers.contains_key("x-request-id"));
                overloaded = Some(answer);
                break;
            }
            assert_eq!(status, StatusCode::OK);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        if let Some(overloaded) = overloaded {
            break (overloaded, slow);
        }
        let (status, answer, _) = slow.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
        turned_away += 1;
        assert!(turned_away < 20, "the slow call never took the slot");
    };
    assert_eq!(overloaded["error"]["code"], "unavailable", "{overloaded}");

    let (status, answer, has_id) = slow.await.unwrap();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{answer}");
    assert_eq!(answer["error"]["code"], "interrupted", "{answer}");
    assert_eq!(answer["error"]["cause"], "request_timeout", "{answer}");
    assert!(has_id);

    // The slot is free again; the cut call was sent once and settles in the background.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let view = loop {
        let (status, view) = s.get("/v1/calls/slow-1", &s.caller).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        if view["state"] == "completed" {
            break view;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never settled: {view}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(view["receipt"]["amount"].is_string(), "{view}");
    assert_eq!(s.mock.request_count(), 1, "sent once");
    std::sync::Arc::into_inner(s)
        .expect("no task holds the service")
        .stop()
        .await;
}

/// One member's counters of H-39: members counted, answered forwards, unreachable owners,
/// requests received.
async fn cluster_counters(http: &reqwest::Client, base: &str, operator: &str) -> [u64; 4] {
    let text = support::metrics_text(http, base, Some(operator))
        .await
        .unwrap_or_else(|| panic!("{base} answers no metrics"));
    [
        "tollgate_cluster_members",
        "tollgate_forwarded_calls_total{outcome=\"answered\"}",
        "tollgate_forwarded_calls_total{outcome=\"unreachable\"}",
        "tollgate_forwarded_calls_received_total",
    ]
    .map(|name| support::metric(&text, name).unwrap_or_else(|| panic!("no {name} in the metrics")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn h_39_two_members_serve_each_consumer_s_calls_on_its_group_s_owner() {
    let db = fresh_database().await;
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    // team-a's chain group (6) and team-b's (3) have different owners in a cluster of two.
    let text = format!(
        "{}\n[[profiles]]\nname = \"summarize-b\"\nkind = \"text\"\nprovider = \"mock\"\n\
         model = \"mock-echo\"\npolicy_version = \"policy-1\"\nprice_version = \"prices-service\"\n\
         consumer = \"team-b\"\nmax_tokens = 64\nmax_input_chars = 2000\nrun_timeout_ms = 10000\n",
        service_config(&mock.base_url(), "")
    );
    let config = TempFile::new("cluster.toml", &text);
    let (caller, _) = create_key(db.url(), "acme", "caller", &[]);
    let (operator, _) = create_key(db.url(), "acme", "operator", &[]);
    let secret = support::CLUSTER_SECRET;
    let (a, a_base) = support::serve_member(&config.0, db.url(), secret).await;
    let (b, b_base) = support::serve_member(&config.0, db.url(), secret).await;
    // Beside them, rows that are no member of theirs: an instance of other profiles (a rolling
    // deploy's other version) and one without the members' secret.
    let other = TempFile::new("cluster-other.toml", &service_config(&mock.base_url(), ""));
    let (_other, other_base) = support::serve_member(&other.0, db.url(), secret).await;
    let forger = "a secret that is not the members' secret at all";
    let (_forger, forger_base) = support::serve_member(&config.0, db.url(), forger).await;
    let http = reqwest::Client::new();
    // A call of `profile` by the native route to `base`, its prompt its key.
    let native = |base: &str, profile: &str, key: &str| {
        http.post(format!("{base}/v1/calls"))
            .bearer_auth(&caller)
            .json(&call(profile, key, key))
    };
    let bases = [a_base.clone(), b_base.clone()];
    let deadline = Instant::now() + Duration::from_secs(20);
    for base in &bases {
        while cluster_counters(&http, base, &operator).await[0] != 2 {
            assert!(
                Instant::now() < deadline,
                "{base} never counted two members"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Every row is read each heartbeat: a heartbeat later, each still counts only its own.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for (base, members) in [
        (&a_base, 2),
        (&b_base, 2),
        (&other_base, 1),
        (&forger_base, 1),
    ] {
        let counted = cluster_counters(&http, base, &operator).await[0];
        assert_eq!(counted, members, "{base}");
    }

    // Each consumer's calls sent to both members, by the native route and the two doors (a
    // stream of each door): one member serves its own, the other forwards them.
    const EACH: usize = 6;
    let mut keys = Vec::new();
    for (profile, consumer) in [("summarize", "a"), ("summarize-b", "b")] {
        for (m, base) in bases.iter().enumerate() {
            for i in 0..EACH {
                let key = format!("h39-{consumer}-{m}-{i}");
                let answer: Value = if i < 2 {
                    let r = native(base, profile, &key).send().await.unwrap();
                    assert_eq!(r.status(), StatusCode::OK, "{key}");
                    r.json().await.unwrap()
                } else {
                    // The OpenAI door (i 2, 3) and the Anthropic door (i 4, 5), a stream each.
                    let stream = i % 2 == 1;
                    let anthropic = i >= 4;
                    let (path, body) = if anthropic {
                        let body = json!({"model": profile, "max_tokens": 64, "stream": stream,
                            "messages": [{"role": "user", "content": key}]});
                        ("/v1/messages", body)
                    } else {
                        let body = json!({"model": profile, "stream": stream,
                            "messages": [{"role": "user", "content": key}]});
                        ("/v1/chat/completions", body)
                    };
                    let r = http
                        .post(format!("{base}{path}"))
                        .bearer_auth(&caller)
                        .header("anthropic-version", "2023-06-01")
                        .header("Idempotency-Key", &key)
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), StatusCode::OK, "{key}");
                    let body = r.text().await.unwrap();
                    match (anthropic, stream) {
                        (false, true) => assert!(body.contains("data: [DONE]"), "{key}: {body}"),
                        (true, true) => {
                            assert!(body.contains("event: message_stop"), "{key}: {body}");
                        }
                        (false, false) => {
                            let completion: Value = serde_json::from_str(&body).unwrap();
                            assert!(completion["choices"][0]["message"]["content"].is_string());
                        }
                        (true, false) => {
                            let message: Value = serde_json::from_str(&body).unwrap();
                            assert_eq!(message["type"], "message", "{key}: {body}");
                        }
                    }
                    json!({"state": "completed"})
                };
                assert_eq!(answer["state"], "completed", "{key}: {answer}");
                keys.push(key);
            }
        }
    }
    let [_, a_sent, a_lost, a_received] = cluster_counters(&http, &a_base, &operator).await;
    let [_, b_sent, b_lost, b_received] = cluster_counters(&http, &b_base, &operator).await;
    assert_eq!((a_lost, b_lost), (0, 0));
    // Each member owns one of the two consumers and forwards the other's calls, once each.
    assert_eq!((a_sent, b_sent), (EACH as u64, EACH as u64));
    assert_eq!((a_received, b_received), (b_sent, a_sent));
    for key in &keys {
        assert_eq!(mock.request_count_for(key), 1, "{key} sent once");
    }
    // A replay on either member answers the stored call without a send.
    for base in &bases {
        let r = native(base, "summarize-b", "h39-b-0-0")
            .send()
            .await
            .unwrap();
        let view: Value = r.json().await.unwrap();
        assert_eq!(view["replayed"], true, "{view}");
    }
    assert_eq!(mock.request_count_for("h39-b-0-0"), 1);

    // Which consumer member a forwards.
    let sent_before = cluster_counters(&http, &a_base, &operator).await[1];
    let r = native(&a_base, "summarize", "h39-probe")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let forwarded = cluster_counters(&http, &a_base, &operator).await[1] > sent_before;
    let foreign = if forwarded {
        "summarize"
    } else {
        "summarize-b"
    };
    let [_, sent_now, _, received_now] = cluster_counters(&http, &a_base, &operator).await;

    // A request that arrives forwarded is served where it arrives, never sent on again.
    let r = native(&a_base, foreign, "h39-marked")
        .header("tollgate-forwarded", "a-test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let after = cluster_counters(&http, &a_base, &operator).await;
    assert_eq!(
        after[1], sent_now,
        "a forwarded request is not forwarded again"
    );
    assert_eq!(after[3], received_now + 1);

    // The owner dies (SIGKILL): member a gets no answer from it and serves the calls itself,
    // each sent once.
    drop(b);
    for i in 0..3 {
        let key = format!("h39-after-kill-{i}");
        let r = native(&a_base, foreign, &key).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{key}");
        let view: Value = r.json().await.unwrap();
        assert_eq!(view["state"], "completed", "{view}");
        assert_eq!(mock.request_count_for(&key), 1, "{key} sent once");
    }
    let after = cluster_counters(&http, &a_base, &operator).await;
    assert_eq!(
        after[2], 1,
        "one forward found the owner gone; the rest were served here"
    );
    assert_eq!(after[1], sent_now);
    // Once the dead member's row expires, a counts itself alone.
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster_counters(&http, &a_base, &operator).await[0] != 1 {
        assert!(
            Instant::now() < deadline,
            "the dead member was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(a);
    mock.shutdown().await;
    drop(config);
    drop(db);
}
