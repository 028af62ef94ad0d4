//! `switchyard-bench`: a load generator for Switchyard.
//!
//! It connects N simulated agents over real gRPC `Connect` streams (many
//! agents per shared HTTP/2 channel, one stream each), submits M tasks of
//! varied selectivity at a target rate or flat out, lets the agents do no-op
//! work, and reports grants/s, completions/s, submit-to-grant-received
//! latency, heartbeat bytes per agent per minute, and the server's CPU and
//! peak RSS — as a table, or as JSON with `--json`.
//!
//! With `--preload` the order flips: every task is submitted first (they
//! queue; no agent exists yet), then the fleet connects and drains the
//! queue, as the job-queue peers in `bench/peers` are measured.
//!
//! With `--release-secs S` the fleet connects first, then every task is
//! submitted (flat out) not to run before S seconds after the first submit:
//! at that moment the whole queue becomes runnable at once among a fleet that
//! is already connected, so grants/s measures placing a backlog, with neither
//! the submits nor the fleet's connecting in the way. The run clock starts at
//! the first grant after the release.
//!
//! With `--parked N` the queue first gets N tasks no agent can run, ahead of
//! every other; `--churn R` has agents join and leave while the tasks flow;
//! `--drain-parked D` then connects agents that can run the parked tasks.
//! With `--busy N` the queue's head holds N tasks that one agent can run
//! but that has no room: they wait busy, not parked.
//!
//! # Layout
//! - [`fleet`]: the agents' capability documents and the placement mix.
//! - [`parked`]: parked tasks, churning agents, and the parked tasks' drain.
//! - [`busy`]: busy tasks, and the agent that keeps them busy.
//! - [`agent`]: one simulated agent's session, and the shared counters.
//! - [`server`]: starting a server binary, and reading `/proc` for its cost.
//! - [`report`]: percentiles and the printed result.

