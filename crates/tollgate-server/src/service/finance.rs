//! The finance feed (spec/service.md — Finance feed, SC-141, SC-142): the key's scope's
//! settlements in feed order, paged by an opaque cursor that a consumer resumes from without
//! gaps or duplicates. Finance role only.

use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use serde::{Deserialize, Serialize};
use tollgate_store::{FeedPosition, KeyRole, SettlementRecord};

/// Default page of the feed.
pub const FEED_PAGE_DEFAULT: u32 = 100;
/// Largest page of the feed.
pub const FEED_PAGE_MAX: u32 = 1000;

/// Query of `GET /v1/finance/settlements`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedQuery {
    /// Resume after this cursor (a `cursor` or `next` of an earlier page); from the start when
    /// absent.
    pub after: Option<String>,
    /// Settlements listed at most (default 100, 1..=1000).
    pub limit: Option<u32>,
}

/// One settlement of the feed with its cursor.
#[derive(Debug, Serialize)]
pub struct FeedItem {
    /// Where it sits in the feed: resume after it.
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
    /// is empty (nothing new yet).
    pub next: String,
}

/// `GET /v1/finance/settlements?after=…&limit=…` (SC-141, SC-142).
///
/// # Errors
/// `forbidden` (not a finance key), `invalid_request` (a cursor this feed did not hand out),
/// `unavailable`.
pub async fn settlements(
    app: &App,
    who: &Principal,
    query: FeedQuery,
) -> Result<FeedPage, ApiError> {
    who.require(&[KeyRole::Finance])?;
    let after = match query.after.as_deref() {
        None => FeedPosition::START,
        Some(text) => FeedPosition::parse(text).ok_or_else(|| {
            ApiError::Invalid("after must be a cursor returned by this feed".into())
        })?,
    };
    let limit = query
        .limit
        .unwrap_or(FEED_PAGE_DEFAULT)
        .clamp(1, FEED_PAGE_MAX);
    let entries = app
        .backend
        .stores()
        .settlements_after(Some(&who.scope), after, limit)
        .await?;
    let next = entries.last().map_or(after, |e| e.position).cursor();
    Ok(FeedPage {
        settlements: entries
            .into_iter()
            .map(|e| FeedItem {
                cursor: e.position.cursor(),
                settlement: e.settlement,
            })
            .collect(),
        next,
    })
}
