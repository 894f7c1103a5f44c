//! A call request served by the member of the cluster that owns its consumer's audit chain group
//! (spec/performance.md, H-39; [`crate::cluster`]), for the native route and the two doors.

use crate::app::{App, ProfileRunner};
use crate::auth::Principal;
use crate::cluster;
use crate::service::door;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Response, Uri};
use tollgate_store::KeyRole;

/// The answer of the member that owns the group of the consumer of the profile `profile`
/// names, for a call request (`POST`, `uri`, `headers`, `body`) this instance would otherwise
/// serve; `None` when it is served here: no cluster or a cluster of one, a request that arrived
/// forwarded, a key that may not make calls, a body that names no profile, a profile that is
/// unknown or a step profile (the local answer names the error; steps under a root are never
/// batched), a group this instance owns, or an owner that gave no answer.
pub(crate) async fn call_elsewhere(
    app: &App,
    who: &Principal,
    profile: Option<&str>,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Response<Body>> {
    let cluster = app.cluster.as_ref()?;
    if cluster::was_forwarded(headers) {
        cluster.received();
        return None;
    }
    if cluster.members().len() < 2 || who.require(&[KeyRole::Caller]).is_err() {
        return None;
    }
    let loaded = app.profiles.get(profile?)?;
    if matches!(loaded.runner, ProfileRunner::Step(_)) {
        return None;
    }
    let owner = cluster.owner(who.scope.as_str(), loaded.profile.config.consumer.as_str())?;
    cluster
        .forward(&owner, Method::POST, uri, headers, body.clone())
        .await
}

/// A door's request ([`door::peek`] of its body) and, when another member serves it, that
/// member's answer ([`call_elsewhere`] for the profile its `model` names).
pub(crate) async fn door_elsewhere(
    app: &App,
    who: &Principal,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> (door::Peek, Option<Response<Body>>) {
    let peek = door::peek(body);
    let answer = call_elsewhere(app, who, peek.model.as_deref(), uri, headers, body).await;
    (peek, answer)
}
