//! The sweep, every `sweep_interval_ms` on every replica at once: leases
//! that ran out their TTL expire, grants nobody acknowledged are revoked
//! (after the ack window, stretched while the fleet is slow; each halves
//! the congestion window, see `congestion`),
//! leases past a deadline (an execution timeout, a cancel's grace, a
//! drain's deadline) are ended, queued tasks past their start deadline fail
//! with the explanation as it stood, sessions silent for three heartbeat
//! intervals are closed (the agent is OFFLINE), and every tenth sweep
//! recounts from the store the leases of agents not picked lately and
//! keeps each namespace's output within its bound.

use std::collections::HashMap;
use std::time::Duration;

use switchyard_core::matcher::{AgentId, AgentView, Explanation, Outcome};
use switchyard_core::resources::Held;
use tracing::{info, warn};
use uuid::Uuid;

use super::Dispatcher;
use crate::error::Result;
use crate::model::{AgentStatus, LeaseRecord, RevocationCause, StoredName, TaskRecord, TaskState};

/// Every this many sweeps, the lease counts of quiet agents are checked
/// against the store (see [`Dispatcher::recount_loads`]).
const RECOUNT_EVERY_SWEEPS: u64 = 10;

/// What an agent is told of a lease that expired.
pub(super) const EXPIRED: &str = "lease expired before it was renewed";

