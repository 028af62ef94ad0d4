//! What matching says about a stored task against the whole fleet (from
//! the store, so agents connected to other replicas count too): the
//! explanation ExplainTask shows, a queued task's reason, what a task
//! past its start deadline fails with, and the queue summarised by groups
//! of one kind and placement (GetQueueSummary, WatchQueue).

use std::collections::{BTreeMap, HashMap};

use switchyard_core::matcher::{self, AgentId, AgentView};
use switchyard_core::placement::{self as core_placement, CompiledPlacement, Placement};
use switchyard_core::resources::Held;

use super::Dispatcher;
use crate::error::{Error, Result};
use crate::model::{
    AgentParts, AgentRecord, Page, QueueGroup, QueueGroupRow, QueueSummary, QueuedReason,
    TaskRecord, TaskState,
};

/// Groups of a queue summary listed (and explained) at most: an
/// explanation evaluates every agent, so a summary costs this many passes
/// over the fleet.
pub const SUMMARY_GROUPS: u32 = 100;

impl Dispatcher {
    /// Every agent of `namespace` as the matcher sees it (from the store, so
    /// agents connected to other replicas count too), with agent names by
    /// id. The store is listed without documents; the views are
    /// [`Dispatcher::views_of`] those agents.
    pub async fn fleet(
        &self,
        namespace: &str,
    ) -> Result<(Vec<AgentView>, BTreeMap<AgentId, String>)> {
        let mut ids = Vec::new();
        let mut names = BTreeMap::new();
        let mut page = Page {
            size: 1000,
            after: None,
        };
        loop {
            let (agents, next) = self
                .shared
                .store
                .list_agents(namespace, &[], &page, AgentParts::Listing)
                .await?;
            for agent in agents {
                ids.push(agent.id);
                names.insert(agent.id.into(), agent.name);
            }
            match next {
                Some(token) => page.after = Some(token),
                None => break,
            }
        }
        Ok((self.views_of(ids).await?, names))
    }

    /// [`Dispatcher::fleet`] without the names: the store is read for the
    /// agents' ids alone (one statement however large the fleet).
    pub async fn fleet_views(&self, namespace: &str) -> Result<Vec<AgentView>> {
        let ids = self.shared.store.agent_ids(namespace).await?;
        self.views_of(ids).await
    }

    /// The matcher's views of the agents `ids`, in that order: an agent
    /// connected here is taken from the index (its view there is as current
    /// as the store's, and its document is not read and parsed again), the
    /// others' documents are read by id. An agent deleted meanwhile is left
    /// out.
    async fn views_of(&self, ids: Vec<uuid::Uuid>) -> Result<Vec<AgentView>> {
        let mut elsewhere = Vec::new();
        let mut views: Vec<Option<AgentView>> = {
            let state = self.state();
            ids.iter()
                .enumerate()
                .map(|(at, id)| {
                    let view = state.index.get((*id).into()).cloned();
                    if view.is_none() {
                        elsewhere.push((at, *id));
                    }
                    view
                })
                .collect()
        };
        if !elsewhere.is_empty() {
            let ids: Vec<uuid::Uuid> = elsewhere.iter().map(|(_, id)| *id).collect();
            let mut read: std::collections::HashMap<uuid::Uuid, AgentRecord> = self
                .shared
                .store
                .agents_by_ids(&ids, AgentParts::Matching)
                .await?
                .into_iter()
                .map(|a| (a.id, a))
                .collect();
            for (at, id) in elsewhere {
                views[at] = read.remove(&id).map(AgentRecord::into_view);
            }
        }
        Ok(views.into_iter().flatten().collect())
    }

    /// [`Dispatcher::fleet`] as matching `placement` sees it: for a
    /// placement that claims more than a slot (resources, a spread key),
    /// with what the busy agents' leases hold, so that explanations count
    /// free devices, amounts and spread as the grant does.
    pub async fn fleet_for(
        &self,
        namespace: &str,
        placement: &CompiledPlacement,
    ) -> Result<(Vec<AgentView>, BTreeMap<AgentId, String>)> {
        let (mut views, names) = self.fleet(namespace).await?;
        self.add_claims(placement, &mut views).await?;
        Ok((views, names))
    }

