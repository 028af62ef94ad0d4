//! The PostgreSQL store: many server replicas on one database. Transitions
//! lock rows (`FOR UPDATE`; grants and sweeps `SKIP LOCKED` what another
//! replica is working on); submits, grants and whole attempts go to the
//! database as one set-based statement per batch. Every change is announced
//! on `switchyard_events` so every replica's [`PgListener`] learns of it: an
//! agent change or a revocation by `pg_notify` in its own transaction
//! (delivered at its commit), a task queued or changed or a lease ended by
//! the notifier task right after the commit (NOTIFY serialises the commits
//! that issue it; the notifier's own commits do not wait for the log's
//! flush, as they hold nothing to keep). New pool connections are warmed
//! before their first use.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::common::{GrantableTask, plan_grants, store_common};
use super::{Store, StoreOptions};

store_common!(
    sqlx::Postgres,
    sqlx::postgres::PgRow,
    sqlx::PgConnection,
    " FOR UPDATE OF t",
    " FOR UPDATE OF t SKIP LOCKED",
    // A hashed subplan: one probe per task however many are parked.
    " AND (t.namespace, t.placement) NOT IN \
     (SELECT p->>0, (p->>1)::jsonb FROM jsonb_array_elements($4::jsonb) AS p)"
);

/// The notification channel every replica listens on.
const CHANNEL: &str = "switchyard_events";

/// How many events a slow subscriber may fall behind before it lags.
const EVENT_BUFFER: usize = 4_096;

/// Notifies every payload of a `text[]`, in order.
const NOTIFY: &str = "SELECT pg_notify($1, p) FROM UNNEST($2::text[]) AS p";

/// [`NOTIFY`] as a transaction of its own that commits without waiting for
/// its flush. A notification takes a transaction id, so its commit is a WAL
/// record that `synchronous_commit` would flush, one `fsync` per batch of
/// notifications beside the commits of the data. There is nothing in it to
/// keep: notifications are not durable, and the changes they announce
/// committed, durably, before they were queued.
const NOTIFY_UNFLUSHED: &str = "SELECT pg_notify($1, p) FROM \
  (SELECT set_config('synchronous_commit', 'off', TRUE)) AS unflushed, \
  UNNEST($2::text[]) AS p";

/// Locks agent rows to grant to them, in id order (every grant and submit
/// locks them so, and concurrent ones queue instead of deadlocking);
/// answers the ids of those that exist.
const LOCK_AGENTS: &str = "SELECT id FROM agents WHERE id = ANY($1) ORDER BY id FOR UPDATE";

/// Connections the pool opens as soon as the store opens, and keeps.
const WARM_CONNECTIONS: u32 = 8;

/// Every named lease with the outcome recorded on it (`$1`: lease ids).
const LEASES_WITH_OUTCOME: &str = concat!(
    "SELECT ",
    lease_columns!(),
    ", outcome FROM leases WHERE id = ANY($1)"
);

/// Locks a report batch's tasks in id order (`$1`: task ids), reading none
/// of their documents (see [`whole_attempts`]).
const WHOLE_ATTEMPT_TASKS: &str = "SELECT t.id, t.namespace, t.kind, 'null'::jsonb AS payload, \
  'null'::jsonb AS placement, t.priority, t.state, t.attempts, t.max_attempts, \
  t.lease_ttl_ms, t.idempotency_key, t.not_before_ms, NULL::jsonb AS result, \
  NULL::jsonb AS error, t.fencing_token, t.lease_id, t.agent_id, \
  l.expires_at_ms AS lease_expires_at_ms, t.cancel_requested, \
  NULL::jsonb AS progress, '{}'::jsonb AS labels, t.created_at_ms, t.updated_at_ms \
  FROM tasks t LEFT JOIN leases l ON l.id = t.lease_id \
  WHERE t.id = ANY($1) ORDER BY t.id FOR UPDATE OF t";

/// Applies whole fresh attempts in one statement (see [`whole_attempts`]):
/// ends the leases (acknowledged), settles the tasks, and appends accepted,
/// started and the end to each history, the history's last sequence looked
/// up once per task. Answers how many leases ended and tasks settled.
const WHOLE_ATTEMPTS: &str = "WITH c AS ( \
  SELECT u.*, COALESCE((SELECT MAX(e.sequence) FROM task_events e \
  WHERE e.task_id = u.task_id), 0) AS last_sequence \
  FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], \
  $5::text[], $6::text[], $7::int8[], $8::int8[], $9::text[], $10::text[], \
  $11::text[], $12::text[]) AS u(lease_id, task_id, agent_id, lease_state, \
  outcome, task_state, attempts, not_before_ms, result, error, event_kind, \
  message) \
  ), ended AS ( \
  UPDATE leases l SET state = c.lease_state, outcome = c.outcome, acked = TRUE, \
  ended_at_ms = $13 FROM c \
  WHERE l.id = c.lease_id AND l.state = 'granted' RETURNING l.id \
  ), history AS ( \
  INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, \
  lease_id, occurred_at_ms) \
  SELECT c.task_id, c.last_sequence + k.n, \
  CASE k.n WHEN 1 THEN 'accepted' WHEN 2 THEN 'started' ELSE c.event_kind END, \
  CASE k.n WHEN 1 THEN 'leased' WHEN 2 THEN 'running' ELSE c.task_state END, \
  CASE k.n WHEN 1 THEN 'the agent acknowledged the lease' \
  WHEN 2 THEN 'the agent started the task' ELSE c.message END, \
  c.agent_id, c.lease_id, $13 \
  FROM c CROSS JOIN (VALUES (1), (2), (3)) AS k(n) \
  ), settled AS ( \
  UPDATE tasks t SET state = c.task_state, attempts = c.attempts, \
  not_before_ms = c.not_before_ms, \
  result = COALESCE(c.result::jsonb, t.result), \
  error = COALESCE(c.error::jsonb, t.error), \
  lease_id = NULL, agent_id = NULL, updated_at_ms = $13 \
  FROM c WHERE t.id = c.task_id RETURNING t.id \
  ) \
  SELECT (SELECT COUNT(*) FROM ended), (SELECT COUNT(*) FROM settled)";

/// How many rolled-back submits warm a new connection (see
/// [`warm_connection`]): one more than the runs PostgreSQL plans afresh
/// before it chooses a plan to keep.
const WARM_RUNS: usize = 6;

/// How many notifications may wait for the notifier.
const NOTIFIER_QUEUE: usize = 65_536;

/// A store on a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgStore {
    /// The connection pool shared by every request of this replica.
    pool: PgPool,
    /// Fed by the listener with every replica's events (this one's too).
    events: broadcast::Sender<StoreEvent>,
    /// Retry backoff and other settings.
    options: StoreOptions,
    /// The listener task; stopped when the last handle goes.
    listener: Arc<ListenerTask>,
    /// This replica's mark on the events it announces.
    origin: Uuid,
    /// Where committed changes' notifications wait for the notifier.
    notifier: mpsc::Sender<String>,
}

