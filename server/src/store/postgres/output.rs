//! PostgreSQL's writing of a report batch's output: the marks of every task
//! with output read in one statement, the output decided by the shared
//! `plan_output` against the tasks the batch locked, every new row inserted
//! in one statement and the namespaces' kept bytes counted in one. A task
//! past its bound drops its oldest rows first, row by row (the shared SQL).

use std::collections::{BTreeMap, HashMap};

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use uuid::Uuid;

use crate::error::Result;
use crate::model::{LeaseReport, OutputBounds, ReportApplied, StoreEvent, TaskRecord};
use crate::store::plan::output::{OutputMark, TaskOutputWrite, outputs_by_task, plan_output};
use crate::store::plan::{db, to_i64};
use crate::store::sql::output::{drop_oldest, mark_of, missing, usage_shard};
use crate::store::sql::{Write, output::Answers};

/// The marks of the tasks in `$1` that have output.
const MARKS: &str = "SELECT t.id AS task_id, m.fencing_token, m.sequence, m.end_byte, \
    m.kept_bytes FROM UNNEST($1::uuid[]) AS t(id) CROSS JOIN LATERAL \
    (SELECT fencing_token, sequence, end_byte, kept_bytes FROM task_output o \
    WHERE o.task_id = t.id ORDER BY at_byte DESC LIMIT 1) m";

/// Every new row of the batch.
const INSERT: &str = "INSERT INTO task_output (task_id, at_byte, end_byte, kept_bytes, \
    namespace, lease_id, fencing_token, sequence, stream, text, written_at_ms) \
    SELECT u.*, $11 FROM UNNEST($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::text[], \
    $6::uuid[], $7::int8[], $8::int8[], $9::text[], $10::text[]) AS u";

/// The namespaces' kept bytes, by shard (each shard once, in order).
const USAGE: &str = "INSERT INTO output_usage (namespace, shard, bytes) \
    SELECT * FROM UNNEST($1::text[], $2::int4[], $3::int8[]) \
    ON CONFLICT (namespace, shard) DO UPDATE SET bytes = output_usage.bytes + excluded.bytes";

/// Writes the output reports of `reports` against `tasks` (the batch's
/// tasks, locked); the answer to each output report.
pub(super) async fn apply(
    w: &mut Write<Postgres>,
    reports: &[LeaseReport],
    tasks: &HashMap<Uuid, TaskRecord>,
    bounds: &OutputBounds,
    now_ms: i64,
) -> Result<Answers> {
    let by_task = outputs_by_task(reports);
    if by_task.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids: Vec<Uuid> = by_task.keys().copied().collect();
    ids.sort_unstable();
    let marks = marks(w, &ids).await?;
    let mut answers = Vec::new();
    let mut writes = Vec::new();
    for id in ids {
        let indices = &by_task[&id];
        let Some(task) = tasks.get(&id) else {
            answers.extend(indices.iter().map(|&i| (i, Err(missing(id)))));
            continue;
        };
        let batch: Vec<&LeaseReport> = indices.iter().map(|&i| &reports[i]).collect();
        let (planned, write) = plan_output(task, marks.get(&id).copied(), &batch, bounds);
        writes.extend(write);
        answers.extend(
            indices
                .iter()
                .copied()
                .zip(planned)
                .map(|(i, answer)| (i, answer.map(|()| ReportApplied { ended: false }))),
        );
    }
    write(w, &writes, now_ms).await?;
    for write in &writes {
        w.announce(StoreEvent::TaskOutput {
            task_id: write.task_id,
        });
    }
    Ok(answers)
}

/// The marks of the tasks that have output, by task.
async fn marks(w: &mut Write<Postgres>, ids: &[Uuid]) -> Result<HashMap<Uuid, OutputMark>> {
    let rows = sqlx::query(MARKS)
        .bind(ids)
        .fetch_all(w.conn())
        .await
        .map_err(db("reading where tasks' output ends"))?;
    let mut marks = HashMap::with_capacity(rows.len());
    for row in &rows {
        let task_id: Uuid = sqlx::Row::try_get(row, "task_id").map_err(db("reading a mark"))?;
        marks.insert(task_id, mark_of::<Postgres>(row)?);
    }
    Ok(marks)
}

/// The columns of the new rows, one array per column.
#[derive(Default)]
struct Rows<'a> {
    task_ids: Vec<Uuid>,
    at: Vec<i64>,
    end: Vec<i64>,
    kept: Vec<i64>,
    namespaces: Vec<&'a str>,
    lease_ids: Vec<Uuid>,
    tokens: Vec<i64>,
    sequences: Vec<i64>,
    streams: Vec<&'a str>,
    texts: Vec<&'a str>,
}

/// Drops what each task keeps past its bound, inserts every new row and
/// counts the namespaces' kept bytes.
async fn write(w: &mut Write<Postgres>, writes: &[TaskOutputWrite<'_>], now_ms: i64) -> Result<()> {
    if writes.is_empty() {
        return Ok(());
    }
    let mut rows = Rows::default();
    let mut usage: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for write in writes {
        let deleted = drop_oldest(w, write.task_id, write.excess).await?;
        let kept = to_i64(write.kept_after(deleted));
        for row in &write.rows {
            rows.task_ids.push(write.task_id);
            rows.at.push(to_i64(row.at_byte));
            rows.end.push(to_i64(row.end_byte));
            rows.kept.push(kept);
            rows.namespaces.push(&write.namespace);
            rows.lease_ids.push(row.lease_id);
            rows.tokens.push(to_i64(row.fencing_token));
            rows.sequences.push(to_i64(row.chunk.sequence));
            rows.streams.push(row.chunk.stream.as_str());
            rows.texts.push(row.text());
        }
        *usage
            .entry((write.namespace.as_str(), usage_shard(write.task_id)))
            .or_default() += to_i64(write.added()) - to_i64(deleted);
    }
    let arguments = rows.arguments(now_ms).map_err(db("encoding task output"))?;
    sqlx::query_with(INSERT, arguments)
        .execute(w.conn())
        .await
        .map_err(db("storing task output"))?;
    let usage: Vec<((&str, i32), i64)> = usage.into_iter().filter(|(_, b)| *b != 0).collect();
    if !usage.is_empty() {
        let namespaces: Vec<&str> = usage.iter().map(|((n, _), _)| *n).collect();
        let shards: Vec<i32> = usage.iter().map(|((_, s), _)| *s).collect();
        let bytes: Vec<i64> = usage.iter().map(|(_, b)| *b).collect();
        sqlx::query(USAGE)
            .bind(&namespaces)
            .bind(&shards)
            .bind(&bytes)
            .execute(w.conn())
            .await
            .map_err(db("counting namespaces' output"))?;
    }
    Ok(())
}

impl Rows<'_> {
    /// `$1`-`$10`: the columns; `$11`: when they were stored.
    fn arguments(&self, now_ms: i64) -> Result<PgArguments, sqlx::Error> {
        use sqlx::Arguments as _;
        let mut arguments = PgArguments::default();
        (|| {
            arguments.add(&self.task_ids)?;
            arguments.add(&self.at)?;
            arguments.add(&self.end)?;
            arguments.add(&self.kept)?;
            arguments.add(&self.namespaces)?;
            arguments.add(&self.lease_ids)?;
            arguments.add(&self.tokens)?;
            arguments.add(&self.sequences)?;
            arguments.add(&self.streams)?;
            arguments.add(&self.texts)?;
            arguments.add(now_ms)
        })()
        .map_err(sqlx::Error::Encode)?;
        Ok(arguments)
    }
}