    /// Puts in `views` what the busy agents' leases hold, if `placement`
    /// claims more than a slot.
    async fn add_claims(
        &self,
        placement: &CompiledPlacement,
        views: &mut [AgentView],
    ) -> Result<()> {
        let busy: Vec<uuid::Uuid> = views
            .iter()
            .filter(|v| v.active_leases > 0)
            .map(|v| v.agent_id.uuid())
            .collect();
        if placement.claims_beyond_slots() && !busy.is_empty() {
            let mut claims = self.shared.store.live_claims(&busy).await?;
            for view in views {
                if let Some(held) = claims.remove(&view.agent_id.uuid()) {
                    view.held = std::sync::Arc::new(Held::of(held));
                }
            }
        }
        Ok(())
    }

    /// What matching says about a stored task against the whole fleet: its
    /// placement and kind, the agents that refused it, and (for a retry)
    /// those its attempts failed on; with agent names.
    pub async fn explanation(
        &self,
        record: &TaskRecord,
    ) -> Result<(matcher::Explanation, BTreeMap<AgentId, String>)> {
        let (fleet, names) = self.fleet(&record.namespace).await?;
        Ok((self.explain_against(record, fleet).await?, names))
    }

    /// Why each of `records`, queued tasks that are due, waits as matching
    /// says: PARKED or WAITING_FOR_CAPACITY, in `records`' order. Unlike
    /// [`Dispatcher::explanation`] per task, a listing's page is matched
    /// by group: each namespace's fleet is read once, each kind and
    /// placement matched once, and a task's refusals are read only when its
    /// group is not parked anyway (a task every capable agent refused is
    /// parked; the agents its attempts failed on do not park it).
    pub async fn queued_reasons(&self, records: &[&TaskRecord]) -> Result<Vec<QueuedReason>> {
        type Group = (String, String, String);
        let none = BTreeMap::new();
        let no_failures = std::collections::BTreeSet::new();
        let mut fleets: HashMap<String, Vec<AgentView>> = HashMap::new();
        let mut groups: HashMap<Group, (CompiledPlacement, Vec<AgentView>, QueuedReason)> =
            HashMap::new();
        let mut reasons = Vec::with_capacity(records.len());
        for record in records {
            let group = (
                record.namespace.clone(),
                record.kind.clone(),
                record.placement.to_string(),
            );
            if !groups.contains_key(&group) {
                if !fleets.contains_key(&record.namespace) {
                    let fleet = self.fleet_views(&record.namespace).await?;
                    fleets.insert(record.namespace.clone(), fleet);
                }
                let mut views = fleets.get(&record.namespace).cloned().unwrap_or_default();
                let compiled = stored_placement(record)?;
                self.add_claims(&compiled, &mut views).await?;
                let outcome = matcher::explain_task(
                    &compiled,
                    &record.namespace,
                    &views,
                    &none,
                    &no_failures,
                )
                .outcome;
                groups.insert(group.clone(), (compiled, views, QueuedReason::of(&outcome)));
            }
            let (compiled, views, reason) = groups.get(&group).ok_or_else(|| Error::Corrupt {
                context: "giving queued tasks their reasons",
                detail: "a group matched was not kept".to_owned(),
            })?;
            if *reason == QueuedReason::Parked {
                reasons.push(QueuedReason::Parked);
                continue;
            }
            let refused = self.refusals(record.id).await?;
            if refused.is_empty() {
                reasons.push(*reason);
            } else {
                let outcome = matcher::explain_task(
                    compiled,
                    &record.namespace,
                    views,
                    &refused,
                    &no_failures,
                )
                .outcome;
                reasons.push(QueuedReason::of(&outcome));
            }
        }
        Ok(reasons)
    }

    /// The agents that refused the task, with what each said, as the
    /// matcher takes them.
    async fn refusals(&self, task_id: uuid::Uuid) -> Result<BTreeMap<AgentId, String>> {
        Ok(self
            .shared
            .store
            .task_refusals(task_id)
            .await?
            .into_iter()
            .map(|(agent, reason)| (agent.into(), reason))
            .collect())
    }

    /// [`Dispatcher::explanation`] against `fleet`, the agents of the
    /// task's namespace as [`Dispatcher::fleet`] read them (read once for
    /// many tasks).
    pub(super) async fn explain_against(
        &self,
        record: &TaskRecord,
        mut fleet: Vec<AgentView>,
    ) -> Result<matcher::Explanation> {
        let compiled = stored_placement(record)?;
        self.add_claims(&compiled, &mut fleet).await?;
        let refused = self.refusals(record.id).await?;
        let failed: std::collections::BTreeSet<AgentId> = if record.attempts > 0 {
            let agents = self.shared.store.failed_agents(record.id).await?;
            agents.into_iter().map(AgentId::from).collect()
        } else {
            Default::default()
        };
        Ok(matcher::explain_task(
            &compiled,
            &record.namespace,
            &fleet,
            &refused,
            &failed,
        ))
    }
}

