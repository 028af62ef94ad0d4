//! The Switchyard control plane as a library: the binary parses flags and
//! calls [`run`], and the integration tests start the very same server on an
//! ephemeral port.
//!
//! # Layout
//! - [`config`]: the command line (clap derive; every flag also reads a
//!   `SWITCHYARD_*` variable) and the settings it produces.
//! - [`server`]: builds the tonic router (the three switchyard.v1 services,
//!   gRPC health, server reflection v1 and v1alpha) and serves it until the
//!   shutdown signal.
//! - [`api`]: the gRPC service implementations, and the one mapping of the
//!   crate's errors to `tonic::Status`.
//! - [`wire`]: every switchyard.v1 message built from the server's records,
//!   for the API and the dispatcher alike.
//! - [`dispatch`]: matching queued tasks to connected agents, pushing
//!   grants, the submit protocol, sweeping expired and unacknowledged leases.
//! - [`batch`]: group commit, many callers' small writes in one transaction.
//! - [`model`]: the domain records and their lifecycles as enums.
//! - [`clock`]: the injected clock.
//! - [`auth`]: bearer tokens, roles and namespaces.
//! - [`metrics`]: the Prometheus recorder and its HTTP endpoint.
//! - [`ctl`]: the `switchyard` operator CLI.
//! - [`store`]: the task store, opened from a database URL (embedded SQLite by
//!   default, PostgreSQL for many replicas).
//! - [`error`]: the crate's error type and its one mapping to `tonic::Status`.
//! - [`telemetry`]: tracing set-up (text or JSON logs).

pub mod api;
pub mod auth;
pub mod batch;
pub mod clock;
pub mod config;
pub mod ctl;
pub mod dispatch;
pub mod error;
pub mod metrics;
pub mod model;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod wire;

pub use config::ServerConfig;
pub use error::Error;
pub use server::run;
