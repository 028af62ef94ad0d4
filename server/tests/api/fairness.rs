//! Fair share over real gRPC on both stores: key A submits 10,000 tasks,
//! then key B submits 10; one agent takes them one at a time. B's first
//! grant comes within a few grants (about one per key), and B is done
//! after about 30, with A's backlog still waiting. A weight out of range,
//! or a weight without a key, is refused naming the field.

use serde_json::json;
use switchyard_proto::v1 as pb;
use tonic::Code;

use crate::common::{Backend, TestAgent, TestServer, all_tasks, submit_request};
use crate::on_both_stores;

on_both_stores!(
    a_backlog_of_one_key_does_not_hold_back_another,
    bad_fairness_is_refused_naming_the_field,
);

fn keyed(key: &str) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        kind: "exec".into(),
        fairness_key: key.into(),
        ..Default::default()
    }
}

async fn a_backlog_of_one_key_does_not_hold_back_another(backend: Backend) {
    let server = TestServer::start(backend).await;
    // Key A's 1,200 (more than B could wait behind: it finishes within 21
    // grants, and more than a page of the list at the end), submitted by 16
    // clients at once while no agent is connected: all of them wait.
    let mut submitters = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let mut tasks = server.tasks().await;
        submitters.spawn(async move {
            for _ in 0..75 {
                tasks.submit_task(keyed("a")).await.expect("submit");
            }
        });
    }
    while let Some(done) = submitters.join_next().await {
        done.expect("submitter");
    }
    let mut b = Vec::new();
    for _ in 0..10 {
        b.push(submit_request(&server, keyed("b")).await.task_id);
    }
    let shown = submit_request(
        &server,
        pb::SubmitTaskRequest {
            fairness_weight: 3,
            ..keyed("c")
        },
    )
    .await;
    assert_eq!(
        (shown.fairness_key.as_str(), shown.fairness_weight),
        ("c", 3)
    );

    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let mut grants = 0;
    let mut first_b = None;
    let mut b_left = b.len();
    while b_left > 0 {
        let grant = agent.grant().await;
        grants += 1;
        let task_id = grant.task.as_ref().unwrap().task_id.clone();
        if b.contains(&task_id) {
            first_b.get_or_insert(grants);
            b_left -= 1;
        }
        agent.run_to_success(&grant, json!({})).await;
        assert!(grants <= 40, "B still waiting after {grants} grants");
    }
    // Three keys take turns, one task of each per rank however the
    // submits were batched: A, B and C share the first rank, then A and B
    // alternate, so B's first grant is among the first three and its last
    // is at most the 21st.
    assert!(
        first_b.unwrap() <= 3,
        "B's first grant was grant {first_b:?}"
    );
    assert!(grants <= 21, "B finished at grant {grants}");
    let waiting = server
        .tasks()
        .await
        .list_tasks(pb::ListTasksRequest {
            states: vec![pb::TaskState::Queued as i32],
            page_size: 1_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(waiting.tasks.len(), 1_000, "A's backlog still waits");
    assert!(!waiting.next_page_token.is_empty());
    server.stop().await;
}

async fn bad_fairness_is_refused_naming_the_field(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut tasks = server.tasks().await;
    for (field, request) in [
        (
            "fairness_weight",
            pb::SubmitTaskRequest {
                fairness_weight: 2,
                ..keyed("")
            },
        ),
        (
            "fairness_weight",
            pb::SubmitTaskRequest {
                fairness_weight: 101,
                ..keyed("a")
            },
        ),
        ("fairness_key", keyed(&"k".repeat(257))),
    ] {
        let err = tasks.submit_task(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    assert!(all_tasks(&server).await.is_empty(), "nothing stored");
    server.stop().await;
}