/// How long an explained queue summary is shown again to followers of the
/// queue if nothing moved since it was made, in milliseconds: no task
/// queued or changed and no agent changed, here or (as the store tells)
/// on another replica. It bounds what time alone changes (tasks coming
/// due) and a change the dispatcher hears of only after a reader.
pub const SUMMARY_REUSE_MS: i64 = 2_000;

/// A namespace's queue as counted, before it is explained: what
/// [`Dispatcher::count_queue`] read, and when.
#[derive(Debug, Clone)]
pub struct QueueCount {
    namespace: String,
    /// The pulses (queue, fleet) before the store was read.
    pulses: (u64, u64),
    /// The clock then, in milliseconds.
    at_ms: i64,
    states: Vec<(TaskState, u64)>,
    rows: Vec<QueueGroupRow>,
    /// Groups in all (`rows` are the first [`SUMMARY_GROUPS`]).
    total: u64,
}

/// The last explained summary of a namespace, and what it was made from.
#[derive(Debug, Clone)]
pub(super) struct MadeSummary {
    pulses: (u64, u64),
    at_ms: i64,
    summary: QueueSummary,
}

impl Dispatcher {
    /// What `namespace`'s queue holds and why it waits: live tasks by
    /// state, and its queued tasks by kind and placement, each group
    /// explained against the whole fleet (read once). A group's due tasks
    /// count under its reason, those not yet due as BACKOFF; concurrency
    /// limits are not read (a group an agent could take now has no reason).
    /// Without `explain`, the groups are counted only (the fleet is not
    /// read): what a first look can show at once. Always read afresh (a
    /// caller sees what it just did).
    pub async fn queue_summary(&self, namespace: &str, explain: bool) -> Result<QueueSummary> {
        let count = self.count_queue(namespace).await?;
        if explain {
            self.explain_queue(count).await
        } else {
            Ok(count.summary())
        }
    }

    /// The explained summary for a follower of the queue (WatchQueue): made
    /// once for all of them while nothing moves, the one made less than
    /// [`SUMMARY_REUSE_MS`] ago shown again if no pulse moved since (on a
    /// large fleet it takes a pass over every agent per group, and every
    /// open console asks for it). A follower subscribes to the pulses
    /// before it asks, so a change this summary misses wakes it.
    pub async fn followed_summary(&self, namespace: &str) -> Result<QueueSummary> {
        match self.fresh_summary(namespace) {
            Some(made) => Ok(made),
            None => self.queue_summary(namespace, true).await,
        }
    }

    /// The explained summary of `namespace` made last, if it is still
    /// fresh (see [`Dispatcher::followed_summary`]).
    pub fn fresh_summary(&self, namespace: &str) -> Option<QueueSummary> {
        let pulses = self.pulses();
        let now = self.now_ms();
        let made = self.shared.summaries.lock().ok()?;
        let made = made.get(namespace)?;
        let age = now - made.at_ms;
        (made.pulses == pulses && (0..SUMMARY_REUSE_MS).contains(&age))
            .then(|| made.summary.clone())
    }

    /// The pulses of the queue and the fleet now.
    fn pulses(&self) -> (u64, u64) {
        (
            *self.shared.queue_pulse.borrow(),
            *self.shared.fleet_pulse.borrow(),
        )
    }

    /// Counts `namespace`'s queue: its live tasks by state and its queued
    /// tasks by kind and placement (the first [`SUMMARY_GROUPS`] groups).
    pub async fn count_queue(&self, namespace: &str) -> Result<QueueCount> {
        // Before reading: a change while the store is read makes what is
        // made of it stale.
        let pulses = self.pulses();
        let at_ms = self.now_ms();
        let store = &self.shared.store;
        // Two statements, on two connections at once (on PostgreSQL each a
        // pass over the queue: about 70 ms and 120 ms at 100,000 queued).
        let (counts, (rows, total)) = tokio::try_join!(
            store.count_tasks(),
            store.queue_groups(namespace, at_ms, SUMMARY_GROUPS)
        )?;
        let states: Vec<(TaskState, u64)> = counts
            .into_iter()
            .filter(|(ns, _, n)| ns == namespace && *n > 0)
            .map(|(_, state, n)| (state, n))
            .collect();
        Ok(QueueCount {
            namespace: namespace.to_owned(),
            pulses,
            at_ms,
            states,
            rows,
            total,
        })
    }