mod agent;
mod busy;
mod fleet;
mod parked;
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
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use crate::agent::Counters;
use crate::report::{ClassDrain, Percentiles, Report, ServerCost};

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
    /// Another replica of the server, on the same database: the fleet's
    /// agents are spread over both (the channels alternate between them, at
    /// least one each), while tasks are submitted to the first. What two
    /// replicas that both serve agents cost.
    #[arg(long, env = "SWITCHYARD_BENCH_FLEET_ALSO")]
    fleet_also: Option<String>,
    /// Tasks to submit.
    #[arg(long, env = "SWITCHYARD_BENCH_TASKS", default_value_t = 20_000)]
    tasks: u64,
    /// Target submit rate in tasks/s; 0 submits flat out.
    #[arg(long, env = "SWITCHYARD_BENCH_RATE", default_value_t = 0.0)]
    rate: f64,
    /// Submits in flight at once.
    #[arg(long, env = "SWITCHYARD_BENCH_SUBMITTERS", default_value_t = 32)]
    submitters: usize,
    /// Tasks per submit call: 1 calls `SubmitTask` for each task; more
    /// call `SubmitTasks` with up to this many (at most 1,000; a server
    /// without it refuses every call, UNIMPLEMENTED). Keep `--submitters`
    /// times this under the server's `--max-submits-waiting` (2,048), or
    /// the calls past it are pushed back, and counted as failed.
    #[arg(long, env = "SWITCHYARD_BENCH_SUBMIT_BATCH", default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(1..=1000))]
    submit_batch: u64,
    /// Placement mix: `mixed` (varied selectivity), `any` (no placement) or
    /// `one-in-n` (each task pinned to exactly one agent,
    /// `custom_properties.bench_slot=K`, K cycling through the fleet).
    #[arg(long, env = "SWITCHYARD_BENCH_PLACEMENTS", default_value = "mixed")]
    placements: String,
    /// CPU (millicores) every task asks for in its placement's resource
    /// request (0: none). The simulated agents offer 1,000 a CPU, 4 to 32.
    /// Sent as the structured field, which a server that predates resource
    /// requests ignores: the same run then measures it without them.
    #[arg(long, env = "SWITCHYARD_BENCH_REQUEST_CPU", default_value_t = 0)]
    request_cpu_millicores: u64,
    /// Memory (MB) every task asks for (0: none); agents offer 8,192 to
    /// 65,536.
    #[arg(long, env = "SWITCHYARD_BENCH_REQUEST_MEMORY_MB", default_value_t = 0)]
    request_memory_mb: u64,
    /// Give task `n` the fairness key `tenant-(n mod K)` (0: no keys), so
    /// dispatch shares the queue among K keys. A server that predates fair
    /// share ignores the field: the same run then measures it without.
    #[arg(long, env = "SWITCHYARD_BENCH_FAIRNESS_KEYS", default_value_t = 0)]
    fairness_keys: u64,
    /// Capabilities each agent of the `--agents` fleet provides (0: none),
    /// named as capability packs name theirs, with a dot (`bench.cap-K`):
    /// the shape of a real agent's document, which a bench fleet otherwise
    /// lacks. The agents of `--churn`, `--drain-parked` and `--busy` keep
    /// their documents.
    #[arg(long, env = "SWITCHYARD_BENCH_PROVIDES", default_value_t = 0)]
    provides: usize,
    /// Submit every task (flat out) before any agent connects, then connect
    /// the fleet. The run clock (run seconds, grants/s, completions/s) then
    /// starts at the first agent's Welcome instead of the first submit, and
    /// latency is measured from that Welcome rather than from each submit
    /// (so it says how long the queue took to drain up to each task, not how
    /// fast a fresh task is placed); the report says `preloaded: true`.
    #[arg(long, env = "SWITCHYARD_BENCH_PRELOAD", conflicts_with = "rate")]
    preload: bool,
    /// Connect the fleet, then submit every task (flat out) with a
    /// `not_before` this many seconds after the first submit; the clock
    /// starts at the first grant after that moment, and latency counts from
    /// it. Pick it longer than the submits take (the report says if not).
    #[arg(
        long,
        env = "SWITCHYARD_BENCH_RELEASE_SECS",
        conflicts_with_all = ["rate", "preload"]
    )]
    release_secs: Option<f64>,
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
    /// Give up on connecting the fleet, and on waiting for completions,
    /// after this many seconds each.
    #[arg(long, env = "SWITCHYARD_BENCH_TIMEOUT_SECS", default_value_t = 600)]
    timeout_secs: u64,
    /// Also report the latency of only the tasks submitted this many seconds
    /// or more after the run clock started (`steady_latency_ms`): the steady
    /// state, without a freshly started server's first moments.
    #[arg(long, env = "SWITCHYARD_BENCH_WARMUP_SECS", default_value_t = 0.0)]
    warmup_secs: f64,
    /// Write every latency to this file as CSV (`from_ms,latency_ms`, in
    /// the order the grants arrived), to see when the slow ones happened.
    /// `from_ms` is when the latency counts from (the submit, or the first
    /// Welcome if later), in ms since the bench began registering the fleet,
    /// so the first submit comes after the fleet's connect time.
    #[arg(long, env = "SWITCHYARD_BENCH_LATENCY_LOG")]
    latency_log: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long, env = "SWITCHYARD_BENCH_JSON")]
    json: bool,
    /// Before anything else, submit this many tasks (priority 10, ahead of
    /// the others) that no agent of the fleet can run: they stay parked.
    #[arg(long, env = "SWITCHYARD_BENCH_PARKED", default_value_t = 0)]
    parked: u64,
    /// Before the fleet connects, submit this many tasks (priority 10,
    /// ahead of the others) that only one more agent can run, with room
    /// for one: it takes one and keeps it, and the rest wait busy.
    #[arg(long, env = "SWITCHYARD_BENCH_BUSY", default_value_t = 0)]
    busy: u64,
    /// Distinct placements the parked tasks are spread over.
    #[arg(long, env = "SWITCHYARD_BENCH_PARKED_PLACEMENTS", default_value_t = 16)]
    parked_placements: usize,
    /// Agents joining per second while the tasks flow (each leaves, draining
    /// first, after --churn-life-secs).
    #[arg(long, env = "SWITCHYARD_BENCH_CHURN", default_value_t = 0.0)]
    churn: f64,
    /// How long each churning agent stays connected.
    #[arg(long, env = "SWITCHYARD_BENCH_CHURN_LIFE_SECS", default_value_t = 10.0)]
    churn_life_secs: f64,
    /// Lines of output each task writes (sent in one output report before
    /// its result, as a runner batches a quick task's lines); 0: none.
    #[arg(long, env = "SWITCHYARD_BENCH_OUTPUT_LINES", default_value_t = 0)]
    output_lines: u32,
    /// After the run, connect this many agents that can run every parked
    /// task, and measure how fast they drain them.
    #[arg(long, env = "SWITCHYARD_BENCH_DRAIN_PARKED", default_value_t = 0)]
    drain_parked: usize,
    /// Overload on purpose: the whole simulated fleet answers at most this
    /// many grants a second (one queue, first come first served; a revoked
    /// grant not yet answered is dropped), as a fleet too slow for its
    /// work. The report adds completions by second. 0: every grant is
    /// answered at once.
    #[arg(long, env = "SWITCHYARD_BENCH_FLEET_ACK_RATE", default_value_t = 0.0)]
    fleet_ack_rate: f64,
    /// Threads the load generator runs on (0: one per core). On a host it
    /// shares with the server and its database, fewer threads leave them
    /// more of the cores: `bench/run` takes 1, as the peers' Node.js
    /// workers run on one.
    #[arg(long, env = "SWITCHYARD_BENCH_THREADS", default_value_t = 0)]
    threads: usize,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if cli.threads > 0 {
        runtime.worker_threads(cli.threads);
    }
    runtime
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut mix = fleet::Mix::named(&cli.placements, cli.agents)?;
    mix.selectivity(cli.agents, cli.capacity)?;
    if cli.parked > 0 {
        anyhow::ensure!(
            cli.parked_placements > 0,
            "--parked-placements must be at least 1"
        );
        let churners = (cli.churn * 3_600.0) as usize;
        parked::check(cli.agents, churners, cli.capacity, cli.parked_placements)?;
    }
    if cli.churn > 0.0 {
        anyhow::ensure!(cli.churn.is_finite(), "--churn must be finite");
    }
    anyhow::ensure!(
        cli.warmup_secs.is_finite() && cli.warmup_secs >= 0.0,
        "--warmup-secs must be a number of seconds, 0 or more (got {})",
        cli.warmup_secs
    );
    let mix = Arc::new(mix);

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
    let result = drive(&cli, mix, &url, pid).await;
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

