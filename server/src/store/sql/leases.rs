//! Leases: granted (row by row, for a backend without a set-based grant),
//! acknowledged, renewed, ended, and reclaimed by the server when they
//! expire, are never acknowledged, or pass a deadline (an execution
//! timeout, a cancel's grace, a drain's deadline).

use std::collections::HashMap;

use uuid::Uuid;

use super::db::{Cols, SqlDb, StatementExt, built, placeholders, query};
use super::history::{self, Entry};
use super::rows::{self, LEASE_COLUMNS};
use super::tasks::{self, Settlement};
use super::{Dialect, Write};
use crate::error::{Error, Result};
use crate::model::{
    EndedLease, GrantRequest, LeaseEnd, LeaseRecord, LeaseState, RenewedLease, RetryPolicy,
    RevocationCause, StoreEvent, TaskRecord, TaskState,
};
use crate::store::StoreOptions;
use crate::store::plan::{
    AgentResources, GrantableTask, agent_resources, claiming_agents, db, lease_lost_error,
    released_too_often, to_i64,
};
use serde_json::Value;
use sqlx::types::Json;
use switchyard_core::resources::Claim;

const BY_ID: &str = const_format::concatcp!("SELECT ", LEASE_COLUMNS, " FROM leases WHERE id = $1");

/// Reads a lease.
pub(crate) async fn fetch<DB: SqlDb>(
    conn: &mut DB::Connection,
    lease_id: Uuid,
) -> Result<Option<LeaseRecord>> {
    let row = query::<DB>(BY_ID)
        .arg(lease_id)
        .optional(conn)
        .await
        .map_err(db("reading a lease"))?;
    row.as_ref().map(rows::lease::<DB>).transpose()
}

/// Reads a lease that must exist.
pub(crate) async fn must_fetch<DB: SqlDb>(
    conn: &mut DB::Connection,
    lease_id: Uuid,
) -> Result<LeaseRecord> {
    fetch::<DB>(conn, lease_id)
        .await?
        .ok_or_else(|| Error::NotFound {
            what: "lease",
            id: lease_id.to_string(),
        })
}

const LIVE_OF: &str = const_format::concatcp!(
    "SELECT ",
    LEASE_COLUMNS,
    " FROM leases WHERE agent_id = $1 AND state IN ('granted', 'active') \
     ORDER BY granted_at_ms, id"
);

/// The agent's live leases, oldest first.
pub(crate) async fn live_of<DB: SqlDb>(
    conn: &mut DB::Connection,
    agent_id: Uuid,
) -> Result<Vec<LeaseRecord>> {
    let rows = query::<DB>(LIVE_OF)
        .arg(agent_id)
        .all(conn)
        .await
        .map_err(db("listing an agent's leases"))?;
    rows::all::<DB, _>(&rows, rows::lease::<DB>)
}

/// The rows of `select` (a statement ending in `IN (`, closed here) for
/// `ids`, 500 ids a statement.
async fn rows_in<DB: SqlDb>(
    conn: &mut DB::Connection,
    select: &str,
    ids: &[Uuid],
    context: &'static str,
) -> Result<Vec<DB::Row>> {
    let mut out = Vec::new();
    for chunk in ids.chunks(500) {
        let mut statement = built::<DB>(format!("{select}{})", placeholders(1, chunk.len())));
        for id in chunk {
            statement = statement.arg(*id);
        }
        out.extend(statement.all(conn).await.map_err(db(context))?);
    }
    Ok(out)
}

/// What each agent's live leases hold, by task (absent: nothing);
/// `claimed_only` leaves out leases that hold slots alone.
pub(crate) async fn live_claims<DB: SqlDb>(
    conn: &mut DB::Connection,
    agent_ids: &[Uuid],
    claimed_only: bool,
) -> Result<HashMap<Uuid, Vec<(Uuid, Claim)>>> {
    let select = if claimed_only {
        "SELECT agent_id, task_id, slots, claim FROM leases WHERE state IN ('granted', 'active') \
         AND claim IS NOT NULL AND agent_id IN ("
    } else {
        "SELECT agent_id, task_id, slots, claim FROM leases WHERE state IN ('granted', 'active') \
         AND agent_id IN ("
    };
    let mut claims: HashMap<Uuid, Vec<(Uuid, Claim)>> = HashMap::new();
    for row in &rows_in::<DB>(conn, select, agent_ids, "reading live leases' claims").await? {
        let cols = Cols::<DB>::new(row, "reading a live lease's claim");
        let claim = rows::claim(cols.get("slots")?, cols.get("claim")?)?;
        claims
            .entry(cols.get("agent_id")?)
            .or_default()
            .push((cols.get("task_id")?, claim));
    }
    Ok(claims)
}

