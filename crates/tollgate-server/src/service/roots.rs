//! Operation roots and their steps on step profiles (spec/service.md — Routes).
//!
//! A root's binding holds its profile's snapshot, not the profile's name: a step runs on the
//! loaded step profile whose snapshot is exactly the root's, so a root opened under a profile
//! that is no longer loaded (changed config, restart) refuses new steps instead of running them
//! under different terms.

use super::{caller_id, checked_input, detached, id, parse, InputBody};
use crate::app::{App, ProfileRunner};
use crate::auth::Principal;
use crate::error::{ApiError, UNKNOWN_PROFILE};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tollgate_core::ids::{InputRevision, Intent, OperationKey, RootKey, SessionId};
use tollgate_core::money::{Currency, Money};
use tollgate_core::view::View;
use tollgate_runner::step::{GovernedStepRunner, OpenRoot, StepRequest};
use tollgate_store::{KeyRole, RootRecord, RootState};
use tracing::Instrument;

/// `POST /v1/roots`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OpenBody {
    root_key: String,
    profile: String,
    session_id: String,
    intent: String,
    input_revision: String,
    deadline_ms: u64,
}

/// `POST /v1/roots/{root_key}/steps`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepBody {
    pub(crate) operation_key: String,
    pub(crate) input: InputBody,
}

/// What the root routes answer with.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RootView {
    /// The root's key.
    #[schema(value_type = String)]
    pub root_key: RootKey,
    /// The loaded step profile whose snapshot the root is bound to (null when none is).
    pub profile: Option<String>,
    /// `active`, `closed`, `expired` or `reconciled`.
    #[schema(value_type = String)]
    pub state: RootState,
    /// Admission deadline.
    pub deadline: DateTime<Utc>,
    /// Calls reserved under the root.
    pub reserved_calls: i64,
    /// Inclusive charged cost (the sum of its root receipts).
    #[schema(value_type = String)]
    pub charged: Money,
    /// Worst-case holds of its calls in flight.
    #[schema(value_type = String)]
    pub held: Money,
    /// Currency of the amounts.
    #[schema(value_type = String)]
    pub currency: Currency,
    /// Opened at.
    pub created_at: DateTime<Utc>,
    /// Last change at.
    pub updated_at: DateTime<Utc>,
}

fn root_view(app: &App, root: RootRecord) -> RootView {
    let profile = app
        .step_profile_of(&root.binding.config)
        .map(|(name, _)| name.to_string());
    RootView {
        currency: root.binding.config.currency.clone(),
        root_key: root.root_key,
        profile,
        state: root.state,
        deadline: root.deadline,
        reserved_calls: root.reserved_calls,
        charged: root.charged,
        held: root.held,
        created_at: root.created_at,
        updated_at: root.updated_at,
    }
}

fn steps(app: &App) -> Result<&GovernedStepRunner, ApiError> {
    app.any_step_runner()
        .ok_or_else(|| ApiError::NotFound("root".into()))
}

async fn root_of(app: &App, who: &Principal, root_key: &RootKey) -> Result<RootRecord, ApiError> {
    steps(app)?
        .root(&who.scope, root_key)
        .await?
        .ok_or_else(|| ApiError::NotFound("root".into()))
}

/// Opens a root on a step profile, or returns the existing one with the same binding (SR-5).
///
/// # Errors
/// `invalid_request`, `conflict`, `unavailable`, `forbidden`.
pub async fn open(app: &App, who: &Principal, body: &[u8]) -> Result<RootView, ApiError> {
    who.require(&[KeyRole::Caller])?;
    let body: OpenBody = parse(body)?;
    let loaded = app
        .profiles
        .get(&body.profile)
        .ok_or_else(|| ApiError::Invalid(UNKNOWN_PROFILE.into()))?;
    let ProfileRunner::Step(runner) = &loaded.runner else {
        return Err(ApiError::Invalid(format!(
            "profile {:?} is not a step profile",
            body.profile
        )));
    };
    let root = runner
        .open_root(OpenRoot {
            scope: who.scope.clone(),
            root_key: caller_id(RootKey::parse, body.root_key)?,
            session_id: id(SessionId::parse, body.session_id)?,
            intent: id(Intent::parse, body.intent)?,
            input_revision: id(InputRevision::parse, body.input_revision)?,
            deadline_ms: body.deadline_ms,
        })
        .await?;
    Ok(root_view(app, root))
}

