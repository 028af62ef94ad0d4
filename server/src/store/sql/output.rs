//! A task's output, in the shared SQL: the output reports of a batch
//! written row by row (every backend's default; PostgreSQL writes them set
//! based, deciding the same way), the per-task bound kept by dropping the
//! oldest rows, the namespace's kept bytes counted in shards, pages read by
//! byte offset, the tail a failed attempt's error carries, and the
//! namespace's bound kept by the sweeper; and [`SqlStore`]'s
//! [`OutputStore`], which reads pages and runs the sweeper's trim.
//!
//! Output reports are taken out of a report batch and written first, with
//! their tasks locked (in id order, like every report), so that the rest
//! of the batch (a quick task's accepted, started and final report) is
//! applied exactly as without output.

use std::borrow::Cow;
use std::collections::HashMap;

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use super::db::{SqlDb, StatementExt, query};
use super::rows::{self, OUTPUT_COLUMNS};
use super::{Backend, Dialect, SqlStore, Write, tasks};
use crate::error::{Error, Result};
use crate::model::output::{TAIL_LINES, output_tail};
use crate::model::{
    CompletionOutcome, LeaseReport, OutputBounds, ReportApplied, ReportKind, StoreEvent,
    StoredChunk,
};
use crate::store::OutputStore;
use crate::store::plan::output::{OutputMark, TaskOutputWrite, outputs_by_task, plan_output};
use crate::store::plan::{db, to_i64, to_u64};

#[async_trait]
impl<B: Backend> OutputStore for SqlStore<B> {
    async fn task_output(
        &self,
        task_id: Uuid,
        from_byte: u64,
        fencing_token: Option<u64>,
        limit: u32,
    ) -> Result<Vec<StoredChunk>> {
        self.read(|c, _| Box::pin(page::<B::Db>(c, task_id, from_byte, fencing_token, limit)))
            .await
    }

    async fn trim_output(&self) -> Result<u64> {
        /// Namespaces trimmed in one sweep at most.
        const STEPS: usize = 16;
        let bounds = self.options.output;
        let mut dropped = 0;
        for _ in 0..STEPS {
            let (step, over) = self.write(|w, _| Box::pin(trim_step(w, &bounds))).await?;
            dropped += step;
            if !over {
                break;
            }
        }
        Ok(dropped)
    }
}

/// The shards a namespace's kept bytes are counted in.
pub(crate) const USAGE_SHARDS: u128 = 16;

/// The shard a task's output is counted in.
pub(crate) fn usage_shard(task_id: Uuid) -> i32 {
    // The low bits of a UUIDv7 are random.
    (task_id.as_u128() % USAGE_SHARDS) as i32
}

/// The task's last row: its mark (`$1`: the task).
pub(crate) const MARK: &str = "SELECT fencing_token, sequence, end_byte, kept_bytes \
    FROM task_output WHERE task_id = $1 ORDER BY at_byte DESC LIMIT 1";

const INSERT: &str = "INSERT INTO task_output (task_id, at_byte, end_byte, kept_bytes, \
    namespace, lease_id, fencing_token, sequence, stream, text, written_at_ms) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

/// The oldest rows that keep text (`$1`: the task, `$2`: how many).
const OLDEST: &str = "SELECT at_byte, end_byte FROM task_output \
    WHERE task_id = $1 AND text <> '' ORDER BY at_byte LIMIT $2";

/// Drops the rows of a task that start at or before `$2`.
const DROP_THROUGH: &str = "DELETE FROM task_output WHERE task_id = $1 AND at_byte <= $2";

/// Adds `$3` bytes to a namespace's shard.
pub(crate) const ADD_USAGE: &str = "INSERT INTO output_usage (namespace, shard, bytes) \
    VALUES ($1, $2, $3) ON CONFLICT (namespace, shard) \
    DO UPDATE SET bytes = output_usage.bytes + excluded.bytes";

const PAGE: &str = const_format::concatcp!(
    "SELECT ",
    OUTPUT_COLUMNS,
    " FROM task_output WHERE task_id = $1 AND at_byte >= $2 \
    AND ($3 = 0 OR fencing_token = $3) ORDER BY at_byte LIMIT $4"
);

/// The last texts of one lease (`$1` task, `$2` token, `$3` how many),
/// newest first.
const TAIL: &str = "SELECT text FROM task_output WHERE task_id = $1 AND fencing_token = $2 \
    AND text <> '' ORDER BY at_byte DESC LIMIT $3";

