//! The core's integration tests, one binary: the shared conformance vectors in
//! `tests/conformance/` (which the Python and Node runners read too) and the property-based laws
//! of merges, diffs, redaction and ranking, and the diff-size target.

mod conformance;
mod laws;
mod targets;
