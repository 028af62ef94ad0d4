//! The task store: where agents, tasks, leases and task history live. A
//! trait with two implementations, chosen at start-up from the database URL
//! and shared as `Arc<dyn Store>`: PostgreSQL for many replicas on one
//! database, SQLite as the embedded default that needs nothing installed.
//!
//! # Layout
//! - `model`: the records and inputs (plain Rust mirrors of the contract)
//!   and [`StoreEvent`], the wake-ups every replica hears.
//! - `common`: the transitions both backends share, written once as SQL
//!   both understand, and the lock order that keeps them deadlock-free.
//! - [`PgStore`]: PostgreSQL (set-based grants, `SKIP LOCKED` sweeps,
//!   LISTEN/NOTIFY); [`SqliteStore`]: the embedded file (`BEGIN IMMEDIATE`
//!   writes, an in-process channel for events).
//! - Migrations: `server/migrations/{postgres,sqlite}/`, embedded with
//!   `sqlx::migrate!` and run by [`Store::migrate`].

mod common;
mod model;
mod postgres;
mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::broadcast;
use uuid::Uuid;

pub use model::{
    AgentRecord, AgentRegistration, Beat, BeatApplied, Completion, CompletionOutcome,
    CompletionResult, DEFAULT_BACKOFF_BASE_MS, DocumentWrite, EndedLease, GrantOutcome,
    GrantRefusal, GrantRequest, LeaseRecord, LeaseReport, LeaseState, MAX_BACKOFF_MS, NewTask,
    Page, ParkedPlacement, QueueCursor, ReportApplied, ReportKind, StoreEvent, Submission,
    Submitted, TaskEventRecord, TaskFilter, TaskRecord, TaskState, TokenRecord, UnknownState,
    backoff_ms,
};
pub use postgres::PgStore;
pub use sqlite::SqliteStore;

use crate::error::{Error, Result};

/// Whether `token` is a ListTasks page token this server issued (a task
/// listing's cursor); the store refuses any other (INVALID_ARGUMENT).
pub fn is_task_page_token(token: &str) -> bool {
    common::parse_task_cursor(token).is_some()
}

