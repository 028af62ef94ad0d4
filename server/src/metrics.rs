//! Prometheus metrics: one process-wide recorder (the `metrics` facade with
//! the Prometheus exporter's recorder) and a minimal HTTP endpoint on its
//! own port that serves the text exposition format to scrapers.
//!
//! Names: `switchyard_tasks{namespace,state}` (gauge of live tasks: queued,
//! leased, running; refreshed from the store every 5 s),
//! `switchyard_grants_total`, `switchyard_lease_expiries_total`,
//! `switchyard_requeues_total`, `switchyard_deadline_revocations_total{cause}`
//! (leases ended at an execution timeout, a cancel's grace or a drain's
//! deadline), `switchyard_start_deadlines_total` (queued tasks failed at
//! their start deadline), `switchyard_match_seconds` (histogram, per
//! task matched), `switchyard_connected_agents` (gauge),
//! `switchyard_stream_queue_depth` (histogram of an agent stream's queued
//! messages, sampled at each push), `switchyard_store_seconds{op}`
//! (histogram), `switchyard_batch_items` (histogram of items per
//! group-committed batch), `switchyard_notifications_dropped_total` (PostgreSQL
//! change notifications dropped while the database was unreachable).

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::{info, warn};

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
/// Messages waiting in an agent stream's queue when one is pushed.
pub const STREAM_QUEUE_DEPTH: &str = "switchyard_stream_queue_depth";
/// Store call latency by operation.
pub const STORE_SECONDS: &str = "switchyard_store_seconds";
/// Items per group-committed batch (lease reports, heartbeats, submits).
pub const BATCH_ITEMS: &str = "switchyard_batch_items";
/// Change notifications the notifier dropped (its queue was full).
pub const NOTIFICATIONS_DROPPED: &str = "switchyard_notifications_dropped_total";
/// Tasks by namespace and state.
pub const TASKS: &str = "switchyard_tasks";

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process-wide recorder (installed on first use; `None` if another
/// recorder was installed first).
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0,
            ];
            PrometheusBuilder::new()
                .set_buckets(&buckets)
                .ok()?
                .install_recorder()
                .map_err(|err| warn!(cause = %err, "metrics recorder not installed"))
                .ok()
        })
        .as_ref()
}

/// Times a store call into `switchyard_store_seconds{op}`.
pub async fn timed<T>(op: &'static str, call: impl std::future::Future<Output = T>) -> T {
    let start = std::time::Instant::now();
    let out = call.await;
    metrics::histogram!(STORE_SECONDS, "op" => op).record(start.elapsed().as_secs_f64());
    out
}

/// Serves `/metrics` (any path answers) on `listener` until dropped.
pub async fn serve(listener: TcpListener) {
    let Some(handle) = handle() else { return };
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "metrics on http://{addr}/metrics");
    }
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            // Read the request head (bounded); the path does not matter.
            let mut buf = vec![0u8; 4096];
            let mut read = 0;
            while read < buf.len() {
                match tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf[read..]))
                    .await
                {
                    Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => {
                        read += n;
                        if buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                }
            }
            let body = handle.render();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

/// Binds the metrics address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
