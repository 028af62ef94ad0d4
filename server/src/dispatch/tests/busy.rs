//! Busy placements left out of the walk, and what a walk leaves waiting
//! (which decides whether a submit is leased on the way in).

use super::*;

on_both_stores!(
    a_busy_placement_is_left_out_of_the_walk_while_no_agent_has_room_for_it,
    a_walk_that_read_what_was_queued_during_it_leaves_nothing_waiting,
);

/// Tasks an agent here can run but that no agent has room for are read by
/// a page, then left out of every page while no agent here has room for
/// their placement, as a parked placement's are: a backlog for a busy
/// agent at the head of the queue was read again by every page of every
/// round (up to 64 pages a round), before the walk reached anything it
/// could lease. A walk that left them out does not find the queue clear,
/// but a submit that no busy placement's agent could take is still leased
/// on the way in; once a slot frees, or the finding is a second old, they
/// are read again.
async fn a_busy_placement_is_left_out_of_the_walk_while_no_agent_has_room_for_it(fx: &Fixture) {
    let mut gpu = fx.connect("g", &["gpu"], 1).await;
    let mut linux = fx.connect("l", &["linux"], 4).await;
    let mut gpu_tasks = Vec::new();
    for _ in 0..40 {
        gpu_tasks.push(fx.queue("gpu", 9, None).await);
    }
    let first_linux = fx.queue("linux", 0, None).await;
    fx.dispatcher.note_queued();
    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    // A page of gpu tasks: one leased, the rest busy.
    assert!(fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert_eq!(gpu.grants(), [gpu_tasks[0]]);
    // The next page leaves them out and reaches the linux task.
    assert!(!fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert_eq!(linux.grants(), [first_linux]);
    fx.dispatcher.finish_walk(&walk);
    assert!(!fx.dispatcher.queue_clear(), "busy tasks wait");

    // The next walk's first page leaves them out from the start.
    let second_linux = fx.queue("linux", 0, None).await;
    fx.dispatcher.note_queued();
    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    assert!(!fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert_eq!(linux.grants(), [second_linux]);
    fx.dispatcher.finish_walk(&walk);
    assert!(!fx.dispatcher.queue_clear(), "busy tasks wait");
    let next = fx
        .dispatcher
        .start_walk()
        .expect("busy tasks are not parked");
    assert_eq!(next.starts_at(), None, "the walk learned no parked head");
    fx.dispatcher.finish_walk(&next);
    assert!(
        fx.dispatcher.nothing_leasable_waits(),
        "only busy tasks wait"
    );
    let submitted = fx
        .dispatcher
        .submit_task(task("linux", 0, None), &compiled("linux"))
        .await
        .expect("submit");
    assert_eq!(submitted.task.state, TaskState::Leased, "on the way in");
    assert_eq!(linux.grants(), [submitted.task.id]);

    // A slot frees: they are read again, in order.
    let done = CompletionOutcome::Succeeded { result: json!({}) };
    settle(fx, &gpu, gpu_tasks[0], done).await;
    assert!(
        !fx.dispatcher.nothing_leasable_waits(),
        "a busy placement has room"
    );
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(gpu.grants(), [gpu_tasks[1]]);

    // Found busy a second ago or more, they are read again too.
    let busy = |fx: &Fixture| {
        let mut state = fx.dispatcher.state();
        let state = &mut *state;
        state.queue.busy.keys(&state.index, fx.now()).len()
    };
    assert_eq!(busy(fx), 1);
    fx.clock.advance(1_000);
    assert_eq!(busy(fx), 0);
}

/// A walk that read to the end of the queue every task queued while it
/// was under way leaves nothing waiting, as of its last read: under a
/// steady stream of submits nearly every walk had one, so once a submit was
/// queued (beside a busy backlog, each time its finding lapsed) every later
/// one was queued too and waited for a round of its own. A task queued
/// after the walk's last read still waits, and overtaking it is not allowed.
async fn a_walk_that_read_what_was_queued_during_it_leaves_nothing_waiting(fx: &Fixture) {
    let mut gpu = fx.connect("g", &["gpu"], 1).await;
    let mut linux = fx.connect("l", &["linux"], 8).await;
    let submit = || async {
        fx.dispatcher
            .submit_task(task("linux", 0, None), &compiled("linux"))
            .await
            .expect("submit")
            .task
    };
    let walk_all = |mut walk| async move {
        while fx.dispatcher.walk_page(&mut walk).await.expect("page") {}
        walk
    };
    // Nothing busy yet: the task queued once the walk began is read and
    // leased by it.
    fx.dispatcher.note_queued();
    let walk = fx.dispatcher.start_walk().expect("a walk");
    let during = submit().await;
    assert_eq!(during.state, TaskState::Queued);
    let walk = walk_all(walk).await;
    fx.dispatcher.finish_walk(&walk);
    assert_eq!(linux.grants(), [during.id]);
    assert!(fx.dispatcher.nothing_leasable_waits(), "read and leased");
    let next = submit().await;
    assert_eq!(next.state, TaskState::Leased, "on the way in");
    assert_eq!(linux.grants(), [next.id]);

    // Queued after the walk's last read: it waits for a round.
    fx.dispatcher.note_queued();
    let walk = walk_all(fx.dispatcher.start_walk().expect("a walk")).await;
    let after = submit().await;
    fx.dispatcher.finish_walk(&walk);
    assert!(!fx.dispatcher.nothing_leasable_waits(), "not read");
    assert_eq!(submit().await.state, TaskState::Queued, "no overtaking");
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 2);
    assert_eq!(linux.grants().first(), Some(&after.id));

    // Beside a backlog for the busy gpu agent, left out of the walk.
    for _ in 0..40 {
        fx.queue("gpu", 9, None).await;
    }
    fx.dispatcher.note_queued();
    fx.dispatcher.dispatch_round().await.unwrap();
    assert_eq!(gpu.grants().len(), 1);
    fx.dispatcher.note_queued();
    let walk = fx.dispatcher.start_walk().expect("a walk");
    let during = submit().await;
    let walk = walk_all(walk).await;
    fx.dispatcher.finish_walk(&walk);
    assert_eq!(linux.grants(), [during.id]);
    assert!(
        fx.dispatcher.nothing_leasable_waits(),
        "only busy tasks wait"
    );
    assert_eq!(submit().await.state, TaskState::Leased, "on the way in");
    // A second later the next page reads them again, but until a page
    // finds them otherwise, submits are still leased on the way in.
    fx.clock.advance(1_000);
    assert!(fx.dispatcher.nothing_leasable_waits(), "a finding to renew");
    let busy = |fx: &Fixture| {
        let mut state = fx.dispatcher.state();
        let state = &mut *state;
        state.queue.busy.keys(&state.index, fx.now()).len()
    };
    assert_eq!(busy(fx), 0, "read again");
    // (A walk by hand: the grants here are never acknowledged, and a
    // round would hold their agents back by now.)
    let walk = walk_all(fx.dispatcher.start_walk().expect("a walk")).await;
    fx.dispatcher.finish_walk(&walk);
    assert_eq!(busy(fx), 1, "found busy again");
    assert!(
        fx.dispatcher.nothing_leasable_waits(),
        "only busy tasks wait"
    );
    // A busy task queued while a walk finds nothing past the backlog.
    linux.grants();
    fx.dispatcher.note_queued();
    let walk = fx.dispatcher.start_walk().expect("a walk");
    fx.queued_elsewhere("gpu", 9).await;
    let walk = walk_all(walk).await;
    fx.dispatcher.finish_walk(&walk);
    assert!(
        fx.dispatcher.nothing_leasable_waits(),
        "only busy tasks wait"
    );
    assert!(gpu.grants().is_empty());
}
