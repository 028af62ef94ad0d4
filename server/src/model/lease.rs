//! A lease's life: [`LeaseState`], how it ended ([`LeaseEnd`]), why the
//! server took it back ([`RevocationCause`]); asking for grants and what
//! came of them; the reports an agent makes about a lease and what they
//! did. The waits before a task is offered again are in
//! [`super::backoff`].

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use switchyard_core::resources::{Claim, Held};
use uuid::Uuid;

use super::names::{StoredName, display};
use super::output::OutputChunk;
use super::task::{NewTask, TaskRecord};

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

impl StoredName for LeaseState {
    const WHAT: &'static str = "lease state";
    const NAMES: &'static [(Self, &'static str)] = &[
        (Self::Granted, "granted"),
        (Self::Active, "active"),
        (Self::Completed, "completed"),
        (Self::Released, "released"),
        (Self::Expired, "expired"),
    ];
}

impl LeaseState {
    /// The name stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        StoredName::stored(self)
    }

    /// True while the lease holds its task (GRANTED or ACTIVE).
    pub fn is_live(self) -> bool {
        matches!(self, Self::Granted | Self::Active)
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        display(*self, f)
    }
}

/// What ended a lease, recorded on it (the `outcome` column): a repeated
/// final report is recognised by it, and nothing else ends a lease twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseEnd {
    /// The agent reported success.
    Succeeded,
    /// The agent reported a failure.
    Failed,
    /// The agent handed the task back.
    Released,
    /// The lease ran out of its TTL unrenewed.
    Expired,
    /// The server revoked a grant the agent never acknowledged.
    Unacknowledged,
    /// The attempt ran past its execution timeout.
    TimedOut,
    /// The server ended it at a deadline: a cancel's grace, or a drain's.
    Revoked,
}

impl StoredName for LeaseEnd {
    const WHAT: &'static str = "lease end";
    const NAMES: &'static [(Self, &'static str)] = &[
        (Self::Succeeded, "succeeded"),
        (Self::Failed, "failed"),
        (Self::Released, "released"),
        (Self::Expired, "expired"),
        (Self::Unacknowledged, "unacknowledged"),
        (Self::TimedOut, "timed_out"),
        (Self::Revoked, "revoked"),
    ];
}

impl LeaseEnd {
    /// The name stored in the `outcome` column.
    pub fn as_str(self) -> &'static str {
        StoredName::stored(self)
    }
}

/// Why the server takes a lease back from its holder (`RevocationReason`
/// in agent_service.proto). Carried as this value, never read out of a
/// message: what a person wrote cannot change what an agent is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RevocationCause {
    /// The task was canceled.
    Canceled,
    /// The lease expired before it was renewed.
    Expired,
    /// A newer session of the agent superseded it.
    Superseded,
    /// The agent did not acknowledge the grant in time.
    Unacknowledged,
    /// The server does not hold the lease for the agent.
    UnknownLease,
    /// The attempt ran past the task's execution timeout.
    Timeout,
    /// The agent's drain deadline passed while it still held the lease.
    DrainDeadline,
}

impl StoredName for RevocationCause {
    const WHAT: &'static str = "revocation cause";
    const NAMES: &'static [(Self, &'static str)] = &[
        (Self::Canceled, "canceled"),
        (Self::Expired, "expired"),
        (Self::Superseded, "superseded"),
        (Self::Unacknowledged, "unacknowledged"),
        (Self::UnknownLease, "unknown_lease"),
        (Self::Timeout, "timeout"),
        (Self::DrainDeadline, "drain_deadline"),
    ];
}

/// Why an agent hands a lease back (`ReleaseCause` in agent_service.proto),
/// which decides what happens to the task next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseCause {
    /// The agent is draining: the task goes back at once.
    Draining,
    /// The agent stops after a revocation (a cancel).
    RevocationAcknowledged,
    /// No handler for the task's kind: the agent is not offered the task
    /// again until it changes.
    CannotHandle,
    /// The agent cannot decode the task, or finds it invalid: as
    /// [`ReleaseCause::CannotHandle`].
    CannotDecode,
    /// Busy for now: the task goes back after a jittered backoff.
    Busy,
    /// Anything else (or not said): as [`ReleaseCause::Busy`].
    Other,
}

impl StoredName for ReleaseCause {
    const WHAT: &'static str = "release cause";
    const NAMES: &'static [(Self, &'static str)] = &[
        (Self::Draining, "draining"),
        (Self::RevocationAcknowledged, "revocation_acknowledged"),
        (Self::CannotHandle, "cannot_handle"),
        (Self::CannotDecode, "cannot_decode"),
        (Self::Busy, "busy"),
        (Self::Other, "other"),
    ];
}

