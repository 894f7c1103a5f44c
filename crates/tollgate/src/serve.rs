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

/// `tollgate keys create --scope S --role R [--expires-in-days N | --expires-at T] [--json]`:
/// prints the key once.
pub async fn keys_create(
    scope: &str,
    role: &str,
    expires_in_days: Option<u32>,
    expires_at: Option<&str>,
    json: bool,
) -> Result<(), CommandError> {
    let env = std::env::vars().collect();
    let (key, record) = match expires_at {
        Some(text) => {
            let at = chrono::DateTime::parse_from_rfc3339(text)
                .map_err(|e| {
                    CommandError::InvalidArgument(format!(
                        "--expires-at must be an RFC 3339 time: {e}"
                    ))
                })?
                .with_timezone(&chrono::Utc);
            start::create_key_until(&env, scope, role, Some(at)).await?
        }
        None => start::create_key_expiring(&env, scope, role, expires_in_days).await?,
    };
    if json {
        print::json(&serde_json::json!({
            "key": key.expose(), "scope": scope, "role": role,
            "id": record.digest.to_hex(), "expires_at": record.expires_at
        }));
    } else {
        print::line(key.expose());
    }
    Ok(())
}

fn key_json(k: &tollgate_store::ApiKeyRecord) -> serde_json::Value {
    serde_json::json!({
        "id": k.digest.to_hex(), "scope": k.scope.as_str(), "role": k.role.as_str(),
        "created_at": k.created_at, "last_used_at": k.last_used_at,
        "expires_at": k.expires_at, "revoked": k.revoked_at.is_some(), "revoked_at": k.revoked_at
    })
}

fn or_dash<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// `tollgate keys list [--scope S] [--json]`: every stored key, never the key itself.
pub async fn keys_list(scope: Option<&str>, json: bool) -> Result<(), CommandError> {
    let env = std::env::vars().collect();
    let keys = start::list_keys(&env, scope).await?;
    if json {
        print::json(&serde_json::json!({"keys": keys.iter().map(key_json).collect::<Vec<_>>()}));
    } else {
        for k in &keys {
            print::line(&format!(
                "{} {} {} created={} last_used={} expires={} revoked={}",
                k.digest.to_hex(),
                k.scope,
                k.role.as_str(),
                k.created_at.to_rfc3339(),
                or_dash(k.last_used_at.map(|t| t.to_rfc3339())),
                or_dash(k.expires_at.map(|t| t.to_rfc3339())),
                or_dash(k.revoked_at.map(|t| t.to_rfc3339())),
            ));
        }
    }
    Ok(())
}

/// `tollgate keys revoke ID [--json]`: revokes a key (idempotent).
pub async fn keys_revoke(id: &str, json: bool) -> Result<(), CommandError> {
    let env = std::env::vars().collect();
    let key = start::revoke_key(&env, id).await?;
    if json {
        print::json(&key_json(&key));
    } else {
        print::line(&format!("revoked {}", key.digest.to_hex()));
    }
    Ok(())
}
