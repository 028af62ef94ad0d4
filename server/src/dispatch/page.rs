//! One page of the queue walk: each task matched against the agents here
//! (the best with room picked and its room reserved in the index; or busy,
//! a capable agent without room, or parked, none here can run it), the
//! parked placements and the busy stretches remembered, then the picks
//! granted in one store batch and each lease pushed to its agent. A retried
//! task avoids the agents its earlier attempts failed on while another
//! agent here could take it (read from the store once per attempt count,
//! and cached while it waits); a task's placement is compiled once per kind
//! and placement, and shared.

use std::collections::HashMap;
use std::sync::Arc;

use switchyard_core::matcher::AgentId;
use switchyard_core::placement::{self, CompiledPlacement, Placement};
use tracing::{debug, warn};
use uuid::Uuid;

use super::Dispatcher;
use super::busy::BUSY_STRETCH;
use crate::error::Result;
use crate::model::{GrantOutcome, GrantRefusal, GrantRequest, ParkedPlacement, TaskRecord};

/// The most compiled placements a dispatcher keeps (by kind and
/// placement); one more clears them. Compiled by task once, they grew with
/// every task a walk read and no round here granted: 550 MiB while a
/// million parked tasks drained.
const MAX_COMPILED: usize = 4_096;

/// The most tasks whose (shared) compiled placement a dispatcher keeps by
/// task id; one more clears them. Keying every task read by its
/// placement's text (a serialization each) left SQLite preloaded, where the
/// dispatcher shares the writer's core, 6.7% lower.
const MAX_TASKS_COMPILED: usize = 65_536;

/// What matching one page of the queue did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PageOutcome {
    /// Tasks leased.
    pub(super) granted: usize,
    /// Grants the store refused (their tasks wait).
    pub(super) refused: usize,
    /// Tasks left out of later pages: no agent here can run them.
    pub(super) parked: usize,
    /// The first task of the page that is not parked.
    pub(super) first_live: Option<usize>,
    /// The congestion window filled before the page's end.
    pub(super) window_full: bool,
}

/// A page matched, not yet granted.
pub(super) struct Matched<'t> {
    /// A grant request for each task picked, its agent's room reserved.
    pub(super) requests: Vec<GrantRequest>,
    /// The tasks picked, in the order of `requests`.
    pub(super) picked: Vec<&'t TaskRecord>,
    /// What matching found (no lease granted yet).
    pub(super) outcome: PageOutcome,
}

