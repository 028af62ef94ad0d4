//! PostgreSQL only: how `tasks` lays out its rows on pages. A task's row is
//! updated as it is leased and settled, never HOT (its state is in the
//! queue indexes' predicates); its pages keep room for those new versions
//! (migration 0022), so an update stays on the row's page, logged as the
//! bytes that changed, instead of moving to another page with the whole
//! row and a lock record for the old one. SQLite has no such setting.

use sqlx::Connection;
use uuid::Uuid;

use crate::common::{Fixture, T0, agent, grant, submit_tasks};

/// The page of a task's current row.
async fn page_of(url: &str, task_id: Uuid) -> i32 {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let page: i32 =
        sqlx::query_scalar("SELECT (ctid::text::point)[0]::int FROM tasks WHERE id = $1")
            .bind(task_id)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    conn.close().await.unwrap();
    page
}

#[tokio::test]
async fn a_leased_task_keeps_its_page() {
    let fx = Fixture::postgres().await;
    // Enough to fill the first task's page and more: with its pages filled
    // by inserts, its update would move to another.
    let ids = submit_tasks(fx.store.as_ref(), "ns", 60).await;
    let worker = agent(fx.store.as_ref(), "ns", "w1", 1).await;
    let first = page_of(&fx.url, ids[0]).await;
    assert_ne!(
        page_of(&fx.url, ids[59]).await,
        first,
        "60 tasks fill more than a page"
    );
    grant(fx.store.as_ref(), ids[0], worker.id, T0).await;
    assert_eq!(page_of(&fx.url, ids[0]).await, first);
    fx.finish().await;
}
