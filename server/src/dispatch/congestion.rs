//! Congestion control of grants, per replica: how many grants pushed from
//! here may wait for their acknowledgement at once, and when an agent or
//! the fleet is too slow to be given more.
//!
//! A grant is *in flight* from its push until the agent's first report on
//! the lease is applied (or the lease ends otherwise). Three rules keep an
//! overloaded fleet from being handed more than it can acknowledge in time
//! (grants revoked and granted again would add work when there is none to
//! spare):
//! - **A window** bounds the grants in flight (additive increase,
//!   multiplicative decrease, as TCP's congestion window): it starts at
//!   [`INITIAL_WINDOW`], grows by one per prompt acknowledgement (within
//!   the late threshold: a slower one says more in flight would only wait
//!   longer) while at least half of it is in use (by `1/window` after the
//!   first loss), and halves,
//!   at most once per revocation period and never below [`MIN_WINDOW`], when
//!   a grant from here is revoked unacknowledged. A round stops granting
//!   when the window is full; acknowledgements wake it once a quarter of the
//!   window is free again.
//! - **A late agent is held back**: one with a grant unacknowledged for
//!   longer than [`Congestion::late_after`] gets no more grants (the index
//!   stops offering its slots; its tasks wait as busy, never parked) until
//!   it acknowledges something or holds nothing in flight.
//! - **Revocation backs off when the whole fleet is slow**: acknowledgement
//!   delays are smoothed as TCP smooths round trips (RFC 6298), and a grant
//!   is revoked as unacknowledged only after [`Congestion::revoke_after`]:
//!   the configured ack window, stretched to three times the smoothed delay
//!   plus four deviations, up to [`MAX_STRETCH`] times the ack window.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

/// The fewest grants in flight the window allows.
pub const MIN_WINDOW: f64 = 64.0;
/// The window a replica starts with.
pub const INITIAL_WINDOW: f64 = 1_024.0;
/// The largest window (more grants than this in flight from one replica
/// would not be acknowledged in time by any fleet on one host).
pub const MAX_WINDOW: f64 = 1_048_576.0;
/// How far a slow fleet may stretch the revocation of unacknowledged
/// grants: at most this many ack windows.
pub const MAX_STRETCH: i64 = 6;

/// A grant pushed from here and not yet acknowledged.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    lease_id: Uuid,
    agent_id: Uuid,
    pushed_at_ms: i64,
}

/// The congestion state of one replica (kept under the dispatcher's lock).
#[derive(Debug)]
pub struct Congestion {
    /// Grants in flight, by task.
    in_flight: HashMap<Uuid, InFlight>,
    /// Grants in flight, counted by agent.
    per_agent: HashMap<Uuid, u32>,
    /// Agents held back for a late acknowledgement.
    held_back: HashSet<Uuid>,
    /// Smoothed acknowledgement delay and its deviation, in milliseconds;
    /// `None` until the first sample.
    srtt_ms: Option<f64>,
    rttvar_ms: f64,
    /// How many grants may be in flight.
    window: f64,
    /// Where slow start ends (the window halved at the last loss).
    threshold: f64,
    /// When the window was last halved.
    last_cut_ms: Option<i64>,
    /// A round found the window full; the next acknowledgements that free a
    /// quarter of it wake dispatch.
    blocked: bool,
    /// When late agents were last looked for.
    last_scan_ms: i64,
}

impl Default for Congestion {
    fn default() -> Self {
        Self {
            in_flight: HashMap::new(),
            per_agent: HashMap::new(),
            held_back: HashSet::new(),
            srtt_ms: None,
            rttvar_ms: 0.0,
            window: INITIAL_WINDOW,
            threshold: MAX_WINDOW,
            last_cut_ms: None,
            blocked: false,
            last_scan_ms: i64::MIN,
        }
    }
}

/// What an acknowledgement changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Acked {
    /// Agents that were held back and take work again.
    pub released: Vec<Uuid>,
    /// The window was full for a round and has room again: wake dispatch.
    pub wake: bool,
}

