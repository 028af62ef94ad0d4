//! [`SqlStore`]: the one implementation of the [`Store`] traits, over a
//! [`Backend`] (PostgreSQL or SQLite) that supplies the pool, the write
//! transaction and its commit (which announces the change's events), the
//! few statements that differ ([`Dialect`]), and set-based fast paths
//! where it has them. Every transition is written once, as SQL both
//! databases understand (`$N` parameters, `RETURNING`, `ON CONFLICT`), in
//! the file of its aggregate.
//!
//! Each transition runs inside a [`Write`] (a transaction and the events to
//! announce once it commits), locks its task row first (PostgreSQL
//! `FOR UPDATE`; SQLite serialises writers with `BEGIN IMMEDIATE`) and
//! appends the task's history in the same transaction.
//!
//! Lock order, to keep PostgreSQL free of deadlocks: grants lock agent rows
//! (sorted by id) and then skip task rows that are locked, and after the
//! agents the concurrency limits they count against (key rows in key
//! order, then namespaces' advisory locks); a keyed submit on PostgreSQL
//! takes its queues' fair advisory locks (in lock id order) before the
//! reserved agents, and nothing else takes them; every other transition locks
//! task rows (in task id order within a batch), then lease rows, and never
//! agent rows or limits: an agent's load is the count of its live leases,
//! and a limit's the count of its running tasks, so final reports and
//! grants never queue on one agent row.
//!
//! # Layout
//! - `db`: the sqlx bounds the shared SQL needs ([`db::SqlDb`]).
//! - `rows`: column lists and decoding of records.
//! - `tasks`, `leases`, `reports`, `agents`, `tokens`, `history`: the
//!   shared SQL of each aggregate (`agents` and `tokens` with their
//!   [`AgentStore`](super::AgentStore) and
//!   [`TokenStore`](super::TokenStore) implementations); `limits`:
//!   concurrency limits, checked where grants are written; `fair`: fair
//!   share's ranks and clock;
//!   `queue`: the queue read in order and past its parked placements,
//!   counted and grouped; `cancel`: a task's cancel, which may revoke its
//!   lease;
//!   `output`: tasks' output, written with the lease reports, read in
//!   pages, bounded per task and per namespace (and its
//!   [`OutputStore`](super::OutputStore) implementation).

pub(crate) mod agents;
pub(crate) mod cancel;
pub(crate) mod db;
pub(crate) mod fair;
pub(crate) mod history;
pub(crate) mod leases;
pub(crate) mod limits;
pub(crate) mod output;
pub(crate) mod queue;
pub(crate) mod reports;
pub(crate) mod rows;
pub(crate) mod tasks;
pub(crate) mod tokens;

use std::collections::HashMap;

use async_trait::async_trait;
use sqlx::{Database, Pool, Transaction};
use switchyard_core::resources::Claim;
use tokio::sync::broadcast;
use uuid::Uuid;

use self::db::{BoxFuture, SqlDb, StatementExt};
use super::{Following, LeaseStore, Store, StoreOptions, TaskStore};
use crate::error::Result;
use crate::model::{
    Beat, BeatOutcome, Completion, CompletionResult, GrantOutcome, GrantRequest, LeaseRecord,
    LeaseReport, LimitUsage, Page, ParkedPlacement, QueueCursor, QueueGroupRow, ReportApplied,
    RevocationCause, StoreEvent, Submission, Submitted, TaskEventRecord, TaskFilter, TaskRecord,
    TaskState,
};

