//! Commands other than the demo.

use crate::out;
use std::net::SocketAddr;
use std::path::Path;
use tollgate_mock_provider as mock;
use tollgate_postgres::PgStores;
use tollgate_provider::parse::parse_stream as parse;
use tollgate_provider::Protocol;

/// Connections of a command-line pool.
const CLI_POOL_CONNECTIONS: u32 = 4;

/// The database URL from the environment.
pub fn database_url() -> Option<String> {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
}

/// Connects and migrates.
pub async fn connect_migrated(url: &str) -> Result<PgStores, String> {
    let stores = PgStores::connect(url, CLI_POOL_CONNECTIONS)
        .await
        .map_err(|e| format!("cannot connect to the database: {e}"))?;
    stores
        .migrate()
        .await
        .map_err(|e| format!("migration failed: {e}"))?;
    Ok(stores)
}

/// `tollgate migrate`.
pub async fn migrate() -> Result<(), String> {
    let url = database_url().ok_or("DATABASE_URL is not set")?;
    connect_migrated(&url).await?;
    out::json(&serde_json::json!({"migrated": true}));
    Ok(())
}

/// `tollgate mock-provider --listen ADDR`.
pub async fn mock_provider(listen: SocketAddr) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::warn!(%addr, "mock provider listening");
    out::json(&serde_json::json!({"listening": addr.to_string()}));
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    mock::serve(listener, shutdown)
        .await
        .map_err(|e| format!("mock provider failed: {e}"))
}

/// `tollgate parse-stream --protocol P FILE`.
pub fn parse_stream(protocol: &str, file: &Path) -> Result<(), String> {
    let protocol: Protocol = protocol.parse()?;
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let limits = tollgate_core::collector::CollectorLimits {
        max_output_chars: tollgate_core::config::CHARS_MAX,
        max_reasoning_chars: tollgate_core::collector::MAX_REASONING_CHARS_CEILING,
        max_consecutive_reasoning: None,
    };
    out::json(&parse(protocol, &bytes, limits));
    Ok(())
}
