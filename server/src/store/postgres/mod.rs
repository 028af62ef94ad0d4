//! The PostgreSQL backend: many server replicas on one database.
//! Transitions lock rows (`FOR UPDATE`; sweeps `SKIP LOCKED` what another
//! replica is working on); submits, grants, whole attempts, completions and
//! heartbeats go to the database as one set-based statement per batch, over
//! arrays (`UNNEST`), deciding through the same [`crate::store::plan`]
//! functions as the row-by-row SQL, so both agree. A change reaches this
//! replica's subscribers at its commit, and, while another replica reads
//! it (`peers`: it has agents connected or a watcher open, `follow`), is
//! announced on `switchyard_events` so every other replica's [`PgListener`]
//! learns of it (a task's changes and output only while another replica
//! follows them): an agent change or a revocation by
//! `pg_notify` in its own transaction (delivered at its commit), a task
//! queued or changed or a lease ended by the notifier task right after the
//! commit (NOTIFY serialises the commits that issue it; the notifier's own
//! commits do not wait for the log's flush, as they hold nothing to keep).
//! New pool connections are warmed before their first use; grants, report
//! batches and submits' batches run on a few connections of their own
//! (`warm`).
//!
//! # Layout
//! - `submit`, `grant`, `settle`, `heartbeat`, `output`: the set-based
//!   paths. A grant and a report batch run their statements after the
//!   first on the plans each connection keeps ([`KEEP_PLANS`]); a report
//!   batch's whole fresh successes are settled before its transaction, in
//!   one call of their own (`settle::settle_successes`).
//! - `warm`: connection warm-up.
//! - `peers`: whether another replica reads the dispatcher's events, and
//!   whether another follows tasks' changes; greeting them.
//! - `follow`: this replica's readers of either, told to the others.
//! - `stats`: planner statistics kept up with tables that double.

mod follow;
mod grant;
mod heartbeat;
mod output;
mod peers;
mod settle;
mod stats;
mod submit;
#[cfg(test)]
mod tests;
mod warm;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use const_format::concatcp;
use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::StoreOptions;
use super::plan::db;
use super::sql::queue::{QUEUE_BELOW, QUEUE_ORDER, QUEUE_WHERE};
use super::sql::rows::TASK_SELECT;
use super::sql::{Backend, Dialect, SqlStore, Write};
use crate::error::{Error, Result};
use crate::model::{
    Beat, BeatOutcome, Completion, CompletionResult, GrantOutcome, GrantRequest, LeaseReport,
    ReportApplied, StoreEvent, Submission, Submitted,
};

/// A store on a PostgreSQL database.
pub type PgStore = SqlStore<PgBackend>;

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

/// A condition, added to the first statement of a grant or a report
/// batch, that makes PostgreSQL keep one plan per connection for the
/// statements after it in the transaction (`plan_cache_mode`, set for the
/// transaction). PostgreSQL plans a prepared statement afresh for its
/// first five runs on a connection, and after each analysis of its tables,
/// before it may keep a plan; so with the choice left to it a grant or a
/// report batch was planned for nearly every run on the 32 shared
/// connections, and still for many on the four of their own (`warm`).
/// The lock itself stays PostgreSQL's choice: PostgreSQL plans it for the
/// table's size at each run, where a kept plan made while `tasks` was
/// small passes over the whole table. Planned as a one-time filter: set
/// once, before the statement reads a row, whether or not it finds any.
const KEEP_PLANS: &str =
    "(SELECT set_config('plan_cache_mode', 'force_generic_plan', TRUE)) IS NOT NULL";

/// A queue page's range after a cursor within its priority, as one row
/// comparison, which `tasks_queue` seeks: the scan starts just after the
/// cursor. The range SQLite needs (its dialect's, written out)
/// starts at the cursor's rank and leaves the tasks of that rank before
/// the cursor to a filter, so a page after a cursor among many tasks of
/// one rank (a batch submitted in one millisecond) read all of them again.
const QUEUE_AFTER: &str =
    "AND t.priority = $5 AND (t.created_at_ms + t.fair_offset, t.id) > ($6, $7) ";

