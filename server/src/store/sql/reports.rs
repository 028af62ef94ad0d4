//! Lease reports, row by row (every report of a backend without a set-based
//! way, and the reports such a backend leaves over): `accepted`, `started`,
//! progress, and final reports that end the lease and settle the task; a
//! batch's output goes first (`output`), and a failed attempt's error takes
//! the tail of its output. A
//! whole fresh attempt reported at once (accepted, started, perhaps its end,
//! as a quick task's agent sends them) is applied in one pass. Also what the
//! backends' set-based paths share: which reports of a batch are whole fresh
//! attempts, how each is planned, and what follows once they are written
//! (their events, the rest of the batch row by row).

use std::collections::HashMap;

use serde_json::Value;
use sqlx::Database;
use uuid::Uuid;

use super::db::{SqlDb, StatementExt, query};
use super::history::{self, ACCEPTED, Entry, STARTED};
use super::tasks::{self, Settlement};
use super::{Dialect, Write, leases, output};
use crate::error::{Error, Result};
use crate::model::{
    Completion, CompletionOutcome, CompletionResult, LeaseRecord, LeaseReport, LeaseState,
    ReportApplied, ReportKind, StoreEvent, TaskRecord, TaskState,
};
use crate::store::StoreOptions;
use crate::store::plan::{
    CompletionPlan, SettledAttempt, check_holder, db, plan_completion, plan_whole_attempt, started,
};

/// The task locked and the named lease read, checked to come from the
/// lease's live holder.
async fn holder<DB: Dialect>(
    w: &mut Write<DB>,
    report: &LeaseReport,
) -> Result<(TaskRecord, LeaseRecord)> {
    let task = tasks::lock(w, report.task_id).await?;
    let lease = leases::fetch::<DB>(w.conn(), report.lease_id).await?;
    let lease = check_holder(
        &task,
        lease.as_ref(),
        report.lease_id,
        report.agent_id,
        report.fencing_token,
    )?
    .clone();
    if !lease.state.is_live() {
        return Err(Error::LeaseNotHeld {
            lease_id: report.lease_id,
            agent_id: report.agent_id,
        });
    }
    Ok((task, lease))
}

const ACTIVATE: &str =
    "UPDATE leases SET state = 'active', acked = TRUE WHERE id = $1 AND state = 'granted'";
const RUNNING: &str = "UPDATE tasks SET state = 'running', updated_at_ms = $2 WHERE id = $1";
const PROGRESS: &str = "UPDATE tasks SET progress = $2, updated_at_ms = $3 WHERE id = $1";

/// `started`: LEASED to RUNNING (the lease ACTIVE); repeating it is fine.
async fn start<DB: Dialect>(w: &mut Write<DB>, r: &LeaseReport, now_ms: i64) -> Result<()> {
    let (task, _) = holder(w, r).await?;
    match task.state {
        TaskState::Running => return Ok(()),
        TaskState::Leased => {}
        from => {
            return Err(Error::InvalidTransition {
                task_id: task.id,
                from,
                what: "start",
            });
        }
    }
    mark_running(w, task.id, now_ms).await?;
    activate(w, r.lease_id).await?;
    let started = Entry::step(r.task_id, STARTED, r.agent_id, r.lease_id);
    history::append(w, started, now_ms).await
}

/// The task RUNNING, announced.
async fn mark_running<DB: SqlDb>(w: &mut Write<DB>, task_id: Uuid, now_ms: i64) -> Result<()> {
    query::<DB>(RUNNING)
        .arg(task_id)
        .arg(now_ms)
        .run(w.conn())
        .await
        .map_err(db("marking a task running"))?;
    w.announce(StoreEvent::TaskChanged {
        task_id,
        state: TaskState::Running,
    });
    Ok(())
}

/// The lease ACTIVE (acknowledged), if it was GRANTED.
async fn activate<DB: SqlDb>(w: &mut Write<DB>, lease_id: Uuid) -> Result<()> {
    query::<DB>(ACTIVATE)
        .arg(lease_id)
        .run(w.conn())
        .await
        .map_err(db("activating a lease"))?;
    Ok(())
}

