//! PostgreSQL only: the store keeps the planner's statistics up with tables
//! that double, rather than leave each connection planning with the sizes
//! autovacuum last counted (it looks about once a minute, and a plan made
//! while `leases` was small once scanned the whole table for every report
//! batch). SQLite plans without sizes.

use std::time::Duration;

use serde_json::json;
use sqlx::Connection;
use switchyard_server::model::Submission;

use crate::common::{Fixture, T0, task};

/// `(relpages, times analyzed)` of `table`, as the catalog says.
async fn counted(conn: &mut sqlx::PgConnection, table: &str) -> (i32, i64) {
    sqlx::query_as(
        "SELECT c.relpages, s.analyze_count FROM pg_class c \
         JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.relname = $1",
    )
    .bind(table)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Pages `table` takes on disk.
async fn pages(conn: &mut sqlx::PgConnection, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT pg_relation_size(to_regclass($1)) / current_setting('block_size')::int8",
    )
    .bind(table)
    .fetch_one(conn)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_table_that_grew_is_analyzed_without_autovacuum() {
    let fx = Fixture::postgres().await;
    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    // Only the store may analyze them here.
    for table in ["tasks", "agents"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    assert_eq!(counted(&mut conn, "tasks").await, (0, 0));

    // About a kilobyte a task: a few hundred fill more than 64 pages.
    let filler = "x".repeat(1_000);
    let submissions: Vec<Submission> = (0..600)
        .map(|i| {
            let mut t = task("ns", 0, 3);
            t.payload = json!({"i": i, "filler": filler});
            Submission {
                task: t,
                agent_id: None,
            }
        })
        .collect();
    for chunk in submissions.chunks(100) {
        let done = fx.store.submit_many(chunk, T0).await.unwrap();
        assert!(done.iter().all(Result::is_ok));
    }
    let grown = pages(&mut conn, "tasks").await;
    assert!(grown >= 64, "600 tasks take {grown} pages");

    // The keeper looks every 2 s; bounded, so a store without it fails.
    // It promises the planner's count within a factor of two of the size.
    let relpages = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (relpages, times) = counted(&mut conn, "tasks").await;
            if times > 0 && 2 * i64::from(relpages) > grown {
                return relpages;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the grown tasks table analyzed within 20 s");
    assert!(i64::from(relpages) <= grown);
    // A table under 64 pages is left to autovacuum.
    assert_eq!(counted(&mut conn, "agents").await.1, 0);
    conn.close().await.unwrap();
    fx.finish().await;
}
