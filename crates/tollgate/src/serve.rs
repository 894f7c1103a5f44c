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

/// `tollgate keys create --scope S --role R [--expires-in-days N | --expires-at T]
/// [--requests-per-minute N] [--input-tokens-per-minute N] [--output-tokens-per-minute N]
/// [--in-flight N] [--json]`:
/// prints the key once.
pub async fn keys_create(
    scope: &str,
    role: &str,
    (expires_in_days, expires_at): (Option<u32>, Option<&str>),
    limits: tollgate_core::limits::RateLimits,
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
            start::create_key_until(&env, scope, role, Some(at), limits).await?
        }
        None => start::create_key_expiring(&env, scope, role, expires_in_days, limits).await?,
    };
    if json {
        print::json(&serde_json::json!({
            "key": key.expose(), "scope": scope, "role": role,
            "id": record.digest.to_hex(), "expires_at": record.expires_at,
            "limits": record.limits
        }));
    } else {
        print::line(key.expose());
    }
    Ok(())
}

fn key_json(k: &tollgate_store::ApiKeyRecord) -> serde_json::Value {
    serde_json::to_value(tollgate_server::service::keys::KeySummary::from(k.clone()))
        .unwrap_or_default()
}

fn or_dash<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// `tollgate keys list [--scope S] [--config FILE] [--json]`: the configured keys (`[[keys]]`)
/// and the stored ones, never a key itself.
pub async fn keys_list(
    scope: Option<&str>,
    config: Option<PathBuf>,
    json: bool,
) -> Result<(), CommandError> {
    let keys = start::list_keys(&Options::from_process(config), scope).await?;
    if json {
        print::json(&serde_json::json!({ "keys": keys }));
    } else {
        for k in &keys {
            print::line(&format!(
                "{} {} {} source={} revocable={} created={} last_used={} expires={} revoked={}",
                k.id,
                k.scope,
                k.role,
                k.source,
                k.revocable,
                or_dash(k.created_at.map(|t| t.to_rfc3339())),
                or_dash(k.last_used_at.map(|t| t.to_rfc3339())),
                or_dash(k.expires_at.map(|t| t.to_rfc3339())),
                or_dash(k.revoked_at.map(|t| t.to_rfc3339())),
            ));
        }
    }
    Ok(())
}

/// `tollgate keys revoke ID [--config FILE] [--json]`: revokes a stored key (idempotent); a
/// configured key is refused.
pub async fn keys_revoke(
    id: &str,
    config: Option<PathBuf>,
    json: bool,
) -> Result<(), CommandError> {
    let key = start::revoke_key(&Options::from_process(config), id).await?;
    if json {
        print::json(&key_json(&key));
    } else {
        print::line(&format!("revoked {}", key.digest.to_hex()));
    }
    Ok(())
}
