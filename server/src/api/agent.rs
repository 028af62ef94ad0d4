//! `AgentService`: registration and the one `Connect` stream per agent
//! session. The stream's reader applies heartbeats (lease renewal, status,
//! capability diffs against the generation the server holds), lease reports
//! (accepted, started, progress, succeeded, failed, released — each checked
//! against the fencing token) and snapshots; its writer is the bounded queue
//! the dispatcher pushes grants, revocations, acks, resync requests and
//! drains into.

use serde_json::{Value, json};
use switchyard_core::diff;
use switchyard_core::redact;
use switchyard_core::tier::{Tier, merge_tiers};
use switchyard_proto::v1::{
    self as pb, agent_service_server::AgentService, connect_request::Message as Up,
};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::codegen::BoxStream;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};
use uuid::Uuid;

use super::convert::{duration, struct_to_json, timestamp};
use super::{AgentApi, Api, invalid, mapping, namespace, parse_id};
use crate::auth::Need;
use crate::error::Error;
use crate::store::{AgentRegistration, Completion, CompletionOutcome, LeaseReport, ReportKind};

/// Messages of one session read and handled at once (their lease reports
/// go to the store in one group commit).
const MAX_MESSAGES_AT_ONCE: usize = 128;

/// Facts that change on nearly every heartbeat; diffs touching only these
/// are written to the store behind (see [`PERSIST_VOLATILE_MS`]).
const VOLATILE: &[&str] = &["/memory/free", "/memory/available", "/loadavg"];

