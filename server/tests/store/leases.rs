//! Grants, fencing, reports, completion, retry backoff, expiry, renewal,
//! revocation of unacknowledged grants, and cancel.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;
use switchyard_server::error::Error;
use switchyard_server::model::{
    Completion, CompletionOutcome, GrantOutcome, GrantRefusal, GrantRequest, LeaseRecord,
    LeaseState, ReleaseCause, RetryPolicy, Submission, TaskState,
};
use switchyard_server::store::Store;
use uuid::Uuid;

use crate::common::{
    BACKOFF_BASE_MS, Fixture, Lcg, T0, TestStore, agent, agents, claiming, completion, gpu_agent,
    grant, seeing, submit, submit_tasks, task,
};

crate::both_backends!(
    grant_refusals_and_monotonic_tokens,
    concurrent_grants_never_double_lease_or_overfill,
    submits_leased_on_the_way_in_and_grants_never_overfill_an_agent,
    stale_fencing_token_is_refused_and_changes_nothing,
    start_and_complete_exactly_once,
    batch_completion_refuses_only_the_stale_item,
    one_batch_completes_many_leases_and_a_repeat,
    failed_attempt_retries_after_backoff,
    a_task_backs_off_by_its_own_retry_policy,
    expiry_counts_attempts_then_fails,
    an_unacknowledged_expiry_is_a_release_not_an_attempt,
    concurrent_sweepers_expire_each_lease_once,
    renewal_extends_every_lease_of_the_agent,
    unacknowledged_grants_are_revoked,
    cancel_queued_and_leased_tasks,
    live_lease_counts_count_granted_and_active_only,
    claims_are_checked_against_what_live_leases_hold,
    a_claim_is_checked_against_the_leases_whatever_its_requester_saw,
);

async fn live_lease_counts_count_granted_and_active_only(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let busy = agent(store, "ns", "busy", 4).await;
    let idle = agent(store, "ns", "idle", 4).await;
    let mut leases = Vec::new();
    for i in 0..3 {
        let t = submit(store, task("ns", 0, 3), T0 + i).await;
        leases.push(grant(store, t.id, busy.id, T0 + 10).await);
    }
    // One lease ends: it no longer counts.
    let ended = &leases[0];
    store
        .complete_leases(
            &[Completion {
                lease_id: ended.id,
                task_id: ended.task_id,
                agent_id: busy.id,
                fencing_token: ended.fencing_token,
                outcome: CompletionOutcome::Succeeded { result: json!({}) },
            }],
            T0 + 20,
        )
        .await
        .unwrap();
    let claims = store
        .live_claims(&[busy.id, idle.id, Uuid::now_v7()])
        .await
        .unwrap();
    let mut held: Vec<(Uuid, u32)> = claims[&busy.id]
        .iter()
        .map(|(t, c)| (*t, c.slots))
        .collect();
    held.sort();
    let mut want: Vec<(Uuid, u32)> = leases[1..].iter().map(|l| (l.task_id, 1)).collect();
    want.sort();
    assert_eq!(held, want);
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert!(store.live_claims(&[]).await.unwrap().is_empty());
}

fn succeeded() -> CompletionOutcome {
    CompletionOutcome::Succeeded {
        result: json!({"exit": 0}),
    }
}

/// The default backoff of the fixture's store after `attempts` failures of `task`.
fn backoff(attempts: u32, task: Uuid) -> i64 {
    RetryPolicy::default_from(BACKOFF_BASE_MS).delay_ms(attempts, task)
}

fn failed(retryable: bool) -> CompletionOutcome {
    CompletionOutcome::Failed {
        error: json!({"message": "exit 1", "code": "handler_error", "retryable": retryable, "details": {}}),
        retryable,
    }
}

async fn grant_refusals_and_monotonic_tokens(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let a = submit(store, task("ns", 0, 5), T0).await;
    let b = submit(store, task("ns", 0, 5), T0).await;
    let mut later = task("ns", 0, 5);
    later.not_before_ms = Some(T0 + 1_000);
    let c = submit(store, later, T0).await;
    let worker = agent(store, "ns", "w1", 1).await;

    let outcomes = store
        .grant_leases(
            &[
                GrantRequest::one_slot(a.id, worker.id),
                GrantRequest::one_slot(a.id, worker.id),
                GrantRequest::one_slot(b.id, worker.id),
                GrantRequest::one_slot(c.id, worker.id),
                GrantRequest::one_slot(b.id, Uuid::now_v7()),
                GrantRequest::one_slot(Uuid::now_v7(), worker.id),
            ],
            T0 + 1,
        )
        .await
        .unwrap();
    let GrantOutcome::Granted(lease) = &outcomes[0] else {
        panic!("first grant refused: {outcomes:?}");
    };
    assert_eq!(lease.fencing_token, 1);
    assert_eq!(lease.state, LeaseState::Granted);
    assert_eq!(lease.expires_at_ms, T0 + 1 + 30_000);
    assert_eq!(
        outcomes[1..],
        [
            GrantOutcome::Refused(GrantRefusal::TaskNotQueued),
            GrantOutcome::Refused(GrantRefusal::AgentAtCapacity),
            GrantOutcome::Refused(GrantRefusal::NotYet),
            GrantOutcome::Refused(GrantRefusal::AgentUnknown),
            GrantOutcome::Refused(GrantRefusal::TaskNotQueued),
        ]
    );
    let leased = store.get_task(a.id).await.unwrap();
    assert_eq!(leased.state, TaskState::Leased);
    assert_eq!(leased.lease_id, Some(lease.id));
    assert_eq!(leased.agent_id, Some(worker.id));
    assert_eq!(leased.lease_expires_at_ms, Some(lease.expires_at_ms));
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 1);

    // Each later grant of the same task gets a larger token.
    store
        .complete_leases(
            &[completion(
                lease,
                CompletionOutcome::Released {
                    reason: "shutdown".into(),
                    cause: ReleaseCause::Draining,
                },
            )],
            T0 + 2,
        )
        .await
        .unwrap();
    let second = grant(store, a.id, worker.id, T0 + 3).await;
    assert_eq!(second.fencing_token, 2);
    store.expire_leases(T0 + 3 + 30_000, 10).await.unwrap();
    let third = grant(store, a.id, worker.id, T0 + 40_000).await;
    assert_eq!(third.fencing_token, 3);
    assert_eq!(store.get_task(a.id).await.unwrap().fencing_token, 3);
}

