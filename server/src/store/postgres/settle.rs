//! PostgreSQL's settling of attempts: final reports of a batch decided in
//! order and written in one statement, and *whole fresh attempts*
//! (`accepted`, `started` and a final report of a lease just granted,
//! reported together as a quick task's agent does) written in one statement
//! for the whole batch; the rest of a report batch goes row by row. The
//! whole fresh attempts that succeeded go first, in one call that commits
//! on its own (`switchyard_settle_successes`, migrations 0024 and 0025),
//! before the batch's transaction. A
//! batch's output is written first (`super::output`). A report batch runs
//! on the connections of the batch paths (`super::warm`); the final
//! reports an agent sends as it reconnects, on the shared ones. The tasks'
//! lock that begins each makes the statements after it run on kept plans
//! (`super::KEEP_PLANS`).

use std::collections::{HashMap, HashSet};

use sqlx::Postgres;
use sqlx::postgres::{PgArguments, PgPool};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::model::{
    Completion, CompletionResult, LeaseRecord, LeaseReport, ReportApplied, StoreEvent, TaskRecord,
    TaskState,
};
use crate::store::StoreOptions;
use crate::store::plan::{CompletionPlan, SettledAttempt, db, plan_completion, to_i64};
use crate::store::sql::reports::{self, WholeAttempt};
use crate::store::sql::rows::{self, LEASE_COLUMNS};
use crate::store::sql::{Write, output};

/// Every named lease (`$1`: lease ids).
pub(super) const LEASES_WITH_OUTCOME: &str =
    const_format::concatcp!("SELECT ", LEASE_COLUMNS, " FROM leases WHERE id = ANY($1)");

/// Locks a report batch's tasks in id order (`$1`: task ids), reading none
/// of their documents, nor their leases' expiry: settling needs none of
/// them. (It read the expiry by a join, and a plan made while `leases` was
/// small, kept by the connection, scanned the whole table for it.) The
/// rest of the batch runs on kept plans ([`super::KEEP_PLANS`]).
pub(super) const WHOLE_ATTEMPT_TASKS: &str = const_format::concatcp!(
    "SELECT t.id, t.namespace, t.kind, \
  'null'::jsonb AS payload, 'null'::jsonb AS placement, t.priority, t.state, t.attempts, \
  t.releases, t.max_attempts, t.lease_ttl_ms, t.idempotency_key, t.not_before_ms, NULL::jsonb AS result, \
  NULL::jsonb AS error, t.fencing_token, t.lease_id, t.agent_id, \
  NULL::int8 AS lease_expires_at_ms, t.cancel_requested, \
  NULL::jsonb AS progress, '{}'::jsonb AS labels, t.retry, t.start_timeout_ms, \
  t.execution_timeout_ms, t.cancel_grace_ms, t.cancel_deadline_ms, t.fairness_key, t.fairness_weight, \
  t.created_at_ms + t.fair_offset AS queue_rank, t.concurrency_key, t.created_at_ms, t.updated_at_ms \
  FROM tasks t WHERE t.id = ANY($1) AND ",
    super::KEEP_PLANS,
    " ORDER BY t.id FOR UPDATE OF t"
);