/// Whether the change a patch made at `at` is to volatile facts only: `at`
/// is at or under a [`VOLATILE`] path, or is above some and nothing but
/// volatile leaves differ below it (an agent may send `/memory` whole).
fn volatile_only(old: &Value, new: &Value, at: &json_patch::jsonptr::Pointer) -> bool {
    /// Whether pointer `path` is `prefix` or below it.
    fn at_or_under(path: &str, prefix: &str) -> bool {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
    fn same_outside(old: Option<&Value>, new: Option<&Value>, at: &str) -> bool {
        if VOLATILE.iter().any(|v| at_or_under(at, v)) {
            return true;
        }
        match (old, new) {
            (Some(Value::Object(a)), Some(Value::Object(b)))
                if VOLATILE.iter().any(|v| at_or_under(v, at)) =>
            {
                a.keys()
                    .chain(b.keys())
                    .all(|k| same_outside(a.get(k), b.get(k), &format!("{at}/{k}")))
            }
            (a, b) => a == b,
        }
    }
    let at = at.as_str();
    same_outside(old.pointer(at), new.pointer(at), at)
}

/// A diff applied to the session's document.
struct AppliedDiff {
    /// What the index matches on.
    document: std::sync::Arc<Value>,
    /// Whether only volatile facts changed (written behind).
    volatile: bool,
    /// Where the document changed, when the index may re-index only there
    /// (`None`: compare the whole document), and the document the patch was
    /// applied to: only if the index still holds that very one does it
    /// differ from the new one just there.
    touched: Option<(std::sync::Arc<Value>, Vec<json_patch::jsonptr::PointerBuf>)>,
}

/// How stale the stored copy of volatile facts may get: a heartbeat writes
/// the document when its last write is older than this.
const PERSIST_VOLATILE_MS: i64 = 60_000;

/// How often a session refreshes the agent's stored last-seen time.
const TOUCH_EVERY_MS: i64 = 30_000;

/// The agent's document with the operator tier merged over it, and the
/// provenance of every leaf: the agent's own (tiers it reported; unknown
/// leaves count as dynamic) overridden by the operator tier's.
pub(crate) fn effective_document(
    reported: &Value,
    agent_provenance: &Value,
    operator: &Value,
) -> (Value, Value) {
    let merged = merge_tiers(
        &[
            (Tier::Dynamic, reported.clone()),
            (Tier::Operator, operator.clone()),
        ],
        &switchyard_core::Limits::default(),
    );
    let mut provenance = serde_json::Map::new();
    for (path, tier) in merged.provenance_entries() {
        let name = if tier == Tier::Operator {
            Tier::Operator.as_str().to_owned()
        } else {
            agent_provenance
                .get(path)
                .and_then(Value::as_str)
                .unwrap_or(Tier::Dynamic.as_str())
                .to_owned()
        };
        provenance.insert(path.to_owned(), Value::String(name));
    }
    (merged.document, Value::Object(provenance))
}

/// What the server does with a reported document before storing it: the
/// limits (INVALID_ARGUMENT naming `field`), and redaction of anything
/// sensitive-looking (reported as rejections, never stored).
fn accept_document(
    api: &Api,
    field: &str,
    doc: &prost_types::Struct,
) -> Result<(Value, Vec<Value>), Status> {
    let mut value =
        struct_to_json(doc).map_err(|e| invalid(&format!("{field}.{}", e.path), e.reason))?;
    if let Some(v) = api.settings.document_limits.violations(&value).first() {
        return Err(invalid(&super::field_path(field, &v.path), &v.reason));
    }
    // The agent's own `sensitive` list (from its static tier) counts too.
    let declared = redact::declared_sensitive(&value);
    let redacted = redact::redact(&mut value, &declared);
    let rejections = redacted
        .into_iter()
        .map(|path| json!({"tier": "", "path": path, "reason": "sensitive value redacted by the server"}))
        .collect();
    Ok((value, rejections))
}

fn provenance_json(entries: &[pb::ProvenanceEntry]) -> Value {
    Value::Object(
        entries
            .iter()
            .filter_map(|e| {
                let tier = mapping::core_tier(pb::Tier::try_from(e.tier).ok()?)?;
                Some((e.path.clone(), Value::String(tier.as_str().to_owned())))
            })
            .collect(),
    )
}

fn rejections_json(rejections: &[pb::Rejection], mut extra: Vec<Value>) -> Value {
    let mut all: Vec<Value> = rejections
        .iter()
        .map(|r| {
            let tier = pb::Tier::try_from(r.tier)
                .ok()
                .and_then(mapping::core_tier)
                .map(Tier::as_str)
                .unwrap_or("");
            json!({"tier": tier, "path": r.path, "reason": r.reason})
        })
        .collect();
    all.append(&mut extra);
    Value::Array(all)
}

fn ack(sequence: u64, code: Code, message: &str, generation: u64) -> pb::ConnectResponse {
    pb::ConnectResponse {
        message: Some(pb::connect_response::Message::Ack(pb::Ack {
            sequence,
            code: code as i32,
            message: message.to_owned(),
            capability_generation: generation,
            leases_expire_at: None,
        })),
    }
}

impl Api {
    /// Whether an agent of this name is registered in the namespace.
    async fn agent_named(&self, namespace: &str, name: &str) -> Result<bool, Status> {
        let (_, names) = self.fleet(namespace).await?;
        Ok(names.values().any(|n| n == name))
    }

    /// An agent the caller may see and steer (operators of its namespace);
    /// agents of other namespaces are NOT_FOUND, like missing ones.
    pub(crate) async fn agent_for(
        &self,
        caller: &crate::auth::Caller,
        id: Uuid,
    ) -> Result<crate::store::AgentRecord, Status> {
        let record = self.store.get_agent(id).await?;
        if !caller.sees(&record.namespace) {
            return Err(Status::not_found(format!("agent {id} not found")));
        }
        caller.require(Need::Fleet, &record.namespace)?;
        Ok(record)
    }
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn register_agent(
        &self,
        request: Request<pb::RegisterAgentRequest>,
    ) -> Result<Response<pb::RegisterAgentResponse>, Status> {
        let api = &self.0;
        let caller = api.caller(&request).await?;
        let req = request.into_inner();
        let namespace = namespace("namespace", &req.namespace)?;
        caller.require(Need::Agent, &namespace)?;
        let cap = api.settings.max_agents_per_namespace;
        if cap > 0 {
            let (_, agents) = api.store.count_in_namespace(&namespace).await?;
            if agents >= cap && !api.agent_named(&namespace, &req.name).await? {
                return Err(Status::resource_exhausted(format!(
                    "namespace {namespace} has {agents} agents; the limit is {cap} (--max-agents-per-namespace)"
                )));
            }
        }
        if req.name.trim().is_empty() || req.name.len() > 253 {
            return Err(invalid("name", "is required, at most 253 bytes"));
        }
        if req.capacity == 0 || req.capacity > 10_000 {
            return Err(invalid("capacity", "must be between 1 and 10000"));
        }
        let doc = req.capabilities.unwrap_or_default();
        let (reported, server_rejections) = accept_document(api, "capabilities", &doc)?;
        let provenance = provenance_json(&req.provenance);
        let rejections = rejections_json(&req.rejections, server_rejections.clone());
        // The operator tier survives re-registration: merge it over the new report.
        let registration = AgentRegistration {
            namespace,
            name: req.name,
            reported: reported.clone(),
            document: reported.clone(),
            provenance: provenance.clone(),
            rejections,
            capacity: req.capacity,
            labels: req.labels.into_iter().collect(),
            runner: req.runner,
        };
        let mut record = api
            .store
            .register_agent(&registration, api.now_ms())
            .await?;
        if record
            .operator_overrides
            .as_object()
            .is_some_and(|m| !m.is_empty())
        {
            let (document, provenance) =
                effective_document(&reported, &provenance, &record.operator_overrides);
            record = api
                .store
                .set_operator_overrides(
                    record.id,
                    record.operator_overrides.clone(),
                    document,
                    provenance,
                    api.now_ms(),
                )
                .await?;
        }
        info!(agent = %record.id, name = %record.name, epoch = record.session_epoch, "agent registered");
        let settings = api.dispatcher.settings();
        Ok(Response::new(pb::RegisterAgentResponse {
            agent_id: record.id.to_string(),
            session_epoch: record.session_epoch,
            heartbeat_interval: Some(duration(settings.heartbeat_interval_ms)),
            lease_ttl: Some(duration(api.settings.default_lease_ttl_ms)),
            capability_generation: record.generation,
            rejections: server_rejections
                .iter()
                .map(|r| pb::Rejection {
                    tier: pb::Tier::Unspecified as i32,
                    path: r["path"].as_str().unwrap_or_default().to_owned(),
                    reason: r["reason"].as_str().unwrap_or_default().to_owned(),
                })
                .collect(),
        }))
    }

    async fn connect(
        &self,
        request: Request<Streaming<pb::ConnectRequest>>,
    ) -> Result<Response<BoxStream<pb::ConnectResponse>>, Status> {
        let api = self.0.clone();
        let caller = api.caller(&request).await?;
        let mut inbound = request.into_inner();
        if api.dispatcher.stopping() {
            return Err(Status::unavailable(
                "server is shutting down; connect to another replica",
            ));
        }
        // The first message must be Hello.
        let first = inbound
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("stream closed before hello"))??;
        let Some(Up::Hello(hello)) = first.message else {
            return Err(invalid(
                "message",
                "the first message on a Connect stream must be hello",
            ));
        };
        let agent_id = parse_id("hello.agent_id", &hello.agent_id)?;
        let record = api.store.get_agent(agent_id).await?;
        if !caller.sees(&record.namespace) {
            return Err(Status::not_found(format!("agent {agent_id} not found")));
        }
        caller.require(Need::Agent, &record.namespace)?;
        if hello.session_epoch != record.session_epoch {
            return Err(Status::failed_precondition(format!(
                "session epoch {} is not the agent's current epoch {}; register again",
                hello.session_epoch, record.session_epoch
            )));
        }
        let epoch = record.session_epoch;
        let now = api.now_ms();

        // Resume what the agent still holds, if the store agrees.
        let mut resumed = Vec::new();
        let mut revoked = Vec::new();
        for held in &hello.held_leases {
            let lease = match parse_id("hello.held_leases.lease_id", &held.lease_id) {
                Ok(id) => api.store.get_lease(id).await.ok(),
                Err(_) => None,
            };
            let valid = lease.as_ref().is_some_and(|l| {
                l.agent_id == agent_id
                    && l.fencing_token == held.fencing_token
                    && matches!(
                        l.state,
                        crate::store::LeaseState::Granted | crate::store::LeaseState::Active
                    )
                    && l.expires_at_ms > now
            });
            if valid {
                resumed.push(held.lease_id.clone());
            } else {
                revoked.push(pb::LeaseRevocation {
                    lease_id: held.lease_id.clone(),
                    task_id: held.task_id.clone(),
                    reason: pb::RevocationReason::UnknownLease as i32,
                    message: "the server no longer holds this lease for the agent".to_owned(),
                });
            }
        }
        if !resumed.is_empty() {
            let acks: Vec<(Uuid, u64)> = hello
                .held_leases
                .iter()
                .filter(|h| resumed.contains(&h.lease_id))
                .filter_map(|h| Some((h.lease_id.parse().ok()?, h.fencing_token)))
                .collect();
            api.store.ack_leases(agent_id, &acks, now).await?;
            api.store.renew_leases(agent_id, now).await?;
        }
        let live = api.store.agent_leases(agent_id).await?;
        // A resumed lease may have ended between the check above and the
        // acknowledgement (another replica's sweeper revoked the grant, or it
        // expired): the agent hears it is gone rather than that it resumed.
        resumed.retain(|id| {
            let still = live.iter().any(|l| l.id.to_string() == *id);
            if !still {
                let held = hello.held_leases.iter().find(|h| h.lease_id == *id);
                revoked.push(pb::LeaseRevocation {
                    lease_id: id.clone(),
                    task_id: held.map(|h| h.task_id.clone()).unwrap_or_default(),
                    reason: pb::RevocationReason::UnknownLease as i32,
                    message: "the server no longer holds this lease for the agent".to_owned(),
                });
            }
            still
        });
        let held_leases_at_connect = !resumed.is_empty();
        // Leases the store holds for this agent that the new session does not:
        // the process that held them is gone (a restart under the same name).
        // Left alone, every heartbeat of the new session would renew them
        // forever; they count as lost attempts and their tasks go back.
        let orphaned: Vec<Completion> = live
            .into_iter()
            .filter(|l| !resumed.contains(&l.id.to_string()))
            .map(|l| Completion {
                lease_id: l.id,
                task_id: l.task_id,
                agent_id,
                fencing_token: l.fencing_token,
                outcome: CompletionOutcome::Failed {
                    error: json!({"message": "the agent reconnected without this lease (restarted?)",
                                  "code": "lease_lost", "retryable": true}),
                    retryable: true,
                },
            })
            .collect();
        if !orphaned.is_empty() {
            warn!(agent = %agent_id, leases = orphaned.len(), "new session does not hold its leases; counting them lost");
            api.store.complete_leases(&orphaned, now).await?;
            api.dispatcher.wake();
        }
        api.store
            .set_agent_status(agent_id, "ready", &[], Some(epoch), now)
            .await?;
        let record = api.store.get_agent(agent_id).await?;

        let (tx, rx) = mpsc::channel(api.dispatcher.settings().stream_queue);
        let welcome = pb::ConnectResponse {
            message: Some(pb::connect_response::Message::Welcome(pb::Welcome {
                capability_generation: record.generation,
                resumed_lease_ids: resumed,
                revoked,
                heartbeat_interval: Some(duration(api.dispatcher.settings().heartbeat_interval_ms)),
            })),
        };
        tx.try_send(Box::new(welcome))
            .map_err(|_| Status::internal("session queue"))?;
        let close = std::sync::Arc::new(tokio::sync::Notify::new());
        let changed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut view = mapping::agent_view(&record);
        let crate::store::AgentRecord {
            generation,
            reported,
            document,
            provenance,
            operator_overrides,
            status,
            status_reasons,
            ..
        } = record;
        // With no operator tier over it, the index matches on the agent's
        // own document: one copy, shared by the session and the index.
        let reported = std::sync::Arc::new(reported);
        if document == *reported {
            view.document = reported.clone();
        }
        drop(document);
        let mut session = Session {
            api: api.clone(),
            agent_id,
            epoch,
            tx: tx.clone(),
            generation,
            persisted: generation,
            persisted_at_ms: api.now_ms(),
            touched_at_ms: api.now_ms(),
            held_leases_at_connect,
            changed: changed.clone(),
            reported,
            provenance,
            operator_overrides,
            status,
            status_reasons,
        };
        if !api
            .dispatcher
            .attach(agent_id, epoch, tx, close.clone(), changed, view)
        {
            return Err(Status::failed_precondition(
                "a newer session of this agent is connected",
            ));
        }
        info!(agent = %agent_id, epoch, "agent connected");

        let span = info_span!("session", agent = %agent_id, epoch);
        tokio::spawn(
            async move {
                let mut ended = false;
                while !ended {
                    let first = tokio::select! {
                        message = inbound.next() => message,
                        () = close.notified() => break,
                    };
                    // What the agent sent meanwhile is handled together, so
                    // its lease reports share one group commit.
                    let mut messages = Vec::new();
                    let mut next = first;
                    loop {
                        match next {
                            Some(Ok(message)) => messages.push(message),
                            Some(Err(status)) => {
                                debug!(%status, "agent stream ended with an error");
                                ended = true;
                                break;
                            }
                            None => {
                                ended = true;
                                break;
                            }
                        }
                        if messages.len() >= MAX_MESSAGES_AT_ONCE {
                            break;
                        }
                        match ready_now(&mut inbound) {
                            Some(message) => next = message,
                            None => break,
                        }
                    }
                    if !api.dispatcher.is_current(agent_id, epoch) {
                        break;
                    }
                    if messages.is_empty() {
                        continue;
                    }
                    api.dispatcher.touch(agent_id);
                    if let Err(err) = session.handle_all(messages).await {
                        warn!(cause = %err, "session message failed");
                    }
                }
                if api.dispatcher.detach(agent_id, epoch) {
                    let _ = api
                        .store
                        .set_agent_status(agent_id, "offline", &[], Some(epoch), api.now_ms())
                        .await;
                    info!("agent disconnected; offline (its leases run out their TTL)");
                    // Grants it never acknowledged go back to the queue at
                    // once; the sweeper would revoke them after the ack window.
                    if let Err(err) = api.dispatcher.revoke_unacked_of(agent_id).await {
                        warn!(cause = %err, "revoking the departed agent's unacknowledged grants failed; the sweeper will");
                    }
                }
            }
            .instrument(span),
        );
        // Boxed items keep the channel's preallocated slots small: a
        // `ConnectResponse` inline is most of a kilobyte, 32 to a block.
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            |m| Ok(*m),
        ))))
    }
}

