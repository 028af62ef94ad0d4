//! The store's decisions, apart from its SQL: which grants of a batch fit
//! (`plan_grants`), what a final report does to its lease and task
//! (`plan_completion`), whether a report comes from the lease's holder
//! (`check_holder`), and the small conversions the rows need. Both
//! backends, row by row or set-based, decide through these, so they agree.
//!
//! [`output`] holds the decisions about a task's output.

pub(crate) mod output;

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use switchyard_core::resources::{self, Claim, Held, Offer};
use uuid::Uuid;

use super::StoreOptions;
use crate::error::{Error, Result};
use crate::model::{
    Completion, CompletionOutcome, GrantRefusal, GrantRequest, LeaseEnd, LeaseRecord, LeaseState,
    ReleaseCause, RetryPolicy, StoredName, TaskRecord, TaskState, release_backoff_ms,
};

/// Wraps a driver error with what the store was doing.
pub(crate) fn db(context: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |source| Error::Store { context, source }
}

/// A stored non-negative counter as `u64` (columns are BIGINT with CHECK >= 0).
pub(crate) fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_default()
}

/// A stored non-negative counter as `u32`, saturating.
pub(crate) fn to_u32(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

/// A `u64` for a BIGINT column, saturating.
pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The error document of a lost lease at the attempt budget.
pub(crate) fn lease_lost_error(times: i64) -> Value {
    json!({
        "message": format!("lease lost {times} times"),
        "code": "lease_lost",
        "retryable": false,
        "details": {},
    })
}

/// The cursor after the last task of a page (newest first).
pub(crate) fn task_cursor(created_at_ms: i64, id: Uuid) -> String {
    format!("{created_at_ms}.{id}")
}

/// Parses a [`task_cursor`]; `None` for text the store did not make.
pub(crate) fn parse_task_cursor(cursor: &str) -> Option<(i64, Uuid)> {
    let (ms, id) = cursor.split_once('.')?;
    Some((ms.parse().ok()?, id.parse().ok()?))
}

/// What the store knows about a task when planning grants.
#[derive(Debug, Clone)]
pub(crate) struct GrantableTask {
    /// The state read under lock.
    pub state: TaskState,
    /// Not leased before this.
    pub not_before_ms: i64,
    /// The last token issued.
    pub fencing_token: i64,
    /// For the lease's expiry.
    pub lease_ttl_ms: i64,
    /// Its namespace (for a limit of running tasks per namespace).
    pub namespace: String,
    /// Its concurrency key, if any.
    pub concurrency_key: Option<String>,
    /// Its priority.
    pub priority: i32,
    /// Its rank in the queue, if it has a fairness key (a grant moves the
    /// fair clock on to it).
    pub fair_rank: Option<i64>,
}

/// What the store knows of an agent's resources when planning grants that
/// claim more than slots: its offer (its stored `resources` section) and
/// what its live leases hold, both read under the agent's lock.
#[derive(Debug, Clone, Default)]
pub(crate) struct AgentResources {
    /// The agent's stored `resources` section (null when it has none).
    pub section: Value,
    /// What its live leases hold.
    pub held: Held,
}

/// The agents `requests` claim more than slots of, sorted, once each: those
/// whose resources a grant must read.
pub(crate) fn claiming_agents(requests: &[GrantRequest]) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = requests
        .iter()
        .filter(|r| !r.claim.is_one_slot())
        .map(|r| r.agent_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The resources of the agents in `sections` (id, stored section) with what
/// their live leases hold (`claims`, by agent), for `plan_grants`.
pub(crate) fn agent_resources(
    sections: impl IntoIterator<Item = (Uuid, Option<Value>)>,
    mut claims: HashMap<Uuid, Vec<(Uuid, Claim)>>,
) -> HashMap<Uuid, AgentResources> {
    sections
        .into_iter()
        .map(|(id, section)| {
            let held = Held::of(claims.remove(&id).unwrap_or_default());
            let section = section.unwrap_or_default();
            (id, AgentResources { section, held })
        })
        .collect()
}

/// One planned grant.
#[derive(Debug, Clone)]
pub(crate) struct PlannedGrant {
    /// The new lease.
    pub lease_id: Uuid,
    /// The task.
    pub task_id: Uuid,
    /// The agent.
    pub agent_id: Uuid,
    /// The task's new token.
    pub fencing_token: i64,
    /// When the lease runs out.
    pub expires_at_ms: i64,
    /// What the lease holds.
    pub claim: Claim,
}

impl PlannedGrant {
    /// The lease this grant writes, as granted at `now_ms`.
    pub(crate) fn lease(&self, now_ms: i64) -> LeaseRecord {
        LeaseRecord {
            id: self.lease_id,
            task_id: self.task_id,
            agent_id: self.agent_id,
            fencing_token: to_u64(self.fencing_token),
            state: LeaseState::Granted,
            granted_at_ms: now_ms,
            acked: false,
            expires_at_ms: self.expires_at_ms,
            ended_by: None,
            claim: self.claim.clone(),
        }
    }
}

/// Decides each grant request against the agents' free slots, their
/// resources and the task rows read under lock: a task is granted at most
/// once per batch, an agent never beyond its free slots (`free`: agent id to
/// free slots; an agent missing from it is unknown), and a claim of more
/// than slots only if its devices are free and its amounts within the
/// agent's offer beside what its leases and the batch's earlier grants hold
/// (`resources`, read for the agents such claims name).
pub(crate) fn plan_grants(
    requests: &[GrantRequest],
    free: &HashMap<Uuid, i64>,
    resources: &mut HashMap<Uuid, AgentResources>,
    tasks: &HashMap<Uuid, GrantableTask>,
    now_ms: i64,
) -> Vec<Result<PlannedGrant, GrantRefusal>> {
    let mut free = free.clone();
    let mut taken: HashSet<Uuid> = HashSet::new();
    requests
        .iter()
        .map(|request| {
            // The task first: a backend reads only the agents of the tasks
            // it could lock, so a task another transaction holds (another
            // replica granting it) leaves its agent unread.
            let task = match tasks.get(&request.task_id) {
                Some(task) if task.state == TaskState::Queued => task,
                _ => return Err(GrantRefusal::TaskNotQueued),
            };
            let Some(slots) = free.get_mut(&request.agent_id) else {
                return Err(GrantRefusal::AgentUnknown);
            };
            if taken.contains(&request.task_id) {
                return Err(GrantRefusal::TaskNotQueued);
            }
            if task.not_before_ms > now_ms {
                return Err(GrantRefusal::NotYet);
            }
            let claim = &request.claim;
            if *slots < i64::from(claim.slots.max(1)) {
                return Err(GrantRefusal::AgentAtCapacity);
            }
            if !claim.is_one_slot() {
                let agent = resources
                    .get_mut(&request.agent_id)
                    .ok_or(GrantRefusal::ResourcesTaken)?;
                resources::recheck(claim, &Offer::of_section(&agent.section), &agent.held)
                    .map_err(|_| GrantRefusal::ResourcesTaken)?;
                agent.held.hold(request.task_id, claim.clone());
            }
            *slots -= i64::from(claim.slots.max(1));
            taken.insert(request.task_id);
            Ok(PlannedGrant {
                lease_id: Uuid::now_v7(),
                task_id: request.task_id,
                agent_id: request.agent_id,
                fencing_token: task.fencing_token + 1,
                expires_at_ms: now_ms.saturating_add(task.lease_ttl_ms),
                claim: Claim {
                    slots: claim.slots.max(1),
                    ..claim.clone()
                },
            })
        })
        .collect()
}

/// How an accepted final report changes its lease and task.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SettledAttempt {
    /// The lease's end state (`completed` or `released`).
    pub lease_state: LeaseState,
    /// Recorded on the lease to recognise a repeated report.
    pub ended_by: LeaseEnd,
    /// The task's next state.
    pub task_state: TaskState,
    /// The task's attempts after the report.
    pub attempts: u32,
    /// The task's releases after the report.
    pub releases: u32,
    /// The agent refused the task (it cannot handle or decode it): why,
    /// recorded so it is not offered the task again until it changes.
    pub refusal: Option<String>,
    /// The task's `not_before` after the report (the backoff of a retry).
    pub not_before_ms: i64,
    /// The handler's output, for a success.
    pub result: Option<Value>,
    /// The failure, for a failed attempt.
    pub error: Option<Value>,
    /// The history entry's kind.
    pub event_kind: &'static str,
    /// The history entry's message.
    pub message: String,
}

/// What a final report does, decided from the task and lease read under
/// lock.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CompletionPlan {
    /// The same final report again: acknowledge, change nothing.
    Duplicate,
    /// Accepted: end the lease and settle the task.
    Settle(SettledAttempt),
}