async fn concurrent_grants_never_double_lease_or_overfill(fx: &mut Fixture) {
    const TASKS: usize = 120;
    const AGENTS: usize = 6;
    const CAPACITY: u32 = 8;
    let store: Arc<dyn Store> = fx.store.clone();
    let mut task_ids = Vec::new();
    for i in 0..TASKS {
        task_ids.push(
            submit(store.as_ref(), task("ns", 0, 3), T0 + i as i64)
                .await
                .id,
        );
    }
    let agent_ids = agents(store.as_ref(), "ns", AGENTS, CAPACITY).await;
    // Eight racers, each on its own connection, each trying every task with
    // random agents in small batches.
    let mut racers = Vec::new();
    for seed in 0..8_u64 {
        let store = store.clone();
        let task_ids = task_ids.clone();
        let agent_ids = agent_ids.clone();
        racers.push(tokio::spawn(async move {
            let mut rng = Lcg(seed + 1);
            let mut granted = Vec::new();
            for chunk in task_ids.chunks(5) {
                let requests: Vec<GrantRequest> = chunk
                    .iter()
                    .map(|&task_id| {
                        GrantRequest::one_slot(task_id, agent_ids[rng.next(agent_ids.len())])
                    })
                    .collect();
                for outcome in store.grant_leases(&requests, T0 + 1_000).await.unwrap() {
                    if let GrantOutcome::Granted(lease) = outcome {
                        granted.push(lease);
                    }
                }
            }
            granted
        }));
    }
    let mut leases = Vec::new();
    for racer in racers {
        leases.extend(racer.await.unwrap());
    }
    let mut per_task: HashMap<Uuid, usize> = HashMap::new();
    let mut per_agent: HashMap<Uuid, u32> = HashMap::new();
    for lease in &leases {
        *per_task.entry(lease.task_id).or_default() += 1;
        *per_agent.entry(lease.agent_id).or_default() += 1;
        assert_eq!(lease.fencing_token, 1);
    }
    assert!(
        per_task.values().all(|&n| n == 1),
        "a task was leased twice"
    );
    assert_eq!(
        leases.len(),
        AGENTS * CAPACITY as usize,
        "total capacity is used"
    );
    for agent_id in agent_ids {
        let record = store.get_agent(agent_id).await.unwrap();
        let live = store.agent_leases(agent_id).await.unwrap().len() as u32;
        assert!(record.active_leases <= CAPACITY);
        assert_eq!(record.active_leases, live);
        assert_eq!(per_agent.get(&agent_id).copied().unwrap_or(0), live);
    }
}

/// Submits that reserve an agent (leased on the way in) race grants of
/// queued tasks to the same agents, each racer on its own connection: no
/// agent ever holds more leases than its capacity, and every slot is used.
/// Both paths count an agent's live leases only once they hold its row.
async fn submits_leased_on_the_way_in_and_grants_never_overfill_an_agent(fx: &mut Fixture) {
    const AGENTS: usize = 3;
    const CAPACITY: u32 = 5;
    let store: Arc<dyn Store> = fx.store.clone();
    let mut queued = Vec::new();
    for i in 0..30 {
        queued.push(submit(store.as_ref(), task("ns", 0, 3), T0 + i).await.id);
    }
    let agent_ids = agents(store.as_ref(), "ns", AGENTS, CAPACITY).await;
    let mut racers = Vec::new();
    for seed in 0..8_u64 {
        let store = store.clone();
        let queued = queued.clone();
        let agent_ids = agent_ids.clone();
        racers.push(tokio::spawn(async move {
            let mut rng = Lcg(seed + 1);
            let mut granted = Vec::new();
            for round in 0..6 {
                let outcomes = if seed % 2 == 0 {
                    let batch: Vec<Submission> = (0..3)
                        .map(|_| Submission {
                            task: task("ns", 0, 3),
                            agent_id: Some(agent_ids[rng.next(AGENTS)]),
                        })
                        .collect();
                    store
                        .submit_many(&batch, T0 + 1_000)
                        .await
                        .unwrap()
                        .into_iter()
                        .filter_map(|r| r.unwrap().2)
                        .collect::<Vec<_>>()
                } else {
                    let requests: Vec<GrantRequest> = queued[(round * 5) % queued.len()..][..5]
                        .iter()
                        .map(|&task_id| {
                            GrantRequest::one_slot(task_id, agent_ids[rng.next(AGENTS)])
                        })
                        .collect();
                    store.grant_leases(&requests, T0 + 1_000).await.unwrap()
                };
                granted.extend(outcomes.into_iter().filter_map(|o| match o {
                    GrantOutcome::Granted(lease) => Some(lease),
                    GrantOutcome::Refused(_) => None,
                }));
            }
            granted
        }));
    }
    let mut per_agent: HashMap<Uuid, u32> = HashMap::new();
    for racer in racers {
        for lease in racer.await.unwrap() {
            *per_agent.entry(lease.agent_id).or_default() += 1;
        }
    }
    for agent_id in &agent_ids {
        let live = store.agent_leases(*agent_id).await.unwrap().len() as u32;
        let granted = per_agent.get(agent_id).copied().unwrap_or(0);
        assert_eq!(granted, live, "every lease answered is stored");
        assert!(live <= CAPACITY, "agent over capacity: {live} > {CAPACITY}");
    }
    assert_eq!(
        per_agent.values().sum::<u32>(),
        AGENTS as u32 * CAPACITY,
        "every slot is used"
    );
}

