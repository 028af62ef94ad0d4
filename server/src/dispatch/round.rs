//! The dispatch round: walk the queue in priority order, page by page,
//! matching each task against the connected agents and granting a page's
//! matches in one store batch, until no agent has room or the queue ends. A
//! parked task is skipped, never a blocker: the walk goes on to lower
//! priorities, and the tasks of placements known to be parked are not read
//! at all; nor are those of placements found busy in a stretch (a backlog:
//! an agent here can run them, none has room) while no agent here has room
//! for them. Each page is matched and granted by `page`. A round grants no
//! more than the congestion window has room for, and never to an agent held
//! back for a late acknowledgement (see `congestion`). A walk from the head
//! that reads to the end of the queue and leaves nothing waiting but the
//! tasks it is granting says so before the grant commits, counting as read
//! the tasks queued during it that its last read reached: under a steady
//! stream of submits, nearly every walk has some.

use std::time::Duration;

use tracing::{debug, warn};

use super::Dispatcher;
use super::queue::{QueuedInWalk, SKIP_TTL_MS, Skip};
use crate::error::Result;
use crate::model::{ParkedPlacement, QueueCursor};

/// Pages one round reads at most; the next wake continues.
const MAX_PAGES: usize = 64;

/// The shortest page read while any slot is free.
const MIN_PAGE: u32 = 16;

/// One round's walk down the queue.
#[derive(Debug)]
pub(super) struct Walk {
    /// The queue signals counted when the round began.
    signals: u64,
    /// The round's time.
    now: i64,
    /// Where the next page starts (`None`: the head).
    cursor: Option<QueueCursor>,
    /// The parked epoch when the round began.
    epoch: u64,
    /// The count of forgotten parked placements last seen.
    seen_unparked: u64,
    /// Whether the walk started at the head of the queue.
    from_head: bool,
    /// Where a walk from the head began (the parked head skipped).
    skip_from: Option<QueueCursor>,
    /// When the skipped head was last read, and how long that holds.
    skip_read: Option<(i64, i64)>,
    /// Just before the first task of this walk from the head that is not
    /// parked (where the next walk from the head may start).
    first_live: Option<QueueCursor>,
    /// Where the first page that left busy placements out began, if no
    /// task before it was found that is not parked (`Some(None)`: the
    /// head): the busy tasks it passed over may be anywhere after it.
    busy_from: Option<Option<QueueCursor>>,
    /// The busy epoch when a page first left busy placements out (their
    /// tasks wait unread), if one did.
    busy_epoch: Option<u64>,
    /// No agent had a free slot.
    full: bool,
    /// The walk reached the end of the queue.
    walked: bool,
    /// The queue signals as of which the walk read to the end of the
    /// queue every task queued since it began (`None`: as of `signals`).
    clear_from: Option<u64>,
    /// Leases granted.
    granted: usize,
    /// Tasks read and left waiting that an agent here could run.
    left: usize,
    /// The shortest page to read next: it doubles after every page that
    /// left tasks behind, so a walk past many parked tasks soon reads whole
    /// batches and goes as deep as it did with whole batches.
    min_page: u32,
}

impl Walk {
    /// A read from `from` reached the end of the queue, begun `before` (the
    /// queue signals then, and what was queued in this walk by then): if
    /// every task queued since the walk began was placed where the read
    /// reaches, the walk has read them all, as of those signals.
    fn read_to_end(&mut self, before: (u64, Option<QueuedInWalk>), from: Option<QueueCursor>) {
        let (signals, queued) = before;
        if queued.is_some_and(|q| q.from == self.signals && q.read_from(signals, from)) {
            self.clear_from = Some(signals);
        }
    }
}

#[cfg(test)]
impl Walk {
    /// Where the walk starts reading (`None`: the head).
    pub(super) fn starts_at(&self) -> Option<QueueCursor> {
        self.skip_from
    }

    /// Where its next page starts (`None`: the head).
    pub(super) fn cursor(&self) -> Option<QueueCursor> {
        self.cursor
    }

