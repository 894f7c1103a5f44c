//! The application state: one runner per profile, built once at startup over shared stores and
//! single-shot provider clients; the key store; the reconciler; the metrics.

use crate::auth::KeyStore;
use crate::backend::Backend;
use crate::config::{ProviderSettings, Settings};
use crate::metrics::Metrics;
use crate::profiles::Profile;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use tokio_util::task::TaskTracker;
use tollgate_core::config::CallConfig;
use tollgate_core::state::CallKind;
use tollgate_provider::fetch::UsageFetcher;
use tollgate_provider::http::{HttpClient, HttpClientConfig};
use tollgate_provider::options::RequestOptions;
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::step::GovernedStepRunner;
use tollgate_runner::structured::StructuredCallRunner;
use tollgate_runner::SystemClock;
use tollgate_runner::{RunnerSettings, SingleCallRunner};
use tollgate_store::ServiceStores;

/// Why the service cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StartError(pub String);

/// The runner of one profile.
pub enum ProfileRunner {
    /// Text and json profiles.
    Single(SingleCallRunner),
    /// Structured profiles.
    Structured(StructuredCallRunner),
    /// Step profiles.
    Step(GovernedStepRunner),
}

/// A loaded profile with its runner.
pub struct Loaded {
    /// Name, retention and call snapshot, as `GET /v1/profiles` lists them.
    pub profile: Profile,
    /// Its runner.
    pub runner: ProfileRunner,
    /// The runners of its snapshot narrowed by requests (SC-211).
    pub narrowed: Narrowed,
}

/// Most narrowed runners a profile keeps; when full, they are dropped and built again as asked.
pub const NARROWED_RUNNERS_MAX: usize = 64;

/// Builds the runner of a profile's snapshot narrowed by a request (SC-211): the same stores,
/// provider connection pool, lease, retries and drive tracker as the profile's runner, over the
/// narrowed snapshot (so the call is bound to it, its hold is fitted to it, and the provider is
/// sent its `max_tokens`, sampling and, when the snapshot says, its user and metadata). The last
/// [`NARROWED_RUNNERS_MAX`] are kept by snapshot, since clients tend to send the same values.
pub struct Narrowed {
    client: HttpClient,
    stores: Arc<dyn ServiceStores>,
    lease_ms: u64,
    settle_retry_ms: u64,
    /// The profile's limits, which a narrowed snapshot keeps.
    limits: tollgate_core::limits::RateLimits,
    drives: TaskTracker,
    kept: Mutex<HashMap<String, Arc<ProfileRunner>>>,
}

impl Narrowed {
    /// The runner of `config`, a narrowing of this profile's snapshot.
    ///
    /// # Errors
    /// A snapshot no runner accepts (the provider's support matrix refuses it), naming why
    /// without a value.
    pub fn runner(&self, config: &CallConfig) -> Result<Arc<ProfileRunner>, StartError> {
        let key = serde_json::to_string(config).map_err(|e| StartError(e.to_string()))?;
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(runner) = kept.get(&key) {
            return Ok(Arc::clone(runner));
        }
        let client = Arc::new(self.client.with_options(RequestOptions::of(config)));
        let mut settings = RunnerSettings::new(config.clone());
        settings.lease_ms = self.lease_ms;
        settings.settle_retry_ms = self.settle_retry_ms;
        settings.drives = self.drives.clone();
        settings.limits = self.limits;
        log_background(&mut settings.background_error);
        let runner = Arc::new(build_runner(Arc::clone(&self.stores), client, settings)?);
        if kept.len() >= NARROWED_RUNNERS_MAX {
            kept.clear();
        }
        kept.insert(key, Arc::clone(&runner));
        Ok(runner)
    }
}

