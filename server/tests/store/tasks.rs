//! Submitting, reading, listing and ordering tasks; idempotent submit;
//! group-committed submits; close and reopen with nothing lost.

use serde_json::json;
use switchyard_server::error::Error;
use switchyard_server::model::{
    Completion, CompletionOutcome, Deadlines, Fairness, GrantOutcome, GrantRefusal, Page,
    ParkedPlacement, QueueCursor, RetryPolicy, StoreEvent, Submission, TaskFilter, TaskRecord,
    TaskState,
};
use uuid::Uuid;

use crate::common::{Fixture, T0, TestStore, agent, grant, submit, submit_tasks, task, tasks_in};

crate::both_backends!(
    submit_get_and_history,
    a_task_reads_back_the_same_whichever_way_it_was_inserted,
    idempotent_submit,
    priority_then_fifo_and_not_before,
    the_queue_walk_leaves_out_parked_placements,
    the_queue_goes_on_past_parked_placements_where_a_page_would,
    past_a_thousand_placements_the_queue_is_read_as_a_page_would,
    list_tasks_filters_and_pages,
    close_and_reopen_loses_nothing,
    submit_many_answers_each_submit_in_one_commit,
    a_batch_with_no_agent_reserved_is_answered_as_any_batch,
    count_tasks_counts_live_tasks_by_namespace_and_state,
    a_schema_migrated_by_a_newer_release_still_opens,
    a_submit_writes_no_history_row_yet_its_history_starts_submitted,
    a_history_an_earlier_release_began_reads_the_same,
    a_task_submitted_alone_for_an_agent_is_leased_as_in_a_batch,
);

/// A submit of one task (PostgreSQL answers it with a statement of its
/// own) is leased on the way in exactly as a batch's task is: while its
/// agent has room, with fencing token 1, its lease stored as answered and
/// its `leased` entry; refused at capacity and for an unknown agent,
/// queued then; a taken idempotency key inserts nothing.
async fn a_task_submitted_alone_for_an_agent_is_leased_as_in_a_batch(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 2).await;
    let alone = |agent_id: Option<Uuid>, key: Option<&str>| {
        let mut t = task("ns", 0, 3);
        t.lease_ttl_ms = 30_000;
        t.idempotency_key = key.map(str::to_owned);
        vec![Submission { task: t, agent_id }]
    };
    let mut answers = Vec::new();
    for (i, (agent_id, key)) in [
        (Some(worker.id), Some("first")),
        (Some(worker.id), None),
        (Some(worker.id), None),
        (Some(Uuid::now_v7()), None),
        (None, Some("first")),
        (None, None),
    ]
    .into_iter()
    .enumerate()
    {
        let now = T0 + 10 * i as i64;
        let mut done = store.submit_many(&alone(agent_id, key), now).await.unwrap();
        assert_eq!(done.len(), 1);
        answers.push(done.remove(0).unwrap());
    }
    for (i, (task, created, outcome)) in answers.iter().enumerate().take(2) {
        assert!(*created);
        assert_eq!(task.state, TaskState::Leased);
        let Some(GrantOutcome::Granted(lease)) = outcome else {
            panic!("submit {i}: expected a lease, got {outcome:?}");
        };
        let stored = store.get_lease(lease.id).await.unwrap();
        assert_eq!(&stored, lease);
        assert_eq!(
            (stored.task_id, stored.agent_id, stored.fencing_token),
            (task.id, worker.id, 1)
        );
        assert_eq!(stored.expires_at_ms, T0 + 10 * i as i64 + 30_000);
        let read = store.get_task(task.id).await.unwrap();
        assert_eq!(
            (read.state, read.lease_id, read.agent_id, read.fencing_token),
            (TaskState::Leased, Some(lease.id), Some(worker.id), 1)
        );
        let history = store.task_events(task.id, 0, 10).await.unwrap();
        let kinds: Vec<_> = history.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["submitted", "leased"]);
        assert_eq!(history[1].lease_id, Some(lease.id));
    }
    for (i, refusal) in [
        (2, GrantRefusal::AgentAtCapacity),
        (3, GrantRefusal::AgentUnknown),
    ] {
        let (task, created, outcome) = &answers[i];
        assert!(*created);
        assert_eq!(outcome, &Some(GrantOutcome::Refused(refusal)), "submit {i}");
        let read = store.get_task(task.id).await.unwrap();
        assert_eq!((read.state, read.lease_id), (TaskState::Queued, None));
    }
    let (again, created, outcome) = &answers[4];
    assert!(!*created && outcome.is_none());
    assert_eq!(again.id, answers[0].0.id);
    let (plain, created, outcome) = &answers[5];
    assert!(*created && outcome.is_none());
    assert_eq!(plain.state, TaskState::Queued);
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 2);
}

