//! The tasks agents here refused: an agent that released a task saying it
//! cannot handle or decode it is not picked for that task again until it
//! changes (its kinds, more than volatile facts of its document, an
//! operator change) or registers again. The store keeps the same refusals
//! (`task_refusals`, for explanations on any replica); this is the copy
//! the dispatch round consults, a task at a time, without reading it.
//!
//! A task every capable agent here refused is parked on its own (its
//! placement is not: other tasks of it may still run), and read by each
//! walk like a parked placement's task; an agent that connects or changes
//! and could run it (it did not refuse it) makes the next round read the
//! queue from its head, as an unparked placement does.

use std::collections::HashMap;
use std::sync::Arc;

use switchyard_core::matcher::{self, AgentId, AgentView};
use switchyard_core::placement::CompiledPlacement;
use uuid::Uuid;

use super::{Dispatcher, State};

/// The most tasks with refusals a dispatcher remembers. One more makes it
/// forget them all: each such task may then be offered once more to the
/// agents that refused it (every release counts toward the task's bound).
const MAX_REFUSED_TASKS: usize = 4_096;

/// Refusals by task.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    by_task: HashMap<Uuid, Refused>,
}

/// One task's refusals.
#[derive(Debug, Default)]
struct Refused {
    /// The agents that refused it.
    agents: Vec<AgentId>,
    /// Its compiled placement, once a round matched it since.
    placement: Option<Arc<CompiledPlacement>>,
}

impl Refusals {
    /// The agents that refused `task_id`.
    pub(super) fn of(&self, task_id: Uuid) -> &[AgentId] {
        self.by_task
            .get(&task_id)
            .map_or(&[], |refused| refused.agents.as_slice())
    }

    /// Keeps the compiled placement of `task_id`, which agents refused (a
    /// round matched it), for [`Refusals::could_take`]; nothing for a task
    /// without refusals.
    pub(super) fn matched(&mut self, task_id: Uuid, placement: &Arc<CompiledPlacement>) {
        if let Some(refused) = self.by_task.get_mut(&task_id)
            && refused.placement.is_none()
        {
            refused.placement = Some(placement.clone());
        }
    }

    /// Records that `agent` refused `task_id`.
    fn note(&mut self, task_id: Uuid, agent: AgentId) {
        if !self.by_task.contains_key(&task_id) && self.by_task.len() >= MAX_REFUSED_TASKS {
            self.by_task.clear();
        }
        let agents = &mut self.by_task.entry(task_id).or_default().agents;
        if !agents.contains(&agent) {
            agents.push(agent);
        }
    }

    /// Forgets `agent`'s refusals; true if it had any.
    pub(super) fn lift(&mut self, agent: AgentId) -> bool {
        let mut lifted = false;
        self.by_task.retain(|_, refused| {
            let before = refused.agents.len();
            refused.agents.retain(|a| *a != agent);
            lifted |= refused.agents.len() < before;
            !refused.agents.is_empty()
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

    /// Whether `view`'s agent, with a slot free, could run a task that
    /// others refused (its compiled placement, kept once a round matched
    /// it, says so); a task of another namespace may answer yes: the walk
    /// then only reads again.
    fn could_take(&self, view: &AgentView) -> bool {
        view.status.takes_work()
            && view.active_leases < view.capacity
            && self.by_task.values().any(|refused| {
                !refused.agents.contains(&view.agent_id)
                    && refused
                        .placement
                        .as_ref()
                        .is_some_and(|p| matcher::satisfies(p, view))
            })
    }
}

impl State {
    /// After `agent`'s view changed in the index (it connected, or its
    /// document, kinds or status changed): forgets the parked placements it
    /// can run, and notes whether it could run a task others refused; true
    /// if either, and the next round reads the queue from its head.
    pub(super) fn unpark_for(&mut self, agent: AgentId) -> bool {
        let State {
            index,
            queue,
            refused,
            ..
        } = self;
        let Some(view) = index.get(agent) else {
            return false;
        };
        if queue.unpark_for(view) {
            return true;
        }
        if refused.could_take(view) {
            queue.note_unparked();
            return true;
        }
        false
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
