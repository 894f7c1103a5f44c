//! Calls batched into one statement and one commit (spec/performance.md, H-32).
//!
//! The claims and settlements of calls outside a root that arrive while an earlier one of their
//! queue is in flight wait in the queue, and the queue's runner, once free, sends all of them, up
//! to [`MAX_CALLS_PER_BATCH`], as one statement of a batch function (`batch.sql`), whose one
//! commit they share (claims and settlements together: `crate::shard`, H-43). No call waits for a
//! timer: a call that finds its queue idle goes at once, alone, as the single function (the
//! statement it would be without batches), and batches form only while the queue's statements
//! are in flight. The stores keep one queue per shard of the consumers (`Batches` in `lib.rs`).
//!
//! Each call of a batch is decided as the single function decides it: the batch function first
//! decides the batch as a whole, one statement per table (H-38), and when a call would be decided
//! otherwise than alone, rolls that back and decides the calls one by one (a subtransaction each).
//! A call the batch could not decide without waiting for a lock, or that failed, is answered
//! [`Answer::Alone`]: nothing of it was written, and its caller sends it by the single function.
//! A batch statement the database refused as a whole answers every call [`Answer::Alone`] the
//! same way (its transaction wrote nothing); one that failed otherwise (the connection lost)
//! answers every call [`Answer::Failed`] with the error the single statement would have given,
//! whose commit is as unknown as that statement's would be.

#[cfg(feature = "test-support")]
pub mod faults;

use crate::error::ends_connection;
use crate::PgStores;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::Postgres;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};
use tollgate_store::{StoreError, StoreResult};

/// The most calls of one kind one batch statement carries.
pub(crate) const MAX_CALLS_PER_BATCH: usize = 16;

/// How long a batch waits for a lock from its second call on before it leaves that call out.
pub(crate) const BATCH_LOCK_TIMEOUT_MS: u32 = 1;

/// How a call was answered by its runner.
pub(crate) enum Answer {
    /// The call went alone, as the single statement: its result, as that statement gave it.
    Single(Result<Option<PgRow>, sqlx::Error>),
    /// The batch decided the call; the single function's row.
    Row(PgRow),
    /// The batch decided the call; the single function answered no row.
    NoRow,
    /// The batch left the call out (it failed, or would have waited for a lock): nothing of it
    /// was written; the caller sends it alone.
    Alone,
    /// The batch statement failed as a whole.
    Failed(StoreError),
    /// The batch statement failed with an error that ended its connection
    /// (`crate::error::ends_connection`): whether it committed is unknown.
    Lost(StoreError),
}

impl Answer {
    /// The answer as the single statement's result would be: `None` for [`Answer::Alone`] (the
    /// call is still to be sent).
    ///
    /// # Errors
    /// The error of [`Answer::Failed`].
    pub(crate) fn single(self) -> StoreResult<Option<Result<Option<PgRow>, sqlx::Error>>> {
        match self {
            Self::Single(result) => Ok(Some(result)),
            Self::Row(row) => Ok(Some(Ok(Some(row)))),
            Self::NoRow => Ok(Some(Ok(None))),
            Self::Alone => Ok(None),
            Self::Failed(e) | Self::Lost(e) => Err(e),
        }
    }

    /// Whether the statement failed with an error that ended its connection.
    pub(crate) fn lost_its_connection(&self) -> bool {
        match self {
            Self::Single(Err(e)) => ends_connection(e),
            Self::Lost(_) => true,
            _ => false,
        }
    }
}

/// `calls` answers [`Answer::Failed`] with `error`.
pub(crate) fn failed(error: &StoreError, calls: usize) -> Vec<Answer> {
    (0..calls).map(|_| Answer::Failed(error.clone())).collect()
}

/// `calls` answers of a statement that failed with `error`: [`Answer::Lost`] when the error
/// ended its connection (whether it committed is unknown), else [`Answer::Failed`].
pub(crate) fn failed_statement(error: sqlx::Error, calls: usize) -> Vec<Answer> {
    let lost = ends_connection(&error);
    let error = crate::error::db(error);
    (0..calls)
        .map(|_| {
            if lost {
                Answer::Lost(error.clone())
            } else {
                Answer::Failed(error.clone())
            }
        })
        .collect()
}

