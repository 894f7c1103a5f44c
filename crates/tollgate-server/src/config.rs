//! The configuration file (spec/service.md — Configuration) and its layers: defaults → TOML
//! file → `TOLLGATE_…` environment variables (`__` between levels) → `DATABASE_URL`, then
//! [`FileConfig::validate`].
//!
//! Environment overrides address the file's keys: `TOLLGATE_SERVER__LISTEN=0.0.0.0:8080`,
//! `TOLLGATE_SCHEDULER__INTERVAL_MS=500`, and array entries by index:
//! `TOLLGATE_PROFILES__0__MAX_TOKENS=512`. A value replacing an existing one keeps its type;
//! a new value is read as an integer, then a boolean, else a string. Variables whose first level
//! is not a section of the file (e.g. `TOLLGATE_TEST_DATABASE_URL`) are ignored.

use crate::layers;
use crate::profiles::{self, Profile};
use crate::secret::Secret;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use tollgate_core::ids::Scope;
use tollgate_postgres::SessionTimeouts;
use tollgate_provider::Protocol;
use tollgate_store::{KeyDigest, KeyRole};

pub use crate::sections::{
    CapsSection, ClusterSection, ConfigError, DatabaseSection, KeySection, LogSection,
    ModelPricesSection, PriceSection, ProfileSection, ProviderSection, RunnerSection,
    SchedulerSection, ServerSection,
};

/// The file read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "tollgate.toml";
/// Prefix of the environment overrides.
pub const ENV_PREFIX: &str = "TOLLGATE_";
/// Default listen address.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:8080";
pub use crate::limits::{
    CONCURRENCY_LIMIT_DEFAULT, CONCURRENCY_LIMIT_MAX, REQUEST_TIMEOUT_MS_DEFAULT,
    REQUEST_TIMEOUT_MS_MAX, REQUEST_TIMEOUT_MS_MIN,
};
/// Default scheduler period.
pub const INTERVAL_MS_DEFAULT: u64 = 1_000;
/// Shortest and longest scheduler period.
pub const INTERVAL_MS_MIN: u64 = 10;
/// Longest scheduler period.
pub const INTERVAL_MS_MAX: u64 = 3_600_000;
/// Default scheduler batch (rows per scope and task per pass).
pub const BATCH_DEFAULT: u32 = 100;
/// Largest scheduler batch (the reconciler's page limit).
pub const BATCH_MAX: u32 = tollgate_runner::recovery::RECONCILE_PAGE_MAX;
/// Default period of the scheduler's ledger audit (five minutes).
pub const LEDGER_AUDIT_INTERVAL_MS_DEFAULT: u64 = 300_000;
/// Shortest period of the scheduler's ledger audit (0 turns it off).
pub const LEDGER_AUDIT_INTERVAL_MS_MIN: u64 = 1_000;
/// Longest period of the scheduler's ledger audit (a day).
pub const LEDGER_AUDIT_INTERVAL_MS_MAX: u64 = 86_400_000;
/// Shortest and longest fence lease.
pub const LEASE_MS_MIN: u64 = 100;
/// Longest fence lease.
pub const LEASE_MS_MAX: u64 = 3_600_000;
/// Longest retry window of a finished call's last write (an hour).
pub const SETTLE_RETRY_MS_MAX: u64 = 3_600_000;
/// Default bound of the shutdown's wait for background drives.
pub const SHUTDOWN_DRAIN_MS_DEFAULT: u64 = 30_000;
/// Longest bound of the shutdown's wait for background drives (0 = do not wait).
pub const SHUTDOWN_DRAIN_MS_MAX: u64 = 600_000;
/// Default bound of the API key cache: a stored key is served from memory for at most this
/// long after it was read (SC-176), so a revocation made elsewhere takes effect within it.
pub const KEY_CACHE_MS_DEFAULT: u64 = 1_000;
/// Longest bound of the API key cache (0 = no cache).
pub const KEY_CACHE_MS_MAX: u64 = 600_000;
/// Default provider connect timeout.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Default database pool size.
pub const POOL_CONNECTIONS_DEFAULT: u32 = 16;
/// The environment variable that sets the log format of `tollgate serve`; it wins over
/// `[log] format`.
pub const LOG_FORMAT_ENV: &str = "TOLLGATE_LOG_FORMAT";

const SECTIONS: [&str; 10] = [
    "server",
    "cluster",
    "log",
    "database",
    "scheduler",
    "runner",
    "providers",
    "prices",
    "profiles",
    "keys",
];

fn err(message: impl Into<String>) -> ConfigError {
    ConfigError(message.into())
}

