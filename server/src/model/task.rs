//! A task's life: [`TaskState`], what a submitter hands in ([`NewTask`],
//! with its [`Deadlines`] and [`Fairness`]),
//! what the store keeps ([`TaskRecord`]) and the append-only history
//! ([`TaskEventRecord`]), and how the queue and listings are read
//! ([`QueueCursor`], [`ParkedPlacement`], [`TaskFilter`], [`Page`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::backoff::RetryPolicy;
use super::names::{StoredName, display};

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

impl StoredName for TaskState {
    const WHAT: &'static str = "task state";
    const NAMES: &'static [(Self, &'static str)] = &[
        (Self::Queued, "queued"),
        (Self::Leased, "leased"),
        (Self::Running, "running"),
        (Self::Succeeded, "succeeded"),
        (Self::Failed, "failed"),
        (Self::Canceled, "canceled"),
    ];
}

impl TaskState {
    /// The name stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        StoredName::stored(self)
    }

    /// True for SUCCEEDED, FAILED and CANCELED, which never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Canceled)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        display(*self, f)
    }
}

/// Why a queued task has no agent yet (`QueuedReason` in task.proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueuedReason {
    /// No agent could ever take it as things are: it waits until one can.
    Parked,
    /// Agents that can take it are busy.
    WaitingForCapacity,
    /// A retry backing off, or a delayed submit, not yet due.
    Backoff,
    /// Its concurrency key, or its namespace, has its limit of tasks
    /// running.
    ConcurrencyLimit,
}

impl QueuedReason {
    /// The reason of a due task, from what matching says about it.
    pub fn of(outcome: &switchyard_core::matcher::Outcome) -> Self {
        match outcome {
            switchyard_core::matcher::Outcome::Parked(_) => Self::Parked,
            // A placeable task is about to be granted; until then it waits.
            _ => Self::WaitingForCapacity,
        }
    }
}

/// What a task is shared out by: within one priority of a namespace,
/// dispatch takes the keys of waiting tasks in weighted round robin
/// (start-time fair queuing on the queue's rank), so a key with thousands
/// waiting delays another key's first task by about one grant per key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fairness {
    /// The tenant, user or repository.
    pub key: String,
    /// Its share against other keys, from 1 to [`MAX_FAIRNESS_WEIGHT`]: a
    /// key of weight 2 gets two grants for every one of a key of weight 1
    /// while both wait.
    pub weight: u32,
}

/// The largest limit a concurrency key may have.
pub const MAX_CONCURRENCY_LIMIT: u32 = 10_000;

/// How full the limits a queued task is held to are: its concurrency key's
/// and its namespace's, each as (running, limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitUsage {
    /// The task's concurrency key, if it has one with a limit.
    pub key: Option<(u64, u64)>,
    /// Its namespace, if the server limits running tasks per namespace.
    pub namespace: Option<(u64, u64)>,
}

impl LimitUsage {
    /// Whether a limit holds the task back.
    pub fn full(&self) -> bool {
        let full = |l: Option<(u64, u64)>| l.is_some_and(|(running, limit)| running >= limit);
        full(self.key) || full(self.namespace)
    }

    /// What an explanation says of the limits that hold the task back,
    /// e.g. `concurrency key deploy-prod: 1/1 running`; empty if none.
    pub fn describe(&self, key: Option<&str>, namespace: &str) -> String {
        let mut parts = Vec::new();
        if let (Some((running, limit)), Some(key)) = (self.key, key)
            && running >= limit
        {
            parts.push(format!("concurrency key {key}: {running}/{limit} running"));
        }
        if let Some((running, limit)) = self.namespace
            && running >= limit
        {
            parts.push(format!("namespace {namespace}: {running}/{limit} running"));
        }
        parts.join("; ")
    }
}

/// The largest weight a fairness key may have.
pub const MAX_FAIRNESS_WEIGHT: u32 = 100;

/// How far apart in the queue's rank a key of weight 1 places its waiting
/// tasks (a key of weight `w`, `1/w` of it). Against tasks without a key
/// (ranked by their submit time) a key's n-th waiting task counts as
/// submitted n/w seconds after the first.
pub const FAIR_STEP_MS: i64 = 1_000;

impl Fairness {
    /// The rank of the key's next task: after the key's last waiting task
    /// by its step, or, if it has none waiting, at the head of the keyed
    /// tasks of its namespace and priority (so it waits behind about one
    /// task of each key), or now if no keyed task waits. Never before the
    /// namespace and priority's fair clock (`clock`: the rank of the last
    /// keyed task granted there), so that tasks left waiting behind it (a
    /// parked one, say) hold no newcomer behind them.
    pub fn next_rank(
        &self,
        last: Option<i64>,
        head: Option<i64>,
        clock: Option<i64>,
        now_ms: i64,
    ) -> i64 {
        let step = FAIR_STEP_MS / i64::from(self.weight.clamp(1, MAX_FAIRNESS_WEIGHT));
        let waiting = match (last, head) {
            (Some(last), head) => last.saturating_add(step).max(head.unwrap_or(i64::MIN)),
            (None, Some(head)) => head,
            (None, None) => return now_ms,
        };
        waiting.max(clock.unwrap_or(i64::MIN))
    }
}

