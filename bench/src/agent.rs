//! A simulated agent: registers its document, holds one `Connect` stream
//! (over a channel shared with other agents), heartbeats with JSON-Patch
//! diffs of its drifting memory and load average, and does no-op work:
//! every grant is answered at once with accepted, started and succeeded,
//! pipelined without waiting for the acks (or, with `--fleet-ack-rate`, at
//! the fleet's next turn: the whole fleet answers at most that many grants a
//! second, first come first served, and drops a revoked grant it has not
//! answered yet). What it sees goes into the shared
//! [`Counters`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use prost::Message;
use prost_types::value::Kind;
use serde_json::Value;
use switchyard_proto::convert::{duration_ms, json_to_struct, patch_to_proto};
use switchyard_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient, connect_request::Message as Up,
    connect_response::Message as Down, lease_update::Update,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::fleet;

/// The payload field that has an agent hold its lease (accepted and started,
/// never finished) instead of answering it (`--busy`).
pub const HOLD: &str = "hold";

/// What every agent and submitter of a run adds to; read by the report.
#[derive(Debug)]
pub struct Counters {
    /// The run's time origin; payloads carry microseconds since it.
    pub epoch: Instant,
    /// Lease grants received.
    pub grants: AtomicU64,
    /// Succeeded reports the server acknowledged with OK.
    pub completions: AtomicU64,
    /// Reports or heartbeats the server refused (non-OK ack).
    pub refused: AtomicU64,
    /// Revocations received (e.g. grants not acknowledged in time).
    pub revocations: AtomicU64,
    /// Resync requests received (a diff the server could not apply).
    pub resyncs: AtomicU64,
    /// Heartbeats sent.
    pub heartbeats: AtomicU64,
    /// Encoded size of those heartbeats (protobuf `ConnectRequest`, without
    /// the 5-byte gRPC frame header and HTTP/2 framing).
    pub heartbeat_bytes: AtomicU64,
    /// Sessions that got their Welcome.
    pub welcomed: AtomicU64,
    /// Microseconds since `epoch` of the first Welcome of the run
    /// (`u64::MAX` until then): where a preloaded run's clock starts, since
    /// no task can be granted before an agent is connected.
    pub first_welcome_us: AtomicU64,
    /// With `--release-secs`: microseconds since `epoch` when the tasks
    /// become runnable (`u64::MAX` otherwise), and the first grant
    /// received at or after it (`u64::MAX` until then).
    pub release_us: AtomicU64,
    pub first_grant_after_release_us: AtomicU64,
    /// Grants received before that moment (should be none).
    pub grants_before_release: AtomicU64,
    /// Sessions that ended before the run did.
    pub lost: AtomicU64,
    /// Microseconds since `epoch` of the last grant and the last completion.
    pub last_grant_us: AtomicU64,
    pub last_completion_us: AtomicU64,
    /// Grant-received latencies, in microseconds, from the later of the
    /// task's submit and the first Welcome (see [`Counters::ready_us`]),
    /// each with that moment (microseconds since `epoch`): `(from, latency)`.
    pub latencies_us: Mutex<Vec<(u64, u64)>>,
    /// When each task's submit was answered, and when its first grant
    /// arrived (microseconds since `epoch`), by task id: the latency from a
    /// durably accepted submit to its grant.
    pub submit_acked_us: Mutex<std::collections::HashMap<String, u64>>,
    pub first_grant_us: Mutex<std::collections::HashMap<String, u64>>,
    /// With `--fleet-ack-rate`: microseconds between two grants the fleet
    /// answers (0: every grant is answered at once), and when the next
    /// answer may go (microseconds since `epoch`). The whole fleet shares
    /// one queue, first come first served: a fleet that cannot keep up.
    pub answer_every_us: AtomicU64,
    pub next_answer_us: AtomicU64,
    /// Completions acknowledged, by second since `epoch`.
    pub completions_by_second: Vec<AtomicU64>,
    /// By class of the placement mix (the payload's `class`): completions
    /// acknowledged, and when the last was (microseconds since `epoch`).
    pub by_class: Vec<(AtomicU64, AtomicU64)>,
}

/// The seconds `Counters::completions_by_second` counts.
const COUNTED_SECONDS: usize = 3_600;

