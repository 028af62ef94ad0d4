//! The server's command line. `///` comments here are the `--help` text, and
//! every flag also reads a `SWITCHYARD_*` environment variable.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand};
use switchyard_core::placement::{PlacementPolicy, UnknownPolicy};

use crate::model::OutputBounds;
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
    /// Manage bearer tokens stored in the database.
    #[command(subcommand)]
    Token(TokenCommand),
}

/// Token subcommands.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token bound to a namespace and a role; prints it once (only
    /// its SHA-256 is stored).
    Create {
        /// A label for people, unique in the namespace (e.g. `ci`, `build-fleet`).
        #[arg(long)]
        name: String,
        /// The namespace the token is bound to.
        #[arg(long, default_value = "default")]
        namespace: String,
        /// agent, submitter or operator.
        #[arg(long)]
        role: String,
        /// The token stops being valid this many seconds from now.
        #[arg(long)]
        expires_in_secs: Option<u64>,
        /// For an agent token: the agent names it may register, exact or
        /// with `*` wildcards (`build-*`); repeat or separate with commas.
        #[arg(long, value_delimiter = ',')]
        agent_names: Vec<String>,
    },
    /// List the stored tokens (never the tokens themselves): name,
    /// namespace, role, id (the start of its SHA-256), created, last used,
    /// expiry and revocation.
    List {
        /// Only this namespace's (all if not given).
        #[arg(long, default_value = "")]
        namespace: String,
    },
    /// Revoke the tokens called NAME in a namespace: every replica refuses
    /// them within a second.
    Revoke {
        /// The token's name.
        #[arg(long)]
        name: String,
        /// Its namespace.
        #[arg(long, default_value = "default")]
        namespace: String,
    },
    /// Replace the token called NAME by a new one (printed once, same role
    /// and agent names); the old one keeps working for the grace period.
    Rotate {
        /// The token's name.
        #[arg(long)]
        name: String,
        /// Its namespace.
        #[arg(long, default_value = "default")]
        namespace: String,
        /// How long the old token stays valid, in seconds (0: revoked now).
        #[arg(long, default_value_t = 3600)]
        grace_secs: u64,
        /// The new token stops being valid this many seconds from now.
        #[arg(long)]
        expires_in_secs: Option<u64>,
    },
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
    /// created if missing; its WAL synced at every commit, or only at
    /// checkpoints with `?synchronous=normal`, which a power loss may cost the
    /// last commits) or `postgres://USER@HOST:PORT/DB` (for several
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

    /// An agent with a grant it has not acknowledged for this many
    /// milliseconds gets no more grants until it acknowledges one (longer
    /// while the whole fleet acknowledges slower than that: the floor of
    /// the replica's congestion control).
    #[arg(
        long,
        env = "SWITCHYARD_ACK_LATE_MS",
        default_value_t = 1_000,
        value_parser = clap::value_parser!(i64).range(1..),
        global = true
    )]
    pub ack_late_ms: i64,

    /// Submitted tasks waiting for the store beyond which a submit (a
    /// `SubmitTask`, or a whole `SubmitTasks` call) is pushed back with
    /// RESOURCE_EXHAUSTED and a retry hint (`google.rpc.RetryInfo`); 1 to
    /// 4,096 (the submits' group commit queues no more calls).
    #[arg(
        long,
        env = "SWITCHYARD_MAX_SUBMITS_WAITING",
        default_value_t = 2_048,
        value_parser = clap::value_parser!(u32).range(1..=4_096),
        global = true
    )]
    pub max_submits_waiting: u32,

    /// How often the sweeper expires leases, revokes unacknowledged grants
    /// and closes silent sessions, in milliseconds.
    #[arg(
        long,
        env = "SWITCHYARD_SWEEP_INTERVAL_MS",
        default_value_t = 1_000,
        global = true
    )]
    pub sweep_interval_ms: i64,

    /// How many queued tasks one dispatch round reads from the store at a
    /// time, at most (a round reads up to 64 such pages).
    #[arg(
        long,
        env = "SWITCHYARD_DISPATCH_PAGE",
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(1..=10_000),
        global = true
    )]
    pub dispatch_page: u32,

    /// How often the dispatcher looks at the queue unprompted, in
    /// milliseconds: a safety net for a missed notification. Submits,
    /// freed slots, connecting agents and tasks coming due (delayed
    /// submits, retries) prompt it at once.
    #[arg(
        long,
        env = "SWITCHYARD_DISPATCH_RECHECK_MS",
        default_value_t = 1_000,
        value_parser = clap::value_parser!(u64).range(1..),
        global = true
    )]
    pub dispatch_recheck_ms: u64,

    /// How long a batch of lease reports may wait for more before it
    /// commits, in milliseconds (0: never). Each batch is one transaction
    /// and one flush of the database's log; waiting a little makes one of
    /// many agents' reports, at up to that much delay to the acknowledgement
    /// of each. Only a batch started on a quiet store waits, and only until
    /// it holds 32 reports.
    #[arg(
        long,
        env = "SWITCHYARD_REPORT_LINGER_MS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(0..=1_000),
        global = true
    )]
    pub report_linger_ms: u64,

    /// Attempts a task gets when its submit does not say.
    #[arg(
        long,
        env = "SWITCHYARD_MAX_ATTEMPTS",
        default_value_t = 3,
        global = true
    )]
    pub max_attempts: u32,

    /// A JSON file of bearer tokens: `[{"name", "namespace", "role":
    /// "agent"|"submitter"|"operator", "token" or "sha256"}]`. With no tokens
    /// here or in the database the server is open (loopback only).
    #[arg(long, env = "SWITCHYARD_TOKENS_FILE", global = true)]
    pub tokens_file: Option<std::path::PathBuf>,

    /// Serve without tokens on a non-loopback address (never in production).
    #[arg(long, env = "SWITCHYARD_INSECURE", global = true)]
    pub insecure: bool,

    /// Who may use gRPC server reflection (what grpcurl lists and
    /// describes): public, authenticated (any valid token; everyone while
    /// the server is open) or off.
    #[arg(
        long,
        env = "SWITCHYARD_REFLECTION",
        value_enum,
        default_value_t = crate::reflection::Reflection::Authenticated,
        global = true
    )]
    pub reflection: crate::reflection::Reflection,

    /// TLS certificate chain (PEM) for the gRPC port; with --tls-key.
    #[arg(long, env = "SWITCHYARD_TLS_CERT", requires = "tls_key", global = true)]
    pub tls_cert: Option<std::path::PathBuf>,

    /// TLS private key (PEM) for the gRPC port.
    #[arg(long, env = "SWITCHYARD_TLS_KEY", requires = "tls_cert", global = true)]
    pub tls_key: Option<std::path::PathBuf>,

    /// CA bundle (PEM) that client certificates must chain to (mTLS).
    #[arg(
        long,
        env = "SWITCHYARD_TLS_CLIENT_CA",
        requires = "tls_cert",
        global = true
    )]
    pub tls_client_ca: Option<std::path::PathBuf>,

    /// Address for Prometheus metrics over HTTP (`/metrics`); off if unset.
    #[arg(long, env = "SWITCHYARD_METRICS_LISTEN", global = true)]
    pub metrics_listen: Option<SocketAddr>,

    /// Address for the web console over HTTP (its page, and the task and
    /// admin services over gRPC-Web, with the same tokens); off if unset.
    /// Plain HTTP: keep it on loopback (e.g. `127.0.0.1:8080`) or behind a
    /// proxy that terminates TLS.
    #[arg(long, env = "SWITCHYARD_CONSOLE_LISTEN", global = true)]
    pub console_listen: Option<SocketAddr>,

    /// Largest gRPC message accepted, in bytes.
    #[arg(long, env = "SWITCHYARD_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024, global = true)]
    pub max_message_bytes: usize,

    /// Unary requests taking longer than this many milliseconds are cut off
    /// with DEADLINE_EXCEEDED (streams are not limited).
    #[arg(
        long,
        env = "SWITCHYARD_REQUEST_TIMEOUT_MS",
        default_value_t = 30_000,
        global = true
    )]
    pub request_timeout_ms: u64,

    /// Requests served at once on one connection; more wait.
    #[arg(
        long,
        env = "SWITCHYARD_CONCURRENCY_PER_CONNECTION",
        default_value_t = 256,
        global = true
    )]
    pub concurrency_per_connection: usize,

    /// HTTP/2 receive window of one connection, in bytes. It also sizes the
    /// flood protection: a connection may hold unread small DATA frames
    /// worth half of it (each counted as 256 bytes) before it is closed with
    /// ENHANCE_YOUR_CALM, so a fleet multiplexed on one connection needs
    /// room for every agent's burst of heartbeats.
    #[arg(
        long,
        env = "SWITCHYARD_HTTP2_CONNECTION_WINDOW_BYTES",
        default_value_t = 8 * 1024 * 1024,
        value_parser = clap::value_parser!(u32).range(65_535..=i32::MAX as i64),
        global = true
    )]
    pub http2_connection_window_bytes: u32,

    /// Most queued tasks one namespace may hold (0: no limit).
    #[arg(
        long,
        env = "SWITCHYARD_MAX_QUEUED_TASKS_PER_NAMESPACE",
        default_value_t = 100_000,
        global = true
    )]
    pub max_queued_tasks_per_namespace: u64,

    /// Most tasks of one namespace LEASED or RUNNING at once, across every
    /// replica (0: no limit). The others wait QUEUED with the reason
    /// CONCURRENCY_LIMIT; while it is set, no submit is leased on the way
    /// in (each goes through a dispatch round, which the limit is checked
    /// in).
    #[arg(
        long,
        env = "SWITCHYARD_MAX_RUNNING_TASKS_PER_NAMESPACE",
        default_value_t = 0,
        global = true
    )]
    pub max_running_tasks_per_namespace: u64,

    /// Most agents one namespace may register (0: no limit).
    #[arg(
        long,
        env = "SWITCHYARD_MAX_AGENTS_PER_NAMESPACE",
        default_value_t = 20_000,
        global = true
    )]
    pub max_agents_per_namespace: u64,

    /// How many times a task may be handed back without running to the end
    /// (released by agents, or granted and never acknowledged) before it
    /// FAILS: no grant can cycle for ever.
    #[arg(
        long,
        env = "SWITCHYARD_MAX_RELEASES_PER_TASK",
        default_value_t = crate::model::DEFAULT_MAX_RELEASES,
        value_parser = clap::value_parser!(u32).range(1..=10_000),
        global = true
    )]
    pub max_releases_per_task: u32,

    /// How tasks that do not say rank the agents that qualify: `spread`
    /// (least loaded first) or `binpack` (fill one agent before the next);
    /// `NAMESPACE=POLICY` sets one namespace's default (repeat, or separate
    /// with commas). Applied when a task is submitted.
    #[arg(
        long,
        env = "SWITCHYARD_PLACEMENT_POLICY",
        value_name = "[NAMESPACE=]POLICY",
        value_parser = parse_policy_default,
        value_delimiter = ',',
        global = true
    )]
    pub placement_policy: Vec<PolicyDefault>,

    /// How many bytes of each task's output (stdout, stderr and its
    /// handlers' log, every attempt together) are kept; past it the oldest
    /// go first, and readers are told where and how much. 0 keeps no output
    /// (what runners send is acknowledged and dropped); otherwise at least
    /// 65536, one chunk.
    #[arg(
        long,
        env = "SWITCHYARD_OUTPUT_BYTES_PER_TASK",
        default_value_t = OutputBounds::DEFAULT_PER_TASK,
        value_parser = parse_output_per_task,
        global = true
    )]
    pub output_bytes_per_task: u64,

    /// How many bytes of output are kept per namespace; past it the sweeper
    /// drops the output of the namespace's oldest tasks (each keeps a mark
    /// of how much went) until it is a tenth under. 0: no bound but each
    /// task's; otherwise at least `--output-bytes-per-task`.
    #[arg(
        long,
        env = "SWITCHYARD_OUTPUT_BYTES_PER_NAMESPACE",
        default_value_t = OutputBounds::DEFAULT_PER_NAMESPACE,
        global = true
    )]
    pub output_bytes_per_namespace: u64,

    /// On SIGTERM, how long in-flight requests and streams get to finish
    /// after agents were told to reconnect elsewhere, in milliseconds.
    #[arg(
        long,
        env = "SWITCHYARD_SHUTDOWN_GRACE_MS",
        default_value_t = 10_000,
        global = true
    )]
    pub shutdown_grace_ms: u64,
}

