//! Leases and submits: refusals, due times, lapsed leases, and a submit
//! leased on the way in.

use super::*;

on_both_stores!(
    a_refused_task_waits_on_its_own_until_an_agent_that_did_not_refuse_it_connects,
    a_delayed_task_is_granted_once_it_comes_due,
    a_lapsed_lease_is_expired_revoked_and_granted_again,
    a_submit_is_leased_on_the_way_in_only_when_nothing_waits,
);

async fn a_refused_task_waits_on_its_own_until_an_agent_that_did_not_refuse_it_connects(
    fx: &Fixture,
) {
    let mut a = fx.connect("a", &["linux"], 1).await;
    let refused = fx.queue("linux", 9, None).await;
    let other = fx.queue("linux", 0, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(a.grants(), [refused]);
    let cannot = CompletionOutcome::Released {
        reason: "no handler".into(),
        cause: ReleaseCause::CannotHandle,
    };
    settle(fx, &a, refused, cannot).await;
    fx.dispatcher.note_refusal(refused, a.id);
    // The slot goes to the other task of the same placement: the placement
    // is not parked, only the refused task waits.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(a.grants(), [other]);
    assert!(fx.dispatcher.state().queue.parked_keys().is_empty());
    let done = CompletionOutcome::Succeeded { result: json!({}) };
    settle(fx, &a, other, done).await;
    // Nothing else to run: the head of the queue is known to be parked.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    assert!(a.grants().is_empty());
    // An agent that did not refuse it takes it at once, past that memory.
    let mut b = fx.connect("b", &["linux"], 1).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(b.grants(), [refused]);
    assert!(a.grants().is_empty());
}

async fn a_delayed_task_is_granted_once_it_comes_due(fx: &Fixture) {
    let mut agent = fx.connect("a", &["linux"], 1).await;
    let later = fx.queue("linux", 0, Some(T0 + 1_000)).await;
    fx.dispatcher.note_due(T0 + 1_000);
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    assert_eq!(
        fx.dispatcher.until_due(fx.now()),
        Some(std::time::Duration::from_millis(1_000))
    );
    fx.clock.advance(1_000);
    fx.dispatcher.take_due(fx.now());
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants(), [later]);
}

async fn a_lapsed_lease_is_expired_revoked_and_granted_again(fx: &Fixture) {
    let mut agent = fx.connect("a", &["linux"], 1).await;
    let id = fx.queue("linux", 0, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants(), [id]);
    // Past the ack window, and past the lease's TTL unrenewed.
    fx.clock.advance(10_000);
    fx.dispatcher.touch(agent.id);
    fx.dispatcher.sweep().await.unwrap();
    let revoked = agent.revocations();
    assert_eq!(revoked, [(id, RevocationReason::Expired)]);
    let task = fx.store.get_task(id).await.unwrap();
    assert_eq!(task.state, TaskState::Queued);
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants(), [id]);
    assert_eq!(fx.store.get_task(id).await.unwrap().fencing_token, 2);
}

async fn a_submit_is_leased_on_the_way_in_only_when_nothing_waits(fx: &Fixture) {
    // Before any round has seen the queue, a submit does not jump it.
    let nobody = fx
        .dispatcher
        .submit_task(task("gpu", 0, None), &compiled("gpu"))
        .await
        .unwrap();
    assert_eq!(nobody.task.state, TaskState::Queued);
    assert_eq!(nobody.queued_reason, Some(QueuedReason::Parked));
    let mut agent = fx.connect("a", &["linux"], 1).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    // The queue holds only a parked task: a submit is leased at once.
    let linux = compiled("linux");
    let first = fx
        .dispatcher
        .submit_task(task("linux", 0, None), &linux)
        .await
        .unwrap();
    assert_eq!((first.task.state, first.created), (TaskState::Leased, true));
    assert_eq!(first.queued_reason, None);
    assert_eq!(agent.grants(), [first.task.id]);
    // The agent is full: the next one waits for capacity.
    let second = fx
        .dispatcher
        .submit_task(task("linux", 0, None), &linux)
        .await
        .unwrap();
    assert_eq!(second.task.state, TaskState::Queued);
    assert_eq!(second.queued_reason, Some(QueuedReason::WaitingForCapacity));
    assert!(agent.grants().is_empty());
}
