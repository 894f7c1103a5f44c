//! The hosts of a database URL, the one of them that accepts writes, and the settings every
//! connection gets once it is open (spec/storage.md — A standby that takes over, A pooler in
//! front).
//!
//! `postgres://user@db-1:5432,db-2:5432/tollgate` names several hosts, tried in order with
//! libpq's meaning of `target_session_attrs=read-write`: the stores connect only to the first
//! host that accepts writes. With more than one host a watcher asks the host in use every
//! [`PRIMARY_PROBE_MS`] whether it still accepts writes; when it does not answer, or answers as a
//! standby, the watcher tries the hosts again in order, and every connection opened from then on
//! (the pool's, the lane's) goes to the host it found. Connections still open to the old host fail
//! on their next statement and are closed, so a promoted standby takes the load without a
//! restart of tollgate. A URL of one host is used as it is: no watcher, no read-write check.

use crate::error::DbResultExt;
use crate::SessionTimeouts;
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::{Connection, Executor, PgConnection, Row};
use std::str::FromStr;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;
use tollgate_store::{StoreError, StoreResult};

/// How often the watcher asks the host in use whether it still accepts writes (several hosts
/// only): a failover is seen within this long plus [`HOST_CONNECT_TIMEOUT_MS`].
pub const PRIMARY_PROBE_MS: u64 = 500;

/// How long the connect (and the read-write question) to one host may take before the next
/// host is tried.
pub const HOST_CONNECT_TIMEOUT_MS: u64 = 2_000;

/// One host of the URL: `host:port` (for messages and logs; never the user or the password) and
/// the options of a connection to it alone.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    pub(crate) name: String,
    pub(crate) options: PgConnectOptions,
}