/// The file as read, after all layers, before validation.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `[server]`.
    #[serde(default)]
    pub server: ServerSection,
    /// `[log]`.
    #[serde(default)]
    pub log: LogSection,
    /// `[cluster]`.
    #[serde(default)]
    pub cluster: ClusterSection,
    /// `[database]`.
    #[serde(default)]
    pub database: DatabaseSection,
    /// `[scheduler]`.
    #[serde(default)]
    pub scheduler: SchedulerSection,
    /// `[runner]`.
    #[serde(default)]
    pub runner: RunnerSection,
    /// `[[providers]]`.
    #[serde(default)]
    pub providers: Vec<ProviderSection>,
    /// `[[prices]]`.
    #[serde(default)]
    pub prices: Vec<PriceSection>,
    /// `[[profiles]]`.
    #[serde(default)]
    pub profiles: Vec<ProfileSection>,
    /// `[[keys]]`.
    #[serde(default)]
    pub keys: Vec<KeySection>,
}

/// A provider ready to build clients for.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    /// The name profiles refer to; unique among providers.
    pub name: String,
    /// Wire protocol.
    pub protocol: Protocol,
    /// API root as configured; the protocol's path is appended to it.
    pub base_url: String,
    /// API key read from the named environment variable.
    pub api_key: Option<Secret>,
    /// Connect timeout.
    pub connect_timeout_ms: u64,
}

/// A static key grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyGrant {
    /// SHA-256 of the key.
    pub digest: KeyDigest,
    /// The scope every request with this key acts in (SC-10).
    pub scope: Scope,
    /// What the key may do: caller, operator or finance.
    pub role: KeyRole,
    /// The pace of calls made with the key (`[keys.limits]`, SC-220).
    pub limits: tollgate_core::limits::RateLimits,
}

/// A member of a cluster (H-39).
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// Where the other members reach this one: `http://host:port`.
    pub url: String,
    /// The members' shared secret, from the variable `[cluster] secret_env` names.
    pub secret: Secret,
}

/// The variable that holds the members' shared secret when `[cluster] secret_env` is not set.
pub const CLUSTER_SECRET_ENV_DEFAULT: &str = "TOLLGATE_CLUSTER_SECRET";

/// How often the scheduler runs a pass and how many rows one pass takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerSettings {
    /// Period between passes.
    pub interval_ms: u64,
    /// Rows per scope and task per pass.
    pub batch: u32,
}

/// Upper bound of each database session timeout.
const SESSION_TIMEOUT_MS_MAX: u64 = 3_600_000;

/// The `[database]` session bounds, defaults where unset, each within 0..=1 h.
fn session_timeouts(section: &DatabaseSection) -> Result<SessionTimeouts, ConfigError> {
    let defaults = SessionTimeouts::default();
    let bounds = SessionTimeouts {
        statement_timeout_ms: section
            .statement_timeout_ms
            .unwrap_or(defaults.statement_timeout_ms),
        lock_timeout_ms: section.lock_timeout_ms.unwrap_or(defaults.lock_timeout_ms),
        idle_in_transaction_timeout_ms: section
            .idle_in_transaction_timeout_ms
            .unwrap_or(defaults.idle_in_transaction_timeout_ms),
    };
    for (name, value) in [
        ("database.statement_timeout_ms", bounds.statement_timeout_ms),
        ("database.lock_timeout_ms", bounds.lock_timeout_ms),
        (
            "database.idle_in_transaction_timeout_ms",
            bounds.idle_in_transaction_timeout_ms,
        ),
    ] {
        range(name, value, 0, SESSION_TIMEOUT_MS_MAX)?;
    }
    Ok(bounds)
}

/// `value`, or `default` when absent, checked to lie in `min..=max`.
fn bounded(
    name: &str,
    value: Option<u64>,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    let value = value.unwrap_or(default);
    range(name, value, min, max)?;
    Ok(value)
}

/// The connection bounds of `[server]`, each within its range.
fn connection_limits(
    server: &crate::sections::ServerSection,
) -> Result<crate::connections::ConnectionLimits, ConfigError> {
    use crate::connections as c;
    let timeout = |name: &str, value: Option<u64>, default: u64| {
        bounded(
            name,
            value,
            default,
            c::CONNECTION_TIMEOUT_MS_MIN,
            c::CONNECTION_TIMEOUT_MS_MAX,
        )
    };
    let connections_max = bounded(
        "server.connections_max",
        server.connections_max,
        c::CONNECTIONS_MAX_DEFAULT,
        1,
        c::CONNECTIONS_MAX_MAX,
    )?;
    Ok(c::ConnectionLimits {
        header_read_timeout_ms: timeout(
            "server.header_read_timeout_ms",
            server.header_read_timeout_ms,
            c::HEADER_READ_TIMEOUT_MS_DEFAULT,
        )?,
        idle_timeout_ms: timeout(
            "server.idle_timeout_ms",
            server.idle_timeout_ms,
            c::IDLE_TIMEOUT_MS_DEFAULT,
        )?,
        connections_max: usize::try_from(connections_max).unwrap_or(usize::MAX),
        http_drain_ms: bounded(
            "server.http_drain_ms",
            server.http_drain_ms,
            c::HTTP_DRAIN_MS_DEFAULT,
            0,
            c::CONNECTION_TIMEOUT_MS_MAX,
        )?,
        http2_max_streams: u32::try_from(bounded(
            "server.http2_max_streams",
            server.http2_max_streams,
            c::HTTP2_MAX_STREAMS_DEFAULT,
            1,
            c::HTTP2_MAX_STREAMS_MAX,
        )?)
        .unwrap_or(u32::MAX),
    })
}

