//! A task's cancel: a queued task is canceled outright; a leased one gets
//! `cancel_requested` (and a deadline, with a grace), its history an
//! entry, and its lease is returned to be revoked. Apart from `super::tasks`
//! because it reads the task's lease (`super::leases`), whose transitions
//! build on the tasks'.

use uuid::Uuid;

use super::db::{StatementExt, query};
use super::history::{self, Entry};
use super::tasks::{lock, must_fetch};
use super::{Dialect, Write, leases};
use crate::error::Result;
use crate::model::{LeaseRecord, StoreEvent, TaskRecord, TaskState};
use crate::store::plan::db;

const CANCEL_QUEUED: &str = "UPDATE tasks SET state = 'canceled', cancel_requested = TRUE, \
    cancel_reason = $2, updated_at_ms = $3 WHERE id = $1";
const REQUEST_CANCEL: &str = "UPDATE tasks SET cancel_requested = TRUE, cancel_reason = $2, \
    updated_at_ms = $3, cancel_deadline_ms = $4 WHERE id = $1";

/// Cancels a task (see `TaskStore::cancel_task`).
pub(crate) async fn cancel<DB: Dialect>(
    w: &mut Write<DB>,
    task_id: Uuid,
    reason: &str,
    grace_ms: Option<i64>,
    now_ms: i64,
) -> Result<(TaskRecord, Option<LeaseRecord>)> {
    let task = lock(w, task_id).await?;
    // The cancel's own grace, or the task's; a second cancel may shorten
    // the deadline, never lengthen it.
    let deadline = grace_ms
        .or(task.deadlines.cancel_grace_ms)
        .map(|grace| now_ms.saturating_add(grace));
    let deadline = match (task.cancel_deadline_ms, deadline) {
        (Some(old), Some(new)) => Some(old.min(new)),
        (old, new) => old.or(new),
    };
    match task.state {
        TaskState::Succeeded | TaskState::Failed | TaskState::Canceled => Ok((task, None)),
        TaskState::Queued => {
            query::<DB>(CANCEL_QUEUED)
                .arg(task_id)
                .text(reason)
                .arg(now_ms)
                .run(w.conn())
                .await
                .map_err(db("canceling a task"))?;
            let entry = Entry::of(task_id, "canceled", TaskState::Canceled, reason);
            history::append(w, entry, now_ms).await?;
            w.announce(StoreEvent::TaskChanged {
                task_id,
                state: TaskState::Canceled,
            });
            Ok((must_fetch::<DB>(w.conn(), task_id).await?, None))
        }
        TaskState::Leased | TaskState::Running => {
            if !task.cancel_requested || deadline != task.cancel_deadline_ms {
                query::<DB>(REQUEST_CANCEL)
                    .arg(task_id)
                    .text(reason)
                    .arg(now_ms)
                    .arg(deadline)
                    .run(w.conn())
                    .await
                    .map_err(db("requesting a cancel"))?;
            }
            if !task.cancel_requested {
                let entry = Entry {
                    agent_id: task.agent_id,
                    lease_id: task.lease_id,
                    ..Entry::of(task_id, "cancel_requested", task.state, reason)
                };
                history::append(w, entry, now_ms).await?;
            }
            let lease = match task.lease_id {
                Some(lease_id) => leases::fetch::<DB>(w.conn(), lease_id).await?,
                None => None,
            };
            if let Some(lease) = &lease {
                w.announce(StoreEvent::LeaseRevoked {
                    lease_id: lease.id,
                    task_id,
                    agent_id: lease.agent_id,
                    cause: Some(crate::model::RevocationCause::Canceled),
                    reason: reason.to_owned(),
                });
            }
            Ok((must_fetch::<DB>(w.conn(), task_id).await?, lease))
        }
    }
}