    /// Whether it reached the end of the queue.
    pub(super) fn walked(&self) -> bool {
        self.walked
    }
}

impl Dispatcher {
    /// Runs rounds whenever woken, when a delayed task comes due, and now
    /// and then unprompted (missed notifications, due times past the ones
    /// kept), until shutdown.
    pub(super) async fn dispatch_loop(self) {
        let recheck = Duration::from_millis(self.shared.settings.recheck_ms);
        loop {
            if self.stopping() {
                return;
            }
            self.take_due(self.now_ms());
            match self.dispatch_round().await {
                // A full batch was granted: there may be more right away.
                Ok(granted) if granted > 0 => continue,
                Ok(_) => {}
                Err(err) => warn!(cause = %err, "dispatch round failed"),
            }
            let wait = self
                .until_due(self.now_ms())
                .map_or(recheck, |due| due.min(recheck));
            let _ = tokio::time::timeout(wait, self.shared.wake.notified()).await;
        }
    }

    /// One round. It reads at most `MAX_PAGES` pages; if it stops there
    /// with slots free, the next one goes on from where it stopped, and the
    /// one after that starts at the head again. Returns how many leases
    /// were granted.
    pub async fn dispatch_round(&self) -> Result<usize> {
        if self.stopping() || self.state().sessions.is_empty() {
            return Ok(0);
        }
        self.hold_back_late(self.now_ms());
        let Some(mut walk) = self.start_walk() else {
            return Ok(0);
        };
        for _ in 0..MAX_PAGES {
            if !self.walk_page(&mut walk).await? {
                break;
            }
        }
        self.finish_walk(&walk);
        Ok(walk.granted)
    }

    /// Where this round starts: where the last stopped with slots free, or
    /// the head, past its parked part while that is known. `None` when
    /// every due task is known to be parked and nothing came since.
    pub(super) fn start_walk(&self) -> Option<Walk> {
        let signals = self.signals();
        let now = self.now_ms();
        let (mut cursor, epoch, skip, seen_unparked) = {
            let mut state = self.state();
            let q = &mut state.queue;
            let resume = q.resume.take();
            q.in_walk = resume.is_none().then(|| QueuedInWalk::since(signals));
            (resume, q.parked_epoch, q.skip, q.unparked)
        };
        let from_head = cursor.is_none();
        let mut skip_read = None;
        let skip = skip.filter(|_| from_head);
        if let Some(skip) = skip
            && (skip.signals != signals || skip.parked_epoch != epoch)
        {
            debug!(
                queued_since = signals.wrapping_sub(skip.signals),
                unparked = skip.parked_epoch != epoch,
                "the parked head of the queue is read again"
            );
        } else if let Some(skip) = skip {
            if now - skip.made_at_ms >= skip.ttl_ms {
                // Read the head again beside this round, not in it.
                self.spawn_recheck_skip();
            }
            skip_read = Some((skip.made_at_ms, skip.ttl_ms));
            match skip.to {
                Some(to) => cursor = Some(to),
                None => {
                    self.mark_clear(signals);
                    return None;
                }
            }
        }
        Some(Walk {
            signals,
            now,
            cursor,
            epoch,
            seen_unparked,
            from_head,
            skip_from: cursor,
            skip_read,
            first_live: None,
            busy_from: None,
            busy_epoch: None,
            full: false,
            walked: false,
            clear_from: None,
            granted: 0,
            left: 0,
            min_page: MIN_PAGE.min(self.shared.settings.batch_size),
        })
    }