/// How `tollgate serve` writes its log on stderr (spec/service.md — Logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Lines for people, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line, with the fields of the event and of its spans.
    Json,
}

impl LogFormat {
    fn parse(text: &str, field: &str) -> Result<Self, ConfigError> {
        match text {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(err(format!(
                "{field} must be \"text\" or \"json\", not {other:?}"
            ))),
        }
    }
}

/// The validated configuration. Profiles are immutable once loaded.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Listen address.
    pub listen: SocketAddr,
    /// The log's format (`TOLLGATE_LOG_FORMAT`, else `[log] format`).
    pub log_format: LogFormat,
    /// A second address serving `GET /metrics` alone, without a key (`[server] metrics_listen`);
    /// `None` → no second listener.
    pub metrics_listen: Option<SocketAddr>,
    /// On shutdown, the longest wait for background drives.
    pub shutdown_drain_ms: u64,
    /// Longest a stored API key is served from memory after it was read; 0 = no cache.
    pub key_cache_ms: u64,
    /// Requests served at once and the per-request timeout (`[server]`).
    pub limits: crate::limits::Limits,
    /// Database URL; `None` → the embedded default.
    pub database_url: Option<Secret>,
    /// This instance as a member of a cluster (`[cluster]`, H-39); `None` → it serves every
    /// call itself.
    pub cluster: Option<ClusterSettings>,
    /// Pool size.
    pub max_connections: u32,
    /// Session bounds of every database connection.
    pub session_timeouts: SessionTimeouts,
    /// Pass period and batch from `[scheduler]`, within their bounds.
    pub scheduler: SchedulerSettings,
    /// Period of the scheduler's ledger audit; 0 = off.
    pub ledger_audit_interval_ms: u64,
    /// Whether the scheduler fetches usage of finished responses for executions awaiting an
    /// operator (`[scheduler] fetch_evidence`, default false; SC-113).
    pub fetch_evidence: bool,
    /// Fence lease.
    pub lease_ms: u64,
    /// Longest time a finished call's last write is retried while the database is unavailable
    /// (`[runner] settle_retry_ms`; SC-202).
    pub settle_retry_ms: u64,
    /// Providers by name.
    pub providers: BTreeMap<String, ProviderSettings>,
    /// Profiles, by name.
    pub profiles: BTreeMap<String, Profile>,
    /// Static keys.
    pub keys: Vec<KeyGrant>,
}

/// The environment as name → value (the binary passes `std::env::vars()`; tests pass a map).
pub type Env = BTreeMap<String, String>;

impl FileConfig {
    /// Reads the layers: `path` (or [`DEFAULT_CONFIG_FILE`] when present), then the
    /// `TOLLGATE_…` overrides and `DATABASE_URL` of `env`.
    ///
    /// # Errors
    /// An unreadable or malformed file, a bad override, an unknown key.
    pub fn load(path: Option<&Path>, env: &Env) -> Result<Self, ConfigError> {
        let text = match path {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?,
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => {
                std::fs::read_to_string(DEFAULT_CONFIG_FILE)
                    .map_err(|e| err(format!("cannot read {DEFAULT_CONFIG_FILE}: {e}")))?
            }
            None => String::new(),
        };
        Self::from_toml(&text, env)
    }

