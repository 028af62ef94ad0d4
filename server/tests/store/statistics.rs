//! PostgreSQL only: the store keeps the planner's statistics up with tables
//! that double, rather than leave each connection planning with the sizes
//! autovacuum last counted (it looks about once a minute, and a plan made
//! while `leases` was small once scanned the whole table for every report
//! batch); a report batch reads only the leases it ends; and the submit
//! function's statements keep their plans. SQLite plans without sizes.

use std::time::Duration;

use serde_json::json;
use sqlx::Connection;
use switchyard_server::model::{
    CompletionOutcome, GrantOutcome, LeaseRecord, LeaseReport, ReportKind, Submission,
};
use uuid::Uuid;

use crate::common::{Fixture, T0, agents, task};

/// The `round`th batch of `size` submits, each reserved for the next
/// agent of `fleet` in turn.
fn reserved(fleet: &[Uuid], round: usize, size: usize) -> Vec<Submission> {
    (0..size)
        .map(|i| Submission {
            task: task("ns", 0, 3),
            agent_id: Some(fleet[(round * size + i) % fleet.len()]),
        })
        .collect()
}

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

/// `leases` is counted once it reaches 64 pages if the planner never
/// counted it, far below the 1,024 at which the keeper takes the other
/// tables: a small fleet's leases may never reach those, and the plans its
/// report batches kept from when the table held a few hundred uncounted
/// rows read all of it.
#[tokio::test]
async fn leases_are_counted_once_early() {
    let fx = Fixture::postgres().await;
    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    sqlx::query("ALTER TABLE leases SET (autovacuum_enabled = false)")
        .execute(&mut conn)
        .await
        .unwrap();
    let (_, before) = counted(&mut conn, "leases").await;
    let fleet = agents(fx.store.as_ref(), "ns", 10, 1_000).await;
    let mut grown = 0;
    for round in 0..20 {
        let batch = reserved(&fleet, round, 500);
        for done in fx.store.submit_many(&batch, T0).await.unwrap() {
            assert!(done.unwrap().2.is_some());
        }
        grown = pages(&mut conn, "leases").await;
        if grown > 80 {
            break;
        }
    }
    assert!((80..1_024).contains(&grown), "leases take {grown} pages");

    // The keeper looks every 2 s; bounded, so a store without it fails.
    let (relpages, times) = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (relpages, times) = counted(&mut conn, "leases").await;
            if relpages > 0 && times > before {
                return (relpages, times);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("leases counted within 20 s");
    assert!((64..=grown).contains(&i64::from(relpages)), "{relpages}");
    assert_eq!(times, before + 1);
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

/// The submit function's parameter types, for a statement of its body
/// prepared on its own.
const SUBMIT_TYPES: &str = "uuid[], text[], text[], text[], text[], int4[], int8[], int8[], \
    text[], int8[], text[], uuid[], uuid[], text[], int8[], int8[], int8[], text[], int8[], \
    int8[], text[], int8";

/// Which of the submit function's statements to prepare: the first it
/// returns (a one-task call's) or the last (a batch's).
enum Returned {
    First,
    Last,
}

/// Prepares, as `name`, a statement of the submit function's body, read
/// from the function's own source in the database.
async fn prepare_submit_statement(conn: &mut sqlx::PgConnection, name: &str, which: Returned) {
    let source: String =
        sqlx::query_scalar("SELECT prosrc FROM pg_proc WHERE proname = 'switchyard_submit_tasks'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    let returned = "RETURN QUERY";
    let at = match which {
        Returned::First => source.find(returned),
        Returned::Last => source.rfind(returned),
    };
    let start = at.expect("the function returns a query") + returned.len();
    let end = start + source[start..].find(';').expect("the statement ends");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "PREPARE {name}({SUBMIT_TYPES}) AS {}",
        &source[start..end]
    )))
    .execute(conn)
    .await
    .unwrap();
}

