//! The `tollgate` binary: a thin shell over the library crates.

mod check;
mod database;
#[cfg(feature = "demo")]
mod demo;
mod dev_tools;
mod error;
mod operator;
mod print;
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// tollgate: governed LLM calls — sent at most once, charged exactly once, capped, recoverable.
#[derive(Parser)]
#[command(name = "tollgate", version)]
struct Cli {
    /// Print machine-readable JSON on stdout.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// HTTP API + scheduler (the embedded default without a database).
    Serve {
        /// Configuration file (default: tollgate.toml when present).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
    /// The scheduler alone (no HTTP); needs a database.
    Scheduler {
        /// Configuration file (default: tollgate.toml when present).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
    /// Check a deployment before going live: configuration, provider keys, the database, its
    /// migrations, the server's role, durability, standby, connections and clock; one row per
    /// check (ok, warn or FAIL), exit 1 when any FAILs.
    Check {
        /// Configuration file (default: tollgate.toml when present).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
    /// API keys.
    Keys {
        #[command(subcommand)]
        what: Keys,
    },
    /// A scripted tour on the embedded default (or on DATABASE_URL when set); in builds with the
    /// cargo feature `demo` (on by default).
    Demo,
    /// Apply migrations to DATABASE_URL (idempotent).
    Migrate,
    /// Run the mock provider server.
    MockProvider {
        /// Address to listen on, e.g. 127.0.0.1:9000.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: std::net::SocketAddr,
    },
    /// Run a captured SSE stream through the adapter and step collector; print one JSON object.
    ParseStream {
        /// openai-chat, openai-responses or anthropic.
        #[arg(long)]
        protocol: String,
        /// The captured stream.
        file: std::path::PathBuf,
    },
    /// Recover one execution whose fence expired (SC-40); never loads input, never sends.
    Recover {
        /// Scope (tenant) the execution was claimed in.
        #[arg(long)]
        scope: String,
        /// Operation key.
        #[arg(long)]
        key: String,
        /// Lease of the recovery fence.
        #[arg(long, default_value_t = 30_000)]
        lease_ms: u64,
    },
    /// Reconcile expired executions or usage evidence of a scope.
    Reconcile {
        #[command(subcommand)]
        what: Reconcile,
    },
    /// The read view plus journal, receipts and audit trail (no content unless asked).
    Inspect {
        /// Scope (tenant) the execution was claimed in.
        #[arg(long)]
        scope: String,
        /// Operation key.
        #[arg(long)]
        key: String,
        /// Include output, step and system prompt.
        #[arg(long)]
        with_content: bool,
    },
    /// Audit log commands.
    Audit {
        #[command(subcommand)]
        what: Audit,
    },
    /// Finance commands.
    Finance {
        #[command(subcommand)]
        what: Finance,
    },
}

#[derive(Subcommand)]
enum Reconcile {
    /// Finish executions whose fences expired; prints {"roots", "executions"}.
    Expired {
        /// Scope (tenant) whose expired executions and roots to finish.
        #[arg(long)]
        scope: String,
        /// At most this many (≤ 100).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Lease of each recovery fence.
        #[arg(long, default_value_t = 30_000)]
        lease_ms: u64,
    },
    /// Acknowledge exact usage evidence; prints {"scanned", "acknowledged", "cursor"}.
    Usage {
        /// Scope (tenant) whose unacknowledged usage evidence to scan.
        #[arg(long)]
        scope: String,
        /// Page size (default 50, at most 100).
        #[arg(long)]
        limit: Option<u32>,
        /// Continue after this cursor.
        #[arg(long)]
        after: Option<i64>,
    },
    /// Executions awaiting an operator with age, hold, provider reference, reason and evidence
    /// status; prints {"backlog": [...]}.
    Backlog {
        /// Scope (default: every scope with work).
        #[arg(long)]
        scope: Option<String>,
        /// Executions listed per scope at most (default 100, at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Fetch usage of finished responses from the provider into the inbox as late evidence
    /// (never settles); prints {"scanned", "stored", "duplicate", "skipped"}.
    FetchEvidence {
        /// Scope (default: every scope with work).
        #[arg(long)]
        scope: Option<String>,
        /// Executions looked at per scope at most (default 50, at most 100).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Configuration file naming the providers (default: tollgate.toml when present).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
    /// Settle executions awaiting an operator from their stored exact evidence; prints
    /// {"dry_run", "items"}.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["all", "key"])))]
    Resolve {
        /// Settle from stored evidence (the only mode).
        #[arg(long, required = true)]
        from_evidence: bool,
        /// Scope (tenant) of the executions.
        #[arg(long)]
        scope: String,
        /// Every execution awaiting an operator (oldest first, at most --limit).
        #[arg(long)]
        all: bool,
        /// An operation key (repeatable).
        #[arg(long)]
        key: Vec<String>,
        /// List what would be charged; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// With --all: executions looked at most (default 100, at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

#[derive(Subcommand)]
enum Keys {
    /// Create a key (stored as its hash in DATABASE_URL); prints it once.
    Create {
        /// Scope the key acts in.
        #[arg(long)]
        scope: String,
        /// caller, operator or finance.
        #[arg(long)]
        role: String,
        /// The key stops working this many days from now (default: never).
        #[arg(long, conflicts_with = "expires_at")]
        expires_in_days: Option<u32>,
        /// The key stops working at this instant (RFC 3339, e.g. 2027-01-01T00:00:00Z; in the
        /// future).
        #[arg(long)]
        expires_at: Option<String>,
        /// Calls made with the key admitted per minute window (default: no limit).
        #[arg(long)]
        requests_per_minute: Option<u64>,
        /// Input tokens (fitted worst case, then settled) per minute window.
        #[arg(long)]
        input_tokens_per_minute: Option<u64>,
        /// Output tokens (`max_tokens`, then settled) per minute window.
        #[arg(long)]
        output_tokens_per_minute: Option<u64>,
        /// Calls made with the key in flight at once.
        #[arg(long)]
        in_flight: Option<u64>,
    },
    /// List the keys, configured (`[[keys]]`) and stored (id, scope, role, source, revocable,
    /// created, last used, expiry, revoked; never a key).
    List {
        /// Only this scope's keys.
        #[arg(long)]
        scope: Option<String>,
        /// Configuration file (default: tollgate.toml when present).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
    /// Revoke a stored key by its id (its SHA-256 in hex, as `keys list` shows it); a key of
    /// `[[keys]]` is refused (remove it from the configuration instead).
    Revoke {
        /// The key's id.
        id: String,
        /// Configuration file (default: tollgate.toml when present).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
}

#[derive(Subcommand)]
enum Audit {
    /// Check a scope's audit hash chain; exit 1 and the first bad row if broken.
    Verify {
        /// Scope (tenant) whose hash chain to check; each scope has its own.
        #[arg(long)]
        scope: String,
    },
    /// Check that spend, holds, settlements, evidence and roots agree, from the stored rows;
    /// exit 1 naming the first violated invariant.
    Ledger {
        /// Scope (default: every scope).
        #[arg(long)]
        scope: Option<String>,
        /// Violations listed at most (default 100, at most 1000; all are counted).
        #[arg(long)]
        limit: Option<u32>,
    },
}

#[derive(Subcommand)]
enum Finance {
    /// Settlement rows with from ≤ accounting day ≤ to.
    Export {
        /// First day (YYYY-MM-DD).
        #[arg(long)]
        from: chrono::NaiveDate,
        /// Last day (YYYY-MM-DD).
        #[arg(long)]
        to: chrono::NaiveDate,
        /// csv or json.
        #[arg(long, default_value = "csv")]
        format: String,
    },
}

/// The log on stderr, filtered by `RUST_LOG` (default `warn`): text, coloured only when stderr
/// is a terminal; `serve` writes one JSON object per line instead when `TOLLGATE_LOG_FORMAT` or
/// its configuration's `[log] format` says `json` (spec/service.md — Logs).
fn init_logging(command: &Command) {
    use std::io::IsTerminal;
    use tollgate_server::config::LogFormat;
    let format = match command {
        Command::Serve { config } => tollgate_server::start::log_format(
            &tollgate_server::start::Options::from_process(config.clone()),
        ),
        _ => LogFormat::Text,
    };
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        );
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        // The event's fields at the top level; the fields of its spans (the request's id, the
        // call's scope and operation key) in `spans`, outermost first.
        LogFormat::Json => logs
            .json()
            .with_ansi(false)
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .init(),
    }
}

/// jemalloc, with the options `.cargo/config.toml` builds into it: a call costs less in
/// allocation than with glibc's malloc, and a burst of calls in flight leaves no freed pages
/// resident behind it (docs/performance-log.md, 2026-12-06).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.command);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return print::fail(&format!("cannot start the runtime: {e}")),
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve { config } => serve::serve(config).await,
            Command::Scheduler { config } => serve::scheduler(config).await,
            Command::Check { config } => check::run(config, cli.json).await,
            Command::Keys {
                what:
                    Keys::Create {
                        scope,
                        role,
                        expires_in_days,
                        expires_at,
                        requests_per_minute,
                        input_tokens_per_minute,
                        output_tokens_per_minute,
                        in_flight,
                    },
            } => {
                let limits = tollgate_core::limits::RateLimits {
                    requests_per_minute,
                    input_tokens_per_minute,
                    output_tokens_per_minute,
                    in_flight,
                };
                serve::keys_create(
                    &scope,
                    &role,
                    (expires_in_days, expires_at.as_deref()),
                    limits,
                    cli.json,
                )
                .await
            }
            Command::Keys {
                what: Keys::List { scope, config },
            } => serve::keys_list(scope.as_deref(), config, cli.json).await,
            Command::Keys {
                what: Keys::Revoke { id, config },
            } => serve::keys_revoke(&id, config, cli.json).await,
            #[cfg(feature = "demo")]
            Command::Demo => demo::run(cli.json).await,
            // A build without the demo (`--no-default-features`, the deployed build) names what
            // it lacks instead of not knowing the command.
            #[cfg(not(feature = "demo"))]
            Command::Demo => Err(error::CommandError::InvalidArgument(
                "this build has no demo: it was built without the cargo feature `demo` (on by \
                 default; `cargo run -p tollgate -- demo` runs it)"
                    .into(),
            )),
            Command::Migrate => database::migrate().await,
            Command::MockProvider { listen } => dev_tools::mock_provider(listen).await,
            Command::ParseStream { protocol, file } => dev_tools::parse_stream(&protocol, &file),
            Command::Recover {
                scope,
                key,
                lease_ms,
            } => operator::recover(&scope, &key, lease_ms).await,
            Command::Reconcile {
                what:
                    Reconcile::Expired {
                        scope,
                        limit,
                        lease_ms,
                    },
            } => operator::reconcile_expired(&scope, limit, lease_ms).await,
            Command::Reconcile {
                what:
                    Reconcile::Usage {
                        scope,
                        limit,
                        after,
                    },
            } => operator::reconcile_usage(&scope, limit, after).await,
            Command::Reconcile {
                what: Reconcile::Backlog { scope, limit },
            } => operator::backlog(scope.as_deref(), limit).await,
            Command::Reconcile {
                what:
                    Reconcile::FetchEvidence {
                        scope,
                        limit,
                        config,
                    },
            } => operator::fetch_evidence(scope.as_deref(), limit, config).await,
            Command::Reconcile {
                what:
                    Reconcile::Resolve {
                        from_evidence: _,
                        scope,
                        all,
                        key,
                        dry_run,
                        limit,
                    },
            } => operator::resolve_from_evidence(&scope, all, &key, dry_run, limit).await,
            Command::Inspect {
                scope,
                key,
                with_content,
            } => operator::inspect(&scope, &key, with_content).await,
            Command::Audit {
                what: Audit::Verify { scope },
            } => operator::audit_verify(&scope).await,
            Command::Audit {
                what: Audit::Ledger { scope, limit },
            } => operator::audit_ledger(scope.as_deref(), limit, cli.json).await,
            Command::Finance {
                what: Finance::Export { from, to, format },
            } => operator::finance_export(from, to, &format).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => print::fail(&e.to_string()),
    }
}
