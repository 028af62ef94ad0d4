//! The queue read in order: pages of the queue index from the head or after
//! a cursor (the parked placements left out), where it goes on past the
//! parked placements, and a namespace's queue counted and grouped by kind
//! and placement.

use serde_json::Value;
use uuid::Uuid;

use super::Dialect;
use super::db::{SqlDb, StatementExt, query};
use super::rows;
use crate::error::{Error, Result};
use crate::model::{ParkedPlacement, QueueCursor, QueueGroupRow, TaskRecord};
use crate::store::plan::{db, to_u64};

/// `WHERE` of a queue page: leasable at `$1`, namespace `$2` (any if NULL).
pub(crate) const QUEUE_WHERE: &str = "WHERE t.state = 'queued' AND t.not_before_ms <= $1 \
    AND ($2 IS NULL OR t.namespace = $2) ";
/// A queue page's range below a cursor's priority.
pub(crate) const QUEUE_BELOW: &str = "AND t.priority < $5 ";
/// A queue page's order and size (`$3`).
pub(crate) const QUEUE_ORDER: &str =
    " ORDER BY t.priority DESC, t.created_at_ms + t.fair_offset, t.id LIMIT $3";

/// A page of the queue (see `TaskStore::queued_tasks`). Each statement is
/// one range of the queue index (`tasks_queue`), so a page costs its own
/// rows however deep in the queue it starts: the rest of the cursor's
/// priority, then the lower priorities.
pub(crate) async fn queue_page<DB: Dialect>(
    conn: &mut DB::Connection,
    namespace: Option<&str>,
    now_ms: i64,
    after: Option<&QueueCursor>,
    parked: &[ParkedPlacement],
    limit: u32,
) -> Result<Vec<TaskRecord>> {
    let parked = parked_json(parked)?;
    let page = |sql: &'static str, limit: u32| {
        query::<DB>(sql)
            .arg(now_ms)
            .opt_text(namespace)
            .arg(i64::from(limit))
            .text(&parked)
    };
    let Some(after) = after else {
        let rows = page(DB::QUEUE_HEAD, limit)
            .all(conn)
            .await
            .map_err(db("listing queued tasks"))?;
        return rows::all::<DB, _>(&rows, rows::task::<DB>);
    };
    let mut rows = page(DB::QUEUE_AFTER, limit)
        .arg(after.priority)
        .arg(after.rank)
        .arg(after.task_id)
        .all(conn)
        .await
        .map_err(db("listing queued tasks"))?;
    let rest = limit.saturating_sub(u32::try_from(rows.len()).unwrap_or(u32::MAX));
    if rest > 0 {
        rows.extend(
            page(DB::QUEUE_BELOW, rest)
                .arg(after.priority)
                .all(conn)
                .await
                .map_err(db("listing queued tasks"))?,
        );
    }
    rows::all::<DB, _>(&rows, rows::task::<DB>)
}

/// The parked placements as the text of a JSON array of
/// `[namespace, kind, placement text]` triples.
fn parked_json(parked: &[ParkedPlacement]) -> Result<String> {
    let triples: Vec<[&str; 3]> = parked
        .iter()
        .map(|p| [p.namespace.as_str(), p.kind.as_str(), p.placement.as_str()])
        .collect();
    serde_json::to_string(&triples).map_err(|err| Error::Corrupt {
        context: "listing queued tasks",
        detail: err.to_string(),
    })
}

/// Where the queue goes on after `after` past the parked placements (see
/// `TaskStore::first_unparked`).
pub(crate) async fn first_unparked<DB: Dialect>(
    conn: &mut DB::Connection,
    now_ms: i64,
    after: Option<&QueueCursor>,
    parked: &[ParkedPlacement],
) -> Result<Option<QueueCursor>> {
    const CONTEXT: &str = "finding the queue past its parked tasks";
    // Read as a page does, one task: where the statement gives up, or
    // there is none.
    let page = async |conn: &mut DB::Connection| {
        let page = queue_page::<DB>(conn, None, now_ms, after, parked, 1).await?;
        Ok(page.first().map(QueueCursor::after))
    };
    let Some(sql) = (if after.is_some() {
        DB::UNPARKED_AFTER
    } else {
        DB::UNPARKED_HEAD
    }) else {
        return page(conn).await;
    };
    let triples = parked_json(parked)?;
    let mut read = query::<DB>(sql).arg(now_ms).text(&triples);
    if let Some(after) = after {
        read = read.arg(after.priority).arg(after.rank).arg(after.task_id);
    }
    let Some(row) = read.optional(conn).await.map_err(db(CONTEXT))? else {
        return Ok(None);
    };
    let cols = super::db::Cols::<DB>::new(&row, CONTEXT);
    if cols.get::<bool>("capped")? {
        return page(conn).await;
    }
    let Some(task_id) = cols.get::<Option<Uuid>>("id")? else {
        return Ok(None);
    };
    Ok(Some(QueueCursor {
        priority: cols.get("priority")?,
        rank: cols.get("queue_rank")?,
        task_id,
    }))
}

const COUNT_QUEUED: &str =
    "SELECT COUNT(*) AS n FROM tasks WHERE namespace = $1 AND state = 'queued'";

/// Queued tasks of a namespace.
pub(crate) async fn count_queued<DB: SqlDb>(
    conn: &mut DB::Connection,
    namespace: &str,
) -> Result<u64> {
    let row = query::<DB>(COUNT_QUEUED)
        .text(namespace)
        .optional(conn)
        .await
        .map_err(db("counting a namespace's queue"))?;
    match row {
        Some(row) => Ok(to_u64(
            super::db::Cols::<DB>::new(&row, "reading a queue count").get("n")?,
        )),
        None => Ok(0),
    }
}

/// One pass over a namespace's queued tasks (the queue's partial index):
/// groups by kind and placement, the largest first, each row carrying the
/// number of groups in all.
const QUEUE_GROUPS: &str = "SELECT kind, placement, COUNT(*) AS n, \
    SUM(CASE WHEN not_before_ms > $2 THEN 1 ELSE 0 END) AS later, \
    MIN(created_at_ms) AS oldest, COUNT(*) OVER () AS groups \
    FROM tasks WHERE namespace = $1 AND state = 'queued' \
    GROUP BY kind, placement ORDER BY n DESC, oldest LIMIT $3";

/// A namespace's queued tasks by kind and placement (at most `limit`
/// groups), with the number of groups in all.
pub(crate) async fn queue_groups<DB: SqlDb>(
    conn: &mut DB::Connection,
    namespace: &str,
    now_ms: i64,
    limit: u32,
) -> Result<(Vec<QueueGroupRow>, u64)> {
    const CONTEXT: &str = "reading a queue group";
    let rows = query::<DB>(QUEUE_GROUPS)
        .text(namespace)
        .arg(now_ms)
        .arg(i64::from(limit))
        .all(conn)
        .await
        .map_err(db("grouping a namespace's queue"))?;
    let mut total = 0;
    let groups = rows
        .iter()
        .map(|row| {
            let cols = super::db::Cols::<DB>::new(row, CONTEXT);
            total = to_u64(cols.get("groups")?);
            Ok(QueueGroupRow {
                kind: cols.get("kind")?,
                placement: cols.get::<sqlx::types::Json<Value>>("placement")?.0,
                tasks: to_u64(cols.get("n")?),
                not_yet_due: to_u64(cols.get("later")?),
                oldest_submitted_ms: cols.get("oldest")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((groups, total))
}
