//! Starting the service: configuration, stores (Postgres with migrations, or the embedded
//! default), keys, runners, the scheduler and the listener. The binary only parses arguments
//! and calls [`serve`], [`scheduler`] or [`create_key`].

use crate::app::{App, StartError};
use crate::auth::{self, KeyStore};
use crate::backend::Backend;
use crate::config::{Env, FileConfig, LogFormat, Settings};
use crate::embedded;
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use crate::secret::Secret;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::Scope;
use tollgate_core::limits::RateLimits;
use tollgate_mock_provider::MockProvider;
use tollgate_postgres::{PgStores, SessionTimeouts};
use tollgate_store::{ApiKeyRecord, ApiKeyStore, KeyDigest, KeyRole};

/// Where the configuration comes from.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--config FILE`; `None` → `tollgate.toml` when present.
    pub config: Option<PathBuf>,
    /// The environment (`TOLLGATE_…`, `DATABASE_URL`, provider key variables).
    pub env: Env,
}

impl Options {
    /// `--config` and the process environment.
    pub fn from_process(config: Option<PathBuf>) -> Self {
        Self {
            config,
            env: std::env::vars().collect(),
        }
    }
}

fn start_error(e: impl std::fmt::Display) -> StartError {
    StartError(e.to_string())
}

/// Writes one line to stderr (start-up notices; never content): as it is, or in the JSON log
/// format as one object with the fields of a log event, so every line of the log is JSON.
fn notice(format: LogFormat, line: &str) {
    let text = match format {
        LogFormat::Text => line.to_string(),
        LogFormat::Json => serde_json::json!({
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "level": "INFO",
            "target": "tollgate",
            "message": line,
        })
        .to_string(),
    };
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{text}");
}

/// The log format `tollgate serve` starts with, read before the logging starts:
/// `TOLLGATE_LOG_FORMAT`, else `[log] format` of the configuration, else text. A configuration
/// that cannot be read or holds a bad value gives text here; [`serve`] then fails naming it.
pub fn log_format(options: &Options) -> LogFormat {
    FileConfig::load(options.config.as_deref(), &options.env)
        .unwrap_or_default()
        .log_format(&options.env)
        .unwrap_or_default()
}

/// The usage fetchers of the configured providers, by provider name (SC-110), for
/// `tollgate reconcile fetch-evidence`.
///
/// # Errors
/// Invalid configuration, a provider client that cannot be built.
pub fn fetchers(options: &Options) -> Result<crate::app::Fetchers, StartError> {
    let file = FileConfig::load(options.config.as_deref(), &options.env).map_err(start_error)?;
    let settings = file.validate(&options.env).map_err(start_error)?;
    crate::app::fetchers(&settings)
}

/// Connects to Postgres and applies pending migrations, if any: with none pending it changes
/// nothing, so the URL may name an application role (a member of `tollgate_app`, spec/storage.md
/// — Database roles) that cannot change the schema.
///
/// # Errors
/// Unreachable database or a failed migration (the URL is never part of the message).
pub async fn connect(
    url: &Secret,
    max_connections: u32,
    timeouts: SessionTimeouts,
) -> Result<Arc<PgStores>, StartError> {
    let stores = PgStores::connect_with(url.expose(), max_connections, timeouts)
        .await
        .map_err(|e| StartError(format!("cannot connect to the database: {e}")))?;
    stores.migrate_if_pending().await.map_err(|e| {
        StartError(format!(
            "migration failed: {e} (a role without schema rights needs `tollgate migrate` run as the owner first)"
        ))
    })?;
    Ok(Arc::new(stores))
}

/// `tollgate serve`: the HTTP API and the scheduler until `shutdown` fires.
///
/// # Errors
/// Invalid configuration, unreachable database, a port that cannot be bound, a server failure.
pub async fn serve(options: Options, shutdown: CancellationToken) -> Result<(), StartError> {
    let mut file =
        FileConfig::load(options.config.as_deref(), &options.env).map_err(start_error)?;
    let mock = if file.is_embedded() {
        let mock = MockProvider::start(([127, 0, 0, 1], 0).into())
            .await
            .map_err(|e| StartError(format!("cannot start the mock provider: {e}")))?;
        embedded::extend(&mut file, &mock.base_url()).map_err(start_error)?;
        Some(mock)
    } else {
        None
    };
    let settings = file.validate(&options.env).map_err(start_error)?;
    let backend = match &settings.database_url {
        Some(url) => Backend::Postgres(
            connect(url, settings.max_connections, settings.session_timeouts).await?,
        ),
        None => Backend::memory(),
    };
    let keys = Arc::new(
        KeyStore::new(&settings.keys, backend.stores()).with_cache_ms(settings.key_cache_ms),
    );
    if let Some(mock) = &mock {
        notice(
            settings.log_format,
            &format!(
            "tollgate: embedded default — in-memory stores (lost on exit) and the built-in mock provider at {}; profiles: {}",
            mock.base_url(),
            settings.profiles.keys().cloned().collect::<Vec<_>>().join(", ")
        ));
        if !keys.has_grants() {
            let demo = embedded::demo_keys(&keys).await?;
            notice(
                settings.log_format,
                &format!(
                    "tollgate: scope {} — caller key {}, operator key {} (shown once)",
                    embedded::DEMO_SCOPE,
                    demo.caller.expose(),
                    demo.operator.expose()
                ),
            );
        }
    }
    let result = serve_app(&settings, backend, keys, shutdown).await;
    if let Some(mock) = mock {
        mock.shutdown().await;
    }
    result
}

