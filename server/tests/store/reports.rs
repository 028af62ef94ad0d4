//! Group-committed lease reports (`Store::apply_reports`): many sessions'
//! accepted, started, progress and final reports in one transaction, with
//! the same outcome, rows and history as applying them one by one, and a
//! refusal of one report leaving the others alone; and group-committed
//! heartbeats (`Store::heartbeats`).

use serde_json::json;
use switchyard_server::error::Error;
use switchyard_server::model::{
    AgentStatus, Beat, BeatApplied, BeatOutcome, CompletionOutcome, DocumentWrite, LeaseRecord,
    LeaseReport, LeaseState, OutputChunk, OutputStream, ReleaseCause, RenewedLease, ReportApplied,
    ReportKind, TaskState,
};

use sqlx::Connection as _;

use crate::common::{Fixture, T0, agent, grant, submit, task};

crate::both_backends!(
    whole_attempts_in_one_batch_match_one_by_one,
    a_refused_report_leaves_the_rest_of_the_batch,
    many_whole_attempts_settle_like_one_by_one,
    whole_successes_no_longer_fresh_are_refused_as_one_by_one,
    a_whole_attempts_history_reads_like_one_by_one_in_any_page,
    heartbeats_renew_touch_and_write_documents,
);

fn report(lease: &LeaseRecord, kind: ReportKind) -> LeaseReport {
    LeaseReport {
        lease_id: lease.id,
        task_id: lease.task_id,
        agent_id: lease.agent_id,
        fencing_token: lease.fencing_token,
        kind,
    }
}

/// A task's history without the ids that differ from task to task.
fn steps(
    history: &[switchyard_server::model::TaskEventRecord],
) -> Vec<(u64, String, TaskState, String, i64)> {
    history
        .iter()
        .map(|e| {
            let message = e
                .message
                .replace(&e.lease_id.unwrap_or_default().to_string(), "L");
            (
                e.sequence,
                e.kind.clone(),
                e.state,
                message,
                e.occurred_at_ms,
            )
        })
        .collect()
}

fn succeeded() -> ReportKind {
    ReportKind::Final(CompletionOutcome::Succeeded {
        result: json!({"exit": 0}),
    })
}

