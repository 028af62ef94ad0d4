//! The Switchyard agent as a library.
//!
//! # Layout
//! (filled in by the agent work: capability tiers and detection, the session,
//! task execution and handler packs.)
