//! Wake-ups: what a subscriber of the store hears when tasks are queued or
//! change (agent changes reach the other replicas only: see `race`).

use std::time::Duration;

use switchyard_server::model::{Completion, CompletionOutcome, StoreEvent, TaskState};
use tokio::sync::broadcast;

use crate::common::{Fixture, T0, agent, grant, submit, task};

crate::both_backends!(subscribers_hear_queued_and_changed_tasks);

/// Waits (bounded) for the first event `want` accepts.
pub async fn wait_for(
    events: &mut broadcast::Receiver<StoreEvent>,
    mut want: impl FnMut(&StoreEvent) -> bool,
) -> StoreEvent {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let event = events.recv().await.expect("event stream open");
            if want(&event) {
                return event;
            }
        }
    })
    .await
    .expect("event within 10 s")
}

/// Waits (bounded) for the first event `want` accepts; every event heard
/// up to it, that one last.
pub async fn heard_until(
    events: &mut broadcast::Receiver<StoreEvent>,
    want: impl Fn(&StoreEvent) -> bool,
) -> Vec<StoreEvent> {
    let mut heard = Vec::new();
    wait_for(events, |e| {
        heard.push(e.clone());
        want(e)
    })
    .await;
    heard
}

/// Whether any of `heard` says a task was queued.
pub fn any_queued(heard: &[StoreEvent]) -> bool {
    heard
        .iter()
        .any(|e| matches!(e, StoreEvent::TaskQueued { .. }))
}

async fn subscribers_hear_queued_and_changed_tasks(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let mut events = store.subscribe();
    let t = submit(store, task("ns", 0, 3), T0).await;
    // A submit is announced to the other replicas only (the one that took
    // it noted it itself): it is marked so.
    let queued = StoreEvent::submitted(&t);
    assert_eq!(
        queued,
        StoreEvent::TaskQueued {
            namespace: "ns".to_owned(),
            task_id: t.id,
            priority: Some(0),
            rank: Some(T0),
            not_before_ms: Some(T0),
            submitted: true,
        }
    );
    assert!(queued.for_other_replicas());
    let queued = StoreEvent::queued(&t, T0);
    // As the release before announces it, the submit time under its old
    // name: read as the rank (the rank of a task without a fairness key).
    let before: StoreEvent = serde_json::from_value(serde_json::json!({
        "t": "task_queued", "namespace": "ns", "task_id": t.id, "priority": 0,
        "created_at_ms": T0, "not_before_ms": T0,
    }))
    .unwrap();
    assert_eq!(before, queued);
    // As a replica of an older version announces it (no place in the
    // queue): still understood.
    let older: StoreEvent = serde_json::from_value(serde_json::json!({
        "t": "task_queued", "namespace": "ns", "task_id": t.id,
    }))
    .unwrap();
    assert_eq!(
        older,
        StoreEvent::TaskQueued {
            namespace: "ns".to_owned(),
            task_id: t.id,
            priority: None,
            rank: None,
            not_before_ms: None,
            submitted: false,
        }
    );
    // Agent changes are announced to other replicas only (see the race
    // tests); the replica that made one applies it itself.
    let worker = agent(store, "ns", "w1", 1).await;
    grant(store, t.id, worker.id, T0).await;
    let leased = StoreEvent::TaskChanged {
        task_id: t.id,
        state: TaskState::Leased,
    };
    let heard = heard_until(&mut events, |e| *e == leased).await;
    assert!(
        !any_queued(&heard),
        "the submit's own replica does not hear it queued: {heard:?}"
    );
    // An expiry re-queues, due at once: announced again.
    store.expire_leases(T0 + 30_000, 10).await.unwrap();
    wait_for(&mut events, |e| {
        matches!(e, StoreEvent::TaskQueued { task_id, not_before_ms, .. }
            if *task_id == t.id && *not_before_ms == Some(T0 + 30_000))
    })
    .await;
    // A retryable failure re-queues it backing off: the announcement says
    // when it comes due, so a dispatcher can look again then.
    let lease = grant(store, t.id, worker.id, T0 + 30_001).await;
    let failed = Completion {
        lease_id: lease.id,
        task_id: t.id,
        agent_id: worker.id,
        fencing_token: lease.fencing_token,
        outcome: CompletionOutcome::Failed {
            error: serde_json::json!({"message": "exit 1", "retryable": true}),
            retryable: true,
        },
    };
    store
        .complete_leases(&[failed], T0 + 30_002)
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    let due = store.get_task(t.id).await.unwrap().not_before_ms;
    assert!(due > T0 + 30_002, "the retry backs off");
    wait_for(&mut events, |e| {
        matches!(e, StoreEvent::TaskQueued { task_id, not_before_ms, .. }
            if *task_id == t.id && *not_before_ms == Some(due))
    })
    .await;
}
