//! The lease heartbeat of a live call (SC-100, spec/journal.md, Fences): from the claim until
//! the call's last journal write, the runner renews the execution's lease every
//! `lease_ms / LEASE_RENEWALS_PER_LEASE`, so a recoverer can take the fence only once the
//! process that holds it has stopped renewing (it died, or its store is gone for longer than
//! two renewals).

use crate::clock::Clock;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::{CancellationToken, DropGuard};
use tollgate_core::ids::OperationKey;
use tollgate_store::{ExecutionStore, Fence, StoreError, Stores};

/// Renewals per lease: the runner renews every `lease_ms / LEASE_RENEWALS_PER_LEASE`, so two
/// renewals in a row may fail (or be slow) before the lease can end under a live call.
pub const LEASE_RENEWALS_PER_LEASE: u64 = 3;

/// The time between two renewals of a `lease_ms` lease (at least 1 ms).
pub fn renew_every_ms(lease_ms: u64) -> u64 {
    (lease_ms / LEASE_RENEWALS_PER_LEASE).max(1)
}

/// How long one renewal attempt of a `lease_ms` lease may take before it is given up: three
/// quarters of the renewal period (at least 1 ms), so that a renewal stuck on a dead connection
/// never delays the next one (SC-205).
pub fn renewal_deadline_ms(lease_ms: u64) -> u64 {
    (renew_every_ms(lease_ms) * 3 / 4).max(1)
}

/// Renews one execution's lease while it lives; dropping it stops the renewals at once (the
/// task ends at its next await, also in the middle of a renewal). Held by the call from its
/// claim, then moved into the drive task, so a drive that outlives its caller (SC-60) keeps its
/// lease until its own last write.
pub(crate) struct Heartbeat {
    _stop: DropGuard,
    lost: CancellationToken,
}

impl Heartbeat {
    /// Starts renewing `fence`'s lease for `lease_ms` at every `renew_every_ms(lease_ms)`.
    ///
    /// A renewal that reports `StaleFence` (a recoverer took the fence, or the execution is
    /// finished) or `NotFound` ends the renewals: the call's later fenced writes fail and change
    /// nothing, while its usage evidence still goes to the inbox (unfenced), where recovery and
    /// usage reconciliation find it. Other failures (a store that is briefly unavailable) are
    /// retried at the next tick.
    pub fn start(
        stores: Arc<dyn Stores>,
        clock: Arc<dyn Clock>,
        fence: Fence,
        lease_ms: u64,
        key: OperationKey,
    ) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let lost = CancellationToken::new();
        let lose = lost.clone();
        let every = Duration::from_millis(renew_every_ms(lease_ms));
        tokio::spawn(async move {
            tokio::select! {
                biased;
                _ = stopped.cancelled() => {}
                _ = renew(stores.as_ref(), clock.as_ref(), fence, lease_ms, every, &key) => {
                    lose.cancel();
                }
            }
        });
        Self {
            _stop: stop.drop_guard(),
            lost,
        }
    }

    /// Cancelled once a renewal has found the fence gone (`StaleFence`, `NotFound`): the call's
    /// later fenced writes cannot succeed, so their retries stop (`crate::retry`).
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }
}

async fn renew(
    stores: &dyn Stores,
    clock: &dyn Clock,
    fence: Fence,
    lease_ms: u64,
    every: Duration,
    key: &OperationKey,
) {
    let deadline = Duration::from_millis(renewal_deadline_ms(lease_ms));
    // Renewals start on a fixed schedule: one that fails or is given up at its deadline does
    // not push the next one back.
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let renewal = ExecutionStore::renew_lease(stores, fence, lease_ms, clock.now());
        let Ok(renewed) = tokio::time::timeout(deadline, renewal).await else {
            tracing::warn!(
                operation_key = %key,
                execution_id = %fence.execution_id,
                "lease renewal given up at its deadline; retrying"
            );
            continue;
        };
        match renewed {
            Ok(_) => {}
            Err(e @ (StoreError::StaleFence(_) | StoreError::NotFound(_))) => {
                // Ids only: never content.
                tracing::warn!(
                    operation_key = %key,
                    execution_id = %fence.execution_id,
                    fence = fence.token.0,
                    error = %e,
                    "lease lost: the call's fenced writes will fail; its evidence goes to the inbox"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(
                    operation_key = %key,
                    execution_id = %fence.execution_id,
                    error = %e,
                    "lease renewal failed; retrying"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_fall_three_times_per_lease() {
        assert_eq!(renew_every_ms(30_000), 10_000);
        assert_eq!(renew_every_ms(300), 100);
        assert_eq!(renew_every_ms(1), 1);
    }

    #[test]
    fn sc_205_a_renewal_is_given_up_before_the_next_is_due() {
        assert_eq!(renewal_deadline_ms(3_000), 750);
        assert!(renewal_deadline_ms(300) < renew_every_ms(300));
        assert_eq!(renewal_deadline_ms(1), 1);
    }
}