/// The offers and held resources of the agents `requests` claim more than
/// slots of (see `plan_grants`), read in the grant's transaction after the
/// agents were locked; empty when every request claims slots alone.
pub(crate) async fn claimed_resources<DB: SqlDb>(
    conn: &mut DB::Connection,
    requests: &[GrantRequest],
) -> Result<HashMap<Uuid, AgentResources>> {
    let agent_ids = claiming_agents(requests);
    if agent_ids.is_empty() {
        return Ok(HashMap::new());
    }
    let select = "SELECT id, resources FROM agents WHERE id IN (";
    let mut sections = Vec::new();
    for row in &rows_in::<DB>(conn, select, &agent_ids, "reading agents' resources").await? {
        let cols = Cols::<DB>::new(row, "reading an agent's resources");
        let section: Option<Json<Value>> = cols.get("resources")?;
        sections.push((cols.get::<Uuid>("id")?, section.map(|s| s.0)));
    }
    let claims = live_claims::<DB>(conn, &agent_ids, true).await?;
    Ok(agent_resources(sections, claims))
}

/// A task row of the columns a grant reads (`state`, `not_before_ms`,
/// `fencing_token`, `lease_ttl_ms`, `namespace`, `concurrency_key`,
/// `priority`, `fair_rank`).
pub(crate) fn grantable_task<DB: SqlDb>(row: &DB::Row) -> Result<GrantableTask> {
    const CONTEXT: &str = "reading a task to grant";
    let cols = Cols::<DB>::new(row, CONTEXT);
    Ok(GrantableTask {
        state: rows::stored::<TaskState>(&cols.get::<String>("state")?, CONTEXT)?,
        not_before_ms: cols.get("not_before_ms")?,
        fencing_token: cols.get("fencing_token")?,
        lease_ttl_ms: cols.get("lease_ttl_ms")?,
        namespace: cols.get("namespace")?,
        concurrency_key: cols.get("concurrency_key")?,
        priority: cols.get("priority")?,
        fair_rank: cols.get("fair_rank")?,
    })
}

const ACK: &str = "UPDATE leases SET state = 'active', acked = TRUE WHERE id = $1 \
    AND agent_id = $2 AND fencing_token = $3 AND state = 'granted'";

/// The agent acknowledged these grants; how many it still held.
pub(crate) async fn ack<DB: Dialect>(
    w: &mut Write<DB>,
    agent_id: Uuid,
    leases: &[(Uuid, u64)],
    now_ms: i64,
) -> Result<u64> {
    let mut acked = 0;
    for (lease_id, token) in leases {
        let Some(lease) = fetch::<DB>(w.conn(), *lease_id).await? else {
            continue;
        };
        let task = tasks::lock(w, lease.task_id).await?;
        let done = query::<DB>(ACK)
            .arg(*lease_id)
            .arg(agent_id)
            .arg(to_i64(*token))
            .run(w.conn())
            .await
            .map_err(db("acknowledging a lease"))?;
        if done == 1 {
            acked += 1;
            let entry = Entry::of(
                task.id,
                "accepted",
                task.state,
                "the agent acknowledged the lease",
            )
            .by(agent_id, *lease_id);
            history::append(w, entry, now_ms).await?;
        }
    }
    Ok(acked)
}

/// Renews the live leases of the agent (`$1`) to `$2` plus their task's
/// TTL; answers each with its new expiry.
pub(crate) const RENEW: &str = "UPDATE leases SET expires_at_ms = $2 + \
    (SELECT t.lease_ttl_ms FROM tasks t WHERE t.id = leases.task_id) \
    WHERE agent_id = $1 AND state IN ('granted', 'active') \
    RETURNING id, task_id, expires_at_ms";

