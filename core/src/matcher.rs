//! Matching: an agent's [`Verdict`] for a compiled placement, and [`explain`], which ranks the
//! eligible agents deterministically, gives every ineligible agent its reason, summarises them
//! in one line, and tells "no agent could ever take this" ([`Outcome::Parked`]) apart from "the
//! agents that could are busy" ([`Outcome::WaitingForCapacity`]).
//!
//! Definitions:
//! - An agent *satisfies* a placement when it is in the task's namespace, handles the task's kind
//!   (when the placement was compiled for a task, see
//!   [`CompiledPlacement::with_kind`](crate::placement::CompiledPlacement::with_kind)), and its
//!   document meets every hard constraint. A DEGRADED agent whose `provides.X.healthy` is false fails capability
//!   refs to `X` (and only those), so it stays eligible for placements that do not need `X`.
//!   A placement with a resource request (see [`crate::resources`]) is satisfied only by an
//!   agent that could give it what it asks for once its leases end (its offer and slots cover
//!   the request; otherwise [`Ineligibility::TooSmall`], and a task no agent could ever take is
//!   parked).
//! - It is *eligible* when it satisfies the placement, is READY or DEGRADED, and has room: a
//!   free slot (`active_leases < capacity`), or for a resource request free resources that
//!   cover it beside what its leases hold ([`Ineligibility::ResourcesHeld`] otherwise).
//! - It is *capable* (the proto's `AgentVerdict.capable`) when it satisfies the placement but is
//!   not eligible: at capacity, short of free resources, draining or offline.
//! - Ranking among eligible agents, by the placement's [`PlacementPolicy`]: higher satisfied
//!   preference weight first under either; then, to *spread*, higher free capacity ratio
//!   (`(capacity - active) / capacity`, compared exactly), then longest since last grant (never
//!   granted first), then agent id ascending; to *binpack*, exactly the reverse of that load
//!   order: lower free capacity ratio, then most recently granted (never granted last), then
//!   agent id descending — the agent left with the least spare room fills first.
//! - A placement that spreads by a document key (`spread_by`) ranks first, before preferences,
//!   the eligible agents whose value there the fewest live leases of tasks spreading by that key
//!   hold ([`spread_counts`]; an agent lacking the key, or with an array or object there, counts
//!   as the value `""`).
//! - A task's retry avoids the agents that failed its earlier attempts ([`explain_task`]): while
//!   another agent that takes work satisfies the placement (free slot or not), they are not
//!   eligible ([`Ineligibility::FailedEarlier`]); when none does, they are as eligible as any.
//! - Outcome: [`Outcome::Placeable`] if any agent is eligible; [`Outcome::WaitingForCapacity`]
//!   if a READY or DEGRADED agent satisfies the placement but is at capacity; otherwise
//!   [`Outcome::Parked`] — a DRAINING or OFFLINE agent that satisfies it does not count, since it
//!   will not take new work until an operator or the agent changes its state.

use crate::kinds::HandledKinds;
use crate::placement::{CompiledPlacement, PlacementPolicy, Unmet};
use crate::resources::{self, Held, Shortfall};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// An agent's lifecycle state as the server tracks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AgentStatus {
    /// Connected and taking work.
    Ready,
    /// Connected and taking work, but some named capability reports unhealthy.
    Degraded,
    /// Connected, finishing its leases, taking no new work.
    Draining,
    /// Not connected.
    Offline,
}

impl AgentStatus {
    /// The proto name without prefix (`READY`, `DEGRADED`, `DRAINING`, `OFFLINE`).
    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Ready => "READY",
            AgentStatus::Degraded => "DEGRADED",
            AgentStatus::Draining => "DRAINING",
            AgentStatus::Offline => "OFFLINE",
        }
    }

    /// Whether an agent in this state takes new leases.
    pub fn takes_work(self) -> bool {
        matches!(self, AgentStatus::Ready | AgentStatus::Degraded)
    }
}

/// The name is not an agent status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown agent status `{0}`")]
pub struct UnknownStatus(pub String);

impl FromStr for AgentStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bare = s.strip_prefix("AGENT_STATUS_").unwrap_or(s);
        [
            AgentStatus::Ready,
            AgentStatus::Degraded,
            AgentStatus::Draining,
            AgentStatus::Offline,
        ]
        .into_iter()
        .find(|st| st.as_str().eq_ignore_ascii_case(bare))
        .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// An agent's id: the server's UUID for it, stable across its sessions.
