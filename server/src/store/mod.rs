//! The task store: where agents, tasks, leases, task history, tasks'
//! output and tokens live. The seam is the [`Store`] trait (one sub-trait per aggregate),
//! shared as `Arc<dyn Store>` and chosen at start-up from the database URL:
//! PostgreSQL for many replicas on one database, SQLite as the embedded
//! default that needs nothing installed. Both are one implementation,
//! [`SqlStore`], over a backend that supplies the connection, the
//! transaction and the few statements that differ.
//!
//! Every method that changes something runs in one transaction, appends the
//! task history in that same transaction, and announces what changed
//! through [`Store::subscribe`] on every replica once it commits. Times are
//! passed in (`now_ms`, Unix milliseconds): the store never reads the clock.
//!
//! # Layout
//! - [`plan`]: the decisions apart from the SQL (which grants fit, what a
//!   final report does, whether a report comes from the lease holder).
//! - `sql`: [`SqlStore`] and its backend seam; the shared SQL by aggregate
//!   (`tasks`, `leases`, `reports`, `agents`, `tokens`, `history`,
//!   `output`), the row
//!   decoding (`rows`) and the sqlx bounds it needs (`db`).
//! - `postgres`: the PostgreSQL backend ([`PgStore`]): LISTEN/NOTIFY,
//!   connection warm-up, and the set-based paths for submits, grants,
//!   whole attempts, completions and heartbeats.
//! - `sqlite`: the SQLite backend ([`SqliteStore`]): `BEGIN IMMEDIATE`
//!   writes, an in-process channel for events.
//! - Migrations: `server/migrations/{postgres,sqlite}/`, embedded with
//!   `sqlx::migrate!` and run by [`Store::migrate`].

pub mod plan;
mod postgres;
mod sql;
mod sqlite;
#[cfg(test)]
pub(crate) mod test_db;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use switchyard_core::resources::Claim;
use tokio::sync::broadcast;
use uuid::Uuid;

pub use postgres::{PgBackend, PgStore};
pub use sql::{Backend, SqlStore};
pub use sqlite::{SqliteBackend, SqliteStore};

use crate::error::{Error, Result};
use crate::model::{
    AgentParts, AgentRecord, AgentRegistration, AgentStatus, Beat, BeatOutcome, Completion,
    CompletionResult, DEFAULT_BACKOFF_BASE_MS, DEFAULT_MAX_RELEASES, GrantOutcome, GrantRequest,
    LeaseRecord, LeaseReport, LimitUsage, OutputBounds, Page, ParkedPlacement, QueueCursor,
    QueueGroupRow, ReportApplied, RevocationCause, StoreEvent, StoredChunk, Submission, Submitted,
    TaskEventRecord, TaskFilter, TaskRecord, TaskState, TokenRecord,
};

/// The ListTasks page token that continues after `task`.
pub fn task_page_token(task: &TaskRecord) -> String {
    plan::task_cursor(task.created_at_ms, task.id)
}

/// Whether `token` is a ListTasks page token this server issued (a task
/// listing's cursor); the store refuses any other (INVALID_ARGUMENT).
pub fn is_task_page_token(token: &str) -> bool {
    plan::parse_task_cursor(token).is_some()
}

