//! The result of a run: throughput, when each class of the placement mix
//! drained, latency percentiles, heartbeat cost and the server's CPU and
//! memory, printed as a table or as JSON.

use serde::Serialize;

use crate::busy::BusyReport;
use crate::parked::ParkedReport;

/// Everything a run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    pub agents: usize,
    pub capacity: u32,
    pub channels: usize,
    pub tasks: u64,
    pub placements: String,
    /// Every task was submitted before any agent connected (`--preload`):
    /// the run clock starts at the first Welcome, and `latency_ms` counts from
    /// that Welcome, not from each task's submit.
    pub preloaded: bool,
    /// `--release-secs`: the tasks were submitted to the connected fleet to
    /// become runnable at one moment; the run clock starts at the first
    /// grant after it, and `latency_ms` counts from that moment.
    pub release_secs: Option<f64>,
    /// How long after that moment the first grant arrived (the dispatcher
    /// re-reads a queue whose tasks are not yet due at least once a second).
    pub release_pickup_ms: Option<f64>,
    /// Grants that arrived before that moment (a server that ignored
    /// `not_before` would show them here).
    pub grants_before_release: Option<u64>,
    /// Target submit rate in tasks/s; null when flat out.
    pub target_rate: Option<f64>,
    /// Tasks per submit call (`--submit-batch`; 1: `SubmitTask`, more:
    /// `SubmitTasks`).
    pub submit_batch: u64,
    /// Worker threads the load generator ran on (`--threads`, or one per
    /// core), as its runtime counted them.
    pub threads: usize,
    /// Each class of the placement mix: its share of the tasks and of the
    /// fleet, and when its last task completed. A class whose share of the
    /// tasks exceeds its share of the fleet's slots drains last, on its
    /// eligible agents alone.
    pub classes: Vec<ClassDrain>,
    /// Seconds to register and connect every agent.
    pub connect_seconds: f64,
    /// Seconds from the first submit (preloaded: the first Welcome) to the
    /// last completion.
    pub run_seconds: f64,
    pub submitted: u64,
    pub submit_errors: u64,
    /// Achieved submit rate over the submit phase.
    pub submits_per_sec: f64,
    pub grants: u64,
    pub completions: u64,
    /// Grants received per second, first submit (preloaded: first Welcome)
    /// to last grant.
    pub grants_per_sec: f64,
    /// Completions acknowledged per second, first submit (preloaded: first
    /// Welcome) to last completion.
    pub completions_per_sec: f64,
    /// Submit-to-grant-received latency, milliseconds; preloaded, from the
    /// first Welcome to each grant (how far into the drain it came).
    pub latency_ms: Percentiles,
    /// `--warmup-secs`.
    pub warmup_secs: f64,
    /// `latency_ms` of the tasks submitted `warmup_secs` or more after the
    /// run clock started; absent without a warm-up.
    pub steady_latency_ms: Option<Percentiles>,
    /// From the submit's answer (the task durably stored) to its first
    /// grant reaching the agent, milliseconds; a grant that arrived first
    /// counts as 0. Excludes the submit's own commit, which the latency
    /// above includes.
    pub acked_latency_ms: Percentiles,
    /// `--fleet-ack-rate`, if set.
    pub fleet_ack_rate: Option<f64>,
    /// Completions acknowledged in each second of the run, from the first
    /// second with one to the last.
    pub completions_by_second: Vec<u64>,
    pub revocations: u64,
    pub refused: u64,
    pub resyncs: u64,
    /// Sessions the server ended before the run did.
    pub sessions_lost: u64,
    /// Sessions that ended with an error (stream error, closed channel).
    pub session_errors: u64,
    pub heartbeats: u64,
    /// Mean encoded heartbeat size, bytes.
    pub heartbeat_bytes_mean: f64,
    /// Encoded heartbeat bytes sent per agent per minute of connection.
    pub heartbeat_bytes_per_agent_minute: f64,
    pub heartbeat_interval_ms: u64,
    /// The server's process, when known.
    pub server: Option<ServerCost>,
    /// Parked tasks, churning agents and the parked tasks' drain
    /// (`--parked`).
    pub parked: Option<ParkedReport>,
    /// Busy tasks at the head of the queue (`--busy`).
    pub busy: Option<BusyReport>,
}

