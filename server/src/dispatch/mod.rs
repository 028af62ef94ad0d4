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
//!
//! # Layout
//! - this module: the handle, its shared state, the settings, and the
//!   group commits of lease reports and heartbeats.
//! - [`sessions`]: the live sessions of this replica (attach, supersede,
//!   detach) and the messages pushed down their streams.
//! - [`submit`]: the submit protocol: reserve an agent, commit, push the
//!   grant or give the reservation back, note the queue.
//! - `queue`: what the dispatcher knows about the queue without reading
//!   it (signals, due times, parked placements, the parked head).
//! - `round`: the dispatch round, walking the queue page by page.
//! - `refusals`: the tasks agents here refused, not offered to them again
//!   until they change.
//! - `sweep`: expiry, unacknowledged grants, silent sessions, recounts.
//! - `events`: the store's events from every replica.
//! - `congestion`: how many grants may wait for their acknowledgement,
//!   which agents are too slow to be given more, and when an
//!   unacknowledged grant is revoked.

mod busy;
mod congestion;
mod events;
mod explain;
mod page;
mod queue;
mod refusals;
mod round;
pub mod sessions;
pub mod submit;
mod sweep;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use switchyard_core::index::AgentIndex;
use switchyard_core::placement::CompiledPlacement;
use tokio::sync::{Notify, broadcast};
use uuid::Uuid;

pub use self::explain::QueueCount;
use self::queue::QueueState;
pub use self::sessions::{SessionId, SessionSender};
pub use self::submit::SubmitOutcome;
use crate::batch::{GroupCommit, Linger};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::model::{Beat, BeatOutcome, LeaseReport, ReportApplied, Submission, Submitted};
use crate::store::{Following, Store};

/// How the dispatcher behaves; defaults suit production, tests shorten them.
#[derive(Debug, Clone)]
pub struct DispatchSettings {
    /// How often agents heartbeat; three silent intervals make an agent OFFLINE.
    pub heartbeat_interval_ms: i64,
    /// A grant not acknowledged within this window is revoked and re-matched
    /// (stretched while the whole fleet acknowledges slower, see
    /// `congestion`).
    pub ack_window_ms: i64,
    /// An agent with a grant unacknowledged for this long (or longer, while
    /// the fleet's acknowledgements are slower) gets no more grants until it
    /// acknowledges.
    pub ack_late_ms: i64,
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
    /// The store's limit of running tasks per namespace (0: none): while
    /// set, no submit is leased on the way in.
    pub max_running_per_namespace: u64,
    /// Submits waiting for a batch beyond which a submit is pushed back
    /// (RESOURCE_EXHAUSTED with a retry hint).
    pub max_submits_waiting: usize,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 5_000,
            ack_window_ms: 5_000,
            ack_late_ms: 1_000,
            batch_size: 256,
            sweep_interval_ms: 1_000,
            recheck_ms: 1_000,
            stream_queue: 256,
            heartbeat_linger_ms: 50,
            report_linger_ms: 10,
            max_running_per_namespace: 0,
            max_submits_waiting: 2_048,
        }
    }
}

/// Lease reports that end a report batch's wait for company: a busy store
/// gathers them within a few milliseconds, and waiting on for more only
/// delays the agents whose slots they free.
const REPORTS_ENOUGH: usize = 32;