/// A task submitted by a release that wrote its `submitted` row: the row
/// is read, not a second entry beside it, and what follows is numbered
/// after it.
async fn a_history_an_earlier_release_began_reads_the_same(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w", 1).await;
    let old = submit(store, task("ns", 0, 3), T0).await;
    let insert = "INSERT INTO task_events (task_id, sequence, kind, state, message, \
                  occurred_at_ms) VALUES ($1, 1, 'submitted', 'queued', 'submitted', $2)";
    crate::on_database!(&fx.url, |pool| {
        let query = sqlx::query(insert).bind(old.id).bind(T0);
        query.execute(&pool).await.unwrap();
    });
    assert_eq!(history_rows(fx, old.id).await, 1);
    grant(store, old.id, worker.id, T0 + 10).await;
    let history = store.task_events(old.id, 0, 100).await.unwrap();
    let read: Vec<_> = history
        .iter()
        .map(|e| (e.sequence, e.kind.as_str(), e.occurred_at_ms))
        .collect();
    assert_eq!(read, [(1, "submitted", T0), (2, "leased", T0 + 10)]);
}

/// How many history rows `task_id` has in the database.
async fn history_rows(fx: &Fixture, task_id: Uuid) -> i64 {
    let count = "SELECT COUNT(*) FROM task_events WHERE task_id = $1";
    crate::on_database!(&fx.url, |pool| {
        let n: i64 = sqlx::query_scalar(count)
            .bind(task_id)
            .fetch_one(&pool)
            .await
            .unwrap();
        n
    })
}

/// A submit writes the task's row and no history row: its `submitted`
/// entry (sequence 1, queued, at its creation time, by no agent) is read
/// from the row, whichever way the task was inserted (plainly, by
/// idempotency key, leased on the way in); every later entry is numbered
/// after it, and a page after it leaves it out.
async fn a_submit_writes_no_history_row_yet_its_history_starts_submitted(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w", 2).await;
    let plain = submit(store, task("ns", 0, 3), T0).await;
    let mut keyed = task("ns", 0, 3);
    keyed.idempotency_key = Some("once".to_owned());
    let keyed = submit(store, keyed, T0 + 1).await;
    let reserved = Submission {
        task: task("ns", 0, 3),
        agent_id: Some(worker.id),
    };
    let done = store.submit_many(&[reserved], T0 + 2).await.unwrap();
    let (leased, _, grant_outcome) = done.into_iter().next().unwrap().unwrap();
    assert!(matches!(grant_outcome, Some(GrantOutcome::Granted(_))));
    assert_eq!(
        [
            history_rows(fx, plain.id).await,
            history_rows(fx, keyed.id).await,
            history_rows(fx, leased.id).await,
        ],
        [0, 0, 1],
        "history rows of a plain, a keyed and a leased-on-the-way-in submit"
    );

    for (task, at) in [(&plain, T0), (&keyed, T0 + 1), (&leased, T0 + 2)] {
        let first = &store.task_events(task.id, 0, 1).await.unwrap()[0];
        assert_eq!(
            (
                first.sequence,
                first.kind.as_str(),
                first.state,
                first.message.as_str()
            ),
            (1, "submitted", TaskState::Queued, "submitted"),
        );
        assert_eq!(
            (first.agent_id, first.lease_id, first.occurred_at_ms),
            (None, None, at)
        );
    }

    grant(store, plain.id, worker.id, T0 + 10).await;
    for task in [&plain, &leased] {
        let history = store.task_events(task.id, 0, 100).await.unwrap();
        let read: Vec<_> = history
            .iter()
            .map(|e| (e.sequence, e.kind.as_str(), e.agent_id))
            .collect();
        assert_eq!(
            read,
            [(1, "submitted", None), (2, "leased", Some(worker.id))]
        );
        let after = store.task_events(task.id, 1, 100).await.unwrap();
        assert_eq!(after, history[1..]);
    }
    let unknown = store.task_events(Uuid::now_v7(), 0, 100).await.unwrap();
    assert!(unknown.is_empty(), "{unknown:?}");
}

