//! The live agent sessions of this replica and what is pushed down their
//! streams. Each attached session gets a [`SessionId`] of its own: a newer
//! session of an agent (a greater epoch, or the same epoch connecting
//! again) supersedes the older one, which is told so with a Drain, and only
//! the session that is current can detach the agent, so a superseded
//! session ending never takes the agent offline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;
use switchyard_core::kinds::HandledKinds;
use switchyard_core::matcher::{AgentId, AgentView};
use switchyard_core::placement::CompiledPlacement;
use switchyard_proto::v1 as pb;
use tokio::sync::{Notify, mpsc};
use tracing::debug;
use uuid::Uuid;

use super::{Dispatcher, State};
use crate::model::{LeaseRecord, RevocationCause, TaskRecord};
use crate::wire::session as down;
use switchyard_core::resources::Claim;

/// Outbound half of one agent session.
pub type SessionSender = mpsc::Sender<Box<pb::ConnectResponse>>;

/// One attached session, unique on this replica (epochs are not: an agent
/// may connect twice with the epoch it registered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId(u64);

/// One live session on this replica.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// Which attached session this is.
    pub(super) id: SessionId,
    /// The epoch the session was opened with; a newer one replaces it.
    pub(super) epoch: u64,
    /// Where grants, revocations, acks and drains for the agent go.
    tx: SessionSender,
    /// Last time the agent said anything, for OFFLINE detection.
    pub(super) last_seen_ms: i64,
    /// Tells the session's reader to stop (superseded, silent, shutdown).
    close: Arc<Notify>,
    /// Tells the session its stored agent changed under it (an operator
    /// change, possibly through another replica): reload before the next
    /// diff.
    pub(super) changed: Arc<AtomicBool>,
}

/// What a session's reader hands the dispatcher when it attaches.
#[derive(Debug)]
pub struct Attach {
    /// The agent.
    pub agent_id: Uuid,
    /// The session epoch it connected with.
    pub epoch: u64,
    /// Its stream's outbound queue.
    pub tx: SessionSender,
    /// Notified to make the reader stop.
    pub close: Arc<Notify>,
    /// Set when the stored agent changed under the session.
    pub changed: Arc<AtomicBool>,
    /// How the matcher sees the agent now.
    pub view: AgentView,
}

impl Dispatcher {
    /// Registers a live session, superseding an older one of the same agent
    /// (a Drain tells it why). `None` if a session with a greater epoch is
    /// already connected here (the caller must refuse this one).
    pub fn attach(&self, attach: Attach) -> Option<SessionId> {
        let now = self.now_ms();
        let id = SessionId(self.shared.next_session.fetch_add(1, Ordering::SeqCst));
        let mut state = self.state();
        let first = state.sessions.is_empty();
        if let Some(existing) = state.sessions.get(&attach.agent_id) {
            if existing.epoch > attach.epoch {
                return None;
            }
            let why = format!("superseded by session epoch {}", attach.epoch);
            let _ = existing.tx.try_send(Box::new(down::drain(&why, 0)));
            existing.close.notify_one();
        }
        let session = Session {
            id,
            epoch: attach.epoch,
            tx: attach.tx,
            last_seen_ms: now,
            close: attach.close,
            changed: attach.changed,
        };
        state.sessions.insert(attach.agent_id, session);
        self.count_sessions(state.sessions.len());
        let agent = attach.view.agent_id;
        state.index.upsert(attach.view);
        // It registered for this session: the store lifted its refusals.
        let lifted = state.refused.lift(agent);
        let unparked = state.unpark_for(agent) || lifted;
        if lifted {
            state.queue.note_unparked();
        }
        drop(state);
        if first {
            // The other replicas tell this one of tasks they queue only
            // while something here reads them: the queue is walked from
            // its head again rather than from what was known before.
            self.note_queued();
        }
        self.changed_agent(unparked);
        Some(id)
    }

    /// How many sessions are attached here.
    pub fn connected_sessions(&self) -> usize {
        self.shared.connected.load(Ordering::Relaxed)
    }

