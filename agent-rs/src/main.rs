//! `switchyard-agent`: runs the agent against a server, prints the
//! capability document it would report (`capabilities [--explain]`), or
//! installs itself as a systemd service (`install`). The agent directory is
//! made absolute first; one that does not exist is an error (exit 2).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use switchyard_agent::capabilities::Capabilities;
use switchyard_agent::{AgentConfig, Handlers, OutputLimits};

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
    /// Log lines as text for people or JSON for log pipelines.
    #[arg(
        long,
        env = "SWITCHYARD_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    #[command(flatten)]
    run: RunArgs,
}

/// How log lines are written (to standard error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
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
    /// The agent's name, unique in its namespace (default:
    /// `{hostname}-rust-{6 hex digits of the directory's SHA-256}`, so
    /// runners sharing a host do not share a name).
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
    /// Most bytes of output (stdout, stderr, log) one task sends; past it
    /// only its last 64 KiB are sent, when it ends, saying how much was
    /// dropped.
    #[arg(long, env = "SWITCHYARD_OUTPUT_MAX_BYTES", default_value_t = OutputLimits::default().max_bytes)]
    output_max_bytes: u64,
    /// Bytes of output per second one task sends, on average (bursts of
    /// up to a second's worth); faster output waits in a 64 KiB tail, the
    /// oldest dropped.
    #[arg(long, env = "SWITCHYARD_OUTPUT_BYTES_PER_SEC", default_value_t = OutputLimits::default().bytes_per_sec)]
    output_bytes_per_sec: u64,
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
    /// Install this agent as a systemd service: a unit running `run` in
    /// `--dir`, and an environment file (mode 0600) with `--server`,
    /// `--token` and the other settings given.
    Install(InstallArgs),
}

#[derive(Debug, clap::Args)]
struct InstallArgs {
    /// The service's name.
    #[arg(long, default_value = "switchyard-agent")]
    service: String,
    /// Where the unit is written.
    #[arg(
        long,
        env = "SWITCHYARD_UNIT_DIR",
        default_value = "/etc/systemd/system"
    )]
    unit_dir: PathBuf,
    /// The environment file (default: /etc/switchyard-agent/SERVICE.env).
    #[arg(long, env = "SWITCHYARD_ENV_FILE")]
    env_file: Option<PathBuf>,
    /// The user the service runs as (default: root).
    #[arg(long)]
    user: Option<String>,
    /// Replace an existing unit.
    #[arg(long)]
    force: bool,
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

fn init_logs(format: LogFormat) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    init_logs(cli.log_format);
    cli.dir = match switchyard_agent::identity::agent_dir(&cli.dir) {
        Ok(dir) => dir,
        Err(err) => {
            eprintln!("switchyard-agent: {err}");
            std::process::exit(2);
        }
    };
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
        Command::Install(args) => install(&cli.dir, &cli.run, args, cli.log_format),
        Command::Run => {
            let caps = Capabilities::load(&cli.dir, &handlers, script_timeout).await;
            let doc = caps.document();
            let name = cli.run.name.clone().unwrap_or_else(|| {
                let host = doc
                    .get("hostname")
                    .and_then(|h| h.as_str())
                    .unwrap_or("agent");
                switchyard_agent::identity::default_name(host, "rust", &cli.dir)
            });
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
                output: OutputLimits {
                    max_bytes: cli.run.output_max_bytes,
                    bytes_per_sec: cli.run.output_bytes_per_sec.max(1),
                    burst_bytes: cli.run.output_bytes_per_sec.max(1),
                    ..OutputLimits::default()
                },
            };
            switchyard_agent::run(config, handlers, shutdown_signal()).await
        }
    }
}

/// `switchyard-agent install`: the unit and its environment file.
fn install(
    dir: &std::path::Path,
    run: &RunArgs,
    args: InstallArgs,
    log_format: LogFormat,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?.canonicalize()?;
    let mut env: Vec<(&'static str, String)> = vec![
        ("SWITCHYARD_SERVER", run.server.clone()),
        ("SWITCHYARD_AGENT_DIR", dir.display().to_string()),
        ("SWITCHYARD_NAMESPACE", run.namespace.clone()),
        ("SWITCHYARD_GRACE_SECS", run.grace_secs.to_string()),
    ];
    let optional = [
        ("SWITCHYARD_TOKEN", run.token.clone()),
        ("SWITCHYARD_AGENT_NAME", run.name.clone()),
        ("SWITCHYARD_CAPACITY", run.capacity.map(|c| c.to_string())),
        ("SWITCHYARD_CA_FILE", absolute(run.ca_file.as_deref())),
        ("SWITCHYARD_TLS_CERT", absolute(run.tls_cert.as_deref())),
        ("SWITCHYARD_TLS_KEY", absolute(run.tls_key.as_deref())),
        (
            "SWITCHYARD_ALLOW_EXEC",
            run.allow_exec.then(|| "true".to_owned()),
        ),
        (
            "SWITCHYARD_LOG_FORMAT",
            (log_format == LogFormat::Json).then(|| "json".to_owned()),
        ),
    ];
    env.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    let env_file = args.env_file.unwrap_or_else(|| {
        PathBuf::from("/etc/switchyard-agent").join(format!("{}.env", args.service))
    });
    let spec = switchyard_agent::install::Install {
        service: args.service.clone(),
        unit_dir: args.unit_dir,
        env_file,
        exe,
        dir: dir.to_path_buf(),
        user: args.user,
        grace_secs: run.grace_secs,
        force: args.force,
        env,
    };
    let done = spec.write().map_err(anyhow::Error::msg)?;
    println!("wrote {}", done.unit.display());
    println!("wrote {} (mode 0600)", done.env_file.display());
    println!(
        "start it: systemctl daemon-reload && systemctl enable --now {}.service",
        args.service
    );
    Ok(())
}

fn absolute(path: Option<&std::path::Path>) -> Option<String> {
    path.map(|p| {
        std::path::absolute(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string()
    })
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
