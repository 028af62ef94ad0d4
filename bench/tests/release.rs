//! The load generator's `--release-secs` mode against a real server (SQLite,
//! in this process), on one thread (`--threads 1`, as `bench/run` runs it):
//! every task is submitted to the connected fleet not to run before the
//! release, none is granted earlier, and each is granted and completed
//! once after it.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_tasks_wait_for_the_release_and_all_complete() {
    let report = common::run_bench(
        "--agents 4 --capacity 2 --tasks 40 --placements any --release-secs 1.5 --threads 1",
    )
    .await;
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
}
