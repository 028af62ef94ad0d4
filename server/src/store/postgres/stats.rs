//! Planner statistics that keep up with fast-growing tables. A connection
//! keeps the plan it chose for each prepared statement until the tables'
//! statistics change, and autovacuum looks at a database about once a
//! minute (`autovacuum_naptime`), or never where it is off. Tasks, leases
//! and their history grow by thousands of rows a second, so a plan made
//! while `leases` held about a thousand rows (a hash join over the whole
//! table) was still in use at a hundred thousand, and each report batch's
//! lock took 29-35 ms instead of about one. Every [`CHECK_EVERY`] the
//! keeper asks the catalog which of Switchyard's tables are at least twice
//! the size the planner last counted (and [`MIN_PAGES`] at least), and
//! analyzes those, skipping one another session holds: the counts are
//! then true within a factor of two, every connection plans again, and a
//! table is analyzed only as often as it doubles. `leases`, which every
//! report batch reads by key, is also counted once at
//! [`LEASES_FIRST_PAGES`] if the planner never counted it.

use std::time::Duration;

use sqlx::postgres::PgPool;

/// How often the keeper looks at the tables' sizes.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Tables smaller than this (pages of 8 KiB: 8 MiB) are left to
/// autovacuum, but for `leases`' first count ([`LEASES_FIRST_PAGES`]).
/// Analyzing invalidates every connection's plans, and each connection
/// plans each of its statements again: analyzing every table from 64
/// pages on raised the latency run's p99 from 9.5 to 12.8 ms (medians of
/// six), while the plans it saves cost little on most tables this small.
const MIN_PAGES: i64 = 1_024;

/// `leases` is counted once when it reaches this size (64 pages: 512 KiB)
/// if the planner never counted it, then as the other tables. Every report
/// batch reads it by lease id and writes it, in statements each connection
/// keeps one plan for: plans chosen while it held a few hundred uncounted
/// rows (a sequential scan of it; a hash join over all of it) stayed in use
/// while it grew towards [`MIN_PAGES`], which a small fleet's leases may
/// never reach, and its report batches slowed as it grew. The plans chosen
/// once it is counted look leases up by key, and stay right as it grows.
const LEASES_FIRST_PAGES: i64 = 64;

/// Switchyard's tables (those in the schema of `tasks`) at least twice
/// the size (pages) the planner last counted, and [`MIN_PAGES`] at least,
/// and `leases` never counted and [`LEASES_FIRST_PAGES`] at least; quoted
/// for `ANALYZE`.
const GROWN: &str = "SELECT quote_ident(c.relname) FROM pg_class c \
    WHERE c.relkind = 'r' \
    AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass('tasks')) \
    AND pg_relation_size(c.oid) / current_setting('block_size')::int8 \
        >= CASE WHEN c.relname = 'leases' AND c.relpages = 0 THEN $2 \
            ELSE GREATEST(2 * c.relpages::int8, $1) END \
    ORDER BY c.relname";

/// Analyzes the tables that grew (see the module doc); answers their
/// names. None grown: no statement but the catalog's read.
pub(super) async fn analyze_grown(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    let grown: Vec<String> = sqlx::query_scalar(GROWN)
        .bind(MIN_PAGES)
        .bind(LEASES_FIRST_PAGES)
        .fetch_all(pool)
        .await?;
    if !grown.is_empty() {
        // The names come from the catalog, quoted by it.
        let statement = format!("ANALYZE (SKIP_LOCKED) {}", grown.join(", "));
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(pool)
            .await?;
    }
    Ok(grown)
}

/// Runs [`analyze_grown`] every [`CHECK_EVERY`] until aborted; a failure
/// (the database unreachable, say) is logged and the next look goes on.
pub(super) async fn keep(pool: PgPool) {
    let mut every = tokio::time::interval(CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match analyze_grown(&pool).await {
            Ok(grown) if !grown.is_empty() => {
                tracing::debug!(tables = %grown.join(", "), "analyzed tables that doubled");
            }
            Ok(_) => {}
            Err(err) => tracing::debug!(cause = %err, "could not look at the tables' sizes"),
        }
    }
}
