//! An agent as the server keeps it: its record ([`AgentRecord`]) and
//! status, what it registers with, and the writes one heartbeat makes
//! ([`Beat`], [`DocumentWrite`]) and what they did ([`BeatApplied`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use switchyard_core::kinds::HandledKinds;
pub use switchyard_core::matcher::AgentStatus;
use switchyard_core::matcher::AgentView;
use uuid::Uuid;

use super::names::StoredName;

impl StoredName for AgentStatus {
    const WHAT: &'static str = "agent status";
    const NAMES: &'static [(Self, &'static str)] = &[
        (Self::Ready, "ready"),
        (Self::Degraded, "degraded"),
        (Self::Draining, "draining"),
        (Self::Offline, "offline"),
    ];
}

/// How much of each agent a listing reads: the JSON documents are most of
/// a row's bytes, and a listing of thousands of agents seldom needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentParts {
    /// Everything but the documents: `document`, `provenance`, `reported`
    /// and `operator_overrides` are `null` (what ListAgents shows).
    Listing,
    /// The listing and the merged `document` (what matching needs).
    Matching,
    /// The whole record.
    Full,
}

/// A registered agent as the server sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRecord {
    /// Stable across sessions of the same (namespace, name).
    pub id: Uuid,
    /// The namespace it serves.
    pub namespace: String,
    /// Unique within the namespace.
    pub name: String,
    /// The merged document: agent tiers plus the operator tier.
    pub document: Value,
    /// Which tier each value of `document` came from.
    pub provenance: Value,
    /// Values the merge refused, with reasons.
    pub rejections: Value,
    /// The agent's own merged document before the operator tier.
    pub reported: Value,
    /// The operator tier.
    pub operator_overrides: Value,
    /// Bumped on every document change; compare-and-set guard for diffs.
    pub generation: u64,
    /// READY, DEGRADED, DRAINING or OFFLINE, as last written.
    pub status: AgentStatus,
    /// Why the status is what it is.
    pub status_reasons: Vec<String>,
    /// Maximum concurrent leases.
    pub capacity: u32,
    /// Leases held now (GRANTED or ACTIVE), counted from the live leases.
    pub active_leases: u32,
    /// An operator drain is in force.
    pub drained: bool,
    /// The drain's deadline: the leases still held then are revoked and
    /// their tasks requeued. `None`: the drain waits for them.
    pub drain_deadline_ms: Option<i64>,
    /// Labels set at registration.
    pub labels: BTreeMap<String, String>,
    /// What the agent runs as.
    pub runner: String,
    /// The task kinds it handles, as validated patterns (see
    /// [`switchyard_core::kinds`]).
    pub handled_kinds: Vec<String>,
    /// Bumped on every registration; a newer session supersedes older ones.
    pub session_epoch: u64,
    /// When the server last heard from the agent.
    pub last_seen_at_ms: i64,
    /// When the agent first registered.
    pub registered_at_ms: i64,
    /// Registrations that replaced a live session of this name.
    pub contention: NameContention,
}

/// How often registrations under an agent's name replaced a session that
/// was still live: two runners sharing one name replace each other in a
/// loop, each registration ending the other's session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameContention {
    /// Such registrations in a row, each within [`Self::WINDOW_MS`] of the
    /// one before.
    pub takeovers: u32,
    /// When the last one came.
    pub last_at_ms: Option<i64>,
    /// The runner the last one replaced.
    pub replaced_runner: String,
}

impl NameContention {
    /// How close takeovers must come to count as one run of them (the
    /// registration upsert counts with it, `store/sql/agents.rs`).
    pub const WINDOW_MS: i64 = 600_000;

    /// Whether two sessions are contending for the name as of `now_ms`:
    /// a second takeover in a row, the last within the window.
    pub fn contended(&self, now_ms: i64) -> bool {
        self.takeovers >= 2
            && self
                .last_at_ms
                .is_some_and(|at| at > now_ms - Self::WINDOW_MS)
    }

    /// What an operator reads: how many, and which runners.
    pub fn warning(&self, runner: &str) -> String {
        format!(
            "name contended: {} registrations in a row replaced a live session of this name \
             (the last: {runner} replacing {}); two runners share one name: give each its own",
            self.takeovers,
            if self.replaced_runner.is_empty() {
                "an unnamed runner"
            } else {
                &self.replaced_runner
            }
        )
    }
}

impl AgentRecord {
    /// The status matching goes by: DRAINING while an operator drain is in
    /// force, whatever the agent last said.
    pub fn effective_status(&self) -> AgentStatus {
        if self.drained {
            AgentStatus::Draining
        } else {
            self.status
        }
    }

    /// [`AgentRecord::view`], moving the document instead of copying it
    /// (a fleet read for matching builds thousands).
    pub fn into_view(self) -> AgentView {
        let kinds = Arc::new(self.kinds());
        let status = self.effective_status();
        AgentView {
            held: Default::default(),
            agent_id: self.id.into(),
            namespace: self.namespace,
            status,
            capacity: self.capacity,
            active_leases: self.active_leases,
            last_granted_at_ms: None,
            document: Arc::new(self.document),
            kinds,
        }
    }

