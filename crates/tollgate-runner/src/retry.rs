//! The retries of a finished call's last writes (SC-202, spec/journal.md — Fences): its
//! settlement, its reconciliation mark and the evidence written alone. A call that was sent and
//! answered holds output and usage that exist only in this process until one of those writes
//! commits, so a store that is briefly unavailable (a restart, a terminated connection, a
//! failover) must not lose them. The writes are fenced, so retrying them is safe: a write whose
//! fence is no longer current changes nothing; and a settlement that did commit while its answer
//! was lost is recognised by its own fence when the retry is refused.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_store::{StoreError, StoreResult};

/// The first pause between two attempts; each later pause doubles, up to [`RETRY_PAUSE_MS_MAX`].
pub const RETRY_PAUSE_MS_FIRST: u64 = 50;
/// The longest pause between two attempts.
pub const RETRY_PAUSE_MS_MAX: u64 = 1_000;

/// How one call's last writes are retried: for at most `window`, and not after `lost` (the
/// heartbeat's signal that the fence is gone: a recoverer took it, or the execution finished).
#[derive(Debug, Clone)]
pub(crate) struct Retry {
    window: Duration,
    lost: CancellationToken,
}

/// A retried write's last result, and whether an attempt before it failed as
/// [`StoreError::Unavailable`] (so that attempt may have committed without its answer).
pub(crate) struct Retried<T> {
    pub result: StoreResult<T>,
    pub after_unavailable: bool,
}

impl Retry {
    /// Retries for at most `window_ms`, and not after `lost` is cancelled.
    pub(crate) fn new(window_ms: u64, lost: CancellationToken) -> Self {
        Self {
            window: Duration::from_millis(window_ms),
            lost,
        }
    }

    /// Runs `write` until it answers anything but [`StoreError::Unavailable`], or the window
    /// ends, or the fence is lost; pauses between attempts with backoff. Every other error is an
    /// answer (a stale fence, a uniqueness rule, a corrupt row): trying again would not change it.
    pub(crate) async fn run<T, F, Fut>(&self, mut write: F) -> Retried<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let end = Instant::now() + self.window;
        let mut pause_ms = RETRY_PAUSE_MS_FIRST;
        let mut after_unavailable = false;
        loop {
            let result = write().await;
            let now = Instant::now();
            match result {
                Err(StoreError::Unavailable(_)) if now < end && !self.lost.is_cancelled() => {
                    after_unavailable = true;
                    let pause = Duration::from_millis(pause_ms).min(end - now);
                    tokio::select! {
                        biased;
                        _ = tokio::time::sleep(pause) => {}
                        // One more attempt at once: it answers `StaleFence` if the fence is gone.
                        _ = self.lost.cancelled() => {}
                    }
                    pause_ms = (pause_ms * 2).min(RETRY_PAUSE_MS_MAX);
                }
                result => {
                    return Retried {
                        result,
                        after_unavailable,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn unavailable() -> StoreError {
        StoreError::Unavailable("down".into())
    }

    #[tokio::test(start_paused = true)]
    async fn sc_202_an_unavailable_store_is_retried_until_it_answers() {
        let attempts = AtomicU32::new(0);
        let retried = Retry::new(10_000, CancellationToken::new())
            .run(|| async {
                if attempts.fetch_add(1, Ordering::SeqCst) < 3 {
                    Err(unavailable())
                } else {
                    Ok(7)
                }
            })
            .await;
        assert_eq!(retried.result.unwrap(), 7);
        assert!(retried.after_unavailable);
        assert_eq!(attempts.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn sc_202_other_errors_are_answers_and_the_window_ends_the_retries() {
        let attempts = AtomicU32::new(0);
        let stale = Retry::new(10_000, CancellationToken::new())
            .run(|| async {
                attempts.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(StoreError::NotFound("x".into()))
            })
            .await;
        assert!(matches!(stale.result, Err(StoreError::NotFound(_))));
        assert!(!stale.after_unavailable);
        assert_eq!(attempts.load(Ordering::SeqCst), 1);

        let started = Instant::now();
        let down = Retry::new(3_000, CancellationToken::new())
            .run(|| async { Err::<(), _>(unavailable()) })
            .await;
        assert!(matches!(down.result, Err(StoreError::Unavailable(_))));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(3_000), "{waited:?}");
        assert!(
            waited < Duration::from_millis(3_000 + RETRY_PAUSE_MS_MAX),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sc_202_a_lost_fence_ends_the_retries() {
        let lost = CancellationToken::new();
        lost.cancel();
        let attempts = AtomicU32::new(0);
        let retried = Retry::new(60_000, lost)
            .run(|| async {
                attempts.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(unavailable())
            })
            .await;
        assert!(matches!(retried.result, Err(StoreError::Unavailable(_))));
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
    }
}