async fn serve_app(
    settings: &Settings,
    backend: Backend,
    keys: Arc<KeyStore>,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let metrics = Arc::new(Metrics::default());
    let app = App::build(settings, backend.clone(), keys.clone(), metrics.clone())?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| StartError(format!("cannot listen on {}: {e}", settings.listen)))?;
    let addr = listener.local_addr().map_err(start_error)?;
    let metrics_listener = match settings.metrics_listen {
        Some(at) => Some(
            tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| StartError(format!("cannot listen on {at} for metrics: {e}")))?,
        ),
        None => None,
    };
    notice(
        settings.log_format,
        &format!(
            "tollgate: listening on http://{addr} (stores: {})",
            backend.name()
        ),
    );
    // The metrics address stops accepting with the main listener; its notice does not say
    // "listening on", which names the main address to whoever reads these lines.
    let scrape = match metrics_listener {
        Some(listener) => {
            let at = listener.local_addr().map_err(start_error)?;
            notice(
                settings.log_format,
                &format!(
                    "tollgate: metrics without a key at http://{at}{}",
                    crate::scrape::METRICS_PATH
                ),
            );
            let run = crate::scrape::run(listener, app.clone(), shutdown.clone().cancelled_owned());
            Some(tokio::spawn(run))
        }
        None => None,
    };
    let fetch = settings.fetch_evidence.then(|| app.fetchers.clone());
    let scheduler = Scheduler::new(backend, settings.scheduler, settings.lease_ms, metrics)
        .with_ledger_audit_interval(settings.ledger_audit_interval_ms)
        .with_evidence_fetch(fetch);
    let stop_scheduler = shutdown.child_token();
    let scheduler = tokio::spawn(scheduler.run(stop_scheduler.clone()));
    // A member leaves its cluster as soon as shutdown begins, so the others stop sending it
    // calls while it drains.
    let membership = match (&app.cluster, &app.backend) {
        (Some(cluster), Backend::Postgres(stores)) => Some(tokio::spawn(
            Arc::clone(cluster).run(Arc::clone(stores), shutdown.child_token()),
        )),
        _ => None,
    };
    let served = crate::run(listener, app, shutdown.cancelled_owned()).await;
    if let Some(scrape) = scrape {
        if let Ok(Err(e)) = scrape.await {
            tracing::warn!(error = %e, "the metrics listener failed");
        }
    }
    stop_scheduler.cancel();
    let _ = scheduler.await;
    if let Some(membership) = membership {
        let _ = membership.await;
    }
    served.map_err(|e| StartError(format!("server failed: {e}")))
}

/// `tollgate scheduler`: the scheduler alone, until `shutdown` fires. It needs a database (the
/// in-memory stores of another process are out of reach).
///
/// # Errors
/// Invalid configuration, no or unreachable database.
pub async fn scheduler(options: Options, shutdown: CancellationToken) -> Result<(), StartError> {
    let file = FileConfig::load(options.config.as_deref(), &options.env).map_err(start_error)?;
    let settings = file.validate(&options.env).map_err(start_error)?;
    let url = settings.database_url.as_ref().ok_or_else(|| {
        StartError(
            "the scheduler alone needs a database: set DATABASE_URL or [database] url".into(),
        )
    })?;
    let backend =
        Backend::Postgres(connect(url, settings.max_connections, settings.session_timeouts).await?);
    notice(LogFormat::Text, "tollgate: scheduler running on postgres");
    let scheduler = Scheduler::new(
        backend,
        settings.scheduler,
        settings.lease_ms,
        Arc::new(Metrics::default()),
    )
    .with_ledger_audit_interval(settings.ledger_audit_interval_ms)
    .with_evidence_fetch(match settings.fetch_evidence {
        true => Some(Arc::new(crate::app::fetchers(&settings)?)),
        false => None,
    });
    scheduler.run(shutdown).await;
    Ok(())
}

/// `tollgate keys create`: a new key for `scope` and `role`, stored as its hash in Postgres
/// (`DATABASE_URL`); returned once.
///
/// # Errors
/// No `DATABASE_URL`, invalid scope or role, store failure.
pub async fn create_key(env: &Env, scope: &str, role: &str) -> Result<Secret, StartError> {
    create_key_expiring(env, scope, role, None, RateLimits::default())
        .await
        .map(|(key, _)| key)
}

async fn key_stores(env: &Env) -> Result<Arc<PgStores>, StartError> {
    let url = env
        .get("DATABASE_URL")
        .filter(|u| !u.trim().is_empty())
        .ok_or_else(|| {
            StartError("DATABASE_URL is not set (keys are stored in Postgres)".into())
        })?;
    connect(&Secret::new(url.clone()), 2, SessionTimeouts::default()).await
}

