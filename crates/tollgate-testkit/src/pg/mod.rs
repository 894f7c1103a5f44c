//! Fresh Postgres databases for tests: a brand-new, migrated database per test, for every suite
//! that runs against Postgres, and the test SQL that reads and damages one behind the stores'
//! back. The product's own statements stay in `tollgate-postgres`; this module reaches inside it
//! only through its `test_support` seam.
//!
//! Databases are named `tollgate_t_<unix seconds>_<uuid>`. A background thread drops the
//! databases this process created once their pool is gone (the test that used it has ended), and
//! the first call in a process drops such databases older than ten minutes (left by earlier
//! runs), so repeated runs do not fill the disk. Each database gets a small pool
//! ([`TEST_POOL_CONNECTIONS`]) that keeps no idle connection for long, so suites that create one
//! database per test stay far below the server's `max_connections` even when tests run in
//! parallel.

pub mod cluster;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::OnceCell;
use tollgate_postgres::test_support as seam;
use tollgate_postgres::PgStores;
use tollgate_store::StoreError;

/// `.store_err()` on a sqlx result: the error mapped as the stores map theirs.
pub(crate) trait DbResultExt<T> {
    /// Maps the error to a [`StoreError`].
    fn store_err(self) -> Result<T, StoreError>;
}

impl<T> DbResultExt<T> for Result<T, sqlx::Error> {
    fn store_err(self) -> Result<T, StoreError> {
        self.map_err(seam::store_error)
    }
}

/// Connections of each test database's pool.
pub const TEST_POOL_CONNECTIONS: u32 = 4;

/// Test databases older than this are dropped by the next process that creates one.
const STALE_TEST_DATABASE_SECS: u64 = 600;

/// The prefix of every test database's name.
const PREFIX: &str = "tollgate_t_";

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn options(admin_url: &str) -> Result<PgConnectOptions, StoreError> {
    Ok(PgConnectOptions::from_str(admin_url)
        .store_err()?
        .disable_statement_logging())
}

async fn admin(admin_url: &str) -> Result<PgConnection, StoreError> {
    PgConnection::connect_with(&options(admin_url)?)
        .await
        .store_err()
}

/// Drops test databases left over from runs more than ten minutes ago (once per process; failures,
/// e.g. a database still in use, are ignored).
async fn drop_stale_databases(admin_url: &str) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let Ok(mut admin) = admin(admin_url).await else {
            return;
        };
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT datname FROM pg_database WHERE datname LIKE 'tollgate\\_t\\_%'",
        )
        .fetch_all(&mut admin)
        .await
        .unwrap_or_default();
        // The login roles of `app_role_url`, named after their database (roles are cluster-wide).
        let roles: Vec<String> = sqlx::query_scalar(
            "SELECT rolname::text FROM pg_roles WHERE rolname LIKE 'tollgate\\_t\\_%'",
        )
        .fetch_all(&mut admin)
        .await
        .unwrap_or_default();
        let databases = names.into_iter().map(|n| ("DATABASE", " WITH (FORCE)", n));
        let roles = roles.into_iter().map(|n| ("ROLE", "", n));
        for (kind, with, name) in databases.chain(roles) {
            let created = name
                .strip_prefix(PREFIX)
                .and_then(|rest| rest.split('_').next())
                .and_then(|secs| secs.parse::<u64>().ok());
            let stale = created.is_some_and(|c| c + STALE_TEST_DATABASE_SECS < now_secs());
            let ours = name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if stale && ours {
                // An identifier, not a value: it cannot be bound. The name was read from the
                // catalog and consists of our own pattern's characters only.
                let sql = format!("DROP {kind} IF EXISTS \"{name}\"{with}");
                let _ = sqlx::raw_sql(&sql).execute(&mut admin).await;
            }
        }
        let _ = admin.close().await;
    })
    .await;
}

/// A database this process created, and whether its pool still exists.
struct Created {
    admin_url: String,
    name: String,
    /// Upgradable while the pool exists (its options hold the strong reference).
    pool_alive: Weak<()>,
}

/// The databases this process created and has not dropped yet.
static CREATED: Mutex<Vec<Created>> = Mutex::new(Vec::new());

/// How often the dropper looks for finished databases.
const DROPPER_PERIOD: Duration = Duration::from_millis(250);

/// Takes this process's databases whose pool is gone (their test has ended) off the list.
fn take_finished() -> Vec<Created> {
    let mut created = CREATED.lock().unwrap_or_else(PoisonError::into_inner);
    let (done, live): (Vec<Created>, Vec<Created>) = created
        .drain(..)
        .partition(|c| c.pool_alive.strong_count() == 0);
    *created = live;
    done
}

