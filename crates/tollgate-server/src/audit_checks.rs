//! The console's audit checks of a scope (spec/service.md — Console, SC-194): its hash chain
//! verified row by row against its heads, and the ledger audit, each with its first violation
//! when there is one. Also the page-by-page walk over a scope's audit rows that the overview and
//! the execution page use.
//!
//! Both checks read every row of the scope, so each runs at most once per scope and
//! [`AUDIT_CHECK_CACHE_MS`] in a process ([`AuditChecks`]): a request within that time of the
//! last check gets its result, marked as cached with the time it ran, and requests that arrive
//! while a check runs wait for it rather than start their own.

use crate::error::ApiError;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use tollgate_core::ids::Scope;
use tollgate_runner::{Clock, SystemClock};
use tollgate_store::audit::ChainVerifier;
use tollgate_store::{AuditPosition, AuditRow, LedgerReport, ServiceStores};

/// Audit rows read per store call.
pub const AUDIT_PAGE_ROWS: u32 = 1000;
/// Violations the ledger audit lists on the page (all are counted).
pub const LEDGER_LIST_MAX: u32 = 20;
/// How long a scope's chain verification and ledger audit are served from this process's
/// memory after they ran: damage made after a check shows on the console within this time.
pub const AUDIT_CHECK_CACHE_MS: u64 = 30_000;
/// Scopes whose last checks a process keeps; past it the ones older than
/// [`AUDIT_CHECK_CACHE_MS`] are dropped.
pub const AUDIT_CHECK_SCOPES_MAX: usize = 10_000;

/// A check's result, with when it ran.
#[derive(Debug, Clone, Serialize)]
pub struct Checked<T> {
    /// The result.
    #[serde(flatten)]
    pub report: T,
    /// When the check began.
    pub checked_at: DateTime<Utc>,
    /// Whether this request was answered from the last check (it began less than `cache_ms`
    /// before the request) rather than by a check of its own.
    pub cached: bool,
    /// How long a check is served from memory ([`AUDIT_CHECK_CACHE_MS`]).
    pub cache_ms: u64,
}

/// The last check of one scope, and the lock a check of the scope holds while it runs.
type Slot<T> = Arc<tokio::sync::Mutex<Option<(DateTime<Utc>, T)>>>;

/// The last checks of each scope, of one kind.
struct Checks<T> {
    scopes: Mutex<HashMap<Scope, Slot<T>>>,
}