/// Tasks: submitted, read, listed, walked in queue order, canceled.
#[async_trait]
pub trait TaskStore: Send + Sync {
    /// Submits several tasks in one transaction (one commit). With an
    /// idempotency key already used in the namespace, a submit returns the
    /// existing task and `false`. A task with a reserved agent (the
    /// dispatcher matched it in memory on the way in) is also leased to it
    /// in that transaction: one commit from submit to lease. Its outcome is
    /// `None` for an idempotent repeat, and a refused grant leaves the task
    /// QUEUED for the dispatcher. Results are in order; a task the store
    /// refuses (a bad argument) gets its own error, while a failing
    /// statement fails the whole batch (nothing of it is stored).
    async fn submit_many(
        &self,
        submissions: &[Submission],
        now_ms: i64,
    ) -> Result<Vec<Result<Submitted>>>;
    /// One task; `NotFound` if missing.
    async fn get_task(&self, task_id: Uuid) -> Result<TaskRecord>;
    /// Tasks of a namespace, newest first, and the cursor of the next page.
    async fn list_tasks(
        &self,
        filter: &TaskFilter,
        page: &Page,
    ) -> Result<(Vec<TaskRecord>, Option<String>)>;
    /// A task's history after `after_sequence`, oldest first.
    async fn task_events(
        &self,
        task_id: Uuid,
        after_sequence: u64,
        limit: u32,
    ) -> Result<Vec<TaskEventRecord>>;
    /// The dispatcher's candidates: QUEUED tasks whose `not_before` has
    /// passed, by priority (higher first) then rank (first-in first-out,
    /// keyed tasks at their fair rank), after `after`, leaving out those of
    /// the `parked` placements.
    async fn queued_tasks(
        &self,
        namespace: Option<&str>,
        now_ms: i64,
        after: Option<&QueueCursor>,
        parked: &[ParkedPlacement],
        limit: u32,
    ) -> Result<Vec<TaskRecord>>;
    /// Where [`TaskStore::queued_tasks`] after `after` (`None`: the head)
    /// would start: the place in the queue (as a cursor just after it) of
    /// the first QUEUED task due at `now_ms` whose placement is not one of
    /// `parked`; `None` if there is none.
    /// On PostgreSQL it reads no parked task: it takes each distinct
    /// placement of the queue once (an index by placement), so a million
    /// parked tasks cost it what their placements do; past 1,024 distinct
    /// placements it reads the queue down to that task, as a page would.
    /// So does SQLite, always.
    async fn first_unparked(
        &self,
        now_ms: i64,
        after: Option<&QueueCursor>,
        parked: &[ParkedPlacement],
    ) -> Result<Option<QueueCursor>>;
    /// Cancels a task: QUEUED becomes CANCELED at once; LEASED or RUNNING
    /// get `cancel_requested` and the lease to revoke is returned; terminal
    /// tasks are returned unchanged. With a grace (`grace_ms`, else the
    /// task's `cancel_grace_ms`) the lease is ended at now plus the grace
    /// if the agent has not ended it (see [`LeaseStore::reclaim_overdue`]);
    /// a second cancel may bring that deadline forward, never back.
    async fn cancel_task(
        &self,
        task_id: Uuid,
        reason: &str,
        grace_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<(TaskRecord, Option<LeaseRecord>)>;
    /// Queued tasks past their start deadline (due, and not granted within
    /// their start timeout), at most `limit`, the earliest deadlines, in id
    /// order: the sweeper explains each and fails it with
    /// [`TaskStore::fail_unstarted`]. Costs an index probe while no task
    /// has a start timeout.
    async fn unstarted_overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<TaskRecord>>;
    /// Fails a task past its start deadline with `error`, its history
    /// saying `message`; `None` (nothing changed) if it is no longer queued
    /// or no longer overdue (it was granted, or a retry made it due later).
    async fn fail_unstarted(
        &self,
        task_id: Uuid,
        error: &serde_json::Value,
        message: &str,
        now_ms: i64,
    ) -> Result<Option<TaskRecord>>;
    /// Sets a concurrency key's limit of running tasks, for every task of
    /// the key from now on.
    async fn set_concurrency_limit(
        &self,
        namespace: &str,
        key: &str,
        limit: u32,
        now_ms: i64,
    ) -> Result<()>;
    /// A concurrency key's limit; `None` if it never had one.
    async fn concurrency_limit(&self, namespace: &str, key: &str) -> Result<Option<u32>>;
    /// How full the limits a task of `namespace` (with concurrency key
    /// `key`) is held to are: its key's, and the namespace's if the store
    /// limits running tasks per namespace.
    async fn limit_usage(&self, namespace: &str, key: Option<&str>) -> Result<LimitUsage>;
    /// Counts of live (QUEUED, LEASED, RUNNING) tasks by namespace and state,
    /// for metrics; a namespace and state with none is absent. Costs the
    /// queue's length and the live leases, not the tasks ever run.
    async fn count_tasks(&self) -> Result<Vec<(String, TaskState, u64)>>;
    /// Queued tasks of a namespace (for its cap).
    async fn queued_in_namespace(&self, namespace: &str) -> Result<u64>;
    /// A namespace's queued tasks grouped by kind and placement, at most
    /// `limit` groups, the largest first (a task not due at `now_ms` counts
    /// as not yet due); with the number of groups in all. Costs one pass
    /// over the queued tasks of the namespace.
    async fn queue_groups(
        &self,
        namespace: &str,
        now_ms: i64,
        limit: u32,
    ) -> Result<(Vec<QueueGroupRow>, u64)>;
}

/// Leases: granted, acknowledged, renewed, reported on, swept.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Leases tasks to agents, all in one transaction; each request is
    /// granted only if its task is still QUEUED and its agent under
    /// capacity, and its claim within what the agent offers beside what its
    /// live leases hold, checked in that transaction (the request's `seen`
    /// may spare reading the leases, never changes the answer).
    async fn grant_leases(
        &self,
        requests: &[GrantRequest],
        now_ms: i64,
    ) -> Result<Vec<GrantOutcome>>;
    /// The agent acknowledged these grants (GRANTED to ACTIVE); returns how
    /// many it still held.
    async fn ack_leases(&self, agent_id: Uuid, leases: &[(Uuid, u64)], now_ms: i64) -> Result<u64>;
    /// Extends every live lease of the agent to now plus its task's TTL, in
    /// one statement; returns how many.
    async fn renew_leases(&self, agent_id: Uuid, now_ms: i64) -> Result<u64>;
    /// Final reports, in one transaction; a refused item (stale token, lease
    /// not held) changes nothing and does not affect the others.
    async fn complete_leases(
        &self,
        completions: &[Completion],
        now_ms: i64,
    ) -> Result<Vec<Result<CompletionResult>>>;
    /// Lease reports of many sessions (accepted, started, progress, output,
    /// final), in one transaction: the server's group commit. Reports about
    /// one task are applied in the order given, but output first: a batch's
    /// output is written before its other reports, checked against the
    /// lease as it was before the batch (a runner sends a lease's output
    /// before its final report). Output is kept within the store's
    /// [`OutputBounds`] per task (the oldest dropped first), a chunk already
    /// stored is skipped, and a failed attempt's error gets the last lines
    /// of its output (`output_tail`). A refused report (stale token, lease
    /// not held, wrong state) changes nothing and does not affect the
    /// others; a database failure fails the whole batch.
    async fn apply_reports(
        &self,
        reports: &[LeaseReport],
        now_ms: i64,
    ) -> Result<Vec<Result<ReportApplied>>>;
    /// Revokes grants never acknowledged and granted before
    /// `older_than_ms`, of one agent (`Some`: its session ended, so no
    /// acknowledgement is coming) or of every agent (the sweeper's ack
    /// window): leases RELEASED, tasks back to QUEUED without counting an
    /// attempt.
    async fn revoke_unacked(
        &self,
        agent_id: Option<Uuid>,
        older_than_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<(LeaseRecord, TaskRecord)>>;
    /// The sweeper: expired live leases become EXPIRED and their tasks go
    /// back to QUEUED with one more attempt, or to FAILED (`lease lost N
    /// times`) at the budget. Safe with every replica sweeping at once.
    async fn expire_leases(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<(LeaseRecord, TaskRecord)>>;
    /// The sweeper: live leases past a deadline end, whatever their
    /// renewals, each by the deadline that passed (its cause): a
    /// cancel-requested lease past its grace (the task CANCELED), an
    /// attempt past its execution timeout (counted as failed, code
    /// `timeout`: retried after the task's backoff, or FAILED at the
    /// budget), a lease of an agent past its drain deadline (the task
    /// requeued at once, counted as a hand-back). Costs nothing while no
    /// task or agent has a deadline; safe with every replica sweeping.
    async fn reclaim_overdue(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<(LeaseRecord, TaskRecord, RevocationCause)>>;
    /// The agent's live (GRANTED or ACTIVE) leases.
    async fn agent_leases(&self, agent_id: Uuid) -> Result<Vec<LeaseRecord>>;
    /// One lease; `NotFound` if missing.
    async fn get_lease(&self, lease_id: Uuid) -> Result<LeaseRecord>;
    /// What the live (granted or active) leases of each of these agents
    /// hold, by task (slots, and the claims of tasks with resource
    /// requests); an agent holding none is absent.
    async fn live_claims(&self, agent_ids: &[Uuid]) -> Result<HashMap<Uuid, Vec<(Uuid, Claim)>>>;
    /// The agents that refused the task (they cannot handle or decode it),
    /// with what each said; an agent's refusals end when it changes its
    /// kinds or document, or registers again.
    async fn task_refusals(&self, task_id: Uuid) -> Result<Vec<(Uuid, String)>>;
    /// The tasks the agent refused (see [`LeaseStore::task_refusals`]).
    async fn agent_refusals(&self, agent_id: Uuid) -> Result<Vec<Uuid>>;
    /// The agents on which earlier attempts of the task failed or lost
    /// their lease (expired), in id order: a retry avoids them.
    async fn failed_agents(&self, task_id: Uuid) -> Result<Vec<Uuid>>;
}

/// A task's output: written with the lease reports that carry it (see
/// [`LeaseStore::apply_reports`]), read by byte offset, bounded per
/// namespace.
#[async_trait]
pub trait OutputStore: Send + Sync {
    /// A task's output from `from_byte` on (the chunks that start there or
    /// later), oldest first, only the lease with `fencing_token` if given;
    /// at most `limit` chunks.
    async fn task_output(
        &self,
        task_id: Uuid,
        from_byte: u64,
        fencing_token: Option<u64>,
        limit: u32,
    ) -> Result<Vec<StoredChunk>>;
    /// Keeps each namespace within its bound of kept output
    /// ([`OutputBounds::per_namespace`]): the output of a namespace past it
    /// is dropped from its oldest tasks on (each keeps its last chunk,
    /// without text, as the mark of where its output ended) until it is a
    /// tenth under. Answers the bytes dropped. Safe with every replica
    /// sweeping: one trims at a time, the others skip.
    async fn trim_output(&self) -> Result<u64>;
}

/// A document an agent reported, as the server stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportedDocument {
    /// The agent's own tiers merged (what its diffs apply to).
    pub reported: serde_json::Value,
    /// With the operator tier merged over it: what the matcher sees.
    pub document: serde_json::Value,
    /// Which tier every leaf of `document` came from.
    pub provenance: serde_json::Value,
    /// What the agent and the server refused or redacted.
    pub rejections: serde_json::Value,
}

/// Agents: registered, read, listed, their documents and status.
#[async_trait]
pub trait AgentStore: Send + Sync {
    /// Registers an agent (upsert on namespace and name): the same id, a new
    /// session epoch and generation.
    async fn register_agent(
        &self,
        registration: &AgentRegistration,
        now_ms: i64,
    ) -> Result<AgentRecord>;
    /// One agent; `NotFound` if missing.
    async fn get_agent(&self, agent_id: Uuid) -> Result<AgentRecord>;
    /// Agents of a namespace by name, optionally only some statuses.
    async fn list_agents(
        &self,
        namespace: &str,
        statuses: &[AgentStatus],
        page: &Page,
        parts: AgentParts,
    ) -> Result<(Vec<AgentRecord>, Option<String>)>;
    /// `parts` of the agents with these ids (those that exist), in no
    /// order.
    async fn agents_by_ids(&self, ids: &[Uuid], parts: AgentParts) -> Result<Vec<AgentRecord>>;
    /// The ids of a namespace's agents, by name (all of them at once: an
    /// id is all a caller that has the agents' views at hand needs).
    async fn agent_ids(&self, namespace: &str) -> Result<Vec<Uuid>>;
    /// Registered agents of a namespace (for its cap).
    async fn agents_in_namespace(&self, namespace: &str) -> Result<u64>;
    /// Replaces the agent's document (a snapshot) if its generation is
    /// still `expected_generation`; returns the new generation.
    async fn update_agent_document(
        &self,
        agent_id: Uuid,
        expected_generation: u64,
        document: &ReportedDocument,
        now_ms: i64,
    ) -> Result<u64>;
    /// Replaces the operator tier (and the merged document it yields).
    async fn set_operator_overrides(
        &self,
        agent_id: Uuid,
        overrides: &serde_json::Value,
        document: &serde_json::Value,
        provenance: &serde_json::Value,
        now_ms: i64,
    ) -> Result<AgentRecord>;
    /// Sets the status, only while the session epoch is still
    /// `session_epoch` when given; returns whether it changed anything.
    async fn set_agent_status(
        &self,
        agent_id: Uuid,
        status: AgentStatus,
        reasons: &[String],
        session_epoch: Option<u64>,
        now_ms: i64,
    ) -> Result<bool>;
    /// Marks the agent READY for a new session of `session_epoch` (DRAINING
    /// while an operator drains it), as [`AgentStore::set_agent_status`]
    /// does, and returns it as stored: `None` when it has registered again
    /// since (the epoch moved on) or is gone.
    async fn ready_for_session(
        &self,
        agent_id: Uuid,
        session_epoch: u64,
        now_ms: i64,
    ) -> Result<Option<AgentRecord>>;
    /// Starts or ends an operator drain. A drain with a deadline: the
    /// leases the agent still holds at `deadline_ms` are revoked and their
    /// tasks requeued (see [`LeaseStore::reclaim_overdue`]); ending a drain
    /// clears it.
    async fn set_agent_drained(
        &self,
        agent_id: Uuid,
        drained: bool,
        reason: Option<String>,
        deadline_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<AgentRecord>;
    /// Heartbeats of many sessions in one transaction: every agent's live
    /// leases renewed to now plus their TTL, the agent touched, a changed
    /// status written (while the session is current) and a changed document
    /// written if its generation still holds; each beat's outcome names the
    /// leases it renewed and their new expiries. Document writes announce
    /// nothing: the session that made them updates its replica's index, and
    /// no other replica holds that agent.
    async fn heartbeats(&self, beats: &[Beat], now_ms: i64) -> Result<Vec<Result<BeatOutcome>>>;
}

/// Bearer tokens, by the SHA-256 of the token.
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// Stores a token's record under its SHA-256 (hex).
    async fn insert_token(&self, token: &TokenRecord, hash: &str) -> Result<()>;
    /// Whether any token was created (auth is then on).
    async fn any_tokens(&self) -> Result<bool>;
    /// The record of the token with this SHA-256 (hex), if any (revoked
    /// and expired ones too: the caller checks [`TokenRecord::valid_at`]).
    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>>;
    /// Every token of `namespace` (of all namespaces if empty), revoked and
    /// expired ones too.
    async fn list_tokens(&self, namespace: &str) -> Result<Vec<TokenRecord>>;
    /// Revokes, as of `at_ms`, the tokens called `name` in `namespace`;
    /// how many were.
    async fn revoke_token(&self, namespace: &str, name: &str, at_ms: i64) -> Result<u64>;
    /// Replaces the current token called `name` by the one with `new_hash`
    /// (same role and agent names), revoking the old one `grace_ms` after
    /// `now_ms`; `None` when no current token has that name.
    async fn rotate_token(
        &self,
        namespace: &str,
        name: &str,
        new_hash: &str,
        expires_at_ms: Option<i64>,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<Option<TokenRecord>>;
    /// Notes that the token with this hash was used at `at_ms`.
    async fn touch_token(&self, hash: &str, at_ms: i64) -> Result<()>;
}

/// The operations the server needs from its database.
#[async_trait]
pub trait Store:
    TaskStore + LeaseStore + AgentStore + TokenStore + OutputStore + std::fmt::Debug + 'static
{
    /// Which backend this is (`sqlite` or `postgres`), for logs and metrics.
    fn backend(&self) -> &'static str;
    /// Runs the backend's migrations (idempotent).
    async fn migrate(&self) -> Result<()>;
    /// Succeeds while the database answers; health reporting polls it.
    async fn ping(&self) -> Result<()>;
    /// Closes the pool, waiting for in-flight statements.
    async fn close(&self);
    /// Events from every replica (this one included) from now on; agent
    /// changes and lease ends only from other replicas (a change made here
    /// is applied to this replica by whoever made it). Another replica's
    /// events only while this one reads them: tasks queued, agents changed
    /// and leases ended or revoked while it holds
    /// [`Store::follow_dispatch`] or [`Store::follow_tasks`], tasks'
    /// changes and output (which only watchers read) while it holds
    /// [`Store::follow_tasks`].
    fn subscribe(&self) -> broadcast::Receiver<StoreEvent>;
    /// Follows tasks' changes and output, and the dispatcher's events, from
    /// every replica while the answer is held: once this returns, the other
    /// replicas notify them (they are told, and have answered, or will hear
    /// of it from their next count). Taken before a watcher of a task or of
    /// the queue subscribes.
    async fn follow_tasks(&self) -> Following;
    /// Follows the dispatcher's events from every replica (tasks queued,
    /// agents changed, leases ended or revoked) while the answer is held,
    /// as [`Store::follow_tasks`] does. Taken before an agent's session
    /// reads the store, and before a watcher of the fleet subscribes.
    async fn follow_dispatch(&self) -> Following;
}

/// Held while something on this replica reads the other replicas' events
/// (an agent's session, a watcher of the fleet, of a task or of the
/// queue); see [`Store::follow_dispatch`] and [`Store::follow_tasks`].
#[must_use = "the other replicas' events are read only while this is held"]
pub struct Following(#[allow(dead_code)] Option<Box<dyn Send + Sync>>);

impl Following {
    /// Nothing to hold: every change reaches this replica anyway (one
    /// replica alone, on SQLite).
    pub fn always() -> Self {
        Self(None)
    }

    /// Followed while `held` is not dropped.
    pub(crate) fn held(held: impl Send + Sync + 'static) -> Self {
        Self(Some(Box::new(held)))
    }
}

impl std::fmt::Debug for Following {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Following")
    }
}

/// Settings of a store beyond its URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// The first retry delay after a failed attempt; doubles per attempt up
    /// to [`crate::model::MAX_BACKOFF_MS`]. Tests shorten it.
    pub backoff_base_ms: i64,
    /// How many times a task may be handed back without an attempt before
    /// it FAILS (see [`DEFAULT_MAX_RELEASES`]).
    pub max_releases: u32,
    /// The most tasks of one namespace LEASED or RUNNING at once, enforced
    /// by grants (0: no limit).
    pub max_running_per_namespace: u64,
    /// How much of the tasks' output is kept.
    pub output: OutputBounds,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            backoff_base_ms: DEFAULT_BACKOFF_BASE_MS,
            max_releases: DEFAULT_MAX_RELEASES,
            max_running_per_namespace: 0,
            output: OutputBounds::default(),
        }
    }
}

/// Opens the store a database URL names: `sqlite://PATH` (created if
/// missing) or `postgres://…`.
pub async fn open(url: &str) -> Result<Arc<dyn Store>> {
    open_with(url, StoreOptions::default()).await
}

/// [`open`] with settings.
pub async fn open_with(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url, options).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PgStore::open(url, options).await?))
    } else {
        Err(Error::UnsupportedDatabaseUrl(redact_url(url)))
    }
}

/// The URL without its password, for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:[redacted]{}", &url[..scheme_end + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redact_url_hides_the_password_only() {
        assert_eq!(
            redact_url("postgres://app:hunter2@db:5432/sy"),
            "postgres://app:[redacted]@db:5432/sy"
        );
        assert_eq!(
            redact_url("sqlite://switchyard.db"),
            "sqlite://switchyard.db"
        );
    }
}
