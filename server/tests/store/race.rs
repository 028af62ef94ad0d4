//! PostgreSQL only: two store instances (two pools, as two replicas would
//! have) on one database racing to grant 1,000 tasks to 50 agents, and to
//! hand out one agent's devices and memory; a grant of a task another
//! transaction holds; LISTEN/NOTIFY carrying an event from one instance to
//! the other (and none while no other reads it: the dispatcher's events
//! while it has agents or a watcher, a task's changes while it follows
//! them); and the pool's warm-up fitting the migrated schema.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;
use sqlx::Connection;
use switchyard_server::model::{
    EndedLease, GrantOutcome, GrantRefusal, GrantRequest, StoreEvent, Submission, TaskState,
};
use switchyard_server::store::{PgStore, Store, StoreOptions, TaskStore};

use crate::common::{
    Fixture, Lcg, T0, TestStore, agent, agents, claiming, gpu_agent, grant, submit, task,
};
use crate::events::{any_queued, heard_until, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_grant_1000_tasks_to_50_agents_exactly_once() {
    const TASKS: usize = 1_000;
    const AGENTS: usize = 50;
    const CAPACITY: u32 = 20;
    const LOOPS_PER_REPLICA: u64 = 4;
    let fx = Fixture::postgres().await;
    let a: Arc<dyn Store> = fx.store.clone();
    let b: Arc<dyn Store> = fx.another_instance().await;
    for i in 0..TASKS {
        submit(a.as_ref(), task("ns", (i % 3) as i32, 3), T0 + i as i64).await;
    }
    let agent_ids = agents(a.as_ref(), "ns", AGENTS, CAPACITY).await;

    // Each loop acts like a dispatcher: read candidates, pick agents that
    // look free, grant in batches, until nothing is queued.
    let mut loops = Vec::new();
    for (replica, store) in [a.clone(), b.clone()].into_iter().enumerate() {
        for seed in 0..LOOPS_PER_REPLICA {
            let store = store.clone();
            let agent_ids = agent_ids.clone();
            loops.push(tokio::spawn(async move {
                let mut rng = Lcg(seed * 31 + replica as u64 + 7);
                let mut granted = 0_usize;
                let mut refused = 0_usize;
                loop {
                    let candidates = store
                        .queued_tasks(Some("ns"), T0 + 10_000, None, &[], 64)
                        .await
                        .unwrap();
                    if candidates.is_empty() {
                        break;
                    }
                    let free: Vec<_> = store
                        .agents_of("ns")
                        .await
                        .unwrap()
                        .into_iter()
                        .filter(|a| a.active_leases < a.capacity)
                        .map(|a| a.id)
                        .collect();
                    let pool = if free.is_empty() { &agent_ids } else { &free };
                    let requests: Vec<GrantRequest> = candidates
                        .iter()
                        .map(|t| GrantRequest::one_slot(t.id, pool[rng.next(pool.len())]))
                        .collect();
                    for outcome in store.grant_leases(&requests, T0 + 10_000).await.unwrap() {
                        match outcome {
                            GrantOutcome::Granted(_) => granted += 1,
                            GrantOutcome::Refused(_) => refused += 1,
                        }
                    }
                }
                (granted, refused)
            }));
        }
    }
    let mut granted = 0;
    for handle in loops {
        granted += handle.await.unwrap().0;
    }
    assert_eq!(
        granted, TASKS,
        "every task granted once across both replicas"
    );

    let mut leased_tasks = HashSet::new();
    for &agent_id in &agent_ids {
        let record = b.get_agent(agent_id).await.unwrap();
        let leases = b.agent_leases(agent_id).await.unwrap();
        assert!(record.active_leases <= CAPACITY, "agent over capacity");
        assert_eq!(record.active_leases as usize, leases.len());
        for lease in leases {
            assert_eq!(lease.fencing_token, 1, "a task was granted more than once");
            assert!(
                leased_tasks.insert(lease.task_id),
                "a task has two live leases"
            );
        }
    }
    assert_eq!(leased_tasks.len(), TASKS);
    for task_id in leased_tasks {
        let t = a.get_task(task_id).await.unwrap();
        assert_eq!(t.state, TaskState::Leased);
        assert_eq!(t.fencing_token, 1);
    }
    b.close().await;
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_from_one_replica_reaches_the_other() {
    let fx = Fixture::postgres().await;
    let other = fx.another_instance().await;
    // Both read the dispatcher's events, as replicas with agents do.
    let _reading = other.follow_dispatch().await;
    let _reading_too = fx.store.follow_dispatch().await;
    let mut heard_by_other = other.subscribe();
    let mut heard_by_self = fx.store.subscribe();
    let t = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    let expected = StoreEvent::TaskQueued {
        namespace: "ns".to_owned(),
        task_id: t.id,
        priority: Some(0),
        rank: Some(T0),
        not_before_ms: Some(T0),
        submitted: true,
    };
    assert_eq!(
        wait_for(&mut heard_by_other, |e| *e == expected).await,
        expected
    );
    // A batch's queued tasks are announced in submit order.
    let batch: Vec<Submission> = (0..3)
        .map(|_| Submission {
            task: task("ns", 0, 1),
            agent_id: None,
        })
        .collect();
    let stored = fx.store.submit_many(&batch, T0).await.unwrap();
    let ids: Vec<_> = stored.iter().map(|r| r.as_ref().unwrap().0.id).collect();
    let mut announced = Vec::new();
    while announced.last() != Some(&ids[2]) {
        let event = wait_for(&mut heard_by_other, |e| {
            matches!(e, StoreEvent::TaskQueued { .. })
        })
        .await;
        if let StoreEvent::TaskQueued { task_id, .. } = event {
            announced.push(task_id);
        }
    }
    assert_eq!(announced, ids);
    let worker = agent(other.as_ref(), "ns", "w1", 1).await;
    let expected = StoreEvent::AgentChanged {
        agent_id: worker.id,
    };
    let mut heard = fx.store.subscribe();
    // Subscribed after the change: nothing replayed, but the next change is heard.
    other
        .set_agent_drained(worker.id, true, None, None, T0)
        .await
        .unwrap();
    assert_eq!(wait_for(&mut heard, |e| *e == expected).await, expected);
    // The submit's own replica noted it as the submit returned, and does not
    // hear it again: before the agent's change, nothing about the task.
    let before = heard_until(&mut heard_by_self, |e| *e == expected).await;
    assert!(!any_queued(&before), "{before:?}");

    // A lease ended by one replica's sweeper frees the slot on the replica
    // the agent is connected to; the sweeping replica is not told again.
    other
        .set_agent_drained(worker.id, false, None, None, T0)
        .await
        .unwrap();
    let leased = submit(fx.store.as_ref(), task("ns", 0, 3), T0).await;
    grant(other.as_ref(), leased.id, worker.id, T0).await;
    let mut heard_by_other = other.subscribe();
    let mut heard_by_self = fx.store.subscribe();
    let expired = fx.store.expire_leases(T0 + 3_600_000, 10).await.unwrap();
    assert_eq!(expired.len(), 1);
    let ended = StoreEvent::LeaseEnded {
        agent_id: worker.id,
        task_id: Some(leased.id),
        expired: Some(EndedLease {
            lease_id: expired[0].0.id,
            task_id: leased.id,
        }),
    };
    assert_eq!(wait_for(&mut heard_by_other, |e| *e == ended).await, ended);
    let later = submit(other.as_ref(), task("ns", 0, 1), T0).await;
    let seen = wait_for(&mut heard_by_self, |e| {
        *e == ended || matches!(e, StoreEvent::TaskQueued { task_id, .. } if *task_id == later.id)
    })
    .await;
    assert_ne!(seen, ended, "the sweeping replica heard its own lease end");
    other.close().await;
    fx.finish().await;
}

/// A replica notifies nobody while no other reads its events: its own
/// subscribers hear its changes at their commit, and every notification
/// took a transaction, a commit and a delivery for nobody. Another replica
/// that has started but reads nothing (no agent connected, no watcher) is
/// told nothing either; once it reads the dispatcher's events, it is told
/// every task queued. A session listening on the channel by another
/// statement than a replica's listener is not counted as a replica, and
/// hears what the replicas notify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_notifies_nobody_until_another_reads_its_events() {
    let fx = Fixture::postgres().await;
    let mut outsider = sqlx::postgres::PgListener::connect(&fx.url).await.unwrap();
    sqlx::Executor::execute(&mut outsider, "LISTEN switchyard_events")
        .await
        .unwrap();
    let alone = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    let other = fx.another_instance().await;
    // Following makes this replica count the others at once (it greets
    // them), not at its next count a second on.
    let _counted = fx.store.follow_tasks().await;
    let unread = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    let reading = other.follow_dispatch().await;
    let read = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    // Notifications arrive in commit order: the first is the one after the
    // other replica began to read.
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), outsider.recv())
        .await
        .expect("a notification within 20 s")
        .unwrap();
    let payload = first.payload();
    assert!(
        payload.contains(&read.id.to_string()),
        "the first notification: {payload}"
    );
    for (what, t) in [
        ("alone", &alone),
        ("beside a replica reading nothing", &unread),
    ] {
        assert!(
            !payload.contains(&t.id.to_string()),
            "the replica {what} notified its submit: {payload}"
        );
    }
    drop(reading);
    other.close().await;
    fx.finish().await;
}