/// The latest progress of a leased or running task.
async fn progress<DB: Dialect>(
    w: &mut Write<DB>,
    r: &LeaseReport,
    progress: &Value,
    now_ms: i64,
) -> Result<()> {
    let (task, _) = holder(w, r).await?;
    if !matches!(task.state, TaskState::Leased | TaskState::Running) {
        return Err(Error::InvalidTransition {
            task_id: task.id,
            from: task.state,
            what: "report progress",
        });
    }
    query::<DB>(PROGRESS)
        .arg(task.id)
        .json(progress)
        .arg(now_ms)
        .run(w.conn())
        .await
        .map_err(db("recording progress"))?;
    Ok(())
}

/// `accepted`: GRANTED to ACTIVE; a repeat for a lease the agent already
/// acknowledged (and still holds) is fine.
async fn accept<DB: Dialect>(w: &mut Write<DB>, r: &LeaseReport, now_ms: i64) -> Result<()> {
    let lease = (r.lease_id, r.fencing_token);
    if leases::ack(w, r.agent_id, &[lease], now_ms).await? == 0 {
        let held = leases::fetch::<DB>(w.conn(), r.lease_id)
            .await?
            .is_some_and(|l| {
                l.agent_id == r.agent_id
                    && l.fencing_token == r.fencing_token
                    && l.acked
                    && l.state == LeaseState::Active
            });
        if !held {
            return Err(Error::LeaseNotHeld {
                lease_id: r.lease_id,
                agent_id: r.agent_id,
            });
        }
    }
    Ok(())
}

/// Writes an accepted final report: the lease ends, the task settles, the
/// history grows.
pub(crate) async fn settle_attempt<DB: SqlDb>(
    w: &mut Write<DB>,
    task: &TaskRecord,
    lease: &LeaseRecord,
    settled: &SettledAttempt,
    now_ms: i64,
) -> Result<()> {
    if !leases::end(w, lease, settled.lease_state, settled.ended_by, now_ms).await? {
        return Err(Error::LeaseNotHeld {
            lease_id: lease.id,
            agent_id: lease.agent_id,
        });
    }
    let next = Settlement {
        state: settled.task_state,
        attempts: settled.attempts,
        releases: settled.releases,
        not_before_ms: settled.not_before_ms,
        result: settled.result.as_ref(),
        error: settled.error.as_ref(),
    };
    tasks::settle(w, task, next, now_ms).await?;
    if let Some(reason) = &settled.refusal {
        tasks::refuse(w, task.id, lease.agent_id, reason, now_ms).await?;
    }
    let entry = Entry::of(
        task.id,
        settled.event_kind,
        settled.task_state,
        &settled.message,
    )
    .by(lease.agent_id, lease.id);
    history::append(w, entry, now_ms).await
}

/// One final report.
async fn complete_one<DB: Dialect>(
    w: &mut Write<DB>,
    completion: &Completion,
    options: &StoreOptions,
    now_ms: i64,
) -> Result<CompletionResult> {
    let task = tasks::lock(w, completion.task_id).await?;
    let lease = leases::fetch::<DB>(w.conn(), completion.lease_id).await?;
    let plan = plan_completion(&task, lease.as_ref(), completion, options, now_ms)?;
    let (CompletionPlan::Settle(settled), Some(lease)) = (plan, lease) else {
        return Ok(CompletionResult {
            task,
            duplicate: true,
        });
    };
    settle_attempt(w, &task, &lease, &settled, now_ms).await?;
    Ok(CompletionResult {
        task: tasks::must_fetch::<DB>(w.conn(), task.id).await?,
        duplicate: false,
    })
}

/// Results of a batch handled in another order than given, in order; a
/// database failure (the transaction is unusable) fails the whole batch,
/// a refusal only its item.
struct InOrder<T>(Vec<Option<Result<T>>>);

impl<T> InOrder<T> {
    fn new(len: usize) -> Self {
        Self((0..len).map(|_| None).collect())
    }

    /// Records item `i`'s outcome; a database failure is returned instead.
    fn set(&mut self, i: usize, outcome: Result<T>) -> Result<()> {
        match outcome {
            Err(err) if err.is_store_failure() => Err(err),
            other => {
                self.0[i] = Some(other);
                Ok(())
            }
        }
    }

    fn into_results(self, context: &'static str) -> Vec<Result<T>> {
        decided(self.0, context)
    }
}

/// Every item's outcome, in order; an item left undecided (`None`) is a
/// fault of the store's own, answered as corruption.
pub(crate) fn decided<T>(
    outcomes: Vec<Option<Result<T>>>,
    context: &'static str,
) -> Vec<Result<T>> {
    outcomes
        .into_iter()
        .map(|r| {
            r.unwrap_or(Err(Error::Corrupt {
                context,
                detail: "an item was not decided".to_owned(),
            }))
        })
        .collect()
}

