//! The load generator's report of its placement mix against a real server
//! (SQLite, in this process): every completion is counted in its class, and
//! the class that drained last ends the run.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_class_counts_its_completions_and_the_last_ends_the_run() {
    // 50 agents: the fewest for which every class of the mix has one.
    let report = common::run_bench(
        "--agents 50 --capacity 1 --tasks 300 --placements mixed --preload --threads 1",
    )
    .await;
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
}
