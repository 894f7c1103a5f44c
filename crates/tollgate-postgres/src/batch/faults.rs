//! Faults at the batch points, for the fault matrix (feature `test-support`, never in a deployed
//! build): the claim batch and the settlement batch of a shard, each struck at its `nth`
//! statement of two calls or more, in one of the ways a batch statement can end:
//!
//! - `refused`: the database refused the statement as a whole (nothing written; every call goes
//!   alone, as after a cancelled statement);
//! - `fail`: the statement never reached the database (every call answered the error);
//! - `die_before` / `die_after`: the process dies before the statement is sent, or after it
//!   committed and before any call is answered;
//! - `lost_before_commit` / `lost_after_commit`: the connection is lost with the statement, before
//!   or after its commit, and the process lives: every call is answered "outcome unknown" either
//!   way, as the client cannot tell which happened.
//!
//! The hook also gathers each batch: a runner that takes the gate waits (holding it) until its
//! queue holds the hook's number of calls, or no call arrived for [`GATHER_QUIET_MS`], so that a
//! case's concurrent calls form batches of two or more at both points every time it runs.

use super::{failed, Answer};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tollgate_store::StoreError;

/// How long a gathering runner waits for one more call before it sends what it has.
pub const GATHER_QUIET_MS: u64 = 200;
/// The longest a runner gathers.
pub const GATHER_WAIT_MAX_MS: u64 = 2_000;

/// A batch point: which queue's statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BatchPoint {
    /// The claims of calls outside a root (`tollgate_claim_batch`).
    Claim,
    /// The settlements of calls outside a root (`tollgate_settle_batch`).
    Settle,
}

impl BatchPoint {
    /// Both points, in report order.
    pub const ALL: [BatchPoint; 2] = [BatchPoint::Claim, BatchPoint::Settle];

    /// The point's name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claim => "claim_batch",
            Self::Settle => "settle_batch",
        }
    }
}

/// The batch point a call's statements count at.
pub(crate) type PointOf<C> = fn(&C) -> BatchPoint;

/// How a struck batch statement ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BatchFaultKind {
    /// Refused by the database as a whole: nothing written, every call goes alone.
    Refused,
    /// Never reached the database: every call answered the error.
    Fail,
    /// The process dies before the statement is sent.
    DieBefore,
    /// The statement commits, then the process dies before answering any call.
    DieAfter,
    /// The connection is lost before the commit; every call answered "outcome unknown".
    LostBeforeCommit,
    /// The statement commits and the connection is lost before its answer; every call answered
    /// "outcome unknown".
    LostAfterCommit,
}

impl BatchFaultKind {
    /// Every kind, in report order.
    pub const ALL: [BatchFaultKind; 6] = [
        Self::Refused,
        Self::Fail,
        Self::DieBefore,
        Self::DieAfter,
        Self::LostBeforeCommit,
        Self::LostAfterCommit,
    ];

    /// The kind's name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Fail => "fail",
            Self::DieBefore => "die_before",
            Self::DieAfter => "die_after",
            Self::LostBeforeCommit => "lost_before_commit",
            Self::LostAfterCommit => "lost_after_commit",
        }
    }

    /// Whether the process lives through it.
    pub fn lives(self) -> bool {
        !matches!(self, Self::DieBefore | Self::DieAfter)
    }
}

/// One planned fault: the `nth` batch statement (of two calls or more) at `point`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchFault {
    /// Where.
    pub point: BatchPoint,
    /// Which statement of that point, counted from 1.
    pub nth: u64,
    /// How it ends.
    pub kind: BatchFaultKind,
}

type OnDeath = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct State {
    planned: Option<BatchFault>,
    fired: Vec<BatchFault>,
    batches: BTreeMap<BatchPoint, u64>,
    sizes: Vec<(BatchPoint, usize)>,
    /// Statements that carried calls of both points.
    shared: u64,
}

/// The batch hook of one process's stores.
pub struct BatchFaults {
    gather_calls: usize,
    state: Mutex<State>,
    on_death: Mutex<Option<OnDeath>>,
}

impl std::fmt::Debug for BatchFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchFaults")
            .field("gather_calls", &self.gather_calls)
            .finish_non_exhaustive()
    }
}

/// What the hook made of a batch statement.
pub(crate) enum Applied<C> {
    /// Not struck: send it as usual.
    Pass(Vec<C>),
    /// Struck: these are its answers.
    Answered((Vec<Answer>, Vec<C>)),
    /// Struck: the process died; nothing is answered.
    Died,
}

