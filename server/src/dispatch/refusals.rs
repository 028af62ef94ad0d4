//! The tasks agents here refused: an agent that released a task saying it
//! cannot handle or decode it is not picked for that task again until it
//! changes (its kinds, more than volatile facts of its document, an
//! operator change) or registers again. The store keeps the same refusals
//! (`task_refusals`, for explanations on any replica); this is the copy
//! the dispatch round consults, a task at a time, without reading it.
//!
//! A task every capable agent here refused is parked on its own (its
//! placement is not: other tasks of it may still run), and read by each
//! walk like a parked placement's task until an agent changes.

use std::collections::HashMap;

use switchyard_core::matcher::AgentId;
use uuid::Uuid;

use super::Dispatcher;

/// The most tasks with refusals a dispatcher remembers. One more makes it
/// forget them all: each such task may then be offered once more to the
/// agents that refused it (every release counts toward the task's bound).
const MAX_REFUSED_TASKS: usize = 65_536;

/// Refusals by task.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    by_task: HashMap<Uuid, Vec<AgentId>>,
}

impl Refusals {
    /// The agents that refused `task_id`.
    pub(super) fn of(&self, task_id: Uuid) -> &[AgentId] {
        self.by_task.get(&task_id).map_or(&[], Vec::as_slice)
    }

    /// Records that `agent` refused `task_id`.
    fn note(&mut self, task_id: Uuid, agent: AgentId) {
        if !self.by_task.contains_key(&task_id) && self.by_task.len() >= MAX_REFUSED_TASKS {
            self.by_task.clear();
        }
        let agents = self.by_task.entry(task_id).or_default();
        if !agents.contains(&agent) {
            agents.push(agent);
        }
    }

    /// Forgets `agent`'s refusals; true if it had any.
    pub(super) fn lift(&mut self, agent: AgentId) -> bool {
        let mut lifted = false;
        self.by_task.retain(|_, agents| {
            let before = agents.len();
            agents.retain(|a| *a != agent);
            lifted |= agents.len() < before;
            !agents.is_empty()
        });
        lifted
    }

    /// Replaces `agent`'s refusals with `tasks` (as the store holds them);
    /// true if that lifted any.
    fn replace(&mut self, agent: AgentId, tasks: &[Uuid]) -> bool {
        let lifted = self.lift(agent);
        for task_id in tasks {
            self.note(*task_id, agent);
        }
        lifted
    }

    /// Forgets a task (it was granted).
    pub(super) fn forget(&mut self, task_id: Uuid) {
        self.by_task.remove(&task_id);
    }
}

impl Dispatcher {
    /// The agent released `task_id` saying it cannot handle or decode it:
    /// it is not picked for it again until its refusals are lifted.
    pub fn note_refusal(&self, task_id: Uuid, agent_id: Uuid) {
        self.state().refused.note(task_id, agent_id.into());
    }

    /// The agent changed (its kinds, or more than volatile facts of its
    /// document): the tasks it refused may go to it again.
    pub fn lift_refusals(&self, agent_id: Uuid) {
        let lifted = self.state().refused.lift(agent_id.into());
        self.refusals_lifted(lifted);
    }

    /// The agent's refusals as the store holds them now (after a change the
    /// store announced).
    pub(super) fn reload_refusals(&self, agent_id: Uuid, tasks: &[Uuid]) {
        let lifted = self.state().refused.replace(agent_id.into(), tasks);
        self.refusals_lifted(lifted);
    }

    /// Refused tasks may be placeable again: the walk reads the queue from
    /// its head, past no remembered parked head.
    fn refusals_lifted(&self, lifted: bool) {
        if lifted {
            self.state().queue.note_unparked();
            self.changed_agent(true);
        }
    }
}
