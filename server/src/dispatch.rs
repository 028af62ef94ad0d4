//! The dispatcher: where tasks and agents meet. It keeps an in-memory index
//! of the agents connected to this replica (the core's [`AgentIndex`]) and
//! their session streams; whenever a task is queued or re-queued, an agent
//! connects, frees capacity or changes its capabilities, it matches waiting
//! tasks against the index, writes the grants to the store in one batch,
//! and pushes each grant down its agent's stream at once.
//!
//! Every replica runs one. It grants only to agents connected to itself;
//! the store's conditional grant makes sure two replicas never lease one
//! task twice. The index and session table sit behind one `std` mutex that
//! is never held across an `.await`, and each agent stream has a bounded
//! queue, so a slow agent cannot stall dispatch to the others: a grant that
//! cannot be queued is left unacknowledged and revoked by the sweeper.
//!
//! The index counts each agent's leases itself (a slot is taken when the
//! agent is picked, before the grant commits). A lease that ends where this
//! replica does not take part is heard as `LeaseEnded` from the store, and
//! every tenth sweep recounts, from the store, the agents not picked lately.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use switchyard_core::index::AgentIndex;
use switchyard_core::matcher::{AgentStatus, AgentView};
use switchyard_core::placement::{self, CompiledPlacement, Placement};
use switchyard_proto::v1 as pb;
use tokio::sync::{Notify, broadcast, mpsc};
use tonic::Status;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::api::mapping;
use crate::batch::{GroupCommit, Linger};
use crate::clock::Clock;
use crate::error::Result;
use crate::store::{
    Beat, BeatApplied, GrantOutcome, GrantRequest, LeaseRecord, LeaseReport, ParkedPlacement,
    QueueCursor, ReportApplied, Store, StoreEvent, Submission, Submitted, TaskRecord,
};

/// How the dispatcher behaves; defaults suit production, tests shorten them.
#[derive(Debug, Clone)]
pub struct DispatchSettings {
    /// How often agents heartbeat; three silent intervals make an agent OFFLINE.
    pub heartbeat_interval_ms: i64,
    /// A grant not acknowledged within this window is revoked and re-matched.
    pub ack_window_ms: i64,
    /// How many queued tasks one dispatch round considers per store read.
    pub batch_size: u32,
    /// How often the sweeper expires leases and revokes unacknowledged grants.
    pub sweep_interval_ms: i64,
    /// How often the dispatcher looks at the queue unprompted (a safety net
    /// for missed notifications).
    pub recheck_ms: u64,
    /// Capacity of each agent stream's outbound queue.
    pub stream_queue: usize,
    /// How long a batch of heartbeats waits for more before committing.
    pub heartbeat_linger_ms: u64,
    /// How long a batch of lease reports waits for more before committing.
    pub report_linger_ms: u64,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 5_000,
            ack_window_ms: 5_000,
            batch_size: 256,
            sweep_interval_ms: 1_000,
            recheck_ms: 1_000,
            stream_queue: 256,
            heartbeat_linger_ms: 50,
            report_linger_ms: 10,
        }
    }
}

/// Lease reports that end a report batch's wait for company: a busy store
/// gathers them within a few milliseconds, and waiting on for more only
/// delays the agents whose slots they free.
const REPORTS_ENOUGH: usize = 32;

/// Every this many sweeps, the lease counts of quiet agents are checked
/// against the store (see [`Dispatcher::recount_loads`]).
const RECOUNT_EVERY_SWEEPS: u64 = 10;

/// The most distinct parked placements a dispatcher remembers. One more
/// makes it forget them all and find again those whose tasks still wait
/// (each costs a page of the next walk).
const MAX_PARKED_PLACEMENTS: usize = 256;

/// Outbound half of one agent session.
pub type SessionSender = mpsc::Sender<Box<pb::ConnectResponse>>;

/// What matching one page of the queue did.
#[derive(Debug, Default, Clone, Copy)]
struct PageOutcome {
    /// Tasks leased.
    granted: usize,
    /// Tasks left out of later pages: no agent here can run them.
    parked: usize,
    /// The first task of the page that is not parked.
    first_live: Option<usize>,
}

/// One live session on this replica.
#[derive(Debug, Clone)]
struct Session {
    /// The epoch the session was opened with; a newer one replaces it.
    epoch: u64,
    /// Where grants, revocations, acks and drains for the agent go.
    tx: SessionSender,
    /// Last time the agent said anything, for OFFLINE detection.
    last_seen_ms: i64,
    /// Tells the session's reader to stop (superseded, silent, shutdown).
    close: Arc<Notify>,
    /// Tells the session its stored agent changed under it (an operator
    /// change, possibly through another replica): reload before the next
    /// diff.
    changed: Arc<AtomicBool>,
}

/// What the dispatcher guards with its one lock.
#[derive(Debug, Default)]
struct State {
    /// Agents with a live session here, as the matcher sees them.
    index: AgentIndex,
    /// Live sessions by agent id.
    sessions: HashMap<Uuid, Session>,
    /// Compiled placements by task id, so a waiting task is compiled once.
    placements: HashMap<Uuid, Arc<CompiledPlacement>>,
    /// Placements no agent here can run (at most [`MAX_PARKED_PLACEMENTS`]):
    /// the queue walk leaves their tasks out, and an agent that connects or
    /// changes is tested against each, to put its tasks back in the walk.
    parked: HashMap<ParkedPlacement, Arc<CompiledPlacement>>,
    /// Counts placements forgotten from `parked`; a round that sees it move
    /// walks again from the head, so their oldest tasks go first.
    unparked: u64,
    /// Where the last round stopped when it read its most pages with slots
    /// still free: the next round goes on from there, so every task is read
    /// within a few rounds however much waits ahead of it.
    resume: Option<QueueCursor>,
    /// Counts changes that put parked tasks back in the walk: placements
    /// forgotten because an agent can run them, or all of them at the cap.
    parked_epoch: u64,
    /// How far the head of the queue is parked tasks only, as the last walk
    /// from the head found it.
    skip: Option<Skip>,
    /// When queued tasks not yet due come due (ms, at most
    /// [`MAX_DUE_TIMES`]): the dispatcher looks at the queue again at each,
    /// as if a task had just been queued.
    due: std::collections::BTreeSet<i64>,
}