/// A task's deadlines, each opt-in (`None`: no such deadline).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deadlines {
    /// Schedule-to-start: the task must be granted within this long of
    /// becoming due (its submit or `not_before`, or the end of a retry's
    /// backoff), or it FAILS, unschedulable or not started in time.
    pub start_timeout_ms: Option<i64>,
    /// Start-to-close: the longest one attempt may hold its lease, from the
    /// grant; the server then revokes it and counts the attempt, whatever
    /// the heartbeats say.
    pub execution_timeout_ms: Option<i64>,
    /// How long a cancel-requested lease may go on before the server ends
    /// it and the task is CANCELED, even while the agent renews it.
    pub cancel_grace_ms: Option<i64>,
}

impl Deadlines {
    /// When a task that became due at `due_ms` must have been granted by.
    pub fn start_by(&self, due_ms: i64) -> Option<i64> {
        self.start_timeout_ms.map(|t| due_ms.saturating_add(t))
    }
}

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
    /// How its failed attempts back off; `None`: the store's default.
    pub retry: Option<RetryPolicy>,
    /// Its deadlines; none by default.
    pub deadlines: Deadlines,
    /// What it is shared out by; `None`: FIFO by priority.
    pub fairness: Option<Fairness>,
    /// Its concurrency key: at most the key's limit of its tasks run at
    /// once in the namespace; `None`: no limit of its own.
    pub concurrency_key: Option<String>,
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
    /// Times the task was handed back without an attempt (released by an
    /// agent, or revoked as a grant never acknowledged); bounded.
    pub releases: u32,
    /// The attempt budget.
    pub max_attempts: u32,
    /// How its failed attempts back off; `None`: the store's default.
    pub retry: Option<RetryPolicy>,
    /// Its deadlines; none by default.
    pub deadlines: Deadlines,
    /// Once a cancel with a grace was requested of its lease: when the
    /// lease is ended whatever the agent does.
    pub cancel_deadline_ms: Option<i64>,
    /// What it is shared out by; `None`: FIFO by priority.
    pub fairness: Option<Fairness>,
    /// Its place in the queue within its priority: its submit time, or for
    /// a task with a fairness key its fair rank (see [`Fairness`]).
    pub queue_rank: i64,
    /// Its concurrency key, if any.
    pub concurrency_key: Option<String>,
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

/// Which tasks a listing returns.
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
/// (priority descending, then rank: submission order, or fair rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCursor {
    /// The last task's priority.
    pub priority: i32,
    /// Its rank ([`TaskRecord::queue_rank`]).
    pub rank: i64,
    /// Its id (the final tiebreak).
    pub task_id: Uuid,
}

impl QueueCursor {
    /// The cursor just after `task`.
    pub fn after(task: &TaskRecord) -> Self {
        Self {
            priority: task.priority,
            rank: task.queue_rank,
            task_id: task.id,
        }
    }

    /// The cursor just before `task`: a walk from it reads `task` first.
    pub fn before(task: &TaskRecord) -> Self {
        Self::before_place(task.priority, task.queue_rank, task.id)
    }

    /// The cursor just before a task at this place in the queue.
    pub fn before_place(priority: i32, rank: i64, task_id: Uuid) -> Self {
        Self {
            priority,
            rank,
            task_id: Uuid::from_u128(task_id.as_u128().saturating_sub(1)),
        }
    }

    /// Whether a walk from this cursor reads a task at this place in the
    /// queue (it comes after the cursor).
    pub fn reaches(&self, priority: i32, rank: i64, task_id: Uuid) -> bool {
        priority < self.priority
            || (priority == self.priority && (rank, task_id) > (self.rank, self.task_id))
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
    /// The tasks' kind (a hard constraint too).
    pub kind: String,
    /// The tasks' placement as JSON text (`TaskRecord::placement`
    /// serialized); compared as JSON, not as text, where the store can.
    pub placement: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_steps_by_its_weight_and_a_new_key_starts_at_the_head() {
        let light = Fairness {
            key: "a".into(),
            weight: 1,
        };
        let heavy = Fairness {
            key: "b".into(),
            weight: 4,
        };
        // Nothing keyed waits: now, whatever the clock.
        assert_eq!(light.next_rank(None, None, Some(99), 5_000), 5_000);
        // Others wait: at their head.
        assert_eq!(light.next_rank(None, Some(10), None, 5_000), 10);
        // The key waits too: one step after its last, by its weight.
        let (last, head) = (Some(100), Some(10));
        assert_eq!(light.next_rank(last, head, None, 5_000), 100 + FAIR_STEP_MS);
        assert_eq!(
            heavy.next_rank(last, head, None, 5_000),
            100 + FAIR_STEP_MS / 4
        );
        // Never before the last keyed grant: what waits behind it (parked)
        // holds nobody back.
        assert_eq!(light.next_rank(None, Some(10), Some(4_000), 5_000), 4_000);
        assert_eq!(light.next_rank(last, head, Some(4_000), 5_000), 4_000);
        // A weight out of range is held to it.
        let zero = Fairness {
            key: "z".into(),
            weight: 0,
        };
        assert_eq!(zero.next_rank(Some(0), None, None, 0), FAIR_STEP_MS);
    }
}
