//! How the CLI prints tasks, agents and explanations: aligned text for
//! people, and JSON (one document per line, field names as in the
//! contract) for scripts.

use serde_json::{Value, json};
use switchyard_proto::v1 as pb;

use super::{Output, Printer};
use switchyard_proto::convert;

fn opt_struct(s: Option<&prost_types::Struct>) -> Value {
    s.and_then(|s| convert::struct_to_json(s).ok())
        .unwrap_or(Value::Null)
}

fn ts(t: Option<&prost_types::Timestamp>) -> Value {
    t.map_or(Value::Null, |t| json!(convert::timestamp_ms(t)))
}

fn state_name(task: &pb::Task) -> String {
    task.state()
        .as_str_name()
        .trim_start_matches("TASK_STATE_")
        .to_ascii_lowercase()
}

fn queued_reason(task: &pb::Task) -> Option<String> {
    match task.queued_reason() {
        pb::QueuedReason::Unspecified => None,
        reason => Some(
            reason
                .as_str_name()
                .trim_start_matches("QUEUED_REASON_")
                .to_ascii_lowercase(),
        ),
    }
}

/// A task as JSON.
pub(super) fn task_json(task: &pb::Task) -> Value {
    json!({
        "task_id": task.task_id,
        "namespace": task.namespace,
        "kind": task.kind,
        "state": state_name(task),
        "queued_reason": queued_reason(task),
        "priority": task.priority,
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "retry": task.retry.as_ref().map(|r| json!({
            "initial_backoff_ms": r.initial_backoff.as_ref().and_then(convert::duration_ms),
            "max_backoff_ms": r.max_backoff.as_ref().and_then(convert::duration_ms),
            "multiplier": r.multiplier,
            "jitter": r.jitter,
        })),
        "start_timeout_ms": task.start_timeout.as_ref().and_then(convert::duration_ms),
        "execution_timeout_ms": task.execution_timeout.as_ref().and_then(convert::duration_ms),
        "cancel_grace_ms": task.cancel_grace.as_ref().and_then(convert::duration_ms),
        "cancel_deadline_ms": ts(task.cancel_deadline.as_ref()),
        "fairness_key": (!task.fairness_key.is_empty()).then_some(&task.fairness_key),
        "fairness_weight": (task.fairness_weight > 0).then_some(task.fairness_weight),
        "concurrency_key": (!task.concurrency_key.is_empty()).then_some(&task.concurrency_key),
        "payload": opt_struct(task.payload.as_ref()),
        "result": opt_struct(task.result.as_ref()),
        "error": task.error.as_ref().map(|e| json!({"message": e.message, "code": e.code, "retryable": e.retryable})),
        "lease": task.lease.as_ref().map(|l| json!({
            "lease_id": l.lease_id, "agent_id": l.agent_id, "fencing_token": l.fencing_token,
            "expires_at_ms": ts(l.expires_at.as_ref()),
        })),
        "progress": task.progress.as_ref().map(|p| json!({"percent": p.percent, "message": p.message})),
        "cancel_requested": task.cancel_requested,
        "idempotency_key": task.idempotency_key,
        "labels": task.labels,
        "created_at_ms": ts(task.created_at.as_ref()),
        "updated_at_ms": ts(task.updated_at.as_ref()),
    })
}

fn agent_status(agent: &pb::Agent) -> String {
    agent
        .status()
        .as_str_name()
        .trim_start_matches("AGENT_STATUS_")
        .to_ascii_lowercase()
}

/// An agent as JSON.
pub(super) fn agent_json(agent: &pb::Agent, leases: &[pb::Lease]) -> Value {
    let caps = agent.capabilities.as_ref();
    json!({
        "agent_id": agent.agent_id,
        "name": agent.name,
        "namespace": agent.namespace,
        "status": agent_status(agent),
        "status_reasons": agent.status_reasons,
        "capacity": agent.capacity,
        "active_leases": agent.active_leases,
        "drained": agent.drained,
        "drain_deadline_ms": ts(agent.drain_deadline.as_ref()),
        "labels": agent.labels,
        "runner": agent.runner,
        "generation": caps.map(|c| c.generation),
        "document": opt_struct(caps.and_then(|c| c.document.as_ref())),
        "provenance": caps.map(|c| c.provenance.iter().map(|p| (p.path.clone(), json!(tier_name(p.tier())))).collect::<serde_json::Map<_, _>>()),
        "rejections": caps.map(|c| c.rejections.iter().map(|r| json!({"tier": tier_name(r.tier()), "path": r.path, "reason": r.reason})).collect::<Vec<_>>()),
        "leases": leases.iter().map(|l| json!({"lease_id": l.lease_id, "task_id": l.task_id, "fencing_token": l.fencing_token})).collect::<Vec<_>>(),
        "last_seen_at_ms": ts(agent.last_seen_at.as_ref()),
    })
}

fn tier_name(tier: pb::Tier) -> String {
    tier.as_str_name()
        .trim_start_matches("TIER_")
        .to_ascii_lowercase()
}

fn verdict_json(v: &pb::AgentVerdict) -> Value {
    json!({
        "agent_id": v.agent_id, "agent_name": v.agent_name, "eligible": v.eligible, "capable": v.capable,
        "reason": v.reason, "preference_score": v.preference_score, "rank": v.rank,
    })
}

