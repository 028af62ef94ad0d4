//! Integration tests of the gRPC surface: each test starts the real server
//! on `127.0.0.1:0` (the same `run` the binary calls), drives it through the
//! generated clients, and shuts it down.

// Helpers and scenario functions are not `#[test]`s, so clippy's
// allow-unwrap-in-tests does not reach them.
#![allow(clippy::unwrap_used)]

mod bulk;
mod cli;
mod common;
mod console;
mod contract;
mod deadlines;
mod explain;
mod fairness;
mod hardening;
mod health;
mod kinds;
mod limits;
mod operators;
mod ops;
mod output;
mod policy;
mod replicas;
mod resources;
mod retry;
mod security;
mod session;
mod wire_limits;
