//! Developer tools: the mock provider server and the captured-stream parser.

use crate::error::CommandError;
use crate::print;
use std::net::SocketAddr;
use std::path::Path;
use tollgate_mock_provider as mock;
use tollgate_provider::parse::parse_stream as parse;
use tollgate_provider::Protocol;

/// `tollgate mock-provider --listen ADDR`.
pub async fn mock_provider(listen: SocketAddr) -> Result<(), CommandError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| CommandError::Io {
            action: format!("listen on {listen}"),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| CommandError::Io {
        action: format!("listen on {listen}"),
        source,
    })?;
    tracing::warn!(%addr, "mock provider listening");
    print::json(&serde_json::json!({"listening": addr.to_string()}));
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    mock::serve(listener, shutdown)
        .await
        .map_err(|source| CommandError::Io {
            action: "serve the mock provider".into(),
            source,
        })
}

/// `tollgate parse-stream --protocol P FILE`.
pub fn parse_stream(protocol: &str, file: &Path) -> Result<(), CommandError> {
    let protocol: Protocol = protocol.parse().map_err(CommandError::InvalidArgument)?;
    let bytes = std::fs::read(file).map_err(|source| CommandError::Io {
        action: format!("read {}", file.display()),
        source,
    })?;
    let limits = tollgate_core::collector::CollectorLimits {
        max_output_chars: tollgate_core::config::CHARS_MAX,
        max_reasoning_chars: tollgate_core::collector::MAX_REASONING_CHARS_CEILING,
        max_consecutive_reasoning: None,
    };
    print::json(&parse(protocol, &bytes, limits));
    Ok(())
}
