//! `SubmitTasks` over real gRPC on both stores: many tasks in one call are
//! queued in their order (the first leased on the way in while an agent
//! has room, none overtaking an earlier one), each answered as `SubmitTask`
//! answers it, idempotency keys each on their own. A bad task refuses the
//! whole call naming it as `tasks[i].field`, and so does an empty or
//! oversized call; nothing is stored then, not even a concurrency limit
//! an earlier task of the call gave. The namespace's queue cap counts every
//! task of a call: one that would pass it is refused whole. So is a call
//! whose answer could pass the largest message: each task's answer takes
//! at most 1,024 bytes more than its request, which a full task checks.

use prost::Message;
use serde_json::json;
use switchyard_proto::v1 as pb;
use switchyard_server::api::convert::json_to_struct;
use tonic::Code;

use crate::common::{Backend, TestAgent, TestServer, all_tasks, submit_request};
use crate::on_both_stores;

on_both_stores!(
    tasks_are_queued_in_order_and_answered_each,
    a_bad_task_refuses_the_whole_call_naming_it,
    a_task_may_rely_on_a_limit_an_earlier_task_gives,
    the_queue_cap_counts_every_task_of_a_call,
    a_call_whose_answer_could_pass_the_largest_message_is_refused,
);

/// An `exec` task whose payload carries `n`.
fn numbered(n: u64) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        kind: "exec".into(),
        payload: Some(json_to_struct(&json!({ "n": n }))),
        ..Default::default()
    }
}

async fn submit_tasks(
    server: &TestServer,
    tasks: Vec<pb::SubmitTaskRequest>,
) -> Result<Vec<pb::SubmitTaskResponse>, tonic::Status> {
    let mut client = server.tasks().await;
    let reply = client
        .submit_tasks(pb::SubmitTasksRequest { tasks })
        .await?;
    Ok(reply.into_inner().results)
}

fn refused(result: Result<Vec<pb::SubmitTaskResponse>, tonic::Status>, field: &str) {
    let err = result.expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains(field), "{field}: {}", err.message());
}

async fn tasks_are_queued_in_order_and_answered_each(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 2).await;
    let mut requests: Vec<_> = (0..5).map(numbered).collect();
    requests[4].idempotency_key = "fifth".into();
    let results = submit_tasks(&server, requests.clone()).await.unwrap();
    assert_eq!(results.len(), 5);
    let ids: Vec<String> = results
        .iter()
        .map(|r| r.task.as_ref().unwrap().task_id.clone())
        .collect();
    for (n, result) in results.iter().enumerate() {
        assert!(result.created, "task {n} created");
        let task = result.task.as_ref().unwrap();
        assert_eq!(task.payload, Some(json_to_struct(&json!({ "n": n }))));
    }
    // Two slots: the first two were leased on the way in, the rest wait
    // for them, in their order.
    let first = agent.grant().await;
    let second = agent.grant().await;
    assert_eq!(first.task.as_ref().unwrap().task_id, ids[0]);
    assert_eq!(second.task.as_ref().unwrap().task_id, ids[1]);
    for (n, result) in results.iter().enumerate().skip(2) {
        let task = result.task.as_ref().unwrap();
        assert_eq!(task.state(), pb::TaskState::Queued, "task {n}");
        assert_eq!(
            task.queued_reason(),
            pb::QueuedReason::WaitingForCapacity,
            "task {n}"
        );
    }
    agent.run_to_success(&first, json!({})).await;
    let third = agent.grant().await;
    assert_eq!(third.task.as_ref().unwrap().task_id, ids[2]);
    // The key makes its task's submit idempotent, alone or in a call.
    let again = submit_tasks(&server, vec![numbered(5), requests[4].clone()])
        .await
        .unwrap();
    assert!(again[0].created);
    assert!(!again[1].created, "the key's task is answered");
    assert_eq!(again[1].task.as_ref().unwrap().task_id, ids[4]);
    assert_eq!(all_tasks(&server).await.len(), 6);
    server.stop().await;
}

async fn a_bad_task_refuses_the_whole_call_naming_it(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut bad = numbered(1);
    bad.max_attempts = 500;
    refused(
        submit_tasks(&server, vec![numbered(0), bad]).await,
        "tasks[1].max_attempts",
    );
    let mut bad = numbered(1);
    bad.kind = String::new();
    refused(
        submit_tasks(&server, vec![numbered(0), bad]).await,
        "tasks[1].kind",
    );
    refused(submit_tasks(&server, Vec::new()).await, "tasks");
    let many: Vec<_> = (0..1_001).map(numbered).collect();
    refused(submit_tasks(&server, many).await, "holds 1001 tasks");
    // A limit given by a task before one the call refuses is not set.
    let keyed = |key: &str, limit: u32| pb::SubmitTaskRequest {
        kind: "exec".into(),
        concurrency_key: key.into(),
        concurrency_limit: limit,
        ..Default::default()
    };
    let mut bad = numbered(2);
    bad.lease_ttl = Some(prost_types::Duration {
        seconds: -1,
        nanos: 0,
    });
    refused(
        submit_tasks(&server, vec![keyed("deploy", 3), bad]).await,
        "tasks[1].lease_ttl",
    );
    refused(
        submit_tasks(&server, vec![keyed("deploy", 0)]).await,
        "tasks[0].concurrency_limit",
    );
    assert!(all_tasks(&server).await.is_empty(), "nothing stored");
    server.stop().await;
}

