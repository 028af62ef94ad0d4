//! `switchyard-bench`: a load generator for Switchyard.
//!
//! It connects N simulated agents over real gRPC `Connect` streams (many
//! agents per shared HTTP/2 channel, one stream each), submits M tasks of
//! varied selectivity at a target rate or flat out, lets the agents do no-op
//! work, and reports grants/s, completions/s, submit-to-grant-received
//! latency, heartbeat bytes per agent per minute, and the server's CPU and
//! peak RSS — as a table, or as JSON with `--json`.
//!
//! # Layout
//! - [`fleet`]: the agents' capability documents and the placement mix.
//! - [`agent`]: one simulated agent's session, and the shared counters.
//! - [`server`]: starting a server binary, and reading `/proc` for its cost.
//! - [`report`]: percentiles and the printed result.

mod agent;
mod fleet;
mod report;
mod server;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use serde_json::json;
use switchyard_proto::convert::json_to_struct;
use switchyard_proto::v1::{self as pb, task_service_client::TaskServiceClient};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use crate::agent::Counters;
use crate::report::{Percentiles, Report, ServerCost};

/// Load generator for Switchyard: simulated agents, tasks of varied
/// selectivity, throughput, latency and server cost.
#[derive(Debug, Parser)]
#[command(name = "switchyard-bench", version, about)]
struct Cli {
    /// An existing server to target, e.g. `http://127.0.0.1:50051`.
    #[arg(long, env = "SWITCHYARD_BENCH_SERVER", conflicts_with = "server_bin")]
    server: Option<String>,
    /// The pid of that server, to report its CPU and peak RSS.
    #[arg(long, env = "SWITCHYARD_BENCH_SERVER_PID", requires = "server")]
    server_pid: Option<u32>,
    /// Start this server binary instead (on 127.0.0.1:0, caps lifted).
    #[arg(long, env = "SWITCHYARD_BENCH_SERVER_BIN", requires = "database_url")]
    server_bin: Option<PathBuf>,
    /// The database of the started server: `postgres://…/DB` or `sqlite://PATH`.
    #[arg(long, env = "SWITCHYARD_BENCH_DATABASE_URL")]
    database_url: Option<String>,
    /// Extra flags for the started server (repeat), e.g. `--server-arg=--ack-window-ms=10000`.
    #[arg(
        long = "server-arg",
        env = "SWITCHYARD_BENCH_SERVER_ARGS",
        value_delimiter = ' ',
        allow_hyphen_values = true
    )]
    server_args: Vec<String>,
    /// Where the started server's logs go (discarded if unset).
    #[arg(long, env = "SWITCHYARD_BENCH_SERVER_LOG")]
    server_log: Option<PathBuf>,
    /// Heartbeat interval the started server tells agents to use, in ms.
    #[arg(
        long,
        env = "SWITCHYARD_BENCH_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5_000
    )]
    heartbeat_interval_ms: u64,
    /// Simulated agents.
    #[arg(long, env = "SWITCHYARD_BENCH_AGENTS", default_value_t = 50)]
    agents: usize,
    /// Concurrent leases per agent.
    #[arg(long, env = "SWITCHYARD_BENCH_CAPACITY", default_value_t = 8)]
    capacity: u32,
    /// Shared HTTP/2 channels the agents' streams are spread over; 0 picks
    /// one per 100 agents.
    #[arg(long, env = "SWITCHYARD_BENCH_CHANNELS", default_value_t = 0)]
    channels: usize,
    /// Tasks to submit.
    #[arg(long, env = "SWITCHYARD_BENCH_TASKS", default_value_t = 20_000)]
    tasks: u64,
    /// Target submit rate in tasks/s; 0 submits flat out.
    #[arg(long, env = "SWITCHYARD_BENCH_RATE", default_value_t = 0.0)]
    rate: f64,
    /// Submits in flight at once.
    #[arg(long, env = "SWITCHYARD_BENCH_SUBMITTERS", default_value_t = 32)]
    submitters: usize,
    /// Placement mix: `mixed` (varied selectivity) or `any` (no placement).
    #[arg(long, env = "SWITCHYARD_BENCH_PLACEMENTS", default_value = "mixed")]
    placements: String,
    /// Registrations and connects in flight at once.
    #[arg(
        long,
        env = "SWITCHYARD_BENCH_CONNECT_CONCURRENCY",
        default_value_t = 64
    )]
    connect_concurrency: usize,
    /// After the tasks, stay connected this many seconds (heartbeats only)
    /// and report the server's idle CPU.
    #[arg(long, env = "SWITCHYARD_BENCH_HOLD_SECS", default_value_t = 0)]
    hold_secs: u64,
    /// Give up on the run after this many seconds.
    #[arg(long, env = "SWITCHYARD_BENCH_TIMEOUT_SECS", default_value_t = 600)]
    timeout_secs: u64,
    /// Print the report as JSON.
    #[arg(long, env = "SWITCHYARD_BENCH_JSON")]
    json: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut mix = fleet::Mix::named(&cli.placements)?;
    mix.selectivity(cli.agents, cli.capacity)?;

    let spawned = match (&cli.server, &cli.server_bin) {
        (Some(_), _) => None,
        (None, Some(bin)) => {
            let url = cli.database_url.as_deref().context("--database-url")?;
            Some(
                server::Spawned::start(
                    bin,
                    url,
                    cli.heartbeat_interval_ms,
                    &cli.server_args,
                    cli.server_log.as_ref(),
                )
                .await?,
            )
        }
        (None, None) => anyhow::bail!("give --server URL or --server-bin PATH --database-url URL"),
    };
    let url = match (&cli.server, &spawned) {
        (Some(url), _) => url.clone(),
        (None, Some(s)) => format!("http://{}", s.addr),
        (None, None) => unreachable!("checked above"),
    };
    let pid = spawned.as_ref().map(|s| s.pid).or(cli.server_pid);
    let result = drive(&cli, &mix, &url, pid).await;
    if let Some(s) = spawned {
        s.stop().await?;
    }
    let report = result?;
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// Opens a channel to `url`.
async fn channel(url: &str) -> anyhow::Result<Channel> {
    Endpoint::from_shared(url.to_owned())
        .context("server URL")?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {url}"))
}

