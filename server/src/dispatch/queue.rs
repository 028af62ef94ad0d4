//! What the dispatcher knows about the queue without reading it: signals
//! that a task may be waiting (and whether the last round left the queue
//! clear), when delayed tasks come due, which placements are parked (no
//! agent here can run them, so the walk leaves their tasks out; a
//! placement is its namespace, task kind and placement), how far the
//! head of the queue is parked tasks only, which placements are busy in a
//! stretch of the queue (`busy`), and which concurrency limits a grant
//! found full (their tasks wait unmatched until a lease ends).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use switchyard_core::matcher::{self, AgentView};
use switchyard_core::placement::CompiledPlacement;
use tracing::warn;
use uuid::Uuid;

use super::Dispatcher;
use super::busy::BusyPlacements;
use crate::model::{ParkedPlacement, QueueCursor, TaskRecord};

/// The most distinct parked placements a dispatcher remembers. One more
/// makes it forget them all and find again those whose tasks still wait
/// (each costs a page of the next walk).
const MAX_PARKED_PLACEMENTS: usize = 256;

/// The most distinct due times a dispatcher keeps; past that the latest are
/// dropped, and their tasks are found by the periodic re-check.
const MAX_DUE_TIMES: usize = 1_024;

/// How long a concurrency limit found full holds its tasks back at most
/// without news of a lease ending (a lost notification, say).
const LIMIT_HOLD_MS: i64 = 1_000;

/// How long a [`Skip`] holds before its head is read again (off the
/// rounds' path; see [`Dispatcher::recheck_skip`]). Longer when that read
/// is slow: at most a tenth of the time goes to it.
pub(super) const SKIP_TTL_MS: i64 = 5_000;

/// The head of the queue up to `to` holds only tasks of parked placements
/// (every due queued task, if `to` is `None`): a walk from the head may
/// start at `to`. The store leaves those tasks out of every page, but it
/// still reads each to do so, and a hundred thousand of them cost a page
/// tens of milliseconds (a million, seconds). Valid while nothing was
/// queued ahead of `to` (`signals`) and no parked placement was forgotten
/// (`parked_epoch`). Past `ttl_ms` the head is read again beside the
/// rounds, which go on starting at `to` meanwhile: a delayed task ahead of
/// `to` that came due unsignalled is found then.
#[derive(Debug, Clone, Copy)]
pub(super) struct Skip {
    pub(super) to: Option<QueueCursor>,
    pub(super) signals: u64,
    pub(super) parked_epoch: u64,
    /// When the head up to `to` was last read.
    pub(super) made_at_ms: i64,
    /// How long that reading holds.
    pub(super) ttl_ms: i64,
}

/// What was queued while a walk from the head was under way: a task
/// queued behind where the walk finds the parked head to end does not undo
/// what the walk learned (under a steady stream of submits, every walk
/// would otherwise start from the head again, and read every parked task).
#[derive(Debug, Clone, Copy)]
pub(super) struct QueuedInWalk {
    /// The queue signals counted when the walk began.
    pub(super) from: u64,
    /// Signals since then whose task's place in the queue is known.
    pub(super) placed: u64,
    /// The foremost of those places.
    pub(super) foremost: Option<QueueCursor>,
}

impl QueuedInWalk {
    /// Nothing queued yet since `from`.
    pub(super) fn since(from: u64) -> Self {
        Self {
            from,
            placed: 0,
            foremost: None,
        }
    }

    /// Where a skip that ended at `to` (`None`: past every due task) ends
    /// now, as of `signals`: just before the foremost task queued since
    /// `from`, if that is ahead of `to` (the head up to it was parked as
    /// read); `None` if some signal since did not say where its task is.
    pub(super) fn shorten(
        &self,
        signals: u64,
        to: Option<QueueCursor>,
    ) -> Option<Option<QueueCursor>> {
        if !self.all_placed(signals) {
            return None;
        }
        Some(match self.foremost {
            Some(first)
                if !to.is_some_and(|to| to.reaches(first.priority, first.rank, first.task_id)) =>
            {
                Some(QueueCursor::before_place(
                    first.priority,
                    first.rank,
                    first.task_id,
                ))
            }
            _ => to,
        })
    }

