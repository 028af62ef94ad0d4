//! The server's command line. `///` comments here are the `--help` text, and
//! every flag also reads a `SWITCHYARD_*` environment variable.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand};

use crate::telemetry::LogFormat;

/// Switchyard control plane: routes tasks to the agents able to run them.
#[derive(Debug, Parser)]
#[command(name = "switchyard-server", version, about, long_about = None)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings shared by every subcommand.
    #[command(flatten)]
    pub config: ServerConfig,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve gRPC (the default).
    Serve,
    /// Run the database migrations and exit.
    Migrate,
}

/// Everything the server needs to run, from flags or `SWITCHYARD_*`
/// variables.
#[derive(Debug, Clone, Args)]
pub struct ServerConfig {
    /// Address for gRPC (agents, submitters, operators, health, reflection).
    /// Port 0 picks a free port; the chosen address is printed on standard
    /// output as `switchyard-server listening on ADDR`.
    #[arg(
        long,
        env = "SWITCHYARD_LISTEN",
        default_value = "127.0.0.1:50051",
        global = true
    )]
    pub listen: SocketAddr,

    /// Where tasks, leases and agents are stored: `sqlite://PATH` (embedded,
    /// created if missing) or `postgres://USER@HOST:PORT/DB` (for several
    /// replicas).
    #[arg(
        long,
        env = "SWITCHYARD_DATABASE_URL",
        default_value = "sqlite://switchyard.db",
        global = true,
        hide_env_values = true
    )]
    pub database_url: String,

    /// Log line format on standard error (filter with RUST_LOG).
    #[arg(
        long,
        env = "SWITCHYARD_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,

    /// How often agents send heartbeats, in milliseconds; an agent silent for
    /// three intervals is OFFLINE.
    #[arg(
        long,
        env = "SWITCHYARD_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5_000,
        global = true
    )]
    pub heartbeat_interval_ms: i64,

    /// Lease lifetime without renewal for tasks that do not set one, in
    /// milliseconds.
    #[arg(
        long,
        env = "SWITCHYARD_LEASE_TTL_MS",
        default_value_t = 30_000,
        global = true
    )]
    pub lease_ttl_ms: i64,

    /// A grant the agent does not acknowledge within this many milliseconds
    /// is revoked and re-matched.
    #[arg(
        long,
        env = "SWITCHYARD_ACK_WINDOW_MS",
        default_value_t = 5_000,
        global = true
    )]
    pub ack_window_ms: i64,

    /// How often the sweeper expires leases, revokes unacknowledged grants
    /// and closes silent sessions, in milliseconds.
    #[arg(
        long,
        env = "SWITCHYARD_SWEEP_INTERVAL_MS",
        default_value_t = 1_000,
        global = true
    )]
    pub sweep_interval_ms: i64,

    /// Attempts a task gets when its submit does not say.
    #[arg(
        long,
        env = "SWITCHYARD_MAX_ATTEMPTS",
        default_value_t = 3,
        global = true
    )]
    pub max_attempts: u32,
}

impl ServerConfig {
    /// Settings for tests: an ephemeral loopback port and the given store.
    pub fn for_tests(database_url: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            database_url: database_url.into(),
            log_format: LogFormat::Text,
            heartbeat_interval_ms: 5_000,
            lease_ttl_ms: 30_000,
            ack_window_ms: 5_000,
            sweep_interval_ms: 1_000,
            max_attempts: 3,
        }
    }
}
