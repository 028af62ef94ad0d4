//! ExplainTask and SimulatePlacement, checked word for word on a fixed fleet:
//! what an operator reads is part of the contract.

use serde_json::json;
use switchyard_proto::v1 as pb;
use switchyard_server::api::convert::json_to_struct;

use crate::common::{Backend, TestAgent, TestServer, submit};
use crate::on_both_stores;

/// alpha and delta can run `linux, docker, software.node.version@^20`;
/// delta is busy (one slot, held); bravo has the wrong node; charlie is
/// not linux (its first failing constraint).
async fn fleet(server: &TestServer) -> Vec<TestAgent> {
    let alpha = TestAgent::start(
        server,
        "alpha",
        json!({"os": "linux", "tags": ["linux", "docker"], "software": {"node": {"version": "20.11.0"}}}),
        2,
    )
    .await;
    let bravo = TestAgent::start(
        server,
        "bravo",
        json!({"os": "linux", "tags": ["linux", "docker"], "software": {"node": {"version": "18.19.0"}}}),
        2,
    )
    .await;
    let charlie = TestAgent::start(
        server,
        "charlie",
        json!({"os": "macos", "tags": ["macos"], "software": {"node": {"version": "20.1.0"}}}),
        2,
    )
    .await;
    let mut delta = TestAgent::start(
        server,
        "delta",
        json!({"os": "linux", "hostname": "delta", "tags": ["linux", "docker"], "software": {"node": {"version": "20.5.0"}}}),
        1,
    )
    .await;
    // Fill delta with a task only it can take, and hold it.
    submit(server, "fill", "hostname=delta").await;
    let grant = delta.grant().await;
    let ack = delta
        .update(
            &grant,
            pb::lease_update::Update::Accepted(pb::LeaseAccepted {}),
        )
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    vec![alpha, bravo, charlie, delta]
}

async fn explain_and_simulate_read_as_specified(backend: Backend) {
    let server = TestServer::start(backend).await;
    let agents = fleet(&server).await;
    let mut admin = server.admin().await;
    let reply = admin
        .simulate_placement(pb::SimulatePlacementRequest {
            namespace: String::new(),
            placement: Some(pb::Placement {
                selector: "linux, docker, software.node.version@^20".into(),
                ..Default::default()
            }),
            hypothetical_capabilities: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let lines: Vec<String> = reply
        .verdicts
        .iter()
        .map(|v| {
            format!(
                "{} eligible={} capable={} rank={} reason={}",
                v.agent_name, v.eligible, v.capable, v.rank, v.reason
            )
        })
        .collect();
    assert_eq!(
        reply.summary,
        "1/4 agents eligible: 1 at capacity, 1 missing tag linux, 1 software.node.version not ^20"
    );
    assert_eq!(
        lines,
        vec![
            "alpha eligible=true capable=false rank=1 reason=".to_owned(),
            "bravo eligible=false capable=false rank=0 reason=software.node.version VERSION ^20: have 18.19.0"
                .to_owned(),
            "charlie eligible=false capable=false rank=0 reason=missing tag linux".to_owned(),
            "delta eligible=false capable=true rank=0 reason=at capacity (1/1)".to_owned(),
        ]
    );

    // A parked task: nobody has a GPU.
    let gpu = submit(&server, "train", "linux, gpu").await;
    let explain = server
        .tasks()
        .await
        .explain_task(pb::ExplainTaskRequest {
            task_id: gpu.task_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        explain.task.unwrap().queued_reason(),
        pb::QueuedReason::Parked
    );
    assert_eq!(
        explain.summary,
        "0/4 agents eligible: 3 missing tag gpu, 1 missing tag linux"
    );

    // What would a GPU machine unpark?
    let what_if = admin
        .simulate_placement(pb::SimulatePlacementRequest {
            namespace: String::new(),
            placement: None,
            hypothetical_capabilities: Some(json_to_struct(&json!({"tags": ["linux", "gpu"]}))),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = what_if
        .placeable_tasks
        .iter()
        .map(|t| t.task_id.as_str())
        .collect();
    assert!(ids.contains(&gpu.task_id.as_str()), "{ids:?}");
    drop(agents);
    server.stop().await;
}

on_both_stores!(explain_and_simulate_read_as_specified);