async fn drive(cli: &Cli, mix: &fleet::Mix, url: &str, pid: Option<u32>) -> anyhow::Result<Report> {
    let counters = Arc::new(Counters::new());
    let run_id = format!("{:x}", std::process::id() ^ (counters.now_us() as u32));
    let n_channels = if cli.channels == 0 {
        cli.agents.div_ceil(100).max(1)
    } else {
        cli.channels
    };
    let mut channels = Vec::with_capacity(n_channels);
    for _ in 0..n_channels {
        channels.push(channel(url).await?);
    }

    // Connect the fleet, a bounded number at a time.
    let before_connect = pid.and_then(server::sample);
    let connect_start = Instant::now();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut sessions = tokio::task::JoinSet::new();
    let limit = Arc::new(tokio::sync::Semaphore::new(cli.connect_concurrency.max(1)));
    let mut connecting = tokio::task::JoinSet::new();
    for i in 0..cli.agents {
        let ch = channels[i % n_channels].clone();
        let permit = limit.clone().acquire_owned().await?;
        let (run_id, capacity) = (run_id.clone(), cli.capacity);
        let (counters, stop) = (counters.clone(), stop_rx.clone());
        let (welcomed_tx, welcomed_rx) = tokio::sync::oneshot::channel();
        sessions.spawn(async move {
            let registered = agent::register(ch.clone(), &run_id, i, capacity).await?;
            agent::run(ch, registered, counters, stop, welcomed_tx).await
        });
        connecting.spawn(async move {
            let ok = welcomed_rx.await.is_ok();
            drop(permit);
            ok
        });
    }
    while let Some(ok) = connecting.join_next().await {
        if !ok.unwrap_or(false) {
            // The session ended before its Welcome; surface its error.
            while let Some(r) = sessions.join_next().await {
                r??;
            }
            anyhow::bail!("an agent's session ended before its Welcome");
        }
    }
    let connect_seconds = connect_start.elapsed().as_secs_f64();
    let after_connect = pid.and_then(server::sample);
    let hb_bytes_at_connect = counters.heartbeat_bytes.load(Ordering::Relaxed);
    let hb_count_at_connect = counters.heartbeats.load(Ordering::Relaxed);
    let connected_at = Instant::now();

    // Submit.
    let submit_channels = [channel(url).await?, channel(url).await?];
    let first_submit_us = counters.now_us();
    let next = Arc::new(AtomicU64::new(0));
    let submit_errors = Arc::new(AtomicU64::new(0));
    let mut submitters = tokio::task::JoinSet::new();
    let start = tokio::time::Instant::now();
    for s in 0..cli.submitters.max(1) {
        let mut client = TaskServiceClient::new(submit_channels[s % 2].clone());
        let (next, errors, counters) = (next.clone(), submit_errors.clone(), counters.clone());
        let (tasks, rate) = (cli.tasks, cli.rate);
        let selectors: Vec<&'static str> = (0..tasks.min(4096)).map(|n| mix.selector(n)).collect();
        submitters.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= tasks {
                    break;
                }
                if rate > 0.0 {
                    tokio::time::sleep_until(start + Duration::from_secs_f64(n as f64 / rate))
                        .await;
                }
                let selector = selectors[(n % selectors.len() as u64) as usize];
                let request = pb::SubmitTaskRequest {
                    kind: "noop".into(),
                    payload: Some(json_to_struct(&json!({
                        "submitted_us": counters.now_us(),
                        "n": n,
                    }))),
                    placement: Some(pb::Placement {
                        selector: selector.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                if let Err(status) = client.submit_task(request).await
                    && errors.fetch_add(1, Ordering::Relaxed) < 5
                {
                    eprintln!("submit {n} failed: {status}");
                }
            }
        });
    }
    while submitters.join_next().await.is_some() {}
    let submit_seconds = (counters.now_us() - first_submit_us) as f64 / 1e6;
    let submitted = cli.tasks - submit_errors.load(Ordering::Relaxed);

    // Wait for every submitted task to complete.
    let deadline = Instant::now() + Duration::from_secs(cli.timeout_secs);
    while counters.completions.load(Ordering::Relaxed) < submitted {
        if Instant::now() > deadline {
            eprintln!(
                "timed out: {} of {submitted} tasks completed",
                counters.completions.load(Ordering::Relaxed)
            );
            break;
        }
        if sessions.len() < cli.agents && sessions.try_join_next().is_some() {
            eprintln!("an agent session ended during the run");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after_run = pid.and_then(server::sample);
    let last_grant_us = counters.last_grant_us.load(Ordering::Relaxed);
    let last_completion_us = counters.last_completion_us.load(Ordering::Relaxed);
    let run_seconds = (last_completion_us.saturating_sub(first_submit_us)) as f64 / 1e6;

    // Hold: heartbeats only.
    let mut idle_cpu_percent = None;
    if cli.hold_secs > 0 {
        let t0 = Instant::now();
        let s0 = pid.and_then(server::sample);
        tokio::time::sleep(Duration::from_secs(cli.hold_secs)).await;
        if let (Some(a), Some(b)) = (s0, pid.and_then(server::sample)) {
            idle_cpu_percent =
                Some(100.0 * (b.cpu_seconds - a.cpu_seconds) / t0.elapsed().as_secs_f64());
        }
    }
    let connected_minutes = connected_at.elapsed().as_secs_f64() / 60.0;
    let hb_bytes = counters.heartbeat_bytes.load(Ordering::Relaxed) - hb_bytes_at_connect;
    let hb_count = counters.heartbeats.load(Ordering::Relaxed) - hb_count_at_connect;
    let end = pid.and_then(server::sample);
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while sessions.join_next().await.is_some() {}
    })
    .await;

    let per_sec = |n: u64, until_us: u64| {
        let secs = until_us.saturating_sub(first_submit_us) as f64 / 1e6;
        if secs > 0.0 { n as f64 / secs } else { 0.0 }
    };
    let grants = counters.grants.load(Ordering::Relaxed);
    let completions = counters.completions.load(Ordering::Relaxed);
    let mut latencies = std::mem::take(
        &mut *counters
            .latencies_us
            .lock()
            .map_err(|_| anyhow::anyhow!("latency lock poisoned"))?,
    );
    let server = match (pid, before_connect, after_connect, after_run, end) {
        (Some(pid), Some(b), Some(c), Some(r), Some(e)) => Some(ServerCost {
            pid,
            cpu_seconds: r.cpu_seconds - c.cpu_seconds,
            cpu_percent: if run_seconds > 0.0 {
                100.0 * (r.cpu_seconds - c.cpu_seconds) / run_seconds
            } else {
                0.0
            },
            connect_cpu_seconds: c.cpu_seconds - b.cpu_seconds,
            idle_cpu_percent,
            peak_rss_mib: e.peak_rss_kib as f64 / 1024.0,
            rss_mib: e.rss_kib as f64 / 1024.0,
            threads: e.threads,
        }),
        _ => None,
    };
    Ok(Report {
        agents: cli.agents,
        capacity: cli.capacity,
        channels: n_channels,
        tasks: cli.tasks,
        placements: cli.placements.clone(),
        target_rate: (cli.rate > 0.0).then_some(cli.rate),
        selectivity: mix
            .classes
            .iter()
            .map(|c| (c.selector.to_owned(), c.eligible))
            .collect(),
        connect_seconds,
        run_seconds,
        submitted,
        submit_errors: submit_errors.load(Ordering::Relaxed),
        submits_per_sec: if submit_seconds > 0.0 {
            submitted as f64 / submit_seconds
        } else {
            0.0
        },
        grants,
        completions,
        grants_per_sec: per_sec(grants, last_grant_us),
        completions_per_sec: per_sec(completions, last_completion_us),
        latency_ms: Percentiles::of(&mut latencies),
        revocations: counters.revocations.load(Ordering::Relaxed),
        refused: counters.refused.load(Ordering::Relaxed),
        resyncs: counters.resyncs.load(Ordering::Relaxed),
        sessions_lost: counters.lost.load(Ordering::Relaxed),
        heartbeats: hb_count,
        heartbeat_bytes_mean: if hb_count > 0 {
            hb_bytes as f64 / hb_count as f64
        } else {
            0.0
        },
        heartbeat_bytes_per_agent_minute: if connected_minutes > 0.0 && cli.agents > 0 {
            hb_bytes as f64 / cli.agents as f64 / connected_minutes
        } else {
            0.0
        },
        heartbeat_interval_ms: cli.heartbeat_interval_ms,
        server,
    })
}