/// Decides a final report. `lease` is the named lease, if it exists.
/// Refusals (stale token, lease not held, lease already ended otherwise)
/// change nothing.
///
/// A success or failure reported after a cancel was requested is still
/// recorded, because the work did finish: a success makes the task
/// SUCCEEDED with its result, a failure makes it CANCELED (with the error
/// kept) rather than retrying work nobody wants.
pub(crate) fn plan_completion(
    task: &TaskRecord,
    lease: Option<&LeaseRecord>,
    completion: &Completion,
    options: &StoreOptions,
    now_ms: i64,
) -> Result<CompletionPlan> {
    let lease = check_holder(
        task,
        lease,
        completion.lease_id,
        completion.agent_id,
        completion.fencing_token,
    )?;
    let ended_by = completion.outcome.end();
    if !lease.state.is_live() {
        return if lease.ended_by == Some(ended_by) {
            Ok(CompletionPlan::Duplicate)
        } else {
            Err(Error::LeaseNotHeld {
                lease_id: completion.lease_id,
                agent_id: completion.agent_id,
            })
        };
    }
    let settled = match &completion.outcome {
        CompletionOutcome::Succeeded { result } => SettledAttempt {
            lease_state: LeaseState::Completed,
            ended_by,
            task_state: TaskState::Succeeded,
            attempts: task.attempts,
            releases: task.releases,
            refusal: None,
            not_before_ms: task.not_before_ms,
            result: Some(result.clone()),
            error: None,
            event_kind: "succeeded",
            message: "the agent reported success".to_owned(),
        },
        CompletionOutcome::Failed { error, retryable } => {
            failed_attempt(task, error, *retryable, options.backoff_base_ms, now_ms)
        }
        CompletionOutcome::Released { reason, cause } => {
            released(task, reason, *cause, options.max_releases, now_ms)
        }
    };
    Ok(CompletionPlan::Settle(settled))
}