/// A binary rolled back after an upgrade (or an old replica restarting
/// mid-upgrade) finds migrations it does not know in the schema's history:
/// it starts and serves instead of refusing them (migrations are additive).
async fn a_schema_migrated_by_a_newer_release_still_opens(fx: &mut Fixture) {
    let insert = "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
                  execution_time) VALUES (99999, 'from a newer release', TRUE, $1, 0)";
    crate::on_database!(&fx.url, |pool| {
        let query = sqlx::query(insert).bind(vec![0_u8]);
        query.execute(&pool).await.unwrap();
    });
    fx.store.migrate().await.unwrap();
    fx.reopen().await;
    let task = submit(fx.store.as_ref(), task("ns", 0, 3), T0).await;
    assert_eq!(fx.store.get_task(task.id).await.unwrap(), task);
}

/// The metrics gauge's counts: queued, leased and running tasks per
/// namespace; finished tasks are not counted, and a state with none is
/// absent.
async fn count_tasks_counts_live_tasks_by_namespace_and_state(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "a", "w", 4).await;
    let ids = submit_tasks(store, "a", 4).await;
    submit(store, task("b", 0, 3), T0).await;
    grant(store, ids[0], worker.id, T0 + 10).await;
    let running = grant(store, ids[1], worker.id, T0 + 10).await;
    store
        .report_started(running.id, ids[1], worker.id, 1, T0 + 11)
        .await
        .unwrap();
    let done = grant(store, ids[2], worker.id, T0 + 10).await;
    store
        .complete_leases(
            &[Completion {
                lease_id: done.id,
                task_id: ids[2],
                agent_id: worker.id,
                fencing_token: done.fencing_token,
                outcome: CompletionOutcome::Succeeded { result: json!({}) },
            }],
            T0 + 12,
        )
        .await
        .unwrap();
    let mut counts = store.count_tasks().await.unwrap();
    counts.sort_by(|x, y| (&x.0, x.1.as_str()).cmp(&(&y.0, y.1.as_str())));
    assert_eq!(
        counts,
        [
            ("a".to_owned(), TaskState::Leased, 1),
            ("a".to_owned(), TaskState::Queued, 1),
            ("a".to_owned(), TaskState::Running, 1),
            ("b".to_owned(), TaskState::Queued, 1),
        ]
    );
}

/// One batch: plain submits, one leased on the way in, one refused by the
/// store, one refused a lease (the agent is full), and an idempotency key
/// used twice in the batch. Each is answered as if submitted alone.
async fn submit_many_answers_each_submit_in_one_commit(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 1).await;
    let keyed = |key: &str| {
        let mut t = task("ns", 0, 3);
        t.idempotency_key = Some(key.to_owned());
        t
    };
    let mut refused = task("ns", 0, 3);
    refused.max_attempts = 0;
    let batch = vec![
        Submission {
            task: task("ns", 0, 3),
            agent_id: None,
        },
        Submission {
            task: task("ns", 0, 3),
            agent_id: Some(worker.id),
        },
        Submission {
            task: refused,
            agent_id: None,
        },
        Submission {
            task: task("ns", 0, 3),
            agent_id: Some(worker.id),
        },
        Submission {
            task: keyed("k1"),
            agent_id: None,
        },
        Submission {
            task: keyed("k1"),
            agent_id: None,
        },
    ];
    let mut events = store.subscribe();
    let results = store.submit_many(&batch, T0).await.unwrap();
    assert_eq!(results.len(), 6);

    let (plain, created, grant) = results[0].as_ref().unwrap();
    assert!(*created && grant.is_none());
    assert_eq!(plain.state, TaskState::Queued);

    let (leased, created, grant) = results[1].as_ref().unwrap();
    assert!(*created);
    assert_eq!(leased.state, TaskState::Leased);
    let Some(GrantOutcome::Granted(lease)) = grant else {
        panic!("expected a lease, got {grant:?}");
    };
    assert_eq!((lease.task_id, lease.agent_id), (leased.id, worker.id));

    assert!(
        matches!(
            &results[2],
            Err(Error::Invalid { field, .. }) if field == "max_attempts"
        ),
        "{:?}",
        results[2]
    );

    let (full, created, grant) = results[3].as_ref().unwrap();
    assert!(*created);
    assert_eq!(full.state, TaskState::Queued);
    assert_eq!(
        grant,
        &Some(GrantOutcome::Refused(GrantRefusal::AgentAtCapacity))
    );

    let (first, created_first, _) = results[4].as_ref().unwrap();
    let (again, created_again, _) = results[5].as_ref().unwrap();
    assert!(*created_first && !*created_again);
    assert_eq!(first.id, again.id);

    // Each answer is the task as stored.
    for result in results.iter().flatten() {
        assert_eq!(store.get_task(result.0.id).await.unwrap(), result.0);
    }
    // Stored as answered: four tasks, one of them leased.
    let listed = tasks_in(store, "ns").await;
    assert_eq!(listed.len(), 4);
    assert_eq!(
        listed
            .iter()
            .filter(|t| t.state == TaskState::Leased)
            .count(),
        1
    );
    let history = store.task_events(leased.id, 0, 100).await.unwrap();
    let kinds: Vec<&str> = history.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["submitted", "leased"]);

    // The submits are announced to the other replicas only (the one that
    // took them notes them itself): this store's subscribers hear none of
    // them before the cancel that follows.
    store.cancel_task(plain.id, "test", None, T0).await.unwrap();
    let heard = crate::events::heard_until(
        &mut events,
        |e| matches!(e, StoreEvent::TaskChanged { task_id, .. } if *task_id == plain.id),
    )
    .await;
    assert!(!crate::events::any_queued(&heard), "{heard:?}");
}

