//! Clocks. Runners take the time from a [`Clock`] so tests can move it (lease expiry, retention).

use chrono::{DateTime, Duration, Utc};
use std::sync::Mutex;

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current UTC time; tests move a [`ManualClock`] instead of sleeping.
    fn now(&self) -> DateTime<Utc>;
}

/// The wall clock (`Utc::now`); the default in `RunnerSettings::new`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told.
#[derive(Debug)]
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self(Mutex::new(start))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance_ms(&self, ms: i64) {
        if let Ok(mut t) = self.0.lock() {
            *t += Duration::milliseconds(ms);
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        self.0.lock().map(|t| *t).unwrap_or_else(|_| Utc::now())
    }
}
