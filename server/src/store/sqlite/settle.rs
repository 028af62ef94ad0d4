//! SQLite's lease reports: a batch's output first (`output::apply_rows`),
//! then every *whole fresh attempt* (`accepted`, `started` and a final
//! report of a lease just granted, reported together as a quick task's
//! agent does) read and written in a handful of statements for the whole
//! batch, as PostgreSQL does in one; the rest of the batch row by row
//! (`reports::apply_rows`).

use serde_json::{Value, json};
use sqlx::Sqlite;

use super::batch::{self, hex};
use crate::error::Result;
use crate::model::{LeaseRecord, LeaseReport, ReportApplied};
use crate::store::StoreOptions;
use crate::store::plan::{SettledAttempt, db};
use crate::store::sql::reports::{self, WholeAttempt};
use crate::store::sql::rows::{self, LEASE_COLUMNS};
use crate::store::sql::{Write, history, output};

/// The named leases (`$1`: JSON array of hex ids).
const LEASES: &str = const_format::concatcp!(
    "SELECT ",
    LEASE_COLUMNS,
    " FROM leases WHERE id IN (SELECT unhex(value) FROM jsonb_each($1))"
);

/// The attempts' leases ended, acknowledged, each only if still just
/// granted (`$1`: JSON array of [`attempt_row`] objects).
const END_LEASES: &str = "UPDATE leases SET state = c.lease_state, outcome = c.outcome, \
    acked = TRUE, ended_at_ms = $2 \
    FROM (SELECT unhex(value ->> 'lease') AS id, value ->> 'lease_state' AS lease_state, \
    value ->> 'outcome' AS outcome FROM jsonb_each($1)) AS c \
    WHERE leases.id = c.id AND leases.state = 'granted'";

/// The attempts' refusals recorded (the agent cannot run the task).
const REFUSE: &str = "INSERT INTO task_refusals (task_id, agent_id, reason, refused_at_ms) \
    SELECT unhex(value ->> 'task'), unhex(value ->> 'agent'), value ->> 'refusal', $2 \
    FROM jsonb_each($1) WHERE value ->> 'refusal' IS NOT NULL \
    ON CONFLICT (task_id, agent_id) \
    DO UPDATE SET reason = excluded.reason, refused_at_ms = excluded.refused_at_ms";

/// The attempts' tasks settled, as `tasks::settle` settles one.
/// A report batch's tasks (`$1`: JSON array of hex ids) without their
/// documents (payload, placement, labels, progress, result, error) or
/// their leases' expiry, as PostgreSQL reads them: settling uses none of
/// them, and copying and decoding them was work done inside the writers'
/// turn.
const WHOLE_ATTEMPT_TASKS: &str = "SELECT t.id, t.namespace, t.kind, \
    'null' AS payload, 'null' AS placement, t.priority, t.state, t.attempts, t.releases, \
    t.max_attempts, t.lease_ttl_ms, t.idempotency_key, t.not_before_ms, NULL AS result, \
    NULL AS error, t.fencing_token, t.lease_id, t.agent_id, \
    NULL AS lease_expires_at_ms, t.cancel_requested, NULL AS progress, \
    '{}' AS labels, t.retry, t.start_timeout_ms, t.execution_timeout_ms, t.cancel_grace_ms, \
    t.cancel_deadline_ms, t.fairness_key, t.fairness_weight, \
    t.created_at_ms + t.fair_offset AS queue_rank, t.concurrency_key, t.created_at_ms, \
    t.updated_at_ms FROM tasks t WHERE t.id IN (SELECT unhex(value) FROM jsonb_each($1))";

const SETTLE_TASKS: &str = "UPDATE tasks SET state = c.task_state, attempts = c.attempts, \
    releases = c.releases, not_before_ms = c.not_before_ms, \
    result = COALESCE(c.result, tasks.result), error = COALESCE(c.error, tasks.error), \
    lease_id = NULL, agent_id = NULL, updated_at_ms = $2 \
    FROM (SELECT unhex(value ->> 'task') AS id, value ->> 'task_state' AS task_state, \
    value ->> 'attempts' AS attempts, value ->> 'releases' AS releases, \
    value ->> 'not_before_ms' AS not_before_ms, value ->> 'result' AS result, \
    value ->> 'error' AS error FROM jsonb_each($1)) AS c WHERE tasks.id = c.id";