/// One class of the placement mix, as the run drained it.
#[derive(Debug, Serialize)]
pub struct ClassDrain {
    pub selector: String,
    /// The fraction of the tasks that carry it.
    pub task_share: f64,
    /// The fraction of the fleet that can run it.
    pub eligible: f64,
    /// Its completions acknowledged.
    pub completions: u64,
    /// Seconds from the run clock's start to its last completion; null
    /// when none completed.
    pub drained_secs: Option<f64>,
}

/// The server's resource use.
#[derive(Debug, Serialize)]
pub struct ServerCost {
    pub pid: u32,
    /// CPU seconds (user+system) during the task phase (preloaded: from the
    /// start of connecting, which overlaps granting, to the last completion).
    pub cpu_seconds: f64,
    /// That, as percent of one core over `run_seconds`.
    pub cpu_percent: f64,
    /// CPU seconds while the agents registered and connected.
    pub connect_cpu_seconds: f64,
    /// CPU seconds while the tasks were submitted, before any agent
    /// connected (preloaded runs only).
    pub preload_cpu_seconds: Option<f64>,
    /// CPU percent of one core while idle with every agent connected
    /// (heartbeats only), if `--hold-secs` was given.
    pub idle_cpu_percent: Option<f64>,
    /// `VmRSS` once every agent was connected, MiB.
    pub connected_rss_mib: f64,
    /// `VmHWM` at the end, MiB.
    pub peak_rss_mib: f64,
    /// `VmRSS` at the end (after the hold, if any), MiB.
    pub rss_mib: f64,
    pub threads: u64,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Serialize, Default)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// From microsecond samples (sorted in place).
    pub fn of(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let at = |q: f64| {
            let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
            samples[i] as f64 / 1000.0
        };
        Self {
            count: samples.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: samples[samples.len() - 1] as f64 / 1000.0,
        }
    }
}

