//! PostgreSQL only: how `tasks` lays out its rows on pages. A task's row is
//! updated as it is leased and settled, never HOT (its state is in the
//! queue indexes' predicates); its pages keep room for those new versions
//! (migration 0022), so an update stays on the row's page, logged as the
//! bytes that changed, instead of moving to another page with the whole
//! row and a lock record for the old one. SQLite has no such setting.

use serde_json::json;
use sqlx::{Connection, PgConnection};
use switchyard_server::model::{CompletionOutcome, TaskState};
use uuid::Uuid;

use crate::common::{Fixture, T0, agent, completion, grant, submit_tasks};

/// The page of a task's current row.
async fn page_of(conn: &mut PgConnection, task_id: Uuid) -> i32 {
    sqlx::query_scalar("SELECT (ctid::text::point)[0]::int FROM tasks WHERE id = $1")
        .bind(task_id)
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_task_keeps_its_page_as_it_is_leased_and_settled() {
    let fx = Fixture::postgres().await;
    let mut conn = PgConnection::connect(&fx.url).await.unwrap();
    // Enough to fill the first task's page and more: with its pages filled
    // by inserts, each update would move to another.
    let ids = submit_tasks(fx.store.as_ref(), "ns", 60).await;
    let worker = agent(fx.store.as_ref(), "ns", "w1", 1).await;
    let first = page_of(&mut conn, ids[0]).await;
    assert_ne!(
        page_of(&mut conn, ids[59]).await,
        first,
        "60 tasks fill more than a page"
    );
    let lease = grant(fx.store.as_ref(), ids[0], worker.id, T0).await;
    assert_eq!(page_of(&mut conn, ids[0]).await, first, "leased");
    let done = CompletionOutcome::Succeeded { result: json!({}) };
    let settled = fx
        .store
        .complete_leases(&[completion(&lease, done)], T0 + 1)
        .await
        .unwrap();
    settled[0].as_ref().unwrap();
    let task = fx.store.get_task(ids[0]).await.unwrap();
    assert_eq!(task.state, TaskState::Succeeded);
    assert_eq!(page_of(&mut conn, ids[0]).await, first, "settled");
    conn.close().await.unwrap();
    fx.finish().await;
}
