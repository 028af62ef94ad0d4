//! Prometheus metrics: one process-wide recorder (the `metrics` facade with
//! the Prometheus exporter's recorder, every series described so the
//! exposition carries `# HELP`), served on a port of its own by an axum
//! router: `GET /metrics` answers the text exposition format, any other
//! path 404 and any other method 405.
//!
//! Names: `switchyard_tasks{namespace,state}` (gauge of live tasks: queued,
//! leased, running; counted in the store every 5 s, or fifty times what a
//! count took if longer),
//! `switchyard_grants_total`, `switchyard_lease_expiries_total`,
//! `switchyard_requeues_total`, `switchyard_deadline_revocations_total{cause}`
//! (leases ended at an execution timeout, a cancel's grace or a drain's
//! deadline), `switchyard_tasks_finished_total{state}` (tasks this replica
//! moved to succeeded, failed or canceled), `switchyard_start_deadlines_total` (queued tasks failed at
//! their start deadline), `switchyard_match_seconds` (histogram, per
//! task matched), `switchyard_connected_agents` (gauge),
//! `switchyard_stream_queue_depth` (histogram of an agent stream's queued
//! messages, sampled at each push), `switchyard_store_seconds{op}`
//! (histogram), `switchyard_batch_items` (histogram of items per
//! group-committed batch), `switchyard_notifications_dropped_total` (PostgreSQL
//! change notifications dropped while the database was unreachable). The
//! histograms' samples are folded into their buckets every 5 s
//! ([`upkeep`]), scraped or not.

use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::Router;
use axum::http::header;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::model::{StoreEvent, StoredName};

/// Grants written.
pub const GRANTS: &str = "switchyard_grants_total";
/// Leases that ran out their TTL.
pub const EXPIRIES: &str = "switchyard_lease_expiries_total";
/// Tasks returned to the queue (expiry, unacknowledged grant, retry).
pub const REQUEUES: &str = "switchyard_requeues_total";
/// Leases ended at a deadline, by cause (`timeout`, `canceled` for a
/// cancel's grace, `drain_deadline`).
pub const DEADLINE_REVOCATIONS: &str = "switchyard_deadline_revocations_total";
/// Queued tasks failed at their start deadline.
pub const START_DEADLINES: &str = "switchyard_start_deadlines_total";
/// Time to match one task against the index.
pub const MATCH_SECONDS: &str = "switchyard_match_seconds";
/// Agents with a live session on this replica.
pub const CONNECTED_AGENTS: &str = "switchyard_connected_agents";
/// Distinct placements no agent on this replica can run, whose tasks the
/// dispatcher's queue walk leaves out.
pub const PARKED_PLACEMENTS: &str = "switchyard_parked_placements";
/// Distinct placements an agent on this replica can run but none has room
/// for, whose tasks the queue walk leaves out until one has.
pub const BUSY_PLACEMENTS: &str = "switchyard_busy_placements";
/// Messages waiting in an agent stream's queue when one is pushed.
pub const STREAM_QUEUE_DEPTH: &str = "switchyard_stream_queue_depth";
/// Store call latency by operation.
pub const STORE_SECONDS: &str = "switchyard_store_seconds";
/// Items per group-committed batch (lease reports, heartbeats, submits).
pub const BATCH_ITEMS: &str = "switchyard_batch_items";
/// Change notifications the notifier dropped (its queue was full).
pub const NOTIFICATIONS_DROPPED: &str = "switchyard_notifications_dropped_total";
/// How many grants from this replica may wait for their acknowledgement
/// at once (the congestion window).
pub const GRANT_WINDOW: &str = "switchyard_grant_window";
/// Grants from this replica waiting for their acknowledgement.
pub const GRANTS_IN_FLIGHT: &str = "switchyard_grants_in_flight";
/// Submits pushed back (RESOURCE_EXHAUSTED) because too many waited for
/// the store.
pub const SUBMITS_PUSHED_BACK: &str = "switchyard_submits_pushed_back_total";
/// Tasks by namespace and state.
pub const TASKS: &str = "switchyard_tasks";
/// Tasks this replica finished, by state (succeeded, failed, canceled).
pub const TASKS_FINISHED: &str = "switchyard_tasks_finished_total";