async fn a_task_may_rely_on_a_limit_an_earlier_task_gives(backend: Backend) {
    let server = TestServer::start(backend).await;
    let keyed = |limit: u32| pb::SubmitTaskRequest {
        kind: "exec".into(),
        concurrency_key: "deploy".into(),
        concurrency_limit: limit,
        ..Default::default()
    };
    // Not before it: the later one's limit is not there yet.
    refused(
        submit_tasks(&server, vec![keyed(0), keyed(1)]).await,
        "tasks[0].concurrency_limit",
    );
    assert!(all_tasks(&server).await.is_empty(), "nothing stored");
    let results = submit_tasks(&server, vec![keyed(1), keyed(0)])
        .await
        .unwrap();
    assert_eq!(results.len(), 2);
    // The limit holds from then on, for a lone submit too.
    let mut agent = TestAgent::start(&server, "a", json!({}), 4).await;
    let grant = agent.grant().await;
    assert_eq!(
        grant.task.as_ref().unwrap().task_id,
        results[0].task.as_ref().unwrap().task_id
    );
    let lone = submit_request(&server, keyed(0)).await;
    assert_eq!(lone.queued_reason(), pb::QueuedReason::ConcurrencyLimit);
    server.stop().await;
}

async fn the_queue_cap_counts_every_task_of_a_call(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.max_queued_tasks_per_namespace = 3).await;
    submit_request(&server, numbered(0)).await;
    let err = submit_tasks(&server, (1..4).map(numbered).collect())
        .await
        .expect_err("past the cap");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message()
            .contains("namespace default has 1 queued tasks and the call adds 3; the limit is 3"),
        "{}",
        err.message()
    );
    assert_eq!(all_tasks(&server).await.len(), 1, "nothing more stored");
    let results = submit_tasks(&server, (1..3).map(numbered).collect())
        .await
        .unwrap();
    assert_eq!(results.len(), 2);
    let err = submit_request_err(&server, numbered(3)).await;
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(all_tasks(&server).await.len(), 3);
    server.stop().await;
}

async fn submit_request_err(server: &TestServer, request: pb::SubmitTaskRequest) -> tonic::Status {
    let mut client = server.tasks().await;
    client.submit_task(request).await.expect_err("refused")
}

async fn a_call_whose_answer_could_pass_the_largest_message_is_refused(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.max_message_bytes = 64 * 1024).await;
    let _agent = TestAgent::start(&server, "a", json!({}), 1).await;
    // Every field a task may carry: the answer repeats them and adds the
    // server's (ids, state, times, the lease of one leased on the way in).
    let full = |n: u64| pb::SubmitTaskRequest {
        kind: "exec".into(),
        payload: Some(json_to_struct(&json!({ "n": n }))),
        placement: Some(pb::Placement {
            selector: "".into(),
            ..Default::default()
        }),
        priority: 3,
        max_attempts: 5,
        lease_ttl: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        idempotency_key: format!("full-{n}"),
        labels: [("team".to_owned(), "web".to_owned())].into(),
        retry: Some(pb::RetryPolicy {
            multiplier: 2.0,
            ..Default::default()
        }),
        start_timeout: Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        }),
        execution_timeout: Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        }),
        cancel_grace: Some(prost_types::Duration {
            seconds: 5,
            nanos: 0,
        }),
        fairness_key: "tenant-1".into(),
        fairness_weight: 2,
        concurrency_key: "deploy".into(),
        concurrency_limit: 10,
        ..Default::default()
    };
    let mut requests: Vec<_> = (0..3).map(full).collect();
    // A keyed task waits for the round: the first is leased on the way in.
    requests[0].concurrency_key.clear();
    requests[0].concurrency_limit = 0;
    let results = submit_tasks(&server, requests.clone()).await.unwrap();
    assert_eq!(
        results[0].task.as_ref().unwrap().state(),
        pb::TaskState::Leased
    );
    for (request, result) in requests.iter().zip(&results) {
        let (asked, answered) = (request.encoded_len(), result.encoded_len());
        // 1,024: the server's allowance a task (`ANSWER_BYTES_PER_TASK`).
        assert!(
            answered + 3 <= asked + 1_024,
            "{answered} bytes answered for {asked} asked"
        );
    }
    // 70 small tasks: a request of about 1.5 KiB whose answer could pass
    // 64 KiB. Refused, and nothing stored.
    refused(
        submit_tasks(&server, (0..70).map(numbered).collect()).await,
        "past the largest message of 65536 (--max-message-bytes)",
    );
    assert_eq!(all_tasks(&server).await.len(), 3);
    let fits = submit_tasks(&server, (0..50).map(numbered).collect()).await;
    assert_eq!(fits.unwrap().len(), 50);
    server.stop().await;
}
