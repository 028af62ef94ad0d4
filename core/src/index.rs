//! An incrementally maintained index of agents, so that choosing the best agent for a task among
//! thousands does not evaluate every agent. It keeps, per namespace:
//!
//! - `available`: the agents that can take a lease now (READY or DEGRADED with a free slot),
//!   ordered by the load part of the ranking (free capacity ratio, then longest since last grant,
//!   then id) — the ranking of [`crate::matcher`] for agents with equal preference scores;
//! - `paths`: for every dotted path present in a document, reached through objects only (arrays
//!   are not descended into), the agents whose document has it;
//! - `values`: for every scalar leaf reached through objects, and every scalar item of an array
//!   of at most 64 items (under the array's path), the agents whose document holds that value
//!   there — `tags` postings are `values["tags"]`. A path where some agent has a longer array is
//!   marked partial and its value postings are not used to narrow. Volatile facts
//!   ([`crate::diff::VOLATILE`]: free memory, load) have their paths posted but never their
//!   values: they change on nearly every heartbeat, so [`AgentIndex::set_leaves`] sets them in
//!   place and moves no posting, whatever else the document holds; a requirement on them
//!   narrows by the path's presence only and is evaluated.
//!
//! Requirement keys with an all-digit segment (which may index an array) are not used to narrow.
//!
//! A posting is a compressed bitmap ([`roaring`]) of agent ordinals: every indexed agent holds a
//! small integer while it is indexed. A membership test then probes compact arrays instead of
//! comparing ids across scattered allocations, and a union copies no ids. On a busy server the
//! caches are cold between selections, so what a selection touches matters more than a hot loop
//! shows (`BENCHMARKS.md` has the figures).
//!
//! [`AgentIndex::select_best`] derives from the placement the postings every satisfying agent
//! must be in (a required tag, `key == scalar`, a key that must be present, a provided
//! capability). A comparison, version range, regular expression or `in` on a path with at most
//! 64 distinct values narrows further, to the agents whose value there may satisfy it: each
//! distinct value is tested once. Otherwise an agent that was never picked because its value
//! fails (node 18 against `@^20`) stays at the front of the rank order, and every later
//! selection would evaluate it again. If the smallest posting is small compared with the
//! namespace's available agents (at most 1/32 of them), it evaluates just those candidates.
//! Otherwise it walks `available` in rank order (from the other end to *binpack*: the binpack
//! order is exactly the spread order reversed), skips agents missing from any required posting
//! or holding a taint the task does not tolerate (bitmap probes, no evaluation: the `taints`
//! value postings), and stops at the first agent that satisfies the placement — or, with
//! preferences, at the first that satisfies all of them (else after the walk).
//!
//! Complexity, with `n` agents in the namespace, `c` the candidate set, `k` the number of
//! available agents visited before the first satisfying one, `k'` those of them in every
//! required posting, `v` the distinct values tested (at most 64 a requirement), and `e` the cost
//! of evaluating one document: selection costs O(p + v + c · e) when it evaluates candidates and
//! O(p + v + k · p + k' · e) when it walks, for `p` placement constraints (a bitmap probe is
//! O(1) for practical purposes); with preferences that no agent fully satisfies, the walk covers
//! all available agents. Updating an agent's load
//! costs O(log n); inserting, replacing or removing a document costs O(m log n) for `m` indexed
//! paths and values, and [`AgentIndex::replace_document_at`] (a heartbeat's patch) only the `m`
//! of the subtrees the patch touched; setting volatile numbers ([`AgentIndex::set_leaves`])
//! moves no posting.
//!
//! Resources: each agent's view holds the claims of its leases that hold more than a slot (by
//! task: [`AgentIndex::hold`], [`AgentIndex::release`]); a placement with a resource request
//! skips, during the walk or the candidate scan, the agents whose free resources do not cover it
//! (its offer is read from the document then, so a request costs a little per agent visited). A
//! placement with a spread key is matched against the agents of its key's least used value first
//! (values grouped once and cached until a document change could move an agent between them;
//! use counts kept from the claims' spread marks), then the next, each group with the same walk.
//!
//! What callers must still check: the index holds the agent state as of the last update, so the
//! store must re-check capacity and claims (and fencing) atomically when it grants the lease;
//! the caller must call [`AgentIndex::hold`] or [`AgentIndex::update_load`] after every grant
//! and [`AgentIndex::release`] after every lease end, and
//! [`AgentIndex::upsert`] after every document or status change; and a `None` from
//! `select_best` does not say why — call [`AgentIndex::explain`] (O(n · e)) to tell parked from
//! waiting for capacity and to get reasons.

use crate::diff::VOLATILE;
use crate::kinds::{HandledKinds, parents};
use crate::matcher::{self, AgentId, AgentStatus, AgentView, Availability, Explanation};
use crate::placement::{CompiledPlacement, Operator, PlacementPolicy, PreferenceCondition};
use crate::resources::{self, Claim};
use json_patch::jsonptr::Pointer;
use roaring::RoaringBitmap;
use serde_json::Value;
use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, LazyLock};

/// What a session's document is while [`AgentIndex::set_leaves`] changes
/// the shared one in place.
static NO_DOCUMENT: LazyLock<Arc<Value>> = LazyLock::new(|| Arc::new(Value::Null));

/// The object keys of each [`VOLATILE`] path (`/memory/free`: `memory`, `free`).
static VOLATILE_KEYS: LazyLock<Vec<Vec<&'static str>>> = LazyLock::new(|| {
    VOLATILE
        .iter()
        .map(|p| p.trim_start_matches('/').split('/').collect())
        .collect()
});

/// Whether the leaf at `keys` (object keys from the top) is at or under a [`VOLATILE`] path.
fn volatile_keys(keys: &[String]) -> bool {
    VOLATILE_KEYS
        .iter()
        .any(|v| v.len() <= keys.len() && v.iter().zip(keys).all(|(a, b)| *a == b.as_str()))
}

/// The dotted form of each [`VOLATILE`] path (`/memory/free`: `memory.free`).
static VOLATILE_PATHS: LazyLock<Vec<String>> =
    LazyLock::new(|| VOLATILE_KEYS.iter().map(|keys| keys.join(".")).collect());

/// Whether dotted `path` is at or under a [`VOLATILE`] path's dotted form: its values are not
/// posted (see the module doc). A key containing `.` can make a path look volatile that is not;
/// its values are then only not posted, which narrows less and is never wrong.
fn volatile_path(path: &str) -> bool {
    VOLATILE_PATHS.iter().any(|v| {
        path.strip_prefix(v.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    })
}

/// A scalar as a hashable posting key; numbers compare numerically (`1` and `1.0` are one key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ScalarKey {
    Null,
    Bool(bool),
    Number(u64),
    String(String),
}

impl ScalarKey {
    fn of(value: &Value) -> Option<ScalarKey> {
        Some(match value {
            Value::Null => ScalarKey::Null,
            Value::Bool(b) => ScalarKey::Bool(*b),
            Value::Number(n) => {
                let f = n.as_f64()?;
                ScalarKey::Number(if f == 0.0 { 0 } else { f.to_bits() })
            }
            Value::String(s) => ScalarKey::String(s.clone()),
            _ => return None,
        })
    }
}

/// An available agent's place in the rank order.
#[derive(Debug, Clone)]
struct RankedSlot {
    availability: Availability,
    agent_id: AgentId,
    /// The agent's ordinal (see [`Posting`]); not part of the order.
    ord: u32,
}

impl PartialEq for RankedSlot {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for RankedSlot {}
impl PartialOrd for RankedSlot {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for RankedSlot {
    fn cmp(&self, other: &Self) -> Ordering {
        self.availability
            .rank_cmp(&other.availability)
            .then_with(|| self.agent_id.cmp(&other.agent_id))
    }
}

/// A set of agents, by ordinal: each indexed agent has a small integer of
/// its own while it is indexed (freed ordinals are reused), so that a
/// membership test is a few probes into compact arrays rather than string
/// comparisons across scattered allocations, and a union of postings copies
/// no ids.
type Posting = RoaringBitmap;

#[derive(Debug, Default)]
struct NamespacePostings {
    /// Every agent of the namespace; the explain path walks it.
    all: Posting,
    /// Agents that can take a lease now, in load rank order.
    available: BTreeSet<RankedSlot>,
    /// Present dotted path → agents.
    paths: HashMap<String, Posting>,
    /// Dotted path → scalar → agents holding it there (or in the array there).
    values: HashMap<String, HashMap<ScalarKey, Posting>>,
    /// Paths where some agent has an array too long to value-index → how many agents; value
    /// postings of these paths are incomplete and never used to narrow.
    partial: HashMap<String, usize>,
    /// Task kind → agents that advertise it exactly.
    kinds_exact: HashMap<String, Posting>,
    /// Prefix `P` → agents that advertise `P.*`.
    kinds_prefix: HashMap<String, Posting>,
    /// Agents that advertise `*`.
    kinds_all: Posting,
    /// Task kind → the agents that handle it (the union of the three kind postings above), built
    /// when a selection first needs it and kept until an agent's kinds are posted or unposted: a
    /// union over thousands of agents costs microseconds, and every selection needs one.
    kind_unions: std::sync::Mutex<HashMap<String, Arc<Posting>>>,
    /// (spread key, value) → how many live leases of tasks spreading by the key hold the value
    /// (the marks of the agents' held claims).
    spread_counts: HashMap<(String, String), u32>,
    /// Spread key → the namespace's agents grouped by their value there, built when a selection
    /// first needs it and dropped when a document change could move an agent between groups.
    spread_groups: std::sync::Mutex<HashMap<String, SpreadGroups>>,
}

/// A namespace's agents grouped by their value at a spread key.
type SpreadGroups = Arc<Vec<(String, Posting)>>;

/// A posting a selection holds: borrowed from the index, built for it, or a shared cached union.
enum Held<'a> {
    Cow(Cow<'a, Posting>),
    Shared(Arc<Posting>),
}

impl std::ops::Deref for Held<'_> {
    type Target = Posting;
    fn deref(&self) -> &Posting {
        match self {
            Held::Cow(cow) => cow,
            Held::Shared(shared) => shared,
        }
    }
}

impl<'a> From<Cow<'a, Posting>> for Held<'a> {
    fn from(cow: Cow<'a, Posting>) -> Self {
        Held::Cow(cow)
    }
}