    /// Whether, as of `signals`, every signal since `from` said where its
    /// task is and a walk from `start` (`None`: the head) reaches each.
    pub(super) fn read_from(&self, signals: u64, start: Option<QueueCursor>) -> bool {
        self.all_placed(signals)
            && self.foremost.is_none_or(|first| {
                start.is_none_or(|start| start.reaches(first.priority, first.rank, first.task_id))
            })
    }

    /// Whether every signal from `from` up to `signals` said where its
    /// task is.
    fn all_placed(&self, signals: u64) -> bool {
        signals.checked_sub(self.from) == Some(self.placed)
    }

    /// A task was queued at `place`.
    fn queued(&mut self, place: QueueCursor) {
        self.placed += 1;
        if self
            .foremost
            .is_none_or(|first| place.reaches(first.priority, first.rank, first.task_id))
        {
            self.foremost = Some(place);
        }
    }
}

/// What reading the skipped head of the queue again found.
#[derive(Debug, Clone, Copy)]
pub(super) struct SkippedHead {
    /// The skip read for.
    skip: Skip,
    /// Whether the head up to its end held only parked tasks.
    parked_head: bool,
    /// When it was read.
    read_at_ms: i64,
    /// How long the reading took.
    spent_ms: i64,
}

/// The queue knowledge the dispatcher's lock guards.
#[derive(Debug, Default)]
pub(super) struct QueueState {
    /// Placements no agent here can run (at most [`MAX_PARKED_PLACEMENTS`]):
    /// the queue walk leaves their tasks out, and an agent that connects or
    /// changes is tested against each, to put its tasks back in the walk.
    parked: HashMap<ParkedPlacement, Arc<CompiledPlacement>>,
    /// Placements busy in a stretch of the queue, which the walk leaves out
    /// while no agent here has room for them.
    pub(super) busy: BusyPlacements,
    /// Counts placements forgotten from `parked`; a round that sees it move
    /// walks again from the head, so their oldest tasks go first.
    pub(super) unparked: u64,
    /// Counts changes that put parked tasks back in the walk: placements
    /// forgotten because an agent can run them, or all of them at the cap.
    pub(super) parked_epoch: u64,
    /// Where the last round stopped when it read its most pages with slots
    /// still free: the next round goes on from there, so every task is read
    /// within a few rounds however much waits ahead of it.
    pub(super) resume: Option<QueueCursor>,
    /// How far the head of the queue is parked tasks only, as the last walk
    /// from the head found it.
    pub(super) skip: Option<Skip>,
    /// What was queued since the walk from the head under way began.
    pub(super) in_walk: Option<QueuedInWalk>,
    /// When queued tasks not yet due come due (ms, at most
    /// [`MAX_DUE_TIMES`]): the dispatcher looks at the queue again at each,
    /// as if a task had just been queued.
    due: BTreeSet<i64>,
    /// Concurrency limits a grant found full, by namespace and key (no key:
    /// the namespace's limit), with when: the walk passes over their tasks
    /// without matching them until a lease ends (here or, by the store's
    /// events, anywhere) or [`LIMIT_HOLD_MS`] passed.
    limited: HashMap<(String, Option<String>), i64>,
}

impl QueueState {
    /// A grant of `task` was refused at its concurrency limit.
    pub(super) fn limit_reached(&mut self, task: &TaskRecord, now_ms: i64) {
        let limit = (task.namespace.clone(), task.concurrency_key.clone());
        self.limited.insert(limit, now_ms);
    }

    /// Whether no limit was found full since the last lease ended.
    pub(super) fn holds_none(&self) -> bool {
        self.limited.is_empty()
    }

    /// Whether a limit found full lately holds `task` back.
    pub(super) fn held_by_limit(&self, task: &TaskRecord, now_ms: i64) -> bool {
        if self.limited.is_empty() {
            return false;
        }
        let recent = |at: &i64| now_ms - *at < LIMIT_HOLD_MS;
        let namespace = (task.namespace.clone(), None);
        self.limited.get(&namespace).is_some_and(recent)
            || (task.concurrency_key.is_some()
                && self
                    .limited
                    .get(&(task.namespace.clone(), task.concurrency_key.clone()))
                    .is_some_and(recent))
    }

    /// A lease ended: every limit may have room again.
    pub(super) fn limits_freed(&mut self) {
        if !self.limited.is_empty() {
            self.limited.clear();
        }
    }

