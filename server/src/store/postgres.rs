//! The PostgreSQL store: many server replicas on one database.

use async_trait::async_trait;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::Store;
use crate::error::{Error, Result};

/// A store on a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgStore {
    /// The connection pool shared by every request of this replica.
    pool: PgPool,
}

impl PgStore {
    /// Connects to the database at `url`.
    pub async fn open(url: &str) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(|source| Error::Store {
                context: "connecting to postgres",
                source,
            })?;
        Ok(Self { pool })
    }
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<()> {
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(|source| Error::Store {
                context: "pinging",
                source,
            })?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
