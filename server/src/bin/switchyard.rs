//! `switchyard`: the operator and submitter CLI (see [`switchyard_server::ctl`]).

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = switchyard_server::ctl::Cli::parse();
    let code = switchyard_server::ctl::run(cli).await;
    std::process::ExitCode::from(code as u8)
}
