//! Calls on text, json and structured profiles, and the profile list (spec/service.md — Routes,
//! Profiles).

use super::{caller_id, checked_input, detached, id, parse, store_failure, InputBody};
use crate::app::{App, ProfileRunner};
use crate::auth::Principal;
use crate::error::{ApiError, UNKNOWN_PROFILE};
use crate::profiles::Profile;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, SessionId};
use tollgate_core::message::Message;
use tollgate_core::view::View;
use tollgate_runner::single::RunRequest;
use tollgate_runner::views;
use tollgate_store::KeyRole;
use tracing::Instrument;

/// `POST /v1/calls`. The scope is the key's: the body cannot name one (SC-10).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CallBody {
    pub(crate) profile: String,
    pub(crate) operation_key: String,
    pub(crate) session_id: String,
    pub(crate) input_revision: String,
    pub(crate) intent: String,
    pub(crate) input: InputBody,
}

/// `GET /v1/profiles`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProfileList {
    /// Every loaded profile (no secrets: provider keys are not part of a profile): `name`,
    /// `result_retention` and the call snapshot's fields (spec/service.md — Profiles).
    #[schema(value_type = Vec<Object>)]
    pub profiles: Vec<Profile>,
}

/// Lists the loaded profiles (any role).
///
/// # Errors
/// None beyond authentication.
pub fn profiles(app: &App, _who: &Principal) -> Result<ProfileList, ApiError> {
    Ok(ProfileList {
        profiles: app.profiles.values().map(|l| l.profile.clone()).collect(),
    })
}

/// Runs a call: validates the body, the profile and the messages first (a bad request writes
/// nothing), then runs it on the profile's runner with the key's scope.
///
/// # Errors
/// `invalid_request`, `conflict`, `cap_blocked`, `unavailable`, `interrupted`, `forbidden`.
pub async fn create(app: &App, who: &Principal, body: &[u8]) -> Result<View, ApiError> {
    who.require(&[KeyRole::Caller])?;
    let result = match parse(body) {
        Ok(body) => create_checked(app, who, body).await,
        Err(e) => Err(e),
    };
    app.metrics.observe(&result);
    result
}

/// Runs a parsed call body (the `/v1/calls` route and the OpenAI-compatible front door).
pub(crate) async fn create_checked(
    app: &App,
    who: &Principal,
    body: CallBody,
) -> Result<View, ApiError> {
    let loaded = app
        .profiles
        .get(&body.profile)
        .ok_or_else(|| ApiError::Invalid(UNKNOWN_PROFILE.into()))?;
    if matches!(loaded.runner, ProfileRunner::Step(_)) {
        return Err(ApiError::Invalid(format!(
            "profile {:?} is a step profile: open a root and run steps",
            body.profile
        )));
    }
    let cancel = CancellationToken::new();
    let messages = body.input.messages;
    let request = RunRequest {
        scope: who.scope.clone(),
        session_id: id(SessionId::parse, body.session_id)?,
        operation_key: caller_id(OperationKey::parse, body.operation_key)?,
        input_revision: id(InputRevision::parse, body.input_revision)?,
        intent: id(Intent::parse, body.intent)?,
        load_input: checked_input(&loaded.profile.config, messages.clone())?,
        cancel: cancel.clone(),
    };
    let span = tracing::info_span!(
        "call",
        scope = %request.scope,
        operation_key = %request.operation_key,
        profile = %body.profile
    );
    let task_app = app.clone();
    let name = body.profile;
    let _in_flight = app.metrics.in_flight();
    let single = matches!(loaded.runner, ProfileRunner::Single(_));
    let work = async move {
        if single {
            run_single(&task_app, &name, request, &messages).await
        } else {
            run_structured(&task_app, &name, request).await
        }
    };
    detached(work.instrument(span), cancel).await
}

/// The input is in the request: the claim holds its own worst case (SC-120).
async fn run_single(
    app: &App,
    profile: &str,
    request: RunRequest,
    messages: &[Message],
) -> Result<View, ApiError> {
    let Some(ProfileRunner::Single(runner)) = app.profiles.get(profile).map(|l| &l.runner) else {
        return Err(ApiError::Internal);
    };
    answered(runner.run_inline(request, messages).await?)
}

async fn run_structured(app: &App, profile: &str, request: RunRequest) -> Result<View, ApiError> {
    let Some(ProfileRunner::Structured(runner)) = app.profiles.get(profile).map(|l| &l.runner)
    else {
        return Err(ApiError::Internal);
    };
    answered(runner.run(request).await?)
}

fn answered(view: View) -> Result<View, ApiError> {
    tracing::info!(state = ?view.state, outcome = ?view.outcome, replayed = view.replayed, "call answered");
    Ok(view)
}

/// `GET /v1/calls/{operation_key}`: the view of a call in the key's scope; 404 when there is
/// none (also when the key belongs to another scope, or names a step — steps are read under
/// their root).
///
/// # Errors
/// `not_found`, `unavailable`, `forbidden`.
pub async fn read(app: &App, who: &Principal, key: String) -> Result<View, ApiError> {
    who.require(&[KeyRole::Caller, KeyRole::Operator])?;
    let key = caller_id(OperationKey::parse, key)?;
    let stores = app.backend.stores();
    let record = stores
        .execution(&who.scope, &key)
        .await
        .map_err(|e| store_failure(&key, e))?;
    if let Some(record) = record.filter(|r| r.root_key.is_none()) {
        return views::view_of(stores.as_ref(), &record, chrono::Utc::now())
            .await
            .map_err(|e| store_failure(&key, e));
    }
    if let Some(runner) = app.structured_runner() {
        if let Some(view) = runner.read(&who.scope, &key).await? {
            return Ok(view);
        }
    }
    Err(ApiError::NotFound("operation".into()))
}