    /// Records how many sessions are attached, for the gauge and for
    /// [`Dispatcher::connected_sessions`].
    fn count_sessions(&self, n: usize) {
        self.shared.connected.store(n, Ordering::Relaxed);
        metrics::gauge!(crate::metrics::CONNECTED_AGENTS).set(n as f64);
    }

    /// Removes the agent's session if `session` is still the current one
    /// (true); a superseded session detaches nothing.
    pub fn detach(&self, agent_id: Uuid, session: SessionId) -> bool {
        let mut state = self.state();
        if !state
            .sessions
            .get(&agent_id)
            .is_some_and(|s| s.id == session)
        {
            return false;
        }
        if let Some(session) = state.sessions.remove(&agent_id) {
            session.close.notify_one();
        }
        self.count_sessions(state.sessions.len());
        state.index.remove(agent_id.into());
        state.congestion.detached(agent_id);
        // Its next registration lifts its refusals in the store too.
        state.refused.lift(agent_id.into());
        drop(state);
        self.fleet_moved();
        true
    }

    /// Whether `session` is still the agent's live session here.
    pub fn is_current(&self, agent_id: Uuid, session: SessionId) -> bool {
        self.state()
            .sessions
            .get(&agent_id)
            .is_some_and(|s| s.id == session)
    }

    /// Records that the agent was heard from.
    pub fn touch(&self, agent_id: Uuid) {
        let now = self.now_ms();
        if let Some(s) = self.state().sessions.get_mut(&agent_id) {
            s.last_seen_ms = now;
        }
    }

