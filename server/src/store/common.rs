//! What the two backends share: the task, lease and agent transitions written
//! once as SQL both PostgreSQL and SQLite understand (`$N` parameters,
//! `RETURNING`, `ON CONFLICT`), instantiated per backend by
//! [`store_common!`], plus the pure helpers they use (grant planning, cursors,
//! integer conversions). Each transition runs inside a transaction the
//! backend opened, locks its task row first (PostgreSQL `FOR UPDATE`; SQLite
//! serialises writers with `BEGIN IMMEDIATE`), appends the task's history in
//! the same transaction and collects the [`StoreEvent`]s to announce once the
//! backend commits.
//!
//! Lock order, to keep PostgreSQL free of deadlocks: grants lock agent rows
//! (sorted by id) and then skip task rows that are locked; every other
//! transition locks task rows (in task id order within a batch), then lease
//! rows, and never agent rows: an agent's load is the count of its live
//! leases, so final reports and grants never queue on one agent row.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use uuid::Uuid;

use super::model::{
    Completion, CompletionOutcome, GrantRefusal, GrantRequest, LeaseRecord, LeaseState, TaskRecord,
    TaskState, backoff_ms,
};
use crate::error::{Error, Result};

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
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrantableTask {
    /// The state read under lock.
    pub state: TaskState,
    /// Not leased before this.
    pub not_before_ms: i64,
    /// The last token issued.
    pub fencing_token: i64,
    /// For the lease's expiry.
    pub lease_ttl_ms: i64,
}

/// One planned grant.
#[derive(Debug, Clone, Copy)]
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
}

