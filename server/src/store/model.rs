//! The store's records and inputs: plain Rust mirrors of the switchyard.v1
//! task, lease, history and agent messages (no proto types, so the store can
//! be tested and reasoned about on its own). Times are Unix milliseconds
//! passed in by the caller; JSON documents are `serde_json::Value`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// Where a task is in its life (`TaskState` in task.proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Waiting for an agent.
    Queued,
    /// Granted to an agent that has not reported it started.
    Leased,
    /// The leasing agent reported it started.
    Running,
    /// Terminal: an agent reported success.
    Succeeded,
    /// Terminal: out of attempts, or a non-retryable failure.
    Failed,
    /// Terminal: canceled by a submitter or operator.
    Canceled,
}

impl TaskState {
    /// The lowercase name stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Leased => "leased",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    /// True for SUCCEEDED, FAILED and CANCELED, which never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Canceled)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored state name the code does not know (a newer schema, or damage).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownState {
    /// Which enum was being parsed.
    pub what: &'static str,
    /// The text found.
    pub value: String,
}

impl FromStr for TaskState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "queued" => Self::Queued,
            "leased" => Self::Leased,
            "running" => Self::Running,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "canceled" => Self::Canceled,
            _ => {
                return Err(UnknownState {
                    what: "task state",
                    value: s.to_owned(),
                });
            }
        })
    }
}

/// Where a lease is in its life (`LeaseState` in task.proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// Granted and sent; not yet acknowledged by the agent.
    Granted,
    /// Acknowledged by the agent.
    Active,
    /// Ended by a success or failure report.
    Completed,
    /// Handed back by the agent or revoked by the server.
    Released,
    /// Not renewed within its TTL.
    Expired,
}

impl LeaseState {
    /// The lowercase name stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Active => "active",
            Self::Completed => "completed",
            Self::Released => "released",
            Self::Expired => "expired",
        }
    }

    /// True while the lease holds its task (GRANTED or ACTIVE).
    pub fn is_live(self) -> bool {
        matches!(self, Self::Granted | Self::Active)
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LeaseState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "granted" => Self::Granted,
            "active" => Self::Active,
            "completed" => Self::Completed,
            "released" => Self::Released,
            "expired" => Self::Expired,
            _ => {
                return Err(UnknownState {
                    what: "lease state",
                    value: s.to_owned(),
                });
            }
        })
    }
}

/// One submit of a group-committed batch (see `Store::submit_many`).
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// The task.
    pub task: NewTask,
    /// The agent the dispatcher reserved for it on the way in, if any: the
    /// task is leased to it in the same transaction.
    pub agent_id: Option<Uuid>,
}

/// What a submit did: the task as stored, whether it was created (`false`:
/// an idempotent repeat returned the existing task), and the outcome of
/// leasing it to the reserved agent (`None` when none was reserved, or for
/// a repeat).
pub type Submitted = (TaskRecord, bool, Option<GrantOutcome>);

/// A task as submitted.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    /// Only agents and principals of this namespace see the task.
    pub namespace: String,
    /// What kind of work; agents dispatch on it.
    pub kind: String,
    /// The handler's input.
    pub payload: Value,
    /// Opaque to the store: the JSON of the task's placement, matched by the
    /// dispatcher.
    pub placement: Value,
    /// Higher runs first.
    pub priority: i32,
    /// After this many unsuccessful attempts the task is FAILED.
    pub max_attempts: u32,
    /// How long a lease lives without renewal.
    pub lease_ttl_ms: i64,
    /// Makes submit idempotent within the namespace.
    pub idempotency_key: Option<String>,
    /// Not leased before this time (a delayed submit); now when `None`.
    pub not_before_ms: Option<i64>,
    /// Free-form labels for listing and display.
    pub labels: BTreeMap<String, String>,
}

/// A task and everything known about it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    /// UUIDv7, time-ordered.
    pub id: Uuid,
    /// The task's namespace.
    pub namespace: String,
    /// What kind of work.
    pub kind: String,
    /// The handler's input.
    pub payload: Value,
    /// The placement JSON, opaque to the store.
    pub placement: Value,
    /// Higher runs first.
    pub priority: i32,
    /// Where the task is now.
    pub state: TaskState,
    /// Attempts that ended without success (failures and lost leases).
    pub attempts: u32,
    /// The attempt budget.
    pub max_attempts: u32,
    /// Lease lifetime without renewal.
    pub lease_ttl_ms: i64,
    /// The submitter's idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// Not leased before this time (backoff or delayed submit).
    pub not_before_ms: i64,
    /// The handler's output once SUCCEEDED.
    pub result: Option<Value>,
    /// The last failure: `{"message","code","retryable","details"}`.
    pub error: Option<Value>,
    /// The last fencing token issued for the task, 0 if never leased.
    pub fencing_token: u64,
    /// The live lease while LEASED or RUNNING.
    pub lease_id: Option<Uuid>,
    /// The agent holding the live lease.
    pub agent_id: Option<Uuid>,
    /// When the live lease runs out unless renewed.
    pub lease_expires_at_ms: Option<i64>,
    /// A cancel was requested while the task was leased or running.
    pub cancel_requested: bool,
    /// The last progress the running agent reported.
    pub progress: Option<Value>,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
    /// When the task was submitted.
    pub created_at_ms: i64,
    /// When the task last changed.
    pub updated_at_ms: i64,
}

