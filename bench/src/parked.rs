//! Parked tasks, and agents that come and go.
//!
//! - `--parked N` submits N tasks before anything else, at priority 10 (ahead
//!   of every other task in the queue), spread over `--parked-placements K`
//!   placements that no agent of the fleet can run: half name a fact no agent
//!   has (a tag), half ask for more memory than any agent has (a fact every agent
//!   has, so only evaluating it rules an agent out).
//! - `--churn R` has R agents a second join the fleet while tasks flow; each
//!   leaves after `--churn-life-secs`, as a real agent does: it says DRAINING,
//!   finishes what it was granted and hangs up.
//! - `--drain-parked D`, once the run is over, connects D agents that can
//!   run every parked placement and measures how fast the parked tasks are
//!   leased and completed.
//!
//! [`check`] proves with the real matcher, before any task is sent, that no
//! agent of the fleet can run a parked task and that every drain agent can.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde_json::{Value, json};
use switchyard_core::placement::compile;
use switchyard_core::selector;
use switchyard_proto::convert::json_to_struct;
use switchyard_proto::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::transport::Channel;

use crate::agent::{self, Counters, Leave};
use crate::{fleet, server};

/// More memory (MB) than any agent of the fleet has.
const NEEDS_MEMORY_MB: u64 = 1 << 20;

/// The selector of parked placement `k`.
pub fn selector(k: usize) -> String {
    if k.is_multiple_of(2) {
        format!("bench-parked-{k}")
    } else {
        format!("memory.total>={}", NEEDS_MEMORY_MB + k as u64)
    }
}

/// The document of drain agent `i`: a fleet agent's, with every parked
/// placement's tag and twice the memory any of them asks for.
pub fn drain_document(i: usize, capacity: u32, placements: usize) -> Value {
    let mut document = fleet::document(i, capacity);
    if let Some(tags) = document["tags"].as_array_mut() {
        tags.extend((0..placements).map(|k| json!(format!("bench-parked-{k}"))));
    }
    document["memory"]["total"] = json!(2 * NEEDS_MEMORY_MB);
    document
}

/// Checks with the real matcher that no agent of the fleet (the first
/// 10,000 of it, and of the churning agents after it) can run a parked
/// placement, and that a drain agent can run every one.
pub fn check(
    agents: usize,
    churners: usize,
    capacity: u32,
    placements: usize,
) -> anyhow::Result<()> {
    for k in 0..placements {
        let text = selector(k);
        let compiled = compile(&selector::parse(&text).context("parked selector")?)
            .with_context(|| format!("compiling {text}"))?;
        let fleet = (0..agents.min(10_000)).chain(agents..agents + churners.min(1_000));
        if let Some(i) = fleet
            .into_iter()
            .find(|&i| compiled.satisfied_by(&fleet::document(i, capacity)))
        {
            anyhow::bail!("agent {i} of the fleet can run the parked placement {text}");
        }
        if !compiled.satisfied_by(&drain_document(0, capacity, placements)) {
            anyhow::bail!("a drain agent cannot run the parked placement {text}");
        }
    }
    Ok(())
}

/// What `--parked`, `--churn` and `--drain-parked` did.
#[derive(Debug, Serialize)]
pub struct ParkedReport {
    /// Parked tasks submitted (and failed submits).
    pub tasks: u64,
    pub submit_errors: u64,
    /// Distinct parked placements.
    pub placements: usize,
    pub submit_seconds: f64,
    pub submits_per_sec: f64,
    /// Server CPU seconds while the parked tasks were submitted.
    pub submit_cpu_seconds: Option<f64>,
    /// Server `VmRSS` once they were, MiB.
    pub rss_mib_after_submit: Option<f64>,
    /// Agents joining and leaving during the run, if `--churn` was given.
    pub churn: Option<ChurnReport>,
    /// The parked tasks' drain, if `--drain-parked` was given.
    pub drain: Option<DrainReport>,
}

/// Agents that joined and left while the run went on.
#[derive(Debug, Serialize)]
pub struct ChurnReport {
    /// Target joins per second, and each agent's time connected.
    pub rate_per_sec: f64,
    pub life_secs: f64,
    /// Agents welcomed, agents that left cleanly, sessions that failed.
    pub joined: u64,
    pub left: u64,
    pub failed: u64,
}

/// Agents able to run the parked tasks connect once the run is over.
#[derive(Debug, Serialize)]
pub struct DrainReport {
    pub agents: usize,
    pub capacity: u32,
    /// Parked tasks completed by them (of `ParkedReport::tasks`).
    pub completions: u64,
    /// From the first drain agent's Welcome to the last completion.
    pub seconds: f64,
    pub completions_per_sec: f64,
    /// Server CPU over `seconds`, percent of one core.
    pub server_cpu_percent: Option<f64>,
}

/// Submits `tasks` parked tasks over `placements` placements from
/// `submitters` concurrent submitters, `batch` to a call, flat out;
/// returns (ok, errors, seconds).
pub async fn submit(
    channel: Channel,
    tasks: u64,
    placements: usize,
    submitters: usize,
    batch: u64,
) -> (u64, u64, f64) {
    let selectors: Vec<String> = (0..placements).map(selector).collect();
    let start = std::time::Instant::now();
    let errors = crate::submit_pool(
        &[channel],
        tasks,
        submitters,
        batch,
        0.0,
        move |n| {
            let k = (n % selectors.len() as u64) as usize;
            pb::SubmitTaskRequest {
                kind: "parked".into(),
                priority: 10,
                payload: Some(json_to_struct(&json!({"parked": k, "n": n}))),
                placement: Some(pb::Placement {
                    selector: selectors[k].clone(),
                    ..Default::default()
                }),
                ..Default::default()
            }
        },
        |_| {},
    )
    .await;
    (tasks - errors, errors, start.elapsed().as_secs_f64())
}