/// The operations the server needs from its database. Every method that
/// changes something runs in one transaction, appends the task history in
/// that same transaction, and announces what changed through
/// [`Store::subscribe`] on every replica once it commits. Times are passed
/// in (`now_ms`, Unix milliseconds): the store never reads the clock.
#[async_trait]
pub trait Store: std::fmt::Debug + Send + Sync + 'static {
    /// Which backend this is (`sqlite` or `postgres`), for logs and metrics.
    fn backend(&self) -> &'static str;
    /// Runs the backend's migrations (idempotent).
    async fn migrate(&self) -> Result<()>;
    /// Succeeds while the database answers; health reporting polls it.
    async fn ping(&self) -> Result<()>;
    /// Closes the pool, waiting for in-flight statements.
    async fn close(&self);

    /// Submits a task; with an idempotency key already used in the
    /// namespace, returns the existing task and `false`.
    async fn submit_task(&self, task: NewTask, now_ms: i64) -> Result<(TaskRecord, bool)>;
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
    /// passed, by priority (higher first) then first-in first-out, leaving
    /// out those of the `parked` placements.
    async fn queued_tasks(
        &self,
        namespace: Option<&str>,
        now_ms: i64,
        after: Option<&QueueCursor>,
        parked: &[ParkedPlacement],
        limit: u32,
    ) -> Result<Vec<TaskRecord>>;

    /// Leases tasks to agents, all in one transaction; each request is
    /// granted only if its task is still QUEUED and its agent under
    /// capacity, checked in that transaction.
    async fn grant_leases(
        &self,
        requests: &[GrantRequest],
        now_ms: i64,
    ) -> Result<Vec<GrantOutcome>>;
    /// Submits several tasks in one transaction (one commit), each as
    /// [`Store::submit_task`] would. A task with a reserved agent (the
    /// dispatcher matched it in memory on the way in) is also leased to it
    /// in that transaction: one commit from submit to lease. Its outcome is
    /// `None` for an idempotent repeat, and a refused grant leaves the task
    /// QUEUED for the dispatcher, as a plain submit would. Results are in
    /// order; a task the store refuses (a bad argument) gets its own error,
    /// while a failing statement fails the whole batch (nothing of it is
    /// stored).
    async fn submit_many(
        &self,
        submissions: &[Submission],
        now_ms: i64,
    ) -> Result<Vec<Result<Submitted>>>;
    /// The agent acknowledged these grants (GRANTED to ACTIVE); returns how
    /// many it still held.
    async fn ack_leases(&self, agent_id: Uuid, leases: &[(Uuid, u64)], now_ms: i64) -> Result<u64>;
    /// A heartbeat: extends every live lease of the agent to now plus its
    /// task's TTL, in one statement; returns how many.
    async fn renew_leases(&self, agent_id: Uuid, now_ms: i64) -> Result<u64>;
    /// LEASED to RUNNING; repeating it is acknowledged.
    async fn report_started(
        &self,
        lease_id: Uuid,
        task_id: Uuid,
        agent_id: Uuid,
        fencing_token: u64,
        now_ms: i64,
    ) -> Result<TaskRecord>;
    /// Records the latest progress of a running task.
    async fn report_progress(
        &self,
        lease_id: Uuid,
        task_id: Uuid,
        agent_id: Uuid,
        fencing_token: u64,
        progress: Value,
        now_ms: i64,
    ) -> Result<TaskRecord>;
    /// Final reports, in one transaction; a refused item (stale token, lease
    /// not held) changes nothing and does not affect the others.
    async fn complete_leases(
        &self,
        completions: &[Completion],
        now_ms: i64,
    ) -> Result<Vec<Result<CompletionResult>>>;
    /// Lease reports of many sessions (accepted, started, progress, final),
    /// in one transaction: the server's group commit. Reports about one
    /// task are applied in the order given; a refused report (stale token,
    /// lease not held, wrong state) changes nothing and does not affect the
    /// others; a database failure fails the whole batch.
    async fn apply_reports(
        &self,
        reports: &[LeaseReport],
        now_ms: i64,
    ) -> Result<Vec<Result<ReportApplied>>>;
    /// Heartbeats of many sessions in one transaction: every agent's live
    /// leases renewed to now plus their TTL, the agent touched, a changed
    /// status written (while the session is current) and a changed document
    /// written if its generation still holds. Document writes announce
    /// nothing: the session that made them already updated its replica's
    /// index, and no other replica holds that agent.
    async fn heartbeats(&self, beats: &[Beat], now_ms: i64) -> Result<Vec<Result<BeatApplied>>>;
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
    /// Cancels a task: QUEUED becomes CANCELED at once; LEASED or RUNNING
    /// get `cancel_requested` and the lease to revoke is returned; terminal
    /// tasks are returned unchanged.
    async fn cancel_task(
        &self,
        task_id: Uuid,
        reason: &str,
        now_ms: i64,
    ) -> Result<(TaskRecord, Option<LeaseRecord>)>;

    /// Registers an agent (upsert on namespace and name): the same id, a new
    /// session epoch and generation.
    async fn register_agent(
        &self,
        registration: &AgentRegistration,
        now_ms: i64,
    ) -> Result<AgentRecord>;
    /// One agent; `NotFound` if missing.
    async fn get_agent(&self, agent_id: Uuid) -> Result<AgentRecord>;
    /// How many live (granted or active) leases each of these agents holds;
    /// an agent holding none is absent.
    async fn live_lease_counts(
        &self,
        agent_ids: &[Uuid],
    ) -> Result<std::collections::HashMap<Uuid, u32>>;
    /// Agents of a namespace by name, optionally only some statuses.
    async fn list_agents(
        &self,
        namespace: &str,
        statuses: &[String],
        page: &Page,
    ) -> Result<(Vec<AgentRecord>, Option<String>)>;
    /// Every agent, to warm the dispatcher's index at start-up.
    async fn all_agents(&self) -> Result<Vec<AgentRecord>>;
    /// Replaces the agent's document if its generation is still
    /// `expected_generation`; returns the new generation.
    #[allow(clippy::too_many_arguments)]
    async fn update_agent_document(
        &self,
        agent_id: Uuid,
        expected_generation: u64,
        reported: Value,
        document: Value,
        provenance: Value,
        rejections: Value,
        now_ms: i64,
    ) -> Result<u64>;
    /// Replaces the operator tier (and the merged document it yields).
    async fn set_operator_overrides(
        &self,
        agent_id: Uuid,
        overrides: Value,
        document: Value,
        provenance: Value,
        now_ms: i64,
    ) -> Result<AgentRecord>;
    /// Sets the status, only while the session epoch is still
    /// `session_epoch` when given; returns whether it changed anything.
    async fn set_agent_status(
        &self,
        agent_id: Uuid,
        status: &str,
        reasons: &[String],
        session_epoch: Option<u64>,
        now_ms: i64,
    ) -> Result<bool>;
    /// Starts or ends an operator drain.
    async fn set_agent_drained(
        &self,
        agent_id: Uuid,
        drained: bool,
        reason: Option<String>,
        now_ms: i64,
    ) -> Result<AgentRecord>;
    /// Records that the agent was heard from.
    async fn touch_agent(&self, agent_id: Uuid, now_ms: i64) -> Result<()>;
    /// The agent's live (GRANTED or ACTIVE) leases.
    async fn agent_leases(&self, agent_id: Uuid) -> Result<Vec<LeaseRecord>>;
    /// One lease; `NotFound` if missing.
    async fn get_lease(&self, lease_id: Uuid) -> Result<LeaseRecord>;

    /// Counts of live (QUEUED, LEASED, RUNNING) tasks by namespace and state,
    /// for metrics; a namespace and state with none is absent. Costs the
    /// queue's length and the live leases, not the tasks ever run.
    async fn count_tasks(&self) -> Result<Vec<(String, TaskState, u64)>>;
    /// Queued tasks and registered agents of a namespace (for the caps).
    async fn count_in_namespace(&self, namespace: &str) -> Result<(u64, u64)>;
    /// Stores a token's record under its SHA-256 (hex).
    async fn insert_token(&self, token: &TokenRecord, hash: &str) -> Result<()>;
    /// Whether any token was created (auth is then on).
    async fn any_tokens(&self) -> Result<bool>;
    /// The record of the token with this SHA-256 (hex), if any.
    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>>;
    /// Events from every replica (this one included) from now on; agent
    /// changes only from other replicas (a change made here is applied to
    /// this replica by whoever made it).
    fn subscribe(&self) -> broadcast::Receiver<StoreEvent>;
}

/// Settings of a store beyond its URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// The first retry delay after a failed attempt; doubles per attempt up
    /// to [`MAX_BACKOFF_MS`]. Tests shorten it.
    pub backoff_base_ms: i64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            backoff_base_ms: DEFAULT_BACKOFF_BASE_MS,
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