    /// Forgets the parked placements `view`'s agent can run; true if any.
    pub(super) fn unpark_for(&mut self, view: &AgentView) -> bool {
        if self.parked.is_empty() || !view.status.takes_work() {
            return false;
        }
        let before = self.parked.len();
        self.parked.retain(|key, placement| {
            key.namespace != view.namespace || !matcher::satisfies(placement, view)
        });
        let unparked = self.parked.len() < before;
        if unparked {
            metrics::gauge!(crate::metrics::PARKED_PLACEMENTS).set(self.parked.len() as f64);
            self.note_unparked();
        }
        unparked
    }

    /// Tasks passed over as parked may be placeable now: the next round
    /// walks from the head, past no remembered parked head.
    pub(super) fn note_unparked(&mut self) {
        self.unparked += 1;
        self.parked_epoch += 1;
    }

    /// Remembers that no agent here can run `key`'s tasks. At the cap, the
    /// placements remembered so far are forgotten first (some may be stale,
    /// their tasks gone): the walk finds the live ones again in a page each.
    /// True when it forgot them, so the queue must be read again before any
    /// submit overtakes their tasks.
    pub(super) fn park(&mut self, key: ParkedPlacement, placement: Arc<CompiledPlacement>) -> bool {
        let cleared = !self.parked.contains_key(&key) && self.parked.len() >= MAX_PARKED_PLACEMENTS;
        if cleared {
            self.parked.clear();
            self.parked_epoch += 1;
        }
        self.parked.insert(key, placement);
        metrics::gauge!(crate::metrics::PARKED_PLACEMENTS).set(self.parked.len() as f64);
        cleared
    }

    /// The parked placements, for the store's queue page.
    pub(super) fn parked_keys(&self) -> Vec<ParkedPlacement> {
        self.parked.keys().cloned().collect()
    }
}

impl Dispatcher {
    /// A task may now be waiting in the queue: no submit is leased on the
    /// way in until a dispatch round has seen the queue empty again.
    pub fn note_queued(&self) {
        self.shared.queued_signals.fetch_add(1, Ordering::SeqCst);
    }

    /// [`Dispatcher::note_queued`] for a task whose place in the queue is
    /// known: a walk may still skip the parked head of the queue if the
    /// task is behind it.
    pub fn note_queued_at(&self, priority: i32, rank: i64, task_id: Uuid) {
        let mut state = self.state();
        let before = self.shared.queued_signals.fetch_add(1, Ordering::SeqCst);
        if let Some(skip) = state.queue.skip.as_mut()
            && skip.signals == before
        {
            if !skip
                .to
                .is_some_and(|to| to.reaches(priority, rank, task_id))
            {
                // Queued ahead of where rounds start: the head before it
                // is still parked, so they start at it.
                skip.to = Some(QueueCursor::before_place(priority, rank, task_id));
            }
            skip.signals = before + 1;
        }
        if let Some(in_walk) = state.queue.in_walk.as_mut() {
            in_walk.queued(QueueCursor {
                priority,
                rank,
                task_id,
            });
        }
    }