/// An event as announced: with the replica that made it, so a replica can
/// skip its own agent changes (whoever made them applied them already).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Announced {
    /// The announcing replica.
    #[serde(rename = "o")]
    origin: Uuid,
    #[serde(flatten)]
    event: StoreEvent,
}

/// Owns the background task that turns notifications into events.
#[derive(Debug)]
struct ListenerTask(JoinHandle<()>);

impl Drop for ListenerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl PgStore {
    /// Connects to the database at `url` and starts listening for events.
    pub async fn open(url: &str, options: StoreOptions) -> __Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(32)
            .min_connections(WARM_CONNECTIONS)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    // A database not yet migrated has nothing to warm.
                    if let Err(err) = warm_connection(conn).await {
                        tracing::debug!(cause = %err, "a new connection was not warmed");
                    }
                    Ok(())
                })
            })
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(db("connecting to postgres"))?;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        // Its own connection (a pool of one that reconnects and re-listens by
        // itself), listening before `open` returns so no event is missed.
        let mut listener = PgListener::connect(url)
            .await
            .map_err(db("connecting the event listener"))?;
        listener
            .listen(CHANNEL)
            .await
            .map_err(db("listening for store events"))?;
        let origin = Uuid::now_v7();
        let task = tokio::spawn(forward_notifications(listener, events.clone(), origin));
        let (notifier, queue) = mpsc::channel(NOTIFIER_QUEUE);
        tokio::spawn(notify_committed(pool.clone(), queue));
        Ok(Self {
            pool,
            events,
            options,
            listener: Arc::new(ListenerTask(task)),
            origin,
            notifier,
        })
    }

    /// Warms [`WARM_CONNECTIONS`] of the pool's connections at once (see
    /// [`warm_connection`]; each new connection is warmed too, as it opens)
    /// and answers how many it warmed. Fails if the schema is not migrated
    /// or does not fit this release's statements.
    pub async fn warm(&self) -> __Result<usize> {
        let mut held = Vec::new();
        for _ in 0..WARM_CONNECTIONS {
            held.push(self.read().await?);
        }
        let mut warming = tokio::task::JoinSet::new();
        for mut conn in held {
            warming.spawn(async move {
                warm_connection(&mut conn)
                    .await
                    .map_err(db("warming a connection"))
            });
        }
        let mut warmed = 0;
        let mut failed = None;
        while let Some(joined) = warming.join_next().await {
            match joined {
                Ok(Ok(_)) => warmed += 1,
                Ok(Err(err)) => {
                    failed.get_or_insert(err);
                }
                Err(err) => {
                    failed.get_or_insert(__Error::Corrupt {
                        context: "warming a connection",
                        detail: err.to_string(),
                    });
                }
            }
        }
        failed.map_or(Ok(warmed), Err)
    }

    /// Warns if the database's autovacuum is off. Every grant and report
    /// leaves dead row versions, and without VACUUM and ANALYZE PostgreSQL
    /// also stops reusing its plans: on a database holding one earlier run
    /// of 5,000 tasks, a submit took PostgreSQL 1.65 ms against 0.66 ms once vacuumed
    /// and analysed. Whether it can answer at all is not this check's
    /// business: a query that fails is only logged.
    async fn check_autovacuum(&self) {
        match sqlx::query_scalar::<_, String>("SELECT current_setting('autovacuum')")
            .fetch_one(&self.pool)
            .await
        {
            Ok(setting) if setting == "off" => tracing::warn!(
                "autovacuum is off on this PostgreSQL: run VACUUM ANALYZE on Switchyard's tables \
                 regularly, or grants, reports and submits slow down as the history grows"
            ),
            Ok(_) => {}
            Err(err) => tracing::debug!(cause = %err, "could not read the autovacuum setting"),
        }
    }

    /// Starts a transaction.
    async fn begin(&self) -> __Result<Transaction<'static, Postgres>> {
        self.pool
            .begin()
            .await
            .map_err(db("starting a transaction"))
    }

    /// Commits, announcing `events` to every replica. An agent change or a
    /// revocation is notified in the transaction (delivered at commit, and
    /// only if it commits); the rest, after the commit, by the notifier.
    async fn commit(
        &self,
        mut tx: Transaction<'static, Postgres>,
        events: Vec<StoreEvent>,
    ) -> __Result<()> {
        let (urgent, lazy): (Vec<StoreEvent>, Vec<StoreEvent>) =
            events.into_iter().partition(|event| {
                matches!(
                    event,
                    StoreEvent::AgentChanged { .. } | StoreEvent::LeaseRevoked { .. }
                )
            });
        if !urgent.is_empty() {
            let payloads = urgent
                .into_iter()
                .map(|event| self.announce(event))
                .collect::<__Result<Vec<_>>>()?;
            sqlx::query(NOTIFY)
                .bind(CHANNEL)
                .bind(&payloads)
                .execute(&mut *tx)
                .await
                .map_err(db("notifying replicas"))?;
        }
        tx.commit().await.map_err(db("committing"))?;
        for event in lazy {
            self.notify_later(self.announce(event)?);
        }
        Ok(())
    }

    /// Hands a committed change's notification to the notifier. A full
    /// queue (the database unreachable for long) drops it: every replica
    /// also re-reads the queue, lease counts and watched tasks on timers.
    fn notify_later(&self, payload: String) {
        if self.notifier.try_send(payload).is_err() {
            metrics::counter!(crate::metrics::NOTIFICATIONS_DROPPED).increment(1);
        }
    }

    /// Announces `event` as this replica: the payload of its notification.
    fn announce(&self, event: StoreEvent) -> __Result<String> {
        serde_json::to_string(&Announced {
            origin: self.origin,
            event,
        })
        .map_err(|err| __Error::Corrupt {
            context: "encoding store events",
            detail: err.to_string(),
        })
    }

    /// [`Store::submit_many`] in one round trip ([`SUBMIT_BATCH`], its own
    /// transaction; the notifications follow the commit). Only an
    /// idempotency key already taken costs a read of its own.
    async fn submit_batch(
        &self,
        submissions: &[Submission],
        now_ms: i64,
    ) -> __Result<Vec<__Result<Submitted>>> {
        let mut out: Vec<Option<__Result<Submitted>>> = Vec::with_capacity(submissions.len());
        let mut rows = SubmitRows::default();
        for submission in submissions {
            if let Err(err) = check_new_task(&submission.task) {
                out.push(Some(Err(err)));
                continue;
            }
            out.push(None);
            let task = &submission.task;
            let id = Uuid::now_v7();
            rows.slot.push(out.len() - 1);
            rows.ids.push(id);
            rows.namespaces.push(&task.namespace);
            rows.kinds.push(&task.kind);
            rows.payloads.push(task.payload.to_string());
            rows.placements.push(task.placement.to_string());
            rows.priorities.push(task.priority);
            rows.max_attempts.push(i64::from(task.max_attempts));
            rows.ttls.push(task.lease_ttl_ms);
            rows.keys.push(task.idempotency_key.as_deref());
            rows.not_before.push(task.not_before_ms.unwrap_or(now_ms));
            rows.labels.push(json_text(&task.labels)?);
            rows.agents.push(submission.agent_id);
            rows.leases
                .push(submission.agent_id.map(|_| Uuid::now_v7()));
        }
        if rows.ids.is_empty() {
            return Ok(out.into_iter().flatten().collect());
        }
        let mut events = Vec::new();
        let mut conn = self.read().await?;
        let out = insert_submits(&mut conn, submissions, &rows, out, now_ms, &mut events).await?;
        for event in events {
            self.notify_later(self.announce(event)?);
        }
        Ok(out)
    }

    /// A connection from the pool, for reads and single autocommitted
    /// statements.
    async fn read(&self) -> __Result<sqlx::pool::PoolConnection<Postgres>> {
        self.pool
            .acquire()
            .await
            .map_err(db("acquiring a connection"))
    }
}