impl Printer {
    fn json(&self, value: &Value) {
        println!("{value}");
    }

    pub(super) fn task(&self, task: &pb::Task, note: &str) {
        if self.0 == Output::Json {
            return self.json(&task_json(task));
        }
        let mut line = format!("{}  {}  {}", task.task_id, task.kind, state_name(task));
        if let Some(reason) = queued_reason(task) {
            line.push_str(&format!(" ({reason})"));
        }
        if !note.is_empty() {
            line.push_str(&format!("  [{note}]"));
        }
        println!("{line}");
        if let Some(error) = &task.error {
            println!("  error: {} ({})", error.message, error.code);
        }
        if let Some(result) = task
            .result
            .as_ref()
            .and_then(|r| convert::struct_to_json(r).ok())
        {
            println!("  result: {result}");
        }
    }

    pub(super) fn task_list(&self, tasks: &[pb::Task]) {
        if self.0 == Output::Json {
            return self.json(&Value::Array(tasks.iter().map(task_json).collect()));
        }
        println!(
            "{:<36}  {:<16}  {:<10}  {:>8}  PRIORITY",
            "TASK", "KIND", "STATE", "ATTEMPTS"
        );
        for t in tasks {
            println!(
                "{:<36}  {:<16}  {:<10}  {:>8}  {}",
                t.task_id,
                t.kind,
                state_name(t),
                format!("{}/{}", t.attempts, t.max_attempts),
                t.priority
            );
        }
    }

    pub(super) fn agent(&self, agent: &pb::Agent, leases: &[pb::Lease]) {
        if self.0 == Output::Json {
            return self.json(&agent_json(agent, leases));
        }
        println!(
            "{}  {}  {}  leases {}/{}{}",
            agent.agent_id,
            agent.name,
            agent_status(agent),
            agent.active_leases,
            agent.capacity,
            if agent.drained { "  (drained)" } else { "" }
        );
        for reason in &agent.status_reasons {
            println!("  reason: {reason}");
        }
        if let Some(caps) = &agent.capabilities {
            println!("  capabilities (generation {}):", caps.generation);
            let doc = opt_struct(caps.document.as_ref());
            for entry in &caps.provenance {
                let value = switchyard_core::document::lookup(&doc, &entry.path)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                println!(
                    "    {:<40} {:<24} [{}]",
                    entry.path,
                    value,
                    tier_name(entry.tier())
                );
            }
            for r in &caps.rejections {
                println!(
                    "    rejected [{}] {}: {}",
                    tier_name(r.tier()),
                    r.path,
                    r.reason
                );
            }
        }
        for lease in leases {
            println!(
                "  lease {} task {} token {}",
                lease.lease_id, lease.task_id, lease.fencing_token
            );
        }
    }

    pub(super) fn agent_list(&self, agents: &[pb::Agent]) {
        if self.0 == Output::Json {
            return self.json(&Value::Array(
                agents.iter().map(|a| agent_json(a, &[])).collect(),
            ));
        }
        println!("{:<36}  {:<24}  {:<9}  LEASES", "AGENT", "NAME", "STATUS");
        for a in agents {
            println!(
                "{:<36}  {:<24}  {:<9}  {}/{}",
                a.agent_id,
                a.name,
                agent_status(a),
                a.active_leases,
                a.capacity
            );
        }
    }

    pub(super) fn explanation(
        &self,
        task: Option<&pb::Task>,
        summary: &str,
        verdicts: &[pb::AgentVerdict],
        ranking: &str,
    ) {
        if self.0 == Output::Json {
            return self.json(&json!({
                "task": task.map(task_json),
                "summary": summary,
                "ranking": ranking,
                "verdicts": verdicts.iter().map(verdict_json).collect::<Vec<_>>(),
            }));
        }
        if let Some(task) = task {
            self.task(task, "");
        }
        println!("{summary}");
        if !ranking.is_empty() {
            println!("{ranking}");
        }
        for v in verdicts {
            if v.eligible {
                println!(
                    "  #{:<3} {:<24} eligible (preference {})",
                    v.rank, v.agent_name, v.preference_score
                );
            } else {
                println!("  -    {:<24} {}", v.agent_name, v.reason);
            }
        }
    }

    pub(super) fn watch_line(&self, event: Option<&pb::TaskEvent>, task: &pb::Task) {
        if self.0 == Output::Json {
            return self.json(&json!({
                "event": event.map(|e| json!({"sequence": e.sequence, "kind": e.kind, "message": e.message})),
                "task": task_json(task),
            }));
        }
        let kind = event.map_or("state", |e| e.kind.as_str());
        let mut line = format!("{}  {}", state_name(task), kind);
        if let Some(p) = &task.progress
            && (!p.message.is_empty() || p.percent >= 0.0)
        {
            line.push_str(&format!("  {:.0}% {}", p.percent.max(0.0), p.message));
        }
        if let Some(e) = event.filter(|e| !e.message.is_empty()) {
            line.push_str(&format!("  — {}", e.message));
        }
        println!("{line}");
    }
}