    /// Explains a counted queue: each group matched against the whole
    /// fleet (read once), its reason, and which constraint fails on how
    /// many agents. The summary is kept for other callers.
    pub async fn explain_queue(&self, count: QueueCount) -> Result<QueueSummary> {
        let fleet = self.fleet_views(&count.namespace).await?;
        let mut summary = count.summary();
        // Each group's placement, and for one that claims more than a slot
        // the fleet with what the busy agents' leases hold (read here: the
        // matching itself reads nothing).
        let mut work = Vec::with_capacity(summary.groups.len());
        for group in &summary.groups {
            let compiled = compile_stored(&group.row.placement, &group.row.kind)?;
            let claimed = if compiled.claims_beyond_slots() {
                let mut views = fleet.clone();
                self.add_claims(&compiled, &mut views).await?;
                Some(views)
            } else {
                None
            };
            work.push((compiled, claimed));
        }
        // A pass over the whole fleet per group (16 groups over 10,000
        // agents: about 0.3 s of one core): off the async workers, so that
        // sessions and grants on them do not wait, and on a host of four
        // cores or more spread over half of them.
        let taking_work = fleet.iter().filter(|a| a.status.takes_work()).count();
        let registered = fleet.len();
        let namespace = count.namespace.clone();
        // Half the cores at most: dispatch, sessions and the store keep the rest.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get() / 2);
        let matched = match tokio::task::spawn_blocking(move || {
            match_groups(&work, &namespace, &fleet, threads)
        })
        .await
        {
            Ok(matched) => matched,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => return Err(Error::Unavailable("the server is shutting down".into())),
        };
        let mut reasons = ReasonCounts::default();
        for (group, matched) in summary.groups.iter_mut().zip(matched) {
            group.reason = match matched.outcome {
                matcher::Outcome::Placeable => None,
                ref outcome => Some(QueuedReason::of(outcome)),
            };
            let not_yet_due = group.row.not_yet_due.min(group.row.tasks);
            if let Some(reason) = group.reason {
                reasons.add(reason, group.row.tasks - not_yet_due);
            }
            reasons.add(QueuedReason::Backoff, not_yet_due);
            group.explanation = matched.summary;
            group.capable_agents = u32::try_from(matched.capable).unwrap_or(u32::MAX);
            group.eligible_agents = u32::try_from(matched.eligible).unwrap_or(u32::MAX);
        }
        summary.reasons = reasons.listed();
        summary.agents_taking_work = u32::try_from(taking_work).unwrap_or(u32::MAX);
        summary.agents_registered = u32::try_from(registered).unwrap_or(u32::MAX);
        summary.explained = true;
        if let Ok(mut made) = self.shared.summaries.lock() {
            let newer = made
                .get(&count.namespace)
                .is_none_or(|m| m.at_ms <= count.at_ms);
            if newer {
                made.insert(
                    count.namespace,
                    MadeSummary {
                        pulses: count.pulses,
                        at_ms: count.at_ms,
                        summary: summary.clone(),
                    },
                );
            }
        }
        Ok(summary)
    }
}

/// What matching says about one group of the queue.
struct GroupMatch {
    outcome: matcher::Outcome,
    /// The explanation's summary line.
    summary: String,
    /// Agents that satisfy the placement, now or once they have room.
    capable: usize,
    /// Agents that could take a task of the group now.
    eligible: usize,
}

