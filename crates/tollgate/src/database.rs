//! The database of the command line: `DATABASE_URL`, connecting and migrating, `tollgate migrate`.

use crate::error::CommandError;
use crate::print;
use tollgate_postgres::PgStores;

/// Connections of a command-line pool.
const CLI_POOL_CONNECTIONS: u32 = 4;

/// The database URL from the environment.
pub fn database_url() -> Option<String> {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
}

/// Connects and migrates.
pub async fn connect_migrated(url: &str) -> Result<PgStores, CommandError> {
    let stores = PgStores::connect(url, CLI_POOL_CONNECTIONS)
        .await
        .map_err(CommandError::Connect)?;
    stores.migrate().await.map_err(CommandError::Migrate)?;
    Ok(stores)
}

/// `tollgate migrate`.
pub async fn migrate() -> Result<(), CommandError> {
    let url = database_url().ok_or(CommandError::NoDatabase(""))?;
    connect_migrated(&url).await?;
    print::json(&serde_json::json!({"migrated": true}));
    Ok(())
}
