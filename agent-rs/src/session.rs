//! The agent's life with the server: register, hold one `Connect` stream,
//! heartbeat at the server's interval with JSON-Patch diffs of the
//! capability document, run what it is leased, and report. When the stream
//! breaks it reconnects with jittered exponential backoff and resumes the
//! leases it still holds (running work is not interrupted); output and
//! final reports not yet acknowledged are sent again (the server skips
//! output it stored, and final reports are idempotent there). A handler's
//! output goes up as it is written, batched and bounded (`crate::output`),
//! always before its lease's final report. On shutdown it drains: it takes nothing new, lets running leases
//! finish within the grace period, releases the rest, and returns.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use rand::Rng;
use serde_json::Value;
use switchyard_core::tier::Tier;
use switchyard_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient, connect_request::Message as Up,
    connect_response::Message as Down, lease_update::Update,
};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use crate::capabilities::Capabilities;
use crate::handler::{Assigned, Handlers, Progress, TaskContext, TaskFailure};
use crate::output::{OutputBatch, OutputLimits, OutputSink};
use switchyard_proto::convert::{
    check_carried, json_to_struct, patch_to_proto, struct_to_json_lossy as struct_to_json,
};

/// How the agent connects and behaves.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The server URL, e.g. `http://127.0.0.1:50051`.
    pub server: String,
    /// Bearer token (agent role), if the server requires one.
    pub token: Option<String>,
    /// TLS files for an https:// server.
    pub tls: switchyard_proto::client::ClientTls,
    /// The agent's name (unique in its namespace).
    pub name: String,
    /// The namespace it serves.
    pub namespace: String,
    /// The agent directory with the capability tiers.
    pub dir: PathBuf,
    /// Maximum concurrent leases.
    pub capacity: u32,
    /// How often memory/load are refreshed and tier files checked.
    pub refresh: Duration,
    /// How long a dynamic capability script may run.
    pub script_timeout: Duration,
    /// How often tool versions and the rest of the base tier are detected again.
    pub redetect: Duration,
    /// How long running leases may finish after shutdown begins.
    pub grace: Duration,
    /// Labels sent at registration.
    pub labels: BTreeMap<String, String>,
    /// How much of each task's output is sent, and how it is batched.
    pub output: OutputLimits,
}

/// What one session ended with.
enum SessionEnd {
    /// The server asked us to reconnect (possibly elsewhere) after a delay.
    Reconnect(Duration),
    /// Shutdown finished.
    Stopped,
}

/// A lease being worked on.
#[derive(Debug)]
struct Running {
    task_id: String,
    fencing_token: u64,
    cancel: CancellationToken,
    /// Set when the server revoked it for cancellation: report `released`.
    canceled: bool,
}

/// A report from a handler task.
#[derive(Debug)]
enum WorkEvent {
    Progress {
        lease_id: String,
        progress: Progress,
    },
    Done {
        lease_id: String,
        outcome: Result<Value, TaskFailure>,
    },
    /// Output of a running lease, before its `Done`.
    Output(OutputBatch),
}

/// The most bytes of output kept for resending after a reconnect; past it
/// the oldest unacknowledged batches are given up.
const UNACKED_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

/// The leases a new session names as held: those running, and those whose
/// final report waits for an acknowledgement (unnamed, the server would
/// count such a lease lost and run its task again).
fn held_leases(
    running: &HashMap<String, Running>,
    unacked_finals: &BTreeMap<String, pb::LeaseUpdate>,
) -> Vec<pb::HeldLease> {
    let finished = unacked_finals
        .iter()
        .filter(|(id, _)| !running.contains_key(*id))
        .map(|(id, u)| (id, &u.task_id, u.fencing_token));
    running
        .iter()
        .map(|(id, r)| (id, &r.task_id, r.fencing_token))
        .chain(finished)
        .map(|(lease_id, task_id, fencing_token)| pb::HeldLease {
            lease_id: lease_id.clone(),
            task_id: task_id.clone(),
            fencing_token,
        })
        .collect()
}

/// State that outlives a session.
struct AgentState {
    config: AgentConfig,
    handlers: Handlers,
    caps: Capabilities,
    running: HashMap<String, Running>,
    /// Final reports not yet acknowledged, by lease id.
    unacked_finals: BTreeMap<String, pb::LeaseUpdate>,
    /// Output reports not yet acknowledged, oldest first, by a number of
    /// their own (a session maps its message sequences to them): resent
    /// after a reconnect, before the finals (the server skips what it
    /// stored already).
    unacked_output: VecDeque<(u64, pb::LeaseUpdate)>,
    /// Their text's bytes, bounded by [`UNACKED_OUTPUT_BYTES`].
    unacked_output_bytes: usize,
    /// The number the next unacknowledged output report gets.
    next_output: u64,
    work_tx: mpsc::UnboundedSender<WorkEvent>,
    work_rx: mpsc::UnboundedReceiver<WorkEvent>,
    draining: bool,
    /// When running leases must be released (set when draining begins,
    /// whether connected or not).
    grace_deadline: Option<tokio::time::Instant>,
}