/// One attempt's exclusive, time-limited right to run a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The lease's id (UUIDv7).
    pub id: Uuid,
    /// The leased task.
    pub task_id: Uuid,
    /// The holder.
    pub agent_id: Uuid,
    /// Monotonic per task; reports carrying an older token are refused.
    pub fencing_token: u64,
    /// Where the lease is in its life.
    pub state: LeaseState,
    /// When it was granted.
    pub granted_at_ms: i64,
    /// The agent acknowledged the grant (unacked grants get revoked).
    pub acked: bool,
    /// When it runs out unless renewed.
    pub expires_at_ms: i64,
}

/// One entry of a task's append-only history.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEventRecord {
    /// The task.
    pub task_id: Uuid,
    /// Position in the task's history, from 1.
    pub sequence: u64,
    /// What happened (`submitted`, `leased`, `started`, …).
    pub kind: String,
    /// The task's state after the event.
    pub state: TaskState,
    /// Details for people.
    pub message: String,
    /// The agent involved, if any.
    pub agent_id: Option<Uuid>,
    /// The lease involved, if any.
    pub lease_id: Option<Uuid>,
    /// When it happened.
    pub occurred_at_ms: i64,
}

/// A registered agent as the server sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRecord {
    /// Stable across sessions of the same (namespace, name).
    pub id: Uuid,
    /// The namespace it serves.
    pub namespace: String,
    /// Unique within the namespace.
    pub name: String,
    /// The merged document: agent tiers plus the operator tier.
    pub document: Value,
    /// Which tier each value of `document` came from.
    pub provenance: Value,
    /// Values the merge refused, with reasons.
    pub rejections: Value,
    /// The agent's own merged document before the operator tier.
    pub reported: Value,
    /// The operator tier.
    pub operator_overrides: Value,
    /// Bumped on every document change; compare-and-set guard for diffs.
    pub generation: u64,
    /// `ready`, `degraded`, `draining` or `offline`.
    pub status: String,
    /// Why the status is what it is.
    pub status_reasons: Vec<String>,
    /// Maximum concurrent leases.
    pub capacity: u32,
    /// Leases held now (GRANTED or ACTIVE), kept in the same transaction as
    /// every grant and lease end so capacity checks are one row lock.
    pub active_leases: u32,
    /// An operator drain is in force.
    pub drained: bool,
    /// Labels set at registration.
    pub labels: BTreeMap<String, String>,
    /// What the agent runs as.
    pub runner: String,
    /// Bumped on every registration; a newer session supersedes older ones.
    pub session_epoch: u64,
    /// When the server last heard from the agent.
    pub last_seen_at_ms: i64,
    /// When the agent first registered.
    pub registered_at_ms: i64,
}

/// What an agent registers with (an upsert on namespace and name).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRegistration {
    /// The namespace it serves.
    pub namespace: String,
    /// Unique within the namespace.
    pub name: String,
    /// The agent's own merged document.
    pub reported: Value,
    /// The merged document including the operator tier, computed by the
    /// caller (the store does not merge).
    pub document: Value,
    /// Provenance of `document`.
    pub provenance: Value,
    /// Values the merge refused.
    pub rejections: Value,
    /// Maximum concurrent leases.
    pub capacity: u32,
    /// Labels for display and listing.
    pub labels: BTreeMap<String, String>,
    /// What the agent runs as.
    pub runner: String,
}

/// Which tasks `list_tasks` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Only this namespace.
    pub namespace: String,
    /// Only these states; all when empty.
    pub states: Vec<TaskState>,
    /// Only this kind.
    pub kind: Option<String>,
}

/// A page request for list methods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// At most this many rows (at least 1).
    pub size: u32,
    /// The opaque cursor a previous page returned.
    pub after: Option<String>,
}

