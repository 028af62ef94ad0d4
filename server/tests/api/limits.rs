//! Concurrency limits over real gRPC on both stores: a key's limit holds
//! its other tasks QUEUED with QUEUED_REASON_CONCURRENCY_LIMIT while an
//! agent has room, explain says which limit and how full it is, and a
//! finished task lets the next one run; the server's limit per namespace
//! does the same for every task of the namespace. A limit without a key,
//! out of range, or missing for a new key is refused naming the field, and
//! nothing is stored. Submits beyond what may wait for the store are pushed
//! back with RESOURCE_EXHAUSTED and when to try again, storing nothing.

use serde_json::json;
use switchyard_proto::v1 as pb;
use tonic::Code;

use crate::common::{Backend, TestAgent, TestServer, all_tasks, explain, get_task, submit_request};
use crate::on_both_stores;

on_both_stores!(
    a_key_limit_holds_tasks_back_and_explain_says_so,
    a_namespace_limit_holds_every_task_back,
    bad_limits_are_refused_naming_the_field,
    submits_past_what_waits_for_the_store_are_pushed_back_with_a_retry_hint,
);

fn keyed(key: &str, limit: u32) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        kind: "exec".into(),
        concurrency_key: key.into(),
        concurrency_limit: limit,
        ..Default::default()
    }
}

async fn a_key_limit_holds_tasks_back_and_explain_says_so(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 4).await;
    let first = submit_request(&server, keyed("deploy-prod", 1)).await;
    assert_eq!(first.concurrency_key, "deploy-prod");
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, first.task_id);
    // The key's limit is 1: the next waits though the agent has room.
    let second = submit_request(&server, keyed("deploy-prod", 0)).await;
    assert_eq!(second.queued_reason(), pb::QueuedReason::ConcurrencyLimit);
    let other = submit_request(&server, keyed("deploy-staging", 1)).await;
    let plain = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            ..Default::default()
        },
    )
    .await;
    let mut granted = vec![
        agent.grant().await.task.unwrap().task_id,
        agent.grant().await.task.unwrap().task_id,
    ];
    granted.sort();
    let mut want = vec![other.task_id.clone(), plain.task_id.clone()];
    want.sort();
    assert_eq!(granted, want, "other keys and no key are not held back");
    let shown = get_task(&server, &second.task_id).await;
    assert_eq!(shown.state(), pb::TaskState::Queued);
    assert_eq!(shown.queued_reason(), pb::QueuedReason::ConcurrencyLimit);
    let why = explain(&server, &second.task_id).await;
    assert!(
        why.summary
            .starts_with("held back by concurrency key deploy-prod: 1/1 running"),
        "{}",
        why.summary
    );
    // The first finishes: the second runs.
    agent.run_to_success(&grant, json!({})).await;
    let next = agent.grant().await;
    assert_eq!(next.task.unwrap().task_id, second.task_id);
    server.stop().await;
}

async fn a_namespace_limit_holds_every_task_back(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.max_running_tasks_per_namespace = 2).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 4).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let task = submit_request(
            &server,
            pb::SubmitTaskRequest {
                kind: "exec".into(),
                ..Default::default()
            },
        )
        .await;
        ids.push(task.task_id);
    }
    let a = agent.grant().await;
    let b = agent.grant().await;
    let third = &ids[2];
    assert_ne!(a.task.as_ref().unwrap().task_id, *third);
    assert_ne!(b.task.as_ref().unwrap().task_id, *third);
    let shown = get_task(&server, third).await;
    assert_eq!(shown.queued_reason(), pb::QueuedReason::ConcurrencyLimit);
    let why = explain(&server, third).await;
    assert!(
        why.summary
            .starts_with("held back by namespace default: 2/2 running"),
        "{}",
        why.summary
    );
    agent.run_to_success(&a, json!({})).await;
    assert_eq!(agent.grant().await.task.unwrap().task_id, *third);
    server.stop().await;
}

async fn bad_limits_are_refused_naming_the_field(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut tasks = server.tasks().await;
    for (field, request) in [
        ("concurrency_limit", keyed("", 2)),
        ("concurrency_limit", keyed("k", 10_001)),
        ("concurrency_limit", keyed("never-set", 0)),
        ("concurrency_key", keyed(&"k".repeat(257), 1)),
    ] {
        let err = tasks.submit_task(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    assert!(all_tasks(&server).await.is_empty(), "nothing stored");
    server.stop().await;
}

/// With at most one submit allowed to wait for the store, 200 submits at
/// once: every one is either stored or pushed back with RESOURCE_EXHAUSTED,
/// a message saying what is full, and a `RetryInfo` saying when to try
/// again; a pushed-back submit stored nothing.
async fn submits_past_what_waits_for_the_store_are_pushed_back_with_a_retry_hint(backend: Backend) {
    use tonic_types::StatusExt;
    let server = TestServer::start_with(backend, |c| c.max_submits_waiting = 1).await;
    let client = server.tasks().await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..200 {
        let mut client = client.clone();
        calls.spawn(async move {
            client
                .submit_task(pb::SubmitTaskRequest {
                    kind: "exec".into(),
                    idempotency_key: format!("burst-{i}"),
                    ..Default::default()
                })
                .await
        });
    }
    let mut stored = 0;
    let mut pushed_back = 0;
    while let Some(result) = calls.join_next().await {
        let result = result.unwrap();
        match result {
            Ok(_) => stored += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("waiting for the store"),
                    "{}",
                    status.message()
                );
                let retry = status.get_details_retry_info().expect("a RetryInfo");
                assert!(retry.retry_delay.is_some_and(|d| !d.is_zero()));
                pushed_back += 1;
            }
        }
    }
    assert!(
        pushed_back > 0,
        "none of 200 submits at once was pushed back"
    );
    let listed = server
        .tasks()
        .await
        .list_tasks(pb::ListTasksRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tasks;
    assert_eq!(listed.len(), stored);
    server.stop().await;
}
