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
use std::collections::HashSet;
use std::sync::Mutex;
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
    pub(crate) config: String,
    pub(crate) digest: String,
}

/// `binding` split into its rest and its config, named by the SHA-256 (hex) of the config's text.
///
/// # Errors
/// [`StoreError::Corrupt`] when the config cannot be written as JSON.
pub(crate) fn split(binding: &Binding) -> StoreResult<SplitBinding> {
    let config = serde_json::to_string(&binding.config)
        .map_err(|_| StoreError::Corrupt("binding config as JSON".into()))?;
    let digest = hex::encode(Sha256::digest(config.as_bytes()));
    Ok(SplitBinding {
        rest: BindingRest {
            session_id: binding.session_id.clone(),
            intent: binding.intent.clone(),
            input_revision: binding.input_revision.clone(),
        },
        config,
        digest,
    })
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

    #[test]
    fn split_keeps_every_field() {
        // H-40: the rest with the config joined back is the binding, field for field.
        let binding = Binding {
            session_id: SessionId::parse("s-1").expect("a session"),
            intent: Intent::parse("summarize").expect("an intent"),
            input_revision: InputRevision::parse("r1").expect("a revision"),
            config: tollgate_core::config::fixtures::text_config(),
        };
        let split = split(&binding).expect("split");
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
}
