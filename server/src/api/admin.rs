//! `AgentAdminService`: operators see the fleet (documents with the tier
//! of every value, leases; live, through `WatchAgents`) and steer it
//! (drain, undrain, operator tier), and ask what-if questions without
//! changing anything.

use switchyard_core::kinds::{HandledKinds, check_kind};
use switchyard_core::matcher;
use switchyard_core::placement::{self as core_placement, Placement};
use switchyard_core::tier::with_operator_tier;
use switchyard_proto::v1::{self as pb, agent_admin_service_server::AgentAdminService};
use tonic::{Request, Response, Status};
use tracing::{info, instrument};

use super::convert::struct_to_json;
use super::live::{FleetWatch, LiveStream};
use super::task::verdicts;
use super::{AdminApi, duration_within, invalid, namespace, page_size, parse_id};
use crate::auth::Need;
use crate::error::Result;
use crate::model::{AgentParts, Page, TaskState};
use crate::wire;

/// The longest drain deadline an operator may set.
const MAX_DRAIN_DEADLINE_MS: i64 = 7 * 86_400_000;

#[tonic::async_trait]
impl AgentAdminService for AdminApi {
    async fn list_agents(
        &self,
        request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let req = request.into_inner();
        let ns = namespace("namespace", &req.namespace)?;
        caller.require(Need::Fleet, &ns)?;
        let statuses = req
            .statuses
            .iter()
            .enumerate()
            .map(|(i, s)| {
                pb::AgentStatus::try_from(*s)
                    .ok()
                    .and_then(wire::core_agent_status)
                    .ok_or_else(|| {
                        invalid(
                            &format!("statuses[{i}]"),
                            &format!("unknown agent status {s}"),
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let page = Page {
            size: page_size("page_size", req.page_size)?,
            after: (!req.page_token.is_empty()).then_some(req.page_token),
        };
        let (agents, next) = self
            .0
            .store
            .list_agents(&ns, &statuses, &page, AgentParts::Listing)
            .await?;
        let mut wire_agents: Vec<pb::Agent> =
            agents.iter().map(|a| wire::agent(a, false)).collect();
        let kept = super::bounds::fitting(&wire_agents);
        let next = if kept < wire_agents.len() {
            wire_agents.truncate(kept);
            Some(agents[kept - 1].name.clone())
        } else {
            next
        };
        Ok(Response::new(pb::ListAgentsResponse {
            agents: wire_agents,
            next_page_token: next.unwrap_or_default(),
        }))
    }

    #[instrument(skip_all, fields(agent = %request.get_ref().agent_id))]
    async fn get_agent(
        &self,
        request: Request<pb::GetAgentRequest>,
    ) -> Result<Response<pb::GetAgentResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let id = parse_id("agent_id", &request.get_ref().agent_id)?;
        let record = self.0.agent_for(&caller, id).await?;
        let leases = self.0.store.agent_leases(id).await?;
        Ok(Response::new(pb::GetAgentResponse {
            agent: Some(wire::agent(&record, true)),
            leases: leases.iter().map(wire::lease).collect(),
        }))
    }

    #[instrument(skip_all, fields(agent = %request.get_ref().agent_id))]
    async fn drain_agent(
        &self,
        request: Request<pb::DrainAgentRequest>,
    ) -> Result<Response<pb::DrainAgentResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let req = request.into_inner();
        let id = parse_id("agent_id", &req.agent_id)?;
        let now_ms = self.0.now_ms();
        let deadline_ms = req
            .deadline
            .as_ref()
            .map(|d| duration_within("deadline", d, 0..=MAX_DRAIN_DEADLINE_MS, "0s and 7d"))
            .transpose()?
            .map(|ms| now_ms.saturating_add(ms));
        self.0.agent_for(&caller, id).await?;
        let reason = if req.reason.is_empty() {
            "drained by operator".to_owned()
        } else {
            super::bounds::reason("reason", &req.reason)?
        };
        let record = self
            .0
            .store
            .set_agent_drained(id, true, Some(reason), deadline_ms, now_ms)
            .await?;
        info!(agent = %id, "agent drained");
        self.0.dispatcher.refresh_agent(id).await;
        Ok(Response::new(pb::DrainAgentResponse {
            agent: Some(wire::agent(&record, false)),
        }))
    }

    #[instrument(skip_all, fields(agent = %request.get_ref().agent_id))]
    async fn undrain_agent(
        &self,
        request: Request<pb::UndrainAgentRequest>,
    ) -> Result<Response<pb::UndrainAgentResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let id = parse_id("agent_id", &request.get_ref().agent_id)?;
        self.0.agent_for(&caller, id).await?;
        let record = self
            .0
            .store
            .set_agent_drained(id, false, None, None, self.0.now_ms())
            .await?;
        info!(agent = %id, "agent undrained");
        self.0.dispatcher.refresh_agent(id).await;
        Ok(Response::new(pb::UndrainAgentResponse {
            agent: Some(wire::agent(&record, false)),
        }))
    }

    #[instrument(skip_all, fields(agent = %request.get_ref().agent_id))]
    async fn set_agent_overrides(
        &self,
        request: Request<pb::SetAgentOverridesRequest>,
    ) -> Result<Response<pb::SetAgentOverridesResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let req = request.into_inner();
        let id = parse_id("agent_id", &req.agent_id)?;
        let mut overrides = match &req.overrides {
            Some(s) => struct_to_json(s)
                .map_err(|e| invalid(&format!("overrides.{}", e.path), e.reason))?,
            None => serde_json::json!({}),
        };
        if let Some(v) = self
            .0
            .settings
            .document_limits
            .violations(&overrides)
            .first()
        {
            return Err(invalid(&super::field_path("overrides", &v.path), &v.reason).into());
        }
        // Overrides are shown to every operator: no secret is kept in them.
        switchyard_core::redact::redact(&mut overrides, &Default::default());
        let record = self.0.agent_for(&caller, id).await?;
        // The agent's own provenance: recover it from the stored effective one.
        let (document, provenance) =
            with_operator_tier(&record.reported, &record.provenance, &overrides);
        let now = self.0.now_ms();
        let record = self
            .0
            .store
            .set_operator_overrides(id, &overrides, &document, &provenance, now)
            .await?;
        info!(agent = %id, generation = record.generation, "operator tier set");
        self.0.dispatcher.refresh_agent(id).await;
        Ok(Response::new(pb::SetAgentOverridesResponse {
            agent: Some(wire::agent(&record, true)),
        }))
    }

    async fn watch_agents(
        &self,
        request: Request<pb::WatchAgentsRequest>,
    ) -> Result<Response<LiveStream<pb::WatchAgentsResponse>>, Status> {
        let caller = self.0.caller(&request).await?;
        let req = request.into_inner();
        let ns = namespace("namespace", &req.namespace)?;
        caller.require(Need::Fleet, &ns)?;
        let selector = if req.selector.trim().is_empty() {
            None
        } else {
            super::bounds::check_len("selector", &req.selector, super::bounds::MAX_SELECTOR_BYTES)?;
            let parsed = switchyard_core::selector::parse(&req.selector)
                .map_err(|err| invalid("selector", &err.to_string()))?;
            Some(
                core_placement::compile(&parsed)
                    .map_err(|err| invalid("selector", &err.message))?,
            )
        };
        Ok(Response::new(FleetWatch::start(
            self.0.clone(),
            ns,
            selector,
        )))
    }

    async fn simulate_placement(
        &self,
        request: Request<pb::SimulatePlacementRequest>,
    ) -> Result<Response<pb::SimulatePlacementResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let req = request.into_inner();
        let ns = namespace("namespace", &req.namespace)?;
        caller.require(Need::Fleet, &ns)?;
        let api = &self.0;
        let mut summary = String::new();
        let mut wire_verdicts = Vec::new();
        let mut policy = None;
        let mut ranking = None;
        if req.placement.is_some() {
            let mut placement = super::bounds::wire_placement(req.placement.as_ref())?;
            // Ranked as a task submitted now would be: the namespace's
            // default applies.
            policy = Some(
                *placement
                    .policy
                    .get_or_insert(api.settings.placement_policy.of(&ns)),
            );
            let mut compiled = core_placement::compile(&placement)
                .map_err(|err| invalid(&format!("placement.{}", err.field), &err.message))?;
            if !req.kind.is_empty() {
                check_kind(&req.kind).map_err(|err| invalid("kind", &err.to_string()))?;
                compiled = compiled.with_kind(&req.kind);
            }
            let (fleet, names) = api.dispatcher.fleet_for(&ns, &compiled).await?;
            let explanation = matcher::explain(&compiled, &ns, &fleet);
            summary = explanation.summary.clone();
            ranking = matcher::ranking_note(&explanation, &fleet, &compiled, |id| {
                names.get(&id).cloned().unwrap_or_else(|| id.to_string())
            });
            wire_verdicts = verdicts(&explanation, &names, true);
        }
        let mut placeable = Vec::new();
        if let Some(doc) = &req.hypothetical_capabilities {
            let doc = struct_to_json(doc)
                .map_err(|e| invalid(&format!("hypothetical_capabilities.{}", e.path), e.reason))?;
            if let Some(v) = api.settings.document_limits.violations(&doc).first() {
                return Err(invalid(
                    &super::field_path("hypothetical_capabilities", &v.path),
                    &v.reason,
                )
                .into());
            }
            let kinds = if req.hypothetical_kinds.is_empty() {
                HandledKinds::every()
            } else {
                HandledKinds::parse(&req.hypothetical_kinds).map_err(|(i, err)| {
                    invalid(&format!("hypothetical_kinds[{i}]"), &err.to_string())
                })?
            };
            let agent = matcher::AgentView {
                held: Default::default(),
                agent_id: matcher::AgentId::from_name("hypothetical"),
                namespace: ns.clone(),
                status: matcher::AgentStatus::Ready,
                capacity: 1,
                active_leases: 0,
                last_granted_at_ms: None,
                document: std::sync::Arc::new(doc),
                kinds: std::sync::Arc::new(kinds),
            };
            let filter = crate::model::TaskFilter {
                namespace: ns.clone(),
                states: vec![TaskState::Queued],
                kind: None,
            };
            let mut page = Page {
                size: 1000,
                after: None,
            };
            'pages: loop {
                let (tasks, next) = api.store.list_tasks(&filter, &page).await?;
                for task in &tasks {
                    let Ok(placement) = serde_json::from_value::<Placement>(task.placement.clone())
                    else {
                        continue;
                    };
                    let Ok(compiled) = core_placement::compile(&placement) else {
                        continue;
                    };
                    let compiled = compiled.with_kind(&task.kind);
                    if matcher::evaluate(&compiled, &ns, &agent).eligible {
                        placeable.push(wire::task(task));
                        if placeable.len() >= 1000 {
                            break 'pages;
                        }
                    }
                }
                match next {
                    Some(token) => page.after = Some(token),
                    None => break,
                }
            }
        }
        // Within the page budget: the summary still counts every agent.
        wire_verdicts.truncate(super::bounds::fitting(&wire_verdicts));
        placeable.truncate(super::bounds::fitting(&placeable));
        Ok(Response::new(pb::SimulatePlacementResponse {
            summary,
            verdicts: wire_verdicts,
            placeable_tasks: placeable,
            policy: wire::placement::wire_policy(policy) as i32,
            ranking: ranking.unwrap_or_default(),
        }))
    }
}
