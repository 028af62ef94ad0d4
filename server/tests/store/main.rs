//! The store conformance suite: every test runs against SQLite (a file in a
//! temporary directory) and PostgreSQL (a database of its own on
//! `$SWITCHYARD_TEST_PG`, dropped afterwards), through the `Store` trait only.
//! The clock is injected, so expiry and backoff tests pass later `now_ms`
//! values instead of sleeping.

// Tests may unwrap (house rule); the workspace lint is for non-test code and
// clippy's test exemption does not reach helpers of an integration binary.
#![allow(clippy::unwrap_used)]

mod agents;
mod common;
mod deadlines;
mod events;
mod fairness;
mod leases;
mod limits;
mod pages;
mod race;
mod releases;
mod reports;
mod statistics;
mod tasks;
