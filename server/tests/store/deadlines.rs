//! Deadlines: an attempt past its execution timeout, a cancel-requested
//! lease past its grace and the leases of an agent past its drain deadline
//! are ended whatever their renewals; a queued task past its start deadline
//! is found and failed once. Without deadlines nothing of this happens.

use serde_json::json;
use switchyard_server::model::{
    Completion, CompletionOutcome, Deadlines, LeaseEnd, LeaseState, RetryPolicy, RevocationCause,
    TaskState,
};
use switchyard_server::store::Store;

use crate::common::{Fixture, T0, agent, grant, submit, task};

crate::both_backends!(
    an_attempt_past_its_execution_timeout_is_revoked_and_counts,
    a_cancel_requested_lease_is_ended_after_its_grace,
    a_drain_deadline_revokes_and_requeues_what_the_agent_still_holds,
    a_task_not_leased_by_its_start_deadline_is_found_and_failed_once,
    the_longest_overdue_tasks_are_found_first,
);

const DAY: i64 = 86_400_000;

/// The kinds of a task's history, in order.
async fn history(store: &dyn Store, task_id: uuid::Uuid) -> Vec<String> {
    let events = store.task_events(task_id, 0, 100).await.unwrap();
    events.into_iter().map(|e| e.kind).collect()
}

async fn an_attempt_past_its_execution_timeout_is_revoked_and_counts(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 4).await;
    let mut spec = task("ns", 0, 2);
    spec.deadlines.execution_timeout_ms = Some(10_000);
    spec.retry = Some(RetryPolicy {
        initial_backoff_ms: 500,
        max_backoff_ms: 500,
        multiplier: 1.0,
        jitter: 0.0,
    });
    let timed = submit(store, spec, T0).await;
    assert_eq!(timed.deadlines.execution_timeout_ms, Some(10_000));
    let untimed = submit(store, task("ns", 0, 2), T0).await;
    let lease = grant(store, timed.id, worker.id, T0).await;
    let other = grant(store, untimed.id, worker.id, T0).await;

    // Renewed, and not yet due: nothing happens.
    store.renew_leases(worker.id, T0 + 9_000).await.unwrap();
    assert!(
        store
            .reclaim_overdue(T0 + 9_999, 100)
            .await
            .unwrap()
            .is_empty()
    );

    let ended = store.reclaim_overdue(T0 + 10_000, 100).await.unwrap();
    assert_eq!(ended.len(), 1, "{ended:?}");
    let (ended_lease, requeued, cause) = &ended[0];
    assert_eq!(*cause, RevocationCause::Timeout);
    assert_eq!(ended_lease.id, lease.id);
    assert_eq!(ended_lease.state, LeaseState::Released);
    assert_eq!(ended_lease.ended_by, Some(LeaseEnd::TimedOut));
    assert_eq!(requeued.state, TaskState::Queued);
    assert_eq!(requeued.attempts, 1);
    assert_eq!(
        requeued.not_before_ms,
        T0 + 10_000 + 500,
        "backs off by its policy"
    );
    assert_eq!(requeued.error.as_ref().unwrap()["code"], json!("timeout"));
    assert_eq!(history(store, timed.id).await.last().unwrap(), "timed_out");
    assert_eq!(store.failed_agents(timed.id).await.unwrap(), [worker.id]);
    // Swept again: ended once.
    assert!(
        store
            .reclaim_overdue(T0 + 10_000, 100)
            .await
            .unwrap()
            .is_empty()
    );

    // The second attempt times out too: out of attempts, FAILED.
    let again = grant(store, timed.id, worker.id, T0 + 20_000).await;
    store.renew_leases(worker.id, T0 + 29_000).await.unwrap();
    let ended = store.reclaim_overdue(T0 + 30_000, 100).await.unwrap();
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].0.id, again.id);
    let failed = store.get_task(timed.id).await.unwrap();
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.attempts, 2);
    assert_eq!(failed.error.as_ref().unwrap()["code"], json!("timeout"));
    assert_eq!(history(store, timed.id).await.last().unwrap(), "failed");

    // The task without a timeout runs on as long as it is renewed.
    store.renew_leases(worker.id, T0 + DAY).await.unwrap();
    assert!(
        store
            .reclaim_overdue(T0 + DAY, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let running = store.get_lease(other.id).await.unwrap();
    assert!(running.state.is_live());
}

async fn a_cancel_requested_lease_is_ended_after_its_grace(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 4).await;
    let mut spec = task("ns", 0, 3);
    spec.deadlines.cancel_grace_ms = Some(5_000);
    let graced = submit(store, spec, T0).await;
    let overridden = submit(store, task("ns", 0, 3), T0).await;
    let ungraced = submit(store, task("ns", 0, 3), T0).await;
    let lease = grant(store, graced.id, worker.id, T0).await;
    let lease2 = grant(store, overridden.id, worker.id, T0).await;
    grant(store, ungraced.id, worker.id, T0).await;

    let (asked, _) = store
        .cancel_task(graced.id, "stop", None, T0 + 100)
        .await
        .unwrap();
    assert!(asked.cancel_requested);
    assert_eq!(
        asked.cancel_deadline_ms,
        Some(T0 + 5_100),
        "the task's grace"
    );
    // A cancel's own grace beats the task's having none.
    let (asked2, _) = store
        .cancel_task(overridden.id, "stop", Some(1_000), T0 + 100)
        .await
        .unwrap();
    assert_eq!(asked2.cancel_deadline_ms, Some(T0 + 1_100));
    // A later cancel never pushes a deadline back.
    let (same, _) = store
        .cancel_task(overridden.id, "again", Some(60_000), T0 + 200)
        .await
        .unwrap();
    assert_eq!(same.cancel_deadline_ms, Some(T0 + 1_100));
    let (plain, _) = store
        .cancel_task(ungraced.id, "stop", None, T0 + 100)
        .await
        .unwrap();
    assert_eq!(plain.cancel_deadline_ms, None);

    // The agent keeps renewing; the graces run out regardless.
    store.renew_leases(worker.id, T0 + 1_000).await.unwrap();
    let ended = store.reclaim_overdue(T0 + 1_100, 100).await.unwrap();
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].0.id, lease2.id);
    assert_eq!(ended[0].2, RevocationCause::Canceled);
    assert_eq!(ended[0].1.state, TaskState::Canceled);
    store.renew_leases(worker.id, T0 + 5_000).await.unwrap();
    assert!(
        store
            .reclaim_overdue(T0 + 5_099, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let ended = store.reclaim_overdue(T0 + 5_100, 100).await.unwrap();
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].0.id, lease.id);
    assert_eq!(ended[0].0.ended_by, Some(LeaseEnd::Revoked));
    let canceled = store.get_task(graced.id).await.unwrap();
    assert_eq!(canceled.state, TaskState::Canceled);
    assert_eq!(canceled.attempts, 0);
    assert_eq!(history(store, graced.id).await.last().unwrap(), "canceled");

    // Without a grace the lease ends only by the agent or its expiry.
    store.renew_leases(worker.id, T0 + DAY).await.unwrap();
    assert!(
        store
            .reclaim_overdue(T0 + DAY, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.get_task(ungraced.id).await.unwrap().state,
        TaskState::Leased
    );
}

