//! The log of the built `tollgate serve` as tools read it (SC-214): with `RUST_LOG=info` and
//! stderr written to a file or a pipe, JSON lines carry a real call's request id, scope,
//! operation key and execution id and none of its content; text lines carry no colour codes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{fresh_database, run, stderr, tollgate, ServeChild, TempFile};
use tollgate_mock_provider::MockProvider;

/// A key configured in `[[keys]]` (scope `acme`, caller): only its SHA-256 is in the file.
const KEY: &str = "tg_configured_caller_key_of_the_log_tests";
/// The prompt of the call; the mock echoes it, so it is the output too. Neither may be logged.
const PROMPT: &str = "the lighthouse keeper counts 8841 gulls";

/// One text profile on the mock's echo model, one configured caller key; `log` is extra lines
/// at the top of the file.
fn config(mock_url: &str, log: &str) -> String {
    let sha = tollgate_store::KeyDigest::of_key(KEY).to_hex();
    format!(
        "{log}\n[server]\nlisten = \"127.0.0.1:0\"\n\n\
         [[providers]]\nname = \"mock\"\nkind = \"openai-chat\"\nbase_url = \"{mock_url}\"\n\n\
         [[prices]]\nversion = \"prices-logs\"\ncurrency = \"USD\"\n\
         [prices.models.\"mock-echo\"]\ninput = \"1.00\"\noutput = \"2.00\"\n\
         cache_read = \"0.10\"\ncache_write = \"1.25\"\nreasoning = \"2.00\"\n\n\
         [[profiles]]\nname = \"summarize\"\nkind = \"text\"\nprovider = \"mock\"\n\
         model = \"mock-echo\"\npolicy_version = \"policy-1\"\nprice_version = \"prices-logs\"\n\
         consumer = \"team-a\"\nmax_tokens = 64\nmax_input_chars = 2000\nrun_timeout_ms = 10000\n\n\
         [[keys]]\nscope = \"acme\"\nrole = \"caller\"\nsha256 = \"{sha}\"\n"
    )
}

