//! The wire: every switchyard.v1 message the server builds from its
//! records, in one place, so every RPC and every session shows a task, a
//! lease or an agent the same way. The API and the dispatcher both build
//! their messages here; nothing here reads a request.
//!
//! # Layout
//! - this module: tasks, leases, history entries, agents and tiers.
//! - [`output`]: a task's output, with what was dropped before each chunk.
//! - [`queue`]: a namespace's queue summary.
//! - [`session`]: what the server sends down an agent's `Connect` stream
//!   (grants, revocations, acknowledgements, resync requests, drains).
//! - [`placement`](mod@placement): placements between the wire and the core, with field
//!   errors for what a submitter got wrong.

pub mod output;
pub mod placement;
pub mod queue;
pub mod session;

pub use switchyard_proto::convert;

use serde_json::Value;
use switchyard_core::matcher::AgentStatus;
use switchyard_core::tier::Tier;
use switchyard_proto::v1 as pb;

use self::convert::{duration, json_to_struct, timestamp};
use crate::model::{
    AgentRecord, LeaseRecord, LeaseState, QueuedReason, RetryPolicy, TaskEventRecord, TaskRecord,
    TaskState,
};

/// The wire state of a task.
pub fn task_state(state: TaskState) -> pb::TaskState {
    match state {
        TaskState::Queued => pb::TaskState::Queued,
        TaskState::Leased => pb::TaskState::Leased,
        TaskState::Running => pb::TaskState::Running,
        TaskState::Succeeded => pb::TaskState::Succeeded,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Canceled => pb::TaskState::Canceled,
    }
}

/// The store state of a wire state; `None` for UNSPECIFIED.
pub fn store_task_state(state: pb::TaskState) -> Option<TaskState> {
    Some(match state {
        pb::TaskState::Unspecified => return None,
        pb::TaskState::Queued => TaskState::Queued,
        pb::TaskState::Leased => TaskState::Leased,
        pb::TaskState::Running => TaskState::Running,
        pb::TaskState::Succeeded => TaskState::Succeeded,
        pb::TaskState::Failed => TaskState::Failed,
        pb::TaskState::Canceled => TaskState::Canceled,
    })
}

/// The wire state of a lease.
pub fn lease_state(state: LeaseState) -> pb::LeaseState {
    match state {
        LeaseState::Granted => pb::LeaseState::Granted,
        LeaseState::Active => pb::LeaseState::Active,
        LeaseState::Completed => pb::LeaseState::Completed,
        LeaseState::Released => pb::LeaseState::Released,
        LeaseState::Expired => pb::LeaseState::Expired,
    }
}

/// A lease on the wire.
pub fn lease(lease: &LeaseRecord) -> pb::Lease {
    pb::Lease {
        lease_id: lease.id.to_string(),
        task_id: lease.task_id.to_string(),
        agent_id: lease.agent_id.to_string(),
        fencing_token: lease.fencing_token,
        state: lease_state(lease.state) as i32,
        granted_at: Some(timestamp(lease.granted_at_ms)),
        expires_at: Some(timestamp(lease.expires_at_ms)),
    }
}

/// The core placement stored with a task, as the wire type.
pub fn placement(stored: &Value) -> Option<pb::Placement> {
    let placement: switchyard_core::placement::Placement =
        serde_json::from_value(stored.clone()).ok()?;
    Some(placement::to_proto(&placement))
}

fn task_error(error: &Value) -> pb::TaskError {
    pb::TaskError {
        message: error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        code: error
            .get("code")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        retryable: error
            .get("retryable")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        details: error
            .get("details")
            .filter(|d| d.is_object())
            .map(json_to_struct),
        output_tail: error
            .get("output_tail")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    }
}

fn progress(progress: &Value) -> pb::TaskProgress {
    pb::TaskProgress {
        percent: progress
            .get("percent")
            .and_then(Value::as_f64)
            .unwrap_or(-1.0),
        message: progress
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        reported_at: progress
            .get("reported_at_ms")
            .and_then(Value::as_i64)
            .map(timestamp),
    }
}