/// The columns of a batch of submits, one array per column (see
/// [`SUBMIT_BATCH`]).
#[derive(Default)]
struct SubmitRows<'a> {
    /// Where each row's answer goes in the batch.
    slot: Vec<usize>,
    ids: Vec<Uuid>,
    namespaces: Vec<&'a str>,
    kinds: Vec<&'a str>,
    payloads: Vec<String>,
    placements: Vec<String>,
    priorities: Vec<i32>,
    max_attempts: Vec<i64>,
    ttls: Vec<i64>,
    keys: Vec<Option<&'a str>>,
    not_before: Vec<i64>,
    labels: Vec<String>,
    /// The agent reserved for the task, if any, and the id of its lease.
    agents: Vec<Option<Uuid>>,
    leases: Vec<Option<Uuid>>,
}

/// JSON as text, for a `text[]` parameter cast to `jsonb`.
fn json_text<T: serde::Serialize>(value: &T) -> __Result<String> {
    serde_json::to_string(value).map_err(|err| __Error::Corrupt {
        context: "encoding a task",
        detail: err.to_string(),
    })
}

/// One batch of submits in one round trip, autocommitted: the function of
/// migration 0004 locks the reserved agents, then inserts the tasks, their
/// history and the leases of those leased on the way in. A task is leased
/// if its reserved agent's live leases plus the batch's earlier grants to
/// it leave room; it is then inserted LEASED with its lease, its history
/// says `submitted` then `leased`, and it is announced as changed, not
/// queued. A task whose idempotency key is taken is not inserted.
const SUBMIT_BATCH: &str = "SELECT id, leased, known FROM switchyard_submit_batch($1::uuid[], \
  $2::text[], $3::text[], $4::text[], $5::text[], $6::int4[], $7::int8[], $8::int8[], \
  $9::text[], $10::int8[], $11::text[], $12::uuid[], $13::uuid[], $14::int8)";

/// The columns of a batch of settled attempts, one array per column: the
/// arguments of [`WHOLE_ATTEMPTS`] and of the completion statement.
#[derive(Default)]
struct SettledColumns<'a> {
    lease_ids: Vec<Uuid>,
    task_ids: Vec<Uuid>,
    agent_ids: Vec<Uuid>,
    lease_states: Vec<&'a str>,
    outcomes: Vec<&'a str>,
    task_states: Vec<&'a str>,
    attempts: Vec<i64>,
    not_before: Vec<i64>,
    results: Vec<Option<String>>,
    errors: Vec<Option<String>>,
    kinds: Vec<&'a str>,
    messages: Vec<&'a str>,
}

impl<'a> SettledColumns<'a> {
    /// One row per lease and how its attempt settles.
    fn new(settled: impl Iterator<Item = (&'a LeaseRecord, &'a SettledAttempt)>) -> Self {
        let mut columns = Self::default();
        for (lease, s) in settled {
            columns.lease_ids.push(lease.id);
            columns.task_ids.push(lease.task_id);
            columns.agent_ids.push(lease.agent_id);
            columns.lease_states.push(s.lease_state.as_str());
            columns.outcomes.push(s.outcome);
            columns.task_states.push(s.task_state.as_str());
            columns.attempts.push(i64::from(s.attempts));
            columns.not_before.push(s.not_before_ms);
            columns
                .results
                .push(s.result.as_ref().map(Value::to_string));
            columns.errors.push(s.error.as_ref().map(Value::to_string));
            columns.kinds.push(s.event_kind);
            columns.messages.push(s.message.as_str());
        }
        columns
    }

    /// `$1`-`$12`: the columns in the order above; `$13`: `now_ms`.
    fn arguments(&self, now_ms: i64) -> Result<sqlx::postgres::PgArguments, sqlx::Error> {
        use sqlx::Arguments as _;
        let mut arguments = sqlx::postgres::PgArguments::default();
        (|| {
            arguments.add(&self.lease_ids)?;
            arguments.add(&self.task_ids)?;
            arguments.add(&self.agent_ids)?;
            arguments.add(&self.lease_states)?;
            arguments.add(&self.outcomes)?;
            arguments.add(&self.task_states)?;
            arguments.add(&self.attempts)?;
            arguments.add(&self.not_before)?;
            arguments.add(&self.results)?;
            arguments.add(&self.errors)?;
            arguments.add(&self.kinds)?;
            arguments.add(&self.messages)?;
            arguments.add(now_ms)
        })()
        .map_err(sqlx::Error::Encode)?;
        Ok(arguments)
    }
}

/// [`SUBMIT_BATCH`] with `rows` bound.
fn submit_query<'q>(
    rows: &'q SubmitRows<'_>,
    now_ms: i64,
) -> sqlx::query::QueryAs<'q, Postgres, (Uuid, bool, bool), sqlx::postgres::PgArguments> {
    sqlx::query_as(SUBMIT_BATCH)
        .bind(&rows.ids)
        .bind(&rows.namespaces)
        .bind(&rows.kinds)
        .bind(&rows.payloads)
        .bind(&rows.placements)
        .bind(&rows.priorities)
        .bind(&rows.max_attempts)
        .bind(&rows.ttls)
        .bind(&rows.keys)
        .bind(&rows.not_before)
        .bind(&rows.labels)
        .bind(&rows.agents)
        .bind(&rows.leases)
        .bind(now_ms)
}