/// Everything a request needs.
pub struct AppState {
    /// Profiles and their runners, by name.
    pub profiles: BTreeMap<String, Loaded>,
    /// The stores.
    pub backend: Backend,
    /// Recovery and reconciliation over the stores (with roots).
    pub reconciler: Reconciler,
    /// API keys.
    pub keys: Arc<KeyStore>,
    /// Counters and gauges served at `GET /metrics`; the scheduler records its passes here too.
    pub metrics: Arc<Metrics>,
    /// Fence lease for operator recovery passes.
    pub lease_ms: u64,
    /// Usage fetchers by provider name (SC-110).
    pub fetchers: Arc<Fetchers>,
    /// Every runner's drives (calls run in their own tasks, outliving callers that left): closed
    /// and awaited on shutdown.
    pub drives: TaskTracker,
    /// The longest wait for [`AppState::drives`] on shutdown.
    pub shutdown_drain_ms: u64,
    /// Concurrency limit and request timeout of the HTTP layer.
    pub limits: crate::limits::Limits,
    /// The console's chain verifications and ledger audits, per scope, served from memory for
    /// a short time after they ran (SC-194).
    pub audit_checks: crate::audit_checks::AuditChecks,
    /// The cluster this instance is a member of (`[cluster] url`, H-39), if any.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
}

/// Longest wait for a fetch's response headers and for each body chunk.
pub const FETCH_READ_TIMEOUT_MS: u64 = 30_000;

/// Usage fetchers by provider name: one single-shot client per configured provider (a protocol
/// that cannot fetch answers `Unsupported`).
pub type Fetchers = BTreeMap<String, Arc<dyn UsageFetcher>>;

/// The usage fetchers of `settings`' providers (SC-110).
///
/// # Errors
/// A provider client that cannot be built.
pub fn fetchers(settings: &Settings) -> Result<Fetchers, StartError> {
    let mut out = Fetchers::new();
    for provider in settings.providers.values() {
        let client = HttpClient::new(HttpClientConfig {
            protocol: provider.protocol,
            base_url: provider.base_url.clone(),
            api_key: provider.api_key.as_ref().map(|k| k.expose().to_string()),
            connect_timeout_ms: provider.connect_timeout_ms,
            read_timeout_ms: FETCH_READ_TIMEOUT_MS,
            max_attempts: 1,
        })
        .map_err(|e| StartError(format!("provider {:?}: {e}", provider.name)))?;
        out.insert(provider.name.clone(), Arc::new(client));
    }
    Ok(out)
}

/// The application, cheap to clone.
#[derive(Clone)]
pub struct App(pub Arc<AppState>);

impl std::ops::Deref for App {
    type Target = AppState;
    fn deref(&self) -> &AppState {
        &self.0
    }
}

/// A reconciler over `backend`'s stores, with roots.
pub fn reconciler(backend: &Backend) -> Reconciler {
    Reconciler::with_roots(backend.stores(), Arc::new(SystemClock))
}

fn client(provider: &ProviderSettings, config: &CallConfig) -> Result<HttpClient, StartError> {
    HttpClient::new(HttpClientConfig {
        protocol: provider.protocol,
        base_url: provider.base_url.clone(),
        api_key: provider.api_key.as_ref().map(|k| k.expose().to_string()),
        connect_timeout_ms: provider.connect_timeout_ms,
        // The run itself is bounded by `run_timeout_ms`; one chunk may not wait longer.
        read_timeout_ms: config.run_timeout_ms,
        max_attempts: 1,
    })
    .map_err(|e| StartError(format!("provider {:?}: {e}", provider.name)))
}

/// Background failures (metadata only: key, stage, error) go to the log.
fn log_background<F: std::fmt::Debug + 'static>(slot: &mut Option<Arc<dyn Fn(F) + Send + Sync>>) {
    *slot = Some(Arc::new(|failure: F| {
        tracing::warn!(?failure, "background failure");
    }));
}

fn build_runner(
    stores: Arc<dyn ServiceStores>,
    client: Arc<HttpClient>,
    settings: RunnerSettings,
) -> Result<ProfileRunner, StartError> {
    let built = match settings.config.kind {
        CallKind::Text | CallKind::Json => {
            SingleCallRunner::new(stores, client, settings).map(ProfileRunner::Single)
        }
        CallKind::Structured => {
            StructuredCallRunner::new(stores, client, settings).map(ProfileRunner::Structured)
        }
        CallKind::Step => {
            GovernedStepRunner::new(stores, client, settings).map(ProfileRunner::Step)
        }
    };
    built.map_err(|e| StartError(e.to_string()))
}