impl Counters {
    /// Counters for a run whose tasks fall into `classes` classes.
    pub fn new(classes: usize) -> Self {
        Self {
            epoch: Instant::now(),
            grants: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            revocations: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            heartbeats: AtomicU64::new(0),
            heartbeat_bytes: AtomicU64::new(0),
            welcomed: AtomicU64::new(0),
            first_welcome_us: AtomicU64::new(u64::MAX),
            release_us: AtomicU64::new(u64::MAX),
            first_grant_after_release_us: AtomicU64::new(u64::MAX),
            grants_before_release: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            last_grant_us: AtomicU64::new(0),
            last_completion_us: AtomicU64::new(0),
            latencies_us: Mutex::new(Vec::new()),
            submit_acked_us: Mutex::new(std::collections::HashMap::new()),
            first_grant_us: Mutex::new(std::collections::HashMap::new()),
            answer_every_us: AtomicU64::new(0),
            next_answer_us: AtomicU64::new(0),
            completions_by_second: (0..COUNTED_SECONDS).map(|_| AtomicU64::new(0)).collect(),
            by_class: (0..classes)
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
        }
    }

    /// When a grant received now may be answered: at once, or at the fleet's
    /// next free turn (`--fleet-ack-rate`).
    pub fn answer_at(&self) -> Option<u64> {
        let every = self.answer_every_us.load(Ordering::Relaxed);
        if every == 0 {
            return None;
        }
        let now = self.now_us();
        let turn = self
            .next_answer_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                Some(next.max(now) + every)
            })
            .unwrap_or(now);
        Some(turn.max(now))
    }

    /// Counts a completion of a task of `class` acknowledged now.
    fn completed(&self, class: Option<usize>) {
        let now = self.now_us();
        if let Some((count, last)) = class.and_then(|c| self.by_class.get(c)) {
            count.fetch_add(1, Ordering::Relaxed);
            last.fetch_max(now, Ordering::Relaxed);
        }
        self.completions.fetch_add(1, Ordering::Relaxed);
        self.last_completion_us.fetch_max(now, Ordering::Relaxed);
        if let Some(second) = self.completions_by_second.get((now / 1_000_000) as usize) {
            second.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Completions per second from the first second with one to the last.
    pub fn completions_timeline(&self) -> Vec<u64> {
        let counts: Vec<u64> = self
            .completions_by_second
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let first = counts.iter().position(|&c| c > 0).unwrap_or(0);
        let last = counts.iter().rposition(|&c| c > 0).map_or(0, |i| i + 1);
        counts[first..last.max(first)].to_vec()
    }

    /// Microseconds since the epoch.
    pub fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// When a task submitted at `submitted_us` could first be granted: its
    /// submit, or the first Welcome if it was submitted before any agent was
    /// connected (a preloaded run). In an ordinary run every agent is
    /// connected before the first submit, so this is the submit time.
    pub fn ready_us(&self, submitted_us: u64) -> u64 {
        let first_welcome = self.first_welcome_us.load(Ordering::Relaxed);
        if first_welcome == u64::MAX {
            submitted_us
        } else {
            submitted_us.max(first_welcome)
        }
    }
}

/// A registered agent, ready to connect.
#[derive(Debug)]
pub struct Registered {
    index: usize,
    document: Value,
    reg: pb::RegisterAgentResponse,
}

/// Registers agent `index` of run `run` with its document.
pub async fn register(
    channel: Channel,
    run: &str,
    index: usize,
    capacity: u32,
) -> anyhow::Result<Registered> {
    register_as(
        channel,
        run,
        index,
        fleet::document(index, capacity),
        capacity,
    )
    .await
}

/// Registers agent `index` of run `run` with `document`.
pub async fn register_as(
    channel: Channel,
    run: &str,
    index: usize,
    document: Value,
    capacity: u32,
) -> anyhow::Result<Registered> {
    let reg = AgentServiceClient::new(channel)
        .register_agent(pb::RegisterAgentRequest {
            name: format!("bench-{run}-{index:05}"),
            namespace: String::new(),
            capabilities: Some(json_to_struct(&document)),
            capacity,
            runner: "switchyard-bench".into(),
            handled_kinds: vec!["noop".into(), "parked".into()],
            ..Default::default()
        })
        .await
        .with_context(|| format!("registering agent {index}"))?
        .into_inner();
    Ok(Registered {
        index,
        document,
        reg,
    })
}

/// How an agent's session ends when told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// Hang up at once (the end of a run).
    HangUp,
    /// As a real agent leaves: say DRAINING, finish what was granted before
    /// the server heard it, and hang up once every report is acknowledged
    /// and [`LEAVE_LINGER`] passed since DRAINING was (or after
    /// [`LEAVE_TIMEOUT`]).
    Drain,
}

