//! `switchyard-server`: parses flags, binds, and hands over to
//! [`switchyard_server::run`]; `switchyard-server migrate` runs the database
//! migrations alone.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use switchyard_server::config::{Cli, Command};
use switchyard_server::{store, telemetry};
use tokio::net::TcpListener;

/// mimalloc: the server allocates and frees many small buffers per task
/// (rows, JSON, protobuf); under load glibc's allocator took a quarter of
/// its CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Errors are printed as one chain of causes, never with a backtrace
/// (whatever `RUST_BACKTRACE` says): they are for the person who started it.
fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("switchyard-server: cannot start the runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // Each cause once: an error's text often already holds its source's.
            let mut text = err.to_string();
            for cause in err.chain().skip(1) {
                let cause = cause.to_string();
                if !text.contains(&cause) {
                    text = format!("{text}: {cause}");
                }
            }
            eprintln!("switchyard-server: {text}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.config.log_format);
    match cli.command.unwrap_or(Command::Serve) {
        Command::Migrate => {
            let store = store::open(&cli.config.database_url).await?;
            store.migrate().await?;
            store.close().await;
            tracing::info!(backend = store.backend(), "migrations applied");
            Ok(())
        }
        Command::Token(command) => {
            let store = store::open(&cli.config.database_url).await?;
            store.migrate().await?;
            let result = switchyard_server::tokens::run(store.as_ref(), command).await;
            store.close().await;
            result
        }
        Command::Serve => {
            // Everything is checked and opened before the port is taken, so
            // nothing says "listening" about a server that cannot run.
            let prepared = switchyard_server::server::prepare(
                cli.config.clone(),
                switchyard_server::clock::Clock::system(),
            )
            .await?;
            let listener = TcpListener::bind(cli.config.listen)
                .await
                .with_context(|| format!("binding {}", cli.config.listen))?;
            let addr = listener.local_addr().context("reading the bound address")?;
            // Tests and scripts read this line to learn an ephemeral port.
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "switchyard-server listening on {addr}")?;
            if let Some(console) = prepared.console_addr() {
                writeln!(stdout, "switchyard-server console on http://{console}/")?;
            }
            stdout.flush()?;
            drop(stdout);
            tracing::info!(%addr, database = %store::redact_url(&cli.config.database_url), "serving");
            prepared.serve(listener, shutdown_signal()).await?;
            Ok(())
        }
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(cause = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received");
}