impl BatchFaults {
    /// A hook that gathers `gather_calls` calls per batch and strikes nothing yet.
    pub fn new(gather_calls: usize) -> Arc<Self> {
        Arc::new(Self {
            gather_calls,
            state: Mutex::new(State::default()),
            on_death: Mutex::new(None),
        })
    }

    /// Plans `fault` (one per hook; a later one replaces it).
    pub fn inject(&self, fault: BatchFault) {
        self.lock().planned = Some(fault);
    }

    /// What a death does (the fault matrix kills the process's store wrapper).
    pub fn on_death(&self, die: impl Fn() + Send + Sync + 'static) {
        *self.on_death.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(die));
    }

    /// Batch statements of two calls or more at each point so far (struck ones included).
    pub fn batches(&self) -> BTreeMap<BatchPoint, u64> {
        self.lock().batches.clone()
    }

    /// Statements of two calls or more that carried claims and settlements together (H-43).
    pub fn shared(&self) -> u64 {
        self.lock().shared
    }

    /// The sizes of those statements, in order (one entry at each point a statement counts at).
    pub fn sizes(&self) -> Vec<(BatchPoint, usize)> {
        self.lock().sizes.clone()
    }

    /// The planned faults that struck.
    pub fn fired(&self) -> Vec<BatchFault> {
        self.lock().fired.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn die(&self) {
        if let Some(die) = self
            .on_death
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            die();
        }
    }

    /// Waits, holding the gate, until `waiting()` reaches the hook's number of calls, is zero,
    /// or stopped growing for [`GATHER_QUIET_MS`].
    pub(crate) async fn gather(&self, waiting: impl Fn() -> usize) {
        let started = Instant::now();
        let mut last = waiting();
        let mut since = Instant::now();
        loop {
            let now = waiting();
            if now == 0
                || now >= self.gather_calls
                || started.elapsed() >= Duration::from_millis(GATHER_WAIT_MAX_MS)
            {
                return;
            }
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= Duration::from_millis(GATHER_QUIET_MS) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Counts a statement of `calls` at each of `points` (those of the calls it carries: a
    /// shard's statement of claims and settlements counts at both) and strikes it when it is the
    /// planned one at one of them.
    pub(crate) async fn apply<C, S, F>(
        &self,
        points: &[BatchPoint],
        calls: Vec<C>,
        send: &S,
    ) -> Applied<C>
    where
        S: Fn(Vec<C>) -> F,
        F: Future<Output = (Vec<Answer>, Vec<C>)>,
    {
        if calls.len() < 2 {
            return Applied::Pass(calls);
        }
        let kind = {
            let mut state = self.lock();
            if points.len() > 1 {
                state.shared += 1;
            }
            let mut struck = None;
            for &point in points {
                let nth = {
                    let count = state.batches.entry(point).or_insert(0);
                    *count += 1;
                    *count
                };
                state.sizes.push((point, calls.len()));
                let planned = state.planned.filter(|f| f.point == point && f.nth == nth);
                if let Some(fault) = planned {
                    state.planned = None;
                    state.fired.push(fault);
                    struck = Some(fault.kind);
                }
            }
            struck
        };
        let lost = |n: usize| -> Vec<Answer> {
            let e = StoreError::Unavailable("database connection lost mid-batch".into());
            (0..n).map(|_| Answer::Lost(e.clone())).collect()
        };
        let n = calls.len();
        match kind {
            None => Applied::Pass(calls),
            Some(BatchFaultKind::Refused) => {
                Applied::Answered(((0..n).map(|_| Answer::Alone).collect(), calls))
            }
            Some(BatchFaultKind::Fail) => {
                let e = StoreError::Unavailable("injected fault: batch not sent".into());
                Applied::Answered((failed(&e, n), calls))
            }
            Some(BatchFaultKind::LostBeforeCommit) => Applied::Answered((lost(n), calls)),
            Some(BatchFaultKind::LostAfterCommit) => {
                let (_, calls) = send(calls).await;
                Applied::Answered((lost(n), calls))
            }
            Some(BatchFaultKind::DieBefore) => {
                self.die();
                Applied::Died
            }
            Some(BatchFaultKind::DieAfter) => {
                let _ = send(calls).await;
                self.die();
                Applied::Died
            }
        }
    }
}
