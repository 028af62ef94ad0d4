//! The task store: where agents, tasks, leases and task history live. A
//! trait with two implementations, chosen at start-up from the database URL
//! and shared as `Arc<dyn Store>`: PostgreSQL for many replicas on one
//! database, SQLite as the embedded default that needs nothing installed.

mod postgres;
mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

use crate::error::{Error, Result};

/// The operations the server needs from its database.
#[async_trait]
pub trait Store: std::fmt::Debug + Send + Sync + 'static {
    /// Which backend this is (`sqlite` or `postgres`), for logs and metrics.
    fn backend(&self) -> &'static str;
    /// Runs the backend's migrations (idempotent).
    async fn migrate(&self) -> Result<()>;
    /// Succeeds while the database answers; health reporting polls it.
    async fn ping(&self) -> Result<()>;
    /// Closes the pool, waiting for in-flight statements.
    async fn close(&self);
}

/// Opens the store a database URL names: `sqlite://PATH` (created if
/// missing) or `postgres://…`.
pub async fn open(url: &str) -> Result<Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PgStore::open(url).await?))
    } else {
        Err(Error::UnsupportedDatabaseUrl(redact_url(url)))
    }
}

/// The URL without its password, for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:[redacted]{}", &url[..scheme_end + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redact_url_hides_the_password_only() {
        assert_eq!(
            redact_url("postgres://app:hunter2@db:5432/sy"),
            "postgres://app:[redacted]@db:5432/sy"
        );
        assert_eq!(
            redact_url("sqlite://switchyard.db"),
            "sqlite://switchyard.db"
        );
    }
}
