//! API keys over HTTP: operators list and revoke the keys of their scope; a revoked or expired
//! key is refused on its next request.
#![cfg(test)]

mod support;

use reqwest::StatusCode;
use serde_json::Value;
use support::Server;
use tollgate_core::ids::Scope;
use tollgate_store::{ApiKeyRecord, KeyDigest, KeyRole};

#[tokio::test]
async fn sc_140_operators_list_and_revoke_keys_and_a_revoked_key_is_refused_at_once() {
    let s = Server::memory().await;
    // A use stamps last_used_at.
    let (status, _, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::OK);

    let (status, list, text) = s.get("/v1/admin/keys", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let keys = list["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "own scope only: {list}");
    assert!(keys.iter().all(|k| k["scope"] == "acme"));
    assert!(
        !text.contains(&s.caller) && !text.contains(&s.operator),
        "never the key"
    );
    let caller_id = KeyDigest::of_key(&s.caller).to_hex();
    let caller = keys.iter().find(|k| k["id"] == caller_id.as_str()).unwrap();
    assert_eq!(caller["role"], "caller");
    assert_eq!(caller["revoked"], false);
    assert!(caller["last_used_at"].is_string(), "{caller}");

    // A caller may not list; another scope's key is not found.
    let (status, _, _) = s.get("/v1/admin/keys", &s.caller).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let stranger = KeyDigest::of_key(&s.stranger).to_hex();
    let (status, _, _) = s
        .post(
            &format!("/v1/admin/keys/{stranger}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = s
        .post("/v1/admin/keys/not-an-id/revoke", &s.operator, &Value::Null)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    let (status, revoked, _) = s
        .post(
            &format!("/v1/admin/keys/{caller_id}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert_eq!(revoked["revoked"], true);
    // No cache: the very next request with the key is refused.
    let (status, body, _) = s.get("/v1/profiles", &s.caller).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _, _) = s.get("/v1/profiles", &s.stranger).await;
    assert_eq!(status, StatusCode::OK, "other keys still work");

    // An expired key is refused too.
    let expired = ApiKeyRecord {
        expires_at: Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
        ..ApiKeyRecord::new(
            KeyDigest::of_key("tg_expired"),
            Scope::parse("acme").unwrap(),
            KeyRole::Caller,
            chrono::Utc::now() - chrono::Duration::days(2),
        )
    };
    s.keys.store().insert_key(expired).await.unwrap();
    let (status, _, _) = s.get("/v1/profiles", "tg_expired").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    s.stop().await;
}

/// SC-161: keys of `[[keys]]` are listed beside the stored ones, marked `config` and not
/// revocable, never as the key; revoking one is a 409 `key_in_config` and the key keeps working.
#[tokio::test]
async fn sc_161_configured_keys_are_listed_and_refuse_revocation() {
    let configured = "tg_configured_operator_key_of_acme";
    let other = "tg_configured_caller_key_of_globex";
    let extra = format!(
        "\n[[keys]]\nscope = \"acme\"\nrole = \"caller\"\nsha256 = \"{}\"\n\
         \n[[keys]]\nscope = \"globex\"\nrole = \"caller\"\nsha256 = \"{}\"\n",
        KeyDigest::of_key(configured).to_hex(),
        KeyDigest::of_key(other).to_hex()
    );
    let s = Server::start_with(tollgate_server::backend::Backend::memory(), &extra).await;
    let id = KeyDigest::of_key(configured).to_hex();

    let (status, list, text) = s.get("/v1/admin/keys", &s.operator).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert!(!text.contains(configured), "never the key");
    let keys = list["keys"].as_array().unwrap();
    assert_eq!(
        keys.len(),
        3,
        "two stored and one configured key of acme: {list}"
    );
    let listed = keys.iter().find(|k| k["id"] == id.as_str()).unwrap();
    assert_eq!(listed["source"], "config", "{listed}");
    assert_eq!(listed["revocable"], false);
    assert_eq!(listed["role"], "caller");
    assert_eq!(listed["scope"], "acme");
    assert_eq!(listed["revoked"], false);
    assert!(listed["created_at"].is_null(), "{listed}");
    let stored: Vec<_> = keys.iter().filter(|k| k["source"] == "stored").collect();
    assert_eq!(stored.len(), 2, "{list}");
    assert!(stored
        .iter()
        .all(|k| k["revocable"] == true && k["created_at"].is_string()));

    let (status, body, _) = s
        .post(
            &format!("/v1/admin/keys/{id}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "key_in_config", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("[[keys]]"));
    let (status, _, _) = s.get("/v1/profiles", configured).await;
    assert_eq!(status, StatusCode::OK, "the configured key still works");

    // Another scope's configured key is neither listed nor revocable here: 404.
    let other_id = KeyDigest::of_key(other).to_hex();
    assert!(!text.contains(&other_id));
    let (status, _, _) = s
        .post(
            &format!("/v1/admin/keys/{other_id}/revoke"),
            &s.operator,
            &Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    s.stop().await;
}