/// Renews every live lease of the agent; each with its new expiry.
pub(crate) async fn renew<DB: SqlDb>(
    w: &mut Write<DB>,
    agent_id: Uuid,
    now_ms: i64,
) -> Result<Vec<RenewedLease>> {
    let rows = query::<DB>(RENEW)
        .arg(agent_id)
        .arg(now_ms)
        .all(w.conn())
        .await
        .map_err(db("renewing leases"))?;
    rows.iter()
        .map(|row| {
            let cols = Cols::<DB>::new(row, "reading a renewed lease");
            Ok(RenewedLease {
                lease_id: cols.get("id")?,
                task_id: cols.get("task_id")?,
                expires_at_ms: cols.get("expires_at_ms")?,
            })
        })
        .collect()
}

const END: &str = "UPDATE leases SET state = $2, outcome = $3, ended_at_ms = $4 \
    WHERE id = $1 AND state IN ('granted', 'active') \
    AND ($5 IS NULL OR (expires_at_ms <= $5 AND acked = $6))";

/// Ends a live lease, recording what ended it; false if it was no longer
/// live (another transition got there first) or, for an expiry, was
/// renewed or acknowledged meanwhile (whether it was decides whether the
/// expiry counts an attempt).
pub(crate) async fn end<DB: SqlDb>(
    w: &mut Write<DB>,
    lease: &LeaseRecord,
    state: LeaseState,
    ended_by: LeaseEnd,
    now_ms: i64,
) -> Result<bool> {
    let due_by = (ended_by == LeaseEnd::Expired).then_some(now_ms);
    let done = query::<DB>(END)
        .arg(lease.id)
        .text(state.as_str())
        .text(ended_by.as_str())
        .arg(now_ms)
        .arg(due_by)
        .arg(lease.acked)
        .run(w.conn())
        .await
        .map_err(db("ending a lease"))?;
    Ok(done == 1)
}

/// How the server ends a lease it reclaims.
#[derive(Debug, Clone, Copy)]
struct Reclaim {
    /// The lease's end state.
    state: LeaseState,
    /// What ended it.
    ended_by: LeaseEnd,
    /// Whether the attempt counts against the budget.
    count_attempt: bool,
    /// The history kind of a task that goes back to the queue.
    requeued_as: &'static str,
    /// The error code of an attempt that failed by the reclaim (it then
    /// backs off by the task's retry policy); `None` for a lease lost
    /// (an expiry, retried at once) or a hand-back.
    fails_as: Option<&'static str>,
    /// Why, for the history.
    reason: &'static str,
    /// What its holder is told, through every replica's events; `None`
    /// for an expiry, which the holder's replica tells from `LeaseEnded`.
    revoked_as: Option<RevocationCause>,
}

const EXPIRED: Reclaim = Reclaim {
    state: LeaseState::Expired,
    ended_by: LeaseEnd::Expired,
    count_attempt: true,
    requeued_as: "lease_expired",
    fails_as: None,
    reason: "the lease expired",
    revoked_as: None,
};

/// An expiry of a grant the agent never acknowledged: like a revocation
/// of one ([`UNACKNOWLEDGED`]), a release rather than an attempt (the
/// agent never held the task), though the lease ends expired.
const EXPIRED_UNACKNOWLEDGED: Reclaim = Reclaim {
    count_attempt: false,
    reason: "the lease expired before the agent acknowledged it",
    ..EXPIRED
};

const UNACKNOWLEDGED: Reclaim = Reclaim {
    state: LeaseState::Released,
    ended_by: LeaseEnd::Unacknowledged,
    count_attempt: false,
    requeued_as: "released",
    fails_as: None,
    reason: "the agent never acknowledged the lease",
    revoked_as: Some(RevocationCause::Unacknowledged),
};

const TIMED_OUT: Reclaim = Reclaim {
    state: LeaseState::Released,
    ended_by: LeaseEnd::TimedOut,
    count_attempt: true,
    requeued_as: "timed_out",
    fails_as: Some("timeout"),
    reason: "the attempt ran past its execution timeout",
    revoked_as: Some(RevocationCause::Timeout),
};

const CANCEL_GRACE: Reclaim = Reclaim {
    state: LeaseState::Released,
    ended_by: LeaseEnd::Revoked,
    count_attempt: false,
    requeued_as: "released",
    fails_as: None,
    reason: "the cancel's grace ran out",
    revoked_as: Some(RevocationCause::Canceled),
};

const DRAIN_DEADLINE: Reclaim = Reclaim {
    state: LeaseState::Released,
    ended_by: LeaseEnd::Revoked,
    count_attempt: false,
    requeued_as: "revoked",
    fails_as: None,
    reason: "the agent's drain deadline passed",
    revoked_as: Some(RevocationCause::DrainDeadline),
};