/// `rows` by their place (`places` of them): each row's `column` holds its call's place in the
/// statement's arrays, counted from 1 (`WITH ORDINALITY`); a place no row names is `None`.
pub(crate) fn by_place(rows: Vec<PgRow>, column: &str, places: usize) -> Vec<Option<PgRow>> {
    use sqlx::Row;
    let mut placed: Vec<Option<PgRow>> = (0..places).map(|_| None).collect();
    for row in rows {
        let place: Result<i64, _> = row.try_get(column);
        if let Some(slot) = place
            .ok()
            .and_then(|n| usize::try_from(n - 1).ok())
            .and_then(|n| placed.get_mut(n))
        {
            *slot = Some(row);
        }
    }
    placed
}

/// A queue of calls and the one runner that sends them. Its `Debug` shows counts only: the
/// calls hold content (a prompt's output, a binding).
pub(crate) struct Batcher<C> {
    queue: Mutex<Queue<C>>,
    /// The gate its statements take (one permit), which other batchers may share: one statement
    /// (a batch or a call alone) in flight among them (a shard's queue has a gate of its own,
    /// H-34). The runner takes its place at the gate before it takes its calls, so the calls that
    /// arrive while it waits join its batch.
    gate: Arc<Semaphore>,
    /// The longest one statement may hold the gate: past it the statement is given up (its
    /// connection closed, its calls answered `Unavailable`, their outcome unknown) and the gate
    /// goes to the next, so a connection that stopped answering (a half-open route, a failover)
    /// cannot stop the shard (SC-206).
    deadline: Duration,
    /// The kind of each call (below [`CALL_KINDS`]; `None`: one kind): a statement carries up
    /// to [`MAX_CALLS_PER_BATCH`] calls of each kind.
    kind_of: Option<fn(&C) -> usize>,
    /// The most calls of one kind a statement carries.
    most_calls: usize,
    /// The fault matrix's hook and the batch point of each call (feature `test-support`).
    #[cfg(feature = "test-support")]
    hook: Option<(faults::PointOf<C>, Arc<faults::BatchFaults>)>,
}

/// Calls one queue holds waiting at most; a call beyond them is refused at once with
/// `Unavailable`, nothing written, instead of queueing without bound behind a slow database
/// (SC-206). Above the calls one instance admits at once (`[server] concurrency_limit`, 1,024 by
/// default; the harness's 10,000 in flight), so only a database too slow for them fills it.
pub(crate) const BATCH_QUEUE_CALLS_MAX: usize = 16_384;

/// A call waiting in a queue, with where its answer goes.
type Waiting<C> = (C, oneshot::Sender<(Answer, C)>);

/// The most waiting calls a runner looks at to fill its statement.
const BATCH_SCAN_MAX: usize = 4 * CALL_KINDS * MAX_CALLS_PER_BATCH;

struct Queue<C> {
    waiting: VecDeque<Waiting<C>>,
    /// 1 while the runner runs, else 0.
    running: usize,
}

/// A runner's place in its queue. When the runner ends without giving it back (a panic), the
/// place is freed and the calls still waiting fail ("database batch lost") instead of waiting
/// for a runner that a later call would start; the calls it had taken fail the same way (their
/// senders drop with the task).
struct Running<'a, C> {
    batcher: &'a Batcher<C>,
    armed: bool,
}

impl<C> Drop for Running<'_, C> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(mut queue) = self.batcher.queue.lock() {
            queue.running = queue.running.saturating_sub(1);
            if queue.running == 0 {
                queue.waiting.clear();
            }
        }
    }
}

impl<C> std::fmt::Debug for Batcher<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (waiting, running) = self
            .queue
            .lock()
            .map(|q| (q.waiting.len(), q.running))
            .unwrap_or_default();
        f.debug_struct("Batcher")
            .field("running", &running)
            .field("waiting", &waiting)
            .finish()
    }
}

fn lost() -> StoreError {
    StoreError::Unavailable("database batch lost".into())
}