/// The fleet's sessions once every agent has its Welcome.
struct Fleet {
    sessions: JoinSet<anyhow::Result<()>>,
    stop: watch::Sender<bool>,
}

/// Registers and connects `cli.agents` agents over `channels`, at most
/// `--connect-concurrency` at a time; returns once every one is welcomed.
async fn connect_fleet(
    cli: &Cli,
    channels: &[Channel],
    run_id: &str,
    counters: &Arc<Counters>,
) -> anyhow::Result<Fleet> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut sessions = JoinSet::new();
    let limit = Arc::new(tokio::sync::Semaphore::new(cli.connect_concurrency.max(1)));
    let mut connecting = JoinSet::new();
    for i in 0..cli.agents {
        let ch = channels[i % channels.len()].clone();
        let permit = limit.clone().acquire_owned().await?;
        let (run_id, capacity, output_lines) = (run_id.to_owned(), cli.capacity, cli.output_lines);
        let mut document = fleet::document(i, capacity);
        fleet::provide(&mut document, cli.provides);
        let (counters, stop) = (counters.clone(), stop_rx.clone());
        let (welcomed_tx, welcomed_rx) = tokio::sync::oneshot::channel();
        sessions.spawn(async move {
            let registered = agent::register_as(ch.clone(), &run_id, i, document, capacity).await?;
            agent::run(
                ch,
                registered,
                counters,
                stop,
                welcomed_tx,
                agent::Leave::HangUp,
                output_lines,
            )
            .await
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
    Ok(Fleet {
        sessions,
        stop: stop_tx,
    })
}

/// What the submit phase did.
struct Submitted {
    /// Microseconds since the counters' epoch of the first submit.
    first_us: u64,
    seconds: f64,
    ok: u64,
    errors: u64,
}

/// Submits `cli.tasks` tasks from `cli.submitters` concurrent submitters over
/// two channels, at `cli.rate` or flat out.
async fn submit_all(
    cli: &Cli,
    mix: &Arc<fleet::Mix>,
    url: &str,
    counters: &Arc<Counters>,
) -> anyhow::Result<Submitted> {
    let submit_channels = [channel(url).await?, channel(url).await?];
    let first_us = counters.now_us();
    // Released: every task waits for one moment, and its latency counts
    // from that moment.
    let release = cli.release_secs.map(|secs| {
        let wall = std::time::SystemTime::now() + Duration::from_secs_f64(secs);
        let at_us = first_us + (secs * 1e6) as u64;
        counters.release_us.store(at_us, Ordering::Relaxed);
        (prost_types::Timestamp::from(wall), at_us)
    });
    let (mix, made, heard) = (mix.clone(), counters.clone(), counters.clone());
    let fairness_keys = cli.fairness_keys;
    let resources = (cli.request_cpu_millicores > 0 || cli.request_memory_mb > 0).then(|| {
        pb::ResourceRequest {
            cpu_millicores: cli.request_cpu_millicores,
            memory_mb: cli.request_memory_mb,
            ..Default::default()
        }
    });
    let errors = submit_pool(
        &submit_channels,
        cli.tasks,
        cli.submitters,
        cli.submit_batch,
        cli.rate,
        move |n| pb::SubmitTaskRequest {
            kind: "noop".into(),
            payload: Some(json_to_struct(&json!({
                "submitted_us": release.as_ref().map_or_else(|| made.now_us(), |r| r.1),
                "n": n,
                "class": mix.class_of(n),
            }))),
            placement: Some(pb::Placement {
                selector: mix.selector(n).into_owned(),
                resources: resources.clone(),
                ..Default::default()
            }),
            not_before: release.as_ref().map(|r| r.0),
            fairness_key: if fairness_keys > 0 {
                format!("tenant-{}", n % fairness_keys)
            } else {
                String::new()
            },
            ..Default::default()
        },
        move |task| {
            let now = heard.now_us();
            if let Ok(mut acked) = heard.submit_acked_us.lock() {
                acked.insert(task.task_id, now);
            }
        },
    )
    .await;
    Ok(Submitted {
        first_us,
        seconds: (counters.now_us() - first_us) as f64 / 1e6,
        ok: cli.tasks - errors,
        errors,
    })
}

/// Submits `tasks` requests, `make(n)` the n-th, from `submitters`
/// concurrent submitters spread over `channels`, `batch` to a call (1: a
/// `SubmitTask` each; more: `SubmitTasks`), at `rate` a second (0: flat
/// out); `answered` hears each task the server accepted. Returns how many
/// submits failed (the first few calls that failed are printed).
pub(crate) async fn submit_pool(
    channels: &[Channel],
    tasks: u64,
    submitters: usize,
    batch: u64,
    rate: f64,
    make: impl Fn(u64) -> pb::SubmitTaskRequest + Send + Sync + 'static,
    answered: impl Fn(pb::Task) + Send + Sync + 'static,
) -> u64 {
    let (make, answered) = (Arc::new(make), Arc::new(answered));
    let batch = batch.max(1);
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let failed_calls = Arc::new(AtomicU64::new(0));
    let mut pool = JoinSet::new();
    let start = tokio::time::Instant::now();
    for s in 0..submitters.max(1) {
        let mut client = TaskServiceClient::new(channels[s % channels.len()].clone());
        let (next, errors, failed_calls) = (next.clone(), errors.clone(), failed_calls.clone());
        let (make, answered) = (make.clone(), answered.clone());
        pool.spawn(async move {
            loop {
                let n = next.fetch_add(batch, Ordering::Relaxed);
                if n >= tasks {
                    break;
                }
                let end = (n + batch).min(tasks);
                if rate > 0.0 {
                    tokio::time::sleep_until(start + Duration::from_secs_f64(n as f64 / rate))
                        .await;
                }
                let answer = if batch == 1 {
                    client
                        .submit_task(make(n))
                        .await
                        .map(|r| r.into_inner().task.into_iter().collect::<Vec<_>>())
                } else {
                    let request = pb::SubmitTasksRequest {
                        tasks: (n..end).map(|i| make(i)).collect(),
                    };
                    client.submit_tasks(request).await.map(|r| {
                        let results = r.into_inner().results;
                        results.into_iter().filter_map(|r| r.task).collect()
                    })
                };
                match answer {
                    Ok(submitted) => submitted.into_iter().for_each(|task| answered(task)),
                    Err(status) => {
                        errors.fetch_add(end - n, Ordering::Relaxed);
                        if failed_calls.fetch_add(1, Ordering::Relaxed) < 5 {
                            eprintln!("submit of tasks {n}..{end} failed: {status}");
                        }
                    }
                }
            }
        });
    }
    while pool.join_next().await.is_some() {}
    errors.load(Ordering::Relaxed)
}

/// Counts an agent session that failed (a session the server ended cleanly
/// is already in `Counters::lost`); prints the first few.
fn note_session(joined: Result<anyhow::Result<()>, tokio::task::JoinError>, errors: &mut u64) {
    let failure = match joined {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("{e:#}")),
        Err(e) => Some(format!("panicked: {e}")),
    };
    if let Some(failure) = failure {
        *errors += 1;
        if *errors <= 5 {
            eprintln!("agent session failed: {failure}");
        }
    }
}

async fn drive(
    cli: &Cli,
    mix: Arc<fleet::Mix>,
    url: &str,
    pid: Option<u32>,
) -> anyhow::Result<Report> {
    let counters = Arc::new(Counters::new(mix.classes.len()));
    if cli.fleet_ack_rate > 0.0 {
        let every = (1e6 / cli.fleet_ack_rate).round().max(1.0) as u64;
        counters.answer_every_us.store(every, Ordering::Relaxed);
    }
    let run_id = format!("{:x}", std::process::id() ^ (counters.now_us() as u32));
    let n_channels = if cli.channels == 0 {
        cli.agents.div_ceil(100).max(1)
    } else {
        cli.channels
    };
    let servers: Vec<&str> = std::iter::once(url)
        .chain(cli.fleet_also.as_deref())
        .collect();
    let n_channels = n_channels.max(servers.len());
    let mut channels = Vec::with_capacity(n_channels);
    for k in 0..n_channels {
        channels.push(channel(servers[k % servers.len()]).await?);
    }

    // Parked tasks first, ahead of everything else.
    let mut parked_report = None;
    if cli.parked > 0 {
        let before = pid.and_then(server::sample);
        let (ok, errors, seconds) = parked::submit(
            channel(url).await?,
            cli.parked,
            cli.parked_placements,
            cli.submitters,
            cli.submit_batch,
        )
        .await;
        let after = pid.and_then(server::sample);
        parked_report = Some(parked::ParkedReport {
            tasks: ok,
            submit_errors: errors,
            placements: cli.parked_placements,
            submit_seconds: seconds,
            submits_per_sec: if seconds > 0.0 {
                ok as f64 / seconds
            } else {
                0.0
            },
            submit_cpu_seconds: before
                .zip(after.as_ref())
                .map(|(a, b)| b.cpu_seconds - a.cpu_seconds),
            rss_mib_after_submit: after.map(|a| a.rss_kib as f64 / 1024.0),
            churn: None,
            drain: None,
        });
    }

    // Busy tasks next, and the one agent that can run them, holding one.
    let mut busy_report = None;
    let mut holder = None;
    if cli.busy > 0 {
        let (ok, errors) = busy::submit(
            channel(url).await?,
            cli.busy,
            cli.submitters,
            cli.submit_batch,
        )
        .await;
        holder = Some(
            busy::Holder::start(
                channel(url).await?,
                &run_id,
                cli.agents + 2_000_000,
                Duration::from_secs(cli.timeout_secs),
            )
            .await?,
        );
        busy_report = Some(busy::BusyReport {
            tasks: ok,
            submit_errors: errors,
            held: 1,
        });
    }

    // Preloaded: queue every task while no agent exists.
    let mut preload_cpu_seconds = None;
    let mut submitted = None;
    if cli.preload {
        let before = pid.and_then(server::sample);
        submitted = Some(submit_all(cli, &mix, url, &counters).await?);
        if let (Some(a), Some(b)) = (before, pid.and_then(server::sample)) {
            preload_cpu_seconds = Some(b.cpu_seconds - a.cpu_seconds);
        }
    }

    // Connect the fleet, a bounded number at a time.
    let before_connect = pid.and_then(server::sample);
    let connect_start = Instant::now();
    // A big fleet can take minutes to connect, or never finish: say how far
    // it got every 10 s, and give up after --timeout-secs.
    let progress = {
        let (counters, agents) = (counters.clone(), cli.agents);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            tick.tick().await;
            loop {
                tick.tick().await;
                eprintln!(
                    "connecting: {} of {agents} agents welcomed after {:.0} s",
                    counters.welcomed.load(Ordering::Relaxed),
                    connect_start.elapsed().as_secs_f64()
                );
            }
        })
    };
    let connected = tokio::time::timeout(
        Duration::from_secs(cli.timeout_secs),
        connect_fleet(cli, &channels, &run_id, &counters),
    )
    .await;
    progress.abort();
    let Fleet {
        mut sessions,
        stop: stop_tx,
    } = connected.map_err(|_| {
        anyhow::anyhow!(
            "only {} of {} agents were welcomed within --timeout-secs {}",
            counters.welcomed.load(Ordering::Relaxed),
            cli.agents,
            cli.timeout_secs
        )
    })??;
    let connect_seconds = connect_start.elapsed().as_secs_f64();
    let after_connect = pid.and_then(server::sample);
    let hb_bytes_at_connect = counters.heartbeat_bytes.load(Ordering::Relaxed);
    let hb_count_at_connect = counters.heartbeats.load(Ordering::Relaxed);
    let connected_at = Instant::now();

    // Agents join and leave while the tasks flow.
    let churn = (cli.churn > 0.0).then(|| {
        parked::Churn::start(
            channels.clone(),
            run_id.clone(),
            cli.agents,
            cli.capacity,
            cli.churn,
            Duration::from_secs_f64(cli.churn_life_secs.max(0.0)),
            counters.clone(),
        )
    });

    // Ordinary: submit to the connected fleet.
    let submitted = match submitted {
        Some(s) => s,
        None => submit_all(cli, &mix, url, &counters).await?,
    };
    let release_us = counters.release_us.load(Ordering::Relaxed);
    let mut at_release = None;
    if cli.release_secs.is_some() {
        let now_us = counters.now_us();
        if now_us > release_us {
            eprintln!(
                "warning: the submits took {:.2} s, longer than --release-secs: the queue was still filling at the release",
                submitted.seconds
            );
        } else {
            tokio::time::sleep(Duration::from_micros(release_us - now_us)).await;
        }
        at_release = pid.and_then(server::sample);
    }

    // Wait for every submitted task to complete.
    let mut session_errors = 0u64;
    let deadline = Instant::now() + Duration::from_secs(cli.timeout_secs);
    while counters.completions.load(Ordering::Relaxed) < submitted.ok {
        if Instant::now() > deadline {
            eprintln!(
                "timed out: {} of {} tasks completed",
                counters.completions.load(Ordering::Relaxed),
                submitted.ok
            );
            break;
        }
        while let Some(joined) = sessions.try_join_next() {
            note_session(joined, &mut session_errors);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after_run = pid.and_then(server::sample);
    // The run clock starts when a task could first be granted (released:
    // when the first was).
    let clock_start_us = if cli.preload {
        counters.first_welcome_us.load(Ordering::Relaxed)
    } else if cli.release_secs.is_some() {
        counters
            .first_grant_after_release_us
            .load(Ordering::Relaxed)
    } else {
        submitted.first_us
    };
    let last_grant_us = counters.last_grant_us.load(Ordering::Relaxed);
    let last_completion_us = counters.last_completion_us.load(Ordering::Relaxed);
    let run_seconds = (last_completion_us.saturating_sub(clock_start_us)) as f64 / 1e6;

    // Hold: heartbeats only.
    let mut idle_cpu_percent = None;
    if cli.hold_secs > 0 {
        let t0 = Instant::now();
        let s0 = pid.and_then(server::sample);
        let hold_end = t0 + Duration::from_secs(cli.hold_secs);
        while Instant::now() < hold_end {
            while let Some(joined) = sessions.try_join_next() {
                note_session(joined, &mut session_errors);
            }
            let left = hold_end.saturating_duration_since(Instant::now());
            tokio::time::sleep(Duration::from_millis(200).min(left)).await;
        }
        if let (Some(a), Some(b)) = (s0, pid.and_then(server::sample)) {
            idle_cpu_percent =
                Some(100.0 * (b.cpu_seconds - a.cpu_seconds) / t0.elapsed().as_secs_f64());
        }
    }
    if let Some(churn) = churn {
        let report = churn.stop().await?;
        if let Some(p) = parked_report.as_mut() {
            p.churn = Some(report);
        } else {
            eprintln!(
                "churn: {} agents joined, {} left, {} failed",
                report.joined, report.left, report.failed
            );
        }
    }
    let connected_minutes = connected_at.elapsed().as_secs_f64() / 60.0;
    let hb_bytes = counters.heartbeat_bytes.load(Ordering::Relaxed) - hb_bytes_at_connect;
    let hb_count = counters.heartbeats.load(Ordering::Relaxed) - hb_count_at_connect;
    let end = pid.and_then(server::sample);
    if cli.drain_parked > 0
        && let Some(p) = parked_report.as_mut()
    {
        p.drain = Some(
            parked::drain(
                &channels,
                &run_id,
                cli.agents + 1_000_000,
                cli.drain_parked,
                cli.capacity,
                cli.parked_placements,
                p.tasks,
                Duration::from_secs(cli.timeout_secs),
                pid,
            )
            .await?,
        );
    }
    let _ = stop_tx.send(true);
    if let Some(holder) = holder {
        holder.stop().await?;
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(joined) = sessions.join_next().await {
            note_session(joined, &mut session_errors);
        }
    })
    .await;

    let per_sec = |n: u64, until_us: u64| {
        let secs = until_us.saturating_sub(clock_start_us) as f64 / 1e6;
        if secs > 0.0 { n as f64 / secs } else { 0.0 }
    };
    let grants = counters.grants.load(Ordering::Relaxed);
    let completions = counters.completions.load(Ordering::Relaxed);
    let points = std::mem::take(
        &mut *counters
            .latencies_us
            .lock()
            .map_err(|_| anyhow::anyhow!("latency lock poisoned"))?,
    );
    let latencies_from = |from: u64| -> Vec<u64> {
        points
            .iter()
            .filter(|&&(at, _)| at >= from)
            .map(|&(_, latency)| latency)
            .collect()
    };
    let mut latencies = latencies_from(0);
    let steady_latency_ms = (cli.warmup_secs > 0.0).then(|| {
        let from = clock_start_us.saturating_add((cli.warmup_secs * 1e6) as u64);
        Percentiles::of(&mut latencies_from(from))
    });
    if let Some(path) = &cli.latency_log {
        let mut csv = String::from("from_ms,latency_ms\n");
        for &(from, latency) in &points {
            csv.push_str(&format!(
                "{:.3},{:.3}\n",
                from as f64 / 1e3,
                latency as f64 / 1e3
            ));
        }
        std::fs::write(path, csv)
            .map_err(|err| anyhow::anyhow!("writing {}: {err}", path.display()))?;
    }
    // A preloaded run's connecting overlaps its granting, so its run CPU
    // counts from the start of connecting.
    let run_from = if cli.preload {
        before_connect
    } else if cli.release_secs.is_some() {
        at_release
    } else {
        after_connect
    };
    let server = match (pid, before_connect, after_connect, run_from, after_run, end) {
        (Some(pid), Some(b), Some(c), Some(f), Some(r), Some(e)) => Some(ServerCost {
            pid,
            cpu_seconds: r.cpu_seconds - f.cpu_seconds,
            cpu_percent: if run_seconds > 0.0 {
                100.0 * (r.cpu_seconds - f.cpu_seconds) / run_seconds
            } else {
                0.0
            },
            connect_cpu_seconds: c.cpu_seconds - b.cpu_seconds,
            preload_cpu_seconds,
            idle_cpu_percent,
            connected_rss_mib: c.rss_kib as f64 / 1024.0,
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
        preloaded: cli.preload,
        release_secs: cli.release_secs,
        grants_before_release: cli
            .release_secs
            .map(|_| counters.grants_before_release.load(Ordering::Relaxed)),
        release_pickup_ms: cli.release_secs.map(|_| {
            counters
                .first_grant_after_release_us
                .load(Ordering::Relaxed)
                .saturating_sub(release_us) as f64
                / 1e3
        }),
        target_rate: (cli.rate > 0.0).then_some(cli.rate),
        submit_batch: cli.submit_batch,
        threads: tokio::runtime::Handle::current().metrics().num_workers(),
        classes: mix
            .classes
            .iter()
            .zip(&counters.by_class)
            .enumerate()
            .map(|(i, (c, (count, last)))| {
                let completions = count.load(Ordering::Relaxed);
                ClassDrain {
                    selector: c.selector.clone(),
                    task_share: mix.share(i),
                    eligible: c.eligible,
                    completions,
                    drained_secs: (completions > 0).then(|| {
                        last.load(Ordering::Relaxed).saturating_sub(clock_start_us) as f64 / 1e6
                    }),
                }
            })
            .collect(),
        connect_seconds,
        run_seconds,
        submitted: submitted.ok,
        submit_errors: submitted.errors,
        submits_per_sec: if submitted.seconds > 0.0 {
            submitted.ok as f64 / submitted.seconds
        } else {
            0.0
        },
        grants,
        completions,
        grants_per_sec: per_sec(grants, last_grant_us),
        completions_per_sec: per_sec(completions, last_completion_us),
        latency_ms: Percentiles::of(&mut latencies),
        warmup_secs: cli.warmup_secs,
        steady_latency_ms,
        acked_latency_ms: {
            let acked = counters
                .submit_acked_us
                .lock()
                .map_err(|_| anyhow::anyhow!("latency lock poisoned"))?;
            let granted = counters
                .first_grant_us
                .lock()
                .map_err(|_| anyhow::anyhow!("latency lock poisoned"))?;
            // A grant that reached the agent before the submitter heard
            // back counts as 0.
            let mut waits: Vec<u64> = acked
                .iter()
                .filter_map(|(id, at)| granted.get(id).map(|g| g.saturating_sub(*at)))
                .collect();
            Percentiles::of(&mut waits)
        },
        fleet_ack_rate: (cli.fleet_ack_rate > 0.0).then_some(cli.fleet_ack_rate),
        completions_by_second: counters.completions_timeline(),
        revocations: counters.revocations.load(Ordering::Relaxed),
        refused: counters.refused.load(Ordering::Relaxed),
        resyncs: counters.resyncs.load(Ordering::Relaxed),
        sessions_lost: counters.lost.load(Ordering::Relaxed),
        session_errors,
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
        parked: parked_report,
        busy: busy_report,
    })
}
