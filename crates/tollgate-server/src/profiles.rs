//! Call profiles: host-side, immutable snapshots callers reference by name (spec/service.md —
//! Profiles). Each `[[profiles]]` section becomes a checked [`CallConfig`] with the model's
//! prices copied from its price version, so a later price table cannot change a loaded profile.

use crate::sections::{CapsSection, ConfigError, PriceSection, ProfileSection};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use tollgate_core::caps::Caps;
use tollgate_core::config::{CallConfig, OutputContract};
use tollgate_core::ids::{ConsumerId, VersionId};
use tollgate_core::limits::RateLimits;
use tollgate_core::money::{Currency, Money, PriceTable, TokenPrices};
use tollgate_core::state::CallKind;

/// Default `max_tokens`.
pub const MAX_TOKENS_DEFAULT: u32 = 1_024;
/// Default `max_input_chars` and `max_output_chars`.
pub const CHARS_DEFAULT: u64 = 100_000;
/// Default `max_reasoning_chars`.
pub const REASONING_CHARS_DEFAULT: u64 = 100_000;
/// Default `run_timeout_ms`.
pub const RUN_TIMEOUT_MS_DEFAULT: u64 = 60_000;
/// Default `result_retention`.
pub const RESULT_RETENTION_DEFAULT: &str = "30d";
/// Default `output_contract_version`.
pub const OUTPUT_CONTRACT_VERSION_DEFAULT: &str = "none";

/// One loaded profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// The name callers use.
    pub name: String,
    /// The retention as written (`30d`).
    pub result_retention: String,
    /// The consumer's rate and concurrency limits under this profile (SC-220).
    #[serde(skip_serializing_if = "RateLimits::is_empty")]
    pub limits: RateLimits,
    /// The snapshot every call of this profile is bound to.
    #[serde(flatten)]
    pub config: CallConfig,
}

fn err(message: impl Into<String>) -> ConfigError {
    ConfigError(message.into())
}

/// Parses a duration like `90s`, `15m`, `12h` or `30d` into seconds.
///
/// # Errors
/// No unit, an unknown unit, zero, or overflow.
pub fn parse_duration_secs(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit (s, m, h or d)"))?;
    let (digits, unit) = text.split_at(split);
    let count: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a number with a unit"))?;
    let per_unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{text:?} has an unknown unit (s, m, h or d)")),
    };
    match count.checked_mul(per_unit) {
        Some(0) => Err(format!("{text:?} must be greater than zero")),
        Some(secs) => Ok(secs),
        None => Err(format!("{text:?} is too long")),
    }
}

fn price_tables(sections: &[PriceSection]) -> Result<BTreeMap<String, PriceTable>, ConfigError> {
    let mut tables = BTreeMap::new();
    for section in sections {
        let at = |e: &dyn std::fmt::Display| err(format!("prices {:?}: {e}", section.version));
        let currency = Currency::parse(&section.currency).map_err(|e| at(&e))?;
        let mut models = BTreeMap::new();
        for (model, p) in &section.models {
            let m = |text: &str, field: &'static str| Money::parse(text, field);
            let prices = TokenPrices {
                input: m(&p.input, "input price").map_err(|e| at(&e))?,
                output: m(&p.output, "output price").map_err(|e| at(&e))?,
                cache_read: m(&p.cache_read, "cache_read price").map_err(|e| at(&e))?,
                cache_write: m(&p.cache_write, "cache_write price").map_err(|e| at(&e))?,
                reasoning: m(&p.reasoning, "reasoning price").map_err(|e| at(&e))?,
            };
            models.insert(model.clone(), prices);
        }
        let table = PriceTable {
            version: section.version.clone(),
            currency,
            models,
        };
        table.validate().map_err(|e| at(&e))?;
        if tables.insert(section.version.clone(), table).is_some() {
            return Err(err(format!(
                "prices: version {:?} is declared twice",
                section.version
            )));
        }
    }
    Ok(tables)
}

fn caps(section: &CapsSection) -> Result<Caps, String> {
    let m = |value: &Option<String>, field: &'static str| {
        value
            .as_deref()
            .map(|text| Money::parse(text, field))
            .transpose()
            .map_err(|e| e.to_string())
    };
    Ok(Caps {
        session_warn: m(&section.session_warn, "caps.session_warn")?,
        session_block: m(&section.session_block, "caps.session_block")?,
        daily_warn: m(&section.daily_warn, "caps.daily_warn")?,
        daily_block: m(&section.daily_block, "caps.daily_block")?,
        root_warn: m(&section.root_warn, "caps.root_warn")?,
        root_block: m(&section.root_block, "caps.root_block")?,
    })
}

fn version(text: &str) -> Result<VersionId, String> {
    VersionId::parse(text).map_err(|e| e.to_string())
}

