//! Fair share's bookkeeping: where a keyed task's rank is reckoned from
//! (its key's last waiting task, the first waiting keyed task of its
//! namespace and priority, and their fair clock), read through partial
//! indexes of keyed waiting tasks only; and the fair clock moved on by the
//! grants of keyed tasks.

use std::collections::{BTreeMap, HashMap};

use uuid::Uuid;

use super::db::{Cols, SqlDb, StatementExt, query};
use crate::error::Result;
use crate::model::NewTask;
use crate::store::plan::{GrantableTask, db};

/// The rank of a key's last waiting task, of the first waiting keyed task
/// of the namespace and priority (through the partial indexes of keyed
/// waiting tasks, their expressions written as the indexes'), and their
/// fair clock.
const FAIR_MARKS: &str = "SELECT \
    (SELECT MAX(created_at_ms + fair_offset) FROM tasks WHERE state = 'queued' \
     AND fairness_key IS NOT NULL AND namespace = $1 AND priority = $2 AND fairness_key = $3) \
     AS last_rank, \
    (SELECT MIN(created_at_ms + fair_offset) FROM tasks WHERE state = 'queued' \
     AND fairness_key IS NOT NULL AND namespace = $1 AND priority = $2) AS head_rank, \
    (SELECT rank FROM fair_clock WHERE namespace = $1 AND priority = $2) AS clock_rank";

/// Where a keyed task's rank starts from (see [`Fairness::next_rank`]):
/// the rank of its key's last waiting task, of the first waiting keyed
/// task of its namespace and priority, and their fair clock.
pub(crate) async fn fair_marks<DB: SqlDb>(
    conn: &mut DB::Connection,
    task: &NewTask,
    key: &str,
) -> Result<FairMarks> {
    const CONTEXT: &str = "reading a fairness key's place";
    let row = query::<DB>(FAIR_MARKS)
        .text(&task.namespace)
        .arg(task.priority)
        .text(key)
        .optional(conn)
        .await
        .map_err(db(CONTEXT))?;
    let Some(row) = row else {
        return Ok(FairMarks::default());
    };
    let cols = Cols::<DB>::new(&row, CONTEXT);
    Ok(FairMarks {
        last: cols.get("last_rank")?,
        head: cols.get("head_rank")?,
        clock: cols.get("clock_rank")?,
    })
}

/// What a keyed task's rank is reckoned from (see [`fair_marks`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FairMarks {
    /// The rank of the key's last waiting task.
    pub last: Option<i64>,
    /// The rank of the first waiting keyed task of the namespace and
    /// priority.
    pub head: Option<i64>,
    /// Their fair clock: the rank of the last keyed task granted.
    pub clock: Option<i64>,
}

const ADVANCE_FAIR_CLOCK: &str = "INSERT INTO fair_clock (namespace, priority, rank) \
    VALUES ($1, $2, $3) ON CONFLICT (namespace, priority) DO UPDATE SET rank = \
    CASE WHEN excluded.rank > fair_clock.rank THEN excluded.rank ELSE fair_clock.rank END";

/// Moves the fair clocks forward to the ranks of the keyed tasks among
/// those just granted (`tasks`: the batch's tasks as read to grant them;
/// one statement per namespace and priority, in order; none if no task
/// granted has a fairness key).
pub(crate) async fn advance_fair_clock<DB: SqlDb>(
    conn: &mut DB::Connection,
    granted: impl IntoIterator<Item = Uuid>,
    tasks: &HashMap<Uuid, GrantableTask>,
) -> Result<()> {
    let mut latest: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for task in granted.into_iter().filter_map(|id| tasks.get(&id)) {
        if let Some(rank) = task.fair_rank {
            let at = latest
                .entry((task.namespace.clone(), task.priority))
                .or_insert(rank);
            *at = (*at).max(rank);
        }
    }
    for ((namespace, priority), rank) in latest {
        query::<DB>(ADVANCE_FAIR_CLOCK)
            .text(&namespace)
            .arg(priority)
            .arg(rank)
            .run(conn)
            .await
            .map_err(db("advancing the fair clock"))?;
    }
    Ok(())
}