/// The first namespace keeping more than `$1` bytes, and how many it keeps.
const OVER: &str = "SELECT namespace, CAST(SUM(bytes) AS BIGINT) AS bytes FROM output_usage \
    GROUP BY namespace HAVING SUM(bytes) > $1 ORDER BY namespace LIMIT 1";

/// A namespace's oldest tasks that keep output, and how much each keeps
/// (`$1` namespace, `$2` how many tasks).
const OLDEST_TASKS: &str = "SELECT task_id, CAST(SUM(end_byte - at_byte) AS BIGINT) AS bytes \
    FROM task_output WHERE namespace = $1 AND text <> '' \
    GROUP BY task_id ORDER BY task_id LIMIT $2";

/// A namespace's count, cleared (`$1`: the namespace).
const RECOUNT_CLEAR: &str = "DELETE FROM output_usage WHERE namespace = $1";

/// A namespace's count, from its rows.
const RECOUNT: &str = "INSERT INTO output_usage (namespace, shard, bytes) \
    SELECT $1, 0, COALESCE(SUM(end_byte - at_byte), 0) FROM task_output \
    WHERE namespace = $1 AND text <> ''";

/// Every row of a task but its last.
const DROP_ALL_BUT_LAST: &str = "DELETE FROM task_output WHERE task_id = $1 \
    AND at_byte < (SELECT MAX(at_byte) FROM task_output WHERE task_id = $1)";

/// The task's last row kept as its mark, without its text.
const BLANK_LAST: &str = "UPDATE task_output SET text = '', kept_bytes = 0 WHERE task_id = $1";

/// A task's mark, if it has output.
pub(crate) async fn mark<DB: SqlDb>(
    conn: &mut DB::Connection,
    task_id: Uuid,
) -> Result<Option<OutputMark>> {
    let row = query::<DB>(MARK)
        .arg(task_id)
        .optional(conn)
        .await
        .map_err(db("reading where a task's output ends"))?;
    row.map(|row| mark_of::<DB>(&row)).transpose()
}

/// A mark from [`MARK`]'s columns.
pub(crate) fn mark_of<DB: SqlDb>(row: &DB::Row) -> Result<OutputMark> {
    let cols = super::db::Cols::<DB>::new(row, "reading an output mark");
    Ok(OutputMark {
        fencing_token: to_u64(cols.get("fencing_token")?),
        sequence: to_u64(cols.get("sequence")?),
        end_byte: to_u64(cols.get("end_byte")?),
        kept_bytes: to_u64(cols.get("kept_bytes")?),
    })
}

/// The answers of the output reports of a batch, by index in the batch.
pub(crate) type Answers = Vec<(usize, Result<ReportApplied>)>;

/// Writes the output reports of `reports`, task by task in id order, each
/// task locked first; the answer to each output report.
pub(crate) async fn apply_rows<DB: Dialect>(
    w: &mut Write<DB>,
    reports: &[LeaseReport],
    bounds: &OutputBounds,
    now_ms: i64,
) -> Result<Answers> {
    let by_task = outputs_by_task(reports);
    let mut ids: Vec<Uuid> = by_task.keys().copied().collect();
    ids.sort_unstable();
    let mut answers = Vec::new();
    for id in ids {
        let indices = &by_task[&id];
        let task = match tasks::lock(w, id).await {
            Ok(task) => task,
            Err(err) if err.is_store_failure() => return Err(err),
            Err(_) => {
                answers.extend(indices.iter().map(|&i| (i, Err(missing(id)))));
                continue;
            }
        };
        let mark = mark::<DB>(w.conn(), id).await?;
        let batch: Vec<&LeaseReport> = indices.iter().map(|&i| &reports[i]).collect();
        let (planned, write) = plan_output(&task, mark, &batch, bounds);
        if let Some(write) = write {
            let added = write_rows(w, &write, now_ms).await?;
            add_usage(w, &write.namespace, id, added).await?;
            w.announce(StoreEvent::TaskOutput { task_id: id });
        }
        answers.extend(
            indices
                .iter()
                .copied()
                .zip(planned)
                .map(|(i, answer)| (i, answer.map(|()| ReportApplied { ended: false }))),
        );
    }
    Ok(answers)
}

