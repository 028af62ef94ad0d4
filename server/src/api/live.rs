//! The live views of the fleet and the queue: `WatchAgents` (every agent
//! once, then each one that changed, and those gone) and `WatchQueue` (the
//! queue summary, again whenever it changed). Both wake on the
//! dispatcher's pulses (a session here attached or detached, a load or
//! document changed, another replica's agent or task changed), read the
//! store for what is true across replicas, and send only what differs
//! from what they sent. They look again every few seconds anyway (what
//! other replicas' agents report is heard only from the store), and never
//! more often than their last read allows: a follower waits at least
//! [`PACE`] times as long as its read took, and at least [`MIN_GAP`], so
//! an open console costs the store a bounded share however busy the fleet.
//!
//! A look that finds nothing new still sends a message when nothing was
//! sent for [`RECHECK`] (an empty WatchAgents message, the summary again):
//! over HTTP/1.1 (the console's gRPC-Web) a caller that left is noticed
//! only when the server writes, and a follower nobody reads would look on
//! for ever. WatchQueue's first look sends the summary made a moment ago
//! for another caller if nothing moved since, else the groups counted at
//! once, then matched against the fleet (which takes a while for a large
//! one) from that same count.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::{Duration, Instant};

use switchyard_core::placement::CompiledPlacement;
use switchyard_proto::v1 as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use uuid::Uuid;

use super::Api;
use crate::error::Result;
use crate::model::{AgentParts, Page, QueueSummary};
use crate::wire;

/// The shortest wait between two looks.
const MIN_GAP: Duration = Duration::from_millis(500);
/// A look waits this many times as long as the last read took.
const PACE: u32 = 20;
/// How long a follower waits for a pulse before it looks anyway.
const RECHECK: Duration = Duration::from_secs(5);
/// Agents in one WatchAgents message at most.
const AGENTS_PER_MESSAGE: usize = 2_000;

/// A follower's stream.
pub(super) type LiveStream<T> = Pin<Box<dyn Stream<Item = std::result::Result<T, Status>> + Send>>;

