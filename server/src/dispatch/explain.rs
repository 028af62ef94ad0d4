//! What matching says about a stored task against the whole fleet (from
//! the store, so agents connected to other replicas count too): the
//! explanation ExplainTask shows, a queued task's reason, and what a task
//! past its start deadline fails with.

use std::collections::BTreeMap;

use switchyard_core::matcher::{self, AgentId, AgentView};
use switchyard_core::placement::{self as core_placement, CompiledPlacement, Placement};
use switchyard_core::resources::Held;

use super::Dispatcher;
use crate::error::{Error, Result};
use crate::model::{Page, TaskRecord};

impl Dispatcher {
    /// Every agent of `namespace` as the matcher sees it (from the store, so
    /// agents connected to other replicas count too), with agent names by id.
    pub async fn fleet(
        &self,
        namespace: &str,
    ) -> Result<(Vec<AgentView>, BTreeMap<AgentId, String>)> {
        let mut views = Vec::new();
        let mut names = BTreeMap::new();
        let mut page = Page {
            size: 1000,
            after: None,
        };
        loop {
            let (agents, next) = self.shared.store.list_agents(namespace, &[], &page).await?;
            for agent in &agents {
                names.insert(agent.id.into(), agent.name.clone());
                views.push(agent.view());
            }
            match next {
                Some(token) => page.after = Some(token),
                None => return Ok((views, names)),
            }
        }
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

/// A stored task's placement, compiled for its kind (it compiled when it
/// was submitted; a failure now is corrupt data).
pub(crate) fn stored_placement(record: &TaskRecord) -> Result<core_placement::CompiledPlacement> {
    let corrupt = |detail: String| Error::Corrupt {
        context: "reading a task's placement",
        detail,
    };
    let placement: Placement =
        serde_json::from_value(record.placement.clone()).map_err(|e| corrupt(e.to_string()))?;
    core_placement::compile(&placement)
        .map(|c| c.with_kind(&record.kind))
        .map_err(|e| corrupt(e.to_string()))
}