/// Writes one task's planned output: the oldest rows past its bound
/// dropped, the new rows inserted. Answers the change of its kept bytes.
pub(crate) async fn write_rows<DB: SqlDb>(
    w: &mut Write<DB>,
    write: &TaskOutputWrite<'_>,
    now_ms: i64,
) -> Result<i64> {
    let deleted = drop_oldest(w, write.task_id, write.excess).await?;
    let kept = to_i64(write.kept_after(deleted));
    for row in &write.rows {
        query::<DB>(INSERT)
            .arg(write.task_id)
            .arg(to_i64(row.at_byte))
            .arg(to_i64(row.end_byte))
            .arg(kept)
            .text(&write.namespace)
            .arg(row.lease_id)
            .arg(to_i64(row.fencing_token))
            .arg(to_i64(row.chunk.sequence))
            .text(row.chunk.stream.as_str())
            .text(row.text())
            .arg(now_ms)
            .run(w.conn())
            .await
            .map_err(db("storing task output"))?;
    }
    Ok(to_i64(write.added()) - to_i64(deleted))
}

/// Drops a task's oldest rows until at least `excess` bytes of text went
/// (whole rows; every row up to the last one dropped goes, the marks of
/// earlier drops too). Answers the bytes of text dropped.
pub(crate) async fn drop_oldest<DB: SqlDb>(
    w: &mut Write<DB>,
    task_id: Uuid,
    excess: u64,
) -> Result<u64> {
    let mut dropped = 0;
    while dropped < excess {
        let rows = query::<DB>(OLDEST)
            .arg(task_id)
            .arg(256_i64)
            .all(w.conn())
            .await
            .map_err(db("reading a task's oldest output"))?;
        if rows.is_empty() {
            break;
        }
        let mut through = 0;
        for row in &rows {
            let cols = super::db::Cols::<DB>::new(row, "reading a task's oldest output");
            let (at, end): (i64, i64) = (cols.get("at_byte")?, cols.get("end_byte")?);
            dropped += to_u64(end - at);
            through = at;
            if dropped >= excess {
                break;
            }
        }
        query::<DB>(DROP_THROUGH)
            .arg(task_id)
            .arg(through)
            .run(w.conn())
            .await
            .map_err(db("dropping a task's oldest output"))?;
    }
    Ok(dropped)
}

/// Counts `bytes` more (or fewer) kept in the namespace, in the task's shard.
pub(crate) async fn add_usage<DB: SqlDb>(
    w: &mut Write<DB>,
    namespace: &str,
    task_id: Uuid,
    bytes: i64,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    query::<DB>(ADD_USAGE)
        .text(namespace)
        .arg(usage_shard(task_id))
        .arg(bytes)
        .run(w.conn())
        .await
        .map_err(db("counting a namespace's output"))?;
    Ok(())
}

/// `reports` with the output tail of each failed attempt in its error
/// (`output_tail`, when the attempt wrote any): borrowed as they are when
/// none failed.
pub(crate) async fn with_failure_tails<'r, DB: SqlDb>(
    conn: &mut DB::Connection,
    reports: &'r [LeaseReport],
) -> Result<Cow<'r, [LeaseReport]>> {
    let failed =
        |r: &LeaseReport| matches!(r.kind, ReportKind::Final(CompletionOutcome::Failed { .. }));
    if !reports.iter().any(failed) {
        return Ok(Cow::Borrowed(reports));
    }
    let mut reports = reports.to_vec();
    for report in &mut reports {
        let ReportKind::Final(CompletionOutcome::Failed { error, .. }) = &mut report.kind else {
            continue;
        };
        let tail = attempt_tail::<DB>(conn, report.task_id, report.fencing_token).await?;
        if !tail.is_empty()
            && let Value::Object(fields) = error
        {
            fields.insert("output_tail".to_owned(), Value::String(tail));
        }
    }
    Ok(Cow::Owned(reports))
}

/// The last lines of one lease's output (see [`output_tail`]).
pub(crate) async fn attempt_tail<DB: SqlDb>(
    conn: &mut DB::Connection,
    task_id: Uuid,
    fencing_token: u64,
) -> Result<String> {
    // A line may span chunks, but the tail never needs more chunks than
    // lines, plus one for a line cut in two.
    let rows = query::<DB>(TAIL)
        .arg(task_id)
        .arg(to_i64(fencing_token))
        .arg(i64::try_from(TAIL_LINES + 1).unwrap_or(i64::MAX))
        .all(conn)
        .await
        .map_err(db("reading an attempt's last output"))?;
    let texts = rows
        .iter()
        .map(|row| super::db::Cols::<DB>::new(row, "reading output text").get::<String>("text"))
        .collect::<Result<Vec<String>>>()?;
    Ok(output_tail(texts.iter().rev().map(String::as_str)))
}

