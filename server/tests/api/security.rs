//! Auth and tenancy, and the limits: every role against every RPC, across
//! namespaces and across agents, each refusal its own assertion; message,
//! document and namespace limits with the right code and message.

use serde_json::json;
use switchyard_proto::v1::{
    self as pb, agent_admin_service_client::AgentAdminServiceClient,
    agent_service_client::AgentServiceClient, task_service_client::TaskServiceClient,
};
use switchyard_server::api::convert::json_to_struct;
use tonic::{Code, Request};

use crate::common::{Backend, TestServer};

const AGENT_A: &str = "sy_agent_alpha_0123456789";
const AGENT_A2: &str = "sy_agent_alpha_second_0123";
const SUBMITTER_A: &str = "sy_submitter_alpha_012345";
const OPERATOR_A: &str = "sy_operator_alpha_0123456";
const OPERATOR_B: &str = "sy_operator_beta_01234567";

fn tokens_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens.json");
    let entries = json!([
        {"name": "agent-a", "namespace": "alpha", "role": "agent", "token": AGENT_A},
        {"name": "agent-a2", "namespace": "alpha", "role": "agent", "token": AGENT_A2},
        {"name": "submitter-a", "namespace": "alpha", "role": "submitter", "token": SUBMITTER_A},
        // Given as a hash: the file need not hold the token in clear.
        {"name": "operator-a", "namespace": "alpha", "role": "operator",
         "sha256": switchyard_server::auth::hash_token(OPERATOR_A)},
        {"name": "operator-b", "namespace": "beta", "role": "operator", "token": OPERATOR_B},
    ]);
    std::fs::write(&path, entries.to_string()).unwrap();
    path
}

fn req<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(message);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// Everything one RPC needs, created with the right tokens.
struct Fixture {
    agent_id: String,
    task_id: String,
}

async fn fixture(server: &TestServer) -> Fixture {
    let channel = server.channel().await;
    let reg = AgentServiceClient::new(channel.clone())
        .register_agent(req(
            pb::RegisterAgentRequest {
                name: "alpha-1".into(),
                namespace: "alpha".into(),
                capabilities: Some(json_to_struct(&json!({"tags": ["linux"]}))),
                capacity: 1,
                handled_kinds: vec!["*".into()],
                ..Default::default()
            },
            Some(AGENT_A),
        ))
        .await
        .unwrap()
        .into_inner();
    let task = TaskServiceClient::new(channel)
        .submit_task(req(
            pb::SubmitTaskRequest {
                namespace: "alpha".into(),
                kind: "never".into(),
                ..Default::default()
            },
            Some(SUBMITTER_A),
        ))
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    Fixture {
        agent_id: reg.agent_id,
        task_id: task.task_id,
    }
}