/// Applies whole fresh attempts in one statement: ends the leases
/// (acknowledged), settles the tasks, records refusals, and appends to each
/// history one row for accepted, started and the end (the end, implying the
/// two before it: `history::IMPLIED_STEPS`), numbered after the task's last
/// entry as `history::NEXT_SEQUENCE` numbers. Answers how many leases ended
/// and tasks settled.
///
/// A lease's state is matched against a column of `c` (`held`), not a
/// constant: the planner then cannot prove the partial indexes' predicate
/// (`state IN ('granted', 'active')`) and reads each lease by its key. With
/// the constant it could scan a partial index instead, which holds an
/// entry for every lease ended since the last VACUUM.
pub(super) const WHOLE_ATTEMPTS: &str = "WITH c AS ( \
  SELECT u.*, COALESCE((SELECT MAX(e.sequence) FROM task_events e \
  WHERE e.task_id = u.task_id), 1) AS last_sequence, 'granted'::text AS held \
  FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], \
  $5::text[], $6::text[], $7::int8[], $8::int8[], $9::text[], $10::text[], \
  $11::text[], $12::text[], $14::int8[], $15::text[]) AS u(lease_id, task_id, \
  agent_id, lease_state, outcome, task_state, attempts, not_before_ms, result, error, \
  event_kind, message, releases, refusal) \
  ), ended AS ( \
  UPDATE leases l SET state = c.lease_state, outcome = c.outcome, acked = TRUE, \
  ended_at_ms = $13 FROM c \
  WHERE l.id = c.lease_id AND l.state = c.held RETURNING l.id \
  ), history AS ( \
  INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, \
  lease_id, occurred_at_ms, implied_steps) \
  SELECT c.task_id, c.last_sequence + 3, c.event_kind, c.task_state, c.message, \
  c.agent_id, c.lease_id, $13, 2 FROM c \
  ), refused AS ( \
  INSERT INTO task_refusals (task_id, agent_id, reason, refused_at_ms) \
  SELECT c.task_id, c.agent_id, c.refusal, $13 FROM c WHERE c.refusal IS NOT NULL \
  ON CONFLICT (task_id, agent_id) DO UPDATE SET reason = excluded.reason, \
  refused_at_ms = excluded.refused_at_ms \
  ), settled AS ( \
  UPDATE tasks t SET state = c.task_state, attempts = c.attempts, releases = c.releases, \
  not_before_ms = c.not_before_ms, \
  result = COALESCE(c.result::jsonb, t.result), \
  error = COALESCE(c.error::jsonb, t.error), \
  lease_id = NULL, agent_id = NULL, updated_at_ms = $13 \
  FROM c WHERE t.id = c.task_id RETURNING t.id \
  ) \
  SELECT (SELECT COUNT(*) FROM ended), (SELECT COUNT(*) FROM settled)";

/// Settles completed attempts in one statement: ends the leases, settles
/// the tasks, appends the history, records refusals; the settled tasks come
/// back. Live lease states are matched as in [`WHOLE_ATTEMPTS`], against a
/// column of `c` (`live`).
const COMPLETE: &str = "WITH c AS ( \
  SELECT *, ARRAY['granted', 'active'] AS live FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], \
  $5::text[], $6::text[], $7::int8[], $8::int8[], $9::text[], $10::text[], \
  $11::text[], $12::text[], $14::int8[], $15::text[]) AS c(lease_id, task_id, \
  agent_id, lease_state, outcome, task_state, attempts, not_before_ms, result, error, \
  event_kind, message, releases, refusal) \
  ), ended AS ( \
  UPDATE leases l SET state = c.lease_state, outcome = c.outcome, \
  ended_at_ms = $13 FROM c \
  WHERE l.id = c.lease_id AND l.state = ANY(c.live) RETURNING l.id \
  ), history AS ( \
  INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, \
  lease_id, occurred_at_ms) \
  SELECT c.task_id, COALESCE((SELECT MAX(e.sequence) FROM task_events e \
  WHERE e.task_id = c.task_id), 1) + 1, c.event_kind, c.task_state, \
  c.message, c.agent_id, c.lease_id, $13 FROM c \
  ), refused AS ( \
  INSERT INTO task_refusals (task_id, agent_id, reason, refused_at_ms) \
  SELECT c.task_id, c.agent_id, c.refusal, $13 FROM c WHERE c.refusal IS NOT NULL \
  ON CONFLICT (task_id, agent_id) DO UPDATE SET reason = excluded.reason, \
  refused_at_ms = excluded.refused_at_ms \
  ), settled AS ( \
  UPDATE tasks t SET state = c.task_state, attempts = c.attempts, releases = c.releases, \
  not_before_ms = c.not_before_ms, \
  result = COALESCE(c.result::jsonb, t.result), \
  error = COALESCE(c.error::jsonb, t.error), \
  lease_id = NULL, agent_id = NULL, updated_at_ms = $13 \
  FROM c WHERE t.id = c.task_id \
  RETURNING t.id, t.namespace, t.kind, t.payload, t.placement, t.priority, \
  t.state, t.attempts, t.releases, t.max_attempts, t.lease_ttl_ms, t.idempotency_key, \
  t.not_before_ms, t.result, t.error, t.fencing_token, t.lease_id, \
  t.agent_id, NULL::int8 AS lease_expires_at_ms, t.cancel_requested, \
  t.progress, t.labels, t.retry, t.start_timeout_ms, t.execution_timeout_ms, t.cancel_grace_ms, \
  t.cancel_deadline_ms, t.fairness_key, t.fairness_weight, t.created_at_ms + t.fair_offset AS queue_rank, \
  t.concurrency_key, t.created_at_ms, t.updated_at_ms \
  ) \
  SELECT s.*, (SELECT COUNT(*) FROM ended) AS ended FROM settled s";

