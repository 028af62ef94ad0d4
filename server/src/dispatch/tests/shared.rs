//! What the dispatcher shares rather than keeps per task or per caller: the
//! queue summary its followers get, and one compiled placement per kind and
//! placement.

use super::*;

on_both_stores!(
    followers_of_the_queue_share_one_summary_while_nothing_moves,
    the_tasks_of_a_placement_share_one_compiled_placement,
);

/// The queue's one group: its tasks and whether matching found an agent.
fn only_group(summary: &crate::model::QueueSummary) -> (u64, Option<QueuedReason>) {
    assert!(summary.explained, "{summary:?}");
    assert_eq!(summary.groups.len(), 1, "{summary:?}");
    (summary.groups[0].row.tasks, summary.groups[0].reason)
}

/// WatchQueue's followers get one explained summary while no pulse moves
/// and it is younger than SUMMARY_REUSE_MS (a task stored behind the
/// dispatcher's back, unheard of, is not read); it is made again once an
/// agent attaches or that time has passed, and a caller asking for the
/// summary itself (GetQueueSummary) always reads afresh.
async fn followers_of_the_queue_share_one_summary_while_nothing_moves(fx: &Fixture) {
    use crate::dispatch::explain::SUMMARY_REUSE_MS;
    let followed = || fx.dispatcher.followed_summary("default");
    fx.queue("gpu", 0, None).await;
    let first = followed().await.expect("summary");
    assert_eq!(only_group(&first), (1, Some(QueuedReason::Parked)));

    fx.queue("gpu", 0, None).await;
    fx.clock.advance(SUMMARY_REUSE_MS - 1);
    assert_eq!(followed().await.expect("summary"), first);
    let asked = fx
        .dispatcher
        .queue_summary("default", true)
        .await
        .expect("summary");
    assert_eq!(only_group(&asked), (2, Some(QueuedReason::Parked)));

    fx.queue("gpu", 0, None).await;
    let _agent = fx.connect("gpu-1", &["gpu"], 1).await;
    let after_attach = followed().await.expect("summary");
    assert_eq!(only_group(&after_attach), (3, None));

    fx.queue("gpu", 0, None).await;
    assert_eq!(followed().await.expect("summary"), after_attach);
    fx.clock.advance(SUMMARY_REUSE_MS);
    assert_eq!(only_group(&followed().await.expect("summary")), (4, None));
}

/// Tasks a walk reads and leaves waiting (busy, parked, or granted by
/// another replica) keep nothing of their own here: the dispatcher keeps
/// one compiled placement per kind and placement. It kept one per task
/// read until a round here granted it, so a drain of a million parked
/// tasks grew the server by 550 MiB, and a task granted elsewhere was
/// never forgotten.
async fn the_tasks_of_a_placement_share_one_compiled_placement(fx: &Fixture) {
    let mut agent = fx.connect("a", &["linux"], 1).await;
    fx.queue("gpu", 0, None).await;
    for _ in 0..20 {
        fx.queue("linux", 0, None).await;
    }
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants().len(), 1);
    // Read and left waiting: the agent is busy, or none can run it.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let state = fx.dispatcher.state();
    assert_eq!(state.placements.len(), 2);
    let linux = state
        .placements
        .values()
        .find(|p| p.placement().required_tags == ["linux"]);
    let linux = linux.expect("linux compiled");
    let of_tasks = state.task_placements.values();
    assert!(
        of_tasks.filter(|p| !Arc::ptr_eq(p, linux)).count() <= 1,
        "only gpu's differs"
    );
}
