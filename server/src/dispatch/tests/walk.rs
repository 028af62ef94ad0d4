//! The queue walk: pages in priority order, parked placements left out, the
//! parked head skipped, and what a task queued while a walk is under way
//! leaves standing.

use super::*;

on_both_stores!(
    a_round_fills_free_slots_in_priority_order,
    a_parked_task_is_skipped_and_remembered_until_an_agent_can_run_it,
    a_task_queued_during_a_walk_leaves_the_skip_standing_up_to_it,
    a_replica_does_not_hear_its_own_submit_queued_again,
    a_skip_past_its_time_is_read_again_beside_the_rounds,
    a_walk_goes_on_past_a_page_of_parked_tasks_where_the_first_is_not_parked,
);

async fn a_round_fills_free_slots_in_priority_order(fx: &Fixture) {
    let mut agent = fx.connect("a", &["linux"], 2).await;
    let low = fx.queue("linux", 0, None).await;
    let high = fx.queue("linux", 5, None).await;
    let middle = fx.queue("linux", 1, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 2);
    assert_eq!(agent.grants(), [high, middle]);
    assert_eq!(
        fx.store.get_task(low).await.unwrap().state,
        TaskState::Queued
    );
    let leased = fx.store.get_task(high).await.unwrap();
    assert_eq!(
        (leased.state, leased.agent_id),
        (TaskState::Leased, Some(agent.id))
    );
    // The agent is full: nothing more until a slot frees.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let done = Completion {
        lease_id: leased.lease_id.unwrap(),
        task_id: high,
        agent_id: agent.id,
        fencing_token: leased.fencing_token,
        outcome: CompletionOutcome::Succeeded { result: json!({}) },
    };
    fx.store.complete_leases(&[done], fx.now()).await.unwrap();
    fx.dispatcher.lease_ended(agent.id, Some(high));
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants(), [low]);
}