/// Drops finished databases, off the tests' path: a thread of its own (each test has its own
/// runtime, which ends with the test) with one admin connection per server. Failures are
/// ignored; the age-based cleanup of a later run catches what is left, including the databases
/// of the last tests when the process exits.
fn start_dropper() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("tollgate-test-db-dropper".into())
            .spawn(|| {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                let mut connections: Vec<(String, PgConnection)> = Vec::new();
                loop {
                    std::thread::sleep(DROPPER_PERIOD);
                    for done in take_finished() {
                        runtime.block_on(drop_database(&mut connections, done));
                    }
                }
            });
        // Without the thread, databases are left to the age-based cleanup.
        drop(spawned);
    });
}

async fn drop_database(connections: &mut Vec<(String, PgConnection)>, done: Created) {
    let index = match connections
        .iter()
        .position(|(url, _)| *url == done.admin_url)
    {
        Some(index) => index,
        None => {
            let Ok(connection) = admin(&done.admin_url).await else {
                return;
            };
            connections.push((done.admin_url.clone(), connection));
            connections.len() - 1
        }
    };
    let Some((_, connection)) = connections.get_mut(index) else {
        return;
    };
    // An identifier we generated (digits, hex and underscores): it cannot be bound.
    let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", done.name);
    if sqlx::raw_sql(&sql).execute(&mut *connection).await.is_err() {
        // Perhaps a broken connection: open a new one next time.
        connections.swap_remove(index);
        return;
    }
    // The database's login role, if `app_role_url` made one (same characters plus `_app`).
    let sql = format!("DROP ROLE IF EXISTS \"{}{APP_ROLE_SUFFIX}\"", done.name);
    let _ = sqlx::raw_sql(&sql).execute(&mut *connection).await;
}

/// The suffix of the login role [`TestDatabase::app_role_url`] makes, after the database's name.
const APP_ROLE_SUFFIX: &str = "_app";

/// A statement the application role must not be able to run (SC-115), for
/// [`TestDatabase::refusal_as`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tamper {
    /// `UPDATE` an audit row.
    UpdateAuditRow,
    /// `DELETE` an audit row.
    DeleteAuditRow,
    /// `TRUNCATE audit_log`.
    TruncateAudit,
    /// `ALTER TABLE audit_log DISABLE TRIGGER USER`.
    DisableAuditTriggers,
    /// `CREATE TABLE` (any DDL).
    CreateTable,
    /// `DROP TABLE audit_log`.
    DropAudit,
}

impl Tamper {
    /// Every tampering statement.
    pub const ALL: [Tamper; 6] = [
        Tamper::UpdateAuditRow,
        Tamper::DeleteAuditRow,
        Tamper::TruncateAudit,
        Tamper::DisableAuditTriggers,
        Tamper::CreateTable,
        Tamper::DropAudit,
    ];

    fn sql(self) -> &'static str {
        match self {
            Tamper::UpdateAuditRow => "UPDATE audit_log SET kind = kind",
            Tamper::DeleteAuditRow => "DELETE FROM audit_log",
            Tamper::TruncateAudit => "TRUNCATE audit_log",
            Tamper::DisableAuditTriggers => "ALTER TABLE audit_log DISABLE TRIGGER USER",
            Tamper::CreateTable => "CREATE TABLE tamper (id int)",
            Tamper::DropAudit => "DROP TABLE audit_log",
        }
    }
}