/// The most distinct due times a dispatcher keeps; past that the latest are
/// dropped, and their tasks are found by the periodic re-check.
const MAX_DUE_TIMES: usize = 1_024;

/// The head of the queue up to `to` holds only tasks of parked placements
/// (every due queued task, if `to` is `None`): a walk from the head may
/// start at `to`. The store leaves those tasks out of every page, but it
/// still reads each to do so, and a hundred thousand of them cost a page
/// tens of milliseconds. Valid while nothing was queued ahead of `to`
/// (`signals`), no parked placement was forgotten (`parked_epoch`), and
/// for [`SKIP_TTL_MS`] at most: a delayed task ahead of `to` that came due
/// is read within that time.
#[derive(Debug, Clone, Copy)]
struct Skip {
    to: Option<QueueCursor>,
    signals: u64,
    parked_epoch: u64,
    made_at_ms: i64,
}

/// How long a [`Skip`] holds at most.
const SKIP_TTL_MS: i64 = 5_000;

impl State {
    /// Forgets the parked placements `view`'s agent can run; true if any.
    fn unpark_for(&mut self, view: &AgentView) -> bool {
        let unparked = forget_runnable(&mut self.parked, view);
        self.note_unparked(unparked)
    }

    /// Forgets the parked placements the indexed agent `key` can run (on
    /// every heartbeat diff: it borrows the indexed view, copies nothing).
    fn unpark_for_agent(&mut self, key: &str) -> bool {
        let unparked = match self.index.get(key) {
            Some(view) => forget_runnable(&mut self.parked, view),
            None => false,
        };
        self.note_unparked(unparked)
    }

    /// Counts a change that put parked tasks back in the walk.
    fn note_unparked(&mut self, unparked: bool) -> bool {
        if unparked {
            metrics::gauge!(crate::metrics::PARKED_PLACEMENTS).set(self.parked.len() as f64);
            self.unparked += 1;
            self.parked_epoch += 1;
        }
        unparked
    }
}

/// Removes from `parked` the placements `view`'s agent can run; true if any.
fn forget_runnable(
    parked: &mut HashMap<ParkedPlacement, Arc<CompiledPlacement>>,
    view: &AgentView,
) -> bool {
    if parked.is_empty() || !view.status.takes_work() {
        return false;
    }
    let before = parked.len();
    parked.retain(|key, placement| {
        key.namespace != view.namespace || !placement.satisfied_by(&view.document)
    });
    parked.len() < before
}

/// The dispatcher handle; cheap to clone.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Where tasks, leases and agents live.
    store: Arc<dyn Store>,
    /// Injected time.
    clock: Clock,
    /// Tunables.
    settings: DispatchSettings,
    /// Sessions, index and placement cache.
    state: Mutex<State>,
    /// Wakes the dispatch loop: something may now be placeable.
    wake: Notify,
    /// Set on shutdown: no new grants.
    stopping: AtomicBool,
    /// Tells streams (WatchTask) that the server is shutting down.
    stopped: tokio::sync::watch::Sender<bool>,
    /// Task state changes, for WatchTask (fed from the store's events, so
    /// changes made through other replicas arrive too).
    task_changes: broadcast::Sender<Uuid>,
    /// Lease reports of every session, group-committed (started by
    /// [`Dispatcher::spawn`]).
    reports: std::sync::OnceLock<GroupCommit<LeaseReport, ReportApplied>>,
    /// Heartbeats of every session, group-committed likewise.
    beats: std::sync::OnceLock<GroupCommit<Beat, BeatApplied>>,
    /// Submits of every caller, group-committed likewise.
    submits: std::sync::OnceLock<GroupCommit<Submission, Submitted>>,
    /// Counts signals that a task may be waiting in the queue (a submit
    /// that was not leased on the way in, a re-queue on any replica).
    queued_signals: AtomicU64,
    /// The `queued_signals` count at the start of the last round that left
    /// nothing in the queue (every task it read was leased); `u64::MAX`
    /// until one does. While it equals `queued_signals`, nothing waits and
    /// a submit may be leased on the way in without overtaking anyone.
    clear_at: AtomicU64,
}

