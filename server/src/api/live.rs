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
use crate::model::Page;
use crate::wire;

/// The shortest wait between two looks.
const MIN_GAP: Duration = Duration::from_millis(500);
/// A look waits this many times as long as the last read took.
const PACE: u32 = 20;
/// How long a follower waits for a pulse before it looks anyway.
const RECHECK: Duration = Duration::from_secs(5);
/// Agents in one WatchAgents message at most.
const AGENTS_PER_MESSAGE: usize = 500;

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
        };
        tokio::spawn(watch.run());
        Box::pin(ReceiverStream::new(rx))
    }

    async fn run(mut self) {
        // Subscribed before the first read, so no change falls in between.
        let mut pulse = self.api.dispatcher.follow_fleet();
        let mut first = true;
        loop {
            pulse.mark_unchanged();
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

    /// Reads the fleet and sends what changed since the last look (on the
    /// first, everything, the last message marked `synced`). False when
    /// the caller left.
    async fn look(&mut self, first: bool) -> Result<bool> {
        let mut current: HashMap<Uuid, pb::Agent> = HashMap::new();
        let mut page = Page {
            size: 1000,
            after: None,
        };
        loop {
            let (agents, next) = self
                .api
                .store
                .list_agents(&self.namespace, &[], &page)
                .await?;
            for agent in &agents {
                if self
                    .selector
                    .as_ref()
                    .is_none_or(|s| s.satisfied_by(&agent.document))
                {
                    current.insert(agent.id, wire::agent(agent, false));
                }
            }
            match next {
                Some(token) => page.after = Some(token),
                None => break,
            }
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
        if !first && changed.is_empty() && removed.is_empty() {
            return Ok(true);
        }
        let mut batches: Vec<Vec<pb::Agent>> = changed
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
                synced: first && i == last,
            };
            if self.tx.send(Ok(message)).await.is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// One WatchQueue stream: a namespace's queue summary.
pub(super) struct QueueWatch {
    api: Api,
    namespace: String,
    tx: mpsc::Sender<std::result::Result<pb::WatchQueueResponse, Status>>,
    /// The summary last sent (without its time), to send only a change.
    sent: Option<pb::QueueSummary>,
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
        };
        tokio::spawn(watch.run());
        Box::pin(ReceiverStream::new(rx))
    }

    async fn run(mut self) {
        // A parked group waits on the fleet: either moving is a reason to look.
        let mut queue = self.api.dispatcher.follow_queue();
        let mut fleet = self.api.dispatcher.follow_fleet();
        loop {
            queue.mark_unchanged();
            fleet.mark_unchanged();
            let started = Instant::now();
            let summary = match self.api.dispatcher.queue_summary(&self.namespace).await {
                Ok(summary) => wire::queue::summary(&summary, self.api.now_ms()),
                Err(err) => {
                    let _ = self.tx.send(Err(err.into())).await;
                    return;
                }
            };
            let took = started.elapsed();
            let unchanged = self.sent.as_ref().is_some_and(|sent| {
                sent == &pb::QueueSummary {
                    computed_at: sent.computed_at,
                    ..summary.clone()
                }
            });
            if !unchanged {
                self.sent = Some(summary.clone());
                let message = pb::WatchQueueResponse {
                    summary: Some(summary),
                };
                if self.tx.send(Ok(message)).await.is_err() {
                    return;
                }
            }
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
}
