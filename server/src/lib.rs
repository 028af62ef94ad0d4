//! The Switchyard control plane as a library: the binary parses flags and
//! calls [`run`], and the integration tests start the very same server on an
//! ephemeral port.
//!
//! # Layout
//! - [`model`]: the domain records (task, lease, agent, token) and their lifecycles as enums.
//! - [`error`]: the crate's one error type; each variant says the status it becomes.
//! - [`store`]: the `Store` traits and their one SQL implementation (SQLite or PostgreSQL).
//! - [`batch`]: group commit, many callers' small writes in one transaction.
//! - [`dispatch`]: sessions, the submit protocol, the dispatch round, refusals, the sweep, store events.
//! - [`wire`]: every switchyard.v1 message built from a record, for the API and the dispatcher.
//! - [`api`]: the three gRPC services, and the one mapping of errors to `tonic::Status`.
//! - [`auth`]: bearer tokens, roles and namespaces.
//! - [`tokens`]: the `switchyard-server token` commands (create, list, revoke, rotate).
//! - [`clock`]: the injected clock.
//! - [`config`]: the command line (clap; every flag also reads a `SWITCHYARD_*` variable).
//! - [`server`]: builds the router (services, health, reflection) and serves until shutdown.
//! - [`reflection`]: who may use server reflection (`--reflection public|authenticated|off`).
//! - [`metrics`]: the Prometheus recorder and its HTTP endpoint.
//! - [`console`]: the web console (its page and gRPC-Web), on a port of its own.
//! - [`telemetry`]: tracing set-up (text or JSON logs).
//! - [`ctl`]: the `switchyard` operator CLI, a plain gRPC client.
//!
//! `ARCHITECTURE.md` at the repository root walks the data paths through them.

pub mod api;
pub mod auth;
pub mod batch;
pub mod clock;
pub mod config;
pub mod console;
pub mod ctl;
pub mod dispatch;
pub mod error;
pub mod metrics;
pub mod model;
pub mod reflection;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tokens;
pub mod wire;

pub use config::ServerConfig;
pub use error::Error;
pub use server::run;