async fn a_parked_task_is_skipped_and_remembered_until_an_agent_can_run_it(fx: &Fixture) {
    let mut linux = fx.connect("a", &["linux"], 4).await;
    let gpu_task = fx.queue("gpu", 9, None).await;
    let linux_task = fx.queue("linux", 0, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(linux.grants(), [linux_task]);
    assert_eq!(fx.dispatcher.state().queue.parked_keys().len(), 1);
    // A round now finds nothing to read past the parked head.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let mut gpu = fx.connect("g", &["gpu"], 1).await;
    assert!(fx.dispatcher.state().queue.parked_keys().is_empty());
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(gpu.grants(), [gpu_task]);
    assert!(linux.grants().is_empty());
}

/// Under a steady stream of submits every walk has tasks queued while it is
/// under way. Each leaves the walk's skip standing as far as the task, so
/// the next round starts past the parked head and reads the task first
/// (before, it read every parked task again: at a million of them, seconds
/// per round); so does one queued ahead of the parked head once the skip is
/// made. A signal that does not say where its task is undoes it.
async fn a_task_queued_during_a_walk_leaves_the_skip_standing_up_to_it(fx: &Fixture) {
    let mut linux = fx.connect("a", &["linux"], 4).await;
    for _ in 0..3 {
        fx.queue("gpu", 9, None).await;
    }
    // A walk reads its pages, then a task is queued before it ends (by
    // another replica: a submit here would be leased on the way in, the
    // walk having read the whole queue).
    let queue_while_walking = |priority: i32| async move {
        fx.dispatcher.note_queued();
        let mut walk = fx.dispatcher.start_walk().expect("a walk");
        while fx.dispatcher.walk_page(&mut walk).await.expect("page") {}
        let during = fx.queued_elsewhere("linux", priority).await;
        fx.dispatcher.finish_walk(&walk);
        during
    };
    for priority in [0, 10] {
        let during = queue_while_walking(priority).await;
        let next = fx.dispatcher.start_walk().expect("a walk");
        assert_eq!(next.starts_at(), Some(QueueCursor::before(&during)));
        assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
        assert_eq!(linux.grants(), [during.id]);
    }
    // Queued ahead of a standing skip (on another replica: heard by the
    // store's event): it stands, up to the task.
    fx.dispatcher.note_queued();
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let ahead = fx.queued_elsewhere("linux", 10).await;
    let next = fx.dispatcher.start_walk().expect("a walk");
    assert_eq!(next.starts_at(), Some(QueueCursor::before(&ahead)));
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(linux.grants(), [ahead.id]);

    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    while fx.dispatcher.walk_page(&mut walk).await.expect("page") {}
    fx.dispatcher.note_queued();
    fx.dispatcher.finish_walk(&walk);
    let next = fx.dispatcher.start_walk().expect("a walk");
    assert_eq!(next.starts_at(), None);
}

/// The replica that took a submit notes the queued task as the submit
/// returns; the store's event for it goes to the other replicas only. Heard
/// here too, it came late (on PostgreSQL, a notification's round trip
/// later): a round may have leased the task meanwhile, and the late signal
/// said a task waited ahead of the parked head, so the next round read every
/// parked task again. The event of the cancel that follows does come back.
async fn a_replica_does_not_hear_its_own_submit_queued_again(fx: &Fixture) {
    use crate::model::StoreEvent;
    let mut events = fx.store.subscribe();
    let submitted = fx
        .dispatcher
        .submit_task(task("gpu", 0, None), &compiled("gpu"))
        .await
        .expect("submit");
    assert_eq!(submitted.task.state, TaskState::Queued);
    let id = submitted.task.id;
    fx.store
        .cancel_task(id, "test", None, fx.now())
        .await
        .expect("cancel");
    let mut heard = Vec::new();
    loop {
        let event = events.recv().await.expect("an event");
        let canceled = matches!(event, StoreEvent::TaskChanged { task_id, .. } if task_id == id);
        heard.push(event);
        if canceled {
            break;
        }
    }
    assert!(
        !heard
            .iter()
            .any(|e| matches!(e, StoreEvent::TaskQueued { task_id, .. } if *task_id == id)),
        "{heard:?}"
    );
}

/// A skip past its time is read again beside the rounds, which go on
/// starting past the parked head meanwhile: while the head holds only
/// parked tasks the skip is renewed; a task that came ahead of it with no
/// signal (a delayed task whose due time was not kept) drops it, and the
/// next round walks from the head and grants that task.
async fn a_skip_past_its_time_is_read_again_beside_the_rounds(fx: &Fixture) {
    use crate::dispatch::queue::SKIP_TTL_MS;
    let mut linux = fx.connect("a", &["linux"], 4).await;
    fx.queue("gpu", 9, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    fx.clock.advance(SKIP_TTL_MS);
    fx.dispatcher.recheck_skip().await;
    let skip = fx.dispatcher.state().queue.skip.expect("renewed");
    assert_eq!((skip.to, skip.made_at_ms), (None, fx.now()));

    // A reading under way while the rounds move the skip's end (a task
    // queued ahead of it, from another replica, moves it back; leasing that
    // task, on) still renews it.
    let queued = fx.queued_elsewhere("linux", 0).await;
    fx.clock.advance(SKIP_TTL_MS);
    let rechecking = &fx.dispatcher.shared.rechecking_skip;
    rechecking.store(true, std::sync::atomic::Ordering::SeqCst);
    let read = fx.dispatcher.read_skipped_head().await.expect("a skip");
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(linux.grants(), [queued.id]);
    let done = CompletionOutcome::Succeeded { result: json!({}) };
    settle(fx, &linux, queued.id, done).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let moved = fx.dispatcher.state().queue.skip.expect("a skip");
    assert_eq!(moved.to, None);
    fx.dispatcher.apply_skipped_head(read);
    let skip = fx.dispatcher.state().queue.skip.expect("renewed");
    assert_eq!((skip.to, skip.made_at_ms), (None, fx.now()));
    rechecking.store(false, std::sync::atomic::Ordering::SeqCst);

    let sneaked = fx.queue("linux", 10, None).await;
    // Not read again before its time: the round starts past the head.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    fx.clock.advance(SKIP_TTL_MS);
    fx.dispatcher.recheck_skip().await;
    assert!(fx.dispatcher.state().queue.skip.is_none());
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(linux.grants(), [sneaked]);
}

/// After a whole page of parked tasks the walk does not read the rest of
/// them (each would be read only to be left out): it goes on just before
/// the first task that is not parked, and grants it on the next page. When
/// every task left is parked, the walk has reached the end of what it can
/// run.
async fn a_walk_goes_on_past_a_page_of_parked_tasks_where_the_first_is_not_parked(fx: &Fixture) {
    let mut linux = fx.connect("a", &["linux"], 4).await;
    for _ in 0..40 {
        fx.queue("gpu", 9, None).await;
    }
    let runnable = fx.queue("linux", 0, None).await;
    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    assert!(fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    let task = fx.store.get_task(runnable).await.expect("stored");
    assert_eq!(walk.cursor(), Some(QueueCursor::before(&task)));
    assert!(!fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert_eq!(linux.grants(), [runnable]);
    fx.dispatcher.finish_walk(&walk);

    for _ in 0..40 {
        fx.queue("arm", 9, None).await;
    }
    fx.dispatcher.note_queued();
    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    assert!(!fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert!(walk.walked(), "every task left is parked: the end");
}
