//! The embedded default (spec/service.md — Embedded default): with no database configured,
//! `serve` runs on in-memory stores and the built-in mock provider on loopback, with built-in
//! profiles for the mock models. Configured providers, prices and profiles keep their names; the
//! built-ins only fill the names that are free.

use crate::app::StartError;
use crate::auth::KeyStore;
use crate::config::{ConfigError, Env, FileConfig, ProviderSection};
use crate::secret::Secret;
use tollgate_core::ids::Scope;
use tollgate_store::KeyRole;

/// The built-in provider's name.
pub const PROVIDER: &str = "embedded-mock";
/// The scope of the generated keys.
pub const DEMO_SCOPE: &str = "demo";

/// Built-in prices and profiles; `provider` and the base URL are filled in at start.
const BUILT_IN: &str = r#"
[[prices]]
version = "prices-embedded"
currency = "USD"
[prices.models."mock-echo"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"
[prices.models."mock-json"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"
[prices.models."mock-tool"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"

[[profiles]]
name = "summarize"
kind = "text"
provider = "embedded-mock"
model = "mock-echo"
policy_version = "policy-1"
price_version = "prices-embedded"
output_contract_version = "out-1"
consumer = "demo"
system = "Be brief."
max_tokens = 256
max_input_chars = 20000
max_output_chars = 20000
run_timeout_ms = 30000
result_retention = "30d"

[[profiles]]
name = "extract"
kind = "json"
provider = "embedded-mock"
model = "mock-json"
policy_version = "policy-1"
price_version = "prices-embedded"
output_contract_version = "answer-v1"
consumer = "demo"
max_tokens = 256
max_input_chars = 20000
max_output_chars = 20000
run_timeout_ms = 30000
result_retention = "30d"
output_schema = { type = "object", required = ["answer", "ok"], properties = { answer = { type = "string" }, ok = { type = "boolean" } } }

[[profiles]]
name = "extract-tool"
kind = "structured"
provider = "embedded-mock"
model = "mock-tool"
policy_version = "policy-1"
price_version = "prices-embedded"
output_contract_version = "record-v1"
consumer = "demo"
max_tokens = 256
max_input_chars = 20000
max_output_chars = 20000
run_timeout_ms = 30000
result_retention = "30d"
tool_choice = { type = "tool", name = "extract_record" }
[[profiles.tools]]
name = "extract_record"
description = "Extract the record"
input_schema = { type = "object", required = ["city"], properties = { city = { type = "string" } } }

[[profiles]]
name = "agent-step"
kind = "step"
provider = "embedded-mock"
model = "mock-tool"
policy_version = "policy-1"
price_version = "prices-embedded"
output_contract_version = "step-v1"
consumer = "demo"
max_tokens = 256
max_input_chars = 20000
max_output_chars = 20000
max_consecutive_reasoning = 64
run_timeout_ms = 30000
result_retention = "30d"
[[profiles.tools]]
name = "extract_record"
description = "Extract the record"
input_schema = { type = "object", required = ["city"], properties = { city = { type = "string" } } }
"#;

/// Adds the built-in provider (at `mock_base_url`), prices and profiles to `config`, keeping
/// every configured name.
///
/// # Errors
/// Never in practice (the built-ins are fixed text); reported rather than assumed.
pub fn extend(config: &mut FileConfig, mock_base_url: &str) -> Result<(), ConfigError> {
    let built_in = FileConfig::from_toml(BUILT_IN, &Env::new())?;
    if !config.providers.iter().any(|p| p.name == PROVIDER) {
        config.providers.push(ProviderSection {
            name: PROVIDER.into(),
            kind: "openai-chat".into(),
            base_url: mock_base_url.into(),
            api_key_env: None,
            connect_timeout_ms: None,
        });
    }
    for prices in built_in.prices {
        if !config.prices.iter().any(|p| p.version == prices.version) {
            config.prices.push(prices);
        }
    }
    for profile in built_in.profiles {
        if !config.profiles.iter().any(|p| p.name == profile.name) {
            config.profiles.push(profile);
        }
    }
    Ok(())
}

/// The generated keys of the embedded default.
#[derive(Debug)]
pub struct DemoKeys {
    /// Caller key of scope `demo`.
    pub caller: Secret,
    /// Operator key of scope `demo`.
    pub operator: Secret,
}

/// Creates scope `demo` with one caller and one operator key in `keys` (the stores' keys).
///
/// # Errors
/// The keys cannot be stored.
pub async fn demo_keys(keys: &KeyStore) -> Result<DemoKeys, StartError> {
    let scope = Scope::parse(DEMO_SCOPE).map_err(|e| StartError(e.to_string()))?;
    let stored =
        |e: tollgate_store::StoreError| StartError(format!("cannot store the demo keys: {e}"));
    Ok(DemoKeys {
        caller: keys.create(&scope, KeyRole::Caller).await.map_err(stored)?,
        operator: keys
            .create(&scope, KeyRole::Operator)
            .await
            .map_err(stored)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_profiles_validate() {
        let mut config = FileConfig::default();
        extend(&mut config, "http://127.0.0.1:9").unwrap();
        let settings = config.validate(&Env::new()).unwrap();
        let names: Vec<_> = settings.profiles.keys().cloned().collect();
        assert_eq!(
            names,
            ["agent-step", "extract", "extract-tool", "summarize"]
        );
    }
}
