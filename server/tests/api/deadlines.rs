//! Deadlines over real gRPC on both stores, with the server's own sweep:
//! an attempt past its execution timeout is revoked (TIMEOUT) and counted;
//! a handler that ignores a cancel is cut off at the grace while its agent
//! keeps renewing; a drain's deadline revokes and requeues what the agent
//! still holds; a task not leased by its start deadline FAILS with
//! `unschedulable` (parked) or `start_timeout` (agents busy) and the
//! explanation in its history. Deadlines out of range are refused naming
//! the field, and nothing is stored.

use serde_json::json;
use switchyard_proto::v1::{self as pb, connect_response::Message as Down, lease_update::Update};
use tonic::Code;

use crate::common::{
    Backend, TestAgent, TestServer, all_tasks, submit_request, task_events, wait_for_state,
};
use crate::on_both_stores;

on_both_stores!(
    an_execution_timeout_revokes_the_attempt_whatever_the_heartbeats,
    a_handler_that_ignores_a_cancel_is_cut_off_at_the_grace,
    a_drain_deadline_revokes_and_requeues_what_the_agent_holds,
    a_start_deadline_fails_a_task_with_the_explanation_as_it_stood,
    bad_deadlines_are_refused_naming_the_field,
);

fn ms(ms: i64) -> prost_types::Duration {
    switchyard_proto::convert::duration(ms)
}

/// Accepts and starts a grant.
async fn start(agent: &mut TestAgent, grant: &pb::LeaseGrant) {
    for update in [
        Update::Accepted(pb::LeaseAccepted {}),
        Update::Started(pb::LeaseStarted {}),
    ] {
        let ack = agent.update(grant, update).await;
        assert_eq!(ack.code, 0, "{}", ack.message);
    }
}

/// The next revocation the agent is sent.
async fn revocation(agent: &mut TestAgent) -> pb::LeaseRevocation {
    agent
        .expect("revocation", |m| match m {
            Down::LeaseRevocation(r) => Some(r.clone()),
            _ => None,
        })
        .await
}

async fn an_execution_timeout_revokes_the_attempt_whatever_the_heartbeats(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            max_attempts: 1,
            execution_timeout: Some(ms(1_000)),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(task.execution_timeout, Some(ms(1_000)));
    let grant = agent.grant().await;
    start(&mut agent, &grant).await;
    // Renewing changes nothing: the server ends the attempt at the timeout.
    let beat = agent.heartbeat(pb::AgentStatus::Ready, &[], None).await;
    assert_eq!(beat.code, 0, "{}", beat.message);
    let revoked = revocation(&mut agent).await;
    assert_eq!(revoked.lease_id, grant.lease_id);
    assert_eq!(revoked.reason(), pb::RevocationReason::Timeout);
    let failed = wait_for_state(&server, &task.task_id, pb::TaskState::Failed).await;
    assert_eq!(failed.attempts, 1);
    assert_eq!(failed.error.as_ref().unwrap().code, "timeout");
    // The agent's late report is refused: the lease is gone.
    let late = agent
        .update(
            &grant,
            Update::Succeeded(pb::LeaseSucceeded { result: None }),
        )
        .await;
    assert_ne!(late.code, 0);
    server.stop().await;
}

