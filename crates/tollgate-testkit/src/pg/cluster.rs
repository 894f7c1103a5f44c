//! Postgres servers of a test's own: a primary with a streaming, synchronous standby, and a
//! pgbouncer in front of a server. Each runs from this machine's Postgres binaries in a
//! temporary directory, on a free loopback port, with no Unix socket; no system cluster is
//! touched. Postgres and pgbouncer refuse to run as root: when the tests run as root, every
//! server process runs as the `postgres` system user (`runuser`), and the directories are given
//! to it.
//!
//! The binaries: `TOLLGATE_PG_BIN` when set, else the newest `/usr/lib/postgresql/<major>/bin`
//! (Debian's layout); pgbouncer from `PATH` or `/usr/sbin`. A missing binary is an error that
//! names the package to install, never a skipped test.

use super::DbResultExt;
use sqlx::{Connection, PgConnection};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tollgate_store::StoreError;

/// How long a server may take to start, a standby to catch up, a promotion to finish.
const STARTS_WITHIN: Duration = Duration::from_secs(60);

fn failed(what: impl Into<String>) -> StoreError {
    StoreError::Unavailable(what.into())
}

/// Whether this process runs as root (then the servers run as `postgres`).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program` as the user the servers run as.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// Runs `command` to its end; an error holding its output when it fails.
fn run(what: &str, command: &mut Command) -> Result<(), StoreError> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| failed(format!("{what}: cannot run: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(failed(format!(
        "{what} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )))
}

/// The directory of `initdb`, `pg_ctl` and `pg_basebackup`.
fn postgres_bin() -> Result<PathBuf, StoreError> {
    if let Ok(dir) = std::env::var("TOLLGATE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| failed("no /usr/lib/postgresql: install Debian's postgresql package"))?
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| failed("no initdb under /usr/lib/postgresql/*/bin: install postgresql"))
}

/// A port nobody listens on now (the kernel's choice for a socket bound to port 0).
fn free_port() -> Result<u16, StoreError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| failed(format!("no free port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| failed(format!("no free port: {e}")))
}

/// Whether something accepts TCP connections on `port` of loopback.
fn listening(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// A temporary directory the server user owns, removed on drop.
#[derive(Debug)]
struct ServerDir(PathBuf);

impl ServerDir {
    fn new(prefix: &str) -> Result<Self, StoreError> {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).map_err(|e| failed(format!("mkdir: {e}")))?;
        if is_root() {
            run(
                "chown",
                Command::new("chown").arg("postgres:postgres").arg(&path),
            )?;
        }
        Ok(Self(path))
    }
}

impl Drop for ServerDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One Postgres server of a test: its data directory and port.
#[derive(Debug)]
struct Node {
    data: PathBuf,
    port: u16,
}

impl Node {
    /// A server whose data directory is `<dir>/<name>`, on a free port.
    fn in_dir(dir: &Path, name: &str) -> Result<Self, StoreError> {
        Ok(Self {
            data: dir.join(name),
            port: free_port()?,
        })
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// `pg_ctl start`, logging to `<data>.log`, waiting until it accepts connections.
    fn start(&self, bin: &Path) -> Result<(), StoreError> {
        let log = self.data.with_extension("log");
        run(
            "pg_ctl start",
            as_server_user(&bin.join("pg_ctl"))
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "60", "start"]),
        )
        .map_err(|e| {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            failed(format!("{e}\n{tail}"))
        })
    }

    /// The postmaster's process id (the first line of `postmaster.pid`).
    fn postmaster_pid(&self) -> Result<String, StoreError> {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .map_err(|e| failed(format!("postmaster.pid: {e}")))?;
        Ok(text.lines().next().unwrap_or_default().trim().to_string())
    }

    /// Appends `lines` to the server's `postgresql.conf` (later lines win).
    fn configure(&self, lines: &str) -> Result<(), StoreError> {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("postgresql.conf"))
            .map_err(|e| failed(format!("postgresql.conf: {e}")))?;
        writeln!(file, "\n{lines}").map_err(|e| failed(format!("postgresql.conf: {e}")))
    }

    /// `pg_ctl stop -m immediate`, ignoring a server that is already gone.
    fn stop(&self, bin: &Path) {
        let _ = as_server_user(&bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A primary and its streaming standby, with `synchronous_standby_names = '*'` on the
/// primary, so that a commit is acknowledged only once the standby has it (`synchronous_commit =
/// on`, the default: the standby has flushed it to disk). The standby itself has no synchronous
/// standby: once promoted, its commits are acknowledged alone.
#[derive(Debug)]
pub struct Replicated {
    bin: PathBuf,
    primary: Node,
    standby: Node,
    _dir: ServerDir,
}

impl Replicated {
    /// `initdb` of the primary, its start, `pg_basebackup -R` of the standby, its start, and a
    /// wait until the primary reports the standby as synchronous.
    ///
    /// # Errors
    /// A binary is missing or a step fails (its output in the message).
    pub async fn start() -> Result<Self, StoreError> {
        let bin = postgres_bin()?;
        let dir = ServerDir::new("tollgate-replicated")?;
        let primary = Node::in_dir(&dir.0, "primary")?;
        run(
            "initdb",
            as_server_user(&bin.join("initdb"))
                .arg("-D")
                .arg(&primary.data)
                .args(["--auth=trust", "--username=postgres", "--no-sync"]),
        )?;
        primary.configure(&format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = ''\n\
             max_connections = 100\nshared_buffers = 32MB\nwal_level = replica\n\
             max_wal_senders = 4\nsynchronous_standby_names = '*'\nsynchronous_commit = on",
            primary.port
        ))?;
        primary.start(&bin)?;
        let standby = Node::in_dir(&dir.0, "standby")?;
        run(
            "pg_basebackup",
            as_server_user(&bin.join("pg_basebackup"))
                .arg("-D")
                .arg(&standby.data)
                .args(["-h", "127.0.0.1", "-p"])
                .arg(primary.port.to_string())
                .args(["-U", "postgres", "-R", "-X", "stream", "-c", "fast"]),
        )?;
        standby.configure(&format!(
            "port = {}\nsynchronous_standby_names = ''",
            standby.port
        ))?;
        let replicated = Self {
            bin,
            primary,
            standby,
            _dir: dir,
        };
        replicated.standby.start(&replicated.bin)?;
        let deadline = Instant::now() + STARTS_WITHIN;
        while replicated.sync_standbys().await? == 0 {
            if Instant::now() > deadline {
                return Err(failed("the standby never became synchronous"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(replicated)
    }

    /// The URL of `database` naming both hosts, the primary first, read-write.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }

    /// The URL of `database` on the primary alone.
    pub fn primary_url(&self, database: &str) -> String {
        self.primary.url(database)
    }

    /// The URL of `database` on the standby alone.
    pub fn standby_url(&self, database: &str) -> String {
        self.standby.url(database)
    }

    /// `CREATE DATABASE` on the primary (replicated to the standby).
    ///
    /// # Errors
    /// The primary cannot be reached or refuses.
    pub async fn create_database(&self, name: &str) -> Result<(), StoreError> {
        let mut admin = PgConnection::connect(&self.primary.url("postgres"))
            .await
            .store_err()?;
        // A name of the test's own (letters, digits, underscores): it cannot be bound.
        sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .store_err()?;
        admin.close().await.store_err()
    }

    /// Standbys the primary reports as synchronous.
    async fn sync_standbys(&self) -> Result<i64, StoreError> {
        let mut admin = PgConnection::connect(&self.primary.url("postgres"))
            .await
            .store_err()?;
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
        )
        .fetch_one(&mut admin)
        .await
        .store_err()?;
        admin.close().await.store_err()?;
        Ok(n)
    }

    /// Client connections to `database` on the primary now.
    ///
    /// # Errors
    /// The primary cannot be reached.
    pub async fn primary_connections(&self, database: &str) -> Result<i64, StoreError> {
        let mut admin = PgConnection::connect(&self.primary.url("postgres"))
            .await
            .store_err()?;
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
             AND backend_type = 'client backend'",
        )
        .bind(database)
        .fetch_one(&mut admin)
        .await
        .store_err()?;
        admin.close().await.store_err()?;
        Ok(n)
    }

    /// Kills the primary's postmaster with SIGKILL (its backends see it gone and exit) and
    /// waits until its port refuses connections.
    ///
    /// # Errors
    /// `kill` fails, or the port still answers after [`STARTS_WITHIN`].
    pub async fn kill_primary(&self) -> Result<(), StoreError> {
        let pid = self.primary.postmaster_pid()?;
        run(
            "kill -9 postmaster",
            Command::new("kill").args(["-KILL", &pid]),
        )?;
        let deadline = Instant::now() + STARTS_WITHIN;
        while listening(self.primary.port) {
            if Instant::now() > deadline {
                return Err(failed("the killed primary still accepts connections"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// `pg_ctl promote -w` of the standby: it returns once the standby accepts writes.
    ///
    /// # Errors
    /// The promotion fails.
    pub fn promote_standby(&self) -> Result<(), StoreError> {
        run(
            "pg_ctl promote",
            as_server_user(&self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(&self.standby.data)
                .args(["-w", "-t", "60", "promote"]),
        )
    }
}

impl Drop for Replicated {
    fn drop(&mut self) {
        self.standby.stop(&self.bin);
        self.primary.stop(&self.bin);
    }
}

/// pgbouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection, for the client's whole session.
    Session,
    /// A server connection per transaction.
    Transaction,
}

/// A pgbouncer in front of one Postgres server, on a free loopback port, trust auth, every
/// database passed through.
#[derive(Debug)]
pub struct Pgbouncer {
    port: u16,
    pidfile: PathBuf,
    log: PathBuf,
    _dir: ServerDir,
}

impl Pgbouncer {
    /// Starts pgbouncer in `mode` in front of `127.0.0.1:<upstream_port>` and waits until it
    /// listens, with `server_login_retry = 1` (a second, where the default waits 15 s after a
    /// failed connect to the server before trying again) and `ignore_startup_parameters =
    /// extra_float_digits`: the Postgres driver sends it at every connect, and pgbouncer refuses
    /// a startup parameter it does not know.
    ///
    /// # Errors
    /// pgbouncer is missing (install Debian's `pgbouncer`) or does not start.
    pub async fn start(upstream_port: u16, mode: PoolMode) -> Result<Self, StoreError> {
        Self::start_ignoring(upstream_port, mode, "extra_float_digits").await
    }

    /// [`Pgbouncer::start`] with `ignore_startup_parameters = <ignored>` (empty: none).
    ///
    /// # Errors
    /// As [`Pgbouncer::start`].
    pub async fn start_ignoring(
        upstream_port: u16,
        mode: PoolMode,
        ignored: &str,
    ) -> Result<Self, StoreError> {
        let program = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or_else(|| failed("no pgbouncer: install Debian's pgbouncer package"))?;
        let dir = ServerDir::new("tollgate-pgbouncer")?;
        let port = free_port()?;
        let mode = match mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        let log = dir.0.join("pgbouncer.log");
        let ini = dir.0.join("pgbouncer.ini");
        let users = dir.0.join("users.txt");
        let pidfile = dir.0.join("pgbouncer.pid");
        std::fs::write(&users, "\"postgres\" \"\"\n").map_err(|e| failed(e.to_string()))?;
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={upstream_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {}\npool_mode = {mode}\n\
                 max_client_conn = 400\ndefault_pool_size = 40\n\
                 server_login_retry = 1\nignore_startup_parameters = {ignored}\n\
                 logfile = {}\npidfile = {}\n",
                users.display(),
                log.display(),
                pidfile.display()
            ),
        )
        .map_err(|e| failed(e.to_string()))?;
        if is_root() {
            run(
                "chown",
                Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(&dir.0),
            )?;
        }
        let bouncer = Self {
            port,
            pidfile,
            log,
            _dir: dir,
        };
        // `-d`: it forks into the background once its configuration is read, and writes its
        // process id to the pidfile.
        run("pgbouncer", as_server_user(&program).arg("-d").arg(&ini))
            .map_err(|e| failed(format!("{e}\n{}", bouncer.log_text())))?;
        let deadline = Instant::now() + STARTS_WITHIN;
        while !listening(port) {
            if Instant::now() > deadline {
                return Err(failed(format!(
                    "pgbouncer never listened: {}",
                    bouncer.log_text()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(bouncer)
    }

    /// Starts pgbouncer in `mode` in front of the loopback server of `url` (its port; the
    /// host must be 127.0.0.1).
    ///
    /// # Errors
    /// As [`Pgbouncer::start`]; a URL that does not parse.
    pub async fn in_front_of(url: &str, mode: PoolMode) -> Result<Self, StoreError> {
        Self::start(super::options(url)?.get_port(), mode).await
    }

    /// [`Pgbouncer::in_front_of`] with `ignore_startup_parameters = <ignored>` (empty: none).
    ///
    /// # Errors
    /// As [`Pgbouncer::start`].
    pub async fn in_front_of_ignoring(
        url: &str,
        mode: PoolMode,
        ignored: &str,
    ) -> Result<Self, StoreError> {
        Self::start_ignoring(super::options(url)?.get_port(), mode, ignored).await
    }

    /// The URL of `database` through pgbouncer.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// What pgbouncer logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(&self.pidfile) {
            let _ = Command::new("kill")
                .args(["-KILL", pid.trim()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