/// Ordered as its hyphenated text is (the final ranking tiebreak), and as
/// cheap to copy and compare as a number: no text is formatted or parsed
/// while matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AgentId(uuid::Uuid);

impl AgentId {
    /// The id as a UUID.
    pub fn uuid(self) -> uuid::Uuid {
        self.0
    }
}

impl AgentId {
    /// An id made of a short name's bytes (zero-padded, at most the first
    /// 16 bytes), for fixtures and tests: such ids sort as their names do.
    pub fn from_name(name: &str) -> Self {
        let mut bytes = [0u8; 16];
        let len = name.len().min(16);
        bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        Self(uuid::Uuid::from_bytes(bytes))
    }
}

impl From<uuid::Uuid> for AgentId {
    fn from(id: uuid::Uuid) -> Self {
        Self(id)
    }
}

impl From<AgentId> for uuid::Uuid {
    fn from(id: AgentId) -> Self {
        id.0
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for AgentId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

/// What matching needs to know about one agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentView {
    /// Stable agent id; the final ranking tiebreak.
    pub agent_id: AgentId,
    /// The namespace the agent serves; tasks of other namespaces never go to it.
    pub namespace: String,
    /// Lifecycle state.
    pub status: AgentStatus,
    /// How many leases it may hold at once.
    pub capacity: u32,
    /// How many it holds now.
    pub active_leases: u32,
    /// When it was last granted a lease, in milliseconds; `None` if never.
    pub last_granted_at_ms: Option<u64>,
    /// Its merged, redacted capability document.
    pub document: Arc<Value>,
    /// The task kinds it handles; a task of another kind never goes to it.
    pub kinds: Arc<HandledKinds>,
    /// What its live leases hold beyond their slots (devices, CPU, memory, named resources),
    /// by task; the slots are `active_leases`.
    pub held: Arc<Held>,
}

impl AgentView {
    /// How the agent's load ranks it among agents with equal preference scores.
    pub fn availability(&self) -> Availability {
        Availability {
            free: self.capacity.saturating_sub(self.active_leases),
            capacity: self.capacity,
            last_granted_at_ms: self.last_granted_at_ms,
        }
    }
}

/// The load part of the ranking key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Availability {
    /// Free slots.
    pub free: u32,
    /// Total slots.
    pub capacity: u32,
    /// Last grant time; `None` ranks as longest ago.
    pub last_granted_at_ms: Option<u64>,
}

impl Availability {
    /// `Less` when `self` ranks before `other`: higher free ratio, then longer since last grant.
    pub fn rank_cmp(&self, other: &Availability) -> Ordering {
        // free/capacity descending, exactly: compare other.free*self.cap with self.free*other.cap.
        let mine = u64::from(self.free) * u64::from(other.capacity.max(1));
        let theirs = u64::from(other.free) * u64::from(self.capacity.max(1));
        theirs.cmp(&mine).then_with(
            || match (self.last_granted_at_ms, other.last_granted_at_ms) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Less,
                (Some(_), None) => Ordering::Greater,
                (Some(a), Some(b)) => a.cmp(&b),
            },
        )
    }
}

/// The full ranking order for eligible agents under `policy`: `Less` ranks first.
pub fn rank_cmp(
    policy: PlacementPolicy,
    a: (u64, &Availability, &AgentId),
    b: (u64, &Availability, &AgentId),
) -> Ordering {
    let load = || a.1.rank_cmp(b.1).then_with(|| a.2.cmp(b.2));
    b.0.cmp(&a.0).then_with(|| match policy {
        PlacementPolicy::Spread => load(),
        PlacementPolicy::Binpack => load().reverse(),
    })
}

/// Why an agent cannot take a task now.
#[derive(Debug, Clone, PartialEq)]
pub enum Ineligibility {
    /// The agent serves another namespace.
    OtherNamespace {
        /// The agent's namespace.
        namespace: String,
    },
    /// It does not handle the task's kind.
    KindNotHandled {
        /// The task's kind.
        kind: String,
    },
    /// Its document fails a hard constraint.
    Unmet(Unmet),
    /// It refused the task (it said it cannot handle or cannot decode it), and has not changed
    /// since.
    Refused {
        /// What it said.
        reason: String,
    },
    /// An earlier attempt of the task failed on it (or its lease was lost there), and another
    /// agent that takes work satisfies the placement.
    FailedEarlier,
    /// It is offline.
    Offline,
    /// It is draining.
    Draining,
    /// It could never give the task what its resource request needs.
    TooSmall(Shortfall),
    /// Its free resources do not cover the task's request now.
    ResourcesHeld(Shortfall),
    /// Every slot is taken.
    AtCapacity {
        /// Leases held.
        active: u32,
        /// Slots.
        capacity: u32,
    },
}

