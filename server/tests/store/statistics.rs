//! PostgreSQL only: the store keeps the planner's statistics up with tables
//! that double, rather than leave each connection planning with the sizes
//! autovacuum last counted (it looks about once a minute, and a plan made
//! while `leases` was small once scanned the whole table for every report
//! batch). SQLite plans without sizes.

use std::time::Duration;

use serde_json::json;
use sqlx::Connection;
use switchyard_server::model::Submission;
use uuid::Uuid;

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
    // Empty, and analyzed at most once (by the migrations).
    let (empty, analyzed) = counted(&mut conn, "tasks").await;
    assert_eq!(empty, 0);
    assert!(analyzed <= 1, "analyzed {analyzed} times");

    // About 1.5 KB a task, not compressible: a few thousand fill more
    // than the 1,024 pages (8 MiB) below which the keeper leaves a table
    // to autovacuum.
    let mut grown = 0;
    for batch in 0..100 {
        let submissions: Vec<Submission> = (0..200)
            .map(|i| {
                let mut t = task("ns", 0, 3);
                let filler: String = (0..45)
                    .map(|_| Uuid::new_v4().simple().to_string())
                    .collect();
                t.payload = json!({"batch": batch, "i": i, "filler": filler});
                Submission {
                    task: t,
                    agent_id: None,
                }
            })
            .collect();
        let done = fx.store.submit_many(&submissions, T0).await.unwrap();
        assert!(done.iter().all(Result::is_ok));
        grown = pages(&mut conn, "tasks").await;
        if grown > 1_100 {
            break;
        }
    }
    assert!(grown > 1_100, "tasks take {grown} pages");

    // The keeper looks every 2 s; bounded, so a store without it fails.
    // It promises the planner's count within a factor of two of the size.
    let relpages = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (relpages, times) = counted(&mut conn, "tasks").await;
            if times > analyzed && 2 * i64::from(relpages) > grown {
                return relpages;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the grown tasks table analyzed within 20 s");
    assert!(i64::from(relpages) <= grown);
    // A table under 1,024 pages is left to autovacuum.
    assert_eq!(counted(&mut conn, "agents").await.1, 0);
    conn.close().await.unwrap();
    fx.finish().await;
}

/// The planner has statistics for the start deadline's expression over the
/// whole table: its partial index is empty while no task has a start
/// timeout, and without them the planner guessed a third of the table for
/// the sweep's search and made it a parallel scan on a large queue.
#[tokio::test]
async fn the_start_deadline_has_statistics_of_its_own() {
    let fx = Fixture::postgres().await;
    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    let expressions: Vec<String> = sqlx::query_scalar(
        "SELECT pg_get_statisticsobjdef_expressions(oid)::text FROM pg_statistic_ext \
         WHERE stxrelid = 'tasks'::regclass",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(
        expressions
            .iter()
            .any(|e| e.contains("not_before_ms + start_timeout_ms")),
        "{expressions:?}"
    );
    conn.close().await.unwrap();
    fx.finish().await;
}

/// The task's documents take no part in the planner's statistics: no
/// statement filters on them by value, and sampling and sorting them was
/// most of what analyzing `tasks` cost. The columns statements do filter on
/// (here the state) still have theirs.
#[tokio::test]
async fn the_task_documents_are_left_out_of_the_statistics() {
    let fx = Fixture::postgres().await;
    let submissions: Vec<Submission> = (0..50)
        .map(|i| {
            let mut t = task("ns", 0, 3);
            t.payload = json!({"step": i, "args": ["--release", format!("--jobs={i}")]});
            t.labels
                .insert("team".to_owned(), format!("team-{}", i % 3));
            Submission {
                task: t,
                agent_id: None,
            }
        })
        .collect();
    for result in fx.store.submit_many(&submissions, T0).await.unwrap() {
        result.unwrap();
    }
    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    sqlx::query("ANALYZE tasks")
        .execute(&mut conn)
        .await
        .unwrap();
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT attname::text FROM pg_stats WHERE tablename = 'tasks' ORDER BY attname",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(columns.iter().any(|c| c == "state"), "{columns:?}");
    for document in [
        "payload",
        "placement",
        "labels",
        "result",
        "error",
        "progress",
    ] {
        assert!(
            !columns.iter().any(|c| c == document),
            "{document} has statistics: {columns:?}"
        );
    }
    conn.close().await.unwrap();
    fx.finish().await;
}
