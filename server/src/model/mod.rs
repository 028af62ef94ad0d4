//! The server's domain records: tasks, leases, agents, tokens and the
//! events every replica hears, as plain Rust (no protobuf, no SQL), with
//! their lifecycles as enums from the store's rows to the wire. The store
//! persists them, the dispatcher and the API act on them, and `wire`
//! shows them to clients. Times are Unix milliseconds; JSON documents are
//! `serde_json::Value`.
//!
//! # Layout
//! - [`task`]: a task's life ([`TaskState`]), what is submitted and stored,
//!   its history, and how the queue is read.
//! - [`lease`]: a lease's life ([`LeaseState`], [`LeaseEnd`]), grants,
//!   lease reports and their outcomes, why the server revokes
//!   ([`RevocationCause`]).
//! - [`backoff`]: the waits before a task is offered again (a busy
//!   release's, a failed attempt's [`RetryPolicy`]).
//! - [`output`]: a task's output as runners send it and the store keeps
//!   it, the bounds on what is kept, a failed attempt's tail.
//! - [`queue`]: a namespace's queue summarised for people (groups of
//!   queued tasks by kind and placement).
//! - [`agent`]: an agent's record and status, registration, heartbeats.
//! - [`token`]: bearer token records and [`Role`]s.
//! - [`event`]: [`StoreEvent`], the wake-ups every replica hears.
//! - [`names`]: the stored name of every lifecycle enum, and
//!   [`UnknownState`] for a name the code does not know.

pub mod agent;
pub mod backoff;
pub mod event;
pub mod lease;
pub mod names;
pub mod output;
pub mod queue;
pub mod task;
pub mod token;

pub use agent::{
    AgentParts, AgentRecord, AgentRegistration, AgentStatus, Beat, BeatApplied, BeatOutcome,
    DocumentWrite, NameContention, RenewedLease,
};
pub use backoff::{
    DEFAULT_BACKOFF_BASE_MS, DEFAULT_RETRY_JITTER, DEFAULT_RETRY_MULTIPLIER, MAX_BACKOFF_MS,
    MAX_RETRY_MULTIPLIER, RetryPolicy, release_backoff_ms,
};
pub use event::{EndedLease, StoreEvent};
pub use lease::{
    Completion, CompletionOutcome, CompletionResult, DEFAULT_MAX_RELEASES, GrantOutcome,
    GrantRefusal, GrantRequest, LeaseEnd, LeaseRecord, LeaseReport, LeaseState, ReleaseCause,
    ReportApplied, ReportKind, RevocationCause, Submission, Submitted,
};
pub use names::{StoredName, UnknownState};
pub use output::{OutputBounds, OutputChunk, OutputStream, StoredChunk};
pub use queue::{QueueGroup, QueueGroupRow, QueueSummary};
pub use task::{
    Deadlines, FAIR_STEP_MS, Fairness, LimitUsage, MAX_CONCURRENCY_LIMIT, MAX_FAIRNESS_WEIGHT,
    NewTask, Page, ParkedPlacement, QueueCursor, QueuedReason, TaskEventRecord, TaskFilter,
    TaskRecord, TaskState,
};
pub use token::{Role, TokenRecord};