/// The kinds of calls one queue may hold (a shard's claims and settlements).
pub(crate) const CALL_KINDS: usize = 2;

impl<C: Send + 'static> Batcher<C> {
    /// A batcher whose statements take `gate` (one permit): one statement in flight among this
    /// batcher and every other one given the same gate, each for at most `deadline`.
    pub(crate) fn new(gate: &Arc<Semaphore>, deadline: Duration) -> Arc<Self> {
        Self::of_kinds(gate, deadline, None)
    }

    /// A batcher like [`Batcher::new`] whose statements carry up to `most_calls` calls (at
    /// least 1), for statements whose size does not shape their text.
    pub(crate) fn with_most_calls(
        gate: &Arc<Semaphore>,
        deadline: Duration,
        most_calls: usize,
    ) -> Arc<Self> {
        Self::made(gate, deadline, None, most_calls.max(1))
    }

    /// A batcher like [`Batcher::new`] of calls of [`CALL_KINDS`] kinds (`kind_of`; `None`: one
    /// kind), whose statements carry up to [`MAX_CALLS_PER_BATCH`] calls of each.
    pub(crate) fn of_kinds(
        gate: &Arc<Semaphore>,
        deadline: Duration,
        kind_of: Option<fn(&C) -> usize>,
    ) -> Arc<Self> {
        Self::made(gate, deadline, kind_of, MAX_CALLS_PER_BATCH)
    }

    fn made(
        gate: &Arc<Semaphore>,
        deadline: Duration,
        kind_of: Option<fn(&C) -> usize>,
        most_calls: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                running: 0,
            }),
            gate: Arc::clone(gate),
            deadline,
            kind_of,
            most_calls,
            #[cfg(feature = "test-support")]
            hook: None,
        })
    }

    /// A batcher like [`Batcher::of_kinds`] whose statements go through `hook`, each at the
    /// points of the calls it carries (`point`).
    #[cfg(feature = "test-support")]
    pub(crate) fn hooked(
        gate: &Arc<Semaphore>,
        deadline: Duration,
        kind_of: Option<fn(&C) -> usize>,
        point: faults::PointOf<C>,
        hook: &Arc<faults::BatchFaults>,
    ) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                running: 0,
            }),
            gate: Arc::clone(gate),
            deadline,
            kind_of,
            most_calls: MAX_CALLS_PER_BATCH,
            hook: Some((point, Arc::clone(hook))),
        })
    }

    /// The calls of the next statement, taken from the front of `waiting`: up to
    /// [`MAX_CALLS_PER_BATCH`] of each kind, in their order; the calls of a kind already full
    /// stay, in their order, for the next. At most [`BATCH_SCAN_MAX`] calls are looked at.
    fn take(&self, waiting: &mut VecDeque<Waiting<C>>) -> Vec<Waiting<C>> {
        let Some(kind_of) = self.kind_of else {
            let n = waiting.len().min(self.most_calls);
            return waiting.drain(..n).collect();
        };
        let mut counts = [0usize; CALL_KINDS];
        let mut taken = Vec::new();
        let mut left = Vec::new();
        let mut looked = 0;
        while looked < BATCH_SCAN_MAX {
            let Some(call) = waiting.pop_front() else {
                break;
            };
            looked += 1;
            let kind = kind_of(&call.0).min(CALL_KINDS - 1);
            if counts[kind] < self.most_calls {
                counts[kind] += 1;
                taken.push(call);
                if counts.iter().all(|&n| n >= self.most_calls) {
                    break;
                }
            } else {
                left.push(call);
            }
        }
        for call in left.into_iter().rev() {
            waiting.push_front(call);
        }
        taken
    }

    /// One statement of `calls`, given up at the deadline (`None`); with the fault hook, `Err`
    /// when the process died.
    async fn sent<S, F>(&self, send: &S, calls: Vec<C>) -> Result<Option<(Vec<Answer>, Vec<C>)>, ()>
    where
        S: Fn(Vec<C>) -> F,
        F: Future<Output = (Vec<Answer>, Vec<C>)>,
    {
        #[cfg(feature = "test-support")]
        let calls = match &self.hook {
            Some((point, hook)) => {
                let mut points: Vec<faults::BatchPoint> = calls.iter().map(point).collect();
                points.sort_unstable();
                points.dedup();
                match hook.apply(&points, calls, send).await {
                    faults::Applied::Pass(calls) => calls,
                    faults::Applied::Answered(answered) => return Ok(Some(answered)),
                    faults::Applied::Died => return Err(()),
                }
            }
            None => calls,
        };
        Ok(tokio::time::timeout(self.deadline, send(calls)).await.ok())
    }

    /// Sends `call` in the next statement a runner sends, and answers how it went, with the
    /// call given back. `send` sends one statement for the calls it is given and answers each, in
    /// their order, with the calls.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the queue is full ([`BATCH_QUEUE_CALLS_MAX`]), or the
    /// runner that took the call ended without answering it (its statement passed the deadline).
    pub(crate) async fn submit<S, F>(self: &Arc<Self>, call: C, send: S) -> StoreResult<(Answer, C)>
    where
        S: Fn(Vec<C>) -> F + Send + Sync + 'static,
        F: Future<Output = (Vec<Answer>, Vec<C>)> + Send,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut queue = self.queue.lock().map_err(|_| lost())?;
            if queue.waiting.len() >= BATCH_QUEUE_CALLS_MAX {
                return Err(StoreError::Unavailable("database batch queue full".into()));
            }
            queue.waiting.push_back((call, tx));
            let start = queue.running == 0;
            if start {
                queue.running += 1;
            }
            start
        };
        if start {
            let batcher = Arc::clone(self);
            tokio::spawn(async move { batcher.run(send).await });
        }
        rx.await.map_err(|_| lost())
    }

    /// A runner: sends what is queued until the queue is empty.
    async fn run<S, F>(&self, send: S)
    where
        S: Fn(Vec<C>) -> F,
        F: Future<Output = (Vec<Answer>, Vec<C>)>,
    {
        let mut running = Running {
            batcher: self,
            armed: true,
        };
        loop {
            // Held until this statement's answer is in. The gate is never closed; were it, the
            // runner would end and its place (`Running`) fail the waiting calls.
            let Ok(permit) = self.gate.acquire().await else {
                return;
            };
            #[cfg(feature = "test-support")]
            if let Some((_, hook)) = &self.hook {
                hook.gather(|| self.queue.lock().map_or(0, |q| q.waiting.len()))
                    .await;
            }
            let taken: Vec<Waiting<C>> = {
                let Ok(mut queue) = self.queue.lock() else {
                    return;
                };
                if queue.waiting.is_empty() {
                    // Given back under the lock, so a call queued after this check starts a
                    // runner of its own.
                    queue.running = queue.running.saturating_sub(1);
                    running.armed = false;
                    return;
                }
                self.take(&mut queue.waiting)
            };
            let (calls, senders): (Vec<C>, Vec<oneshot::Sender<(Answer, C)>>) =
                taken.into_iter().unzip();
            // A process that died (the fault matrix) answers nothing: its place is given back
            // and every call still waiting fails with it.
            let Ok(sent) = self.sent(&send, calls).await else {
                return;
            };
            drop(permit);
            let Some((answers, calls)) = sent else {
                // Given up at the deadline: the statement's connection is closed with its
                // future, and the callers, whose senders drop here, answer `Unavailable`.
                tracing::warn!(
                    deadline_ms = self.deadline.as_millis(),
                    calls = senders.len(),
                    "database batch given up at its deadline"
                );
                continue;
            };
            for ((answer, call), to) in answers.into_iter().zip(calls).zip(senders) {
                // The caller may have gone (its future dropped): its call was sent all the same.
                let _ = to.send((answer, call));
            }
        }
    }
}

