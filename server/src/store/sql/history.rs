//! A task's append-only history: one entry per thing that happened to it,
//! appended in the transaction of the change (the task row is locked, so
//! the next sequence number is the appender's), read oldest first.
//!
//! A row is one entry, or, written by a whole fresh attempt's set-based
//! path, its end with the fixed steps before it ([`IMPLIED_STEPS`]: accepted
//! and started) implied. The first entry, [`SUBMITTED`] at sequence 1, is
//! implied by the task's row (at its creation time) and written by no
//! submit (a task submitted by an earlier release has a row of it), so a
//! quick task's life takes two rows instead of five; [`list`] expands them,
//! and the history reads the same either way.

use uuid::Uuid;

use super::Write;
use super::db::{Cols, SqlDb, StatementExt, query};
use super::rows::{self, EVENT_COLUMNS};
use crate::error::{Error, Result};
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

/// A fixed step of an attempt: its kind, the task's state after it, and
/// what it says.
pub(crate) type Step = (&'static str, TaskState, &'static str);

/// The task was submitted: the first entry of every task, at sequence 1,
/// by no agent, at its creation time; implied by the task's row.
pub(crate) const SUBMITTED: Step = ("submitted", TaskState::Queued, "submitted");

/// The agent acknowledged its lease.
pub(crate) const ACCEPTED: Step = (
    "accepted",
    TaskState::Leased,
    "the agent acknowledged the lease",
);

/// The agent started the task.
pub(crate) const STARTED: Step = ("started", TaskState::Running, "the agent started the task");

/// The steps a row may imply before its own entry (its `implied_steps`, 0
/// to 2, are the last ones of these), at the sequences just before its
/// own, by its agent and lease, at its time.
pub(crate) const IMPLIED_STEPS: [Step; 2] = [ACCEPTED, STARTED];

impl Entry<'static> {
    /// `step` of the attempt of `lease_id` on `agent_id`.
    pub(crate) fn step(task_id: Uuid, step: Step, agent_id: Uuid, lease_id: Uuid) -> Self {
        let (kind, state, message) = step;
        Self::of(task_id, kind, state, message).by(agent_id, lease_id)
    }
}

/// The sequence after a task's last entry: its last row's, or after the
/// [`SUBMITTED`] entry its row implies (`$1`: the task's id). Every
/// appender numbers so.
pub(crate) const NEXT_SEQUENCE: &str = "COALESCE((SELECT MAX(e.sequence) FROM task_events e \
    WHERE e.task_id = $1), 1) + 1";

const APPEND: &str = const_format::concatcp!(
    "INSERT INTO task_events \
    (task_id, sequence, kind, state, message, agent_id, lease_id, occurred_at_ms) \
    VALUES ($1, ",
    NEXT_SEQUENCE,
    ", $2, $3, $4, $5, $6, $7)"
);

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

/// The rows whose own entry comes after `$2`: each holds at least one
/// entry of the page, so `$3` rows hold at least `$3` entries.
const LIST: &str = const_format::concatcp!(
    "SELECT ",
    EVENT_COLUMNS,
    " FROM task_events WHERE task_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
);

/// When the task was created, if it exists.
const CREATED: &str = "SELECT created_at_ms FROM tasks WHERE id = $1";

/// A task's history after `after_sequence`, oldest first, at most `limit`
/// entries; the [`SUBMITTED`] entry its row implies first where no row
/// holds it, and a row's implied steps expanded before its own entry.
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
        .all(&mut *conn)
        .await
        .map_err(db("reading task events"))?;
    let rows = rows::all::<DB, _>(&rows, rows::event::<DB>)?;
    let mut entries = Vec::with_capacity(rows.len() + 1);
    if after_sequence == 0 && rows.first().map(|(entry, _)| entry.sequence) != Some(1) {
        entries.extend(submitted::<DB>(conn, task_id).await?);
    }
    for (entry, implied) in rows {
        entries.extend(expanded(entry, implied)?);
    }
    entries.retain(|e| e.sequence > after_sequence);
    entries.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(entries)
}

