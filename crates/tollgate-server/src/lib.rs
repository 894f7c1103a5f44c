//! The tollgate HTTP service (spec/service.md): call profiles, API-key auth with scopes
//! and roles, the calls / roots / operator API, health, readiness and metrics, and the
//! scheduler.
//!
//! The binary is a thin shell over [`start::serve`], [`start::scheduler`] and
//! [`start::create_key`]. Tests build an [`App`] and serve it with [`run`] on a port-0 listener.
#![warn(missing_docs)]

pub mod app;
pub mod audit_checks;
pub mod auth;
pub mod backend;
pub mod cluster;
pub mod config;
pub mod connections;
pub mod console;
pub mod embedded;
pub mod error;
pub mod gate;
pub mod handlers;
pub mod layers;
pub mod limits;
pub mod metrics;
pub mod openapi;
pub mod profiles;
pub mod routes;
pub mod scheduler;
pub mod schemas;
pub mod scrape;
pub mod secret;
pub mod sections;
pub mod service;
pub mod start;

pub use app::{App, StartError};
pub use backend::Backend;
pub use error::ApiError;

use std::future::Future;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

/// Serves `app` on `listener` within its connection bounds ([`connections`]) until `shutdown`
/// completes, then lets the answers in progress finish for at most `[server] http_drain_ms`,
/// then waits for the drives whose callers left (calls still settling in their own tasks) up to
/// the app's `shutdown_drain_ms` (spec/service.md — Shutdown).
///
/// # Errors
/// The server failed.
pub async fn run(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let drives = app.drives.clone();
    let drain_ms = app.shutdown_drain_ms;
    let connections = app.limits.connections;
    let served = connections::serve(listener, routes::router(app), connections, shutdown).await;
    drain(&drives, drain_ms).await;
    served
}

/// Closes `drives` and waits up to `drain_ms` for them; logs how many ran when the wait began and
/// how many were left (their calls stay open and recovery finishes them after their lease).
pub async fn drain(drives: &TaskTracker, drain_ms: u64) {
    drives.close();
    let running = drives.len();
    if running == 0 {
        return;
    }
    tracing::info!(running, drain_ms, "shutdown: waiting for background drives");
    let bound = std::time::Duration::from_millis(drain_ms);
    match tokio::time::timeout(bound, drives.wait()).await {
        Ok(()) => tracing::info!(running, left = 0, "shutdown: background drives finished"),
        Err(_) => tracing::warn!(
            running,
            left = drives.len(),
            "shutdown: drain bound reached; the calls left are finished by recovery"
        ),
    }
}