impl fmt::Display for Ineligibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ineligibility::OtherNamespace { namespace } => write!(f, "in namespace {namespace}"),
            Ineligibility::KindNotHandled { kind } => write!(f, "does not handle kind {kind}"),
            Ineligibility::Unmet(u) => u.fmt(f),
            Ineligibility::Refused { reason } => write!(f, "refused the task: {reason}"),
            Ineligibility::FailedEarlier => f.write_str(
                "an earlier attempt failed on it; another capable agent takes the retry",
            ),
            Ineligibility::Offline => f.write_str("offline"),
            Ineligibility::Draining => f.write_str("draining"),
            Ineligibility::TooSmall(short) | Ineligibility::ResourcesHeld(short) => short.fmt(f),
            Ineligibility::AtCapacity { active, capacity } => {
                write!(f, "at capacity ({active}/{capacity})")
            }
        }
    }
}

impl Ineligibility {
    /// The phrase agents failing the same way share in the summary line.
    pub fn summary(&self) -> String {
        match self {
            Ineligibility::OtherNamespace { .. } => "in other namespaces".to_owned(),
            Ineligibility::KindNotHandled { kind } => format!("not handling kind {kind}"),
            Ineligibility::Unmet(u) => u.summary(),
            Ineligibility::Refused { .. } => "refused the task".to_owned(),
            Ineligibility::FailedEarlier => "failed an earlier attempt".to_owned(),
            Ineligibility::Offline => "offline".to_owned(),
            Ineligibility::Draining => "draining".to_owned(),
            Ineligibility::TooSmall(short) | Ineligibility::ResourcesHeld(short) => short.summary(),
            Ineligibility::AtCapacity { .. } => "at capacity".to_owned(),
        }
    }
}

/// One agent's fitness for a placement (mirrors `switchyard.v1.AgentVerdict`).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The agent.
    pub agent_id: AgentId,
    /// Satisfies every hard constraint and can take a lease now.
    pub eligible: bool,
    /// Satisfies the placement but cannot take it now (at capacity, draining, offline).
    pub capable: bool,
    /// Why not; `None` when eligible.
    pub reason: Option<Ineligibility>,
    /// Satisfied preference weight (computed for agents that satisfy the placement).
    pub preference_score: u64,
    /// Rank among eligible agents from 1; 0 when not eligible or not ranked yet.
    pub rank: u32,
    /// The agent's status, kept for the outcome.
    pub status: AgentStatus,
}

impl Verdict {
    /// Whether the agent satisfies the placement, now or once it has room.
    pub fn satisfies_placement(&self) -> bool {
        self.eligible || self.capable
    }

    /// The reason as text (empty when eligible), as the proto carries it.
    pub fn reason_text(&self) -> String {
        self.reason
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    /// [`Verdict::reason_text`] without the agent's values (see
    /// [`crate::placement::Unmet::without_agent_values`]), for callers who may not read agents.
    pub fn reason_text_without_agent_values(&self) -> String {
        match &self.reason {
            Some(Ineligibility::Unmet(unmet)) => unmet.without_agent_values().to_string(),
            _ => self.reason_text(),
        }
    }
}

/// Evaluates one agent for a task of `namespace`. The verdict's rank is 0.
pub fn evaluate(placement: &CompiledPlacement, namespace: &str, agent: &AgentView) -> Verdict {
    let mut verdict = Verdict {
        agent_id: agent.agent_id,
        eligible: false,
        capable: false,
        reason: None,
        preference_score: 0,
        rank: 0,
        status: agent.status,
    };
    if agent.namespace != namespace {
        verdict.reason = Some(Ineligibility::OtherNamespace {
            namespace: agent.namespace.clone(),
        });
        return verdict;
    }
    if let Some(kind) = placement.kind()
        && !agent.kinds.handles(kind)
    {
        verdict.reason = Some(Ineligibility::KindNotHandled {
            kind: kind.to_owned(),
        });
        return verdict;
    }
    if let Some(unmet) = placement.unmet(&agent.document) {
        verdict.reason = Some(Ineligibility::Unmet(unmet));
        return verdict;
    }
    if let Some(short) = placement.never_fits(&agent.document, agent.capacity) {
        verdict.reason = Some(Ineligibility::TooSmall(short));
        return verdict;
    }
    verdict.preference_score = placement.preference_score(&agent.document);
    verdict.reason = match agent.status {
        AgentStatus::Offline => Some(Ineligibility::Offline),
        AgentStatus::Draining => Some(Ineligibility::Draining),
        _ if placement.resource_need().is_some() => placement
            .assign(
                &agent.document,
                agent.capacity,
                agent.active_leases,
                &agent.held,
            )
            .err()
            .map(Ineligibility::ResourcesHeld),
        _ if agent.active_leases >= agent.capacity => Some(Ineligibility::AtCapacity {
            active: agent.active_leases,
            capacity: agent.capacity,
        }),
        _ => None,
    };
    verdict.eligible = verdict.reason.is_none();
    verdict.capable = !verdict.eligible;
    verdict
}

/// Why a placement has no agent that could ever take it as things stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParkedReason {
    /// No agent serves the namespace at all.
    NoAgents,
    /// No agent of the namespace satisfies the placement.
    NoCapableAgent,
    /// Only draining or offline agents satisfy it.
    CapableAgentsUnavailable,
}