async fn submit_get_and_history(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let (created, fresh) = store.submit_task(task("ns", 3, 2), T0).await.unwrap();
    assert!(fresh);
    assert_eq!(created.id.get_version_num(), 7);
    assert_eq!(created.state, TaskState::Queued);
    assert_eq!(created.attempts, 0);
    assert_eq!(created.fencing_token, 0);
    assert_eq!(created.not_before_ms, T0);
    assert_eq!(created.created_at_ms, T0);
    assert_eq!(created.payload, json!({"cmd": "true"}));
    assert_eq!(
        created.labels.get("team").map(String::as_str),
        Some("infra")
    );
    assert_eq!(store.get_task(created.id).await.unwrap(), created);

    let events = store.task_events(created.id, 0, 100).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].sequence, 1);
    assert_eq!(events[0].kind, "submitted");
    assert_eq!(events[0].state, TaskState::Queued);

    let mut no_attempts = task("ns", 0, 0);
    no_attempts.lease_ttl_ms = 1;
    let invalid = store.submit_task(no_attempts, T0).await.unwrap_err();
    assert!(
        matches!(
            invalid,
            Error::Invalid { ref field, .. } if field == "max_attempts"
        ),
        "{invalid:?}"
    );

    let missing = store.get_task(Uuid::now_v7()).await.unwrap_err();
    assert!(
        matches!(missing, Error::NotFound { what: "task", .. }),
        "{missing:?}"
    );
}

/// A batch none of whose submits has an agent reserved (on PostgreSQL one
/// plain insert, migration 0023): each submit answered as in any batch:
/// queued and not leased, one refused by the store, an idempotency key
/// used twice in the batch and one taken before it, fairness kept.
async fn a_batch_with_no_agent_reserved_is_answered_as_any_batch(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let keyed = |key: &str| {
        let mut t = task("ns", 0, 3);
        t.idempotency_key = Some(key.to_owned());
        t
    };
    let (taken, _) = store.submit_task(keyed("taken"), T0).await.unwrap();
    let mut refused = task("ns", 0, 3);
    refused.max_attempts = 0;
    let mut fair = task("ns", 2, 3);
    fair.fairness = Some(Fairness {
        key: "tenant-a".to_owned(),
        weight: 3,
    });
    let batch = [
        task("ns", 0, 3),
        refused,
        keyed("k1"),
        keyed("k1"),
        keyed("taken"),
        fair,
    ]
    .map(|task| Submission {
        task,
        agent_id: None,
    });
    let results = store.submit_many(&batch, T0 + 1).await.unwrap();
    assert_eq!(results.len(), 6);
    assert!(
        matches!(&results[1], Err(Error::Invalid { field, .. }) if field == "max_attempts"),
        "{:?}",
        results[1]
    );
    let answered: Vec<(&TaskRecord, bool)> = [0, 2, 3, 4, 5]
        .map(|i| {
            let (record, created, grant) = results[i].as_ref().unwrap();
            assert!(grant.is_none(), "{i}: {grant:?}");
            assert_eq!(record.state, TaskState::Queued, "{i}");
            (record, *created)
        })
        .to_vec();
    let created: Vec<bool> = answered.iter().map(|(_, c)| *c).collect();
    assert_eq!(created, [true, true, false, false, true]);
    assert_eq!(answered[1].0.id, answered[2].0.id);
    assert_eq!(answered[3].0.id, taken.id);
    assert_eq!(
        answered[4].0.fairness,
        Some(Fairness {
            key: "tenant-a".to_owned(),
            weight: 3
        })
    );
    for (record, _) in &answered {
        assert_eq!(&store.get_task(record.id).await.unwrap(), *record);
    }
    // Stored as answered: the one taken before, and three of the batch.
    let listed = tasks_in(store, "ns").await;
    assert_eq!(listed.len(), 4);
}