/// Matches each group (its placement, and the views it is matched against
/// when they are not `fleet`'s) against the fleet, the groups split over
/// up to `threads` threads; the results in the groups' order.
fn match_groups(
    work: &[(CompiledPlacement, Option<Vec<AgentView>>)],
    namespace: &str,
    fleet: &[AgentView],
    threads: usize,
) -> Vec<GroupMatch> {
    let none = BTreeMap::new();
    let no_failures = std::collections::BTreeSet::new();
    let one = |(compiled, claimed): &(CompiledPlacement, Option<Vec<AgentView>>)| {
        let views = claimed.as_deref().unwrap_or(fleet);
        let explained = matcher::explain_task(compiled, namespace, views, &none, &no_failures);
        GroupMatch {
            capable: explained
                .verdicts
                .iter()
                .filter(|v| v.satisfies_placement())
                .count(),
            eligible: explained.verdicts.iter().filter(|v| v.eligible).count(),
            outcome: explained.outcome,
            summary: explained.summary,
        }
    };
    if threads < 2 || work.len() < 2 {
        return work.iter().map(one).collect();
    }
    let per_thread = work.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = work
            .chunks(per_thread)
            .map(|part| scope.spawn(|| part.iter().map(one).collect::<Vec<_>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|part| {
                part.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

impl QueueCount {
    /// The summary as counted: groups without reasons, and the tasks not
    /// yet due as BACKOFF.
    pub fn summary(&self) -> QueueSummary {
        let not_yet_due: u64 = self.rows.iter().map(|r| r.not_yet_due.min(r.tasks)).sum();
        let mut reasons = ReasonCounts::default();
        reasons.add(QueuedReason::Backoff, not_yet_due);
        QueueSummary {
            namespace: self.namespace.clone(),
            states: self.states.clone(),
            reasons: reasons.listed(),
            more_groups: self.total.saturating_sub(self.rows.len() as u64),
            groups: self
                .rows
                .iter()
                .map(|row| QueueGroup {
                    row: row.clone(),
                    reason: None,
                    explanation: String::new(),
                    capable_agents: 0,
                    eligible_agents: 0,
                })
                .collect(),
            agents_taking_work: 0,
            agents_registered: 0,
            explained: false,
            made_at_ms: self.at_ms,
        }
    }
}

/// Queued tasks by reason, listed in the contract's order.
#[derive(Default)]
struct ReasonCounts([u64; 3]);

impl ReasonCounts {
    const ORDER: [QueuedReason; 3] = [
        QueuedReason::Parked,
        QueuedReason::WaitingForCapacity,
        QueuedReason::Backoff,
    ];

    fn add(&mut self, reason: QueuedReason, n: u64) {
        if let Some(i) = Self::ORDER.iter().position(|r| *r == reason) {
            self.0[i] += n;
        }
    }

    /// The reasons with tasks, and how many.
    fn listed(&self) -> Vec<(QueuedReason, u64)> {
        Self::ORDER
            .into_iter()
            .zip(self.0)
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// A stored task's placement, compiled for its kind (it compiled when it
/// was submitted; a failure now is corrupt data).
pub(crate) fn stored_placement(record: &TaskRecord) -> Result<core_placement::CompiledPlacement> {
    compile_stored(&record.placement, &record.kind)
}

/// A stored placement compiled for `kind`.
fn compile_stored(placement: &serde_json::Value, kind: &str) -> Result<CompiledPlacement> {
    let corrupt = |detail: String| Error::Corrupt {
        context: "reading a task's placement",
        detail,
    };
    let placement: Placement =
        serde_json::from_value(placement.clone()).map_err(|e| corrupt(e.to_string()))?;
    core_placement::compile(&placement)
        .map(|c| c.with_kind(kind))
        .map_err(|e| corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use switchyard_core::kinds::HandledKinds;
    use switchyard_core::matcher::AgentStatus;
    use switchyard_core::selector;

    use super::*;

    fn agent(i: usize) -> AgentView {
        AgentView {
            agent_id: AgentId::from_name(&format!("agent-{i}")),
            namespace: "default".into(),
            status: AgentStatus::Ready,
            capacity: 1,
            active_leases: i.is_multiple_of(3).into(),
            last_granted_at_ms: None,
            document: Arc::new(json!({"tags": [format!("t{}", i % 7), format!("u{}", i % 5)]})),
            kinds: Arc::new(HandledKinds::every()),
            held: Default::default(),
        }
    }

    #[test]
    fn groups_matched_on_several_threads_come_back_in_their_order() {
        let fleet: Vec<AgentView> = (0..60).map(agent).collect();
        // More groups than threads, each failing on a different count of agents.
        let work: Vec<(CompiledPlacement, Option<Vec<AgentView>>)> = (0..9)
            .map(|k| {
                let text = format!("t{k}");
                let compiled = core_placement::compile(&selector::parse(&text).unwrap()).unwrap();
                (compiled, None)
            })
            .collect();
        let matched = match_groups(&work, "default", &fleet, 3);
        assert_eq!(matched.len(), work.len());
        for ((compiled, _), got) in work.iter().zip(&matched) {
            let alone = matcher::explain(compiled, "default", &fleet);
            assert_eq!(got.summary, alone.summary);
            assert_eq!(got.outcome, alone.outcome);
            let capable = alone.verdicts.iter().filter(|v| v.satisfies_placement());
            assert_eq!(got.capable, capable.count());
        }
        // The groups differ, so an answer out of order would not match.
        assert_ne!(matched[0].summary, matched[8].summary);
    }
}