/// What the scheduler should do with the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Grant to the first ranked agent.
    Placeable,
    /// Agents that satisfy it are at capacity; retry when a lease ends.
    WaitingForCapacity,
    /// Park until the fleet changes (an agent registers, updates its document or changes state).
    Parked(ParkedReason),
}

/// The result of matching a placement against a set of agents.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// Eligible agent ids, best first.
    pub ranked: Vec<AgentId>,
    /// Every agent's verdict, in the order the agents were given, with ranks filled in.
    pub verdicts: Vec<Verdict>,
    /// E.g. `0/12 agents eligible: 7 missing tag docker, 3 software.node.version not ^20, 2 at capacity`.
    pub summary: String,
    /// Placeable, waiting for capacity, or parked.
    pub outcome: Outcome,
}

/// Whether the agent handles the placement's kind (if it has one) and its document satisfies
/// every hard constraint: [`evaluate`]'s test, apart from namespace and state.
pub fn satisfies(placement: &CompiledPlacement, agent: &AgentView) -> bool {
    placement
        .kind()
        .is_none_or(|kind| agent.kinds.handles(kind))
        && placement.satisfied_by(&agent.document)
        && placement
            .never_fits(&agent.document, agent.capacity)
            .is_none()
}

/// [`satisfies`] and [`fits_now`] together, reading the agent's offer once (an agent whose free
/// resources cover the request now could always cover it).
pub fn satisfies_now(placement: &CompiledPlacement, agent: &AgentView) -> bool {
    placement
        .kind()
        .is_none_or(|kind| agent.kinds.handles(kind))
        && placement.satisfied_by(&agent.document)
        && fits_now(placement, agent)
}

/// Whether the agent's free resources cover the placement's request now (for a placement that
/// needs one slot: whether it has a free slot). Status and constraints are not looked at.
pub fn fits_now(placement: &CompiledPlacement, agent: &AgentView) -> bool {
    match placement.resource_need() {
        None => agent.active_leases < agent.capacity,
        Some(_) => placement
            .assign(
                &agent.document,
                agent.capacity,
                agent.active_leases,
                &agent.held,
            )
            .is_ok(),
    }
}

/// Evaluates every agent and ranks the eligible ones (see the module doc for the order).
pub fn explain(
    placement: &CompiledPlacement,
    namespace: &str,
    agents: &[AgentView],
) -> Explanation {
    explain_refused(placement, namespace, agents, &BTreeMap::new())
}

/// [`explain`], where the agents in `refused` (with what each said) refused the task: one that
/// would satisfy the placement is ineligible and not capable, so a task every capable agent
/// refused is parked.
pub fn explain_refused(
    placement: &CompiledPlacement,
    namespace: &str,
    agents: &[AgentView],
    refused: &BTreeMap<AgentId, String>,
) -> Explanation {
    explain_task(placement, namespace, agents, refused, &BTreeSet::new())
}