/// A call's parameters as its single function takes them, in order.
pub(crate) trait Call: Send + 'static {
    /// `query` with this call's parameters bound after the ones it has.
    fn bind<'q>(
        &'q self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments>;
}

impl PgStores {
    /// One call alone, as the single statement `single`.
    pub(crate) async fn send_alone<C: Call>(&self, single: &str, call: &C) -> Answer {
        let mut conn = match self.call_connection().await {
            Ok(conn) => conn,
            Err(e) => return Answer::Failed(e),
        };
        let on = match conn.conn() {
            Ok(on) => on,
            Err(e) => return Answer::Failed(e),
        };
        let row = call.bind(sqlx::query(single)).fetch_optional(on).await;
        Answer::Single(conn.check(row))
    }

    /// `calls`, alone as `single` when there is one, else as one statement of `batches`
    /// (indexed by size, [`statements`]); answered in order, with the calls given back.
    pub(crate) async fn send_batch<C: Call>(
        &self,
        single: &str,
        batches: &[String],
        calls: Vec<C>,
    ) -> (Vec<Answer>, Vec<C>) {
        let statement = match batches.get(calls.len()) {
            Some(statement) if calls.len() > 1 => statement,
            _ => {
                let mut answers = Vec::with_capacity(calls.len());
                for call in &calls {
                    answers.push(self.send_alone(single, call).await);
                }
                return (answers, calls);
            }
        };
        let mut query = sqlx::query(statement);
        for call in &calls {
            query = call.bind(query);
        }
        let answers = self.batch_statement(query, calls.len()).await;
        (answers, calls)
    }