/// The statements that differ between the two databases, each written out
/// whole by its backend from the shared fragments.
pub trait Dialect: SqlDb {
    /// One task by id (`$1`), locked for the rest of the transaction.
    const LOCK_TASK: &'static str;
    /// Ids of live leases expired at `$1`, at most `$2`, in task id order;
    /// rows another replica is sweeping are skipped where the database can.
    const DUE_LEASES: &'static str;
    /// Ids of grants never acknowledged, granted before `$1`, of agent `$2`
    /// (any if NULL), in task id order, skipping as [`Dialect::DUE_LEASES`].
    const UNACKED_LEASES: &'static str;
    /// The head of the queue: leasable at `$1`, namespace `$2` (any if
    /// NULL), at most `$3`, leaving out the parked placements in `$4` (a
    /// JSON array of `[namespace, kind, placement text]` triples), in queue
    /// order.
    const QUEUE_HEAD: &'static str;
    /// As [`Dialect::QUEUE_HEAD`], after the cursor within its priority
    /// (`$5` priority, `$6` created at, `$7` id).
    const QUEUE_AFTER: &'static str;
    /// As [`Dialect::QUEUE_HEAD`], below the cursor's priority (`$5`).
    const QUEUE_BELOW: &'static str;
    /// The place (`priority`, `queue_rank`, `id`) of the first task
    /// leasable at `$1` whose placement is not one of the parked ones in
    /// `$2` (as `$4` of [`Dialect::QUEUE_HEAD`]), if any, and `capped`: if
    /// true the statement gave up (too many placements to take each) and
    /// the place says nothing. `None` where the database cannot find it
    /// without reading the parked tasks: a one-task page is read instead.
    const UNPARKED_HEAD: Option<&'static str>;
    /// As [`Dialect::UNPARKED_HEAD`], after the cursor (`$3` priority, `$4`
    /// rank, `$5` id).
    const UNPARKED_AFTER: Option<&'static str>;
    /// A concurrency key's limit (`max_running`; namespace `$1`, key `$2`),
    /// its row locked for the rest of the transaction where the database
    /// can.
    const LOCK_LIMIT_KEY: &'static str;
    /// Locks a namespace's limit of running tasks (namespace `$1`) for the
    /// rest of the transaction; `None` where one writer needs no lock.
    const LOCK_NAMESPACE: Option<&'static str>;
    /// Takes the output trim's lock for the rest of the transaction if no
    /// other transaction holds it: one row, `locked`, true if taken.
    const TRY_LOCK_OUTPUT_TRIM: &'static str;
}

/// A write transaction and the events to announce once it commits.
pub struct Write<DB: Database> {
    /// The transaction.
    tx: Transaction<'static, DB>,
    /// What changed, for every replica, announced by the commit.
    events: Vec<StoreEvent>,
    /// The writers' turn this write holds, if its backend takes turns
    /// (SQLite); released after the transaction, with the write.
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl<DB: Database> std::fmt::Debug for Write<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Write")
            .field("events", &self.events.len())
            .finish_non_exhaustive()
    }
}

impl<DB: Database> Write<DB> {
    /// A write in `tx`.
    pub(crate) fn new(tx: Transaction<'static, DB>) -> Self {
        Self {
            tx,
            events: Vec::new(),
            turn: None,
        }
    }

    /// A write in `tx`, holding the writers' turn `turn`.
    pub(crate) fn in_turn(
        tx: Transaction<'static, DB>,
        turn: tokio::sync::OwnedMutexGuard<()>,
    ) -> Self {
        Self {
            turn: Some(turn),
            ..Self::new(tx)
        }
    }

    /// The transaction's connection.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }

    /// Announces `event` once the transaction commits.
    pub(crate) fn announce(&mut self, event: StoreEvent) {
        self.events.push(event);
    }

    /// The events announced so far (a fast path may drop one it made moot).
    pub(crate) fn events_mut(&mut self) -> &mut Vec<StoreEvent> {
        &mut self.events
    }

    /// The transaction and its events, to commit, and the turn to release
    /// once it has.
    pub(crate) fn into_parts(
        self,
    ) -> (
        Transaction<'static, DB>,
        Vec<StoreEvent>,
        Option<tokio::sync::OwnedMutexGuard<()>>,
    ) {
        (self.tx, self.events, self.turn)
    }
}