/// The stream's next item if it is already there, without waiting.
fn ready_now<S: tokio_stream::Stream + Unpin>(stream: &mut S) -> Option<Option<S::Item>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::Pin::new(stream).poll_next(&mut cx) {
        std::task::Poll::Ready(item) => Some(item),
        std::task::Poll::Pending => None,
    }
}

/// One agent session's inbound handling.
struct Session {
    api: Api,
    agent_id: Uuid,
    epoch: u64,
    tx: crate::dispatch::SessionSender,
    /// The generation of the document the server holds for this agent
    /// (the base of the agent's next diff); counts every applied diff.
    generation: u64,
    /// The generation last written to the store, and when. Diffs that
    /// change only volatile facts (free memory, load) are written behind:
    /// at most every [`PERSIST_VOLATILE_MS`], and at once with any other
    /// change. Matching on this replica always sees the latest.
    persisted: u64,
    persisted_at_ms: i64,
    /// When the stored last-seen time was last refreshed.
    touched_at_ms: i64,
    /// The agent resumed leases at connect: renew on the first heartbeat
    /// whatever the index says.
    held_leases_at_connect: bool,
    /// Set by the dispatcher when the stored agent changed under the
    /// session (an operator change): reload before the next diff.
    changed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The agent's own tiers at `generation` (diffs apply to it). Shared
    /// with the dispatcher's index when no operator tier is merged over it.
    reported: std::sync::Arc<Value>,
    /// The provenance stored with it.
    provenance: Value,
    /// The operator tier, merged over every new document.
    operator_overrides: Value,
    /// The status and reasons last written for this session.
    status: String,
    status_reasons: Vec<String>,
}