    /// Reads and matches one page; whether the walk goes on. A page is as
    /// long as the free slots could use (twice over, for tasks only busy
    /// agents match), up to the batch size: under load a round fills a few
    /// freed slots, and reading and decoding a whole batch of tasks for them
    /// is most of the round's cost.
    pub(super) async fn walk_page(&self, walk: &mut Walk) -> Result<bool> {
        let batch = self.shared.settings.batch_size;
        let (free, room) = {
            let mut state = self.state();
            let room = state.congestion.room();
            if room == 0 {
                // Grants in flight fill the window: acknowledgements wake
                // the next round.
                state.congestion.block();
            }
            (state.index.free_slots(u64::from(batch)), room)
        };
        let free = free.min(room as u64);
        if free == 0 {
            walk.full = true;
            return Ok(false);
        }
        let limit = u32::try_from(free.saturating_mul(2))
            .unwrap_or(u32::MAX)
            .clamp(walk.min_page, batch);
        let (mut parked, unparked, busy) = {
            let mut state = self.state();
            let state = &mut *state;
            let busy = state.queue.busy.keys(&state.index, walk.now);
            let busy = (!busy.is_empty()).then_some((busy, state.queue.busy.epoch));
            (state.queue.parked_keys(), state.queue.unparked, busy)
        };
        if unparked != walk.seen_unparked {
            // Tasks passed over may be placeable now: start again.
            walk.seen_unparked = unparked;
            walk.cursor = None;
            walk.left = 0;
            walk.from_head = true;
            walk.first_live = None;
            walk.busy_from = None;
            walk.busy_epoch = None;
        }
        if let Some((busy, epoch)) = busy {
            let first = walk.busy_epoch.is_none();
            walk.busy_epoch.get_or_insert(epoch);
            if walk.first_live.is_none() && walk.busy_from.is_none() {
                walk.busy_from = Some(walk.cursor);
            }
            parked.extend(busy);
            // The page would leave the busy tasks out, but read each to do
            // so, and they lie in a stretch: the first page that leaves
            // them out goes on from the first task neither parked nor busy.
            if first && !self.go_past(walk, &parked).await? {
                return Ok(false);
            }
        }
        let store = &self.shared.store;
        let (from, before) = (walk.cursor, self.before_read());
        let read = store.queued_tasks(None, walk.now, from.as_ref(), &parked, limit);
        let tasks = crate::metrics::timed("queued_tasks", read).await?;
        let Some(last) = tasks.last() else {
            walk.walked = true;
            walk.read_to_end(before, from);
            return Ok(false);
        };
        walk.cursor = Some(QueueCursor::after(last));
        let matched = self.match_page(&tasks, walk.now, room).await?;
        let to_end = tasks.len() < limit as usize && !matched.outcome.window_full;
        let left = tasks.len() - matched.requests.len() - matched.outcome.parked;
        let clear = to_end && walk.left + left == 0;
        if clear {
            walk.read_to_end(before, from);
            // Nothing the walk read waits but what it is about to grant,
            // reserved already: a submit need not wait for the grant's
            // commit to be leased on the way in.
            self.mark_walk_clear(walk);
        }
        let granted = self.grant_matched(matched, walk.now).await;
        if clear && granted.as_ref().map_or(true, |p| p.refused > 0) {
            // A grant refused or failed: its task may wait after all.
            self.note_queued();
        }
        let page = granted?;
        if walk.first_live.is_none()
            && let Some(i) = page.first_live
        {
            walk.first_live = Some(QueueCursor::before(&tasks[i]));
        }
        walk.granted += page.granted;
        walk.left += tasks.len() - page.granted - page.parked;
        if page.window_full {
            // The next round starts at the head, not past what this page
            // left unread.
            walk.full = true;
            return Ok(false);
        }
        if page.granted < tasks.len() {
            walk.min_page = limit.saturating_mul(2).min(batch);
        }
        if tasks.len() < limit as usize {
            walk.walked = true;
            return Ok(false);
        }
        if page.first_live.is_none() {
            // A whole page of parked tasks, and more may follow: a page
            // leaves them out but reads each to do so. Go on from the
            // first task that is not parked, found without reading them.
            let parked = self.state().queue.parked_keys();
            return self.go_past(walk, &parked).await;
        }
        Ok(true)
    }