impl ServerConfig {
    /// Whether the gRPC address is a loopback one (open mode is allowed).
    pub fn is_loopback(&self) -> bool {
        self.listen.ip().is_loopback()
    }

    /// Settings for tests: an ephemeral loopback port and the given store.
    pub fn for_tests(database_url: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            database_url: database_url.into(),
            log_format: LogFormat::Text,
            heartbeat_interval_ms: 5_000,
            lease_ttl_ms: 30_000,
            ack_window_ms: 5_000,
            ack_late_ms: 1_000,
            max_submits_waiting: 2_048,
            sweep_interval_ms: 1_000,
            dispatch_page: 256,
            dispatch_recheck_ms: 1_000,
            report_linger_ms: 10,
            max_attempts: 3,
            tokens_file: None,
            insecure: false,
            reflection: crate::reflection::Reflection::Authenticated,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            metrics_listen: None,
            console_listen: None,
            max_message_bytes: 4 * 1024 * 1024,
            request_timeout_ms: 30_000,
            concurrency_per_connection: 256,
            http2_connection_window_bytes: 8 * 1024 * 1024,
            max_queued_tasks_per_namespace: 100_000,
            max_running_tasks_per_namespace: 0,
            max_agents_per_namespace: 20_000,
            max_releases_per_task: crate::model::DEFAULT_MAX_RELEASES,
            placement_policy: Vec::new(),
            output_bytes_per_task: OutputBounds::DEFAULT_PER_TASK,
            output_bytes_per_namespace: OutputBounds::DEFAULT_PER_NAMESPACE,
            shutdown_grace_ms: 2_000,
        }
    }
}

