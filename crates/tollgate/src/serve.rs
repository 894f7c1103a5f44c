//! `serve`, `scheduler` and `keys create`: thin shells over `tollgate_server::start`.

use crate::error::CommandError;
use crate::print;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;
use tollgate_server::start::{self, Options};

/// A token cancelled on Ctrl-C or SIGTERM.
fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::warn!("shutting down");
        trigger.cancel();
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}

/// `tollgate serve [--config FILE]`.
pub async fn serve(config: Option<PathBuf>) -> Result<(), CommandError> {
    start::serve(Options::from_process(config), shutdown_on_signal())
        .await
        .map_err(CommandError::from)
}

/// `tollgate scheduler [--config FILE]`.
pub async fn scheduler(config: Option<PathBuf>) -> Result<(), CommandError> {
    start::scheduler(Options::from_process(config), shutdown_on_signal())
        .await
        .map_err(CommandError::from)
}

/// `tollgate keys create --scope S --role R [--json]`: prints the key once.
pub async fn keys_create(scope: &str, role: &str, json: bool) -> Result<(), CommandError> {
    let env = std::env::vars().collect();
    let key = start::create_key(&env, scope, role).await?;
    if json {
        print::json(&serde_json::json!({"key": key.expose(), "scope": scope, "role": role}));
    } else {
        print::line(key.expose());
    }
    Ok(())
}
