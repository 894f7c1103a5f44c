//! Authentication as a layer (spec/service.md — Limits and request ids): on every route but the
//! public ones the key is read from the `Authorization` header alone (on the Anthropic Messages
//! door, from it or `x-api-key`), before any of the body is read and before a concurrency permit
//! is taken, so a client without a valid key holds nothing of the server; and the order of the
//! layers around the router.

use crate::auth::{KeyStore, Principal, API_KEY_HEADER};
use crate::error::ApiError;
use crate::limits::{is_public, read_body, span, unread, Limits, REQUEST_ID};
use crate::service::anthropic;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::response::Response;
use axum::Router;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

#[derive(Clone)]
struct Gate {
    keys: Arc<KeyStore>,
    limits: Limits,
    /// The `(method, path)` pairs the router serves.
    routes: &'static [(&'static str, &'static str)],
}

/// Authenticates every request on a path that needs a key from its headers alone
/// (`Authorization`, and `x-api-key` on the Anthropic Messages door): a missing, malformed or
/// unknown key is answered before the body is read and before a concurrency permit is taken.
/// The principal goes into the request's extensions, where the [`Principal`] extractor takes it.
async fn authenticated(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    if is_public(request.uri().path(), &gate.limits) {
        return next.run(request).await;
    }
    if !method_served(&request, gate.routes) {
        // A known path with another method is 405 for everyone, as an unknown path is 404.
        let refused = ApiError::NoRoute(axum::http::StatusCode::METHOD_NOT_ALLOWED);
        return unread(refusal(request.uri().path(), &refused));
    }
    let headers = request.headers();
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok());
    // The Anthropic Messages door also takes the bare key in `x-api-key`, as Anthropic's API
    // does; an unreadable value is a malformed key.
    let api_key = anthropic::PATHS
        .contains(&request.uri().path())
        .then(|| headers.get(API_KEY_HEADER))
        .flatten()
        .map(|h| h.to_str().unwrap_or_default());
    match gate.keys.authenticate_either(header, api_key).await {
        Ok(principal) => {
            request.extensions_mut().insert::<Principal>(principal);
            next.run(request).await
        }
        Err(e) => unread(refusal(request.uri().path(), &e)),
    }
}

#[derive(Clone)]
struct Bounded {
    permits: Arc<Semaphore>,
    limits: Limits,
}

async fn bounded(State(bounded): State<Bounded>, request: Request, next: Next) -> Response {
    let Bounded { permits, limits } = bounded;
    let path = request.uri().path().to_string();
    let Ok(permit) = permits.try_acquire_owned() else {
        tracing::warn!("over the concurrency limit");
        return unread(refusal(&path, &ApiError::Overloaded));
    };
    let timeout_ms = limits.request_timeout_ms;
    let within = async {
        let request = match read_body(request, limits.body_read_timeout_ms).await {
            Ok(request) => request,
            Err(e) => return unread(refusal(&path, &e)),
        };
        next.run(request).await
    };
    let response = match tokio::time::timeout(Duration::from_millis(timeout_ms), within).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(timeout_ms, "request timed out");
            refusal(&path, &ApiError::RequestTimeout(timeout_ms))
        }
    };
    holding(response, permit)
}

/// `response`, keeping `permit` until its body ends when that body is a stream of server-sent
/// events: a live stream outlives its handler (SC-213), and its call counts against the
/// concurrency limit until the stream is over. Any other body is complete when the handler
/// returns, and the permit goes back then.
fn holding(response: Response, permit: tokio::sync::OwnedSemaphorePermit) -> Response {
    let streaming = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        return response;
    }
    let (parts, body) = response.into_parts();
    let chunks = futures::StreamExt::map(body.into_data_stream(), move |chunk| {
        let _held = &permit;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(chunks))
}

/// Paths whose errors are in OpenAI's shape (spec/service.md — OpenAI-compatible front door).
const OPENAI_SHAPED: &[&str] = &["/v1/chat/completions"];