/// Readies a new connection for the statements every task goes through:
/// prepares each (the connection keeps it) and runs it on no rows, then
/// runs [`WARM_RUNS`] one-task submits and rolls them back; nothing is
/// left behind. A new backend's first runs of a statement pay for
/// compiling the submit function, cold catalog caches, the prepare round
/// trip and planning afresh: a connection's first submit cost about 10 ms
/// against 0.5 ms warm, and a freshly started replica's first few hundred
/// milliseconds of grants were slow.
async fn warm_connection(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    let no_ids: Vec<Uuid> = Vec::new();
    submit_query(&SubmitRows::default(), 0)
        .fetch_all(&mut *conn)
        .await?;
    // PostgreSQL plans a prepared statement afresh for its first five runs
    // on a connection and only then settles on a plan: a few one-task
    // submits, rolled back, spend those runs here rather than on live ones.
    let rows = SubmitRows {
        slot: vec![0],
        ids: vec![Uuid::nil()],
        namespaces: vec!["switchyard-warm-up"],
        kinds: vec!["warm-up"],
        payloads: vec!["null".to_owned()],
        placements: vec!["{}".to_owned()],
        priorities: vec![0],
        max_attempts: vec![1],
        ttls: vec![1],
        keys: vec![None],
        not_before: vec![0],
        labels: vec!["{}".to_owned()],
        agents: vec![None],
        leases: vec![None],
    };
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    for _ in 0..WARM_RUNS {
        sqlx::query("SAVEPOINT warm").execute(&mut *tx).await?;
        submit_query(&rows, 0).fetch_all(&mut *tx).await?;
        sqlx::query("ROLLBACK TO SAVEPOINT warm")
            .execute(&mut *tx)
            .await?;
    }
    tx.rollback().await?;
    sqlx::query(WHOLE_ATTEMPT_TASKS)
        .bind(&no_ids)
        .fetch_all(&mut *conn)
        .await?;
    sqlx::query(LEASES_WITH_OUTCOME)
        .bind(&no_ids)
        .fetch_all(&mut *conn)
        .await?;
    sqlx::query_with(WHOLE_ATTEMPTS, SettledColumns::default().arguments(0)?)
        .fetch_all(&mut *conn)
        .await?;
    Ok(())
}

/// Runs [`SUBMIT_BATCH`] over `rows` and answers each submission: the
/// task as inserted (built from what was sent, not read back), or the
/// task that already holds its idempotency key. `out` holds the answers
/// of the submissions refused before any statement; the events to announce
/// once committed are added to `events`.
async fn insert_submits(
    executor: &mut sqlx::PgConnection,
    submissions: &[Submission],
    rows: &SubmitRows<'_>,
    mut out: Vec<Option<__Result<Submitted>>>,
    now_ms: i64,
    events: &mut Vec<StoreEvent>,
) -> __Result<Vec<__Result<Submitted>>> {
    // Each row: the task's id, whether it was inserted (an idempotency
    // key already taken is not) and whether it was leased; a reserved
    // agent that is gone is told apart from a full one.
    let inserted: Vec<(Uuid, bool, bool)> = submit_query(rows, now_ms)
        .fetch_all(&mut *executor)
        .await
        .map_err(db("inserting tasks"))?;
    let inserted: HashMap<Uuid, (bool, bool)> = inserted
        .into_iter()
        .map(|(id, leased, known)| (id, (leased, known)))
        .collect();
    for (row, &slot) in rows.slot.iter().enumerate() {
        let submission = &submissions[slot];
        let task = &submission.task;
        let id = rows.ids[row];
        let Some(&(leased, known)) = inserted.get(&id) else {
            // Another submit with the same key came first (maybe in
            // this batch): answer with its task.
            let existing = task_by_key(executor, task)
                .await?
                .ok_or_else(|| __Error::Corrupt {
                    context: "inserting tasks",
                    detail: format!("task {id} was neither inserted nor found by its key"),
                })?;
            out[slot] = Some(Ok((existing, false, None)));
            continue;
        };
        let mut record = TaskRecord {
            id,
            namespace: task.namespace.clone(),
            kind: task.kind.clone(),
            payload: task.payload.clone(),
            placement: task.placement.clone(),
            priority: task.priority,
            state: TaskState::Queued,
            attempts: 0,
            max_attempts: task.max_attempts,
            lease_ttl_ms: task.lease_ttl_ms,
            idempotency_key: task.idempotency_key.clone(),
            not_before_ms: rows.not_before[row],
            result: None,
            error: None,
            fencing_token: 0,
            lease_id: None,
            agent_id: None,
            lease_expires_at_ms: None,
            cancel_requested: false,
            progress: None,
            labels: task.labels.clone(),
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
        };
        let grant = match (submission.agent_id, rows.leases[row]) {
            (Some(agent_id), Some(lease_id)) if leased => {
                let expires_at_ms = now_ms.saturating_add(task.lease_ttl_ms);
                record.state = TaskState::Leased;
                record.fencing_token = 1;
                record.lease_id = Some(lease_id);
                record.agent_id = Some(agent_id);
                record.lease_expires_at_ms = Some(expires_at_ms);
                Some(GrantOutcome::Granted(LeaseRecord {
                    id: lease_id,
                    task_id: id,
                    agent_id,
                    fencing_token: 1,
                    state: LeaseState::Granted,
                    granted_at_ms: now_ms,
                    acked: false,
                    expires_at_ms,
                }))
            }
            (Some(_), _) if known => Some(GrantOutcome::Refused(GrantRefusal::AgentAtCapacity)),
            (Some(_), _) => Some(GrantOutcome::Refused(GrantRefusal::AgentUnknown)),
            (None, _) => None,
        };
        events.push(if record.state == TaskState::Leased {
            StoreEvent::TaskChanged {
                task_id: id,
                state: TaskState::Leased,
            }
        } else {
            StoreEvent::queued(&record, record.not_before_ms)
        });
        out[slot] = Some(Ok((record, true, grant)));
    }
    Ok(out.into_iter().flatten().collect())
}

/// The notifier: sends the notifications of committed changes, all that
/// wait in one statement. NOTIFY serialises the commits of the
/// transactions that issue it (on one lock, held through the commit's
/// flush), so the busy transactions leave it to this one: they commit in
/// parallel, and one notifying commit at a time carries everyone's
/// notifications. Ends when every handle of the store is dropped.
async fn notify_committed(pool: PgPool, mut queue: mpsc::Receiver<String>) {
    let mut batch = Vec::new();
    while queue.recv_many(&mut batch, 4_096).await > 0 {
        if let Err(err) = sqlx::query(NOTIFY_UNFLUSHED)
            .bind(CHANNEL)
            .bind(&batch)
            .execute(&pool)
            .await
        {
            // The replicas' timers re-read what the notifications said.
            tracing::warn!(cause = %err, dropped = batch.len(), "cannot notify replicas of committed changes");
            metrics::counter!(crate::metrics::NOTIFICATIONS_DROPPED).increment(batch.len() as u64);
        }
        batch.clear();
    }
}

