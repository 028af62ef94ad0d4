//! Anything the server accepts, every runner can decode: a real server is
//! driven to its limits (a capability document and operator overrides 32
//! levels deep, a task whose payload, result, JSON Schema, operands and
//! failure details are each as deep as allowed), and every message it sends
//! carrying them (a grant, a task listing page, an agent, an explanation,
//! a simulation, a watch) is decoded here by prost with its default limits
//! (the generated clients did so to receive them) and written, re-encoded,
//! to `target/wire-limits/`, where the Python runner's tests decode them
//! with Python's protobuf and the Node runner's with protobuf-es.

use prost::Message;
use serde_json::{Value, json};
use switchyard_proto::v1 as pb;
use switchyard_server::api::convert::json_to_struct;
use tokio_stream::StreamExt;

use crate::common::{Backend, TestAgent, TestServer, submit_request};

/// Objects `levels` deep below (and counting) the outermost.
fn nested(levels: usize) -> Value {
    let mut v = json!("leaf");
    for _ in 0..levels {
        v = json!({"d": v});
    }
    v
}

/// Where the corpus goes: `target/wire-limits` at the repository root.
fn corpus_dir() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("target").join("wire-limits");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn keep<M: Message + Default>(backend: Backend, name: &str, message: &M) {
    let bytes = message.encode_to_vec();
    M::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{name} does not decode: {e}"));
    let file = corpus_dir().join(format!("{backend:?}-{name}.binpb").to_lowercase());
    std::fs::write(file, bytes).unwrap();
}

fn deepest_placement(tag: &str) -> pb::Placement {
    pb::Placement {
        required_tags: vec![tag.into()],
        // The schema object is level 1 of 32.
        json_schema: Some(json_to_struct(&json!({"properties": nested(31)}))),
        requirements: vec![pb::Requirement {
            key: "deep".into(),
            operator: pb::Operator::Ne as i32,
            // An operand 8 levels deep, the most allowed.
            values: vec![switchyard_proto::convert::json_to_value(&nested(8))],
        }],
        ..Default::default()
    }
}

async fn what_the_server_accepts_every_runner_decodes(backend: Backend) {
    let server = TestServer::start(backend).await;
    // The document object is level 1 of 32.
    let document = json!({"tags": ["deep"], "deep": nested(31)});
    let mut agent = TestAgent::start(&server, "deep-agent", document.clone(), 2).await;
    let mut admin = server.admin().await;
    admin
        .set_agent_overrides(pb::SetAgentOverridesRequest {
            agent_id: agent.agent_id.clone(),
            overrides: Some(json_to_struct(&json!({"op": nested(31)}))),
        })
        .await
        .unwrap();
    let submit = |tag: &str| pb::SubmitTaskRequest {
        kind: "deep".into(),
        payload: Some(json_to_struct(&json!({"p": nested(31)}))),
        placement: Some(deepest_placement(tag)),
        max_attempts: 1,
        ..Default::default()
    };
    let done = submit_request(&server, submit("deep")).await;
    let mut watch = server
        .tasks()
        .await
        .watch_task(pb::WatchTaskRequest {
            task_id: done.task_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let grant = agent.grant().await;
    keep(
        backend,
        "grant",
        &pb::ConnectResponse {
            message: Some(pb::connect_response::Message::LeaseGrant(grant.clone())),
        },
    );
    agent.run_to_success(&grant, json!({"r": nested(31)})).await;
    let failed = submit_request(&server, submit("deep")).await;
    let grant = agent.grant().await;
    let ack = agent
        .update(
            &grant,
            pb::lease_update::Update::Failed(pb::LeaseFailed {
                error: Some(pb::TaskError {
                    message: "failed".into(),
                    code: "handler_error".into(),
                    retryable: false,
                    // The details object is level 1 of 8.
                    details: Some(json_to_struct(&json!({"x": nested(7)}))),
                    ..Default::default()
                }),
            }),
        )
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    // Parked: a tag nobody has.
    let parked = submit_request(&server, submit("nobody")).await;

    let mut tasks = server.tasks().await;
    let mut last = None;
    while let Some(Ok(update)) = watch.next().await {
        let finished = update
            .task
            .as_ref()
            .is_some_and(|t| t.state == pb::TaskState::Succeeded as i32);
        last = Some(update);
        if finished {
            break;
        }
    }
    keep(backend, "watch", &last.expect("watch updates"));
    let page = tasks
        .list_tasks(pb::ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.tasks.len(), 3);
    let failed_task = page
        .tasks
        .iter()
        .find(|t| t.task_id == failed.task_id)
        .unwrap();
    assert!(
        failed_task
            .error
            .as_ref()
            .is_some_and(|e| e.details.is_some()),
        "{failed_task:?}"
    );
    keep(backend, "task-page", &page);
    let explained = tasks
        .explain_task(pb::ExplainTaskRequest {
            task_id: parked.task_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    keep(backend, "explain", &explained);
    let got = admin
        .get_agent(pb::GetAgentRequest {
            agent_id: agent.agent_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    keep(backend, "agent", &got);
    let simulated = admin
        .simulate_placement(pb::SimulatePlacementRequest {
            placement: Some(deepest_placement("deep")),
            hypothetical_capabilities: Some(json_to_struct(
                &json!({"tags": ["nobody"], "deep": nested(31)}),
            )),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(simulated.placeable_tasks.len(), 1, "{simulated:?}");
    keep(backend, "simulation", &simulated);
    server.stop().await;
}

crate::on_both_stores!(what_the_server_accepts_every_runner_decodes);