    /// Like [`FileConfig::load`] with the file's text given.
    ///
    /// # Errors
    /// Malformed TOML, a bad override, an unknown key.
    pub fn from_toml(text: &str, env: &Env) -> Result<Self, ConfigError> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| err(layers::toml_error(text, &e)))?;
        let mut root = toml::Value::Table(table);
        layers::apply_env(&mut root, env, ENV_PREFIX, &SECTIONS).map_err(err)?;
        let mut config: FileConfig = root
            .try_into()
            .map_err(|e: toml::de::Error| err(format!("configuration: {}", e.message())))?;
        if let Some(url) = env.get("DATABASE_URL").filter(|u| !u.trim().is_empty()) {
            config.database.url = Some(Secret::new(url.clone()));
        }
        Ok(config)
    }

    /// The `[[keys]]` grants alone, checked as [`FileConfig::validate`] checks them (for the
    /// `keys` commands, which need neither providers nor profiles).
    ///
    /// # Errors
    /// A bad scope, role or hash, or a hash declared twice.
    pub fn key_grants(&self) -> Result<Vec<KeyGrant>, ConfigError> {
        keys(&self.keys)
    }

    /// The database URL (`DATABASE_URL` or `[database] url`), if any.
    pub fn database_url(&self) -> Option<&Secret> {
        self.database.url.as_ref()
    }

    /// The log's format: `TOLLGATE_LOG_FORMAT` of `env` when set, else `[log] format`, else
    /// text.
    ///
    /// # Errors
    /// A value other than `text` or `json`, naming where it came from.
    pub fn log_format(&self, env: &Env) -> Result<LogFormat, ConfigError> {
        match env.get(LOG_FORMAT_ENV) {
            Some(text) => LogFormat::parse(text, LOG_FORMAT_ENV),
            None => match &self.log.format {
                Some(text) => LogFormat::parse(text, "log.format"),
                None => Ok(LogFormat::Text),
            },
        }
    }

    /// Whether no database is configured (→ the embedded default).
    pub fn is_embedded(&self) -> bool {
        self.database.url.is_none()
    }

    /// Validates everything and snapshots each profile into a checked `CallConfig` (prices from
    /// its price version). Provider API keys are read from `env`.
    ///
    /// # Errors
    /// The first problem, naming the section and field.
    pub fn validate(self, env: &Env) -> Result<Settings, ConfigError> {
        let log_format = self.log_format(env)?;
        let listen_text = self.server.listen.as_deref().unwrap_or(LISTEN_DEFAULT);
        let listen: SocketAddr = listen_text
            .parse()
            .map_err(|_| err(format!("server.listen {listen_text:?} is not host:port")))?;
        let metrics_listen = self
            .server
            .metrics_listen
            .as_deref()
            .map(|text| {
                text.parse::<SocketAddr>()
                    .map_err(|_| err(format!("server.metrics_listen {text:?} is not host:port")))
            })
            .transpose()?;
        let shutdown_drain_ms = self
            .server
            .shutdown_drain_ms
            .unwrap_or(SHUTDOWN_DRAIN_MS_DEFAULT);
        range(
            "server.shutdown_drain_ms",
            shutdown_drain_ms,
            0,
            SHUTDOWN_DRAIN_MS_MAX,
        )?;
        let key_cache_ms = self.server.key_cache_ms.unwrap_or(KEY_CACHE_MS_DEFAULT);
        range("server.key_cache_ms", key_cache_ms, 0, KEY_CACHE_MS_MAX)?;
        let concurrency_limit = self
            .server
            .concurrency_limit
            .unwrap_or(CONCURRENCY_LIMIT_DEFAULT);
        range(
            "server.concurrency_limit",
            concurrency_limit,
            1,
            CONCURRENCY_LIMIT_MAX,
        )?;
        let request_timeout_ms = self
            .server
            .request_timeout_ms
            .unwrap_or(REQUEST_TIMEOUT_MS_DEFAULT);
        range(
            "server.request_timeout_ms",
            request_timeout_ms,
            REQUEST_TIMEOUT_MS_MIN,
            REQUEST_TIMEOUT_MS_MAX,
        )?;
        let limits = crate::limits::Limits {
            concurrency_limit: usize::try_from(concurrency_limit).unwrap_or(usize::MAX),
            request_timeout_ms,
            body_read_timeout_ms: bounded(
                "server.body_read_timeout_ms",
                self.server.body_read_timeout_ms,
                crate::limits::BODY_READ_TIMEOUT_MS_DEFAULT,
                crate::limits::BODY_READ_TIMEOUT_MS_MIN,
                crate::limits::BODY_READ_TIMEOUT_MS_MAX,
            )?,
            metrics_public: self.server.metrics_public.unwrap_or(false),
            connections: connection_limits(&self.server)?,
        };
        let interval_ms = self.scheduler.interval_ms.unwrap_or(INTERVAL_MS_DEFAULT);
        range(
            "scheduler.interval_ms",
            interval_ms,
            INTERVAL_MS_MIN,
            INTERVAL_MS_MAX,
        )?;
        let batch = self.scheduler.batch.unwrap_or(BATCH_DEFAULT);
        range("scheduler.batch", batch.into(), 1, BATCH_MAX.into())?;
        let ledger_audit_interval_ms = self
            .scheduler
            .ledger_audit_interval_ms
            .unwrap_or(LEDGER_AUDIT_INTERVAL_MS_DEFAULT);
        if ledger_audit_interval_ms != 0 {
            range(
                "scheduler.ledger_audit_interval_ms",
                ledger_audit_interval_ms,
                LEDGER_AUDIT_INTERVAL_MS_MIN,
                LEDGER_AUDIT_INTERVAL_MS_MAX,
            )?;
        }
        let lease_ms = self
            .runner
            .lease_ms
            .unwrap_or(tollgate_runner::settings::LEASE_MS_DEFAULT);
        range("runner.lease_ms", lease_ms, LEASE_MS_MIN, LEASE_MS_MAX)?;
        let settle_retry_ms = self
            .runner
            .settle_retry_ms
            .unwrap_or(tollgate_runner::settings::SETTLE_RETRY_MS_DEFAULT);
        range(
            "runner.settle_retry_ms",
            settle_retry_ms,
            0,
            SETTLE_RETRY_MS_MAX,
        )?;
        let max_connections = self
            .database
            .max_connections
            .unwrap_or(POOL_CONNECTIONS_DEFAULT);
        range("database.max_connections", max_connections.into(), 1, 1_000)?;
        let session_timeouts = session_timeouts(&self.database)?;
        let providers = providers(&self.providers, env)?;
        let provider_names = providers.keys().map(String::as_str).collect();
        let profiles = profiles::build(&self.profiles, &self.prices, &provider_names)?;
        let keys = keys(&self.keys)?;
        let cluster = cluster(&self.cluster, self.database.url.is_some(), env)?;
        Ok(Settings {
            listen,
            log_format,
            metrics_listen,
            shutdown_drain_ms,
            key_cache_ms,
            limits,
            database_url: self.database.url,
            cluster,
            max_connections,
            session_timeouts,
            scheduler: SchedulerSettings { interval_ms, batch },
            ledger_audit_interval_ms,
            fetch_evidence: self.scheduler.fetch_evidence.unwrap_or(false),
            lease_ms,
            settle_retry_ms,
            providers,
            profiles,
            keys,
        })
    }
}