/// SQLite inserts a batch's tasks without an idempotency key in one
/// statement and the others one by one: every field reads back the same
/// either way (and on PostgreSQL, which inserts both alike).
async fn a_task_reads_back_the_same_whichever_way_it_was_inserted(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let mut full = task("ns", 7, 3);
    full.payload = json!({"cmd": "echo \"é\" \\", "n": 9_007_199_254_740_993_u64, "f": 0.5, "nested": [null, true]});
    full.placement = json!({"required_tags": ["gpu"], "prefer": {"zone": "b"}});
    full.retry = Some(RetryPolicy {
        initial_backoff_ms: 250,
        max_backoff_ms: 8_000,
        multiplier: 1.5,
        jitter: 0.25,
    });
    full.deadlines = Deadlines {
        start_timeout_ms: Some(60_000),
        execution_timeout_ms: Some(120_000),
        cancel_grace_ms: Some(5_000),
    };
    full.concurrency_key = Some("db-migrations".to_owned());
    full.lease_ttl_ms = 12_345;
    full.not_before_ms = Some(T0 + 1_000);
    full.labels
        .insert("quote".to_owned(), "it's \"here\"".to_owned());
    let mut keyed = full.clone();
    keyed.idempotency_key = Some("one".to_owned());
    let batch = [full, keyed].map(|task| Submission {
        task,
        agent_id: None,
    });
    let results = store.submit_many(&batch, T0).await.unwrap();
    let [Ok((plain, true, None)), Ok((by_key, true, None))] = results.as_slice() else {
        panic!("{results:?}");
    };
    for record in [plain, by_key] {
        assert_eq!(&store.get_task(record.id).await.unwrap(), record);
        let events = store.task_events(record.id, 0, 10).await.unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].kind, "submitted");
    }
    assert_eq!(plain.payload, batch[0].task.payload);
    assert_eq!(plain.placement, batch[0].task.placement);
    assert_eq!(plain.labels, batch[0].task.labels);
    let same = TaskRecord {
        id: plain.id,
        idempotency_key: None,
        ..by_key.clone()
    };
    assert_eq!(plain, &same);
}

async fn idempotent_submit(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let mut keyed = task("ns", 0, 1);
    keyed.idempotency_key = Some("order-42".to_owned());
    let (first, created) = store.submit_task(keyed.clone(), T0).await.unwrap();
    assert!(created);
    let (again, created) = store.submit_task(keyed.clone(), T0 + 5).await.unwrap();
    assert!(!created);
    assert_eq!(again.id, first.id);
    // The same key in another namespace is another task.
    let mut other_ns = keyed.clone();
    other_ns.namespace = "other".to_owned();
    let (other, created) = store.submit_task(other_ns, T0).await.unwrap();
    assert!(created);
    assert_ne!(other.id, first.id);
    // Still one history entry: the repeat changed nothing.
    assert_eq!(store.task_events(first.id, 0, 10).await.unwrap().len(), 1);
}

