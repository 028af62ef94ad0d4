//! One agent session's reader: it attaches to the dispatcher, then reads
//! the stream and hands each message to the module of its kind
//! (heartbeats, lease reports, snapshots), until the stream ends, the
//! session is superseded, or the server shuts down; then it detaches, and
//! if it was still the agent's current session, marks the agent OFFLINE
//! and revokes the grants it never acknowledged.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use json_patch::jsonptr::PointerBuf;
use serde_json::Value;
use switchyard_core::limits::serialized_len;
use switchyard_proto::v1::{self as pb, connect_request::Message as Up};
use tokio::sync::{Notify, mpsc};
use tokio_stream::StreamExt;
use tonic::{Code, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};
use uuid::Uuid;

use super::hello::Opened;
use crate::api::Api;
use crate::dispatch::sessions::Attach;
use crate::dispatch::{SessionId, SessionSender};
use crate::error::{Error, Result};
use crate::model::{AgentRecord, AgentStatus, LeaseReport};
use crate::store::Following;
use crate::wire::session::{self as down, ack};

/// Messages of one session read and handled at once (their lease reports
/// go to the store in one group commit).
const MAX_MESSAGES_AT_ONCE: usize = 128;

/// The outbound half of a session, as the handler returns it.
pub(super) type Outbound = mpsc::Receiver<Box<pb::ConnectResponse>>;

/// One agent session's inbound handling.
pub(super) struct Session {
    pub(super) api: Api,
    pub(super) agent_id: Uuid,
    pub(super) epoch: u64,
    tx: SessionSender,
    /// The generation of the document the server holds for this agent
    /// (the base of the agent's next diff); counts every applied diff.
    pub(super) generation: u64,
    /// The generation last written to the store, and when. Diffs that
    /// change only volatile facts (free memory, load) are written behind:
    /// at most every `PERSIST_VOLATILE_MS`, and at once with any other
    /// change. Matching on this replica always sees the latest.
    pub(super) persisted: u64,
    pub(super) persisted_at_ms: i64,
    /// When the stored last-seen time was last refreshed.
    pub(super) touched_at_ms: i64,
    /// The agent resumed leases at connect: renew on the first heartbeat
    /// whatever the index says.
    pub(super) held_leases_at_connect: bool,
    /// Set by the dispatcher when the stored agent changed under the
    /// session (an operator change): reload before the next diff.
    pub(super) changed: Arc<AtomicBool>,
    /// The other replicas' events, read while the session lasts.
    _following: Following,
    /// The agent's own tiers at `generation` (diffs apply to it). Shared
    /// with the dispatcher's index when no operator tier is merged over it.
    pub(super) reported: Arc<Value>,
    /// Its size as JSON text, for a diff that changes numbers only (see
    /// `Session::set_volatile_numbers`).
    pub(super) reported_bytes: usize,
    /// The provenance stored with it.
    pub(super) provenance: Value,
    /// The operator tier, merged over every new document.
    pub(super) operator_overrides: Value,
    /// The status and reasons last written for this session.
    pub(super) status: AgentStatus,
    pub(super) status_reasons: Vec<String>,
    /// A diff the index does not hold yet: it changed more than volatile
    /// facts, and the index follows the committed document, so it waits for
    /// the heartbeat that writes it (a volatile diff after it waits too: the
    /// document it yields holds the change).
    pub(super) unindexed: Option<AppliedDiff>,
    /// The task kinds the agent handles, as stored.
    pub(super) kinds: Vec<String>,
    /// Kinds the agent announced that are not written yet (a heartbeat's
    /// write failed): every heartbeat carries them until one commits.
    pub(super) pending_kinds: Option<Vec<String>>,
}

/// A diff applied to the session's document (by a heartbeat), which the
/// session holds until the index takes it.
pub(super) struct AppliedDiff {
    /// What the index matches on.
    pub(super) document: Arc<Value>,
    /// Whether only volatile facts changed.
    pub(super) volatile: bool,
    /// Where the document changed, when the index may re-index only there
    /// (`None`: compare the whole document), and the document the patch was
    /// applied to: only if the index still holds that very one does it
    /// differ from the new one just there.
    pub(super) touched: Option<(Arc<Value>, Vec<PointerBuf>)>,
}