fn snapshot(
    p: &ProfileSection,
    tables: &BTreeMap<String, PriceTable>,
    providers: &BTreeSet<&str>,
) -> Result<Profile, String> {
    let kind: CallKind = p
        .kind
        .parse()
        .map_err(|_| format!("kind {:?} is not text, json, structured or step", p.kind))?;
    if !providers.contains(p.provider.as_str()) {
        return Err(format!("provider {:?} is not declared", p.provider));
    }
    let table = tables
        .get(&p.price_version)
        .ok_or_else(|| format!("price_version {:?} is not declared", p.price_version))?;
    let prices = table.prices(&p.model).map_err(|e| e.to_string())?.clone();
    let retention = p
        .result_retention
        .clone()
        .unwrap_or_else(|| RESULT_RETENTION_DEFAULT.to_string());
    let output = p.output_schema.clone().map(|schema| OutputContract {
        name: p.name.clone(),
        schema,
    });
    let config = CallConfig {
        kind,
        provider: p.provider.clone(),
        model: p.model.clone(),
        policy_version: version(&p.policy_version)?,
        price_version: version(&p.price_version)?,
        output_contract_version: version(
            p.output_contract_version
                .as_deref()
                .unwrap_or(OUTPUT_CONTRACT_VERSION_DEFAULT),
        )?,
        consumer: ConsumerId::parse(p.consumer.clone()).map_err(|e| e.to_string())?,
        currency: table.currency.clone(),
        prices,
        caps: caps(&p.caps)?,
        system: p.system.clone(),
        max_tokens: p.max_tokens.unwrap_or(MAX_TOKENS_DEFAULT),
        max_input_chars: p.max_input_chars.unwrap_or(CHARS_DEFAULT),
        max_output_chars: p.max_output_chars.unwrap_or(CHARS_DEFAULT),
        max_request_chars: p.max_request_chars,
        max_reasoning_chars: p.max_reasoning_chars.unwrap_or(REASONING_CHARS_DEFAULT),
        max_consecutive_reasoning: p.max_consecutive_reasoning,
        run_timeout_ms: p.run_timeout_ms.unwrap_or(RUN_TIMEOUT_MS_DEFAULT),
        result_retention_secs: parse_duration_secs(&retention)
            .map_err(|e| format!("result_retention {e}"))?,
        cache: p.cache,
        temperature: p.temperature,
        output,
        tools: p.tools.clone(),
        tool_choice: p.tool_choice.clone(),
        context_window_tokens: p.context_window_tokens,
        top_p: p.top_p,
        stop: p.stop.clone(),
        seed: p.seed,
        user: None,
        metadata: BTreeMap::new(),
        request_fields: p.request_fields,
    };
    config.validate().map_err(|e| e.to_string())?;
    if kind == CallKind::Structured && config.tools.is_empty() {
        return Err("structured profiles need tools".into());
    }
    p.limits.validate().map_err(|e| format!("limits: {e}"))?;
    Ok(Profile {
        name: p.name.clone(),
        result_retention: retention,
        limits: p.limits,
        config,
    })
}