impl Session {
    async fn send(&self, message: pb::ConnectResponse) {
        // A full queue means the agent is not reading; the message is
        // dropped and the sweeper's timeouts take over.
        let _ = self.tx.try_send(Box::new(message));
    }

    /// Handles messages in order; consecutive lease reports are applied
    /// together (one group commit) before the next other message.
    async fn handle_all(&mut self, messages: Vec<pb::ConnectRequest>) -> Result<(), Status> {
        let mut reports: Vec<(u64, LeaseReport)> = Vec::new();
        let mut outcome = Ok(());
        for request in messages {
            if let Some(Up::LeaseUpdate(update)) = request.message {
                match self.to_report(update) {
                    Ok(report) => reports.push((request.sequence, report)),
                    Err(status) => {
                        let reply = ack(
                            request.sequence,
                            status.code(),
                            status.message(),
                            self.generation,
                        );
                        self.send(reply).await;
                    }
                }
                continue;
            }
            self.flush_reports(std::mem::take(&mut reports)).await;
            if let Err(status) = self.handle(request).await {
                outcome = Err(status);
            }
        }
        self.flush_reports(reports).await;
        outcome
    }

    /// Applies lease reports and acknowledges each. A slot a final report
    /// freed is handed back to the dispatcher only after its
    /// acknowledgement is queued: the agent counts the lease as held until
    /// it hears the answer, and must not see a grant for the slot first.
    async fn flush_reports(&mut self, reports: Vec<(u64, LeaseReport)>) {
        if reports.is_empty() {
            return;
        }
        let (sequences, reports): (Vec<u64>, Vec<LeaseReport>) = reports.into_iter().unzip();
        match self.api.dispatcher.report(reports).await {
            Ok(results) => {
                let mut ended = 0;
                for (sequence, result) in sequences.into_iter().zip(results) {
                    let reply = match result {
                        Ok(applied) => {
                            ended += usize::from(applied.ended);
                            ack(sequence, Code::Ok, "", self.generation)
                        }
                        Err(err) => {
                            let status = Status::from(err);
                            ack(sequence, status.code(), status.message(), self.generation)
                        }
                    };
                    self.send(reply).await;
                }
                for _ in 0..ended {
                    self.api.dispatcher.lease_ended(self.agent_id);
                }
            }
            Err(status) => {
                warn!(%status, "lease reports failed");
                for sequence in sequences {
                    let reply = ack(sequence, status.code(), status.message(), self.generation);
                    self.send(reply).await;
                }
            }
        }
    }

