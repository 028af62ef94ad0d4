//! Fair share in the queue's order: tasks with fairness keys take turns by
//! weight within their priority, a new key's first task waits behind about
//! one task of each key rather than behind a backlog, a retried task keeps
//! its place, and tasks without a key keep their submit order.

use switchyard_server::model::{Fairness, NewTask, QueueCursor, TaskRecord};
use switchyard_server::store::Store;
use uuid::Uuid;

use crate::common::{Fixture, T0, submit, task};

crate::both_backends!(
    keyed_tasks_take_turns_by_weight,
    a_new_key_waits_behind_one_task_of_each_key_not_a_backlog,
);

fn keyed(key: &str, weight: u32) -> NewTask {
    NewTask {
        fairness: Some(Fairness {
            key: key.to_owned(),
            weight,
        }),
        ..task("ns", 0, 3)
    }
}

/// The whole queue, in the order the dispatcher walks it, page by page.
async fn queue(store: &dyn Store, now_ms: i64) -> Vec<TaskRecord> {
    let mut all = Vec::new();
    let mut after: Option<QueueCursor> = None;
    loop {
        let page = store
            .queued_tasks(None, now_ms, after.as_ref(), &[], 3)
            .await
            .unwrap();
        let Some(last) = page.last() else {
            return all;
        };
        after = Some(QueueCursor::after(last));
        all.extend(page);
    }
}

async fn keyed_tasks_take_turns_by_weight(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let mut a = Vec::new();
    for i in 0..6 {
        a.push(submit(store, keyed("a", 1), T0 + i).await.id);
    }
    let mut b = Vec::new();
    for i in 0..3 {
        b.push(submit(store, keyed("b", 2), T0 + 10 + i).await.id);
    }
    let c = submit(store, keyed("c", 1), T0 + 20).await.id;
    let plain = submit(store, task("ns", 0, 3), T0 + 30).await.id;
    let urgent = submit(store, keyed("a", 1), T0 + 40);
    let urgent = urgent.await;
    let mut high = task("ns", 5, 3);
    high.fairness = urgent.fairness.clone();
    let high = submit(store, high, T0 + 50).await.id;

    let order: Vec<Uuid> = queue(store, T0 + 100).await.iter().map(|t| t.id).collect();
    // Priority first; within it the keys' turns: a key of weight 2 takes two
    // places for every one of a key of weight 1; the task without a key at
    // its submit time; the seventh task of `a` after the sixth.
    let want = vec![
        high, a[0], b[0], c, plain, b[1], a[1], b[2], a[2], a[3], a[4], a[5], urgent.id,
    ];
    assert_eq!(order, want);
    assert_eq!(
        store.get_task(a[1]).await.unwrap().fairness,
        Some(Fairness {
            key: "a".to_owned(),
            weight: 1
        })
    );
}

async fn a_new_key_waits_behind_one_task_of_each_key_not_a_backlog(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    // A backlog of one key, submitted in batches as a flood arrives.
    let flood: Vec<_> = (0..2_000).map(|_| keyed("flood", 1)).collect();
    for (i, chunk) in flood.chunks(500).enumerate() {
        let submissions: Vec<_> = chunk
            .iter()
            .cloned()
            .map(|task| switchyard_server::model::Submission {
                task,
                agent_id: None,
            })
            .collect();
        let done = store
            .submit_many(&submissions, T0 + i64::try_from(i).unwrap())
            .await
            .unwrap();
        assert!(done.iter().all(Result::is_ok));
    }
    // Another key's tasks, half a minute later.
    let mut late = Vec::new();
    for i in 0..10 {
        late.push(submit(store, keyed("late", 1), T0 + 30_000 + i).await.id);
    }
    let order: Vec<Uuid> = store
        .queued_tasks(None, T0 + 70_000, None, &[], 40)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    let places: Vec<usize> = late
        .iter()
        .map(|id| {
            order
                .iter()
                .position(|o| o == id)
                .expect("late task near the head")
        })
        .collect();
    // Every other place: the keys take turns from the head.
    assert_eq!(places, (0..10).map(|i| 2 * i + 1).collect::<Vec<_>>());

    // An hour later the backlog still waits (no agent); a newcomer is
    // behind at most a minute's worth of its turns, not the backlog.
    let hour = T0 + 3_600_000;
    let newcomer = submit(store, keyed("newcomer", 1), hour).await.id;
    let order: Vec<Uuid> = store
        .queued_tasks(None, hour, None, &[], 200)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    let place = order
        .iter()
        .position(|o| *o == newcomer)
        .expect("near the head");
    assert!(
        place <= 2 * 60 + 2,
        "the newcomer waits behind {place} tasks"
    );
}
