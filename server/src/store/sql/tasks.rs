//! Tasks: submitted (one by one, for a backend without a set-based submit),
//! read, listed newest first, failed past their start deadline, counted by
//! state, settled, and refused by agents. The queue read in order is
//! `super::queue`; a cancel, which may revoke the task's lease, is
//! `super::cancel`.

use uuid::Uuid;

use super::db::{SqlDb, StatementExt, built, placeholders, query};
use super::history::{self, Entry};
use super::rows::{self, TASK_SELECT};
use super::{Dialect, Write, fair};
use crate::error::{Error, Result};
use crate::model::{NewTask, Page, StoreEvent, TaskFilter, TaskRecord, TaskState};
use crate::store::plan::{db, parse_task_cursor, task_cursor, to_u64};

const BY_ID: &str = const_format::concatcp!(TASK_SELECT, "WHERE t.id = $1");

/// Reads a task without locking it.
pub(crate) async fn fetch<DB: SqlDb>(
    conn: &mut DB::Connection,
    task_id: Uuid,
) -> Result<Option<TaskRecord>> {
    let row = query::<DB>(BY_ID)
        .arg(task_id)
        .optional(conn)
        .await
        .map_err(db("reading a task"))?;
    row.as_ref().map(rows::task::<DB>).transpose()
}

/// Reads a task that must exist.
pub(crate) async fn must_fetch<DB: SqlDb>(
    conn: &mut DB::Connection,
    task_id: Uuid,
) -> Result<TaskRecord> {
    fetch::<DB>(conn, task_id)
        .await?
        .ok_or_else(|| not_found(task_id))
}

/// Reads and locks a task for the rest of the transaction.
pub(crate) async fn lock<DB: Dialect>(w: &mut Write<DB>, task_id: Uuid) -> Result<TaskRecord> {
    let row = query::<DB>(DB::LOCK_TASK)
        .arg(task_id)
        .optional(w.conn())
        .await
        .map_err(db("locking a task"))?;
    match row {
        Some(row) => rows::task::<DB>(&row),
        None => Err(not_found(task_id)),
    }
}

fn not_found(task_id: Uuid) -> Error {
    Error::NotFound {
        what: "task",
        id: task_id.to_string(),
    }
}

/// What the store refuses before any statement runs.
pub(crate) fn check_new(task: &NewTask) -> Result<()> {
    if task.max_attempts == 0 {
        return Err(Error::invalid("max_attempts", "must be at least 1"));
    }
    if task.lease_ttl_ms <= 0 {
        return Err(Error::invalid("lease_ttl", "must be positive"));
    }
    Ok(())
}

const BY_KEY: &str = const_format::concatcp!(
    TASK_SELECT,
    "WHERE t.namespace = $1 AND t.idempotency_key = $2"
);

/// The task already submitted with `task`'s idempotency key, if any.
pub(crate) async fn by_key<DB: SqlDb>(
    conn: &mut DB::Connection,
    task: &NewTask,
) -> Result<Option<TaskRecord>> {
    let Some(key) = &task.idempotency_key else {
        return Ok(None);
    };
    let row = query::<DB>(BY_KEY)
        .text(&task.namespace)
        .text(key)
        .optional(conn)
        .await
        .map_err(db("looking up an idempotency key"))?;
    row.as_ref().map(rows::task::<DB>).transpose()
}

const INSERT: &str = "INSERT INTO tasks (id, namespace, kind, payload, placement, priority, \
    state, attempts, max_attempts, lease_ttl_ms, idempotency_key, not_before_ms, \
    fencing_token, cancel_requested, labels, retry, start_timeout_ms, execution_timeout_ms, \
    cancel_grace_ms, fairness_key, fairness_weight, fair_offset, concurrency_key, created_at_ms, \
    updated_at_ms) \
    VALUES ($1, $2, $3, $4, $5, $6, 'queued', 0, $7, $8, $9, $10, 0, FALSE, $11, $12, $13, $14, \
    $15, $16, $17, $18, $19, $20, $20) \
    ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING";

/// What [`insert`] did with a new task.
pub(crate) enum Inserted {
    /// A task with its idempotency key was there already.
    Existing(TaskRecord),
    /// The task was inserted with this id; its event is the caller's (its
    /// history's first entry is implied by its row).
    New(Uuid),
}

