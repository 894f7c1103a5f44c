//! Where the captured provider streams are, for the adapters' tests
//! (`crates/tollgate-provider/tests/adapters.rs`) and the binary's (`tests/cli.rs`).
//!
//! The captured streams are reference data kept outside the repository and never copied into
//! it: `TOLLGATE_CAPTURED_STREAMS` when set, else `../shared/fixtures/streams` beside the
//! repository root, else `/work/shared/fixtures/streams` (the project machine's shared folder).
//! A missing folder fails the suite, naming every place it looked, instead of skipping it
//! (SC-118).

use std::path::{Path, PathBuf};

/// The repository root (this crate is `crates/tollgate-testkit`).
pub static REPOSITORY_ROOT: std::sync::LazyLock<PathBuf> =
    std::sync::LazyLock::new(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."));

/// The folder of the captured streams; panics naming where it looked when there is none.
///
/// # Panics
/// When no candidate folder holds `EXPECTED.json`.
#[allow(clippy::panic)]
pub fn captured_streams() -> PathBuf {
    captured_streams_in(
        std::env::var_os("TOLLGATE_CAPTURED_STREAMS").map(PathBuf::from),
        &REPOSITORY_ROOT,
    )
    .unwrap_or_else(|message| panic!("{message}"))
}

/// [`captured_streams`] over an explicit variable and repository root.
///
/// # Errors
/// No candidate holds `EXPECTED.json`: the message names every place looked at.
pub fn captured_streams_in(from_env: Option<PathBuf>, root: &Path) -> Result<PathBuf, String> {
    let candidates = match from_env {
        // An explicit choice is never replaced by a default.
        Some(dir) => vec![dir],
        None => vec![
            root.join("../shared/fixtures/streams"),
            PathBuf::from("/work/shared/fixtures/streams"),
        ],
    };
    candidates
        .iter()
        .find(|dir| dir.join("EXPECTED.json").is_file())
        .cloned()
        .ok_or_else(|| {
            let looked: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
            format!(
                "the captured provider streams are missing (no EXPECTED.json in {}); set \
                 TOLLGATE_CAPTURED_STREAMS to the folder that holds them",
                looked.join(", ")
            )
        })
}
