//! The set-based paths on one connection of a database of their own, so
//! that what PostgreSQL did on that connection can be read back.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use super::{grant, settle};
use crate::model::{
    AgentRegistration, CompletionOutcome, GrantOutcome, GrantRequest, LeaseRecord, LeaseReport,
    NewTask, ReportKind, Submission,
};
use crate::store::sql::Write;
use crate::store::test_db::TestDatabase;
use crate::store::{self, StoreOptions};

const T0: i64 = 1_700_000_000_000;

/// Grants and report batches run each of their statements after the
/// first on the plan the connection keeps: PostgreSQL plans a statement
/// afresh for its first five runs on a connection, and the store's
/// connections take turns, so with the choice left to PostgreSQL nearly
/// every grant and report batch was planned for its one run (the grant's
/// writing statement alone about 0.85 ms of each dispatch round).
#[tokio::test]
async fn grants_and_report_batches_run_on_the_plans_a_connection_keeps() {
    const RUNS: i64 = 8;
    let db = TestDatabase::create("sy_pgstore").await;
    let store = store::open(&db.url).await.expect("open the store");
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
    let submissions: Vec<Submission> = (0..RUNS)
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
        .collect();
    let tasks: Vec<Uuid> = store
        .submit_many(&submissions, T0)
        .await
        .expect("submit")
        .into_iter()
        .map(|s| s.expect("stored").0.id)
        .collect();
    store.close().await;

    // One connection: every grant and report batch on it.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .expect("connect");
    let mut leases: Vec<LeaseRecord> = Vec::new();
    for task in &tasks {
        let mut w = Write::new(pool.begin().await.expect("begin"));
        let request = GrantRequest::one_slot(*task, agent);
        let outcomes = grant::grant(&mut w, &[request], u64::MAX, T0)
            .await
            .expect("grant");
        w.into_parts().0.commit().await.expect("commit");
        match outcomes.as_slice() {
            [GrantOutcome::Granted(lease)] => leases.push(lease.clone()),
            other => panic!("grant refused: {other:?}"),
        }
    }
    for lease in &leases {
        let kinds = [
            ReportKind::Accepted,
            ReportKind::Started,
            ReportKind::Final(CompletionOutcome::Succeeded { result: json!({}) }),
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
        let mut w = Write::new(pool.begin().await.expect("begin"));
        let applied = settle::apply_reports(&mut w, &reports, &StoreOptions::default(), T0 + 1)
            .await
            .expect("reports");
        assert!(applied.iter().all(Result::is_ok), "{applied:?}");
        w.into_parts().0.commit().await.expect("commit");
    }

    // `(kept, made for one run)`: the plans of each statement on the
    // connection.
    let plans = async |sql: &str| -> (i64, i64) {
        sqlx::query_as(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
             WHERE statement = $1",
        )
        .bind(sql)
        .fetch_one(&pool)
        .await
        .expect("the statement was prepared")
    };
    assert_eq!(
        plans(grant::GRANT_LEASES).await,
        (RUNS, 0),
        "the grant's writing statement"
    );
    assert_eq!(
        plans(settle::LEASES_WITH_OUTCOME).await,
        (RUNS, 0),
        "reading the leases"
    );
    assert_eq!(
        plans(settle::WHOLE_ATTEMPTS).await,
        (RUNS, 0),
        "the whole attempts"
    );
    pool.close().await;
    db.drop_now().await;
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