/// How many notifications may wait for the notifier.
const NOTIFIER_QUEUE: usize = 65_536;

/// A hashed subplan: one probe per task however many are parked.
const NOT_PARKED: &str = "AND (t.namespace, t.kind, t.placement) NOT IN \
    (SELECT p->>0, p->>1, (p->>2)::jsonb FROM jsonb_array_elements($4::jsonb) AS p)";

/// A queued task's placement group: its namespace, kind and placement,
/// hashed as the index `tasks_queue_groups` keys them.
const GROUP: &str = "md5(t.namespace || chr(31) || t.kind || chr(31) || t.placement::text)::uuid";

/// The placement groups of the queue, one index probe each (`g.grp`), at
/// most 1,024 of them ([`GROUP_RESULT`] says if there were more).
const GROUPS: &str = concatcp!(
    "WITH RECURSIVE g(grp, n) AS ((SELECT ",
    GROUP,
    ", 1 FROM tasks t WHERE t.state = 'queued' ORDER BY 1 LIMIT 1) \
    UNION ALL SELECT nx.grp, g.n + 1 FROM g CROSS JOIN LATERAL (SELECT ",
    GROUP,
    " AS grp FROM tasks t WHERE t.state = 'queued' AND ",
    GROUP,
    " > g.grp ORDER BY 1 LIMIT 1) nx WHERE g.n < 1024), \
    f AS (SELECT f.priority, f.queue_rank, f.id FROM g CROSS JOIN LATERAL "
);

/// The first due task of group `g` (a place it comes after may follow).
const GROUP_FIRST: &str = concatcp!(
    "SELECT t.priority, t.created_at_ms + t.fair_offset AS queue_rank, t.id FROM tasks t \
    WHERE t.state = 'queued' AND ",
    GROUP,
    " = g.grp AND t.not_before_ms <= $1 "
);

/// A group's tasks after the place `$3` (priority), `$4` (rank), `$5` (id)
/// in the queue: one row comparison in the order of `tasks_queue_groups`,
/// which only that index serves (see its migration, 0021).
const GROUP_AFTER: &str = concatcp!(
    "AND (",
    GROUP,
    ", -(t.priority::int8), t.created_at_ms + t.fair_offset, t.id) \
    > (g.grp, -($3::int8), $4, $5) "
);

/// Queue order within a group, one task: the order of `tasks_queue_groups`.
const FIRST: &str = concatcp!(
    "ORDER BY ",
    GROUP,
    ", -(t.priority::int8), t.created_at_ms + t.fair_offset, t.id LIMIT 1"
);

/// The groups of the parked placements in `$2` left out, and the first
/// place of those that remain; then [`GROUP_RESULT`].
const GROUP_NOT_PARKED: &str = concatcp!(
    " f WHERE g.grp NOT IN (SELECT md5((p->>0) || chr(31) || (p->>1) || chr(31) || \
    ((p->>2)::jsonb)::text)::uuid FROM jsonb_array_elements($2::jsonb) AS p) \
    ORDER BY 1 DESC, 2, 3 LIMIT 1) ",
    GROUP_RESULT
);

/// One row: the place found (NULLs if none), and `capped` if the queue
/// has more placement groups than were taken (then the place says
/// nothing, and the queue is read as a page would).
const GROUP_RESULT: &str = "SELECT f.priority, f.queue_rank, f.id, \
    (SELECT count(*) FROM g) >= 1024 AS capped FROM (SELECT 1) AS one LEFT JOIN f ON TRUE";

/// Sweeps on every replica at once share the work: a row another replica
/// holds is skipped.
const DUE: &str = "SELECT l.id FROM leases l JOIN tasks t ON t.id = l.task_id \
    WHERE l.state IN ('granted', 'active') AND l.expires_at_ms <= $1 ORDER BY t.id LIMIT $2 \
    FOR UPDATE OF t SKIP LOCKED";