impl<T> Default for Checks<T> {
    fn default() -> Self {
        Self {
            scopes: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Clone> Checks<T> {
    fn slot(&self, scope: &Scope, now: DateTime<Utc>, cache_ms: u64) -> Slot<T> {
        let mut scopes = self.scopes.lock().unwrap_or_else(PoisonError::into_inner);
        if scopes.len() >= AUDIT_CHECK_SCOPES_MAX && !scopes.contains_key(scope) {
            // A slot in use or checked within the window stays; a slot held only by the map
            // and checked longer ago (or never) goes.
            scopes.retain(|_, slot| {
                Arc::strong_count(slot) > 1
                    || slot.try_lock().is_ok_and(|last| {
                        last.as_ref()
                            .is_some_and(|(at, _)| fresh(*at, now, cache_ms))
                    })
            });
            if scopes.len() >= AUDIT_CHECK_SCOPES_MAX {
                // Every kept scope was checked within the window: this one's check is not kept.
                return Slot::default();
            }
        }
        scopes.entry(scope.clone()).or_default().clone()
    }

    /// The last check of `scope` when it began less than `cache_ms` ago, else a new one by
    /// `run`, which is kept. One check of a scope runs at a time; a request that waited for it
    /// gets its result.
    async fn get<F, Fut>(
        &self,
        scope: &Scope,
        clock: &dyn Clock,
        cache_ms: u64,
        run: F,
    ) -> Result<Checked<T>, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let slot = self.slot(scope, clock.now(), cache_ms);
        let mut last = slot.lock().await;
        let now = clock.now();
        if let Some((at, report)) = last.as_ref().filter(|(at, _)| fresh(*at, now, cache_ms)) {
            return Ok(Checked {
                report: report.clone(),
                checked_at: *at,
                cached: true,
                cache_ms,
            });
        }
        let report = run().await?;
        *last = Some((now, report.clone()));
        Ok(Checked {
            report,
            checked_at: now,
            cached: false,
            cache_ms,
        })
    }
}

/// Whether a check that began at `at` is served at `now`: it began at most `cache_ms` before,
/// and not after (a clock that went back serves nothing).
fn fresh(at: DateTime<Utc>, now: DateTime<Utc>, cache_ms: u64) -> bool {
    let age = (now - at).num_milliseconds();
    u64::try_from(age).is_ok_and(|age| age < cache_ms)
}

/// The console's audit checks of each scope, each run at most once per `cache_ms` in this
/// process (SC-194): the chain verification (the audit page) and the ledger audit (the audit
/// page and the overview).
pub struct AuditChecks {
    cache_ms: u64,
    clock: Arc<dyn Clock>,
    chains: Checks<ChainReport>,
    ledgers: Checks<LedgerReport>,
}

impl Default for AuditChecks {
    fn default() -> Self {
        Self::new(AUDIT_CHECK_CACHE_MS, Arc::new(SystemClock))
    }
}

impl AuditChecks {
    /// Checks served for `cache_ms` after they began, on `clock`.
    #[must_use]
    pub fn new(cache_ms: u64, clock: Arc<dyn Clock>) -> Self {
        Self {
            cache_ms,
            clock,
            chains: Checks::default(),
            ledgers: Checks::default(),
        }
    }

    /// The scope's chain verification ([`verify`]), from the last one when it began less than
    /// `cache_ms` ago.
    ///
    /// # Errors
    /// `unavailable`.
    pub async fn chain(
        &self,
        stores: &dyn ServiceStores,
        scope: &Scope,
    ) -> Result<Checked<ChainReport>, ApiError> {
        self.chains
            .get(scope, self.clock.as_ref(), self.cache_ms, || {
                verify(stores, scope)
            })
            .await
    }

    /// The scope's ledger audit (at most [`LEDGER_LIST_MAX`] violations listed), from the last
    /// one when it began less than `cache_ms` ago.
    ///
    /// # Errors
    /// `unavailable`.
    pub async fn ledger(
        &self,
        stores: &dyn ServiceStores,
        scope: &Scope,
    ) -> Result<Checked<LedgerReport>, ApiError> {
        self.ledgers
            .get(scope, self.clock.as_ref(), self.cache_ms, || async {
                Ok(stores.audit_ledger(Some(scope), LEDGER_LIST_MAX).await?)
            })
            .await
    }
}

/// Calls `visit` on the scope's audit rows after `after` (by chain, then seq), until the rows
/// end, `visit` answers `false`, or — with `one_chain` — the chain of `after` ends. Returns the
/// rows visited.
///
/// # Errors
/// `unavailable`.
pub async fn walk(
    stores: &dyn ServiceStores,
    scope: &Scope,
    after: AuditPosition,
    one_chain: bool,
    mut visit: impl FnMut(&AuditRow) -> bool,
) -> Result<u64, ApiError> {
    let chain = after.chain;
    let mut after = after;
    let mut seen = 0u64;
    loop {
        let rows = stores.audit_rows(scope, after, AUDIT_PAGE_ROWS).await?;
        let Some(last) = rows.last() else {
            return Ok(seen);
        };
        after = last.position();
        for row in &rows {
            if one_chain && row.chain != chain {
                return Ok(seen);
            }
            seen += 1;
            if !visit(row) {
                return Ok(seen);
            }
        }
    }
}

/// The first row that does not verify.
#[derive(Debug, Clone, Serialize)]
pub struct ChainViolation {
    /// Its chain.
    pub chain: u16,
    /// Its seq in the chain.
    pub seq: i64,
    /// What is wrong.
    pub reason: &'static str,
}

/// The chain verification of one scope.
#[derive(Debug, Clone, Serialize)]
pub struct ChainReport {
    /// Every row verifies and the last one is the head.
    pub ok: bool,
    /// Rows verified before the first violation (all of them when `ok`).
    pub rows_verified: i64,
    /// Rows the chains' heads account for, as the store keeps them (0: no row yet).
    pub head_seq: i64,
    /// The first violation.
    pub first_violation: Option<ChainViolation>,
}

/// Verifies the scope's chain from its first row to its head.
///
/// # Errors
/// `unavailable`.
pub async fn verify(stores: &dyn ServiceStores, scope: &Scope) -> Result<ChainReport, ApiError> {
    let heads = stores.audit_heads(scope).await?;
    let mut verifier = ChainVerifier::default();
    let mut broken = None;
    walk(
        stores,
        scope,
        AuditPosition::START,
        false,
        |row| match verifier.push(row) {
            Ok(()) => true,
            Err(e) => {
                broken = Some(e);
                false
            }
        },
    )
    .await?;
    let rows_verified = verifier.rows();
    let broken = match broken {
        Some(e) => Some(e),
        None => verifier.finish(&heads).err(),
    };
    Ok(ChainReport {
        ok: broken.is_none(),
        rows_verified,
        head_seq: heads.iter().map(|h| h.seq).sum(),
        first_violation: broken.map(|e| ChainViolation {
            chain: e.chain.0,
            seq: e.seq,
            reason: e.reason,
        }),
    })
}
