//! The server's error type. Every failure the gRPC surface can see passes
//! through the one `From<Error> for tonic::Status` below, which decides the
//! status code and keeps internals (SQL text, file paths) out of messages.

use tonic::Status;

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
            Error::UnsupportedDatabaseUrl(_) | Error::Transport(_) | Error::Reflection(_) => {
                Status::internal("internal error")
            }
        }
    }
}