    /// Stops granting and tells every connected agent to reconnect
    /// elsewhere; used on shutdown.
    pub fn drain_all(&self, reason: &str) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.shared.stopped.send(true);
        let sessions: Vec<Session> = self.state().sessions.drain().map(|(_, s)| s).collect();
        for session in sessions {
            let _ = session.tx.try_send(Box::new(down::drain(reason, 1_000)));
            // The queued Drain is still delivered before the stream ends.
            session.close.notify_one();
        }
    }

    /// Tells every agent connected here to reconnect elsewhere and ends its
    /// session, without stopping: this replica cannot reach the store (see
    /// `server::watch_store`), and an agent that stayed would have its
    /// heartbeats and reports go nowhere until its leases ran out, while a
    /// replica that can reach the store would keep them. Each session ends
    /// as if its stream had (the queued Drain is still delivered); the
    /// number of agents told.
    pub fn send_agents_elsewhere(&self, reason: &str) -> usize {
        let state = self.state();
        for session in state.sessions.values() {
            let _ = session.tx.try_send(Box::new(down::drain(reason, 1_000)));
            session.close.notify_one();
        }
        state.sessions.len()
    }

    /// Sends a message to the agent if it is connected here; false if not
    /// connected or its queue is full.
    pub fn send(&self, agent_id: Uuid, message: pb::ConnectResponse) -> bool {
        let tx = self.state().sessions.get(&agent_id).map(|s| s.tx.clone());
        tx.is_some_and(|tx| {
            let depth = tx.max_capacity() - tx.capacity();
            metrics::histogram!(crate::metrics::STREAM_QUEUE_DEPTH).record(depth as f64);
            tx.try_send(Box::new(message)).is_ok()
        })
    }

    /// Pushes a granted lease down its agent's stream.
    pub fn push_grant(&self, task: &TaskRecord, lease: &LeaseRecord) {
        metrics::counter!(crate::metrics::GRANTS).increment(1);
        let now = self.now_ms();
        {
            let mut state = self.state();
            state.task_placements.remove(&task.id);
            state.failed.remove(&task.id);
            state.refused.forget(task.id);
            state
                .congestion
                .pushed(task.id, lease.id, lease.agent_id, now);
        }
        if !self.send(lease.agent_id, down::grant(task, lease)) {
            // Left unacknowledged: the sweeper revokes and re-matches it.
            debug!(lease = %lease.id, agent = %lease.agent_id, "grant not queued to the agent stream");
        }
        self.task_changed(task.id);
        self.fleet_moved();
    }

    /// Tells the agent holding `lease` to stop, if it is connected here.
    pub fn revoke(&self, lease: &LeaseRecord, cause: RevocationCause, message: &str) -> bool {
        self.revoke_ids(lease.agent_id, lease.id, lease.task_id, cause, message)
    }

    /// [`Dispatcher::revoke`] by ids.
    pub(super) fn revoke_ids(
        &self,
        agent_id: Uuid,
        lease_id: Uuid,
        task_id: Uuid,
        cause: RevocationCause,
        message: &str,
    ) -> bool {
        self.send(agent_id, down::revoke(lease_id, task_id, cause, message))
    }

    /// The agent's view in the index, if connected here.
    pub fn view(&self, agent_id: Uuid) -> Option<AgentView> {
        self.state().index.get(agent_id.into()).cloned()
    }

    /// Replaces the agent's view in the index (document, status or load
    /// changed) and wakes dispatch.
    pub fn update_view(&self, view: AgentView) {
        let mut state = self.state();
        let mut unparked = false;
        if state.sessions.contains_key(&view.agent_id.uuid()) {
            let agent = view.agent_id;
            state.index.upsert(view);
            unparked = state.unpark_for(agent);
        }
        drop(state);
        // A changed agent matters only to tasks that wait.
        self.changed_agent(unparked);
    }

    /// Replaces a connected agent's document in the index (a heartbeat's
    /// diff), re-indexing only what changed: with `touched` (the document
    /// the patch was applied to, and the patch's paths), only under those
    /// paths if the index still holds that document; else by comparing the
    /// whole documents (the index may hold a copy refreshed from the store).
    pub fn replace_document(
        &self,
        agent_id: Uuid,
        document: Arc<Value>,
        touched: Option<(&Arc<Value>, &[json_patch::jsonptr::PointerBuf])>,
    ) {
        let key = AgentId::from(agent_id);
        let mut state = self.state();
        let mut unparked = false;
        if state.sessions.contains_key(&agent_id) {
            let holds = |from: &Arc<Value>| {
                state
                    .index
                    .get(key)
                    .is_some_and(|v| Arc::ptr_eq(&v.document, from))
            };
            match touched {
                Some((from, paths)) if holds(from) => {
                    let paths = paths.iter().map(|p| p.as_ptr());
                    state.index.replace_document_at(key, document, paths);
                }
                _ => {
                    state.index.replace_document(key, document);
                }
            }
            unparked = state.unpark_for(key);
        }
        drop(state);
        self.changed_agent(unparked);
    }

    /// Sets scalar leaves of a connected agent's document in place, in the
    /// copy `held` shares with the index (see [`AgentIndex::set_leaves`]),
    /// and wakes dispatch as [`Dispatcher::replace_document`] does. False,
    /// with nothing changed, where the index holds another document or a
    /// path is not a scalar: the caller then replaces the document whole.
    ///
    /// [`AgentIndex::set_leaves`]: switchyard_core::index::AgentIndex::set_leaves
    pub fn set_leaves(
        &self,
        agent_id: Uuid,
        held: &mut Arc<Value>,
        leaves: &[(Vec<String>, Value)],
    ) -> bool {
        let key = AgentId::from(agent_id);
        let mut state = self.state();
        if !state.sessions.contains_key(&agent_id) || !state.index.set_leaves(key, held, leaves) {
            return false;
        }
        let unparked = state.unpark_for(key);
        drop(state);
        self.changed_agent(unparked);
        true
    }

    /// Records the kinds a connected agent handles from now on (written to
    /// the store): its parked placements of those kinds go back in the
    /// walk, and its refusals are lifted.
    pub fn set_kinds(&self, agent_id: Uuid, kinds: Arc<HandledKinds>) {
        let key = AgentId::from(agent_id);
        let mut state = self.state();
        let mut unparked = false;
        if state.index.set_kinds(key, kinds) {
            unparked = state.unpark_for(key);
        }
        drop(state);
        self.changed_agent(unparked);
        self.lift_refusals(agent_id);
    }

    /// Whether some agent connected to this replica that takes work could
    /// run a task of `placement` (free slot or not): false exactly when
    /// matching here would park it. In memory, walking only the agents of
    /// the placement's narrowest required posting; never a whole
    /// explanation, which costs every agent of the fleet.
    pub fn capable_here(&self, placement: &CompiledPlacement, namespace: &str) -> bool {
        self.state().index.any_capable(placement, namespace)
    }

    /// A lease of the agent ended (for `task`; `None` from an older
    /// replica): what it held is free again — its claim, or one slot — and
    /// a dispatch round follows, unless nothing waits in the queue for it.
    pub fn lease_ended(&self, agent_id: Uuid, task: Option<Uuid>) {
        self.free_slot(agent_id, task, true);
    }

    /// The agent's reports on these leases (task, lease) were applied: the
    /// grants among them still in flight are acknowledged (see
    /// `congestion`); the agent, if held back for a late acknowledgement,
    /// takes work again, and dispatch wakes if the window has room again.
    pub fn acknowledged(&self, agent_id: Uuid, leases: &[(Uuid, Uuid)]) {
        let now = self.now_ms();
        let mut state = self.state();
        let prompt = self.shared.settings.ack_late_ms;
        let acked = state.congestion.acknowledged(agent_id, leases, now, prompt);
        for agent in &acked.released {
            state.index.hold_back((*agent).into(), false);
        }
        drop(state);
        if acked.wake || !acked.released.is_empty() {
            self.wake();
        }
    }

    /// Holds back, in the index, the agents here with a grant in flight
    /// for longer than the congestion state's `late_after` (looked for at
    /// most every 50 ms).
    pub(super) fn hold_back_late(&self, now_ms: i64) {
        let mut state = self.state();
        let late_after = state
            .congestion
            .late_after(self.shared.settings.ack_late_ms);
        for agent in state.congestion.hold_back_late(now_ms, late_after, 50) {
            debug!(%agent, late_after_ms = late_after, "agent held back: a grant is unacknowledged");
            state.index.hold_back(agent.into(), true);
        }
    }

    /// Gives back a slot reserved for a grant that was not made (refused,
    /// or a submit not leased on the way in): as [`Dispatcher::lease_ended`],
    /// but no lease ended, so no concurrency limit has more room.
    pub(super) fn give_back(&self, agent_id: Uuid, task: Option<Uuid>) {
        self.free_slot(agent_id, task, false);
    }

    fn free_slot(&self, agent_id: Uuid, task: Option<Uuid>, ended: bool) {
        let key = AgentId::from(agent_id);
        let mut state = self.state();
        if ended {
            state.queue.limits_freed();
        }
        match task {
            Some(task) => {
                state.index.release(key, task);
                if let Some(agent) = state.congestion.ended(task) {
                    state.index.hold_back(agent.into(), false);
                }
            }
            None => {
                if let Some(view) = state.index.get(key) {
                    let active = view.active_leases.saturating_sub(1);
                    let last = view.last_granted_at_ms;
                    state.index.update_load(key, active, last);
                }
            }
        }
        // Under the lock already held: a lease ends for every task.
        let waits = !self.queue_clear() && {
            let (signals, now) = (self.signals(), self.now_ms());
            let state = &mut *state;
            !state.queue.busy.clear_but_busy(signals, &state.index, now)
        };
        drop(state);
        self.fleet_moved();
        if waits {
            self.wake();
        }
    }

    /// Takes what a grant of `task` being made at `now_ms` would hold on
    /// the agent (so the next pick sees it taken); given back by
    /// [`Dispatcher::lease_ended`].
    pub(super) fn reserve(
        &self,
        state: &mut State,
        agent_id: AgentId,
        task: Uuid,
        claim: Claim,
        now_ms: i64,
    ) {
        state
            .index
            .hold(agent_id, task, claim, u64::try_from(now_ms).ok());
    }

    /// Marks the session's stored agent as changed under it; false if the
    /// agent has no session here.
    pub(super) fn mark_changed(&self, agent_id: Uuid) -> bool {
        match self.state().sessions.get(&agent_id) {
            Some(session) => {
                session.changed.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }
}