async fn stale_fencing_token_is_refused_and_changes_nothing(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let t = submit(store, task("ns", 0, 5), T0).await;
    let old_agent = agent(store, "ns", "old", 1).await;
    let new_agent = agent(store, "ns", "new", 1).await;
    let old = grant(store, t.id, old_agent.id, T0).await;
    store
        .report_started(old.id, t.id, old_agent.id, old.fencing_token, T0 + 1)
        .await
        .unwrap();
    // The old agent goes silent; its lease expires; the task moves on.
    assert_eq!(store.expire_leases(T0 + 31_000, 10).await.unwrap().len(), 1);
    let new = grant(store, t.id, new_agent.id, T0 + 31_001).await;
    assert_eq!(new.fencing_token, old.fencing_token + 1);
    let before = store.get_task(t.id).await.unwrap();
    let history = store.task_events(t.id, 0, 100).await.unwrap();

    let results = store
        .complete_leases(&[completion(&old, succeeded())], T0 + 31_002)
        .await
        .unwrap();
    match &results[0] {
        Err(Error::StaleFencingToken {
            presented, current, ..
        }) => {
            assert_eq!((*presented, *current), (1, 2));
        }
        other => panic!("expected a stale token refusal, got {other:?}"),
    }
    let status: tonic::Status = match results.into_iter().next() {
        Some(Err(err)) => err.into(),
        _ => unreachable!(),
    };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    let err = store
        .report_started(old.id, t.id, old_agent.id, 1, T0 + 31_003)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StaleFencingToken { .. }), "{err:?}");
    let err = store
        .report_progress(
            old.id,
            t.id,
            old_agent.id,
            1,
            json!({"percent": 50}),
            T0 + 31_003,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StaleFencingToken { .. }), "{err:?}");
    // Right token, wrong holder.
    let err = store
        .report_started(new.id, t.id, old_agent.id, 2, T0 + 31_003)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseNotHeld { .. }), "{err:?}");

    assert_eq!(store.get_task(t.id).await.unwrap(), before);
    assert_eq!(store.task_events(t.id, 0, 100).await.unwrap(), history);
    assert_eq!(
        store.get_agent(new_agent.id).await.unwrap().active_leases,
        1
    );
}

async fn start_and_complete_exactly_once(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let t = submit(store, task("ns", 0, 3), T0).await;
    let worker = agent(store, "ns", "w1", 2).await;
    let lease = grant(store, t.id, worker.id, T0).await;
    assert_eq!(
        store
            .ack_leases(worker.id, &[(lease.id, lease.fencing_token)], T0 + 1)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store.get_lease(lease.id).await.unwrap().state,
        LeaseState::Active
    );
    let running = store
        .report_started(lease.id, t.id, worker.id, 1, T0 + 2)
        .await
        .unwrap();
    assert_eq!(running.state, TaskState::Running);
    // Repeated: acknowledged, nothing new.
    let again = store
        .report_started(lease.id, t.id, worker.id, 1, T0 + 3)
        .await
        .unwrap();
    assert_eq!(again, running);
    let progressed = store
        .report_progress(
            lease.id,
            t.id,
            worker.id,
            1,
            json!({"percent": 40.0, "message": "compiling"}),
            T0 + 4,
        )
        .await
        .unwrap();
    assert_eq!(
        progressed.progress,
        Some(json!({"percent": 40.0, "message": "compiling"}))
    );

    let first = store
        .complete_leases(&[completion(&lease, succeeded())], T0 + 5)
        .await
        .unwrap();
    let first = first.into_iter().next().unwrap().unwrap();
    assert!(!first.duplicate);
    assert_eq!(first.task.state, TaskState::Succeeded);
    assert_eq!(first.task.result, Some(json!({"exit": 0})));
    assert_eq!(first.task.lease_id, None);
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 0);
    assert_eq!(
        store.get_lease(lease.id).await.unwrap().state,
        LeaseState::Completed
    );
    let history = store.task_events(t.id, 0, 100).await.unwrap();
    let kinds: Vec<_> = history.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["submitted", "leased", "accepted", "started", "succeeded"]
    );
    assert!(
        history
            .windows(2)
            .all(|w| w[1].sequence == w[0].sequence + 1)
    );

    // The same report again: acknowledged as a duplicate, nothing changed.
    let repeat = store
        .complete_leases(&[completion(&lease, succeeded())], T0 + 6)
        .await
        .unwrap();
    let repeat = repeat.into_iter().next().unwrap().unwrap();
    assert!(repeat.duplicate);
    assert_eq!(repeat.task, first.task);
    assert_eq!(store.task_events(t.id, 0, 100).await.unwrap(), history);
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 0);
    // A different final report for the same lease is refused.
    let other = store
        .complete_leases(&[completion(&lease, failed(true))], T0 + 7)
        .await
        .unwrap();
    assert!(
        matches!(other[0], Err(Error::LeaseNotHeld { .. })),
        "{other:?}"
    );
    assert_eq!(store.get_task(t.id).await.unwrap(), first.task);
}

