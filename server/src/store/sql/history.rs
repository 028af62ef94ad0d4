//! A task's append-only history: one entry per thing that happened to it,
//! appended in the transaction of the change (the task row is locked, so
//! the next sequence number is the appender's), read oldest first.

use uuid::Uuid;

use super::Write;
use super::db::{SqlDb, StatementExt, query};
use super::rows::{self, EVENT_COLUMNS};
use crate::error::Result;
use crate::model::{TaskEventRecord, TaskState};
use crate::store::plan::{db, to_i64};

/// What one history entry says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry<'a> {
    /// The task.
    pub task_id: Uuid,
    /// What happened (`submitted`, `leased`, `started`, …).
    pub kind: &'a str,
    /// The task's state after it.
    pub state: TaskState,
    /// Details for people.
    pub message: &'a str,
    /// The agent involved, if any.
    pub agent_id: Option<Uuid>,
    /// The lease involved, if any.
    pub lease_id: Option<Uuid>,
}

impl<'a> Entry<'a> {
    /// An entry about `task_id` involving no agent.
    pub(crate) fn of(task_id: Uuid, kind: &'a str, state: TaskState, message: &'a str) -> Self {
        Self {
            task_id,
            kind,
            state,
            message,
            agent_id: None,
            lease_id: None,
        }
    }

    /// The same entry, involving this agent and lease.
    pub(crate) fn by(self, agent_id: Uuid, lease_id: Uuid) -> Self {
        Self {
            agent_id: Some(agent_id),
            lease_id: Some(lease_id),
            ..self
        }
    }
}

const APPEND: &str = "INSERT INTO task_events \
    (task_id, sequence, kind, state, message, agent_id, lease_id, occurred_at_ms) \
    VALUES ($1, (SELECT COALESCE(MAX(sequence), 0) + 1 FROM task_events \
    WHERE task_id = $1), $2, $3, $4, $5, $6, $7)";

/// Appends `entry` to its task's history (the task row is locked).
pub(crate) async fn append<DB: SqlDb>(
    w: &mut Write<DB>,
    entry: Entry<'_>,
    now_ms: i64,
) -> Result<()> {
    query::<DB>(APPEND)
        .arg(entry.task_id)
        .text(entry.kind)
        .text(entry.state.as_str())
        .text(entry.message)
        .arg(entry.agent_id)
        .arg(entry.lease_id)
        .arg(now_ms)
        .run(w.conn())
        .await
        .map_err(db("appending a task event"))?;
    Ok(())
}

const LIST: &str = const_format::concatcp!(
    "SELECT ",
    EVENT_COLUMNS,
    " FROM task_events WHERE task_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
);

/// A task's history after `after_sequence`, oldest first, at most `limit`.
pub(crate) async fn list<DB: SqlDb>(
    conn: &mut DB::Connection,
    task_id: Uuid,
    after_sequence: u64,
    limit: u32,
) -> Result<Vec<TaskEventRecord>> {
    let rows = query::<DB>(LIST)
        .arg(task_id)
        .arg(to_i64(after_sequence))
        .arg(i64::from(limit))
        .all(conn)
        .await
        .map_err(db("reading task events"))?;
    rows::all::<DB, _>(&rows, rows::event::<DB>)
}