impl Dispatcher {
    pub(super) async fn sweep_loop(self) {
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
            if sweeps.is_multiple_of(RECOUNT_EVERY_SWEEPS) {
                if let Err(err) = self.recount_loads().await {
                    warn!(cause = %err, "recounting agents' leases failed");
                }
                match self.shared.store.trim_output().await {
                    Ok(0) => {}
                    Ok(bytes) => info!(
                        bytes,
                        "dropped the oldest output of namespaces past their bound"
                    ),
                    Err(err) => warn!(cause = %err, "trimming namespaces' output failed"),
                }
            }
        }
    }

    /// Expires lapsed leases, revokes grants nobody acknowledged, and closes
    /// sessions that went silent. Safe on every replica at once.
    pub async fn sweep(&self) -> Result<()> {
        let now = self.now_ms();
        let expired = self.shared.store.expire_leases(now, 500).await?;
        metrics::counter!(crate::metrics::EXPIRIES).increment(expired.len() as u64);
        for (lease, task) in &expired {
            info!(lease = %lease.id, task = %task.id, agent = %lease.agent_id, state = task.state.as_str(), "lease expired");
            self.revoke(lease, RevocationCause::Expired, EXPIRED);
            self.lease_ended(lease.agent_id, Some(lease.task_id));
            self.task_changed(task.id);
        }
        count_requeued(&expired);
        let revoke_after = self
            .state()
            .congestion
            .revoke_after(self.shared.settings.ack_window_ms);
        let unacked = self
            .shared
            .store
            .revoke_unacked(None, now - revoke_after, now)
            .await?;
        self.grants_lost(&unacked, now, revoke_after);
        self.unacked_revoked(&unacked, "grant not acknowledged in time");
        let overdue = self.shared.store.reclaim_overdue(now, 500).await?;
        for (lease, task, cause) in &overdue {
            info!(lease = %lease.id, task = %task.id, agent = %lease.agent_id, cause = cause.stored(), state = task.state.as_str(), "lease ended at a deadline");
            metrics::counter!(crate::metrics::DEADLINE_REVOCATIONS, "cause" => cause.stored())
                .increment(1);
            self.revoke(lease, *cause, deadline_passed(*cause));
            self.lease_ended(lease.agent_id, Some(lease.task_id));
            self.task_changed(task.id);
        }
        metrics::counter!(crate::metrics::REQUEUES).increment(
            overdue
                .iter()
                .filter(|(_, t, _)| t.state == TaskState::Queued)
                .count() as u64,
        );
        self.fail_unstarted(now).await?;
        self.close_silent_sessions(now).await?;
        if !expired.is_empty() || !unacked.is_empty() || !overdue.is_empty() {
            self.wake();
        }
        Ok(())
    }

    /// Fails the queued tasks past their start deadline, each with the
    /// explanation as it stood: `unschedulable` if no agent of the fleet
    /// could run it (parked), `start_timeout` if capable agents were busy.
    /// The fleet is read once per namespace.
    async fn fail_unstarted(&self, now: i64) -> Result<()> {
        let overdue = self.shared.store.unstarted_overdue(now, 100).await?;
        let mut fleets = HashMap::new();
        for task in overdue {
            if !fleets.contains_key(&task.namespace) {
                let (fleet, _) = self.fleet(&task.namespace).await?;
                fleets.insert(task.namespace.clone(), fleet);
            }
            let fleet = fleets[&task.namespace].clone();
            let explanation = self.explain_against(&task, fleet).await?;
            let (error, message) = unstarted(&task, &explanation);
            if let Some(failed) = self
                .shared
                .store
                .fail_unstarted(task.id, &error, &message, now)
                .await?
            {
                info!(task = %failed.id, "{message}");
                metrics::counter!(crate::metrics::START_DEADLINES).increment(1);
                self.task_changed(failed.id);
            }
        }
        Ok(())
    }

    /// Sessions silent for three heartbeat intervals: closed; the agent is
    /// OFFLINE (recorded first, so that whoever sees the stream end also
    /// sees the status) and its leases run out their TTL.
    async fn close_silent_sessions(&self, now: i64) -> Result<()> {
        let silent_before = now - 3 * self.shared.settings.heartbeat_interval_ms;
        let silent: Vec<(Uuid, super::SessionId, u64)> = self
            .state()
            .sessions
            .iter()
            .filter(|(_, s)| s.last_seen_ms < silent_before)
            .map(|(id, s)| (*id, s.id, s.epoch))
            .collect();
        for (agent_id, session, epoch) in silent {
            if !self.is_current(agent_id, session) {
                continue;
            }
            self.shared
                .store
                .set_agent_status(agent_id, AgentStatus::Offline, &[], Some(epoch), now)
                .await?;
            if self.detach(agent_id, session) {
                info!(agent = %agent_id, "agent silent for three heartbeat intervals: offline");
            }
        }
        Ok(())
    }

    /// Corrects the index's lease counts of agents connected here from the
    /// store. A slot stays counted if its lease ended where this replica
    /// did not hear of it: another replica's sweeper, with the notification
    /// lost while the listener was disconnected, or a submit whose caller
    /// went away after its agent was reserved. Only agents not picked for
    /// the last `RECOUNT_EVERY_SWEEPS` sweeps are recounted, so no grant
    /// of theirs is in flight and the stored count is the whole truth.
    pub async fn recount_loads(&self) -> Result<usize> {
        let quiet_window = self.shared.settings.sweep_interval_ms
            * i64::try_from(RECOUNT_EVERY_SWEEPS).unwrap_or(10);
        let quiet_before = self.now_ms() - quiet_window;
        let quiet = |v: &AgentView| {
            v.active_leases > 0
                && v.last_granted_at_ms
                    .is_none_or(|at| i64::try_from(at).unwrap_or(i64::MAX) < quiet_before)
        };
        let candidates: Vec<Uuid> = {
            let state = self.state();
            state
                .sessions
                .keys()
                .filter(|id| state.index.get(AgentId::from(**id)).is_some_and(quiet))
                .copied()
                .collect()
        };
        if candidates.is_empty() {
            return Ok(0);
        }
        let mut stored = self.shared.store.live_claims(&candidates).await?;
        let mut corrected = 0;
        let mut state = self.state();
        for agent_id in candidates {
            let key = AgentId::from(agent_id);
            let Some(view) = state.index.get(key).filter(|v| quiet(v)) else {
                continue;
            };
            let claims = stored.remove(&agent_id).unwrap_or_default();
            let count = claims
                .iter()
                .fold(0u32, |n, (_, c)| n.saturating_add(c.slots));
            let held = Held::of(claims);
            if count != view.active_leases || held != *view.held {
                warn!(agent = %agent_id, counted = view.active_leases, stored = count, "lease count corrected from the store");
                state.index.set_held(key, held, count);
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
        let now = self.now_ms();
        let revoked = self
            .shared
            .store
            .revoke_unacked(Some(agent_id), i64::MAX, now)
            .await?;
        self.unacked_revoked(&revoked, "agent left without acknowledging a grant");
        Ok(revoked.len())
    }

    /// Grants revoked for want of an acknowledgement within `revoke_after`:
    /// the congestion window halves (once per period; logged), and an
    /// agent held back that now holds nothing in flight takes work again.
    /// Publishes the window and the grants in flight.
    fn grants_lost(&self, revoked: &[(LeaseRecord, TaskRecord)], now: i64, revoke_after: i64) {
        let mut state = self.state();
        let before = state.congestion.window();
        for (lease, _) in revoked {
            if let Some(agent) = state.congestion.lost(lease.task_id, now, revoke_after) {
                state.index.hold_back(agent.into(), false);
            }
        }
        let (window, in_flight) = (state.congestion.window(), state.congestion.in_flight());
        drop(state);
        if window < before {
            warn!(
                window,
                before,
                in_flight,
                revoke_after_ms = revoke_after,
                "grants went unacknowledged; fewer grants may now wait for acknowledgement"
            );
        }
        metrics::gauge!(crate::metrics::GRANT_WINDOW).set(window as f64);
        metrics::gauge!(crate::metrics::GRANTS_IN_FLIGHT).set(in_flight as f64);
    }

    /// What follows a revocation of grants never acknowledged: the agent is
    /// told (if it is connected here, on a new session, say), its slot is
    /// freed, and watchers hear of the task.
    fn unacked_revoked(&self, revoked: &[(LeaseRecord, TaskRecord)], why: &str) {
        count_requeued(revoked);
        for (lease, task) in revoked {
            info!(lease = %lease.id, task = %task.id, agent = %lease.agent_id, "{why}; revoked");
            self.revoke(lease, RevocationCause::Unacknowledged, why);
            self.lease_ended(lease.agent_id, Some(lease.task_id));
            self.task_changed(task.id);
        }
    }
}

/// What an agent is told of a lease ended at a deadline.
fn deadline_passed(cause: RevocationCause) -> &'static str {
    match cause {
        RevocationCause::Timeout => "the attempt ran past its execution timeout",
        RevocationCause::DrainDeadline => "the agent's drain deadline passed",
        _ => "the cancel's grace ran out",
    }
}

/// The error and history message of a task past its start deadline.
fn unstarted(task: &TaskRecord, explanation: &Explanation) -> (serde_json::Value, String) {
    let parked = matches!(explanation.outcome, Outcome::Parked(_));
    let (code, what) = if parked {
        ("unschedulable", "unschedulable")
    } else {
        ("start_timeout", "start deadline passed")
    };
    let timeout_ms = task.deadlines.start_timeout_ms.unwrap_or_default();
    let message = format!(
        "{what}: not leased within {timeout_ms} ms of coming due; {}",
        explanation.summary
    );
    let error = serde_json::json!({
        "message": message,
        "code": code,
        "retryable": false,
        "details": {"start_timeout_ms": timeout_ms, "explanation": explanation.summary},
    });
    (error, message)
}

/// Counts the tasks the store put back in the queue.
fn count_requeued(reclaimed: &[(LeaseRecord, TaskRecord)]) {
    let requeued = reclaimed
        .iter()
        .filter(|(_, t)| t.state == TaskState::Queued)
        .count();
    metrics::counter!(crate::metrics::REQUEUES).increment(requeued as u64);
}