async fn batch_completion_refuses_only_the_stale_item(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 3).await;
    let mut leases = Vec::new();
    for i in 0..3 {
        let t = submit(store, task("ns", 0, 3), T0 + i).await;
        leases.push(grant(store, t.id, worker.id, T0 + 10).await);
    }
    let mut stale = completion(&leases[1], succeeded());
    stale.fencing_token = 0;
    let results = store
        .complete_leases(
            &[
                completion(&leases[0], succeeded()),
                stale,
                completion(&leases[2], failed(false)),
            ],
            T0 + 20,
        )
        .await
        .unwrap();
    assert_eq!(
        results[0].as_ref().unwrap().task.state,
        TaskState::Succeeded
    );
    assert!(matches!(results[1], Err(Error::StaleFencingToken { .. })));
    assert_eq!(results[2].as_ref().unwrap().task.state, TaskState::Failed);
    assert_eq!(
        store.get_task(leases[1].task_id).await.unwrap().state,
        TaskState::Leased
    );
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 1);
}

async fn failed_attempt_retries_after_backoff(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let t = submit(store, task("ns", 0, 3), T0).await;
    let worker = agent(store, "ns", "w1", 1).await;

    let first = grant(store, t.id, worker.id, T0).await;
    let done = store
        .complete_leases(&[completion(&first, failed(true))], T0 + 10)
        .await
        .unwrap();
    let retried = done.into_iter().next().unwrap().unwrap().task;
    assert_eq!(retried.state, TaskState::Queued);
    assert_eq!(retried.attempts, 1);
    // The default: the store's base, shortened by up to a fifth.
    let first_wait = backoff(1, t.id);
    assert!((BACKOFF_BASE_MS * 4 / 5..=BACKOFF_BASE_MS).contains(&first_wait));
    assert_eq!(retried.not_before_ms, T0 + 10 + first_wait);
    assert_eq!(retried.error.as_ref().unwrap()["code"], "handler_error");
    assert!(
        store
            .queued_tasks(Some("ns"), T0 + 10 + first_wait - 1, None, &[], 10)
            .await
            .unwrap()
            .is_empty()
    );
    let early = store
        .grant_leases(&[GrantRequest::one_slot(t.id, worker.id)], T0 + 11)
        .await
        .unwrap();
    assert_eq!(early, [GrantOutcome::Refused(GrantRefusal::NotYet)]);

    // The second failure waits up to twice as long.
    let now = T0 + 10 + first_wait;
    assert_eq!(
        store
            .queued_tasks(Some("ns"), now, None, &[], 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let second = grant(store, t.id, worker.id, now).await;
    let done = store
        .complete_leases(&[completion(&second, failed(true))], now + 5)
        .await
        .unwrap();
    let retried = done.into_iter().next().unwrap().unwrap().task;
    assert_eq!(retried.attempts, 2);
    let second_wait = backoff(2, t.id);
    assert!((2 * BACKOFF_BASE_MS * 4 / 5..=2 * BACKOFF_BASE_MS).contains(&second_wait));
    assert_eq!(retried.not_before_ms, now + 5 + second_wait);

    // The third uses the last attempt: FAILED.
    let now = now + 5 + second_wait;
    let third = grant(store, t.id, worker.id, now).await;
    let done = store
        .complete_leases(&[completion(&third, failed(true))], now + 1)
        .await
        .unwrap();
    let final_task = done.into_iter().next().unwrap().unwrap().task;
    assert_eq!(final_task.state, TaskState::Failed);
    assert_eq!(final_task.attempts, 3);

    // A non-retryable failure fails at once.
    let u = submit(store, task("ns", 0, 5), T0).await;
    let lease = grant(store, u.id, worker.id, now + 2).await;
    let done = store
        .complete_leases(&[completion(&lease, failed(false))], now + 3)
        .await
        .unwrap();
    let failed_now = done.into_iter().next().unwrap().unwrap().task;
    assert_eq!(failed_now.state, TaskState::Failed);
    assert_eq!(failed_now.attempts, 1);
}

async fn a_task_backs_off_by_its_own_retry_policy(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 1).await;
    let policy = RetryPolicy {
        initial_backoff_ms: 500,
        max_backoff_ms: 2_000,
        multiplier: 3.0,
        jitter: 0.0,
    };
    let mut spec = task("ns", 0, 5);
    spec.retry = Some(policy);
    let t = submit(store, spec, T0).await;
    assert_eq!(t.retry, Some(policy));
    assert_eq!(store.get_task(t.id).await.unwrap().retry, Some(policy));

    // 500 ms, then three times that, then the cap: not the store's default.
    let mut now = T0;
    for (attempt, wait) in [(1, 500), (2, 1_500), (3, 2_000), (4, 2_000)] {
        let lease = grant(store, t.id, worker.id, now).await;
        let done = store
            .complete_leases(&[completion(&lease, failed(true))], now + 1)
            .await
            .unwrap();
        let retried = done.into_iter().next().unwrap().unwrap().task;
        assert_eq!(retried.attempts, attempt);
        assert_eq!(retried.state, TaskState::Queued);
        assert_eq!(retried.not_before_ms, now + 1 + wait, "attempt {attempt}");
        assert_eq!(retried.retry, Some(policy));
        now = retried.not_before_ms;
    }

    // A jittered policy waits the policy's delay less up to the jitter,
    // by an amount the task decides.
    let jittered = RetryPolicy {
        jitter: 1.0,
        ..policy
    };
    let mut waits = Vec::new();
    for _ in 0..4 {
        let mut spec = task("ns", 0, 5);
        spec.retry = Some(jittered);
        let u = submit(store, spec, now).await;
        let lease = grant(store, u.id, worker.id, now).await;
        let done = store
            .complete_leases(&[completion(&lease, failed(true))], now + 1)
            .await
            .unwrap();
        let retried = done.into_iter().next().unwrap().unwrap().task;
        let wait = retried.not_before_ms - (now + 1);
        assert_eq!(wait, jittered.delay_ms(1, u.id));
        assert!((0..=500).contains(&wait), "{wait}");
        waits.push(wait);
        store
            .cancel_task(u.id, "done", None, now + 2)
            .await
            .unwrap();
    }
    waits.dedup();
    assert!(waits.len() > 1, "the jitter depends on the task: {waits:?}");
}

async fn expiry_counts_attempts_then_fails(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let t = submit(store, task("ns", 0, 2), T0).await;
    let worker = agent(store, "ns", "w1", 1).await;
    let first = grant(store, t.id, worker.id, T0).await;
    ack(store, &first).await;
    // Not yet due.
    assert!(
        store
            .expire_leases(first.expires_at_ms - 1, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let expired = store.expire_leases(first.expires_at_ms, 10).await.unwrap();
    assert_eq!(expired.len(), 1);
    let (lease, task_after) = &expired[0];
    assert_eq!(lease.state, LeaseState::Expired);
    assert_eq!(task_after.state, TaskState::Queued);
    assert_eq!(task_after.attempts, 1);
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 0);
    // Sweeping again finds nothing.
    assert!(
        store
            .expire_leases(first.expires_at_ms + 1, 10)
            .await
            .unwrap()
            .is_empty()
    );

    let second = grant(store, t.id, worker.id, first.expires_at_ms + 1).await;
    ack(store, &second).await;
    let expired = store.expire_leases(second.expires_at_ms, 10).await.unwrap();
    let (_, failed_task) = &expired[0];
    assert_eq!(failed_task.state, TaskState::Failed);
    assert_eq!(failed_task.attempts, 2);
    let error = failed_task.error.as_ref().unwrap();
    assert_eq!(error["message"], "lease lost 2 times");
    assert_eq!(error["code"], "lease_lost");
    let kinds: Vec<_> = store
        .task_events(t.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "submitted",
            "leased",
            "accepted",
            "lease_expired",
            "leased",
            "accepted",
            "failed"
        ]
    );
}

/// The agent acknowledges `lease`.
async fn ack(store: &dyn Store, lease: &LeaseRecord) {
    let acked = store
        .ack_leases(
            lease.agent_id,
            &[(lease.id, lease.fencing_token)],
            lease.granted_at_ms + 1,
        )
        .await
        .unwrap();
    assert_eq!(acked, 1);
}

/// A grant that expires before the agent acknowledged it is no attempt:
/// it counts a release (as a grant revoked unacknowledged does), its
/// history says so, and past the bound of releases the task FAILS; the
/// agent is not one an attempt failed on.
async fn an_unacknowledged_expiry_is_a_release_not_an_attempt(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let t = submit(store, task("ns", 0, 2), T0).await;
    let worker = agent(store, "ns", "w1", 1).await;
    let mut now = T0;
    let max_releases = crate::common::MAX_RELEASES;
    for n in 1..=max_releases {
        let lease = grant(store, t.id, worker.id, now).await;
        let expired = store.expire_leases(lease.expires_at_ms, 10).await.unwrap();
        let (lease, after) = &expired[0];
        assert_eq!(lease.state, LeaseState::Expired);
        assert_eq!((after.attempts, after.releases), (0, n), "expiry {n}");
        let want = if n < max_releases {
            TaskState::Queued
        } else {
            TaskState::Failed
        };
        assert_eq!(after.state, want, "expiry {n}");
        now = lease.expires_at_ms + 1;
    }
    let events = store.task_events(t.id, 0, 100).await.unwrap();
    assert_eq!(
        events[2].message,
        "the lease expired before the agent acknowledged it"
    );
    assert!(store.failed_agents(t.id).await.unwrap().is_empty());
}

async fn renewal_extends_every_lease_of_the_agent(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 3).await;
    let other = agent(store, "ns", "w2", 3).await;
    let a = submit(store, task("ns", 0, 3), T0).await;
    let mut short = task("ns", 0, 3);
    short.lease_ttl_ms = 5_000;
    let b = submit(store, short, T0).await;
    let c = submit(store, task("ns", 0, 3), T0).await;
    grant(store, a.id, worker.id, T0).await;
    grant(store, b.id, worker.id, T0).await;
    let untouched = grant(store, c.id, other.id, T0).await;

    assert_eq!(store.renew_leases(worker.id, T0 + 28_000).await.unwrap(), 2);
    let leases = store.agent_leases(worker.id).await.unwrap();
    let mut expiries: Vec<_> = leases.iter().map(|l| l.expires_at_ms).collect();
    expiries.sort_unstable();
    assert_eq!(expiries, [T0 + 33_000, T0 + 58_000]);
    assert_eq!(
        store.get_task(b.id).await.unwrap().lease_expires_at_ms,
        Some(T0 + 33_000)
    );
    assert_eq!(store.get_lease(untouched.id).await.unwrap(), untouched);
    // At the old expiry only the other agent's lease lapses.
    let expired = store.expire_leases(T0 + 30_000, 10).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].0.id, untouched.id);
}

