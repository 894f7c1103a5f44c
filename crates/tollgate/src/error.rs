//! Why a command failed. Every variant prints as the one-line reason on stderr; none carries
//! content or secrets. Every failure exits with status 1.

use tollgate_core::ids::{OperationKey, Scope};
use tollgate_runner::RunError;
use tollgate_store::StoreError;

/// A command's failure.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// An argument is not valid (an identifier, a format, a protocol).
    #[error("{0}")]
    InvalidArgument(String),
    /// The command needs `DATABASE_URL`.
    #[error("DATABASE_URL is not set{0}")]
    NoDatabase(&'static str),
    /// The database could not be reached.
    #[error("cannot connect to the database: {0}")]
    Connect(StoreError),
    /// The migrations could not be applied.
    #[error("migration failed: {0}")]
    Migrate(StoreError),
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A runner refused or failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// No execution under the key.
    #[error("no execution {key} in scope {scope}")]
    NoExecution {
        /// The scope asked for.
        scope: Scope,
        /// The key asked for.
        key: OperationKey,
    },
    /// A check found a violation (the audit chain is broken).
    #[error("{0}")]
    CheckFailed(String),
    /// A file or socket could not be used.
    #[error("cannot {action}: {source}")]
    Io {
        /// What was attempted, e.g. `read FILE` or `listen on ADDR`.
        action: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The server, the scheduler or key creation could not start or failed.
    #[error("{0}")]
    Server(#[from] tollgate_server::StartError),
    /// A value could not be encoded as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The demo could not go on.
    #[cfg(feature = "demo")]
    #[error("{0}")]
    Demo(String),
}

impl From<tollgate_core::ids::IdError> for CommandError {
    fn from(error: tollgate_core::ids::IdError) -> Self {
        Self::InvalidArgument(error.to_string())
    }
}