    /// One batch statement of `calls` calls on a call connection, answered one per call in
    /// order: [`Answer::Lost`] for every call when the statement ended its connection (whether
    /// it committed is unknown), else as [`answers`] reads its rows.
    pub(crate) async fn batch_statement(
        &self,
        query: Query<'_, Postgres, PgArguments>,
        calls: usize,
    ) -> Vec<Answer> {
        let mut conn = match self.call_connection().await {
            Ok(conn) => conn,
            Err(e) => return failed(&e, calls),
        };
        let on = match conn.conn() {
            Ok(on) => on,
            Err(e) => return failed(&e, calls),
        };
        let rows = query.fetch_all(on).await;
        let rows = conn.check(rows);
        drop(conn);
        if let Err(e) = &rows {
            if ends_connection(e) {
                let lost = StoreError::Unavailable("database connection lost mid-batch".into());
                return (0..calls).map(|_| Answer::Lost(lost.clone())).collect();
            }
        }
        answers(rows, calls)
    }
}

/// The statement of a batch of `calls` calls (2 ..= [`MAX_CALLS_PER_BATCH`]): the batch
/// function `function` over one `call_type` row per call, whose fields are `types` (the single
/// function's parameters, bound in order, call after call), answering `call_index`,
/// `call_state` and the single function's row as `columns`.
pub(crate) fn statement(
    function: &str,
    call_type: &str,
    types: &[&str],
    columns: &str,
    calls: usize,
) -> String {
    let mut sql = String::from("SELECT b.call_index, b.call_state");
    for column in columns.split(',').map(str::trim) {
        sql.push_str(&format!(", (b.call_row).{column}"));
    }
    sql.push_str(&format!(" FROM {function}(ARRAY["));
    let mut n = 0;
    for call in 0..calls {
        if call > 0 {
            sql.push_str(", ");
        }
        sql.push_str("ROW(");
        for (i, ty) in types.iter().enumerate() {
            n += 1;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("${n}::{ty}"));
        }
        sql.push_str(&format!(")::{call_type}"));
    }
    sql.push_str(&format!(
        "], {}) b ORDER BY b.call_index",
        BATCH_LOCK_TIMEOUT_MS
    ));
    sql
}

/// The statements of batches of 2 ..= [`MAX_CALLS_PER_BATCH`] calls, indexed by size.
pub(crate) fn statements(
    function: &str,
    call_type: &str,
    types: &[&str],
    columns: &str,
) -> Vec<String> {
    (0..=MAX_CALLS_PER_BATCH)
        .map(|calls| match calls {
            0 | 1 => String::new(),
            _ => statement(function, call_type, types, columns, calls),
        })
        .collect()
}