async fn whole_attempts_in_one_batch_match_one_by_one(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let w1 = agent(store, "ns", "w1", 4).await;
    let w2 = agent(store, "ns", "w2", 4).await;
    let mut leases = Vec::new();
    for (i, worker) in [&w1, &w1, &w2, &w2].into_iter().enumerate() {
        let t = submit(store, task("ns", 0, 3), T0 + i as i64).await;
        leases.push(grant(store, t.id, worker.id, T0 + 10).await);
    }
    // Lease 0: the whole attempt at once (the fast path). Lease 1: accepted
    // and started only. Lease 2: accepted, then progress, then the end, one
    // by one. Lease 3: only accepted. Interleaved, as sessions send them.
    let batch = vec![
        report(&leases[0], ReportKind::Accepted),
        report(&leases[2], ReportKind::Accepted),
        report(&leases[1], ReportKind::Accepted),
        report(&leases[0], ReportKind::Started),
        report(&leases[2], ReportKind::Progress(json!({"percent": 50.0}))),
        report(&leases[1], ReportKind::Started),
        report(&leases[0], succeeded()),
        report(&leases[3], ReportKind::Accepted),
        report(
            &leases[2],
            ReportKind::Final(CompletionOutcome::Failed {
                error: json!({"message": "exit 1", "retryable": false}),
                retryable: false,
            }),
        ),
    ];
    let results = store.apply_reports(&batch, T0 + 20).await.unwrap();
    let ended: Vec<bool> = results.iter().map(|r| r.as_ref().unwrap().ended).collect();
    assert_eq!(
        ended,
        [false, false, false, false, false, false, true, false, true]
    );

    let state = |i: usize| {
        let id = leases[i].task_id;
        async move { store.get_task(id).await.unwrap() }
    };
    assert_eq!(state(0).await.state, TaskState::Succeeded);
    assert_eq!(state(0).await.result, Some(json!({"exit": 0})));
    assert_eq!(state(1).await.state, TaskState::Running);
    assert_eq!(state(2).await.state, TaskState::Failed);
    assert_eq!(state(3).await.state, TaskState::Leased);
    // Agents' load is their live leases: w1 holds lease 1, w2 lease 3.
    assert_eq!(store.get_agent(w1.id).await.unwrap().active_leases, 1);
    assert_eq!(store.get_agent(w2.id).await.unwrap().active_leases, 1);
    let lease0 = store.get_lease(leases[0].id).await.unwrap();
    assert_eq!((lease0.state, lease0.acked), (LeaseState::Completed, true));
    let lease3 = store.get_lease(leases[3].id).await.unwrap();
    assert_eq!((lease3.state, lease3.acked), (LeaseState::Active, true));

    let kinds = |i: usize| {
        let id = leases[i].task_id;
        async move {
            let history = store.task_events(id, 0, 100).await.unwrap();
            assert!(
                history
                    .windows(2)
                    .all(|w| w[1].sequence == w[0].sequence + 1),
                "{history:?}"
            );
            history.into_iter().map(|e| e.kind).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        kinds(0).await,
        ["submitted", "leased", "accepted", "started", "succeeded"]
    );
    assert_eq!(
        kinds(1).await,
        ["submitted", "leased", "accepted", "started"]
    );
    assert_eq!(
        kinds(2).await,
        ["submitted", "leased", "accepted", "failed"]
    );
    assert_eq!(kinds(3).await, ["submitted", "leased", "accepted"]);

    // The same whole attempt again, as one by one: the final report is a
    // duplicate (acknowledged), accepted and started are refused (the lease
    // ended), and nothing changes.
    let again = store
        .apply_reports(
            &[
                report(&leases[0], ReportKind::Accepted),
                report(&leases[0], ReportKind::Started),
                report(&leases[0], succeeded()),
            ],
            T0 + 30,
        )
        .await
        .unwrap();
    assert!(
        matches!(again[0], Err(Error::LeaseNotHeld { .. })),
        "{again:?}"
    );
    assert!(
        matches!(again[1], Err(Error::LeaseNotHeld { .. })),
        "{again:?}"
    );
    assert!(
        matches!(again[2], Ok(ReportApplied { ended: false })),
        "{again:?}"
    );
    assert_eq!(kinds(0).await.len(), 5);
}

async fn a_refused_report_leaves_the_rest_of_the_batch(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 3).await;
    let intruder = agent(store, "ns", "w2", 3).await;
    let mut leases = Vec::new();
    for i in 0..2 {
        let t = submit(store, task("ns", 0, 3), T0 + i).await;
        leases.push(grant(store, t.id, worker.id, T0 + 10).await);
    }
    let mut stale = report(&leases[0], ReportKind::Accepted);
    stale.fencing_token = 0;
    let mut stale_start = report(&leases[0], ReportKind::Started);
    stale_start.fencing_token = 0;
    let mut foreign = report(&leases[1], succeeded());
    foreign.agent_id = intruder.id;
    let results = store
        .apply_reports(
            &[
                stale,
                stale_start,
                foreign,
                report(&leases[1], ReportKind::Accepted),
                report(&leases[1], ReportKind::Started),
            ],
            T0 + 20,
        )
        .await
        .unwrap();
    assert!(
        matches!(results[0], Err(Error::LeaseNotHeld { .. })),
        "{results:?}"
    );
    assert!(
        matches!(results[1], Err(Error::StaleFencingToken { .. })),
        "{results:?}"
    );
    assert!(
        matches!(results[2], Err(Error::LeaseNotHeld { .. })),
        "{results:?}"
    );
    assert!(results[3].is_ok() && results[4].is_ok(), "{results:?}");
    let first = store.get_lease(leases[0].id).await.unwrap();
    assert_eq!((first.state, first.acked), (LeaseState::Granted, false));
    assert_eq!(
        store.get_task(leases[0].task_id).await.unwrap().state,
        TaskState::Leased
    );
    assert_eq!(
        store.get_task(leases[1].task_id).await.unwrap().state,
        TaskState::Running
    );
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 2);
}

