//! Capability documents, tier merges, diffs, placements and matching.
//!
//! Pure logic: no IO, no async runtime, no clock it is not handed.
//!
//! # Layout
//! Filled in by the capability-core work (issue 3).