/// Runs `calls` of the statement prepared as `name`, each of as many tasks
/// as `agents` holds (each reserved for its agent, an SQL uuid literal or
/// `NULL`), in a transaction rolled back; each inserts all its tasks.
async fn run_submit_calls(conn: &mut sqlx::PgConnection, name: &str, calls: &[Vec<String>]) {
    let mut tx = conn.begin().await.unwrap();
    for agents in calls {
        let column = |value: &dyn Fn(usize) -> String, ty: &str| {
            let values: Vec<String> = (0..agents.len()).map(value).collect();
            format!("ARRAY[{}]::{ty}[]", values.join(", "))
        };
        let same = |value: &'static str, ty: &str| column(&|_| value.to_owned(), ty);
        let new_id = |_: usize| format!("'{}'", Uuid::now_v7());
        let execute = format!(
            "EXECUTE {name}({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, \
             {}, {}, {}, {}, {T0})",
            column(&new_id, "uuid"),
            same("'ns'", "text"),
            same("'k'", "text"),
            same("'null'", "text"),
            same("'{}'", "text"),
            same("0", "int4"),
            same("3", "int8"),
            same("60000", "int8"),
            same("NULL", "text"),
            same("0", "int8"),
            same("'{}'", "text"),
            column(&|i| agents[i].clone(), "uuid"),
            column(&new_id, "uuid"),
            same("NULL", "text"),
            same("NULL", "int8"),
            same("NULL", "int8"),
            same("NULL", "int8"),
            same("NULL", "text"),
            same("NULL", "int8"),
            same("0", "int8"),
            same("NULL", "text"),
        );
        let inserted = sqlx::raw_sql(sqlx::AssertSqlSafe(execute))
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        assert_eq!(
            inserted.len(),
            agents.len(),
            "every task of a call inserted"
        );
    }
    tx.rollback().await.unwrap();
}