    async fn handle(&mut self, request: pb::ConnectRequest) -> Result<(), Status> {
        let sequence = request.sequence;
        let now = self.api.now_ms();
        let reply = match request.message {
            None => Ok(ack(
                sequence,
                Code::InvalidArgument,
                "message: empty",
                self.generation,
            )),
            Some(Up::Hello(_)) => Ok(ack(
                sequence,
                Code::InvalidArgument,
                "message: hello is only the first message",
                self.generation,
            )),
            Some(Up::Heartbeat(heartbeat)) => self.heartbeat(sequence, heartbeat, now).await,
            // `handle_all` batches lease updates; one on its own goes the same way.
            Some(Up::LeaseUpdate(update)) => match self.to_report(update) {
                Ok(report) => {
                    self.flush_reports(vec![(sequence, report)]).await;
                    return Ok(());
                }
                Err(status) => Ok(ack(
                    sequence,
                    status.code(),
                    status.message(),
                    self.generation,
                )),
            },
            Some(Up::CapabilitySnapshot(snapshot)) => self.snapshot(sequence, snapshot, now).await,
        };
        // A store failure still gets an answer (e.g. UNAVAILABLE), never silence.
        let (reply, outcome) = match reply {
            Ok(reply) => (reply, Ok(())),
            Err(err) => {
                let status = Status::from(err);
                (
                    ack(sequence, status.code(), status.message(), self.generation),
                    Err(status),
                )
            }
        };
        self.send(reply).await;
        outcome
    }