/// A release: CANCELED if a cancel was requested; FAILED once the task was
/// handed back `max_releases` times (no grant and release can cycle for
/// ever); otherwise back in the queue, at once or after a jittered backoff
/// as the cause says, and refused by this agent if it cannot handle it.
fn released(
    task: &TaskRecord,
    reason: &str,
    cause: ReleaseCause,
    max_releases: u32,
    now_ms: i64,
) -> SettledAttempt {
    let releases = task.releases.saturating_add(1);
    let mut settled = SettledAttempt {
        lease_state: LeaseState::Released,
        ended_by: LeaseEnd::Released,
        task_state: TaskState::Queued,
        attempts: task.attempts,
        releases,
        refusal: cause.refuses().then(|| reason.to_owned()),
        not_before_ms: now_ms,
        result: None,
        error: None,
        event_kind: "released",
        message: format!("the agent released the task ({}): {reason}", cause.stored()),
    };
    if task.cancel_requested {
        settled.task_state = TaskState::Canceled;
        settled.event_kind = "canceled";
        settled.refusal = None;
    } else if releases >= max_releases {
        settled.task_state = TaskState::Failed;
        settled.event_kind = "failed";
        settled.not_before_ms = task.not_before_ms;
        settled.error = Some(released_too_often(releases, reason));
        settled.message = format!("{}; released {releases} times, no more", settled.message);
    } else if cause.backs_off() {
        let delay = release_backoff_ms(releases, task.id);
        settled.not_before_ms = now_ms.saturating_add(delay);
        settled.message = format!("{}; offered again in {delay} ms", settled.message);
    }
    settled
}