/// `(kept, made for one call)`: the generic and the custom plans
/// PostgreSQL made for the statement prepared as `name`.
async fn plans(conn: &mut sqlx::PgConnection, name: &str) -> (i64, i64) {
    sqlx::query_as("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1")
        .bind(name)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// A one-task submit runs a statement whose plan PostgreSQL keeps, on a
/// fleet of 1,000 agents whose live leases the planner has counted (as
/// autovacuum counts them in a deployment). The batch's statement, which
/// one-task submits ran too, is kept with ten elements an array assumed:
/// ten agents' and ten live-lease lookups, far above a one-task call's
/// own plans here, so PostgreSQL planned it afresh on every call, which
/// took longer than running it. The statement a one-task call runs (the
/// first the function returns) is prepared from the function's own source,
/// without the function's settings (its own plans are kept even so), and
/// run eight times; PostgreSQL counts the plans it made.
#[tokio::test]
async fn a_one_task_submit_keeps_its_plan_on_a_large_fleet() {
    let fx = Fixture::postgres().await;
    let fleet = agents(fx.store.as_ref(), "ns", 1_000, 2).await;
    for batch in reserved(&fleet, 0, 2 * fleet.len()).chunks(500) {
        for done in fx.store.submit_many(batch, T0).await.unwrap() {
            assert!(done.unwrap().2.is_some());
        }
    }
    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    sqlx::query("ANALYZE leases")
        .execute(&mut conn)
        .await
        .unwrap();

    prepare_submit_statement(&mut conn, "one_task", Returned::First).await;
    let calls: Vec<Vec<String>> = fleet
        .iter()
        .take(8)
        .map(|agent| vec![format!("'{agent}'")])
        .collect();
    run_submit_calls(&mut conn, "one_task", &calls).await;
    let (generic, custom) = plans(&mut conn, "one_task").await;
    // PostgreSQL plans a statement afresh for its first five runs, then
    // keeps one plan if it costs no more than theirs.
    assert_eq!(
        (generic, custom),
        (3, 5),
        "plans of a one-task submit: {generic} kept, {custom} made for one call"
    );
    conn.close().await.unwrap();
    fx.finish().await;
}

/// A batch submit runs a statement PostgreSQL plans once per connection,
/// not for its calls: the submit function carries the setting that keeps
/// one plan for each of its statements (`plan_cache_mode`, migration
/// 0020). Without it PostgreSQL planned the batch's statement afresh for
/// its first five runs on every connection and again whenever the plan it
/// kept cost more than the calls' own, each plan as long as a batch's run.
/// The batch's statement (the last the function returns) is prepared from
/// the function's own source, with the function's settings applied as a
/// call applies them, and run eight times on batches of 2 to 40 tasks,
/// some reserved for agents with live leases; PostgreSQL counts the plans
/// it made.
#[tokio::test]
async fn a_batch_submit_is_planned_once_per_connection() {
    let fx = Fixture::postgres().await;
    let fleet = agents(fx.store.as_ref(), "ns", 50, 4).await;
    for done in fx
        .store
        .submit_many(&reserved(&fleet, 0, fleet.len()), T0)
        .await
        .unwrap()
    {
        assert!(done.unwrap().2.is_some());
    }
    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    sqlx::query("ANALYZE leases, tasks, agents")
        .execute(&mut conn)
        .await
        .unwrap();

    let settings: Option<Vec<String>> = sqlx::query_scalar(
        "SELECT proconfig FROM pg_proc WHERE proname = 'switchyard_submit_tasks'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    for setting in settings.unwrap_or_default() {
        let (name, value) = setting.split_once('=').expect("a setting is name=value");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET {name} = '{value}'")))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    prepare_submit_statement(&mut conn, "batch", Returned::Last).await;
    // Every other call reserves its tasks for agents of the fleet.
    let calls: Vec<Vec<String>> = [2usize, 15, 40, 3, 15, 2, 40, 8]
        .into_iter()
        .enumerate()
        .map(|(call, size)| {
            (0..size)
                .map(|i| match call % 2 {
                    0 => "NULL".to_owned(),
                    _ => format!("'{}'", fleet[(call + i) % fleet.len()]),
                })
                .collect()
        })
        .collect();
    run_submit_calls(&mut conn, "batch", &calls).await;
    let (generic, custom) = plans(&mut conn, "batch").await;
    assert_eq!(
        (generic, custom),
        (8, 0),
        "plans of a batch submit: {generic} kept, {custom} made for one call"
    );
    conn.close().await.unwrap();
    fx.finish().await;
}

/// How many of a table's rows were read, and how.
#[derive(Debug, Clone, Copy)]
struct RowsRead {
    /// By sequential scans.
    scanned: i64,
    /// Through an index.
    by_index: i64,
}

/// `(rows read, rows updated)` of `table`, as the statistics have them:
/// each backend sends its counts when it exits at the latest, so the store
/// is closed first (and opened again).
async fn read_and_updated(
    fx: &mut Fixture,
    conn: &mut sqlx::PgConnection,
    table: &str,
) -> (RowsRead, i64) {
    fx.reopen().await;
    let (scanned, by_index, updated) = sqlx::query_as(
        "SELECT COALESCE(seq_tup_read, 0), COALESCE(idx_tup_fetch, 0), n_tup_upd \
         FROM pg_stat_user_tables WHERE relname = $1",
    )
    .bind(table)
    .fetch_one(conn)
    .await
    .unwrap();
    (RowsRead { scanned, by_index }, updated)
}

/// `table`'s rows read once the store's connections have sent counts of at
/// least `updated` of its rows updated (see [`read_and_updated`]).
async fn rows_read(
    fx: &mut Fixture,
    conn: &mut sqlx::PgConnection,
    table: &str,
    updated: i64,
) -> RowsRead {
    // Bounded, so that counts never sent fail the test rather than hang it.
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (read, n) = read_and_updated(fx, conn, table).await;
            if n >= updated {
                return read;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the counts sent within 20 s")
}

/// The reports of `leases`, each `kinds` in turn.
fn reports(leases: &[LeaseRecord], kinds: &[fn() -> ReportKind]) -> Vec<LeaseReport> {
    leases
        .iter()
        .flat_map(|lease| {
            kinds.iter().map(|kind| LeaseReport {
                lease_id: lease.id,
                task_id: lease.task_id,
                agent_id: lease.agent_id,
                fencing_token: lease.fencing_token,
                kind: kind(),
            })
        })
        .collect()
}

fn succeeded() -> ReportKind {
    ReportKind::Final(CompletionOutcome::Succeeded { result: json!({}) })
}

/// Runs 12,000 leases' reports through the store, 400 of them (200 whole
/// attempts, 200 ends of attempts reported started earlier) in one batch
/// measured on its own; answers the rows of `leases` that batch read by
/// sequential scans.
async fn rows_a_report_batch_reads() -> i64 {
    let mut fx = Fixture::postgres().await;
    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    let fleet = agents(fx.store.as_ref(), "ns", 20, 1_000).await;
    let mut leases = Vec::new();
    for round in 0..24 {
        let batch = reserved(&fleet, round, 500);
        for done in fx.store.submit_many(&batch, T0).await.unwrap() {
            match done.unwrap().2 {
                Some(GrantOutcome::Granted(lease)) => leases.push(lease),
                other => panic!("a reserved submit was not leased: {other:?}"),
            }
        }
    }
    let whole: [fn() -> ReportKind; 3] =
        [|| ReportKind::Accepted, || ReportKind::Started, succeeded];
    let (measured, earlier) = leases.split_at(400);
    let (at_once, in_two) = measured.split_at(200);
    for chunk in earlier.chunks(200) {
        fx.store
            .apply_reports(&reports(chunk, &whole), T0 + 10)
            .await
            .unwrap();
    }
    fx.store
        .apply_reports(&reports(in_two, &whole[..2]), T0 + 10)
        .await
        .unwrap();
    sqlx::query("ANALYZE leases")
        .execute(&mut conn)
        .await
        .unwrap();
    let (before, updated_before) = read_and_updated(&mut fx, &mut conn, "leases").await;

    let mut batch = reports(at_once, &whole);
    batch.extend(reports(in_two, &[succeeded]));
    let applied = fx.store.apply_reports(&batch, T0 + 20).await.unwrap();
    assert_eq!(
        applied.iter().filter(|r| r.as_ref().unwrap().ended).count(),
        400
    );

    let read = rows_read(&mut fx, &mut conn, "leases", updated_before + 400)
        .await
        .scanned
        - before.scanned;
    conn.close().await.unwrap();
    fx.finish().await;
    read
}

/// A report batch ends its leases by their keys, whatever the size of
/// `leases`, which keeps every lease ever held: at PostgreSQL's default
/// price of a page read out of order, the planner preferred one pass over
/// all 12,000 leases to two hundred lookups, for the batch's whole
/// attempts and again for its ends of attempts reported started earlier,
/// and the pass grew with every lease until the table was large enough
/// for the lookups to cost less. The store's connections price such a
/// page as one in memory costs, and the batch's statements run on the
/// plans each connection keeps, which look leases up by key at any price
/// (each is tested on its own with the store's PostgreSQL backend).
#[tokio::test]
async fn a_report_batch_reads_only_the_leases_it_ends() {
    let read = rows_a_report_batch_reads().await;
    assert!(
        read < 1_000,
        "a batch ending 400 of 12,000 leases read {read} by sequential scans"
    );
}

/// A report batch's whole successes (`switchyard_settle_successes`) lock
/// and check their tasks by key however small `tasks` was when the
/// connection made the function's plans, which it keeps: made by the
/// warm-up of a store opened on migrated, empty tables, they passed over
/// the whole of `tasks` twice a call once it held thousands of tasks; with
/// sequential scans off, the check joined the batch to a pass over the
/// whole of `tasks_pkey` instead (a hash join, its inner side a full index
/// scan), once a call.
#[tokio::test]
async fn whole_successes_read_tasks_by_key_on_plans_made_when_it_was_empty() {
    let mut fx = Fixture::postgres().await;
    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    // No analysis may remake the plans meanwhile.
    for table in ["tasks", "leases", "task_events"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    // Opened on the migrated, empty tables: every connection warms then.
    fx.reopen().await;
    let fleet = agents(fx.store.as_ref(), "ns", 20, 1_000).await;
    let mut leases = Vec::new();
    for round in 0..8 {
        for done in fx
            .store
            .submit_many(&reserved(&fleet, round, 500), T0)
            .await
            .unwrap()
        {
            match done.unwrap().2 {
                Some(GrantOutcome::Granted(lease)) => leases.push(lease),
                other => panic!("a reserved submit was not leased: {other:?}"),
            }
        }
    }
    let whole: [fn() -> ReportKind; 3] =
        [|| ReportKind::Accepted, || ReportKind::Started, succeeded];
    let applied = fx
        .store
        .apply_reports(&reports(&leases[..200], &whole), T0 + 10)
        .await
        .unwrap();
    assert_eq!(
        applied.iter().filter(|r| r.as_ref().unwrap().ended).count(),
        200
    );
    let read = rows_read(&mut fx, &mut conn, "tasks", 200).await;
    // Each of the 200 is read by key three times: locked, checked, settled;
    // a pass over the table reads all 4,000.
    assert!(
        read.scanned + read.by_index < 1_000,
        "whole successes of 200 of 4,000 tasks read {read:?}"
    );
    conn.close().await.unwrap();
    fx.finish().await;
}