/// The admin URL of the test database server: `TOLLGATE_TEST_DATABASE_URL`, by default
/// `postgres://postgres@127.0.0.1:5432/postgres` (a user that may create databases).
pub fn test_admin_url() -> String {
    std::env::var("TOLLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A brand-new, empty database of one test. It is dropped (off the test's path) once this
/// value and every pool opened through [`TestDatabase::stores`] are gone.
#[derive(Debug)]
pub struct TestDatabase {
    admin_url: String,
    name: String,
    url: String,
    /// The strong reference the dropper watches; pools hold clones.
    alive: Arc<()>,
}

impl TestDatabase {
    /// Creates the database (not migrated) on the server of `admin_url`.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the server cannot be reached or refuses the database.
    pub async fn create(admin_url: &str) -> Result<Self, StoreError> {
        drop_stale_databases(admin_url).await;
        let name = format!("{PREFIX}{}_{}", now_secs(), uuid::Uuid::new_v4().simple());
        start_dropper();
        let mut admin = admin(admin_url).await?;
        // An identifier we generated (digits, hex and underscores): it cannot be bound.
        sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .store_err()?;
        admin.close().await.store_err()?;
        let alive = Arc::new(());
        CREATED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Created {
                admin_url: admin_url.to_string(),
                name: name.clone(),
                pool_alive: Arc::downgrade(&alive),
            });
        let url = options(admin_url)?
            .database(&name)
            .to_url_lossy()
            .to_string();
        Ok(Self {
            admin_url: admin_url.to_string(),
            name,
            url,
            alive,
        })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A URL to the database (e.g. for `DATABASE_URL` of a child process).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stores over a new pool of at most `max_connections` to this database, keeping no idle
    /// connection for long. Nothing is migrated. Leases use the database's clock, as in
    /// production.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database cannot be reached.
    pub async fn stores(&self, max_connections: u32) -> Result<PgStores, StoreError> {
        // The pool's options keep `alive` until the pool itself is dropped.
        let alive = Arc::clone(&self.alive);
        let (pool_connections, lane_connections) = seam::split_connections(max_connections);
        let options = options(&self.admin_url)?.database(&self.name);
        let pool = seam::pool_options()
            .max_connections(pool_connections)
            .min_connections(0)
            .idle_timeout(Duration::from_secs(5))
            .acquire_timeout(Duration::from_secs(60))
            .after_connect(move |_, _| {
                let _alive = &alive;
                Box::pin(async { Ok(()) })
            })
            .connect_with(options.clone())
            .await
            .store_err()?;
        Ok(seam::with_lane(
            PgStores::new(pool),
            options,
            lane_connections,
        ))
    }
}

/// Creates a brand-new database on the server of `admin_url` (a URL whose user may create
/// databases), applies the migrations, and returns stores over a small pool
/// ([`TEST_POOL_CONNECTIONS`]) to it. Their leases follow the caller's `now`
/// ([`PgStores::with_caller_lease_clock`]), so suites can move a manual clock past leases; use
/// [`TestDatabase::stores`] for the production rule (the database's clock).
///
/// # Errors
/// [`StoreError::Unavailable`] when the server cannot be reached, the database cannot be
/// created, or a migration fails.
pub async fn fresh_test_database(admin_url: &str) -> Result<PgStores, StoreError> {
    let database = TestDatabase::create(admin_url).await?;
    let stores = database.stores(TEST_POOL_CONNECTIONS).await?;
    stores.migrate().await?;
    Ok(stores.with_caller_lease_clock())
}

/// Like [`fresh_test_database`], with two stores over the one database that share nothing but
/// it (each its own pool, lane, batch queues and known keys), as two processes have: for
/// suites whose second process must not inherit what the first one left in memory.
///
/// # Errors
/// As [`fresh_test_database`].
pub async fn fresh_test_database_pair(admin_url: &str) -> Result<(PgStores, PgStores), StoreError> {
    let database = TestDatabase::create(admin_url).await?;
    let first = database.stores(TEST_POOL_CONNECTIONS).await?;
    first.migrate().await?;
    let second = database.stores(TEST_POOL_CONNECTIONS).await?;
    Ok((
        first.with_caller_lease_clock(),
        second.with_caller_lease_clock(),
    ))
}

/// What black-box tests read from, and break in, a test database: each query is here, so no test
/// writes SQL of its own. The damaging ones bypass the stores on purpose, as an attacker or a
/// broken tool with the table owner's rights would.
impl TestDatabase {
    pub(crate) async fn connection(&self) -> Result<PgConnection, StoreError> {
        PgConnection::connect_with(&options(&self.url)?)
            .await
            .store_err()
    }

    /// How many migrations succeeded.
    ///
    /// # Errors
    /// The database cannot be read.
    pub async fn applied_migrations(&self) -> Result<i64, StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
            .fetch_one(&mut conn)
            .await
            .store_err()
    }

    /// The relation `name` (`schema.table`) as Postgres names it, if it exists.
    ///
    /// # Errors
    /// The database cannot be read.
    pub async fn relation(&self, name: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query_scalar("SELECT to_regclass($1::text)::text")
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .store_err()
    }

    /// The SQL type of `schema.table.column`.
    ///
    /// # Errors
    /// No such column; the database cannot be read.
    pub async fn column_type(
        &self,
        schema: &str,
        table: &str,
        column: &str,
    ) -> Result<String, StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query_scalar(
            "SELECT data_type::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2 AND column_name = $3",
        )
        .bind(schema)
        .bind(table)
        .bind(column)
        .fetch_one(&mut conn)
        .await
        .store_err()
    }

    /// `(execution_id, amount, source)` of every row of the finance view, as text.
    ///
    /// # Errors
    /// The database cannot be read.
    pub async fn finance_rows(&self) -> Result<Vec<(String, String, String)>, StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query_as("SELECT execution_id::text, amount::text, source FROM finance.settlements")
            .fetch_all(&mut conn)
            .await
            .store_err()
    }

    /// The sum of `consumer`'s settlements in the finance view and its session spend row's
    /// `settled`, as exact decimal text.
    ///
    /// # Errors
    /// The database cannot be read.
    pub async fn settled_and_session_spend(
        &self,
        consumer: &str,
    ) -> Result<(String, String), StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query_as(
            "SELECT (SELECT sum(amount) FROM finance.settlements WHERE consumer = $1)::text, \
             (SELECT settled FROM spend_sessions WHERE consumer = $1)::text",
        )
        .bind(consumer)
        .fetch_one(&mut conn)
        .await
        .store_err()
    }

    /// Damage: adds `delta` (a decimal, may be negative) to `consumer`'s session spend.
    ///
    /// # Errors
    /// The database cannot be written.
    pub async fn shift_session_spend(&self, consumer: &str, delta: &str) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query(
            "UPDATE spend_sessions SET settled = settled + $2::numeric WHERE consumer = $1",
        )
        .bind(consumer)
        .bind(delta)
        .execute(&mut conn)
        .await
        .store_err()?;
        Ok(())
    }

    /// Damage: adds `delta` to the first settlement's amount; returns its execution id.
    ///
    /// # Errors
    /// No settlement; the database cannot be written.
    pub async fn shift_first_settlement(&self, delta: &str) -> Result<String, StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query_scalar(
            "UPDATE cost_settlements SET amount = amount + $1::numeric \
             WHERE seq = (SELECT min(seq) FROM cost_settlements) RETURNING execution_id::text",
        )
        .bind(delta)
        .fetch_one(&mut conn)
        .await
        .store_err()
    }

    /// A URL to this database as a new login role that is a member of `tollgate_app` and nothing
    /// else (created by the migrations; roles are cluster-wide, so the role is named after the
    /// database and dropped with it). The database must be migrated.
    ///
    /// # Errors
    /// The role cannot be created (e.g. migrations not applied).
    pub async fn app_role_url(&self) -> Result<String, StoreError> {
        let role = format!("{}{APP_ROLE_SUFFIX}", self.name);
        let mut admin = admin(&self.admin_url).await?;
        // Identifiers we generated (digits, hex and underscores): they cannot be bound.
        sqlx::raw_sql(&format!(
            "CREATE ROLE \"{role}\" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE; \
             GRANT tollgate_app TO \"{role}\";"
        ))
        .execute(&mut admin)
        .await
        .store_err()?;
        admin.close().await.store_err()?;
        Ok(options(&self.url)?
            .username(&role)
            .to_url_lossy()
            .to_string())
    }

    /// Runs `tamper` in its own transaction (rolled back) over `url` (e.g. [`Self::app_role_url`])
    /// and returns the SQLSTATE that refused it, or `None` when it ran.
    ///
    /// # Errors
    /// The database cannot be reached as that role.
    pub async fn refusal_as(
        &self,
        url: &str,
        tamper: Tamper,
    ) -> Result<Option<String>, StoreError> {
        let mut conn = PgConnection::connect_with(&options(url)?)
            .await
            .store_err()?;
        let mut tx = conn.begin().await.store_err()?;
        let refused = match sqlx::raw_sql(tamper.sql()).execute(&mut *tx).await {
            Ok(_) => None,
            Err(e) => Some(
                e.as_database_error()
                    .and_then(|d| d.code())
                    .map_or_else(|| "none".to_string(), |c| c.into_owned()),
            ),
        };
        tx.rollback().await.store_err()?;
        Ok(refused)
    }

    /// Damage: removes the last audit row of `scope` (the latest chain tail appended)
    /// with the append-only triggers disabled, as the tables' owner could.
    ///
    /// # Errors
    /// The database cannot be written.
    /// Returns the chain and seq of the row removed.
    pub async fn delete_last_audit_row(&self, scope: &str) -> Result<(u16, i64), StoreError> {
        let mut tx = self.connection().await?;
        let mut tx = tx.begin().await.store_err()?;
        sqlx::query("ALTER TABLE audit_log DISABLE TRIGGER USER")
            .execute(&mut *tx)
            .await
            .store_err()?;
        let (chain, seq): (i16, i64) = sqlx::query_as(
            "DELETE FROM audit_log WHERE (scope, chain, seq) = \
             (SELECT l.scope, l.chain, l.seq FROM audit_log l JOIN audit_heads h \
              ON h.scope = l.scope AND h.chain = l.chain AND h.last_seq = l.seq \
              WHERE l.scope = $1 ORDER BY l.at DESC, l.chain DESC LIMIT 1) \
             RETURNING chain, seq",
        )
        .bind(scope)
        .fetch_one(&mut *tx)
        .await
        .store_err()?;
        sqlx::query("ALTER TABLE audit_log ENABLE TRIGGER USER")
            .execute(&mut *tx)
            .await
            .store_err()?;
        tx.commit().await.store_err()?;
        let chain = u16::try_from(chain).map_err(|_| StoreError::Corrupt("audit chain".into()))?;
        Ok((chain, seq))
    }

    /// Holds a lock on `executions` that every write of the table waits for (`SHARE` mode,
    /// which plain reads pass), until the returned block is dropped.
    ///
    /// # Errors
    /// The database cannot be reached.
    pub async fn block_execution_writes(&self) -> Result<ExecutionWritesBlocked, StoreError> {
        let mut conn = self.connection().await?;
        sqlx::raw_sql("BEGIN; LOCK TABLE executions IN SHARE MODE")
            .execute(&mut conn)
            .await
            .store_err()?;
        Ok(ExecutionWritesBlocked { _conn: conn })
    }
}