/// The longest a draining agent waits for its last acks.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a draining agent stays after the server acknowledged DRAINING:
/// a grant picked for it just before can still be on its way (see
/// BENCHMARKS.md). Staying lets this agent run it; hanging up would send it
/// back to the queue (the server revokes a departed agent's unacknowledged
/// grants when its session ends), to be granted again elsewhere.
const LEAVE_LINGER: Duration = Duration::from_millis(500);

/// A draining agent on its way out.
#[derive(Debug, Clone, Copy)]
struct Leaving {
    /// The sequence of its DRAINING heartbeat.
    sequence: u64,
    /// When the server acknowledged it.
    acked_at: Option<tokio::time::Instant>,
    /// When to hang up regardless.
    give_up: tokio::time::Instant,
}

impl Leaving {
    fn new(sequence: u64) -> Self {
        Self {
            sequence,
            acked_at: None,
            give_up: tokio::time::Instant::now() + LEAVE_TIMEOUT,
        }
    }

    /// Whether to hang up, with reports still unacknowledged or not.
    fn done(&self, reports_pending: bool) -> bool {
        let lingered = self.acked_at.is_some_and(|at| at.elapsed() >= LEAVE_LINGER);
        tokio::time::Instant::now() >= self.give_up || (lingered && !reports_pending)
    }

    /// When nothing but time can make it done: the linger's end, until it
    /// has passed; then giving up (acks wake the session meanwhile).
    fn next_check(&self) -> tokio::time::Instant {
        match self.acked_at {
            Some(at) if at.elapsed() < LEAVE_LINGER => at + LEAVE_LINGER,
            _ => self.give_up,
        }
    }
}