const UNACKED: &str = "SELECT l.id FROM leases l JOIN tasks t ON t.id = l.task_id \
    WHERE l.state = 'granted' AND NOT l.acked AND l.granted_at_ms < $1 \
    AND ($2::uuid IS NULL OR l.agent_id = $2) ORDER BY t.id FOR UPDATE OF t SKIP LOCKED";

impl Dialect for Postgres {
    const LOCK_TASK: &'static str = concatcp!(TASK_SELECT, "WHERE t.id = $1 FOR UPDATE OF t");
    const DUE_LEASES: &'static str = DUE;
    const UNACKED_LEASES: &'static str = UNACKED;
    const QUEUE_HEAD: &'static str = concatcp!(TASK_SELECT, QUEUE_WHERE, NOT_PARKED, QUEUE_ORDER);
    const QUEUE_AFTER: &'static str = concatcp!(
        TASK_SELECT,
        QUEUE_WHERE,
        QUEUE_AFTER,
        NOT_PARKED,
        QUEUE_ORDER
    );
    const QUEUE_BELOW: &'static str = concatcp!(
        TASK_SELECT,
        QUEUE_WHERE,
        QUEUE_BELOW,
        NOT_PARKED,
        QUEUE_ORDER
    );
    const UNPARKED_HEAD: Option<&'static str> = Some(concatcp!(
        GROUPS,
        "(",
        GROUP_FIRST,
        FIRST,
        ")",
        GROUP_NOT_PARKED
    ));
    const UNPARKED_AFTER: Option<&'static str> = Some(concatcp!(
        GROUPS,
        "(",
        GROUP_FIRST,
        GROUP_AFTER,
        FIRST,
        ")",
        GROUP_NOT_PARKED
    ));
    const LOCK_LIMIT_KEY: &'static str =
        "SELECT max_running FROM concurrency_keys WHERE namespace = $1 AND key = $2 FOR UPDATE";
    const LOCK_NAMESPACE: Option<&'static str> = Some(
        "SELECT pg_advisory_xact_lock(hashtextextended('switchyard.running.' || $1::text, 0))",
    );
    const TRY_LOCK_OUTPUT_TRIM: &'static str = "SELECT \
        pg_try_advisory_xact_lock(hashtextextended('switchyard.output_trim', 0)) AS locked";
}

/// The database, the listener that hears every replica, and the notifier
/// that tells them.
#[derive(Debug, Clone)]
pub struct PgBackend {
    /// The connection pool shared by every request of this replica.
    pool: PgPool,
    /// The few connections of the grants, the report batches and the
    /// submits' batches, which run them often enough to keep their plans
    /// (the `warm` module).
    batches: PgPool,
    /// This replica's events, at their commit, and the other replicas',
    /// from the listener.
    events: broadcast::Sender<StoreEvent>,
    /// The listener task; stopped when the last handle goes.
    listener: Arc<BackgroundTask>,
    /// The statistics keeper (`stats`); stopped when the last handle goes.
    statistics: Arc<BackgroundTask>,
    /// This replica's mark on the events it announces.
    origin: Uuid,
    /// Where committed changes' notifications wait for the notifier.
    notifier: mpsc::Sender<String>,
    /// What the other replicas read (`peers`).
    peers: Arc<peers::Peers>,
    /// This replica's readers of the dispatcher's events (`follow`).
    dispatch: Arc<follow::Follow>,
    /// This replica's followers of tasks' changes (`follow`).
    follow: Arc<follow::Follow>,
    /// What keeps their connections up; stopped when the last handle
    /// goes.
    keeper: Arc<BackgroundTask>,
    /// The count of the other replicas' listeners; stopped when the last
    /// handle goes.
    watcher: Arc<BackgroundTask>,
}

/// An event as announced: with the replica that made it, so a replica can
/// skip its own (its subscribers heard them at their commit).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Announced {
    /// The announcing replica.
    #[serde(rename = "o")]
    origin: Uuid,
    #[serde(flatten)]
    event: StoreEvent,
}