/// Waits for the "listening on" line of `log()` and for `/readyz`; returns the base URL.
async fn ready(log: impl Fn() -> String) -> String {
    let http = reqwest::Client::new();
    for _ in 0..3000 {
        let text = log();
        if let Some(rest) = text.split("listening on ").nth(1) {
            let base = rest.split_whitespace().next().unwrap_or_default();
            let base = base.trim_end_matches(|c: char| !c.is_ascii_digit());
            let up = http.get(format!("{base}/readyz")).send().await;
            if up.is_ok_and(|r| r.status().is_success()) {
                return base.to_string();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("serve never became ready; its log:\n{}", log());
}

/// One call of the `summarize` profile: `(x-request-id, view)`.
async fn one_call(base: &str, operation_key: &str) -> (String, Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/calls"))
        .bearer_auth(KEY)
        .json(&json!({
            "profile": "summarize", "operation_key": operation_key, "session_id": "s-1",
            "input_revision": "r-1", "intent": "summarize",
            "input": {"messages": [{"role": "user", "content": PROMPT}]}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let request_id = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let view: Value = response.json().await.unwrap();
    assert_eq!(view["state"], "completed", "{view}");
    (request_id, view)
}

/// `tollgate serve` on `config` and `db_url` with `RUST_LOG=info`.
fn serve(config: &Path, db_url: &str) -> Command {
    let mut command = tollgate();
    command
        .arg("serve")
        .arg("--config")
        .arg(config)
        .env("DATABASE_URL", db_url)
        .env("RUST_LOG", "info")
        .env_remove("TOLLGATE_LOG_FORMAT")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// A line's event fields and the fields of its spans, in one map (inner spans win).
fn fields(line: &Map<String, Value>) -> Map<String, Value> {
    let mut all = Map::new();
    if let Some(Value::Array(spans)) = line.get("spans") {
        for span in spans.iter().filter_map(Value::as_object) {
            all.extend(span.clone());
        }
    }
    all.extend(line.iter().map(|(k, v)| (k.clone(), v.clone())));
    all
}

#[tokio::test(flavor = "multi_thread")]
async fn sc_214_json_logs_of_a_real_call_carry_its_ids_and_no_content() {
    let db = fresh_database().await;
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let config = TempFile::new(
        "logs-json.toml",
        &config(&mock.base_url(), "[log]\nformat = \"json\"\n"),
    );
    let log = TempFile::new("logs-json.log", "");
    let file = std::fs::File::create(&log.0).unwrap();
    let child = serve(&config.0, db.url()).stderr(file).spawn().unwrap();
    let serving = ServeChild(child);
    let read = || std::fs::read_to_string(&log.0).unwrap_or_default();
    let base = ready(read).await;

    let (request_id, view) = one_call(&base, "logs-json-1").await;
    let execution_id = view["execution_id"].as_str().unwrap().to_string();
    // Stop the server, so that every line it would write is in the file.
    drop(serving);
    mock.shutdown().await;
    let text = read();

    assert!(
        !text.contains(PROMPT),
        "the log holds the call's content:\n{text}"
    );
    assert!(
        !text.contains(KEY),
        "the log holds the caller's key:\n{text}"
    );
    assert!(
        !text.contains("\x1b["),
        "an escape sequence in the log:\n{text}"
    );
    let lines: Vec<Map<String, Value>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match serde_json::from_str(l) {
            Ok(Value::Object(line)) => line,
            _ => panic!("not a JSON object: {l:?}\nthe log:\n{text}"),
        })
        .collect();
    assert!(
        lines.iter().any(|l| l["message"]
            .as_str()
            .is_some_and(|m| m.contains("listening on"))),
        "the start-up notice is a JSON line too:\n{text}"
    );
    let of_the_call = lines.iter().map(fields).find(|f| {
        f.get("scope") == Some(&json!("acme"))
            && f.get("operation_key") == Some(&json!("logs-json-1"))
            && f.get("execution_id") == Some(&json!(execution_id))
            && f.get("request_id") == Some(&json!(request_id))
    });
    let line = of_the_call.unwrap_or_else(|| {
        panic!("no line of the call with its request id {request_id}, scope, operation key and execution id {execution_id}:\n{text}")
    });
    for field in ["timestamp", "level", "target", "message"] {
        assert!(line.contains_key(field), "{field} missing: {line:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sc_214_text_logs_in_a_pipe_have_no_escape_sequences() {
    let db = fresh_database().await;
    let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    // The environment wins over the file: these logs are text.
    let config = TempFile::new(
        "logs-text.toml",
        &config(&mock.base_url(), "[log]\nformat = \"json\"\n"),
    );
    let mut child = serve(&config.0, db.url())
        .env("TOLLGATE_LOG_FORMAT", "text")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pipe = child.stderr.take().unwrap();
    let serving = ServeChild(child);
    let captured = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let writer = captured.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            let mut all = writer.lock().unwrap();
            all.push_str(&line);
            all.push('\n');
        }
    });
    let read = || captured.lock().unwrap().clone();
    let base = ready(read).await;

    let (request_id, _) = one_call(&base, "logs-text-1").await;
    drop(serving);
    reader.join().unwrap();
    mock.shutdown().await;
    let text = read();

    assert!(
        text.contains("call finished") && text.contains(&request_id),
        "the call is logged with its request id:\n{text}"
    );
    assert!(
        !text.contains("\x1b["),
        "an escape sequence in the log:\n{text}"
    );
    assert!(
        !text.contains(PROMPT),
        "the log holds the call's content:\n{text}"
    );
    assert!(
        text.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_err()),
        "text logs, not JSON:\n{text}"
    );
}

#[test]
fn sc_214_an_unknown_log_format_is_a_configuration_error() {
    let config = TempFile::new("logs-bad.toml", "[log]\nformat = \"yaml\"\n");
    let out = run(tollgate().arg("serve").arg("--config").arg(&config.0));
    assert!(!out.status.success());
    let message = stderr(&out);
    assert!(
        message.contains("log.format") && message.contains("yaml"),
        "{message}"
    );
    let out = run(tollgate()
        .arg("serve")
        .arg("--config")
        .arg(&config.0)
        .env("TOLLGATE_LOG_FORMAT", "xml"));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("TOLLGATE_LOG_FORMAT"),
        "{}",
        stderr(&out)
    );
}