/// A task's changes and output, which only watchers read, reach another
/// replica only while it follows them: it has told the others, and they
/// answered, before `follow_tasks` returns. Notifications arrive in the
/// order their changes committed, so whatever the other heard before the
/// next submit's is what it heard of the grant before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_change_reaches_another_replica_only_while_it_follows_tasks() {
    let fx = Fixture::postgres().await;
    let other = fx.another_instance().await;
    let _dispatching = other.follow_dispatch().await;
    let worker = agent(fx.store.as_ref(), "ns", "w1", 2).await;
    let mut heard = other.subscribe();
    let unwatched = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    grant(fx.store.as_ref(), unwatched.id, worker.id, T0).await;
    let next = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    let before = heard_until(
        &mut heard,
        |e| matches!(e, StoreEvent::TaskQueued { task_id, .. } if *task_id == next.id),
    )
    .await;
    assert!(
        before.iter().any(
            |e| matches!(e, StoreEvent::TaskQueued { task_id, .. } if *task_id == unwatched.id)
        ),
        "the other replica's dispatcher hears every submit: {before:?}"
    );
    assert!(
        !before
            .iter()
            .any(|e| matches!(e, StoreEvent::TaskChanged { .. })),
        "told of a task's change while following none: {before:?}"
    );

    let following = other.follow_tasks().await;
    grant_and_hear(fx.store.as_ref(), next.id, worker.id, &mut heard).await;
    drop(following);
    other.close().await;
    fx.finish().await;
}

