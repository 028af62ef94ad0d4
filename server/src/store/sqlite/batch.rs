//! What SQLite's set-based statements share: a batch's rows travel as one
//! JSON array (`jsonb_each($1)`, ids as hex text turned back into the 16-byte
//! blobs the tables hold with `unhex`; the array is parsed once, and each
//! row's fields are read from its binary form, where `json_each` would hand
//! each row over as text to be parsed again), so each statement is prepared once
//! and a whole batch costs one round trip to the connection's thread instead
//! of one per row; records read by id in one statement; and the history
//! entries of a batch appended in one statement.

use std::collections::HashMap;

use serde_json::{Value, json};
use sqlx::Sqlite;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use crate::error::Result;
use crate::model::{TaskRecord, TaskState};
use crate::store::plan::db;
use crate::store::sql::Write;
use crate::store::sql::rows::{self, TASK_SELECT};

/// The named tasks (`$1`: JSON array of hex ids).
const TASKS: &str = const_format::concatcp!(
    TASK_SELECT,
    "WHERE t.id IN (SELECT unhex(value) FROM jsonb_each($1))"
);

/// An id as the hex text `unhex` turns back into its blob.
pub(super) fn hex(id: Uuid) -> String {
    id.simple().to_string()
}

/// The ids as one JSON array of [`hex`] texts: `$1` of a statement that
/// reads `WHERE id IN (SELECT unhex(value) FROM jsonb_each($1))`.
pub(super) fn ids(ids: impl IntoIterator<Item = Uuid>) -> String {
    Value::Array(ids.into_iter().map(|id| Value::String(hex(id))).collect()).to_string()
}

/// Appends each entry (`$1`: a JSON array of [`entry`] objects) to its
/// task's history, numbered after the task's last entry (as
/// `history::NEXT_SEQUENCE` numbers: after the submit's implied sequence 1
/// where no row holds one) by the entry's place `n` among the batch's
/// entries of that task (1, 2, …). SQLite reads the whole `SELECT` before
/// it inserts, so every entry of a task counts from the same last entry.
const APPEND: &str = "INSERT INTO task_events \
    (task_id, sequence, kind, state, message, agent_id, lease_id, occurred_at_ms, implied_steps) \
    SELECT unhex(e.value ->> 'task'), \
    COALESCE((SELECT MAX(h.sequence) FROM task_events h \
    WHERE h.task_id = unhex(e.value ->> 'task')), 1) + (e.value ->> 'n'), \
    e.value ->> 'kind', e.value ->> 'state', e.value ->> 'message', \
    unhex(e.value ->> 'agent'), unhex(e.value ->> 'lease'), $2, \
    COALESCE(e.value ->> 'implied', 0) FROM jsonb_each($1) e";

/// A history entry of a batch: the `n`th of its task in the batch, `by`
/// the agent and lease involved, if any.
pub(super) fn entry(
    task_id: Uuid,
    n: u32,
    kind: &str,
    state: TaskState,
    message: &str,
    by: Option<(Uuid, Uuid)>,
) -> Value {
    json!({
        "task": hex(task_id),
        "n": n,
        "kind": kind,
        "state": state.as_str(),
        "message": message,
        "agent": by.map(|(agent, _)| hex(agent)),
        "lease": by.map(|(_, lease)| hex(lease)),
    })
}

/// `entry` (of [`entry`]) implying the last `steps` of
/// `history::IMPLIED_STEPS` before it, at the sequences just before its own.
pub(super) fn implying(mut entry: Value, steps: usize) -> Value {
    entry["implied"] = json!(steps);
    entry
}

/// Appends the entries (see [`APPEND`]); answers how many were appended.
pub(super) async fn append(w: &mut Write<Sqlite>, entries: Vec<Value>, now_ms: i64) -> Result<u64> {
    if entries.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query(APPEND)
        .bind(Value::Array(entries).to_string())
        .bind(now_ms)
        .execute(w.conn())
        .await
        .map_err(db("appending task events"))?;
    Ok(done.rows_affected())
}

/// The rows of `sql` (a statement reading `$1`, a JSON array of hex ids;
/// an id named twice is read once) for `ids`, each decoded into its id and
/// value.
pub(super) async fn read<T>(
    w: &mut Write<Sqlite>,
    sql: &'static str,
    ids: impl IntoIterator<Item = Uuid>,
    decode: fn(&SqliteRow) -> Result<(Uuid, T)>,
) -> Result<HashMap<Uuid, T>> {
    let rows = sqlx::query(sql)
        .bind(self::ids(ids))
        .fetch_all(w.conn())
        .await
        .map_err(db("reading a batch's rows"))?;
    rows.iter().map(decode).collect()
}

/// The named tasks, by id.
pub(super) async fn tasks(
    w: &mut Write<Sqlite>,
    ids: impl IntoIterator<Item = Uuid>,
) -> Result<HashMap<Uuid, TaskRecord>> {
    read(w, TASKS, ids, |row| {
        rows::task::<Sqlite>(row).map(|t| (t.id, t))
    })
    .await
}