/// Owns a background task (the listener that turns notifications into
/// events, the statistics keeper); aborts it when dropped.
#[derive(Debug)]
struct BackgroundTask(JoinHandle<()>);

impl Drop for BackgroundTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts a write transaction on a connection of `pool`.
async fn begin_on(pool: &PgPool) -> Result<Write<Postgres>> {
    let tx = pool.begin().await.map_err(db("starting a transaction"))?;
    Ok(Write::new(tx))
}

/// Connections of the pool every request shares.
const POOL_CONNECTIONS: u32 = 32;

/// Opens a pool of at most `max` connections to `url`, `min` of them kept
/// open, each priced and warmed as it opens (`warm`).
async fn connect(url: &str, max: u32, min: u32) -> Result<PgPool> {
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .min_connections(min)
        .after_connect(|conn, _| {
            Box::pin(async move {
                if let Err(err) = warm::price_pages(conn).await {
                    tracing::debug!(cause = %err, "a new connection kept the default price of a page");
                }
                // A database not yet migrated has nothing to warm.
                if let Err(err) = warm::connection(conn).await {
                    tracing::debug!(cause = %err, "a new connection was not warmed");
                }
                Ok(())
            })
        })
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await;
    match pool {
        Ok(pool) => Ok(pool),
        // The pool says only that it timed out: one plain connection
        // says why (refused, unknown host, bad password, no database).
        Err(sqlx::Error::PoolTimedOut) => {
            use sqlx::Connection;
            let cause = match sqlx::PgConnection::connect(url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    sqlx::Error::PoolTimedOut
                }
                Err(cause) => cause,
            };
            Err(db("connecting to postgres")(cause))
        }
        Err(err) => Err(db("connecting to postgres")(err)),
    }
}

impl SqlStore<PgBackend> {
    /// Connects to the database at `url` and starts listening for events.
    pub async fn open(url: &str, options: StoreOptions) -> Result<Self> {
        let pool = connect(url, POOL_CONNECTIONS, warm::WARM_CONNECTIONS).await?;
        let batches = connect(url, warm::BATCH_CONNECTIONS, warm::BATCH_CONNECTIONS).await?;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let origin = Uuid::now_v7();
        // Its own connection (a pool of one that reconnects and re-listens by
        // itself), named as this replica's for the others' counts (`peers`),
        // listening before `open` returns so no event is missed.
        let named: PgConnectOptions = url.parse().map_err(db("reading the database URL"))?;
        let listening = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_with(
                named
                    .clone()
                    .application_name(&peers::listener_name(origin)),
            )
            .await
            .map_err(db("connecting the event listener"))?;
        let mut listener = PgListener::connect_with(&listening)
            .await
            .map_err(db("connecting the event listener"))?;
        listener.ignore_pool_close_event(true);
        listener
            .listen_all([CHANNEL, peers::GREETINGS])
            .await
            .map_err(db("listening for store events"))?;
        let peers = Arc::new(peers::Peers::new());
        let (answers, answered) = mpsc::channel(64);
        let answered: follow::Answers = Arc::new(tokio::sync::Mutex::new(answered));
        let forwarding = Forwarding {
            events: events.clone(),
            origin,
            peers: peers.clone(),
            pool: pool.clone(),
            answers,
        };
        let task = tokio::spawn(forward_notifications(listener, forwarding));
        let reading = |reads| {
            Arc::new(follow::Follow::new(
                reads,
                pool.clone(),
                named.clone(),
                origin,
                peers.clone(),
                answered.clone(),
            ))
        };
        let dispatch = reading(follow::Reads::Dispatch);
        let follow = reading(follow::Reads::Tasks);
        let keeper = tokio::spawn(follow::keep([dispatch.clone(), follow.clone()]));
        // What the others read, before this replica commits anything.
        peers::count(&pool, origin, &peers).await;
        let watcher = tokio::spawn(peers::watch(pool.clone(), origin, peers.clone()));
        let (notifier, queue) = mpsc::channel(NOTIFIER_QUEUE);
        tokio::spawn(notify_committed(pool.clone(), queue));
        let statistics = tokio::spawn(stats::keep(pool.clone()));
        Ok(Self {
            backend: PgBackend {
                pool,
                batches,
                events,
                listener: Arc::new(BackgroundTask(task)),
                statistics: Arc::new(BackgroundTask(statistics)),
                origin,
                notifier,
                peers,
                dispatch,
                follow,
                keeper: Arc::new(BackgroundTask(keeper)),
                watcher: Arc::new(BackgroundTask(watcher)),
            },
            options,
        })
    }