/// Builds every profile; `providers` are the names of the declared providers.
///
/// # Errors
/// The first invalid profile or price table, naming it.
pub fn build(
    sections: &[ProfileSection],
    prices: &[PriceSection],
    providers: &BTreeSet<&str>,
) -> Result<BTreeMap<String, Profile>, ConfigError> {
    let tables = price_tables(prices)?;
    let mut profiles = BTreeMap::new();
    for section in sections {
        if section.name.is_empty() {
            return Err(err("profiles: a profile has an empty name"));
        }
        let profile = snapshot(section, &tables, providers)
            .map_err(|e| err(format!("profiles {:?}: {e}", section.name)))?;
        if profiles.insert(section.name.clone(), profile).is_some() {
            return Err(err(format!(
                "profiles: {:?} is declared twice",
                section.name
            )));
        }
    }
    Ok(profiles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use tollgate_core::config::RequestFields;

    /// The price and profile sections of a file (the rest of the file is not read here).
    #[derive(Deserialize)]
    struct Sections {
        #[serde(default)]
        prices: Vec<PriceSection>,
        #[serde(default)]
        profiles: Vec<ProfileSection>,
    }

    const BASE: &str = r#"
[[prices]]
version = "prices-1"
currency = "USD"
[prices.models."mock-echo"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"
"#;

    fn load(profile: &str) -> Result<BTreeMap<String, Profile>, ConfigError> {
        let text = format!("{BASE}\n{profile}");
        let sections: Sections = toml::from_str(&text).map_err(|e| err(e.message()))?;
        build(
            &sections.profiles,
            &sections.prices,
            &BTreeSet::from(["mock"]),
        )
    }

    const SUMMARIZE: &str = r#"
[[profiles]]
name = "summarize"
kind = "text"
provider = "mock"
model = "mock-echo"
policy_version = "policy-1"
price_version = "prices-1"
consumer = "team-a"
temperature = 0.2
result_retention = "12h"
[profiles.caps]
daily_block = "10.00"
"#;

    #[test]
    fn sc_1_a_profile_snapshots_its_prices_and_limits() {
        let profiles = load(SUMMARIZE).unwrap();
        let p = &profiles["summarize"];
        assert_eq!(p.config.prices.output.to_string(), "2");
        assert_eq!(p.config.result_retention_secs, 12 * 3600);
        assert_eq!(
            p.config.temperature.map(|t| t.to_string()).as_deref(),
            Some("0.2")
        );
        assert!(p.config.caps.daily_block.is_some());
        assert_eq!(p.config.max_tokens, MAX_TOKENS_DEFAULT);
    }

    #[test]
    fn unknown_price_version_or_model_is_a_clear_error() {
        let e = load(&SUMMARIZE.replace("price_version = \"prices-1\"", "price_version = \"p-9\""))
            .unwrap_err();
        assert!(e.0.contains("price_version \"p-9\""), "{e}");
        let e = load(&SUMMARIZE.replace("model = \"mock-echo\"", "model = \"gpt-x\"")).unwrap_err();
        assert!(e.0.contains("no prices for model gpt-x"), "{e}");
    }

    #[test]
    fn sc_8_tool_choice_on_a_text_profile_is_rejected() {
        let text = SUMMARIZE.replace(
            "[profiles.caps]",
            "tool_choice = { type = \"auto\" }\n[profiles.caps]",
        );
        let e = load(&text).unwrap_err();
        assert!(e.0.contains("tool_choice"), "{e}");
    }

    #[test]
    fn sc_211_sampling_and_request_fields_are_profile_settings() {
        let p = &load(SUMMARIZE).unwrap()["summarize"];
        assert_eq!(p.config.request_fields, RequestFields::default());
        assert!(p.config.request_fields.sampling && !p.config.request_fields.send_user);
        let text = SUMMARIZE.replace(
            "[profiles.caps]",
            "top_p = 0.9\nstop = [\"END\"]\nseed = 7\n\
             [profiles.request_fields]\nsampling = false\nsend_user = true\n[profiles.caps]",
        );
        let p = &load(&text).unwrap()["summarize"];
        assert_eq!(
            p.config.top_p.map(|t| t.to_string()).as_deref(),
            Some("0.9")
        );
        assert_eq!(p.config.stop, ["END"]);
        assert_eq!(p.config.seed, Some(7));
        assert!(!p.config.request_fields.sampling && p.config.request_fields.send_user);
        let listed = serde_json::to_value(p).unwrap();
        assert_eq!(listed["request_fields"]["send_user"], true);
        let bad = SUMMARIZE.replace(
            "[profiles.caps]",
            "[profiles.request_fields]\nsend_everything = true\n[profiles.caps]",
        );
        assert!(load(&bad).is_err());
        let many = SUMMARIZE.replace(
            "[profiles.caps]",
            "stop = [\"a\", \"b\", \"c\", \"d\", \"e\"]\n[profiles.caps]",
        );
        assert!(load(&many).unwrap_err().0.contains("stop"));
    }

    #[test]
    fn sc_220_a_profile_s_limits_are_read_checked_and_listed() {
        assert!(load(SUMMARIZE).unwrap()["summarize"].limits.is_empty());
        let text =
            format!("{SUMMARIZE}[profiles.limits]\nrequests_per_minute = 600\nin_flight = 8\n");
        let p = &load(&text).unwrap()["summarize"];
        assert_eq!(p.limits.requests_per_minute, Some(600));
        assert_eq!(p.limits.in_flight, Some(8));
        assert_eq!(p.limits.input_tokens_per_minute, None);
        let listed = serde_json::to_value(p).unwrap();
        assert_eq!(listed["limits"]["requests_per_minute"], 600);
        let zero = format!("{SUMMARIZE}[profiles.limits]\nin_flight = 0\n");
        let e = load(&zero).unwrap_err();
        assert!(e.0.contains("limits: in_flight must be between 1"), "{e}");
        let unknown = format!("{SUMMARIZE}[profiles.limits]\nrequests_per_hour = 1\n");
        assert!(load(&unknown).unwrap_err().0.contains("requests_per_hour"));
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration_secs("30d"), Ok(30 * 86_400));
        assert_eq!(parse_duration_secs("90s"), Ok(90));
        assert!(parse_duration_secs("30").is_err());
        assert!(parse_duration_secs("0h").is_err());
        assert!(parse_duration_secs("3w").is_err());
    }
}