impl Dispatcher {
    /// A dispatcher over `store`; call [`Dispatcher::spawn`] to start it.
    pub fn new(store: Arc<dyn Store>, clock: Clock, settings: DispatchSettings) -> Self {
        let (task_changes, _) = broadcast::channel(1024);
        Self {
            shared: Arc::new(Shared {
                store,
                clock,
                settings,
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                stopping: AtomicBool::new(false),
                stopped: tokio::sync::watch::channel(false).0,
                task_changes,
                reports: std::sync::OnceLock::new(),
                beats: std::sync::OnceLock::new(),
                submits: std::sync::OnceLock::new(),
                queued_signals: AtomicU64::new(0),
                clear_at: AtomicU64::new(u64::MAX),
            }),
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &DispatchSettings {
        &self.shared.settings
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere; the state is still usable.
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the dispatch loop, the sweeper and the store-event listener.
    pub fn spawn(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let store = self.shared.store.clone();
        // SQLite serialises writers: one transaction at a time; PostgreSQL
        // commits several batches at once.
        let in_flight = if store.backend() == "sqlite" { 1 } else { 4 };
        let clock = self.shared.clock.clone();
        // Lease reports commit at most two batches at once. Four gained no
        // throughput (preloaded 20,000 tasks: medians 4,665 and 4,691/s over
        // six runs each) and slowed submits racing them for the database: at
        // 500 submits/s with 1,000 agents, submit-to-grant p50 5.7 against
        // 4.0 ms and p99 22.1 against 14.9 ms (medians of five runs each).
        // When the store is quiet, a batch waits up to `report_linger_ms`
        // for company: at that load most batches were one agent's attempt
        // (about two tasks), and each commit flushed the log beside the
        // submits'. 10 ms against none, three alternating runs:
        // submit-to-grant p50 2.97 against 4.70 ms. A busy store gets no
        // wait (reports queued when a slot frees go at once) and a batch
        // stops waiting at REPORTS_ENOUGH: waiting always cost 8-12% of the
        // preloaded throughput, as the agents' slots wait for the reports.
        let _ = self.shared.reports.set(GroupCommit::start(
            512,
            in_flight.min(2),
            Linger::WhenIdle {
                wait: Duration::from_millis(self.shared.settings.report_linger_ms),
                enough: REPORTS_ENOUGH,
            },
            move |reports: Vec<LeaseReport>| {
                let (store, now) = (store.clone(), clock.now_ms());
                async move {
                    crate::metrics::timed("apply_reports", store.apply_reports(&reports, now)).await
                }
            },
        ));
        let (store, clock) = (self.shared.store.clone(), self.shared.clock.clone());
        // Heartbeats linger for company: a renewal a few tens of
        // milliseconds later changes nothing, and a thousand agents'
        // heartbeats then cost a few commits a second instead of hundreds.
        let _ =
            self.shared.beats.set(GroupCommit::start(
                1_024,
                in_flight,
                Linger::Always(Duration::from_millis(
                    self.shared.settings.heartbeat_linger_ms,
                )),
                move |beats: Vec<Beat>| {
                    let (store, now) = (store.clone(), clock.now_ms());
                    async move {
                        crate::metrics::timed("heartbeats", store.heartbeats(&beats, now)).await
                    }
                },
            ));
        let (store, clock) = (self.shared.store.clone(), self.shared.clock.clone());
        // Concurrent submits share a commit: a caller waits for at most
        // the batches already in flight, and a lone submit commits at once.
        let _ = self.shared.submits.set(GroupCommit::start(
            256,
            in_flight,
            Linger::None,
            move |submissions: Vec<Submission>| {
                let (store, now) = (store.clone(), clock.now_ms());
                async move {
                    crate::metrics::timed("submit_many", store.submit_many(&submissions, now)).await
                }
            },
        ));
        let events = self.shared.store.subscribe();
        vec![
            tokio::spawn(self.clone().dispatch_loop()),
            tokio::spawn(self.clone().sweep_loop()),
            tokio::spawn(self.clone().event_loop(events)),
        ]
    }

    /// Applies lease reports of a session, group-committed with other
    /// sessions' reports. The slot of a lease a final report ended
    /// (`ReportApplied::ended`) stays taken in the index until the caller
    /// calls [`Dispatcher::lease_ended`]: the session does so only after it
    /// has queued the report's acknowledgement, so that the agent hears its
    /// lease is over before any grant that reuses the slot.
    pub async fn report(
        &self,
        reports: Vec<LeaseReport>,
    ) -> std::result::Result<Vec<Result<ReportApplied>>, Status> {
        match self.shared.reports.get() {
            Some(group) => group.submit(reports).await,
            None => {
                let now = self.shared.clock.now_ms();
                Ok(self.shared.store.apply_reports(&reports, now).await?)
            }
        }
    }

    /// Stores a submitted task (leasing it to the agent reserved for it by
    /// [`Dispatcher::place_now`], if any), group-committed with other
    /// callers' submits.
    pub async fn submit(&self, submission: Submission) -> std::result::Result<Submitted, Status> {
        let mut results = match self.shared.submits.get() {
            Some(group) => group.submit(vec![submission]).await?,
            None => {
                let now = self.shared.clock.now_ms();
                self.shared
                    .store
                    .submit_many(std::slice::from_ref(&submission), now)
                    .await?
            }
        };
        results
            .pop()
            .ok_or_else(|| Status::internal("no submit result"))?
            .map_err(Status::from)
    }

    /// Applies a session's heartbeat, group-committed with other sessions'.
    pub async fn heartbeat(&self, beat: Beat) -> std::result::Result<BeatApplied, Status> {
        let mut results = match self.shared.beats.get() {
            Some(group) => group.submit(vec![beat]).await?,
            None => {
                let now = self.shared.clock.now_ms();
                self.shared
                    .store
                    .heartbeats(std::slice::from_ref(&beat), now)
                    .await?
            }
        };
        results
            .pop()
            .ok_or_else(|| Status::internal("no heartbeat result"))?
            .map_err(Status::from)
    }

    /// A task may now be waiting in the queue: no submit is leased on the
    /// way in until a dispatch round has seen the queue empty again.
    pub fn note_queued(&self) {
        self.shared.queued_signals.fetch_add(1, Ordering::SeqCst);
    }

    /// A queued task comes due at `at_ms` (a delayed submit, a retry
    /// backing off): the dispatcher looks at the queue again then, rather
    /// than at its next periodic re-check (up to a second later, and up to
    /// [`SKIP_TTL_MS`] past a remembered walk that found nothing due).
    pub fn note_due(&self, at_ms: i64) {
        if at_ms <= self.shared.clock.now_ms() {
            return;
        }
        let mut state = self.state();
        let earlier = state.due.first().is_none_or(|first| at_ms < *first);
        state.due.insert(at_ms);
        if state.due.len() > MAX_DUE_TIMES {
            state.due.pop_last();
        }
        drop(state);
        if earlier {
            // The loop sleeps until the earliest due time: make it look.
            self.wake();
        }
    }

    /// Forgets the due times that have passed; if any had, the queue holds
    /// tasks that just came due, which [`Dispatcher::note_queued`] makes
    /// the next round read.
    fn take_due(&self, now_ms: i64) {
        let mut state = self.state();
        let mut passed = false;
        while state.due.first().is_some_and(|first| *first <= now_ms) {
            state.due.pop_first();
            passed = true;
        }
        drop(state);
        if passed {
            self.note_queued();
        }
    }

    /// How long until the earliest due time, if any.
    fn until_due(&self, now_ms: i64) -> Option<Duration> {
        let first = *self.state().due.first()?;
        Some(Duration::from_millis(
            u64::try_from(first.saturating_sub(now_ms)).unwrap_or(0),
        ))
    }

    /// [`Dispatcher::note_queued`] for a task whose place in the queue is
    /// known: a walk may still skip the parked head of the queue if the
    /// task is behind it.
    pub fn note_queued_at(&self, priority: i32, created_at_ms: i64, task_id: Uuid) {
        let mut state = self.state();
        let before = self.shared.queued_signals.fetch_add(1, Ordering::SeqCst);
        if let Some(skip) = state.skip.as_mut()
            && skip.signals == before
            && skip
                .to
                .is_some_and(|to| to.reaches(priority, created_at_ms, task_id))
        {
            skip.signals = before + 1;
        }
    }

    /// Picks and reserves an agent for a task being submitted, if one
    /// connected here has room and nothing waits in the queue (so the task
    /// overtakes no one); the caller leases it in the submit's transaction
    /// and then calls [`Dispatcher::push_grant`], or
    /// [`Dispatcher::lease_ended`] to give the reservation back.
    pub fn place_now(&self, placement: &CompiledPlacement, namespace: &str) -> Option<Uuid> {
        if self.stopping() || !self.queue_clear() {
            return None;
        }
        let now = self.shared.clock.now_ms();
        let mut state = self.state();
        let started = std::time::Instant::now();
        let selection = state.index.select_best(placement, namespace);
        metrics::histogram!(crate::metrics::MATCH_SECONDS).record(started.elapsed().as_secs_f64());
        let selection = selection?;
        let view = state.index.get(&selection.agent_id)?;
        let active = view.active_leases + 1;
        state
            .index
            .update_load(&selection.agent_id, active, u64::try_from(now).ok());
        selection.agent_id.parse().ok()
    }

    /// Pushes a granted lease down its agent's stream.
    pub fn push_grant(&self, task: &TaskRecord, lease: &LeaseRecord) {
        metrics::counter!(crate::metrics::GRANTS).increment(1);
        self.state().placements.remove(&task.id);
        let grant = pb::ConnectResponse {
            message: Some(pb::connect_response::Message::LeaseGrant(pb::LeaseGrant {
                lease_id: lease.id.to_string(),
                fencing_token: lease.fencing_token,
                task: Some(mapping::granted_task(task, lease)),
                expires_at: Some(crate::api::convert::timestamp(lease.expires_at_ms)),
            })),
        };
        if !self.send(lease.agent_id, grant) {
            // Left unacknowledged: the sweeper revokes and re-matches it.
            debug!(lease = %lease.id, agent = %lease.agent_id, "grant not queued to the agent stream");
        }
        let _ = self.shared.task_changes.send(task.id);
    }

    /// Asks the dispatch loop to run a round soon.
    pub fn wake(&self) {
        self.shared.wake.notify_one();
    }

    /// Subscribes to task-change notifications (task ids).
    pub fn watch_tasks(&self) -> broadcast::Receiver<Uuid> {
        self.shared.task_changes.subscribe()
    }

    /// Stops granting and tells every connected agent to reconnect
    /// elsewhere; used on shutdown.
    pub fn drain_all(&self, reason: &str) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.shared.stopped.send(true);
        let sessions: Vec<Session> = self.state().sessions.drain().map(|(_, s)| s).collect();
        for session in sessions {
            let _ = session.tx.try_send(Box::new(drain_message(reason, 1_000)));
            // The queued Drain is still delivered before the stream ends.
            session.close.notify_one();
        }
    }

    /// Completes when the server starts shutting down (streams end then).
    pub async fn stopped(&self) {
        let mut rx = self.shared.stopped.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Whether the dispatcher is shutting down.
    pub fn stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::SeqCst)
    }

    /// Registers a live session, closing an older one of the same agent
    /// (with a Drain saying why). Returns false if a newer epoch is already
    /// connected here (the caller must refuse this one).
    pub fn attach(
        &self,
        agent_id: Uuid,
        epoch: u64,
        tx: SessionSender,
        close: Arc<Notify>,
        changed: Arc<AtomicBool>,
        view: AgentView,
    ) -> bool {
        let now = self.shared.clock.now_ms();
        let mut state = self.state();
        if let Some(existing) = state.sessions.get(&agent_id) {
            if existing.epoch > epoch {
                return false;
            }
            let _ = existing.tx.try_send(Box::new(drain_message(
                &format!("superseded by session epoch {epoch}"),
                0,
            )));
            existing.close.notify_one();
        }
        state.sessions.insert(
            agent_id,
            Session {
                epoch,
                tx,
                last_seen_ms: now,
                close,
                changed,
            },
        );
        metrics::gauge!(crate::metrics::CONNECTED_AGENTS).set(state.sessions.len() as f64);
        let unparked = state.unpark_for(&view);
        state.index.upsert(view);
        drop(state);
        self.changed_agent(unparked);
        true
    }

    /// After an agent connected or changed: parked tasks it can run wait
    /// again (so no submit overtakes them), and any task that waits gets a
    /// round.
    fn changed_agent(&self, unparked: bool) {
        if unparked {
            self.note_queued();
        }
        if !self.queue_clear() {
            self.wake();
        }
    }

    /// Removes a session if it is still the given epoch.
    pub fn detach(&self, agent_id: Uuid, epoch: u64) -> bool {
        let mut state = self.state();
        if state
            .sessions
            .get(&agent_id)
            .is_some_and(|s| s.epoch == epoch)
        {
            if let Some(session) = state.sessions.remove(&agent_id) {
                session.close.notify_one();
            }
            metrics::gauge!(crate::metrics::CONNECTED_AGENTS).set(state.sessions.len() as f64);
            state.index.remove(&agent_id.to_string());
            true
        } else {
            false
        }
    }

    /// Whether this epoch is still the agent's live session here.
    pub fn is_current(&self, agent_id: Uuid, epoch: u64) -> bool {
        self.state()
            .sessions
            .get(&agent_id)
            .is_some_and(|s| s.epoch == epoch)
    }

    /// Records that the agent was heard from.
    pub fn touch(&self, agent_id: Uuid) {
        let now = self.shared.clock.now_ms();
        if let Some(s) = self.state().sessions.get_mut(&agent_id) {
            s.last_seen_ms = now;
        }
    }

    /// Replaces the agent's view in the index (document, status or load
    /// changed) and wakes dispatch.
    pub fn update_view(&self, view: AgentView) {
        let id: Uuid = match view.agent_id.parse() {
            Ok(id) => id,
            Err(_) => return,
        };
        let mut state = self.state();
        let mut unparked = false;
        if state.sessions.contains_key(&id) {
            unparked = state.unpark_for(&view);
            state.index.upsert(view);
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
        document: Arc<serde_json::Value>,
        touched: Option<(&Arc<serde_json::Value>, &[json_patch::jsonptr::PointerBuf])>,
    ) {
        let mut buf = Uuid::encode_buffer();
        let key: &str = agent_id.as_hyphenated().encode_lower(&mut buf);
        let mut state = self.state();
        let mut unparked = false;
        if state.sessions.contains_key(&agent_id) {
            let holds = |from: &Arc<serde_json::Value>| {
                state
                    .index
                    .get(key)
                    .is_some_and(|v| Arc::ptr_eq(&v.document, from))
            };
            match touched {
                Some((from, paths)) if holds(from) => {
                    state.index.replace_document_at(
                        key,
                        document,
                        paths.iter().map(|p| p.as_ptr()),
                    );
                }
                _ => {
                    state.index.replace_document(key, document);
                }
            }
            unparked = state.unpark_for_agent(key);
        }
        drop(state);
        self.changed_agent(unparked);
    }

    /// What matching says about a placement against the agents connected to
    /// this replica (in memory; no store access).
    pub fn local_outcome(
        &self,
        placement: &CompiledPlacement,
        namespace: &str,
    ) -> switchyard_core::matcher::Outcome {
        self.state().index.explain(placement, namespace).outcome
    }

    /// The agent's view in the index, if connected here.
    pub fn view(&self, agent_id: Uuid) -> Option<AgentView> {
        self.state().index.get(&agent_id.to_string()).cloned()
    }

    /// A lease of the agent ended: one more free slot (and a dispatch round,
    /// unless nothing waits in the queue for it).
    pub fn lease_ended(&self, agent_id: Uuid) {
        let mut state = self.state();
        let key = agent_id.to_string();
        if let Some(view) = state.index.get(&key) {
            let active = view.active_leases.saturating_sub(1);
            let last = view.last_granted_at_ms;
            state.index.update_load(&key, active, last);
        }
        drop(state);
        if !self.queue_clear() {
            self.wake();
        }
    }

    /// Whether the last dispatch round left the queue empty and nothing
    /// was queued since.
    fn queue_clear(&self) -> bool {
        self.shared.clear_at.load(Ordering::SeqCst)
            == self.shared.queued_signals.load(Ordering::SeqCst)
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

    /// Tells the agent holding `lease` to stop, if it is connected here.
    pub fn revoke(&self, lease: &LeaseRecord, reason: pb::RevocationReason, message: &str) -> bool {
        self.revoke_ids(lease.agent_id, lease.id, lease.task_id, reason, message)
    }

    /// [`Dispatcher::revoke`] by ids.
    fn revoke_ids(
        &self,
        agent_id: Uuid,
        lease_id: Uuid,
        task_id: Uuid,
        reason: pb::RevocationReason,
        message: &str,
    ) -> bool {
        self.send(
            agent_id,
            pb::ConnectResponse {
                message: Some(pb::connect_response::Message::LeaseRevocation(
                    pb::LeaseRevocation {
                        lease_id: lease_id.to_string(),
                        task_id: task_id.to_string(),
                        reason: reason as i32,
                        message: message.to_owned(),
                    },
                )),
            },
        )
    }

    /// The compiled placement of a task (cached).
    fn compiled(&self, task: &TaskRecord) -> Option<Arc<CompiledPlacement>> {
        if let Some(c) = self.state().placements.get(&task.id) {
            return Some(c.clone());
        }
        let placement: Placement = match serde_json::from_value(task.placement.clone()) {
            Ok(p) => p,
            Err(err) => {
                warn!(task = %task.id, cause = %err, "stored placement does not parse; task cannot be placed");
                return None;
            }
        };
        let compiled = match placement::compile(&placement) {
            Ok(c) => Arc::new(c),
            Err(err) => {
                warn!(task = %task.id, cause = %err, "stored placement does not compile");
                return None;
            }
        };
        self.state().placements.insert(task.id, compiled.clone());
        Some(compiled)
    }

    async fn dispatch_loop(self) {
        // The safety re-check: also look now and then (missed notifications,
        // due times past the ones kept).
        let recheck = Duration::from_millis(self.shared.settings.recheck_ms);
        loop {
            if self.stopping() {
                return;
            }
            self.take_due(self.shared.clock.now_ms());
            match self.dispatch_round().await {
                // A full batch was granted: there may be more right away.
                Ok(granted) if granted > 0 => continue,
                Ok(_) => {}
                Err(err) => warn!(cause = %err, "dispatch round failed"),
            }
            let wait = self
                .until_due(self.shared.clock.now_ms())
                .map_or(recheck, |due| due.min(recheck));
            let _ = tokio::time::timeout(wait, self.shared.wake.notified()).await;
        }
    }

    /// One round: walk the queue in priority order, page by page, matching
    /// each task against the connected agents, until no agent has room or
    /// the queue ends. A parked task is skipped, never a blocker: the walk
    /// goes on to lower priorities, and the tasks of placements known to be
    /// parked are not read at all. A round reads at most `MAX_PAGES` pages;
    /// if it stops there with slots free, the next one goes on from where it
    /// stopped, and the one after that starts at the head again. Returns
    /// how many leases were granted.
    pub async fn dispatch_round(&self) -> Result<usize> {
        /// Pages one round reads at most; the next wake continues.
        const MAX_PAGES: usize = 64;
        /// The shortest page read while any slot is free.
        const MIN_PAGE: u32 = 16;
        if self.stopping() || self.state().sessions.is_empty() {
            return Ok(0);
        }
        let signals = self.shared.queued_signals.load(Ordering::SeqCst);
        let now = self.shared.clock.now_ms();
        let batch = self.shared.settings.batch_size;
        let (mut cursor, epoch, skip, mut seen_unparked) = {
            let mut state = self.state();
            let resume = state.resume.take();
            (resume, state.parked_epoch, state.skip, state.unparked)
        };
        let mut from_head = cursor.is_none();
        if from_head {
            match skip {
                Some(skip)
                    if skip.signals == signals
                        && skip.parked_epoch == epoch
                        && now - skip.made_at_ms < SKIP_TTL_MS =>
                {
                    match skip.to {
                        Some(to) => cursor = Some(to),
                        // Every due task is parked, and nothing came since.
                        None => {
                            self.shared.clear_at.store(signals, Ordering::SeqCst);
                            return Ok(0);
                        }
                    }
                }
                _ => {}
            }
        }
        let skip_from = cursor;
        // Just before the first task of this walk from the head that is
        // not parked (where the next walk from the head may start).
        let mut first_live: Option<QueueCursor> = None;
        let mut full = false;
        let mut granted = 0;
        // Tasks read and left waiting that an agent here could run.
        let mut left = 0;
        let mut walked = false;
        // The shortest page to read next: it doubles after every page that
        // left tasks behind, so a walk past many parked tasks soon reads
        // whole batches and goes as deep as it did with whole batches.
        let mut min_page = MIN_PAGE.min(batch);
        for _ in 0..MAX_PAGES {
            // A page as long as the free slots could use (twice over, for
            // tasks only busy agents match), up to the batch size: under
            // load a round fills a few freed slots, and reading and decoding
            // a whole batch of tasks for them is most of the round's cost.
            let free = self.state().index.free_slots(u64::from(batch));
            if free == 0 {
                full = true;
                break;
            }
            let limit = u32::try_from(free.saturating_mul(2))
                .unwrap_or(u32::MAX)
                .clamp(min_page, batch);
            let (parked, unparked) = {
                let state = self.state();
                let keys: Vec<ParkedPlacement> = state.parked.keys().cloned().collect();
                (keys, state.unparked)
            };
            if unparked != seen_unparked {
                // Tasks passed over may be placeable now: start again.
                (seen_unparked, cursor, left, from_head) = (unparked, None, 0, true);
                first_live = None;
            }
            let tasks = crate::metrics::timed(
                "queued_tasks",
                self.shared
                    .store
                    .queued_tasks(None, now, cursor.as_ref(), &parked, limit),
            )
            .await?;
            let Some(last) = tasks.last() else {
                walked = true;
                break;
            };
            cursor = Some(QueueCursor::after(last));
            let page = self.grant_page(&tasks, now).await?;
            if first_live.is_none()
                && let Some(i) = page.first_live
            {
                first_live = Some(QueueCursor::before(&tasks[i]));
            }
            granted += page.granted;
            left += tasks.len() - page.granted - page.parked;
            if page.granted < tasks.len() {
                min_page = limit.saturating_mul(2).min(batch);
            }
            if tasks.len() < limit as usize {
                walked = true;
                break;
            }
        }
        if walked && from_head && left == 0 {
            // Nothing an agent here can run was left waiting as of `signals`.
            self.shared.clear_at.store(signals, Ordering::SeqCst);
        }
        if from_head {
            let to = match (first_live, walked, cursor.or(skip_from)) {
                (Some(at), _, _) => Some(Some(at)),
                (None, true, _) => Some(None),
                // Every task read was parked: up to the last one.
                (None, false, Some(last)) => Some(Some(last)),
                // Nothing read (no free slot): nothing learned.
                (None, false, None) => None,
            };
            let mut state = self.state();
            state.skip = to.filter(|_| state.parked_epoch == epoch).map(|to| Skip {
                to,
                signals,
                parked_epoch: epoch,
                made_at_ms: now,
            });
        }
        if !walked && !full {
            self.state().resume = cursor;
        }
        Ok(granted)
    }

    /// Matches one page of queued tasks and grants in one batch; remembers
    /// the placements of tasks no agent here can run.
    async fn grant_page(&self, tasks: &[TaskRecord], now: i64) -> Result<PageOutcome> {
        let mut requests = Vec::new();
        let mut picked: Vec<&TaskRecord> = Vec::new();
        let mut outcome = PageOutcome::default();
        for (i, task) in tasks.iter().enumerate() {
            let Some(compiled) = self.compiled(task) else {
                outcome.first_live.get_or_insert(i);
                continue;
            };
            let mut state = self.state();
            let started = std::time::Instant::now();
            let selected = state.index.select_best(&compiled, &task.namespace);
            metrics::histogram!(crate::metrics::MATCH_SECONDS)
                .record(started.elapsed().as_secs_f64());
            let Some(selection) = selected else {
                if !state.index.any_capable(&compiled, &task.namespace) {
                    let key = ParkedPlacement {
                        namespace: task.namespace.clone(),
                        placement: task.placement.to_string(),
                    };
                    if !state.parked.contains_key(&key)
                        && state.parked.len() >= MAX_PARKED_PLACEMENTS
                    {
                        // Some may be stale (their tasks gone): start over;
                        // the walk finds the live ones again in a page each,
                        // and until it has, nothing overtakes their tasks.
                        state.parked.clear();
                        state.parked_epoch += 1;
                        self.note_queued();
                    }
                    state.parked.insert(key, compiled);
                    metrics::gauge!(crate::metrics::PARKED_PLACEMENTS)
                        .set(state.parked.len() as f64);
                    outcome.parked += 1;
                } else {
                    outcome.first_live.get_or_insert(i);
                }
                continue;
            };
            outcome.first_live.get_or_insert(i);
            // Reserve the slot so the next task of this round sees it taken.
            if let Some(view) = state.index.get(&selection.agent_id) {
                let active = view.active_leases + 1;
                state
                    .index
                    .update_load(&selection.agent_id, active, u64::try_from(now).ok());
            }
            drop(state);
            let Ok(agent_id) = selection.agent_id.parse::<Uuid>() else {
                continue;
            };
            requests.push(GrantRequest {
                task_id: task.id,
                agent_id,
            });
            picked.push(task);
        }
        if requests.is_empty() {
            return Ok(outcome);
        }
        // The grant's own time, read after the agents were picked: a slot
        // freed while the page was read was freed by a commit stamped
        // earlier, so the stored lease intervals of an agent never overlap.
        let granted_at = self.shared.clock.now_ms().max(now);
        let outcomes = crate::metrics::timed(
            "grant_leases",
            self.shared.store.grant_leases(&requests, granted_at),
        )
        .await?;
        for ((request, task), granted) in requests.iter().zip(picked).zip(outcomes) {
            match granted {
                GrantOutcome::Granted(lease) => {
                    outcome.granted += 1;
                    self.push_grant(task, &lease);
                }
                GrantOutcome::Refused(refusal) => {
                    debug!(task = %task.id, agent = %request.agent_id, ?refusal, "grant refused");
                    self.lease_ended(request.agent_id);
                }
            }
        }
        Ok(outcome)
    }

    async fn sweep_loop(self) {
        let period = Duration::from_millis(
            u64::try_from(self.shared.settings.sweep_interval_ms).unwrap_or(1_000),
        );
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweeps: u64 = 0;
        loop {
            ticker.tick().await;
            if self.stopping() {
                return;
            }
            if let Err(err) = self.sweep().await {
                warn!(cause = %err, "sweep failed");
            }
            sweeps += 1;
            if sweeps.is_multiple_of(RECOUNT_EVERY_SWEEPS)
                && let Err(err) = self.recount_loads().await
            {
                warn!(cause = %err, "recounting agents' leases failed");
            }
        }
    }

    /// Corrects the index's lease counts of agents connected here from the
    /// store. A slot stays counted if its lease ended where this replica
    /// did not hear of it: another replica's sweeper, with the notification
    /// lost while the listener was disconnected, or a submit whose caller
    /// went away after its agent was reserved. Only agents not picked for
    /// the last [`RECOUNT_EVERY_SWEEPS`] sweeps are recounted, so no grant
    /// of theirs is in flight and the stored count is the whole truth.
    pub async fn recount_loads(&self) -> Result<usize> {
        let quiet_before = self.shared.clock.now_ms()
            - self.shared.settings.sweep_interval_ms
                * i64::try_from(RECOUNT_EVERY_SWEEPS).unwrap_or(10);
        let quiet = |v: &switchyard_core::matcher::AgentView| {
            v.active_leases > 0
                && v.last_granted_at_ms
                    .is_none_or(|at| i64::try_from(at).unwrap_or(i64::MAX) < quiet_before)
        };
        let candidates: Vec<Uuid> = {
            let state = self.state();
            state
                .sessions
                .keys()
                .filter(|id| state.index.get(&id.to_string()).is_some_and(quiet))
                .copied()
                .collect()
        };
        if candidates.is_empty() {
            return Ok(0);
        }
        let stored = self.shared.store.live_lease_counts(&candidates).await?;
        let mut corrected = 0;
        let mut state = self.state();
        for agent_id in candidates {
            let key = agent_id.to_string();
            let Some(view) = state.index.get(&key).filter(|v| quiet(v)) else {
                continue;
            };
            let count = stored.get(&agent_id).copied().unwrap_or(0);
            if count != view.active_leases {
                warn!(agent = %agent_id, counted = view.active_leases, stored = count, "lease count corrected from the store");
                let last = view.last_granted_at_ms;
                state.index.update_load(&key, count, last);
                corrected += 1;
            }
        }
        drop(state);
        if corrected > 0 {
            self.wake();
        }
        Ok(corrected)
    }

    /// Revokes the grants an agent never acknowledged once its session here
    /// has ended: no acknowledgement can come, so the tasks go back to the
    /// queue now rather than after the ack window. A grant the agent did
    /// receive and acknowledges on a new session first is kept (the store
    /// decides, under the task's lock). Answers how many were revoked.
    pub async fn revoke_unacked_of(&self, agent_id: Uuid) -> Result<usize> {
        let now = self.shared.clock.now_ms();
        let revoked = self
            .shared
            .store
            .revoke_unacked(Some(agent_id), i64::MAX, now)
            .await?;
        self.unacked_revoked(&revoked, "agent left without acknowledging a grant");
        Ok(revoked.len())
    }

    /// What follows a revocation of grants never acknowledged: the agent is
    /// told (if it is connected here, on a new session, say), its slot is
    /// freed, and watchers hear of the task.
    fn unacked_revoked(&self, revoked: &[(LeaseRecord, TaskRecord)], why: &str) {
        let requeued = revoked
            .iter()
            .filter(|(_, t)| t.state == crate::store::TaskState::Queued)
            .count();
        metrics::counter!(crate::metrics::REQUEUES).increment(requeued as u64);
        for (lease, task) in revoked {
            info!(lease = %lease.id, task = %task.id, agent = %lease.agent_id, "{why}; revoked");
            self.revoke(lease, pb::RevocationReason::Unacknowledged, why);
            self.lease_ended(lease.agent_id);
            let _ = self.shared.task_changes.send(task.id);
        }
    }

    /// Expires lapsed leases, revokes grants nobody acknowledged, and closes
    /// sessions that went silent. Safe on every replica at once.
    pub async fn sweep(&self) -> Result<()> {
        let now = self.shared.clock.now_ms();
        let expired = self.shared.store.expire_leases(now, 500).await?;
        metrics::counter!(crate::metrics::EXPIRIES).increment(expired.len() as u64);
        for (lease, task) in &expired {
            info!(lease = %lease.id, task = %task.id, agent = %lease.agent_id, state = task.state.as_str(), "lease expired");
            self.revoke(
                lease,
                pb::RevocationReason::Expired,
                "lease expired before it was renewed",
            );
            self.lease_ended(lease.agent_id);
            let _ = self.shared.task_changes.send(task.id);
        }
        let requeued = expired
            .iter()
            .filter(|(_, t)| t.state == crate::store::TaskState::Queued)
            .count();
        metrics::counter!(crate::metrics::REQUEUES).increment(requeued as u64);
        let cutoff = now - self.shared.settings.ack_window_ms;
        let unacked = self.shared.store.revoke_unacked(None, cutoff, now).await?;
        self.unacked_revoked(&unacked, "grant not acknowledged in time");
        // Sessions silent for three heartbeat intervals: close them; the
        // agent is OFFLINE and its leases run out their TTL.
        let silent_before = now - 3 * self.shared.settings.heartbeat_interval_ms;
        let silent: Vec<(Uuid, u64)> = self
            .state()
            .sessions
            .iter()
            .filter(|(_, s)| s.last_seen_ms < silent_before)
            .map(|(id, s)| (*id, s.epoch))
            .collect();
        for (agent_id, epoch) in silent {
            if !self.is_current(agent_id, epoch) {
                continue;
            }
            // Record OFFLINE first, so that whoever sees the stream end
            // also sees the status.
            self.shared
                .store
                .set_agent_status(agent_id, "offline", &[], Some(epoch), now)
                .await?;
            if self.detach(agent_id, epoch) {
                info!(agent = %agent_id, "agent silent for three heartbeat intervals: offline");
            }
        }
        if !expired.is_empty() || !unacked.is_empty() {
            self.wake();
        }
        Ok(())
    }

    async fn event_loop(self, mut events: broadcast::Receiver<StoreEvent>) {
        loop {
            match events.recv().await {
                Ok(StoreEvent::TaskQueued {
                    task_id,
                    priority,
                    created_at_ms,
                    not_before_ms,
                    ..
                }) => {
                    match (priority, created_at_ms) {
                        (Some(p), Some(c)) => self.note_queued_at(p, c, task_id),
                        _ => self.note_queued(),
                    }
                    if let Some(at) = not_before_ms {
                        self.note_due(at);
                    }
                    self.wake();
                }
                Ok(StoreEvent::TaskChanged { task_id, .. }) => {
                    let _ = self.shared.task_changes.send(task_id);
                }
                Ok(StoreEvent::AgentChanged { agent_id }) => {
                    self.refresh_agent(agent_id).await;
                }
                // Another replica's sweeper ended a lease of an agent that
                // may be connected here: its slot is free again. An expired
                // lease is news to the agent (it may be working on it still):
                // it hears so before a grant can reuse the slot.
                Ok(StoreEvent::LeaseEnded { agent_id, expired }) => {
                    if let Some(ended) = expired {
                        self.revoke_ids(
                            agent_id,
                            ended.lease_id,
                            ended.task_id,
                            pb::RevocationReason::Expired,
                            "lease expired before it was renewed",
                        );
                    }
                    self.lease_ended(agent_id);
                }
                Ok(StoreEvent::LeaseRevoked {
                    lease_id,
                    task_id,
                    agent_id,
                    reason,
                }) => {
                    // The store says why in words; unacknowledged grants are
                    // revoked by the sweeper of some replica, cancels by an RPC.
                    let why = if reason.contains("never acknowledged") {
                        pb::RevocationReason::Unacknowledged
                    } else {
                        pb::RevocationReason::Canceled
                    };
                    self.revoke_ids(agent_id, lease_id, task_id, why, &reason);
                    let _ = self.shared.task_changes.send(task_id);
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    warn!(missed, "store events lagged; re-dispatching");
                    self.note_queued();
                    self.wake();
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Reloads a connected agent's document and status from the store (an
    /// operator changed it, possibly through another replica).
    pub async fn refresh_agent(&self, agent_id: Uuid) {
        match self.state().sessions.get(&agent_id) {
            Some(session) => session.changed.store(true, Ordering::SeqCst),
            None => return,
        }
        match self.shared.store.get_agent(agent_id).await {
            Ok(record) => {
                let mut view = mapping::agent_view(&record);
                // The index knows load the store has not committed yet
                // (reservations of a round in flight) and when it last granted.
                if let Some(current) = self.view(agent_id) {
                    view.active_leases = view.active_leases.max(current.active_leases);
                    view.last_granted_at_ms = current.last_granted_at_ms;
                }
                self.update_view(view);
            }
            Err(err) => warn!(agent = %agent_id, cause = %err, "cannot refresh agent"),
        }
    }
}

/// A Drain message.
pub fn drain_message(reason: &str, reconnect_after_ms: i64) -> pb::ConnectResponse {
    pb::ConnectResponse {
        message: Some(pb::connect_response::Message::Drain(pb::Drain {
            reason: reason.to_owned(),
            reconnect_after: Some(crate::api::convert::duration(reconnect_after_ms)),
        })),
    }
}

/// The status an agent record's text maps to.
pub fn status_of(text: &str, drained: bool) -> AgentStatus {
    if drained {
        return AgentStatus::Draining;
    }
    match text {
        "ready" => AgentStatus::Ready,
        "degraded" => AgentStatus::Degraded,
        "draining" => AgentStatus::Draining,
        _ => AgentStatus::Offline,
    }
}