impl ReleaseCause {
    /// Whether the agent refused the task itself: it is not offered it
    /// again until its kinds or document change or it registers again.
    pub fn refuses(self) -> bool {
        matches!(self, Self::CannotHandle | Self::CannotDecode)
    }

    /// Whether the task waits a jittered backoff before it is offered again.
    pub fn backs_off(self) -> bool {
        matches!(self, Self::Busy | Self::Other)
    }
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
    /// What ended it, once it ended.
    pub ended_by: Option<LeaseEnd>,
    /// What it holds on its agent: slots and, for a task with a resource request, the amounts
    /// and devices assigned.
    pub claim: Claim,
}

/// Asks to lease a task to an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRequest {
    /// The task to lease.
    pub task_id: Uuid,
    /// The agent to lease it to.
    pub agent_id: Uuid,
    /// What the lease would hold there (re-checked against the agent's live leases when
    /// granted).
    pub claim: Claim,
    /// What the requester saw the agent's other live leases hold when it assigned `claim`. A
    /// store may check the claim against this instead of reading the leases, if it confirms,
    /// under the agent's lock, that no live lease holds anything this leaves out; a claim it
    /// cannot confirm so is checked against the leases themselves. Never trusted alone; `None`:
    /// nothing seen held.
    pub seen: Option<Arc<Held>>,
}

impl GrantRequest {
    /// A request for a lease that would hold `claim`, with nothing seen held.
    pub fn new(task_id: Uuid, agent_id: Uuid, claim: Claim) -> Self {
        Self {
            task_id,
            agent_id,
            claim,
            seen: None,
        }
    }

    /// A request for a lease that holds one slot.
    pub fn one_slot(task_id: Uuid, agent_id: Uuid) -> Self {
        Self::new(task_id, agent_id, Claim::one_slot())
    }
}

/// Why a grant was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantRefusal {
    /// Missing, no longer QUEUED, or being changed by another transaction.
    TaskNotQueued,
    /// The agent's free slots do not cover the grant.
    AgentAtCapacity,
    /// Another lease holds a device, or the amounts, the grant would take.
    ResourcesTaken,
    /// No such agent.
    AgentUnknown,
    /// The task's `not_before` is in the future.
    NotYet,
    /// The task's concurrency key, or its namespace, has its limit of
    /// tasks running.
    ConcurrencyLimit,
}

/// What became of one grant request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantOutcome {
    /// Leased: the new lease.
    Granted(LeaseRecord),
    /// Not leased, and why; nothing changed.
    Refused(GrantRefusal),
}

/// One submit of a group-committed batch (see `TaskStore::submit_many`).
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
        /// Why, for what happens next.
        cause: ReleaseCause,
    },
}

impl CompletionOutcome {
    /// What this report records on the lease it ends.
    pub fn end(&self) -> LeaseEnd {
        match self {
            Self::Succeeded { .. } => LeaseEnd::Succeeded,
            Self::Failed { .. } => LeaseEnd::Failed,
            Self::Released { .. } => LeaseEnd::Released,
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

/// One lease report of an agent session (the store applies the reports of
/// many sessions in one transaction).
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

impl LeaseReport {
    /// Whether `other` is about the same lease, from the same holder.
    pub fn same_lease(&self, other: &LeaseReport) -> bool {
        self.lease_id == other.lease_id
            && self.task_id == other.task_id
            && self.agent_id == other.agent_id
            && self.fencing_token == other.fencing_token
    }

    /// The final report this is, as a completion.
    pub fn completion(&self, outcome: &CompletionOutcome) -> Completion {
        Completion {
            lease_id: self.lease_id,
            task_id: self.task_id,
            agent_id: self.agent_id,
            fencing_token: self.fencing_token,
            outcome: outcome.clone(),
        }
    }
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
    /// Output the handler wrote, in order. Kept apart from the other kinds
    /// by the store (written before them in a batch), so that a quick
    /// task's accepted, started and final report still make one whole
    /// attempt.
    Output(Vec<OutputChunk>),
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

/// The result of an accepted completion.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionResult {
    /// The task after the report.
    pub task: TaskRecord,
    /// The same final report was repeated: acknowledged, nothing changed.
    pub duplicate: bool,
}

/// How many times a task may be handed back (released by an agent, or
/// revoked as a grant never acknowledged) before it FAILS, unless a store is
/// configured otherwise: no grant and release can cycle for ever.
pub const DEFAULT_MAX_RELEASES: u32 = 20;