    /// Moves the walk on to just before the first task after its cursor
    /// that is not of a placement in `left_out`, found without reading the
    /// tasks it passes (`first_unparked`); whether there is one (if not,
    /// the walk has reached the end of what it reads).
    async fn go_past(&self, walk: &mut Walk, left_out: &[ParkedPlacement]) -> Result<bool> {
        let (from, before) = (walk.cursor, self.before_read());
        let next = self
            .shared
            .store
            .first_unparked(walk.now, from.as_ref(), left_out);
        match crate::metrics::timed("first_unparked", next).await? {
            Some(at) => {
                walk.cursor = Some(QueueCursor::before_place(at.priority, at.rank, at.task_id));
                Ok(true)
            }
            None => {
                walk.walked = true;
                walk.read_to_end(before, from);
                Ok(false)
            }
        }
    }

    /// The queue signals counted just before a read of the queue, and what
    /// this walk from the head has heard queued since it began, read
    /// together (a task's place is noted under the same lock as its
    /// signal): every task they count was stored before the read began.
    fn before_read(&self) -> (u64, Option<QueuedInWalk>) {
        let state = self.state();
        (self.signals(), state.queue.in_walk)
    }

    /// Records that nothing an agent here can run waits, as of the queue
    /// signals the walk read to the end at (its own if it did not say),
    /// if the walk began at the head and left nothing waiting that an
    /// agent here can run (busy placements' tasks aside, while none of
    /// them is forgotten).
    fn mark_walk_clear(&self, walk: &Walk) {
        if !walk.from_head || walk.left > 0 {
            return;
        }
        let signals = walk.clear_from.unwrap_or(walk.signals);
        match walk.busy_epoch {
            None => self.mark_clear(signals),
            Some(epoch) => {
                let mut state = self.state();
                if state.queue.busy.epoch == epoch {
                    state.queue.busy.clear_at = Some((signals, epoch));
                }
            }
        }
    }

    /// What the walk learned: whether nothing runnable waits, how far the
    /// head is parked, where the next round goes on.
    pub(super) fn finish_walk(&self, walk: &Walk) {
        if walk.walked {
            self.mark_walk_clear(walk);
        }
        if walk.from_head {
            let to = match (
                walk.busy_from,
                walk.first_live,
                walk.walked,
                walk.cursor.or(walk.skip_from),
            ) {
                // Parked up to where busy tasks were left out, unread.
                (Some(from), ..) => from.map(Some),
                (None, Some(at), _, _) => Some(Some(at)),
                (None, None, true, _) => Some(None),
                // Every task read was parked: up to the last one.
                (None, None, false, Some(last)) => Some(Some(last)),
                // Nothing read (no free slot): nothing learned.
                (None, None, false, None) => None,
            };
            let mut state = self.state();
            let epoch_holds = state.queue.parked_epoch == walk.epoch;
            // Tasks queued while the walk was under way leave what it
            // learned true, as far as the foremost of them.
            let queued = state.queue.in_walk.take();
            let now_signals = self.signals();
            let (to, signals) = match to {
                Some(to) => match queued
                    .filter(|q| q.from == walk.signals)
                    .and_then(|q| q.shorten(now_signals, to))
                {
                    Some(to) => (Some(to), now_signals),
                    None => (Some(to), walk.signals),
                },
                None => (None, walk.signals),
            };
            debug!(
                ?to,
                walked = walk.walked,
                queued_since = now_signals - walk.signals,
                read_to_end_at = ?walk.clear_from.map(|at| at - walk.signals),
                left = walk.left,
                standing = signals == now_signals,
                "a walk from the head ended"
            );
            let (made_at_ms, ttl_ms) = walk.skip_read.unwrap_or((walk.now, SKIP_TTL_MS));
            state.queue.skip = to.filter(|_| epoch_holds).map(|to| Skip {
                to,
                signals,
                parked_epoch: walk.epoch,
                made_at_ms,
                ttl_ms,
            });
        }
        if !walk.walked && !walk.full {
            self.state().queue.resume = walk.cursor;
        }
    }
}