impl Dispatcher {
    /// Matches one page of queued tasks, at most `room` of them (the
    /// congestion window's room), reserving each its agent's room;
    /// remembers the placements of tasks no agent here can run, and those
    /// busy in a stretch of the page.
    pub(super) async fn match_page<'t>(
        &self,
        tasks: &'t [TaskRecord],
        now: i64,
        room: usize,
    ) -> Result<Matched<'t>> {
        let mut requests = Vec::new();
        let mut picked: Vec<&TaskRecord> = Vec::new();
        let mut outcome = PageOutcome::default();
        // Placements found busy for every task of theirs, one entry each,
        // with how many of the page's tasks they hold (a stretch of them
        // is left out of later pages).
        let mut busy: Vec<(&TaskRecord, Arc<CompiledPlacement>, usize)> = Vec::new();
        let failed = self.failed_agents(tasks).await?;
        // Tasks whose concurrency limit was full when last tried, no lease
        // having ended since (read once for the page): they wait, not parked.
        let held: Vec<bool> = {
            let state = self.state();
            if state.queue.holds_none() {
                Vec::new()
            } else {
                tasks
                    .iter()
                    .map(|t| state.queue.held_by_limit(t, now))
                    .collect()
            }
        };
        for (i, task) in tasks.iter().enumerate() {
            if requests.len() >= room {
                // The window is full: the rest wait for the next round.
                outcome.first_live.get_or_insert(i);
                outcome.window_full = true;
                break;
            }
            if held.get(i).copied().unwrap_or(false) {
                outcome.first_live.get_or_insert(i);
                continue;
            }
            let Some(compiled) = self.compiled(task) else {
                outcome.first_live.get_or_insert(i);
                continue;
            };
            let avoid = failed.get(&task.id).map_or(&[][..], |a| a);
            match self.pick(task, &compiled, avoid, now) {
                Pick::Agent(request) => {
                    outcome.first_live.get_or_insert(i);
                    requests.push(request);
                    picked.push(task);
                }
                Pick::Busy { placement_wide } => {
                    outcome.first_live.get_or_insert(i);
                    if placement_wide {
                        let same =
                            |(t, c, _): &&mut (&TaskRecord, Arc<CompiledPlacement>, usize)| {
                                Arc::ptr_eq(c, &compiled) && t.namespace == task.namespace
                            };
                        match busy.iter_mut().find(same) {
                            Some((_, _, tasks)) => *tasks += 1,
                            None => busy.push((task, compiled, 1)),
                        }
                    }
                }
                Pick::Parked => outcome.parked += 1,
            }
        }
        busy.retain(|(_, _, of_page)| *of_page >= BUSY_STRETCH && of_page * 2 >= tasks.len());
        if !busy.is_empty() {
            let mut state = self.state();
            for (task, compiled, _) in busy {
                state.queue.busy.note(placement_key(task), compiled, now);
            }
        }
        Ok(Matched {
            requests,
            picked,
            outcome,
        })
    }

    /// Grants a matched page's requests in one batch and pushes each lease.
    pub(super) async fn grant_matched(
        &self,
        matched: Matched<'_>,
        now: i64,
    ) -> Result<PageOutcome> {
        let Matched {
            requests,
            picked,
            mut outcome,
        } = matched;
        if requests.is_empty() {
            return Ok(outcome);
        }
        // The grant's own time, read after the agents were picked: a slot
        // freed while the page was read was freed by a commit stamped
        // earlier, so the stored lease intervals of an agent never overlap.
        let granted_at = self.now_ms().max(now);
        let grant = self.shared.store.grant_leases(&requests, granted_at);
        let outcomes = crate::metrics::timed("grant_leases", grant).await?;
        for ((request, task), granted) in requests.iter().zip(picked).zip(outcomes) {
            match granted {
                GrantOutcome::Granted(lease) => {
                    outcome.granted += 1;
                    self.push_grant(task, &lease);
                }
                GrantOutcome::Refused(refusal) => {
                    outcome.refused += 1;
                    debug!(task = %task.id, agent = %request.agent_id, ?refusal, "grant refused");
                    if refusal == GrantRefusal::ConcurrencyLimit {
                        self.state().queue.limit_reached(task, now);
                    }
                    self.give_back(request.agent_id, Some(request.task_id));
                }
            }
        }
        Ok(outcome)
    }

    /// The best agent here for `task`, its slot reserved; or why there is
    /// none (busy: a capable agent has no room; parked: no agent here can
    /// run it, and its placement is remembered as parked).
    fn pick(
        &self,
        task: &TaskRecord,
        compiled: &Arc<CompiledPlacement>,
        failed: &[AgentId],
        now: i64,
    ) -> Pick {
        let mut state = self.state();
        let started = std::time::Instant::now();
        state.refused.matched(task.id, compiled);
        let refused = state.refused.of(task.id);
        let selected = state
            .index
            .select_retry(compiled, &task.namespace, refused, failed);
        metrics::histogram!(crate::metrics::MATCH_SECONDS).record(started.elapsed().as_secs_f64());
        if let Some(selection) = selected {
            let mut request = GrantRequest::one_slot(task.id, selection.agent_id.uuid());
            if let Some(v) = state.index.get(selection.agent_id)
                && let Ok(claim) =
                    compiled.assign(&v.document, v.capacity, v.active_leases, &v.held)
            {
                // What the claim was assigned beside, for the store to confirm
                // rather than read (a one-slot claim needs neither). An agent
                // holding nothing is left `None`: sharing its empty view would
                // make the reservation below copy it.
                if !claim.is_one_slot() && !v.held.is_empty() {
                    request.seen = Some(v.held.clone());
                }
                request.claim = claim;
            }
            let claim = request.claim.clone();
            self.reserve(&mut state, selection.agent_id, task.id, claim, now);
            return Pick::Agent(request);
        }
        if state
            .index
            .any_capable_except(compiled, &task.namespace, refused)
        {
            return Pick::Busy {
                placement_wide: refused.is_empty() && failed.is_empty(),
            };
        }
        if !refused.is_empty() && state.index.any_capable(compiled, &task.namespace) {
            // Every agent here that could run it refused it: it waits on
            // its own until one changes; its placement is not parked.
            return Pick::Parked;
        }
        if state.queue.park(placement_key(task), compiled.clone()) {
            // Until the walk finds the forgotten placements' tasks again,
            // nothing overtakes them.
            self.note_queued();
        }
        Pick::Parked
    }

    /// The agents on which earlier attempts of the page's retried tasks
    /// failed (by task; tasks without any are absent), read once per
    /// attempt count and cached while the task waits.
    async fn failed_agents(&self, tasks: &[TaskRecord]) -> Result<HashMap<Uuid, Arc<[AgentId]>>> {
        let mut out = HashMap::new();
        for task in tasks.iter().filter(|t| t.attempts > 0) {
            let cached = self
                .state()
                .failed
                .get(&task.id)
                .filter(|(attempts, _)| *attempts == task.attempts)
                .map(|(_, agents)| agents.clone());
            let agents = match cached {
                Some(agents) => agents,
                None => {
                    let read = self.shared.store.failed_agents(task.id);
                    let agents: Arc<[AgentId]> = crate::metrics::timed("failed_agents", read)
                        .await?
                        .into_iter()
                        .map(AgentId::from)
                        .collect();
                    self.state()
                        .failed
                        .insert(task.id, (task.attempts, agents.clone()));
                    agents
                }
            };
            if !agents.is_empty() {
                out.insert(task.id, agents);
            }
        }
        Ok(out)
    }

    /// The compiled placement of a task, for its kind (shared by the tasks
    /// of that kind and placement); `None` if the stored placement no
    /// longer parses or compiles (logged: the task waits).
    fn compiled(&self, task: &TaskRecord) -> Option<Arc<CompiledPlacement>> {
        if let Some(c) = self.state().task_placements.get(&task.id) {
            return Some(c.clone());
        }
        let key = (task.kind.clone(), task.placement.to_string());
        let shared = self.state().placements.get(&key).cloned();
        let compiled = match shared {
            Some(c) => c,
            None => self.compile(task, key)?,
        };
        let mut state = self.state();
        if state.task_placements.len() >= MAX_TASKS_COMPILED {
            state.task_placements.clear();
        }
        state.task_placements.insert(task.id, compiled.clone());
        Some(compiled)
    }

    /// Compiles a task's placement for its kind and keeps it under `key`.
    fn compile(&self, task: &TaskRecord, key: (String, String)) -> Option<Arc<CompiledPlacement>> {
        let placement: Placement = match serde_json::from_value(task.placement.clone()) {
            Ok(p) => p,
            Err(err) => {
                warn!(task = %task.id, cause = %err, "stored placement does not parse; task cannot be placed");
                return None;
            }
        };
        let compiled = match placement::compile(&placement) {
            Ok(c) => Arc::new(c.with_kind(&task.kind)),
            Err(err) => {
                warn!(task = %task.id, cause = %err, "stored placement does not compile");
                return None;
            }
        };
        let mut state = self.state();
        if state.placements.len() >= MAX_COMPILED {
            state.placements.clear();
        }
        state.placements.insert(key, compiled.clone());
        Some(compiled)
    }
}

/// What matching a task against the agents here found.
enum Pick {
    /// The request for this agent, what the lease would hold there reserved.
    Agent(GrantRequest),
    /// A capable agent, but none with room; for any task of its placement
    /// (`placement_wide`: this one has no agents to avoid) or this one.
    Busy { placement_wide: bool },
    /// No agent here can run it (or every one that could refused it).
    Parked,
}

/// The placement a task is parked or busy under: its namespace, kind and
/// placement.
fn placement_key(task: &TaskRecord) -> ParkedPlacement {
    ParkedPlacement {
        namespace: task.namespace.clone(),
        kind: task.kind.clone(),
        placement: task.placement.to_string(),
    }
}