    /// Takes what the session holds from a stored record (at connect, and
    /// after a snapshot or a lost compare-and-set).
    fn load(&mut self, record: &crate::store::AgentRecord) {
        self.generation = record.generation;
        self.persisted = record.generation;
        self.persisted_at_ms = self.api.now_ms();
        self.reported = std::sync::Arc::new(record.reported.clone());
        self.provenance = record.provenance.clone();
        self.operator_overrides = record.operator_overrides.clone();
        self.status = record.status.clone();
        self.status_reasons = record.status_reasons.clone();
    }

    /// A heartbeat: the diff is applied to the document the session holds,
    /// and the renewal, status and document are written in one group
    /// commit with other sessions' heartbeats (no store read on the way).
    async fn heartbeat(
        &mut self,
        sequence: u64,
        hb: pb::Heartbeat,
        now: i64,
    ) -> Result<pb::ConnectResponse, Error> {
        let status = match pb::AgentStatus::try_from(hb.status) {
            Ok(pb::AgentStatus::Degraded) => "degraded",
            Ok(pb::AgentStatus::Draining) => "draining",
            Ok(pb::AgentStatus::Ready | pb::AgentStatus::Unspecified) => "ready",
            Ok(pb::AgentStatus::Offline) | Err(_) => {
                return Ok(ack(
                    sequence,
                    Code::InvalidArgument,
                    "heartbeat.status: must be READY, DEGRADED or DRAINING",
                    self.generation,
                ));
            }
        };
        if self
            .changed
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            // An operator changed the stored agent: start from what is
            // stored (a diff based on the old generation then resyncs).
            let record = self.api.store.get_agent(self.agent_id).await?;
            self.load(&record);
        }
        let status_change = (self.status != status || self.status_reasons != hb.status_reasons)
            .then(|| (status.to_owned(), hb.status_reasons.clone()));
        let mut resync = None;
        let mut durable_change = status_change.is_some();
        if let Some(d) = hb.capability_diff {
            match self.apply_diff(d) {
                Ok(applied) => {
                    durable_change |= !applied.volatile;
                    self.api.dispatcher.replace_document(
                        self.agent_id,
                        applied.document,
                        applied
                            .touched
                            .as_ref()
                            .map(|(from, at)| (from, at.as_slice())),
                    );
                }
                Err(reason) => resync = Some(reason),
            }
        }
        let due = now - self.persisted_at_ms >= PERSIST_VOLATILE_MS;
        let write = (self.generation != self.persisted && (durable_change || due))
            .then(|| self.document_write());
        // Leases are renewed while the agent holds any (by this replica's
        // count, reservations included); the stored last-seen time is
        // refreshed now and then: liveness is judged in memory.
        let renew = self
            .api
            .dispatcher
            .view(self.agent_id)
            .is_none_or(|v| v.active_leases > 0)
            || self.held_leases_at_connect;
        let touch = now - self.touched_at_ms >= TOUCH_EVERY_MS;
        let beat = crate::store::Beat {
            agent_id: self.agent_id,
            session_epoch: self.epoch,
            renew,
            touch,
            status: status_change.clone(),
            document: write,
        };
        let applied = match self.api.dispatcher.heartbeat(beat).await {
            Ok(applied) => applied,
            // The batch failed (the store): the agent hears why.
            Err(status) => {
                return Ok(ack(
                    sequence,
                    status.code(),
                    status.message(),
                    self.generation,
                ));
            }
        };
        if touch {
            self.touched_at_ms = now;
        }
        self.held_leases_at_connect = false;
        let mut document_changed = false;
        match applied {
            crate::store::BeatApplied::Written(generation) => {
                self.persisted = generation;
                self.persisted_at_ms = now;
                document_changed = true;
            }
            crate::store::BeatApplied::Stale(held) => {
                // An operator changed the document meanwhile: start over
                // from what is stored.
                let record = self.api.store.get_agent(self.agent_id).await?;
                self.load(&record);
                resync = Some((
                    format!("document changed concurrently (generation {held})"),
                    held,
                ));
            }
            crate::store::BeatApplied::Renewed => {}
        }
        if let Some((status, reasons)) = status_change {
            self.status = status;
            self.status_reasons = reasons;
            // Rare: re-read the record (an operator drain keeps it draining).
            if let Some(mut view) = self.api.dispatcher.view(self.agent_id) {
                let record = self.api.store.get_agent(self.agent_id).await?;
                let fresh = mapping::agent_view(&record);
                view.status = fresh.status;
                if !document_changed {
                    view.document = fresh.document;
                }
                self.api.dispatcher.update_view(view);
            }
        }
        if let Some((reason, generation)) = resync {
            self.send(pb::ConnectResponse {
                message: Some(pb::connect_response::Message::ResyncRequest(
                    pb::ResyncRequest {
                        server_generation: generation,
                        reason,
                    },
                )),
            })
            .await;
        }
        let mut reply = ack(sequence, Code::Ok, "", self.generation);
        if let Some(pb::connect_response::Message::Ack(a)) = &mut reply.message {
            a.leases_expire_at = Some(timestamp(now + self.api.settings.default_lease_ttl_ms));
        }
        Ok(reply)
    }

    /// Applies a diff to the document the session holds (a new generation)
    /// and returns the merged document for the matcher and whether the
    /// diff touched only volatile facts; or why it does not apply (and the
    /// generation to resync from).
    fn apply_diff(&mut self, d: pb::CapabilityDiff) -> Result<AppliedDiff, (String, u64)> {
        let patch = super::convert::patch_from_proto(&d.operations)
            .map_err(|reason| (reason, self.generation))?;
        let mut next = diff::apply(
            &self.reported,
            self.generation,
            d.base_generation,
            &patch,
            &self.api.settings.document_limits,
        )
        .map_err(|err| (err.to_string(), self.generation))?;
        let touched = diff::touched(&patch);
        let declared = redact::declared_sensitive(&next);
        // What the patch did not touch was redacted when it arrived; the
        // `sensitive` declaration changing means everything is looked at.
        let declaration_touched = touched.iter().any(|p| {
            p.first()
                .is_none_or(|t| t.decoded().as_ref() == "sensitive")
        });
        let redacted = if declaration_touched {
            redact::redact(&mut next, &declared)
        } else {
            redact::redact_at(&mut next, touched.iter().copied(), &declared)
        };
        if !redacted.is_empty() {
            warn!(paths = ?redacted, "sensitive values in a capability diff were redacted");
        }
        let volatile = touched
            .iter()
            .all(|p| volatile_only(&self.reported, &next, p));
        let no_overrides = self
            .operator_overrides
            .as_object()
            .is_none_or(serde_json::Map::is_empty);
        let next = std::sync::Arc::new(next);
        let applied = if volatile && no_overrides {
            // The common heartbeat: leaves replaced in place, provenance
            // unchanged, nothing to merge over them: the index shares the
            // session's document and re-indexes only what was touched.
            AppliedDiff {
                document: next.clone(),
                volatile,
                touched: Some((
                    self.reported.clone(),
                    touched.iter().map(|p| p.to_buf()).collect(),
                )),
            }
        } else {
            let (document, provenance) =
                effective_document(&next, &self.provenance, &self.operator_overrides);
            self.provenance = provenance;
            AppliedDiff {
                document: std::sync::Arc::new(document),
                volatile,
                touched: None,
            }
        };
        self.reported = next;
        self.generation += 1;
        Ok(applied)
    }

    /// The document the session holds, to write at its generation.
    fn document_write(&self) -> crate::store::DocumentWrite {
        let (document, provenance) =
            effective_document(&self.reported, &self.provenance, &self.operator_overrides);
        crate::store::DocumentWrite {
            expected_generation: self.persisted,
            generation: self.generation,
            reported: (*self.reported).clone(),
            document,
            provenance,
        }
    }

    async fn snapshot(
        &mut self,
        sequence: u64,
        s: pb::CapabilitySnapshot,
        now: i64,
    ) -> Result<pb::ConnectResponse, Error> {
        let doc = s.capabilities.unwrap_or_default();
        let (reported, server_rejections) =
            match accept_document(&self.api, "capability_snapshot.capabilities", &doc) {
                Ok(x) => x,
                Err(status) => {
                    return Ok(ack(
                        sequence,
                        Code::InvalidArgument,
                        status.message(),
                        self.generation,
                    ));
                }
            };
        let record = self.api.store.get_agent(self.agent_id).await?;
        let provenance = provenance_json(&s.provenance);
        let (document, effective_provenance) =
            effective_document(&reported, &provenance, &record.operator_overrides);
        let generation = self
            .api
            .store
            .update_agent_document(
                self.agent_id,
                record.generation,
                reported,
                document,
                effective_provenance,
                rejections_json(&s.rejections, server_rejections),
                now,
            )
            .await?;
        let record = self.api.store.get_agent(self.agent_id).await?;
        self.load(&record);
        self.generation = generation;
        if let Some(mut view) = self.api.dispatcher.view(self.agent_id) {
            view.document = mapping::agent_view(&record).document;
            self.api.dispatcher.update_view(view);
        }
        Ok(ack(sequence, Code::Ok, "", generation))
    }

    /// A lease update as a store report, validated (INVALID_ARGUMENT naming
    /// the field otherwise).
    fn to_report(&self, u: pb::LeaseUpdate) -> Result<LeaseReport, Status> {
        use pb::lease_update::Update;
        let lease_id = parse_id("lease_update.lease_id", &u.lease_id)?;
        let task_id = parse_id("lease_update.task_id", &u.task_id)?;
        let kind = match u.update {
            None => return Err(invalid("lease_update.update", "empty")),
            Some(Update::Accepted(_)) => ReportKind::Accepted,
            Some(Update::Started(_)) => ReportKind::Started,
            Some(Update::Progress(p)) => ReportKind::Progress(
                json!({"percent": p.percent, "message": p.message, "reported_at_ms": self.api.now_ms()}),
            ),
            Some(Update::Succeeded(s)) => {
                let result = match &s.result {
                    Some(r) => struct_to_json(r).map_err(|e| {
                        invalid(
                            &format!("lease_update.succeeded.result.{}", e.path),
                            e.reason,
                        )
                    })?,
                    None => json!({}),
                };
                if let Some(v) = self
                    .api
                    .settings
                    .document_limits
                    .violations(&result)
                    .first()
                {
                    return Err(invalid(
                        &format!("lease_update.succeeded.result.{}", v.path),
                        &v.reason,
                    ));
                }
                ReportKind::Final(CompletionOutcome::Succeeded { result })
            }
            Some(Update::Failed(f)) => {
                let e = f.error.unwrap_or_default();
                let details = match &e.details {
                    Some(d) => struct_to_json(d)
                        .map_err(|err| invalid("lease_update.failed.error.details", err.reason))?,
                    None => Value::Null,
                };
                let error = json!({"message": e.message, "code": e.code, "retryable": e.retryable, "details": details});
                ReportKind::Final(CompletionOutcome::Failed {
                    error,
                    retryable: e.retryable,
                })
            }
            Some(Update::Released(r)) => {
                ReportKind::Final(CompletionOutcome::Released { reason: r.reason })
            }
        };
        Ok(LeaseReport {
            lease_id,
            task_id,
            agent_id: self.agent_id,
            fencing_token: u.fencing_token,
            kind,
        })
    }
}