async fn a_handler_that_ignores_a_cancel_is_cut_off_at_the_grace(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 2).await;
    let task = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            cancel_grace: Some(ms(60_000)),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(task.cancel_grace, Some(ms(60_000)));
    let grant = agent.grant().await;
    start(&mut agent, &grant).await;
    // The cancel's own grace (1 s) comes before the task's (60 s).
    let asked = server
        .tasks()
        .await
        .cancel_task(pb::CancelTaskRequest {
            task_id: task.task_id.clone(),
            reason: "not needed".into(),
            grace: Some(ms(1_000)),
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    assert!(asked.cancel_requested);
    assert!(asked.cancel_deadline.is_some());
    assert_eq!(
        revocation(&mut agent).await.reason(),
        pb::RevocationReason::Canceled
    );
    // The handler ignores it and the agent keeps renewing the lease.
    let beat = agent.heartbeat(pb::AgentStatus::Ready, &[], None).await;
    assert_eq!(beat.code, 0, "{}", beat.message);
    let canceled = wait_for_state(&server, &task.task_id, pb::TaskState::Canceled).await;
    assert_eq!(canceled.attempts, 0);
    let events = task_events(&server, &task.task_id).await;
    let last = events.last().unwrap();
    assert_eq!(last.kind, "canceled");
    assert!(last.message.contains("grace"), "{}", last.message);
    let late = agent
        .update(
            &grant,
            Update::Succeeded(pb::LeaseSucceeded { result: None }),
        )
        .await;
    assert_ne!(late.code, 0);
    server.stop().await;
}

async fn a_drain_deadline_revokes_and_requeues_what_the_agent_holds(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut draining = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            ..Default::default()
        },
    )
    .await;
    let grant = draining.grant().await;
    start(&mut draining, &grant).await;
    let drained = server
        .admin()
        .await
        .drain_agent(pb::DrainAgentRequest {
            agent_id: draining.agent_id.clone(),
            reason: "maintenance".into(),
            deadline: Some(ms(0)),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert!(drained.drained);
    assert!(drained.drain_deadline.is_some());
    let revoked = revocation(&mut draining).await;
    assert_eq!(revoked.reason(), pb::RevocationReason::DrainDeadline);
    // Requeued without an attempt counted, and taken by another agent.
    let mut other = TestAgent::start(&server, "b", json!({}), 1).await;
    let regrant = other.grant().await;
    assert_eq!(regrant.task.as_ref().unwrap().task_id, task.task_id);
    other.run_to_success(&regrant, json!({})).await;
    let done = wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
    assert_eq!(done.attempts, 0);
    let kinds: Vec<String> = task_events(&server, &task.task_id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.contains(&"revoked".to_owned()), "{kinds:?}");
    server.stop().await;
}

async fn a_start_deadline_fails_a_task_with_the_explanation_as_it_stood(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({"tags": ["linux"]}), 1).await;
    // No agent has a GPU: parked, then unschedulable.
    let parked = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            placement: Some(pb::Placement {
                selector: "gpu".into(),
                ..Default::default()
            }),
            start_timeout: Some(ms(1_000)),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(parked.start_timeout, Some(ms(1_000)));
    // The one agent is busy: the second task waits for capacity, then
    // its start deadline passes.
    let busy = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            ..Default::default()
        },
    )
    .await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, busy.task_id);
    start(&mut agent, &grant).await;
    let waiting = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            start_timeout: Some(ms(1_000)),
            ..Default::default()
        },
    )
    .await;
    // A task without a start deadline waits on, parked.
    let patient = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            placement: Some(pb::Placement {
                selector: "gpu".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await;

    let failed = wait_for_state(&server, &parked.task_id, pb::TaskState::Failed).await;
    let error = failed.error.unwrap();
    assert_eq!(error.code, "unschedulable");
    assert!(!error.retryable);
    let events = task_events(&server, &parked.task_id).await;
    let last = events.last().unwrap();
    assert_eq!(last.kind, "failed");
    assert!(
        last.message.starts_with("unschedulable"),
        "{}",
        last.message
    );
    assert!(
        last.message.contains("0/1 agents eligible"),
        "{}",
        last.message
    );

    let failed = wait_for_state(&server, &waiting.task_id, pb::TaskState::Failed).await;
    assert_eq!(failed.error.unwrap().code, "start_timeout");
    let events = task_events(&server, &waiting.task_id).await;
    assert!(
        events
            .last()
            .unwrap()
            .message
            .starts_with("start deadline passed"),
        "{:?}",
        events.last()
    );

    let tasks = all_tasks(&server).await;
    let patient = tasks.iter().find(|t| t.task_id == patient.task_id).unwrap();
    assert_eq!(patient.state(), pb::TaskState::Queued);
    server.stop().await;
}

async fn bad_deadlines_are_refused_naming_the_field(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut tasks = server.tasks().await;
    let day = 86_400_000;
    let cases: Vec<(&str, pb::SubmitTaskRequest)> = vec![
        (
            "start_timeout",
            pb::SubmitTaskRequest {
                start_timeout: Some(ms(999)),
                ..Default::default()
            },
        ),
        (
            "start_timeout",
            pb::SubmitTaskRequest {
                start_timeout: Some(ms(31 * day)),
                ..Default::default()
            },
        ),
        (
            "execution_timeout",
            pb::SubmitTaskRequest {
                execution_timeout: Some(ms(8 * day)),
                ..Default::default()
            },
        ),
        (
            "cancel_grace",
            pb::SubmitTaskRequest {
                cancel_grace: Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                }),
                ..Default::default()
            },
        ),
        (
            "cancel_grace",
            pb::SubmitTaskRequest {
                cancel_grace: Some(ms(day + 1)),
                ..Default::default()
            },
        ),
    ];
    for (field, request) in cases {
        let request = pb::SubmitTaskRequest {
            kind: "exec".into(),
            ..request
        };
        let err = tasks.submit_task(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    assert!(all_tasks(&server).await.is_empty(), "nothing stored");

    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            ..Default::default()
        },
    )
    .await;
    agent.grant().await;
    let err = tasks
        .cancel_task(pb::CancelTaskRequest {
            task_id: task.task_id.clone(),
            reason: String::new(),
            grace: Some(ms(day + 1)),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("grace"), "{}", err.message());
    let err = server
        .admin()
        .await
        .drain_agent(pb::DrainAgentRequest {
            agent_id: agent.agent_id.clone(),
            reason: String::new(),
            deadline: Some(ms(8 * day)),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("deadline"), "{}", err.message());
    // Nothing changed: the task is not cancel-requested, the agent not drained.
    let tasks_now = all_tasks(&server).await;
    assert!(!tasks_now[0].cancel_requested);
    let shown = server
        .admin()
        .await
        .get_agent(pb::GetAgentRequest {
            agent_id: agent.agent_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert!(!shown.drained);
    server.stop().await;
}
