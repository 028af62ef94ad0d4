//! The embedded SQLite store: one file, created if missing, WAL journal.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use super::Store;
use crate::error::{Error, Result};

/// A store on an SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The connection pool; SQLite serialises writers, so it stays small.
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://PATH`).
    pub async fn open(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|source| Error::Store {
                context: "parsing the sqlite url",
                source,
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(std::time::Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|source| Error::Store {
                context: "opening the sqlite database",
                source,
            })?;
        Ok(Self { pool })
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
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