/// Grants `task_id` to `worker` through `store`, and waits until `heard`
/// (another replica's) hears it leased.
async fn grant_and_hear(
    store: &dyn Store,
    task_id: uuid::Uuid,
    worker: uuid::Uuid,
    heard: &mut tokio::sync::broadcast::Receiver<StoreEvent>,
) {
    grant(store, task_id, worker, T0).await;
    let leased = StoreEvent::TaskChanged {
        task_id,
        state: TaskState::Leased,
    };
    assert_eq!(wait_for(heard, |e| *e == leased).await, leased);
}

/// A follower connection lost while followed (the database restarted, or
/// an operator ended it) is opened again and the others greeted again, so
/// a long-lived watcher (a console) is not left to its timers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_follower_connection_is_opened_again_while_followed() {
    let fx = Fixture::postgres().await;
    let other = fx.another_instance().await;
    let worker = agent(fx.store.as_ref(), "ns", "w1", 1).await;
    let _following = other.follow_tasks().await;
    let mut admin = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    let followers = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
        AND application_name LIKE 'switchyard-follower %'";
    let lost: Vec<i32> = sqlx::query_scalar(followers)
        .fetch_all(&mut admin)
        .await
        .unwrap();
    assert_eq!(lost.len(), 1, "one follower connection");
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(lost[0])
        .execute(&mut admin)
        .await
        .unwrap();
    let reopened = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            let now: Vec<i32> = sqlx::query_scalar(followers)
                .fetch_all(&mut admin)
                .await
                .unwrap();
            if now.len() == 1 && now[0] != lost[0] {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(reopened.is_ok(), "no follower connection opened again");
    // A second follower waits for the greeting that came with it.
    let _also = other.follow_tasks().await;
    let mut heard = other.subscribe();
    let t = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    grant_and_hear(fx.store.as_ref(), t.id, worker.id, &mut heard).await;
    other.close().await;
    fx.finish().await;
}