impl NamespacePostings {
    /// Whether the value postings of `path` are complete, so that they may narrow: no agent has
    /// an array there too long to post, and the path is not volatile (never value-posted).
    fn values_complete(&self, path: &str) -> bool {
        !self.partial.contains_key(path) && !volatile_path(path)
    }

    /// Counts (`add`) or uncounts the spread marks of an agent's held claims.
    fn count_marks(&mut self, held: &resources::Held, add: bool) {
        for mark in held.spread_marks() {
            let key = (mark.key.clone(), mark.value.clone());
            let count = self.spread_counts.entry(key.clone()).or_default();
            if add {
                *count += 1;
            } else {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.spread_counts.remove(&key);
                }
            }
        }
    }

    /// Drops the cached spread groups a change at `roots` (segments; `None`: anything) could
    /// affect.
    fn forget_spread_groups(&mut self, roots: Option<&[Vec<String>]>) {
        let groups = self
            .spread_groups
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if groups.is_empty() {
            return;
        }
        match roots {
            None => groups.clear(),
            Some(roots) => groups.retain(|key, _| {
                !roots.iter().any(|root| {
                    let root = root.join(".");
                    root.is_empty()
                        || *key == root
                        || key.starts_with(&format!("{root}."))
                        || root.starts_with(&format!("{key}."))
                })
            }),
        }
    }

    /// Adds (`add`) or removes agent `id` from the postings of the kinds it handles.
    fn post_kinds(&mut self, id: u32, kinds: &HandledKinds, add: bool) {
        self.kind_unions
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        fn toggle(map: &mut HashMap<String, Posting>, key: &str, id: u32, add: bool) {
            if add {
                map.entry(key.to_owned()).or_default().insert(id);
            } else if let Some(set) = map.get_mut(key) {
                set.remove(id);
                if set.is_empty() {
                    map.remove(key);
                }
            }
        }
        for kind in kinds.exact() {
            toggle(&mut self.kinds_exact, kind, id, add);
        }
        for prefix in kinds.prefixes() {
            toggle(&mut self.kinds_prefix, prefix, id, add);
        }
        if kinds.handles_every_kind() {
            if add {
                self.kinds_all.insert(id);
            } else {
                self.kinds_all.remove(id);
            }
        }
    }

    /// The agents that handle `kind`; `None` when none does. A union of several postings is
    /// cached (see `kind_unions`).
    fn handling<'a>(&'a self, kind: &str) -> Option<Held<'a>> {
        let mut sources: Vec<&'a Posting> = Vec::new();
        if !self.kinds_all.is_empty() {
            sources.push(&self.kinds_all);
        }
        sources.extend(self.kinds_exact.get(kind));
        sources.extend(parents(kind).filter_map(|p| self.kinds_prefix.get(p)));
        match sources.as_slice() {
            [] => None,
            [one] => Some(Held::Cow(Cow::Borrowed(*one))),
            many => {
                let mut unions = self
                    .kind_unions
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let union = match unions.get(kind) {
                    Some(union) => union.clone(),
                    None => {
                        let union = Arc::new(many.iter().fold(Posting::new(), |all, p| all | *p));
                        unions.insert(kind.to_owned(), union.clone());
                        union
                    }
                };
                Some(Held::Shared(union))
            }
        }
    }

    /// Moves agent `id` from the postings of `old` to those of `new` (two
    /// whole documents, the same subtrees of two documents, or a document
    /// and nothing when an agent is added or removed).
    fn repost(&mut self, id: u32, old: &DocumentPostings, new: &DocumentPostings) {
        let gone = |from: &Vec<String>, to: &Vec<String>| -> Vec<String> {
            from.iter()
                .filter(|p| to.binary_search(p).is_err())
                .cloned()
                .collect()
        };
        for p in gone(&old.paths, &new.paths) {
            if let Some(set) = self.paths.get_mut(&p) {
                set.remove(id);
                if set.is_empty() {
                    self.paths.remove(&p);
                }
            }
        }
        for p in gone(&new.paths, &old.paths) {
            self.paths.entry(p).or_default().insert(id);
        }
        let old_values: HashSet<&(String, ScalarKey)> = old.values.iter().collect();
        let new_values: HashSet<&(String, ScalarKey)> = new.values.iter().collect();
        for (p, v) in old_values.difference(&new_values).copied() {
            if let Some(by_value) = self.values.get_mut(p) {
                if let Some(set) = by_value.get_mut(v) {
                    set.remove(id);
                    if set.is_empty() {
                        by_value.remove(v);
                    }
                }
                if by_value.is_empty() {
                    self.values.remove(p);
                }
            }
        }
        for (p, v) in new_values.difference(&old_values) {
            self.values
                .entry(p.clone())
                .or_default()
                .entry(v.clone())
                .or_default()
                .insert(id);
        }
        for p in gone(&old.partial, &new.partial) {
            if let Some(n) = self.partial.get_mut(&p) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.partial.remove(&p);
                }
            }
        }
        for p in gone(&new.partial, &old.partial) {
            *self.partial.entry(p).or_default() += 1;
        }
    }
}

#[derive(Debug)]
struct IndexedAgent {
    view: AgentView,
    /// Its ordinal in the postings.
    ord: u32,
    /// Whether some key of the document contains `.` (its dotted paths are
    /// then ambiguous, and a partial re-index could miss a shared posting).
    dotted_keys: bool,
    /// Held back (see [`AgentIndex::hold_back`]): its free slots are not
    /// offered.
    held_back: bool,
}

impl IndexedAgent {
    fn slot(&self) -> Option<RankedSlot> {
        let v = &self.view;
        (!self.held_back && v.status.takes_work() && v.active_leases < v.capacity).then(|| {
            RankedSlot {
                availability: v.availability(),
                agent_id: v.agent_id,
                ord: self.ord,
            }
        })
    }
}

/// The best agent for a placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The chosen agent.
    pub agent_id: AgentId,
    /// Its satisfied preference weight.
    pub preference_score: u64,
}

/// Agents indexed by namespace, availability, present paths and scalar values.
#[derive(Debug, Default)]
pub struct AgentIndex {
    agents: HashMap<AgentId, IndexedAgent>,
    namespaces: HashMap<String, NamespacePostings>,
    /// Ordinal → the agent holding it.
    ordinals: Vec<Option<AgentId>>,
    /// Ordinals free for the next agent.
    free_ordinals: Vec<u32>,
}

/// The document path of an agent's taints.
const TAINTS: &str = "taints";

/// Arrays with more items than this are not value-indexed (their path is marked partial).
const MAX_INDEXED_ARRAY_ITEMS: usize = 64;

/// What one document is posted under.
#[derive(Debug, Default)]
struct DocumentPostings {
    paths: Vec<String>,
    values: Vec<(String, ScalarKey)>,
    partial: Vec<String>,
    /// Whether a key walked contains `.`.
    dotted_keys: bool,
}

impl DocumentPostings {
    fn of(doc: &Value) -> Self {
        let mut out = DocumentPostings::default();
        out.collect(doc, &mut String::new());
        out.finish()
    }

    /// The postings of the subtrees at `roots` (object keys from the top;
    /// none empty, none a prefix of another): each root's own path, and
    /// everything below it.
    fn of_subtrees(doc: &Value, roots: &[Vec<String>]) -> Self {
        let mut out = DocumentPostings::default();
        for root in roots {
            let mut node = Some(doc);
            for key in root {
                node = node.and_then(|v| v.as_object()).and_then(|m| m.get(key));
            }
            out.dotted_keys |= root.iter().any(|k| k.contains('.'));
            if let Some(value) = node {
                let mut path = root.join(".");
                out.paths.push(path.clone());
                out.collect(value, &mut path);
            }
        }
        out.finish()
    }

    fn finish(mut self) -> Self {
        self.paths.sort();
        self.paths.dedup();
        self.values.dedup();
        self.partial.sort();
        self.partial.dedup();
        self
    }

    /// Walks objects only: arrays are value-indexed at their own path but not descended into.
    fn collect(&mut self, value: &Value, path: &mut String) {
        match value {
            Value::Object(map) => {
                for (k, child) in map {
                    self.dotted_keys |= k.contains('.');
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(k);
                    self.paths.push(path.clone());
                    self.collect(child, path);
                    path.truncate(len);
                }
            }
            _ if volatile_path(path) => {}
            Value::Array(items) => {
                if items.len() > MAX_INDEXED_ARRAY_ITEMS {
                    self.partial.push(path.clone());
                } else {
                    self.values.extend(
                        items
                            .iter()
                            .filter_map(ScalarKey::of)
                            .map(|k| (path.clone(), k)),
                    );
                }
            }
            scalar => {
                if let Some(key) = ScalarKey::of(scalar) {
                    self.values.push((path.clone(), key));
                }
            }
        }
    }
}