async fn many_whole_attempts_settle_like_one_by_one(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 12).await;
    let mut leases = Vec::new();
    for i in 0..12 {
        let t = submit(store, task("ns", 0, 3), T0 + i).await;
        leases.push(grant(store, t.id, worker.id, T0 + 20).await);
    }
    let end = |i: usize| match i % 3 {
        0 => succeeded(),
        1 => ReportKind::Final(CompletionOutcome::Failed {
            error: json!({"message": "flaky", "retryable": true}),
            retryable: true,
        }),
        _ => ReportKind::Final(CompletionOutcome::Released {
            reason: "shutting down".into(),
            cause: ReleaseCause::Draining,
        }),
    };
    let mut batch = Vec::new();
    for (i, lease) in leases.iter().enumerate() {
        batch.push(report(lease, ReportKind::Accepted));
        batch.push(report(lease, ReportKind::Started));
        batch.push(report(lease, end(i)));
    }
    let results = store.apply_reports(&batch, T0 + 30).await.unwrap();
    assert!(
        results
            .iter()
            .enumerate()
            .all(|(i, r)| r.as_ref().unwrap().ended == (i % 3 == 2)),
        "{results:?}"
    );
    for (i, lease) in leases.iter().enumerate() {
        let t = store.get_task(lease.task_id).await.unwrap();
        let history = store.task_events(t.id, 0, 100).await.unwrap();
        let kinds: Vec<_> = history.iter().map(|e| e.kind.as_str()).collect();
        let (state, attempts, last) = match i % 3 {
            0 => (TaskState::Succeeded, 0, "succeeded"),
            1 => (TaskState::Queued, 1, "attempt_failed"),
            _ => (TaskState::Queued, 0, "released"),
        };
        assert_eq!((t.state, t.attempts, t.lease_id), (state, attempts, None));
        assert_eq!(kinds, ["submitted", "leased", "accepted", "started", last]);
        assert_eq!(
            history.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        let l = store.get_lease(lease.id).await.unwrap();
        assert!(l.acked && !l.state.is_live(), "{l:?}");
    }
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 0);
}

/// A whole attempt's three reports (accepted, started, success).
fn whole_success(lease: &LeaseRecord) -> [LeaseReport; 3] {
    [
        report(lease, ReportKind::Accepted),
        report(lease, ReportKind::Started),
        report(lease, succeeded()),
    ]
}

/// Whole successes that are no longer fresh attempts of the lease's holder
/// (a stale token, another agent, a lease revoked before the batch) are
/// refused and change nothing, as one by one; a fresh one beside them
/// settles, and so does one whose output is in the batch. (PostgreSQL
/// settles fresh successes apart from the batch's transaction:
/// `switchyard_settle_successes`.)
async fn whole_successes_no_longer_fresh_are_refused_as_one_by_one(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 5).await;
    let intruder = agent(store, "ns", "w2", 5).await;
    let mut leases = Vec::new();
    for i in 0..5 {
        let t = submit(store, task("ns", 0, 3), T0 + i).await;
        leases.push(grant(store, t.id, worker.id, T0 + 10 + i).await);
    }
    // Lease 3 is revoked before the batch: never acknowledged.
    let revoked = store
        .revoke_unacked(Some(worker.id), T0 + 14, T0 + 15)
        .await
        .unwrap();
    assert_eq!(revoked.len(), 4, "{revoked:?}");
    let mut leases3 = Vec::new();
    for lease in &leases[..3] {
        leases3.push(grant(store, lease.task_id, worker.id, T0 + 16).await);
    }
    let (fresh, stale, foreign, gone) = (&leases3[0], &leases3[1], &leases3[2], &leases[3]);
    let output = report(
        &leases[4],
        ReportKind::Output(vec![OutputChunk {
            stream: OutputStream::Stdout,
            sequence: 1,
            text: "done\n".to_owned(),
            dropped_bytes: 0,
        }]),
    );
    let mut batch: Vec<LeaseReport> = Vec::new();
    batch.extend(whole_success(fresh));
    batch.extend(whole_success(stale).map(|mut r| {
        r.fencing_token -= 1;
        r
    }));
    batch.extend(whole_success(foreign).map(|mut r| {
        r.agent_id = intruder.id;
        r
    }));
    batch.extend(whole_success(gone));
    batch.push(output);
    batch.extend(whole_success(&leases[4]));
    let results = store.apply_reports(&batch, T0 + 20).await.unwrap();

    let ended: Vec<Option<bool>> = results
        .iter()
        .map(|r| r.as_ref().ok().map(|a| a.ended))
        .collect();
    let (yes, no) = (Some(true), Some(false));
    assert_eq!(
        ended,
        [
            no, no, yes, // fresh
            None, None, None, // stale
            None, None, None, // foreign
            None, None, None, // gone
            no, no, no, yes // output, then the whole attempt
        ],
        "{results:?}"
    );
    for (i, result) in results.iter().enumerate().skip(3).take(9) {
        assert!(
            matches!(
                result,
                Err(Error::LeaseNotHeld { .. } | Error::StaleFencingToken { .. })
            ),
            "report {i}: {result:?}"
        );
    }
    let task = |lease: &LeaseRecord| {
        let id = lease.task_id;
        async move { store.get_task(id).await.unwrap() }
    };
    let fresh_task = task(fresh).await;
    assert_eq!(
        (fresh_task.state, fresh_task.result, fresh_task.lease_id),
        (TaskState::Succeeded, Some(json!({"exit": 0})), None)
    );
    for lease in [stale, foreign] {
        assert_eq!(task(lease).await.state, TaskState::Leased);
        let stored = store.get_lease(lease.id).await.unwrap();
        assert_eq!((stored.state, stored.acked), (LeaseState::Granted, false));
        let kinds: Vec<String> = store
            .task_events(lease.task_id, 0, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, ["submitted", "leased", "released", "leased"]);
    }
    assert_eq!(task(gone).await.state, TaskState::Queued);
    assert_eq!(
        store.get_lease(gone.id).await.unwrap().state,
        LeaseState::Released
    );
    assert_eq!(task(&leases[4]).await.state, TaskState::Succeeded);
    let kept = store
        .task_output(leases[4].task_id, 0, None, 10)
        .await
        .unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let history = store.task_events(fresh.task_id, 0, 100).await.unwrap();
    assert_eq!(
        history.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        [
            "submitted",
            "leased",
            "released",
            "leased",
            "accepted",
            "started",
            "succeeded"
        ]
    );
    assert!(
        history[4..]
            .iter()
            .all(|e| e.lease_id == Some(fresh.id) && e.agent_id == Some(worker.id)),
        "{history:?}"
    );
    assert_eq!(store.get_agent(worker.id).await.unwrap().active_leases, 2);
}

