//! A session's first message, `Hello`: who the agent is (checked against
//! the caller and the epoch it registered with), and the leases it still
//! holds after a reconnect, which the server resumes if it agrees, and
//! revokes otherwise. Leases the store holds for the agent that the new
//! session does not (the process that held them is gone) count as lost
//! attempts, and their tasks go back to the queue.

use serde_json::json;
use switchyard_core::resources::Held;
use switchyard_proto::v1 as pb;
use tracing::warn;
use uuid::Uuid;

use crate::api::{Api, parse_id};
use crate::auth::{Caller, Need};
use crate::error::{Error, Result};
use crate::model::{
    AgentParts, AgentRecord, Completion, CompletionOutcome, LeaseRecord, RevocationCause,
};
use crate::store::Following;
use crate::wire::session::revocation;

/// A session the server agreed to open.
pub(super) struct Opened {
    /// The agent, as stored once the session is READY.
    pub record: AgentRecord,
    /// The leases it still holds that the server resumed.
    pub resumed: Vec<String>,
    /// The leases it said it holds that the server does not.
    pub revoked: Vec<pb::LeaseRevocation>,
    /// What the resumed leases hold on the agent, by task.
    pub held: Held,
    /// The other replicas' events (tasks queued, the agent changed, its
    /// leases ended or revoked elsewhere), read while the session holds it.
    pub following: Following,
}

/// What the agent hears of a held lease the server does not hold for it.
const UNKNOWN_LEASE: &str = "the server no longer holds this lease for the agent";

impl Api {
    /// Reads and checks the Hello, resumes or revokes the held leases,
    /// counts the orphaned ones lost, and marks the agent READY.
    pub(super) async fn open_session(&self, caller: &Caller, hello: pb::Hello) -> Result<Opened> {
        let agent_id = parse_id("hello.agent_id", &hello.agent_id)?;
        // Only who it is and its epoch are checked here: the documents are
        // read once, as the session's update stores them.
        let record = self
            .store
            .agents_by_ids(&[agent_id], AgentParts::Listing)
            .await?
            .pop()
            .ok_or_else(|| Error::NotFound {
                what: "agent",
                id: agent_id.to_string(),
            })?;
        if !caller.sees(&record.namespace) {
            return Err(Error::NotFound {
                what: "agent",
                id: agent_id.to_string(),
            });
        }
        caller.require(Need::Agent, &record.namespace)?;
        if hello.session_epoch != record.session_epoch {
            return Err(Error::FailedPrecondition(format!(
                "session epoch {} is not the agent's current epoch {}; register again",
                hello.session_epoch, record.session_epoch
            )));
        }
        // Once the Hello is checked (a refused one opens nothing), and
        // before its leases and its record are read for the session, so
        // nothing the others change after them goes unheard (the epoch read
        // above is checked again as the agent is marked READY).
        let following = self.store.follow_dispatch().await;
        let (resumed, revoked, held) = self.resume(agent_id, &hello.held_leases).await?;
        let epoch = record.session_epoch;
        let record = self
            .store
            .ready_for_session(agent_id, epoch, self.now_ms())
            .await?
            .ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "session epoch {epoch} is no longer the agent's current epoch; register again"
                ))
            })?;
        Ok(Opened {
            record,
            resumed,
            revoked,
            held,
            following,
        })
    }

    /// Resumes what the agent still holds, if the store agrees: the leases
    /// resumed (acknowledged and renewed) and those revoked. A resumed lease
    /// may end between the check and the acknowledgement (another replica's
    /// sweeper revoked the grant, or it expired): the agent then hears it is
    /// gone. The live leases it did not name are counted lost. Also answers
    /// what the resumed leases hold.
    async fn resume(
        &self,
        agent_id: Uuid,
        held: &[pb::HeldLease],
    ) -> Result<(Vec<String>, Vec<pb::LeaseRevocation>, Held)> {
        let now = self.now_ms();
        let mut resumed = Vec::new();
        let mut revoked = Vec::new();
        let mut acks: Vec<(Uuid, u64)> = Vec::new();
        for lease in held {
            let id = parse_id("hello.held_leases.lease_id", &lease.lease_id).ok();
            let stored = match id {
                Some(id) => self.store.get_lease(id).await.ok(),
                None => None,
            };
            let valid = stored.as_ref().is_some_and(|l| {
                l.agent_id == agent_id
                    && l.fencing_token == lease.fencing_token
                    && l.state.is_live()
                    && l.expires_at_ms > now
            });
            match (valid, id) {
                (true, Some(id)) => {
                    resumed.push(lease.lease_id.clone());
                    acks.push((id, lease.fencing_token));
                }
                _ => revoked.push(unknown(&lease.lease_id, &lease.task_id)),
            }
        }
        if !acks.is_empty() {
            self.store.ack_leases(agent_id, &acks, now).await?;
            self.store.renew_leases(agent_id, now).await?;
        }
        let live = self.store.agent_leases(agent_id).await?;
        resumed.retain(|id| {
            let still = live.iter().any(|l| l.id.to_string() == *id);
            if !still {
                let task = held
                    .iter()
                    .find(|h| h.lease_id == *id)
                    .map(|h| h.task_id.as_str());
                revoked.push(unknown(id, task.unwrap_or_default()));
            }
            still
        });
        let orphaned: Vec<&LeaseRecord> = live
            .iter()
            .filter(|l| !resumed.contains(&l.id.to_string()))
            .collect();
        self.count_lost(agent_id, &orphaned).await?;
        let held = Held::of(
            live.iter()
                .filter(|l| resumed.contains(&l.id.to_string()))
                .map(|l| (l.task_id, l.claim.clone())),
        );
        Ok((resumed, revoked, held))
    }

    /// Leases of the agent its new session does not hold: left alone, every
    /// heartbeat of the new session would renew them forever, so they count
    /// as lost attempts and their tasks go back.
    async fn count_lost(&self, agent_id: Uuid, orphaned: &[&LeaseRecord]) -> Result<()> {
        if orphaned.is_empty() {
            return Ok(());
        }
        let lost: Vec<Completion> = orphaned
            .iter()
            .map(|l| Completion {
                lease_id: l.id,
                task_id: l.task_id,
                agent_id,
                fencing_token: l.fencing_token,
                outcome: CompletionOutcome::Failed {
                    error: json!({"message": "the agent reconnected without this lease (restarted?)",
                                  "code": "lease_lost", "retryable": true}),
                    retryable: true,
                },
            })
            .collect();
        warn!(agent = %agent_id, leases = lost.len(), "new session does not hold its leases; counting them lost");
        self.store.complete_leases(&lost, self.now_ms()).await?;
        self.dispatcher.wake();
        Ok(())
    }
}

/// A revocation of a held lease the server does not know.
fn unknown(lease_id: &str, task_id: &str) -> pb::LeaseRevocation {
    revocation(
        lease_id,
        task_id,
        RevocationCause::UnknownLease,
        UNKNOWN_LEASE,
    )
}
