//! What a runner is built from: its settings, the lazy input loader, the host's JSON validator
//! and the metadata-only report of failures in background work. Shared by every runner.

use crate::clock::{Clock, SystemClock};
use futures::future::BoxFuture;
use std::sync::Arc;
use tokio_util::task::TaskTracker;
use tollgate_core::config::CallConfig;
use tollgate_core::limits::RateLimits;
use tollgate_core::message::Message;

/// A failure reported by background work, as metadata only (SC-60).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackgroundFailure {
    /// The call's key.
    pub operation_key: String,
    /// What failed (`evidence`, `settle`, `reconcile`).
    pub stage: &'static str,
    /// The error, without content.
    pub error: String,
}

/// The host's `backgroundError` callback.
pub type BackgroundErrorFn = Arc<dyn Fn(BackgroundFailure) + Send + Sync>;

/// Default fence lease of a claimed execution: a few seconds, renewed every third of it while
/// the call lives, so that a dead process's calls are taken over (and their holds released)
/// within the lease and a scheduler pass (SC-205).
pub const LEASE_MS_DEFAULT: u64 = 3_000;

/// Default longest time a finished call's last write (its settlement, its reconciliation mark,
/// the evidence written alone) is retried while the store is unavailable (SC-202).
pub const SETTLE_RETRY_MS_DEFAULT: u64 = 60_000;

/// The host's synchronous JSON validator (SC-4).
pub type JsonValidator = Arc<dyn Fn(&serde_json::Value) -> bool + Send + Sync>;

/// Loads input lazily, after the claim (SC-11, SC-12).
pub type InputLoader = BoxFuture<'static, Result<Vec<Message>, String>>;

/// Everything a runner is built from.
pub struct RunnerSettings {
    /// The immutable config snapshot.
    pub config: CallConfig,
    /// Fence lease.
    pub lease_ms: u64,
    /// Longest time a finished call's last write is retried while the store is unavailable
    /// (`crate::retry`); the retries also end when the fence is lost.
    pub settle_retry_ms: u64,
    /// Host validator for JSON output (json calls).
    pub validate: Option<JsonValidator>,
    /// Metadata-only failures of background work.
    pub background_error: Option<BackgroundErrorFn>,
    /// Where claims, leases, accounting days and retention read the time; a `ManualClock` in tests.
    pub clock: Arc<dyn Clock>,
    /// Where the drives are spawned (each call's send, collect and settle runs in its own task,
    /// which outlives a caller that stops waiting): a host that shuts down closes it and waits
    /// for the drives still running (spec/service.md — Shutdown).
    pub drives: TaskTracker,
    /// The profile consumer's rate and concurrency limits (`[profiles.limits]`, SC-220); empty:
    /// none.
    pub limits: RateLimits,
}

impl RunnerSettings {
    /// Settings with defaults for everything but the config.
    pub fn new(config: CallConfig) -> Self {
        Self {
            config,
            lease_ms: LEASE_MS_DEFAULT,
            settle_retry_ms: SETTLE_RETRY_MS_DEFAULT,
            validate: None,
            background_error: None,
            clock: Arc::new(SystemClock),
            drives: TaskTracker::new(),
            limits: RateLimits::default(),
        }
    }
}