/// Inserts a new task's row, or finds the task its idempotency key names.
pub(crate) async fn insert<DB: SqlDb>(
    w: &mut Write<DB>,
    task: &NewTask,
    now_ms: i64,
) -> Result<Inserted> {
    check_new(task)?;
    if let Some(existing) = by_key::<DB>(w.conn(), task).await? {
        return Ok(Inserted::Existing(existing));
    }
    let id = Uuid::now_v7();
    let retry = task.retry.as_ref().map(rows::retry_text);
    // One writer: the key's last waiting task and the head are read in the
    // transaction that inserts, so every keyed task's rank is exact.
    let fair_offset = match &task.fairness {
        Some(fairness) => {
            let marks = fair::fair_marks::<DB>(w.conn(), task, &fairness.key).await?;
            fairness.next_rank(marks.last, marks.head, marks.clock, now_ms) - now_ms
        }
        None => 0,
    };
    let inserted = query::<DB>(INSERT)
        .arg(id)
        .text(&task.namespace)
        .text(&task.kind)
        .json(&task.payload)
        .json(&task.placement)
        .arg(task.priority)
        .arg(i64::from(task.max_attempts))
        .arg(task.lease_ttl_ms)
        .opt_text(task.idempotency_key.as_deref())
        .arg(task.not_before_ms.unwrap_or(now_ms))
        .json(&task.labels)
        .opt_text(retry.as_deref())
        .arg(task.deadlines.start_timeout_ms)
        .arg(task.deadlines.execution_timeout_ms)
        .arg(task.deadlines.cancel_grace_ms)
        .opt_text(task.fairness.as_ref().map(|f| f.key.as_str()))
        .arg(task.fairness.as_ref().map(|f| i64::from(f.weight)))
        .arg(fair_offset)
        .opt_text(task.concurrency_key.as_deref())
        .arg(now_ms)
        .run(w.conn())
        .await
        .map_err(db("inserting a task"))?;
    if inserted == 0 {
        // Another submit with the same key won the race.
        if let Some(existing) = by_key::<DB>(w.conn(), task).await? {
            return Ok(Inserted::Existing(existing));
        }
    }
    Ok(Inserted::New(id))
}

/// Tasks of a namespace, newest first, and the cursor of the next page.
pub(crate) async fn list<DB: SqlDb>(
    conn: &mut DB::Connection,
    filter: &TaskFilter,
    page: &Page,
) -> Result<(Vec<TaskRecord>, Option<String>)> {
    let size = page.size.clamp(1, 1_000);
    let after = match &page.after {
        Some(after) => Some(
            parse_task_cursor(after)
                .ok_or_else(|| Error::invalid("page_token", "not a token this server issued"))?,
        ),
        None => None,
    };
    // Only the conditions asked for, so that each form of the statement is
    // one range of `tasks_by_namespace` (a condition that is sometimes NULL
    // would keep a cursor out of the index range in a generic plan).
    let mut sql = format!("{TASK_SELECT}WHERE t.namespace = $1");
    let mut next_arg = 2;
    let mut arg = |count: usize| {
        let list = placeholders(next_arg, count);
        next_arg += count;
        list
    };
    if !filter.states.is_empty() {
        sql += &format!(" AND t.state IN ({})", arg(filter.states.len()));
    }
    if filter.kind.is_some() {
        sql += &format!(" AND t.kind = {}", arg(1));
    }
    if after.is_some() {
        let (ms, id) = (arg(1), arg(1));
        sql +=
            &format!(" AND (t.created_at_ms < {ms} OR (t.created_at_ms = {ms} AND t.id < {id}))");
    }
    sql += &format!(" ORDER BY t.created_at_ms DESC, t.id DESC LIMIT {}", arg(1));
    let mut statement = built::<DB>(sql).text(&filter.namespace);
    for state in &filter.states {
        statement = statement.text(state.as_str());
    }
    if let Some(kind) = &filter.kind {
        statement = statement.text(kind);
    }
    if let Some((ms, id)) = after {
        statement = statement.arg(ms).arg(id);
    }
    let rows = statement
        .arg(i64::from(size) + 1)
        .all(conn)
        .await
        .map_err(db("listing tasks"))?;
    let mut tasks = rows::all::<DB, _>(&rows, rows::task::<DB>)?;
    let next = if tasks.len() > size as usize {
        tasks.truncate(size as usize);
        tasks.last().map(|t| task_cursor(t.created_at_ms, t.id))
    } else {
        None
    };
    Ok((tasks, next))
}

