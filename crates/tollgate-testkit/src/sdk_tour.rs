//! The official OpenAI SDKs as clients of the front door, for the
//! server's tests (`crates/tollgate-server/tests/openai.rs`) and the black-box tests
//! (`tests/service.rs`):
//! finding the interpreter with the SDK installed (a missing one fails the test, naming what to
//! install), and running the tour of `examples/openai_sdk.py` or `examples/openai_sdk.mjs` at the
//! SDKs' default retry settings.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// A file of the repository (this crate is `crates/tollgate-testkit`).
pub fn repo_path(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The python of the virtualenv `.ci/run` makes (`TOLLGATE_PYTHON`, else `target/pyenv`).
/// # Panics
/// When it is missing, naming how to install it.
pub fn sdk_python() -> PathBuf {
    let python = std::env::var_os("TOLLGATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_path("target/pyenv/bin/python"));
    assert!(
        python.exists(),
        "no python with the openai SDK at {}: run `python3 -m venv target/pyenv && \
         target/pyenv/bin/pip install -r examples/requirements.txt` (README — OpenAI SDK) \
         or set TOLLGATE_PYTHON",
        python.display()
    );
    python
}

/// `node` (`TOLLGATE_NODE`, else the one on `PATH`) with the pinned `openai` package installed
/// in `examples/node_modules` (`npm ci --prefix examples`, as `.ci/run` does).
/// # Panics
/// When it or the package is missing, naming how to install them.
pub fn sdk_node() -> PathBuf {
    let modules = repo_path("examples/node_modules/openai/package.json");
    assert!(
        modules.exists(),
        "the openai npm package is not installed at {}: run `npm ci --prefix examples` \
         (README — OpenAI SDK)",
        modules.display()
    );
    let node = std::env::var_os("TOLLGATE_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("node"));
    let found = std::process::Command::new(&node)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "no node at {}: install Node.js 20 or later (apt-get install nodejs) or set TOLLGATE_NODE",
        node.display()
    );
    node
}

/// The slow profile of a tour: its name and how long its provider waits before answering.
#[derive(Debug, Clone, Copy)]
pub struct Slow<'a> {
    /// A text profile whose model is `mock-slow-MS`.
    pub profile: &'a str,
    /// Its `MS`: the script's client times out well before it (SC-209).
    pub ms: u64,
}

/// The prompt of the tour's retried call: the caller checks the provider was sent it once.
pub const RETRIED_PROMPT: &str = "retried words";

/// Runs `program script` against the front door at `base` with `key` and checks the tour's
/// steps: call, replay (the same completion), the common fields, the SDK's own retries of a call
/// still being processed (a timeout, a 409 `in_progress`, then the stored completion), a reused
/// key with another body (422 `conflict`), stream, no key. The caller checks the provider
/// requests: one each for the call, the fields, the retried call ([`RETRIED_PROMPT`]) and the
/// stream.
///
/// # Panics
/// When the program fails or a step is not the tour's.
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub async fn run_tour(
    program: &Path,
    script: &str,
    base: &str,
    key: &str,
    slow: Slow<'_>,
) -> Vec<Value> {
    let output = tokio::process::Command::new(program)
        .arg(repo_path(script))
        .env("TOLLGATE_BASE_URL", base)
        .env("TOLLGATE_API_KEY", key)
        .env("TOLLGATE_SLOW_PROFILE", slow.profile)
        .env("TOLLGATE_SLOW_MS", slow.ms.to_string())
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{out}\n{err}");
    let steps: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = steps.iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["call", "replay", "fields", "retry", "conflict", "stream", "no_key"]
    );
    assert_eq!(steps[0]["id"], steps[1]["id"], "the replay is the call");
    // The first attempt timed out (no status), the retry met the call in progress, the last
    // one got the stored completion.
    let retry = &steps[3];
    assert_eq!(retry["attempts"], 3, "{retry}");
    assert_eq!(retry["statuses"], serde_json::json!([409, 200]), "{retry}");
    assert_eq!(steps[4]["code"], "conflict");
    steps
}
