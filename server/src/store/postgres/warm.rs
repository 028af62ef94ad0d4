//! Connection warm-up. A new backend's first runs of a statement pay for
//! compiling the submit function, cold catalog caches, the prepare round
//! trip and planning afresh, so a freshly started replica's first grants
//! and submits were slow. Each new connection prepares the statements every
//! task goes through, runs each on no rows, and runs a one-task submit
//! that it rolls back: nothing is left behind. One is enough: the submit
//! function keeps the plan its first run makes (migration 0020).

use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::settle::{LEASES_WITH_OUTCOME, SettledColumns, WHOLE_ATTEMPT_TASKS, WHOLE_ATTEMPTS};
use super::submit::{SubmitRows, submit_query};
use crate::error::{Error, Result};
use crate::store::plan::db;

/// Connections the pool opens as soon as the store opens, and keeps.
pub(super) const WARM_CONNECTIONS: u32 = 8;

/// Readies one connection (see the module doc).
pub(super) async fn connection(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    let no_ids: Vec<Uuid> = Vec::new();
    submit_query(&SubmitRows::default(), 0)
        .fetch_all(&mut *conn)
        .await?;
    let rows = SubmitRows::warm_up();
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    submit_query(&rows, 0).fetch_all(&mut *tx).await?;
    tx.rollback().await?;
    sqlx::query(WHOLE_ATTEMPT_TASKS)
        .bind(&no_ids)
        .fetch_all(&mut *conn)
        .await?;
    sqlx::query(LEASES_WITH_OUTCOME)
        .bind(&no_ids)
        .fetch_all(&mut *conn)
        .await?;
    sqlx::query_with(WHOLE_ATTEMPTS, SettledColumns::default().arguments(0)?)
        .fetch_all(&mut *conn)
        .await?;
    Ok(())
}

/// Warms [`WARM_CONNECTIONS`] of the pool's connections at once (each new
/// connection is warmed too, as it opens) and answers how many it warmed.
pub(super) async fn pool(pool: &PgPool) -> Result<usize> {
    let mut held = Vec::new();
    for _ in 0..WARM_CONNECTIONS {
        held.push(pool.acquire().await.map_err(db("acquiring a connection"))?);
    }
    let mut warming = tokio::task::JoinSet::new();
    for mut conn in held {
        warming.spawn(async move {
            connection(&mut conn)
                .await
                .map_err(db("warming a connection"))
        });
    }
    let mut warmed = 0;
    let mut failed = None;
    while let Some(joined) = warming.join_next().await {
        match joined {
            Ok(Ok(())) => warmed += 1,
            Ok(Err(err)) => {
                failed.get_or_insert(err);
            }
            Err(err) => {
                failed.get_or_insert(Error::Corrupt {
                    context: "warming a connection",
                    detail: err.to_string(),
                });
            }
        }
    }
    failed.map_or(Ok(warmed), Err)
}