    /// Warms the pool's first connections (see the `warm` module) and answers how
    /// many it warmed. Fails if the schema is not migrated or does not fit
    /// this release's statements.
    pub async fn warm(&self) -> Result<usize> {
        self.backend.warm().await
    }
}

impl PgBackend {
    /// Warms the first connections of both pools (see the `warm` module)
    /// and answers how many it warmed.
    async fn warm(&self) -> Result<usize> {
        let shared = warm::pool(&self.pool, warm::WARM_CONNECTIONS).await?;
        Ok(shared + warm::pool(&self.batches, warm::BATCH_CONNECTIONS).await?)
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
    fn announce(&self, event: StoreEvent) -> Result<String> {
        serde_json::to_string(&Announced {
            origin: self.origin,
            event,
        })
        .map_err(|err| Error::Corrupt {
            context: "encoding store events",
            detail: err.to_string(),
        })
    }

    /// Hands committed changes to this replica's subscribers (those only
    /// other replicas need left out: whoever made them here applied them).
    fn deliver(&self, events: &[StoreEvent]) {
        for event in events.iter().filter(|e| !e.for_other_replicas()) {
            let _ = self.events.send(event.clone());
        }
    }

    /// Hands changes already committed to this replica's subscribers and,
    /// while another replica reads the dispatcher's events, to the
    /// notifier: a task's changes and output only while another follows
    /// them.
    fn announce_committed(&self, events: Vec<StoreEvent>) -> Result<()> {
        self.deliver(&events);
        if !self.peers.dispatching() {
            return Ok(());
        }
        let following = self.peers.following();
        for event in events {
            if following || !event.for_followers() {
                self.notify_later(self.announce(event)?);
            }
        }
        Ok(())
    }

    /// Warns if the database's autovacuum is off: every grant and report
    /// leaves dead row versions, and without VACUUM and ANALYZE PostgreSQL
    /// also stops reusing its plans, so submits and grants slow down as the
    /// history grows. A query that fails is only logged.
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
}

#[async_trait]
impl Backend for PgBackend {
    type Db = Postgres;
    const NAME: &'static str = "postgres";

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn begin(&self) -> Result<Write<Postgres>> {
        begin_on(&self.pool).await
    }

    /// On the connections of the batch paths (the `warm` module).
    async fn begin_batch(&self) -> Result<Write<Postgres>> {
        begin_on(&self.batches).await
    }

    /// While another replica reads the dispatcher's events, an agent
    /// change or a revocation is notified in the transaction (delivered at
    /// commit, and only if it commits); the rest, after the commit, by the
    /// notifier. This replica's subscribers hear them all at the commit.
    async fn commit(&self, write: Write<Postgres>) -> Result<()> {
        let (mut tx, events, _) = write.into_parts();
        let (urgent, lazy): (Vec<StoreEvent>, Vec<StoreEvent>) =
            events.into_iter().partition(|event| {
                matches!(
                    event,
                    StoreEvent::AgentChanged { .. } | StoreEvent::LeaseRevoked { .. }
                )
            });
        if !urgent.is_empty() && self.peers.dispatching() {
            let payloads = urgent
                .iter()
                .map(|event| self.announce(event.clone()))
                .collect::<Result<Vec<_>>>()?;
            sqlx::query(NOTIFY)
                .bind(CHANNEL)
                .bind(&payloads)
                .execute(&mut *tx)
                .await
                .map_err(db("notifying replicas"))?;
        }
        tx.commit().await.map_err(db("committing"))?;
        crate::metrics::count_finished(&lazy);
        self.deliver(&urgent);
        self.announce_committed(lazy)
    }

