//! The `tollgate` binary: a thin shell over the library crates.

mod commands;
mod demo;
mod out;

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
    /// A scripted tour on the embedded default (or on DATABASE_URL when set).
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
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return out::fail(&format!("cannot start the runtime: {e}")),
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Demo => demo::run(cli.json).await,
            Command::Migrate => commands::migrate().await,
            Command::MockProvider { listen } => commands::mock_provider(listen).await,
            Command::ParseStream { protocol, file } => commands::parse_stream(&protocol, &file),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => out::fail(&e),
    }
}