/// A settled attempt as one element of the statements' array; the result
/// and error as JSON text, stored as the row-by-row path stores them.
fn attempt_row(lease: &LeaseRecord, s: &SettledAttempt) -> Value {
    json!({
        "lease": hex(lease.id),
        "task": hex(lease.task_id),
        "agent": hex(lease.agent_id),
        "lease_state": s.lease_state.as_str(),
        "outcome": s.ended_by.as_str(),
        "task_state": s.task_state.as_str(),
        "attempts": s.attempts,
        "releases": s.releases,
        "not_before_ms": s.not_before_ms,
        "result": s.result.as_ref().map(Value::to_string),
        "error": s.error.as_ref().map(Value::to_string),
        "refusal": s.refusal,
    })
}

/// `LeaseStore::apply_reports` in `w`: output, then whole fresh attempts
/// set-based, then the rest row by row; a failed attempt's error takes its
/// output's tail.
pub(super) async fn apply_reports(
    w: &mut Write<Sqlite>,
    reports: &[LeaseReport],
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Vec<Result<ReportApplied>>> {
    let mut results: Vec<Option<Result<ReportApplied>>> = reports.iter().map(|_| None).collect();
    for (i, answer) in output::apply_rows(w, reports, &options.output, now_ms).await? {
        results[i] = Some(answer);
    }
    let reports = output::with_failure_tails::<Sqlite>(w.conn(), reports).await?;
    whole_attempts(w, &reports, options, now_ms, &mut results).await?;
    reports::apply_rest(w, &reports, results, options, now_ms).await
}

/// Applies each whole fresh attempt of the batch (see
/// `reports::whole_attempt_candidates`): tasks and leases read in one
/// statement each, each attempt planned as PostgreSQL plans it
/// (`plan_whole_attempt`), and the leases, history, refusals and tasks
/// written in one statement each. Fills those reports' results; every other
/// report is left `None` for the row-by-row path.
async fn whole_attempts(
    w: &mut Write<Sqlite>,
    reports: &[LeaseReport],
    options: &StoreOptions,
    now_ms: i64,
    results: &mut [Option<Result<ReportApplied>>],
) -> Result<()> {
    let candidates = reports::whole_attempt_candidates(reports);
    if candidates.is_empty() {
        return Ok(());
    }
    let task_ids = candidates.iter().map(|c| reports[c[0]].task_id);
    let tasks = batch::read(w, WHOLE_ATTEMPT_TASKS, task_ids, |row| {
        rows::task::<Sqlite>(row).map(|t| (t.id, t))
    })
    .await?;
    let lease_ids = candidates.iter().map(|c| reports[c[0]].lease_id);
    let leases = batch::read(w, LEASES, lease_ids, |row| {
        rows::lease::<Sqlite>(row).map(|l| (l.id, l))
    })
    .await?;
    let settle =
        reports::plan_whole_attempts(reports, candidates, &tasks, &leases, options, now_ms);
    if settle.is_empty() {
        return Ok(());
    }
    write(w, &settle, now_ms).await?;
    reports::whole_attempts_written(w, &settle, results);
    Ok(())
}

/// Writes the attempts; every one is written, or the transaction is
/// refused (the rows were read in this transaction, and one writer holds
/// the database).
async fn write(w: &mut Write<Sqlite>, settle: &[WholeAttempt], now_ms: i64) -> Result<()> {
    let rows = Value::Array(
        settle
            .iter()
            .map(|(_, l, _, s)| attempt_row(l, s))
            .collect(),
    );
    let rows = rows.to_string();
    let ended = run(w, END_LEASES, &rows, now_ms, "ending leases").await?;
    // One row for accepted, started and the end: the end, implying the two
    // before it (`history::IMPLIED_STEPS`).
    let entries = settle
        .iter()
        .map(|(_, lease, _, s)| {
            let by = Some((lease.agent_id, lease.id));
            let end = batch::entry(lease.task_id, 3, s.event_kind, s.task_state, &s.message, by);
            batch::implying(end, history::IMPLIED_STEPS.len())
        })
        .collect();
    batch::append(w, entries, now_ms).await?;
    if settle.iter().any(|(_, _, _, s)| s.refusal.is_some()) {
        run(w, REFUSE, &rows, now_ms, "recording refusals").await?;
    }
    let settled = run(w, SETTLE_TASKS, &rows, now_ms, "settling tasks").await?;
    reports::all_whole_attempts_written(ended, settled, settle.len())
}

/// Runs one of the statements above on the batch's rows; answers how many
/// rows it changed.
async fn run(
    w: &mut Write<Sqlite>,
    sql: &'static str,
    rows: &str,
    now_ms: i64,
    context: &'static str,
) -> Result<u64> {
    let done = sqlx::query(sql)
        .bind(rows)
        .bind(now_ms)
        .execute(w.conn())
        .await
        .map_err(db(context))?;
    Ok(done.rows_affected())
}