/// A listener of an earlier release (unnamed, listening on the events'
/// channel) reads every change, so a replica that counts one notifies a
/// task's changes as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_of_an_earlier_release_is_told_every_change() {
    let fx = Fixture::postgres().await;
    let mut earlier = sqlx::postgres::PgListener::connect(&fx.url).await.unwrap();
    earlier.listen("switchyard_events").await.unwrap();
    // Counted as it starts.
    let replica = fx.another_instance().await;
    let worker = agent(replica.as_ref(), "ns", "w1", 1).await;
    let t = submit(replica.as_ref(), task("ns", 0, 1), T0).await;
    grant(replica.as_ref(), t.id, worker.id, T0).await;
    let leased = format!(r#""task_id":"{}","state":"#, t.id);
    loop {
        let heard = tokio::time::timeout(std::time::Duration::from_secs(20), earlier.recv())
            .await
            .expect("a notification within 20 s")
            .unwrap();
        if heard.payload().contains(&leased) {
            break;
        }
    }
    replica.close().await;
    fx.finish().await;
}

/// A listener of the release before (named as a replica's, saying by a
/// connection of its own only whether it follows tasks' changes) read the
/// dispatcher's events always: a replica that counts one notifies the
/// tasks it queues, and no task's change while it does not follow them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_of_the_release_before_is_told_the_dispatchers_events() {
    let fx = Fixture::postgres().await;
    let options: sqlx::postgres::PgConnectOptions = fx.url.parse().unwrap();
    let name = format!("switchyard-listener {} v2", uuid::Uuid::now_v7());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.application_name(&name))
        .await
        .unwrap();
    let mut before = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    before.listen("switchyard_events").await.unwrap();
    // Following makes the replica count the others at once (it greets
    // them; the listener does not answer, so it waits its two seconds).
    let _following = fx.store.follow_tasks().await;
    let worker = agent(fx.store.as_ref(), "ns", "w1", 1).await;
    let first = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    grant(fx.store.as_ref(), first.id, worker.id, T0).await;
    let next = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    let mut heard = Vec::new();
    while !heard
        .last()
        .is_some_and(|payload: &String| payload.contains(&next.id.to_string()))
    {
        let notification = tokio::time::timeout(std::time::Duration::from_secs(20), before.recv())
            .await
            .expect("the next submit notified within 20 s")
            .unwrap();
        heard.push(notification.payload().to_owned());
    }
    assert!(
        heard.iter().any(|p| p.contains(&first.id.to_string())),
        "the first submit: {heard:?}"
    );
    assert!(
        !heard.iter().any(|p| p.contains("task_changed")),
        "told a task's change: {heard:?}"
    );
    fx.finish().await;
}

/// A task another transaction holds (another replica granting it, as two
/// replicas' dispatchers walk one queue) is refused to a grant as not
/// queued: the grant reads only the agents of the tasks it could lock, and
/// named the agent unknown (what the dispatcher's log then said).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_of_a_task_another_transaction_holds_is_refused_as_not_queued() {
    let fx = Fixture::postgres().await;
    let worker = agent(fx.store.as_ref(), "ns", "w1", 1).await;
    let t = submit(fx.store.as_ref(), task("ns", 0, 1), T0).await;
    let mut other = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    let mut holding = sqlx::Connection::begin(&mut other).await.unwrap();
    sqlx::query("SELECT id FROM tasks WHERE id = $1 FOR UPDATE")
        .bind(t.id)
        .execute(&mut *holding)
        .await
        .unwrap();
    let outcomes = fx
        .store
        .grant_leases(&[GrantRequest::one_slot(t.id, worker.id)], T0)
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [GrantOutcome::Refused(GrantRefusal::TaskNotQueued)]
    );
    holding.rollback().await.unwrap();
    grant(fx.store.as_ref(), t.id, worker.id, T0).await;
    fx.finish().await;
}

