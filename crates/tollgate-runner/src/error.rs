//! Runner errors. None carries message content or secrets.

use tollgate_core::caps::CapBlocked;
use tollgate_core::ids::OperationKey;
use tollgate_core::limits::LimitRefused;
use tollgate_store::StoreError;

/// Why a run stopped waiting without a final answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interruption {
    /// The run timeout expired.
    Timeout,
    /// The caller's signal fired.
    Aborted,
    /// The call's deadline passed.
    Deadline,
}

/// A runner error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The runner's configuration is invalid (construction only).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The request is invalid; nothing was written.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Same key, different binding (SC-14); nothing was written.
    #[error("operation key {operation_key} is bound differently: {}", fields.join(", "))]
    Conflict {
        /// The key.
        operation_key: OperationKey,
        /// Names of the differing fields.
        fields: Vec<String>,
    },
    /// A block cap refused the call before dispatch (SC-16); nothing was written.
    #[error("cap blocked: {0}")]
    CapBlocked(CapBlocked),
    /// A rate or concurrency limit refused the call before dispatch (SC-220..SC-223); nothing
    /// was written.
    #[error("rate limited: {} {} limit of {}", .0.subject.kind(), .0.kind, .0.limit)]
    RateLimited(LimitRefused),
    /// A persistence step failed (SC-17). Read or recover `operation_key` later; the provider is
    /// never retried.
    #[error("store failure on {operation_key}: {source}")]
    Store {
        /// The key to read back.
        operation_key: OperationKey,
        /// The store error.
        #[source]
        source: StoreError,
    },
    /// The root refuses new admissions: closed by its owner (ST-33).
    #[error("root {0} is closed")]
    RootClosed(String),
    /// The root refuses new admissions: its deadline passed.
    #[error("root {0} is expired")]
    RootExpired(String),
    /// No such root in this scope.
    #[error("root {0} not found")]
    RootNotFound(String),
    /// The run stopped waiting; a dispatched call keeps draining in the background (SC-60).
    #[error("interrupted ({cause:?}) on {operation_key}")]
    Interrupted {
        /// The key to read back.
        operation_key: OperationKey,
        /// Why.
        cause: Interruption,
    },
}

impl RunError {
    pub(crate) fn store(key: &OperationKey, source: StoreError) -> Self {
        Self::Store {
            operation_key: key.clone(),
            source,
        }
    }

    /// True only for the runner's own interruption — its timeout, its deadline, or its caller's
    /// signal — never for a store failure, even one caused by an abort (ST-35, spec: call-retry).
    pub fn is_interruption(&self) -> bool {
        matches!(self, Self::Interrupted { .. })
    }
}