/// `[cluster]` checked: `url` an `http://` URL of a host and port with no path, query or
/// credentials, a database beside it (the members meet in it), and the shared secret of at
/// least `CLUSTER_SECRET_MIN_BYTES` bytes in the variable `secret_env` names.
fn cluster(
    section: &ClusterSection,
    has_database: bool,
    env: &Env,
) -> Result<Option<ClusterSettings>, ConfigError> {
    let Some(text) = section.url.as_deref() else {
        if section.secret_env.is_some() {
            return Err(err("cluster.secret_env is set without cluster.url"));
        }
        return Ok(None);
    };
    // The URL is not quoted back: one with credentials in it would print them.
    let bad = || {
        err("cluster.url must be http://host:port (no path, query or credentials), where the other instances reach this one")
    };
    let uri: axum::http::Uri = text.parse().map_err(|_| bad())?;
    let plain = uri.scheme_str() == Some("http")
        && uri.authority().is_some_and(|a| {
            a.port_u16().is_some() && !a.as_str().contains('@') && !a.host().is_empty()
        })
        && uri.path_and_query().is_none_or(|p| p.as_str() == "/");
    if !plain {
        return Err(bad());
    }
    if !has_database {
        return Err(err(
            "cluster.url needs [database] url: the members of a cluster share one database",
        ));
    }
    let var = section
        .secret_env
        .as_deref()
        .unwrap_or(CLUSTER_SECRET_ENV_DEFAULT);
    let secret = env.get(var).map(String::as_str).unwrap_or_default();
    if secret.len() < crate::cluster::CLUSTER_SECRET_MIN_BYTES {
        return Err(err(format!(
            "cluster: environment variable {var} (cluster.secret_env) must hold the members' shared secret, at least {} bytes",
            crate::cluster::CLUSTER_SECRET_MIN_BYTES
        )));
    }
    Ok(Some(ClusterSettings {
        url: text.trim_end_matches('/').to_string(),
        secret: Secret::new(secret),
    }))
}

/// Checks `min ≤ value ≤ max`.
///
/// # Errors
/// Naming `field`.
pub fn range(field: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(err(format!("{field} must be between {min} and {max}")));
    }
    Ok(())
}

