//! The connections of a call's own statements (spec/performance.md, H-27): the claim's read of
//! its key, the claim and the settlement of a call outside a root, and the read of a call's view.
//!
//! Each of those is one statement outside an explicit transaction. A connection of the sqlx pool
//! sends a `Sync` and waits for `ReadyForQuery` every time it goes back to the pool (its guard
//! against a connection left mid-transaction or mid-answer), so through the pool each of them
//! cost two round trips. A lane connection goes back to its idle list as it is:
//!
//! - it never holds a transaction (only single statements in autocommit run on it);
//! - a connection whose statement's future was dropped before the statement ended (a deadline, a
//!   caller that left) is closed, never handed to the next statement;
//! - a connection whose statement failed in a way that ends it (i/o, protocol, a terminated
//!   backend, a server shutting down: `crate::error::ends_connection`) is closed, not kept; one
//!   idle for [`PING_AFTER_IDLE_MS`](crate::PING_AFTER_IDLE_MS) or more is pinged before
//!   use and replaced when it does not answer (as the pool does, H-23).
//!
//! The lane's connections count against the stores' `max_connections`: the stores split it
//! between the pool and the lane ([`split`]).

use crate::error::{ends_connection, DbResultExt};
use crate::hosts::Target;
use crate::PING_AFTER_IDLE_MS;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tollgate_store::{StoreError, StoreResult};

/// The smallest `max_connections` that gets a lane; below it every statement takes the pool.
pub(crate) const LANE_MIN_CONNECTIONS: u32 = 4;

/// `max_connections` split into the pool's share and the lane's: half each (the pool keeps the
/// odd one), and no lane below [`LANE_MIN_CONNECTIONS`].
pub(crate) fn split(max_connections: u32) -> (u32, u32) {
    if max_connections < LANE_MIN_CONNECTIONS {
        return (max_connections, 0);
    }
    let lane = max_connections / 2;
    (max_connections - lane, lane)
}

