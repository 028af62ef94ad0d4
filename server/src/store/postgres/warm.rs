//! Connection set-up: the planner's price of a page, then warm-up; the
//! connections of the batch paths.
//!
//! PostgreSQL prices a page read out of order at four read in order
//! (`random_page_cost`, for disks that seek); the rows the store writes
//! and reads by key (live leases, the queue, tasks of this hour) are in
//! memory, where the two cost the same. At the default the planner chose
//! one pass over all of `leases`, which keeps every lease ever held, over
//! a lookup per lease of a report batch, up to some tens of thousands of
//! leases: a pass that grew with every task run. Each connection prices a
//! page read out of order at [`RANDOM_PAGE_COST`] unless PostgreSQL's
//! configuration, the database, the role or the connection set a price.
//!
//! A new backend's first runs of a statement pay for compiling the submit
//! function, cold catalog caches, the prepare round trip and planning
//! afresh, so a freshly started replica's first grants and submits were
//! slow. Each new connection prepares the statements every task goes
//! through, runs each on no rows, and runs a one-task submit that it rolls
//! back: nothing is left behind. One is enough: the submit function keeps
//! the plan its first run makes (migration 0020).
//!
//! The grants, the report batches and the submits' batches run on
//! [`BATCH_CONNECTIONS`] of their own. On the 32 connections every request
//! shares, which the pool hands out in turn, each of their statements met
//! a connection that had run it a few times at most: PostgreSQL plans a
//! prepared statement afresh for its first five runs on a connection
//! before it may keep a plan, and again after each analysis of its tables,
//! and each connection's caches (the submit function's compiled body
//! among them) were cold for them. On four of their own they reach the
//! plans each connection keeps within a few batches, and stay warm. (Their
//! sessions keep PostgreSQL's choice of plan for the tasks' lock that
//! begins a grant or a report batch: forced to keep one, a connection kept
//! the plan it made while `tasks` was small, a pass over the whole table,
//! as the queue grew.)

use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::settle::{
    LEASES_WITH_OUTCOME, SETTLE_SUCCESSES, SettledColumns, WHOLE_ATTEMPT_TASKS, WHOLE_ATTEMPTS,
};
use super::submit::{SubmitRows, submit_query};
use crate::error::{Error, Result};
use crate::store::plan::db;

/// Connections the pool opens as soon as the store opens, and keeps.
pub(super) const WARM_CONNECTIONS: u32 = 8;

/// Connections of the grants, the report batches and the submits' batches
/// (see the module doc): one dispatcher grants at a time, at most two
/// report batches and one batch of submits commit at once, so none waits
/// for a connection.
pub(super) const BATCH_CONNECTIONS: u32 = 4;

/// The planner's price of a page read out of order on the store's
/// connections, where PostgreSQL's own is its default (see the module doc):
/// the value PostgreSQL's documentation gives for storage with no seek.
const RANDOM_PAGE_COST: &str = "1.1";

/// Sets [`RANDOM_PAGE_COST`] for the session if the price in force is
/// PostgreSQL's default, set by nobody (not the server's configuration,
/// the database, the role nor the connection's options).
const PRICE_PAGES: &str = "SELECT set_config('random_page_cost', $1, false) \
  FROM pg_settings WHERE name = 'random_page_cost' AND source = 'default'";

/// Prices a page read out of order for a new connection's session (see
/// the module doc), before anything on it is planned.
pub(super) async fn price_pages(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query(PRICE_PAGES)
        .bind(RANDOM_PAGE_COST)
        .execute(conn)
        .await?;
    Ok(())
}

/// Warms one connection (see the module doc).
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
    sqlx::query(SETTLE_SUCCESSES)
        .bind(&no_ids)
        .bind(&no_ids)
        .bind(&no_ids)
        .bind(Vec::<i64>::new())
        .bind(Vec::<String>::new())
        .bind(0_i64)
        .fetch_all(&mut *conn)
        .await?;
    Ok(())
}

/// Warms `count` of the pool's connections at once (each new connection is
/// warmed too, as it opens) and answers how many it warmed.
pub(super) async fn pool(pool: &PgPool, count: u32) -> Result<usize> {
    let mut held = Vec::new();
    for _ in 0..count {
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
