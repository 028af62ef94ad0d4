//! [`StoreEvent`]: what the store tells every replica has happened, once it
//! committed, so dispatchers react without polling. Events travel between
//! replicas as JSON (PostgreSQL notifications); a field added later is
//! optional, so replicas of the release before read what they can.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::lease::RevocationCause;
use super::task::{TaskRecord, TaskState};

/// What the store tells every replica has happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum StoreEvent {
    /// A task was queued or re-queued (it may be leasable now or after its
    /// `not_before`).
    TaskQueued {
        /// Its namespace.
        namespace: String,
        /// The task.
        task_id: Uuid,
        /// Its place in the queue (priority, then rank: its submit time,
        /// or its fair rank), so a dispatcher knows whether it waits ahead
        /// of what it has walked past; absent from older replicas (which
        /// send the submit time, the rank of a task without a fairness
        /// key, as `created_at_ms`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        priority: Option<i32>,
        #[serde(
            default,
            alias = "created_at_ms",
            skip_serializing_if = "Option::is_none"
        )]
        rank: Option<i64>,
        /// When it comes due (a delayed submit, a retry backing off), so a
        /// dispatcher can look again at that moment; absent from older
        /// replicas.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        not_before_ms: Option<i64>,
        /// Queued by its submit: the replica that took the submit noted it
        /// as it returned, and does not hear it again (late, it would say a
        /// task waits that a round may have leased since).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        submitted: bool,
    },
    /// A task changed state.
    TaskChanged {
        /// The task.
        task_id: Uuid,
        /// Its new state.
        state: TaskState,
    },
    /// Output of a task was stored (watchers following it read on).
    TaskOutput {
        /// The task.
        task_id: Uuid,
    },
    /// An agent registered, changed its document, status or drain.
    AgentChanged {
        /// The agent.
        agent_id: Uuid,
    },
    /// The sweeper ended a lease (it expired, or its grant was never
    /// acknowledged): the replica the agent is connected to frees the slot
    /// its index still counts. Told to other replicas only.
    LeaseEnded {
        /// The agent that held it.
        agent_id: Uuid,
        /// Its task, whose claim on the agent comes back. Absent from the events of older
        /// replicas (one slot comes back).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        task_id: Option<Uuid>,
        /// The lease, when it expired: the agent may not know yet (a grant
        /// never acknowledged is told as [`StoreEvent::LeaseRevoked`]), and
        /// must hear so before any grant that reuses the slot. Absent from
        /// the events of older replicas.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expired: Option<EndedLease>,
    },
    /// The holder of a lease must stop (cancel, or revocation by the server).
    LeaseRevoked {
        /// The lease.
        lease_id: Uuid,
        /// Its task.
        task_id: Uuid,
        /// The agent holding it.
        agent_id: Uuid,
        /// Why, as the agent is told it. Absent from the events of older
        /// replicas, which revoked only for cancels and unacknowledged
        /// grants: such an event is told as a cancel.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<RevocationCause>,
        /// Details for people (a cancel's reason as its caller gave it).
        reason: String,
    },
}

/// The lease a [`StoreEvent::LeaseEnded`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndedLease {
    /// The lease.
    pub lease_id: Uuid,
    /// Its task.
    pub task_id: Uuid,
}

impl StoreEvent {
    /// `task` was queued or re-queued, to come due at `not_before_ms`.
    pub fn queued(task: &TaskRecord, not_before_ms: i64) -> Self {
        Self::task_queued(task, not_before_ms, false)
    }

    /// `task` was queued by its submit.
    pub fn submitted(task: &TaskRecord) -> Self {
        Self::task_queued(task, task.not_before_ms, true)
    }

    fn task_queued(task: &TaskRecord, not_before_ms: i64, submitted: bool) -> Self {
        StoreEvent::TaskQueued {
            namespace: task.namespace.clone(),
            task_id: task.id,
            priority: Some(task.priority),
            rank: Some(task.queue_rank),
            not_before_ms: Some(not_before_ms),
            submitted,
        }
    }

    /// Whether only followers of tasks' changes read it (watchers of a task
    /// or of the queue): another replica needs it only while it has one.
    pub fn for_followers(&self) -> bool {
        matches!(
            self,
            StoreEvent::TaskChanged { .. } | StoreEvent::TaskOutput { .. }
        )
    }

    /// Whether only other replicas need to hear it: whoever made the change
    /// on this replica applied it here already.
    pub fn for_other_replicas(&self) -> bool {
        matches!(
            self,
            StoreEvent::AgentChanged { .. }
                | StoreEvent::LeaseEnded { .. }
                | StoreEvent::TaskQueued {
                    submitted: true,
                    ..
                }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_from_an_older_replica_still_reads() {
        let old = r#"{"t":"lease_revoked","lease_id":"00000000-0000-0000-0000-000000000001",
            "task_id":"00000000-0000-0000-0000-000000000002",
            "agent_id":"00000000-0000-0000-0000-000000000003",
            "reason":"the agent never acknowledged the lease"}"#;
        let event: StoreEvent = serde_json::from_str(old).unwrap();
        assert!(matches!(
            event,
            StoreEvent::LeaseRevoked { cause: None, .. }
        ));
        let new = StoreEvent::LeaseRevoked {
            lease_id: Uuid::nil(),
            task_id: Uuid::nil(),
            agent_id: Uuid::nil(),
            cause: Some(RevocationCause::Unacknowledged),
            reason: "never acknowledged".into(),
        };
        let text = serde_json::to_string(&new).unwrap();
        assert!(text.contains(r#""cause":"unacknowledged""#), "{text}");
        assert_eq!(serde_json::from_str::<StoreEvent>(&text).unwrap(), new);
    }

    #[test]
    fn a_submit_is_heard_by_the_other_replicas_and_a_requeue_by_all() {
        let queued = |submitted: Option<bool>| {
            let flag = submitted.map_or(String::new(), |s| format!(r#","submitted":{s}"#));
            let text = format!(
                r#"{{"t":"task_queued","namespace":"default",
                "task_id":"00000000-0000-0000-0000-000000000001","priority":0,"rank":5{flag}}}"#
            );
            serde_json::from_str::<StoreEvent>(&text).unwrap()
        };
        assert!(queued(Some(true)).for_other_replicas());
        assert!(!queued(Some(false)).for_other_replicas());
        // From a replica of the release before: heard by all, as it was.
        assert!(!queued(None).for_other_replicas());
        let requeue = queued(Some(false));
        let text = serde_json::to_string(&requeue).unwrap();
        assert!(!text.contains("submitted"), "{text}");
    }
}