/// Two replicas contest one agent's two GPUs and its memory: eight loops
/// on two store instances each try every task with a claim of one device
/// (or of 10,000 MB of 32,000), in their own order, all at once. Each
/// device ends up held by exactly one lease, and exactly three memory
/// claims fit: never a device twice, never more memory than offered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_never_hand_out_one_device_twice() {
    const TASKS: usize = 40;
    let fx = Fixture::postgres().await;
    let a: Arc<dyn Store> = fx.store.clone();
    let b: Arc<dyn Store> = fx.another_instance().await;
    let gpu = gpu_agent(a.as_ref(), "ns", "contested", 100).await;
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        tasks.push(submit(a.as_ref(), task("ns", 0, 3), T0 + i as i64).await.id);
    }
    let mut loops = Vec::new();
    for (replica, store) in [a.clone(), b.clone()].into_iter().enumerate() {
        for seed in 0..4u64 {
            let store = store.clone();
            let mut order = tasks.clone();
            let mut rng = Lcg(seed * 17 + replica as u64 + 3);
            for i in (1..order.len()).rev() {
                order.swap(i, rng.next(i + 1));
            }
            loops.push(tokio::spawn(async move {
                let mut granted = 0;
                for (n, task_id) in order.into_iter().enumerate() {
                    let claim = match n % 3 {
                        0 => json!({"slots": 1, "gpus": ["GPU-0"]}),
                        1 => json!({"slots": 1, "gpus": ["GPU-1"]}),
                        _ => json!({"slots": 1, "memory_mb": 10000}),
                    };
                    let request = claiming(task_id, gpu.id, claim);
                    let outcome = store.grant_leases(&[request], T0 + 10_000).await.unwrap();
                    granted += usize::from(matches!(outcome[0], GrantOutcome::Granted(_)));
                }
                granted
            }));
        }
    }
    let mut granted = 0;
    for handle in loops {
        granted += handle.await.unwrap();
    }
    let held = b.live_claims(&[gpu.id]).await.unwrap();
    let claims = &held[&gpu.id];
    assert_eq!(claims.len(), granted);
    let mut devices: Vec<String> = claims.iter().flat_map(|(_, c)| c.gpus.clone()).collect();
    devices.sort();
    assert_eq!(
        devices,
        ["GPU-0", "GPU-1"],
        "each device held by exactly one lease"
    );
    let memory: Vec<u64> = claims
        .iter()
        .map(|(_, c)| c.memory_mb)
        .filter(|m| *m > 0)
        .collect();
    assert_eq!(
        memory,
        [10000, 10000, 10000],
        "three of 10,000 MB fit in 32,000"
    );
    let tasks_held: HashSet<_> = claims.iter().map(|(t, _)| *t).collect();
    assert_eq!(tasks_held.len(), granted, "no task leased twice");
    b.close().await;
    fx.finish().await;
}

/// The warm-up calls the submit function as the latest migration defines
/// it. A migration that changed the function's arguments would otherwise
/// leave every replica's fresh connections cold with nothing but a
/// warning at start; without the function, the warm-up fails.
#[tokio::test]
async fn the_pool_warm_up_fits_the_migrated_schema() {
    let fx = Fixture::postgres().await;
    let store = PgStore::open(&fx.url, StoreOptions::default())
        .await
        .unwrap();
    assert_eq!(store.warm().await.unwrap(), 8 + 4);
    // The warm-up's own submits were rolled back: no task of any state.
    assert_eq!(store.count_tasks().await.unwrap(), Vec::new());

    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    // The latest function (0018's); those before stay for replicas of the
    // releases before, and the warm-up must not fall back on them.
    sqlx::query(
        "DROP FUNCTION switchyard_submit_tasks(uuid[], text[], text[], text[], text[], int4[], \
         int8[], int8[], text[], int8[], text[], uuid[], uuid[], text[], int8[], int8[], int8[], text[], \
         int8[], int8[], text[], int8)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    let err = store.warm().await.unwrap_err().to_string();
    assert!(err.contains("warming a connection"), "{err}");
    store.close().await;
    fx.finish().await;
}
