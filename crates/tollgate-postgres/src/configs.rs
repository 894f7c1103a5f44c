//! A binding's config snapshot stored once (H-40). The claim function writes an execution's
//! binding without its config and names the config by the SHA-256 of its JSON text, which
//! `binding_configs` holds once for every call of a profile: the row the claim inserts, and the
//! settlement's new version of it, are a third of their size. Readers join the config back
//! (`rows::stored_binding`).
//!
//! The server stores a config by its own statement before the first claim that names it, so the
//! claim never waits for another transaction's insert of the same config while it holds its
//! locks. The configs these stores have stored are remembered; the claim functions still refuse a
//! digest that names no stored config (SQLSTATE `TG005`: after a restore or a failover that lost
//! the config's commit), and the claim then stores it and claims again.

use crate::error::DbResultExt;
use crate::PgStores;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use tollgate_core::config::CallConfig;
use tollgate_core::digest::Binding;
use tollgate_core::ids::{InputRevision, Intent, SessionId};
use tollgate_store::{StoreError, StoreResult};

/// SQLSTATE of a claim whose config digest names no stored config.
pub(crate) const CONFIG_MISSING: &str = "TG005";

/// Configs remembered as stored; past this many the set starts again empty (a forgotten config
/// costs one statement that stores nothing, never a wrong row).
pub(crate) const STORED_CONFIGS_MAX: usize = 4_096;

/// Stores a config unless it is there; waits only for a concurrent insert of the same config.
const STORE_CONFIG: &str = "INSERT INTO binding_configs (digest, config) VALUES ($1, $2::json) \
     ON CONFLICT (digest) DO NOTHING";

/// A binding without its config, as the claim function writes it: every field of [`Binding`]
/// but `config` (`split_keeps_every_field` checks that the config joined back gives the binding).
#[derive(Serialize)]
pub(crate) struct BindingRest {
    session_id: SessionId,
    intent: Intent,
    input_revision: InputRevision,
}

/// A binding split for the claim function: the rest, the config's JSON text and its digest.
pub(crate) struct SplitBinding {
    pub(crate) rest: BindingRest,
    pub(crate) config: Arc<str>,
    pub(crate) digest: String,
}

/// Configs whose JSON text and digest [`ConfigTexts`] keeps; past them the oldest is dropped
/// (a config not kept is written and hashed again, the same text and digest).
pub(crate) const CONFIG_TEXTS_MAX: usize = 64;

/// The JSON text and digest of the configs split last. Every call of a profile carries the same
/// config, so its text is written and hashed once instead of once per claim; a config is found
/// by equality, and equal configs write the same text.
#[derive(Debug, Default)]
pub(crate) struct ConfigTexts {
    recent: Mutex<VecDeque<Arc<ConfigText>>>,
}

#[derive(Debug)]
struct ConfigText {
    config: CallConfig,
    text: Arc<str>,
    digest: String,
}

impl ConfigTexts {
    /// `binding` split into its rest and its config, named by the SHA-256 (hex) of the config's
    /// text.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] when the config cannot be written as JSON.
    pub(crate) fn split(&self, binding: &Binding) -> StoreResult<SplitBinding> {
        let kept = self.recent.lock().ok().and_then(|recent| {
            recent
                .iter()
                .find(|kept| kept.config == binding.config)
                .cloned()
        });
        let text = match kept {
            Some(text) => text,
            None => {
                let written = serde_json::to_string(&binding.config)
                    .map_err(|_| StoreError::Corrupt("binding config as JSON".into()))?;
                let text = Arc::new(ConfigText {
                    config: binding.config.clone(),
                    digest: hex::encode(Sha256::digest(written.as_bytes())),
                    text: Arc::from(written),
                });
                if let Ok(mut recent) = self.recent.lock() {
                    recent.push_front(Arc::clone(&text));
                    recent.truncate(CONFIG_TEXTS_MAX);
                }
                text
            }
        };
        Ok(SplitBinding {
            rest: BindingRest {
                session_id: binding.session_id.clone(),
                intent: binding.intent.clone(),
                input_revision: binding.input_revision.clone(),
            },
            config: Arc::clone(&text.text),
            digest: text.digest.clone(),
        })
    }
}