async fn priority_then_fifo_and_not_before(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let low_a = submit(store, task("ns", 1, 1), T0).await;
    let high = submit(store, task("ns", 9, 1), T0 + 1).await;
    let low_b = submit(store, task("ns", 1, 1), T0 + 2).await;
    let mut later = task("ns", 100, 1);
    later.not_before_ms = Some(T0 + 60_000);
    let delayed = submit(store, later, T0 + 3).await;
    let _elsewhere = submit(store, task("other", 50, 1), T0 + 4).await;

    let ids = |tasks: Vec<switchyard_server::model::TaskRecord>| {
        tasks.into_iter().map(|t| t.id).collect::<Vec<_>>()
    };
    let queued = store
        .queued_tasks(Some("ns"), T0 + 10, None, &[], 10)
        .await
        .unwrap();
    assert_eq!(ids(queued), vec![high.id, low_a.id, low_b.id]);
    let queued = store
        .queued_tasks(Some("ns"), T0 + 60_000, None, &[], 10)
        .await
        .unwrap();
    assert_eq!(ids(queued), vec![delayed.id, high.id, low_a.id, low_b.id]);
    assert_eq!(
        store
            .queued_tasks(None, T0 + 10, None, &[], 10)
            .await
            .unwrap()
            .len(),
        4
    );

    // A high-priority task no agent takes does not hide the others: the
    // candidate list keeps offering them, and a lower one can be granted.
    let worker = agent(store, "ns", "w1", 1).await;
    grant(store, low_a.id, worker.id, T0 + 20).await;
    let queued = store
        .queued_tasks(Some("ns"), T0 + 20, None, &[], 10)
        .await
        .unwrap();
    assert_eq!(ids(queued), vec![high.id, low_b.id]);

    // The queue can be walked page by page from a cursor, in the same order.
    let first = store
        .queued_tasks(Some("ns"), T0 + 60_000, None, &[], 2)
        .await
        .unwrap();
    assert_eq!(ids(first.clone()), vec![delayed.id, high.id]);
    let cursor = QueueCursor::after(first.last().unwrap());
    let rest = store
        .queued_tasks(Some("ns"), T0 + 60_000, Some(&cursor), &[], 2)
        .await
        .unwrap();
    assert_eq!(ids(rest), vec![low_b.id]);

    // One task at a time, through priorities and submit-time ties (two
    // more submitted in the same millisecond), the walk sees the whole
    // queue in order, each task once.
    submit(store, task("ns", 1, 1), T0 + 2).await;
    submit(store, task("ns", 1, 1), T0 + 2).await;
    let whole = ids(store
        .queued_tasks(Some("ns"), T0 + 60_000, None, &[], 100)
        .await
        .unwrap());
    assert_eq!(whole.len(), 5);
    let walked = walk_queue(store, Some("ns"), T0 + 60_000, &[], 1).await;
    assert_eq!(walked, whole);
}

/// The ids of the whole queue, read page by page from the head as the
/// dispatcher walks it.
async fn walk_queue(
    store: &dyn switchyard_server::store::Store,
    namespace: Option<&str>,
    now_ms: i64,
    parked: &[ParkedPlacement],
    page: u32,
) -> Vec<Uuid> {
    let mut walked = Vec::new();
    let mut cursor: Option<QueueCursor> = None;
    loop {
        let tasks = store
            .queued_tasks(namespace, now_ms, cursor.as_ref(), parked, page)
            .await
            .unwrap();
        let Some(last) = tasks.last() else { break };
        cursor = Some(QueueCursor::after(last));
        walked.extend(tasks.into_iter().map(|t| t.id));
    }
    walked
}

/// A task's placement as the dispatcher names it when none of its agents
/// can run it.
fn parked_key(t: &TaskRecord) -> ParkedPlacement {
    ParkedPlacement {
        namespace: t.namespace.clone(),
        kind: t.kind.clone(),
        placement: t.placement.to_string(),
    }
}