impl AgentState {
    /// Keeps an output report until it is acknowledged; its number.
    fn keep_output(&mut self, update: pb::LeaseUpdate) -> u64 {
        self.next_output += 1;
        self.unacked_output_bytes += output_bytes(&update);
        self.unacked_output.push_back((self.next_output, update));
        while self.unacked_output_bytes > UNACKED_OUTPUT_BYTES
            && let Some((_, oldest)) = self.unacked_output.pop_front()
        {
            self.unacked_output_bytes -= output_bytes(&oldest);
        }
        self.next_output
    }

    /// The output report `number` was acknowledged (or refused): it is not
    /// sent again.
    fn output_acknowledged(&mut self, number: u64) {
        if let Some(at) = self.unacked_output.iter().position(|(n, _)| *n == number)
            && let Some((_, update)) = self.unacked_output.remove(at)
        {
            self.unacked_output_bytes -= output_bytes(&update);
        }
    }
}

/// The bytes of text an output report carries.
fn output_bytes(update: &pb::LeaseUpdate) -> usize {
    match &update.update {
        Some(Update::Output(output)) => output.chunks.iter().map(|c| c.text.len()).sum(),
        _ => 0,
    }
}

async fn run_with_token(state: &mut AgentState, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut backoff = Duration::from_millis(250);
    loop {
        match session(state, &shutdown).await {
            Ok(SessionEnd::Stopped) => return Ok(()),
            Ok(SessionEnd::Reconnect(after)) => {
                backoff = Duration::from_millis(250);
                info!(
                    after_ms = after.as_millis() as u64,
                    "server asked us to reconnect"
                );
                tokio::time::sleep(after).await;
            }
            Err(err) => {
                if state.draining && state.running.is_empty() {
                    return Ok(());
                }
                let jitter = rand::rng().random_range(0.5..1.5);
                let wait = backoff.mul_f64(jitter);
                warn!(cause = %format!("{err:#}"), retry_in_ms = wait.as_millis() as u64, "session ended; reconnecting");
                if state
                    .grace_deadline
                    .is_some_and(|d| d <= tokio::time::Instant::now())
                {
                    // Out of grace and no server to report to: stop the work;
                    // the server expires the leases and retries the tasks.
                    warn!(
                        running = state.running.len(),
                        "grace period over while disconnected; stopping"
                    );
                    for (_, r) in state.running.drain() {
                        r.cancel.cancel();
                    }
                    return Ok(());
                }
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = shutdown.cancelled(), if !state.draining => {
                        state.draining = true;
                        state.grace_deadline = Some(tokio::time::Instant::now() + state.config.grace);
                        if state.running.is_empty() { return Ok(()); }
                    }
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Runs the agent until `shutdown` completes and draining ends.
pub async fn run(
    config: AgentConfig,
    handlers: Handlers,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let caps = Capabilities::load(&config.dir, &handlers, config.script_timeout).await;
    let (work_tx, work_rx) = mpsc::unbounded_channel();
    let mut state = AgentState {
        config,
        handlers,
        caps,
        running: HashMap::new(),
        unacked_finals: BTreeMap::new(),
        unacked_output: VecDeque::new(),
        unacked_output_bytes: 0,
        next_output: 0,
        work_tx,
        work_rx,
        draining: false,
        grace_deadline: None,
    };
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        shutdown.await;
        trigger.cancel();
    });
    run_with_token(&mut state, token).await
}

fn auth(
    token: Option<&str>,
) -> anyhow::Result<Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>> {
    token
        .map(|t| {
            format!("Bearer {t}")
                .parse()
                .context("the token has characters a header cannot carry")
        })
        .transpose()
}

fn with_auth<T>(
    message: T,
    auth: &Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = auth {
        request
            .metadata_mut()
            .insert("authorization", value.clone());
    }
    request
}

fn provenance(state: &AgentState) -> Vec<pb::ProvenanceEntry> {
    state
        .caps
        .merged()
        .provenance_entries()
        .map(|(path, tier)| pb::ProvenanceEntry {
            path: path.to_owned(),
            tier: wire_tier(tier) as i32,
        })
        .collect()
}

fn rejections(state: &AgentState) -> Vec<pb::Rejection> {
    state
        .caps
        .merged()
        .rejections
        .iter()
        .map(|r| pb::Rejection {
            tier: r.tier.map_or(pb::Tier::Unspecified, wire_tier) as i32,
            path: r.path.clone(),
            reason: r.reason.clone(),
        })
        .collect()
}

fn wire_tier(tier: Tier) -> pb::Tier {
    match tier {
        Tier::Base => pb::Tier::Base,
        Tier::Static => pb::Tier::Static,
        Tier::Dynamic => pb::Tier::Dynamic,
        Tier::Override => pb::Tier::Override,
        Tier::Operator => pb::Tier::Operator,
    }
}

/// One session: register, connect, serve until it ends.
async fn session(
    state: &mut AgentState,
    shutdown: &CancellationToken,
) -> anyhow::Result<SessionEnd> {
    let (mut live, mut inbound) = Live::open(state).await?;
    live.serve(&mut inbound, shutdown).await
}

/// The timers of a session: heartbeats, refreshes of the document, the
/// grace period of a drain, and the wait for the releases after it.
struct Timers {
    heartbeat: tokio::time::Interval,
    refresh: tokio::time::Interval,
    redetect: tokio::time::Interval,
    grace: std::pin::Pin<Box<tokio::time::Sleep>>,
    give_up: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl Timers {
    async fn new(
        config: &AgentConfig,
        heartbeat: Duration,
        grace: Option<tokio::time::Instant>,
    ) -> Self {
        let every = |period| {
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval
        };
        let mut refresh = every(config.refresh);
        refresh.tick().await;
        let mut redetect = every(config.redetect);
        redetect.tick().await;
        let far = || Box::pin(tokio::time::sleep(Duration::from_secs(86_400)));
        let mut timers = Self {
            heartbeat: every(heartbeat),
            refresh,
            redetect,
            grace: far(),
            give_up: far(),
        };
        if let Some(deadline) = grace {
            timers.grace.as_mut().reset(deadline);
        }
        timers
    }
}

/// A connected session: what it sent and what it waits to hear about.
struct Live<'s> {
    state: &'s mut AgentState,
    /// The session stream's outbound queue.
    out: mpsc::Sender<pb::ConnectRequest>,
    /// The last sequence number sent.
    sequence: u64,
    /// The capability generation the server holds.
    generation: u64,
    /// The document the server holds (the base of the next diff).
    sent_doc: Value,
    /// A diff or snapshot in flight: its sequence and the document it carries.
    pending_doc: Option<(u64, Value)>,
    /// The handled kinds last sent (at registration or in a heartbeat).
    sent_kinds: Vec<String>,
    /// Final reports in flight, by sequence: their lease.
    final_seqs: HashMap<u64, String>,
    /// Output reports in flight, by sequence: their number.
    output_seqs: HashMap<u64, u64>,
    /// After the grace period: releases sent, waiting (bounded) for acks.
    releasing: bool,
    timers: Timers,
}

impl<'s> Live<'s> {
    /// Registers, opens the stream with Hello (naming the leases still
    /// held), and resends the final reports the previous session did not
    /// see acknowledged.
    async fn open(
        state: &'s mut AgentState,
    ) -> anyhow::Result<(Live<'s>, tonic::Streaming<pb::ConnectResponse>)> {
        let endpoint = switchyard_proto::client::endpoint(&state.config.server, &state.config.tls)
            .map_err(|e| anyhow::anyhow!(e))?;
        let channel: Channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to {}", state.config.server))?;
        let auth = auth(state.config.token.as_deref())?;
        let mut client = AgentServiceClient::new(channel);
        state.caps.refresh(false).await;
        let registration = registration(state);
        let sent_kinds = registration.handled_kinds.clone();
        let reg = client
            .register_agent(with_auth(registration, &auth))
            .await
            .context("registering")?
            .into_inner();
        let interval = reg
            .heartbeat_interval
            .map(|d| duration_ms(&d).max(100))
            .map_or(Duration::from_secs(5), Duration::from_millis);
        let (out, out_rx) = mpsc::channel::<pb::ConnectRequest>(256);
        let timers = Timers::new(&state.config, interval, state.grace_deadline).await;
        let mut live = Live {
            generation: reg.capability_generation,
            sent_doc: state.caps.document().clone(),
            state,
            out,
            sequence: 0,
            pending_doc: None,
            sent_kinds,
            final_seqs: HashMap::new(),
            output_seqs: HashMap::new(),
            releasing: false,
            timers,
        };
        let held = live.held();
        live.send(Up::Hello(pb::Hello {
            agent_id: reg.agent_id.clone(),
            session_epoch: reg.session_epoch,
            held_leases: held,
        }))
        .await;
        let stream = tokio_stream::wrappers::ReceiverStream::new(out_rx);
        let inbound = client
            .connect(with_auth(stream, &auth))
            .await
            .context("opening the session stream")?
            .into_inner();
        info!(agent = %reg.agent_id, epoch = reg.session_epoch, "connected");
        // Output first: a lease's output comes before its final report.
        for (number, update) in live.state.unacked_output.clone() {
            let seq = live.send(Up::LeaseUpdate(update)).await;
            live.output_seqs.insert(seq, number);
        }
        for (lease_id, update) in live.state.unacked_finals.clone() {
            let seq = live.send(Up::LeaseUpdate(update)).await;
            live.final_seqs.insert(seq, lease_id);
        }
        Ok((live, inbound))
    }

    /// The leases still held, to resume.
    fn held(&self) -> Vec<pb::HeldLease> {
        held_leases(&self.state.running, &self.state.unacked_finals)
    }

    /// Sends a message on the stream; its sequence number.
    async fn send(&mut self, message: Up) -> u64 {
        self.sequence += 1;
        let _ = self
            .out
            .send(pb::ConnectRequest {
                sequence: self.sequence,
                message: Some(message),
            })
            .await;
        self.sequence
    }

    /// Serves the session until it ends: the server asks for a reconnect,
    /// the stream breaks (an error), or a drain finishes.
    async fn serve(
        &mut self,
        inbound: &mut tonic::Streaming<pb::ConnectResponse>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<SessionEnd> {
        loop {
            let state = &*self.state;
            if state.draining && state.running.is_empty() && state.unacked_finals.is_empty() {
                info!("drained: nothing left to run or report");
                return Ok(SessionEnd::Stopped);
            }
            let (draining, grace_set) = (state.draining, state.grace_deadline.is_some());
            let releasing = self.releasing;
            tokio::select! {
                () = shutdown.cancelled(), if !draining => self.start_draining().await,
                () = &mut self.timers.grace, if grace_set && !releasing => self.release_all().await,
                () = &mut self.timers.give_up, if releasing => {
                    warn!(unacknowledged = self.state.unacked_finals.len(), "releases not acknowledged in time; stopping");
                    return Ok(SessionEnd::Stopped);
                }
                _ = self.timers.refresh.tick() => {
                    self.state.caps.refresh(false).await;
                }
                _ = self.timers.redetect.tick() => self.state.caps.redetect().await,
                _ = self.timers.heartbeat.tick() => self.heartbeat().await,
                Some(event) = self.state.work_rx.recv() => self.on_work(event).await,
                message = inbound.next() => {
                    let message = match message {
                        Some(Ok(m)) => m,
                        Some(Err(status)) => anyhow::bail!("session stream failed: {status}"),
                        None => anyhow::bail!("server closed the session stream"),
                    };
                    if let Some(end) = self.on_message(message).await {
                        return Ok(end);
                    }
                }
            }
        }
    }

    /// Shutdown began: take nothing new, tell the server, and give running
    /// leases the grace period.
    async fn start_draining(&mut self) {
        info!(
            running = self.state.running.len(),
            "shutting down: draining"
        );
        self.state.draining = true;
        let deadline = tokio::time::Instant::now() + self.state.config.grace;
        self.state.grace_deadline = Some(deadline);
        self.timers.grace.as_mut().reset(deadline);
        self.send(Up::Heartbeat(pb::Heartbeat {
            status: pb::AgentStatus::Draining as i32,
            status_reasons: vec!["agent shutting down".into()],
            load: None,
            capability_diff: None,
            handled_kinds: None,
        }))
        .await;
    }

    /// The grace period is over: release what is still running, and wait
    /// (bounded) for the releases to be acknowledged.
    async fn release_all(&mut self) {
        warn!(
            running = self.state.running.len(),
            "grace period over: releasing what is still running"
        );
        let running: Vec<(String, Running)> = self.state.running.drain().collect();
        for (lease_id, r) in running {
            r.cancel.cancel();
            let released = release(pb::ReleaseCause::Draining, "agent shut down");
            self.report_final(lease_id, r.task_id, r.fencing_token, released)
                .await;
        }
        self.releasing = true;
        let until = tokio::time::Instant::now() + Duration::from_secs(3);
        self.timers.give_up.as_mut().reset(until);
    }

    /// A final report, kept until acknowledged (and resent by the next
    /// session if the stream breaks first).
    async fn report_final(
        &mut self,
        lease_id: String,
        task_id: String,
        fencing_token: u64,
        update: Update,
    ) {
        let report = pb::LeaseUpdate {
            lease_id: lease_id.clone(),
            task_id,
            fencing_token,
            update: Some(update),
        };
        self.state
            .unacked_finals
            .insert(lease_id.clone(), report.clone());
        let seq = self.send(Up::LeaseUpdate(report)).await;
        self.final_seqs.insert(seq, lease_id);
    }

    /// A heartbeat: status and reasons, load, the handled kinds when they
    /// changed (a required capability went or came back), and, when the
    /// document changed and no diff is in flight, the diff from what the
    /// server holds (the core's diff: the smaller of per-member operations
    /// and whole-object replaces, so a memory and load change stays tiny).
    async fn heartbeat(&mut self) {
        let state = &*self.state;
        let (status, reasons) = status(state);
        let kinds = state.handlers.advertise(state.caps.document()).kinds;
        let handled_kinds = (kinds != self.sent_kinds).then(|| pb::HandledKinds {
            kinds: kinds.clone(),
        });
        let document = state.caps.document();
        let diff = (self.pending_doc.is_none() && document != &self.sent_doc).then(|| {
            let patch = switchyard_core::diff::diff(&self.sent_doc, document);
            let diff = pb::CapabilityDiff {
                base_generation: self.generation,
                operations: patch_to_proto(&patch),
            };
            (diff, document.clone())
        });
        let load = pb::AgentLoad {
            running_leases: u32::try_from(state.running.len()).unwrap_or(u32::MAX),
            load_average: document
                .pointer("/loadavg/1min")
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
        };
        let seq = self
            .send(Up::Heartbeat(pb::Heartbeat {
                status: status as i32,
                status_reasons: reasons,
                load: Some(load),
                capability_diff: diff.as_ref().map(|d| d.0.clone()),
                handled_kinds,
            }))
            .await;
        if let Some((_, doc)) = diff {
            self.pending_doc = Some((seq, doc));
        }
        if kinds != self.sent_kinds {
            info!(?kinds, "handled kinds changed");
            self.sent_kinds = kinds;
        }
    }

    /// A handler reported progress or finished.
    async fn on_work(&mut self, event: WorkEvent) {
        match event {
            WorkEvent::Progress { lease_id, progress } => {
                let Some(r) = self.state.running.get(&lease_id) else {
                    return;
                };
                let update = pb::LeaseUpdate {
                    lease_id,
                    task_id: r.task_id.clone(),
                    fencing_token: r.fencing_token,
                    update: Some(Update::Progress(pb::TaskProgress {
                        percent: progress.percent,
                        message: progress.message,
                        reported_at: None,
                    })),
                };
                self.send(Up::LeaseUpdate(update)).await;
            }
            WorkEvent::Output(batch) => {
                let Some(r) = self.state.running.get(&batch.lease_id) else {
                    return;
                };
                let update = pb::LeaseUpdate {
                    task_id: r.task_id.clone(),
                    fencing_token: r.fencing_token,
                    lease_id: batch.lease_id,
                    update: Some(Update::Output(pb::TaskOutput {
                        chunks: batch.chunks,
                    })),
                };
                let number = self.state.keep_output(update.clone());
                let seq = self.send(Up::LeaseUpdate(update)).await;
                self.output_seqs.insert(seq, number);
            }
            WorkEvent::Done { lease_id, outcome } => {
                let Some(r) = self.state.running.remove(&lease_id) else {
                    return;
                };
                let update = if r.canceled {
                    release(
                        pb::ReleaseCause::RevocationAcknowledged,
                        "canceled by the server",
                    )
                } else {
                    finished(outcome)
                };
                self.report_final(lease_id, r.task_id, r.fencing_token, update)
                    .await;
            }
        }
    }

    /// A message from the server; `Some` when the session ends with it.
    async fn on_message(&mut self, message: pb::ConnectResponse) -> Option<SessionEnd> {
        match message.message? {
            Down::Welcome(w) => self.welcomed(w),
            Down::LeaseGrant(grant) => self.on_grant(grant).await,
            Down::LeaseRevocation(revocation) => self.on_revocation(&revocation),
            Down::Ack(ack) => self.on_ack(&ack),
            Down::ResyncRequest(resync) => self.on_resync(resync).await,
            Down::Drain(drain) => {
                info!(reason = %drain.reason, "server drained this session");
                let after = drain.reconnect_after.map_or(Duration::from_secs(1), |d| {
                    Duration::from_millis(duration_ms(&d))
                });
                return Some(SessionEnd::Reconnect(after));
            }
        }
        None
    }

    /// The Welcome: the generation held, and the held leases the server no
    /// longer knows (their work stops).
    fn welcomed(&mut self, w: pb::Welcome) {
        self.generation = w.capability_generation;
        for r in w.revoked {
            if let Some(running) = self.state.running.remove(&r.lease_id) {
                warn!(lease = %r.lease_id, "server no longer knows a held lease; stopping it");
                running.cancel.cancel();
            }
        }
    }

    /// A grant: accepted and started at once, or released with the cause
    /// and reason the agent cannot take it (the server offers a task the
    /// agent cannot handle to it no more, and retries a busy one later).
    async fn on_grant(&mut self, grant: pb::LeaseGrant) {
        let Some(task) = grant.task.clone() else {
            return;
        };
        let refuse = refusal(self.state, &task.kind);
        let update = |update| {
            Up::LeaseUpdate(pb::LeaseUpdate {
                lease_id: grant.lease_id.clone(),
                task_id: task.task_id.clone(),
                fencing_token: grant.fencing_token,
                update: Some(update),
            })
        };
        if let Some((cause, reason)) = refuse {
            debug!(lease = %grant.lease_id, %reason, "releasing a grant");
            self.send(update(release(cause, &reason))).await;
            return;
        }
        self.send(update(Update::Accepted(pb::LeaseAccepted {})))
            .await;
        self.send(update(Update::Started(pb::LeaseStarted {})))
            .await;
        start_work(self.state, &grant, &task);
    }

    /// A revocation: the work stops; a canceled lease is reported released
    /// once its handler returns, an expired or superseded one not at all.
    fn on_revocation(&mut self, revocation: &pb::LeaseRevocation) {
        let canceled = revocation.reason() == pb::RevocationReason::Canceled;
        if let Some(running) = self.state.running.get_mut(&revocation.lease_id) {
            info!(lease = %revocation.lease_id, reason = ?revocation.reason(), "lease revoked; stopping its work");
            running.canceled = canceled;
            running.cancel.cancel();
            if !canceled {
                self.state.running.remove(&revocation.lease_id);
            }
        }
    }

    /// An acknowledgement: of the diff in flight (the server now holds its
    /// document), of a final report (no need to resend it), or of anything
    /// else (an operator change moves the generation too; the next diff
    /// must name the one the server holds).
    fn on_ack(&mut self, ack: &pb::Ack) {
        if let Some((seq, doc)) = &self.pending_doc
            && *seq == ack.sequence
        {
            if ack.code == 0 && ack.capability_generation != self.generation {
                self.generation = ack.capability_generation;
                self.sent_doc = doc.clone();
            }
            self.pending_doc = None;
        } else if self.pending_doc.is_none() && ack.code == 0 {
            self.generation = ack.capability_generation;
        }
        if let Some(number) = self.output_seqs.remove(&ack.sequence) {
            if ack.code != 0 {
                debug!(code = ack.code, message = %ack.message, "output refused");
            }
            self.state.output_acknowledged(number);
        } else if let Some(lease_id) = self.final_seqs.remove(&ack.sequence) {
            if ack.code != 0 {
                warn!(lease = %lease_id, code = ack.code, message = %ack.message, "final report refused");
            }
            self.state.unacked_finals.remove(&lease_id);
        } else if ack.code != 0 {
            debug!(sequence = ack.sequence, code = ack.code, message = %ack.message, "message refused");
        }
    }

    /// The server asks for the full document: a snapshot.
    async fn on_resync(&mut self, resync: pb::ResyncRequest) {
        info!(reason = %resync.reason, "server asked for the full document");
        let doc = self.state.caps.document().clone();
        let snapshot = pb::CapabilitySnapshot {
            capabilities: Some(json_to_struct(&doc)),
            provenance: provenance(self.state),
            rejections: rejections(self.state),
        };
        let seq = self.send(Up::CapabilitySnapshot(snapshot)).await;
        self.generation = resync.server_generation;
        self.pending_doc = Some((seq, doc));
    }
}

/// The registration of the agent as its tiers stand now.
fn registration(state: &AgentState) -> pb::RegisterAgentRequest {
    pb::RegisterAgentRequest {
        name: state.config.name.clone(),
        namespace: state.config.namespace.clone(),
        capabilities: Some(json_to_struct(state.caps.document())),
        capacity: state.config.capacity,
        labels: state.config.labels.clone().into_iter().collect(),
        provenance: provenance(state),
        rejections: rejections(state),
        runner: format!("switchyard-agent/{} (rust)", env!("CARGO_PKG_VERSION")),
        handled_kinds: state.handlers.advertise(state.caps.document()).kinds,
    }
}

/// The status and reasons to report: DRAINING while shutting down, else
/// DEGRADED while a capability is unhealthy or a handler is withdrawn.
fn status(state: &AgentState) -> (pb::AgentStatus, Vec<String>) {
    if state.draining {
        return (
            pb::AgentStatus::Draining,
            vec!["agent shutting down".to_owned()],
        );
    }
    let mut reasons = state.caps.unhealthy().to_vec();
    let advertised = state.handlers.advertise(state.caps.document());
    reasons.extend(advertised.withdrawn.iter().map(|w| w.reason()));
    if reasons.is_empty() {
        (pb::AgentStatus::Ready, reasons)
    } else {
        (pb::AgentStatus::Degraded, reasons)
    }
}

/// Why the agent cannot take a grant of `kind` now, if it cannot: draining,
/// at capacity (busy: the server retries later), or no handler for the kind
/// or its handler withdrawn (the server offers it to this agent no more).
fn refusal(state: &AgentState, kind: &str) -> Option<(pb::ReleaseCause, String)> {
    if state.draining {
        return Some((pb::ReleaseCause::Draining, "agent is draining".to_owned()));
    }
    if state.running.len() >= state.config.capacity as usize {
        return Some((pb::ReleaseCause::Busy, "agent at capacity".to_owned()));
    }
    if state.handlers.get(kind).is_none() {
        return Some((
            pb::ReleaseCause::CannotHandle,
            format!("no handler for kind {kind}"),
        ));
    }
    let advertised = state.handlers.advertise(state.caps.document());
    if let Some(w) = advertised.withdrawn.iter().find(|w| w.kind == kind) {
        return Some((pb::ReleaseCause::CannotHandle, w.reason()));
    }
    None
}

/// A release with its cause.
fn release(cause: pb::ReleaseCause, reason: &str) -> Update {
    Update::Released(pb::LeaseReleased {
        reason: reason.to_owned(),
        cause: cause as i32,
    })
}

/// A handler's outcome as the final report's update. A result with a
/// number the contract cannot carry exactly fails the attempt, naming it,
/// rather than succeeding with the number rounded.
fn finished(outcome: Result<Value, TaskFailure>) -> Update {
    match outcome {
        Ok(result) => match check_carried(&result, "result") {
            Ok(()) => Update::Succeeded(pb::LeaseSucceeded {
                result: Some(json_to_struct(&result)),
            }),
            Err(err) => Update::Failed(pb::LeaseFailed {
                error: Some(pb::TaskError {
                    message: format!("the handler's result cannot be sent: {err}"),
                    code: "handler_error".to_owned(),
                    retryable: false,
                    details: None,
                    output_tail: String::new(),
                }),
            }),
        },
        Err(TaskFailure {
            release: Some(cause),
            message,
            ..
        }) => release(cause, &message),
        Err(f) => {
            // Details the contract cannot carry are dropped, said in the
            // message, rather than making the server refuse the report.
            let (message, details) = match check_carried(&f.details, "error.details") {
                Ok(()) => (
                    f.message,
                    f.details.is_object().then(|| json_to_struct(&f.details)),
                ),
                Err(err) => (format!("{} (details dropped: {err})", f.message), None),
            };
            Update::Failed(pb::LeaseFailed {
                error: Some(pb::TaskError {
                    message,
                    code: f.code,
                    retryable: f.retryable,
                    details,
                    // The server fills it in from the output it stored.
                    output_tail: String::new(),
                }),
            })
        }
    }
}

/// A protobuf duration in whole milliseconds (negative as zero).
fn duration_ms(d: &prost_types::Duration) -> u64 {
    u64::try_from(d.seconds * 1000 + i64::from(d.nanos) / 1_000_000).unwrap_or(0)
}

/// What a grant's lease holds, for the handler (one slot when the server
/// says nothing).
fn assigned(resources: Option<&pb::AssignedResources>) -> Assigned {
    let Some(r) = resources else {
        return Assigned {
            slots: 1,
            ..Assigned::default()
        };
    };
    Assigned {
        slots: r.slots.max(1),
        cpu_millicores: r.cpu_millicores,
        memory_mb: r.memory_mb,
        gpu_ids: r.gpu_ids.clone(),
        named: r.named.iter().map(|(k, v)| (k.clone(), *v)).collect(),
    }
}

/// Spawns the handler for a grant.
fn start_work(state: &mut AgentState, grant: &pb::LeaseGrant, task: &pb::Task) {
    let Some(handler) = state.handlers.get(&task.kind) else {
        return;
    };
    let cancel = CancellationToken::new();
    state.running.insert(
        grant.lease_id.clone(),
        Running {
            task_id: task.task_id.clone(),
            fencing_token: grant.fencing_token,
            cancel: cancel.clone(),
            canceled: false,
        },
    );
    let (progress_tx, mut progress_rx) = mpsc::unbounded_channel();
    let payload = task
        .payload
        .as_ref()
        .map(struct_to_json)
        .unwrap_or_else(|| Value::Object(Default::default()));
    let ctx = TaskContext::new(
        task.task_id.clone(),
        task.kind.clone(),
        payload,
        cancel,
        progress_tx,
    )
    .with_resources(assigned(grant.resources.as_ref()))
    .with_execution_timeout(
        task.execution_timeout
            .as_ref()
            .and_then(switchyard_proto::convert::duration_ms)
            .and_then(|ms| u64::try_from(ms).ok())
            .map(std::time::Duration::from_millis),
    );
    let work = state.work_tx.clone();
    let to_session = work.clone();
    let output = OutputSink::new(grant.lease_id.clone(), state.config.output, move |batch| {
        let _ = to_session.send(WorkEvent::Output(batch));
    });
    output.spawn_flusher();
    let ctx = ctx.with_output(output.clone());
    let lease_id = grant.lease_id.clone();
    let forward = work.clone();
    let forward_id = lease_id.clone();
    tokio::spawn(async move {
        while let Some(progress) = progress_rx.recv().await {
            let _ = forward.send(WorkEvent::Progress {
                lease_id: forward_id.clone(),
                progress,
            });
        }
    });
    tokio::spawn(async move {
        let outcome = handler.run(ctx).await;
        // The last of the output goes before the final report.
        output.finish();
        let _ = work.send(WorkEvent::Done { lease_id, outcome });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_the_contract_cannot_carry_fails_the_attempt_naming_it() {
        let ok = finished(Ok(
            serde_json::json!({"exit_code": 0, "id": 9_007_199_254_740_991_i64}),
        ));
        assert!(matches!(ok, Update::Succeeded(_)), "{ok:?}");
        let big = finished(Ok(
            serde_json::json!({"exit_code": 0, "id": 9_007_199_254_740_993_i64}),
        ));
        let Update::Failed(pb::LeaseFailed { error: Some(error) }) = big else {
            panic!("{big:?}");
        };
        assert!(
            error
                .message
                .starts_with("the handler's result cannot be sent: result.id: number is beyond"),
            "{}",
            error.message
        );
        assert!(!error.retryable);
        let failure = TaskFailure {
            message: "exit 3".into(),
            code: "exit_code".into(),
            retryable: true,
            details: serde_json::json!({"inode": u64::MAX}),
            release: None,
        };
        let Update::Failed(pb::LeaseFailed { error: Some(error) }) = finished(Err(failure)) else {
            panic!("a failure stays a failure");
        };
        assert!(
            error
                .message
                .starts_with("exit 3 (details dropped: error.details.inode: number is beyond"),
            "{}",
            error.message
        );
        assert_eq!(error.details, None);
    }

    #[test]
    fn a_session_names_running_leases_and_those_whose_final_report_waits() {
        let running: HashMap<String, Running> = [(
            "l1".to_owned(),
            Running {
                task_id: "t1".into(),
                fencing_token: 1,
                cancel: CancellationToken::new(),
                canceled: false,
            },
        )]
        .into();
        let report = |lease: &str, task: &str, token: u64| pb::LeaseUpdate {
            lease_id: lease.into(),
            task_id: task.into(),
            fencing_token: token,
            update: None,
        };
        // l1's release waits too (a drain): it is named once.
        let finals: BTreeMap<String, pb::LeaseUpdate> = [
            ("l1".to_owned(), report("l1", "t1", 1)),
            ("l2".to_owned(), report("l2", "t2", 7)),
        ]
        .into();
        let held: Vec<(String, String, u64)> = held_leases(&running, &finals)
            .into_iter()
            .map(|h| (h.lease_id, h.task_id, h.fencing_token))
            .collect();
        assert_eq!(
            held,
            [
                ("l1".to_owned(), "t1".to_owned(), 1),
                ("l2".to_owned(), "t2".to_owned(), 7),
            ]
        );
    }
}