/// Queued tasks past their start deadline, the earliest deadlines first
/// (a sweep that cannot take them all takes those overdue the longest),
/// through the partial index of tasks with a start timeout (its expression
/// written as the index's).
const UNSTARTED_OVERDUE: &str = const_format::concatcp!(
    TASK_SELECT,
    "WHERE t.id IN (SELECT id FROM tasks WHERE state = 'queued' AND start_timeout_ms IS NOT NULL \
     AND (not_before_ms + start_timeout_ms) <= $1 \
     ORDER BY (not_before_ms + start_timeout_ms) LIMIT $2) ORDER BY t.id"
);

/// Queued tasks past their start deadline (see
/// `TaskStore::unstarted_overdue`).
pub(crate) async fn unstarted_overdue<DB: SqlDb>(
    conn: &mut DB::Connection,
    now_ms: i64,
    limit: u32,
) -> Result<Vec<TaskRecord>> {
    let rows = query::<DB>(UNSTARTED_OVERDUE)
        .arg(now_ms)
        .arg(i64::from(limit))
        .all(conn)
        .await
        .map_err(db("finding tasks past their start deadline"))?;
    rows.iter().map(rows::task::<DB>).collect()
}

/// Fails a task past its start deadline (see `TaskStore::fail_unstarted`).
pub(crate) async fn fail_unstarted<DB: Dialect>(
    w: &mut Write<DB>,
    task_id: Uuid,
    error: &serde_json::Value,
    message: &str,
    now_ms: i64,
) -> Result<Option<TaskRecord>> {
    let task = lock(w, task_id).await?;
    let overdue = task.state == TaskState::Queued
        && task
            .deadlines
            .start_by(task.not_before_ms)
            .is_some_and(|at| at <= now_ms);
    if !overdue {
        return Ok(None);
    }
    let next = Settlement {
        state: TaskState::Failed,
        attempts: task.attempts,
        releases: task.releases,
        not_before_ms: task.not_before_ms,
        result: None,
        error: Some(error),
    };
    settle(w, &task, next, now_ms).await?;
    history::append(
        w,
        Entry::of(task_id, "failed", TaskState::Failed, message),
        now_ms,
    )
    .await?;
    Ok(Some(must_fetch::<DB>(w.conn(), task_id).await?))
}

/// Live tasks only: queued ones through the queue's index, leased and
/// running ones through their live leases (a task is LEASED or RUNNING
/// exactly while it holds one). Finished tasks are kept forever, and
/// counting them was a scan of the whole table.
const COUNT_LIVE: &str = "SELECT namespace, state, COUNT(*) AS n FROM tasks \
    WHERE state = 'queued' GROUP BY namespace, state \
    UNION ALL \
    SELECT t.namespace, t.state, COUNT(*) AS n FROM leases l \
    JOIN tasks t ON t.id = l.task_id WHERE l.state IN ('granted', 'active') \
    GROUP BY t.namespace, t.state";

/// Counts of live tasks by namespace and state.
pub(crate) async fn count_live<DB: SqlDb>(
    conn: &mut DB::Connection,
) -> Result<Vec<(String, TaskState, u64)>> {
    const CONTEXT: &str = "reading a task count";
    let rows = query::<DB>(COUNT_LIVE)
        .all(conn)
        .await
        .map_err(db("counting tasks"))?;
    rows.iter()
        .map(|row| {
            let cols = super::db::Cols::<DB>::new(row, CONTEXT);
            Ok((
                cols.get("namespace")?,
                rows::stored::<TaskState>(&cols.get::<String>("state")?, CONTEXT)?,
                to_u64(cols.get("n")?),
            ))
        })
        .collect()
}

const SETTLE: &str = "UPDATE tasks SET state = $2, attempts = $3, releases = $4, \
    not_before_ms = $5, result = COALESCE($6, result), error = COALESCE($7, error), \
    lease_id = NULL, agent_id = NULL, updated_at_ms = $8 WHERE id = $1";