/// What the dispatcher guards with its one lock.
#[derive(Debug, Default)]
struct State {
    /// Agents with a live session here, as the matcher sees them.
    index: AgentIndex,
    /// Live sessions by agent id.
    sessions: HashMap<Uuid, sessions::Session>,
    /// Compiled placements by task kind and placement (as JSON text), so
    /// the tasks of one placement share one, compiled once (at most
    /// `page::MAX_COMPILED`; one more clears them).
    placements: HashMap<(String, String), Arc<CompiledPlacement>>,
    /// The shared compiled placement of each task read, so a task read
    /// again is not keyed again (at most `page::MAX_TASKS_COMPILED`; one
    /// more clears them).
    task_placements: HashMap<Uuid, Arc<CompiledPlacement>>,
    /// By retried task id: its attempt count when read, and the agents its
    /// attempts failed on (a retry avoids them).
    failed: HashMap<Uuid, (u32, Arc<[switchyard_core::matcher::AgentId]>)>,
    /// What is known about the queue without reading it.
    queue: QueueState,
    /// The tasks agents here refused.
    refused: refusals::Refusals,
    /// Grants waiting for their acknowledgement, and the window over them.
    congestion: congestion::Congestion,
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
    /// Sessions, index, placement cache and queue knowledge.
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
    reports: OnceLock<GroupCommit<LeaseReport, ReportApplied>>,
    /// Heartbeats of every session, group-committed likewise.
    beats: OnceLock<GroupCommit<Beat, BeatOutcome>>,
    /// Submits of every caller, group-committed likewise.
    submits: OnceLock<GroupCommit<Submission, Submitted>>,
    /// Counts signals that a task may be waiting in the queue (a submit
    /// that was not leased on the way in, a re-queue on any replica).
    queued_signals: AtomicU64,
    /// The `queued_signals` count at the start of the last round that left
    /// nothing in the queue (every task it read was leased); `u64::MAX`
    /// until one does. While it equals `queued_signals`, nothing waits and
    /// a submit may be leased on the way in without overtaking anyone.
    clear_at: AtomicU64,
    /// Set while the parked head of the queue is read again (see
    /// [`Dispatcher::recheck_skip`]).
    rechecking_skip: AtomicBool,
    /// The id the next attached session gets.
    next_session: AtomicU64,
    /// Sessions attached here now (read without the state's lock).
    connected: AtomicUsize,
    /// Counts changes to the fleet seen here (a session attached or
    /// detached, an agent's view or load changed, another replica's agent
    /// changed), so live views (WatchAgents, WatchQueue) look again only
    /// when something moved.
    fleet_pulse: tokio::sync::watch::Sender<u64>,
    /// Counts changes to the queue seen here (a task queued or changed, on
    /// any replica), likewise.
    queue_pulse: tokio::sync::watch::Sender<u64>,
    /// The explained queue summary made last, by namespace, shown again
    /// while nothing moved (see [`Dispatcher::queue_summary`]).
    summaries: Mutex<HashMap<String, explain::MadeSummary>>,
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
                reports: OnceLock::new(),
                beats: OnceLock::new(),
                submits: OnceLock::new(),
                queued_signals: AtomicU64::new(0),
                clear_at: AtomicU64::new(u64::MAX),
                rechecking_skip: AtomicBool::new(false),
                next_session: AtomicU64::new(1),
                connected: AtomicUsize::new(0),
                fleet_pulse: tokio::sync::watch::channel(0).0,
                queue_pulse: tokio::sync::watch::channel(0).0,
                summaries: Mutex::new(HashMap::new()),
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