/// Waits for the next look: a pulse or [`RECHECK`], then no sooner than
/// the pace allows after `last` (which took `took`). False when the caller
/// left or the server is shutting down.
async fn next_look<T>(
    api: &Api,
    pulse: &mut watch::Receiver<u64>,
    other: Option<&mut watch::Receiver<u64>>,
    tx: &mpsc::Sender<T>,
    last: Instant,
    took: Duration,
) -> bool {
    let other_changed = async {
        match other {
            Some(rx) => rx.changed().await.is_ok(),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = pulse.changed() => {}
        _ = other_changed => {}
        () = tokio::time::sleep(RECHECK) => {}
        () = tx.closed() => return false,
        () = api.dispatcher.stopped() => return false,
    }
    let gap = MIN_GAP.max(took * PACE);
    tokio::select! {
        () = tokio::time::sleep_until((last + gap).into()) => true,
        () = tx.closed() => false,
        () = api.dispatcher.stopped() => false,
    }
}

/// One WatchAgents stream: the agents of a namespace a selector picks.
pub(super) struct FleetWatch {
    api: Api,
    namespace: String,
    selector: Option<CompiledPlacement>,
    tx: mpsc::Sender<std::result::Result<pb::WatchAgentsResponse, Status>>,
    /// What was last sent of each agent, to send only what changed.
    sent: HashMap<Uuid, pb::Agent>,
    /// When a message was last sent.
    last_sent: Instant,
}

impl FleetWatch {
    /// Follows the fleet in a task of its own; the stream of what it sends.
    pub(super) fn start(
        api: Api,
        namespace: String,
        selector: Option<CompiledPlacement>,
    ) -> LiveStream<pb::WatchAgentsResponse> {
        let (tx, rx) = mpsc::channel(8);
        let watch = FleetWatch {
            api,
            namespace,
            selector,
            tx,
            sent: HashMap::new(),
            last_sent: Instant::now(),
        };
        tokio::spawn(watch.run());
        Box::pin(ReceiverStream::new(rx))
    }

    async fn run(mut self) {
        // Subscribed before the first read, so no change falls in between.
        let (mut pulse, _following) = self.api.dispatcher.follow_fleet().await;
        let mut first = true;
        loop {
            pulse.mark_unchanged();
            if self.tx.is_closed() {
                return;
            }
            let started = Instant::now();
            let sent = match self.look(first).await {
                Ok(sent) => sent,
                Err(err) => {
                    let _ = self.tx.send(Err(err.into())).await;
                    return;
                }
            };
            if !sent {
                return;
            }
            first = false;
            let took = started.elapsed();
            if !next_look(&self.api, &mut pulse, None, &self.tx, started, took).await {
                return;
            }
        }
    }

    /// Reads the fleet and sends what changed since the last look. The
    /// first look sends every agent, page by page as the store is read (in
    /// name order, so a page can draw the first agents at once), the last
    /// message marked `synced`. False when the caller left.
    async fn look(&mut self, first: bool) -> Result<bool> {
        let mut current: HashMap<Uuid, pb::Agent> = HashMap::new();
        // Documents only to test a selector against: they are most of a row.
        let parts = if self.selector.is_some() {
            AgentParts::Matching
        } else {
            AgentParts::Listing
        };
        let mut page = Page {
            size: 1000,
            after: None,
        };
        let mut fresh: Vec<pb::Agent> = Vec::new();
        loop {
            let (agents, next) = self
                .api
                .store
                .list_agents(&self.namespace, &[], &page, parts)
                .await?;
            for agent in &agents {
                if self
                    .selector
                    .as_ref()
                    .is_none_or(|s| s.satisfied_by(&agent.document))
                {
                    let wire = wire::agent(agent, false);
                    if first {
                        fresh.push(wire.clone());
                    }
                    current.insert(agent.id, wire);
                }
            }
            match next {
                Some(token) => page.after = Some(token),
                None => break,
            }
            if first
                && !fresh.is_empty()
                && !self
                    .send(std::mem::take(&mut fresh), Vec::new(), false)
                    .await
            {
                return Ok(false);
            }
        }
        if first {
            self.sent = current;
            return Ok(self.send(fresh, Vec::new(), true).await);
        }
        let mut changed: Vec<pb::Agent> = current
            .iter()
            .filter(|(id, agent)| self.sent.get(id) != Some(agent))
            .map(|(_, agent)| agent.clone())
            .collect();
        changed.sort_by(|a, b| a.name.cmp(&b.name));
        let removed: Vec<String> = self
            .sent
            .keys()
            .filter(|id| !current.contains_key(id))
            .map(Uuid::to_string)
            .collect();
        self.sent = current;
        if changed.is_empty() && removed.is_empty() && self.last_sent.elapsed() < RECHECK {
            return Ok(true);
        }
        Ok(self.send(changed, removed, false).await)
    }

    /// Sends `agents` (in messages of at most [`AGENTS_PER_MESSAGE`]) and
    /// `removed` (with the last), the last marked `synced` if asked. False
    /// when the caller left.
    async fn send(&mut self, agents: Vec<pb::Agent>, removed: Vec<String>, synced: bool) -> bool {
        self.last_sent = Instant::now();
        let mut batches: Vec<Vec<pb::Agent>> = agents
            .chunks(AGENTS_PER_MESSAGE)
            .map(<[pb::Agent]>::to_vec)
            .collect();
        if batches.is_empty() {
            batches.push(Vec::new());
        }
        let last = batches.len() - 1;
        let mut removed = Some(removed);
        for (i, agents) in batches.into_iter().enumerate() {
            let message = pb::WatchAgentsResponse {
                agents,
                removed_agent_ids: if i == last {
                    removed.take().unwrap_or_default()
                } else {
                    Vec::new()
                },
                synced: synced && i == last,
            };
            if self.tx.send(Ok(message)).await.is_err() {
                return false;
            }
        }
        true
    }
}

/// One WatchQueue stream: a namespace's queue summary.
pub(super) struct QueueWatch {
    api: Api,
    namespace: String,
    tx: mpsc::Sender<std::result::Result<pb::WatchQueueResponse, Status>>,
    /// The summary last sent (without its time), to send only a change.
    sent: Option<pb::QueueSummary>,
    /// When it was sent.
    last_sent: Instant,
}

impl QueueWatch {
    /// Follows the queue in a task of its own; the stream of what it sends.
    pub(super) fn start(api: Api, namespace: String) -> LiveStream<pb::WatchQueueResponse> {
        let (tx, rx) = mpsc::channel(4);
        let watch = QueueWatch {
            api,
            namespace,
            tx,
            sent: None,
            last_sent: Instant::now(),
        };
        tokio::spawn(watch.run());
        Box::pin(ReceiverStream::new(rx))
    }

    async fn run(mut self) {
        // A parked group waits on the fleet: either moving is a reason to look.
        let (mut queue, _following) = self.api.dispatcher.follow_queue().await;
        let mut fleet = self.api.dispatcher.fleet_pulse();
        // First what is at hand: the summary made a moment ago for another
        // caller if it still holds, else the groups as counted, at once
        // (matching them against the fleet follows).
        let mut counted = None;
        if self.api.dispatcher.fresh_summary(&self.namespace).is_none() {
            let count = match self.api.dispatcher.count_queue(&self.namespace).await {
                Ok(count) => count,
                Err(err) => {
                    let _ = self.send_summary(Err(err)).await;
                    return;
                }
            };
            if !self
                .send_summary(Ok(count.summary()))
                .await
                .unwrap_or(false)
            {
                return;
            }
            counted = Some(count);
        }
        loop {
            if counted.is_none() {
                queue.mark_unchanged();
                fleet.mark_unchanged();
            }
            if self.tx.is_closed() {
                return;
            }
            let started = Instant::now();
            let summary = match counted.take() {
                Some(count) => self.api.dispatcher.explain_queue(count).await,
                None => self.api.dispatcher.followed_summary(&self.namespace).await,
            };
            match self.send_summary(summary).await {
                Some(true) => {}
                _ => return,
            }
            let took = started.elapsed();
            if !next_look(
                &self.api,
                &mut queue,
                Some(&mut fleet),
                &self.tx,
                started,
                took,
            )
            .await
            {
                return;
            }
        }
    }

    /// Sends `summary` if it changed, or if nothing was sent for
    /// [`RECHECK`]. `Some(false)` when the caller left, `None` on an error
    /// (sent to the caller).
    async fn send_summary(&mut self, summary: Result<QueueSummary>) -> Option<bool> {
        let summary = match summary {
            Ok(summary) => wire::queue::summary(&summary),
            Err(err) => {
                let _ = self.tx.send(Err(err.into())).await;
                return None;
            }
        };
        let unchanged = self.sent.as_ref().is_some_and(|sent| {
            sent == &pb::QueueSummary {
                computed_at: sent.computed_at,
                ..summary.clone()
            }
        });
        if unchanged && self.last_sent.elapsed() < RECHECK {
            return Some(true);
        }
        self.sent = Some(summary.clone());
        self.last_sent = Instant::now();
        let message = pb::WatchQueueResponse {
            summary: Some(summary),
        };
        Some(self.tx.send(Ok(message)).await.is_ok())
    }
}