    /// A queued task comes due at `at_ms` (a delayed submit, a retry
    /// backing off): the dispatcher looks at the queue again then, rather
    /// than at its next periodic re-check (up to a second later, and up to
    /// `SKIP_TTL_MS` past a remembered walk that found nothing due).
    pub fn note_due(&self, at_ms: i64) {
        if at_ms <= self.now_ms() {
            return;
        }
        let mut state = self.state();
        let due = &mut state.queue.due;
        let earlier = due.first().is_none_or(|first| at_ms < *first);
        due.insert(at_ms);
        if due.len() > MAX_DUE_TIMES {
            due.pop_last();
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
    pub(super) fn take_due(&self, now_ms: i64) {
        let mut state = self.state();
        let due = &mut state.queue.due;
        let mut passed = false;
        while due.first().is_some_and(|first| *first <= now_ms) {
            due.pop_first();
            passed = true;
        }
        drop(state);
        if passed {
            self.note_queued();
        }
    }

    /// Starts [`Dispatcher::recheck_skip`] unless it is under way.
    pub(super) fn spawn_recheck_skip(&self) {
        if self.shared.rechecking_skip.swap(true, Ordering::SeqCst) {
            return;
        }
        let dispatcher = self.clone();
        tokio::spawn(async move {
            dispatcher.recheck_skip().await;
            dispatcher
                .shared
                .rechecking_skip
                .store(false, Ordering::SeqCst);
        });
    }

    /// Reads the head of the queue again, beside the rounds (which go on
    /// starting past it), to check that it still holds only parked tasks
    /// up to where they start: a task ahead of that point with no signal (a
    /// delayed task whose due time was not kept, a notification lost) is
    /// found here. Renews the [`Skip`], or drops it and has a round walk
    /// from the head. The next read comes after ten times this one took,
    /// [`SKIP_TTL_MS`] at least, so that it costs a tenth of the time.
    pub(super) async fn recheck_skip(&self) {
        if let Some(read) = self.read_skipped_head().await {
            self.apply_skipped_head(read);
        }
    }

    /// The reading of [`Dispatcher::recheck_skip`].
    pub(super) async fn read_skipped_head(&self) -> Option<SkippedHead> {
        let now = self.now_ms();
        let (skip, parked) = {
            let state = self.state();
            (state.queue.skip?, state.queue.parked_keys())
        };
        let started = std::time::Instant::now();
        let read = self.shared.store.first_unparked(now, None, &parked).await;
        let parked_head = match &read {
            Ok(first) => match (skip.to, first) {
                (_, None) => true,
                (None, Some(_)) => false,
                (Some(to), Some(first)) => to.reaches(first.priority, first.rank, first.task_id),
            },
            Err(err) => {
                warn!(cause = %err, "cannot read the parked head of the queue again");
                false
            }
        };
        Some(SkippedHead {
            skip,
            parked_head,
            read_at_ms: now,
            spent_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        })
    }

    /// Renews or drops the skip as `read` found its head. The rounds may
    /// have moved its end meanwhile (further, as they lease the tasks past
    /// it, or back, as tasks are queued ahead of it): it is still the skip
    /// read for while it dates from the same reading and no parked
    /// placement was forgotten; a skip made since by a walk from the head
    /// is newer, and left as it is.
    pub(super) fn apply_skipped_head(&self, read: SkippedHead) {
        let mut state = self.state();
        let q = &mut state.queue;
        let Some(current) = q.skip.as_mut().filter(|current| {
            current.parked_epoch == read.skip.parked_epoch
                && current.made_at_ms == read.skip.made_at_ms
        }) else {
            return;
        };
        if read.parked_head {
            current.made_at_ms = read.read_at_ms;
            current.ttl_ms = read.spent_ms.saturating_mul(10).max(SKIP_TTL_MS);
            return;
        }
        q.skip = None;
        drop(state);
        self.note_queued();
        self.wake();
    }

    /// How long until the earliest due time, if any.
    pub(super) fn until_due(&self, now_ms: i64) -> Option<Duration> {
        let first = *self.state().queue.due.first()?;
        Some(Duration::from_millis(
            u64::try_from(first.saturating_sub(now_ms)).unwrap_or(0),
        ))
    }

    /// Whether the last dispatch round left the queue empty and nothing
    /// was queued since.
    pub(super) fn queue_clear(&self) -> bool {
        self.shared.clear_at.load(Ordering::SeqCst)
            == self.shared.queued_signals.load(Ordering::SeqCst)
    }

    /// Whether nothing waits that an agent here with room could run: the
    /// queue is clear, or holds only tasks of busy placements that still
    /// have no room (see `BusyPlacements::clear_but_busy`). A submit is leased
    /// on the way in, and a freed slot or a changed agent wakes no round,
    /// only then.
    pub(super) fn nothing_leasable_waits(&self) -> bool {
        if self.queue_clear() {
            return true;
        }
        let (signals, now) = (self.signals(), self.now_ms());
        let mut state = self.state();
        let state = &mut *state;
        state.queue.busy.clear_but_busy(signals, &state.index, now)
    }

    /// Records that a round starting at `signals` left nothing waiting that
    /// an agent here can run.
    pub(super) fn mark_clear(&self, signals: u64) {
        self.shared.clear_at.store(signals, Ordering::SeqCst);
    }

    /// The queue signals counted so far.
    pub(super) fn signals(&self) -> u64 {
        self.shared.queued_signals.load(Ordering::SeqCst)
    }

    /// After an agent connected or changed: parked tasks it can run wait
    /// again (so no submit overtakes them), and any task that waits gets a
    /// round.
    pub(super) fn changed_agent(&self, unparked: bool) {
        self.fleet_moved();
        if unparked {
            self.note_queued();
        }
        if !self.nothing_leasable_waits() {
            self.wake();
        }
    }
}
