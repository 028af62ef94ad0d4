//! Hand-backs: every release (whatever its cause, by whichever path the
//! store settles it) and every grant revoked as never acknowledged counts
//! toward the task's bound, past which it FAILS; a busy release backs off;
//! a refusal (cannot handle, cannot decode) is recorded and lifted when the
//! agent changes or registers again; an agent's kinds are stored; the
//! agents a task's attempts failed or expired on are known (a retry avoids
//! them), and a release is not one of them.

use serde_json::json;
use switchyard_server::model::{
    Beat, CompletionOutcome, LeaseRecord, LeaseReport, ReleaseCause, ReportKind, TaskState,
    release_backoff_ms,
};
use switchyard_server::store::{ReportedDocument, Store};

use crate::common::{Fixture, MAX_RELEASES, T0, agent, completion, grant, submit, task};

crate::both_backends!(
    every_hand_back_counts_and_the_bound_fails_the_task,
    refusals_are_recorded_and_lifted_when_the_agent_changes,
    kinds_are_stored_at_registration_and_by_heartbeat,
    failed_agents_are_those_attempts_failed_or_expired_on,
);

async fn failed_agents_are_those_attempts_failed_or_expired_on(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let a = agent(store, "ns", "a", 2).await;
    let b = agent(store, "ns", "b", 2).await;
    let c = agent(store, "ns", "c", 2).await;
    let t = submit(store, task("ns", 0, 5), T0).await;
    assert!(store.failed_agents(t.id).await.unwrap().is_empty());
    let mut now = T0 + 10;

    // Fails on a.
    let lease = grant(store, t.id, a.id, now).await;
    let failed = CompletionOutcome::Failed {
        error: json!({"message": "exit 1", "retryable": true}),
        retryable: true,
    };
    store
        .complete_leases(&[completion(&lease, failed.clone())], now + 1)
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
    // Handed back by b: not a failure.
    now += 600_000;
    let lease = grant(store, t.id, b.id, now).await;
    let busy = released(ReleaseCause::Busy, "no room");
    store
        .complete_leases(&[completion(&lease, busy)], now + 1)
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
    // Expired on b before b acknowledged it: no attempt, b not named.
    now += 600_000;
    let lease = grant(store, t.id, b.id, now).await;
    assert_eq!(
        store
            .expire_leases(lease.expires_at_ms, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(store.failed_agents(t.id).await.unwrap(), [a.id]);
    // Lost on c.
    now += 600_000;
    let lease = grant(store, t.id, c.id, now).await;
    store
        .ack_leases(c.id, &[(lease.id, lease.fencing_token)], now + 1)
        .await
        .unwrap();
    assert_eq!(
        store
            .expire_leases(lease.expires_at_ms, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let mut expected = vec![a.id, c.id];
    expected.sort();
    assert_eq!(store.failed_agents(t.id).await.unwrap(), expected);
    // Failing on a again names it once.
    now += 600_000;
    let lease = grant(store, t.id, a.id, now).await;
    store
        .complete_leases(&[completion(&lease, failed)], now + 1)
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
    assert_eq!(store.failed_agents(t.id).await.unwrap(), expected);
    assert_eq!(store.get_task(t.id).await.unwrap().attempts, 3);
}

fn released(cause: ReleaseCause, reason: &str) -> CompletionOutcome {
    CompletionOutcome::Released {
        reason: reason.to_owned(),
        cause,
    }
}

fn report(lease: &LeaseRecord, kind: ReportKind) -> LeaseReport {
    LeaseReport {
        lease_id: lease.id,
        task_id: lease.task_id,
        agent_id: lease.agent_id,
        fencing_token: lease.fencing_token,
        kind,
    }
}

fn beat(agent_id: uuid::Uuid, epoch: u64) -> Beat {
    Beat {
        agent_id,
        session_epoch: epoch,
        renew: false,
        touch: false,
        status: None,
        document: None,
        kinds: None,
        lift_refusals: false,
    }
}

/// Releases by each path (a batch completion, a lone final report, a whole
/// attempt, a revoked grant), five of them: the fifth fails the task.
async fn every_hand_back_counts_and_the_bound_fails_the_task(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let w = agent(store, "ns", "w", 4).await;
    let t = submit(store, task("ns", 0, 3), T0).await;
    let mut now = T0 + 10;

    // 1: a batch completion, draining: back at once, no attempt counted.
    let lease = grant(store, t.id, w.id, now).await;
    let outcome = released(ReleaseCause::Draining, "agent shut down");
    store
        .complete_leases(&[completion(&lease, outcome)], now + 1)
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
    let after = store.get_task(t.id).await.unwrap();
    assert_eq!(
        (after.state, after.releases, after.attempts),
        (TaskState::Queued, 1, 0)
    );
    assert_eq!(after.not_before_ms, now + 1);

    // 2: a lone final report, busy: back after the jittered backoff.
    now += 100;
    let lease = grant(store, t.id, w.id, now).await;
    let busy = ReportKind::Final(released(ReleaseCause::Busy, "at capacity"));
    let results = store
        .apply_reports(&[report(&lease, busy)], now + 1)
        .await
        .unwrap();
    assert!(results[0].as_ref().unwrap().ended);
    let after = store.get_task(t.id).await.unwrap();
    assert_eq!((after.state, after.releases), (TaskState::Queued, 2));
    assert_eq!(after.not_before_ms, now + 1 + release_backoff_ms(2, t.id));
    now = after.not_before_ms;

    // 3: a whole attempt (accepted, started, released) in one batch.
    let lease = grant(store, t.id, w.id, now).await;
    let end = ReportKind::Final(released(ReleaseCause::Other, "gave up"));
    let batch = [
        report(&lease, ReportKind::Accepted),
        report(&lease, ReportKind::Started),
        report(&lease, end),
    ];
    let results = store.apply_reports(&batch, now + 1).await.unwrap();
    assert!(results[2].as_ref().unwrap().ended);
    let after = store.get_task(t.id).await.unwrap();
    assert_eq!((after.state, after.releases), (TaskState::Queued, 3));
    now = after.not_before_ms;

    // 4: a grant never acknowledged, revoked.
    grant(store, t.id, w.id, now).await;
    let revoked = store
        .revoke_unacked(Some(w.id), now + 1, now + 1)
        .await
        .unwrap();
    assert_eq!(revoked.len(), 1);
    let after = store.get_task(t.id).await.unwrap();
    assert_eq!((after.state, after.releases), (TaskState::Queued, 4));

    // 5: the bound: FAILED, with the reason, and no attempt spent.
    now += 10;
    let lease = grant(store, t.id, w.id, now).await;
    let outcome = released(ReleaseCause::CannotHandle, "no handler for kind exec");
    let done = store
        .complete_leases(&[completion(&lease, outcome)], now + 1)
        .await
        .unwrap();
    let failed = done[0].as_ref().unwrap().task.clone();
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.releases, MAX_RELEASES);
    assert_eq!(failed.attempts, 0);
    let error = failed.error.unwrap();
    assert_eq!(error["code"], "released_too_often");
    assert_eq!(error["retryable"], false);
    assert_eq!(
        error["message"],
        "released 5 times without running to the end; last: no handler for kind exec"
    );
    let history = store.task_events(t.id, 0, 100).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(
        (last.kind.as_str(), last.state),
        ("failed", TaskState::Failed)
    );

    // A revoked grant at the bound fails the task as well.
    let u = submit(store, task("ns", 0, 3), now).await;
    for i in 0..MAX_RELEASES {
        let at = now + 100 * i64::from(i + 1);
        grant(store, u.id, w.id, at).await;
        store
            .revoke_unacked(Some(w.id), at + 1, at + 1)
            .await
            .unwrap();
    }
    let failed = store.get_task(u.id).await.unwrap();
    assert_eq!(
        (failed.state, failed.releases),
        (TaskState::Failed, MAX_RELEASES)
    );
    assert_eq!(failed.error.unwrap()["code"], "released_too_often");
}

/// A cannot-handle or cannot-decode release records the refusal (by every
/// settling path); a heartbeat that lifts refusals, a new document and a new
/// registration each forget the agent's refusals.
async fn refusals_are_recorded_and_lifted_when_the_agent_changes(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let w = agent(store, "ns", "w", 4).await;
    let other = agent(store, "ns", "other", 4).await;
    let mut tasks = Vec::new();
    for i in 0..3 {
        tasks.push(submit(store, task("ns", 0, 3), T0 + i).await);
    }
    let now = T0 + 10;
    let leases: Vec<LeaseRecord> = {
        let mut leases = Vec::new();
        for t in &tasks {
            leases.push(grant(store, t.id, w.id, now).await);
        }
        leases
    };
    // Task 0 by a batch completion, task 1 by a lone report, task 2 by a
    // whole attempt; task 2's is "cannot decode".
    store
        .complete_leases(
            &[completion(
                &leases[0],
                released(ReleaseCause::CannotHandle, "no handler for kind exec"),
            )],
            now + 1,
        )
        .await
        .unwrap();
    let lone = ReportKind::Final(released(ReleaseCause::CannotHandle, "no handler"));
    let decode = ReportKind::Final(released(ReleaseCause::CannotDecode, "bad payload"));
    let batch = [
        report(&leases[1], lone),
        report(&leases[2], ReportKind::Accepted),
        report(&leases[2], ReportKind::Started),
        report(&leases[2], decode),
    ];
    for r in store.apply_reports(&batch, now + 1).await.unwrap() {
        r.unwrap();
    }
    assert_eq!(
        store.task_refusals(tasks[0].id).await.unwrap(),
        [(w.id, "no handler for kind exec".to_owned())]
    );
    assert_eq!(
        store.task_refusals(tasks[2].id).await.unwrap(),
        [(w.id, "bad payload".to_owned())]
    );
    let mut refused = store.agent_refusals(w.id).await.unwrap();
    refused.sort();
    let mut expected: Vec<_> = tasks.iter().map(|t| t.id).collect();
    expected.sort();
    assert_eq!(refused, expected);
    // A busy release and a release of another agent record nothing.
    let lease = grant(store, tasks[0].id, other.id, now + 2).await;
    store
        .complete_leases(
            &[completion(&lease, released(ReleaseCause::Busy, "later"))],
            now + 3,
        )
        .await
        .unwrap();
    assert!(store.agent_refusals(other.id).await.unwrap().is_empty());

    // A heartbeat that lifts them.
    let mut lift = beat(w.id, w.session_epoch);
    lift.lift_refusals = true;
    store.heartbeats(&[lift], now + 4).await.unwrap()[0]
        .as_ref()
        .unwrap();
    assert!(store.agent_refusals(w.id).await.unwrap().is_empty());
    assert!(store.task_refusals(tasks[0].id).await.unwrap().is_empty());

    // A new document.
    let lease = grant(store, tasks[1].id, w.id, now + 5).await;
    let outcome = released(ReleaseCause::CannotHandle, "no handler");
    store
        .complete_leases(&[completion(&lease, outcome)], now + 6)
        .await
        .unwrap();
    assert_eq!(store.agent_refusals(w.id).await.unwrap(), [tasks[1].id]);
    let held = store.get_agent(w.id).await.unwrap().generation;
    let doc = json!({"tags": ["linux", "docker"]});
    let document = ReportedDocument {
        reported: doc.clone(),
        document: doc,
        provenance: json!({}),
        rejections: json!([]),
    };
    store
        .update_agent_document(w.id, held, &document, now + 7)
        .await
        .unwrap();
    assert!(store.agent_refusals(w.id).await.unwrap().is_empty());

    // A new registration.
    let lease = grant(store, tasks[1].id, w.id, now + 8).await;
    let outcome = released(ReleaseCause::CannotDecode, "bad");
    store
        .complete_leases(&[completion(&lease, outcome)], now + 9)
        .await
        .unwrap();
    assert_eq!(store.agent_refusals(w.id).await.unwrap(), [tasks[1].id]);
    agent(store, "ns", "w", 4).await;
    assert!(store.agent_refusals(w.id).await.unwrap().is_empty());
}

/// Kinds are stored as registered, and replaced by a heartbeat's.
async fn kinds_are_stored_at_registration_and_by_heartbeat(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let w = agent(store, "ns", "w", 1).await;
    assert_eq!(w.handled_kinds, ["*"]);
    let mut change = beat(w.id, w.session_epoch);
    change.kinds = Some(vec!["build.*".to_owned(), "exec".to_owned()]);
    store.heartbeats(&[change], T0 + 1).await.unwrap()[0]
        .as_ref()
        .unwrap();
    let stored = store.get_agent(w.id).await.unwrap();
    assert_eq!(stored.handled_kinds, ["build.*", "exec"]);
    assert!(stored.kinds().handles("build.docker"));
    assert!(!stored.kinds().handles("deploy"));
    let store_dyn: &dyn Store = store;
    let listed = store_dyn
        .list_agents(
            "ns",
            &[],
            &switchyard_server::model::Page::default(),
            switchyard_server::model::AgentParts::Full,
        )
        .await
        .unwrap()
        .0;
    assert_eq!(listed[0].handled_kinds, ["build.*", "exec"]);
}