async fn unacknowledged_grants_are_revoked(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 3).await;
    let a = submit(store, task("ns", 0, 3), T0).await;
    let b = submit(store, task("ns", 0, 3), T0).await;
    let c = submit(store, task("ns", 0, 3), T0).await;
    let unacked = grant(store, a.id, worker.id, T0).await;
    let acked = grant(store, b.id, worker.id, T0).await;
    let recent = grant(store, c.id, worker.id, T0 + 5_000).await;
    store
        .ack_leases(worker.id, &[(acked.id, acked.fencing_token)], T0 + 100)
        .await
        .unwrap();
    let mut events = store.subscribe();

    // Scoped to another agent: nothing of this one's.
    let bystander = agent(store, "ns", "w2", 1).await;
    assert!(
        store
            .revoke_unacked(Some(bystander.id), i64::MAX, T0 + 6_000)
            .await
            .unwrap()
            .is_empty()
    );

    let revoked = store
        .revoke_unacked(None, T0 + 1_000, T0 + 6_000)
        .await
        .unwrap();
    assert_eq!(revoked.len(), 1);
    let (lease, back) = &revoked[0];
    assert_eq!(lease.id, unacked.id);
    assert_eq!(lease.state, LeaseState::Released);
    assert_eq!(back.state, TaskState::Queued);
    assert_eq!(back.attempts, 0, "a revoked grant is not an attempt");
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 2);
    assert_eq!(
        store.get_lease(recent.id).await.unwrap().state,
        LeaseState::Granted
    );
    // The holder is told.
    let deadline = std::time::Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout(deadline, events.recv())
            .await
            .unwrap()
            .unwrap();
        if let switchyard_server::model::StoreEvent::LeaseRevoked { lease_id, .. } = event {
            assert_eq!(lease_id, unacked.id);
            break;
        }
    }
    // A late acknowledgement of the revoked grant is ignored.
    assert_eq!(
        store
            .ack_leases(worker.id, &[(unacked.id, 1)], T0 + 7_000)
            .await
            .unwrap(),
        0
    );
    // Its session ended: every grant it never acknowledged goes, however
    // recent; the acknowledged one stays.
    let gone = store
        .revoke_unacked(Some(worker.id), i64::MAX, T0 + 7_000)
        .await
        .unwrap();
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].0.id, recent.id);
    assert_eq!(
        store.get_lease(acked.id).await.unwrap().state,
        LeaseState::Active
    );
}

