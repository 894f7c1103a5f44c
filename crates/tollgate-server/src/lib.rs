//! The tollgate HTTP service (spec/service.md): call profiles, API-key auth with scopes
//! and roles, the calls / roots / operator API, health, readiness and metrics, and the
//! scheduler.
//!
//! The binary is a thin shell over [`start::serve`], [`start::scheduler`] and
//! [`start::create_key`]. Tests build an [`App`] and serve it with [`run`] on a port-0 listener.
#![warn(missing_docs)]

pub mod app;
pub mod auth;
pub mod backend;
pub mod config;
pub mod embedded;
pub mod error;
pub mod handlers;
pub mod layers;
pub mod limits;
pub mod metrics;
pub mod openapi;
pub mod profiles;
pub mod routes;
pub mod scheduler;
pub mod schemas;
pub mod secret;
pub mod sections;
pub mod service;
pub mod start;

pub use app::{App, StartError};
pub use backend::Backend;
pub use error::ApiError;

use axum::serve::ListenerExt;
use std::future::Future;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `shutdown` completes, then lets requests in flight finish.
/// Accepted sockets get `TCP_NODELAY` (spec/service.md — Observability: without it every
/// keep-alive answer waits for the peer's delayed ACK between its header and body writes).
///
/// # Errors
/// The server failed.
pub async fn run(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = listener.tap_io(|tcp| {
        // A socket that refuses the option still works, only slower.
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, routes::router(app))
        .with_graceful_shutdown(shutdown)
        .await
}
