//! The `switchyard` command line: every command, flag and the variable each
//! reads, as clap parses them. What the commands do is in the module above.

use clap::{Args, Parser, Subcommand, ValueEnum};
use switchyard_proto::v1 as pb;

/// Switchyard CLI: submit and follow tasks, see and steer agents.
#[derive(Debug, Parser)]
#[command(name = "switchyard", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub(super) global: Global,
    #[command(subcommand)]
    pub(super) command: Command,
}

/// Connection and output settings shared by every command.
#[derive(Debug, Args)]
pub(super) struct Global {
    /// The server to talk to (any replica).
    #[arg(
        long,
        env = "SWITCHYARD_SERVER",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub(super) server: String,
    /// Bearer token (submitter or operator); never printed.
    #[arg(long, env = "SWITCHYARD_TOKEN", hide_env_values = true, global = true)]
    pub(super) token: Option<String>,
    /// CA bundle (PEM) for an https:// server.
    #[arg(long, env = "SWITCHYARD_CA_FILE", global = true)]
    pub(super) ca_file: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for servers that require mTLS.
    #[arg(long, env = "SWITCHYARD_TLS_CERT", global = true)]
    pub(super) tls_cert: Option<std::path::PathBuf>,
    /// Client key (PEM) for servers that require mTLS.
    #[arg(long, env = "SWITCHYARD_TLS_KEY", global = true)]
    pub(super) tls_key: Option<std::path::PathBuf>,
    /// The namespace to work in.
    #[arg(
        long,
        env = "SWITCHYARD_NAMESPACE",
        default_value = "default",
        global = true
    )]
    pub(super) namespace: String,
    /// Output for people (text) or for scripts (json: each reply as proto3
    /// JSON, as grpcurl prints it, one per line).
    #[arg(
        long,
        env = "SWITCHYARD_OUTPUT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub(super) output: Output,
    /// Seconds to wait for the server to answer a call (to connect, and for
    /// each answer to begin; a stream that has begun is not cut).
    #[arg(
        long,
        env = "SWITCHYARD_TIMEOUT_SECS",
        default_value_t = 15,
        value_parser = clap::value_parser!(u64).range(1..=3_600),
        global = true
    )]
    pub(super) timeout_secs: u64,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Output {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Submit a task.
    Submit(SubmitArgs),
    /// Submit many tasks from JSON lines, each a task as `SubmitTask` takes it in proto3 JSON
    /// (what grpcurl's `-d` takes: `{"kind": "build", "placement": {"selector": "linux"}}`), in
    /// calls of up to 1,000 (`SubmitTasks`, one transaction each); prints each task's id, in
    /// order. A refused call names the task's line, and stores none of its tasks; the calls
    /// before it stay submitted (give the tasks idempotency keys to resubmit the file safely).
    SubmitMany {
        /// The file, or `-` for standard input; blank lines are skipped.
        file: String,
        /// Tasks a call, from 1 to 1000.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u16).range(1..=1000))]
        batch: u16,
    },
    /// Show one task.
    Get {
        /// The task's id.
        task_id: String,
    },
    /// List tasks, newest first.
    List {
        /// Only these states (queued, leased, running, succeeded, failed, canceled); repeatable.
        #[arg(long = "state")]
        states: Vec<String>,
        /// Only this kind.
        #[arg(long)]
        kind: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i32,
    },
    /// Cancel a task.
    Cancel {
        /// The task's id.
        task_id: String,
        /// Why (recorded in the task's history).
        #[arg(long, default_value = "canceled from the CLI")]
        reason: String,
        /// End the lease this many seconds after the cancel even if the agent
        /// keeps running it (default: the task's cancel grace, if any).
        #[arg(long)]
        grace_secs: Option<u64>,
    },
    /// Follow a task's state changes until it is terminal.
    Watch {
        /// The task's id.
        task_id: String,
    },
    /// Print a task's output (stdout, stderr and its handlers' log, every
    /// attempt); stdout goes to stdout, the rest to stderr.
    Logs {
        /// The task's id.
        task_id: String,
        /// Follow the output live until the task ends (the exit code then
        /// says how it ended, as `watch`).
        #[arg(short, long)]
        follow: bool,
        /// Only the attempt whose lease has this fencing token (1 for the
        /// first grant, then one more per grant).
        #[arg(long, conflicts_with = "follow")]
        lease: Option<u64>,
    },
    /// Explain why a task is where it is, agent by agent.
    Explain {
        /// The task's id.
        task_id: String,
    },
    /// See and steer agents.
    #[command(subcommand)]
    Agents(AgentsCommand),
    /// Print a shell completion script: `source <(switchyard completion bash)`,
    /// or write it where your shell loads completions from.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `switchyard man | man -l -`.
    Man,
    /// Which agents would take a placement now?
    Simulate {
        /// The placement as selector text, e.g. `linux, docker, memory.total>=16384`.
        #[arg(long = "require", default_value = "")]
        selector: String,
        /// The task kind: agents that do not handle it are not eligible
        /// (unset: any kind).
        #[arg(long, default_value = "")]
        kind: String,
        /// Rank by `spread` or `binpack` (unset: the namespace's default).
        #[arg(long, value_parser = parse_policy)]
        policy: Option<pb::PlacementPolicy>,
    },
}

