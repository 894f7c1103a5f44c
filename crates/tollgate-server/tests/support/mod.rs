//! The test harness: the app on a port-0 listener with a real mock provider, three keys (a
//! caller and an operator of scope `acme`, a caller of scope `globex`), and a reqwest client.
#![allow(dead_code)]

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::Scope;
use tollgate_mock_provider::MockProvider;
use tollgate_server::auth::KeyStore;
use tollgate_server::config::{Env, FileConfig};
use tollgate_server::metrics::Metrics;
use tollgate_server::{App, Backend};
use tollgate_store::KeyRole;

/// Looks like a credential; must never come back in an error body.
pub const SECRET: &str = "sk-live-TOPSECRET-4242";

/// The model of the `slow` profile: the mock waits this long before its headers.
pub const SLOW_MS: u64 = 1500;

fn config_text(mock_url: &str, server: &str) -> String {
    format!(
        r#"
{server}

[runner]
lease_ms = 1000

[[providers]]
name = "mock"
kind = "openai-chat"
base_url = "{mock_url}"

[[prices]]
version = "prices-t"
currency = "USD"
[prices.models."mock-echo"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"
[prices.models."mock-tool"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"
[prices.models."mock-slow-{SLOW_MS}"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"
[prices.models."mock-cut-before-usage"]
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
consumer = "team-a"
max_tokens = 64
max_input_chars = 200
max_output_chars = 2000
run_timeout_ms = 10000

[[profiles]]
name = "tight"
kind = "text"
provider = "mock"
model = "mock-echo"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-t"
max_tokens = 64
max_input_chars = 200
[profiles.caps]
session_block = "0.000001"

[[profiles]]
name = "slow"
kind = "text"
provider = "mock"
model = "mock-slow-{SLOW_MS}"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-a"
max_tokens = 64
max_input_chars = 200
run_timeout_ms = 10000

[[profiles]]
name = "cut"
kind = "text"
provider = "mock"
model = "mock-cut-before-usage"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-a"
max_tokens = 64
max_input_chars = 200
run_timeout_ms = 10000

[[profiles]]
name = "extract-tool"
kind = "structured"
provider = "mock"
model = "mock-tool"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-a"
max_tokens = 64
max_input_chars = 200
tool_choice = {{ type = "tool", name = "extract_record" }}
[[profiles.tools]]
name = "extract_record"
input_schema = {{ type = "object", required = ["city"], properties = {{ city = {{ type = "string" }} }} }}

[[profiles]]
name = "agent-step"
kind = "step"
provider = "mock"
model = "mock-tool"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-a"
max_tokens = 64
max_input_chars = 2000
[[profiles.tools]]
name = "extract_record"
input_schema = {{ type = "object", required = ["city"], properties = {{ city = {{ type = "string" }} }} }}
"#
    )
}

pub struct Server {
    pub base: String,
    pub mock: MockProvider,
    pub http: reqwest::Client,
    pub caller: String,
    pub operator: String,
    /// A caller of another scope.
    pub stranger: String,
    pub backend: Backend,
    pub keys: Arc<KeyStore>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<std::io::Result<()>>,
}

async fn key_for(keys: &KeyStore, scope: &str, role: KeyRole) -> String {
    let scope = Scope::parse(scope).unwrap();
    let key = keys.create(&scope, role).await.unwrap();
    key.expose().to_string()
}

impl Server {
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, "").await
    }

    /// Like [`Server::start`], with `extra` TOML (e.g. more profiles) after the base config;
    /// `{mock_url}` in `extra` is the mock provider's base URL.
    pub async fn start_with(backend: Backend, extra: &str) -> Self {
        let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
            .await
            .unwrap();
        let env = Env::new();
        let extra = extra.replace("{mock_url}", &mock.base_url());
        let text = format!("{}{extra}", config_text(&mock.base_url(), ""));
        let settings = FileConfig::from_toml(&text, &env)
            .unwrap()
            .validate(&env)
            .unwrap();
        let keys = Arc::new(
            KeyStore::new(&settings.keys, backend.stores()).with_cache_ms(settings.key_cache_ms),
        );
        let caller = key_for(&keys, "acme", KeyRole::Caller).await;
        let operator = key_for(&keys, "acme", KeyRole::Operator).await;
        let stranger = key_for(&keys, "globex", KeyRole::Caller).await;
        let metrics = Arc::new(Metrics::default());
        let app = App::build(&settings, backend.clone(), keys.clone(), metrics).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(tollgate_server::run(
            listener,
            app,
            shutdown.clone().cancelled_owned(),
        ));
        Self {
            base,
            mock,
            http: reqwest::Client::new(),
            caller,
            operator,
            stranger,
            backend,
            keys,
            shutdown,
            task,
        }
    }

    pub async fn memory() -> Self {
        Self::start(Backend::memory()).await
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, Value, String) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::Null);
        (status, value, text)
    }

    pub async fn post(&self, path: &str, key: &str, body: &Value) -> (StatusCode, Value, String) {
        self.send(
            reqwest::Method::POST,
            path,
            Some(key),
            Some(&body.to_string()),
        )
        .await
    }

    pub async fn get(&self, path: &str, key: &str) -> (StatusCode, Value, String) {
        self.send(reqwest::Method::GET, path, Some(key), None).await
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
        self.mock.shutdown().await;
    }
}

pub fn call(profile: &str, key: &str, revision: &str, text: &str) -> Value {
    json!({
        "profile": profile, "operation_key": key, "session_id": "s-1",
        "input_revision": revision, "intent": "summarize",
        "input": {"messages": [{"role": "user", "content": text}]}
    })
}

pub fn admin_url() -> String {
    std::env::var("TOLLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Reads `response`'s body until it holds `text`, or fails after five seconds.
pub async fn read_until(response: &mut reqwest::Response, seen: &mut String, text: &str) {
    let found = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while !seen.contains(text) {
            match response.chunk().await.unwrap() {
                Some(bytes) => seen.push_str(std::str::from_utf8(&bytes).unwrap()),
                None => return false,
            }
        }
        true
    })
    .await;
    assert!(
        matches!(found, Ok(true)),
        "{text:?} did not reach the client; it read {seen:?}"
    );
}