async fn cancel_queued_and_leased_tasks(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 3).await;
    let queued = submit(store, task("ns", 0, 3), T0).await;
    let (canceled, revoke) = store
        .cancel_task(queued.id, "user asked", None, T0 + 1)
        .await
        .unwrap();
    assert_eq!(canceled.state, TaskState::Canceled);
    assert!(revoke.is_none());
    // Terminal: unchanged.
    let (same, revoke) = store
        .cancel_task(queued.id, "again", None, T0 + 2)
        .await
        .unwrap();
    assert_eq!(same, canceled);
    assert!(revoke.is_none());

    // Leased: a revocation; CANCELED when the agent hands it back.
    let leased = submit(store, task("ns", 0, 3), T0).await;
    let lease = grant(store, leased.id, worker.id, T0).await;
    let (pending, revoke) = store
        .cancel_task(leased.id, "user asked", None, T0 + 3)
        .await
        .unwrap();
    assert_eq!(pending.state, TaskState::Leased);
    assert!(pending.cancel_requested);
    assert_eq!(revoke.as_ref().map(|l| l.id), Some(lease.id));
    let done = store
        .complete_leases(
            &[completion(
                &lease,
                CompletionOutcome::Released {
                    reason: "canceled".into(),
                    cause: ReleaseCause::Draining,
                },
            )],
            T0 + 4,
        )
        .await
        .unwrap();
    let done = done.into_iter().next().unwrap().unwrap().task;
    assert_eq!(done.state, TaskState::Canceled);
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 0);

    // Running: CANCELED when the lease expires instead.
    let running = submit(store, task("ns", 0, 3), T0).await;
    let lease = grant(store, running.id, worker.id, T0).await;
    store
        .report_started(lease.id, running.id, worker.id, 1, T0 + 1)
        .await
        .unwrap();
    store
        .cancel_task(running.id, "user asked", None, T0 + 2)
        .await
        .unwrap();
    let expired = store.expire_leases(lease.expires_at_ms, 10).await.unwrap();
    assert_eq!(expired[0].1.state, TaskState::Canceled);
    assert_eq!(expired[0].1.attempts, 1);

    // A success reported after the cancel request still records the result.
    let finishing = submit(store, task("ns", 0, 3), T0).await;
    let lease = grant(store, finishing.id, worker.id, T0).await;
    store
        .cancel_task(finishing.id, "too late", None, T0 + 1)
        .await
        .unwrap();
    let done = store
        .complete_leases(&[completion(&lease, succeeded())], T0 + 2)
        .await
        .unwrap();
    assert_eq!(done[0].as_ref().unwrap().task.state, TaskState::Succeeded);
    let kinds: Vec<_> = store
        .task_events(finishing.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        ["submitted", "leased", "cancel_requested", "succeeded"]
    );
}