/// The answers of a batch statement's rows, one per call in order; `calls` answers
/// [`Answer::Failed`] when the statement failed or did not answer every call.
pub(crate) fn answers(rows: Result<Vec<PgRow>, sqlx::Error>, calls: usize) -> Vec<Answer> {
    use sqlx::Row;
    let rows = match rows {
        Ok(rows) => rows,
        // The database refused the statement: its transaction wrote nothing, so each call goes
        // alone (a database without the batch functions, a cancelled statement).
        Err(sqlx::Error::Database(e)) => {
            tracing::warn!(
                sqlstate = e.code().as_deref().unwrap_or(""),
                calls,
                "a batch statement was refused; its calls go alone"
            );
            return (0..calls).map(|_| Answer::Alone).collect();
        }
        Err(e) => return failed(&crate::error::db(e), calls),
    };
    if rows.len() != calls {
        let e = StoreError::Corrupt("batch answered another number of calls".into());
        return failed(&e, calls);
    }
    let mut answers = Vec::with_capacity(calls);
    for row in rows {
        let state: Result<String, _> = row.try_get("call_state");
        answers.push(match state.as_deref() {
            Ok("row") => Answer::Row(row),
            Ok("none") => Answer::NoRow,
            Ok("alone") => Answer::Alone,
            _ => {
                let e = StoreError::Corrupt("batch answer without its state".into());
                return failed(&e, calls);
            }
        });
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A deadline no statement of these tests reaches.
    const TEST_DEADLINE: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn sc_206_a_statement_past_its_deadline_gives_the_gate_to_the_next() {
        let gate = Arc::new(Semaphore::new(1));
        let claims = Batcher::<usize>::new(&gate, Duration::from_millis(100));
        let settles = Batcher::<usize>::new(&gate, Duration::from_millis(100));
        // A statement on a connection that never answers.
        let stuck = {
            let claims = Arc::clone(&claims);
            tokio::spawn(async move {
                claims
                    .submit(1, |batch: Vec<usize>| async move {
                        std::future::pending::<()>().await;
                        (batch.iter().map(|_| Answer::NoRow).collect(), batch)
                    })
                    .await
            })
        };
        let stuck = tokio::time::timeout(Duration::from_secs(5), stuck)
            .await
            .expect("the stuck statement held the gate past its deadline")
            .unwrap();
        assert!(matches!(stuck, Err(StoreError::Unavailable(_))));
        // The shard goes on: the other queue of the gate, and the same queue, answer.
        for queue in [&settles, &claims] {
            let answered = tokio::time::timeout(
                Duration::from_secs(5),
                queue.submit(2, |batch: Vec<usize>| async move {
                    (batch.iter().map(|_| Answer::NoRow).collect(), batch)
                }),
            )
            .await
            .expect("the shard stayed stopped");
            assert!(matches!(answered, Ok((Answer::NoRow, 2))));
        }
    }

    #[tokio::test]
    async fn sc_206_a_full_queue_refuses_at_once() {
        let gate = Arc::new(Semaphore::new(1));
        // The gate is held elsewhere, so nothing leaves the queue.
        let held = Arc::clone(&gate).acquire_owned().await.unwrap();
        let queue = Batcher::<usize>::new(&gate, TEST_DEADLINE);
        let send = |batch: Vec<usize>| async move {
            (batch.iter().map(|_| Answer::NoRow).collect(), batch)
        };
        let mut waiting = Vec::new();
        for i in 0..BATCH_QUEUE_CALLS_MAX {
            let queue = Arc::clone(&queue);
            waiting.push(tokio::spawn(async move { queue.submit(i, send).await }));
        }
        // Every one of them queued (polled), then one more is refused without waiting.
        while queue.queue.lock().unwrap().waiting.len() < BATCH_QUEUE_CALLS_MAX {
            tokio::task::yield_now().await;
        }
        let refused = tokio::time::timeout(Duration::from_secs(1), queue.submit(0, send))
            .await
            .expect("a full queue made its caller wait");
        assert!(matches!(refused, Err(StoreError::Unavailable(_))));
        drop(held);
        for call in waiting {
            assert!(call.await.unwrap().is_ok());
        }
    }

    #[test]
    fn h_32_a_batch_statement_casts_every_call_s_parameters_in_order() {
        let sql = statement("f_batch", "f_call", &["uuid", "text[]"], "id, state", 2);
        assert_eq!(
            sql,
            "SELECT b.call_index, b.call_state, (b.call_row).id, (b.call_row).state \
             FROM f_batch(ARRAY[ROW($1::uuid, $2::text[])::f_call, \
             ROW($3::uuid, $4::text[])::f_call], 1) b ORDER BY b.call_index"
        );
    }

    #[tokio::test]
    async fn h_32_calls_queued_while_the_runner_is_busy_go_in_one_batch() {
        let batcher = Batcher::<usize>::new(&Arc::new(Semaphore::new(1)), TEST_DEADLINE);
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let mut calls = Vec::new();
        for i in 0..10 {
            let batcher = Arc::clone(&batcher);
            let sizes = Arc::clone(&sizes);
            let in_flight = Arc::clone(&in_flight);
            calls.push(tokio::spawn(async move {
                batcher
                    .submit(i, move |batch: Vec<usize>| {
                        let sizes = Arc::clone(&sizes);
                        let in_flight = Arc::clone(&in_flight);
                        async move {
                            assert_eq!(in_flight.fetch_add(1, Ordering::SeqCst), 0);
                            sizes.lock().unwrap().push(batch.len());
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            in_flight.fetch_sub(1, Ordering::SeqCst);
                            (batch.iter().map(|_| Answer::NoRow).collect(), batch)
                        }
                    })
                    .await
            }));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for call in calls {
            assert!(matches!(call.await.unwrap(), Ok((Answer::NoRow, _))));
        }
        let sizes = sizes.lock().unwrap().clone();
        // The first call went alone; the others queued behind it and went in batches of at most
        // MAX_CALLS_PER_BATCH.
        assert_eq!(sizes[0], 1);
        assert_eq!(sizes.iter().sum::<usize>(), 10);
        assert!(sizes.len() < 10, "{sizes:?}");
        assert!(sizes.iter().all(|n| *n <= MAX_CALLS_PER_BATCH));
        assert_eq!(batcher.queue.lock().unwrap().running, 0);
    }

    #[test]
    fn h_43_a_statement_takes_up_to_the_most_of_each_kind_in_order() {
        // Calls 0..40, odd ones of kind 1: the first statement takes the first 16 of each kind
        // (0..32), in order; the next one takes the rest.
        fn parity(n: &usize) -> usize {
            n % 2
        }
        let batcher =
            Batcher::<usize>::of_kinds(&Arc::new(Semaphore::new(1)), TEST_DEADLINE, Some(parity));
        let mut waiting: VecDeque<Waiting<usize>> =
            (0..40).map(|n| (n, oneshot::channel().0)).collect();
        let first: Vec<usize> = batcher
            .take(&mut waiting)
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(first, (0..32).collect::<Vec<_>>());
        let next: Vec<usize> = batcher
            .take(&mut waiting)
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(next, (32..40).collect::<Vec<_>>());
        // One kind past its most: the other kind's later calls join; the full kind's wait, in
        // their order.
        let mut waiting: VecDeque<Waiting<usize>> = (0..20)
            .map(|n| n * 2)
            .chain([1, 3])
            .map(|n| (n, oneshot::channel().0))
            .collect();
        let first: Vec<usize> = batcher
            .take(&mut waiting)
            .into_iter()
            .map(|c| c.0)
            .collect();
        let expected: Vec<usize> = (0..16).map(|n| n * 2).chain([1, 3]).collect();
        assert_eq!(first, expected);
        let left: Vec<usize> = waiting.iter().map(|c| c.0).collect();
        assert_eq!(left, vec![32, 34, 36, 38]);
        // One kind only: at most MAX_CALLS_PER_BATCH.
        let single = Batcher::<usize>::new(&Arc::new(Semaphore::new(1)), TEST_DEADLINE);
        let mut waiting: VecDeque<Waiting<usize>> =
            (0..40).map(|n| (n, oneshot::channel().0)).collect();
        assert_eq!(single.take(&mut waiting).len(), MAX_CALLS_PER_BATCH);
        assert_eq!(waiting.len(), 40 - MAX_CALLS_PER_BATCH);
    }

    #[test]
    fn h_36_a_batcher_of_its_own_most_takes_up_to_it() {
        const MOST: usize = 1_024;
        let batcher =
            Batcher::<usize>::with_most_calls(&Arc::new(Semaphore::new(1)), TEST_DEADLINE, MOST);
        let mut waiting: VecDeque<Waiting<usize>> =
            (0..MOST + 10).map(|n| (n, oneshot::channel().0)).collect();
        let first: Vec<usize> = batcher
            .take(&mut waiting)
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(first, (0..MOST).collect::<Vec<_>>());
        assert_eq!(batcher.take(&mut waiting).len(), 10);
    }

    #[tokio::test]
    async fn h_34_the_two_queues_of_one_gate_never_have_two_statements_in_flight() {
        // Two queues that share one gate: whatever arrives on either, one statement is in
        // flight at a time, and the calls that arrive meanwhile on both queues are carried by
        // the next statements of each.
        let gate = Arc::new(Semaphore::new(1));
        let claims = Batcher::<usize>::new(&gate, TEST_DEADLINE);
        let settles = Batcher::<usize>::new(&gate, TEST_DEADLINE);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let statements = Arc::new(AtomicUsize::new(0));
        let send = {
            let in_flight = Arc::clone(&in_flight);
            let statements = Arc::clone(&statements);
            move |batch: Vec<usize>| {
                let in_flight = Arc::clone(&in_flight);
                let statements = Arc::clone(&statements);
                async move {
                    assert_eq!(in_flight.fetch_add(1, Ordering::SeqCst), 0);
                    statements.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    (batch.iter().map(|_| Answer::NoRow).collect(), batch)
                }
            }
        };
        let mut calls = Vec::new();
        for i in 0..40 {
            let queue = Arc::clone(if i % 2 == 0 { &claims } else { &settles });
            let send = send.clone();
            calls.push(tokio::spawn(async move { queue.submit(i, send).await }));
            if i % 8 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        for (i, call) in calls.into_iter().enumerate() {
            let answered = call.await.unwrap();
            assert!(matches!(answered, Ok((Answer::NoRow, n)) if n == i));
        }
        // Batched: fewer statements than calls.
        assert!(statements.load(Ordering::SeqCst) < 40);
        assert_eq!(gate.available_permits(), 1);
        for queue in [&claims, &settles] {
            assert_eq!(queue.queue.lock().unwrap().running, 0);
        }
    }

    #[tokio::test]
    async fn h_32_a_runner_that_panics_fails_its_calls_and_the_waiting_ones_instead_of_hanging() {
        let batcher = Batcher::<usize>::new(&Arc::new(Semaphore::new(1)), TEST_DEADLINE);
        let send = |batch: Vec<usize>| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(batch.is_empty(), "a runner that panics");
            (Vec::new(), batch)
        };
        let first = {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move { batcher.submit(1, send).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let queued = {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move { batcher.submit(2, send).await })
        };
        for call in [first, queued] {
            let answered = tokio::time::timeout(Duration::from_secs(5), call)
                .await
                .expect("a call waited for a runner that had died")
                .unwrap();
            assert!(matches!(answered, Err(StoreError::Unavailable(_))));
        }
        assert_eq!(batcher.queue.lock().unwrap().running, 0);
    }

    #[tokio::test]
    async fn h_32_a_runner_that_ends_without_answering_fails_its_calls_and_gives_its_place_back() {
        let batcher = Batcher::<usize>::new(&Arc::new(Semaphore::new(1)), TEST_DEADLINE);
        let answered = batcher
            .submit(1, |batch: Vec<usize>| async move { (Vec::new(), batch) })
            .await;
        assert!(matches!(answered, Err(StoreError::Unavailable(_))));
        // Its place is free again: the next call is sent.
        let next = batcher
            .submit(2, |batch: Vec<usize>| async move {
                (batch.iter().map(|_| Answer::NoRow).collect(), batch)
            })
            .await;
        assert!(matches!(next, Ok((Answer::NoRow, 2))));
    }
}