    fn now_ms(&self) -> i64 {
        self.shared.clock.now_ms()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere; the state is still usable.
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the group commits, the dispatch loop, the sweeper and the
    /// store-event listener.
    pub fn spawn(&self) -> Vec<tokio::task::JoinHandle<()>> {
        self.start_group_commits();
        let events = self.shared.store.subscribe();
        vec![
            tokio::spawn(self.clone().dispatch_loop()),
            tokio::spawn(self.clone().sweep_loop()),
            tokio::spawn(self.clone().event_loop(events)),
        ]
    }

    /// The group commits of lease reports, heartbeats and submits. SQLite
    /// serialises writers (one transaction at a time); PostgreSQL commits
    /// several batches at once. Lease reports commit at most two batches at
    /// once: more gained no throughput and slowed the submits racing them
    /// for the database. A report batch waits for company only while the
    /// store is quiet ([`Linger::WhenIdle`]): when it is busy, reports queued
    /// as a slot frees go at once, and a batch stops waiting at
    /// [`REPORTS_ENOUGH`], since the agents' slots wait for the reports.
    /// Heartbeats always linger: a renewal a few tens of milliseconds later
    /// changes nothing, and a thousand agents' heartbeats then cost a few
    /// commits a second. Concurrent submits share a commit, and on both
    /// stores submits commit one batch at a time: a lone submit commits at
    /// once, and the submits that arrive meanwhile wait for that one commit
    /// and go together in the next. On PostgreSQL, several small submit
    /// batches at once each waited for a log flush of its own (`WALWrite`,
    /// `WALSync`), and the grants and reports with them; one at a time, as
    /// many submits share fewer flushes (see BENCHMARKS.md, "Side by side:
    /// submits one batch at a time").
    fn start_group_commits(&self) {
        let in_flight = if self.shared.store.backend() == "sqlite" {
            1
        } else {
            4
        };
        let settings = &self.shared.settings;
        let (store, clock) = (self.shared.store.clone(), self.shared.clock.clone());
        let _ = self.shared.reports.set(GroupCommit::start(
            512,
            in_flight.min(2),
            Linger::WhenIdle {
                wait: Duration::from_millis(settings.report_linger_ms),
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
        let _ =
            self.shared.beats.set(GroupCommit::start(
                1_024,
                in_flight,
                Linger::Always(Duration::from_millis(settings.heartbeat_linger_ms)),
                move |beats: Vec<Beat>| {
                    let (store, now) = (store.clone(), clock.now_ms());
                    async move {
                        crate::metrics::timed("heartbeats", store.heartbeats(&beats, now)).await
                    }
                },
            ));
        let (store, clock) = (self.shared.store.clone(), self.shared.clock.clone());
        let _ = self.shared.submits.set(GroupCommit::start(
            submit::SUBMIT_BATCH,
            1,
            Linger::None,
            move |submissions: Vec<Submission>| {
                let (store, now) = (store.clone(), clock.now_ms());
                async move {
                    crate::metrics::timed("submit_many", store.submit_many(&submissions, now)).await
                }
            },
        ));
    }

    /// Applies lease reports of a session, group-committed with other
    /// sessions' reports (directly when the group commits are not started,
    /// as in unit tests). The slot of a lease a final report ended
    /// (`ReportApplied::ended`) stays taken in the index until the caller
    /// calls [`Dispatcher::lease_ended`]: the session does so only after it
    /// has queued the report's acknowledgement, so that the agent hears its
    /// lease is over before any grant that reuses the slot.
    pub async fn report(&self, reports: Vec<LeaseReport>) -> Result<Vec<Result<ReportApplied>>> {
        match self.shared.reports.get() {
            Some(group) => group.submit(reports).await,
            None => {
                self.shared
                    .store
                    .apply_reports(&reports, self.now_ms())
                    .await
            }
        }
    }

    /// Applies a session's heartbeat, group-committed with other sessions';
    /// one with nothing to write goes nowhere.
    pub async fn heartbeat(&self, beat: Beat) -> Result<BeatOutcome> {
        if beat.is_empty() {
            return Ok(BeatOutcome::NOTHING);
        }
        let mut results = match self.shared.beats.get() {
            Some(group) => group.submit(vec![beat]).await?,
            None => {
                let now = self.now_ms();
                self.shared
                    .store
                    .heartbeats(std::slice::from_ref(&beat), now)
                    .await?
            }
        };
        results.pop().unwrap_or_else(|| {
            Err(Error::Corrupt {
                context: "applying a heartbeat",
                detail: "no result".to_owned(),
            })
        })
    }

    /// Asks the dispatch loop to run a round soon.
    pub fn wake(&self) {
        self.shared.wake.notify_one();
    }

    /// Subscribes to task-change notifications (task ids), from every
    /// replica while the [`Following`] is held (the others are told first).
    pub async fn watch_tasks(&self) -> (broadcast::Receiver<Uuid>, Following) {
        let following = self.shared.store.follow_tasks().await;
        (self.shared.task_changes.subscribe(), following)
    }

    /// Tells watchers that `task_id` changed.
    fn task_changed(&self, task_id: Uuid) {
        let _ = self.shared.task_changes.send(task_id);
        self.queue_moved();
    }

    /// Changes to the fleet seen here: the value moves on each (no more
    /// than that; a follower reads the store for what changed), those made
    /// on another replica while the [`Following`] is held.
    pub async fn follow_fleet(&self) -> (tokio::sync::watch::Receiver<u64>, Following) {
        let following = self.shared.store.follow_dispatch().await;
        (self.fleet_pulse(), following)
    }

    /// [`Dispatcher::follow_fleet`] without its hold, for a follower that
    /// holds [`Dispatcher::follow_queue`]'s (which reads the fleet's
    /// changes too).
    pub fn fleet_pulse(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.fleet_pulse.subscribe()
    }

    /// Changes to the queue seen here, likewise (a task leased or ended
    /// on another replica, while the [`Following`] is held).
    pub async fn follow_queue(&self) -> (tokio::sync::watch::Receiver<u64>, Following) {
        let following = self.shared.store.follow_tasks().await;
        (self.shared.queue_pulse.subscribe(), following)
    }

    /// Notes a change to the fleet for its followers (a counter bumped;
    /// nothing is read).
    fn fleet_moved(&self) {
        self.shared
            .fleet_pulse
            .send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Notes a change to the queue for its followers.
    fn queue_moved(&self) {
        self.shared
            .queue_pulse
            .send_modify(|n| *n = n.wrapping_add(1));
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
}

#[cfg(test)]
mod tests;