/// The columns of a batch of settled attempts, one array per column: the
/// arguments of [`WHOLE_ATTEMPTS`] and of [`COMPLETE`].
#[derive(Default)]
pub(super) struct SettledColumns<'a> {
    lease_ids: Vec<Uuid>,
    task_ids: Vec<Uuid>,
    agent_ids: Vec<Uuid>,
    lease_states: Vec<&'a str>,
    outcomes: Vec<&'a str>,
    task_states: Vec<&'a str>,
    attempts: Vec<i64>,
    not_before: Vec<i64>,
    results: Vec<Option<String>>,
    errors: Vec<Option<String>>,
    kinds: Vec<&'a str>,
    messages: Vec<&'a str>,
    releases: Vec<i64>,
    refusals: Vec<Option<&'a str>>,
}

impl<'a> SettledColumns<'a> {
    /// One row per lease and how its attempt settles.
    fn new(settled: impl Iterator<Item = (&'a LeaseRecord, &'a SettledAttempt)>) -> Self {
        let mut columns = Self::default();
        for (lease, s) in settled {
            columns.lease_ids.push(lease.id);
            columns.task_ids.push(lease.task_id);
            columns.agent_ids.push(lease.agent_id);
            columns.lease_states.push(s.lease_state.as_str());
            columns.outcomes.push(s.ended_by.as_str());
            columns.task_states.push(s.task_state.as_str());
            columns.attempts.push(i64::from(s.attempts));
            columns.not_before.push(s.not_before_ms);
            columns
                .results
                .push(s.result.as_ref().map(|v| v.to_string()));
            columns.errors.push(s.error.as_ref().map(|v| v.to_string()));
            columns.kinds.push(s.event_kind);
            columns.messages.push(s.message.as_str());
            columns.releases.push(i64::from(s.releases));
            columns.refusals.push(s.refusal.as_deref());
        }
        columns
    }

    /// `$1`-`$12`: the columns in the order above up to the messages;
    /// `$13`: `now_ms`; `$14`, `$15`: the releases and refusals.
    pub(super) fn arguments(&self, now_ms: i64) -> Result<PgArguments, sqlx::Error> {
        use sqlx::Arguments as _;
        let mut arguments = PgArguments::default();
        (|| {
            arguments.add(&self.lease_ids)?;
            arguments.add(&self.task_ids)?;
            arguments.add(&self.agent_ids)?;
            arguments.add(&self.lease_states)?;
            arguments.add(&self.outcomes)?;
            arguments.add(&self.task_states)?;
            arguments.add(&self.attempts)?;
            arguments.add(&self.not_before)?;
            arguments.add(&self.results)?;
            arguments.add(&self.errors)?;
            arguments.add(&self.kinds)?;
            arguments.add(&self.messages)?;
            arguments.add(now_ms)?;
            arguments.add(&self.releases)?;
            arguments.add(&self.refusals)
        })()
        .map_err(sqlx::Error::Encode)?;
        Ok(arguments)
    }
}

