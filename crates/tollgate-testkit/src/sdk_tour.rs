//! The official OpenAI SDKs as clients of the front door, for the
//! server's tests (`crates/tollgate-server/tests/openai.rs`) and the black-box tests
//! (`tests/service.rs`):
//! finding the interpreter with the SDK installed (a missing one fails the test, naming what to
//! install), and running the tour of `examples/openai_sdk.py` or `examples/openai_sdk.mjs`.

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

/// Runs `program script` against the front door at `base` with `key` and checks the tour's
/// steps: call, replay (the same completion), conflict (409 `conflict`), stream, no key. The
/// caller checks the provider requests (one for the call, one for the stream).
///
/// # Panics
/// When the program fails or a step is not the tour's.
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub async fn run_tour(program: &Path, script: &str, base: &str, key: &str) -> Vec<Value> {
    let output = tokio::process::Command::new(program)
        .arg(repo_path(script))
        .env("TOLLGATE_BASE_URL", base)
        .env("TOLLGATE_API_KEY", key)
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
    assert_eq!(names, ["call", "replay", "conflict", "stream", "no_key"]);
    assert_eq!(steps[0]["id"], steps[1]["id"], "the replay is the call");
    assert_eq!(steps[2]["code"], "conflict");
    steps
}
