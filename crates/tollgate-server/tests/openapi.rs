//! The OpenAPI document (SC-134): served at `/openapi.json`, identical to the checked-in
//! `spec/openapi.json`, covering every route of the router and every error code of the error
//! table. Regenerate the file with `TOLLGATE_UPDATE_OPENAPI=1 cargo test -p tollgate-server
//! --test openapi`.
#![cfg(test)]

mod support;

use reqwest::StatusCode;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use support::Server;
use tollgate_server::routes::ROUTES;

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The codes of spec/service.md's error table.
fn error_table_codes() -> BTreeSet<String> {
    let spec = std::fs::read_to_string(repo_file("spec/service.md")).unwrap();
    let table = spec.split("## Errors").nth(1).unwrap();
    let mut codes = BTreeSet::new();
    for line in table
        .lines()
        .skip_while(|l| !l.starts_with("| code"))
        .skip(2)
    {
        if !line.starts_with('|') {
            break;
        }
        let cell = line.split('|').nth(1).unwrap();
        for code in cell.split(',') {
            codes.insert(code.trim().trim_matches('`').to_string());
        }
    }
    codes
}

#[tokio::test]
async fn sc_134_the_served_document_is_the_checked_in_one_and_covers_every_route() {
    let s = Server::memory().await;
    let response = s
        .http
        .get(format!("{}/openapi.json", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let served = response.text().await.unwrap();
    s.stop().await;

    let path = repo_file("spec/openapi.json");
    if std::env::var_os("TOLLGATE_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &served).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        served == checked_in,
        "spec/openapi.json differs from the served document: regenerate it with \
         TOLLGATE_UPDATE_OPENAPI=1 cargo test -p tollgate-server --test openapi"
    );

    let doc: Value = serde_json::from_str(&served).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for (method, route) in ROUTES {
        let operation = &doc["paths"][route][method];
        assert!(operation.is_object(), "{method} {route} is not documented");
        let responses = operation["responses"].as_object().unwrap();
        assert!(responses.contains_key("200"), "{method} {route}");
        let open = operation["security"] == serde_json::json!([{}]);
        if !open {
            assert!(
                responses.contains_key("401"),
                "{method} {route} does not declare 401"
            );
            assert!(
                responses.contains_key("503"),
                "{method} {route} does not declare 503"
            );
        }
        if operation.get("requestBody").is_some() {
            for status in ["400", "413"] {
                assert!(
                    responses.contains_key(status),
                    "{method} {route} lacks {status}"
                );
            }
        }
    }
    let documented: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p.as_object().unwrap().len())
        .sum();
    assert_eq!(
        documented,
        ROUTES.len(),
        "the document has routes the router lacks"
    );

    // Every code of the error table is declared on some route, with its status.
    let declared: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|p| p.as_object().unwrap().values())
        .flat_map(|op| op["responses"].as_object().unwrap().clone())
        .map(|(status, r)| (status, r["description"].as_str().unwrap_or("").to_string()))
        .collect();
    for code in error_table_codes() {
        // Answered by the router itself for any path, not by a route.
        if code == "method_not_allowed" {
            continue;
        }
        assert!(
            declared
                .iter()
                .any(|(_, d)| d.split([' ', ',', ':']).any(|w| w == code)),
            "error code {code} is declared on no route"
        );
    }
}