impl Session {
    /// Opens the session the Hello agreed to: the Welcome queued, the
    /// session attached to the dispatcher, and its reader spawned on
    /// `inbound`. Refused if a newer session of the agent is connected here.
    pub(super) fn start(
        api: Api,
        opened: Opened,
        inbound: Streaming<pb::ConnectRequest>,
    ) -> Result<Outbound> {
        let settings = api.dispatcher.settings();
        let (tx, rx) = mpsc::channel(settings.stream_queue);
        let record = opened.record;
        let welcome = down::welcome(
            record.generation,
            opened.resumed.clone(),
            opened.revoked,
            settings.heartbeat_interval_ms,
        );
        tx.try_send(Box::new(welcome)).map_err(|_| Error::Corrupt {
            context: "opening a session",
            detail: "the session queue is full".to_owned(),
        })?;
        let close = Arc::new(Notify::new());
        let (session, mut view) = Session::new(
            api,
            &record,
            tx.clone(),
            !opened.resumed.is_empty(),
            opened.following,
        );
        view.held = Arc::new(opened.held);
        let attach = Attach {
            agent_id: session.agent_id,
            epoch: session.epoch,
            tx,
            close: close.clone(),
            changed: session.changed.clone(),
            view,
        };
        let Some(id) = session.api.dispatcher.attach(attach) else {
            return Err(Error::FailedPrecondition(
                "a newer session of this agent is connected".to_owned(),
            ));
        };
        info!(agent = %session.agent_id, epoch = session.epoch, "agent connected");
        let span = info_span!("session", agent = %session.agent_id, epoch = session.epoch);
        tokio::spawn(session.run(inbound, close, id).instrument(span));
        Ok(rx)
    }

    /// The session of the agent `record` describes, and how the matcher
    /// sees it. With no operator tier over it, the index matches on the
    /// agent's own document: one copy, shared by the session and the index.
    fn new(
        api: Api,
        record: &AgentRecord,
        tx: SessionSender,
        held: bool,
        following: Following,
    ) -> (Self, switchyard_core::matcher::AgentView) {
        let now = api.now_ms();
        let mut view = record.view();
        let reported = Arc::new(record.reported.clone());
        if record.document == *reported {
            view.document = reported.clone();
        }
        let session = Session {
            api,
            agent_id: record.id,
            epoch: record.session_epoch,
            tx,
            generation: record.generation,
            persisted: record.generation,
            persisted_at_ms: now,
            touched_at_ms: now,
            held_leases_at_connect: held,
            changed: Arc::new(AtomicBool::new(false)),
            _following: following,
            reported_bytes: serialized_len(&reported),
            reported,
            provenance: record.provenance.clone(),
            operator_overrides: record.operator_overrides.clone(),
            status: record.status,
            status_reasons: record.status_reasons.clone(),
            unindexed: None,
            kinds: record.handled_kinds.clone(),
            pending_kinds: None,
        };
        (session, view)
    }

    /// Reads the stream until it ends or the session is closed; what the
    /// agent sent meanwhile is handled together, so its lease reports share
    /// one group commit.
    async fn run(
        mut self,
        mut inbound: Streaming<pb::ConnectRequest>,
        close: Arc<Notify>,
        id: SessionId,
    ) {
        let dispatcher = self.api.dispatcher.clone();
        let mut ended = false;
        while !ended {
            let first = tokio::select! {
                message = inbound.next() => message,
                () = close.notified() => break,
            };
            let messages;
            (messages, ended) = gather(first, &mut inbound);
            if !dispatcher.is_current(self.agent_id, id) {
                break;
            }
            if messages.is_empty() {
                continue;
            }
            dispatcher.touch(self.agent_id);
            if let Err(err) = self.handle_all(messages).await {
                warn!(cause = %err, "session message failed");
            }
        }
        self.end(id).await;
    }

    /// After the stream: if this was still the agent's current session, the
    /// agent is OFFLINE (its leases run out their TTL), and the grants it
    /// never acknowledged go back to the queue at once (the sweeper would
    /// revoke them after the ack window).
    async fn end(&self, id: SessionId) {
        let dispatcher = &self.api.dispatcher;
        if !dispatcher.detach(self.agent_id, id) {
            return;
        }
        let now = self.api.now_ms();
        let offline = AgentStatus::Offline;
        let _ = self
            .api
            .store
            .set_agent_status(self.agent_id, offline, &[], Some(self.epoch), now)
            .await;
        info!("agent disconnected; offline (its leases run out their TTL)");
        if let Err(err) = dispatcher.revoke_unacked_of(self.agent_id).await {
            warn!(cause = %err, "revoking the departed agent's unacknowledged grants failed; the sweeper will");
        }
    }

