//! SQLite's submits: each task's row inserted as the shared SQL inserts it
//! (`tasks::insert`: idempotency key, fair rank), then the new tasks'
//! history entries appended and their records read in one statement each,
//! and the tasks with an agent reserved on the way in leased in one
//! set-based grant (`grant`), as `tasks::submit_rows` does row by row.

use std::collections::{HashMap, HashSet};

use sqlx::Sqlite;
use uuid::Uuid;

use super::{batch, grant};
use crate::error::{Error, Result};
use crate::model::{
    GrantOutcome, GrantRequest, StoreEvent, Submission, Submitted, TaskRecord, TaskState,
};
use crate::store::StoreOptions;
use crate::store::sql::Write;
use crate::store::sql::tasks::{self, Inserted};

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
    for submission in submissions {
        if let Err(err) = tasks::check_new(&submission.task) {
            slots.push(Slot::Refused(err));
            continue;
        }
        slots.push(match tasks::insert(w, &submission.task, now_ms).await? {
            Inserted::Existing(task) => Slot::Existing(task),
            Inserted::New(id) => Slot::New(id),
        });
    }
    let created: Vec<Uuid> = slots
        .iter()
        .filter_map(|s| match s {
            Slot::New(id) => Some(*id),
            _ => None,
        })
        .collect();
    let entries = created
        .iter()
        .map(|id| batch::entry(*id, 1, "submitted", TaskState::Queued, "submitted", None))
        .collect();
    batch::append(w, entries, now_ms).await?;
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