/// `error` as the answer of a request to `path`: in OpenAI's shape on the front door, in
/// Anthropic's on the Messages door, in tollgate's elsewhere.
fn refusal(path: &str, error: &ApiError) -> Response {
    if anthropic::PATHS.contains(&path) {
        return anthropic::error_response(error);
    }
    if OPENAI_SHAPED.contains(&path) {
        let body = crate::service::openai::error_body(error);
        (error.status_code(), axum::Json(body)).into_response()
    } else {
        error.clone().into_response()
    }
}

/// Whether the route `request` matched serves its method (the `ROUTES` table); a request without a
/// matched route (a router built without the table, in tests) is taken as served.
fn method_served(request: &Request, routes: &[(&str, &str)]) -> bool {
    let Some(matched) = request.extensions().get::<axum::extract::MatchedPath>() else {
        return true;
    };
    let pattern = matched.as_str();
    if !routes.iter().any(|(_, p)| *p == pattern) {
        return true;
    }
    let method = request.method().as_str();
    routes
        .iter()
        .any(|(m, p)| *p == pattern && m.eq_ignore_ascii_case(method))
}

/// Whether `path` is the console's (its page, assets and reads).
fn console_path(path: &str) -> bool {
    path == "/console" || path.starts_with("/console/") || path.starts_with("/v1/console/")
}

/// The console's security headers on every answer of a console path, refusals included: a 401,
/// 403, 404 or 503 of the console is as much a console page as its data is.
async fn console_headers(request: Request, next: Next) -> Response {
    let console = console_path(request.uri().path());
    let mut response = next.run(request).await;
    if console {
        let headers = response.headers_mut();
        for (name, value) in crate::console::assets::security_headers() {
            headers.entry(name).or_insert(value);
        }
    }
    response
}

/// `router` inside the limits, authentication and request-id layers.
pub fn apply(router: Router, limits: Limits, keys: Arc<KeyStore>) -> Router {
    with_routes(router, limits, keys, &[])
}