/// A task on the wire; `queued_reason` is filled by callers that know it.
pub fn task(task: &TaskRecord) -> pb::Task {
    let lease = match (task.lease_id, task.agent_id) {
        (Some(lease_id), Some(agent_id))
            if matches!(task.state, TaskState::Leased | TaskState::Running) =>
        {
            Some(pb::Lease {
                lease_id: lease_id.to_string(),
                task_id: task.id.to_string(),
                agent_id: agent_id.to_string(),
                fencing_token: task.fencing_token,
                state: if task.state == TaskState::Running {
                    pb::LeaseState::Active as i32
                } else {
                    pb::LeaseState::Granted as i32
                },
                granted_at: None,
                expires_at: task.lease_expires_at_ms.map(timestamp),
            })
        }
        _ => None,
    };
    pb::Task {
        task_id: task.id.to_string(),
        namespace: task.namespace.clone(),
        kind: task.kind.clone(),
        payload: Some(json_to_struct(&task.payload)),
        placement: placement(&task.placement),
        priority: task.priority,
        state: task_state(task.state) as i32,
        queued_reason: pb::QueuedReason::Unspecified as i32,
        attempts: task.attempts,
        max_attempts: task.max_attempts,
        lease_ttl: Some(duration(task.lease_ttl_ms)),
        idempotency_key: task.idempotency_key.clone().unwrap_or_default(),
        not_before: Some(timestamp(task.not_before_ms)),
        result: task.result.as_ref().map(json_to_struct),
        error: task.error.as_ref().map(task_error),
        lease,
        progress: task.progress.as_ref().map(progress),
        cancel_requested: task.cancel_requested,
        created_at: Some(timestamp(task.created_at_ms)),
        updated_at: Some(timestamp(task.updated_at_ms)),
        labels: task.labels.clone().into_iter().collect(),
        retry: task.retry.as_ref().map(retry_policy),
        start_timeout: task.deadlines.start_timeout_ms.map(duration),
        execution_timeout: task.deadlines.execution_timeout_ms.map(duration),
        cancel_grace: task.deadlines.cancel_grace_ms.map(duration),
        cancel_deadline: task.cancel_deadline_ms.map(timestamp),
        fairness_key: task
            .fairness
            .as_ref()
            .map(|f| f.key.clone())
            .unwrap_or_default(),
        fairness_weight: task.fairness.as_ref().map_or(0, |f| f.weight),
        concurrency_key: task.concurrency_key.clone().unwrap_or_default(),
    }
}

/// A task's retry policy on the wire, every field filled in.
pub fn retry_policy(policy: &RetryPolicy) -> pb::RetryPolicy {
    pb::RetryPolicy {
        initial_backoff: Some(duration(policy.initial_backoff_ms)),
        max_backoff: Some(duration(policy.max_backoff_ms)),
        multiplier: policy.multiplier,
        jitter: Some(policy.jitter),
    }
}

/// Why a queued task waits, on the wire.
pub fn queued_reason(reason: QueuedReason) -> pb::QueuedReason {
    match reason {
        QueuedReason::Parked => pb::QueuedReason::Parked,
        QueuedReason::WaitingForCapacity => pb::QueuedReason::WaitingForCapacity,
        QueuedReason::Backoff => pb::QueuedReason::Backoff,
        QueuedReason::ConcurrencyLimit => pb::QueuedReason::ConcurrencyLimit,
    }
}

/// A task on the wire with the reason it waits, if it is queued.
pub fn task_with_reason(record: &TaskRecord, reason: Option<QueuedReason>) -> pb::Task {
    let mut task = task(record);
    if let Some(reason) = reason {
        task.queued_reason = queued_reason(reason) as i32;
    }
    task
}

/// The task as the agent receives it in a grant.
pub fn granted_task(record: &TaskRecord, grant: &LeaseRecord) -> pb::Task {
    let mut t = task(record);
    t.state = pb::TaskState::Leased as i32;
    t.lease = Some(lease(grant));
    t
}

/// A history entry on the wire.
pub fn event(event: &TaskEventRecord) -> pb::TaskEvent {
    pb::TaskEvent {
        sequence: event.sequence,
        task_id: event.task_id.to_string(),
        state: task_state(event.state) as i32,
        kind: event.kind.clone(),
        message: event.message.clone(),
        agent_id: event.agent_id.map(|a| a.to_string()).unwrap_or_default(),
        lease_id: event.lease_id.map(|l| l.to_string()).unwrap_or_default(),
        occurred_at: Some(timestamp(event.occurred_at_ms)),
    }
}

