//! The set-based paths on a database of their own, so that what
//! PostgreSQL did on the store's connections can be read back.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use super::{grant, settle, submit};
use crate::model::{
    AgentRegistration, CompletionOutcome, GrantOutcome, GrantRequest, LeaseRecord, LeaseReport,
    NewTask, QueueCursor, ReportKind, Submission,
};
use crate::store::sql::{Backend, Dialect};
use crate::store::test_db::TestDatabase;
use crate::store::{AgentStore, LeaseStore, Store, StoreOptions, TaskStore};

const T0: i64 = 1_700_000_000_000;

/// Grants, report batches and submits' batches run on a few connections of
/// their own (`warm`), and each statement of a grant or a report batch
/// after the tasks' lock on the plan the connection keeps: PostgreSQL
/// plans a statement afresh for its first five runs on a connection, and
/// the 32 connections every request shares take turns, so there nearly
/// every grant and report batch was planned for its one run (the grant's
/// writing statement alone about 0.85 ms of each dispatch round). A
/// report batch's whole successes are settled there too, in a call of
/// their own (`settle::SETTLE_SUCCESSES`); its other whole attempts (here
/// failures) in the batch's transaction.
#[tokio::test]
async fn grants_reports_and_submits_run_on_their_own_connections_and_kept_plans() {
    const RUNS: i64 = 8;
    let db = TestDatabase::create("sy_pgstore").await;
    let store = super::PgStore::open(&db.url, StoreOptions::default())
        .await
        .expect("open the store");
    store.migrate().await.expect("migrate");
    let registration = AgentRegistration {
        namespace: "default".into(),
        name: "w".into(),
        reported: json!({}),
        document: json!({}),
        provenance: json!({}),
        rejections: json!([]),
        capacity: 100,
        labels: BTreeMap::new(),
        runner: "test".into(),
        handled_kinds: vec!["*".into()],
        registered_by: String::new(),
    };
    let agent = store
        .register_agent(&registration, T0)
        .await
        .expect("register")
        .id;
    let submissions = queued(2 * RUNS);
    let before = plans_on_batch_connections(&store).await;
    let tasks: Vec<Uuid> = store
        .submit_many(&submissions, T0)
        .await
        .expect("submit")
        .into_iter()
        .map(|s| s.expect("stored").0.id)
        .collect();

    let mut leases: Vec<LeaseRecord> = Vec::new();
    for task in &tasks {
        let request = GrantRequest::one_slot(*task, agent);
        match store
            .grant_leases(&[request], T0)
            .await
            .expect("grant")
            .as_slice()
        {
            [GrantOutcome::Granted(lease)] => leases.push(lease.clone()),
            other => panic!("grant refused: {other:?}"),
        }
    }
    for (i, lease) in leases.iter().enumerate() {
        let end = if i < RUNS as usize {
            CompletionOutcome::Failed {
                error: json!({"message": "exit 1", "retryable": false}),
                retryable: false,
            }
        } else {
            CompletionOutcome::Succeeded { result: json!({}) }
        };
        let kinds = [
            ReportKind::Accepted,
            ReportKind::Started,
            ReportKind::Final(end),
        ];
        let reports: Vec<LeaseReport> = kinds
            .into_iter()
            .map(|kind| LeaseReport {
                lease_id: lease.id,
                task_id: lease.task_id,
                agent_id: lease.agent_id,
                fencing_token: lease.fencing_token,
                kind,
            })
            .collect();
        let applied = store
            .apply_reports(&reports, T0 + 1)
            .await
            .expect("reports");
        assert!(applied.iter().all(Result::is_ok), "{applied:?}");
    }

    let after = plans_on_batch_connections(&store).await;
    let made = |i: usize| (after[i].0 - before[i].0, after[i].1 - before[i].1);
    // The submits' batch ran there, and the locks once a grant or a batch,
    // on plans of PostgreSQL's choice; the rest on the plans the
    // connections kept.
    for (i, what, runs) in [
        (5, "the submits' batch", 1),
        (0, "the grant's lock", 2 * RUNS),
        (1, "the report batch's lock", RUNS),
        (6, "the whole successes' call", RUNS),
    ] {
        let (kept, planned) = made(i);
        assert_eq!(
            kept + planned,
            runs,
            "{what}: runs on the batch paths' connections"
        );
    }
    for (i, what, runs) in [
        (2, "the grant's writing statement", 2 * RUNS),
        (3, "reading the leases", RUNS),
        (4, "the whole attempts", RUNS),
    ] {
        assert_eq!(
            made(i),
            (runs, 0),
            "{what}: (runs on kept plans, on plans made for one)"
        );
    }
    store.backend.close().await;
    db.drop_now().await;
}

/// The statements of a grant, a report batch and a submits' batch, as
/// [`plans_on_batch_connections`] answers them.
const BATCH_STATEMENTS: [&str; 7] = [
    grant::LOCK_TASKS_TO_GRANT,
    settle::WHOLE_ATTEMPT_TASKS,
    grant::GRANT_LEASES,
    settle::LEASES_WITH_OUTCOME,
    settle::WHOLE_ATTEMPTS,
    submit::SUBMIT_BATCH,
    settle::SETTLE_SUCCESSES,
];

