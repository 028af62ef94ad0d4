//! The embedded SQLite backend: one file, created if missing, WAL journal
//! synced at every commit (`synchronous=full`, unless the URL asks for
//! `normal`), foreign keys on. SQLite allows one writer at a time, so the
//! process's write transactions take turns (a fair queue, held from `BEGIN`
//! to the end of the transaction): a writer waiting for the write lock in
//! SQLite's busy handler sleeps 1, 2, 5, … up to 100 ms between looks and
//! leaves the lock idle meanwhile. They run on one connection of their own,
//! whose page cache stays warm from one to the next (a connection drops its
//! cache when another has written since its last transaction); reads run on
//! a pool beside it. Each starts with `BEGIN IMMEDIATE` (the
//! write lock up front, waited for under `busy_timeout` against another
//! process, instead of failing half-way); events go to this process's
//! subscribers after each commit.
//!
//! Grants, whole fresh attempts and submits (but the inserts of tasks with
//! an idempotency or fairness key) are set-based (`grant`, `settle`,
//! `submit`): a batch's rows travel as one JSON array (`batch`), so a batch
//! costs a handful of statements instead of several per task, each a round
//! trip to the connection's thread. Every other transition is the shared
//! row-by-row SQL.

mod batch;
mod grant;
mod settle;
mod submit;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use const_format::concatcp;
use sqlx::Sqlite;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::sync::broadcast;

use super::StoreOptions;
use super::plan::db;
use super::sql::queue::{QUEUE_BELOW, QUEUE_ORDER, QUEUE_WHERE};
use super::sql::rows::TASK_SELECT;
use super::sql::{Backend, Dialect, SqlStore, Write};
use crate::error::{Error, Result};
use crate::model::{
    GrantOutcome, GrantRequest, LeaseReport, ReportApplied, StoreEvent, Submission, Submitted,
};

/// A store on an SQLite file.
pub type SqliteStore = SqlStore<SqliteBackend>;

/// How many events a slow subscriber may fall behind before it lags.
const EVENT_BUFFER: usize = 4_096;

/// SQLite keeps the placement as the text it was given, which is how the
/// dispatcher spells it too.
const NOT_PARKED: &str = "AND (t.namespace, t.kind, t.placement) NOT IN \
    (SELECT json_extract(p.value, '$[0]'), json_extract(p.value, '$[1]'), \
    json_extract(p.value, '$[2]') FROM json_each($4) AS p)";

/// Sweeps lock nothing (there is one writer): candidates in task id order.
const DUE: &str = "SELECT l.id FROM leases l JOIN tasks t ON t.id = l.task_id \
    WHERE l.state IN ('granted', 'active') AND l.expires_at_ms <= $1 ORDER BY t.id LIMIT $2";
const UNACKED: &str = "SELECT l.id FROM leases l JOIN tasks t ON t.id = l.task_id \
    WHERE l.state = 'granted' AND NOT l.acked AND l.granted_at_ms < $1 \
    AND ($2 IS NULL OR l.agent_id = $2) ORDER BY t.id";

/// A queue page's range after a cursor within its priority, the rank's
/// range written out: SQLite seeks an expression index by a plain
/// comparison only, not by a row comparison as PostgreSQL's dialect does.
const QUEUE_AFTER: &str = "AND t.priority = $5 AND t.created_at_ms + t.fair_offset >= $6 \
    AND (t.created_at_ms + t.fair_offset > $6 OR t.id > $7) ";

impl Dialect for Sqlite {
    const LOCK_TASK: &'static str = concatcp!(TASK_SELECT, "WHERE t.id = $1");
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
    // No index by placement: the queue is read down to the task, on a
    // reader's connection beside the writer.
    const UNPARKED_HEAD: Option<&'static str> = None;
    const UNPARKED_AFTER: Option<&'static str> = None;
    // One writer: what a grant counts cannot change under it.
    const LOCK_LIMIT_KEY: &'static str =
        "SELECT max_running FROM concurrency_keys WHERE namespace = $1 AND key = $2";
    const LOCK_NAMESPACE: Option<&'static str> = None;
    // One writer: the trim is alone.
    const TRY_LOCK_OUTPUT_TRIM: &'static str = "SELECT TRUE AS locked";
}

/// The SQLite file and this process's subscribers.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    /// The readers' connections, in parallel (WAL).
    pool: SqlitePool,
    /// The one connection every write transaction runs on. A connection's
    /// page cache is dropped whenever another connection has written since
    /// its last transaction; writes on one connection keep theirs warm.
    writer: SqlitePool,
    /// The writers' turn: a write transaction holds it from `BEGIN` to its
    /// end, so writers queue here, in order, instead of sleeping in
    /// SQLite's busy handler for the write lock.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Where committed changes are announced (there are no other replicas).
    events: broadcast::Sender<StoreEvent>,
}