impl Congestion {
    /// How many more grants may be pushed now.
    pub fn room(&self) -> usize {
        (self.window as usize).saturating_sub(self.in_flight.len())
    }

    /// Notes that a round found no room (see [`Acked::wake`]).
    pub fn block(&mut self) {
        self.blocked = true;
    }

    /// Grants in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The window, rounded down.
    pub fn window(&self) -> usize {
        self.window as usize
    }

    /// A grant of `task` (`lease`, to `agent`) was pushed at `now_ms`.
    pub fn pushed(&mut self, task: Uuid, lease: Uuid, agent: Uuid, now_ms: i64) {
        let grant = InFlight {
            lease_id: lease,
            agent_id: agent,
            pushed_at_ms: now_ms,
        };
        if let Some(before) = self.in_flight.insert(task, grant) {
            self.uncount(before.agent_id);
        }
        *self.per_agent.entry(agent).or_default() += 1;
    }

    /// The agent's reports on these leases (task, lease) were applied at
    /// `now_ms`: each grant still in flight is acknowledged and its delay
    /// sampled; the window grows by each acknowledged within `prompt_ms`
    /// (a slower one says more in flight would only wait longer); an agent
    /// held back takes work again.
    pub fn acknowledged(
        &mut self,
        agent: Uuid,
        leases: &[(Uuid, Uuid)],
        now_ms: i64,
        prompt_ms: i64,
    ) -> Acked {
        let mut acked = Acked::default();
        for (task, lease) in leases {
            let Some(grant) = self.in_flight.get(task).copied() else {
                continue;
            };
            if grant.lease_id != *lease {
                continue;
            }
            let in_use = self.in_flight.len() as f64 >= self.window / 2.0;
            self.in_flight.remove(task);
            self.uncount(grant.agent_id);
            let delay = (now_ms - grant.pushed_at_ms).max(0);
            self.sample(delay as f64);
            if in_use && delay < prompt_ms {
                let step = if self.window < self.threshold {
                    1.0
                } else {
                    1.0 / self.window
                };
                self.window = (self.window + step).min(MAX_WINDOW);
            }
        }
        if self.held_back.remove(&agent) {
            acked.released.push(agent);
        }
        if self.blocked && self.room() as f64 >= (self.window / 4.0).max(1.0) {
            self.blocked = false;
            acked.wake = true;
        }
        acked
    }

    /// The grant of `task` is no longer in flight (its lease ended, was
    /// revoked or expired, or its agent left). Returns the agent if it was
    /// held back and now holds nothing in flight (it takes work again).
    pub fn ended(&mut self, task: Uuid) -> Option<Uuid> {
        let grant = self.in_flight.remove(&task)?;
        self.uncount(grant.agent_id);
        (!self.per_agent.contains_key(&grant.agent_id) && self.held_back.remove(&grant.agent_id))
            .then_some(grant.agent_id)
    }

    /// The grant of `task` was revoked unacknowledged at `now_ms` (with the
    /// revocation period `revoke_after_ms` then): the window halves, once
    /// per period. Returns what [`Congestion::ended`] does.
    pub fn lost(&mut self, task: Uuid, now_ms: i64, revoke_after_ms: i64) -> Option<Uuid> {
        if !self.in_flight.contains_key(&task) {
            return None;
        }
        if self
            .last_cut_ms
            .is_none_or(|at| now_ms - at >= revoke_after_ms)
        {
            self.threshold = (self.window / 2.0).max(MIN_WINDOW);
            self.window = self.threshold;
            self.last_cut_ms = Some(now_ms);
        }
        self.ended(task)
    }

    /// The agent's session here ended: its grants are no longer in flight
    /// from here.
    pub fn detached(&mut self, agent: Uuid) {
        if self.per_agent.remove(&agent).is_some() {
            self.in_flight.retain(|_, g| g.agent_id != agent);
        }
        self.held_back.remove(&agent);
    }