/// Where a task goes once its lease ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settlement<'a> {
    /// Its next state.
    pub state: TaskState,
    /// Its attempts from now on.
    pub attempts: u32,
    /// Its releases from now on.
    pub releases: u32,
    /// Not leased again before this (a retry's backoff).
    pub not_before_ms: i64,
    /// The handler's output, for a success.
    pub result: Option<&'a serde_json::Value>,
    /// The failure, for a failed attempt.
    pub error: Option<&'a serde_json::Value>,
}

/// Moves a task whose lease ended to its next state, announcing it.
pub(crate) async fn settle<DB: SqlDb>(
    w: &mut Write<DB>,
    task: &TaskRecord,
    next: Settlement<'_>,
    now_ms: i64,
) -> Result<()> {
    query::<DB>(SETTLE)
        .arg(task.id)
        .text(next.state.as_str())
        .arg(i64::from(next.attempts))
        .arg(i64::from(next.releases))
        .arg(next.not_before_ms)
        .opt_json(next.result)
        .opt_json(next.error)
        .arg(now_ms)
        .run(w.conn())
        .await
        .map_err(db("settling a task"))?;
    if next.state == TaskState::Queued {
        w.announce(StoreEvent::queued(task, next.not_before_ms));
    }
    w.announce(StoreEvent::TaskChanged {
        task_id: task.id,
        state: next.state,
    });
    Ok(())
}

const REFUSE: &str = "INSERT INTO task_refusals (task_id, agent_id, reason, refused_at_ms) \
    VALUES ($1, $2, $3, $4) ON CONFLICT (task_id, agent_id) \
    DO UPDATE SET reason = excluded.reason, refused_at_ms = excluded.refused_at_ms";

/// Records that an agent refused a task (it cannot handle or decode it):
/// it is not offered the task again until its refusals are lifted.
pub(crate) async fn refuse<DB: SqlDb>(
    w: &mut Write<DB>,
    task_id: Uuid,
    agent_id: Uuid,
    reason: &str,
    now_ms: i64,
) -> Result<()> {
    query::<DB>(REFUSE)
        .arg(task_id)
        .arg(agent_id)
        .text(reason)
        .arg(now_ms)
        .run(w.conn())
        .await
        .map_err(db("recording a refusal"))?;
    Ok(())
}

const REFUSALS: &str =
    "SELECT agent_id, reason FROM task_refusals WHERE task_id = $1 ORDER BY agent_id";

/// The agents that refused a task, with what each said.
pub(crate) async fn refusals<DB: SqlDb>(
    conn: &mut DB::Connection,
    task_id: Uuid,
) -> Result<Vec<(Uuid, String)>> {
    let rows = query::<DB>(REFUSALS)
        .arg(task_id)
        .all(conn)
        .await
        .map_err(db("reading a task's refusals"))?;
    rows.iter()
        .map(|row| {
            let cols = super::db::Cols::<DB>::new(row, "reading a refusal");
            Ok((cols.get("agent_id")?, cols.get("reason")?))
        })
        .collect()
}

const LIFT_REFUSALS: &str = "DELETE FROM task_refusals WHERE agent_id = $1";

/// Forgets an agent's refusals (it changed, or registered again): it may be
/// offered those tasks again.
pub(crate) async fn lift_refusals<DB: SqlDb>(w: &mut Write<DB>, agent_id: Uuid) -> Result<()> {
    query::<DB>(LIFT_REFUSALS)
        .arg(agent_id)
        .run(w.conn())
        .await
        .map_err(db("lifting an agent's refusals"))?;
    Ok(())
}

const AGENT_REFUSALS: &str = "SELECT task_id FROM task_refusals WHERE agent_id = $1";

/// The tasks an agent refused.
pub(crate) async fn agent_refusals<DB: SqlDb>(
    conn: &mut DB::Connection,
    agent_id: Uuid,
) -> Result<Vec<Uuid>> {
    let rows = query::<DB>(AGENT_REFUSALS)
        .arg(agent_id)
        .all(conn)
        .await
        .map_err(db("reading an agent's refusals"))?;
    rows.iter()
        .map(|row| super::db::Cols::<DB>::new(row, "reading a refusal").get("task_id"))
        .collect()
}