fn loaded(
    profile: &Profile,
    settings: &Settings,
    backend: &Backend,
    drives: &TaskTracker,
) -> Result<Loaded, StartError> {
    let config = &profile.config;
    let provider = settings
        .providers
        .get(&config.provider)
        .ok_or_else(|| StartError(format!("provider {:?} is not declared", config.provider)))?;
    let base = client(provider, config)?;
    let client = Arc::new(base.with_options(RequestOptions::of(config)));
    let mut runner_settings = RunnerSettings::new(config.clone());
    runner_settings.lease_ms = settings.lease_ms;
    runner_settings.settle_retry_ms = settings.settle_retry_ms;
    runner_settings.drives = drives.clone();
    runner_settings.limits = profile.limits;
    log_background(&mut runner_settings.background_error);
    let runner = build_runner(backend.stores(), client, runner_settings)
        .map_err(|e| StartError(format!("profile {:?}: {e}", profile.name)))?;
    Ok(Loaded {
        profile: profile.clone(),
        runner,
        narrowed: Narrowed {
            client: base,
            stores: backend.stores(),
            lease_ms: settings.lease_ms,
            settle_retry_ms: settings.settle_retry_ms,
            limits: profile.limits,
            drives: drives.clone(),
            kept: Mutex::new(HashMap::new()),
        },
    })
}

impl App {
    /// Builds one runner per profile over `backend` (checking each against its client's support
    /// matrix) and the shared state.
    ///
    /// # Errors
    /// A profile no runner accepts, a provider client that cannot be built.
    pub fn build(
        settings: &Settings,
        backend: Backend,
        keys: Arc<KeyStore>,
        metrics: Arc<Metrics>,
    ) -> Result<App, StartError> {
        let mut profiles = BTreeMap::new();
        let drives = TaskTracker::new();
        let backend_is_postgres = matches!(backend, Backend::Postgres(_));
        for profile in settings.profiles.values() {
            let loaded = loaded(profile, settings, &backend, &drives)?;
            profiles.insert(profile.name.clone(), loaded);
        }
        Ok(App(Arc::new(AppState {
            profiles,
            reconciler: reconciler(&backend),
            backend,
            keys,
            metrics,
            lease_ms: settings.lease_ms,
            fetchers: Arc::new(fetchers(settings)?),
            drives,
            shutdown_drain_ms: settings.shutdown_drain_ms,
            limits: settings.limits,
            audit_checks: crate::audit_checks::AuditChecks::default(),
            cluster: match (&settings.cluster, backend_is_postgres) {
                (Some(member), true) => Some(Arc::new(crate::cluster::Cluster::new(
                    member.url.clone(),
                    member.secret.clone(),
                    crate::cluster::config_digest(&settings.profiles),
                ))),
                _ => None,
            },
        })))
    }
}

impl AppState {
    /// Any structured runner (reads and recovery of structured calls depend only on the scope
    /// and the key, not on the profile).
    pub fn structured_runner(&self) -> Option<&StructuredCallRunner> {
        self.profiles.values().find_map(|l| match &l.runner {
            ProfileRunner::Structured(r) => Some(r),
            _ => None,
        })
    }

    /// The step profile whose snapshot is `config` (a root's binding names its snapshot, not
    /// its profile).
    pub fn step_profile_of(&self, config: &CallConfig) -> Option<(&str, &GovernedStepRunner)> {
        self.profiles.values().find_map(|l| match &l.runner {
            ProfileRunner::Step(r) if &l.profile.config == config => {
                Some((l.profile.name.as_str(), r))
            }
            _ => None,
        })
    }

    /// Any step runner (root reads depend only on the stores).
    pub fn any_step_runner(&self) -> Option<&GovernedStepRunner> {
        self.profiles.values().find_map(|l| match &l.runner {
            ProfileRunner::Step(r) => Some(r),
            ProfileRunner::Structured(_) | ProfileRunner::Single(_) => None,
        })
    }
}
