//! The simulated wall clock. Paused tokio time moves by itself (a sleeping task advances it), so a
//! [`tollgate_runner::ManualClock`] moved by the driver would fall behind; this clock reads the
//! paused tokio instant instead and is therefore always in step with it. On top of that it keeps
//! the clock jumps the driver makes (the wall clock leaping ahead while timers do not, as after a
//! stalled process or a corrected host clock), and adds one nanosecond per reading, so that no two
//! readings are equal: leases and claim times never tie, and the stores' orderings by time never
//! fall back on random execution ids (which would make a run depend on more than its seed).

use chrono::{DateTime, Duration, Utc};
use std::sync::atomic::{AtomicI64, Ordering};
use tokio::time::Instant;
use tollgate_runner::Clock;

/// The simulated wall clock.
pub struct SimClock {
    start: Instant,
    base: DateTime<Utc>,
    jumped_ms: AtomicI64,
    readings: AtomicI64,
}

impl SimClock {
    /// A clock reading `base` now.
    pub fn new(base: DateTime<Utc>) -> Self {
        Self {
            start: Instant::now(),
            base,
            jumped_ms: AtomicI64::new(0),
            readings: AtomicI64::new(0),
        }
    }

    /// Moves the wall clock ahead by `ms` without moving timers.
    pub fn jump(&self, ms: i64) {
        self.jumped_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Simulated milliseconds since the start (timers only, no jumps).
    pub fn elapsed_ms(&self) -> u128 {
        (Instant::now() - self.start).as_millis()
    }
}

impl Clock for SimClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = Instant::now() - self.start;
        let elapsed = Duration::from_std(elapsed).unwrap_or(Duration::zero());
        let tick = self.readings.fetch_add(1, Ordering::SeqCst);
        self.base
            + elapsed
            + Duration::milliseconds(self.jumped_ms.load(Ordering::SeqCst))
            + Duration::nanoseconds(tick)
    }
}
