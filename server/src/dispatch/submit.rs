//! The submit protocol, whole: a task due now may be leased on the way in
//! to an agent connected here that has room, when nothing waits in the
//! queue (so it overtakes no one). The agent's slot is reserved before the
//! commit, the task and its lease are stored in one group-committed
//! transaction, and then the grant is pushed, or the reservation given back
//! whatever went wrong; a task left queued is noted so the next round
//! reads it. While more submits wait for the store than
//! `--max-submits-waiting`, a submit is pushed back (RESOURCE_EXHAUSTED,
//! with a `RetryInfo`) before anything is stored.

use switchyard_core::placement::CompiledPlacement;
use switchyard_core::resources::Claim;
use tracing::info;
use uuid::Uuid;

use super::Dispatcher;
use crate::error::{Error, Result};

/// The most submits one group commit batch holds.
pub(super) const SUBMIT_BATCH: usize = 256;
use crate::model::{
    GrantOutcome, NewTask, QueuedReason, Submission, Submitted, TaskRecord, TaskState,
};

/// What a submit did.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmitOutcome {
    /// The task as stored (an idempotent repeat: the task already there).
    pub task: TaskRecord,
    /// Whether this submit created it.
    pub created: bool,
    /// Why it waits, while it is queued: judged from the agents connected
    /// to this replica, in memory (reading and matching the whole fleet on
    /// every submit would cost more than the submit).
    pub queued_reason: Option<QueuedReason>,
}

impl Dispatcher {
    /// Submits a task (see the module doc); `placement` is its placement,
    /// compiled.
    pub async fn submit_task(
        &self,
        task: NewTask,
        placement: &CompiledPlacement,
    ) -> Result<SubmitOutcome> {
        self.admit_submit()?;
        let now = self.now_ms();
        // The batch that commits it reads the clock after this pick, so the
        // lease is stamped after it (see the dispatch round's grants).
        let target = if task.not_before_ms.is_none_or(|at| at <= now) {
            self.place_now(placement, &task)
        } else {
            None
        };
        let submitted = self.commit_submit(Submission {
            task,
            agent_id: target,
        });
        let (record, created, grant) = match submitted.await {
            Ok(submitted) => submitted,
            Err(err) => {
                if let Some(agent_id) = target {
                    self.give_back(agent_id, None);
                }
                return Err(err);
            }
        };
        let leased = match (target, grant) {
            (_, Some(GrantOutcome::Granted(lease))) => {
                self.push_grant(&record, &lease);
                true
            }
            (Some(agent_id), _) => {
                self.give_back(agent_id, Some(record.id));
                false
            }
            (None, _) => false,
        };
        info!(task = %record.id, created, leased, "task submitted");
        if created && !leased {
            // What the store's event for it does on other replicas (this
            // one does not hear it).
            self.queue_moved();
            self.note_queued_at(record.priority, record.queue_rank, record.id);
            self.note_due(record.not_before_ms);
            self.wake();
        }
        let queued_reason = (record.state == TaskState::Queued).then(|| {
            if record.not_before_ms > self.now_ms() {
                QueuedReason::Backoff
            } else {
                // Parked or waiting: whether any agent here could run it,
                // not a whole explanation (at 30,000 agents, explaining
                // every queued submit against each agent under the
                // dispatcher's lock was most of the server's time).
                if self.capable_here(placement, &record.namespace) {
                    QueuedReason::WaitingForCapacity
                } else {
                    QueuedReason::Parked
                }
            }
        });
        Ok(SubmitOutcome {
            task: record,
            created,
            queued_reason,
        })
    }

    /// Picks and reserves an agent for a task being submitted, if one
    /// connected here has room (and is not held back for a late
    /// acknowledgement), the congestion window has room, and nothing waits
    /// in the queue. A task with
    /// a resource request or a spread is left to the dispatch round, whose
    /// grant records (and checks) its claim against the agent's live
    /// leases; so is one a concurrency limit counts (its key's, or the
    /// namespace's), whose grant checks the limit.
    fn place_now(&self, placement: &CompiledPlacement, task: &NewTask) -> Option<Uuid> {
        if self.stopping()
            || !self.queue_clear()
            || placement.claims_beyond_slots()
            || task.concurrency_key.is_some()
            || self.shared.settings.max_running_per_namespace > 0
        {
            return None;
        }
        let namespace = &task.namespace;
        let now = self.now_ms();
        self.hold_back_late(now);
        let mut state = self.state();
        if state.congestion.room() == 0 {
            // Grants in flight fill the window: the round grants it later.
            return None;
        }
        let started = std::time::Instant::now();
        let selection = state.index.select_best(placement, namespace);
        metrics::histogram!(crate::metrics::MATCH_SECONDS).record(started.elapsed().as_secs_f64());
        let selection = selection?;
        // One slot, not recorded by task (the task has no id yet).
        self.reserve(
            &mut state,
            selection.agent_id,
            Uuid::nil(),
            Claim::one_slot(),
            now,
        );
        Some(selection.agent_id.uuid())
    }

    /// Pushes back (RESOURCE_EXHAUSTED, with when to try again) while more
    /// submits than `max_submits_waiting` wait for a batch: the store is
    /// behind, and queueing more would only make every caller wait longer.
    /// The hint is a tenth of a second per full batch ahead.
    fn admit_submit(&self) -> Result<()> {
        let limit = self.shared.settings.max_submits_waiting;
        let Some(group) = self.shared.submits.get() else {
            return Ok(());
        };
        let waiting = group.waiting();
        if waiting < limit {
            return Ok(());
        }
        metrics::counter!(crate::metrics::SUBMITS_PUSHED_BACK).increment(1);
        let batches_ahead = (waiting / SUBMIT_BATCH).max(1) as u64;
        Err(Error::Overloaded {
            what: format!("{waiting} submits are waiting for the store (at most {limit})"),
            retry_after_ms: 100 * batches_ahead,
        })
    }

    /// Stores a submission (leasing it to its reserved agent, if any),
    /// group-committed with other callers' submits.
    async fn commit_submit(&self, submission: Submission) -> Result<Submitted> {
        let mut results = match self.shared.submits.get() {
            Some(group) => group.submit(vec![submission]).await?,
            None => {
                let now = self.now_ms();
                self.shared
                    .store
                    .submit_many(std::slice::from_ref(&submission), now)
                    .await?
            }
        };
        results.pop().unwrap_or_else(|| {
            Err(Error::Corrupt {
                context: "submitting a task",
                detail: "no result".to_owned(),
            })
        })
    }
}