/// Decides each grant request against the agent rows (`capacity`,
/// `active_leases`) and task rows read under lock: a task is granted at most
/// once per batch, an agent never beyond its capacity.
pub(crate) fn plan_grants(
    requests: &[GrantRequest],
    agents: &HashMap<Uuid, (i64, i64)>,
    tasks: &HashMap<Uuid, GrantableTask>,
    now_ms: i64,
) -> Vec<Result<PlannedGrant, GrantRefusal>> {
    let mut free: HashMap<Uuid, i64> = agents
        .iter()
        .map(|(id, (capacity, active))| (*id, capacity - active))
        .collect();
    let mut taken: HashSet<Uuid> = HashSet::new();
    requests
        .iter()
        .map(|request| {
            let Some(slots) = free.get_mut(&request.agent_id) else {
                return Err(GrantRefusal::AgentUnknown);
            };
            let task = match tasks.get(&request.task_id) {
                Some(task) if task.state == TaskState::Queued => task,
                _ => return Err(GrantRefusal::TaskNotQueued),
            };
            if taken.contains(&request.task_id) {
                return Err(GrantRefusal::TaskNotQueued);
            }
            if task.not_before_ms > now_ms {
                return Err(GrantRefusal::NotYet);
            }
            if *slots <= 0 {
                return Err(GrantRefusal::AgentAtCapacity);
            }
            *slots -= 1;
            taken.insert(request.task_id);
            Ok(PlannedGrant {
                lease_id: Uuid::now_v7(),
                task_id: request.task_id,
                agent_id: request.agent_id,
                fencing_token: task.fencing_token + 1,
                expires_at_ms: now_ms.saturating_add(task.lease_ttl_ms),
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
    pub outcome: &'static str,
    /// The task's next state.
    pub task_state: TaskState,
    /// The task's attempts after the report.
    pub attempts: u32,
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

/// Decides a final report. `lease` is the named lease with the outcome
/// recorded on it, if it exists. Refusals (stale token, lease not held,
/// lease already ended otherwise) change nothing.
///
/// A success or failure reported after a cancel was requested is still
/// recorded, because the work did finish: a success makes the task
/// SUCCEEDED with its result, a failure makes it CANCELED (with the error
/// kept) rather than retrying work nobody wants.
pub(crate) fn plan_completion(
    task: &TaskRecord,
    lease: Option<(&LeaseRecord, Option<&str>)>,
    completion: &Completion,
    backoff_base_ms: i64,
    now_ms: i64,
) -> Result<CompletionPlan> {
    let lease = check_holder(
        task,
        lease.map(|(lease, _)| lease),
        completion.lease_id,
        completion.agent_id,
        completion.fencing_token,
    )
    .map(|_| lease)?;
    let Some((lease, recorded)) = lease else {
        return Err(Error::LeaseNotHeld {
            lease_id: completion.lease_id,
            agent_id: completion.agent_id,
        });
    };
    let outcome = completion.outcome.as_str();
    if !lease.state.is_live() {
        return if recorded == Some(outcome) {
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
            outcome,
            task_state: TaskState::Succeeded,
            attempts: task.attempts,
            not_before_ms: task.not_before_ms,
            result: Some(result.clone()),
            error: None,
            event_kind: "succeeded",
            message: "the agent reported success".to_owned(),
        },
        CompletionOutcome::Failed { error, retryable } => {
            let attempts = task.attempts.saturating_add(1);
            let (task_state, not_before_ms, event_kind, message) = if task.cancel_requested {
                (
                    TaskState::Canceled,
                    task.not_before_ms,
                    "canceled",
                    "the attempt failed after a cancel was requested".to_owned(),
                )
            } else if *retryable && attempts < task.max_attempts {
                let delay = backoff_ms(backoff_base_ms, attempts);
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
                outcome,
                task_state,
                attempts,
                not_before_ms,
                result: None,
                error: Some(error.clone()),
                event_kind,
                message,
            }
        }
        CompletionOutcome::Released { reason } => {
            let (task_state, event_kind) = if task.cancel_requested {
                (TaskState::Canceled, "canceled")
            } else {
                (TaskState::Queued, "released")
            };
            SettledAttempt {
                lease_state: LeaseState::Released,
                outcome,
                task_state,
                attempts: task.attempts,
                not_before_ms: now_ms,
                result: None,
                error: None,
                event_kind,
                message: format!("the agent released the task: {reason}"),
            }
        }
    };
    Ok(CompletionPlan::Settle(settled))
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

/// The SELECT list and FROM clause that read a [`TaskRecord`](super::TaskRecord)
/// (the lease expiry comes from the live lease).
macro_rules! task_select {
    () => {
        "SELECT t.id, t.namespace, t.kind, t.payload, t.placement, t.priority, t.state, \
         t.attempts, t.max_attempts, t.lease_ttl_ms, t.idempotency_key, t.not_before_ms, \
         t.result, t.error, t.fencing_token, t.lease_id, t.agent_id, \
         l.expires_at_ms AS lease_expires_at_ms, t.cancel_requested, t.progress, t.labels, \
         t.created_at_ms, t.updated_at_ms \
         FROM tasks t LEFT JOIN leases l ON l.id = t.lease_id "
    };
}

/// A page of the queue, leasable at `$1`, in namespace `$2` (any if NULL),
/// at most `$3` tasks, within `$range` (a condition on the queue index's
/// leading columns, so the page is one range of `tasks_queue`), leaving out
/// by `$not_parked` the parked placements in `$4` (a JSON array of
/// `[namespace, placement text]` pairs), in queue order.
macro_rules! queue_page {
    ($range:literal, $not_parked:literal) => {
        concat!(
            task_select!(),
            "WHERE t.state = 'queued' AND t.not_before_ms <= $1 \
             AND ($2 IS NULL OR t.namespace = $2) ",
            $range,
            $not_parked,
            " ORDER BY t.priority DESC, t.created_at_ms, t.id LIMIT $3"
        )
    };
}

/// The SELECT list that reads a [`LeaseRecord`](super::LeaseRecord).
macro_rules! lease_columns {
    () => {
        "id, task_id, agent_id, fencing_token, state, granted_at_ms, acked, expires_at_ms"
    };
}

/// The SELECT list that reads an [`AgentRecord`](super::AgentRecord).
macro_rules! agent_columns {
    () => {
        "id, namespace, name, document, provenance, rejections, reported, operator_overrides, \
         generation, status, status_reasons, capacity, \
         (SELECT COUNT(*) FROM leases l WHERE l.agent_id = agents.id \
         AND l.state IN ('granted', 'active')) AS active_leases, drained, labels, runner, \
         session_epoch, last_seen_at_ms, registered_at_ms"
    };
}

pub(crate) use {agent_columns, lease_columns, queue_page, task_select};

/// Expands, inside a backend module, to the transitions both backends share.
/// `$db` is the sqlx database, `$row` its row type, `$conn` its connection
/// type; `$lock_task` is appended to the task SELECT to lock the row
/// (`FOR UPDATE OF t` on PostgreSQL, nothing on SQLite), `$skip_locked` to
/// sweeper candidate queries so replicas sweeping at once share the work,
/// and `$not_parked` is the queue page's condition that leaves out the
/// parked placements in `$4` (see [`queue_page!`]).
macro_rules! store_common {
    ($db:ty, $row:ty, $conn:ty, $lock_task:literal, $skip_locked:literal, $not_parked:literal) => {
        use std::collections::BTreeMap as __BTreeMap;

        use serde_json::Value as __Value;
        use sqlx::Row as _;
        use sqlx::types::Json;
        use uuid::Uuid as __Uuid;

        use $crate::error::{Error as __Error, Result as __Result};
        use $crate::store::common::{
            CompletionPlan, SettledAttempt, agent_columns, check_holder, db,
            lease_columns, lease_lost_error, parse_task_cursor, plan_completion, task_cursor,
            queue_page, task_select, to_i64, to_u32, to_u64,
        };
        use $crate::store::model::*;

        fn corrupt(context: &'static str) -> impl FnOnce(UnknownState) -> __Error {
            move |err| __Error::Corrupt {
                context,
                detail: err.to_string(),
            }
        }

        fn task_from_row(row: &$row) -> __Result<TaskRecord> {
            let get = |source| __Error::Store {
                context: "reading a task row",
                source,
            };
            let state: String = row.try_get("state").map_err(get)?;
            Ok(TaskRecord {
                id: row.try_get("id").map_err(get)?,
                namespace: row.try_get("namespace").map_err(get)?,
                kind: row.try_get("kind").map_err(get)?,
                payload: row.try_get::<Json<__Value>, _>("payload").map_err(get)?.0,
                placement: row.try_get::<Json<__Value>, _>("placement").map_err(get)?.0,
                priority: row.try_get("priority").map_err(get)?,
                state: state.parse().map_err(corrupt("reading a task row"))?,
                attempts: to_u32(row.try_get("attempts").map_err(get)?),
                max_attempts: to_u32(row.try_get("max_attempts").map_err(get)?),
                lease_ttl_ms: row.try_get("lease_ttl_ms").map_err(get)?,
                idempotency_key: row.try_get("idempotency_key").map_err(get)?,
                not_before_ms: row.try_get("not_before_ms").map_err(get)?,
                result: row
                    .try_get::<Option<Json<__Value>>, _>("result")
                    .map_err(get)?
                    .map(|json| json.0),
                error: row
                    .try_get::<Option<Json<__Value>>, _>("error")
                    .map_err(get)?
                    .map(|json| json.0),
                fencing_token: to_u64(row.try_get("fencing_token").map_err(get)?),
                lease_id: row.try_get("lease_id").map_err(get)?,
                agent_id: row.try_get("agent_id").map_err(get)?,
                lease_expires_at_ms: row.try_get("lease_expires_at_ms").map_err(get)?,
                cancel_requested: row.try_get("cancel_requested").map_err(get)?,
                progress: row
                    .try_get::<Option<Json<__Value>>, _>("progress")
                    .map_err(get)?
                    .map(|json| json.0),
                labels: row
                    .try_get::<Json<__BTreeMap<String, String>>, _>("labels")
                    .map_err(get)?
                    .0,
                created_at_ms: row.try_get("created_at_ms").map_err(get)?,
                updated_at_ms: row.try_get("updated_at_ms").map_err(get)?,
            })
        }

        fn lease_from_row(row: &$row) -> __Result<LeaseRecord> {
            let get = |source| __Error::Store {
                context: "reading a lease row",
                source,
            };
            let state: String = row.try_get("state").map_err(get)?;
            Ok(LeaseRecord {
                id: row.try_get("id").map_err(get)?,
                task_id: row.try_get("task_id").map_err(get)?,
                agent_id: row.try_get("agent_id").map_err(get)?,
                fencing_token: to_u64(row.try_get("fencing_token").map_err(get)?),
                state: state.parse().map_err(corrupt("reading a lease row"))?,
                granted_at_ms: row.try_get("granted_at_ms").map_err(get)?,
                acked: row.try_get("acked").map_err(get)?,
                expires_at_ms: row.try_get("expires_at_ms").map_err(get)?,
            })
        }

        fn agent_from_row(row: &$row) -> __Result<AgentRecord> {
            let get = |source| __Error::Store {
                context: "reading an agent row",
                source,
            };
            let json = |name: &str| -> __Result<__Value> {
                Ok(row.try_get::<Json<__Value>, _>(name).map_err(get)?.0)
            };
            Ok(AgentRecord {
                id: row.try_get("id").map_err(get)?,
                namespace: row.try_get("namespace").map_err(get)?,
                name: row.try_get("name").map_err(get)?,
                document: json("document")?,
                provenance: json("provenance")?,
                rejections: json("rejections")?,
                reported: json("reported")?,
                operator_overrides: json("operator_overrides")?,
                generation: to_u64(row.try_get("generation").map_err(get)?),
                status: row.try_get("status").map_err(get)?,
                status_reasons: row
                    .try_get::<Json<Vec<String>>, _>("status_reasons")
                    .map_err(get)?
                    .0,
                capacity: to_u32(row.try_get("capacity").map_err(get)?),
                active_leases: to_u32(row.try_get("active_leases").map_err(get)?),
                drained: row.try_get("drained").map_err(get)?,
                labels: row
                    .try_get::<Json<__BTreeMap<String, String>>, _>("labels")
                    .map_err(get)?
                    .0,
                runner: row.try_get("runner").map_err(get)?,
                session_epoch: to_u64(row.try_get("session_epoch").map_err(get)?),
                last_seen_at_ms: row.try_get("last_seen_at_ms").map_err(get)?,
                registered_at_ms: row.try_get("registered_at_ms").map_err(get)?,
            })
        }

        fn event_from_row(row: &$row) -> __Result<TaskEventRecord> {
            let get = |source| __Error::Store {
                context: "reading a task event row",
                source,
            };
            let state: String = row.try_get("state").map_err(get)?;
            Ok(TaskEventRecord {
                task_id: row.try_get("task_id").map_err(get)?,
                sequence: to_u64(row.try_get("sequence").map_err(get)?),
                kind: row.try_get("kind").map_err(get)?,
                state: state.parse().map_err(corrupt("reading a task event row"))?,
                message: row.try_get("message").map_err(get)?,
                agent_id: row.try_get("agent_id").map_err(get)?,
                lease_id: row.try_get("lease_id").map_err(get)?,
                occurred_at_ms: row.try_get("occurred_at_ms").map_err(get)?,
            })
        }

        /// Reads a task without locking it.
        async fn fetch_task(conn: &mut $conn, task_id: __Uuid) -> __Result<Option<TaskRecord>> {
            let row = sqlx::query(concat!(task_select!(), "WHERE t.id = $1"))
                .bind(task_id)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db("reading a task"))?;
            row.as_ref().map(task_from_row).transpose()
        }

        /// Reads a task that must exist.
        async fn must_fetch_task(conn: &mut $conn, task_id: __Uuid) -> __Result<TaskRecord> {
            fetch_task(conn, task_id)
                .await?
                .ok_or_else(|| __Error::NotFound {
                    what: "task",
                    id: task_id.to_string(),
                })
        }

        /// Reads and locks a task for the rest of the transaction.
        async fn lock_task(conn: &mut $conn, task_id: __Uuid) -> __Result<TaskRecord> {
            let row = sqlx::query(concat!(task_select!(), "WHERE t.id = $1", $lock_task))
                .bind(task_id)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db("locking a task"))?;
            match row {
                Some(row) => task_from_row(&row),
                None => Err(__Error::NotFound {
                    what: "task",
                    id: task_id.to_string(),
                }),
            }
        }

        async fn fetch_lease(conn: &mut $conn, lease_id: __Uuid) -> __Result<Option<LeaseRecord>> {
            let row = sqlx::query(concat!(
                "SELECT ",
                lease_columns!(),
                " FROM leases WHERE id = $1"
            ))
            .bind(lease_id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("reading a lease"))?;
            row.as_ref().map(lease_from_row).transpose()
        }

        async fn fetch_agent(conn: &mut $conn, agent_id: __Uuid) -> __Result<AgentRecord> {
            let row = sqlx::query(concat!(
                "SELECT ",
                agent_columns!(),
                " FROM agents WHERE id = $1"
            ))
            .bind(agent_id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("reading an agent"))?;
            match row {
                Some(row) => agent_from_row(&row),
                None => Err(__Error::NotFound {
                    what: "agent",
                    id: agent_id.to_string(),
                }),
            }
        }

        /// Appends one entry to a task's history (the task row is locked, so
        /// the next sequence number is ours).
        #[allow(clippy::too_many_arguments)]
        async fn append_event(
            conn: &mut $conn,
            task_id: __Uuid,
            kind: &str,
            state: TaskState,
            message: &str,
            agent_id: Option<__Uuid>,
            lease_id: Option<__Uuid>,
            now_ms: i64,
        ) -> __Result<()> {
            sqlx::query(
                "INSERT INTO task_events \
                 (task_id, sequence, kind, state, message, agent_id, lease_id, occurred_at_ms) \
                 VALUES ($1, (SELECT COALESCE(MAX(sequence), 0) + 1 FROM task_events \
                 WHERE task_id = $1), $2, $3, $4, $5, $6, $7)",
            )
            .bind(task_id)
            .bind(kind)
            .bind(state.as_str())
            .bind(message)
            .bind(agent_id)
            .bind(lease_id)
            .bind(now_ms)
            .execute(&mut *conn)
            .await
            .map_err(db("appending a task event"))?;
            Ok(())
        }

        async fn submit_task(
            conn: &mut $conn,
            task: &NewTask,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<(TaskRecord, bool)> {
            check_new_task(task)?;
            if let Some(existing) = task_by_key(conn, task).await? {
                return Ok((existing, false));
            }
            let id = __Uuid::now_v7();
            let inserted = sqlx::query(
                "INSERT INTO tasks (id, namespace, kind, payload, placement, priority, state, \
                 attempts, max_attempts, lease_ttl_ms, idempotency_key, not_before_ms, \
                 fencing_token, cancel_requested, labels, created_at_ms, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, 'queued', 0, $7, $8, $9, $10, 0, FALSE, $11, \
                 $12, $12) \
                 ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL \
                 DO NOTHING",
            )
            .bind(id)
            .bind(&task.namespace)
            .bind(&task.kind)
            .bind(Json(&task.payload))
            .bind(Json(&task.placement))
            .bind(task.priority)
            .bind(i64::from(task.max_attempts))
            .bind(task.lease_ttl_ms)
            .bind(&task.idempotency_key)
            .bind(task.not_before_ms.unwrap_or(now_ms))
            .bind(Json(&task.labels))
            .bind(now_ms)
            .execute(&mut *conn)
            .await
            .map_err(db("inserting a task"))?;
            if inserted.rows_affected() == 0 {
                // Another submit with the same key won the race.
                if let Some(existing) = task_by_key(conn, task).await? {
                    return Ok((existing, false));
                }
            }
            append_event(
                conn,
                id,
                "submitted",
                TaskState::Queued,
                "submitted",
                None,
                None,
                now_ms,
            )
            .await?;
            let record = must_fetch_task(conn, id).await?;
            events.push(StoreEvent::queued(&record, record.not_before_ms));
            Ok((record, true))
        }

        /// What the store refuses before any statement runs.
        fn check_new_task(task: &NewTask) -> __Result<()> {
            if task.max_attempts == 0 {
                return Err(__Error::InvalidArgument {
                    field: "max_attempts",
                    reason: "must be at least 1",
                });
            }
            if task.lease_ttl_ms <= 0 {
                return Err(__Error::InvalidArgument {
                    field: "lease_ttl",
                    reason: "must be positive",
                });
            }
            Ok(())
        }

        async fn live_lease_counts(
            conn: &mut $conn,
            agent_ids: &[__Uuid],
        ) -> __Result<std::collections::HashMap<__Uuid, u32>> {
            let mut counts = std::collections::HashMap::new();
            for chunk in agent_ids.chunks(500) {
                let mut query = sqlx::QueryBuilder::<$db>::new(
                    "SELECT agent_id, COUNT(*) FROM leases \
                     WHERE state IN ('granted', 'active') AND agent_id IN (",
                );
                let mut list = query.separated(", ");
                for id in chunk {
                    list.push_bind(*id);
                }
                query.push(") GROUP BY agent_id");
                let rows: Vec<(__Uuid, i64)> = query
                    .build_query_as()
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(db("counting live leases"))?;
                counts.extend(
                    rows.into_iter()
                        .map(|(id, n)| (id, u32::try_from(n).unwrap_or(u32::MAX))),
                );
            }
            Ok(counts)
        }

        async fn task_by_key(conn: &mut $conn, task: &NewTask) -> __Result<Option<TaskRecord>> {
            let Some(key) = &task.idempotency_key else {
                return Ok(None);
            };
            let row = sqlx::query(concat!(
                task_select!(),
                "WHERE t.namespace = $1 AND t.idempotency_key = $2"
            ))
            .bind(&task.namespace)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("looking up an idempotency key"))?;
            row.as_ref().map(task_from_row).transpose()
        }

        async fn list_tasks(
            conn: &mut $conn,
            filter: &TaskFilter,
            page: &Page,
        ) -> __Result<(Vec<TaskRecord>, Option<String>)> {
            let size = page.size.clamp(1, 1_000);
            let mut query = sqlx::QueryBuilder::<$db>::new(task_select!());
            query.push("WHERE t.namespace = ").push_bind(filter.namespace.clone());
            if !filter.states.is_empty() {
                query.push(" AND t.state IN (");
                let mut list = query.separated(", ");
                for state in &filter.states {
                    list.push_bind(state.as_str());
                }
                query.push(")");
            }
            if let Some(kind) = &filter.kind {
                query.push(" AND t.kind = ").push_bind(kind.clone());
            }
            if let Some(after) = &page.after {
                let Some((ms, id)) = parse_task_cursor(after) else {
                    return Err(__Error::InvalidArgument {
                        field: "page_token",
                        reason: "not a token this server issued",
                    });
                };
                query
                    .push(" AND (t.created_at_ms < ")
                    .push_bind(ms)
                    .push(" OR (t.created_at_ms = ")
                    .push_bind(ms)
                    .push(" AND t.id < ")
                    .push_bind(id)
                    .push("))");
            }
            query
                .push(" ORDER BY t.created_at_ms DESC, t.id DESC LIMIT ")
                .push_bind(i64::from(size) + 1);
            let rows = query
                .build()
                .fetch_all(&mut *conn)
                .await
                .map_err(db("listing tasks"))?;
            let mut tasks = rows.iter().map(task_from_row).collect::<__Result<Vec<_>>>()?;
            let next = if tasks.len() > size as usize {
                tasks.truncate(size as usize);
                tasks.last().map(|t| task_cursor(t.created_at_ms, t.id))
            } else {
                None
            };
            Ok((tasks, next))
        }

        async fn task_events(
            conn: &mut $conn,
            task_id: __Uuid,
            after_sequence: u64,
            limit: u32,
        ) -> __Result<Vec<TaskEventRecord>> {
            let rows = sqlx::query(
                "SELECT task_id, sequence, kind, state, message, agent_id, lease_id, \
                 occurred_at_ms FROM task_events WHERE task_id = $1 AND sequence > $2 \
                 ORDER BY sequence LIMIT $3",
            )
            .bind(task_id)
            .bind(to_i64(after_sequence))
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await
            .map_err(db("reading task events"))?;
            rows.iter().map(event_from_row).collect()
        }

        async fn queued_tasks(
            conn: &mut $conn,
            namespace: Option<&str>,
            now_ms: i64,
            after: Option<&QueueCursor>,
            parked: &[ParkedPlacement],
            limit: u32,
        ) -> __Result<Vec<TaskRecord>> {
            let parked = Json(
                parked
                    .iter()
                    .map(|p| [p.namespace.as_str(), p.placement.as_str()])
                    .collect::<Vec<_>>(),
            );
            // Each query is one range of the queue index (`tasks_queue`), so
            // a page costs its own rows however deep in the queue it starts:
            // the rest of the cursor's priority, then the lower priorities.
            let Some(after) = after else {
                let rows = sqlx::query(queue_page!("", $not_parked))
                    .bind(now_ms)
                    .bind(namespace)
                    .bind(i64::from(limit))
                    .bind(&parked)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(db("listing queued tasks"))?;
                return rows.iter().map(task_from_row).collect();
            };
            let mut rows = sqlx::query(queue_page!(
                "AND t.priority = $5 AND (t.created_at_ms, t.id) > ($6, $7)",
                $not_parked
            ))
            .bind(now_ms)
            .bind(namespace)
            .bind(i64::from(limit))
            .bind(&parked)
            .bind(after.priority)
            .bind(after.created_at_ms)
            .bind(after.task_id)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("listing queued tasks"))?;
            let rest = limit.saturating_sub(u32::try_from(rows.len()).unwrap_or(u32::MAX));
            if rest > 0 {
                rows.extend(
                    sqlx::query(queue_page!("AND t.priority < $5", $not_parked))
                        .bind(now_ms)
                        .bind(namespace)
                        .bind(i64::from(rest))
                        .bind(&parked)
                        .bind(after.priority)
                        .fetch_all(&mut *conn)
                        .await
                        .map_err(db("listing queued tasks"))?,
                );
            }
            rows.iter().map(task_from_row).collect()
        }

        /// Reads the named lease and checks the report comes from it.
        async fn holder(
            conn: &mut $conn,
            task: &TaskRecord,
            lease_id: __Uuid,
            agent_id: __Uuid,
            fencing_token: u64,
        ) -> __Result<LeaseRecord> {
            let lease = fetch_lease(conn, lease_id).await?;
            check_holder(task, lease.as_ref(), lease_id, agent_id, fencing_token).cloned()
        }

        async fn ack_leases(
            conn: &mut $conn,
            agent_id: __Uuid,
            leases: &[(__Uuid, u64)],
            now_ms: i64,
        ) -> __Result<u64> {
            let mut acked = 0;
            for (lease_id, token) in leases {
                let Some(lease) = fetch_lease(conn, *lease_id).await? else {
                    continue;
                };
                let task = lock_task(conn, lease.task_id).await?;
                let done = sqlx::query(
                    "UPDATE leases SET state = 'active', acked = TRUE WHERE id = $1 \
                     AND agent_id = $2 AND fencing_token = $3 AND state = 'granted'",
                )
                .bind(lease_id)
                .bind(agent_id)
                .bind(to_i64(*token))
                .execute(&mut *conn)
                .await
                .map_err(db("acknowledging a lease"))?;
                if done.rows_affected() == 1 {
                    acked += 1;
                    append_event(
                        conn,
                        task.id,
                        "accepted",
                        task.state,
                        "the agent acknowledged the lease",
                        Some(agent_id),
                        Some(*lease_id),
                        now_ms,
                    )
                    .await?;
                }
            }
            Ok(acked)
        }

        async fn renew_leases(conn: &mut $conn, agent_id: __Uuid, now_ms: i64) -> __Result<u64> {
            let done = sqlx::query(
                "UPDATE leases SET expires_at_ms = $2 + \
                 (SELECT t.lease_ttl_ms FROM tasks t WHERE t.id = leases.task_id) \
                 WHERE agent_id = $1 AND state IN ('granted', 'active')",
            )
            .bind(agent_id)
            .bind(now_ms)
            .execute(&mut *conn)
            .await
            .map_err(db("renewing leases"))?;
            Ok(done.rows_affected())
        }

        async fn report_started(
            conn: &mut $conn,
            lease_id: __Uuid,
            task_id: __Uuid,
            agent_id: __Uuid,
            fencing_token: u64,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<TaskRecord> {
            let task = lock_task(conn, task_id).await?;
            let lease = holder(conn, &task, lease_id, agent_id, fencing_token).await?;
            if !lease.state.is_live() {
                return Err(__Error::LeaseNotHeld { lease_id, agent_id });
            }
            match task.state {
                TaskState::Running => return Ok(task),
                TaskState::Leased => {}
                from => {
                    return Err(__Error::InvalidTransition {
                        task_id,
                        from,
                        what: "start",
                    });
                }
            }
            sqlx::query("UPDATE tasks SET state = 'running', updated_at_ms = $2 WHERE id = $1")
                .bind(task_id)
                .bind(now_ms)
                .execute(&mut *conn)
                .await
                .map_err(db("marking a task running"))?;
            sqlx::query(
                "UPDATE leases SET state = 'active', acked = TRUE WHERE id = $1 AND state = 'granted'",
            )
            .bind(lease_id)
            .execute(&mut *conn)
            .await
            .map_err(db("activating a lease"))?;
            append_event(
                conn,
                task_id,
                "started",
                TaskState::Running,
                "the agent started the task",
                Some(agent_id),
                Some(lease_id),
                now_ms,
            )
            .await?;
            events.push(StoreEvent::TaskChanged {
                task_id,
                state: TaskState::Running,
            });
            must_fetch_task(conn, task_id).await
        }

        #[allow(clippy::too_many_arguments)]
        async fn report_progress(
            conn: &mut $conn,
            lease_id: __Uuid,
            task_id: __Uuid,
            agent_id: __Uuid,
            fencing_token: u64,
            progress: &__Value,
            now_ms: i64,
        ) -> __Result<TaskRecord> {
            let task = lock_task(conn, task_id).await?;
            let lease = holder(conn, &task, lease_id, agent_id, fencing_token).await?;
            if !lease.state.is_live() {
                return Err(__Error::LeaseNotHeld { lease_id, agent_id });
            }
            if !matches!(task.state, TaskState::Leased | TaskState::Running) {
                return Err(__Error::InvalidTransition {
                    task_id,
                    from: task.state,
                    what: "report progress",
                });
            }
            sqlx::query("UPDATE tasks SET progress = $2, updated_at_ms = $3 WHERE id = $1")
                .bind(task_id)
                .bind(Json(progress))
                .bind(now_ms)
                .execute(&mut *conn)
                .await
                .map_err(db("recording progress"))?;
            must_fetch_task(conn, task_id).await
        }

        /// Ends a live lease (`completed`, `released` or `expired`); false
        /// if it was no longer live (another transition got there first) or,
        /// for an expiry, was renewed meanwhile.
        async fn end_lease(
            conn: &mut $conn,
            lease: &LeaseRecord,
            state: LeaseState,
            outcome: Option<&str>,
            now_ms: i64,
        ) -> __Result<bool> {
            let due_by = (state == LeaseState::Expired).then_some(now_ms);
            let done = sqlx::query(
                "UPDATE leases SET state = $2, outcome = $3, ended_at_ms = $4 \
                 WHERE id = $1 AND state IN ('granted', 'active') \
                 AND ($5 IS NULL OR expires_at_ms <= $5)",
            )
            .bind(lease.id)
            .bind(state.as_str())
            .bind(outcome)
            .bind(now_ms)
            .bind(due_by)
            .execute(&mut *conn)
            .await
            .map_err(db("ending a lease"))?;
            if done.rows_affected() == 0 {
                return Ok(false);
            }
            Ok(true)
        }

        /// Moves a task whose lease ended to its next state.
        #[allow(clippy::too_many_arguments)]
        async fn settle_task(
            conn: &mut $conn,
            task: &TaskRecord,
            state: TaskState,
            attempts: u32,
            not_before_ms: i64,
            result: Option<&__Value>,
            error: Option<&__Value>,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<()> {
            sqlx::query(
                "UPDATE tasks SET state = $2, attempts = $3, not_before_ms = $4, \
                 result = COALESCE($5, result), error = COALESCE($6, error), \
                 lease_id = NULL, agent_id = NULL, updated_at_ms = $7 WHERE id = $1",
            )
            .bind(task.id)
            .bind(state.as_str())
            .bind(i64::from(attempts))
            .bind(not_before_ms)
            .bind(result.map(Json))
            .bind(error.map(Json))
            .bind(now_ms)
            .execute(&mut *conn)
            .await
            .map_err(db("settling a task"))?;
            if state == TaskState::Queued {
                events.push(StoreEvent::queued(task, not_before_ms));
            }
            events.push(StoreEvent::TaskChanged {
                task_id: task.id,
                state,
            });
            Ok(())
        }

        /// Writes an accepted final report: the lease ends, the task
        /// settles, the history grows.
        async fn apply_settlement(
            conn: &mut $conn,
            task: &TaskRecord,
            lease: &LeaseRecord,
            settled: &SettledAttempt,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<()> {
            if !end_lease(conn, lease, settled.lease_state, Some(settled.outcome), now_ms)
                .await?
            {
                return Err(__Error::LeaseNotHeld {
                    lease_id: lease.id,
                    agent_id: lease.agent_id,
                });
            }
            settle_task(
                conn,
                task,
                settled.task_state,
                settled.attempts,
                settled.not_before_ms,
                settled.result.as_ref(),
                settled.error.as_ref(),
                now_ms,
                events,
            )
            .await?;
            append_event(
                conn,
                task.id,
                settled.event_kind,
                settled.task_state,
                &settled.message,
                Some(lease.agent_id),
                Some(lease.id),
                now_ms,
            )
            .await
        }

        /// Reads a lease with the outcome recorded on it.
        async fn fetch_lease_outcome(
            conn: &mut $conn,
            lease_id: __Uuid,
        ) -> __Result<Option<(LeaseRecord, Option<String>)>> {
            let row = sqlx::query(concat!(
                "SELECT ",
                lease_columns!(),
                ", outcome FROM leases WHERE id = $1"
            ))
            .bind(lease_id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("reading a lease"))?;
            match row {
                Some(row) => {
                    let outcome: Option<String> =
                        row.try_get("outcome").map_err(db("reading a lease outcome"))?;
                    Ok(Some((lease_from_row(&row)?, outcome)))
                }
                None => Ok(None),
            }
        }

        /// One final report, row by row (SQLite's batches and every
        /// backend's group-committed lease reports).
        async fn complete_one(
            conn: &mut $conn,
            completion: &Completion,
            backoff_base_ms: i64,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<CompletionResult> {
            let task = lock_task(conn, completion.task_id).await?;
            let lease = fetch_lease_outcome(conn, completion.lease_id).await?;
            let plan = plan_completion(
                &task,
                lease.as_ref().map(|(lease, outcome)| (lease, outcome.as_deref())),
                completion,
                backoff_base_ms,
                now_ms,
            )?;
            let (CompletionPlan::Settle(settled), Some((lease, _))) = (plan, lease) else {
                return Ok(CompletionResult {
                    task,
                    duplicate: true,
                });
            };
            apply_settlement(conn, &task, &lease, &settled, now_ms, events).await?;
            Ok(CompletionResult {
                task: must_fetch_task(conn, task.id).await?,
                duplicate: false,
            })
        }

        /// Final reports row by row in task id order (the SQLite path).
        #[allow(dead_code)]
        async fn complete_leases(
            conn: &mut $conn,
            completions: &[Completion],
            backoff_base_ms: i64,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<Vec<__Result<CompletionResult>>> {
            let mut order: Vec<usize> = (0..completions.len()).collect();
            order.sort_by_key(|&i| completions[i].task_id);
            let mut results: Vec<Option<__Result<CompletionResult>>> =
                completions.iter().map(|_| None).collect();
            for i in order {
                let outcome = complete_one(
                    conn,
                    &completions[i],
                    backoff_base_ms,
                    now_ms,
                    events,
                )
                .await;
                let outcome = match outcome {
                    // A database failure fails the whole batch (the
                    // transaction is unusable); refusals fail one item.
                    Err(err @ (__Error::Store { .. } | __Error::Corrupt { .. })) => {
                        return Err(err);
                    }
                    other => other,
                };
                results[i] = Some(outcome);
            }
            Ok(results
                .into_iter()
                .map(|r| {
                    r.unwrap_or(Err(__Error::Corrupt {
                        context: "completing leases",
                        detail: "an item was not processed".to_owned(),
                    }))
                })
                .collect())
        }

        /// An `accepted` report: GRANTED to ACTIVE; a repeat for a lease the
        /// agent already acknowledged (and still holds) is fine.
        async fn accept_one(
            conn: &mut $conn,
            report: &LeaseReport,
            now_ms: i64,
        ) -> __Result<ReportApplied> {
            let lease = (report.lease_id, report.fencing_token);
            if ack_leases(conn, report.agent_id, &[lease], now_ms).await? == 0 {
                let held = fetch_lease(conn, report.lease_id).await?.is_some_and(|l| {
                    l.agent_id == report.agent_id
                        && l.fencing_token == report.fencing_token
                        && l.acked
                        && l.state == LeaseState::Active
                });
                if !held {
                    return Err(__Error::LeaseNotHeld {
                        lease_id: report.lease_id,
                        agent_id: report.agent_id,
                    });
                }
            }
            Ok(ReportApplied { ended: false })
        }

        /// `accepted` and `started` of a freshly granted lease, and perhaps
        /// its final report, applied in one pass: the same rows, history and
        /// outcome as applying them one by one, in fewer statements (the
        /// task goes from LEASED straight to its end state when the end is
        /// there). `None` if the lease is not freshly granted to the
        /// reporter; the caller then applies the reports one by one.
        async fn run_attempt(
            conn: &mut $conn,
            report: &LeaseReport,
            end: Option<&CompletionOutcome>,
            backoff_base_ms: i64,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<Option<__Result<ReportApplied>>> {
            let task = lock_task(conn, report.task_id).await?;
            let Some((lease, recorded)) = fetch_lease_outcome(conn, report.lease_id).await? else {
                return Ok(None);
            };
            let holder = check_holder(
                &task,
                Some(&lease),
                report.lease_id,
                report.agent_id,
                report.fencing_token,
            );
            if holder.is_err() || lease.state != LeaseState::Granted || task.state != TaskState::Leased
            {
                return Ok(None);
            }
            sqlx::query(
                "UPDATE leases SET state = 'active', acked = TRUE WHERE id = $1 AND state = 'granted'",
            )
            .bind(report.lease_id)
            .execute(&mut *conn)
            .await
            .map_err(db("activating a lease"))?;
            let (agent, lease_id) = (Some(report.agent_id), Some(report.lease_id));
            append_event(
                conn,
                task.id,
                "accepted",
                TaskState::Leased,
                "the agent acknowledged the lease",
                agent,
                lease_id,
                now_ms,
            )
            .await?;
            if end.is_none() {
                sqlx::query("UPDATE tasks SET state = 'running', updated_at_ms = $2 WHERE id = $1")
                    .bind(task.id)
                    .bind(now_ms)
                    .execute(&mut *conn)
                    .await
                    .map_err(db("marking a task running"))?;
                events.push(StoreEvent::TaskChanged {
                    task_id: task.id,
                    state: TaskState::Running,
                });
            }
            append_event(
                conn,
                task.id,
                "started",
                TaskState::Running,
                "the agent started the task",
                agent,
                lease_id,
                now_ms,
            )
            .await?;
            let Some(outcome) = end else {
                return Ok(Some(Ok(ReportApplied { ended: false })));
            };
            let running = TaskRecord {
                state: TaskState::Running,
                ..task
            };
            let active = LeaseRecord {
                state: LeaseState::Active,
                acked: true,
                ..lease
            };
            let completion = Completion {
                lease_id: report.lease_id,
                task_id: report.task_id,
                agent_id: report.agent_id,
                fencing_token: report.fencing_token,
                outcome: outcome.clone(),
            };
            let plan = match plan_completion(
                &running,
                Some((&active, recorded.as_deref())),
                &completion,
                backoff_base_ms,
                now_ms,
            ) {
                Ok(CompletionPlan::Settle(settled)) => settled,
                Ok(CompletionPlan::Duplicate) => {
                    return Ok(Some(Ok(ReportApplied { ended: false })));
                }
                Err(refusal) => return Ok(Some(Err(refusal))),
            };
            apply_settlement(conn, &running, &active, &plan, now_ms, events).await?;
            Ok(Some(Ok(ReportApplied { ended: true })))
        }

        /// Lease reports of many sessions in one transaction, in task id
        /// order (a stable sort: reports about one task keep their order),
        /// each applied or refused on its own. Agent rows are never touched:
        /// an agent's load is the count of its live leases.
        async fn apply_reports(
            conn: &mut $conn,
            reports: &[LeaseReport],
            backoff_base_ms: i64,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<Vec<__Result<ReportApplied>>> {
            let mut order: Vec<usize> = (0..reports.len()).collect();
            order.sort_by_key(|&i| reports[i].task_id);
            let mut results: Vec<Option<__Result<ReportApplied>>> =
                reports.iter().map(|_| None).collect();
            let same_lease = |a: &LeaseReport, b: &LeaseReport| {
                a.lease_id == b.lease_id
                    && a.task_id == b.task_id
                    && a.agent_id == b.agent_id
                    && a.fencing_token == b.fencing_token
            };
            let mut k = 0;
            while k < order.len() {
                // A whole attempt reported at once (accepted, started and
                // perhaps the end, as a quick task's agent sends them):
                // applied in one pass over the task and lease rows.
                let i = order[k];
                let r = &reports[i];
                let next = |n: usize| order.get(k + n).map(|&j| &reports[j]);
                if r.kind == ReportKind::Accepted
                    && let Some(started) = next(1)
                    && started.kind == ReportKind::Started
                    && same_lease(r, started)
                {
                    let end = next(2).filter(|f| same_lease(r, f)).and_then(|f| match &f.kind {
                        ReportKind::Final(outcome) => Some(outcome),
                        _ => None,
                    });
                    if let Some(outcome) =
                        run_attempt(conn, r, end, backoff_base_ms, now_ms, events).await?
                    {
                        results[i] = Some(Ok(ReportApplied { ended: false }));
                        results[order[k + 1]] = Some(Ok(ReportApplied { ended: false }));
                        if end.is_some() {
                            results[order[k + 2]] = Some(outcome);
                            k += 3;
                        } else {
                            k += 2;
                        }
                        continue;
                    }
                }
                k += 1;
                let outcome = match &r.kind {
                    ReportKind::Accepted => accept_one(conn, r, now_ms).await,
                    ReportKind::Started => report_started(
                        conn,
                        r.lease_id,
                        r.task_id,
                        r.agent_id,
                        r.fencing_token,
                        now_ms,
                        events,
                    )
                    .await
                    .map(|_| ReportApplied { ended: false }),
                    ReportKind::Progress(progress) => report_progress(
                        conn,
                        r.lease_id,
                        r.task_id,
                        r.agent_id,
                        r.fencing_token,
                        progress,
                        now_ms,
                    )
                    .await
                    .map(|_| ReportApplied { ended: false }),
                    ReportKind::Final(outcome) => {
                        let completion = Completion {
                            lease_id: r.lease_id,
                            task_id: r.task_id,
                            agent_id: r.agent_id,
                            fencing_token: r.fencing_token,
                            outcome: outcome.clone(),
                        };
                        complete_one(conn, &completion, backoff_base_ms, now_ms, events)
                            .await
                            .map(|c| ReportApplied { ended: !c.duplicate })
                    }
                };
                let outcome = match outcome {
                    // A database failure fails the whole batch (the
                    // transaction is unusable); refusals fail one report.
                    Err(err @ (__Error::Store { .. } | __Error::Corrupt { .. })) => {
                        return Err(err);
                    }
                    other => other,
                };
                results[i] = Some(outcome);
            }
            Ok(results
                .into_iter()
                .map(|r| {
                    r.unwrap_or(Err(__Error::Corrupt {
                        context: "applying lease reports",
                        detail: "a report was not processed".to_owned(),
                    }))
                })
                .collect())
        }

        /// The server ends a live lease: the task goes back to QUEUED (with
        /// one more attempt when `count_attempt`), or FAILED at the budget,
        /// or CANCELED if a cancel was requested.
        #[allow(clippy::too_many_arguments)]
        async fn reclaim(
            conn: &mut $conn,
            lease_id: __Uuid,
            lease_state: LeaseState,
            count_attempt: bool,
            reason: &str,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<Option<(LeaseRecord, TaskRecord)>> {
            let Some(lease) = fetch_lease(conn, lease_id).await? else {
                return Ok(None);
            };
            let task = lock_task(conn, lease.task_id).await?;
            if !end_lease(conn, &lease, lease_state, None, now_ms).await? {
                return Ok(None);
            }
            let who = (Some(lease.agent_id), Some(lease_id));
            let attempts = if count_attempt {
                task.attempts.saturating_add(1)
            } else {
                task.attempts
            };
            if task.lease_id == Some(lease_id) {
                if task.cancel_requested {
                    settle_task(
                        conn, &task, TaskState::Canceled, attempts, task.not_before_ms, None,
                        None, now_ms, events,
                    )
                    .await?;
                    let message = format!("{reason} after a cancel was requested");
                    append_event(
                        conn, task.id, "canceled", TaskState::Canceled, &message, who.0, who.1,
                        now_ms,
                    )
                    .await?;
                } else if count_attempt && attempts >= task.max_attempts {
                    let lost: i64 = sqlx::query_scalar(
                        "SELECT COUNT(*) FROM leases WHERE task_id = $1 AND state = 'expired'",
                    )
                    .bind(task.id)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db("counting lost leases"))?;
                    let error = lease_lost_error(lost);
                    settle_task(
                        conn, &task, TaskState::Failed, attempts, task.not_before_ms, None,
                        Some(&error), now_ms, events,
                    )
                    .await?;
                    let message = format!("{reason}; lease lost {lost} times, no attempts left");
                    append_event(
                        conn, task.id, "failed", TaskState::Failed, &message, who.0, who.1, now_ms,
                    )
                    .await?;
                } else {
                    settle_task(
                        conn, &task, TaskState::Queued, attempts, now_ms, None, None, now_ms,
                        events,
                    )
                    .await?;
                    let kind = if count_attempt { "lease_expired" } else { "released" };
                    append_event(
                        conn, task.id, kind, TaskState::Queued, reason, who.0, who.1, now_ms,
                    )
                    .await?;
                }
            }
            if lease_state == LeaseState::Released {
                events.push(StoreEvent::LeaseRevoked {
                    lease_id,
                    task_id: task.id,
                    agent_id: lease.agent_id,
                    reason: reason.to_owned(),
                });
            }
            let lease = fetch_lease(conn, lease_id).await?.ok_or_else(|| __Error::NotFound {
                what: "lease",
                id: lease_id.to_string(),
            })?;
            Ok(Some((lease, must_fetch_task(conn, task.id).await?)))
        }

        async fn expire_leases(
            conn: &mut $conn,
            now_ms: i64,
            limit: u32,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<Vec<(LeaseRecord, TaskRecord)>> {
            let due: Vec<__Uuid> = sqlx::query_scalar(concat!(
                "SELECT l.id FROM leases l JOIN tasks t ON t.id = l.task_id \
                 WHERE l.state IN ('granted', 'active') AND l.expires_at_ms <= $1 \
                 ORDER BY t.id LIMIT $2",
                $skip_locked
            ))
            .bind(now_ms)
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await
            .map_err(db("finding expired leases"))?;
            let mut reclaimed = Vec::new();
            for lease_id in due {
                if let Some(pair) = reclaim(
                    conn,
                    lease_id,
                    LeaseState::Expired,
                    true,
                    "the lease expired",
                    now_ms,
                    events,
                )
                .await?
                {
                    events.push(StoreEvent::LeaseEnded {
                        agent_id: pair.0.agent_id,
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

        /// Grants never acknowledged and granted before `older_than_ms`,
        /// of one agent or (`None`) of every agent.
        async fn revoke_unacked(
            conn: &mut $conn,
            agent_id: Option<__Uuid>,
            older_than_ms: i64,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<Vec<(LeaseRecord, TaskRecord)>> {
            let due: Vec<__Uuid> = sqlx::query_scalar(concat!(
                "SELECT l.id FROM leases l JOIN tasks t ON t.id = l.task_id \
                 WHERE l.state = 'granted' AND NOT l.acked AND l.granted_at_ms < $1 \
                 AND ($2 IS NULL OR l.agent_id = $2) ORDER BY t.id",
                $skip_locked
            ))
            .bind(older_than_ms)
            .bind(agent_id)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("finding unacknowledged leases"))?;
            let mut revoked = Vec::new();
            for lease_id in due {
                if let Some(pair) = reclaim(
                    conn,
                    lease_id,
                    LeaseState::Released,
                    false,
                    "the agent never acknowledged the lease",
                    now_ms,
                    events,
                )
                .await?
                {
                    events.push(StoreEvent::LeaseEnded {
                        agent_id: pair.0.agent_id,
                        expired: None,
                    });
                    revoked.push(pair);
                }
            }
            Ok(revoked)
        }

        async fn cancel_task(
            conn: &mut $conn,
            task_id: __Uuid,
            reason: &str,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<(TaskRecord, Option<LeaseRecord>)> {
            let task = lock_task(conn, task_id).await?;
            match task.state {
                TaskState::Succeeded | TaskState::Failed | TaskState::Canceled => Ok((task, None)),
                TaskState::Queued => {
                    sqlx::query(
                        "UPDATE tasks SET state = 'canceled', cancel_requested = TRUE, \
                         cancel_reason = $2, updated_at_ms = $3 WHERE id = $1",
                    )
                    .bind(task_id)
                    .bind(reason)
                    .bind(now_ms)
                    .execute(&mut *conn)
                    .await
                    .map_err(db("canceling a task"))?;
                    append_event(
                        conn,
                        task_id,
                        "canceled",
                        TaskState::Canceled,
                        reason,
                        None,
                        None,
                        now_ms,
                    )
                    .await?;
                    events.push(StoreEvent::TaskChanged {
                        task_id,
                        state: TaskState::Canceled,
                    });
                    Ok((must_fetch_task(conn, task_id).await?, None))
                }
                TaskState::Leased | TaskState::Running => {
                    if !task.cancel_requested {
                        sqlx::query(
                            "UPDATE tasks SET cancel_requested = TRUE, cancel_reason = $2, \
                             updated_at_ms = $3 WHERE id = $1",
                        )
                        .bind(task_id)
                        .bind(reason)
                        .bind(now_ms)
                        .execute(&mut *conn)
                        .await
                        .map_err(db("requesting a cancel"))?;
                        append_event(
                            conn,
                            task_id,
                            "cancel_requested",
                            task.state,
                            reason,
                            task.agent_id,
                            task.lease_id,
                            now_ms,
                        )
                        .await?;
                    }
                    let lease = match task.lease_id {
                        Some(lease_id) => fetch_lease(conn, lease_id).await?,
                        None => None,
                    };
                    if let Some(lease) = &lease {
                        events.push(StoreEvent::LeaseRevoked {
                            lease_id: lease.id,
                            task_id,
                            agent_id: lease.agent_id,
                            reason: reason.to_owned(),
                        });
                    }
                    Ok((must_fetch_task(conn, task_id).await?, lease))
                }
            }
        }

        async fn register_agent(
            conn: &mut $conn,
            registration: &AgentRegistration,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<AgentRecord> {
            let no_reasons: Vec<String> = Vec::new();
            let row = sqlx::query(concat!(
                "INSERT INTO agents (id, namespace, name, document, provenance, rejections, \
                 reported, operator_overrides, generation, status, status_reasons, capacity, \
                 active_leases, drained, labels, runner, session_epoch, last_seen_at_ms, \
                 registered_at_ms, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, 'ready', $9, $10, 0, FALSE, $11, \
                 $12, 1, $13, $13, $13) \
                 ON CONFLICT (namespace, name) DO UPDATE SET \
                 document = excluded.document, provenance = excluded.provenance, \
                 rejections = excluded.rejections, reported = excluded.reported, \
                 generation = agents.generation + 1, \
                 status = CASE WHEN agents.drained THEN 'draining' ELSE 'ready' END, \
                 status_reasons = CASE WHEN agents.drained THEN agents.status_reasons \
                 ELSE excluded.status_reasons END, \
                 capacity = excluded.capacity, labels = excluded.labels, \
                 runner = excluded.runner, session_epoch = agents.session_epoch + 1, \
                 last_seen_at_ms = excluded.last_seen_at_ms, \
                 updated_at_ms = excluded.updated_at_ms \
                 RETURNING ",
                agent_columns!()
            ))
            .bind(__Uuid::now_v7())
            .bind(&registration.namespace)
            .bind(&registration.name)
            .bind(Json(&registration.document))
            .bind(Json(&registration.provenance))
            .bind(Json(&registration.rejections))
            .bind(Json(&registration.reported))
            .bind(Json(serde_json::json!({})))
            .bind(Json(&no_reasons))
            .bind(i64::from(registration.capacity))
            .bind(Json(&registration.labels))
            .bind(&registration.runner)
            .bind(now_ms)
            .fetch_one(&mut *conn)
            .await
            .map_err(db("registering an agent"))?;
            let agent = agent_from_row(&row)?;
            events.push(StoreEvent::AgentChanged { agent_id: agent.id });
            Ok(agent)
        }

        async fn list_agents(
            conn: &mut $conn,
            namespace: &str,
            statuses: &[String],
            page: &Page,
        ) -> __Result<(Vec<AgentRecord>, Option<String>)> {
            let size = page.size.clamp(1, 1_000);
            let mut query = sqlx::QueryBuilder::<$db>::new(concat!(
                "SELECT ",
                agent_columns!(),
                " FROM agents WHERE namespace = "
            ));
            query.push_bind(namespace.to_owned());
            if !statuses.is_empty() {
                query.push(" AND status IN (");
                let mut list = query.separated(", ");
                for status in statuses {
                    list.push_bind(status.clone());
                }
                query.push(")");
            }
            if let Some(after) = &page.after {
                query.push(" AND name > ").push_bind(after.clone());
            }
            query
                .push(" ORDER BY name LIMIT ")
                .push_bind(i64::from(size) + 1);
            let rows = query
                .build()
                .fetch_all(&mut *conn)
                .await
                .map_err(db("listing agents"))?;
            let mut agents = rows.iter().map(agent_from_row).collect::<__Result<Vec<_>>>()?;
            let next = if agents.len() > size as usize {
                agents.truncate(size as usize);
                agents.last().map(|a| a.name.clone())
            } else {
                None
            };
            Ok((agents, next))
        }

        async fn all_agents(conn: &mut $conn) -> __Result<Vec<AgentRecord>> {
            let rows = sqlx::query(concat!(
                "SELECT ",
                agent_columns!(),
                " FROM agents ORDER BY namespace, name"
            ))
            .fetch_all(&mut *conn)
            .await
            .map_err(db("listing all agents"))?;
            rows.iter().map(agent_from_row).collect()
        }

        #[allow(clippy::too_many_arguments)]
        async fn update_agent_document(
            conn: &mut $conn,
            agent_id: __Uuid,
            expected_generation: u64,
            reported: &__Value,
            document: &__Value,
            provenance: &__Value,
            rejections: &__Value,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<u64> {
            let generation: Option<i64> = sqlx::query_scalar(
                "UPDATE agents SET reported = $3, document = $4, provenance = $5, \
                 rejections = $6, generation = generation + 1, updated_at_ms = $7 \
                 WHERE id = $1 AND generation = $2 RETURNING generation",
            )
            .bind(agent_id)
            .bind(to_i64(expected_generation))
            .bind(Json(reported))
            .bind(Json(document))
            .bind(Json(provenance))
            .bind(Json(rejections))
            .bind(now_ms)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("updating an agent document"))?;
            match generation {
                Some(generation) => {
                    events.push(StoreEvent::AgentChanged { agent_id });
                    Ok(to_u64(generation))
                }
                None => {
                    let held = fetch_agent(conn, agent_id).await?.generation;
                    Err(__Error::GenerationMismatch {
                        held,
                        expected: expected_generation,
                    })
                }
            }
        }

        /// A document a session computed from a diff, if the generation
        /// still holds; no event (see `Store::heartbeats`).
        async fn write_document(
            conn: &mut $conn,
            agent_id: __Uuid,
            write: &DocumentWrite,
            now_ms: i64,
        ) -> __Result<BeatApplied> {
            let generation: Option<i64> = sqlx::query_scalar(
                "UPDATE agents SET reported = $3, document = $4, provenance = $5, \
                 generation = $7, updated_at_ms = $6 \
                 WHERE id = $1 AND generation = $2 RETURNING generation",
            )
            .bind(agent_id)
            .bind(to_i64(write.expected_generation))
            .bind(Json(&write.reported))
            .bind(Json(&write.document))
            .bind(Json(&write.provenance))
            .bind(now_ms)
            .bind(to_i64(write.generation))
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("writing an agent document"))?;
            Ok(match generation {
                Some(generation) => BeatApplied::Written(to_u64(generation)),
                None => BeatApplied::Stale(fetch_agent(conn, agent_id).await?.generation),
            })
        }

        /// Heartbeats one by one, in agent id order (the SQLite path, and
        /// the statuses of PostgreSQL's batches).
        #[allow(dead_code)]
        async fn heartbeats(
            conn: &mut $conn,
            beats: &[Beat],
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<Vec<__Result<BeatApplied>>> {
            let mut order: Vec<usize> = (0..beats.len()).collect();
            order.sort_by_key(|&i| beats[i].agent_id);
            let mut results: Vec<Option<__Result<BeatApplied>>> = beats.iter().map(|_| None).collect();
            for i in order {
                let beat = &beats[i];
                if beat.renew {
                    renew_leases(conn, beat.agent_id, now_ms).await?;
                }
                match &beat.status {
                    Some((status, reasons)) => {
                        set_agent_status(
                            conn,
                            beat.agent_id,
                            status,
                            reasons,
                            Some(beat.session_epoch),
                            now_ms,
                            events,
                        )
                        .await?;
                    }
                    None if beat.touch => {
                        sqlx::query(
                            "UPDATE agents SET last_seen_at_ms = $2 WHERE id = $1 \
                             AND last_seen_at_ms < $2",
                        )
                        .bind(beat.agent_id)
                        .bind(now_ms)
                        .execute(&mut *conn)
                        .await
                        .map_err(db("touching an agent"))?;
                    }
                    None => {}
                }
                results[i] = Some(match &beat.document {
                    Some(write) => write_document(conn, beat.agent_id, write, now_ms).await,
                    None => Ok(BeatApplied::Renewed),
                });
            }
            Ok(results
                .into_iter()
                .map(|r| {
                    r.unwrap_or(Err(__Error::Corrupt {
                        context: "applying heartbeats",
                        detail: "a heartbeat was not processed".to_owned(),
                    }))
                })
                .collect())
        }

        async fn set_operator_overrides(
            conn: &mut $conn,
            agent_id: __Uuid,
            overrides: &__Value,
            document: &__Value,
            provenance: &__Value,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<AgentRecord> {
            let row = sqlx::query(concat!(
                "UPDATE agents SET operator_overrides = $2, document = $3, provenance = $4, \
                 generation = generation + 1, updated_at_ms = $5 WHERE id = $1 RETURNING ",
                agent_columns!()
            ))
            .bind(agent_id)
            .bind(Json(overrides))
            .bind(Json(document))
            .bind(Json(provenance))
            .bind(now_ms)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("setting operator overrides"))?;
            let Some(row) = row else {
                return Err(__Error::NotFound {
                    what: "agent",
                    id: agent_id.to_string(),
                });
            };
            events.push(StoreEvent::AgentChanged { agent_id });
            agent_from_row(&row)
        }

        async fn set_agent_status(
            conn: &mut $conn,
            agent_id: __Uuid,
            status: &str,
            reasons: &[String],
            session_epoch: Option<u64>,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<bool> {
            // A drained agent stays draining while it is up.
            let done = sqlx::query(
                "UPDATE agents SET status = CASE WHEN drained AND $2 IN ('ready', 'degraded') \
                 THEN 'draining' ELSE $2 END, status_reasons = $3, updated_at_ms = $5 \
                 WHERE id = $1 AND ($4 IS NULL OR session_epoch = $4)",
            )
            .bind(agent_id)
            .bind(status)
            .bind(Json(reasons))
            .bind(session_epoch.map(to_i64))
            .bind(now_ms)
            .execute(&mut *conn)
            .await
            .map_err(db("setting an agent status"))?;
            let changed = done.rows_affected() == 1;
            if changed {
                events.push(StoreEvent::AgentChanged { agent_id });
            }
            Ok(changed)
        }

        async fn set_agent_drained(
            conn: &mut $conn,
            agent_id: __Uuid,
            drained: bool,
            reason: Option<String>,
            now_ms: i64,
            events: &mut Vec<StoreEvent>,
        ) -> __Result<AgentRecord> {
            let reasons: Vec<String> = if drained {
                vec![reason.unwrap_or_else(|| "drained by operator".to_owned())]
            } else {
                Vec::new()
            };
            let row = sqlx::query(concat!(
                "UPDATE agents SET drained = $2, \
                 status = CASE WHEN $2 THEN 'draining' WHEN status = 'draining' THEN 'ready' \
                 ELSE status END, status_reasons = $3, updated_at_ms = $4 \
                 WHERE id = $1 RETURNING ",
                agent_columns!()
            ))
            .bind(agent_id)
            .bind(drained)
            .bind(Json(&reasons))
            .bind(now_ms)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("draining an agent"))?;
            let Some(row) = row else {
                return Err(__Error::NotFound {
                    what: "agent",
                    id: agent_id.to_string(),
                });
            };
            events.push(StoreEvent::AgentChanged { agent_id });
            agent_from_row(&row)
        }

        async fn touch_agent(conn: &mut $conn, agent_id: __Uuid, now_ms: i64) -> __Result<()> {
            let done = sqlx::query(
                "UPDATE agents SET last_seen_at_ms = $2 WHERE id = $1 AND last_seen_at_ms < $2",
            )
            .bind(agent_id)
            .bind(now_ms)
            .execute(&mut *conn)
            .await
            .map_err(db("touching an agent"))?;
            if done.rows_affected() == 0 {
                // Unchanged (already as recent) or missing: tell them apart.
                fetch_agent(conn, agent_id).await?;
            }
            Ok(())
        }

        /// Live tasks only: queued ones through the queue's index, leased and
        /// running ones through their live leases (a task is LEASED or
        /// RUNNING exactly while it holds one). Finished tasks are kept
        /// forever, and counting them was a scan of the whole table.
        async fn count_tasks(conn: &mut $conn) -> __Result<Vec<(String, TaskState, u64)>> {
            let rows = sqlx::query(
                "SELECT namespace, state, COUNT(*) AS n FROM tasks WHERE state = 'queued' \
                 GROUP BY namespace, state \
                 UNION ALL \
                 SELECT t.namespace, t.state, COUNT(*) AS n FROM leases l \
                 JOIN tasks t ON t.id = l.task_id WHERE l.state IN ('granted', 'active') \
                 GROUP BY t.namespace, t.state",
            )
            .fetch_all(&mut *conn)
            .await
            .map_err(db("counting tasks"))?;
            rows.iter()
                .map(|row| {
                    let get = |source| __Error::Store { context: "reading a task count", source };
                    let state: String = row.try_get("state").map_err(get)?;
                    Ok((
                        row.try_get("namespace").map_err(get)?,
                        state.parse().map_err(corrupt("reading a task count"))?,
                        to_u64(row.try_get("n").map_err(get)?),
                    ))
                })
                .collect()
        }

        async fn count_in_namespace(
            conn: &mut $conn,
            namespace: &str,
        ) -> __Result<(u64, u64)> {
            let row = sqlx::query(
                "SELECT (SELECT COUNT(*) FROM tasks WHERE namespace = $1 AND state = 'queued') AS queued, \
                        (SELECT COUNT(*) FROM agents WHERE namespace = $1) AS agents",
            )
            .bind(namespace)
            .fetch_one(&mut *conn)
            .await
            .map_err(db("counting a namespace"))?;
            let get = |source| __Error::Store { context: "reading namespace counts", source };
            Ok((to_u64(row.try_get("queued").map_err(get)?), to_u64(row.try_get("agents").map_err(get)?)))
        }

        async fn insert_token(conn: &mut $conn, token: &TokenRecord, hash: &str) -> __Result<()> {
            sqlx::query(
                "INSERT INTO tokens (hash, name, namespace, role, created_at_ms) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(hash)
            .bind(&token.name)
            .bind(&token.namespace)
            .bind(&token.role)
            .bind(token.created_at_ms)
            .execute(&mut *conn)
            .await
            .map_err(db("storing a token"))?;
            Ok(())
        }

        async fn any_tokens(conn: &mut $conn) -> __Result<bool> {
            let row = sqlx::query("SELECT EXISTS (SELECT 1 FROM tokens) AS any")
                .fetch_one(&mut *conn)
                .await
                .map_err(db("checking for tokens"))?;
            row.try_get::<bool, _>("any").map_err(|source| __Error::Store { context: "reading a token count", source })
        }

        async fn find_token(conn: &mut $conn, hash: &str) -> __Result<Option<TokenRecord>> {
            let row = sqlx::query("SELECT name, namespace, role, created_at_ms FROM tokens WHERE hash = $1")
                .bind(hash)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db("looking up a token"))?;
            let get = |source| __Error::Store { context: "reading a token", source };
            row.map(|row| {
                Ok(TokenRecord {
                    name: row.try_get("name").map_err(get)?,
                    namespace: row.try_get("namespace").map_err(get)?,
                    role: row.try_get("role").map_err(get)?,
                    created_at_ms: row.try_get("created_at_ms").map_err(get)?,
                })
            })
            .transpose()
        }

        async fn agent_leases(conn: &mut $conn, agent_id: __Uuid) -> __Result<Vec<LeaseRecord>> {
            let rows = sqlx::query(concat!(
                "SELECT ",
                lease_columns!(),
                " FROM leases WHERE agent_id = $1 AND state IN ('granted', 'active') \
                 ORDER BY granted_at_ms, id"
            ))
            .bind(agent_id)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("listing an agent's leases"))?;
            rows.iter().map(lease_from_row).collect()
        }

        async fn get_lease(conn: &mut $conn, lease_id: __Uuid) -> __Result<LeaseRecord> {
            fetch_lease(conn, lease_id)
                .await?
                .ok_or_else(|| __Error::NotFound {
                    what: "lease",
                    id: lease_id.to_string(),
                })
        }
    };
}

pub(crate) use store_common;