async fn one_batch_completes_many_leases_and_a_repeat(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let first = agent(store, "ns", "w1", 25).await;
    let second = agent(store, "ns", "w2", 25).await;
    let mut requests = Vec::new();
    for i in 0..50 {
        let t = submit(store, task("ns", 0, 3), T0 + i).await;
        let agent_id = if i % 2 == 0 { first.id } else { second.id };
        requests.push(GrantRequest::one_slot(t.id, agent_id));
    }
    let leases: Vec<_> = store
        .grant_leases(&requests, T0 + 100)
        .await
        .unwrap()
        .into_iter()
        .map(|outcome| match outcome {
            GrantOutcome::Granted(lease) => lease,
            refused => panic!("{refused:?}"),
        })
        .collect();
    let mut batch: Vec<Completion> = leases
        .iter()
        .enumerate()
        .map(|(i, lease)| match i % 3 {
            0 => completion(lease, succeeded()),
            1 => completion(lease, failed(true)),
            _ => completion(
                lease,
                CompletionOutcome::Released {
                    reason: "draining".into(),
                    cause: ReleaseCause::Draining,
                },
            ),
        })
        .collect();
    batch.push(completion(&leases[0], succeeded()));
    let results = store.complete_leases(&batch, T0 + 200).await.unwrap();
    assert_eq!(results.len(), 51);
    for (i, result) in results.iter().take(50).enumerate() {
        let result = result.as_ref().unwrap();
        assert!(!result.duplicate);
        let expected = match i % 3 {
            0 => TaskState::Succeeded,
            _ => TaskState::Queued,
        };
        assert_eq!(result.task.state, expected, "item {i}");
        assert_eq!(
            store.get_task(leases[i].task_id).await.unwrap(),
            result.task
        );
    }
    let repeat = results[50].as_ref().unwrap();
    assert!(repeat.duplicate);
    assert_eq!(repeat.task.state, TaskState::Succeeded);
    assert_eq!(store.get_agent(first.id).await.unwrap().active_leases, 0);
    assert_eq!(store.get_agent(second.id).await.unwrap().active_leases, 0);
    let retried = store.get_task(leases[1].task_id).await.unwrap();
    assert_eq!(
        (retried.attempts, retried.not_before_ms),
        (1, T0 + 200 + backoff(1, leases[1].task_id))
    );
    let released = store.get_task(leases[2].task_id).await.unwrap();
    assert_eq!((released.attempts, released.not_before_ms), (0, T0 + 200));
}

async fn concurrent_sweepers_expire_each_lease_once(fx: &mut Fixture) {
    let worker = agent(fx.store.as_ref(), "ns", "w1", 40).await;
    let mut requests = Vec::new();
    for i in 0..40 {
        let t = submit(fx.store.as_ref(), task("ns", 0, 3), T0 + i).await;
        requests.push(GrantRequest::one_slot(t.id, worker.id));
    }
    fx.store.grant_leases(&requests, T0 + 100).await.unwrap();
    // Two instances (two replicas on PostgreSQL), two sweepers each.
    let replicas = [fx.store.clone(), fx.another_instance().await];
    let mut sweepers = Vec::new();
    for store in replicas.iter().chain(replicas.iter()) {
        let store = store.clone();
        sweepers.push(tokio::spawn(async move {
            let mut swept = Vec::new();
            loop {
                let batch = store.expire_leases(T0 + 100_000, 7).await.unwrap();
                if batch.is_empty() {
                    break swept;
                }
                swept.extend(batch.into_iter().map(|(lease, _)| lease.id));
            }
        }));
    }
    let mut swept = Vec::new();
    for sweeper in sweepers {
        swept.extend(sweeper.await.unwrap());
    }
    let unique: std::collections::HashSet<_> = swept.iter().collect();
    assert_eq!(swept.len(), 40, "every lease expired exactly once");
    assert_eq!(unique.len(), 40);
    for request in &requests {
        let t = fx.store.get_task(request.task_id).await.unwrap();
        // Never acknowledged: a release, not an attempt.
        assert_eq!((t.state, t.attempts, t.releases), (TaskState::Queued, 0, 1));
    }
    assert_eq!(
        fx.store.get_agent(worker.id).await.unwrap().active_leases,
        0
    );
    replicas[1].close().await;
}

/// A claim of more than slots is granted only while its devices are free
/// and its amounts within the agent's offer beside what its live leases
/// (and the batch's earlier grants) hold; it comes back when the lease
/// ends, and the stored lease says what it holds.
async fn claims_are_checked_against_what_live_leases_hold(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let gpu = gpu_agent(store, "ns", "gpu", 8).await;
    let tasks = submit_tasks(store, "ns", 8).await;
    let outcomes = store
        .grant_leases(
            &[
                claiming(
                    tasks[0],
                    gpu.id,
                    json!({"slots": 1, "gpus": ["GPU-0"], "memory_mb": 20000}),
                ),
                // The same device again in the same batch.
                claiming(tasks[1], gpu.id, json!({"slots": 1, "gpus": ["GPU-0"]})),
                // A device the agent does not offer.
                claiming(tasks[2], gpu.id, json!({"slots": 1, "gpus": ["GPU-7"]})),
                // More memory than is left (12,000 of 32,000).
                claiming(tasks[3], gpu.id, json!({"slots": 1, "memory_mb": 16000})),
                claiming(
                    tasks[4],
                    gpu.id,
                    json!({"slots": 1, "gpus": ["GPU-1"], "cpu_millicores": 4000}),
                ),
                // No CPU left.
                claiming(tasks[5], gpu.id, json!({"slots": 1, "cpu_millicores": 1})),
            ],
            T0 + 10,
        )
        .await
        .unwrap();
    let verdicts: Vec<Option<GrantRefusal>> = outcomes
        .iter()
        .map(|o| match o {
            GrantOutcome::Granted(_) => None,
            GrantOutcome::Refused(r) => Some(*r),
        })
        .collect();
    use GrantRefusal::ResourcesTaken as Taken;
    assert_eq!(
        verdicts,
        [
            None,
            Some(Taken),
            Some(Taken),
            Some(Taken),
            None,
            Some(Taken)
        ]
    );
    let GrantOutcome::Granted(first) = &outcomes[0] else {
        unreachable!()
    };
    assert_eq!(first.claim.gpus, ["GPU-0"]);
    assert_eq!(store.get_lease(first.id).await.unwrap().claim, first.claim);
    // In a later batch, what the live leases hold still counts.
    let later = store
        .grant_leases(
            &[claiming(
                tasks[1],
                gpu.id,
                json!({"slots": 1, "gpus": ["GPU-0"]}),
            )],
            T0 + 20,
        )
        .await
        .unwrap();
    assert_eq!(later, [GrantOutcome::Refused(Taken)]);
    // Slots count as the claims say: 2 held of 8, so 7 more do not fit.
    let slots = store
        .grant_leases(&[claiming(tasks[6], gpu.id, json!({"slots": 7}))], T0 + 20)
        .await
        .unwrap();
    assert_eq!(
        slots,
        [GrantOutcome::Refused(GrantRefusal::AgentAtCapacity)]
    );
    assert_eq!(store.get_agent(gpu.id).await.unwrap().active_leases, 2);
    // The first lease ends: its device and memory come back.
    store
        .complete_leases(
            &[completion(
                first,
                CompletionOutcome::Succeeded { result: json!({}) },
            )],
            T0 + 30,
        )
        .await
        .unwrap();
    let again = store
        .grant_leases(
            &[claiming(
                tasks[1],
                gpu.id,
                json!({"slots": 6, "gpus": ["GPU-0"], "memory_mb": 32000}),
            )],
            T0 + 40,
        )
        .await
        .unwrap();
    assert!(matches!(again[0], GrantOutcome::Granted(_)), "{again:?}");
    assert_eq!(store.get_agent(gpu.id).await.unwrap().active_leases, 7);
    let held = store.live_claims(&[gpu.id]).await.unwrap();
    let mut gpus: Vec<String> = held[&gpu.id]
        .iter()
        .flat_map(|(_, c)| c.gpus.clone())
        .collect();
    gpus.sort();
    assert_eq!(gpus, ["GPU-0", "GPU-1"]);
}