/// The digests of the configs these stores have stored.
#[derive(Debug, Default)]
pub(crate) struct StoredConfigs {
    digests: Mutex<HashSet<String>>,
}

impl StoredConfigs {
    fn contains(&self, digest: &str) -> bool {
        self.digests
            .lock()
            .map(|d| d.contains(digest))
            .unwrap_or(false)
    }

    fn insert(&self, digest: &str) {
        if let Ok(mut digests) = self.digests.lock() {
            if digests.len() >= STORED_CONFIGS_MAX {
                digests.clear();
            }
            digests.insert(digest.to_owned());
        }
    }

    /// Forgets `digest`: the database answered that it is not stored.
    fn forget(&self, digest: &str) {
        if let Ok(mut digests) = self.digests.lock() {
            digests.remove(digest);
        }
    }
}

impl PgStores {
    /// Stores the config `config` (its JSON text) named `digest` unless these stores know it is
    /// stored (`again`: store it even so, after the database answered that it is not).
    pub(crate) async fn store_config(
        &self,
        digest: &str,
        config: &str,
        again: bool,
    ) -> StoreResult<()> {
        if again {
            self.stored_configs.forget(digest);
        } else if self.stored_configs.contains(digest) {
            return Ok(());
        }
        sqlx::query(STORE_CONFIG)
            .bind(digest)
            .bind(config)
            .execute(&self.pool)
            .await
            .store_err()?;
        self.stored_configs.insert(digest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> Binding {
        Binding {
            session_id: SessionId::parse("s-1").expect("a session"),
            intent: Intent::parse("summarize").expect("an intent"),
            input_revision: InputRevision::parse("r1").expect("a revision"),
            config: tollgate_core::config::fixtures::text_config(),
        }
    }

    #[test]
    fn split_keeps_every_field() {
        // H-40: the rest with the config joined back is the binding, field for field.
        let binding = binding();
        let split = ConfigTexts::default().split(&binding).expect("split");
        let mut joined = serde_json::to_value(&split.rest).expect("rest");
        let config: serde_json::Value = serde_json::from_str(&split.config).expect("config");
        joined
            .as_object_mut()
            .expect("an object")
            .insert("config".into(), config);
        assert_eq!(joined, serde_json::to_value(&binding).expect("binding"));
        assert_eq!(
            split.digest,
            hex::encode(Sha256::digest(split.config.as_bytes()))
        );
    }

    #[test]
    fn h_40_a_kept_config_text_is_the_text_of_its_config() {
        // H-40: the texts kept are found by the config alone; another config, however close,
        // is written and hashed anew; past CONFIG_TEXTS_MAX configs the text is written again.
        let texts = ConfigTexts::default();
        let first = binding();
        let mut other_session = binding();
        other_session.session_id = SessionId::parse("s-2").expect("a session");
        let mut other_config = binding();
        other_config.config.policy_version =
            tollgate_core::ids::VersionId::parse("policy-2").expect("a version");
        let a = texts.split(&first).expect("split");
        let b = texts.split(&other_session).expect("split");
        let c = texts.split(&other_config).expect("split");
        assert!(Arc::ptr_eq(&a.config, &b.config), "one config, one text");
        assert_eq!(a.digest, b.digest);
        assert_ne!(a.digest, c.digest);
        for (split, binding) in [(&a, &first), (&c, &other_config)] {
            let written = serde_json::to_string(&binding.config).expect("config");
            assert_eq!(&*split.config, written.as_str());
            assert_eq!(
                split.digest,
                hex::encode(Sha256::digest(written.as_bytes()))
            );
        }
        for n in 0..CONFIG_TEXTS_MAX {
            let mut filler = binding();
            filler.config.price_version =
                tollgate_core::ids::VersionId::parse(format!("price-{n}")).expect("a version");
            texts.split(&filler).expect("split");
        }
        let again = texts.split(&first).expect("split");
        assert!(
            !Arc::ptr_eq(&a.config, &again.config),
            "dropped past the bound"
        );
        assert_eq!(a.digest, again.digest);
    }
}
