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
            for status in ["400", "408", "413"] {
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

/// A path of the document with its parameters filled in.
fn concrete(route: &str) -> String {
    route
        .split('/')
        .map(|segment| {
            if segment.starts_with('{') {
                "00000000-0000-4000-8000-000000000000"
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// SC-160: the router serves its routes from the table only, so a route registered beside it
/// (as the console's once were) fails here; and every route of the table, console included,
/// is documented and answers its method (neither 404 nor 405) with the document's roles.
#[tokio::test]
async fn sc_160_every_route_the_router_serves_is_in_the_document() {
    let source =
        std::fs::read_to_string(repo_file("crates/tollgate-server/src/routes.rs")).unwrap();
    assert_eq!(
        source.matches(".route(").count(),
        1,
        "routes.rs registers a route outside the `table!` macro: put it in the table"
    );
    for other in [
        ".nest(",
        ".merge(",
        ".route_service(",
        ".nest_service(",
        ".fallback_service(",
    ] {
        assert!(
            !source.contains(other),
            "routes.rs serves routes through {other}: put them in the table"
        );
    }

    let doc: Value = serde_json::from_str(&tollgate_server::openapi::document_json()).unwrap();
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_string(), (*p).to_string()))
        .collect();
    assert_eq!(documented, served, "the document and the router differ");
    for console in [
        "/console",
        "/v1/console/session",
        "/v1/console/backlog/{execution_id}/quote",
        "/v1/console/finance/settlements.csv",
    ] {
        assert!(
            doc["paths"][console].is_object(),
            "{console} is not documented"
        );
    }
    // The console's keyed reads declare who may not read them.
    let backlog = &doc["paths"]["/v1/console/backlog"]["get"]["responses"];
    assert!(backlog["403"]["description"]
        .as_str()
        .is_some_and(|d| d.contains("operator")));

    let s = Server::memory().await;
    for (method, route) in ROUTES {
        let url = format!("{}{}", s.base, concrete(route));
        let request = match *method {
            "get" => s.http.get(&url),
            "post" => s.http.post(&url).json(&serde_json::json!({})),
            other => panic!("a {other} route: teach this test its method"),
        };
        let response = request.bearer_auth(&s.operator).send().await.unwrap();
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {route}");
        // A route's own 404 (no such key) names what it did not find; the router's says
        // there is no such route.
        assert!(
            !body.contains("no such route"),
            "{method} {route} is not served: {status} {body}"
        );
    }
    s.stop().await;
}
