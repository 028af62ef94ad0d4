//! SQLite's submits: the tasks with neither an idempotency key nor a
//! fairness key inserted in one statement, the others one by one as the
//! shared SQL inserts them (`tasks::insert`: the key's lookup, the fair
//! rank), their history's first entry implied by their rows; then their
//! records read in one statement, and the tasks with an agent reserved on
//! the way in leased in one set-based grant (`grant`).

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use sqlx::Sqlite;
use uuid::Uuid;

use super::{batch, grant};
use crate::error::{Error, Result};
use crate::model::{
    GrantOutcome, GrantRequest, NewTask, StoreEvent, Submission, Submitted, TaskRecord,
};
use crate::store::StoreOptions;
use crate::store::plan::db;
use crate::store::sql::tasks::{self, Inserted};
use crate::store::sql::{Write, rows};

/// New tasks inserted from `$1`, a JSON array of [`plain_row`] objects,
/// created at `$2`, as `tasks::insert` inserts a task without an
/// idempotency key or a fairness key.
const INSERT_PLAIN: &str = "INSERT INTO tasks (id, namespace, kind, payload, placement, priority, \
    state, attempts, max_attempts, lease_ttl_ms, idempotency_key, not_before_ms, \
    fencing_token, cancel_requested, labels, retry, start_timeout_ms, execution_timeout_ms, \
    cancel_grace_ms, fairness_key, fairness_weight, fair_offset, concurrency_key, created_at_ms, \
    updated_at_ms) \
    SELECT unhex(value ->> 'id'), value ->> 'namespace', value ->> 'kind', value ->> 'payload', \
    value ->> 'placement', value ->> 'priority', 'queued', 0, value ->> 'max_attempts', \
    value ->> 'lease_ttl_ms', NULL, value ->> 'not_before_ms', 0, FALSE, value ->> 'labels', \
    value ->> 'retry', value ->> 'start_timeout_ms', value ->> 'execution_timeout_ms', \
    value ->> 'cancel_grace_ms', NULL, NULL, 0, value ->> 'concurrency_key', $2, $2 \
    FROM jsonb_each($1)";

/// Whether `task` goes into [`INSERT_PLAIN`]: an idempotency key needs its
/// lookup and conflict, a fairness key the rank read from the tasks before
/// it.
fn plain(task: &NewTask) -> bool {
    task.idempotency_key.is_none() && task.fairness.is_none()
}

/// A plain task as one element of [`INSERT_PLAIN`]'s array; its documents
/// as the JSON text the shared insert binds.
fn plain_row(id: Uuid, task: &NewTask, now_ms: i64) -> Value {
    json!({
        "id": batch::hex(id),
        "namespace": task.namespace,
        "kind": task.kind,
        "payload": task.payload.to_string(),
        "placement": task.placement.to_string(),
        "priority": task.priority,
        "max_attempts": task.max_attempts,
        "lease_ttl_ms": task.lease_ttl_ms,
        "not_before_ms": task.not_before_ms.unwrap_or(now_ms),
        "labels": serde_json::to_string(&task.labels).unwrap_or_default(),
        "retry": task.retry.as_ref().map(rows::retry_text),
        "start_timeout_ms": task.deadlines.start_timeout_ms,
        "execution_timeout_ms": task.deadlines.execution_timeout_ms,
        "cancel_grace_ms": task.deadlines.cancel_grace_ms,
        "concurrency_key": task.concurrency_key,
    })
}

/// What became of one submission before its record is read.
enum Slot {
    /// Refused on its own (a bad task).
    Refused(Error),
    /// Its idempotency key named this task.
    Existing(TaskRecord),
    /// Inserted with this id.
    New(Uuid),
}

/// A batch of submits in `w` (see `TaskStore::submit_many`): a refused task
/// is answered on its own; a statement's failure fails the batch.
pub(super) async fn submit_many(
    w: &mut Write<Sqlite>,
    submissions: &[Submission],
    options: &StoreOptions,
    now_ms: i64,
) -> Result<Vec<Result<Submitted>>> {
    let mut slots = Vec::with_capacity(submissions.len());
    let mut plain_rows = Vec::new();
    for submission in submissions {
        if let Err(err) = tasks::check_new(&submission.task) {
            slots.push(Slot::Refused(err));
            continue;
        }
        if plain(&submission.task) {
            let id = Uuid::now_v7();
            plain_rows.push(plain_row(id, &submission.task, now_ms));
            slots.push(Slot::New(id));
            continue;
        }
        slots.push(match tasks::insert(w, &submission.task, now_ms).await? {
            Inserted::Existing(task) => Slot::Existing(task),
            Inserted::New(id) => Slot::New(id),
        });
    }
    if !plain_rows.is_empty() {
        sqlx::query(INSERT_PLAIN)
            .bind(Value::Array(plain_rows).to_string())
            .bind(now_ms)
            .execute(w.conn())
            .await
            .map_err(db("inserting tasks"))?;
    }
    let created: Vec<Uuid> = slots
        .iter()
        .filter_map(|s| match s {
            Slot::New(id) => Some(*id),
            _ => None,
        })
        .collect();
    // Their history's first entry is implied by their rows
    // (`history::SUBMITTED`).
    let mut records = batch::tasks(w, created.iter().copied()).await?;
    let mut requests = Vec::new();
    for (slot, submission) in slots.iter().zip(submissions) {
        if let Slot::New(id) = slot {
            let record = records.get(id).ok_or_else(|| Error::NotFound {
                what: "task",
                id: id.to_string(),
            })?;
            w.announce(StoreEvent::submitted(record));
            if let Some(agent_id) = submission.agent_id {
                requests.push(GrantRequest::one_slot(*id, agent_id));
            }
        }
    }
    let mut grants = HashMap::new();
    if !requests.is_empty() {
        let outcomes =
            grant::grant(w, &requests, options.max_running_per_namespace, now_ms).await?;
        let leased: HashSet<Uuid> = requests
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| matches!(o, GrantOutcome::Granted(_)))
            .map(|(r, _)| r.task_id)
            .collect();
        if !leased.is_empty() {
            // Leased before anyone could see them queued.
            w.events_mut().retain(|e| {
                !matches!(e, StoreEvent::TaskQueued { task_id, .. } if leased.contains(task_id))
            });
            records.extend(batch::tasks(w, leased.iter().copied()).await?);
        }
        grants.extend(requests.iter().map(|r| r.task_id).zip(outcomes));
    }
    Ok(slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Refused(err) => Err(err),
            Slot::Existing(task) => Ok((task, false, None)),
            Slot::New(id) => match records.remove(&id) {
                Some(task) => Ok((task, true, grants.remove(&id))),
                None => Err(Error::NotFound {
                    what: "task",
                    id: id.to_string(),
                }),
            },
        })
        .collect())
}