/// The dispatcher names the placements no agent of its own can run, as the
/// store gave them back; every page of the walk, from the head or from a
/// cursor, leaves out exactly the queued tasks of those placements in
/// those namespaces and of those kinds.
async fn the_queue_walk_leaves_out_parked_placements(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let placed = |ns: &str, priority: i32, placement: serde_json::Value| {
        let mut t = task(ns, priority, 1);
        t.placement = placement;
        t
    };
    let gpu = json!({"required_tags": ["gpu"]});
    let big = json!({"required_tags": ["linux"], "requirements": [
        {"key": "memory.total", "operator": "gte", "values": [16384.5, "x", {"b": 1, "a": [true, null]}]}
    ]});
    let mut all = Vec::new();
    for i in 0..4 {
        all.push(submit(store, placed("ns", 5 - i, gpu.clone()), T0 + i64::from(i)).await);
        all.push(submit(store, placed("ns", 5 - i, big.clone()), T0 + i64::from(i)).await);
        all.push(submit(store, task("ns", 5 - i, 1), T0 + i64::from(i)).await);
        all.push(
            submit(
                store,
                placed("other", 5 - i, gpu.clone()),
                T0 + i64::from(i),
            )
            .await,
        );
        // The gpu placement for another kind: a placement of its own.
        let mut build = placed("ns", 5 - i, gpu.clone());
        build.kind = "build".to_owned();
        all.push(submit(store, build, T0 + i64::from(i)).await);
    }
    // gpu in `ns` and the big placement in `ns`, both of kind exec, named
    // from the tasks read.
    let parked = [parked_key(&all[0]), parked_key(&all[1])];
    let expected: Vec<Uuid> = all
        .iter()
        .filter(|t| !parked.contains(&parked_key(t)))
        .map(|t| t.id)
        .collect();
    assert_eq!(expected.len(), 12);
    let whole: Vec<Uuid> = store
        .queued_tasks(None, T0 + 10, None, &parked, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    let mut sorted = whole.clone();
    sorted.sort();
    let mut want = expected.clone();
    want.sort();
    assert_eq!(sorted, want);
    // Page by page, through the priorities, the same tasks in the same order.
    assert_eq!(walk_queue(store, None, T0 + 10, &parked, 3).await, whole);
    // Nothing parked: every task.
    assert_eq!(
        store
            .queued_tasks(None, T0 + 10, None, &[], 100)
            .await
            .unwrap()
            .len(),
        20
    );
}

/// Where the first task that is not parked is, found without reading the
/// parked ones (by placement group on PostgreSQL): from the head and from
/// a cursor at every task of the queue, the place a page would start at,
/// through the priorities, past tasks not yet due; nothing when every due
/// task left is parked.
async fn the_queue_goes_on_past_parked_placements_where_a_page_would(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let placed = |ns: &str, priority: i32, placement: &serde_json::Value| {
        let mut t = task(ns, priority, 1);
        t.placement = placement.clone();
        t
    };
    let gpu = json!({"required_tags": ["gpu"]});
    // Keys out of order and nested: the store's JSON spells it otherwise.
    let big = json!({"requirements": [
        {"values": [16384.5, "x", {"b": 1, "a": [true, null]}], "operator": "gte", "key": "memory.total"}
    ], "required_tags": ["linux"]});
    let mut all = Vec::new();
    for i in 0..3 {
        let at = T0 + i64::from(i);
        for _ in 0..3 {
            all.push(submit(store, placed("ns", 9 - i, &gpu), at).await);
            all.push(submit(store, placed("ns", 9 - i, &big), at).await);
        }
        all.push(submit(store, task("ns", 5 - i, 1), at).await);
        all.push(submit(store, placed("other", 5 - i, &gpu), at).await);
        let mut build = placed("ns", 9 - i, &gpu);
        build.kind = "build".to_owned();
        all.push(submit(store, build, at).await);
        let mut later = task("ns", 9, 1);
        later.not_before_ms = Some(T0 + 60_000);
        all.push(submit(store, later, at).await);
    }
    let parked = [parked_key(&all[0]), parked_key(&all[1])];
    let now = T0 + 10;
    let queue = store.queued_tasks(None, now, None, &[], 100).await.unwrap();
    assert_eq!(queue.len(), 27);
    let cursors = std::iter::once(None).chain(queue.iter().map(|t| Some(QueueCursor::after(t))));
    let mut found = 0;
    for cursor in cursors {
        let page = store
            .queued_tasks(None, now, cursor.as_ref(), &parked, 1)
            .await
            .unwrap();
        let want = page.first().map(QueueCursor::after);
        let got = store
            .first_unparked(now, cursor.as_ref(), &parked)
            .await
            .unwrap();
        assert_eq!(got, want, "after {cursor:?}");
        found += usize::from(got.is_some());
    }
    // The head is parked: the first task not parked is the other kind's.
    assert_eq!(
        store.first_unparked(now, None, &parked).await.unwrap(),
        Some(QueueCursor::after(&all[8]))
    );
    // Found from every cursor up to the last task not parked.
    let last_unparked = queue.iter().rposition(|t| !parked.contains(&parked_key(t)));
    assert_eq!(Some(found), last_unparked.map(|i| i + 1));
    // Nothing parked: the head itself.
    assert_eq!(
        store.first_unparked(now, None, &[]).await.unwrap(),
        Some(QueueCursor::after(&queue[0]))
    );
    // Every placement parked: nothing.
    let everything: Vec<ParkedPlacement> = all.iter().map(parked_key).collect();
    assert_eq!(
        store.first_unparked(now, None, &everything).await.unwrap(),
        None
    );
}

/// A queue of more placements than are worth taking one by one (1,024 on
/// PostgreSQL) is read down to the first task that is not parked, as a
/// page would: the same place, parked tasks ahead of it or not.
async fn past_a_thousand_placements_the_queue_is_read_as_a_page_would(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let mut batch = Vec::new();
    for i in 0..1_100 {
        let mut t = task("ns", if i < 1_050 { 5 } else { 1 }, 1);
        t.placement = json!({"required_tags": [format!("slot-{i}")]});
        batch.push(Submission {
            task: t,
            agent_id: None,
        });
    }
    let all: Vec<TaskRecord> = store
        .submit_many(&batch, T0)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.unwrap().0)
        .collect();
    // The first 1,050 (priority 5) parked: the first of priority 1 next.
    let parked: Vec<ParkedPlacement> = all[..1_050].iter().map(parked_key).collect();
    let now = T0 + 10;
    let want = store
        .queued_tasks(None, now, None, &parked, 1)
        .await
        .unwrap();
    assert_eq!(want.len(), 1);
    assert_eq!(want[0].priority, 1);
    for after in [None, Some(QueueCursor::after(&all[3]))] {
        assert_eq!(
            store
                .first_unparked(now, after.as_ref(), &parked)
                .await
                .unwrap(),
            Some(QueueCursor::after(&want[0]))
        );
    }
    let everything: Vec<ParkedPlacement> = all.iter().map(parked_key).collect();
    assert_eq!(
        store.first_unparked(now, None, &everything).await.unwrap(),
        None
    );
}