/// The `synchronous` setting a `sqlite://` URL asks for, and the URL
/// without it (sqlx refuses query parameters it does not know). `full`, the
/// default, syncs the WAL at every commit: what a submit or report was
/// acknowledged for survives a power loss, as on PostgreSQL with
/// `synchronous_commit = on`, and a group commit pays one sync for its whole
/// batch. `normal` syncs only at checkpoints: a crash of the server loses
/// nothing, a power loss or an operating system crash may lose the last
/// commits.
fn synchronous_of(url: &str) -> Result<(String, SqliteSynchronous)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), SqliteSynchronous::Full));
    };
    let mut synchronous = SqliteSynchronous::Full;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("synchronous", value)) => {
                synchronous = match value.to_ascii_lowercase().as_str() {
                    "full" => SqliteSynchronous::Full,
                    "normal" => SqliteSynchronous::Normal,
                    _ => {
                        return Err(Error::Config(format!(
                            "database url: synchronous={value} is not full or normal"
                        )));
                    }
                }
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, synchronous))
}

impl SqlStore<SqliteBackend> {
    /// Opens (creating if missing) the database at `url` (`sqlite://PATH`,
    /// optionally `?synchronous=normal`: see [`synchronous_of`]).
    pub async fn open(url: &str, options: StoreOptions) -> Result<Self> {
        let (url, synchronous) = synchronous_of(url)?;
        let connect = SqliteConnectOptions::from_str(&url)
            .map_err(db("parsing the sqlite url"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(30));
        // A connection to a file cannot go stale: no ping before each use.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(connect.clone())
            .await
            .map_err(db("opening the sqlite database"))?;
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(connect)
            .await
            .map_err(db("opening the sqlite database"))?;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Ok(Self {
            backend: SqliteBackend {
                pool,
                writer,
                events,
                turn: Arc::default(),
            },
            options,
        })
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    type Db = Sqlite;
    const NAME: &'static str = "sqlite";

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn begin(&self) -> Result<Write<Sqlite>> {
        let turn = Arc::clone(&self.turn).lock_owned().await;
        let tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("starting a write transaction"))?;
        Ok(Write::in_turn(tx, turn))
    }

    async fn commit(&self, write: Write<Sqlite>) -> Result<()> {
        let (tx, events, turn) = write.into_parts();
        tx.commit().await.map_err(db("committing"))?;
        drop(turn);
        crate::metrics::count_finished(&events);
        for event in events {
            // There are no other replicas to tell; no subscriber is fine.
            if !event.for_other_replicas() {
                let _ = self.events.send(event);
            }
        }
        Ok(())
    }

    async fn migrate(&self) -> Result<()> {
        // A schema migrated by a newer release is accepted: migrations are
        // additive, so a rolled-back binary runs on it; sqlx would otherwise
        // refuse versions it does not know.
        let mut migrator = sqlx::migrate!("migrations/sqlite");
        migrator.set_ignore_missing(true);
        migrator
            .run(&self.pool)
            .await
            .map_err(|source| Error::Store {
                context: "running sqlite migrations",
                source: source.into(),
            })
    }

    fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.events.subscribe()
    }

    async fn submit_many(
        &self,
        submissions: &[Submission],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<Result<Submitted>>> {
        let mut w = self.begin().await?;
        let out = submit::submit_many(&mut w, submissions, options, now_ms).await?;
        self.commit(w).await?;
        Ok(out)
    }

    async fn grant(
        &self,
        w: &mut Write<Sqlite>,
        requests: &[GrantRequest],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<GrantOutcome>> {
        grant::grant(w, requests, options.max_running_per_namespace, now_ms).await
    }

    async fn apply_reports(
        &self,
        w: &mut Write<Sqlite>,
        reports: &[LeaseReport],
        options: &StoreOptions,
        now_ms: i64,
    ) -> Result<Vec<Result<ReportApplied>>> {
        settle::apply_reports(w, reports, options, now_ms).await
    }

    async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::SqliteSynchronous;

    use super::synchronous_of;

    fn level(url: &str) -> (String, String) {
        let (url, sync) = synchronous_of(url).unwrap();
        let name = match sync {
            SqliteSynchronous::Full => "full",
            SqliteSynchronous::Normal => "normal",
            _ => "other",
        };
        (url, name.to_owned())
    }

    #[test]
    fn the_url_chooses_full_or_normal_sync_and_keeps_its_other_parameters() {
        let pair = |u: &str, s: &str| (u.to_owned(), s.to_owned());
        assert_eq!(level("sqlite://a.db"), pair("sqlite://a.db", "full"));
        assert_eq!(
            level("sqlite://a.db?synchronous=normal"),
            pair("sqlite://a.db", "normal")
        );
        assert_eq!(
            level("sqlite://a.db?synchronous=FULL"),
            pair("sqlite://a.db", "full")
        );
        assert_eq!(
            level("sqlite://a.db?mode=rwc&synchronous=normal"),
            pair("sqlite://a.db?mode=rwc", "normal")
        );
        let err = synchronous_of("sqlite://a.db?synchronous=off").unwrap_err();
        assert_eq!(
            err.to_string(),
            "configuration: database url: synchronous=off is not full or normal"
        );
    }
}