/// Where a walk down the queue stopped: the last task seen, in queue order
/// (priority descending, then submission order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCursor {
    /// The last task's priority.
    pub priority: i32,
    /// Its submission time.
    pub created_at_ms: i64,
    /// Its id (the final tiebreak).
    pub task_id: Uuid,
}

impl QueueCursor {
    /// The cursor just after `task`.
    pub fn after(task: &TaskRecord) -> Self {
        Self {
            priority: task.priority,
            created_at_ms: task.created_at_ms,
            task_id: task.id,
        }
    }

    /// The cursor just before `task`: a walk from it reads `task` first.
    pub fn before(task: &TaskRecord) -> Self {
        Self {
            priority: task.priority,
            created_at_ms: task.created_at_ms,
            task_id: Uuid::from_u128(task.id.as_u128().saturating_sub(1)),
        }
    }

    /// Whether a walk from this cursor reads a task at this place in the
    /// queue (it comes after the cursor).
    pub fn reaches(&self, priority: i32, created_at_ms: i64, task_id: Uuid) -> bool {
        priority < self.priority
            || (priority == self.priority
                && (created_at_ms, task_id) > (self.created_at_ms, self.task_id))
    }
}

/// A placement no agent connected to this replica can run: the
/// dispatcher's walk down the queue leaves out the queued tasks of this
/// namespace with exactly this placement until an agent that can run it
/// appears, so a great many parked tasks cost a round nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParkedPlacement {
    /// The tasks' namespace.
    pub namespace: String,
    /// The tasks' placement as JSON text (`TaskRecord::placement`
    /// serialized); compared as JSON, not as text, where the store can.
    pub placement: String,
}

/// Asks to lease a task to an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRequest {
    /// The task to lease.
    pub task_id: Uuid,
    /// The agent to lease it to.
    pub agent_id: Uuid,
}

/// Why a grant was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantRefusal {
    /// Missing, no longer QUEUED, or being changed by another transaction.
    TaskNotQueued,
    /// The agent already holds `capacity` leases.
    AgentAtCapacity,
    /// No such agent.
    AgentUnknown,
    /// The task's `not_before` is in the future.
    NotYet,
}

/// What became of one grant request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantOutcome {
    /// Leased: the new lease.
    Granted(LeaseRecord),
    /// Not leased, and why; nothing changed.
    Refused(GrantRefusal),
}

/// How an attempt ended, as the agent reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum CompletionOutcome {
    /// The handler succeeded.
    Succeeded {
        /// Its output.
        result: Value,
    },
    /// The handler failed.
    Failed {
        /// `{"message","code","retryable","details"}`.
        error: Value,
        /// False if a retry cannot succeed.
        retryable: bool,
    },
    /// The agent hands the task back without running it to the end.
    Released {
        /// Why, for the history.
        reason: String,
    },
}

impl CompletionOutcome {
    /// The name recorded on the lease, to recognise a repeated report.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "succeeded",
            Self::Failed { .. } => "failed",
            Self::Released { .. } => "released",
        }
    }
}

/// An agent's final report about one lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The lease the report is about.
    pub lease_id: Uuid,
    /// The task it leased.
    pub task_id: Uuid,
    /// The reporting agent.
    pub agent_id: Uuid,
    /// The token of the lease; an older one than the task's is refused.
    pub fencing_token: u64,
    /// How the attempt ended.
    pub outcome: CompletionOutcome,
}

/// One lease report of an agent session, for [`Store::apply_reports`]
/// (which applies the reports of many sessions in one transaction).
///
/// [`Store::apply_reports`]: super::Store::apply_reports
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseReport {
    /// The lease the report is about.
    pub lease_id: Uuid,
    /// The task it leased.
    pub task_id: Uuid,
    /// The reporting agent.
    pub agent_id: Uuid,
    /// The token of the lease; an older one than the task's is refused.
    pub fencing_token: u64,
    /// What the agent says.
    pub kind: ReportKind,
}

/// What a [`LeaseReport`] says.
#[derive(Debug, Clone, PartialEq)]
pub enum ReportKind {
    /// The agent took the grant (GRANTED to ACTIVE); repeating it is fine.
    Accepted,
    /// The agent started the task (LEASED to RUNNING); repeating it is fine.
    Started,
    /// The latest progress of a running task.
    Progress(Value),
    /// The attempt ended.
    Final(CompletionOutcome),
}

/// What an accepted [`LeaseReport`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportApplied {
    /// A final report ended the lease and freed the agent's slot (false for
    /// a repeated final report and for every other kind).
    pub ended: bool,
}