/// What a backend supplies to [`SqlStore`]. Submits and grants are each
/// backend's own (set-based); the other fast-path hooks default to the
/// shared row-by-row SQL, and a backend with a set-based way overrides them.
#[async_trait]
pub trait Backend: std::fmt::Debug + Send + Sync + Sized + 'static {
    /// Its database, with the statements that differ.
    type Db: Dialect;
    /// `sqlite` or `postgres`, for logs and metrics.
    const NAME: &'static str;

    /// The connection pool.
    fn pool(&self) -> &Pool<Self::Db>;
    /// Starts a write transaction.
    async fn begin(&self) -> Result<Write<Self::Db>>;
    /// Starts a write transaction of a grant or a report batch, which may
    /// run on connections of their own ([`Backend::begin`]'s by default).
    async fn begin_batch(&self) -> Result<Write<Self::Db>> {
        self.begin().await
    }
    /// Commits `write`, then announces its events to every replica.
    async fn commit(&self, write: Write<Self::Db>) -> Result<()>;
    /// Runs the migrations (idempotent).
    async fn migrate(&self) -> Result<()>;
    /// Events from every replica.
    fn subscribe(&self) -> broadcast::Receiver<StoreEvent>;
    /// [`Store::follow_tasks`]: every change is heard where there is one
    /// replica.
    async fn follow_tasks(&self) -> Following {
        Following::always()
    }
    /// [`Store::follow_dispatch`]: likewise.
    async fn follow_dispatch(&self) -> Following {
        Following::always()
    }
    /// Closes the pool and stops the backend's tasks.
    async fn close(&self);

    /// [`TaskStore::submit_many`].
    async fn submit_many(
        &self,
        submissions: &[Submission],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<Result<Submitted>>>;
    /// Grants inside `w` (see [`LeaseStore::grant_leases`]).
    async fn grant(
        &self,
        w: &mut Write<Self::Db>,
        requests: &[GrantRequest],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<GrantOutcome>>;
    /// Final reports inside `w` (see [`LeaseStore::complete_leases`]).
    async fn complete(
        &self,
        w: &mut Write<Self::Db>,
        completions: &[Completion],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<Result<CompletionResult>>> {
        reports::complete_rows(w, completions, options, now_ms).await
    }
    /// The reports of a batch this backend settles before, and apart from,
    /// the batch's transaction, committed on their own: each one's answer,
    /// `None` for those left to [`Backend::apply_reports`] (by default all).
    async fn settle_apart(
        &self,
        reports: &[LeaseReport],
        _now_ms: i64,
    ) -> Result<Vec<Option<Result<ReportApplied>>>> {
        Ok(reports.iter().map(|_| None).collect())
    }
    /// Lease reports inside `w` (see [`LeaseStore::apply_reports`]).
    async fn apply_reports(
        &self,
        w: &mut Write<Self::Db>,
        reports: &[LeaseReport],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<Result<ReportApplied>>> {
        reports::apply_all(w, reports, options, now_ms).await
    }
    /// Heartbeats inside `w` (see [`AgentStore::heartbeats`](super::AgentStore::heartbeats)).
    async fn heartbeats(
        &self,
        w: &mut Write<Self::Db>,
        beats: &[Beat],
        now_ms: i64,
    ) -> Result<Vec<Result<BeatOutcome>>> {
        agents::heartbeat_rows(w, beats, now_ms).await
    }
}

/// The borrow a [`SqlStore::write`] or [`SqlStore::read`] closure gets:
/// `'t` lives within `'a`, so the closure may capture the caller's borrows.
pub type Within<'t, 'a> = &'t &'a ();

/// The store over a backend.
#[derive(Debug)]
pub struct SqlStore<B: Backend> {
    /// The database and what differs about it.
    pub(crate) backend: B,
    /// Retry backoff and other settings.
    pub(crate) options: StoreOptions,
}

/// A connection of `B`'s database.
type Conn<B> = <<B as Backend>::Db as Database>::Connection;

impl<B: Backend> SqlStore<B> {
    /// Runs `change` in one write transaction and commits it, announcing
    /// its events; nothing is committed if it fails.
    pub(crate) async fn write<'a, T, F>(&'a self, change: F) -> Result<T>
    where
        T: Send,
        F: for<'t> FnOnce(&'t mut Write<B::Db>, Within<'t, 'a>) -> BoxFuture<'t, Result<T>>
            + Send
            + 'a,
    {
        self.write_in(self.backend.begin().await?, change).await
    }

    /// [`SqlStore::write`] in the transaction `w` begun already (a grant's
    /// or a report batch's, [`Backend::begin_batch`]).
    async fn write_in<'a, T, F>(&'a self, mut w: Write<B::Db>, change: F) -> Result<T>
    where
        T: Send,
        F: for<'t> FnOnce(&'t mut Write<B::Db>, Within<'t, 'a>) -> BoxFuture<'t, Result<T>>
            + Send
            + 'a,
    {
        let out = change(&mut w, &&()).await?;
        self.backend.commit(w).await?;
        Ok(out)
    }

    /// Runs `read` on a pooled connection, outside any transaction.
    pub(crate) async fn read<'a, T, F>(&'a self, read: F) -> Result<T>
    where
        T: Send,
        F: for<'c> FnOnce(&'c mut Conn<B>, Within<'c, 'a>) -> BoxFuture<'c, Result<T>> + Send + 'a,
    {
        let mut conn = self
            .backend
            .pool()
            .acquire()
            .await
            .map_err(super::plan::db("acquiring a connection"))?;
        read(&mut conn, &&()).await
    }
}