impl TestDatabase {
    /// Terminates every backend connected to this database, as an operator's
    /// `pg_terminate_backend` or a failover ends them (each gets `FATAL 57P01`), and waits until
    /// the server lists none. Answers how many were terminated.
    ///
    /// # Errors
    /// The server cannot be reached, or the backends are still listed after ten seconds.
    pub async fn terminate_backends(&self) -> Result<u64, StoreError> {
        let mut admin = admin(&self.admin_url).await?;
        let terminated: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(&self.name)
        .fetch_one(&mut admin)
        .await
        .store_err()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
                    .bind(&self.name)
                    .fetch_one(&mut admin)
                    .await
                    .store_err()?;
            if left == 0 {
                return Ok(u64::try_from(terminated).unwrap_or(0));
            }
            if std::time::Instant::now() > deadline {
                return Err(StoreError::Unavailable(format!(
                    "{left} backends still listed after termination"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A connection whose open transaction blocks writes of `executions` (see
/// [`TestDatabase::block_execution_writes`]); dropping it closes the connection and the lock.
pub struct ExecutionWritesBlocked {
    _conn: PgConnection,
}

/// Damage for the money conformance cases (SC-107, SC-108), done with SQL behind the stores'
/// back.
#[async_trait::async_trait]
impl crate::conformance::StoreDamage for PgStores {
    async fn lose_holds(&self, scope: &tollgate_core::ids::Scope) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await.store_err()?;
        for sql in [
            "UPDATE spend_sessions SET held = 0 WHERE scope = $1",
            "UPDATE spend_days SET held = 0 WHERE scope = $1",
            "UPDATE roots SET held = 0 WHERE scope = $1",
        ] {
            sqlx::query(sql)
                .bind(scope.as_str())
                .execute(&mut *tx)
                .await
                .store_err()?;
        }
        tx.commit().await.store_err()
    }

    async fn drop_root_receipt(
        &self,
        execution_id: tollgate_core::ids::ExecutionId,
    ) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM root_receipts WHERE execution_id = $1")
            .bind(execution_id.0)
            .execute(self.pool())
            .await
            .store_err()?;
        Ok(())
    }
}

/// The conformance suite's way below the store methods: the charge's `INSERT` as `settle` runs it
/// (its `UNIQUE (execution_id)` violation mapped to `Duplicate`), without the fence, state,
/// spend or journal work around it.
#[async_trait::async_trait]
impl crate::conformance::RawSettlementInsert for PgStores {
    async fn insert_settlement_unchecked(
        &self,
        settlement: &tollgate_store::rows::SettlementRecord,
    ) -> Result<tollgate_store::rows::SettlementRecord, StoreError> {
        seam::insert_settlement_unchecked(self, settlement).await
    }
}