/// The named leases, by id.
async fn leases_by_id(
    w: &mut Write<Postgres>,
    lease_ids: &[Uuid],
    context: &'static str,
) -> Result<HashMap<Uuid, LeaseRecord>> {
    let rows = sqlx::query(LEASES_WITH_OUTCOME)
        .bind(lease_ids)
        .fetch_all(w.conn())
        .await
        .map_err(db(context))?;
    let mut leases = HashMap::with_capacity(rows.len());
    for row in &rows {
        let lease = rows::lease::<Postgres>(row)?;
        leases.insert(lease.id, lease);
    }
    Ok(leases)
}

/// Tasks read by `sql` (`$1`: their ids, in id order, locked), by id.
async fn locked_tasks(
    w: &mut Write<Postgres>,
    sql: &'static str,
    task_ids: &[Uuid],
    context: &'static str,
) -> Result<HashMap<Uuid, TaskRecord>> {
    let mut ids = task_ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let rows = sqlx::query(sql)
        .bind(&ids)
        .fetch_all(w.conn())
        .await
        .map_err(db(context))?;
    let mut tasks = HashMap::with_capacity(rows.len());
    for row in &rows {
        let task = rows::task::<Postgres>(row)?;
        tasks.insert(task.id, task);
    }
    Ok(tasks)
}

/// Locks final reports' tasks in id order (`$1`: task ids) with their
/// leases' expiry; the rest of the batch runs on kept plans
/// ([`super::KEEP_PLANS`]).
const LOCK_TASKS_TO_COMPLETE: &str = const_format::concatcp!(
    rows::TASK_SELECT,
    "WHERE t.id = ANY($1) AND ",
    super::KEEP_PLANS,
    " ORDER BY t.id FOR UPDATE OF t"
);