/// A bounded set of connections for single statements outside a transaction.
pub(crate) struct Lane {
    /// Where new connections go (the host that accepts writes) and their session settings.
    target: Arc<Target>,
    /// Idle connections with the moment each went idle, the most recent last.
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    /// One permit per connection the lane may have open (idle or in use).
    permits: Arc<Semaphore>,
    /// How long a caller waits for a connection before the statement fails.
    acquire_timeout: Duration,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("available", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl Lane {
    /// A lane of at most `connections` connections to `target`; none is opened yet.
    pub(crate) fn new(target: Arc<Target>, connections: u32, acquire_timeout: Duration) -> Self {
        Self {
            target,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(
                usize::try_from(connections).unwrap_or(usize::MAX),
            )),
            acquire_timeout,
        }
    }

    /// A connection: an idle one (pinged first when it has been idle for
    /// [`PING_AFTER_IDLE_MS`]), else a new one.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when none is free within the acquire timeout or the database
    /// cannot be reached.
    pub(crate) async fn acquire(self: &Arc<Self>) -> StoreResult<LaneConnection> {
        let permit = tokio::time::timeout(
            self.acquire_timeout,
            Arc::clone(&self.permits).acquire_owned(),
        )
        .await
        .map_err(|_| StoreError::Unavailable("database lane timed out".into()))?
        .map_err(|_| StoreError::Unavailable("database lane closed".into()))?;
        self.connect_for(permit).await
    }

    /// A connection when one of the lane's is free now, else `None` (nothing waited for).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database cannot be reached.
    pub(crate) async fn try_acquire(self: &Arc<Self>) -> StoreResult<Option<LaneConnection>> {
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => self.connect_for(permit).await.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// An idle connection or a new one, under `permit`.
    async fn connect_for(
        self: &Arc<Self>,
        permit: OwnedSemaphorePermit,
    ) -> StoreResult<LaneConnection> {
        loop {
            let next = self.idle.lock().map_err(|_| poisoned())?.pop();
            let Some((mut conn, since)) = next else {
                break;
            };
            if since.elapsed() < Duration::from_millis(PING_AFTER_IDLE_MS)
                || matches!(
                    tokio::time::timeout(self.acquire_timeout, conn.ping()).await,
                    Ok(Ok(()))
                )
            {
                return Ok(self.hand_out(conn, permit));
            }
            // It no longer answers (or not within the acquire timeout): dropped, and the next
            // idle one (or a new one) is tried.
        }
        // A connect to a server that does not answer (a dropped route) ends at the acquire
        // timeout too, so no wait on the lane is unbounded (SC-206).
        let conn = tokio::time::timeout(self.acquire_timeout, self.target.connect())
            .await
            .map_err(|_| StoreError::Unavailable("database connect timed out".into()))??;
        Ok(self.hand_out(conn, permit))
    }

    /// Closes every idle connection.
    fn close_idle(&self) {
        let idle = match self.idle.lock() {
            Ok(mut idle) => std::mem::take(&mut *idle),
            Err(_) => return,
        };
        drop(idle);
    }

    /// Closes every idle connection and opens no more: a later acquire fails.
    #[cfg(feature = "test-support")]
    pub(crate) fn close(&self) {
        self.permits.close();
        self.close_idle();
    }

    fn hand_out(
        self: &Arc<Self>,
        conn: PgConnection,
        permit: OwnedSemaphorePermit,
    ) -> LaneConnection {
        LaneConnection {
            lane: Arc::clone(self),
            conn: Some(conn),
            broken: false,
            _permit: permit,
        }
    }
}

fn poisoned() -> StoreError {
    StoreError::Unavailable("database lane state lost".into())
}

/// A lane connection in use; it goes back to the lane's idle list when dropped, unless it
/// failed other than with a database error ([`LaneConnection::failed`]).
pub(crate) struct LaneConnection {
    lane: Arc<Lane>,
    conn: Option<PgConnection>,
    broken: bool,
    _permit: OwnedSemaphorePermit,
}

impl LaneConnection {
    /// Notes how the statement on this connection ended: an error that ends the connection
    /// ([`ends_connection`]: i/o, protocol, a terminated backend, a server shutting down) closes
    /// it instead of giving it back; an answer or any other error gives it back.
    ///
    /// A connection the database ended means the others may be ended too (a terminated set of
    /// backends, a restart, a failover): the idle ones are closed with it, so the statements
    /// after it, and a claim sent again at once, open fresh connections instead of finding
    /// the next dead one (SC-203).
    pub(crate) fn finished<T>(&mut self, result: &Result<T, sqlx::Error>) {
        self.broken = matches!(result, Err(e) if ends_connection(e));
        if self.broken {
            self.lane.close_idle();
        }
    }

    /// The connection for a statement (present from hand-out until drop). It counts as broken
    /// until [`LaneConnection::finished`] notes the statement's end, so a statement whose
    /// future is dropped mid-way (a deadline, a caller that left) closes its connection rather
    /// than handing the next user a connection with an answer of unknown length still to come.
    fn conn(&mut self) -> StoreResult<&mut PgConnection> {
        self.broken = true;
        self.conn.as_mut().ok_or_else(poisoned)
    }
}

impl Drop for LaneConnection {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.broken {
            return;
        }
        if let Ok(mut idle) = self.lane.idle.lock() {
            idle.push((conn, Instant::now()));
        }
    }
}

/// The connection of one of a call's own statements: from the lane when the stores have one,
/// else from the pool.
pub(crate) enum CallConnection {
    /// A lane connection.
    Lane(LaneConnection),
    /// A pooled connection (stores without a lane).
    Pool(PoolConnection<Postgres>),
}

impl CallConnection {
    /// A connection from `lane`, or from `pool` without one.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when none can be had.
    pub(crate) async fn acquire(lane: Option<&Arc<Lane>>, pool: &PgPool) -> StoreResult<Self> {
        match lane {
            Some(lane) => Ok(Self::Lane(lane.acquire().await?)),
            None => Ok(Self::Pool(pool.acquire().await.store_err()?)),
        }
    }

    /// The connection to run a statement on.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if a lane connection was already given back (never, while
    /// this value lives).
    pub(crate) fn conn(&mut self) -> StoreResult<&mut PgConnection> {
        match self {
            Self::Lane(conn) => conn.conn(),
            Self::Pool(conn) => Ok(conn),
        }
    }

    /// `result`, having noted how the statement ended ([`LaneConnection::finished`]).
    pub(crate) fn check<T>(&mut self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if let Self::Lane(conn) = self {
            conn.finished(&result);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h_27_the_lane_takes_half_of_four_or_more_connections() {
        assert_eq!(split(1), (1, 0));
        assert_eq!(split(3), (3, 0));
        assert_eq!(split(4), (2, 2));
        assert_eq!(split(5), (3, 2));
        assert_eq!(split(16), (8, 8));
    }
}
