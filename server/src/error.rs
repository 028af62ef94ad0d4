//! The server's error type: everything that can go wrong inside it, in the
//! domain's words. Domain code (store, group commit, dispatcher, auth)
//! returns it; only the API layer turns it into a `tonic::Status`, through
//! the one mapping in `api::status`, which decides the code and keeps
//! internals (SQL text, file paths) out of messages. Each variant says the
//! status it becomes.

use std::sync::Arc;

use uuid::Uuid;

use crate::model::TaskState;

/// Everything that can go wrong inside the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database refused or could not be reached. UNAVAILABLE; the
    /// driver's error stays in the server's log.
    #[error("store: {context}: {source}")]
    Store {
        /// What the server was doing.
        context: &'static str,
        /// The driver's error (never shown to clients).
        #[source]
        source: sqlx::Error,
    },
    /// A stored row could not be read back (a column held something the
    /// code does not understand). INTERNAL, without the detail.
    #[error("store: {context}: {detail}")]
    Corrupt {
        /// What the server was reading.
        context: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// The thing asked for does not exist. NOT_FOUND.
    #[error("{what} {id} not found")]
    NotFound {
        /// What kind of thing (`task`, `agent`, `lease`).
        what: &'static str,
        /// Its id as given.
        id: String,
    },
    /// A report carried a fencing token other than the task's current one:
    /// an older lease of the task is talking. FAILED_PRECONDITION.
    #[error("task {task_id}: fencing token {presented} is stale (current {current})")]
    StaleFencingToken {
        /// The task reported on.
        task_id: Uuid,
        /// The token in the report.
        presented: u64,
        /// The task's current token.
        current: u64,
    },
    /// The lease is not (or no longer) held by this agent: it ended, was
    /// revoked or expired, or belongs to someone else. FAILED_PRECONDITION.
    #[error("lease {lease_id} is not held by agent {agent_id}")]
    LeaseNotHeld {
        /// The lease named in the request.
        lease_id: Uuid,
        /// The agent that claimed it.
        agent_id: Uuid,
    },
    /// The task's state does not allow the requested change.
    /// FAILED_PRECONDITION.
    #[error("task {task_id} is {from}: cannot {what}")]
    InvalidTransition {
        /// The task.
        task_id: Uuid,
        /// Its state now.
        from: TaskState,
        /// What was attempted.
        what: &'static str,
    },
    /// A compare-and-set on an agent's document generation lost. ABORTED.
    #[error("agent document generation is {held}, expected {expected}")]
    GenerationMismatch {
        /// The generation stored now.
        held: u64,
        /// The generation the caller based its change on.
        expected: u64,
    },
    /// A request field is not acceptable. INVALID_ARGUMENT, with a field
    /// violation naming the field.
    #[error("{field}: {reason}")]
    Invalid {
        /// The offending field, as a path (`placement.requirements[2].values`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No valid credentials. UNAUTHENTICATED.
    #[error("{0}")]
    Unauthenticated(String),
    /// The credentials do not allow this. PERMISSION_DENIED.
    #[error("{0}")]
    PermissionDenied(String),
    /// A configured limit is reached. RESOURCE_EXHAUSTED.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The server is overloaded: the caller should try again after
    /// `retry_after_ms`. RESOURCE_EXHAUSTED with a `RetryInfo` detail.
    #[error("{what}; retry in {retry_after_ms} ms")]
    Overloaded {
        /// What is full.
        what: String,
        /// When to try again.
        retry_after_ms: u64,
    },
    /// The request conflicts with the state of things (a session epoch that
    /// is not the agent's current one). FAILED_PRECONDITION.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The server cannot serve this now (it is shutting down). UNAVAILABLE.
    #[error("{0}")]
    Unavailable(String),
    /// A group commit failed for every caller whose items were in it; each
    /// caller gets this. The status of the error inside.
    #[error("{0}")]
    Batch(Arc<Error>),
    /// A setting or configuration file is not usable (start-up only).
    /// INTERNAL.
    #[error("configuration: {0}")]
    Config(String),
    /// The database URL is not one the server can use (start-up only).
    /// INTERNAL.
    #[error("unsupported database url {0:?}: use sqlite://PATH or postgres://…")]
    UnsupportedDatabaseUrl(String),
    /// Binding or serving the gRPC listener failed. INTERNAL.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Building the reflection service failed. INTERNAL.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Convenience alias for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An invalid request field: `field` and what is wrong with it.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Whether the database failed (the transaction is unusable), rather
    /// than one item being refused.
    pub fn is_store_failure(&self) -> bool {
        match self {
            Self::Store { .. } | Self::Corrupt { .. } => true,
            Self::Batch(inner) => inner.is_store_failure(),
            _ => false,
        }
    }
}
