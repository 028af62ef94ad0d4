//! What the load generator's tests share: one run of `switchyard-bench`
//! against a real server (SQLite, in this process), its JSON report.

use std::process::Command;

use serde_json::Value;
use switchyard_server::config::ServerConfig;
use tokio::net::TcpListener;

/// Runs the bench with `args` (its flags, split at spaces; `--server` and
/// `--json` added) against a server started for it, stops the server, and
/// answers the report; fails the test if either fails.
pub async fn run_bench(args: &str) -> Value {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind an ephemeral port");
    let addr = listener.local_addr().expect("the bound address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(switchyard_server::run(
        listener,
        ServerConfig::for_tests(url),
        async {
            let _ = stopped.await;
        },
    ));
    let args: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_switchyard-bench"))
            .args(["--server", &format!("http://{addr}"), "--json"])
            .args(&args)
            .output()
            .expect("run switchyard-bench")
    })
    .await
    .expect("the bench's thread");
    assert!(
        output.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = stop.send(());
    server
        .await
        .expect("the server task")
        .expect("the server stopped cleanly");
    serde_json::from_slice(&output.stdout).expect("the bench's JSON report")
}