/// One heartbeat's writes, for [`Store::heartbeats`] (which applies the
/// heartbeats of many sessions in one transaction).
///
/// [`Store::heartbeats`]: super::Store::heartbeats
#[derive(Debug, Clone, PartialEq)]
pub struct Beat {
    /// The agent.
    pub agent_id: Uuid,
    /// Its session; a status is written only while this is still current.
    pub session_epoch: u64,
    /// Renew the agent's live leases (the session skips it while the agent
    /// holds none).
    pub renew: bool,
    /// Record that the agent was heard from (the session does it now and
    /// then, not on every heartbeat: liveness is judged in memory).
    pub touch: bool,
    /// A new status and its reasons, when they changed.
    pub status: Option<(String, Vec<String>)>,
    /// A new document (the session applied a diff), when it changed.
    pub document: Option<DocumentWrite>,
}

/// A document the session computed from diffs, written only if the stored
/// generation is still the one it descends from.
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentWrite {
    /// The stored generation the session's document descends from; the
    /// write happens only if it is still stored.
    pub expected_generation: u64,
    /// The generation to store with it (the session's own, which counts
    /// every diff it applied, written or not; greater than `expected`).
    pub generation: u64,
    /// The agent's own tiers merged (what its diffs apply to).
    pub reported: Value,
    /// With the operator tier merged over it: what the matcher sees.
    pub document: Value,
    /// Which tier every leaf came from.
    pub provenance: Value,
}

/// What [`Store::heartbeats`] did for one heartbeat.
///
/// [`Store::heartbeats`]: super::Store::heartbeats
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeatApplied {
    /// Leases renewed and the agent touched; no document was given.
    Renewed,
    /// The document was written; its new generation.
    Written(u64),
    /// The document was not written: the stored generation (held) moved
    /// on meanwhile (an operator change); the session must resync.
    Stale(u64),
}

/// The result of an accepted completion.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionResult {
    /// The task after the report.
    pub task: TaskRecord,
    /// The same final report was repeated: acknowledged, nothing changed.
    pub duplicate: bool,
}

/// What the store tells every replica has happened, so dispatchers react
/// without polling.
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
        /// Its place in the queue (priority, then submit time), so a
        /// dispatcher knows whether it waits ahead of what it has walked
        /// past; absent from older replicas.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        priority: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        created_at_ms: Option<i64>,
        /// When it comes due (a delayed submit, a retry backing off), so a
        /// dispatcher can look again at that moment; absent from older
        /// replicas.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        not_before_ms: Option<i64>,
    },
    /// A task changed state.
    TaskChanged {
        /// The task.
        task_id: Uuid,
        /// Its new state.
        state: TaskState,
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
        /// Why.
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
        StoreEvent::TaskQueued {
            namespace: task.namespace.clone(),
            task_id: task.id,
            priority: Some(task.priority),
            created_at_ms: Some(task.created_at_ms),
            not_before_ms: Some(not_before_ms),
        }
    }
}

/// The first retry delay unless a store is configured otherwise.
pub const DEFAULT_BACKOFF_BASE_MS: i64 = 1_000;

/// The longest retry delay.
pub const MAX_BACKOFF_MS: i64 = 5 * 60 * 1_000;

/// The delay before retrying after `attempts` failed attempts: `base`,
/// doubling each attempt, capped at five minutes.
pub fn backoff_ms(base_ms: i64, attempts: u32) -> i64 {
    let doublings = attempts.saturating_sub(1).min(30);
    base_ms
        .saturating_mul(1_i64 << doublings)
        .min(MAX_BACKOFF_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_names() {
        for state in [
            TaskState::Queued,
            TaskState::Leased,
            TaskState::Running,
            TaskState::Succeeded,
            TaskState::Failed,
            TaskState::Canceled,
        ] {
            assert_eq!(state.as_str().parse::<TaskState>(), Ok(state));
        }
        for state in [
            LeaseState::Granted,
            LeaseState::Active,
            LeaseState::Completed,
            LeaseState::Released,
            LeaseState::Expired,
        ] {
            assert_eq!(state.as_str().parse::<LeaseState>(), Ok(state));
        }
        assert!("bogus".parse::<TaskState>().is_err());
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff_ms(1_000, 1), 1_000);
        assert_eq!(backoff_ms(1_000, 2), 2_000);
        assert_eq!(backoff_ms(1_000, 4), 8_000);
        assert_eq!(backoff_ms(1_000, 40), MAX_BACKOFF_MS);
    }
}

/// A bearer token as stored: who it is for, never the token itself (the
/// store keys it by the token's SHA-256).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// A label for people (unique per namespace).
    pub name: String,
    /// The namespace the token is bound to.
    pub namespace: String,
    /// `agent`, `submitter` or `operator`.
    pub role: String,
    /// When it was created.
    pub created_at_ms: i64,
}
