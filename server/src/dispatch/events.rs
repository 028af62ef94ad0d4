//! The store's events, from every replica: a task queued (look at the queue,
//! perhaps when it comes due), a task changed or its output grew (tell
//! watchers), an agent
//! changed (reload it, if connected here), a lease ended by another
//! replica's sweeper (free its slot, tell the agent of an expiry), a lease
//! revoked (tell the agent why).

use tokio::sync::broadcast;
use tracing::warn;
use uuid::Uuid;

use super::Dispatcher;
use super::sweep::EXPIRED;
use crate::model::{RevocationCause, StoreEvent};

impl Dispatcher {
    pub(super) async fn event_loop(self, mut events: broadcast::Receiver<StoreEvent>) {
        loop {
            match events.recv().await {
                Ok(event) => self.on_event(event).await,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    warn!(missed, "store events lagged; re-dispatching");
                    self.note_queued();
                    self.wake();
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    async fn on_event(&self, event: StoreEvent) {
        match event {
            StoreEvent::TaskQueued {
                task_id,
                priority,
                rank,
                not_before_ms,
                ..
            } => {
                self.queue_moved();
                match (priority, rank) {
                    (Some(p), Some(c)) => self.note_queued_at(p, c, task_id),
                    _ => self.note_queued(),
                }
                if let Some(at) = not_before_ms {
                    self.note_due(at);
                }
                self.wake();
            }
            StoreEvent::TaskChanged { task_id, .. } | StoreEvent::TaskOutput { task_id } => {
                self.task_changed(task_id);
            }
            StoreEvent::AgentChanged { agent_id } => self.refresh_agent(agent_id).await,
            // Another replica's sweeper ended a lease of an agent that may be
            // connected here: its slot is free again. An expired lease is
            // news to the agent (it may be working on it still): it hears so
            // before a grant can reuse the slot.
            StoreEvent::LeaseEnded {
                agent_id,
                task_id,
                expired,
            } => {
                if let Some(ended) = expired {
                    self.revoke_ids(
                        agent_id,
                        ended.lease_id,
                        ended.task_id,
                        RevocationCause::Expired,
                        EXPIRED,
                    );
                }
                self.lease_ended(agent_id, task_id);
            }
            StoreEvent::LeaseRevoked {
                lease_id,
                task_id,
                agent_id,
                cause,
                reason,
            } => {
                // Events of older replicas carry no cause; they revoked only
                // for cancels and unacknowledged grants, told as a cancel.
                let cause = cause.unwrap_or(RevocationCause::Canceled);
                self.revoke_ids(agent_id, lease_id, task_id, cause, &reason);
                self.task_changed(task_id);
            }
        }
    }

    /// Reloads a connected agent's document, status and refusals from the
    /// store (an operator changed it, possibly through another replica, or
    /// a snapshot replaced its document), and tells its session to reload
    /// before its next diff.
    pub async fn refresh_agent(&self, agent_id: Uuid) {
        // Followers of the fleet read it from the store, wherever the agent
        // is connected.
        self.fleet_moved();
        if !self.mark_changed(agent_id) {
            return;
        }
        match self.shared.store.get_agent(agent_id).await {
            Ok(record) => {
                let mut view = record.view();
                // The index knows load the store has not committed yet
                // (reservations of a round in flight) and when it last granted.
                if let Some(current) = self.view(agent_id) {
                    view.active_leases = view.active_leases.max(current.active_leases);
                    view.last_granted_at_ms = current.last_granted_at_ms;
                    view.held = current.held;
                }
                self.update_view(view);
            }
            Err(err) => warn!(agent = %agent_id, cause = %err, "cannot refresh agent"),
        }
        match self.shared.store.agent_refusals(agent_id).await {
            Ok(tasks) => self.reload_refusals(agent_id, &tasks),
            Err(err) => warn!(agent = %agent_id, cause = %err, "cannot reload agent refusals"),
        }
    }
}