/// PostgreSQL only: a report batch's fresh whole successes go through
/// `switchyard_settle_successes`, in a call of their own. With the function
/// gone, a batch holding one fails, writing nothing of it; a batch without
/// one still applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_successes_are_settled_in_a_call_of_their_own() {
    let fx = Fixture::postgres().await;
    let store = fx.store.as_ref();
    let worker = agent(store, "ns", "w1", 4).await;
    let mut leases = Vec::new();
    for i in 0..2 {
        let t = submit(store, task("ns", 0, 3), T0 + i).await;
        leases.push(grant(store, t.id, worker.id, T0 + 10).await);
    }
    let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
    sqlx::query("DROP FUNCTION switchyard_settle_successes")
        .execute(&mut conn)
        .await
        .unwrap();
    let failed = store
        .apply_reports(&whole_success(&leases[0]), T0 + 20)
        .await;
    assert!(failed.is_err(), "{failed:?}");
    let untouched = store.get_task(leases[0].task_id).await.unwrap();
    assert_eq!(untouched.state, TaskState::Leased);
    let started = store
        .apply_reports(
            &[
                report(&leases[1], ReportKind::Accepted),
                report(&leases[1], ReportKind::Started),
            ],
            T0 + 21,
        )
        .await
        .unwrap();
    assert!(started.iter().all(Result::is_ok), "{started:?}");
    assert_eq!(
        store.get_task(leases[1].task_id).await.unwrap().state,
        TaskState::Running
    );
    sqlx::Connection::close(conn).await.unwrap();
    fx.finish().await;
}

