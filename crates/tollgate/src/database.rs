//! The database of the command line: `DATABASE_URL`, connecting and migrating, `tollgate migrate`.

use crate::error::CommandError;
use crate::print;
use tollgate_postgres::PgStores;

/// Connections of a command-line pool.
const CLI_POOL_CONNECTIONS: u32 = 4;

/// The database URL from the environment.
pub fn database_url() -> Option<String> {
    env_url("DATABASE_URL")
}

/// The owner role's URL for `tollgate migrate`: `DATABASE_OWNER_URL`, else `DATABASE_URL`
/// (spec/storage.md — Database roles).
pub fn owner_url() -> Option<String> {
    env_url("DATABASE_OWNER_URL").or_else(database_url)
}

fn env_url(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|u| !u.trim().is_empty())
}

async fn connect(url: &str) -> Result<PgStores, CommandError> {
    PgStores::connect(url, CLI_POOL_CONNECTIONS)
        .await
        .map_err(CommandError::Connect)
}

/// Connects and applies pending migrations, if any (with none pending nothing changes, so the
/// URL may name an application role that cannot change the schema).
pub async fn connect_migrated(url: &str) -> Result<PgStores, CommandError> {
    let stores = connect(url).await?;
    stores
        .migrate_if_pending()
        .await
        .map_err(CommandError::Migrate)?;
    Ok(stores)
}

/// `tollgate migrate`, as the owner role ([`owner_url`]).
pub async fn migrate() -> Result<(), CommandError> {
    let url = owner_url().ok_or(CommandError::NoDatabase(""))?;
    connect(&url)
        .await?
        .migrate()
        .await
        .map_err(CommandError::Migrate)?;
    print::json(&serde_json::json!({"migrated": true}));
    Ok(())
}
