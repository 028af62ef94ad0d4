//! Retry policy over real gRPC on both stores: a task's policy is kept,
//! shown with its defaults filled in and followed after a failed attempt;
//! a task without one shows none; a policy out of range is refused naming
//! the field, and nothing is stored.

use prost_types::Duration;
use serde_json::json;
use switchyard_proto::convert::duration_ms;
use switchyard_proto::v1::{self as pb, lease_update::Update};

use crate::common::{
    Backend, TestAgent, TestServer, all_tasks, get_task, submit_request, task_events,
    wait_for_state,
};
use crate::on_both_stores;

on_both_stores!(
    a_retry_policy_is_kept_shown_and_followed,
    bad_retry_policies_are_refused_naming_the_field,
);

fn ms(ms: i64) -> Duration {
    switchyard_proto::convert::duration(ms)
}

fn submit(retry: Option<pb::RetryPolicy>) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        kind: "exec".into(),
        max_attempts: 3,
        retry,
        ..Default::default()
    }
}

async fn a_retry_policy_is_kept_shown_and_followed(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let plain = submit_request(&server, submit(None)).await;
    assert_eq!(plain.retry, None, "no policy named, none shown");

    let task = submit_request(
        &server,
        submit(Some(pb::RetryPolicy {
            initial_backoff: Some(ms(250)),
            multiplier: 1.0,
            jitter: Some(0.0),
            ..Default::default()
        })),
    )
    .await;
    let shown = pb::RetryPolicy {
        initial_backoff: Some(ms(250)),
        max_backoff: Some(ms(300_000)),
        multiplier: 1.0,
        jitter: Some(0.0),
    };
    assert_eq!(task.retry.as_ref(), Some(&shown));
    assert_eq!(get_task(&server, &task.task_id).await.retry, Some(shown));

    // The agent takes the plain task first (FIFO), and finishes it.
    let first = agent.grant().await;
    assert_eq!(first.task.as_ref().unwrap().task_id, plain.task_id);
    agent.run_to_success(&first, json!({})).await;

    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    let accepted = Update::Accepted(pb::LeaseAccepted {});
    assert_eq!(agent.update(&grant, accepted).await.code, 0);
    let failure = Update::Failed(pb::LeaseFailed {
        error: Some(pb::TaskError {
            message: "flaky".into(),
            code: "handler_error".into(),
            retryable: true,
            details: None,
            ..Default::default()
        }),
    });
    assert_eq!(agent.update(&grant, failure).await.code, 0);
    // The wait is the policy's, as the history tells it.
    let events = task_events(&server, &task.task_id).await;
    let failed = events.iter().find(|e| e.kind == "attempt_failed").unwrap();
    assert_eq!(failed.message, "attempt 1 failed; retrying in 250 ms");
    // And the retry comes back to the agent once it has passed.
    let retry = agent.grant().await;
    assert_eq!(retry.task.as_ref().unwrap().task_id, task.task_id);
    let leased = wait_for_state(&server, &task.task_id, pb::TaskState::Leased).await;
    assert_eq!(leased.attempts, 1);
    assert_eq!(
        leased
            .retry
            .as_ref()
            .and_then(|r| r.initial_backoff.as_ref())
            .and_then(duration_ms),
        Some(250)
    );
    server.stop().await;
}

async fn bad_retry_policies_are_refused_naming_the_field(backend: Backend) {
    let server = TestServer::start(backend).await;
    let cases = [
        (
            pb::RetryPolicy {
                initial_backoff: Some(ms(50)),
                ..Default::default()
            },
            "retry.initial_backoff",
        ),
        (
            pb::RetryPolicy {
                initial_backoff: Some(ms(90_000_000)),
                ..Default::default()
            },
            "retry.initial_backoff",
        ),
        (
            pb::RetryPolicy {
                initial_backoff: Some(ms(10_000)),
                max_backoff: Some(ms(5_000)),
                ..Default::default()
            },
            "retry.max_backoff",
        ),
        (
            pb::RetryPolicy {
                multiplier: 0.5,
                ..Default::default()
            },
            "retry.multiplier",
        ),
        (
            pb::RetryPolicy {
                multiplier: f64::NAN,
                ..Default::default()
            },
            "retry.multiplier",
        ),
        (
            pb::RetryPolicy {
                multiplier: 11.0,
                ..Default::default()
            },
            "retry.multiplier",
        ),
        (
            pb::RetryPolicy {
                jitter: Some(1.5),
                ..Default::default()
            },
            "retry.jitter",
        ),
        (
            pb::RetryPolicy {
                jitter: Some(-0.1),
                ..Default::default()
            },
            "retry.jitter",
        ),
    ];
    for (policy, field) in cases {
        let err = server
            .tasks()
            .await
            .submit_task(submit(Some(policy)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    assert!(all_tasks(&server).await.is_empty());
    server.stop().await;
}
