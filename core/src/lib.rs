//! Capability documents, tier merges, diffs, placements and matching for Switchyard.
//!
//! Pure logic: no IO, no async runtime, no clock it is not handed (times are `u64` milliseconds
//! passed in by the caller). Every function here is deterministic and total: merges report what
//! they rejected instead of failing, and nothing panics on hostile input.
//!
//! # Layout
//!
//! - [`limits`]: the size, depth, key-length and array-length limits every document and patch
//!   obeys, and the walk that reports violations with dotted paths.
//! - [`document`]: dotted-path lookup into a capability document and the conventional fields
//!   matching understands (`os`, `tags`, `software.<tool>`, `memory`, `provides.<name>`, ...).
//! - [`tier`]: the base → static → dynamic → override → operator merge (RFC 7386), with
//!   per-leaf provenance and a rejection channel; the operator tier merged over an agent's own.
//! - [`redact`]: replacing values under sensitive-looking keys, or holding a secret of a known
//!   shape, with [`redact::MARKER`].
//! - [`secrets`]: the known shapes of secrets (cloud and forge tokens, JWTs, private keys,
//!   passwords in URLs, `Bearer` credentials), and their redaction from free text.
//! - [`diff`]: RFC 6902 JSON Patch between generations, generation-checked application, and
//!   whether a change touched only volatile facts (free memory, load).
//! - [`version`]: lenient version parsing (`v18.2`, `1.95.0-nightly`) and version ranges.
//! - [`placement`]: what a task needs (tags, requirements, capability refs, preferences, JSON
//!   Schema, tolerations, policy, spread key, resource request), validated and compiled once
//!   into a [`placement::CompiledPlacement`].
//! - [`resources`]: consumable resources — what an agent offers (its document's `resources`
//!   section and its slots), what its leases hold, what a request needs, and what falls short.
//! - [`selector`]: the text form of a placement (`linux, docker, !gpu, memory.total>=16384`),
//!   with its grammar.
//! - [`kinds`]: the task kinds an agent handles (exact, `prefix.*`, `*`) and the rules for a
//!   kind's name.
//! - [`matcher`]: agents as matching sees them ([`matcher::AgentView`], [`matcher::AgentId`]), an
//!   agent's [`matcher::Verdict`] for a placement, the deterministic ranking,
//!   the summary line, and the parked / waiting-for-capacity distinction.
//! - [`index`]: an incrementally maintained [`index::AgentIndex`] that selects the best agent
//!   without evaluating every agent.
//! - [`pack`]: handler packs merged first-registration-wins, and parameter resolution into the
//!   `provides` subtree (health, never parameter values).
//! - [`error`]: the crate's typed errors.

pub mod diff;
pub mod document;
pub mod error;
pub mod index;
pub mod kinds;
pub mod limits;
pub mod matcher;
pub mod pack;
pub mod placement;
pub mod redact;
pub mod resources;
pub mod secrets;
pub mod selector;
pub mod tier;
pub mod version;

pub use error::{DiffError, Error, PlacementError, SelectorError};
pub use limits::Limits;
pub use tier::{Merged, Rejection, Tier, merge_tiers};