/// A requester's view of what an agent holds (`GrantRequest::seen`) only
/// spares a read: a view that misses a live lease, remembers one that
/// ended, or remembers the wrong devices for one, changes nothing about
/// which claims are granted.
async fn a_claim_is_checked_against_the_leases_whatever_its_requester_saw(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let gpu = gpu_agent(store, "ns", "gpu", 8).await;
    let tasks = submit_tasks(store, "ns", 6).await;
    let gpu0 = json!({"slots": 1, "gpus": ["GPU-0"]});
    let gpu1 = json!({"slots": 1, "gpus": ["GPU-1"]});
    let first = store
        .grant_leases(&[claiming(tasks[0], gpu.id, gpu0.clone())], T0 + 10)
        .await
        .unwrap();
    assert!(matches!(first[0], GrantOutcome::Granted(_)), "{first:?}");
    let verdict = |outcomes: Vec<GrantOutcome>| match outcomes.as_slice() {
        [GrantOutcome::Granted(lease)] => Ok(lease.claim.gpus.clone()),
        [GrantOutcome::Refused(refusal)] => Err(*refusal),
        other => panic!("one outcome expected: {other:?}"),
    };
    // Seen nothing held: GPU-0 is still refused, GPU-1 still granted.
    let blind = store
        .grant_leases(&[claiming(tasks[1], gpu.id, gpu0.clone())], T0 + 20)
        .await
        .unwrap();
    assert_eq!(verdict(blind), Err(GrantRefusal::ResourcesTaken));
    // Seen the wrong device held by the live lease: GPU-0 looks free, is not.
    let wrong = seeing(
        claiming(tasks[1], gpu.id, gpu0.clone()),
        &[(tasks[0], gpu1.clone())],
    );
    let wrong = store.grant_leases(&[wrong], T0 + 20).await.unwrap();
    assert_eq!(verdict(wrong), Err(GrantRefusal::ResourcesTaken));
    // Seen right: GPU-0 refused, GPU-1 granted.
    let right = seeing(
        claiming(tasks[1], gpu.id, gpu0.clone()),
        &[(tasks[0], gpu0.clone())],
    );
    let right = store.grant_leases(&[right], T0 + 20).await.unwrap();
    assert_eq!(verdict(right), Err(GrantRefusal::ResourcesTaken));
    let fits = seeing(
        claiming(tasks[2], gpu.id, gpu1.clone()),
        &[(tasks[0], gpu0.clone())],
    );
    let fits = store.grant_leases(&[fits], T0 + 20).await.unwrap();
    assert_eq!(verdict(fits), Ok(vec!["GPU-1".to_owned()]));
    // Both leases end; a view that still remembers them refuses nothing.
    for lease in store.live_claims(&[gpu.id]).await.unwrap()[&gpu.id].clone() {
        let lease = store.get_task(lease.0).await.unwrap().lease_id.unwrap();
        let lease = store.get_lease(lease).await.unwrap();
        store
            .complete_leases(
                &[completion(
                    &lease,
                    CompletionOutcome::Succeeded { result: json!({}) },
                )],
                T0 + 30,
            )
            .await
            .unwrap();
    }
    let stale = seeing(
        claiming(tasks[3], gpu.id, gpu0.clone()),
        &[(tasks[0], gpu0.clone()), (tasks[2], gpu1.clone())],
    );
    let stale = store.grant_leases(&[stale], T0 + 40).await.unwrap();
    assert_eq!(verdict(stale), Ok(vec!["GPU-0".to_owned()]));
    // Blind again, in one batch with a request that saw right: the batch's
    // own first grant counts for the second.
    let batch = store
        .grant_leases(
            &[
                claiming(tasks[4], gpu.id, gpu1.clone()),
                seeing(
                    claiming(tasks[5], gpu.id, gpu1.clone()),
                    &[(tasks[3], gpu0.clone())],
                ),
            ],
            T0 + 50,
        )
        .await
        .unwrap();
    assert!(matches!(batch[0], GrantOutcome::Granted(_)), "{batch:?}");
    assert_eq!(
        batch[1],
        GrantOutcome::Refused(GrantRefusal::ResourcesTaken)
    );
    assert_eq!(store.get_agent(gpu.id).await.unwrap().active_leases, 2);
}
