//! What matching says about a stored task against the whole fleet (from
//! the store, so agents connected to other replicas count too): the
//! explanation ExplainTask shows, a queued task's reason, what a task
//! past its start deadline fails with, and the queue summarised by groups
//! of one kind and placement (GetQueueSummary, WatchQueue).

use std::collections::BTreeMap;

use switchyard_core::matcher::{self, AgentId, AgentView};
use switchyard_core::placement::{self as core_placement, CompiledPlacement, Placement};
use switchyard_core::resources::Held;

use super::Dispatcher;
use crate::error::{Error, Result};
use crate::model::{
    AgentParts, AgentRecord, Page, QueueGroup, QueueSummary, QueuedReason, TaskRecord, TaskState,
};

/// Groups of a queue summary listed (and explained) at most: an
/// explanation evaluates every agent, so a summary costs this many passes
/// over the fleet.
pub const SUMMARY_GROUPS: u32 = 100;

impl Dispatcher {
    /// Every agent of `namespace` as the matcher sees it (from the store, so
    /// agents connected to other replicas count too), with agent names by
    /// id. The store is listed without documents; an agent connected here
    /// is taken from the index (its view there is as current as the store's,
    /// and its document is not read and parsed again), the others' documents
    /// are read by id.
    pub async fn fleet(
        &self,
        namespace: &str,
    ) -> Result<(Vec<AgentView>, BTreeMap<AgentId, String>)> {
        // In the listing's order (by name), those read later left empty.
        let mut views: Vec<Option<AgentView>> = Vec::new();
        let mut names = BTreeMap::new();
        let mut elsewhere = Vec::new();
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
            {
                let state = self.state();
                for agent in &agents {
                    names.insert(agent.id.into(), agent.name.clone());
                    let view = state.index.get(agent.id.into()).cloned();
                    if view.is_none() {
                        elsewhere.push((views.len(), agent.id));
                    }
                    views.push(view);
                }
            }
            match next {
                Some(token) => page.after = Some(token),
                None => break,
            }
        }
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
        // An agent deleted between the two reads is left out.
        Ok((views.into_iter().flatten().collect(), names))
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
        let refused: BTreeMap<AgentId, String> = self
            .shared
            .store
            .task_refusals(record.id)
            .await?
            .into_iter()
            .map(|(agent, reason)| (agent.into(), reason))
            .collect();
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

impl Dispatcher {
    /// What `namespace`'s queue holds and why it waits: live tasks by
    /// state, and its queued tasks by kind and placement, each group
    /// explained against the whole fleet (read once). A group's due tasks
    /// count under its reason, those not yet due as BACKOFF; concurrency
    /// limits are not read (a group an agent could take now has no reason).
    /// Without `explain`, the groups are counted only (the fleet is not
    /// read): what a first look can show at once.
    pub async fn queue_summary(&self, namespace: &str, explain: bool) -> Result<QueueSummary> {
        let now = self.now_ms();
        let store = &self.shared.store;
        let states: Vec<(TaskState, u64)> = store
            .count_tasks()
            .await?
            .into_iter()
            .filter(|(ns, _, n)| ns == namespace && *n > 0)
            .map(|(_, state, n)| (state, n))
            .collect();
        let (rows, total) = store.queue_groups(namespace, now, SUMMARY_GROUPS).await?;
        if !explain {
            let not_yet_due: u64 = rows.iter().map(|r| r.not_yet_due.min(r.tasks)).sum();
            return Ok(QueueSummary {
                namespace: namespace.to_owned(),
                states,
                reasons: if not_yet_due > 0 {
                    vec![(QueuedReason::Backoff, not_yet_due)]
                } else {
                    Vec::new()
                },
                more_groups: total.saturating_sub(rows.len() as u64),
                groups: rows
                    .into_iter()
                    .map(|row| QueueGroup {
                        row,
                        reason: None,
                        explanation: String::new(),
                        capable_agents: 0,
                        eligible_agents: 0,
                    })
                    .collect(),
                agents_taking_work: 0,
                agents_registered: 0,
                explained: false,
            });
        }
        let (fleet, _) = self.fleet(namespace).await?;
        let none = BTreeMap::new();
        let no_failures = std::collections::BTreeSet::new();
        // By reason, in the contract's order.
        let order = [
            QueuedReason::Parked,
            QueuedReason::WaitingForCapacity,
            QueuedReason::Backoff,
        ];
        let mut counts = [0u64; 3];
        let mut count = |reason: QueuedReason, n: u64| {
            if let Some(i) = order.iter().position(|r| *r == reason) {
                counts[i] += n;
            }
        };
        let mut groups = Vec::with_capacity(rows.len());
        for row in rows {
            let compiled = compile_stored(&row.placement, &row.kind)?;
            let claimed;
            let views: &[AgentView] = if compiled.claims_beyond_slots() {
                let mut views = fleet.clone();
                self.add_claims(&compiled, &mut views).await?;
                claimed = views;
                &claimed
            } else {
                &fleet
            };
            let explained = matcher::explain_task(&compiled, namespace, views, &none, &no_failures);
            let reason = match explained.outcome {
                matcher::Outcome::Placeable => None,
                ref outcome => Some(QueuedReason::of(outcome)),
            };
            let not_yet_due = row.not_yet_due.min(row.tasks);
            if let Some(reason) = reason {
                count(reason, row.tasks - not_yet_due);
            }
            count(QueuedReason::Backoff, not_yet_due);
            let capable = explained
                .verdicts
                .iter()
                .filter(|v| v.satisfies_placement())
                .count();
            let eligible = explained.verdicts.iter().filter(|v| v.eligible).count();
            groups.push(QueueGroup {
                row,
                reason,
                explanation: explained.summary,
                capable_agents: u32::try_from(capable).unwrap_or(u32::MAX),
                eligible_agents: u32::try_from(eligible).unwrap_or(u32::MAX),
            });
        }
        let taking_work = fleet.iter().filter(|a| a.status.takes_work()).count();
        Ok(QueueSummary {
            namespace: namespace.to_owned(),
            states,
            reasons: order
                .into_iter()
                .zip(counts)
                .filter(|(_, n)| *n > 0)
                .collect(),
            more_groups: total.saturating_sub(groups.len() as u64),
            groups,
            agents_taking_work: u32::try_from(taking_work).unwrap_or(u32::MAX),
            agents_registered: u32::try_from(fleet.len()).unwrap_or(u32::MAX),
            explained: true,
        })
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