/// Runs one step under a root: the messages are checked against the root's profile first.
///
/// # Errors
/// `not_found`, `root_closed`, `root_expired`, `conflict`, `cap_blocked`, `invalid_request`,
/// `invalid_state` (the root's profile is not loaded), `unavailable`, `interrupted`.
pub async fn step(
    app: &App,
    who: &Principal,
    root_key: String,
    body: &[u8],
) -> Result<View, ApiError> {
    who.require(&[KeyRole::Caller])?;
    let result = match parse::<StepBody>(body) {
        Ok(body) => step_checked(app, who, root_key, body).await,
        Err(e) => Err(e),
    };
    app.metrics.observe(&result);
    result
}

/// Runs a parsed step under `root_key` (the steps route and the OpenAI-compatible front door).
pub(crate) async fn step_checked(
    app: &App,
    who: &Principal,
    root_key: String,
    body: StepBody,
) -> Result<View, ApiError> {
    let root_key = caller_id(RootKey::parse, root_key)?;
    let operation_key = caller_id(OperationKey::parse, body.operation_key)?;
    let root = root_of(app, who, &root_key).await?;
    let config = root.binding.config;
    let Some((name, _)) = app.step_profile_of(&config) else {
        return Err(ApiError::InvalidState(
            "the root's profile is no longer loaded: open a new root".into(),
        ));
    };
    let cancel = CancellationToken::new();
    let request = StepRequest {
        scope: who.scope.clone(),
        root_key,
        operation_key,
        load_input: checked_input(&config, body.input.messages)?,
        cancel: cancel.clone(),
        limits: who.limit_charges(),
    };
    let span = tracing::info_span!(
        "step",
        scope = %request.scope,
        root_key = %request.root_key,
        operation_key = %request.operation_key,
        profile = %name
    );
    let task_app = app.clone();
    let _in_flight = app.metrics.in_flight();
    let work = async move {
        let (_, runner) = task_app
            .step_profile_of(&config)
            .ok_or(ApiError::Internal)?;
        let view = runner.run_step(request).await?;
        tracing::info!(state = ?view.state, outcome = ?view.outcome, replayed = view.replayed, "step answered");
        Ok(view)
    };
    detached(work.instrument(span), cancel).await
}

/// The view of a step under its root; 404 when none (or when the key is under another root).
///
/// # Errors
/// `not_found`, `unavailable`, `forbidden`.
pub async fn read_step(
    app: &App,
    who: &Principal,
    root_key: String,
    key: String,
) -> Result<View, ApiError> {
    who.require(&[KeyRole::Caller, KeyRole::Operator])?;
    let root_key = caller_id(RootKey::parse, root_key)?;
    let key = caller_id(OperationKey::parse, key)?;
    steps(app)?
        .read(&who.scope, &root_key, &key)
        .await?
        .ok_or_else(|| ApiError::NotFound("step".into()))
}

/// A root.
///
/// # Errors
/// `not_found`, `unavailable`, `forbidden`.
pub async fn read(app: &App, who: &Principal, root_key: String) -> Result<RootView, ApiError> {
    who.require(&[KeyRole::Caller, KeyRole::Operator])?;
    let root_key = caller_id(RootKey::parse, root_key)?;
    let root = root_of(app, who, &root_key).await?;
    Ok(root_view(app, root))
}

/// Closes a root: no new admissions; reserved calls go on (ST-33). Idempotent.
///
/// # Errors
/// `not_found`, `unavailable`, `forbidden`.
pub async fn close(app: &App, who: &Principal, root_key: String) -> Result<RootView, ApiError> {
    who.require(&[KeyRole::Caller])?;
    let root_key = caller_id(RootKey::parse, root_key)?;
    let root = steps(app)?
        .close_root(&who.scope, &root_key)
        .await?
        .ok_or_else(|| ApiError::NotFound("root".into()))?;
    Ok(root_view(app, root))
}