/// [`explain_refused`] for a retry: the agents in `failed` had earlier attempts of the task
/// fail (or lose their lease). While another agent that takes work satisfies the placement,
/// each of them that would satisfy it is capable but not eligible
/// ([`Ineligibility::FailedEarlier`]).
pub fn explain_task(
    placement: &CompiledPlacement,
    namespace: &str,
    agents: &[AgentView],
    refused: &BTreeMap<AgentId, String>,
    failed: &BTreeSet<AgentId>,
) -> Explanation {
    let mut verdicts: Vec<Verdict> = agents
        .iter()
        .map(|a| {
            let mut verdict = evaluate(placement, namespace, a);
            if let Some(reason) = refused.get(&a.agent_id)
                && verdict.satisfies_placement()
            {
                verdict.eligible = false;
                verdict.capable = false;
                verdict.reason = Some(Ineligibility::Refused {
                    reason: reason.clone(),
                });
            }
            verdict
        })
        .collect();
    let elsewhere = verdicts.iter().zip(agents).any(|(v, a)| {
        v.satisfies_placement() && v.status.takes_work() && !failed.contains(&a.agent_id)
    });
    if elsewhere {
        for (verdict, agent) in verdicts.iter_mut().zip(agents) {
            if failed.contains(&agent.agent_id)
                && verdict.satisfies_placement()
                && verdict.status.takes_work()
            {
                verdict.eligible = false;
                verdict.capable = true;
                verdict.reason = Some(Ineligibility::FailedEarlier);
            }
        }
    }
    let mut order: Vec<usize> = (0..agents.len())
        .filter(|&i| verdicts[i].eligible)
        .collect();
    let avail: Vec<Availability> = agents.iter().map(AgentView::availability).collect();
    let policy = placement.policy();
    let spread: Vec<u32> = match placement.spread_by() {
        Some(key) => {
            let counts = spread_counts(key, namespace, agents);
            agents
                .iter()
                .map(|a| {
                    let value = resources::spread_value(&a.document, key);
                    counts.get(value.as_str()).copied().unwrap_or(0)
                })
                .collect()
        }
        None => vec![0; agents.len()],
    };
    order.sort_by(|&i, &j| {
        spread[i].cmp(&spread[j]).then_with(|| {
            rank_cmp(
                policy,
                (verdicts[i].preference_score, &avail[i], &agents[i].agent_id),
                (verdicts[j].preference_score, &avail[j], &agents[j].agent_id),
            )
        })
    });
    for (rank, &i) in order.iter().enumerate() {
        verdicts[i].rank = u32::try_from(rank + 1).unwrap_or(u32::MAX);
    }
    let ranked = order.iter().map(|&i| agents[i].agent_id).collect();
    let summary = summarize(&verdicts);
    let outcome = outcome_of(&verdicts, agents.iter().any(|a| a.namespace == namespace));
    Explanation {
        ranked,
        verdicts,
        summary,
        outcome,
    }
}

/// How many live leases of tasks spreading by `key` hold each of its values, over the agents of
/// `namespace` (by the value each lease was granted at).
pub fn spread_counts<'a>(
    key: &str,
    namespace: &str,
    agents: &'a [AgentView],
) -> BTreeMap<&'a str, u32> {
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for agent in agents.iter().filter(|a| a.namespace == namespace) {
        for mark in agent.held.spread_marks().filter(|m| m.key == key) {
            *counts.entry(mark.value.as_str()).or_default() += 1;
        }
    }
    counts
}