/// Indices of `items` in `key` order (a stable sort: items with one key
/// keep their order).
fn order_by<T, K: Ord>(items: &[T], key: impl Fn(&T) -> K) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| key(&items[i]));
    order
}

/// Final reports row by row, in task id order (see
/// `LeaseStore::complete_leases`).
pub(crate) async fn complete_rows<DB: Dialect>(
    w: &mut Write<DB>,
    completions: &[Completion],
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Vec<Result<CompletionResult>>> {
    let mut results = InOrder::new(completions.len());
    for i in order_by(completions, |c| c.task_id) {
        let outcome = complete_one(w, &completions[i], options, now_ms).await;
        results.set(i, outcome)?;
    }
    Ok(results.into_results("completing leases"))
}

/// `accepted` and `started` of a freshly granted lease, and perhaps its
/// final report, applied in one pass: the same rows, history and outcome as
/// applying them one by one, in fewer statements (the task goes from LEASED
/// straight to its end state when the end is there). `None` if the lease is
/// not freshly granted to the reporter; the caller then applies the reports
/// one by one.
async fn run_attempt<DB: Dialect>(
    w: &mut Write<DB>,
    r: &LeaseReport,
    end: Option<&CompletionOutcome>,
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Option<Result<ReportApplied>>> {
    let task = tasks::lock(w, r.task_id).await?;
    let Some(lease) = leases::fetch::<DB>(w.conn(), r.lease_id).await? else {
        return Ok(None);
    };
    let holds = check_holder(&task, Some(&lease), r.lease_id, r.agent_id, r.fencing_token);
    if holds.is_err() || lease.state != LeaseState::Granted || task.state != TaskState::Leased {
        return Ok(None);
    }
    activate(w, r.lease_id).await?;
    let accepted = Entry::step(r.task_id, ACCEPTED, r.agent_id, r.lease_id);
    history::append(w, accepted, now_ms).await?;
    if end.is_none() {
        mark_running(w, task.id, now_ms).await?;
    }
    let started_entry = Entry::step(r.task_id, STARTED, r.agent_id, r.lease_id);
    history::append(w, started_entry, now_ms).await?;
    let Some(outcome) = end else {
        return Ok(Some(Ok(ReportApplied { ended: false })));
    };
    let (running, active) = started(&task, &lease);
    let completion = r.completion(outcome);
    let settled = match plan_completion(&running, Some(&active), &completion, options, now_ms) {
        Ok(CompletionPlan::Settle(settled)) => settled,
        Ok(CompletionPlan::Duplicate) => return Ok(Some(Ok(ReportApplied { ended: false }))),
        Err(refusal) => return Ok(Some(Err(refusal))),
    };
    settle_attempt(w, &running, &active, &settled, now_ms).await?;
    Ok(Some(Ok(ReportApplied { ended: true })))
}

/// One report on its own.
async fn apply_one<DB: Dialect>(
    w: &mut Write<DB>,
    r: &LeaseReport,
    options: &StoreOptions,
    now_ms: i64,
) -> Result<ReportApplied> {
    let not_ended = ReportApplied { ended: false };
    match &r.kind {
        ReportKind::Accepted => accept(w, r, now_ms).await.map(|()| not_ended),
        ReportKind::Started => start(w, r, now_ms).await.map(|()| not_ended),
        ReportKind::Progress(value) => progress(w, r, value, now_ms).await.map(|()| not_ended),
        // Written apart, before the rest of the batch (`apply_all`).
        ReportKind::Output(_) => Ok(not_ended),
        ReportKind::Final(outcome) => complete_one(w, &r.completion(outcome), options, now_ms)
            .await
            .map(|c| ReportApplied {
                ended: !c.duplicate,
            }),
    }
}

/// Lease reports of many sessions (see `LeaseStore::apply_reports`): the
/// output reports first ([`output::apply_rows`]), then the rest row by row
/// ([`apply_rows`]), a failed attempt's error carrying its output's tail.
pub(crate) async fn apply_all<DB: Dialect>(
    w: &mut Write<DB>,
    reports: &[LeaseReport],
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Vec<Result<ReportApplied>>> {
    let answers = output::apply_rows(w, reports, &options.output, now_ms).await?;
    if answers.is_empty() {
        let reports = output::with_failure_tails::<DB>(w.conn(), reports).await?;
        return apply_rows(w, &reports, options, now_ms).await;
    }
    let mut results = InOrder::new(reports.len());
    for (i, answer) in answers {
        results.set(i, answer)?;
    }
    let rest: Vec<usize> = (0..reports.len())
        .filter(|&i| results.0[i].is_none())
        .collect();
    let others: Vec<LeaseReport> = rest.iter().map(|&i| reports[i].clone()).collect();
    let others = output::with_failure_tails::<DB>(w.conn(), &others).await?;
    let applied = apply_rows(w, &others, options, now_ms).await?;
    for (i, answer) in rest.into_iter().zip(applied) {
        results.set(i, answer)?;
    }
    Ok(results.into_results("applying lease reports"))
}

/// Lease reports of many sessions row by row, in task id order (a stable
/// sort: reports about one task keep their order), each applied or refused
/// on its own. Agent rows are never touched: an agent's load is the count
/// of its live leases.
pub(crate) async fn apply_rows<DB: Dialect>(
    w: &mut Write<DB>,
    reports: &[LeaseReport],
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Vec<Result<ReportApplied>>> {
    let order = order_by(reports, |r| r.task_id);
    let mut results = InOrder::new(reports.len());
    let mut k = 0;
    while k < order.len() {
        let r = &reports[order[k]];
        let next = |n: usize| order.get(k + n).map(|&j| &reports[j]);
        // A whole attempt reported at once: accepted, started, perhaps the end.
        if r.kind == ReportKind::Accepted
            && let Some(started) = next(1)
            && started.kind == ReportKind::Started
            && r.same_lease(started)
        {
            let end = next(2)
                .filter(|f| r.same_lease(f))
                .and_then(|f| match &f.kind {
                    ReportKind::Final(outcome) => Some(outcome),
                    _ => None,
                });
            if let Some(outcome) = run_attempt(w, r, end, options, now_ms).await? {
                results.set(order[k], Ok(ReportApplied { ended: false }))?;
                results.set(order[k + 1], Ok(ReportApplied { ended: false }))?;
                if end.is_some() {
                    results.set(order[k + 2], outcome)?;
                    k += 3;
                } else {
                    k += 2;
                }
                continue;
            }
        }
        let outcome = apply_one(w, r, options, now_ms).await;
        results.set(order[k], outcome)?;
        k += 1;
    }
    Ok(results.into_results("applying lease reports"))
}

/// A settled attempt's events: re-queued (with its due time) and changed.
pub(crate) fn settled_events<DB: Database>(
    w: &mut Write<DB>,
    task: &TaskRecord,
    settled: &SettledAttempt,
) {
    if settled.task_state == TaskState::Queued {
        w.announce(StoreEvent::queued(task, settled.not_before_ms));
    }
    w.announce(StoreEvent::TaskChanged {
        task_id: task.id,
        state: settled.task_state,
    });
}

/// The reports of each task that are exactly accepted, started and a final
/// report of one lease, in order: candidates for a whole fresh attempt.
pub(crate) fn whole_attempt_candidates(reports: &[LeaseReport]) -> Vec<[usize; 3]> {
    let mut by_task: HashMap<Uuid, Vec<usize>> = HashMap::new();
    for (i, r) in reports.iter().enumerate() {
        // Output was written already, apart.
        if !matches!(r.kind, ReportKind::Output(_)) {
            by_task.entry(r.task_id).or_default().push(i);
        }
    }
    by_task
        .values()
        .filter_map(|idx| {
            let &[a, s, f] = idx.as_slice() else {
                return None;
            };
            let (ra, rs, rf) = (&reports[a], &reports[s], &reports[f]);
            (ra.kind == ReportKind::Accepted
                && rs.kind == ReportKind::Started
                && matches!(rf.kind, ReportKind::Final(_))
                && ra.same_lease(rs)
                && ra.same_lease(rf))
            .then_some([a, s, f])
        })
        .collect()
}

/// The candidates for a whole fresh attempt (see
/// [`whole_attempt_candidates`]) that end in success, with the success's
/// result, whose task has no output in the batch: what a backend may
/// settle before, and apart from, the batch's transaction, as nothing else
/// of the batch touches their tasks.
pub(crate) fn whole_success_candidates(reports: &[LeaseReport]) -> Vec<([usize; 3], &Value)> {
    let with_output: std::collections::HashSet<Uuid> = reports
        .iter()
        .filter(|r| matches!(r.kind, ReportKind::Output(_)))
        .map(|r| r.task_id)
        .collect();
    whole_attempt_candidates(reports)
        .into_iter()
        .filter(|c| !with_output.contains(&reports[c[0]].task_id))
        .filter_map(|c| match &reports[c[2]].kind {
            ReportKind::Final(CompletionOutcome::Succeeded { result }) => Some((c, result)),
            _ => None,
        })
        .collect()
}

/// The answers of a whole attempt's three reports, settled (`c`: their
/// places in the batch).
pub(crate) fn whole_attempt_answered(c: [usize; 3], results: &mut [Option<Result<ReportApplied>>]) {
    results[c[0]] = Some(Ok(ReportApplied { ended: false }));
    results[c[1]] = Some(Ok(ReportApplied { ended: false }));
    results[c[2]] = Some(Ok(ReportApplied { ended: true }));
}

/// A whole fresh attempt to write: its three reports' places in the batch
/// (accepted, started, the end), the lease as the attempt ends it, the task
/// as running, and how the attempt settles.
pub(crate) type WholeAttempt = ([usize; 3], LeaseRecord, TaskRecord, SettledAttempt);

/// Plans each candidate (see [`whole_attempt_candidates`]) against its task
/// and lease as read for the batch (`plan_whole_attempt`); one that is not a
/// fresh attempt of the lease's holder is left to the row-by-row path.
pub(crate) fn plan_whole_attempts(
    reports: &[LeaseReport],
    candidates: Vec<[usize; 3]>,
    tasks: &HashMap<Uuid, TaskRecord>,
    leases: &HashMap<Uuid, LeaseRecord>,
    options: &StoreOptions,
    now_ms: i64,
) -> Vec<WholeAttempt> {
    let mut settle = Vec::new();
    for c in candidates {
        let report = &reports[c[0]];
        let ReportKind::Final(outcome) = &reports[c[2]].kind else {
            continue;
        };
        let (Some(task), Some(lease)) = (tasks.get(&report.task_id), leases.get(&report.lease_id))
        else {
            continue;
        };
        let completion = report.completion(outcome);
        if let Some((running, active, settled)) =
            plan_whole_attempt(task, lease, &completion, options, now_ms)
        {
            settle.push((c, active, running, settled));
        }
    }
    settle
}

/// Refuses the transaction unless every one of `attempts` whole attempts
/// ended its lease and settled its task: the rows were read in this
/// transaction (locked, or under SQLite's one writer), so a shortfall is
/// corruption, and committing would record half an attempt.
pub(crate) fn all_whole_attempts_written<N>(ended: N, settled: N, attempts: usize) -> Result<()>
where
    N: Copy + std::fmt::Display + TryInto<usize>,
{
    if [ended, settled]
        .iter()
        .any(|&n| n.try_into().ok() != Some(attempts))
    {
        return Err(Error::Corrupt {
            context: "applying whole attempts",
            detail: format!(
                "{ended} leases ended and {settled} tasks settled of {attempts} attempts"
            ),
        });
    }
    Ok(())
}

/// The written attempts' events, and their reports' answers.
pub(crate) fn whole_attempts_written<DB: Database>(
    w: &mut Write<DB>,
    settle: &[WholeAttempt],
    results: &mut [Option<Result<ReportApplied>>],
) {
    for (c, _, task, settled) in settle {
        settled_events(w, task, settled);
        whole_attempt_answered(*c, results);
    }
}

/// The reports a backend's set-based path left undecided (`None`), applied
/// row by row ([`apply_rows`]); then every report's answer.
pub(crate) async fn apply_rest<DB: Dialect>(
    w: &mut Write<DB>,
    reports: &[LeaseReport],
    mut results: Vec<Option<Result<ReportApplied>>>,
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Vec<Result<ReportApplied>>> {
    let rest: Vec<usize> = (0..reports.len())
        .filter(|&i| results[i].is_none())
        .collect();
    if !rest.is_empty() {
        let subset: Vec<LeaseReport> = rest.iter().map(|&i| reports[i].clone()).collect();
        let applied = apply_rows(w, &subset, options, now_ms).await?;
        for (i, result) in rest.into_iter().zip(applied) {
            results[i] = Some(result);
        }
    }
    Ok(decided(results, "applying lease reports"))
}