#[async_trait]
impl<B: Backend> TaskStore for SqlStore<B> {
    async fn submit_many(
        &self,
        submissions: &[Submission],
        now_ms: i64,
    ) -> Result<Vec<Result<Submitted>>> {
        self.backend
            .submit_many(submissions, &self.options, now_ms)
            .await
    }

    async fn get_task(&self, task_id: Uuid) -> Result<TaskRecord> {
        self.read(|c, _| Box::pin(tasks::must_fetch::<B::Db>(c, task_id)))
            .await
    }

    async fn list_tasks(
        &self,
        filter: &TaskFilter,
        page: &Page,
    ) -> Result<(Vec<TaskRecord>, Option<String>)> {
        self.read(|c, _| Box::pin(tasks::list::<B::Db>(c, filter, page)))
            .await
    }

    async fn task_events(
        &self,
        task_id: Uuid,
        after_sequence: u64,
        limit: u32,
    ) -> Result<Vec<TaskEventRecord>> {
        self.read(|c, _| Box::pin(history::list::<B::Db>(c, task_id, after_sequence, limit)))
            .await
    }

    async fn queued_tasks(
        &self,
        namespace: Option<&str>,
        now_ms: i64,
        after: Option<&QueueCursor>,
        parked: &[ParkedPlacement],
        limit: u32,
    ) -> Result<Vec<TaskRecord>> {
        self.read(|c, _| {
            Box::pin(queue::queue_page::<B::Db>(
                c, namespace, now_ms, after, parked, limit,
            ))
        })
        .await
    }

    async fn first_unparked(
        &self,
        now_ms: i64,
        after: Option<&QueueCursor>,
        parked: &[ParkedPlacement],
    ) -> Result<Option<QueueCursor>> {
        self.read(|c, _| Box::pin(queue::first_unparked::<B::Db>(c, now_ms, after, parked)))
            .await
    }