/// `LeaseStore::complete_leases` in `w`: every task locked in id order and
/// every named lease read (one round trip each), each report decided in
/// order (a settled report ends its lease for the reports after it), and
/// the settled ones written in one statement.
pub(super) async fn complete(
    w: &mut Write<Postgres>,
    completions: &[Completion],
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Vec<Result<CompletionResult>>> {
    let task_ids: Vec<Uuid> = completions.iter().map(|c| c.task_id).collect();
    let tasks = locked_tasks(
        w,
        LOCK_TASKS_TO_COMPLETE,
        &task_ids,
        "locking tasks to complete",
    )
    .await?;
    let lease_ids: Vec<Uuid> = completions.iter().map(|c| c.lease_id).collect();
    let mut leases = leases_by_id(w, &lease_ids, "reading leases to complete").await?;
    let mut results: Vec<Option<Result<CompletionResult>>> = Vec::new();
    let mut settle: Vec<(usize, LeaseRecord, SettledAttempt)> = Vec::new();
    for (i, completion) in completions.iter().enumerate() {
        let Some(task) = tasks.get(&completion.task_id) else {
            results.push(Some(Err(Error::NotFound {
                what: "task",
                id: completion.task_id.to_string(),
            })));
            continue;
        };
        let lease = leases.get(&completion.lease_id);
        match plan_completion(task, lease, completion, options, now_ms) {
            Ok(CompletionPlan::Duplicate) => results.push(Some(Ok(CompletionResult {
                task: task.clone(),
                duplicate: true,
            }))),
            Ok(CompletionPlan::Settle(settled)) => {
                if let Some(lease) = leases.get_mut(&completion.lease_id) {
                    let before = lease.clone();
                    lease.state = settled.lease_state;
                    lease.ended_by = Some(settled.ended_by);
                    settle.push((i, before, settled));
                }
                results.push(None);
            }
            Err(err) => results.push(Some(Err(err))),
        }
    }
    let settled_tasks = write_completions(w, &settle, now_ms).await?;
    for (i, lease, settled) in &settle {
        let task = &settled_tasks[&lease.task_id];
        reports::settled_events(w, task, settled);
        results[*i] = Some(Ok(CompletionResult {
            task: task.clone(),
            duplicate: false,
        }));
    }
    // A repeat of a report settled earlier in this batch answers with the
    // settled task.
    for result in results.iter_mut().flatten().flatten() {
        if result.duplicate
            && let Some(task) = settled_tasks.get(&result.task.id)
        {
            result.task = task.clone();
        }
    }
    Ok(reports::decided(results, "completing leases"))
}

/// Runs [`COMPLETE`] for the settled attempts; the tasks as settled, by id
/// (every one of them, or the transaction is refused).
async fn write_completions(
    w: &mut Write<Postgres>,
    settle: &[(usize, LeaseRecord, SettledAttempt)],
    now_ms: i64,
) -> Result<HashMap<Uuid, TaskRecord>> {
    let mut settled_tasks = HashMap::new();
    if settle.is_empty() {
        return Ok(settled_tasks);
    }
    let columns = SettledColumns::new(settle.iter().map(|(_, l, s)| (l, s)));
    let arguments = columns
        .arguments(now_ms)
        .map_err(db("encoding settled attempts"))?;
    let rows = sqlx::query_with(COMPLETE, arguments)
        .fetch_all(w.conn())
        .await
        .map_err(db("completing leases"))?;
    for row in &rows {
        let ended: i64 = sqlx::Row::try_get(row, "ended").map_err(db("counting ended leases"))?;
        if usize::try_from(ended).ok() != Some(settle.len()) {
            // The leases were read live under the task locks; refuse to
            // commit rather than miscount capacity.
            return Err(Error::Corrupt {
                context: "completing leases",
                detail: format!("{ended} of {} live leases ended", settle.len()),
            });
        }
        let task = rows::task::<Postgres>(row)?;
        settled_tasks.insert(task.id, task);
    }
    if let Some((_, lease, _)) = settle
        .iter()
        .find(|(_, l, _)| !settled_tasks.contains_key(&l.task_id))
    {
        return Err(Error::Corrupt {
            context: "completing leases",
            detail: format!("task {} was not settled", lease.task_id),
        });
    }
    Ok(settled_tasks)
}

/// `LeaseStore::apply_reports` in `w`: every task of the batch locked in id
/// order (the one-by-one path then finds its rows already held: one lock
/// order for the batch), its output written (set-based, against the tasks
/// as locked), the whole fresh attempts applied in one statement, and the
/// rest one by one; a failed attempt's error takes its output's tail.
pub(super) async fn apply_reports(
    w: &mut Write<Postgres>,
    reports: &[LeaseReport],
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Vec<Result<ReportApplied>>> {
    let mut results: Vec<Option<Result<ReportApplied>>> = reports.iter().map(|_| None).collect();
    let task_ids: Vec<Uuid> = reports.iter().map(|r| r.task_id).collect();
    let tasks = locked_tasks(
        w,
        WHOLE_ATTEMPT_TASKS,
        &task_ids,
        "locking tasks to apply reports",
    )
    .await?;
    for (i, answer) in super::output::apply(w, reports, &tasks, &options.output, now_ms).await? {
        results[i] = Some(answer);
    }
    let reports = output::with_failure_tails::<Postgres>(w.conn(), reports).await?;
    let whole = whole_attempts(w, &reports, &tasks, options, now_ms, &mut results).await?;
    tracing::trace!(reports = reports.len(), whole, "lease reports applied");
    reports::apply_rest(w, &reports, results, options, now_ms).await
}

/// The set-based part of [`apply_reports`]: with every task of the batch
/// locked (`tasks`), applies each *whole fresh attempt* (a task whose only
/// reports but output are `accepted`, `started` and a final report of the
/// lease it was just granted) in one statement for all of them. Fills those
/// reports' results and returns how many attempts it applied; every other
/// report is left `None` for the one-by-one path. Settling reads none of a
/// task's documents: the records here hold nulls and no labels in their
/// place.
async fn whole_attempts(
    w: &mut Write<Postgres>,
    reports: &[LeaseReport],
    tasks: &HashMap<Uuid, TaskRecord>,
    options: &StoreOptions,
    now_ms: i64,
    results: &mut [Option<Result<ReportApplied>>],
) -> Result<usize> {
    let candidates = reports::whole_attempt_candidates(reports);
    if candidates.is_empty() {
        return Ok(0);
    }
    let lease_ids: Vec<Uuid> = candidates.iter().map(|c| reports[c[0]].lease_id).collect();
    let leases = leases_by_id(w, &lease_ids, "reading leases to apply reports").await?;
    let settle = reports::plan_whole_attempts(reports, candidates, tasks, &leases, options, now_ms);
    if settle.is_empty() {
        return Ok(0);
    }
    write_whole_attempts(w, &settle, now_ms).await?;
    reports::whole_attempts_written(w, &settle, results);
    Ok(settle.len())
}

/// Settles whole fresh attempts that succeeded, each checked under its
/// task's lock to be a fresh attempt of the lease's holder (migrations 0024
/// and 0025: each task looked up by its key, whatever plan is kept;
/// `$1`-`$5`: lease, task and agent ids, fencing tokens, results; `$6`:
/// `now_ms`); answers the tasks it settled.
pub(super) const SETTLE_SUCCESSES: &str =
    "SELECT s FROM switchyard_settle_successes($1, $2, $3, $4, $5, $6) AS s";

/// `Backend::settle_apart` on PostgreSQL: the batch's whole fresh attempts
/// that succeeded ([`reports::whole_success_candidates`]), settled in one
/// call that commits on its own, a round trip where the batch's
/// transaction takes five. Answers those it settled, with their events;
/// the rest of the batch (and any attempt the call found no longer fresh)
/// is left to the transaction.
pub(super) async fn settle_successes(
    pool: &PgPool,
    reports: &[LeaseReport],
    now_ms: i64,
) -> Result<(Vec<Option<Result<ReportApplied>>>, Vec<StoreEvent>)> {
    let mut results: Vec<Option<Result<ReportApplied>>> = reports.iter().map(|_| None).collect();
    let candidates = reports::whole_success_candidates(reports);
    if candidates.is_empty() {
        return Ok((results, Vec::new()));
    }
    let n = candidates.len();
    let (mut lease_ids, mut task_ids, mut agent_ids) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut tokens, mut outcomes) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (c, result) in &candidates {
        let first = &reports[c[0]];
        lease_ids.push(first.lease_id);
        task_ids.push(first.task_id);
        agent_ids.push(first.agent_id);
        tokens.push(to_i64(first.fencing_token));
        outcomes.push(result.to_string());
    }
    let settled: Vec<Uuid> = sqlx::query_scalar(SETTLE_SUCCESSES)
        .bind(&lease_ids)
        .bind(&task_ids)
        .bind(&agent_ids)
        .bind(&tokens)
        .bind(&outcomes)
        .bind(now_ms)
        .fetch_all(pool)
        .await
        .map_err(db("settling successful attempts"))?;
    let settled: HashSet<Uuid> = settled.into_iter().collect();
    let mut events = Vec::with_capacity(settled.len());
    for (c, _) in candidates {
        let task_id = reports[c[0]].task_id;
        if settled.contains(&task_id) {
            reports::whole_attempt_answered(c, &mut results);
            events.push(StoreEvent::TaskChanged {
                task_id,
                state: TaskState::Succeeded,
            });
        }
    }
    Ok((results, events))
}

/// Runs [`WHOLE_ATTEMPTS`]; every attempt is written, or the transaction is
/// refused.
async fn write_whole_attempts(
    w: &mut Write<Postgres>,
    settle: &[WholeAttempt],
    now_ms: i64,
) -> Result<()> {
    let columns = SettledColumns::new(settle.iter().map(|(_, l, _, s)| (l, s)));
    let arguments = columns
        .arguments(now_ms)
        .map_err(db("encoding whole attempts"))?;
    let (ended, settled): (i64, i64) = sqlx::query_as_with(WHOLE_ATTEMPTS, arguments)
        .fetch_one(w.conn())
        .await
        .map_err(db("applying whole attempts"))?;
    reports::all_whole_attempts_written(ended, settled, settle.len())
}