async fn a_drain_deadline_revokes_and_requeues_what_the_agent_still_holds(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 4).await;
    let waiting = agent(store, "ns", "w2", 4).await;
    let a = submit(store, task("ns", 0, 3), T0).await;
    let b = submit(store, task("ns", 0, 3), T0).await;
    let c = submit(store, task("ns", 0, 3), T0).await;
    grant(store, a.id, worker.id, T0).await;
    grant(store, b.id, worker.id, T0).await;
    grant(store, c.id, waiting.id, T0).await;

    let drained = store
        .set_agent_drained(worker.id, true, None, Some(T0 + 60_000), T0 + 1)
        .await
        .unwrap();
    assert_eq!(drained.drain_deadline_ms, Some(T0 + 60_000));
    // A drain without a deadline waits for ever.
    store
        .set_agent_drained(waiting.id, true, None, None, T0 + 1)
        .await
        .unwrap();

    store.renew_leases(worker.id, T0 + 59_000).await.unwrap();
    assert!(
        store
            .reclaim_overdue(T0 + 59_999, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let ended = store.reclaim_overdue(T0 + 60_000, 100).await.unwrap();
    assert_eq!(ended.len(), 2, "{ended:?}");
    for (lease, requeued, cause) in &ended {
        assert_eq!(*cause, RevocationCause::DrainDeadline);
        assert_eq!(lease.agent_id, worker.id);
        assert_eq!(requeued.state, TaskState::Queued);
        assert_eq!(requeued.attempts, 0, "a drain does not count an attempt");
        assert_eq!(requeued.not_before_ms, T0 + 60_000, "requeued at once");
        assert_eq!(history(store, requeued.id).await.last().unwrap(), "revoked");
    }
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 0);

    // Undraining clears the deadline: a lease granted later is kept.
    let undrained = store
        .set_agent_drained(worker.id, false, None, None, T0 + 70_000)
        .await
        .unwrap();
    assert_eq!(undrained.drain_deadline_ms, None);
    grant(store, a.id, worker.id, T0 + 70_000).await;
    store.renew_leases(worker.id, T0 + DAY).await.unwrap();
    store.renew_leases(waiting.id, T0 + DAY).await.unwrap();
    assert!(
        store
            .reclaim_overdue(T0 + DAY, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_task_not_leased_by_its_start_deadline_is_found_and_failed_once(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 4).await;
    let deadline = |spec: &mut switchyard_server::model::NewTask| {
        spec.deadlines = Deadlines {
            start_timeout_ms: Some(30_000),
            ..Deadlines::default()
        };
    };
    let mut spec = task("ns", 0, 3);
    deadline(&mut spec);
    let stuck = submit(store, spec, T0).await;
    let mut spec = task("ns", 0, 3);
    deadline(&mut spec);
    spec.not_before_ms = Some(T0 + 10_000);
    let delayed = submit(store, spec, T0).await;
    let mut spec = task("ns", 0, 3);
    deadline(&mut spec);
    let started = submit(store, spec, T0).await;
    let mut spec = task("ns", 0, 3);
    deadline(&mut spec);
    let retried = submit(store, spec, T0).await;
    let patient = submit(store, task("ns", 0, 3), T0).await;

    grant(store, started.id, worker.id, T0 + 1_000).await;
    // A failed attempt puts the task back, due again after its backoff:
    // the deadline counts from then.
    let lease = grant(store, retried.id, worker.id, T0 + 1_000).await;
    let done = store
        .complete_leases(
            &[Completion {
                lease_id: lease.id,
                task_id: lease.task_id,
                agent_id: lease.agent_id,
                fencing_token: lease.fencing_token,
                outcome: CompletionOutcome::Failed {
                    error: json!({"message": "exit 1", "code": "handler_error", "retryable": true, "details": {}}),
                    retryable: true,
                },
            }],
            T0 + 2_000,
        )
        .await
        .unwrap();
    let due_again = done.into_iter().next().unwrap().unwrap().task.not_before_ms;
    assert!(due_again > T0 + 2_000);

    assert!(
        store
            .unstarted_overdue(T0 + 29_999, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let overdue = store.unstarted_overdue(T0 + 30_000, 100).await.unwrap();
    let ids: Vec<_> = overdue.iter().map(|t| t.id).collect();
    assert_eq!(
        ids,
        [stuck.id],
        "not the delayed, started, retried or patient task"
    );

    let error = json!({"message": "unschedulable", "code": "unschedulable", "retryable": false, "details": {}});
    let failed = store
        .fail_unstarted(
            stuck.id,
            &error,
            "unschedulable: 0/1 agents eligible",
            T0 + 30_000,
        )
        .await
        .unwrap()
        .expect("failed");
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.error, Some(error.clone()));
    let events = store.task_events(stuck.id, 0, 100).await.unwrap();
    let last = events.last().unwrap();
    assert_eq!(
        (last.kind.as_str(), last.message.as_str()),
        ("failed", "unschedulable: 0/1 agents eligible")
    );
    // Once only; and a task not overdue is left alone.
    let again = store
        .fail_unstarted(stuck.id, &error, "again", T0 + 30_001)
        .await
        .unwrap();
    assert_eq!(again, None);
    let early = store
        .fail_unstarted(delayed.id, &error, "early", T0 + 30_000)
        .await
        .unwrap();
    assert_eq!(early, None);
    assert_eq!(
        store.get_task(delayed.id).await.unwrap().state,
        TaskState::Queued
    );

    // The delayed task is overdue 30 s after it came due; the retried one
    // 30 s after its backoff ended, not before.
    let later = store.unstarted_overdue(T0 + 40_000, 100).await.unwrap();
    assert!(later.iter().any(|t| t.id == delayed.id));
    let before = store
        .unstarted_overdue(due_again + 29_999, 100)
        .await
        .unwrap();
    assert!(!before.iter().any(|t| t.id == retried.id));
    let after = store
        .unstarted_overdue(due_again + 30_000, 100)
        .await
        .unwrap();
    assert!(after.iter().any(|t| t.id == retried.id));
    assert!(
        !after
            .iter()
            .any(|t| t.id == patient.id || t.id == started.id)
    );
}

/// Past the sweep's limit, the tasks overdue the longest are found first,
/// whatever their ids.
async fn the_longest_overdue_tasks_are_found_first(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let mut later = Vec::new();
    let mut earlier = Vec::new();
    for timeout in [50_000, 40_000, 20_000, 10_000] {
        let mut spec = task("ns", 0, 3);
        spec.deadlines = Deadlines {
            start_timeout_ms: Some(timeout),
            ..Deadlines::default()
        };
        let t = submit(store, spec, T0).await;
        if timeout > 30_000 {
            later.push(t.id)
        } else {
            earlier.push(t.id)
        }
    }
    let overdue = store.unstarted_overdue(T0 + DAY, 2).await.unwrap();
    let mut ids: Vec<_> = overdue.iter().map(|t| t.id).collect();
    ids.sort();
    earlier.sort();
    assert_eq!(ids, earlier);
    assert!(later.iter().all(|id| !ids.contains(id)));
}