/// A page of a task's output from `from_byte` on.
pub(crate) async fn page<DB: SqlDb>(
    conn: &mut DB::Connection,
    task_id: Uuid,
    from_byte: u64,
    fencing_token: Option<u64>,
    limit: u32,
) -> Result<Vec<StoredChunk>> {
    let rows = query::<DB>(PAGE)
        .arg(task_id)
        .arg(to_i64(from_byte))
        .arg(to_i64(fencing_token.unwrap_or(0)))
        .arg(i64::from(limit))
        .all(conn)
        .await
        .map_err(db("reading task output"))?;
    rows::all::<DB, _>(&rows, rows::chunk::<DB>)
}

/// How many of a namespace's oldest tasks one step of the trim reads.
const TRIM_STEP: i64 = 256;

/// One step of keeping the namespaces within `bounds.per_namespace` (see
/// `OutputStore::trim_output`): the first namespace over it has the output
/// of its oldest tasks dropped (each keeps its last row, without text, as
/// its mark) until it is a tenth under, each task locked (in id order)
/// while its output goes, and its kept bytes counted down after. One
/// replica trims at a time. Answers the bytes dropped, and whether a
/// namespace was over (another step may find the next).
pub(crate) async fn trim_step<DB: Dialect>(
    w: &mut Write<DB>,
    bounds: &OutputBounds,
) -> Result<(u64, bool)> {
    if bounds.per_namespace == 0 || !trim_lock(w).await? {
        return Ok((0, false));
    }
    let over = query::<DB>(OVER)
        .arg(to_i64(bounds.per_namespace))
        .optional(w.conn())
        .await
        .map_err(db("reading the namespaces' output"))?;
    let Some(over) = over else {
        return Ok((0, false));
    };
    let cols = super::db::Cols::<DB>::new(&over, "reading the namespaces' output");
    let (namespace, kept): (String, i64) = (cols.get("namespace")?, cols.get("bytes")?);
    let target = bounds.per_namespace - bounds.per_namespace / 10;
    let excess = to_u64(kept).saturating_sub(target);
    let mut dropped = 0;
    let mut usage: HashMap<i32, i64> = HashMap::new();
    while dropped < excess {
        let rows = query::<DB>(OLDEST_TASKS)
            .text(&namespace)
            .arg(TRIM_STEP)
            .all(w.conn())
            .await
            .map_err(db("reading a namespace's oldest output"))?;
        if rows.is_empty() {
            // Nothing is left to drop, yet the count says the namespace is
            // over: the count is wrong; count again from the rows.
            recount(w, &namespace).await?;
            return Ok((dropped, false));
        }
        for row in &rows {
            let cols = super::db::Cols::<DB>::new(row, "reading a namespace's oldest output");
            let (task_id, bytes): (Uuid, i64) = (cols.get("task_id")?, cols.get("bytes")?);
            tasks::lock(w, task_id).await?;
            for sql in [DROP_ALL_BUT_LAST, BLANK_LAST] {
                query::<DB>(sql)
                    .arg(task_id)
                    .run(w.conn())
                    .await
                    .map_err(db("dropping a namespace's oldest output"))?;
            }
            *usage.entry(usage_shard(task_id)).or_default() -= bytes;
            dropped += to_u64(bytes);
            if dropped >= excess {
                break;
            }
        }
    }
    let mut shards: Vec<(i32, i64)> = usage.into_iter().collect();
    shards.sort_unstable();
    for (shard, bytes) in shards {
        query::<DB>(ADD_USAGE)
            .text(&namespace)
            .arg(shard)
            .arg(bytes)
            .run(w.conn())
            .await
            .map_err(db("counting a namespace's output"))?;
    }
    Ok((dropped, true))
}

/// A namespace's kept bytes counted again from its rows (in one shard).
async fn recount<DB: SqlDb>(w: &mut Write<DB>, namespace: &str) -> Result<()> {
    for sql in [RECOUNT_CLEAR, RECOUNT] {
        query::<DB>(sql)
            .text(namespace)
            .run(w.conn())
            .await
            .map_err(db("counting a namespace's output again"))?;
    }
    Ok(())
}

/// Takes the trim's lock for the transaction, if no other replica holds it.
async fn trim_lock<DB: Dialect>(w: &mut Write<DB>) -> Result<bool> {
    const CONTEXT: &str = "taking the output trim's lock";
    let row = query::<DB>(DB::TRY_LOCK_OUTPUT_TRIM)
        .optional(w.conn())
        .await
        .map_err(db(CONTEXT))?;
    match row {
        Some(row) => super::db::Cols::<DB>::new(&row, CONTEXT).get("locked"),
        None => Ok(false),
    }
}

/// The answer to output for a task the store does not have.
pub(crate) fn missing(task_id: Uuid) -> Error {
    Error::NotFound {
        what: "task",
        id: task_id.to_string(),
    }
}