async fn heartbeats_renew_touch_and_write_documents(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let w1 = agent(store, "ns", "w1", 2).await;
    let w2 = agent(store, "ns", "w2", 2).await;
    let t = submit(store, task("ns", 0, 3), T0).await;
    let lease = grant(store, t.id, w1.id, T0 + 1).await;
    let write = |expected: u64, memory: u64| DocumentWrite {
        expected_generation: expected,
        generation: expected + 5,
        reported: json!({"memory": {"free": memory}}),
        document: json!({"memory": {"free": memory}}),
        provenance: json!({"memory.free": "dynamic"}),
    };
    let beats = [
        Beat {
            agent_id: w1.id,
            session_epoch: w1.session_epoch,
            renew: true,
            touch: true,
            status: None,
            document: Some(write(w1.generation, 512)),
            kinds: None,
            lift_refusals: false,
        },
        Beat {
            agent_id: w2.id,
            session_epoch: w2.session_epoch,
            renew: true,
            touch: true,
            status: Some((AgentStatus::Degraded, vec!["disk full".into()])),
            // Based on a generation the store no longer holds.
            document: Some(write(w2.generation + 7, 1)),
            kinds: None,
            lift_refusals: false,
        },
    ];
    let now = T0 + 10_000;
    let results = store.heartbeats(&beats, now).await.unwrap();
    // Each beat's outcome names the leases it renewed and their expiries
    // (the task's own TTL); w2 holds none.
    assert_eq!(
        *results[0].as_ref().unwrap(),
        BeatOutcome {
            applied: BeatApplied::Written(w1.generation + 5),
            renewed: vec![RenewedLease {
                lease_id: lease.id,
                task_id: t.id,
                expires_at_ms: now + t.lease_ttl_ms,
            }],
        }
    );
    assert_eq!(
        *results[1].as_ref().unwrap(),
        BeatOutcome {
            applied: BeatApplied::Stale(w2.generation),
            renewed: vec![],
        }
    );
    let l = store.get_lease(lease.id).await.unwrap();
    assert_eq!(l.expires_at_ms, now + t.lease_ttl_ms);
    let a1 = store.get_agent(w1.id).await.unwrap();
    assert_eq!(a1.reported, json!({"memory": {"free": 512}}));
    assert_eq!(a1.document, json!({"memory": {"free": 512}}));
    assert_eq!(a1.last_seen_at_ms, now);
    let a2 = store.get_agent(w2.id).await.unwrap();
    assert_eq!(
        (a2.status, a2.generation),
        (AgentStatus::Degraded, w2.generation)
    );
    assert_eq!(a2.status_reasons, ["disk full"]);
    assert_eq!(a2.document, w2.document);
    // A plain heartbeat of a missing agent is that beat's error only.
    let ghost = Beat {
        agent_id: uuid::Uuid::now_v7(),
        session_epoch: 1,
        renew: true,
        touch: true,
        status: None,
        document: Some(write(1, 1)),
        kinds: None,
        lift_refusals: false,
    };
    let plain = Beat {
        agent_id: w1.id,
        session_epoch: w1.session_epoch,
        renew: true,
        touch: false,
        status: None,
        document: None,
        kinds: None,
        lift_refusals: false,
    };
    let results = store.heartbeats(&[ghost, plain], now + 1).await.unwrap();
    assert!(
        matches!(results[0], Err(Error::NotFound { .. })),
        "{results:?}"
    );
    assert_eq!(
        *results[1].as_ref().unwrap(),
        BeatOutcome {
            applied: BeatApplied::Renewed,
            renewed: vec![RenewedLease {
                lease_id: lease.id,
                task_id: t.id,
                expires_at_ms: now + 1 + t.lease_ttl_ms,
            }],
        }
    );
}

/// A whole fresh attempt applied in one batch (the set-based path, which
/// keeps accepted and started in the row of the end) reads back the same
/// history as one applied a report at a time, entry for entry; and any page
/// of it (after any sequence, any limit) is the same slice of the whole.
async fn a_whole_attempts_history_reads_like_one_by_one_in_any_page(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let w = agent(store, "ns", "w", 4).await;
    let a = submit(store, task("ns", 0, 3), T0).await;
    let b = submit(store, task("ns", 0, 3), T0).await;
    let la = grant(store, a.id, w.id, T0 + 10).await;
    let lb = grant(store, b.id, w.id, T0 + 10).await;
    let whole = [
        report(&la, ReportKind::Accepted),
        report(&la, ReportKind::Started),
        report(&la, succeeded()),
    ];
    store.apply_reports(&whole, T0 + 20).await.unwrap();
    for kind in [ReportKind::Accepted, ReportKind::Started, succeeded()] {
        store
            .apply_reports(&[report(&lb, kind)], T0 + 20)
            .await
            .unwrap();
    }
    let full_a = store.task_events(a.id, 0, 100).await.unwrap();
    let full_b = store.task_events(b.id, 0, 100).await.unwrap();
    assert_eq!(steps(&full_a), steps(&full_b));
    assert_eq!(
        full_a.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        ["submitted", "leased", "accepted", "started", "succeeded"]
    );
    for e in &full_a[2..] {
        assert_eq!((e.agent_id, e.lease_id), (Some(w.id), Some(la.id)), "{e:?}");
    }
    for after in 0..=5u64 {
        for limit in 1..=6u32 {
            let page = store.task_events(a.id, after, limit).await.unwrap();
            let want: Vec<_> = full_a
                .iter()
                .filter(|e| e.sequence > after)
                .take(limit as usize)
                .cloned()
                .collect();
            assert_eq!(page, want, "after {after}, limit {limit}");
        }
    }
}
