//! The agent binary end to end against a real server (started in-process on
//! an ephemeral port over SQLite, or PostgreSQL where the store matters): an
//! exec task runs and returns its output, streamed live and bounded;
//! editing `.capabilities.override.json` reaches the server as a diff and
//! unparks a waiting task; the agent survives a server restart and its
//! running lease still completes; SIGTERM drains.

// Helpers and scenario functions are not `#[test]`s, so clippy's
// allow-unwrap-in-tests does not reach them.
#![allow(clippy::unwrap_used)]

mod bytes;
mod common;
mod kinds;
mod output;
mod session;
mod tiers;
