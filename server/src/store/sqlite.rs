//! The embedded SQLite store: one file, created if missing, WAL journal,
//! foreign keys on. SQLite allows one writer at a time, so every write
//! transaction starts with `BEGIN IMMEDIATE` (it takes the write lock up
//! front and waits for it under `busy_timeout` instead of failing half-way);
//! events go to this process's subscribers after each commit.

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use tokio::sync::broadcast;
use uuid::Uuid;

use super::common::{GrantableTask, plan_grants, store_common};
use super::{Store, StoreOptions};

store_common!(
    sqlx::Sqlite,
    sqlx::sqlite::SqliteRow,
    sqlx::SqliteConnection,
    "",
    "",
    // SQLite keeps the placement as the text it was given, which is how
    // the dispatcher spells it too.
    " AND (t.namespace, t.placement) NOT IN \
     (SELECT json_extract(p.value, '$[0]'), json_extract(p.value, '$[1]') \
     FROM json_each($4) AS p)"
);

/// How many events a slow subscriber may fall behind before it lags.
const EVENT_BUFFER: usize = 4_096;

/// A store on an SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The connection pool; readers run in parallel (WAL), writers queue for
    /// the one write lock.
    pool: SqlitePool,
    /// Where committed changes are announced (there are no other replicas).
    events: broadcast::Sender<StoreEvent>,
    /// Retry backoff and other settings.
    options: StoreOptions,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://PATH`).
    pub async fn open(url: &str, options: StoreOptions) -> __Result<Self> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(db("parsing the sqlite url"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(connect)
            .await
            .map_err(db("opening the sqlite database"))?;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Ok(Self {
            pool,
            events,
            options,
        })
    }

    /// Starts a write transaction holding the database's write lock.
    async fn begin(&self) -> __Result<Transaction<'static, Sqlite>> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("starting a write transaction"))
    }

    /// Commits, then tells subscribers what changed.
    async fn commit(
        &self,
        tx: Transaction<'static, Sqlite>,
        events: Vec<StoreEvent>,
    ) -> __Result<()> {
        tx.commit().await.map_err(db("committing"))?;
        for event in events {
            // An agent change made here is applied here by whoever made it
            // (there are no other replicas to tell).
            if matches!(
                event,
                StoreEvent::AgentChanged { .. } | StoreEvent::LeaseEnded { .. }
            ) {
                continue;
            }
            // No subscriber is fine: nobody needs waking.
            let _ = self.events.send(event);
        }
        Ok(())
    }

    /// A connection for reads.
    async fn read(&self) -> __Result<sqlx::pool::PoolConnection<Sqlite>> {
        self.pool
            .acquire()
            .await
            .map_err(db("acquiring a connection"))
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> __Result<()> {
        // A schema migrated by a newer release is accepted: migrations are
        // additive, so a rolled-back binary (or an old replica mid-upgrade)
        // runs on it; sqlx would otherwise refuse versions it does not know.
        let mut migrator = sqlx::migrate!("migrations/sqlite");
        migrator.set_ignore_missing(true);
        migrator
            .run(&self.pool)
            .await
            .map_err(|source| __Error::Store {
                context: "running sqlite migrations",
                source: source.into(),
            })
    }

    async fn ping(&self) -> __Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(db("pinging"))?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn submit_task(&self, task: NewTask, now_ms: i64) -> __Result<(TaskRecord, bool)> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let out = submit_task(&mut tx, &task, now_ms, &mut events).await?;
        self.commit(tx, events).await?;
        Ok(out)
    }

    async fn get_task(&self, task_id: Uuid) -> __Result<TaskRecord> {
        must_fetch_task(&mut *self.read().await?, task_id).await
    }

    async fn list_tasks(
        &self,
        filter: &TaskFilter,
        page: &Page,
    ) -> __Result<(Vec<TaskRecord>, Option<String>)> {
        list_tasks(&mut *self.read().await?, filter, page).await
    }

    async fn task_events(
        &self,
        task_id: Uuid,
        after_sequence: u64,
        limit: u32,
    ) -> __Result<Vec<TaskEventRecord>> {
        task_events(&mut *self.read().await?, task_id, after_sequence, limit).await
    }

    async fn queued_tasks(
        &self,
        namespace: Option<&str>,
        now_ms: i64,
        after: Option<&QueueCursor>,
        parked: &[ParkedPlacement],
        limit: u32,
    ) -> __Result<Vec<TaskRecord>> {
        let mut conn = self.read().await?;
        queued_tasks(&mut conn, namespace, now_ms, after, parked, limit).await
    }

    async fn grant_leases(
        &self,
        requests: &[GrantRequest],
        now_ms: i64,
    ) -> __Result<Vec<GrantOutcome>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let outcomes = grant_in(&mut tx, requests, now_ms, &mut events).await?;
        self.commit(tx, events).await?;
        Ok(outcomes)
    }

    async fn submit_many(
        &self,
        submissions: &[Submission],
        now_ms: i64,
    ) -> __Result<Vec<__Result<Submitted>>> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let submitted = submit_many_in(&mut tx, submissions, now_ms, &mut events).await?;
        self.commit(tx, events).await?;
        Ok(submitted)
    }

    async fn ack_leases(
        &self,
        agent_id: Uuid,
        leases: &[(Uuid, u64)],
        now_ms: i64,
    ) -> __Result<u64> {
        let mut tx = self.begin().await?;
        let acked = ack_leases(&mut tx, agent_id, leases, now_ms).await?;
        self.commit(tx, Vec::new()).await?;
        Ok(acked)
    }

    async fn renew_leases(&self, agent_id: Uuid, now_ms: i64) -> __Result<u64> {
        let mut tx = self.begin().await?;
        let renewed = renew_leases(&mut tx, agent_id, now_ms).await?;
        self.commit(tx, Vec::new()).await?;
        Ok(renewed)
    }

    async fn report_started(
        &self,
        lease_id: Uuid,
        task_id: Uuid,
        agent_id: Uuid,
        fencing_token: u64,
        now_ms: i64,
    ) -> __Result<TaskRecord> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let task = report_started(
            &mut tx,
            lease_id,
            task_id,
            agent_id,
            fencing_token,
            now_ms,
            &mut events,
        )
        .await?;
        self.commit(tx, events).await?;
        Ok(task)
    }

    async fn report_progress(
        &self,
        lease_id: Uuid,
        task_id: Uuid,
        agent_id: Uuid,
        fencing_token: u64,
        progress: Value,
        now_ms: i64,
    ) -> __Result<TaskRecord> {
        let mut tx = self.begin().await?;
        let task = report_progress(
            &mut tx,
            lease_id,
            task_id,
            agent_id,
            fencing_token,
            &progress,
            now_ms,
        )
        .await?;
        self.commit(tx, Vec::new()).await?;
        Ok(task)
    }

    async fn complete_leases(
        &self,
        completions: &[Completion],
        now_ms: i64,
    ) -> __Result<Vec<__Result<CompletionResult>>> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let results = complete_leases(
            &mut tx,
            completions,
            self.options.backoff_base_ms,
            now_ms,
            &mut events,
        )
        .await?;
        self.commit(tx, events).await?;
        Ok(results)
    }

    async fn apply_reports(
        &self,
        reports: &[LeaseReport],
        now_ms: i64,
    ) -> __Result<Vec<__Result<ReportApplied>>> {
        if reports.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let results = apply_reports(
            &mut tx,
            reports,
            self.options.backoff_base_ms,
            now_ms,
            &mut events,
        )
        .await?;
        self.commit(tx, events).await?;
        Ok(results)
    }

    async fn heartbeats(
        &self,
        beats: &[Beat],
        now_ms: i64,
    ) -> __Result<Vec<__Result<BeatApplied>>> {
        if beats.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let results = heartbeats(&mut tx, beats, now_ms, &mut events).await?;
        self.commit(tx, events).await?;
        Ok(results)
    }

    async fn revoke_unacked(
        &self,
        agent_id: Option<Uuid>,
        older_than_ms: i64,
        now_ms: i64,
    ) -> __Result<Vec<(LeaseRecord, TaskRecord)>> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let revoked = revoke_unacked(&mut tx, agent_id, older_than_ms, now_ms, &mut events).await?;
        self.commit(tx, events).await?;
        Ok(revoked)
    }

    async fn expire_leases(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> __Result<Vec<(LeaseRecord, TaskRecord)>> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let expired = expire_leases(&mut tx, now_ms, limit, &mut events).await?;
        self.commit(tx, events).await?;
        Ok(expired)
    }

    async fn cancel_task(
        &self,
        task_id: Uuid,
        reason: &str,
        now_ms: i64,
    ) -> __Result<(TaskRecord, Option<LeaseRecord>)> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let out = cancel_task(&mut tx, task_id, reason, now_ms, &mut events).await?;
        self.commit(tx, events).await?;
        Ok(out)
    }

    async fn register_agent(
        &self,
        registration: &AgentRegistration,
        now_ms: i64,
    ) -> __Result<AgentRecord> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let agent = register_agent(&mut tx, registration, now_ms, &mut events).await?;
        self.commit(tx, events).await?;
        Ok(agent)
    }

    async fn live_lease_counts(
        &self,
        agent_ids: &[Uuid],
    ) -> __Result<std::collections::HashMap<Uuid, u32>> {
        live_lease_counts(&mut *self.read().await?, agent_ids).await
    }

    async fn get_agent(&self, agent_id: Uuid) -> __Result<AgentRecord> {
        fetch_agent(&mut *self.read().await?, agent_id).await
    }

    async fn list_agents(
        &self,
        namespace: &str,
        statuses: &[String],
        page: &Page,
    ) -> __Result<(Vec<AgentRecord>, Option<String>)> {
        list_agents(&mut *self.read().await?, namespace, statuses, page).await
    }

    async fn all_agents(&self) -> __Result<Vec<AgentRecord>> {
        all_agents(&mut *self.read().await?).await
    }

    async fn update_agent_document(
        &self,
        agent_id: Uuid,
        expected_generation: u64,
        reported: Value,
        document: Value,
        provenance: Value,
        rejections: Value,
        now_ms: i64,
    ) -> __Result<u64> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let generation = update_agent_document(
            &mut tx,
            agent_id,
            expected_generation,
            &reported,
            &document,
            &provenance,
            &rejections,
            now_ms,
            &mut events,
        )
        .await?;
        self.commit(tx, events).await?;
        Ok(generation)
    }

    async fn set_operator_overrides(
        &self,
        agent_id: Uuid,
        overrides: Value,
        document: Value,
        provenance: Value,
        now_ms: i64,
    ) -> __Result<AgentRecord> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let agent = set_operator_overrides(
            &mut tx,
            agent_id,
            &overrides,
            &document,
            &provenance,
            now_ms,
            &mut events,
        )
        .await?;
        self.commit(tx, events).await?;
        Ok(agent)
    }

    async fn set_agent_status(
        &self,
        agent_id: Uuid,
        status: &str,
        reasons: &[String],
        session_epoch: Option<u64>,
        now_ms: i64,
    ) -> __Result<bool> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let changed = set_agent_status(
            &mut tx,
            agent_id,
            status,
            reasons,
            session_epoch,
            now_ms,
            &mut events,
        )
        .await?;
        self.commit(tx, events).await?;
        Ok(changed)
    }

    async fn set_agent_drained(
        &self,
        agent_id: Uuid,
        drained: bool,
        reason: Option<String>,
        now_ms: i64,
    ) -> __Result<AgentRecord> {
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        let agent =
            set_agent_drained(&mut tx, agent_id, drained, reason, now_ms, &mut events).await?;
        self.commit(tx, events).await?;
        Ok(agent)
    }

    async fn touch_agent(&self, agent_id: Uuid, now_ms: i64) -> __Result<()> {
        let mut tx = self.begin().await?;
        touch_agent(&mut tx, agent_id, now_ms).await?;
        self.commit(tx, Vec::new()).await
    }

    async fn agent_leases(&self, agent_id: Uuid) -> __Result<Vec<LeaseRecord>> {
        agent_leases(&mut *self.read().await?, agent_id).await
    }

    async fn get_lease(&self, lease_id: Uuid) -> __Result<LeaseRecord> {
        get_lease(&mut *self.read().await?, lease_id).await
    }

    async fn count_tasks(&self) -> __Result<Vec<(String, TaskState, u64)>> {
        count_tasks(&mut *self.read().await?).await
    }

    async fn count_in_namespace(&self, namespace: &str) -> __Result<(u64, u64)> {
        count_in_namespace(&mut *self.read().await?, namespace).await
    }

    async fn insert_token(&self, token: &TokenRecord, hash: &str) -> __Result<()> {
        let mut tx = self.begin().await?;
        insert_token(&mut tx, token, hash).await?;
        self.commit(tx, Vec::new()).await
    }

    async fn any_tokens(&self) -> __Result<bool> {
        any_tokens(&mut *self.read().await?).await
    }

    async fn find_token(&self, hash: &str) -> __Result<Option<TokenRecord>> {
        find_token(&mut *self.read().await?, hash).await
    }

    fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.events.subscribe()
    }
}