/// The subtrees to re-index for a change at `changed`: each pointer cut at
/// the first key under which the old or the new document is not an object
/// (postings do not descend further), deduplicated, none a prefix of
/// another. An empty root means the whole document.
fn changed_roots<'p>(
    old: &Value,
    new: &Value,
    changed: impl IntoIterator<Item = &'p Pointer>,
) -> Vec<Vec<String>> {
    let mut roots: Vec<Vec<String>> = changed
        .into_iter()
        .map(|pointer| {
            let mut root = Vec::new();
            let (mut o, mut n) = (Some(old), Some(new));
            for token in pointer.tokens() {
                let key = token.decoded().into_owned();
                let oc = o.and_then(Value::as_object).and_then(|m| m.get(&key));
                let nc = n.and_then(Value::as_object).and_then(|m| m.get(&key));
                root.push(key);
                if !(oc.is_some_and(Value::is_object) && nc.is_some_and(Value::is_object)) {
                    break;
                }
                (o, n) = (oc, nc);
            }
            root
        })
        .collect();
    roots.sort();
    let mut kept: Vec<Vec<String>> = Vec::with_capacity(roots.len());
    for root in roots {
        if !kept.last().is_some_and(|k| root.starts_with(k)) {
            kept.push(root);
        }
    }
    kept
}

/// Whether a requirement key may pass through an array (then it is not used to narrow).
fn may_index_array(key: &str) -> bool {
    key.split('.')
        .any(|seg| !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()))
}