/// Every series with its help text (the exposition's `# HELP` lines).
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(GRANTS, "Leases granted by this replica.");
    describe_counter!(EXPIRIES, "Leases that ran out their TTL without renewal.");
    describe_counter!(
        REQUEUES,
        "Tasks returned to the queue (expiry, unacknowledged grant, retry)."
    );
    describe_counter!(
        DEADLINE_REVOCATIONS,
        "Leases ended at a deadline, by cause (timeout, canceled, drain_deadline)."
    );
    describe_counter!(
        START_DEADLINES,
        "Queued tasks failed at their start deadline."
    );
    describe_histogram!(
        MATCH_SECONDS,
        Unit::Seconds,
        "Time to match one task against the agent index."
    );
    describe_gauge!(
        CONNECTED_AGENTS,
        "Agents with a live session on this replica."
    );
    describe_gauge!(
        PARKED_PLACEMENTS,
        "Distinct placements no agent on this replica can run (their tasks are parked)."
    );
    describe_gauge!(
        BUSY_PLACEMENTS,
        "Distinct placements an agent on this replica can run but none has room for (the queue walk leaves their tasks out until one has)."
    );
    describe_histogram!(
        STREAM_QUEUE_DEPTH,
        "Messages waiting in an agent stream's queue when one is pushed."
    );
    describe_histogram!(
        STORE_SECONDS,
        Unit::Seconds,
        "Store call latency by operation."
    );
    describe_histogram!(
        BATCH_ITEMS,
        "Items per group-committed batch (lease reports, heartbeats, submits)."
    );
    describe_counter!(
        NOTIFICATIONS_DROPPED,
        "PostgreSQL change notifications dropped while the database was unreachable."
    );
    describe_counter!(
        SUBMITS_PUSHED_BACK,
        "Submits pushed back (RESOURCE_EXHAUSTED with a retry hint) because too many waited for the store."
    );
    describe_gauge!(
        GRANT_WINDOW,
        "How many grants from this replica may wait for their acknowledgement at once (halved when grants go unacknowledged, grown by acknowledgements)."
    );
    describe_gauge!(
        GRANTS_IN_FLIGHT,
        "Grants from this replica waiting for their acknowledgement (as of the last sweep)."
    );
    describe_gauge!(
        TASKS,
        "Live tasks by namespace and state (queued, leased, running), from the store."
    );
    describe_counter!(
        TASKS_FINISHED,
        "Tasks this replica moved to a final state, by state (succeeded, failed, canceled)."
    );
}

/// Counts the tasks a committed write finished into
/// `switchyard_tasks_finished_total{state}`.
pub fn count_finished(events: &[StoreEvent]) {
    for event in events {
        if let StoreEvent::TaskChanged { state, .. } = event
            && state.is_terminal()
        {
            metrics::counter!(TASKS_FINISHED, "state" => state.stored()).increment(1);
        }
    }
}

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process-wide recorder (installed on first use; `None` if another
/// recorder was installed first).
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            // Seconds for the timings; counts for the histograms of items
            // and queue depths, which the seconds' buckets put all in +Inf.
            let seconds = [
                0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0,
            ];
            let counts = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];
            let handle = PrometheusBuilder::new()
                .set_buckets(&seconds)
                .ok()?
                .set_buckets_for_metric(Matcher::Full(BATCH_ITEMS.to_owned()), &counts)
                .ok()?
                .set_buckets_for_metric(Matcher::Full(STREAM_QUEUE_DEPTH.to_owned()), &counts)
                .ok()?
                .install_recorder()
                .map_err(|err| warn!(cause = %err, "metrics recorder not installed"))
                .ok()?;
            describe();
            Some(handle)
        })
        .as_ref()
}

/// How often the histograms' samples are folded into their buckets. The
/// recorder keeps every sample until then (or until a scrape), so without
/// it a server nobody scraped grew by every timing it recorded (about 200
/// bytes per task granted and completed).
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds the histograms' samples into their buckets every
/// [`UPKEEP_EVERY`], until dropped (installing the recorder first).
pub async fn upkeep() {
    let Some(handle) = handle() else { return };
    let mut ticker = tokio::time::interval(UPKEEP_EVERY);
    loop {
        ticker.tick().await;
        handle.run_upkeep();
    }
}

/// Times a store call into `switchyard_store_seconds{op}`.
pub async fn timed<T>(op: &'static str, call: impl std::future::Future<Output = T>) -> T {
    let start = std::time::Instant::now();
    let out = call.await;
    metrics::histogram!(STORE_SECONDS, "op" => op).record(start.elapsed().as_secs_f64());
    out
}

/// Serves `GET /metrics` on `listener` until dropped; other paths are 404.
pub async fn serve(listener: TcpListener) {
    let Some(handle) = handle() else { return };
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "metrics on http://{addr}/metrics");
    }
    let router = Router::new().route(
        "/metrics",
        get(move || {
            let body = handle.render();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    body,
                )
            }
        }),
    );
    if let Err(err) = axum::serve(listener, router).await {
        warn!(cause = %err, "the metrics listener stopped");
    }
}

/// Binds the metrics address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