/// The grants of a batch that fit their agents' free slots, written: the
/// leases, the tasks LEASED, one history entry each. Answers the task ids
/// that fit and those leased (the same, with the tasks locked). A task is
/// updated only if its fencing token is still the one the grant was planned
/// on (looked up by id: a `state = 'queued'` condition could make the
/// planner scan the queue's partial index instead).
const GRANT_LEASES: &str = "\
WITH g AS ( \
  SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::int8[], $5::int8[]) \
  WITH ORDINALITY AS g(lease_id, task_id, agent_id, token, expires_at_ms, ord) \
), live AS ( \
  SELECT l.agent_id, COUNT(*) AS n FROM leases l \
  WHERE l.agent_id = ANY($3) AND l.state IN ('granted', 'active') GROUP BY l.agent_id \
), fit AS ( \
  SELECT r.* FROM ( \
    SELECT g.*, ROW_NUMBER() OVER (PARTITION BY g.agent_id ORDER BY g.ord) AS rn FROM g \
  ) r JOIN agents a ON a.id = r.agent_id LEFT JOIN live ON live.agent_id = r.agent_id \
  WHERE COALESCE(live.n, 0) + r.rn <= a.capacity \
), new_leases AS ( \
  INSERT INTO leases (id, task_id, agent_id, fencing_token, state, acked, granted_at_ms, \
  expires_at_ms) \
  SELECT lease_id, task_id, agent_id, token, 'granted', FALSE, $6, expires_at_ms FROM fit \
), leased AS ( \
  UPDATE tasks t SET state = 'leased', fencing_token = fit.token, lease_id = fit.lease_id, \
  agent_id = fit.agent_id, progress = NULL, updated_at_ms = $6 FROM fit \
  WHERE t.id = fit.task_id AND t.fencing_token + 1 = fit.token RETURNING t.id \
), history AS ( \
  INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id, \
  occurred_at_ms) \
  SELECT fit.task_id, COALESCE((SELECT MAX(e.sequence) FROM task_events e \
  WHERE e.task_id = fit.task_id), 0) + 1, 'leased', 'leased', \
  'leased to agent ' || fit.agent_id::text || ' with fencing token ' || fit.token::text, \
  fit.agent_id, fit.lease_id, $6 FROM fit \
) \
SELECT ARRAY(SELECT task_id FROM fit), ARRAY(SELECT id FROM leased)";