    /// The agents with a grant in flight for longer than `late_after_ms`
    /// that are not held back yet, now held back; looked for at most every
    /// `every_ms` (else none).
    pub fn hold_back_late(&mut self, now_ms: i64, late_after_ms: i64, every_ms: i64) -> Vec<Uuid> {
        if now_ms.saturating_sub(self.last_scan_ms) < every_ms || self.in_flight.is_empty() {
            return Vec::new();
        }
        self.last_scan_ms = now_ms;
        let late_from = now_ms - late_after_ms;
        let mut late = Vec::new();
        for grant in self.in_flight.values() {
            if grant.pushed_at_ms <= late_from && self.held_back.insert(grant.agent_id) {
                late.push(grant.agent_id);
            }
        }
        late
    }

    /// The smoothed acknowledgement delay plus four deviations (RFC 6298's
    /// retransmission timeout, before its floor); `None` before any sample.
    fn spread_ms(&self) -> Option<i64> {
        self.srtt_ms
            .map(|srtt| (srtt + 4.0 * self.rttvar_ms).ceil() as i64)
    }

    /// How long a grant may go unacknowledged before its agent is held
    /// back: `floor_ms`, or longer while the fleet's acknowledgements are
    /// slower than that.
    pub fn late_after(&self, floor_ms: i64) -> i64 {
        self.spread_ms().map_or(floor_ms, |s| s.max(floor_ms))
    }

    /// How long a grant may go unacknowledged before it is revoked: the ack
    /// window, stretched to three times the fleet's spread while the fleet
    /// is that slow, up to [`MAX_STRETCH`] ack windows.
    pub fn revoke_after(&self, ack_window_ms: i64) -> i64 {
        let stretched = self.spread_ms().map_or(0, |s| s.saturating_mul(3));
        stretched.clamp(ack_window_ms, ack_window_ms.saturating_mul(MAX_STRETCH))
    }

    fn sample(&mut self, delay_ms: f64) {
        match self.srtt_ms {
            None => {
                self.srtt_ms = Some(delay_ms);
                self.rttvar_ms = delay_ms / 2.0;
            }
            Some(srtt) => {
                self.rttvar_ms = 0.75 * self.rttvar_ms + 0.25 * (srtt - delay_ms).abs();
                self.srtt_ms = Some(0.875 * srtt + 0.125 * delay_ms);
            }
        }
    }