/// [`apply`] for a router that serves exactly `routes` (`crate::routes::ROUTES`): a known path
/// asked with a method it does not serve is answered 405 before authentication.
pub fn with_routes(
    router: Router,
    limits: Limits,
    keys: Arc<KeyStore>,
    routes: &'static [(&'static str, &'static str)],
) -> Router {
    let permits = Arc::new(Semaphore::new(limits.concurrency_limit.max(1)));
    // Route layers run for matched routes only: a path no route serves is answered 404 by the
    // fallback at once, with no key, no permit and no body read.
    router
        .route_layer(middleware::from_fn_with_state(
            Bounded { permits, limits },
            bounded,
        ))
        .route_layer(middleware::from_fn_with_state(
            Gate {
                keys,
                limits,
                routes,
            },
            authenticated,
        ))
        .layer(middleware::from_fn(console_headers))
        .layer(TraceLayer::new_for_http().make_span_with(span))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyGrant;
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::get;
    use tokio::sync::Notify;
    use tollgate_core::ids::Scope;
    use tollgate_store::{KeyDigest, KeyRole, MemoryStores};
    use tower::ServiceExt;

    const KEY: &str = "static-test-key";

    fn keys() -> Arc<KeyStore> {
        let grant = KeyGrant {
            digest: KeyDigest::of_key(KEY),
            scope: Scope::parse("acme").unwrap(),
            role: KeyRole::Caller,
            limits: tollgate_core::limits::RateLimits::default(),
        };
        Arc::new(KeyStore::new(&[grant], Arc::new(MemoryStores::new())))
    }

    fn held(gate: Arc<Notify>, entered: Arc<Notify>) -> Router {
        Router::new().route(
            "/hold",
            get(move || async move {
                entered.notify_one();
                gate.notified().await;
                "done"
            }),
        )
    }

    fn get_hold(id: Option<&str>) -> Request {
        let mut builder = Request::builder()
            .uri("/hold")
            .header(header::AUTHORIZATION, format!("Bearer {KEY}"));
        if let Some(id) = id {
            builder = builder.header(REQUEST_ID, id);
        }
        builder.body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn sc_213_a_stream_holds_its_permit_until_its_body_ends() {
        let (more, rest) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
        let rest = Arc::new(std::sync::Mutex::new(Some(rest)));
        let streaming = Router::new().route(
            "/hold",
            get(move || {
                let rest = rest.lock().unwrap().take();
                async move {
                    let chunks = futures::stream::unfold(rest, |rest| async move {
                        let mut rest = rest?;
                        let chunk = rest.recv().await?;
                        Some((Ok::<_, std::convert::Infallible>(chunk), Some(rest)))
                    });
                    (
                        [(header::CONTENT_TYPE, "text/event-stream")],
                        Body::from_stream(chunks),
                    )
                }
            }),
        );
        let limits = Limits {
            concurrency_limit: 1,
            request_timeout_ms: 60_000,
            ..Limits::default()
        };
        let app = apply(streaming, limits, keys());
        let open = app.clone().oneshot(get_hold(None)).await.unwrap();
        assert_eq!(open.status(), StatusCode::OK);
        // Its handler returned; its body streams on and keeps the permit.
        let second = app.clone().oneshot(get_hold(None)).await.unwrap();
        assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
        more.send("data: last\n\n").unwrap();
        drop(more);
        let body = axum::body::to_bytes(open.into_body(), 1 << 16)
            .await
            .unwrap();
        assert_eq!(&body[..], b"data: last\n\n");
        // The stream is over: the permit is back (the route answers nothing more, but the gate
        // lets the request in).
        let third = app.oneshot(get_hold(None)).await.unwrap();
        assert_eq!(third.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn sc_139_over_the_concurrency_limit_is_503_and_a_slow_request_is_504() {
        let gate = Arc::new(Notify::new());
        let entered = Arc::new(Notify::new());
        let limits = Limits {
            concurrency_limit: 1,
            request_timeout_ms: 60_000,
            ..Limits::default()
        };
        let app = apply(held(gate.clone(), entered.clone()), limits, keys());
        let first = tokio::spawn(app.clone().oneshot(get_hold(None)));
        entered.notified().await;
        let second = app.clone().oneshot(get_hold(None)).await.unwrap();
        assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
        gate.notify_one();
        let first = first.await.unwrap().unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        // The permit is back.
        let third = tokio::spawn(app.clone().oneshot(get_hold(None)));
        entered.notified().await;
        gate.notify_one();
        assert_eq!(third.await.unwrap().unwrap().status(), StatusCode::OK);

        let limits = Limits {
            concurrency_limit: 4,
            request_timeout_ms: 100,
            ..Limits::default()
        };
        let app = apply(held(gate, entered), limits, keys());
        let late = app.oneshot(get_hold(None)).await.unwrap();
        assert_eq!(late.status(), StatusCode::GATEWAY_TIMEOUT);
        let body = axum::body::to_bytes(late.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "interrupted");
        assert_eq!(body["error"]["cause"], "request_timeout");
    }

    #[tokio::test]
    async fn sc_138_every_answer_carries_a_request_id() {
        let app = apply(
            Router::new().route("/ok", get(|| async { "ok" })),
            Limits::default(),
            keys(),
        );
        let request = |id: Option<&str>| {
            let mut builder = Request::builder()
                .uri("/ok")
                .header(header::AUTHORIZATION, format!("Bearer {KEY}"));
            if let Some(id) = id {
                builder = builder.header(REQUEST_ID, id);
            }
            builder.body(Body::empty()).unwrap()
        };
        let given = app.clone().oneshot(request(Some("req-42"))).await.unwrap();
        assert_eq!(given.headers()[REQUEST_ID], "req-42");
        let generated = app.clone().oneshot(request(None)).await.unwrap();
        let id = generated.headers()[REQUEST_ID].to_str().unwrap();
        assert_eq!(uuid::Uuid::parse_str(id).unwrap().get_version_num(), 4);
        let other = app.oneshot(request(None)).await.unwrap();
        assert_ne!(other.headers()[REQUEST_ID], generated.headers()[REQUEST_ID]);
    }

    /// A body that never ends: what a client sending its body slowly looks like to the server.
    fn endless() -> Body {
        Body::from_stream(futures::stream::pending::<
            Result<axum::body::Bytes, std::io::Error>,
        >())
    }

    #[tokio::test]
    async fn sc_181_a_request_without_a_valid_key_is_refused_before_its_body_and_its_permit() {
        let gate = Arc::new(Notify::new());
        let entered = Arc::new(Notify::new());
        let limits = Limits {
            concurrency_limit: 1,
            ..Limits::default()
        };
        let app = apply(held(gate.clone(), entered.clone()), limits, keys());
        // The one permit is taken by an authenticated request that waits.
        let first = tokio::spawn(app.clone().oneshot(get_hold(None)));
        entered.notified().await;
        // Without a key, and with a body that never ends: 401 at once, not 503 and not a wait
        // for the body.
        for auth in [None, Some("Bearer not-a-key"), Some("Basic abc")] {
            let mut builder = Request::builder().method("POST").uri("/hold");
            if let Some(auth) = auth {
                builder = builder.header(header::AUTHORIZATION, auth);
            }
            let refused = app
                .clone()
                .oneshot(builder.body(endless()).unwrap())
                .await
                .unwrap();
            assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
            assert_eq!(refused.headers()[header::CONNECTION], "close");
        }
        // A path no route serves is 404 at once, without a permit.
        let unknown = Request::builder()
            .uri("/v1/nothing-here")
            .body(Body::empty())
            .unwrap();
        let unknown = app.clone().oneshot(unknown).await.unwrap();
        assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
        gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);

        let public = apply(
            Router::new().route("/healthz", get(|| async { "ok" })),
            Limits::default(),
            keys(),
        );
        let probe = Request::builder()
            .uri("/healthz")
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            public.oneshot(probe).await.unwrap().status(),
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn sc_182_a_body_that_does_not_arrive_in_time_is_408_and_frees_its_permit() {
        let limits = Limits {
            concurrency_limit: 1,
            body_read_timeout_ms: 100,
            ..Limits::default()
        };
        let app = apply(
            Router::new().route(
                "/ok",
                axum::routing::post(|body: String| async move { body }),
            ),
            limits,
            keys(),
        );
        let slow = Request::builder()
            .method("POST")
            .uri("/ok")
            .header(header::AUTHORIZATION, format!("Bearer {KEY}"))
            .body(endless())
            .unwrap();
        let late = app.clone().oneshot(slow).await.unwrap();
        assert_eq!(late.status(), StatusCode::REQUEST_TIMEOUT);
        let body = axum::body::to_bytes(late.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "body_timeout");
        // The permit is back, and a body that arrives is read whole.
        let whole = Request::builder()
            .method("POST")
            .uri("/ok")
            .header(header::AUTHORIZATION, format!("Bearer {KEY}"))
            .body(Body::from("hello"))
            .unwrap();
        let answer = app.oneshot(whole).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
            .await
            .unwrap();
        assert_eq!(&body[..], b"hello");
    }

    #[tokio::test]
    async fn sc_191_console_refusals_carry_the_security_headers() {
        let app = apply(
            Router::new().route("/v1/console/overview", get(|| async { "data" })),
            Limits::default(),
            keys(),
        );
        for path in ["/v1/console/overview", "/console/nothing"] {
            let request = Request::builder().uri(path).body(Body::empty()).unwrap();
            let answer = app.clone().oneshot(request).await.unwrap();
            assert!(answer.status().is_client_error(), "{path}");
            let headers = answer.headers();
            assert!(
                headers.contains_key(header::CONTENT_SECURITY_POLICY),
                "{path}: {headers:?}"
            );
            assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
        }
        let api = Request::builder()
            .uri("/v1/calls/x")
            .body(Body::empty())
            .unwrap();
        let answer = app.oneshot(api).await.unwrap();
        assert!(!answer.headers().contains_key(header::X_FRAME_OPTIONS));
    }
}
