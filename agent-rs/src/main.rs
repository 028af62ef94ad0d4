//! `switchyard-agent`: runs the agent against a server, or prints the
//! capability document it would report (`capabilities [--explain]`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use switchyard_agent::capabilities::Capabilities;
use switchyard_agent::{AgentConfig, Handlers};

/// Switchyard agent: reports what this machine can do and runs what it is leased.
#[derive(Debug, Parser)]
#[command(name = "switchyard-agent", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The agent directory holding the capability tiers.
    #[arg(long, env = "SWITCHYARD_AGENT_DIR", default_value = ".", global = true)]
    dir: PathBuf,
    /// How long a dynamic capability script may run, in seconds.
    #[arg(
        long,
        env = "SWITCHYARD_SCRIPT_TIMEOUT_SECS",
        default_value_t = 10,
        global = true
    )]
    script_timeout_secs: u64,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The server (any replica).
    #[arg(
        long,
        env = "SWITCHYARD_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    server: String,
    /// Bearer token (agent role); never printed.
    #[arg(long, env = "SWITCHYARD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA bundle (PEM) for an https:// server.
    #[arg(long, env = "SWITCHYARD_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for servers that require mTLS.
    #[arg(long, env = "SWITCHYARD_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// Client key (PEM) for servers that require mTLS.
    #[arg(long, env = "SWITCHYARD_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// The agent's name, unique in its namespace (default: the hostname).
    #[arg(long, env = "SWITCHYARD_AGENT_NAME")]
    name: Option<String>,
    /// The namespace to serve.
    #[arg(long, env = "SWITCHYARD_NAMESPACE", default_value = "default")]
    namespace: String,
    /// Maximum concurrent leases (default: `max_concurrent_tasks` from the document, else 1).
    #[arg(long, env = "SWITCHYARD_CAPACITY")]
    capacity: Option<u32>,
    /// Refresh memory/load and check the tier files every this many seconds.
    #[arg(long, env = "SWITCHYARD_REFRESH_SECS", default_value_t = 30)]
    refresh_secs: u64,
    /// Detect tool versions and the rest of the base tier again every this many seconds.
    #[arg(long, env = "SWITCHYARD_REDETECT_SECS", default_value_t = 3600)]
    redetect_secs: u64,
    /// Seconds running leases get to finish after SIGTERM before they are released.
    #[arg(long, env = "SWITCHYARD_GRACE_SECS", default_value_t = 30)]
    grace_secs: u64,
    /// Run `exec` tasks (arbitrary commands). Off unless given.
    #[arg(long, env = "SWITCHYARD_ALLOW_EXEC")]
    allow_exec: bool,
    /// A label `key=value` sent at registration; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Connect to the server and run leased tasks (the default).
    Run,
    /// Print the capability document this agent would report.
    Capabilities {
        /// Show every value with the tier it came from, and every rejection.
        #[arg(long)]
        explain: bool,
    },
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("label {text:?} is not key=value"))
}

fn handlers(allow_exec: bool) -> Handlers {
    let handlers = Handlers::new();
    if allow_exec {
        handlers.handler("exec", switchyard_agent::exec::Exec::default())
    } else {
        handlers
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let handlers = handlers(cli.run.allow_exec);
    let script_timeout = Duration::from_secs(cli.script_timeout_secs);
    match cli.command.unwrap_or(Command::Run) {
        Command::Capabilities { explain } => {
            let caps = Capabilities::load(&cli.dir, &handlers, script_timeout).await;
            if explain {
                let merged = caps.merged();
                for (path, tier) in merged.provenance_entries() {
                    let value = switchyard_core::document::lookup(&merged.document, path)
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    println!("{path:<40} {value:<32} [{}]", tier.as_str());
                }
                for r in &merged.rejections {
                    let tier = r.tier.map_or("-", |t| t.as_str());
                    println!(
                        "rejected [{tier}] {}: {}",
                        if r.path.is_empty() {
                            "(whole tier)"
                        } else {
                            &r.path
                        },
                        r.reason
                    );
                }
                for r in handlers.rejections() {
                    println!("rejected [pack {}] {}: {}", r.pack, r.id, r.reason);
                }
            } else {
                println!("{}", serde_json::to_string_pretty(caps.document())?);
            }
            Ok(())
        }
        Command::Run => {
            let caps = Capabilities::load(&cli.dir, &handlers, script_timeout).await;
            let doc = caps.document();
            let name = cli
                .run
                .name
                .clone()
                .or_else(|| {
                    doc.get("hostname")
                        .and_then(|h| h.as_str())
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| "agent".to_owned());
            let capacity = cli
                .run
                .capacity
                .or_else(|| {
                    doc.get("max_concurrent_tasks")
                        .and_then(serde_json::Value::as_u64)
                        .and_then(|n| u32::try_from(n).ok())
                })
                .unwrap_or(1)
                .max(1);
            drop(caps);
            let config = AgentConfig {
                server: cli.run.server,
                token: cli.run.token,
                tls: switchyard_proto::client::ClientTls {
                    ca_file: cli.run.ca_file,
                    cert_file: cli.run.tls_cert,
                    key_file: cli.run.tls_key,
                },
                name,
                namespace: cli.run.namespace,
                dir: cli.dir,
                capacity,
                refresh: Duration::from_secs(cli.run.refresh_secs.max(1)),
                script_timeout,
                redetect: Duration::from_secs(cli.run.redetect_secs.max(1)),
                grace: Duration::from_secs(cli.run.grace_secs),
                labels: cli.run.labels.into_iter().collect::<BTreeMap<_, _>>(),
            };
            switchyard_agent::run(config, handlers, shutdown_signal()).await
        }
    }
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
