//! Placements busy in a stretch of the queue: a page found a run of their
//! tasks (a backlog) with every agent here that can run them without room.
//! The queue walk leaves their tasks out, beside the parked placements',
//! while the agent index still has no agent with room for them, and for a
//! second at most (then a page reads them again, and finds them busy
//! again or not); a walk that left them out may still find that nothing
//! else waits, which lets a submit be leased on the way in, for as long
//! as the finding is renewed (forgotten two seconds after it was last
//! made).

use std::collections::HashMap;
use std::sync::Arc;

use switchyard_core::index::AgentIndex;
use switchyard_core::placement::CompiledPlacement;

use crate::model::ParkedPlacement;

/// The most distinct busy placements a dispatcher remembers; one more
/// makes it forget them all (the walk finds those still busy again).
const MAX_BUSY_PLACEMENTS: usize = 256;

/// The most busy placements a submit matches to learn whether it may be
/// leased on the way in while their tasks wait.
const MAX_BUSY_CHECKED: usize = 16;

/// Tasks of one busy placement in a page (and half the page at least) from
/// which they are taken to lie in a stretch of the queue, a backlog the
/// walk then leaves out and goes past in one probe. Busy tasks scattered
/// among others are read by the pages that pass them: leaving them out
/// saved no page and made each cost more (every row the page passed is
/// matched against the list of placements left out).
pub(super) const BUSY_STRETCH: usize = 8;

/// How long a placement found busy is left out of the walk at most, while
/// no agent here has room for it: then a page reads its tasks again, and
/// finds it busy again (or not).
const BUSY_TTL_MS: i64 = 1_000;

/// How long a placement found busy is remembered at most without a page
/// finding it so again: what no read confirms (tasks leased by another
/// replica, cancelled) is not tested against the agents for longer. Until
/// then, a finding past [`BUSY_TTL_MS`] still counts for
/// [`BusyPlacements::clear_but_busy`]: while the rounds (at least one a
/// second) read its tasks again, submits need not wait for them.
const BUSY_FORGET_MS: i64 = 2 * BUSY_TTL_MS;

/// A placement found busy: every agent here that can run it without room.
#[derive(Debug)]
struct Busy {
    placement: Arc<CompiledPlacement>,
    /// When a page found it so.
    since_ms: i64,
}

/// The busy placements a dispatcher knows (held in its queue state).
#[derive(Debug, Default)]
pub(super) struct BusyPlacements {
    /// Placements an agent here can run but none has room for, with when
    /// that was found (at most [`MAX_BUSY_PLACEMENTS`]): while no agent here
    /// has room for one, the walk leaves its tasks out, as it does a parked
    /// placement's. Matched on every page, not remembered past a slot.
    placements: HashMap<ParkedPlacement, Busy>,
    /// Counts busy placements forgotten (an agent had room, the finding
    /// was old, or all of them at the cap): their tasks may be leasable.
    pub(super) epoch: u64,
    /// The last walk from the head left nothing waiting that an agent here
    /// can run but the tasks of busy placements, as of these queue signals
    /// and this `epoch`: while both hold and no busy placement has
    /// room, nothing a submit could overtake waits.
    pub(super) clear_at: Option<(u64, u64)>,
}

impl BusyPlacements {
    /// Remembers that a page found every agent here that can run `key`'s
    /// tasks without room, at `now_ms`, with a stretch of them
    /// ([`BUSY_STRETCH`]).
    pub(super) fn note(
        &mut self,
        key: ParkedPlacement,
        placement: Arc<CompiledPlacement>,
        now_ms: i64,
    ) {
        if !self.placements.contains_key(&key) && self.placements.len() >= MAX_BUSY_PLACEMENTS {
            self.placements.clear();
            self.epoch += 1;
        }
        let busy = Busy {
            placement,
            since_ms: now_ms,
        };
        self.placements.insert(key, busy);
        metrics::gauge!(crate::metrics::BUSY_PLACEMENTS).set(self.placements.len() as f64);
    }

    /// The placements still busy at `now_ms`, for the store's queue page to
    /// leave out beside the parked ones: those for which no agent in `index`
    /// has room (the matcher's own choice, as for a task of theirs with no
    /// agent to avoid), found so within [`BUSY_TTL_MS`]. Those with room are
    /// forgotten; the tasks of both are read again.
    pub(super) fn keys(&mut self, index: &AgentIndex, now_ms: i64) -> Vec<ParkedPlacement> {
        self.forget_unbusy(index, now_ms);
        self.placements
            .iter()
            .filter(|(_, busy)| now_ms - busy.since_ms < BUSY_TTL_MS)
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Forgets the busy placements an agent in `index` has room for, or
    /// found so [`BUSY_FORGET_MS`] or more before `now_ms`.
    fn forget_unbusy(&mut self, index: &AgentIndex, now_ms: i64) {
        if self.placements.is_empty() {
            return;
        }
        let before = self.placements.len();
        self.placements.retain(|key, busy| {
            now_ms - busy.since_ms < BUSY_FORGET_MS
                && index
                    .select_best_except(&busy.placement, &key.namespace, &[])
                    .is_none()
        });
        if self.placements.len() < before {
            self.epoch += 1;
            metrics::gauge!(crate::metrics::BUSY_PLACEMENTS).set(self.placements.len() as f64);
        }
    }

    /// Whether the last walk from the head, as of queue signals `signals`,
    /// left only busy placements' tasks waiting and none of those
    /// placements has room at `now_ms` (so a submit leased on the way in
    /// overtakes no task an agent with room could run). Checked only while
    /// at most [`MAX_BUSY_CHECKED`] placements are busy: each is matched.
    pub(super) fn clear_but_busy(&mut self, signals: u64, index: &AgentIndex, now_ms: i64) -> bool {
        let Some((at, epoch)) = self.clear_at else {
            return false;
        };
        if at != signals || epoch != self.epoch || self.placements.len() > MAX_BUSY_CHECKED {
            return false;
        }
        self.forget_unbusy(index, now_ms);
        epoch == self.epoch
    }
}