/// Why the first of `explanation.ranked` ranks first under `placement`'s spread and policy, for
/// people: the key that
/// put it ahead of the second (`agent-7 ranks first of 3 under binpack: fewer slots free (1/4
/// against 4/4)`); `None` when no agent is eligible. `agents` are the views explained, `name`
/// names an agent.
pub fn ranking_note(
    explanation: &Explanation,
    agents: &[AgentView],
    placement: &CompiledPlacement,
    name: impl Fn(AgentId) -> String,
) -> Option<String> {
    let policy = placement.policy();
    let view = |id: &AgentId| agents.iter().find(|a| &a.agent_id == id);
    let score = |id: &AgentId| {
        explanation
            .verdicts
            .iter()
            .find(|v| &v.agent_id == id)
            .map_or(0, |v| v.preference_score)
    };
    let first_id = explanation.ranked.first()?;
    let first = view(first_id)?;
    let mut note = format!(
        "{} ranks first of {} under {policy}",
        name(*first_id),
        explanation.ranked.len()
    );
    let Some(second) = explanation.ranked.get(1).and_then(view) else {
        note.push_str(": the only eligible agent");
        return Some(note);
    };
    let (a, b) = (first.availability(), second.availability());
    let slots = |v: &Availability| format!("{}/{}", v.free, v.capacity);
    let (s1, s2) = (score(first_id), score(&second.agent_id));
    let spread = placement.spread_by().and_then(|key| {
        let namespace = first.namespace.as_str();
        let counts = spread_counts(key, namespace, agents);
        let value = |a: &AgentView| resources::spread_value(&a.document, key);
        let (v1, v2) = (value(first), value(second));
        let (c1, c2) = (
            counts.get(v1.as_str()).copied().unwrap_or(0),
            counts.get(v2.as_str()).copied().unwrap_or(0),
        );
        (c1 != c2).then(|| {
            format!(
                "fewer leases spreading by {key} hold its value ({c1} on {v1:?} against {c2} on {v2:?})"
            )
        })
    });
    let why = if let Some(spread) = spread {
        spread
    } else if s1 != s2 {
        format!("a higher preference score ({s1} against {s2})")
    } else if u64::from(a.free) * u64::from(b.capacity.max(1))
        != u64::from(b.free) * u64::from(a.capacity.max(1))
    {
        match policy {
            PlacementPolicy::Spread => format!(
                "more of its slots free ({} against {})",
                slots(&a),
                slots(&b)
            ),
            PlacementPolicy::Binpack => format!(
                "the least spare room that still fits ({} free against {})",
                slots(&a),
                slots(&b)
            ),
        }
    } else if a.last_granted_at_ms != b.last_granted_at_ms {
        match policy {
            PlacementPolicy::Spread => "as free, and granted longest ago".to_owned(),
            PlacementPolicy::Binpack => "as full, and granted most recently".to_owned(),
        }
    } else {
        "as loaded and as recently granted; the agent id breaks the tie".to_owned()
    };
    note.push_str(": ");
    note.push_str(&why);
    Some(note)
}

/// The outcome implied by a set of verdicts.
pub fn outcome_of(verdicts: &[Verdict], namespace_has_agents: bool) -> Outcome {
    if verdicts.iter().any(|v| v.eligible) {
        Outcome::Placeable
    } else if verdicts.iter().any(|v| v.capable && v.status.takes_work()) {
        Outcome::WaitingForCapacity
    } else if !namespace_has_agents {
        Outcome::Parked(ParkedReason::NoAgents)
    } else if verdicts.iter().any(|v| v.capable) {
        Outcome::Parked(ParkedReason::CapableAgentsUnavailable)
    } else {
        Outcome::Parked(ParkedReason::NoCapableAgent)
    }
}

