//! A PostgreSQL database of a unit test's own, on the server
//! `SWITCHYARD_TEST_PG` names (the host's shared one by default): created
//! under a unique name, dropped when the test is done with it or panics.

use sqlx::Connection;
use uuid::Uuid;

/// A test's own database; dropped by [`TestDatabase::drop_now`], or when
/// dropped itself (a test that panicked).
pub(crate) struct TestDatabase {
    /// The server's administrative database, to create and drop from.
    admin: String,
    /// The database's name.
    name: String,
    /// Its URL.
    pub(crate) url: String,
    /// Dropped already.
    dropped: bool,
}

impl TestDatabase {
    /// Creates an empty database named `prefix` and a unique suffix.
    pub(crate) async fn create(prefix: &str) -> Self {
        let admin = std::env::var("SWITCHYARD_TEST_PG")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let name = format!("{prefix}_{}", Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&admin).await.expect("connect");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("create database");
        let base = admin
            .rsplit_once('/')
            .map(|(b, _)| b.to_owned())
            .expect("base");
        Self {
            url: format!("{base}/{name}"),
            admin,
            name,
            dropped: false,
        }
    }

    /// Drops the database (its connections closed by force).
    pub(crate) async fn drop_now(mut self) {
        drop_database(&self.admin, &self.name).await;
        self.dropped = true;
    }
}

impl Drop for TestDatabase {
    /// A test that panicked before [`TestDatabase::drop_now`] still drops
    /// its database (on a thread of its own: the test's runtime is
    /// unwinding).
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (admin, name) = (self.admin.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(drop_database(&admin, &name));
            }
        })
        .join();
    }
}

/// Drops the database `name` (its connections closed by force).
async fn drop_database(admin: &str, name: &str) {
    let mut conn = sqlx::PgConnection::connect(admin).await.expect("connect");
    let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    sqlx::query(sqlx::AssertSqlSafe(drop))
        .execute(&mut conn)
        .await
        .expect("drop database");
}
