//! `RegisterAgent`: records (or refreshes) an agent and its full document,
//! and starts a new session epoch. The operator tier survives a
//! re-registration: it is merged over the new report.

use switchyard_core::kinds::{HandledKinds, KindError};
use switchyard_core::tier::with_operator_tier;
use switchyard_proto::v1 as pb;
use tracing::{info, warn};

use super::document;
use crate::api::convert::duration;
use crate::api::{Api, invalid, namespace};
use crate::auth::{Caller, Need};
use crate::error::{Error, Result};
use crate::model::AgentRegistration;

impl Api {
    /// Registers the agent `req` describes, for `caller`.
    pub(super) async fn register(
        &self,
        caller: &Caller,
        req: pb::RegisterAgentRequest,
    ) -> Result<pb::RegisterAgentResponse> {
        let namespace = namespace("namespace", &req.namespace)?;
        caller.require(Need::Agent, &namespace)?;
        caller.may_register(&req.name)?;
        self.admit_agent(&namespace, &req.name).await?;
        if req.name.trim().is_empty() || req.name.len() > 253 {
            return Err(invalid("name", "is required, at most 253 bytes"));
        }
        if req.capacity == 0 || req.capacity > 10_000 {
            return Err(invalid("capacity", "must be between 1 and 10000"));
        }
        let handled_kinds = handled_kinds("handled_kinds", &req.handled_kinds)?;
        let doc = req.capabilities.unwrap_or_default();
        let (reported, server_rejections) = document::accept(self, "capabilities", &doc)?;
        let provenance = document::provenance(&req.provenance);
        let registration = AgentRegistration {
            namespace,
            name: req.name,
            reported: reported.clone(),
            document: reported.clone(),
            provenance: provenance.clone(),
            rejections: document::rejections(&req.rejections, server_rejections.clone()),
            capacity: req.capacity,
            labels: crate::api::bounds::labels("labels", req.labels)?,
            runner: req.runner,
            handled_kinds,
            registered_by: caller.principal().unwrap_or_default().to_owned(),
        };
        let mut record = self
            .store
            .register_agent(&registration, self.now_ms())
            .await?;
        if record
            .operator_overrides
            .as_object()
            .is_some_and(|m| !m.is_empty())
        {
            let overrides = record.operator_overrides.clone();
            let (document, provenance) = with_operator_tier(&reported, &provenance, &overrides);
            record = self
                .store
                .set_operator_overrides(
                    record.id,
                    &overrides,
                    &document,
                    &provenance,
                    self.now_ms(),
                )
                .await?;
        }
        info!(agent = %record.id, name = %record.name, epoch = record.session_epoch, "agent registered");
        if record.contention.contended(record.last_seen_at_ms) {
            warn!(
                agent = %record.id,
                name = %record.name,
                takeovers = record.contention.takeovers,
                runner = %record.runner,
                replaced = %record.contention.replaced_runner,
                "two live sessions contend for one agent name: each registration ends the other's session"
            );
        }
        Ok(pb::RegisterAgentResponse {
            agent_id: record.id.to_string(),
            session_epoch: record.session_epoch,
            heartbeat_interval: Some(duration(self.dispatcher.settings().heartbeat_interval_ms)),
            lease_ttl: Some(duration(self.settings.default_lease_ttl_ms)),
            capability_generation: record.generation,
            rejections: document::wire_rejections(&server_rejections),
        })
    }

    /// Refuses a new agent of a namespace at its `--max-agents-per-namespace`
    /// cap; an agent already registered under `name` may always come back.
    async fn admit_agent(&self, namespace: &str, name: &str) -> Result<()> {
        let cap = self.settings.max_agents_per_namespace;
        if cap == 0 {
            return Ok(());
        }
        let agents = self.store.agents_in_namespace(namespace).await?;
        if agents >= cap && !self.agent_named(namespace, name).await? {
            return Err(Error::ResourceExhausted(format!(
                "namespace {namespace} has {agents} agents; the limit is {cap} (--max-agents-per-namespace)"
            )));
        }
        Ok(())
    }

    /// Whether an agent of this name is registered in the namespace.
    async fn agent_named(&self, namespace: &str, name: &str) -> Result<bool> {
        let (_, names) = self.dispatcher.fleet(namespace).await?;
        Ok(names.values().any(|n| n == name))
    }
}

/// An agent's handled kinds, validated (INVALID_ARGUMENT naming the first
/// bad one, `field[i]`) and spelled the one way the store keeps them.
pub(super) fn handled_kinds(field: &str, patterns: &[String]) -> Result<Vec<String>> {
    match HandledKinds::parse(patterns) {
        Ok(kinds) => Ok(kinds.patterns()),
        Err((_, err @ KindError::TooMany(_))) => Err(invalid(field, &err.to_string())),
        Err((i, err)) => Err(invalid(&format!("{field}[{i}]"), &err.to_string())),
    }
}