/// The [`SUBMITTED`] entry `task_id`'s row implies; none for a task that
/// does not exist.
async fn submitted<DB: SqlDb>(
    conn: &mut DB::Connection,
    task_id: Uuid,
) -> Result<Option<TaskEventRecord>> {
    let row = query::<DB>(CREATED)
        .arg(task_id)
        .optional(conn)
        .await
        .map_err(db("reading when a task was created"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let created: i64 =
        Cols::<DB>::new(&row, "reading when a task was created").get("created_at_ms")?;
    let (kind, state, message) = SUBMITTED;
    Ok(Some(TaskEventRecord {
        task_id,
        sequence: 1,
        kind: kind.to_owned(),
        state,
        message: message.to_owned(),
        agent_id: None,
        lease_id: None,
        occurred_at_ms: created,
    }))
}

/// A row's entries: the `implied` last of [`IMPLIED_STEPS`] before its own,
/// after sequence 1 (the [`SUBMITTED`] entry's).
fn expanded(entry: TaskEventRecord, implied: usize) -> Result<Vec<TaskEventRecord>> {
    let steps = IMPLIED_STEPS
        .len()
        .checked_sub(implied)
        .and_then(|from| IMPLIED_STEPS.get(from..));
    let first = u64::try_from(implied)
        .ok()
        .and_then(|n| entry.sequence.checked_sub(n))
        .filter(|&first| first > 1 || (first == 1 && implied == 0));
    let (Some(steps), Some(first)) = (steps, first) else {
        return Err(Error::Corrupt {
            context: "reading task events",
            detail: format!(
                "entry {} of task {} implies {implied} steps",
                entry.sequence, entry.task_id
            ),
        });
    };
    let mut out: Vec<TaskEventRecord> = steps
        .iter()
        .zip(first..)
        .map(|(&(kind, state, message), sequence)| TaskEventRecord {
            sequence,
            kind: kind.to_owned(),
            state,
            message: message.to_owned(),
            ..entry.clone()
        })
        .collect();
    out.push(entry);
    Ok(out)
}

#[cfg(test)]
mod tests {
    //! How a row's implied steps read back, and the rows that cannot be.

    use super::*;

    fn row(sequence: u64) -> TaskEventRecord {
        TaskEventRecord {
            task_id: Uuid::nil(),
            sequence,
            kind: "succeeded".to_owned(),
            state: TaskState::Succeeded,
            message: "done".to_owned(),
            agent_id: Some(Uuid::from_u128(1)),
            lease_id: Some(Uuid::from_u128(2)),
            occurred_at_ms: 7,
        }
    }

    fn read(sequence: u64, implied: usize) -> Vec<(u64, String, TaskState)> {
        expanded(row(sequence), implied)
            .unwrap()
            .into_iter()
            .inspect(|e| {
                let by = (e.agent_id, e.lease_id, e.occurred_at_ms);
                assert_eq!(by, (Some(Uuid::from_u128(1)), Some(Uuid::from_u128(2)), 7));
            })
            .map(|e| (e.sequence, e.kind, e.state))
            .collect()
    }

    #[test]
    fn a_row_reads_as_its_implied_steps_then_itself() {
        let end = (5, "succeeded".to_owned(), TaskState::Succeeded);
        assert_eq!(read(5, 0), std::slice::from_ref(&end));
        // A row at sequence 1 implying nothing, as an earlier release wrote
        // its submitted entry.
        assert_eq!(
            read(1, 0),
            [(1, "succeeded".to_owned(), TaskState::Succeeded)]
        );
        assert_eq!(
            read(5, 1),
            [(4, "started".to_owned(), TaskState::Running), end.clone()]
        );
        assert_eq!(
            read(5, 2),
            [
                (3, "accepted".to_owned(), TaskState::Leased),
                (4, "started".to_owned(), TaskState::Running),
                end
            ]
        );
    }

    #[test]
    fn a_row_implying_more_than_there_is_is_corrupt() {
        for (sequence, implied) in [(5, 3), (2, 2), (1, 1), (3, 2), (2, 1), (0, 0)] {
            let err = expanded(row(sequence), implied).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
        }
    }
}
