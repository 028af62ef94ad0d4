//! The agent's life with the server: register, hold one `Connect` stream,
//! heartbeat at the server's interval with JSON-Patch diffs of the
//! capability document, run what it is leased, and report. When the stream
//! breaks it reconnects with jittered exponential backoff and resumes the
//! leases it still holds (running work is not interrupted); reports not yet
//! acknowledged are sent again (final reports are idempotent on the
//! server). On shutdown it drains: it takes nothing new, lets running leases
//! finish within the grace period, releases the rest, and returns.

use std::collections::{BTreeMap, HashMap};
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
use crate::handler::{Handlers, Progress, TaskContext, TaskFailure};
use switchyard_proto::convert::{
    json_to_struct, patch_to_proto, struct_to_json_lossy as struct_to_json,
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
}

/// State that outlives a session.
struct AgentState {
    config: AgentConfig,
    handlers: Handlers,
    caps: Capabilities,
    running: HashMap<String, Running>,
    /// Final reports not yet acknowledged, by lease id.
    unacked_finals: BTreeMap<String, pb::LeaseUpdate>,
    work_tx: mpsc::UnboundedSender<WorkEvent>,
    work_rx: mpsc::UnboundedReceiver<WorkEvent>,
    draining: bool,
    /// When running leases must be released (set when draining begins,
    /// whether connected or not).
    grace_deadline: Option<tokio::time::Instant>,
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
    let endpoint = switchyard_proto::client::endpoint(&state.config.server, &state.config.tls)
        .map_err(|e| anyhow::anyhow!(e))?;
    let channel: Channel = endpoint
        .connect()
        .await
        .with_context(|| format!("connecting to {}", state.config.server))?;
    let auth = auth(state.config.token.as_deref())?;
    let mut client = AgentServiceClient::new(channel);

    state.caps.refresh(false).await;
    let reg = client
        .register_agent(with_auth(
            pb::RegisterAgentRequest {
                name: state.config.name.clone(),
                namespace: state.config.namespace.clone(),
                capabilities: Some(json_to_struct(state.caps.document())),
                capacity: state.config.capacity,
                labels: state.config.labels.clone().into_iter().collect(),
                provenance: provenance(state),
                rejections: rejections(state),
                runner: format!("switchyard-agent/{} (rust)", env!("CARGO_PKG_VERSION")),
            },
            &auth,
        ))
        .await
        .context("registering")?
        .into_inner();
    let mut generation = reg.capability_generation;
    let mut sent_doc = state.caps.document().clone();
    let interval = reg
        .heartbeat_interval
        .map(|d| {
            Duration::from_millis(
                (d.seconds * 1000 + i64::from(d.nanos) / 1_000_000).max(100) as u64
            )
        })
        .unwrap_or(Duration::from_secs(5));

    let (out_tx, out_rx) = mpsc::channel::<pb::ConnectRequest>(256);
    let mut sequence = 0u64;
    let mut send = |message: Up| {
        sequence += 1;
        let seq = sequence;
        let tx = out_tx.clone();
        async move {
            let _ = tx
                .send(pb::ConnectRequest {
                    sequence: seq,
                    message: Some(message),
                })
                .await;
            seq
        }
    };
    let held: Vec<pb::HeldLease> = state
        .running
        .iter()
        .map(|(lease_id, r)| pb::HeldLease {
            lease_id: lease_id.clone(),
            task_id: r.task_id.clone(),
            fencing_token: r.fencing_token,
        })
        .collect();
    send(Up::Hello(pb::Hello {
        agent_id: reg.agent_id.clone(),
        session_epoch: reg.session_epoch,
        held_leases: held,
    }))
    .await;
    let mut inbound = client
        .connect(with_auth(
            tokio_stream::wrappers::ReceiverStream::new(out_rx),
            &auth,
        ))
        .await
        .context("opening the session stream")?
        .into_inner();
    info!(agent = %reg.agent_id, epoch = reg.session_epoch, "connected");

    // Resend final reports the previous session did not see acknowledged.
    let mut final_seqs: HashMap<u64, String> = HashMap::new();
    for (lease_id, update) in state.unacked_finals.clone() {
        let seq = send(Up::LeaseUpdate(update)).await;
        final_seqs.insert(seq, lease_id);
    }

    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refresh = tokio::time::interval(state.config.refresh);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    refresh.tick().await;
    let mut redetect = tokio::time::interval(state.config.redetect);
    redetect.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    redetect.tick().await;
    // A diff or snapshot in flight: (sequence, the document it carries).
    let mut pending_doc: Option<(u64, Value)> = None;
    let grace_sleep = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(grace_sleep);
    if let Some(deadline) = state.grace_deadline {
        grace_sleep.as_mut().reset(deadline);
    }
    // After the grace period: how long releases get to be acknowledged.
    let mut releasing = false;
    let give_up = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(give_up);