/// `E/N agents eligible: <count> <phrase>, ...`, groups by descending count then phrase.
pub fn summarize(verdicts: &[Verdict]) -> String {
    let eligible = verdicts.iter().filter(|v| v.eligible).count();
    let mut groups: BTreeMap<String, usize> = BTreeMap::new();
    for reason in verdicts.iter().filter_map(|v| v.reason.as_ref()) {
        *groups.entry(reason.summary()).or_default() += 1;
    }
    let mut line = format!("{eligible}/{} agents eligible", verdicts.len());
    if !groups.is_empty() {
        let mut groups: Vec<(String, usize)> = groups.into_iter().collect();
        groups.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        line.push_str(": ");
        line.push_str(
            &groups
                .iter()
                .map(|(phrase, n)| format!("{n} {phrase}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> AgentId {
        AgentId::from_name(name)
    }
    use crate::placement::compile;
    use crate::selector;
    use serde_json::json;

    fn agent(id: &str, doc: Value) -> AgentView {
        AgentView {
            held: Default::default(),
            agent_id: AgentId::from_name(id),
            namespace: "default".into(),
            status: AgentStatus::Ready,
            capacity: 4,
            active_leases: 0,
            last_granted_at_ms: None,
            document: Arc::new(doc),
            kinds: Arc::new(HandledKinds::every()),
        }
    }

    fn placement(sel: &str) -> CompiledPlacement {
        compile(&selector::parse(sel).unwrap()).unwrap()
    }

    fn node(version: &str) -> Value {
        json!({"tags": ["linux", "docker"], "software": {"node": {"version": version}}})
    }

    #[test]
    fn ranking_note_names_the_key_that_decided() {
        let mut a = agent("a", json!({}));
        let b = agent("b", json!({}));
        a.active_leases = 1;
        let agents = vec![a, b];
        let name = |id: AgentId| id.to_string().chars().take(8).collect::<String>();
        let mut p = selector::parse("").unwrap();
        let spread = compile(&p).unwrap();
        let e = explain(&spread, "default", &agents);
        assert_eq!(e.ranked, vec![id("b"), id("a")]);
        let note = ranking_note(&e, &agents, &spread, |i| {
            if i == id("a") { "a".into() } else { "b".into() }
        })
        .unwrap();
        assert_eq!(
            note,
            "b ranks first of 2 under spread: more of its slots free (4/4 against 3/4)"
        );
        p.policy = Some(PlacementPolicy::Binpack);
        let binpack = compile(&p).unwrap();
        let e = explain(&binpack, "default", &agents);
        assert_eq!(e.ranked, vec![id("a"), id("b")]);
        assert!(
            ranking_note(&e, &agents, &binpack, name)
                .unwrap()
                .ends_with(
                    "under binpack: the least spare room that still fits (3/4 free against 4/4)"
                )
        );
        let alone = explain(&binpack, "default", &agents[..1]);
        assert!(
            ranking_note(&alone, &agents[..1], &binpack, name)
                .unwrap()
                .ends_with("the only eligible agent")
        );
        let gpu = compile(&selector::parse("gpu").unwrap()).unwrap();
        let none = explain(&gpu, "default", &agents);
        assert_eq!(ranking_note(&none, &agents, &gpu, name), None);
        // Spreading by a key: the least used value decided.
        let mut eu = agent("a", json!({"zone": "eu"}));
        eu.held = Arc::new(Held::of([(
            uuid::Uuid::from_u128(1),
            crate::resources::Claim {
                slots: 1,
                spread: Some(crate::resources::SpreadMark {
                    key: "zone".into(),
                    value: "eu".into(),
                }),
                ..Default::default()
            },
        )]));
        eu.active_leases = 0;
        let us = agent("b", json!({"zone": "us"}));
        let zoned = vec![eu, us];
        let by_zone = placement("spread by zone, prefer 1: zone=eu");
        let e = explain(&by_zone, "default", &zoned);
        assert_eq!(e.ranked, vec![id("b"), id("a")]);
        assert!(ranking_note(&e, &zoned, &by_zone, name).unwrap().ends_with(
            "fewer leases spreading by zone hold its value (0 on \"us\" against 1 on \"eu\")"
        ));
    }

    #[test]
    fn a_retry_avoids_failed_agents_while_another_can_take_it() {
        let mut busy = agent("b", json!({}));
        busy.active_leases = busy.capacity;
        let agents = vec![agent("a", json!({})), busy];
        let failed: BTreeSet<AgentId> = [id("a")].into();
        let p = placement("");
        let e = explain_task(&p, "default", &agents, &BTreeMap::new(), &failed);
        // b is busy, but it is there: the retry waits for it.
        assert!(e.ranked.is_empty());
        assert_eq!(e.outcome, Outcome::WaitingForCapacity);
        assert_eq!(e.verdicts[0].reason, Some(Ineligibility::FailedEarlier));
        assert!(e.verdicts[0].capable);
        assert_eq!(
            e.summary,
            "0/2 agents eligible: 1 at capacity, 1 failed an earlier attempt"
        );
        // Without b, a takes it again.
        let e = explain_task(&p, "default", &agents[..1], &BTreeMap::new(), &failed);
        assert_eq!(e.ranked, vec![id("a")]);
    }

    #[test]
    fn status_names() {
        for s in [
            AgentStatus::Ready,
            AgentStatus::Degraded,
            AgentStatus::Draining,
            AgentStatus::Offline,
        ] {
            assert_eq!(s.as_str().parse::<AgentStatus>().unwrap(), s);
        }
        assert_eq!(
            "AGENT_STATUS_READY".parse::<AgentStatus>().unwrap(),
            AgentStatus::Ready
        );
    }

    #[test]
    fn reasons_and_summary() {
        let mut agents = vec![
            agent("a", json!({"tags": ["linux"]})),
            agent("b", json!({"tags": ["linux"]})),
            agent("c", node("18.19.0")),
            agent("d", node("20.11.0")),
            agent("e", node("20.11.0")),
            agent("f", node("20.11.0")),
            agent("g", node("20.11.0")),
            agent("h", node("20.11.0")),
        ];
        agents[4].active_leases = 4;
        agents[5].status = AgentStatus::Draining;
        agents[6].status = AgentStatus::Offline;
        agents[7].namespace = "other".into();
        let e = explain(
            &placement("docker, software.node.version@^20"),
            "default",
            &agents,
        );
        assert_eq!(e.ranked, vec![id("d")]);
        assert_eq!(e.outcome, Outcome::Placeable);
        assert_eq!(e.verdicts[0].reason_text(), "missing tag docker");
        assert_eq!(
            e.verdicts[2].reason_text(),
            "software.node.version VERSION ^20: have 18.19.0"
        );
        assert_eq!(e.verdicts[4].reason_text(), "at capacity (4/4)");
        assert!(e.verdicts[4].capable && !e.verdicts[4].eligible);
        assert_eq!(e.verdicts[5].reason_text(), "draining");
        assert_eq!(e.verdicts[6].reason_text(), "offline");
        assert_eq!(e.verdicts[7].reason_text(), "in namespace other");
        assert!(!e.verdicts[7].capable);
        assert_eq!(e.verdicts[3].rank, 1);
        assert_eq!(
            e.summary,
            "1/8 agents eligible: 2 missing tag docker, 1 at capacity, 1 draining, 1 in other namespaces, 1 offline, 1 software.node.version not ^20"
        );
    }

    #[test]
    fn parked_versus_waiting() {
        let busy = AgentView {
            held: Default::default(),
            active_leases: 4,
            ..agent("a", node("20.1.0"))
        };
        let p = placement("software.node.version@^20");
        assert_eq!(
            explain(&p, "default", std::slice::from_ref(&busy)).outcome,
            Outcome::WaitingForCapacity
        );
        let draining = AgentView {
            held: Default::default(),
            status: AgentStatus::Draining,
            ..agent("a", node("20.1.0"))
        };
        assert_eq!(
            explain(&p, "default", &[draining]).outcome,
            Outcome::Parked(ParkedReason::CapableAgentsUnavailable)
        );
        let old = agent("b", node("18.0.0"));
        let e = explain(&p, "default", &[old]);
        assert_eq!(e.outcome, Outcome::Parked(ParkedReason::NoCapableAgent));
        assert_eq!(
            e.summary,
            "0/1 agents eligible: 1 software.node.version not ^20"
        );
        assert_eq!(
            explain(&p, "default", &[]).outcome,
            Outcome::Parked(ParkedReason::NoAgents)
        );
        assert_eq!(explain(&p, "default", &[]).summary, "0/0 agents eligible");
    }

    #[test]
    fn degraded_agent_only_fails_what_is_unhealthy() {
        let doc = json!({"tags": ["linux"], "provides": {
            "ai.llm": {"version": "1.0.0", "healthy": false, "reason": "missing parameter API_KEY"},
            "comm.gateway": {"version": "1.2.0", "healthy": true}}});
        let a = AgentView {
            held: Default::default(),
            status: AgentStatus::Degraded,
            ..agent("a", doc)
        };
        let v = evaluate(&placement("provides ai.llm@1"), "default", &a);
        assert!(!v.eligible && !v.capable);
        assert_eq!(
            v.reason_text(),
            "capability ai.llm@1 unhealthy: missing parameter API_KEY"
        );
        assert!(evaluate(&placement("linux, provides comm.gateway@1"), "default", &a).eligible);
        assert!(evaluate(&placement("linux"), "default", &a).eligible);
    }

    #[test]
    fn ranking_order() {
        let mut agents = vec![
            agent("z", json!({"tags": ["gpu"]})),
            agent("y", json!({"tags": []})),
            agent("x", json!({"tags": []})),
            agent("w", json!({"tags": []})),
            agent("v", json!({"tags": []})),
        ];
        agents[1].active_leases = 2; // ratio 2/4
        agents[2].last_granted_at_ms = Some(100);
        agents[3].last_granted_at_ms = Some(50);
        agents[4].last_granted_at_ms = Some(50);
        agents[4].capacity = 8; // ratio 8/8 == 4/4, same grant time as w; id breaks the tie
        let e = explain(&placement("prefer 3: gpu"), "default", &agents);
        assert_eq!(e.ranked, vec![id("z"), id("v"), id("w"), id("x"), id("y")]);
        assert_eq!(e.verdicts[0].preference_score, 3);
    }

    #[test]
    fn zero_capacity_is_at_capacity() {
        let a = AgentView {
            held: Default::default(),
            capacity: 0,
            ..agent("a", json!({}))
        };
        assert_eq!(
            evaluate(&placement(""), "default", &a).reason_text(),
            "at capacity (0/0)"
        );
    }
}
