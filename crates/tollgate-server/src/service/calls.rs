//! Calls on text, json and structured profiles, and the profile list (spec/service.md — Routes,
//! Profiles).

use super::{caller_id, checked_input, detached, id, store_failure, InputBody};
use crate::app::{App, ProfileRunner};
use crate::auth::Principal;
use crate::error::{ApiError, UNKNOWN_PROFILE};
use crate::profiles::Profile;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tollgate_core::config::CallConfig;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, SessionId};
use tollgate_core::message::Message;
use tollgate_core::view::{View, ViewState};
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

/// Runs a call, its body as parsed: validates the body, the profile and the messages first (a
/// bad request writes nothing), then runs it on the profile's runner with the key's scope. A replay of a call still
/// being processed is answered 409 `in_progress` (SC-209).
///
/// # Errors
/// `invalid_request`, `conflict`, `in_progress`, `cap_blocked`, `unavailable`, `interrupted`,
/// `forbidden`.
pub(crate) async fn create(
    app: &App,
    who: &Principal,
    body: Result<CallBody, ApiError>,
) -> Result<View, ApiError> {
    who.require(&[KeyRole::Caller])?;
    let result = match body {
        Ok(body) => create_checked(app, who, body).await,
        Err(e) => Err(e),
    };
    app.metrics.observe(&result);
    retry_answer(result?)
}

/// The answer of a route that runs a call and answers its view (SC-209): a call still being
/// processed (a replay that arrived while the first request runs) is 409 `in_progress` with
/// `Retry-After`, so that a client retries and then gets the stored answer; every other view is
/// the answer.
///
/// # Errors
/// `in_progress`.
pub(crate) fn retry_answer(view: View) -> Result<View, ApiError> {
    if view.state == ViewState::InProgress {
        return Err(ApiError::InProgress {
            operation_key: view.operation_key.to_string(),
            execution_id: view.execution_id.map(|id| id.to_string()),
        });
    }
    Ok(view)
}

/// The answer of a door whose success answer is a completed call (the OpenAI-compatible and
/// Anthropic doors, SC-209): as [`retry_answer`], and a call that was not dispatched (422
/// `not_dispatched`) or awaits an operator (502 `reconciliation_required`) is an error, never an
/// empty completion.
///
/// # Errors
/// `in_progress`, `not_dispatched`, `reconciliation_required`.
pub(crate) fn completed_answer(view: View) -> Result<View, ApiError> {
    let view = retry_answer(view)?;
    let operation_key = view.operation_key.to_string();
    let execution_id = view.execution_id.map(|id| id.to_string());
    match view.state {
        ViewState::NotDispatched => Err(ApiError::NotDispatched {
            operation_key,
            execution_id,
            cause: view.not_dispatched_cause.map(|c| c.as_str()),
        }),
        ViewState::ReconciliationRequired => Err(ApiError::ReconciliationRequired {
            operation_key,
            execution_id,
        }),
        ViewState::Completed | ViewState::InProgress => Ok(view),
    }
}

/// Runs a parsed call body on its profile's snapshot (the `/v1/calls` route and the doors).
pub(crate) async fn create_checked(
    app: &App,
    who: &Principal,
    body: CallBody,
) -> Result<View, ApiError> {
    create_narrowed(app, who, body, None).await
}

/// Runs a parsed call body on `narrowed`, the profile's snapshot narrowed by the request's
/// values (SC-211; built with [`CallConfig::narrowed`]), or on the profile's own snapshot when
/// `None` or equal to it.
///
/// # Errors
/// As [`create`]; `invalid_request` (400) when the provider does not take the narrowed snapshot.
pub(crate) async fn create_narrowed(
    app: &App,
    who: &Principal,
    body: CallBody,
    narrowed: Option<CallConfig>,
) -> Result<View, ApiError> {
    create_live(app, who, body, narrowed, None).await
}