async fn list_tasks_filters_and_pages(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let mut submitted = Vec::new();
    for i in 0..5 {
        let mut t = task("ns", 0, 1);
        if i == 4 {
            t.kind = "build".to_owned();
        }
        submitted.push(submit(store, t, T0 + i).await);
    }
    store
        .cancel_task(submitted[0].id, "no longer needed", None, T0 + 10)
        .await
        .unwrap();

    let filter = TaskFilter {
        namespace: "ns".to_owned(),
        ..TaskFilter::default()
    };
    let (page1, next) = page(store, &filter, 2, None).await;
    assert_eq!(page1, vec![submitted[4].id, submitted[3].id]);
    let (page2, next) = page(store, &filter, 2, next).await;
    assert_eq!(page2, vec![submitted[2].id, submitted[1].id]);
    let (page3, next) = page(store, &filter, 2, next).await;
    assert_eq!(page3, vec![submitted[0].id]);
    assert_eq!(next, None);

    let canceled = TaskFilter {
        namespace: "ns".to_owned(),
        states: vec![TaskState::Canceled],
        kind: None,
    };
    let (only, _) = page(store, &canceled, 10, None).await;
    assert_eq!(only, vec![submitted[0].id]);
    let builds = TaskFilter {
        namespace: "ns".to_owned(),
        states: vec![TaskState::Queued, TaskState::Leased],
        kind: Some("build".to_owned()),
    };
    let (only, _) = page(store, &builds, 10, None).await;
    assert_eq!(only, vec![submitted[4].id]);
    // A cursor the store did not make is refused, not read as the end.
    let forged = store
        .list_tasks(
            &builds,
            &Page {
                size: 10,
                after: Some("forged".to_owned()),
            },
        )
        .await;
    assert!(
        matches!(
            forged,
            Err(Error::Invalid { ref field, .. }) if field == "page_token"
        ),
        "{forged:?}"
    );
}

/// One page of `filter`'s tasks (`size` of them after `after`): their ids
/// in order, and the cursor after the page.
async fn page(
    store: &dyn switchyard_server::store::Store,
    filter: &TaskFilter,
    size: u32,
    after: Option<String>,
) -> (Vec<Uuid>, Option<String>) {
    let (tasks, next) = store
        .list_tasks(filter, &Page { size, after })
        .await
        .unwrap();
    (tasks.iter().map(|t| t.id).collect(), next)
}

async fn close_and_reopen_loses_nothing(fx: &mut Fixture) {
    let queued = submit(fx.store.as_ref(), task("ns", 0, 3), T0).await;
    let leased = submit(fx.store.as_ref(), task("ns", 0, 3), T0).await;
    let worker = agent(fx.store.as_ref(), "ns", "w1", 4).await;
    let lease = grant(fx.store.as_ref(), leased.id, worker.id, T0 + 1).await;
    let before_events = fx.store.task_events(leased.id, 0, 100).await.unwrap();

    fx.reopen().await;
    let store = fx.store.as_ref();
    assert_eq!(store.get_task(queued.id).await.unwrap(), queued);
    let after = store.get_task(leased.id).await.unwrap();
    assert_eq!(after.state, TaskState::Leased);
    assert_eq!(after.lease_id, Some(lease.id));
    assert_eq!(store.get_lease(lease.id).await.unwrap(), lease);
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 1);
    assert_eq!(
        store.task_events(leased.id, 0, 100).await.unwrap(),
        before_events
    );
    // And it keeps working: the lease completes after the reopen.
    store
        .report_started(lease.id, leased.id, worker.id, lease.fencing_token, T0 + 2)
        .await
        .unwrap();
}