impl AgentIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many agents are indexed.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether no agent is indexed.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// The indexed view of an agent.
    pub fn get(&self, agent_id: AgentId) -> Option<&AgentView> {
        self.agents.get(&agent_id).map(|a| &a.view)
    }

    /// Inserts an agent, or replaces it (document, status, namespace, load) if present.
    pub fn upsert(&mut self, view: AgentView) {
        let held_back = self.agents.get(&view.agent_id).is_some_and(|a| a.held_back);
        self.remove(view.agent_id);
        let id = view.agent_id;
        let ord = match self.free_ordinals.pop() {
            Some(ord) => {
                self.ordinals[ord as usize] = Some(id);
                ord
            }
            None => {
                self.ordinals.push(Some(id));
                u32::try_from(self.ordinals.len() - 1).expect("fewer than 2^32 agents")
            }
        };
        let postings = DocumentPostings::of(&view.document);
        let ns = self.namespaces.entry(view.namespace.clone()).or_default();
        ns.all.insert(ord);
        ns.repost(ord, &DocumentPostings::default(), &postings);
        ns.post_kinds(ord, &view.kinds, true);
        ns.count_marks(&view.held, true);
        ns.forget_spread_groups(None);
        let agent = IndexedAgent {
            view,
            ord,
            dotted_keys: postings.dotted_keys,
            held_back,
        };
        if let Some(slot) = agent.slot() {
            ns.available.insert(slot);
        }
        self.agents.insert(id, agent);
    }

    /// Replaces an indexed agent's document, touching only the postings that
    /// changed: a heartbeat's diff changes a few leaves of a hundred, and
    /// re-indexing the whole document ([`AgentIndex::upsert`]) on every one
    /// dominates the cost of a large fleet. Compares the whole old and new
    /// documents; [`AgentIndex::replace_document_at`] compares only where a
    /// patch touched. Returns false if the agent is not indexed.
    pub fn replace_document(&mut self, agent_id: AgentId, document: Arc<Value>) -> bool {
        self.replace_document_at(agent_id, document, [Pointer::root()])
    }

    /// [`AgentIndex::replace_document`] when the new document is known to
    /// differ from the indexed one only at or below `changed` (the `path`s and
    /// `from`s of the JSON Patch that made it, see [`crate::diff::touched`]):
    /// only the postings of those subtrees are compared, so a heartbeat that
    /// replaces `/memory` costs the few leaves under it. The caller must not
    /// leave out a touched path; a document with a key containing `.` (whose
    /// dotted paths are ambiguous) is compared whole.
    pub fn replace_document_at<'p>(
        &mut self,
        agent_id: AgentId,
        document: Arc<Value>,
        changed: impl IntoIterator<Item = &'p Pointer>,
    ) -> bool {
        let Some(agent) = self.agents.get_mut(&agent_id) else {
            return false;
        };
        let roots = changed_roots(&agent.view.document, &document, changed);
        let subtrees = (!agent.dotted_keys && !roots.iter().any(Vec::is_empty))
            .then(|| {
                let old = DocumentPostings::of_subtrees(&agent.view.document, &roots);
                let new = DocumentPostings::of_subtrees(&document, &roots);
                (!new.dotted_keys).then_some((old, new))
            })
            .flatten();
        let (old, new) = match subtrees {
            Some(pair) => pair,
            None => (
                DocumentPostings::of(&agent.view.document),
                DocumentPostings::of(&document),
            ),
        };
        agent.dotted_keys = new.dotted_keys;
        agent.view.document = document;
        if let Some(ns) = self.namespaces.get_mut(&agent.view.namespace) {
            ns.repost(agent.ord, &old, &new);
            ns.forget_spread_groups(Some(&roots));
        }
        true
    }

    /// Sets scalar leaves of an indexed agent's document in place: each
    /// `(keys, value)` replaces the scalar at that path of object keys from
    /// the top. `held` must be the very document indexed (the session's
    /// copy, shared with the index); it gives up its reference for the
    /// change, so that nothing is cloned when the two are the only holders,
    /// and gets the changed document back. When every leaf is volatile
    /// ([`VOLATILE`], the common heartbeat) no posting moves: their paths
    /// stay, their values are never posted. Otherwise only those leaves'
    /// postings are compared. Returns false and changes nothing if the agent
    /// is not indexed, holds another document, some path is not a scalar of
    /// it, or (for a leaf that is not volatile) it has a dotted key: the
    /// caller then replaces the document whole.
    pub fn set_leaves(
        &mut self,
        agent_id: AgentId,
        held: &mut Arc<Value>,
        leaves: &[(Vec<String>, Value)],
    ) -> bool {
        /// The value at `keys` (object keys from the top).
        fn at<'v>(doc: &'v Value, keys: &[String]) -> Option<&'v Value> {
            keys.iter()
                .try_fold(doc, |node, key| node.as_object()?.get(key))
        }
        let Some(agent) = self.agents.get_mut(&agent_id) else {
            return false;
        };
        let scalar = |v: &Value| !v.is_object() && !v.is_array();
        let volatile = leaves.iter().all(|(keys, _)| volatile_keys(keys));
        let fits = (volatile || !agent.dotted_keys)
            && Arc::ptr_eq(&agent.view.document, held)
            && leaves.iter().all(|(keys, value)| {
                !keys.is_empty()
                    && scalar(value)
                    && at(&agent.view.document, keys).is_some_and(scalar)
            });
        if !fits {
            return false;
        }
        let mut roots: Vec<Vec<String>> = leaves.iter().map(|(keys, _)| keys.clone()).collect();
        roots.sort();
        roots.dedup();
        // A scalar replaced by a scalar leaves the document's paths as they
        // were, and a volatile leaf's value is posted nowhere.
        let old = (!volatile).then(|| DocumentPostings::of_subtrees(&agent.view.document, &roots));
        // The session's reference goes, so the index's is the only one left
        // (unless a reader holds a view): `make_mut` then changes it in place.
        *held = Arc::clone(&NO_DOCUMENT);
        let document = Arc::make_mut(&mut agent.view.document);
        for (keys, value) in leaves {
            let mut node = &mut *document;
            for key in keys {
                node = node
                    .as_object_mut()
                    .and_then(|m| m.get_mut(key))
                    .expect("checked above: every path leads to a scalar");
            }
            *node = value.clone();
        }
        *held = Arc::clone(&agent.view.document);
        if let Some(ns) = self.namespaces.get_mut(&agent.view.namespace) {
            if let Some(old) = old {
                let new = DocumentPostings::of_subtrees(&agent.view.document, &roots);
                ns.repost(agent.ord, &old, &new);
            }
            ns.forget_spread_groups(Some(&roots));
        }
        true
    }

    /// Removes an agent; returns its last view.
    pub fn remove(&mut self, agent_id: AgentId) -> Option<AgentView> {
        let agent = self.agents.remove(&agent_id)?;
        self.ordinals[agent.ord as usize] = None;
        self.free_ordinals.push(agent.ord);
        let Some(ns) = self.namespaces.get_mut(&agent.view.namespace) else {
            return Some(agent.view);
        };
        let postings = DocumentPostings::of(&agent.view.document);
        ns.all.remove(agent.ord);
        if let Some(slot) = agent.slot() {
            ns.available.remove(&slot);
        }
        ns.repost(agent.ord, &postings, &DocumentPostings::default());
        ns.post_kinds(agent.ord, &agent.view.kinds, false);
        ns.count_marks(&agent.view.held, false);
        ns.forget_spread_groups(None);
        if ns.all.is_empty() {
            self.namespaces.remove(&agent.view.namespace);
        }
        Some(agent.view)
    }

    /// The agent holding ordinal `ord`.
    fn agent_at(&self, ord: u32) -> Option<&IndexedAgent> {
        let id = (*self.ordinals.get(ord as usize)?)?;
        self.agents.get(&id)
    }

    /// The free lease slots of the agents that can take a lease now (every namespace), counted
    /// up to `limit`: O(min(available agents, limit)).
    pub fn free_slots(&self, limit: u64) -> u64 {
        let mut free = 0u64;
        for ns in self.namespaces.values() {
            for slot in &ns.available {
                if let Some(agent) = self.agents.get(&slot.agent_id) {
                    let v = &agent.view;
                    free += u64::from(v.capacity.saturating_sub(v.active_leases));
                }
                if free >= limit {
                    return free;
                }
            }
        }
        free
    }

    /// Records an agent's lease count and last grant time. Returns false for an unknown agent.
    pub fn update_load(
        &mut self,
        agent_id: AgentId,
        active_leases: u32,
        last_granted_at_ms: Option<u64>,
    ) -> bool {
        self.update(agent_id, |v| {
            v.active_leases = active_leases;
            v.last_granted_at_ms = last_granted_at_ms;
        })
    }

    /// Records an agent's status. Returns false for an unknown agent.
    pub fn set_status(&mut self, agent_id: AgentId, status: AgentStatus) -> bool {
        self.update(agent_id, |v| v.status = status)
    }

    /// Holds the agent back (`true`: no selection picks it, and its free
    /// slots are not counted, as if it were full, while it stays capable) or
    /// lets it take work again (`false`); kept across [`AgentIndex::upsert`].
    /// Returns false for an unknown agent.
    pub fn hold_back(&mut self, agent_id: AgentId, held_back: bool) -> bool {
        let Some(agent) = self.agents.get_mut(&agent_id) else {
            return false;
        };
        if agent.held_back == held_back {
            return true;
        }
        let Some(ns) = self.namespaces.get_mut(&agent.view.namespace) else {
            return false;
        };
        if let Some(slot) = agent.slot() {
            ns.available.remove(&slot);
        }
        agent.held_back = held_back;
        if let Some(slot) = agent.slot() {
            ns.available.insert(slot);
        }
        true
    }

    /// Whether the agent is held back (see [`AgentIndex::hold_back`]).
    pub fn is_held_back(&self, agent_id: AgentId) -> bool {
        self.agents.get(&agent_id).is_some_and(|a| a.held_back)
    }

    /// Records that the lease for `task` holds `claim` on the agent (its slots counted in
    /// `active_leases`, replacing what the task held before), granted at `granted_at_ms`. A
    /// claim of one slot alone is only counted, not recorded by task. Returns false for an
    /// unknown agent.
    pub fn hold(
        &mut self,
        agent_id: AgentId,
        task: uuid::Uuid,
        claim: Claim,
        granted_at_ms: Option<u64>,
    ) -> bool {
        self.update(agent_id, |v| {
            v.last_granted_at_ms = granted_at_ms;
            if claim.is_one_slot() && v.held.claim(task).is_none() {
                v.active_leases = v.active_leases.saturating_add(1);
                return;
            }
            let held = Arc::make_mut(&mut v.held);
            let before = held.claim(task).map_or(0, |c| c.slots);
            v.active_leases = v
                .active_leases
                .saturating_sub(before)
                .saturating_add(claim.slots);
            held.hold(task, claim);
        })
    }

    /// Gives back what the lease for `task` held on the agent: its claim, or one slot for a
    /// lease whose claim was not recorded here. Returns false for an unknown agent.
    pub fn release(&mut self, agent_id: AgentId, task: uuid::Uuid) -> bool {
        self.update(agent_id, |v| {
            let slots = match v.held.claim(task) {
                Some(_) => Arc::make_mut(&mut v.held)
                    .release(task)
                    .map_or(1, |c| c.slots),
                None => 1,
            };
            v.active_leases = v.active_leases.saturating_sub(slots);
        })
    }

    /// Replaces what the agent's leases hold with `held` and the slots they hold with `active`
    /// (both counted from the store). Returns false for an unknown agent.
    pub fn set_held(&mut self, agent_id: AgentId, held: resources::Held, active: u32) -> bool {
        self.update(agent_id, |v| {
            v.active_leases = active;
            v.held = Arc::new(held);
        })
    }

    /// Records the kinds an agent handles. Returns false for an unknown agent.
    pub fn set_kinds(&mut self, agent_id: AgentId, kinds: Arc<HandledKinds>) -> bool {
        let Some(agent) = self.agents.get_mut(&agent_id) else {
            return false;
        };
        if let Some(ns) = self.namespaces.get_mut(&agent.view.namespace) {
            ns.post_kinds(agent.ord, &agent.view.kinds, false);
            ns.post_kinds(agent.ord, &kinds, true);
        }
        agent.view.kinds = kinds;
        true
    }

    fn update(&mut self, agent_id: AgentId, change: impl FnOnce(&mut AgentView)) -> bool {
        let Some(agent) = self.agents.get_mut(&agent_id) else {
            return false;
        };
        let Some(ns) = self.namespaces.get_mut(&agent.view.namespace) else {
            return false;
        };
        if let Some(slot) = agent.slot() {
            ns.available.remove(&slot);
        }
        ns.count_marks(&agent.view.held, false);
        change(&mut agent.view);
        ns.count_marks(&agent.view.held, true);
        if let Some(slot) = agent.slot() {
            ns.available.insert(slot);
        }
        true
    }

    /// The postings every satisfying agent must be in, smallest first; `None` when some required
    /// posting is empty (no agent can satisfy the placement).
    fn required_postings<'a>(
        ns: &'a NamespacePostings,
        placement: &CompiledPlacement,
    ) -> Option<Vec<Held<'a>>> {
        let mut required: Vec<Held<'a>> = Vec::new();
        if let Some(kind) = placement.kind() {
            required.push(ns.handling(kind)?);
        }
        let value_posting = |path: &str, v: &Value| -> Option<&'a Posting> {
            if !ns.values_complete(path) {
                return ns.paths.get(path);
            }
            ns.values.get(path)?.get(&ScalarKey::of(v)?)
        };
        for tag in &placement.placement().required_tags {
            required.push(Held::Cow(Cow::Borrowed(value_posting(
                "tags",
                &Value::String(tag.clone()),
            )?)));
        }
        for compiled in placement.requirements() {
            let r = compiled.requirement();
            if may_index_array(&r.key) {
                continue;
            }
            match r.operator {
                Operator::NotExists | Operator::NotIn => {}
                Operator::Eq if r.values.first().and_then(ScalarKey::of).is_some() => {
                    required.push(Held::Cow(Cow::Borrowed(
                        r.values.first().and_then(|v| value_posting(&r.key, v))?,
                    )));
                }
                _ => match Self::satisfying_posting(ns, compiled) {
                    Some(posting) if posting.is_empty() => return None,
                    Some(posting) => required.push(posting.into()),
                    None => required.push(Held::Cow(Cow::Borrowed(ns.paths.get(r.key.as_str())?))),
                },
            }
        }
        for c in &placement.placement().capabilities {
            required.push(Held::Cow(Cow::Borrowed(
                ns.paths.get(format!("provides.{}", c.name).as_str())?,
            )));
        }
        required.sort_by_key(|p| p.len());
        Some(required)
    }

    /// For a comparison, a version range, a regular expression or a set of
    /// scalars (`memory.total>=32768`, `software.node.version@^20`,
    /// `team in (web, infra)`) on a path with few distinct values: the
    /// agents holding a value there that may satisfy it, so that the walk
    /// neither evaluates nor even visits the agents whose value does not.
    /// Each distinct string, boolean or null is tested as the matcher would
    /// test it; a number is tested only against a numeric comparison (its
    /// indexed form is an `f64`, which a version or an exact integer
    /// comparison could read differently) and is otherwise kept. No agent
    /// that satisfies the requirement is left out:
    ///
    /// - none of these holds for a missing key, so a satisfying agent has a
    ///   value there;
    /// - a scalar value is posted under itself;
    /// - an array satisfies only `in`, through a scalar item equal to a
    ///   (scalar) operand, and every item of an array of at most 64 is
    ///   posted (a path with a longer one is partial and not used here);
    /// - an object satisfies none of them.
    ///
    /// An empty posting when no value does; the value's own posting, not a
    /// copy, when one does. `None` when the path's values are too many or
    /// not all indexed, or when the agents holding a satisfying value
    /// outnumber three quarters of the available ones (narrowing then saves
    /// less than the union costs), without building the union: only the
    /// path's presence narrows.
    fn satisfying_posting<'a>(
        ns: &'a NamespacePostings,
        requirement: &crate::placement::CompiledRequirement,
    ) -> Option<Cow<'a, Posting>> {
        /// Distinct values at most to look through.
        const MAX_VALUES: usize = 64;
        let r = requirement.requirement();
        let numeric_comparison =
            r.operator.is_ordering() && r.values.len() == 1 && r.values[0].is_number();
        let indexable = match r.operator {
            o if o.is_ordering() => r.values.len() == 1,
            Operator::Version | Operator::Regex => true,
            Operator::In => r.values.iter().all(|v| ScalarKey::of(v).is_some()),
            _ => false,
        };
        if !indexable || !ns.values_complete(r.key.as_str()) {
            return None;
        }
        let values = ns.values.get(r.key.as_str())?;
        if values.len() > MAX_VALUES {
            return None;
        }
        let mut satisfying: Vec<&Posting> = Vec::new();
        // An upper bound (an array's items may count one agent twice).
        let mut agents = 0u64;
        for (key, posting) in values {
            let may_satisfy = match key {
                ScalarKey::Null => requirement.holds_for(&Value::Null),
                ScalarKey::Bool(b) => requirement.holds_for(&Value::Bool(*b)),
                ScalarKey::String(s) => requirement.holds_for(&Value::String(s.clone())),
                // The value as a numeric comparison reads it: its f64.
                ScalarKey::Number(bits) if numeric_comparison => {
                    serde_json::Number::from_f64(f64::from_bits(*bits))
                        .is_some_and(|n| requirement.holds_for(&Value::Number(n)))
                }
                ScalarKey::Number(_) => true,
            };
            if may_satisfy {
                agents += posting.len();
                satisfying.push(posting);
            }
        }
        if agents.saturating_mul(4) > (ns.available.len() as u64).saturating_mul(3) {
            return None;
        }
        Some(match satisfying.as_slice() {
            [] => Cow::Owned(Posting::new()),
            [one] => Cow::Borrowed(*one),
            many => Cow::Owned(many.iter().fold(Posting::new(), |all, p| all | *p)),
        })
    }

    /// The postings of the taints `placement` does not tolerate (an agent in any of them
    /// satisfies nothing it asks), from the value postings of `taints`: probed one by one, never
    /// unioned, since a fleet has few distinct taints. Empty when no agent has one, or when those
    /// postings are incomplete (some agent has more than 64): evaluation then tells.
    fn untolerated<'a>(
        ns: &'a NamespacePostings,
        placement: &CompiledPlacement,
    ) -> Vec<&'a Posting> {
        if ns.partial.contains_key(TAINTS) {
            return Vec::new();
        }
        ns.values.get(TAINTS).map_or_else(Vec::new, |values| {
            values
                .iter()
                .filter_map(|(key, posting)| match key {
                    ScalarKey::String(taint) if !placement.tolerates(taint) => Some(posting),
                    _ => None,
                })
                .collect()
        })
    }

    /// Each preference's weight with the posting an agent must be in to satisfy it (`None`: any
    /// agent may); preferences no agent can satisfy are left out.
    fn preference_bounds<'a>(
        ns: &'a NamespacePostings,
        placement: &CompiledPlacement,
    ) -> Vec<(u64, Option<&'a Posting>)> {
        let empty: Option<&Posting> = None;
        let value_posting = |path: &str, v: &Value| -> Option<Option<&'a Posting>> {
            if !ns.values_complete(path) {
                return ns.paths.get(path).map(Some);
            }
            ns.values.get(path)?.get(&ScalarKey::of(v)?).map(Some)
        };
        placement
            .placement()
            .preferences
            .iter()
            .filter_map(|p| {
                let posting = match &p.condition {
                    PreferenceCondition::Tag(t) => {
                        value_posting("tags", &Value::String(t.clone()))?
                    }
                    PreferenceCondition::Capability(c) => {
                        Some(ns.paths.get(format!("provides.{}", c.name).as_str())?)
                    }
                    PreferenceCondition::Requirement(r) => {
                        if may_index_array(&r.key) {
                            empty
                        } else {
                            match r.operator {
                                Operator::NotExists | Operator::NotIn => empty,
                                Operator::Eq
                                    if r.values.first().and_then(ScalarKey::of).is_some() =>
                                {
                                    r.values.first().and_then(|v| value_posting(&r.key, v))?
                                }
                                _ => Some(ns.paths.get(r.key.as_str())?),
                            }
                        }
                    }
                };
                Some((u64::from(p.weight), posting))
            })
            .collect()
    }

    /// The best eligible agent of `namespace` for `placement` under the matcher's ranking, or
    /// `None` if no agent is eligible now. Equivalent to the first of
    /// [`crate::matcher::explain`]'s `ranked` over the namespace's agents.
    pub fn select_best(&self, placement: &CompiledPlacement, namespace: &str) -> Option<Selection> {
        self.select_best_except(placement, namespace, &[])
    }

    /// [`AgentIndex::select_best`] leaving out the agents in `except` (those that refused the
    /// task). A placement that spreads by a key is matched against the agents of the value
    /// the fewest of its group's leases hold first, then the next fewest, and so on.
    pub fn select_best_except(
        &self,
        placement: &CompiledPlacement,
        namespace: &str,
        except: &[AgentId],
    ) -> Option<Selection> {
        let Some(key) = placement.spread_by() else {
            return self.select_within(placement, namespace, except, None);
        };
        let ns = self.namespaces.get(namespace)?;
        let mut levels: std::collections::BTreeMap<u32, Posting> = Default::default();
        for (value, agents) in self.spread_groups(ns, key).iter() {
            let count = ns
                .spread_counts
                .get(&(key.to_owned(), value.clone()))
                .copied()
                .unwrap_or(0);
            *levels.entry(count).or_default() |= agents;
        }
        levels
            .values()
            .find_map(|within| self.select_within(placement, namespace, except, Some(within)))
    }

    /// The namespace's agents grouped by their value at `key` (cached until a change could
    /// move one).
    fn spread_groups(&self, ns: &NamespacePostings, key: &str) -> SpreadGroups {
        let mut cache = ns
            .spread_groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(groups) = cache.get(key) {
            return groups.clone();
        }
        let mut by_value: std::collections::BTreeMap<String, Posting> = Default::default();
        for ord in &ns.all {
            if let Some(agent) = self.agent_at(ord) {
                let value = resources::spread_value(&agent.view.document, key);
                by_value.entry(value).or_default().insert(ord);
            }
        }
        let groups: SpreadGroups = Arc::new(by_value.into_iter().collect());
        cache.insert(key.to_owned(), groups.clone());
        groups
    }

    /// [`AgentIndex::select_best_except`] among the agents in `within` (all when `None`).
    fn select_within(
        &self,
        placement: &CompiledPlacement,
        namespace: &str,
        except: &[AgentId],
        within: Option<&Posting>,
    ) -> Option<Selection> {
        let outside = |ord: u32| within.is_some_and(|w| !w.contains(ord));
        let ns = self.namespaces.get(namespace)?;
        let required = Self::required_postings(ns, placement)?;
        let untolerated = Self::untolerated(ns, placement);
        let tolerated = |ord: u32| !untolerated.iter().any(|p| p.contains(ord));
        let policy = placement.policy();
        let max = placement.max_preference_score();
        let mut best: Option<(u64, &IndexedAgent)> = None;
        // The narrowest of the required postings and the spread group, if any.
        let narrowest: Option<&Posting> = match (required.first().map(|p| &**p), within) {
            (Some(p), Some(w)) if w.len() < p.len() => Some(w),
            (None, w) => w,
            (p, _) => p,
        };
        match narrowest {
            Some(candidates)
                if candidates.len().saturating_mul(32) <= ns.available.len() as u64 =>
            {
                for ord in candidates.iter() {
                    let Some(agent) = self.agent_at(ord) else {
                        continue;
                    };
                    if agent.slot().is_none()
                        || outside(ord)
                        || !tolerated(ord)
                        || except.contains(&agent.view.agent_id)
                        || !matcher::satisfies_now(placement, &agent.view)
                    {
                        continue;
                    }
                    let score = placement.preference_score(&agent.view.document);
                    let better = best.is_none_or(|(s, b)| {
                        matcher::rank_cmp(
                            policy,
                            (score, &agent.view.availability(), &agent.view.agent_id),
                            (s, &b.view.availability(), &b.view.agent_id),
                        ) == Ordering::Less
                    });
                    if better {
                        best = Some((score, agent));
                    }
                }
            }
            _ => {
                let bounds = Self::preference_bounds(ns, placement);
                let walk: Box<dyn Iterator<Item = &RankedSlot>> = match policy {
                    PlacementPolicy::Spread => Box::new(ns.available.iter()),
                    PlacementPolicy::Binpack => Box::new(ns.available.iter().rev()),
                };
                for slot in walk {
                    if outside(slot.ord)
                        || !required.iter().all(|p| p.contains(slot.ord))
                        || !tolerated(slot.ord)
                    {
                        continue;
                    }
                    // Skip agents that could not beat the best score so far even if they
                    // satisfied every preference their postings allow.
                    if let Some((s, _)) = best {
                        let bound: u64 = bounds
                            .iter()
                            .filter(|(_, p)| p.is_none_or(|p| p.contains(slot.ord)))
                            .map(|(w, _)| *w)
                            .sum();
                        if bound <= s {
                            continue;
                        }
                    }
                    if except.contains(&slot.agent_id) {
                        continue;
                    }
                    let Some(agent) = self.agents.get(&slot.agent_id) else {
                        continue;
                    };
                    if !matcher::satisfies_now(placement, &agent.view) {
                        continue;
                    }
                    let score = placement.preference_score(&agent.view.document);
                    // Walking in load order, a strictly higher score is the only way to win.
                    if best.is_none_or(|(s, _)| score > s) {
                        best = Some((score, agent));
                    }
                    if score == max {
                        break;
                    }
                }
            }
        }
        best.map(|(preference_score, agent)| Selection {
            agent_id: agent.view.agent_id,
            preference_score,
        })
    }

    /// The best agent for a task's retry, leaving out the agents in `refused`, and those in
    /// `failed` (earlier attempts failed on them) while another agent that takes work satisfies
    /// the placement: then `None` if that agent has no free slot (the retry waits for it).
    /// Equivalent to the first of [`crate::matcher::explain_task`]'s `ranked`.
    pub fn select_retry(
        &self,
        placement: &CompiledPlacement,
        namespace: &str,
        refused: &[AgentId],
        failed: &[AgentId],
    ) -> Option<Selection> {
        if failed.is_empty() {
            return self.select_best_except(placement, namespace, refused);
        }
        let avoided: Vec<AgentId> = refused.iter().chain(failed).copied().collect();
        if let Some(selection) = self.select_best_except(placement, namespace, &avoided) {
            return Some(selection);
        }
        if self.any_capable_except(placement, namespace, &avoided) {
            return None;
        }
        self.select_best_except(placement, namespace, refused)
    }

    /// Whether some agent of `namespace` that takes work satisfies
    /// `placement`, free slot or not: false exactly when the matcher's
    /// outcome is [`Outcome::Parked`](crate::matcher::Outcome::Parked). Walks
    /// only the agents in the placement's narrowest required posting.
    pub fn any_capable(&self, placement: &CompiledPlacement, namespace: &str) -> bool {
        self.any_capable_except(placement, namespace, &[])
    }

    /// [`AgentIndex::any_capable`] leaving out the agents in `except`.
    pub fn any_capable_except(
        &self,
        placement: &CompiledPlacement,
        namespace: &str,
        except: &[AgentId],
    ) -> bool {
        let Some(ns) = self.namespaces.get(namespace) else {
            return false;
        };
        let Some(required) = Self::required_postings(ns, placement) else {
            return false;
        };
        let untolerated = Self::untolerated(ns, placement);
        let candidates: &Posting = required.first().map_or(&ns.all, |p| p);
        candidates.iter().any(|ord| {
            self.agent_at(ord).is_some_and(|agent| {
                agent.view.status.takes_work()
                    && !untolerated.iter().any(|p| p.contains(ord))
                    && !except.contains(&agent.view.agent_id)
                    && required.iter().all(|p| p.contains(ord))
                    && matcher::satisfies(placement, &agent.view)
            })
        })
    }

    /// Full explanation over every agent of every namespace (other namespaces appear as
    /// ineligible), in agent id order. O(n · e).
    pub fn explain(&self, placement: &CompiledPlacement, namespace: &str) -> Explanation {
        let mut views: Vec<AgentView> = self.agents.values().map(|a| a.view.clone()).collect();
        views.sort_by_key(|a| a.agent_id);
        matcher::explain(placement, namespace, &views)
    }
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

    fn view(id: &str, doc: Value) -> AgentView {
        AgentView {
            held: Default::default(),
            agent_id: AgentId::from_name(id),
            namespace: "default".into(),
            status: AgentStatus::Ready,
            capacity: 2,
            active_leases: 0,
            last_granted_at_ms: None,
            document: Arc::new(doc),
            kinds: Arc::new(HandledKinds::every()),
        }
    }

    fn sel(text: &str) -> CompiledPlacement {
        compile(&selector::parse(text).unwrap()).unwrap()
    }

    fn best(index: &AgentIndex, text: &str) -> Option<AgentId> {
        index.select_best(&sel(text), "default").map(|s| s.agent_id)
    }

    /// Asserts that `index`, changed in place, posts what `fresh` (the same
    /// documents upserted anew) posts, and picks what it picks for each of
    /// `queries`; `after` names the change in a failure.
    fn agrees_with_fresh(index: &AgentIndex, fresh: &AgentIndex, queries: &[&str], after: &str) {
        let (ns, ns_f) = (&index.namespaces["default"], &fresh.namespaces["default"]);
        assert_eq!(ns.paths, ns_f.paths, "{after}");
        assert_eq!(ns.values, ns_f.values, "{after}");
        assert_eq!(ns.partial, ns_f.partial, "{after}");
        for text in queries {
            assert_eq!(best(index, text), best(fresh, text), "{text} after {after}");
        }
    }

    #[test]
    fn any_capable_is_not_parked() {
        let mut index = AgentIndex::new();
        for i in 0..12 {
            let tags = match i % 4 {
                0 => json!(["linux", "gpu"]),
                1 => json!(["linux", "tpu"]),
                _ => json!(["linux"]),
            };
            let mut v = view(
                &format!("a{i:02}"),
                json!({"tags": tags, "memory": {"total": 1024 * i}, "n": i}),
            );
            // Every tpu agent drains; one gpu agent is full.
            if i % 4 == 1 {
                v.status = AgentStatus::Draining;
            }
            if i == 4 {
                v.active_leases = v.capacity;
            }
            index.upsert(v);
        }
        for text in [
            "linux",
            "gpu",
            "tpu",
            "fpga",
            "gpu, n=4",
            "gpu, n=5",
            "n=3",
            "memory.total>=11264",
            "memory.total>=11265",
            "!linux",
            "missing?",
            "prefer: tpu",
        ] {
            let c = sel(text);
            let parked = matches!(
                index.explain(&c, "default").outcome,
                crate::matcher::Outcome::Parked(_)
            );
            assert_eq!(index.any_capable(&c, "default"), !parked, "{text}");
            assert!(!index.any_capable(&c, "elsewhere"), "{text}");
        }
        assert!(index.any_capable(&sel("gpu, n=4"), "default"));
        assert!(!index.any_capable(&sel("tpu"), "default"));
    }

    #[test]
    fn selects_like_the_matcher() {
        let mut index = AgentIndex::new();
        for i in 0..40 {
            let tags = if i % 10 == 0 {
                json!(["linux", "gpu"])
            } else {
                json!(["linux"])
            };
            let mut v = view(
                &format!("a{i:02}"),
                json!({"tags": tags, "memory": {"total": 1024 * i}, "n": i}),
            );
            v.last_granted_at_ms = Some(1000 - i);
            index.upsert(v);
        }
        for text in [
            "linux",
            "gpu",
            "n=7",
            "memory.total>=30000",
            "linux, prefer 2: gpu",
            "prefer: n=3",
            "missing?",
            "!gpu",
            "n in (3, 4)",
        ] {
            let c = sel(text);
            let expected = index.explain(&c, "default").ranked.first().cloned();
            assert_eq!(best(&index, text), expected, "{text}");
        }
        assert_eq!(best(&index, "gpu"), Some(id("a30")));
        assert_eq!(best(&index, "n=7.0"), Some(id("a07")));
        assert_eq!(best(&index, "nothing"), None);
    }

    #[test]
    fn candidate_scan_agrees_with_the_matcher() {
        let mut index = AgentIndex::new();
        for i in 0..300u64 {
            let mut tags = vec!["linux"];
            if i % 60 == 7 {
                tags.push("rare");
            }
            if i % 2 == 0 {
                tags.push("even");
            }
            let mut v = view(&format!("a{i:03}"), json!({"tags": tags, "n": i % 13}));
            v.capacity = 3;
            v.active_leases = u32::try_from(i % 4).unwrap();
            v.last_granted_at_ms = Some((i * 37) % 11);
            index.upsert(v);
        }
        for text in [
            "rare",
            "rare, prefer 2: even",
            "rare, n=7",
            "n=4, prefer: rare",
            "rare, prefer 5: n>=10",
            "even, prefer 9: rare",
        ] {
            let c = sel(text);
            let expected = index.explain(&c, "default").ranked.first().cloned();
            assert_eq!(best(&index, text), expected, "{text}");
        }
    }

    #[test]
    fn the_cached_union_of_kind_postings_follows_every_change() {
        let mut index = AgentIndex::new();
        let mut a = view("a", json!({}));
        a.kinds = Arc::new(HandledKinds::parse(&["exec"]).unwrap());
        index.upsert(a);
        index.upsert(view("b", json!({})));
        index.upsert(view("d", json!({})));
        let exec = sel("").with_kind("exec");
        // a (exact), b and d (`*`): the union is built and cached.
        assert!(index.any_capable(&exec, "default"));
        index.update_load(id("a"), 2, Some(1));
        index.update_load(id("d"), 2, Some(1));
        assert_eq!(
            index.select_best(&exec, "default").map(|s| s.agent_id),
            Some(id("b"))
        );
        // b stops handling every kind: the cached union must not keep it.
        index.set_kinds(
            id("b"),
            Arc::new(HandledKinds::parse(&["build.*"]).unwrap()),
        );
        assert_eq!(index.select_best(&exec, "default"), None);
        // A new agent handling exec by `*` is found at once.
        index.upsert(view("c", json!({})));
        assert_eq!(
            index.select_best(&exec, "default").map(|s| s.agent_id),
            Some(id("c"))
        );
        // Removed, it is gone from the union.
        index.remove(id("c"));
        assert_eq!(index.select_best(&exec, "default"), None);
        assert!(index.any_capable(&exec, "default"));
    }

    #[test]
    fn binpack_fills_one_agent_before_the_next() {
        let mut index = AgentIndex::new();
        for name in ["a", "b", "c"] {
            let mut v = view(name, json!({}));
            v.capacity = 3;
            index.upsert(v);
        }
        let mut binpack = selector::parse("").unwrap();
        binpack.policy = Some(PlacementPolicy::Binpack);
        let binpack = compile(&binpack).unwrap();
        let spread = sel("");
        let mut now = 0;
        let mut grant = |index: &mut AgentIndex, placement: &CompiledPlacement| {
            let chosen = index.select_best(placement, "default").unwrap().agent_id;
            let active = index.get(chosen).unwrap().active_leases;
            now += 1;
            index.update_load(chosen, active + 1, Some(now));
            chosen
        };
        // Binpack: every idle agent ties, the highest id first, then it fills.
        let packed: Vec<AgentId> = (0..4).map(|_| grant(&mut index, &binpack)).collect();
        assert_eq!(packed, vec![id("c"), id("c"), id("c"), id("b")]);
        // Spread: the idle agent first, then of two equally loaded the
        // one granted longest ago, then the less loaded.
        let spread_out: Vec<AgentId> = (0..3).map(|_| grant(&mut index, &spread)).collect();
        assert_eq!(spread_out, vec![id("a"), id("b"), id("a")]);
        assert_eq!(
            index.explain(&binpack, "default").ranked.first().copied(),
            index.select_best(&binpack, "default").map(|s| s.agent_id)
        );
    }

    #[test]
    fn spread_balances_over_the_values_of_a_key() {
        let mut index = AgentIndex::new();
        // Three agents in eu, one in us, one without a region.
        for (name, region) in [("e1", "eu"), ("e2", "eu"), ("e3", "eu"), ("u1", "us")] {
            index.upsert(view(name, json!({"region": region})));
        }
        index.upsert(view("x1", json!({})));
        let placement = sel("spread by region");
        let mut regions = Vec::new();
        for n in 0..6u128 {
            let agent = index.select_best(&placement, "default").unwrap().agent_id;
            let v = index.get(agent).unwrap();
            let claim = placement
                .assign(&v.document, v.capacity, v.active_leases, &v.held)
                .unwrap();
            regions.push(claim.spread.clone().unwrap().value);
            assert!(index.hold(agent, uuid::Uuid::from_u128(n + 1), claim, Some(1)));
        }
        regions.sort();
        assert_eq!(regions, ["", "", "eu", "eu", "us", "us"]);
        // A lease in us ends: us is the least used again.
        let us = index
            .agents
            .values()
            .find(|a| a.view.agent_id == id("u1"))
            .unwrap();
        let task = *us.view.held.claims().next().unwrap().0;
        assert!(index.release(id("u1"), task));
        let next = index.select_best(&placement, "default").unwrap().agent_id;
        assert_eq!(next, id("u1"));
    }

    #[test]
    fn tainted_agents_take_only_tolerating_tasks() {
        let mut index = AgentIndex::new();
        index.upsert(view("cpu", json!({"tags": ["linux"]})));
        // The GPU pool is idle and would rank first, but it is tainted.
        index.upsert(view(
            "gpu",
            json!({"tags": ["linux", "gpu"], "taints": ["gpu"]}),
        ));
        index.update_load(id("cpu"), 1, Some(1));
        assert_eq!(best(&index, "linux"), Some(id("cpu")));
        assert_eq!(best(&index, "linux, tolerates gpu"), Some(id("gpu")));
        assert_eq!(best(&index, "gpu"), None);
        assert!(!index.any_capable(&sel("gpu"), "default"));
        let why = index.explain(&sel("gpu"), "default");
        assert_eq!(
            why.summary,
            "0/2 agents eligible: 1 missing tag gpu, 1 tainted gpu"
        );
        let gpu = why
            .verdicts
            .iter()
            .find(|v| v.agent_id == id("gpu"))
            .unwrap();
        assert_eq!(gpu.reason_text(), "tainted gpu: task does not tolerate it");
        // Untainted, it takes ordinary work again.
        index.replace_document(id("gpu"), Arc::new(json!({"tags": ["linux", "gpu"]})));
        assert_eq!(best(&index, "gpu"), Some(id("gpu")));
    }

    #[test]
    fn a_retry_goes_elsewhere_while_another_agent_could_take_it() {
        let mut index = AgentIndex::new();
        index.upsert(view("a", json!({})));
        index.upsert(view("b", json!({})));
        let any = sel("");
        let failed = [id("a")];
        assert_eq!(
            index
                .select_retry(&any, "default", &[], &failed)
                .map(|s| s.agent_id),
            Some(id("b"))
        );
        // The other agent is busy: the retry waits for it.
        index.update_load(id("b"), 2, Some(1));
        assert_eq!(index.select_retry(&any, "default", &[], &failed), None);
        // It is gone: the agent that failed is the only one, and takes it.
        index.remove(id("b"));
        assert_eq!(
            index
                .select_retry(&any, "default", &[], &failed)
                .map(|s| s.agent_id),
            Some(id("a"))
        );
    }

    #[test]
    fn free_slots_count_agents_that_take_work() {
        let mut index = AgentIndex::new();
        assert_eq!(index.free_slots(100), 0);
        index.upsert(view("a", json!({})));
        let mut busy = view("b", json!({}));
        busy.capacity = 5;
        busy.active_leases = 2;
        index.upsert(busy);
        let mut draining = view("c", json!({}));
        draining.status = AgentStatus::Draining;
        index.upsert(draining);
        let mut elsewhere = view("d", json!({}));
        elsewhere.namespace = "other".into();
        index.upsert(elsewhere);
        // a: 2 free, b: 3, c: none (draining), d: 2 in another namespace.
        assert_eq!(index.free_slots(100), 7);
        assert!(index.free_slots(3) >= 3);
        index.update_load(id("b"), 5, None);
        assert_eq!(index.free_slots(100), 4);
    }

    #[test]
    fn load_updates_change_the_choice() {
        let mut index = AgentIndex::new();
        index.upsert(view("a", json!({"tags": ["x"]})));
        index.upsert(view("b", json!({"tags": ["x"]})));
        assert_eq!(best(&index, "x"), Some(id("a")));
        assert!(index.update_load(id("a"), 1, Some(10)));
        assert_eq!(best(&index, "x"), Some(id("b")));
        assert!(index.update_load(id("b"), 2, Some(20)));
        assert_eq!(best(&index, "x"), Some(id("a")));
        assert!(index.update_load(id("a"), 2, Some(30)));
        assert_eq!(best(&index, "x"), None);
        assert!(index.update_load(id("b"), 0, Some(20)));
        assert!(index.set_status(id("b"), AgentStatus::Draining));
        assert_eq!(best(&index, "x"), None);
        assert!(!index.update_load(id("nope"), 0, None));
    }

    #[test]
    fn a_held_back_agent_is_capable_but_never_picked_nor_counted_free() {
        let mut index = AgentIndex::new();
        index.upsert(view("a", json!({"tags": ["x"]})));
        let compiled = sel("x");
        assert!(index.hold_back(id("a"), true));
        assert!(index.is_held_back(id("a")));
        assert_eq!(best(&index, "x"), None);
        assert_eq!(index.free_slots(100), 0);
        // Capable, so a task that needs it waits for it rather than parks.
        assert!(index.any_capable(&compiled, "default"));
        // A new document keeps it held back; letting it go offers it again.
        index.upsert(view("a", json!({"tags": ["x", "y"]})));
        assert_eq!(best(&index, "x"), None);
        assert!(index.hold_back(id("a"), false));
        assert_eq!(best(&index, "x"), Some(id("a")));
        assert_eq!(index.free_slots(100), 2);
        assert!(!index.hold_back(id("nope"), true));
    }

    #[test]
    fn upsert_replaces_and_remove_cleans_up() {
        let mut index = AgentIndex::new();
        index.upsert(view("a", json!({"tags": ["x"]})));
        index.upsert(view("a", json!({"tags": ["y"]})));
        assert_eq!(index.len(), 1);
        assert_eq!(best(&index, "x"), None);
        assert_eq!(best(&index, "y"), Some(id("a")));
        assert!(index.remove(id("a")).is_some());
        assert!(index.is_empty());
        assert!(index.namespaces.is_empty());
        assert_eq!(best(&index, "y"), None);
    }

    #[test]
    fn a_reused_ordinal_carries_nothing_of_its_last_agent() {
        let mut index = AgentIndex::new();
        for i in 0..40 {
            index.upsert(view(
                &format!("a{i:02}"),
                json!({"tags": ["linux"], "n": i}),
            ));
        }
        index.upsert(view(
            "rare",
            json!({"tags": ["linux", "rare"], "v": "2.0.0"}),
        ));
        assert_eq!(best(&index, "rare"), Some(id("rare")));
        index.remove(id("rare"));
        // The next agent takes the freed ordinal.
        index.upsert(view("plain", json!({"tags": ["linux"], "v": "1.0.0"})));
        assert_eq!(index.ordinals.len(), 41);
        for text in ["rare", "v@^2", "linux, rare"] {
            assert_eq!(best(&index, text), None, "{text}");
            assert!(!index.any_capable(&sel(text), "default"), "{text}");
        }
        // A candidate found by its ordinal is the agent holding it now.
        assert_eq!(best(&index, "v@^1"), Some(id("plain")));
    }

    #[test]
    fn replace_document_matches_a_fresh_upsert() {
        let docs = [
            json!({"tags": ["linux", "gpu"], "memory": {"free": 100, "total": 4096}, "n": 1}),
            json!({"tags": ["linux"], "memory": {"free": 900, "total": 4096}, "os": "linux"}),
            json!({"tags": ["mac"], "memory": {"free": 5}, "long": (0..80).collect::<Vec<_>>()}),
            json!({"tags": ["linux", "gpu"], "memory": {"free": 700, "total": 4096}, "n": 2}),
        ];
        let queries = [
            "linux",
            "gpu",
            "mac",
            "memory.free>=500",
            "n=1",
            "n=2",
            "os=linux",
            "long?",
            "!gpu",
        ];
        let mut replaced = AgentIndex::new();
        replaced.upsert(view("a", docs[0].clone()));
        replaced.upsert(view("b", json!({"tags": ["linux"]})));
        for doc in &docs[1..] {
            assert!(replaced.replace_document(id("a"), Arc::new(doc.clone())));
            let mut fresh = AgentIndex::new();
            fresh.upsert(view("a", doc.clone()));
            fresh.upsert(view("b", json!({"tags": ["linux"]})));
            agrees_with_fresh(&replaced, &fresh, &queries, &doc.to_string());
        }
        assert!(!replaced.replace_document(id("nobody"), Arc::new(json!({}))));
    }

    #[test]
    fn replace_document_at_matches_a_fresh_upsert() {
        let start = json!({
            "tags": ["linux", "gpu"],
            "memory": {"free": 100, "total": 4096, "unit": "MB"},
            "loadavg": [0.5, 0.4, 0.3],
            "tools": {"node": {"version": "20.1.0"}, "rust": {"version": "1.95.0"}},
            "n": 1
        });
        let patches = [
            json!([{"op": "replace", "path": "/memory", "value": {"free": 90, "total": 4096, "unit": "MB"}},
                   {"op": "replace", "path": "/loadavg", "value": [0.6, 0.4, 0.3]}]),
            json!([{"op": "replace", "path": "/memory/free", "value": 4000}]),
            json!([{"op": "add", "path": "/tags/-", "value": "docker"}]),
            json!([{"op": "remove", "path": "/tags/0"}]),
            json!([{"op": "add", "path": "/tools/go", "value": {"version": "1.22"}}]),
            json!([{"op": "move", "from": "/tools/node", "path": "/node"}]),
            json!([{"op": "copy", "from": "/tools/rust", "path": "/tools/cargo"}]),
            json!([{"op": "replace", "path": "/memory", "value": 7}]),
            json!([{"op": "add", "path": "/memory", "value": {"free": 1}}]),
            json!([{"op": "test", "path": "/n", "value": 1},
                   {"op": "remove", "path": "/tools"}]),
            json!([{"op": "add", "path": "/a.b", "value": 1}, {"op": "add", "path": "/a", "value": {"b": 1}}]),
            json!([{"op": "remove", "path": "/a.b"}]),
            json!([{"op": "replace", "path": "/a/b", "value": 2}]),
            json!([{"op": "replace", "path": "", "value": {"tags": ["mac"], "n": 2}}]),
        ];
        let queries = [
            "linux",
            "gpu",
            "docker",
            "mac",
            "memory.free>=500",
            "memory.free=1",
            "n=1",
            "n=2",
            "tools.go.version=1.22",
            "node.version=20.1.0",
            "tools.cargo?",
            "a.b=1",
            "a.b=2",
        ];
        let mut replaced = AgentIndex::new();
        replaced.upsert(view("a", start.clone()));
        replaced.upsert(view("b", json!({"tags": ["linux"], "n": 1})));
        let mut doc = start;
        for patch in patches {
            let patch: crate::diff::Patch = serde_json::from_value(patch).unwrap();
            json_patch::patch(&mut doc, &patch).unwrap();
            let touched = crate::diff::touched(&patch);
            assert!(replaced.replace_document_at(id("a"), Arc::new(doc.clone()), touched));
            let mut fresh = AgentIndex::new();
            fresh.upsert(view("a", doc.clone()));
            fresh.upsert(view("b", json!({"tags": ["linux"], "n": 1})));
            agrees_with_fresh(&replaced, &fresh, &queries, &doc.to_string());
        }
    }

    #[test]
    fn set_leaves_changes_the_shared_document_in_place_as_a_fresh_upsert_would() {
        let start = json!({
            "memory": {"free": 100, "total": 4096},
            "loadavg": {"one": 0.5},
            "tags": ["linux"],
            "name": "a"
        });
        let keys = |path: &str| -> Vec<String> { path.split('/').map(str::to_owned).collect() };
        let mut index = AgentIndex::new();
        index.upsert(view("a", start.clone()));
        index.upsert(view("b", json!({"memory": {"free": 3000}})));
        let mut held = index.get(id("a")).unwrap().document.clone();
        let address = Arc::as_ptr(&held);
        let leaves = vec![
            (keys("memory/free"), json!(4000)),
            (keys("loadavg/one"), json!(1.5)),
        ];
        assert!(index.set_leaves(id("a"), &mut held, &leaves));
        // Changed where it was: no clone, and the session and the index
        // share the change.
        assert_eq!(Arc::as_ptr(&held), address);
        assert!(Arc::ptr_eq(&held, &index.get(id("a")).unwrap().document));
        let mut doc = start;
        doc["memory"]["free"] = json!(4000);
        doc["loadavg"]["one"] = json!(1.5);
        assert_eq!(*held, doc);
        let mut fresh = AgentIndex::new();
        fresh.upsert(view("a", doc.clone()));
        fresh.upsert(view("b", json!({"memory": {"free": 3000}})));
        agrees_with_fresh(
            &index,
            &fresh,
            &[
                "memory.free>=3500",
                "memory.free=100",
                "loadavg.one>1",
                "linux",
            ],
            "set_leaves",
        );
        // A reader's copy is left as it was: the change is made on a clone.
        let reader = held.clone();
        assert!(index.set_leaves(id("a"), &mut held, &[(keys("memory/free"), json!(1))]));
        assert_eq!(reader["memory"]["free"], json!(4000));
        assert_eq!(held["memory"]["free"], json!(1));

        // Nothing changes where a path is not a scalar, the document is not
        // the indexed one, or the agent is unknown.
        for bad in [
            vec![(keys("memory"), json!(1))],
            vec![(keys("tags"), json!(1))],
            vec![(keys("memory/used"), json!(1))],
            vec![(keys("memory/free"), json!({"x": 1}))],
            vec![(keys("memory/free"), json!(2)), (keys("name/x"), json!(1))],
        ] {
            let before = held.clone();
            assert!(!index.set_leaves(id("a"), &mut held, &bad), "{bad:?}");
            assert!(Arc::ptr_eq(&held, &before));
        }
        let mut other = Arc::new((*held).clone());
        assert!(!index.set_leaves(id("a"), &mut other, &leaves));
        assert!(!index.set_leaves(id("nobody"), &mut held, &leaves));
    }

    #[test]
    fn a_volatile_heartbeat_moves_no_posting_even_beside_dotted_capability_names() {
        // A capability pack's names are dotted (`ai.llm`): such a document
        // was re-indexed whole on every heartbeat.
        let doc = |free: u64, load: f64| {
            json!({
                "memory": {"free": free, "available": free + 100, "total": 8192},
                "loadavg": {"1min": load, "5min": load},
                "provides": {"ai.llm": {"version": "1.2.0"}},
                "tags": ["linux"],
                "name": "a"
            })
        };
        let keys = |path: &str| -> Vec<String> { path.split('/').map(str::to_owned).collect() };
        // Agent `a` with `first`, and three others.
        let fleet = |first: Value| {
            let mut index = AgentIndex::new();
            index.upsert(view("a", first));
            for (i, free) in [3000u64, 5000, 7000].into_iter().enumerate() {
                index.upsert(view(&format!("b{i}"), doc(free, 1.0)));
            }
            index
        };
        let mut index = fleet(doc(100, 0.5));
        let paths = index.namespaces["default"].paths.clone();
        let values = index.namespaces["default"].values.clone();
        // Volatile facts: their paths are posted, their values never.
        for path in [
            "memory.free",
            "memory.available",
            "loadavg.1min",
            "loadavg.5min",
        ] {
            assert!(paths.contains_key(path), "{path}");
            assert!(!values.contains_key(path), "{path}");
        }
        assert!(values.contains_key("memory.total"));

        let mut held = index.get(id("a")).unwrap().document.clone();
        let address = Arc::as_ptr(&held);
        let leaves = vec![
            (keys("memory/free"), json!(6000)),
            (keys("memory/available"), json!(6100)),
            (keys("loadavg/1min"), json!(2.5)),
        ];
        assert!(index.set_leaves(id("a"), &mut held, &leaves));
        assert_eq!(Arc::as_ptr(&held), address);
        let mut changed = doc(6000, 0.5);
        changed["loadavg"]["1min"] = json!(2.5);
        assert_eq!(*held, changed);
        let ns = &index.namespaces["default"];
        assert_eq!(ns.paths, paths);
        assert_eq!(ns.values, values);

        agrees_with_fresh(
            &index,
            &fleet(changed),
            &[
                "memory.free>=5500",
                "memory.free=6000",
                "memory.free=100",
                "memory.available>6050, memory.free<6500",
                "loadavg.1min>2",
                "loadavg.5min=0.5",
                "provides ai.llm@1",
                "prefer 3: memory.free=6000",
            ],
            "a volatile heartbeat",
        );
        assert_eq!(best(&index, "memory.free=6000"), Some(id("a")));
        assert_eq!(best(&index, "loadavg.1min>2"), Some(id("a")));

        // A leaf that is not volatile, on a document with a dotted key, is
        // still refused (its postings could be shared across dotted paths).
        let before = held.clone();
        assert!(!index.set_leaves(id("a"), &mut held, &[(keys("name"), json!("z"))]));
        assert!(Arc::ptr_eq(&held, &before));
    }

    #[test]
    fn volatile_paths_are_the_dotted_forms_of_the_volatile_pointers() {
        for (path, volatile) in [
            ("memory.free", true),
            ("memory.available", true),
            ("loadavg", true),
            ("loadavg.1min", true),
            ("memory", false),
            ("memory.total", false),
            ("memory.freely", false),
            ("loadavgs", false),
            ("memoryfree", false),
            ("tags", false),
        ] {
            assert_eq!(volatile_path(path), volatile, "{path}");
        }
        let keys = |path: &str| -> Vec<String> { path.split('/').map(str::to_owned).collect() };
        assert!(volatile_keys(&keys("memory/free")));
        assert!(volatile_keys(&keys("loadavg/15min")));
        assert!(!volatile_keys(&keys("memory")));
        assert!(!volatile_keys(&keys("memory/total")));
        assert!(!volatile_keys(&keys("loadavgs/1min")));
    }

    #[test]
    fn arrays_long_or_indexed_still_match() {
        let mut index = AgentIndex::new();
        let long: Vec<String> = (0..100).map(|i| format!("p{i}")).collect();
        for i in 0..12 {
            let doc = if i == 5 {
                json!({"tags": long.clone(), "gpus": [{"model": "a100"}], "m": {"0": "zero"}})
            } else {
                json!({"tags": ["x"], "gpus": []})
            };
            index.upsert(view(&format!("a{i:02}"), doc));
        }
        assert_eq!(best(&index, "p77"), Some(id("a05")));
        assert_eq!(best(&index, "gpus.0.model=a100"), Some(id("a05")));
        assert_eq!(best(&index, "m.0=zero"), Some(id("a05")));
        assert_eq!(best(&index, "x"), Some(id("a00")));
        index.remove(id("a05"));
        assert!(index.namespaces["default"].partial.is_empty());
        assert_eq!(best(&index, "p77"), None);
    }

    #[test]
    fn namespaces_are_separate() {
        let mut index = AgentIndex::new();
        let mut other = view("b", json!({"tags": ["x"]}));
        other.namespace = "prod".into();
        index.upsert(other);
        assert_eq!(best(&index, "x"), None);
        assert_eq!(
            index.select_best(&sel("x"), "prod").map(|s| s.agent_id),
            Some(id("b"))
        );
        assert_eq!(
            index.explain(&sel("x"), "default").summary,
            "0/1 agents eligible: 1 in other namespaces"
        );
    }

    #[test]
    fn capability_postings() {
        let mut index = AgentIndex::new();
        for i in 0..20 {
            let doc = if i == 13 {
                json!({"provides": {"ai.llm": {"version": "1.2.0"}}})
            } else {
                json!({})
            };
            index.upsert(view(&format!("a{i:02}"), doc));
        }
        assert_eq!(best(&index, "provides ai.llm@1"), Some(id("a13")));
        assert_eq!(best(&index, "provides.ai.llm.version@^1"), Some(id("a13")));
        assert_eq!(best(&index, "provides ai.llm@2"), None);
    }
}