/// Calls every RPC once with `token`; returns (rpc, code) pairs.
async fn call_all(
    server: &TestServer,
    f: &Fixture,
    token: Option<&str>,
) -> Vec<(&'static str, Code)> {
    let channel = server.channel().await;
    let mut agents = AgentServiceClient::new(channel.clone());
    let mut tasks = TaskServiceClient::new(channel.clone());
    let mut admin = AgentAdminServiceClient::new(channel);
    let task_id = f.task_id.clone();
    let agent_id = f.agent_id.clone();
    let mut out = Vec::new();
    out.push((
        "RegisterAgent",
        code(
            agents
                .register_agent(req(
                    pb::RegisterAgentRequest {
                        name: "alpha-2".into(),
                        namespace: "alpha".into(),
                        capacity: 1,
                        handled_kinds: vec!["*".into()],
                        ..Default::default()
                    },
                    token,
                ))
                .await,
        ),
    ));
    // Connect: the first message is checked before the stream is accepted.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(pb::ConnectRequest {
        sequence: 1,
        message: Some(pb::connect_request::Message::Hello(pb::Hello {
            agent_id: agent_id.clone(),
            session_epoch: 0,
            held_leases: vec![],
        })),
    })
    .await
    .unwrap();
    let connect = agents
        .connect(req(tokio_stream::wrappers::ReceiverStream::new(rx), token))
        .await;
    // A stale epoch is FAILED_PRECONDITION for an allowed caller: auth passed.
    out.push(("Connect", code(connect)));
    out.push((
        "SubmitTask",
        code(
            tasks
                .submit_task(req(
                    pb::SubmitTaskRequest {
                        namespace: "alpha".into(),
                        kind: "k".into(),
                        ..Default::default()
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "SubmitTasks",
        code(
            tasks
                .submit_tasks(req(
                    pb::SubmitTasksRequest {
                        tasks: vec![pb::SubmitTaskRequest {
                            namespace: "alpha".into(),
                            kind: "k".into(),
                            ..Default::default()
                        }],
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "GetTask",
        code(
            tasks
                .get_task(req(
                    pb::GetTaskRequest {
                        task_id: task_id.clone(),
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "ListTasks",
        code(
            tasks
                .list_tasks(req(
                    pb::ListTasksRequest {
                        namespace: "alpha".into(),
                        ..Default::default()
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "ExplainTask",
        code(
            tasks
                .explain_task(req(
                    pb::ExplainTaskRequest {
                        task_id: task_id.clone(),
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "ListTaskEvents",
        code(
            tasks
                .list_task_events(req(
                    pb::ListTaskEventsRequest {
                        task_id: task_id.clone(),
                        ..Default::default()
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "WatchTask",
        code(
            tasks
                .watch_task(req(
                    pb::WatchTaskRequest {
                        task_id: task_id.clone(),
                        ..Default::default()
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "ListAgents",
        code(
            admin
                .list_agents(req(
                    pb::ListAgentsRequest {
                        namespace: "alpha".into(),
                        ..Default::default()
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "GetAgent",
        code(
            admin
                .get_agent(req(
                    pb::GetAgentRequest {
                        agent_id: agent_id.clone(),
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "SetAgentOverrides",
        code(
            admin
                .set_agent_overrides(req(
                    pb::SetAgentOverridesRequest {
                        agent_id: agent_id.clone(),
                        overrides: None,
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "DrainAgent",
        code(
            admin
                .drain_agent(req(
                    pb::DrainAgentRequest {
                        agent_id: agent_id.clone(),
                        reason: String::new(),
                        ..Default::default()
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "UndrainAgent",
        code(
            admin
                .undrain_agent(req(
                    pb::UndrainAgentRequest {
                        agent_id: agent_id.clone(),
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "SimulatePlacement",
        code(
            admin
                .simulate_placement(req(
                    pb::SimulatePlacementRequest {
                        namespace: "alpha".into(),
                        placement: Some(pb::Placement::default()),
                        ..Default::default()
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "GetQueueSummary",
        code(
            tasks
                .get_queue_summary(req(
                    pb::GetQueueSummaryRequest {
                        namespace: "alpha".into(),
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "WatchQueue",
        code(
            tasks
                .watch_queue(req(
                    pb::WatchQueueRequest {
                        namespace: "alpha".into(),
                    },
                    token,
                ))
                .await,
        ),
    ));
    out.push((
        "WatchAgents",
        code(
            admin
                .watch_agents(req(
                    pb::WatchAgentsRequest {
                        namespace: "alpha".into(),
                        selector: String::new(),
                    },
                    token,
                ))
                .await,
        ),
    ));
    // Last: cancel (it changes the task).
    out.push((
        "CancelTask",
        code(
            tasks
                .cancel_task(req(
                    pb::CancelTaskRequest {
                        task_id,
                        reason: String::new(),
                        ..Default::default()
                    },
                    token,
                ))
                .await,
        ),
    ));
    out
}

async fn auth_matrix(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let file = tokens_file(dir.path());
    let server = TestServer::start_with(backend, |c| c.tokens_file = Some(file)).await;
    let f = fixture(&server).await;
    use Code::{
        FailedPrecondition as Stale, NotFound, Ok as Allowed, PermissionDenied as Denied,
        Unauthenticated as NoAuth,
    };
    // (token, expected code per RPC in call_all's order)
    let rpcs = [
        "RegisterAgent",
        "Connect",
        "SubmitTask",
        "SubmitTasks",
        "GetTask",
        "ListTasks",
        "ExplainTask",
        "ListTaskEvents",
        "WatchTask",
        "ListAgents",
        "GetAgent",
        "SetAgentOverrides",
        "DrainAgent",
        "UndrainAgent",
        "SimulatePlacement",
        "GetQueueSummary",
        "WatchQueue",
        "WatchAgents",
        "CancelTask",
    ];
    let cases: Vec<(&str, Option<&str>, [Code; 19])> = vec![
        ("no token", None, [NoAuth; 19]),
        ("unknown token", Some("sy_not_a_token"), [NoAuth; 19]),
        (
            "agent of alpha",
            Some(AGENT_A),
            [
                Allowed, Stale, Denied, Denied, Denied, Denied, Denied, Denied, Denied, Denied,
                Denied, Denied, Denied, Denied, Denied, Denied, Denied, Denied, Denied,
            ],
        ),
        (
            "submitter of alpha",
            Some(SUBMITTER_A),
            [
                Denied, Denied, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed,
                Denied, Denied, Denied, Denied, Denied, Denied, Allowed, Allowed, Denied, Allowed,
            ],
        ),
        (
            "operator of alpha",
            Some(OPERATOR_A),
            [
                Denied, Denied, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed,
                Allowed, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed,
                Allowed,
            ],
        ),
        // Another namespace: named namespaces are refused, ids are invisible.
        (
            "operator of beta",
            Some(OPERATOR_B),
            [
                Denied, NotFound, Denied, Denied, NotFound, Denied, NotFound, NotFound, NotFound,
                Denied, NotFound, NotFound, NotFound, NotFound, Denied, Denied, Denied, Denied,
                NotFound,
            ],
        ),
    ];
    for (who, token, expected) in cases {
        let got = call_all(&server, &f, token).await;
        for ((rpc, code), (want_rpc, want)) in got.iter().zip(rpcs.iter().zip(expected)) {
            assert_eq!(rpc, want_rpc);
            assert_eq!(
                *code, want,
                "{who} calling {rpc}: got {code:?}, want {want:?}"
            );
        }
    }
    server.stop().await;
}

async fn an_agent_reports_only_on_its_own_leases(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let file = tokens_file(dir.path());
    let server = TestServer::start_with(backend, |c| c.tokens_file = Some(file)).await;
    let channel = server.channel().await;
    let mut agents = AgentServiceClient::new(channel.clone());
    let register = |name: &'static str, token: &'static str| {
        let mut agents = agents.clone();
        async move {
            agents
                .register_agent(req(
                    pb::RegisterAgentRequest {
                        name: name.into(),
                        namespace: "alpha".into(),
                        capabilities: Some(json_to_struct(&json!({"tags": [name]}))),
                        capacity: 1,
                        handled_kinds: vec!["*".into()],
                        ..Default::default()
                    },
                    Some(token),
                ))
                .await
                .unwrap()
                .into_inner()
        }
    };
    let owner = register("owner", AGENT_A).await;
    let thief = register("thief", AGENT_A2).await;
    let _ = &mut agents;
    let connect = |reg: pb::RegisterAgentResponse, token: &'static str| {
        let mut agents = AgentServiceClient::new(channel.clone());
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel(16);
            tx.send(pb::ConnectRequest {
                sequence: 1,
                message: Some(pb::connect_request::Message::Hello(pb::Hello {
                    agent_id: reg.agent_id.clone(),
                    session_epoch: reg.session_epoch,
                    held_leases: vec![],
                })),
            })
            .await
            .unwrap();
            let stream = agents
                .connect(req(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                    Some(token),
                ))
                .await
                .unwrap()
                .into_inner();
            (tx, stream)
        }
    };
    let (_otx, mut ostream) = connect(owner, AGENT_A).await;
    let (ttx, mut tstream) = connect(thief, AGENT_A2).await;
    use tokio_stream::StreamExt;
    TaskServiceClient::new(server.channel().await)
        .submit_task(req(
            pb::SubmitTaskRequest {
                namespace: "alpha".into(),
                kind: "k".into(),
                placement: Some(pb::Placement {
                    selector: "owner".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Some(SUBMITTER_A),
        ))
        .await
        .unwrap();
    let grant = loop {
        let m = tokio::time::timeout(crate::common::PROMPT, ostream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(pb::connect_response::Message::LeaseGrant(g)) = m.message {
            break g;
        }
    };
    // The other agent (same namespace, same role) reports success on it.
    ttx.send(pb::ConnectRequest {
        sequence: 2,
        message: Some(pb::connect_request::Message::LeaseUpdate(pb::LeaseUpdate {
            lease_id: grant.lease_id.clone(),
            task_id: grant.task.unwrap().task_id,
            fencing_token: grant.fencing_token,
            update: Some(pb::lease_update::Update::Succeeded(pb::LeaseSucceeded {
                result: None,
            })),
        })),
    })
    .await
    .unwrap();
    let ack = loop {
        let m = tokio::time::timeout(crate::common::PROMPT, tstream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(pb::connect_response::Message::Ack(a)) = m.message
            && a.sequence == 2
        {
            break a;
        }
    };
    assert_eq!(ack.code, Code::FailedPrecondition as i32, "{}", ack.message);
    server.stop().await;
}

/// Far below the cap a submit is admitted on a recent count; near it every
/// submit counts afresh, so the cap still holds to the task.
async fn a_bulk_submit_to_a_namespace_not_the_tokens_names_the_task(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let file = tokens_file(dir.path());
    let server = TestServer::start_with(backend, |c| c.tokens_file = Some(file)).await;
    let mut tasks = server.tasks().await;
    let task = |namespace: &str| pb::SubmitTaskRequest {
        namespace: namespace.into(),
        kind: "k".into(),
        ..Default::default()
    };
    let call = pb::SubmitTasksRequest {
        tasks: vec![task("alpha"), task("beta")],
    };
    let err = tasks
        .submit_tasks(req(call, Some(SUBMITTER_A)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().starts_with("tasks[1]: "), "{}", err.message());
    let listed = tasks
        .list_tasks(req(
            pb::ListTasksRequest {
                namespace: "alpha".into(),
                ..Default::default()
            },
            Some(SUBMITTER_A),
        ))
        .await
        .unwrap()
        .into_inner()
        .tasks;
    assert!(listed.is_empty(), "nothing stored: {listed:?}");
    server.stop().await;
}

async fn the_queue_cap_is_exact_near_the_cap(backend: Backend) {
    let server = TestServer::start_with(backend, |c| {
        c.max_queued_tasks_per_namespace = 20;
    })
    .await;
    let mut tasks = server.tasks().await;
    let submit = || pb::SubmitTaskRequest {
        kind: "k".into(),
        ..Default::default()
    };
    for i in 0..20 {
        tasks
            .submit_task(submit())
            .await
            .unwrap_or_else(|e| panic!("submit {i}: {e}"));
    }
    let err = tasks.submit_task(submit()).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message()
            .contains("namespace default has 20 queued tasks; the limit is 20"),
        "{}",
        err.message()
    );
    server.stop().await;
}

async fn limits_refuse_with_the_right_code_and_message(backend: Backend) {
    let server = TestServer::start_with(backend, |c| {
        c.max_queued_tasks_per_namespace = 2;
        c.max_agents_per_namespace = 1;
        c.max_message_bytes = 64 * 1024;
    })
    .await;
    let mut tasks = server.tasks().await;
    for _ in 0..2 {
        tasks
            .submit_task(pb::SubmitTaskRequest {
                kind: "k".into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let err = tasks
        .submit_task(pb::SubmitTaskRequest {
            kind: "k".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message()
            .contains("namespace default has 2 queued tasks; the limit is 2"),
        "{}",
        err.message()
    );

    let mut agents = AgentServiceClient::new(server.channel().await);
    let register = |name: &str| pb::RegisterAgentRequest {
        name: name.into(),
        capacity: 1,
        handled_kinds: vec!["*".into()],
        ..Default::default()
    };
    agents.register_agent(register("one")).await.unwrap();
    agents
        .register_agent(register("one"))
        .await
        .expect("re-registering an existing agent is not a new one");
    let err = agents.register_agent(register("two")).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message()
            .contains("the limit is 1 (--max-agents-per-namespace)"),
        "{}",
        err.message()
    );

    // Message size.
    let big = json!({"blob": "x".repeat(100 * 1024)});
    let err = tasks
        .submit_task(pb::SubmitTaskRequest {
            kind: "k".into(),
            payload: Some(json_to_struct(&big)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err.code(), Code::ResourceExhausted | Code::OutOfRange),
        "{err:?}"
    );

    // Document limits: too deep.
    // 33 levels: over the document limit (32), under protobuf's own
    // recursion limit of 100 messages (a JSON level is three of them).
    let mut deep = json!(1);
    for _ in 0..32 {
        deep = json!({"d": deep});
    }
    let err = agents
        .register_agent(pb::RegisterAgentRequest {
            name: "one".into(),
            capacity: 1,
            capabilities: Some(json_to_struct(&json!({"deep": deep}))),
            handled_kinds: vec!["*".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("capabilities.deep"),
        "{}",
        err.message()
    );
    server.stop().await;
}

crate::on_both_stores!(
    auth_matrix,
    an_agent_reports_only_on_its_own_leases,
    limits_refuse_with_the_right_code_and_message,
    the_queue_cap_is_exact_near_the_cap,
    a_bulk_submit_to_a_namespace_not_the_tokens_names_the_task,
);
