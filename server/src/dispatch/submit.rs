//! The submit protocol, whole: a task due now may be leased on the way in
//! to an agent connected here that has room, when nothing waits in the
//! queue that an agent with room could run (so it overtakes no one). The
//! agent's slot is reserved before the commit, the task and its lease are
//! stored in one group-committed transaction, and then the grant is pushed,
//! or the reservation given back whatever went wrong; a task left queued is
//! noted so the next round reads it. A call's tasks go in one batch, in
//! order. While more submitted tasks wait for the store than
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
        let mut outcomes = self.submit_tasks(vec![(task, placement)]).await?;
        outcomes.pop().ok_or_else(|| Error::Corrupt {
            context: "submitting a task",
            detail: "no result".to_owned(),
        })
    }

    /// Submits tasks in one store transaction, each with its placement
    /// compiled; answers in their order. Each is leased on the way in as
    /// [`Dispatcher::submit_task`] would, in order, until the first that is
    /// not: the rest are queued behind it, so none overtakes an earlier one.
    /// Pushed back as one submit; a refusal of any task is the call's.
    pub async fn submit_tasks(
        &self,
        tasks: Vec<(NewTask, &CompiledPlacement)>,
    ) -> Result<Vec<SubmitOutcome>> {
        self.admit_submit()?;
        let now = self.now_ms();
        let mut placing = true;
        let mut placements = Vec::with_capacity(tasks.len());
        let mut submissions = Vec::with_capacity(tasks.len());
        for (task, placement) in tasks {
            // The batch that commits it reads the clock after this pick, so
            // the lease is stamped after it (see the dispatch round's
            // grants).
            let target = if placing && task.not_before_ms.is_none_or(|at| at <= now) {
                self.place_now(placement, &task)
            } else {
                None
            };
            placing = target.is_some();
            placements.push(placement);
            submissions.push(Submission {
                task,
                agent_id: target,
            });
        }
        let targets: Vec<Option<Uuid>> = submissions.iter().map(|s| s.agent_id).collect();
        let results = match self.commit_submits(submissions).await {
            Ok(results) => results,
            Err(err) => {
                for agent_id in targets.iter().flatten() {
                    self.give_back(*agent_id, None);
                }
                return Err(err);
            }
        };
        let mut outcomes = Vec::with_capacity(results.len());
        let mut failure = None;
        let mut queued = false;
        for ((result, target), placement) in results.into_iter().zip(targets).zip(placements) {
            let (record, created, grant) = match result {
                Ok(submitted) => submitted,
                Err(err) => {
                    if let Some(agent_id) = target {
                        self.give_back(agent_id, None);
                    }
                    failure.get_or_insert(err);
                    continue;
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
                // What the store's event for it does on other replicas
                // (this one does not hear it).
                self.note_queued_at(record.priority, record.queue_rank, record.id);
                self.note_due(record.not_before_ms);
                queued = true;
            }
            let queued_reason = (record.state == TaskState::Queued).then(|| {
                if record.not_before_ms > self.now_ms() {
                    QueuedReason::Backoff
                } else {
                    // Parked or waiting: whether any agent here could run
                    // it, not a whole explanation (at 30,000 agents,
                    // explaining every queued submit against each agent
                    // under the dispatcher's lock was most of the server's
                    // time).
                    if self.capable_here(placement, &record.namespace) {
                        QueuedReason::WaitingForCapacity
                    } else {
                        QueuedReason::Parked
                    }
                }
            });
            outcomes.push(SubmitOutcome {
                task: record,
                created,
                queued_reason,
            });
        }
        if queued {
            self.queue_moved();
            self.wake();
        }
        match failure {
            Some(err) => Err(err),
            None => Ok(outcomes),
        }
    }

    /// Picks and reserves an agent for a task being submitted, if one
    /// connected here has room (and is not held back for a late
    /// acknowledgement), the congestion window has room, and nothing waits
    /// in the queue that an agent with room could run. A task with
    /// a resource request or a spread is left to the dispatch round, whose
    /// grant records (and checks) its claim against the agent's live
    /// leases; so is one a concurrency limit counts (its key's, or the
    /// namespace's), whose grant checks the limit.
    fn place_now(&self, placement: &CompiledPlacement, task: &NewTask) -> Option<Uuid> {
        if self.stopping()
            || placement.claims_beyond_slots()
            || task.concurrency_key.is_some()
            || self.shared.settings.max_running_per_namespace > 0
            || !self.nothing_leasable_waits()
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
    /// submitted tasks than `max_submits_waiting` wait for a batch: the
    /// store is behind, and queueing more would only make every caller wait
    /// longer. The hint is a tenth of a second per full batch ahead.
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
            what: format!("{waiting} submitted tasks are waiting for the store (at most {limit})"),
            retry_after_ms: 100 * batches_ahead,
        })
    }

    /// Stores submissions (leasing each to its reserved agent, if any), in
    /// one batch, group-committed with other callers' submits.
    async fn commit_submits(&self, submissions: Vec<Submission>) -> Result<Vec<Result<Submitted>>> {
        let count = submissions.len();
        let results = match self.shared.submits.get() {
            Some(group) => group.submit(submissions).await?,
            None => {
                let now = self.now_ms();
                self.shared.store.submit_many(&submissions, now).await?
            }
        };
        if results.len() != count {
            return Err(Error::Corrupt {
                context: "submitting tasks",
                detail: format!("{count} submits produced {} results", results.len()),
            });
        }
        Ok(results)
    }
}