    fn uncount(&mut self, agent: Uuid) {
        if let Some(n) = self.per_agent.get_mut(&agent) {
            *n -= 1;
            if *n == 0 {
                self.per_agent.remove(&agent);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<Uuid> {
        (0..n).map(|_| Uuid::new_v4()).collect()
    }

    #[test]
    fn the_window_bounds_what_is_in_flight_and_grows_with_acknowledgements() {
        let mut c = Congestion::default();
        let agent = Uuid::new_v4();
        let tasks = ids(INITIAL_WINDOW as usize);
        for t in &tasks {
            c.pushed(*t, *t, agent, 0);
        }
        assert_eq!(c.room(), 0);
        c.block();
        // Acknowledging a quarter of the window wakes dispatch once; each
        // acknowledgement of a window in use grows it by one (slow start).
        let quarter = tasks.len() / 4;
        let mut woke = 0;
        for t in &tasks[..quarter] {
            woke += usize::from(c.acknowledged(agent, &[(*t, *t)], 10, 1_000).wake);
        }
        assert_eq!(woke, 1);
        assert_eq!(c.window(), INITIAL_WINDOW as usize + quarter);
        assert_eq!(c.in_flight(), tasks.len() - quarter);
        // A report on a lease that is no longer the task's grant is no ack.
        let stale = c.acknowledged(agent, &[(tasks[quarter], Uuid::new_v4())], 10, 1_000);
        assert_eq!(c.in_flight(), tasks.len() - quarter);
        assert!(!stale.wake);
        // An acknowledgement slower than the prompt threshold does not grow it.
        let slow = tasks[quarter + 1];
        c.acknowledged(agent, &[(slow, slow)], 2_000, 1_000);
        assert_eq!(c.window(), INITIAL_WINDOW as usize + quarter);
    }

    #[test]
    fn a_loss_halves_the_window_once_per_revocation_period_and_never_below_the_floor() {
        let mut c = Congestion::default();
        let agent = Uuid::new_v4();
        let tasks = ids(8);
        for t in &tasks {
            c.pushed(*t, *t, agent, 0);
        }
        c.lost(tasks[0], 5_000, 5_000);
        assert_eq!(c.window(), INITIAL_WINDOW as usize / 2);
        // The rest of the same burst does not cut it again.
        c.lost(tasks[1], 5_100, 5_000);
        assert_eq!(c.window(), INITIAL_WINDOW as usize / 2);
        for (i, t) in tasks[2..].iter().enumerate() {
            c.lost(*t, 10_100 + 5_000 * i as i64, 5_000);
        }
        assert_eq!(c.window(), MIN_WINDOW as usize);
        assert_eq!(c.in_flight(), 0);
        // Past the threshold the window grows by 1/window per acknowledgement
        // (of a window at least half in use): less than one for a window's worth.
        let tasks = ids(MIN_WINDOW as usize);
        for t in &tasks {
            c.pushed(*t, *t, agent, 40_000);
        }
        for t in &tasks {
            c.acknowledged(agent, &[(*t, *t)], 40_001, 1_000);
        }
        assert_eq!(c.window(), MIN_WINDOW as usize);
    }

    #[test]
    fn a_late_agent_is_held_back_until_it_acknowledges_or_holds_nothing() {
        let mut c = Congestion::default();
        let (slow, quick) = (Uuid::new_v4(), Uuid::new_v4());
        let [a, b, q] = [Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()];
        c.pushed(a, a, slow, 0);
        c.pushed(b, b, slow, 0);
        c.pushed(q, q, quick, 900);
        assert_eq!(c.hold_back_late(940, 1_000, 50), Vec::<Uuid>::new());
        assert_eq!(c.hold_back_late(1_000, 1_000, 50), vec![slow]);
        // Looked for again only after `every_ms`, and never twice.
        assert!(c.hold_back_late(1_020, 1_000, 50).is_empty());
        assert!(c.hold_back_late(1_100, 1_000, 50).is_empty());
        assert_eq!(
            c.acknowledged(slow, &[(a, a)], 1_200, 1_000).released,
            vec![slow]
        );
        assert_eq!(c.hold_back_late(1_300, 1_000, 50), vec![slow]);
        // Its last grant revoked, it holds nothing in flight: released.
        assert_eq!(c.lost(b, 5_000, 5_000), Some(slow));
        assert_eq!(c.ended(q), None);
        c.pushed(a, a, slow, 6_000);
        c.detached(slow);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn revocation_waits_longer_while_the_whole_fleet_is_slow() {
        let mut c = Congestion::default();
        assert_eq!(c.revoke_after(5_000), 5_000);
        assert_eq!(c.late_after(1_000), 1_000);
        let agent = Uuid::new_v4();
        for (i, t) in ids(32).into_iter().enumerate() {
            let pushed = i as i64 * 10_000;
            c.pushed(t, t, agent, pushed);
            c.acknowledged(agent, &[(t, t)], pushed + 3_000, 1_000);
        }
        // Acknowledgements take 3 s: revocation waits 9 s, late is 3 s, and
        // slow acknowledgements never grew the window.
        assert_eq!(c.window(), INITIAL_WINDOW as usize);
        assert!((9_000..9_010).contains(&c.revoke_after(5_000)));
        assert!((3_000..3_004).contains(&c.late_after(1_000)));
        // Never past six ack windows.
        let t = Uuid::new_v4();
        c.pushed(t, t, agent, 400_000);
        c.acknowledged(agent, &[(t, t)], 500_000, 1_000);
        assert_eq!(c.revoke_after(5_000), 30_000);
    }
}