    /// Queues a message for the agent. A full queue means the agent is not
    /// reading; the message is dropped and the sweeper's timeouts take over.
    pub(super) fn send(&self, message: pb::ConnectResponse) {
        let _ = self.tx.try_send(Box::new(message));
    }

    /// An acknowledgement of `sequence` with `err`'s status.
    pub(super) fn refuse(&self, sequence: u64, err: &Error) -> pb::ConnectResponse {
        let status = tonic::Status::from(err);
        ack(sequence, status.code(), status.message(), self.generation)
    }

    /// Handles messages in order; consecutive lease reports are applied
    /// together (one group commit) before the next other message.
    async fn handle_all(&mut self, messages: Vec<pb::ConnectRequest>) -> Result<()> {
        let mut reports: Vec<(u64, LeaseReport)> = Vec::new();
        let mut outcome = Ok(());
        for request in messages {
            if let Some(Up::LeaseUpdate(update)) = request.message {
                match self.to_report(update) {
                    Ok(report) => reports.push((request.sequence, report)),
                    Err(err) => self.send(self.refuse(request.sequence, &err)),
                }
                continue;
            }
            self.flush_reports(std::mem::take(&mut reports)).await;
            if let Err(err) = self.handle(request).await {
                outcome = Err(err);
            }
        }
        self.flush_reports(reports).await;
        outcome
    }

    /// One message that is not a lease report; a store failure still gets
    /// an answer (e.g. UNAVAILABLE), never silence.
    async fn handle(&mut self, request: pb::ConnectRequest) -> Result<()> {
        let sequence = request.sequence;
        let now = self.api.now_ms();
        let reply = match request.message {
            None => Ok(self.refuse(sequence, &Error::invalid("message", "empty"))),
            Some(Up::Hello(_)) => Ok(self.refuse(
                sequence,
                &Error::invalid("message", "hello is only the first message"),
            )),
            Some(Up::Heartbeat(heartbeat)) => self.heartbeat(sequence, heartbeat, now).await,
            // `handle_all` batches lease updates; one on its own goes the same way.
            Some(Up::LeaseUpdate(update)) => {
                match self.to_report(update) {
                    Ok(report) => self.flush_reports(vec![(sequence, report)]).await,
                    Err(err) => self.send(self.refuse(sequence, &err)),
                }
                return Ok(());
            }
            Some(Up::CapabilitySnapshot(snapshot)) => self.snapshot(sequence, snapshot, now).await,
        };
        match reply {
            Ok(reply) => {
                self.send(reply);
                Ok(())
            }
            Err(err) => {
                self.send(self.refuse(sequence, &err));
                Err(err)
            }
        }
    }

    /// Takes what the session holds from a stored record (after a snapshot
    /// or a lost compare-and-set), and the index follows it.
    pub(super) fn load(&mut self, record: &AgentRecord) {
        self.generation = record.generation;
        self.persisted = record.generation;
        self.persisted_at_ms = self.api.now_ms();
        self.reported = Arc::new(record.reported.clone());
        self.reported_bytes = serialized_len(&self.reported);
        self.provenance = record.provenance.clone();
        self.operator_overrides = record.operator_overrides.clone();
        self.status = record.status;
        self.status_reasons = record.status_reasons.clone();
        self.unindexed = None;
    }

    /// An OK acknowledgement of `sequence`.
    pub(super) fn ok(&self, sequence: u64) -> pb::ConnectResponse {
        ack(sequence, Code::Ok, "", self.generation)
    }
}

/// The messages ready on the stream after `first`, up to
/// [`MAX_MESSAGES_AT_ONCE`], and whether the stream ended.
fn gather(
    first: Option<Result<pb::ConnectRequest, tonic::Status>>,
    inbound: &mut Streaming<pb::ConnectRequest>,
) -> (Vec<pb::ConnectRequest>, bool) {
    let mut messages = Vec::new();
    let mut next = first;
    loop {
        match next {
            Some(Ok(message)) => messages.push(message),
            Some(Err(status)) => {
                debug!(%status, "agent stream ended with an error");
                return (messages, true);
            }
            None => return (messages, true),
        }
        if messages.len() >= MAX_MESSAGES_AT_ONCE {
            return (messages, false);
        }
        match ready_now(inbound) {
            Some(message) => next = message,
            None => return (messages, false),
        }
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