impl Report {
    /// A two-column table for people; the headline (grants/s) first.
    pub fn table(&self) -> String {
        let mut rows: Vec<(String, String)> = vec![
            (
                "grants/s".into(),
                format!(
                    "{:.0}  ({} grants in {:.2} s{})",
                    self.grants_per_sec,
                    self.grants,
                    self.run_seconds,
                    if self.preloaded {
                        ", clock from first Welcome"
                    } else if self.release_secs.is_some() {
                        ", clock from the first grant after the release"
                    } else {
                        ""
                    }
                ),
            ),
            (
                "fleet".into(),
                format!(
                    "{} agents x capacity {} over {} channels",
                    self.agents, self.capacity, self.channels
                ),
            ),
            (
                "tasks".into(),
                format!(
                    "{} ({} placements), {}",
                    self.tasks,
                    self.placements,
                    if self.preloaded {
                        "preloaded before any agent connected".to_owned()
                    } else if let Some(secs) = self.release_secs {
                        format!(
                            "released at once {secs} s after the first submit (first grant {:.0} ms later)",
                            self.release_pickup_ms.unwrap_or_default()
                        )
                    } else {
                        self.target_rate
                            .map(|r| format!("rate {r}/s"))
                            .unwrap_or_else(|| "rate flat out".into())
                    }
                ),
            ),
        ];
        for c in &self.classes {
            rows.push((
                "  placement".into(),
                format!(
                    "{:>5.1}% eligible, {:>5.1}% of tasks, last done {}  {}",
                    c.eligible * 100.0,
                    c.task_share * 100.0,
                    c.drained_secs
                        .map_or_else(|| "-".to_owned(), |s| format!("{s:.2} s")),
                    if c.selector.is_empty() {
                        "(none)"
                    } else {
                        &c.selector
                    }
                ),
            ));
        }
        let l = &self.latency_ms;
        rows.extend([
            ("connect".into(), format!("{:.2} s", self.connect_seconds)),
            ("run".into(), format!("{:.2} s", self.run_seconds)),
            (
                "submitted".into(),
                format!(
                    "{} ({:.0}/s, {} errors)",
                    self.submitted, self.submits_per_sec, self.submit_errors
                ),
            ),
            (
                "completions".into(),
                format!("{} ({:.0}/s)", self.completions, self.completions_per_sec),
            ),
            (
                if self.preloaded {
                    "welcome->grant ms".into()
                } else if self.release_secs.is_some() {
                    "release->grant ms".into()
                } else {
                    "submit->grant ms".into()
                },
                format!(
                    "p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}  (n={})",
                    l.p50, l.p90, l.p99, l.max, l.count
                ),
            ),
        ]);
        if let Some(steady) = &self.steady_latency_ms {
            rows.push((
                format!("  after {:.1} s warm-up", self.warmup_secs),
                format!(
                    "p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}  (n={})",
                    steady.p50, steady.p90, steady.p99, steady.max, steady.count
                ),
            ));
        }
        rows.extend([(
            "submit-acked->grant ms".into(),
            format!(
                "p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}  (n={})",
                self.acked_latency_ms.p50,
                self.acked_latency_ms.p90,
                self.acked_latency_ms.p99,
                self.acked_latency_ms.max,
                self.acked_latency_ms.count
            ),
        )]);
        if let Some(rate) = self.fleet_ack_rate {
            rows.push((
                "completions by second".into(),
                format!(
                    "{:?} (the fleet answers at most {rate:.0}/s)",
                    self.completions_by_second
                ),
            ));
        }
        rows.extend([
            (
                "revoked/refused/resync/lost/failed".into(),
                format!(
                    "{}/{}/{}/{}/{}",
                    self.revocations,
                    self.refused,
                    self.resyncs,
                    self.sessions_lost,
                    self.session_errors
                ),
            ),
            (
                "heartbeats".into(),
                format!(
                    "{} every {} ms, mean {:.0} B, {:.0} B/agent/min",
                    self.heartbeats,
                    self.heartbeat_interval_ms,
                    self.heartbeat_bytes_mean,
                    self.heartbeat_bytes_per_agent_minute
                ),
            ),
        ]);
        if let Some(s) = &self.server {
            rows.push((
                "server cpu, run".into(),
                format!("{:.0}% of a core ({:.2} s)", s.cpu_percent, s.cpu_seconds),
            ));
            rows.push((
                "server cpu, idle".into(),
                s.idle_cpu_percent
                    .map(|p| format!("{p:.1}% of a core (heartbeats only)"))
                    .unwrap_or_else(|| "not measured (give --hold-secs)".into()),
            ));
            rows.push((
                "server cpu, other".into(),
                format!(
                    "{:.2} s connecting{}",
                    s.connect_cpu_seconds,
                    s.preload_cpu_seconds
                        .map(|c| format!(", {c:.2} s preloading"))
                        .unwrap_or_default()
                ),
            ));
            rows.push((
                "server peak RSS".into(),
                format!(
                    "{:.1} MiB (RSS {:.1} MiB connected, {:.1} MiB at end; {} threads, pid {})",
                    s.peak_rss_mib, s.connected_rss_mib, s.rss_mib, s.threads, s.pid
                ),
            ));
        }
        if let Some(b) = &self.busy {
            rows.push((
                "busy".into(),
                format!(
                    "{} tasks, priority 10, one held by the only agent that can run them ({} errors)",
                    b.tasks, b.submit_errors
                ),
            ));
        }
        if let Some(p) = &self.parked {
            rows.push((
                "parked".into(),
                format!(
                    "{} tasks over {} placements, priority 10, submitted in {:.2} s ({:.0}/s, {} errors){}{}",
                    p.tasks,
                    p.placements,
                    p.submit_seconds,
                    p.submits_per_sec,
                    p.submit_errors,
                    p.submit_cpu_seconds
                        .map(|c| format!(", server {c:.2} s CPU"))
                        .unwrap_or_default(),
                    p.rss_mib_after_submit
                        .map(|r| format!(", RSS {r:.1} MiB after"))
                        .unwrap_or_default()
                ),
            ));
            if let Some(c) = &p.churn {
                rows.push((
                    "  churn".into(),
                    format!(
                        "{}/s joining for {:.0} s each: {} joined, {} left, {} failed",
                        c.rate_per_sec, c.life_secs, c.joined, c.left, c.failed
                    ),
                ));
            }
            if let Some(d) = &p.drain {
                rows.push((
                    "  drain".into(),
                    format!(
                        "{} agents x {}: {} completed in {:.2} s ({:.0}/s){}",
                        d.agents,
                        d.capacity,
                        d.completions,
                        d.seconds,
                        d.completions_per_sec,
                        d.server_cpu_percent
                            .map(|c| format!(", server {c:.0}% of a core"))
                            .unwrap_or_default()
                    ),
                ));
            }
        }
        let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        rows.iter()
            .map(|(k, v)| format!("{k:<width$}  {v}\n"))
            .collect()
    }
}