#[derive(Debug, Args)]
pub(super) struct SubmitArgs {
    /// The task kind agents dispatch on (e.g. `exec`).
    pub(super) kind: String,
    /// What the task needs, as selector text, e.g. `linux, docker, software.node.version@^20`
    /// (`tolerates gpu` lets it run on agents tainted `gpu`).
    #[arg(long = "require", default_value = "")]
    pub(super) selector: String,
    /// How the agents that qualify rank: `spread` (least loaded first) or
    /// `binpack` (fill one agent before the next); unset: the namespace's
    /// default.
    #[arg(long, value_parser = parse_policy)]
    pub(super) policy: Option<pb::PlacementPolicy>,
    /// The payload: a JSON object in a file, or `-` for standard input.
    #[arg(long)]
    pub(super) payload: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0)]
    pub(super) priority: i32,
    /// Attempts before the task fails (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub(super) max_attempts: u32,
    /// Lease lifetime in seconds without renewal (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub(super) lease_ttl_secs: u64,
    /// The wait before the first retry of a failed attempt, in ms (default 1000).
    #[arg(long)]
    pub(super) retry_initial_backoff_ms: Option<u64>,
    /// The longest wait before a retry, in ms (default 300000).
    #[arg(long)]
    pub(super) retry_max_backoff_ms: Option<u64>,
    /// The growth of the wait per failed attempt, 1 to 10 (default 2).
    #[arg(long)]
    pub(super) retry_multiplier: Option<f64>,
    /// The largest fraction of each wait taken off at random, 0 to 1 (default 0.2).
    #[arg(long)]
    pub(super) retry_jitter: Option<f64>,
    /// Fail the task if it is not leased within this many seconds of coming
    /// due (unschedulable, or agents busy); default: it waits for ever.
    #[arg(long)]
    pub(super) start_timeout_secs: Option<u64>,
    /// Revoke an attempt still running this many seconds after its grant
    /// (counted as a failed attempt, code `timeout`).
    #[arg(long)]
    pub(super) execution_timeout_secs: Option<u64>,
    /// After a cancel, end the lease this many seconds later even if the
    /// agent keeps running it.
    #[arg(long)]
    pub(super) cancel_grace_secs: Option<u64>,
    /// Share the queue fairly by this key (a tenant, user, repository):
    /// within a priority, keys take turns.
    #[arg(long)]
    pub(super) fairness_key: Option<String>,
    /// The key's share, 1 to 100 (default 1).
    #[arg(long)]
    pub(super) fairness_weight: Option<u32>,
    /// At most the key's limit of tasks with this key run at once.
    #[arg(long)]
    pub(super) concurrency_key: Option<String>,
    /// Set the concurrency key's limit, 1 to 10000 (default: the key's own).
    #[arg(long)]
    pub(super) concurrency_limit: Option<u32>,
    /// Makes the submit idempotent within the namespace.
    #[arg(long)]
    pub(super) idempotency_key: Option<String>,
    /// A label `key=value`; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    pub(super) labels: Vec<(String, String)>,
    /// Wait for the task to finish, printing its progress and its output as
    /// it comes, then its result or error; exit 0 only if it succeeded.
    #[arg(long)]
    pub(super) wait: bool,
}

#[derive(Debug, Subcommand)]
pub(super) enum AgentsCommand {
    /// List agents.
    List,
    /// Show one agent: its document with the tier of every value, and its leases.
    Show {
        /// The agent's id.
        agent_id: String,
    },
    /// Stop new leases to an agent.
    Drain {
        /// The agent's id.
        agent_id: String,
        /// Why.
        #[arg(long, default_value = "drained from the CLI")]
        reason: String,
        /// Revoke and requeue the leases it still holds this many seconds
        /// from now (default: wait for them however long they run).
        #[arg(long)]
        deadline_secs: Option<u64>,
    },
    /// Let a drained agent take leases again.
    Undrain {
        /// The agent's id.
        agent_id: String,
    },
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("label {text:?} is not key=value"))
}

fn parse_policy(text: &str) -> Result<pb::PlacementPolicy, String> {
    use switchyard_core::placement::{PlacementPolicy, UnknownPolicy};
    Ok(
        match text.parse().map_err(|e: UnknownPolicy| e.to_string())? {
            PlacementPolicy::Spread => pb::PlacementPolicy::Spread,
            PlacementPolicy::Binpack => pb::PlacementPolicy::Binpack,
        },
    )
}