/// [`create_narrowed`], handing a text call's deltas to `live` as the provider sends them
/// (SC-213). Any other call drops `live` at once, so its reader ends with nothing: a JSON call's
/// output is validated at its end, and a structured call's is a tool call.
///
/// # Errors
/// As [`create_narrowed`].
pub(crate) async fn create_live(
    app: &App,
    who: &Principal,
    body: CallBody,
    narrowed: Option<CallConfig>,
    live: Option<tollgate_runner::live::LiveSink>,
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
    let narrowed = narrowed.filter(|c| c != &loaded.profile.config);
    let runner = match &narrowed {
        Some(config) => Some(loaded.narrowed.runner(config).map_err(|e| {
            ApiError::Malformed(format!(
                "the profile's provider does not take this request: {e}"
            ))
        })?),
        None => None,
    };
    let config = narrowed.as_ref().unwrap_or(&loaded.profile.config);
    let live = live.filter(|_| config.kind == tollgate_core::state::CallKind::Text);
    let cancel = CancellationToken::new();
    let messages = body.input.messages;
    let request = RunRequest {
        scope: who.scope.clone(),
        session_id: id(SessionId::parse, body.session_id)?,
        operation_key: caller_id(OperationKey::parse, body.operation_key)?,
        input_revision: id(InputRevision::parse, body.input_revision)?,
        intent: id(Intent::parse, body.intent)?,
        load_input: checked_input(config, messages.clone())?,
        cancel: cancel.clone(),
        limits: who.limit_charges(),
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
    let work = async move {
        let runner = match &runner {
            Some(runner) => runner.as_ref(),
            None => match task_app.profiles.get(&name) {
                Some(loaded) => &loaded.runner,
                None => return Err(ApiError::Internal),
            },
        };
        run(runner, request, &messages, live).await
    };
    detached(work.instrument(span), cancel).await
}

/// Runs `request` on `runner`. The input of a single call is in the request: the claim holds
/// its own worst case (SC-120).
async fn run(
    runner: &ProfileRunner,
    request: RunRequest,
    messages: &[Message],
    live: Option<tollgate_runner::live::LiveSink>,
) -> Result<View, ApiError> {
    // Each kind's run on the heap, only the one taken: a call in flight holds its own state,
    // not room for the largest kind's.
    let view = match (runner, live) {
        (ProfileRunner::Single(runner), Some(live)) => {
            Box::pin(runner.run_live(request, Some(messages), live)).await?
        }
        (ProfileRunner::Single(runner), None) => {
            Box::pin(runner.run_inline(request, messages)).await?
        }
        (ProfileRunner::Structured(runner), _) => Box::pin(runner.run(request)).await?,
        (ProfileRunner::Step(_), _) => return Err(ApiError::Internal),
    };
    answered(view)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::state::NotDispatchedCause;

    fn view(state: ViewState) -> View {
        let mut view = tollgate_runner::views::bare(OperationKey::parse("k").unwrap(), state);
        view.replayed = true;
        view
    }

    #[test]
    fn sc_209_only_a_completed_call_is_a_completion() {
        assert!(matches!(
            retry_answer(view(ViewState::InProgress)),
            Err(ApiError::InProgress { .. })
        ));
        // The native door answers the views that state an outcome.
        for state in [ViewState::NotDispatched, ViewState::ReconciliationRequired] {
            assert!(retry_answer(view(state)).is_ok());
        }
        let mut never = view(ViewState::NotDispatched);
        never.not_dispatched_cause = Some(NotDispatchedCause::Aborted);
        let e = completed_answer(never).unwrap_err();
        assert_eq!(e.code(), "not_dispatched");
        assert_eq!(e.body()["error"]["cause"], "aborted");
        let e = completed_answer(view(ViewState::ReconciliationRequired)).unwrap_err();
        assert_eq!(e.code(), "reconciliation_required");
        assert!(completed_answer(view(ViewState::Completed)).is_ok());
    }
}