    async fn migrate(&self) -> Result<()> {
        // A schema migrated by a newer release is accepted: migrations are
        // additive, so a rolled-back binary (or an old replica mid-upgrade)
        // runs on it; sqlx would otherwise refuse versions it does not know.
        let mut migrator = sqlx::migrate!("migrations/postgres");
        migrator.set_ignore_missing(true);
        migrator
            .run(&self.pool)
            .await
            .map_err(|source| Error::Store {
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

    fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.events.subscribe()
    }

    async fn follow_tasks(&self) -> crate::store::Following {
        self.follow.follow().await
    }

    async fn follow_dispatch(&self) -> crate::store::Following {
        self.dispatch.follow().await
    }

    async fn close(&self) {
        self.listener.0.abort();
        self.watcher.0.abort();
        self.keeper.0.abort();
        self.statistics.0.abort();
        self.dispatch.close().await;
        self.follow.close().await;
        self.pool.close().await;
        self.batches.close().await;
    }

    async fn submit_many(
        &self,
        submissions: &[Submission],
        _options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<Result<Submitted>>> {
        let (out, events) = submit::submit_batch(&self.batches, submissions, now_ms).await?;
        self.announce_committed(events)?;
        Ok(out)
    }

    async fn grant(
        &self,
        w: &mut Write<Postgres>,
        requests: &[GrantRequest],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<GrantOutcome>> {
        grant::grant(w, requests, options.max_running_per_namespace, now_ms).await
    }

    async fn complete(
        &self,
        w: &mut Write<Postgres>,
        completions: &[Completion],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<Result<CompletionResult>>> {
        settle::complete(w, completions, options, now_ms).await
    }

    /// The whole fresh attempts that succeeded, in one call of their own
    /// on the connections of the batch paths (`settle::settle_successes`).
    async fn settle_apart(
        &self,
        reports: &[LeaseReport],
        now_ms: i64,
    ) -> Result<Vec<Option<Result<ReportApplied>>>> {
        let (results, events) = settle::settle_successes(&self.batches, reports, now_ms).await?;
        crate::metrics::count_finished(&events);
        self.announce_committed(events)?;
        Ok(results)
    }

    async fn apply_reports(
        &self,
        w: &mut Write<Postgres>,
        reports: &[LeaseReport],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<Result<ReportApplied>>> {
        settle::apply_reports(w, reports, options, now_ms).await
    }

    async fn heartbeats(
        &self,
        w: &mut Write<Postgres>,
        beats: &[Beat],
        now_ms: i64,
    ) -> Result<Vec<Result<BeatOutcome>>> {
        heartbeat::heartbeats(w, beats, now_ms).await
    }
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

/// What the listener needs to forward notifications and answer greetings.
struct Forwarding {
    /// Where the other replicas' events go.
    events: broadcast::Sender<StoreEvent>,
    /// This replica.
    origin: Uuid,
    /// Told of every greeting.
    peers: Arc<peers::Peers>,
    /// Where answers are sent from.
    pool: PgPool,
    /// The replicas that answered this one's greeting.
    answers: mpsc::Sender<Uuid>,
}

/// Feeds the other replicas' events to the broadcast until the store is
/// dropped, and answers their greetings (`peers`), once this replica
/// notifies. The listener reconnects (and re-listens) by itself; while it
/// is down nothing is emitted, and the dispatcher's slow safety sweep
/// covers what was missed.
async fn forward_notifications(mut listener: PgListener, to: Forwarding) {
    loop {
        match listener.recv().await {
            Ok(notification) if notification.channel() == peers::GREETINGS => {
                let payload = notification.payload();
                peers::heard(&to.pool, to.origin, &to.peers, &to.answers, payload).await;
            }
            Ok(notification) => match serde_json::from_str::<Announced>(notification.payload()) {
                Ok(announced) => {
                    // This replica's own were heard at their commit.
                    if announced.origin != to.origin {
                        let _ = to.events.send(announced.event);
                    }
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
