//! The load generator's `--release-secs` mode against a real server (SQLite,
//! in this process), on one thread (`--threads 1`, as `bench/run` runs it):
//! every task is submitted to the connected fleet not to run before the
//! release, none is granted earlier, and each is granted and completed
//! once after it.

use std::process::Command;

use serde_json::Value;
use switchyard_server::config::ServerConfig;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_tasks_wait_for_the_release_and_all_complete() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(switchyard_server::run(
        listener,
        ServerConfig::for_tests(url),
        async {
            let _ = stopped.await;
        },
    ));

    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_switchyard-bench"))
            .args(["--server", &format!("http://{addr}")])
            .args(["--agents", "4", "--capacity", "2", "--tasks", "40"])
            .args(["--placements", "any", "--release-secs", "1.5", "--json"])
            .args(["--threads", "1"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["release_secs"], 1.5);
    // On the one thread asked for, as bench/run runs it.
    assert_eq!(report["threads"], 1, "{report}");
    assert_eq!(report["grants_before_release"], 0, "{report}");
    assert_eq!(report["submitted"], 40, "{report}");
    assert_eq!(report["grants"], 40, "{report}");
    assert_eq!(report["completions"], 40, "{report}");
    assert_eq!(report["latency_ms"]["count"], 40, "{report}");
    assert!(report["release_pickup_ms"].as_f64().unwrap() >= 0.0);
    assert!(report["grants_per_sec"].as_f64().unwrap() > 0.0);

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
