//! The server's error type. Every failure the gRPC surface can see passes
//! through the one `From<Error> for tonic::Status` below, which decides the
//! status code and keeps internals (SQL text, file paths) out of messages.

use tonic::Status;
use uuid::Uuid;

use crate::store::TaskState;

/// Everything that can go wrong inside the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database refused or could not be reached.
    #[error("store: {context}: {source}")]
    Store {
        /// What the server was doing.
        context: &'static str,
        /// The driver's error (never shown to clients).
        #[source]
        source: sqlx::Error,
    },
    /// A stored row could not be read back (a column held something the
    /// code does not understand).
    #[error("store: {context}: {detail}")]
    Corrupt {
        /// What the server was reading.
        context: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// The thing asked for does not exist.
    #[error("{what} {id} not found")]
    NotFound {
        /// What kind of thing (`task`, `agent`, `lease`).
        what: &'static str,
        /// Its id as given.
        id: String,
    },
    /// A report carried a fencing token other than the task's current one:
    /// an older lease of the task is talking.
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
    /// revoked or expired, or belongs to someone else.
    #[error("lease {lease_id} is not held by agent {agent_id}")]
    LeaseNotHeld {
        /// The lease named in the request.
        lease_id: Uuid,
        /// The agent that claimed it.
        agent_id: Uuid,
    },
    /// The task's state does not allow the requested change.
    #[error("task {task_id} is {from}: cannot {what}")]
    InvalidTransition {
        /// The task.
        task_id: Uuid,
        /// Its state now.
        from: TaskState,
        /// What was attempted.
        what: &'static str,
    },
    /// A compare-and-set on an agent's document generation lost.
    #[error("agent document generation is {held}, expected {expected}")]
    GenerationMismatch {
        /// The generation stored now.
        held: u64,
        /// The generation the caller based its change on.
        expected: u64,
    },
    /// An input the store cannot accept (the API layer validates first and
    /// reports field violations; this is the store's own guard).
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A setting or configuration file is not usable (start-up only).
    #[error("configuration: {0}")]
    Config(String),
    /// The database URL is not one the server can use.
    #[error("unsupported database url {0:?}: use sqlite://PATH or postgres://…")]
    UnsupportedDatabaseUrl(String),
    /// Binding or serving the gRPC listener failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Building the reflection service failed.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Convenience alias for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        match err {
            // Details stay in the server's log; clients learn only the kind.
            Error::Store { context, .. } => {
                Status::unavailable(format!("store unavailable while {context}"))
            }
            Error::Corrupt { context, .. } => {
                Status::internal(format!("stored data unreadable while {context}"))
            }
            err @ Error::NotFound { .. } => Status::not_found(err.to_string()),
            err @ (Error::StaleFencingToken { .. }
            | Error::LeaseNotHeld { .. }
            | Error::InvalidTransition { .. }) => Status::failed_precondition(err.to_string()),
            err @ Error::GenerationMismatch { .. } => Status::aborted(err.to_string()),
            err @ Error::InvalidArgument { .. } => Status::invalid_argument(err.to_string()),
            Error::UnsupportedDatabaseUrl(_)
            | Error::Config(_)
            | Error::Transport(_)
            | Error::Reflection(_) => Status::internal("internal error"),
        }
    }
}