/// A batch of submits in the caller's transaction (see
/// `Store::submit_many`): a refused task is answered on its own; a
/// statement's failure fails the batch. Every task is inserted
/// first; then the ones with a reserved agent are leased in one
/// `grant_in`, which locks all their agents at once in id order (one
/// by one, two batches could lock them in opposite orders).
async fn submit_many_in(
    tx: &mut Transaction<'static, Sqlite>,
    submissions: &[Submission],
    now_ms: i64,
    events: &mut Vec<StoreEvent>,
) -> __Result<Vec<__Result<Submitted>>> {
    let mut out: Vec<__Result<Submitted>> = Vec::with_capacity(submissions.len());
    let mut requests = Vec::new();
    let mut requested_by = Vec::new();
    for (i, submission) in submissions.iter().enumerate() {
        if let Err(err) = check_new_task(&submission.task) {
            out.push(Err(err));
            continue;
        }
        let (record, created) = submit_task(tx, &submission.task, now_ms, events).await?;
        if let (Some(agent_id), true) = (submission.agent_id, created) {
            requests.push(GrantRequest {
                task_id: record.id,
                agent_id,
            });
            requested_by.push(i);
        }
        out.push(Ok((record, created, None)));
    }
    if requests.is_empty() {
        return Ok(out);
    }
    let outcomes = grant_in(tx, &requests, now_ms, events).await?;
    for (i, outcome) in requested_by.into_iter().zip(outcomes) {
        let Some(Ok((record, _, grant))) = out.get_mut(i) else {
            continue;
        };
        if matches!(outcome, GrantOutcome::Granted(_)) {
            // Leased before anyone could see it queued.
            let id = record.id;
            events
                .retain(|e| !matches!(e, StoreEvent::TaskQueued { task_id, .. } if *task_id == id));
            *record = must_fetch_task(tx, id).await?;
        }
        *grant = Some(outcome);
    }
    Ok(out)
}