    async fn cancel_task(
        &self,
        task_id: Uuid,
        reason: &str,
        grace_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<(TaskRecord, Option<LeaseRecord>)> {
        self.write(|w, _| Box::pin(cancel::cancel(w, task_id, reason, grace_ms, now_ms)))
            .await
    }

    async fn unstarted_overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<TaskRecord>> {
        self.read(|c, _| Box::pin(tasks::unstarted_overdue::<B::Db>(c, now_ms, limit)))
            .await
    }

    async fn fail_unstarted(
        &self,
        task_id: Uuid,
        error: &serde_json::Value,
        message: &str,
        now_ms: i64,
    ) -> Result<Option<TaskRecord>> {
        self.write(|w, _| Box::pin(tasks::fail_unstarted(w, task_id, error, message, now_ms)))
            .await
    }

    async fn set_concurrency_limit(
        &self,
        namespace: &str,
        key: &str,
        limit: u32,
        now_ms: i64,
    ) -> Result<()> {
        self.write(|w, _| Box::pin(limits::set_limit(w, namespace, key, limit, now_ms)))
            .await
    }

    async fn concurrency_limit(&self, namespace: &str, key: &str) -> Result<Option<u32>> {
        self.read(|c, _| Box::pin(limits::limit_of::<B::Db>(c, namespace, key)))
            .await
    }

    async fn limit_usage(&self, namespace: &str, key: Option<&str>) -> Result<LimitUsage> {
        let per_namespace = self.options.max_running_per_namespace;
        self.read(|c, _| Box::pin(limits::usage::<B::Db>(c, namespace, key, per_namespace)))
            .await
    }

    async fn count_tasks(&self) -> Result<Vec<(String, TaskState, u64)>> {
        self.read(|c, _| Box::pin(tasks::count_live::<B::Db>(c)))
            .await
    }

    async fn queued_in_namespace(&self, namespace: &str) -> Result<u64> {
        self.read(|c, _| Box::pin(queue::count_queued::<B::Db>(c, namespace)))
            .await
    }

    async fn queue_groups(
        &self,
        namespace: &str,
        now_ms: i64,
        limit: u32,
    ) -> Result<(Vec<QueueGroupRow>, u64)> {
        self.read(|c, _| Box::pin(queue::queue_groups::<B::Db>(c, namespace, now_ms, limit)))
            .await
    }
}

#[async_trait]
impl<B: Backend> LeaseStore for SqlStore<B> {
    async fn grant_leases(
        &self,
        requests: &[GrantRequest],
        now_ms: i64,
    ) -> Result<Vec<GrantOutcome>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let (backend, options) = (&self.backend, &self.options);
        let w = backend.begin_batch().await?;
        self.write_in(w, |w, _| {
            Box::pin(backend.grant(w, requests, options, now_ms))
        })
        .await
    }

    async fn ack_leases(&self, agent_id: Uuid, leases: &[(Uuid, u64)], now_ms: i64) -> Result<u64> {
        self.write(|w, _| Box::pin(leases::ack(w, agent_id, leases, now_ms)))
            .await
    }

    async fn renew_leases(&self, agent_id: Uuid, now_ms: i64) -> Result<u64> {
        let renewed = self
            .write(|w, _| Box::pin(leases::renew(w, agent_id, now_ms)))
            .await?;
        Ok(renewed.len() as u64)
    }

    async fn complete_leases(
        &self,
        completions: &[Completion],
        now_ms: i64,
    ) -> Result<Vec<Result<CompletionResult>>> {
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let (backend, options) = (&self.backend, &self.options);
        self.write(|w, _| Box::pin(backend.complete(w, completions, options, now_ms)))
            .await
    }