/// The hosts of `url`, in order, with `target_session_attrs` taken out (a list of hosts always
/// means read-write; `read-write` and `primary` may be written, any other value is refused).
///
/// # Errors
/// [`StoreError::Unavailable`] naming what is wrong; the message never holds the URL.
pub(crate) fn parse(url: &str) -> StoreResult<Vec<Host>> {
    let invalid = |what: &str| StoreError::Unavailable(format!("the database URL {what}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid("has no scheme (postgres://…)"))?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, query),
        None => (tail, ""),
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", "read-write" | "primary")) => {}
            Some(("target_session_attrs", value)) => {
                return Err(invalid(&format!(
                    "asks for target_session_attrs={value}: tollgate writes, so it connects only \
                     to a host that accepts writes (read-write)"
                )))
            }
            _ => kept.push(pair),
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    hosts
        .split(',')
        .map(|host| {
            if host.is_empty() && hosts.contains(',') {
                return Err(invalid("names an empty host in its list"));
            }
            let single = format!("{scheme}://{user}{host}{path}{query}");
            let options = PgConnectOptions::from_str(&single)
                .map_err(|_| invalid(&format!("is not valid at host {host:?}")))?;
            let name = format!("{}:{}", options.get_host(), options.get_port());
            Ok(Host { name, options })
        })
        .collect()
}

/// Opens one connection with `options` within [`HOST_CONNECT_TIMEOUT_MS`] and gives it the
/// session settings of `timeouts`.
///
/// # Errors
/// [`StoreError::Unavailable`] when the host does not answer in time or refuses; a pooler that
/// refuses one of the startup parameters gets a message naming it and the setting that lets it
/// through.
pub(crate) async fn open(
    options: &PgConnectOptions,
    timeouts: SessionTimeouts,
) -> StoreResult<PgConnection> {
    let timeout = Duration::from_millis(HOST_CONNECT_TIMEOUT_MS);
    let mut conn = tokio::time::timeout(timeout, PgConnection::connect_with(options))
        .await
        .map_err(|_| {
            StoreError::Unavailable(format!("no connection within {HOST_CONNECT_TIMEOUT_MS} ms"))
        })?
        .map_err(refused_startup)?;
    timeouts.prepare(&mut conn).await.store_err()?;
    Ok(conn)
}

/// A pooler's refusal of a startup parameter named, with the setting to change; any other
/// connect error as every store error.
fn refused_startup(error: sqlx::Error) -> StoreError {
    const REFUSED: &str = "unsupported startup parameter: ";
    if let sqlx::Error::Database(e) = &error {
        if let Some(parameter) = e.message().strip_prefix(REFUSED) {
            return StoreError::Unavailable(format!(
                "the database (a pooler in front of it) refuses the startup parameter \
                 {parameter:?}, which the Postgres driver always sends: add it to the pooler's \
                 ignore_startup_parameters (pgbouncer.ini)"
            ));
        }
    }
    crate::error::db(error)
}

/// The one row `sql` answers on `conn`, asked in the simple protocol and given up after
/// [`HOST_CONNECT_TIMEOUT_MS`]: a host that took the connection and then stopped answering (a
/// dropped route, a failover under way) cannot hold a connect or the watcher.
async fn ask(conn: &mut PgConnection, sql: &'static str) -> StoreResult<PgRow> {
    tokio::time::timeout(
        Duration::from_millis(HOST_CONNECT_TIMEOUT_MS),
        conn.fetch_one(sql),
    )
    .await
    .map_err(|_| StoreError::Unavailable(format!("no answer within {HOST_CONNECT_TIMEOUT_MS} ms")))?
    .store_err()
}

/// Closes `conn`, waiting at most 100 ms for the server to take its goodbye.
pub(crate) async fn close_quickly(conn: PgConnection) {
    let _ = tokio::time::timeout(Duration::from_millis(100), conn.close()).await;
}

/// Whether the server on `conn` accepts writes: neither in recovery (a standby) nor read-only
/// by default.
pub(crate) async fn accepts_writes(conn: &mut PgConnection) -> StoreResult<bool> {
    let row = ask(
        conn,
        "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')",
    )
    .await?;
    let in_recovery: bool = row.try_get(0).store_err()?;
    let read_only: String = row.try_get(1).store_err()?;
    Ok(!in_recovery && read_only == "off")
}

/// The server process of `conn` (`pg_backend_pid()`), asked in the simple protocol.
async fn backend_pid(conn: &mut PgConnection) -> StoreResult<i32> {
    ask(conn, "SELECT pg_backend_pid()")
        .await?
        .try_get(0)
        .store_err()
}

/// Whether two open connections share one server session, as a pooler that pools per
/// transaction or per statement makes them (pgbouncer's `pool_mode = transaction` or
/// `statement`). `first` stays open while a second connection asks for its server process: with
/// a connection of its own (no pooler, or pgbouncer's `pool_mode = session`) the two differ; a
/// pooler per transaction hands the second connection the server the first one just released
/// (pgbouncer's default `server_round_robin = 0` reuses the last released server first).
///
/// # Errors
/// [`StoreError::Unavailable`] when a connection or a question fails.
pub(crate) async fn sessions_shared(
    first: &mut PgConnection,
    target: &Target,
) -> StoreResult<bool> {
    let first_pid = backend_pid(first).await?;
    let mut second = target.connect().await?;
    let second_pid = backend_pid(&mut second).await;
    close_quickly(second).await;
    Ok(second_pid? == first_pid)
}

/// What to change when [`sessions_shared`] says yes.
pub const SHARED_SESSIONS: &str = "two open connections share one server session: the database \
     is behind a pooler that pools per transaction or per statement (pgbouncer pool_mode = \
     transaction or statement); tollgate keeps prepared statements and session settings on each \
     connection, so set pool_mode = session for its database";

/// Refuses connections that share server sessions ([`sessions_shared`]): tollgate keeps
/// prepared statements and its session settings on each connection, which such a pooler hands
/// to other clients between transactions.
///
/// # Errors
/// [`StoreError::Unavailable`] naming the setting to change ([`SHARED_SESSIONS`]).
pub(crate) async fn refuse_shared_sessions(
    first: &mut PgConnection,
    target: &Target,
) -> StoreResult<()> {
    if sessions_shared(first, target).await? {
        return Err(StoreError::Unavailable(SHARED_SESSIONS.into()));
    }
    Ok(())
}

/// The hosts of the stores and the one new connections go to.
#[derive(Debug)]
pub(crate) struct Target {
    hosts: Vec<Host>,
    current: RwLock<usize>,
    timeouts: SessionTimeouts,
}

impl Target {
    /// The hosts of `url`; the first is in use until [`Target::find_writable`] says otherwise.
    ///
    /// # Errors
    /// As [`parse`].
    pub(crate) fn new(url: &str, timeouts: SessionTimeouts) -> StoreResult<Self> {
        Ok(Self {
            hosts: parse(url)?,
            current: RwLock::new(0),
            timeouts,
        })
    }

    /// One host, `options`.
    #[cfg(feature = "test-support")]
    pub(crate) fn from_options(options: PgConnectOptions, timeouts: SessionTimeouts) -> Self {
        let name = format!("{}:{}", options.get_host(), options.get_port());
        Self {
            hosts: vec![Host { name, options }],
            current: RwLock::new(0),
            timeouts,
        }
    }

    fn current(&self) -> usize {
        *self.current.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The options of a connection to the host in use.
    pub(crate) fn options(&self) -> PgConnectOptions {
        self.hosts[self.current()].options.clone()
    }

    /// A new connection to the host in use, with the session settings.
    ///
    /// # Errors
    /// As [`open`].
    pub(crate) async fn connect(&self) -> StoreResult<PgConnection> {
        open(&self.options(), self.timeouts).await
    }

    /// The first host, in order, that accepts writes (with one host: that host, unasked), made
    /// the one in use; answers a connection to it.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when no host accepts writes, naming what each answered.
    pub(crate) async fn find_writable(&self) -> StoreResult<PgConnection> {
        if self.hosts.len() == 1 {
            return open(&self.hosts[0].options, self.timeouts).await;
        }
        let mut answers = Vec::new();
        for (n, host) in self.hosts.iter().enumerate() {
            let answer = match open(&host.options, self.timeouts).await {
                Ok(mut conn) => match accepts_writes(&mut conn).await {
                    Ok(true) => {
                        *self.current.write().unwrap_or_else(PoisonError::into_inner) = n;
                        return Ok(conn);
                    }
                    Ok(false) => "a standby or read-only".to_string(),
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            answers.push(format!("{}: {answer}", host.name));
        }
        Err(StoreError::Unavailable(format!(
            "no host of the database URL accepts writes ({})",
            answers.join("; ")
        )))
    }

    /// With more than one host, starts the watcher that keeps `pool` (and, through
    /// [`Target::options`], the lane) on the host that accepts writes. It ends when the pool is
    /// closed or the stores are gone.
    pub(crate) fn watch(self: &Arc<Self>, pool: PgPool) {
        if self.hosts.len() > 1 {
            tokio::spawn(watch(Arc::downgrade(self), pool));
        }
    }
}

/// The watcher of [`Target::watch`].
async fn watch(target: Weak<Target>, pool: PgPool) {
    let mut probe: Option<PgConnection> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(PRIMARY_PROBE_MS)).await;
        let Some(target) = target.upgrade() else {
            return;
        };
        if pool.is_closed() {
            return;
        }
        let asked = match probe.as_mut() {
            Some(conn) => accepts_writes(conn).await,
            None => match target.connect().await {
                Ok(mut conn) => {
                    let answer = accepts_writes(&mut conn).await;
                    probe = Some(conn);
                    answer
                }
                Err(e) => Err(e),
            },
        };
        if matches!(asked, Ok(true)) {
            continue;
        }
        if let Some(conn) = probe.take() {
            close_quickly(conn).await;
        }
        let before = target.current();
        match target.find_writable().await {
            Ok(conn) => {
                probe = Some(conn);
                let now = target.current();
                if now != before {
                    pool.set_connect_options(target.options());
                    tracing::warn!(
                        from = %target.hosts[before].name,
                        to = %target.hosts[now].name,
                        "the database host that accepts writes changed; new connections go to it"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "no database host accepts writes yet"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sc_216_a_list_of_hosts_is_one_url_per_host_in_order() {
        let hosts = parse(
            "postgres://app:secret@db-1:5433,db-2,10.0.0.3:6000/tollgate?sslmode=disable&\
             target_session_attrs=read-write",
        )
        .unwrap();
        let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["db-1:5433", "db-2:5432", "10.0.0.3:6000"]);
        for host in &hosts {
            assert_eq!(host.options.get_username(), "app");
            assert_eq!(host.options.get_database(), Some("tollgate"));
        }
        let one = parse("postgres://postgres@127.0.0.1:5432/t").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].name, "127.0.0.1:5432");
        assert_eq!(
            parse("postgres://u@a,b/t?target_session_attrs=primary")
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn sc_216_a_url_asking_for_a_standby_or_naming_an_empty_host_is_refused_without_its_secret() {
        for url in [
            "postgres://u:hunter2@a,b/t?target_session_attrs=read-only",
            "postgres://u:hunter2@a,b/t?target_session_attrs=any",
            "postgres://u:hunter2@a,,b/t",
            "u:hunter2@a/t",
        ] {
            let error = parse(url).unwrap_err().to_string();
            assert!(!error.contains("hunter2"), "{error}");
            assert!(error.contains("database URL"), "{error}");
        }
    }
}