    /// How the matcher sees the agent: no grant time known (the index that
    /// holds it keeps its own).
    pub fn view(&self) -> AgentView {
        AgentView {
            held: Default::default(),
            agent_id: self.id.into(),
            namespace: self.namespace.clone(),
            status: self.effective_status(),
            capacity: self.capacity,
            active_leases: self.active_leases,
            last_granted_at_ms: None,
            document: Arc::new(self.document.clone()),
            kinds: Arc::new(self.kinds()),
        }
    }

    /// The kinds it handles (none if what is stored does not parse: they
    /// were validated on the way in).
    pub fn kinds(&self) -> HandledKinds {
        HandledKinds::parse(&self.handled_kinds).unwrap_or_default()
    }
}

/// What an agent registers with (an upsert on namespace and name).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRegistration {
    /// The namespace it serves.
    pub namespace: String,
    /// Unique within the namespace.
    pub name: String,
    /// The agent's own merged document.
    pub reported: Value,
    /// The merged document including the operator tier, computed by the
    /// caller (the store does not merge).
    pub document: Value,
    /// Provenance of `document`.
    pub provenance: Value,
    /// Values the merge refused.
    pub rejections: Value,
    /// Maximum concurrent leases.
    pub capacity: u32,
    /// Labels for display and listing.
    pub labels: BTreeMap<String, String>,
    /// What the agent runs as.
    pub runner: String,
    /// The task kinds it handles, validated patterns.
    pub handled_kinds: Vec<String>,
    /// The name of the token registering it (empty on an open server).
    pub registered_by: String,
}

/// One heartbeat's writes (the store applies the heartbeats of many
/// sessions in one transaction).
#[derive(Debug, Clone, PartialEq)]
pub struct Beat {
    /// The agent.
    pub agent_id: Uuid,
    /// Its session; a status is written only while this is still current.
    pub session_epoch: u64,
    /// Renew the agent's live leases (the session skips it while the agent
    /// holds none).
    pub renew: bool,
    /// Record that the agent was heard from (the session does it now and
    /// then, not on every heartbeat: liveness is judged in memory).
    pub touch: bool,
    /// A new status and its reasons, when they changed.
    pub status: Option<(AgentStatus, Vec<String>)>,
    /// A new document (the session applied a diff), when it changed.
    pub document: Option<DocumentWrite>,
    /// The task kinds it handles from now on, when they changed.
    pub kinds: Option<Vec<String>>,
    /// The agent changed (its kinds, or more than volatile facts of its
    /// document): the tasks it refused may be offered to it again.
    pub lift_refusals: bool,
}

impl Beat {
    /// Whether the beat has nothing to write: no renewal, no touch, no
    /// change. Most heartbeats of an idle fleet are such, and cost no store
    /// round trip.
    pub fn is_empty(&self) -> bool {
        !self.renew
            && !self.touch
            && !self.lift_refusals
            && self.status.is_none()
            && self.document.is_none()
            && self.kinds.is_none()
    }
}

/// A document the session computed from diffs, written only if the stored
/// generation is still the one it descends from.
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentWrite {
    /// The stored generation the session's document descends from; the
    /// write happens only if it is still stored.
    pub expected_generation: u64,
    /// The generation to store with it (the session's own, which counts
    /// every diff it applied, written or not; greater than `expected`).
    pub generation: u64,
    /// The agent's own tiers merged (what its diffs apply to).
    pub reported: Value,
    /// With the operator tier merged over it: what the matcher sees.
    pub document: Value,
    /// Which tier every leaf came from.
    pub provenance: Value,
}

/// What one heartbeat's writes did: to the document, and the leases it
/// renewed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeatOutcome {
    /// What became of the document.
    pub applied: BeatApplied,
    /// Every live lease of the agent the beat renewed, with its new expiry
    /// (empty when it renewed none).
    pub renewed: Vec<RenewedLease>,
}

impl BeatOutcome {
    /// A beat that renewed nothing and wrote no document.
    pub const NOTHING: Self = Self {
        applied: BeatApplied::Renewed,
        renewed: Vec::new(),
    };
}

/// A live lease a heartbeat renewed: it now runs until the heartbeat's time
/// plus its own task's TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewedLease {
    /// The lease.
    pub lease_id: Uuid,
    /// Its task.
    pub task_id: Uuid,
    /// When it now expires, in milliseconds since the epoch.
    pub expires_at_ms: i64,
}

/// What one heartbeat's writes did to the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeatApplied {
    /// No document was given (leases renewed, the agent touched, as the
    /// beat asked).
    Renewed,
    /// The document was written; its new generation.
    Written(u64),
    /// The document was not written: the stored generation (held) moved
    /// on meanwhile (an operator change); the session must resync.
    Stale(u64),
}
