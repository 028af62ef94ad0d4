//! What a namespace's queue holds, summarised for people (the console's
//! queue page, `GetQueueSummary`): live tasks by state, and queued tasks
//! grouped by kind and placement — the tasks of one group wait for the same
//! agents, so one explanation covers them all.

use serde_json::Value;

use super::task::{QueuedReason, TaskState};

/// Queued tasks of one kind and placement, as the store counts them.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueGroupRow {
    /// The tasks' kind.
    pub kind: String,
    /// Their stored placement.
    pub placement: Value,
    /// How many are queued.
    pub tasks: u64,
    /// Of those, how many are not due yet (backing off, or submitted to
    /// start later).
    pub not_yet_due: u64,
    /// The oldest one's submit time.
    pub oldest_submitted_ms: i64,
}

/// A [`QueueGroupRow`] with what matching says about it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueGroup {
    /// The group as counted.
    pub row: QueueGroupRow,
    /// Why its due tasks wait; `None` when an agent could take one now.
    pub reason: Option<QueuedReason>,
    /// The explanation's summary line.
    pub explanation: String,
    /// Agents that satisfy the placement, room or not.
    pub capable_agents: u32,
    /// Agents that satisfy it and have room now.
    pub eligible_agents: u32,
}

/// A namespace's queue, summarised.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueueSummary {
    /// The namespace.
    pub namespace: String,
    /// Live tasks by state (states with none left out).
    pub states: Vec<(TaskState, u64)>,
    /// Queued tasks by reason (reasons with none left out).
    pub reasons: Vec<(QueuedReason, u64)>,
    /// The largest groups, largest first.
    pub groups: Vec<QueueGroup>,
    /// Groups beyond those in `groups`.
    pub more_groups: u64,
    /// Agents of the namespace taking work now.
    pub agents_taking_work: u32,
    /// Agents registered in the namespace.
    pub agents_registered: u32,
    /// Whether the groups were matched against the fleet (reason,
    /// explanation, capable and eligible agents); when not, those are
    /// empty and the queued reasons count only what is not yet due.
    pub explained: bool,
    /// When it was made (the store read for it), in milliseconds.
    pub made_at_ms: i64,
}