/// One `--placement-policy` value: a namespace's default policy, or (no
/// namespace) every other namespace's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyDefault {
    /// The namespace; `None` for the default of all.
    pub namespace: Option<String>,
    /// The policy.
    pub policy: PlacementPolicy,
}

fn parse_output_per_task(text: &str) -> Result<u64, String> {
    let bytes: u64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of bytes"))?;
    if bytes != 0 && bytes < OutputBounds::MIN_PER_TASK {
        return Err(format!(
            "{bytes}: 0 (keep no output) or at least {}",
            OutputBounds::MIN_PER_TASK
        ));
    }
    Ok(bytes)
}

impl ServerConfig {
    /// The output bounds the flags give; refused if a namespace's bound is
    /// below a task's.
    pub fn output_bounds(&self) -> Result<OutputBounds, String> {
        let bounds = OutputBounds {
            per_task: self.output_bytes_per_task,
            per_namespace: self.output_bytes_per_namespace,
        };
        if bounds.per_namespace != 0 && bounds.per_namespace < bounds.per_task {
            return Err(format!(
                "--output-bytes-per-namespace ({}) must be 0 or at least --output-bytes-per-task ({})",
                bounds.per_namespace, bounds.per_task
            ));
        }
        Ok(bounds)
    }
}

fn parse_policy_default(text: &str) -> Result<PolicyDefault, String> {
    let (namespace, policy) = match text.split_once('=') {
        Some((ns, policy)) if !ns.trim().is_empty() => (Some(ns.trim().to_owned()), policy),
        Some(_) => return Err(format!("{text:?}: the namespace before '=' is empty")),
        None => (None, text),
    };
    let policy = policy.parse().map_err(|e: UnknownPolicy| e.to_string())?;
    Ok(PolicyDefault { namespace, policy })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The congestion flags refuse what would hold back every agent at once
    /// or push back every submit, naming the flag.
    #[test]
    fn congestion_flags_refuse_values_that_stop_all_work() {
        for (flag, value) in [
            ("--ack-late-ms", "0"),
            ("--ack-late-ms", "-5"),
            ("--max-submits-waiting", "0"),
            ("--max-submits-waiting", "5000"),
        ] {
            let arg = format!("{flag}={value}");
            let err = Cli::try_parse_from(["switchyard-server", arg.as_str()]).unwrap_err();
            assert!(err.to_string().contains(flag), "{arg}: {err}");
        }
        let ok = Cli::try_parse_from([
            "switchyard-server",
            "--ack-late-ms",
            "250",
            "--max-submits-waiting",
            "64",
        ])
        .unwrap();
        assert_eq!(ok.config.ack_late_ms, 250);
        assert_eq!(ok.config.max_submits_waiting, 64);
    }
}