/// Like [`create_key`], with an optional expiry `expires_in_days` from now; also answers the
/// stored record (never holding the key).
///
/// # Errors
/// A bad scope or role, no `DATABASE_URL`, a store failure.
pub async fn create_key_expiring(
    env: &Env,
    scope: &str,
    role: &str,
    expires_in_days: Option<u32>,
    limits: RateLimits,
) -> Result<(Secret, ApiKeyRecord), StartError> {
    if expires_in_days == Some(0) {
        return Err(StartError("--expires-in-days must be at least 1".into()));
    }
    let now = chrono::Utc::now();
    let expires_at = expires_in_days.map(|d| now + chrono::Duration::days(i64::from(d)));
    create_key_until(env, scope, role, expires_at, limits).await
}

/// Creates a key that stops working at `expires_at` (never when `None`; SC-144); it must lie in
/// the future. Prints nothing; returns the key and the stored record.
///
/// # Errors
/// A bad scope or role, an expiry not in the future, a store failure.
pub async fn create_key_until(
    env: &Env,
    scope: &str,
    role: &str,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    limits: RateLimits,
) -> Result<(Secret, ApiKeyRecord), StartError> {
    let scope = Scope::parse(scope).map_err(start_error)?;
    limits
        .validate()
        .map_err(|e| StartError(format!("--{}", e.replace('_', "-"))))?;
    let role: KeyRole = role.parse().map_err(StartError)?;
    let now = chrono::Utc::now();
    if expires_at.is_some_and(|at| at <= now) {
        return Err(StartError("--expires-at must lie in the future".into()));
    }
    let stores = key_stores(env).await?;
    let key = auth::generate_key();
    let mut record = ApiKeyRecord::new(KeyDigest::of_key(key.expose()), scope, role, now);
    record.expires_at = expires_at;
    record.limits = limits;
    let digest = record.digest;
    stores
        .insert_key(record)
        .await
        .map_err(|e| StartError(format!("cannot store the key: {e}")))?;
    // Read back: what was stored (the database keeps microseconds).
    let stored = stores
        .key_by_digest(&digest)
        .await
        .map_err(|e| StartError(format!("cannot read the key back: {e}")))?
        .ok_or_else(|| StartError("the stored key is not found".into()))?;
    Ok((key, stored))
}

/// The configured grants (`[[keys]]` of the configuration) and the stores of the database the
/// configuration names (`DATABASE_URL` or `[database] url`).
async fn configured_keys(
    options: &Options,
) -> Result<(Vec<crate::config::KeyGrant>, Arc<PgStores>), StartError> {
    let file = FileConfig::load(options.config.as_deref(), &options.env).map_err(start_error)?;
    let grants = file.key_grants().map_err(start_error)?;
    let url = file.database_url().ok_or_else(|| {
        StartError(
            "no database: set DATABASE_URL or [database] url (keys are stored in Postgres)".into(),
        )
    })?;
    let stores = connect(url, 2, SessionTimeouts::default()).await?;
    Ok((grants, stores))
}

/// The keys of `scope` (all when `None`): the configured ones (`[[keys]]`, by id), then the
/// stored ones, oldest first; never a key (SC-161).
///
/// # Errors
/// A bad scope, an invalid configuration, no database, a store failure.
pub async fn list_keys(
    options: &Options,
    scope: Option<&str>,
) -> Result<Vec<crate::service::keys::KeySummary>, StartError> {
    use crate::service::keys::KeySummary;
    let scope = scope.map(Scope::parse).transpose().map_err(start_error)?;
    let (grants, stores) = configured_keys(options).await?;
    let stored = stores
        .list_keys(scope.as_ref())
        .await
        .map_err(|e| StartError(format!("cannot list the keys: {e}")))?;
    let mut configured: Vec<_> = grants
        .iter()
        .filter(|g| scope.as_ref().is_none_or(|s| g.scope == *s))
        .map(|g| KeySummary::configured(&g.digest, &g.scope, g.role, g.limits))
        .collect();
    configured.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(configured
        .into_iter()
        .chain(stored.into_iter().map(KeySummary::from))
        .collect())
}

/// Revokes the stored key whose id (SHA-256 hex) is `id`; a configured key (`[[keys]]`) is
/// refused, naming the configuration (SC-161).
///
/// # Errors
/// Not an id, a configured key, no such key, no database, a store failure.
pub async fn revoke_key(options: &Options, id: &str) -> Result<ApiKeyRecord, StartError> {
    let digest = KeyDigest::from_hex(id)
        .ok_or_else(|| StartError("the key id is 64 lower-case hex digits".into()))?;
    let (grants, stores) = configured_keys(options).await?;
    if grants.iter().any(|g| g.digest == digest) {
        return Err(StartError(
            crate::error::ApiError::KeyInConfig(id.to_string()).to_string(),
        ));
    }
    stores
        .revoke_key(None, &digest, chrono::Utc::now())
        .await
        .map_err(|e| StartError(format!("cannot revoke the key: {e}")))?
        .ok_or_else(|| StartError("no key with that id".into()))
}