/// Runs one agent's session until `stop` turns true (then leaves as
/// `leave` says) or the stream ends. Says when the Welcome arrived through
/// `welcomed`. Each task writes `output_lines` lines of output (one output
/// report, as a runner batches a quick task's lines) before its result.
pub async fn run(
    channel: Channel,
    agent: Registered,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
    welcomed: tokio::sync::oneshot::Sender<()>,
    leave: Leave,
    output_lines: u32,
) -> anyhow::Result<()> {
    let Registered {
        index,
        mut document,
        reg,
    } = agent;
    let (tx, rx) = mpsc::channel::<pb::ConnectRequest>(256);
    tx.send(pb::ConnectRequest {
        sequence: 1,
        message: Some(Up::Hello(pb::Hello {
            agent_id: reg.agent_id.clone(),
            session_epoch: reg.session_epoch,
            held_leases: Vec::new(),
        })),
    })
    .await
    .context("queueing hello")?;
    let mut stream = AgentServiceClient::new(channel)
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .with_context(|| format!("connecting agent {index}"))?
        .into_inner();
    let mut session = Session {
        tx,
        sequence: 1,
        generation: reg.capability_generation,
        succeeded: HashMap::new(),
        acked: Volatile::of(&document),
        pending: None,
    };
    let interval_ms = reg
        .heartbeat_interval
        .as_ref()
        .and_then(duration_ms)
        .unwrap_or(5_000)
        .max(100) as u64;
    // Spread the fleet's heartbeats over the interval instead of all at once.
    let offset = (index as u64).wrapping_mul(7_919) % interval_ms;
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_millis(offset),
        Duration::from_millis(interval_ms),
    );
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut welcomed = Some(welcomed);
    let mut beat = 0u64;
    // Grants waiting for the fleet's turn (`--fleet-ack-rate`).
    let mut waiting: std::collections::VecDeque<Deferred> = std::collections::VecDeque::new();
    let mut leaving: Option<Leaving> = None;
    loop {
        if leaving.is_some_and(|l| l.done(!session.succeeded.is_empty())) {
            break;
        }
        tokio::select! {
            _ = stop.changed(), if leaving.is_none() => {
                if leave == Leave::HangUp || welcomed.is_some() {
                    break;
                }
                let load = document["loadavg"]["1min"].as_f64().unwrap_or(0.0);
                session.send(Up::Heartbeat(pb::Heartbeat {
                    status: pb::AgentStatus::Draining as i32,
                    status_reasons: vec!["leaving".into()],
                    load: Some(pb::AgentLoad { running_leases: RUNNING, load_average: load }),
                    capability_diff: None,
                    handled_kinds: None,
                })).await?;
                leaving = Some(Leaving::new(session.sequence));
            }
            _ = tokio::time::sleep_until(leaving.map_or_else(tokio::time::Instant::now, |l| l.next_check())),
                if leaving.is_some() => {}
            _ = tokio::time::sleep_until(waiting.front().map_or_else(tokio::time::Instant::now, |w| w.at)),
                if !waiting.is_empty() => {
                if let Some(w) = waiting.pop_front() {
                    answer(&mut session, &w.lease_id, w.token, &w.task_id, w.class, output_lines).await?;
                }
            }
            _ = ticker.tick(), if welcomed.is_none() && leaving.is_none() => {
                beat += 1;
                fleet::drift(&mut document, index, beat);
                // Diff against what the server acknowledged holding; while a
                // diff or snapshot is unacknowledged, heartbeat without one.
                let diff = if session.pending.is_none() {
                    let patch = session.acked.patch_to(&Volatile::of(&document));
                    (!patch.0.is_empty()).then(|| pb::CapabilityDiff {
                        base_generation: session.generation,
                        operations: patch_to_proto(&patch),
                    })
                } else {
                    None
                };
                let carries_diff = diff.is_some();
                let load = document["loadavg"]["1min"].as_f64().unwrap_or(0.0);
                let heartbeat = Up::Heartbeat(pb::Heartbeat {
                    status: pb::AgentStatus::Ready as i32,
                    status_reasons: Vec::new(),
                    load: Some(pb::AgentLoad { running_leases: RUNNING, load_average: load }),
                    capability_diff: diff,
                    handled_kinds: None,
                });
                let bytes = session.send(heartbeat).await?;
                if carries_diff {
                    session.pending = Some((session.sequence, Volatile::of(&document)));
                }
                counters.heartbeats.fetch_add(1, Ordering::Relaxed);
                counters.heartbeat_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            }
            item = stream.next() => {
                let Some(item) = item else {
                    counters.lost.fetch_add(1, Ordering::Relaxed);
                    break;
                };
                let Some(message) = item.with_context(|| format!("agent {index} stream"))?.message else {
                    continue;
                };
                match message {
                    Down::Welcome(w) => {
                        session.generation = w.capability_generation;
                        counters.welcomed.fetch_add(1, Ordering::Relaxed);
                        counters.first_welcome_us.fetch_min(counters.now_us(), Ordering::Relaxed);
                        if let Some(tx) = welcomed.take() {
                            let _ = tx.send(());
                        }
                    }
                    Down::LeaseGrant(grant) => {
                        let now = counters.now_us();
                        counters.grants.fetch_add(1, Ordering::Relaxed);
                        counters.last_grant_us.fetch_max(now, Ordering::Relaxed);
                        let release = counters.release_us.load(Ordering::Relaxed);
                        if now >= release {
                            counters
                                .first_grant_after_release_us
                                .fetch_min(now, Ordering::Relaxed);
                        } else if release != u64::MAX {
                            counters.grants_before_release.fetch_add(1, Ordering::Relaxed);
                        }
                        let task = grant.task.unwrap_or_default();
                        let class = payload_number(&task, "class").map(|c| c as usize);
                        if let Some(sent) = submitted_us(&task)
                            && let Ok(mut l) = counters.latencies_us.lock()
                        {
                            let from = counters.ready_us(sent);
                            l.push((from, now.saturating_sub(from)));
                        }
                        if let Ok(mut g) = counters.first_grant_us.lock() {
                            g.entry(task.task_id.clone()).or_insert(now);
                        }
                        if payload_number(&task, HOLD).is_some() {
                            // A busy task's holder keeps it.
                            hold(&mut session, &grant.lease_id, grant.fencing_token, &task.task_id).await?;
                            continue;
                        }
                        match counters.answer_at() {
                            Some(at) => {
                                let at = tokio::time::Instant::from_std(counters.epoch)
                                    + Duration::from_micros(at);
                                waiting.push_back(Deferred {
                                    at,
                                    lease_id: grant.lease_id.clone(),
                                    token: grant.fencing_token,
                                    task_id: task.task_id,
                                    class,
                                });
                            }
                            None => {
                                answer(&mut session, &grant.lease_id, grant.fencing_token, &task.task_id, class, output_lines).await?;
                            }
                        }
                    }
                    Down::Ack(ack) => {
                        if let Some(l) = leaving.as_mut()
                            && l.sequence == ack.sequence {
                                l.acked_at = Some(tokio::time::Instant::now());
                            }
                        if session.pending.as_ref().is_some_and(|p| p.0 == ack.sequence)
                            && let Some((_, held)) = session.pending.take()
                                && ack.code == 0 {
                                    session.acked = held;
                                    session.generation = ack.capability_generation;
                                }
                        let success = session.succeeded.remove(&ack.sequence);
                        if ack.code != 0 {
                            counters.refused.fetch_add(1, Ordering::Relaxed);
                        } else if let Some(class) = success {
                            counters.completed(class);
                        }
                    }
                    Down::LeaseRevocation(r) => {
                        counters.revocations.fetch_add(1, Ordering::Relaxed);
                        // Work not started yet is dropped, as a runner would.
                        waiting.retain(|w| w.lease_id != r.lease_id);
                    }
                    Down::ResyncRequest(r) => {
                        counters.resyncs.fetch_add(1, Ordering::Relaxed);
                        session.generation = r.server_generation;
                        session.send(Up::CapabilitySnapshot(pb::CapabilitySnapshot {
                            capabilities: Some(json_to_struct(&document)),
                            ..Default::default()
                        })).await?;
                        session.pending = Some((session.sequence, Volatile::of(&document)));
                    }
                    Down::Drain(_) => {
                        counters.lost.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Accepts and starts a grant, and never finishes it.
async fn hold(
    session: &mut Session,
    lease_id: &str,
    fencing_token: u64,
    task_id: &str,
) -> anyhow::Result<()> {
    for update in [
        Update::Accepted(pb::LeaseAccepted {}),
        Update::Started(pb::LeaseStarted {}),
    ] {
        session
            .report(lease_id, fencing_token, task_id, update)
            .await?;
    }
    Ok(())
}

/// Answers a grant at once with accepted, started, `output_lines` lines of
/// output (one report) and succeeded, pipelined without waiting for acks.
async fn answer(
    session: &mut Session,
    lease_id: &str,
    fencing_token: u64,
    task_id: &str,
    class: Option<usize>,
    output_lines: u32,
) -> anyhow::Result<()> {
    let output = (output_lines > 0).then(|| {
        Update::Output(pb::TaskOutput {
            chunks: vec![pb::OutputChunk {
                stream: pb::OutputStream::Stdout as i32,
                sequence: 1,
                text: (1..=output_lines)
                    .map(|n| format!("task {task_id} line {n}: compiling module {n}\n"))
                    .collect(),
                dropped_bytes: 0,
            }],
        })
    });
    let updates = [
        Some(Update::Accepted(pb::LeaseAccepted {})),
        Some(Update::Started(pb::LeaseStarted {})),
        output,
        Some(Update::Succeeded(pb::LeaseSucceeded { result: None })),
    ];
    for update in updates.into_iter().flatten() {
        let last = matches!(update, Update::Succeeded(_));
        session
            .report(lease_id, fencing_token, task_id, update)
            .await?;
        if last {
            session.succeeded.insert(session.sequence, class);
        }
    }
    Ok(())
}

/// The facts of a simulated agent's document that drift ([`fleet::drift`]):
/// free and available memory and the load averages. A heartbeat's diff is
/// made from these alone, never by diffing and copying the whole
/// hundred-leaf document, so that a large simulated fleet costs the load
/// generator little beside the server it measures.
#[derive(Debug, Clone, PartialEq)]
struct Volatile([Value; 5]);

impl Volatile {
    /// The drifting leaves, in the order of [`Volatile::PATHS`].
    const PATHS: [&'static str; 5] = [
        "/memory/free",
        "/memory/available",
        "/loadavg/1min",
        "/loadavg/5min",
        "/loadavg/15min",
    ];

    fn of(document: &Value) -> Self {
        Self(Self::PATHS.map(|p| document.pointer(p).cloned().unwrap_or(Value::Null)))
    }

    /// A JSON Patch replacing what differs, as `json_patch::diff` of the
    /// two documents would.
    fn patch_to(&self, now: &Self) -> json_patch::Patch {
        json_patch::Patch(
            Self::PATHS
                .iter()
                .zip(self.0.iter().zip(&now.0))
                .filter(|(_, (was, is))| was != is)
                .map(|(path, (_, is))| {
                    json_patch::PatchOperation::Replace(json_patch::ReplaceOperation {
                        path: json_patch::jsonptr::PointerBuf::parse(*path)
                            .expect("a valid pointer"),
                        value: is.clone(),
                    })
                })
                .collect(),
        )
    }
}

/// The leases a simulated agent's heartbeat reports running: none, since a
/// grant is answered whole as it arrives (or waits, unstarted, for the
/// fleet's turn).
const RUNNING: u32 = 0;

/// The sending half of one session.
struct Session {
    tx: mpsc::Sender<pb::ConnectRequest>,
    sequence: u64,
    /// The capability generation the server last said it holds; the base of
    /// the next diff.
    generation: u64,
    /// Sequence numbers of succeeded reports whose ack is outstanding, with
    /// their task's class.
    succeeded: HashMap<u64, Option<usize>>,
    /// The drifting facts of the document the server acknowledged holding
    /// at `generation` (the rest never changes).
    acked: Volatile,
    /// A diff or snapshot in flight: its sequence and the facts it sets.
    pending: Option<(u64, Volatile)>,
}

impl Session {
    /// Sends a message; returns its encoded size.
    /// Sends one report on a lease.
    async fn report(
        &mut self,
        lease_id: &str,
        fencing_token: u64,
        task_id: &str,
        update: Update,
    ) -> anyhow::Result<()> {
        self.send(Up::LeaseUpdate(pb::LeaseUpdate {
            lease_id: lease_id.to_owned(),
            task_id: task_id.to_owned(),
            fencing_token,
            update: Some(update),
        }))
        .await?;
        Ok(())
    }

    async fn send(&mut self, message: Up) -> anyhow::Result<usize> {
        self.sequence += 1;
        let request = pb::ConnectRequest {
            sequence: self.sequence,
            message: Some(message),
        };
        let len = request.encoded_len();
        self.tx
            .send(request)
            .await
            .map_err(|_| anyhow::anyhow!("session stream closed"))?;
        Ok(len)
    }
}

/// A grant waiting for the fleet's turn to be answered (`--fleet-ack-rate`).
struct Deferred {
    /// When it may be answered.
    at: tokio::time::Instant,
    lease_id: String,
    token: u64,
    task_id: String,
    /// Its task's class in the placement mix.
    class: Option<usize>,
}

/// The submit time the submitter put in the task's payload.
fn submitted_us(task: &pb::Task) -> Option<u64> {
    payload_number(task, "submitted_us")
}

/// A whole number the submitter put in the task's payload.
fn payload_number(task: &pb::Task, field: &str) -> Option<u64> {
    let payload = task.payload.as_ref()?;
    match payload.fields.get(field)?.kind.as_ref()? {
        Kind::NumberValue(n) => Some(*n as u64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The heartbeat's patch from the drifting facts alone is what diffing
    /// the whole documents gives (the same operations, in any order).
    #[test]
    fn the_volatile_patch_is_the_whole_documents_diff() {
        for agent in [0, 7, 4_242] {
            let before = fleet::document(agent, 4);
            let mut after = before.clone();
            for beat in 1..4 {
                fleet::drift(&mut after, agent, beat);
                let sorted = |p: json_patch::Patch| {
                    let mut ops: Vec<String> =
                        p.0.iter()
                            .map(|o| serde_json::to_string(o).unwrap())
                            .collect();
                    ops.sort();
                    ops
                };
                let whole = sorted(json_patch::diff(&before, &after));
                let volatile = sorted(Volatile::of(&before).patch_to(&Volatile::of(&after)));
                assert!(!whole.is_empty());
                assert_eq!(volatile, whole);
            }
        }
    }
}