/// Leases tasks to agents inside the caller's transaction (see
/// [`Store::grant_leases`]); the events to announce are added to `events`.
async fn grant_in(
    tx: &mut Transaction<'static, Sqlite>,
    requests: &[GrantRequest],
    now_ms: i64,
    events: &mut Vec<StoreEvent>,
) -> __Result<Vec<GrantOutcome>> {
    let mut agents = HashMap::new();
    let mut tasks = HashMap::new();
    let agent_ids: BTreeSet<Uuid> = requests.iter().map(|r| r.agent_id).collect();
    let task_ids: BTreeSet<Uuid> = requests.iter().map(|r| r.task_id).collect();
    for agent_id in agent_ids {
        let row: Option<(i64, i64)> = sqlx::query_as(
            "SELECT capacity, (SELECT COUNT(*) FROM leases l WHERE l.agent_id = agents.id \
                 AND l.state IN ('granted', 'active')) FROM agents WHERE id = $1",
        )
        .bind(agent_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(db("reading an agent's capacity"))?;
        if let Some(row) = row {
            agents.insert(agent_id, row);
        }
    }
    for task_id in task_ids {
        let row: Option<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT state, not_before_ms, fencing_token, lease_ttl_ms FROM tasks \
                 WHERE id = $1",
        )
        .bind(task_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(db("reading a task to grant"))?;
        if let Some((state, not_before_ms, fencing_token, lease_ttl_ms)) = row {
            let state = state.parse().map_err(corrupt("reading a task to grant"))?;
            tasks.insert(
                task_id,
                GrantableTask {
                    state,
                    not_before_ms,
                    fencing_token,
                    lease_ttl_ms,
                },
            );
        }
    }
    let plan = plan_grants(requests, &agents, &tasks, now_ms);
    let mut outcomes = Vec::with_capacity(plan.len());
    for planned in plan {
        let grant = match planned {
            Ok(grant) => grant,
            Err(refusal) => {
                outcomes.push(GrantOutcome::Refused(refusal));
                continue;
            }
        };
        sqlx::query(
            "INSERT INTO leases (id, task_id, agent_id, fencing_token, state, acked, \
             granted_at_ms, expires_at_ms) VALUES ($1, $2, $3, $4, 'granted', FALSE, $5, $6)",
        )
        .bind(grant.lease_id)
        .bind(grant.task_id)
        .bind(grant.agent_id)
        .bind(grant.fencing_token)
        .bind(now_ms)
        .bind(grant.expires_at_ms)
        .execute(&mut **tx)
        .await
        .map_err(db("inserting a lease"))?;
        sqlx::query(
            "UPDATE tasks SET state = 'leased', fencing_token = $2, lease_id = $3, \
             agent_id = $4, progress = NULL, updated_at_ms = $5 \
             WHERE id = $1 AND state = 'queued'",
        )
        .bind(grant.task_id)
        .bind(grant.fencing_token)
        .bind(grant.lease_id)
        .bind(grant.agent_id)
        .bind(now_ms)
        .execute(&mut **tx)
        .await
        .map_err(db("leasing a task"))?;
        let message = format!(
            "leased to agent {} with fencing token {}",
            grant.agent_id, grant.fencing_token
        );
        append_event(
            &mut *tx,
            grant.task_id,
            "leased",
            TaskState::Leased,
            &message,
            Some(grant.agent_id),
            Some(grant.lease_id),
            now_ms,
        )
        .await?;
        events.push(StoreEvent::TaskChanged {
            task_id: grant.task_id,
            state: TaskState::Leased,
        });
        outcomes.push(GrantOutcome::Granted(LeaseRecord {
            id: grant.lease_id,
            task_id: grant.task_id,
            agent_id: grant.agent_id,
            fencing_token: to_u64(grant.fencing_token),
            state: LeaseState::Granted,
            granted_at_ms: now_ms,
            acked: false,
            expires_at_ms: grant.expires_at_ms,
        }));
    }

    Ok(outcomes)
}