/// The attempts of a task that were lost: acknowledged leases that
/// expired.
const COUNT_LOST: &str =
    "SELECT COUNT(*) AS n FROM leases WHERE task_id = $1 AND state = 'expired' AND acked";

/// The server ends a live lease: the task goes back to QUEUED (with one
/// more attempt when the reclaim counts one, one more release when it does
/// not), or FAILED at the budget of either, or CANCELED if a cancel was
/// requested. `None` if the lease was no longer live.
async fn reclaim<DB: Dialect>(
    w: &mut Write<DB>,
    lease_id: Uuid,
    how: Reclaim,
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Option<(LeaseRecord, TaskRecord)>> {
    let Some(lease) = fetch::<DB>(w.conn(), lease_id).await? else {
        return Ok(None);
    };
    // One rule for what counts as an attempt: a lease the agent
    // acknowledged. A grant that ends unacknowledged is a release however
    // it ends.
    let how = if how.ended_by == LeaseEnd::Expired && !lease.acked {
        EXPIRED_UNACKNOWLEDGED
    } else {
        how
    };
    let task = tasks::lock(w, lease.task_id).await?;
    if !end(w, &lease, how.state, how.ended_by, now_ms).await? {
        return Ok(None);
    }
    if task.lease_id == Some(lease_id) {
        let error;
        let (next, kind, mut message) = settle_reclaimed(&task, how, options.max_releases);
        let mut next = match (next.state, how.fails_as) {
            (TaskState::Failed | TaskState::Queued, Some(code)) => {
                error = failed_by_reclaim(&task, how, code);
                Settlement {
                    error: Some(&error),
                    ..next
                }
            }
            (TaskState::Failed, None) if how.count_attempt => {
                let lost = count_lost::<DB>(w, task.id).await?;
                error = lease_lost_error(lost);
                message = format!("{}; lease lost {lost} times, no attempts left", how.reason);
                Settlement {
                    error: Some(&error),
                    ..next
                }
            }
            (TaskState::Failed, None) => {
                error = released_too_often(next.releases, how.reason);
                Settlement {
                    error: Some(&error),
                    ..next
                }
            }
            _ => next,
        };
        match (next.state, how.fails_as) {
            (TaskState::Queued, Some(_)) => {
                let delay = task
                    .retry
                    .unwrap_or_else(|| RetryPolicy::default_from(options.backoff_base_ms))
                    .delay_ms(next.attempts, task.id);
                next.not_before_ms = now_ms.saturating_add(delay);
                message = format!("{message}; retrying in {delay} ms");
            }
            (TaskState::Queued, None) => next.not_before_ms = now_ms,
            (TaskState::Failed, Some(_)) => {
                message = format!("{}; no attempts left", how.reason);
            }
            _ => {}
        }
        tasks::settle(w, &task, next, now_ms).await?;
        let entry = Entry::of(task.id, kind, next.state, &message).by(lease.agent_id, lease_id);
        history::append(w, entry, now_ms).await?;
    }
    reclaimed(w, lease_id, task.id, how, lease.agent_id).await
}

/// The error document of an attempt a reclaim failed (an execution
/// timeout).
fn failed_by_reclaim(task: &TaskRecord, how: Reclaim, code: &str) -> Value {
    let mut details = serde_json::Map::new();
    if let Some(ms) = task.deadlines.execution_timeout_ms {
        details.insert("execution_timeout_ms".to_owned(), ms.into());
    }
    serde_json::json!({
        "message": how.reason,
        "code": code,
        "retryable": true,
        "details": details,
    })
}

/// Where a reclaimed task goes (before the error of a FAILED one), its
/// history kind and message.
fn settle_reclaimed(
    task: &TaskRecord,
    how: Reclaim,
    max_releases: u32,
) -> (Settlement<'static>, &'static str, String) {
    let attempts = task.attempts + u32::from(how.count_attempt);
    let releases = task.releases + u32::from(!how.count_attempt);
    let keep = |state| Settlement {
        state,
        attempts,
        releases,
        not_before_ms: task.not_before_ms,
        result: None,
        error: None,
    };
    if task.cancel_requested {
        let message = format!("{} after a cancel was requested", how.reason);
        (keep(TaskState::Canceled), "canceled", message)
    } else if how.count_attempt && attempts >= task.max_attempts {
        (keep(TaskState::Failed), "failed", String::new())
    } else if !how.count_attempt && releases >= max_releases {
        let message = format!("{}; handed back {releases} times, no more", how.reason);
        (keep(TaskState::Failed), "failed", message)
    } else {
        (
            keep(TaskState::Queued),
            how.requeued_as,
            how.reason.to_owned(),
        )
    }
}

/// How many leases of the task expired.
async fn count_lost<DB: SqlDb>(w: &mut Write<DB>, task_id: Uuid) -> Result<i64> {
    let row = query::<DB>(COUNT_LOST)
        .arg(task_id)
        .optional(w.conn())
        .await
        .map_err(db("counting lost leases"))?;
    match row {
        Some(row) => Cols::<DB>::new(&row, "counting lost leases").get("n"),
        None => Ok(0),
    }
}

/// The lease and task as a reclaim left them, with the revocation
/// announced to the holder's replica.
async fn reclaimed<DB: SqlDb>(
    w: &mut Write<DB>,
    lease_id: Uuid,
    task_id: Uuid,
    how: Reclaim,
    agent_id: Uuid,
) -> Result<Option<(LeaseRecord, TaskRecord)>> {
    if let Some(cause) = how.revoked_as {
        w.announce(StoreEvent::LeaseRevoked {
            lease_id,
            task_id,
            agent_id,
            cause: Some(cause),
            reason: how.reason.to_owned(),
        });
    }
    let lease = must_fetch::<DB>(w.conn(), lease_id).await?;
    Ok(Some((
        lease,
        tasks::must_fetch::<DB>(w.conn(), task_id).await?,
    )))
}

/// Expires lapsed live leases (see `LeaseStore::expire_leases`).
pub(crate) async fn expire<DB: Dialect>(
    w: &mut Write<DB>,
    now_ms: i64,
    limit: u32,
    options: &StoreOptions,
) -> Result<Vec<(LeaseRecord, TaskRecord)>> {
    let due = lease_ids::<DB>(
        query::<DB>(DB::DUE_LEASES)
            .arg(now_ms)
            .arg(i64::from(limit))
            .all(w.conn())
            .await
            .map_err(db("finding expired leases"))?,
    )?;
    let mut reclaimed = Vec::new();
    for lease_id in due {
        if let Some(pair) = reclaim(w, lease_id, EXPIRED, options, now_ms).await? {
            w.announce(StoreEvent::LeaseEnded {
                agent_id: pair.0.agent_id,
                task_id: Some(pair.0.task_id),
                expired: Some(EndedLease {
                    lease_id: pair.0.id,
                    task_id: pair.0.task_id,
                }),
            });
            reclaimed.push(pair);
        }
    }
    Ok(reclaimed)
}

/// Revokes grants never acknowledged (see `LeaseStore::revoke_unacked`).
pub(crate) async fn revoke_unacked<DB: Dialect>(
    w: &mut Write<DB>,
    agent_id: Option<Uuid>,
    older_than_ms: i64,
    now_ms: i64,
    options: &StoreOptions,
) -> Result<Vec<(LeaseRecord, TaskRecord)>> {
    let due = lease_ids::<DB>(
        query::<DB>(DB::UNACKED_LEASES)
            .arg(older_than_ms)
            .arg(agent_id)
            .all(w.conn())
            .await
            .map_err(db("finding unacknowledged leases"))?,
    )?;
    let mut revoked = Vec::new();
    for lease_id in due {
        if let Some(pair) = reclaim(w, lease_id, UNACKNOWLEDGED, options, now_ms).await? {
            w.announce(StoreEvent::LeaseEnded {
                agent_id: pair.0.agent_id,
                task_id: Some(pair.0.task_id),
                expired: None,
            });
            revoked.push(pair);
        }
    }
    Ok(revoked)
}

/// Live leases past a deadline, in task order: an attempt past its
/// execution timeout, a cancel-requested lease past its grace, a lease of an
/// agent past its drain deadline. Each arm reads through a partial index
/// holding only the rows with such a deadline.
const OVERDUE: &str = "SELECT id, task_id FROM (\
    SELECT l.id, l.task_id FROM tasks t JOIN leases l ON l.id = t.lease_id \
    WHERE t.execution_timeout_ms IS NOT NULL AND t.state IN ('leased', 'running') \
    AND l.state IN ('granted', 'active') AND l.granted_at_ms + t.execution_timeout_ms <= $1 \
    UNION SELECT l.id, l.task_id FROM tasks t JOIN leases l ON l.id = t.lease_id \
    WHERE t.cancel_deadline_ms IS NOT NULL AND t.state IN ('leased', 'running') \
    AND l.state IN ('granted', 'active') AND t.cancel_deadline_ms <= $1 \
    UNION SELECT l.id, l.task_id FROM agents a JOIN leases l ON l.agent_id = a.id \
    WHERE a.drain_deadline_ms IS NOT NULL AND a.drain_deadline_ms <= $1 \
    AND l.state IN ('granted', 'active')) overdue ORDER BY task_id LIMIT $2";

const DRAIN_DEADLINE_OF: &str = "SELECT drain_deadline_ms FROM agents WHERE id = $1";

/// Ends the live leases past a deadline (see `LeaseStore::reclaim_overdue`),
/// each by the deadline that passed, checked again with its task locked: a
/// cancel's grace first, then the execution timeout, then the drain.
pub(crate) async fn reclaim_overdue<DB: Dialect>(
    w: &mut Write<DB>,
    now_ms: i64,
    limit: u32,
    options: &StoreOptions,
) -> Result<Vec<(LeaseRecord, TaskRecord, RevocationCause)>> {
    let due = lease_ids::<DB>(
        query::<DB>(OVERDUE)
            .arg(now_ms)
            .arg(i64::from(limit))
            .all(w.conn())
            .await
            .map_err(db("finding leases past a deadline"))?,
    )?;
    let mut reclaimed = Vec::new();
    for lease_id in due {
        let Some(lease) = fetch::<DB>(w.conn(), lease_id).await? else {
            continue;
        };
        let task = tasks::lock(w, lease.task_id).await?;
        let passed = |deadline: Option<i64>| deadline.is_some_and(|at| at <= now_ms);
        let how = if task.cancel_requested && passed(task.cancel_deadline_ms) {
            CANCEL_GRACE
        } else if passed(
            task.deadlines
                .execution_timeout_ms
                .map(|t| lease.granted_at_ms.saturating_add(t)),
        ) {
            TIMED_OUT
        } else if passed(drain_deadline_of::<DB>(w, lease.agent_id).await?) {
            DRAIN_DEADLINE
        } else {
            continue;
        };
        let cause = how.revoked_as.unwrap_or(RevocationCause::Canceled);
        if let Some((lease, task)) = reclaim(w, lease_id, how, options, now_ms).await? {
            w.announce(StoreEvent::LeaseEnded {
                agent_id: lease.agent_id,
                task_id: Some(lease.task_id),
                expired: None,
            });
            reclaimed.push((lease, task, cause));
        }
    }
    Ok(reclaimed)
}

/// An agent's drain deadline, if it has one.
async fn drain_deadline_of<DB: SqlDb>(w: &mut Write<DB>, agent_id: Uuid) -> Result<Option<i64>> {
    let row = query::<DB>(DRAIN_DEADLINE_OF)
        .arg(agent_id)
        .optional(w.conn())
        .await
        .map_err(db("reading a drain deadline"))?;
    match row {
        Some(row) => Cols::<DB>::new(&row, "reading a drain deadline").get("drain_deadline_ms"),
        None => Ok(None),
    }
}

/// The `id` column of every row.
fn lease_ids<DB: SqlDb>(rows: Vec<DB::Row>) -> Result<Vec<Uuid>> {
    rows.iter()
        .map(|row| Cols::<DB>::new(row, "reading a lease id").get("id"))
        .collect()
}

const FAILED_AGENTS: &str = "SELECT DISTINCT agent_id FROM leases \
    WHERE task_id = $1 AND (outcome IN ('failed', 'timed_out') OR (outcome = 'expired' AND acked)) \
    ORDER BY agent_id";

/// The agents on which attempts of a task failed or expired (an attempt:
/// a lease the agent acknowledged).
pub(crate) async fn failed_agents<DB: SqlDb>(
    conn: &mut DB::Connection,
    task_id: Uuid,
) -> Result<Vec<Uuid>> {
    let rows = query::<DB>(FAILED_AGENTS)
        .arg(task_id)
        .all(conn)
        .await
        .map_err(db("reading the agents a task failed on"))?;
    rows.iter()
        .map(|row| Cols::<DB>::new(row, "reading a failed attempt").get("agent_id"))
        .collect()
}
