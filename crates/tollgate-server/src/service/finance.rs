//! The finance feed (spec/service.md — Finance feed, SC-141, SC-142, SC-193): the key's scope's
//! settlements in feed order, paged by a cursor that a consumer resumes from without gaps or
//! duplicates. Finance role only.
//!
//! A cursor is the id of the last settlement handed out (random, and already a column of the
//! row), never its feed position: the position is drawn from sequences that every scope's
//! settlements advance, so handing it out would tell a tenant how many settlements all tenants
//! made. The store resolves a cursor to its position within the key's scope only, so another
//! scope's cursor, an altered one and one of any other form are refused alike.

use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use serde::{Deserialize, Serialize};
use tollgate_core::ids::{Scope, SettlementId};
use tollgate_store::{FeedPosition, KeyRole, ServiceStores, SettlementRecord};

/// Default page of the feed.
pub const FEED_PAGE_DEFAULT: u32 = 100;
/// Largest page of the feed.
pub const FEED_PAGE_MAX: u32 = 1000;

/// Query of `GET /v1/finance/settlements`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedQuery {
    /// Resume after this cursor (a `cursor` or `next` of an earlier page); from the start when
    /// absent or empty.
    pub after: Option<String>,
    /// Settlements listed at most (default 100, 1..=1000).
    pub limit: Option<u32>,
}

/// One settlement of the feed with its cursor.
#[derive(Debug, Serialize)]
pub struct FeedItem {
    /// Resume after it: the settlement's id.
    pub cursor: String,
    /// The settlement (the columns of `finance.settlements`).
    #[serde(flatten)]
    pub settlement: SettlementRecord,
}

/// `GET /v1/finance/settlements` answer.
#[derive(Debug, Serialize)]
pub struct FeedPage {
    /// In feed order.
    pub settlements: Vec<FeedItem>,
    /// The cursor to pass as `after` next: the last item's, or the `after` given when the page
    /// is empty (nothing new yet; empty when none was given).
    pub next: String,
}

/// Why a cursor is refused; the same for every cursor this feed did not hand out to the scope.
const NOT_A_CURSOR: &str = "after must be a cursor returned by this feed";

/// The feed position `cursor` names in `scope`'s feed: the start for an empty cursor, else the
/// position of the scope's settlement whose id it is (in its canonical form).
///
/// # Errors
/// `invalid_request` (not a cursor of this scope's feed), `unavailable`.
async fn position_of(
    stores: &dyn ServiceStores,
    scope: &Scope,
    cursor: &str,
) -> Result<FeedPosition, ApiError> {
    if cursor.is_empty() {
        return Ok(FeedPosition::START);
    }
    let id = uuid::Uuid::try_parse(cursor)
        .ok()
        .filter(|id| id.hyphenated().to_string() == cursor)
        .map(SettlementId)
        .ok_or_else(|| ApiError::Invalid(NOT_A_CURSOR.into()))?;
    stores
        .feed_position(scope, id)
        .await?
        .ok_or_else(|| ApiError::Invalid(NOT_A_CURSOR.into()))
}

/// `GET /v1/finance/settlements?after=…&limit=…` (SC-141, SC-142, SC-193).
///
/// # Errors
/// `forbidden` (not a finance key), `invalid_request` (a cursor this feed did not hand out to
/// the key's scope), `unavailable`.
pub async fn settlements(
    app: &App,
    who: &Principal,
    query: FeedQuery,
) -> Result<FeedPage, ApiError> {
    who.require(&[KeyRole::Finance])?;
    let stores = app.backend.stores();
    let given = query.after.unwrap_or_default();
    let after = position_of(stores.as_ref(), &who.scope, &given).await?;
    let limit = query
        .limit
        .unwrap_or(FEED_PAGE_DEFAULT)
        .clamp(1, FEED_PAGE_MAX);
    let entries = stores
        .settlements_after(Some(&who.scope), after, limit)
        .await?;
    let next = entries
        .last()
        .map_or(given, |e| e.settlement.id.to_string());
    Ok(FeedPage {
        settlements: entries
            .into_iter()
            .map(|e| FeedItem {
                cursor: e.settlement.id.to_string(),
                settlement: e.settlement,
            })
            .collect(),
        next,
    })
}