/// The error document of a task handed back too often.
pub(crate) fn released_too_often(releases: u32, last: &str) -> Value {
    json!({
        "message": format!("released {releases} times without running to the end; last: {last}"),
        "code": "released_too_often",
        "retryable": false,
        "details": {},
    })
}

/// A failed attempt: retried after the backoff of the task's retry policy
/// (or the default from `backoff_base_ms`) while attempts remain and the
/// failure is retryable, CANCELED if a cancel was requested, FAILED
/// otherwise.
fn failed_attempt(
    task: &TaskRecord,
    error: &Value,
    retryable: bool,
    backoff_base_ms: i64,
    now_ms: i64,
) -> SettledAttempt {
    let attempts = task.attempts.saturating_add(1);
    let (task_state, not_before_ms, event_kind, message) = if task.cancel_requested {
        (
            TaskState::Canceled,
            task.not_before_ms,
            "canceled",
            "the attempt failed after a cancel was requested".to_owned(),
        )
    } else if retryable && attempts < task.max_attempts {
        let policy = task
            .retry
            .unwrap_or_else(|| RetryPolicy::default_from(backoff_base_ms));
        let delay = policy.delay_ms(attempts, task.id);
        (
            TaskState::Queued,
            now_ms.saturating_add(delay),
            "attempt_failed",
            format!("attempt {attempts} failed; retrying in {delay} ms"),
        )
    } else {
        (
            TaskState::Failed,
            task.not_before_ms,
            "failed",
            format!("attempt {attempts} failed; no attempts left or not retryable"),
        )
    };
    SettledAttempt {
        lease_state: LeaseState::Completed,
        ended_by: LeaseEnd::Failed,
        task_state,
        attempts,
        releases: task.releases,
        refusal: None,
        not_before_ms,
        result: None,
        error: Some(error.clone()),
        event_kind,
        message,
    }
}

/// Checks that a report comes from the task's live lease holder: the
/// current token, the named lease of this task, held by the reporting agent.
pub(crate) fn check_holder<'l>(
    task: &TaskRecord,
    lease: Option<&'l LeaseRecord>,
    lease_id: Uuid,
    agent_id: Uuid,
    fencing_token: u64,
) -> Result<&'l LeaseRecord> {
    if fencing_token != task.fencing_token {
        return Err(Error::StaleFencingToken {
            task_id: task.id,
            presented: fencing_token,
            current: task.fencing_token,
        });
    }
    match lease {
        Some(lease)
            if lease.id == lease_id
                && lease.task_id == task.id
                && lease.agent_id == agent_id
                && lease.fencing_token == fencing_token =>
        {
            Ok(lease)
        }
        _ => Err(Error::LeaseNotHeld { lease_id, agent_id }),
    }
}

/// The attempt a whole fresh report batch settles: `accepted`, `started`
/// and a final report of a lease just granted, planned as if the first two
/// had been applied (the task RUNNING, the lease ACTIVE). `None` when the
/// lease is not freshly granted to the reporter, or the final report is
/// refused or repeated: the caller applies the reports one by one.
pub(crate) fn plan_whole_attempt(
    task: &TaskRecord,
    lease: &LeaseRecord,
    completion: &Completion,
    options: &StoreOptions,
    now_ms: i64,
) -> Option<(TaskRecord, LeaseRecord, SettledAttempt)> {
    let fresh = lease.state == LeaseState::Granted
        && task.state == TaskState::Leased
        && check_holder(
            task,
            Some(lease),
            completion.lease_id,
            completion.agent_id,
            completion.fencing_token,
        )
        .is_ok();
    if !fresh {
        return None;
    }
    let (running, active) = started(task, lease);
    match plan_completion(&running, Some(&active), completion, options, now_ms) {
        Ok(CompletionPlan::Settle(settled)) => Some((running, active, settled)),
        _ => None,
    }
}

/// The task and lease as an `accepted` and a `started` report leave them.
pub(crate) fn started(task: &TaskRecord, lease: &LeaseRecord) -> (TaskRecord, LeaseRecord) {
    (
        TaskRecord {
            state: TaskState::Running,
            ..task.clone()
        },
        LeaseRecord {
            state: LeaseState::Active,
            acked: true,
            ..lease.clone()
        },
    )
}