fn providers(
    sections: &[ProviderSection],
    env: &Env,
) -> Result<BTreeMap<String, ProviderSettings>, ConfigError> {
    let mut out = BTreeMap::new();
    for p in sections {
        let protocol: Protocol = p
            .kind
            .parse()
            .map_err(|e| err(format!("providers {:?}: {e}", p.name)))?;
        let api_key = match &p.api_key_env {
            Some(var) => Some(Secret::new(env.get(var).cloned().ok_or_else(|| {
                err(format!(
                    "providers {:?}: environment variable {var} (api_key_env) is not set",
                    p.name
                ))
            })?)),
            None => None,
        };
        let connect_timeout_ms = p.connect_timeout_ms.unwrap_or(CONNECT_TIMEOUT_MS_DEFAULT);
        range(
            "providers.connect_timeout_ms",
            connect_timeout_ms,
            1,
            600_000,
        )?;
        let settings = ProviderSettings {
            name: p.name.clone(),
            protocol,
            base_url: p.base_url.clone(),
            api_key,
            connect_timeout_ms,
        };
        if out.insert(p.name.clone(), settings).is_some() {
            return Err(err(format!("providers: {:?} is declared twice", p.name)));
        }
    }
    Ok(out)
}

fn keys(sections: &[KeySection]) -> Result<Vec<KeyGrant>, ConfigError> {
    let mut seen = BTreeSet::new();
    sections
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let scope =
                Scope::parse(k.scope.clone()).map_err(|e| err(format!("keys[{i}]: {e}")))?;
            let role: KeyRole = k.role.parse().map_err(|e| err(format!("keys[{i}]: {e}")))?;
            let digest = KeyDigest::from_hex(&k.sha256).ok_or_else(|| {
                err(format!(
                    "keys[{i}]: sha256 must be 64 lower-case hex digits"
                ))
            })?;
            if !seen.insert(digest) {
                return Err(err(format!(
                    "keys[{i}]: the same key hash is declared twice"
                )));
            }
            k.limits
                .validate()
                .map_err(|e| err(format!("keys[{i}]: limits: {e}")))?;
            Ok(KeyGrant {
                digest,
                scope,
                role,
                limits: k.limits,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn env_overrides_the_file_and_database_url_wins() {
        let text = "[server]\nlisten = \"127.0.0.1:1\"\n[scheduler]\ninterval_ms = 5\n[database]\nurl = \"postgres://u:pw@h/db\"\n";
        let e = env(&[
            ("TOLLGATE_SERVER__LISTEN", "127.0.0.1:2"),
            ("TOLLGATE_SCHEDULER__INTERVAL_MS", "250"),
            ("TOLLGATE_RUNNER__LEASE_MS", "5000"),
            ("TOLLGATE_TEST_DATABASE_URL", "ignored"),
            ("DATABASE_URL", "postgres://other"),
        ]);
        let config = FileConfig::from_toml(text, &e).unwrap();
        assert_eq!(config.server.listen.as_deref(), Some("127.0.0.1:2"));
        assert_eq!(config.scheduler.interval_ms, Some(250));
        assert_eq!(config.runner.lease_ms, Some(5000));
        assert_eq!(
            config.database.url.as_ref().map(Secret::expose),
            Some("postgres://other")
        );
        assert!(!format!("{config:?}").contains("other"));
        let settings = config.validate(&e).unwrap();
        assert_eq!(settings.listen.port(), 2);
        assert_eq!(settings.scheduler.interval_ms, 250);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = Env::new();
        let bad = FileConfig::from_toml("[server]\nlisten_on = 1\n", &e).unwrap_err();
        assert!(bad.0.contains("listen_on"), "{bad}");
        let bad = FileConfig::from_toml("[scheduler]\ninterval_ms = 1\n", &e)
            .unwrap()
            .validate(&e)
            .unwrap_err();
        assert!(bad.0.contains("scheduler.interval_ms"), "{bad}");
        let bad =
            FileConfig::from_toml("", &env(&[("TOLLGATE_PROFILES__0__NAME", "x")])).unwrap_err();
        assert!(bad.0.contains("TOLLGATE_PROFILES__0__NAME"), "{bad}");
    }

    #[test]
    fn sc_214_log_format_defaults_to_text_and_the_environment_wins() {
        let none = Env::new();
        let json = env(&[(LOG_FORMAT_ENV, "json")]);
        let text = env(&[(LOG_FORMAT_ENV, "text")]);
        let settings = |file: &str, e: &Env| FileConfig::from_toml(file, e).unwrap().validate(e);
        assert_eq!(settings("", &none).unwrap().log_format, LogFormat::Text);
        let file = "[log]\nformat = \"json\"\n";
        assert_eq!(settings(file, &none).unwrap().log_format, LogFormat::Json);
        assert_eq!(settings("", &json).unwrap().log_format, LogFormat::Json);
        assert_eq!(settings(file, &text).unwrap().log_format, LogFormat::Text);
        let bad = settings("[log]\nformat = \"yaml\"\n", &none).unwrap_err();
        assert!(
            bad.0.contains("log.format") && bad.0.contains("yaml"),
            "{bad}"
        );
        let bad = settings("", &env(&[(LOG_FORMAT_ENV, "JSON")])).unwrap_err();
        assert!(bad.0.contains(LOG_FORMAT_ENV), "{bad}");
        let bad = FileConfig::from_toml("[log]\nlevel = \"info\"\n", &none).unwrap_err();
        assert!(bad.0.contains("level"), "{bad}");
    }

    #[test]
    fn sc_116_shutdown_drain_defaults_and_is_bounded() {
        let e = Env::new();
        let settings = |text: &str| FileConfig::from_toml(text, &e).unwrap().validate(&e);
        assert_eq!(
            settings("").unwrap().shutdown_drain_ms,
            SHUTDOWN_DRAIN_MS_DEFAULT
        );
        let off = settings("[server]\nshutdown_drain_ms = 0\n").unwrap();
        assert_eq!(off.shutdown_drain_ms, 0);
        let bad = settings("[server]\nshutdown_drain_ms = 600001\n").unwrap_err();
        assert!(bad.0.contains("server.shutdown_drain_ms"), "{bad}");
    }

    #[test]
    fn sc_226_http2_streams_default_and_are_bounded() {
        let e = Env::new();
        let settings = |text: &str| FileConfig::from_toml(text, &e).unwrap().validate(&e);
        assert_eq!(
            u64::from(settings("").unwrap().limits.connections.http2_max_streams),
            crate::connections::HTTP2_MAX_STREAMS_DEFAULT
        );
        let set = settings("[server]\nhttp2_max_streams = 10000\n").unwrap();
        assert_eq!(set.limits.connections.http2_max_streams, 10_000);
        for bad in ["0", "10001"] {
            let bad = settings(&format!("[server]\nhttp2_max_streams = {bad}\n")).unwrap_err();
            assert!(bad.0.contains("server.http2_max_streams"), "{bad}");
        }
    }

    #[test]
    fn sc_176_key_cache_defaults_turns_off_and_is_bounded() {
        let e = Env::new();
        let settings = |text: &str| FileConfig::from_toml(text, &e).unwrap().validate(&e);
        assert_eq!(settings("").unwrap().key_cache_ms, KEY_CACHE_MS_DEFAULT);
        assert_eq!(KEY_CACHE_MS_DEFAULT, 1_000);
        let off = settings("[server]\nkey_cache_ms = 0\n").unwrap();
        assert_eq!(off.key_cache_ms, 0);
        let bad = settings("[server]\nkey_cache_ms = 600001\n").unwrap_err();
        assert!(bad.0.contains("server.key_cache_ms"), "{bad}");
        let from_env = FileConfig::from_toml("", &env(&[("TOLLGATE_SERVER__KEY_CACHE_MS", "250")]))
            .unwrap()
            .validate(&e)
            .unwrap();
        assert_eq!(from_env.key_cache_ms, 250);
    }

    #[test]
    fn sc_93_ledger_audit_interval_defaults_turns_off_and_is_bounded() {
        let e = Env::new();
        let settings = |text: &str| FileConfig::from_toml(text, &e).unwrap().validate(&e);
        assert_eq!(
            settings("").unwrap().ledger_audit_interval_ms,
            LEDGER_AUDIT_INTERVAL_MS_DEFAULT
        );
        let off = settings("[scheduler]\nledger_audit_interval_ms = 0\n").unwrap();
        assert_eq!(off.ledger_audit_interval_ms, 0);
        let bad = settings("[scheduler]\nledger_audit_interval_ms = 10\n").unwrap_err();
        assert!(
            bad.0.contains("scheduler.ledger_audit_interval_ms"),
            "{bad}"
        );
        let over = env(&[("TOLLGATE_SCHEDULER__LEDGER_AUDIT_INTERVAL_MS", "60000")]);
        let from_env = FileConfig::from_toml("", &over)
            .unwrap()
            .validate(&over)
            .unwrap();
        assert_eq!(from_env.ledger_audit_interval_ms, 60_000);
    }

    #[test]
    fn sc_197_metrics_need_a_key_by_default_and_a_metrics_address_is_optional() {
        let e = Env::new();
        let settings = |text: &str| FileConfig::from_toml(text, &e).unwrap().validate(&e);
        let default = settings("").unwrap();
        assert!(!default.limits.metrics_public);
        assert_eq!(default.metrics_listen, None);
        let open = settings("[server]\nmetrics_public = true\n").unwrap();
        assert!(open.limits.metrics_public);
        let scrape = settings("[server]\nmetrics_listen = \"127.0.0.1:9464\"\n").unwrap();
        assert_eq!(scrape.metrics_listen, Some(([127, 0, 0, 1], 9464).into()));
        let bad = settings("[server]\nmetrics_listen = \"nowhere\"\n").unwrap_err();
        assert!(bad.0.contains("server.metrics_listen"), "{bad}");
    }

    #[test]
    fn h_39_a_cluster_url_is_a_plain_http_address_beside_a_database_and_a_secret() {
        let secret = "s".repeat(crate::cluster::CLUSTER_SECRET_MIN_BYTES);
        let e = env(&[(CLUSTER_SECRET_ENV_DEFAULT, secret.as_str())]);
        let settings = |text: &str| FileConfig::from_toml(text, &e).unwrap().validate(&e);
        let db = "[database]\nurl = \"postgres://u@h/db\"\n";
        assert!(settings(db).unwrap().cluster.is_none());
        let member = settings(&format!("{db}[cluster]\nurl = \"http://10.0.0.5:8080/\"\n"))
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(member.url, "http://10.0.0.5:8080");
        assert_eq!(member.secret.expose(), secret);
        for bad in [
            "https://10.0.0.5:8080",
            "http://10.0.0.5",
            "http://10.0.0.5:8080/v1",
            "http://u:pw@10.0.0.5:8080",
            "10.0.0.5:8080",
            "http://10.0.0.5:8080?x=1",
        ] {
            let error = settings(&format!("{db}[cluster]\nurl = \"{bad}\"\n")).unwrap_err();
            assert!(error.0.contains("cluster.url"), "{bad}: {error}");
            assert!(!error.0.contains("pw"), "{error}");
        }
        let alone = settings("[cluster]\nurl = \"http://10.0.0.5:8080\"\n").unwrap_err();
        assert!(alone.0.contains("[database] url"), "{alone}");
        // The secret: from the default variable or the one named, never shorter than the bound,
        // never quoted in the error.
        let cluster = format!("{db}[cluster]\nurl = \"http://10.0.0.5:8080\"\n");
        let short = env(&[(CLUSTER_SECRET_ENV_DEFAULT, "short-secret")]);
        let error = FileConfig::from_toml(&cluster, &short)
            .unwrap()
            .validate(&short)
            .unwrap_err();
        assert!(error.0.contains(CLUSTER_SECRET_ENV_DEFAULT), "{error}");
        assert!(!error.0.contains("short-secret"), "{error}");
        let none = Env::new();
        let error = FileConfig::from_toml(&cluster, &none)
            .unwrap()
            .validate(&none)
            .unwrap_err();
        assert!(error.0.contains("secret"), "{error}");
        let named = env(&[("MY_SECRET", secret.as_str())]);
        let text = format!("{cluster}secret_env = \"MY_SECRET\"\n");
        let member = FileConfig::from_toml(&text, &named)
            .unwrap()
            .validate(&named)
            .unwrap();
        assert_eq!(member.cluster.unwrap().secret.expose(), secret);
        let stray = settings("[cluster]\nsecret_env = \"X\"\n").unwrap_err();
        assert!(stray.0.contains("cluster.secret_env"), "{stray}");
        let over = env(&[
            ("TOLLGATE_CLUSTER__URL", "http://127.0.0.1:9001"),
            ("DATABASE_URL", "postgres://u@h/db"),
            (CLUSTER_SECRET_ENV_DEFAULT, secret.as_str()),
        ]);
        let from_env = FileConfig::from_toml("", &over)
            .unwrap()
            .validate(&over)
            .unwrap();
        assert_eq!(
            from_env.cluster.map(|c| c.url).as_deref(),
            Some("http://127.0.0.1:9001")
        );
    }

    #[test]
    fn malformed_toml_errors_do_not_quote_the_line() {
        let bad =
            FileConfig::from_toml("[database]\nurl = \"postgres://u:hunter2@h\n", &Env::new())
                .unwrap_err();
        assert!(!bad.0.contains("hunter2"), "{bad}");
        assert!(bad.0.contains("line"), "{bad}");
    }

    #[test]
    fn provider_keys_come_from_the_named_variable_and_never_print() {
        let text = "[[providers]]\nname = \"p\"\nkind = \"anthropic\"\nbase_url = \"http://x\"\napi_key_env = \"P_KEY\"\n";
        let missing = FileConfig::from_toml(text, &Env::new())
            .unwrap()
            .validate(&Env::new())
            .unwrap_err();
        assert!(missing.0.contains("P_KEY"), "{missing}");
        let e = env(&[("P_KEY", "sk-very-secret")]);
        let settings = FileConfig::from_toml(text, &e)
            .unwrap()
            .validate(&e)
            .unwrap();
        let p = &settings.providers["p"];
        assert_eq!(
            p.api_key.as_ref().map(Secret::expose),
            Some("sk-very-secret")
        );
        assert!(!format!("{settings:?}").contains("sk-very-secret"));
    }
}