    loop {
        if state.draining && state.running.is_empty() && state.unacked_finals.is_empty() {
            info!("drained: nothing left to run or report");
            return Ok(SessionEnd::Stopped);
        }
        tokio::select! {
            () = shutdown.cancelled(), if !state.draining => {
                info!(running = state.running.len(), "shutting down: draining");
                state.draining = true;
                let deadline = tokio::time::Instant::now() + state.config.grace;
                state.grace_deadline = Some(deadline);
                grace_sleep.as_mut().reset(deadline);
                send(Up::Heartbeat(pb::Heartbeat { status: pb::AgentStatus::Draining as i32, status_reasons: vec!["agent shutting down".into()], load: None, capability_diff: None })).await;
            }
            () = &mut grace_sleep, if state.grace_deadline.is_some() && !releasing => {
                warn!(running = state.running.len(), "grace period over: releasing what is still running");
                for (lease_id, r) in state.running.drain() {
                    r.cancel.cancel();
                    let report = pb::LeaseUpdate { lease_id: lease_id.clone(), task_id: r.task_id, fencing_token: r.fencing_token, update: Some(Update::Released(pb::LeaseReleased { reason: "agent shut down".into() })) };
                    state.unacked_finals.insert(lease_id.clone(), report.clone());
                    let seq = send(Up::LeaseUpdate(report)).await;
                    final_seqs.insert(seq, lease_id);
                }
                // Wait (bounded) for the releases to be acknowledged.
                releasing = true;
                give_up.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs(3));
            }
            () = &mut give_up, if releasing => {
                warn!(unacknowledged = state.unacked_finals.len(), "releases not acknowledged in time; stopping");
                return Ok(SessionEnd::Stopped);
            }
            _ = refresh.tick() => {
                state.caps.refresh(false).await;
            }
            _ = redetect.tick() => {
                state.caps.redetect().await;
            }
            _ = ticker.tick() => {
                let status = if state.draining {
                    pb::AgentStatus::Draining
                } else if state.caps.unhealthy().is_empty() {
                    pb::AgentStatus::Ready
                } else {
                    pb::AgentStatus::Degraded
                };
                let reasons = if state.draining { vec!["agent shutting down".to_owned()] } else { state.caps.unhealthy().to_vec() };
                let mut diff = None;
                if pending_doc.is_none() && state.caps.document() != &sent_doc {
                    // The core's diff: the smaller of per-member operations and
                    // whole-object replaces, so a memory/load change stays tiny.
                    let patch = switchyard_core::diff::diff(&sent_doc, state.caps.document());
                    diff = Some((pb::CapabilityDiff { base_generation: generation, operations: patch_to_proto(&patch) }, state.caps.document().clone()));
                }
                let seq = send(Up::Heartbeat(pb::Heartbeat {
                    status: status as i32,
                    status_reasons: reasons,
                    load: Some(pb::AgentLoad { running_leases: u32::try_from(state.running.len()).unwrap_or(u32::MAX), load_average: state.caps.document().pointer("/loadavg/1min").and_then(Value::as_f64).unwrap_or(0.0) }),
                    capability_diff: diff.as_ref().map(|d| d.0.clone()),
                })).await;
                if let Some((_, doc)) = diff {
                    pending_doc = Some((seq, doc));
                }
            }
            Some(event) = state.work_rx.recv() => {
                match event {
                    WorkEvent::Progress { lease_id, progress } => {
                        if let Some(r) = state.running.get(&lease_id) {
                            send(Up::LeaseUpdate(pb::LeaseUpdate { lease_id, task_id: r.task_id.clone(), fencing_token: r.fencing_token, update: Some(Update::Progress(pb::TaskProgress { percent: progress.percent, message: progress.message, reported_at: None })) })).await;
                        }
                    }
                    WorkEvent::Done { lease_id, outcome } => {
                        let Some(r) = state.running.remove(&lease_id) else { continue };
                        let update = if r.canceled {
                            Update::Released(pb::LeaseReleased { reason: "canceled by the server".into() })
                        } else {
                            match outcome {
                                Ok(result) => Update::Succeeded(pb::LeaseSucceeded { result: Some(json_to_struct(&result)) }),
                                Err(f) => Update::Failed(pb::LeaseFailed { error: Some(pb::TaskError { message: f.message, code: f.code, retryable: f.retryable, details: f.details.is_object().then(|| json_to_struct(&f.details)) }) }),
                            }
                        };
                        let report = pb::LeaseUpdate { lease_id: lease_id.clone(), task_id: r.task_id, fencing_token: r.fencing_token, update: Some(update) };
                        state.unacked_finals.insert(lease_id.clone(), report.clone());
                        let seq = send(Up::LeaseUpdate(report)).await;
                        final_seqs.insert(seq, lease_id);
                    }
                }
            }
            message = inbound.next() => {
                let message = match message {
                    Some(Ok(m)) => m,
                    Some(Err(status)) => anyhow::bail!("session stream failed: {status}"),
                    None => anyhow::bail!("server closed the session stream"),
                };
                match message.message {
                    Some(Down::Welcome(w)) => {
                        generation = w.capability_generation;
                        for r in w.revoked {
                            if let Some(running) = state.running.remove(&r.lease_id) {
                                warn!(lease = %r.lease_id, "server no longer knows a held lease; stopping it");
                                running.cancel.cancel();
                            }
                        }
                    }
                    Some(Down::LeaseGrant(grant)) => {
                        let Some(task) = grant.task.clone() else { continue };
                        let refuse = if state.draining {
                            Some("agent is draining".to_owned())
                        } else if state.running.len() >= state.config.capacity as usize {
                            Some("agent at capacity".to_owned())
                        } else if state.handlers.get(&task.kind).is_none() {
                            Some(format!("no handler for kind {}", task.kind))
                        } else {
                            None
                        };
                        if let Some(reason) = refuse {
                            debug!(lease = %grant.lease_id, %reason, "releasing a grant");
                            send(Up::LeaseUpdate(pb::LeaseUpdate { lease_id: grant.lease_id, task_id: task.task_id, fencing_token: grant.fencing_token, update: Some(Update::Released(pb::LeaseReleased { reason })) })).await;
                            continue;
                        }
                        send(Up::LeaseUpdate(pb::LeaseUpdate { lease_id: grant.lease_id.clone(), task_id: task.task_id.clone(), fencing_token: grant.fencing_token, update: Some(Update::Accepted(pb::LeaseAccepted {})) })).await;
                        send(Up::LeaseUpdate(pb::LeaseUpdate { lease_id: grant.lease_id.clone(), task_id: task.task_id.clone(), fencing_token: grant.fencing_token, update: Some(Update::Started(pb::LeaseStarted {})) })).await;
                        start_work(state, &grant, &task);
                    }
                    Some(Down::LeaseRevocation(revocation)) => {
                        let canceled = revocation.reason() == pb::RevocationReason::Canceled;
                        if let Some(running) = state.running.get_mut(&revocation.lease_id) {
                            info!(lease = %revocation.lease_id, reason = ?revocation.reason(), "lease revoked; stopping its work");
                            running.canceled = canceled;
                            running.cancel.cancel();
                            if !canceled {
                                // Expired or superseded: nothing to report.
                                state.running.remove(&revocation.lease_id);
                            }
                        }
                    }
                    Some(Down::Ack(ack)) => {
                        if let Some((seq, doc)) = &pending_doc
                            && *seq == ack.sequence
                        {
                            if ack.code == 0 && ack.capability_generation != generation {
                                generation = ack.capability_generation;
                                sent_doc = doc.clone();
                            }
                            pending_doc = None;
                        } else if pending_doc.is_none() && ack.code == 0 {
                            // An operator change moves the generation too; the
                            // next diff must name the one the server holds.
                            generation = ack.capability_generation;
                        }
                        if let Some(lease_id) = final_seqs.remove(&ack.sequence) {
                            if ack.code != 0 {
                                warn!(lease = %lease_id, code = ack.code, message = %ack.message, "final report refused");
                            }
                            state.unacked_finals.remove(&lease_id);
                        } else if ack.code != 0 {
                            debug!(sequence = ack.sequence, code = ack.code, message = %ack.message, "message refused");
                        }
                    }
                    Some(Down::ResyncRequest(resync)) => {
                        info!(reason = %resync.reason, "server asked for the full document");
                        let doc = state.caps.document().clone();
                        let seq = send(Up::CapabilitySnapshot(pb::CapabilitySnapshot { capabilities: Some(json_to_struct(&doc)), provenance: provenance(state), rejections: rejections(state) })).await;
                        generation = resync.server_generation;
                        pending_doc = Some((seq, doc));
                    }
                    Some(Down::Drain(drain)) => {
                        info!(reason = %drain.reason, "server drained this session");
                        let after = drain.reconnect_after.map_or(Duration::from_secs(1), |d| Duration::from_millis((d.seconds * 1000 + i64::from(d.nanos) / 1_000_000).max(0) as u64));
                        return Ok(SessionEnd::Reconnect(after));
                    }
                    None => {}
                }
            }
        }
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
    );
    let work = state.work_tx.clone();
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
        let _ = work.send(WorkEvent::Done { lease_id, outcome });
    });
}