/// Feeds notifications to the broadcast until the store is dropped. The
/// listener reconnects (and re-listens) by itself; while it is down nothing is
/// emitted, and the dispatcher's slow safety sweep covers what was missed.
async fn forward_notifications(
    mut listener: PgListener,
    events: broadcast::Sender<StoreEvent>,
    origin: Uuid,
) {
    loop {
        match listener.recv().await {
            Ok(notification) => match serde_json::from_str::<Announced>(notification.payload()) {
                Ok(announced) => {
                    // What this replica changed, it applied itself.
                    if announced.origin == origin
                        && matches!(
                            announced.event,
                            StoreEvent::AgentChanged { .. } | StoreEvent::LeaseEnded { .. }
                        )
                    {
                        continue;
                    }
                    let _ = events.send(announced.event);
                }
                Err(err) => {
                    tracing::warn!(cause = %err, "ignoring an unreadable store event");
                }
            },
            Err(err) => {
                tracing::warn!(cause = %err, "store event listener disconnected; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> __Result<()> {
        // A schema migrated by a newer release is accepted: migrations are
        // additive, so a rolled-back binary (or an old replica mid-upgrade)
        // runs on it; sqlx would otherwise refuse versions it does not know.
        let mut migrator = sqlx::migrate!("migrations/postgres");
        migrator.set_ignore_missing(true);
        migrator
            .run(&self.pool)
            .await
            .map_err(|source| __Error::Store {
                context: "running postgres migrations",
                source: source.into(),
            })?;
        // The pool's first connections opened before the schema existed
        // (a fresh database), so their warm-up failed; warm them now. On a
        // schema from a newer release the warm-up may no longer fit: that
        // only makes the first submits slower.
        if let Err(err) = self.warm().await {
            tracing::warn!(cause = %err, "the store's connections were not warmed");
        }
        self.check_autovacuum().await;
        Ok(())
    }

    async fn ping(&self) -> __Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(db("pinging"))?;
        Ok(())
    }

    async fn close(&self) {
        self.listener.0.abort();
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
        self.submit_batch(submissions, now_ms).await
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
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let mut task_ids: Vec<Uuid> = completions.iter().map(|c| c.task_id).collect();
        task_ids.sort_unstable();
        task_ids.dedup();
        let lease_ids: Vec<Uuid> = completions.iter().map(|c| c.lease_id).collect();
        let mut tx = self.begin().await?;
        // Every task of the batch, locked in id order (one round trip).
        let rows = sqlx::query(concat!(
            task_select!(),
            "WHERE t.id = ANY($1) ORDER BY t.id FOR UPDATE OF t"
        ))
        .bind(&task_ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("locking tasks to complete"))?;
        let mut tasks: HashMap<Uuid, TaskRecord> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let task = task_from_row(row)?;
            tasks.insert(task.id, task);
        }
        // Every named lease with its recorded outcome (one round trip).
        let rows = sqlx::query(LEASES_WITH_OUTCOME)
            .bind(&lease_ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(db("reading leases to complete"))?;
        let mut leases: HashMap<Uuid, (LeaseRecord, Option<String>)> =
            HashMap::with_capacity(rows.len());
        for row in &rows {
            let outcome: Option<String> =
                sqlx::Row::try_get(row, "outcome").map_err(db("reading a lease outcome"))?;
            let lease = lease_from_row(row)?;
            leases.insert(lease.id, (lease, outcome));
        }

        // Decide each report in order; a settled report ends its lease for
        // the reports after it in the same batch.
        let mut results: Vec<Option<__Result<CompletionResult>>> = Vec::new();
        let mut settle: Vec<(usize, LeaseRecord, SettledAttempt)> = Vec::new();
        for (i, completion) in completions.iter().enumerate() {
            let Some(task) = tasks.get(&completion.task_id) else {
                results.push(Some(Err(__Error::NotFound {
                    what: "task",
                    id: completion.task_id.to_string(),
                })));
                continue;
            };
            let lease = leases
                .get(&completion.lease_id)
                .map(|(lease, outcome)| (lease, outcome.as_deref()));
            match plan_completion(
                task,
                lease,
                completion,
                self.options.backoff_base_ms,
                now_ms,
            ) {
                Ok(CompletionPlan::Duplicate) => results.push(Some(Ok(CompletionResult {
                    task: task.clone(),
                    duplicate: true,
                }))),
                Ok(CompletionPlan::Settle(settled)) => {
                    if let Some((lease, outcome)) = leases.get_mut(&completion.lease_id) {
                        let before = lease.clone();
                        lease.state = settled.lease_state;
                        *outcome = Some(settled.outcome.to_owned());
                        settle.push((i, before, settled));
                    }
                    results.push(None);
                }
                Err(err) => results.push(Some(Err(err))),
            }
        }

        let mut events = Vec::new();
        if !settle.is_empty() {
            let columns = SettledColumns::new(settle.iter().map(|(_, l, s)| (l, s)));
            let arguments = columns
                .arguments(now_ms)
                .map_err(db("encoding settled attempts"))?;
            // One round trip: end the leases, settle the tasks, append the
            // history; the settled tasks come back.
            let rows = sqlx::query_with(
                "WITH c AS ( \
                   SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], \
                   $5::text[], $6::text[], $7::int8[], $8::int8[], $9::text[], $10::text[], \
                   $11::text[], $12::text[]) AS c(lease_id, task_id, agent_id, lease_state, \
                   outcome, task_state, attempts, not_before_ms, result, error, event_kind, \
                   message) \
                 ), ended AS ( \
                   UPDATE leases l SET state = c.lease_state, outcome = c.outcome, \
                   ended_at_ms = $13 FROM c \
                   WHERE l.id = c.lease_id AND l.state IN ('granted', 'active') RETURNING l.id \
                 ), history AS ( \
                   INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, \
                   lease_id, occurred_at_ms) \
                   SELECT c.task_id, COALESCE((SELECT MAX(e.sequence) FROM task_events e \
                   WHERE e.task_id = c.task_id), 0) + 1, c.event_kind, c.task_state, \
                   c.message, c.agent_id, c.lease_id, $13 FROM c \
                 ), settled AS ( \
                   UPDATE tasks t SET state = c.task_state, attempts = c.attempts, \
                   not_before_ms = c.not_before_ms, \
                   result = COALESCE(c.result::jsonb, t.result), \
                   error = COALESCE(c.error::jsonb, t.error), \
                   lease_id = NULL, agent_id = NULL, updated_at_ms = $13 \
                   FROM c WHERE t.id = c.task_id \
                   RETURNING t.id, t.namespace, t.kind, t.payload, t.placement, t.priority, \
                   t.state, t.attempts, t.max_attempts, t.lease_ttl_ms, t.idempotency_key, \
                   t.not_before_ms, t.result, t.error, t.fencing_token, t.lease_id, \
                   t.agent_id, NULL::int8 AS lease_expires_at_ms, t.cancel_requested, \
                   t.progress, t.labels, t.created_at_ms, t.updated_at_ms \
                 ) \
                 SELECT s.*, (SELECT COUNT(*) FROM ended) AS ended FROM settled s",
                arguments,
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(db("completing leases"))?;
            let mut settled_tasks: HashMap<Uuid, TaskRecord> = HashMap::new();
            for row in &rows {
                let ended: i64 =
                    sqlx::Row::try_get(row, "ended").map_err(db("counting ended leases"))?;
                if usize::try_from(ended).ok() != Some(settle.len()) {
                    // The leases were read live under the task locks; refuse
                    // to commit rather than miscount capacity.
                    return Err(__Error::Corrupt {
                        context: "completing leases",
                        detail: format!("{ended} of {} live leases ended", settle.len()),
                    });
                }
                let task = task_from_row(row)?;
                settled_tasks.insert(task.id, task);
            }
            for (i, lease, settled) in &settle {
                let Some(task) = settled_tasks.get(&lease.task_id) else {
                    return Err(__Error::Corrupt {
                        context: "completing leases",
                        detail: format!("task {} was not settled", lease.task_id),
                    });
                };
                if settled.task_state == TaskState::Queued {
                    events.push(StoreEvent::queued(task, settled.not_before_ms));
                }
                events.push(StoreEvent::TaskChanged {
                    task_id: task.id,
                    state: settled.task_state,
                });
                results[*i] = Some(Ok(CompletionResult {
                    task: task.clone(),
                    duplicate: false,
                }));
            }
            // A repeat of a report settled earlier in this batch answers with
            // the settled task.
            for result in results.iter_mut().flatten().flatten() {
                if result.duplicate
                    && let Some(task) = settled_tasks.get(&result.task.id)
                {
                    result.task = task.clone();
                }
            }
        }
        self.commit(tx, events).await?;
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or(Err(__Error::Corrupt {
                    context: "completing leases",
                    detail: "an item was not decided".to_owned(),
                }))
            })
            .collect())
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
        let mut results: Vec<Option<__Result<ReportApplied>>> =
            reports.iter().map(|_| None).collect();
        let whole = whole_attempts(
            &mut tx,
            reports,
            self.options.backoff_base_ms,
            now_ms,
            &mut results,
            &mut events,
        )
        .await?;
        // The rest (reports of tasks that were not a whole fresh attempt),
        // one by one; their task rows are already locked.
        let rest: Vec<usize> = (0..reports.len())
            .filter(|&i| results[i].is_none())
            .collect();
        if !rest.is_empty() {
            let subset: Vec<LeaseReport> = rest.iter().map(|&i| reports[i].clone()).collect();
            let applied = apply_reports(
                &mut tx,
                &subset,
                self.options.backoff_base_ms,
                now_ms,
                &mut events,
            )
            .await?;
            for (i, result) in rest.into_iter().zip(applied) {
                results[i] = Some(result);
            }
        }
        self.commit(tx, events).await?;
        tracing::trace!(reports = reports.len(), whole, "lease reports applied");
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or(Err(__Error::Corrupt {
                    context: "applying lease reports",
                    detail: "a report was not decided".to_owned(),
                }))
            })
            .collect())
    }

    async fn heartbeats(
        &self,
        beats: &[Beat],
        now_ms: i64,
    ) -> __Result<Vec<__Result<BeatApplied>>> {
        if beats.is_empty() {
            return Ok(Vec::new());
        }
        let ids = |pick: fn(&Beat) -> bool| {
            let mut ids: Vec<Uuid> = beats
                .iter()
                .filter(|b| pick(b))
                .map(|b| b.agent_id)
                .collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let renewing = ids(|b| b.renew);
        let touching = ids(|b| b.touch);
        let mut tx = self.begin().await?;
        let mut events = Vec::new();
        // The live leases of agents holding some renewed, and agents due a
        // touch touched: two statements for the whole batch, agent rows in
        // id order.
        sqlx::query(
            "UPDATE leases SET expires_at_ms = $2 + \
             (SELECT t.lease_ttl_ms FROM tasks t WHERE t.id = leases.task_id) \
             WHERE agent_id = ANY($1) AND state IN ('granted', 'active')",
        )
        .bind(&renewing)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .map_err(db("renewing leases"))?;
        sqlx::query(
            "UPDATE agents SET last_seen_at_ms = $2 FROM \
             (SELECT id FROM agents WHERE id = ANY($1) ORDER BY id FOR UPDATE) locked \
             WHERE agents.id = locked.id AND agents.last_seen_at_ms < $2",
        )
        .bind(&touching)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .map_err(db("touching agents"))?;
        let mut results: Vec<__Result<BeatApplied>> = Vec::with_capacity(beats.len());
        // Status changes are rare: one by one.
        for beat in beats {
            if let Some((status, reasons)) = &beat.status {
                set_agent_status(
                    &mut tx,
                    beat.agent_id,
                    status,
                    reasons,
                    Some(beat.session_epoch),
                    now_ms,
                    &mut events,
                )
                .await?;
            }
        }
        // Documents: one compare-and-set statement for the batch.
        let writes: Vec<(Uuid, &DocumentWrite)> = beats
            .iter()
            .filter_map(|b| b.document.as_ref().map(|d| (b.agent_id, d)))
            .collect();
        let mut written: HashMap<Uuid, i64> = HashMap::new();
        if !writes.is_empty() {
            let ids: Vec<Uuid> = writes.iter().map(|(id, _)| *id).collect();
            let expected: Vec<i64> = writes
                .iter()
                .map(|(_, d)| to_i64(d.expected_generation))
                .collect();
            let reported: Vec<String> =
                writes.iter().map(|(_, d)| d.reported.to_string()).collect();
            let documents: Vec<String> =
                writes.iter().map(|(_, d)| d.document.to_string()).collect();
            let provenance: Vec<String> = writes
                .iter()
                .map(|(_, d)| d.provenance.to_string())
                .collect();
            let generations: Vec<i64> = writes.iter().map(|(_, d)| to_i64(d.generation)).collect();
            written = sqlx::query_as::<_, (Uuid, i64)>(
                "UPDATE agents a SET reported = d.reported::jsonb, document = d.document::jsonb, \
                 provenance = d.provenance::jsonb, generation = d.generation, \
                 updated_at_ms = $6 \
                 FROM UNNEST($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::text[], \
                 $7::int8[]) AS d(id, expected, reported, document, provenance, generation) \
                 WHERE a.id = d.id AND a.generation = d.expected RETURNING a.id, a.generation",
            )
            .bind(&ids)
            .bind(&expected)
            .bind(&reported)
            .bind(&documents)
            .bind(&provenance)
            .bind(now_ms)
            .bind(&generations)
            .fetch_all(&mut *tx)
            .await
            .map_err(db("writing agent documents"))?
            .into_iter()
            .collect();
        }
        for beat in beats {
            results.push(match &beat.document {
                None => Ok(BeatApplied::Renewed),
                Some(_) => match written.get(&beat.agent_id) {
                    Some(&generation) => Ok(BeatApplied::Written(to_u64(generation))),
                    None => fetch_agent(&mut tx, beat.agent_id)
                        .await
                        .map(|a| BeatApplied::Stale(a.generation)),
                },
            });
        }
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

/// The set-based fast path of [`Store::apply_reports`]: locks every task of
/// the batch in id order, and applies each *whole fresh attempt* (a task
/// whose only reports in the batch are `accepted`, `started` and a final
/// report of the lease it was just granted) in one statement for all of
/// them: leases ended, tasks settled, three history entries each. Fills
/// those reports' results and returns how many attempts it applied; every
/// other report is left `None` for the one-by-one path.
async fn whole_attempts(
    tx: &mut Transaction<'static, Postgres>,
    reports: &[LeaseReport],
    backoff_base_ms: i64,
    now_ms: i64,
    results: &mut [Option<__Result<ReportApplied>>],
    events: &mut Vec<StoreEvent>,
) -> __Result<usize> {
    let mut task_ids: Vec<Uuid> = reports.iter().map(|r| r.task_id).collect();
    task_ids.sort_unstable();
    task_ids.dedup();
    // Every task of the batch, locked in id order (the one-by-one path
    // then finds its rows already held: one lock order for the batch).
    // Settling reads none of a task's documents (payload, placement,
    // result, error, progress, labels): they stay in the database, and the
    // records here hold nulls and no labels in their place.
    let rows = sqlx::query(WHOLE_ATTEMPT_TASKS)
        .bind(&task_ids)
        .fetch_all(&mut **tx)
        .await
        .map_err(db("locking tasks to apply reports"))?;
    let mut tasks: HashMap<Uuid, TaskRecord> = HashMap::with_capacity(rows.len());
    for row in &rows {
        let task = task_from_row(row)?;
        tasks.insert(task.id, task);
    }
    // Candidates: exactly accepted, started, final of one lease, in order.
    let mut by_task: HashMap<Uuid, Vec<usize>> = HashMap::new();
    for (i, r) in reports.iter().enumerate() {
        by_task.entry(r.task_id).or_default().push(i);
    }
    let candidates: Vec<[usize; 3]> = by_task
        .values()
        .filter_map(|idx| {
            let &[a, st, f] = idx.as_slice() else {
                return None;
            };
            let (ra, rs, rf) = (&reports[a], &reports[st], &reports[f]);
            let same = |x: &LeaseReport| {
                x.lease_id == ra.lease_id
                    && x.agent_id == ra.agent_id
                    && x.fencing_token == ra.fencing_token
            };
            (ra.kind == ReportKind::Accepted
                && rs.kind == ReportKind::Started
                && matches!(rf.kind, ReportKind::Final(_))
                && same(rs)
                && same(rf))
            .then_some([a, st, f])
        })
        .collect();
    if candidates.is_empty() {
        return Ok(0);
    }
    let lease_ids: Vec<Uuid> = candidates.iter().map(|c| reports[c[0]].lease_id).collect();
    let rows = sqlx::query(LEASES_WITH_OUTCOME)
        .bind(&lease_ids)
        .fetch_all(&mut **tx)
        .await
        .map_err(db("reading leases to apply reports"))?;
    let mut leases: HashMap<Uuid, LeaseRecord> = HashMap::with_capacity(rows.len());
    for row in &rows {
        let lease = lease_from_row(row)?;
        leases.insert(lease.id, lease);
    }
    let mut settle: Vec<([usize; 3], LeaseRecord, TaskRecord, SettledAttempt)> = Vec::new();
    for c in candidates {
        let report = &reports[c[0]];
        let (Some(task), Some(lease)) = (tasks.get(&report.task_id), leases.get(&report.lease_id))
        else {
            continue;
        };
        let fresh = lease.state == LeaseState::Granted
            && task.state == TaskState::Leased
            && check_holder(
                task,
                Some(lease),
                report.lease_id,
                report.agent_id,
                report.fencing_token,
            )
            .is_ok();
        let ReportKind::Final(outcome) = &reports[c[2]].kind else {
            continue;
        };
        if !fresh {
            continue;
        }
        let running = TaskRecord {
            state: TaskState::Running,
            ..task.clone()
        };
        let active = LeaseRecord {
            state: LeaseState::Active,
            acked: true,
            ..lease.clone()
        };
        let completion = Completion {
            lease_id: report.lease_id,
            task_id: report.task_id,
            agent_id: report.agent_id,
            fencing_token: report.fencing_token,
            outcome: outcome.clone(),
        };
        if let Ok(CompletionPlan::Settle(settled)) = plan_completion(
            &running,
            Some((&active, None)),
            &completion,
            backoff_base_ms,
            now_ms,
        ) {
            settle.push((c, active, running, settled));
        }
    }
    if settle.is_empty() {
        return Ok(0);
    }
    let columns = SettledColumns::new(settle.iter().map(|(_, l, _, s)| (l, s)));
    let arguments = columns
        .arguments(now_ms)
        .map_err(db("encoding whole attempts"))?;
    // One round trip: end the leases (acknowledged), settle the tasks, and
    // append accepted, started and the end to each history (the history's
    // last sequence looked up once per task, not once per entry).
    let (ended, settled): (i64, i64) = sqlx::query_as_with(WHOLE_ATTEMPTS, arguments)
        .fetch_one(&mut **tx)
        .await
        .map_err(db("applying whole attempts"))?;
    if [ended, settled]
        .iter()
        .any(|&n| usize::try_from(n).ok() != Some(settle.len()))
    {
        // The rows were read under the task locks; refuse to commit rather
        // than record half an attempt.
        return Err(__Error::Corrupt {
            context: "applying whole attempts",
            detail: format!(
                "{ended} leases ended and {settled} tasks settled of {} attempts",
                settle.len()
            ),
        });
    }
    for (c, _, task, settled) in &settle {
        if settled.task_state == TaskState::Queued {
            events.push(StoreEvent::queued(task, settled.not_before_ms));
        }
        events.push(StoreEvent::TaskChanged {
            task_id: task.id,
            state: settled.task_state,
        });
        results[c[0]] = Some(Ok(ReportApplied { ended: false }));
        results[c[1]] = Some(Ok(ReportApplied { ended: false }));
        results[c[2]] = Some(Ok(ReportApplied { ended: true }));
    }
    Ok(settle.len())
}

/// Leases tasks to agents inside the caller's transaction (see
/// [`Store::grant_leases`]); the events to announce are added to `events`.
///
/// Four statements: the requested tasks are locked (`SKIP LOCKED`: one another
/// transaction is changing is refused), then the agents (in id order, as
/// every grant and submit locks them, so concurrent grants queue instead of
/// deadlocking), and then one statement counts the agents' live leases,
/// keeps the grants that fit their capacity, and writes leases, tasks and
/// history. The count is a statement after the agent locks, so it sees
/// every grant committed before ours; the agents stay locked only for that
/// statement and the commit.
async fn grant_in(
    tx: &mut Transaction<'static, Postgres>,
    requests: &[GrantRequest],
    now_ms: i64,
    events: &mut Vec<StoreEvent>,
) -> __Result<Vec<GrantOutcome>> {
    let task_ids: Vec<Uuid> = requests.iter().map(|r| r.task_id).collect();
    // By id alone: with `state = 'queued'` in the condition the planner
    // may read the rows through the queue's partial index (it does
    // whenever its statistics undercount the queue, as after a burst of
    // submits) and filter the whole queue by id. The state is checked in
    // `plan_grants`.
    let task_rows: Vec<(Uuid, String, i64, i64, i64)> = sqlx::query_as(
        "SELECT id, state, not_before_ms, fencing_token, lease_ttl_ms FROM tasks \
         WHERE id = ANY($1) FOR UPDATE SKIP LOCKED",
    )
    .bind(&task_ids)
    .fetch_all(&mut **tx)
    .await
    .map_err(db("locking tasks to grant"))?;
    let tasks: HashMap<Uuid, GrantableTask> = task_rows
        .into_iter()
        .map(|(id, state, not_before_ms, fencing_token, lease_ttl_ms)| {
            Ok((
                id,
                GrantableTask {
                    state: state.parse().map_err(corrupt("locking tasks to grant"))?,
                    not_before_ms,
                    fencing_token,
                    lease_ttl_ms,
                },
            ))
        })
        .collect::<__Result<_>>()?;
    let mut agent_ids: Vec<Uuid> = requests
        .iter()
        .filter(|r| tasks.contains_key(&r.task_id))
        .map(|r| r.agent_id)
        .collect();
    agent_ids.sort_unstable();
    agent_ids.dedup();
    let known: Vec<Uuid> = if agent_ids.is_empty() {
        Vec::new()
    } else {
        sqlx::query_scalar(LOCK_AGENTS)
            .bind(&agent_ids)
            .fetch_all(&mut **tx)
            .await
            .map_err(db("locking agents to grant"))?
    };
    // Planned as if every agent had room; the statement keeps, agent by
    // agent in request order, the grants its free slots allow.
    let unbounded: HashMap<Uuid, (i64, i64)> =
        known.iter().map(|id| (*id, (i64::MAX, 0))).collect();
    let mut plan = plan_grants(requests, &unbounded, &tasks, now_ms);
    let planned: Vec<_> = plan.iter().filter_map(|p| p.as_ref().ok()).collect();
    if !planned.is_empty() {
        let lease_ids: Vec<Uuid> = planned.iter().map(|g| g.lease_id).collect();
        let task_ids: Vec<Uuid> = planned.iter().map(|g| g.task_id).collect();
        let agent_ids: Vec<Uuid> = planned.iter().map(|g| g.agent_id).collect();
        let tokens: Vec<i64> = planned.iter().map(|g| g.fencing_token).collect();
        let expiries: Vec<i64> = planned.iter().map(|g| g.expires_at_ms).collect();
        let (fitting, leased): (Vec<Uuid>, Vec<Uuid>) = sqlx::query_as(GRANT_LEASES)
            .bind(&lease_ids)
            .bind(&task_ids)
            .bind(&agent_ids)
            .bind(&tokens)
            .bind(&expiries)
            .bind(now_ms)
            .fetch_one(&mut **tx)
            .await
            .map_err(db("granting leases"))?;
        if leased.len() != fitting.len() {
            // Cannot happen with the rows locked above; refuse to commit
            // rather than count capacity wrongly.
            return Err(__Error::Corrupt {
                context: "granting leases",
                detail: format!(
                    "{} of {} locked tasks were leased",
                    leased.len(),
                    fitting.len()
                ),
            });
        }
        let leased: std::collections::HashSet<Uuid> = leased.into_iter().collect();
        for planned in &mut plan {
            if planned.as_ref().is_ok_and(|g| !leased.contains(&g.task_id)) {
                *planned = Err(GrantRefusal::AgentAtCapacity);
            }
        }
    }
    let outcomes = plan
        .into_iter()
        .map(|planned| match planned {
            Ok(grant) => {
                events.push(StoreEvent::TaskChanged {
                    task_id: grant.task_id,
                    state: TaskState::Leased,
                });
                GrantOutcome::Granted(LeaseRecord {
                    id: grant.lease_id,
                    task_id: grant.task_id,
                    agent_id: grant.agent_id,
                    fencing_token: to_u64(grant.fencing_token),
                    state: LeaseState::Granted,
                    granted_at_ms: now_ms,
                    acked: false,
                    expires_at_ms: grant.expires_at_ms,
                })
            }
            Err(refusal) => GrantOutcome::Refused(refusal),
        })
        .collect();
    Ok(outcomes)
}