    async fn apply_reports(
        &self,
        reports: &[LeaseReport],
        now_ms: i64,
    ) -> Result<Vec<Result<ReportApplied>>> {
        if reports.is_empty() {
            return Ok(Vec::new());
        }
        let (backend, options) = (&self.backend, &self.options);
        let mut results = backend.settle_apart(reports, now_ms).await?;
        let rest: Vec<usize> = (0..reports.len())
            .filter(|&i| results[i].is_none())
            .collect();
        if rest.is_empty() {
            return Ok(reports::decided(results, "applying lease reports"));
        }
        let subset: Vec<LeaseReport>;
        let undecided = if rest.len() == reports.len() {
            reports
        } else {
            subset = rest.iter().map(|&i| reports[i].clone()).collect();
            &subset
        };
        let w = backend.begin_batch().await?;
        let applied = self
            .write_in(w, |w, _| {
                Box::pin(backend.apply_reports(w, undecided, options, now_ms))
            })
            .await?;
        for (i, answer) in rest.into_iter().zip(applied) {
            results[i] = Some(answer);
        }
        Ok(reports::decided(results, "applying lease reports"))
    }

    async fn revoke_unacked(
        &self,
        agent_id: Option<Uuid>,
        older_than_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<(LeaseRecord, TaskRecord)>> {
        let options = &self.options;
        self.write(|w, _| {
            Box::pin(leases::revoke_unacked(
                w,
                agent_id,
                older_than_ms,
                now_ms,
                options,
            ))
        })
        .await
    }

    async fn expire_leases(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<(LeaseRecord, TaskRecord)>> {
        let options = &self.options;
        self.write(|w, _| Box::pin(leases::expire(w, now_ms, limit, options)))
            .await
    }

    async fn reclaim_overdue(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<(LeaseRecord, TaskRecord, RevocationCause)>> {
        let options = &self.options;
        self.write(|w, _| Box::pin(leases::reclaim_overdue(w, now_ms, limit, options)))
            .await
    }

    async fn agent_leases(&self, agent_id: Uuid) -> Result<Vec<LeaseRecord>> {
        self.read(|c, _| Box::pin(leases::live_of::<B::Db>(c, agent_id)))
            .await
    }

    async fn get_lease(&self, lease_id: Uuid) -> Result<LeaseRecord> {
        self.read(|c, _| Box::pin(leases::must_fetch::<B::Db>(c, lease_id)))
            .await
    }

    async fn live_claims(&self, agent_ids: &[Uuid]) -> Result<HashMap<Uuid, Vec<(Uuid, Claim)>>> {
        self.read(|c, _| Box::pin(leases::live_claims::<B::Db>(c, agent_ids, false)))
            .await
    }

    async fn task_refusals(&self, task_id: Uuid) -> Result<Vec<(Uuid, String)>> {
        self.read(|c, _| Box::pin(tasks::refusals::<B::Db>(c, task_id)))
            .await
    }

    async fn agent_refusals(&self, agent_id: Uuid) -> Result<Vec<Uuid>> {
        self.read(|c, _| Box::pin(tasks::agent_refusals::<B::Db>(c, agent_id)))
            .await
    }

    async fn failed_agents(&self, task_id: Uuid) -> Result<Vec<Uuid>> {
        self.read(|c, _| Box::pin(leases::failed_agents::<B::Db>(c, task_id)))
            .await
    }
}

#[async_trait]
impl<B: Backend> Store for SqlStore<B> {
    fn backend(&self) -> &'static str {
        B::NAME
    }

    async fn migrate(&self) -> Result<()> {
        self.backend.migrate().await
    }

    async fn ping(&self) -> Result<()> {
        self.read(|c, _| Box::pin(ping::<B::Db>(c))).await
    }

    async fn close(&self) {
        self.backend.close().await;
    }

    fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.backend.subscribe()
    }

    async fn follow_tasks(&self) -> Following {
        self.backend.follow_tasks().await
    }

    async fn follow_dispatch(&self) -> Following {
        self.backend.follow_dispatch().await
    }
}

/// Succeeds while the database answers a trivial statement.
async fn ping<DB: SqlDb>(conn: &mut DB::Connection) -> Result<()> {
    db::query::<DB>("SELECT 1")
        .run(conn)
        .await
        .map_err(super::plan::db("pinging"))?;
    Ok(())
}