/// Agents joining at a steady rate, each leaving after its life.
pub struct Churn {
    spawner: tokio::task::JoinHandle<JoinSet<anyhow::Result<bool>>>,
    end: watch::Sender<bool>,
    rate: f64,
    life: Duration,
}

impl Churn {
    /// Starts agents `first_index`, `first_index + 1`, … joining at `rate`
    /// a second over `channels`, each connected for `life`.
    pub fn start(
        channels: Vec<Channel>,
        run_id: String,
        first_index: usize,
        capacity: u32,
        rate: f64,
        life: Duration,
        counters: Arc<Counters>,
    ) -> Self {
        let (end, end_rx) = watch::channel(false);
        let spawner = tokio::spawn(async move {
            let mut sessions = JoinSet::new();
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut end_seen = end_rx.clone();
            for j in 0.. {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = end_seen.changed() => break,
                }
                let index = first_index + j;
                let ch = channels[j % channels.len()].clone();
                let (run_id, counters, mut end) =
                    (run_id.clone(), counters.clone(), end_rx.clone());
                sessions.spawn(async move {
                    let registered = agent::register(ch.clone(), &run_id, index, capacity).await?;
                    let (stop_tx, stop_rx) = watch::channel(false);
                    let (welcomed_tx, welcomed_rx) = tokio::sync::oneshot::channel();
                    let session = tokio::spawn(agent::run(
                        ch,
                        registered,
                        counters,
                        stop_rx,
                        welcomed_tx,
                        Leave::Drain,
                        0,
                    ));
                    let welcomed = welcomed_rx.await.is_ok();
                    tokio::select! {
                        _ = tokio::time::sleep(life) => {}
                        _ = end.changed() => {}
                    }
                    let _ = stop_tx.send(true);
                    session.await.context("churn agent panicked")??;
                    Ok(welcomed)
                });
            }
            sessions
        });
        Self {
            spawner,
            end,
            rate,
            life,
        }
    }

    /// Stops new joins, lets every connected churn agent leave, and counts.
    pub async fn stop(self) -> anyhow::Result<ChurnReport> {
        let _ = self.end.send(true);
        let mut sessions = self.spawner.await.context("churn spawner panicked")?;
        let (mut joined, mut left, mut failed) = (0, 0, 0);
        while let Some(done) = sessions.join_next().await {
            match done {
                Ok(Ok(welcomed)) => {
                    joined += u64::from(welcomed);
                    left += 1;
                }
                Ok(Err(e)) => {
                    failed += 1;
                    if failed <= 5 {
                        eprintln!("churn agent failed: {e:#}");
                    }
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("churn agent panicked: {e}");
                }
            }
        }
        Ok(ChurnReport {
            rate_per_sec: self.rate,
            life_secs: self.life.as_secs_f64(),
            joined,
            left,
            failed,
        })
    }
}

/// Connects `agents` drain agents (indices from `first_index`) and waits
/// until they completed `expected` tasks or `timeout` passed.
#[allow(clippy::too_many_arguments)]
pub async fn drain(
    channels: &[Channel],
    run_id: &str,
    first_index: usize,
    agents: usize,
    capacity: u32,
    placements: usize,
    expected: u64,
    timeout: Duration,
    pid: Option<u32>,
) -> anyhow::Result<DrainReport> {
    let counters = Arc::new(Counters::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut sessions = JoinSet::new();
    let before = pid.and_then(server::sample);
    let started = std::time::Instant::now();
    for d in 0..agents {
        let index = first_index + d;
        let ch = channels[d % channels.len()].clone();
        let (run_id, counters, stop) = (run_id.to_owned(), counters.clone(), stop_rx.clone());
        let document = drain_document(index, capacity, placements);
        sessions.spawn(async move {
            let registered =
                agent::register_as(ch.clone(), &run_id, index, document, capacity).await?;
            let (welcomed_tx, _welcomed_rx) = tokio::sync::oneshot::channel();
            agent::run(
                ch,
                registered,
                counters,
                stop,
                welcomed_tx,
                Leave::HangUp,
                0,
            )
            .await
        });
    }
    let deadline = tokio::time::Instant::now() + timeout;
    while counters.completions.load(Ordering::Relaxed) < expected {
        if tokio::time::Instant::now() > deadline {
            eprintln!(
                "drain timed out: {} of {expected} parked tasks completed",
                counters.completions.load(Ordering::Relaxed)
            );
            break;
        }
        if let Some(done) = sessions.try_join_next() {
            done.context("drain agent panicked")??;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = pid.and_then(server::sample);
    let sampled_over = started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    while sessions.join_next().await.is_some() {}
    let first = counters.first_welcome_us.load(Ordering::Relaxed);
    let last = counters.last_completion_us.load(Ordering::Relaxed);
    let seconds = last.saturating_sub(first) as f64 / 1e6;
    let completions = counters.completions.load(Ordering::Relaxed);
    // From the start of connecting, which overlaps the drain.
    let server_cpu_percent = match (before, after) {
        (Some(a), Some(b)) => Some(100.0 * (b.cpu_seconds - a.cpu_seconds) / sampled_over),
        _ => None,
    };
    Ok(DrainReport {
        agents,
        capacity,
        completions,
        seconds,
        completions_per_sec: if seconds > 0.0 {
            completions as f64 / seconds
        } else {
            0.0
        },
        server_cpu_percent,
    })
}