/// An agent status on the wire.
pub fn agent_status(status: AgentStatus) -> pb::AgentStatus {
    match status {
        AgentStatus::Ready => pb::AgentStatus::Ready,
        AgentStatus::Degraded => pb::AgentStatus::Degraded,
        AgentStatus::Draining => pb::AgentStatus::Draining,
        AgentStatus::Offline => pb::AgentStatus::Offline,
    }
}

/// A wire agent status in the core; `None` for UNSPECIFIED.
pub fn core_agent_status(status: pb::AgentStatus) -> Option<AgentStatus> {
    Some(match status {
        pb::AgentStatus::Unspecified => return None,
        pb::AgentStatus::Ready => AgentStatus::Ready,
        pb::AgentStatus::Degraded => AgentStatus::Degraded,
        pb::AgentStatus::Draining => AgentStatus::Draining,
        pb::AgentStatus::Offline => AgentStatus::Offline,
    })
}

/// A tier on the wire.
pub fn tier(tier: Tier) -> pb::Tier {
    match tier {
        Tier::Base => pb::Tier::Base,
        Tier::Static => pb::Tier::Static,
        Tier::Dynamic => pb::Tier::Dynamic,
        Tier::Override => pb::Tier::Override,
        Tier::Operator => pb::Tier::Operator,
    }
}

/// A wire tier in the core; `None` for UNSPECIFIED.
pub fn core_tier(tier: pb::Tier) -> Option<Tier> {
    Some(match tier {
        pb::Tier::Unspecified => return None,
        pb::Tier::Base => Tier::Base,
        pb::Tier::Static => Tier::Static,
        pb::Tier::Dynamic => Tier::Dynamic,
        pb::Tier::Override => Tier::Override,
        pb::Tier::Operator => Tier::Operator,
    })
}

fn tier_named(name: &str) -> pb::Tier {
    match name {
        "base" => pb::Tier::Base,
        "static" => pb::Tier::Static,
        "dynamic" => pb::Tier::Dynamic,
        "override" => pb::Tier::Override,
        "operator" => pb::Tier::Operator,
        _ => pb::Tier::Unspecified,
    }
}

/// The agent's status reasons, and a warning while two sessions contend
/// for its name (reckoned from when it was last seen).
fn status_reasons(record: &AgentRecord) -> Vec<String> {
    let mut reasons = record.status_reasons.clone();
    if record.contention.contended(record.last_seen_at_ms) {
        reasons.push(record.contention.warning(&record.runner));
    }
    reasons
}

/// An agent on the wire; `full` adds the document and provenance.
pub fn agent(record: &AgentRecord, full: bool) -> pb::Agent {
    let provenance = if full {
        record
            .provenance
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(path, tier)| pb::ProvenanceEntry {
                        path: path.clone(),
                        tier: tier_named(tier.as_str().unwrap_or_default()) as i32,
                    })
                    .collect()
            })
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let rejections = record
        .rejections
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|r| pb::Rejection {
                    tier: tier_named(r.get("tier").and_then(Value::as_str).unwrap_or_default())
                        as i32,
                    path: r
                        .get("path")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    reason: r
                        .get("reason")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    pb::Agent {
        agent_id: record.id.to_string(),
        name: record.name.clone(),
        namespace: record.namespace.clone(),
        status: agent_status(record.effective_status()) as i32,
        status_reasons: status_reasons(record),
        capacity: record.capacity,
        active_leases: record.active_leases,
        labels: record.labels.clone().into_iter().collect(),
        capabilities: Some(pb::CapabilityView {
            document: full.then(|| json_to_struct(&record.document)),
            generation: record.generation,
            provenance,
            rejections,
            operator_overrides: full.then(|| json_to_struct(&record.operator_overrides)),
        }),
        session_epoch: record.session_epoch,
        last_seen_at: Some(timestamp(record.last_seen_at_ms)),
        registered_at: Some(timestamp(record.registered_at_ms)),
        drained: record.drained,
        drain_deadline: record.drain_deadline_ms.map(timestamp),
        runner: record.runner.clone(),
        handled_kinds: record.handled_kinds.clone(),
    }
}
