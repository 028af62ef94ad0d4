//! The load generator's report of its placement mix against a real server
//! (SQLite, in this process): every completion is counted in its class, and
//! the class that drained last ends the run.

use std::process::Command;

use serde_json::Value;
use switchyard_server::config::ServerConfig;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_class_counts_its_completions_and_the_last_ends_the_run() {
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

    // 50 agents: the fewest for which every class of the mix has one.
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_switchyard-bench"))
            .args(["--server", &format!("http://{addr}")])
            .args(["--agents", "50", "--capacity", "1", "--tasks", "300"])
            .args(["--placements", "mixed", "--preload", "--json"])
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
    assert_eq!(report["completions"], 300, "{report}");
    let classes = report["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 7, "{report}");
    let counted: u64 = classes
        .iter()
        .map(|c| c["completions"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, 300, "{report}");
    let run = report["run_seconds"].as_f64().unwrap();
    let mut last: f64 = 0.0;
    for class in classes {
        assert!(class["completions"].as_u64().unwrap() > 0, "{class}");
        let drained = class["drained_secs"].as_f64().unwrap();
        assert!(drained > 0.0 && drained <= run, "{class} in {run} s");
        last = last.max(drained);
        let eligible = class["eligible"].as_f64().unwrap();
        assert!(eligible > 0.0 && eligible <= 1.0, "{class}");
    }
    assert_eq!(last, run, "{report}");
    let shares: f64 = classes
        .iter()
        .map(|c| c["task_share"].as_f64().unwrap())
        .sum();
    assert!((shares - 1.0).abs() < 1e-9, "{shares}");

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