/// `n` submits of a plain task in namespace `default`, none reserved.
fn queued(n: i64) -> Vec<Submission> {
    (0..n)
        .map(|_| Submission {
            task: NewTask {
                namespace: "default".into(),
                kind: "exec".into(),
                payload: Value::Null,
                placement: json!({}),
                priority: 0,
                max_attempts: 3,
                retry: None,
                deadlines: Default::default(),
                fairness: None,
                concurrency_key: None,
                lease_ttl_ms: 10_000,
                idempotency_key: None,
                not_before_ms: None,
                labels: BTreeMap::new(),
            },
            agent_id: None,
        })
        .collect()
}

/// A page of the queue after a cursor starts just after it, however many
/// tasks share the cursor's rank: the range as SQLite reads it started at
/// the cursor's rank and left the tasks of that rank before the cursor to
/// a filter, so each page after a cursor among a thousand tasks submitted
/// in one millisecond read all the tasks before it again.
#[tokio::test]
async fn a_queue_page_after_a_cursor_reads_no_task_before_it() {
    let db = TestDatabase::create("sy_pgqueue").await;
    let store = super::PgStore::open(&db.url, StoreOptions::default())
        .await
        .expect("open the store");
    store.migrate().await.expect("migrate");
    store.submit_many(&queued(1_000), T0).await.expect("submit");
    let head = store
        .queued_tasks(Some("default"), T0 + 10, None, &[], 500)
        .await
        .expect("a page");
    let last = head.last().expect("a page of tasks");
    assert_eq!(head[0].queue_rank, last.queue_rank, "one rank for all");
    let cursor = QueueCursor::after(last);

    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .expect("connect");
    let plan: Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        <sqlx::Postgres as Dialect>::QUEUE_AFTER
    )))
    .bind(T0 + 10)
    .bind("default")
    .bind(100_i64)
    .bind("[]")
    .bind(cursor.priority)
    .bind(cursor.rank)
    .bind(cursor.task_id)
    .fetch_one(&pool)
    .await
    .expect("explain a page after the cursor");
    assert_eq!(plan[0]["Plan"]["Actual Rows"], 100, "{plan}");
    assert_eq!(rows_removed(&plan[0]["Plan"]), 0, "{plan}");
    pool.close().await;
    store.backend.close().await;
    db.drop_now().await;
}

/// The rows every node of `plan` read and dropped by a filter.
fn rows_removed(plan: &Value) -> u64 {
    let own = ["Rows Removed by Filter", "Rows Removed by Join Filter"]
        .iter()
        .filter_map(|k| plan[k].as_u64())
        .sum::<u64>();
    let children = plan["Plans"]
        .as_array()
        .map_or(0, |plans| plans.iter().map(rows_removed).sum());
    own + children
}

/// For each of [`BATCH_STATEMENTS`], its runs on kept plans and on plans
/// made for one run, summed over the store's batch connections (every one
/// of them held at once).
async fn plans_on_batch_connections(store: &super::PgStore) -> Vec<(i64, i64)> {
    let mut held = Vec::new();
    for _ in 0..super::warm::BATCH_CONNECTIONS {
        held.push(store.backend.batches.acquire().await.expect("acquire"));
    }
    let mut sums = Vec::new();
    for sql in BATCH_STATEMENTS {
        let mut sum = (0, 0);
        for conn in &mut held {
            let found: Option<(i64, i64)> = sqlx::query_as(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
                 WHERE statement = $1",
            )
            .bind(sql)
            .fetch_optional(&mut **conn)
            .await
            .expect("the prepared statements");
            let (kept, made) = found.unwrap_or_default();
            sum = (sum.0 + kept, sum.1 + made);
        }
        sums.push(sum);
    }
    sums
}

/// `random_page_cost` on a connection of the store's pool, opened on
/// `db`'s database after the database set `price` (if any).
async fn price_on_the_store_connections(db: &TestDatabase, price: Option<&str>) -> String {
    if let Some(price) = price {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&db.url)
            .await
            .expect("connect");
        let database: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&pool)
            .await
            .expect("database");
        let set = format!("ALTER DATABASE \"{database}\" SET random_page_cost = {price}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(set))
            .execute(&pool)
            .await
            .expect("set the price");
        pool.close().await;
    }
    let store = super::PgStore::open(&db.url, StoreOptions::default())
        .await
        .expect("open the store");
    let price: String = sqlx::query_scalar("SELECT current_setting('random_page_cost')")
        .fetch_one(&store.backend.pool)
        .await
        .expect("the price");
    store.backend.pool.close().await;
    price
}

/// The store's connections price a page read out of order as memory does
/// (`warm::price_pages`): at PostgreSQL's default (4, for disks that
/// seek) a report batch read all of `leases` rather than its own leases.
#[tokio::test]
async fn the_store_connections_price_a_page_read_out_of_order_as_memory_does() {
    let db = TestDatabase::create("sy_pgstore").await;
    assert_eq!(price_on_the_store_connections(&db, None).await, "1.1");
    db.drop_now().await;
}

/// A price the database sets (or the role, the server's configuration,
/// the connection's options) is left as it is.
#[tokio::test]
async fn a_price_of_pages_the_database_sets_is_kept() {
    let db = TestDatabase::create("sy_pgstore").await;
    assert_eq!(price_on_the_store_connections(&db, Some("2")).await, "2");
    db.drop_now().await;
}
