//! The holes an attacker's probe found, each held shut: a poison task the
//! runners cannot decode, agent values read through explanations, secrets
//! kept because of their key's name only, and inputs with no bound.

use prost::Message;
use serde_json::{Value, json};
use switchyard_proto::v1 as pb;
use switchyard_server::api::convert::json_to_struct;
use tonic::Code;

use crate::common::{Backend, TestAgent, TestServer, explain, get_task, submit_request};

/// `{"d": {"d": ... 1}}`, `levels` objects deep (the outer one is level 1).
fn nested(levels: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..levels {
        v = json!({"d": v});
    }
    v
}

fn refused_field(err: tonic::Status, field: &str) {
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with(field),
        "expected the message to name {field}: {}",
        err.message()
    );
}

async fn a_schema_too_deep_for_the_runners_is_refused(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut tasks = server.tasks().await;
    let submit = |placement: pb::Placement| pb::SubmitTaskRequest {
        kind: "k".into(),
        placement: Some(placement),
        ..Default::default()
    };
    let err = tasks
        .submit_task(submit(pb::Placement {
            json_schema: Some(json_to_struct(&nested(33))),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    refused_field(err, "placement.json_schema");
    // An operand nested deeper than operands may be.
    let err = tasks
        .submit_task(submit(pb::Placement {
            requirements: vec![pb::Requirement {
                key: "x".into(),
                operator: pb::Operator::Eq as i32,
                values: vec![switchyard_proto::convert::json_to_value(&nested(20))],
            }],
            ..Default::default()
        }))
        .await
        .unwrap_err();
    refused_field(err, "placement.requirements[0].values[0]");
    assert!(crate::common::all_tasks(&server).await.is_empty());

    // The deepest schema accepted reaches an agent, and its grant decodes
    // with prost's default recursion limit.
    let mut agent = TestAgent::start(&server, "deep", json!({"tags": ["linux"]}), 1).await;
    let deepest = nested(31); // the schema object itself is level 1 of 32
    submit_request(
        &server,
        submit(pb::Placement {
            json_schema: Some(json_to_struct(&json!({"properties": deepest}))),
            ..Default::default()
        }),
    )
    .await;
    let grant = agent.grant().await;
    let wire = pb::ConnectResponse {
        message: Some(pb::connect_response::Message::LeaseGrant(grant)),
    }
    .encode_to_vec();
    pb::ConnectResponse::decode(wire.as_slice()).expect("the grant decodes");
    server.stop().await;
}

async fn a_submitter_does_not_read_agent_values_in_explanations(backend: Backend) {
    let server = TestServer::start(backend).await;
    let _agent = TestAgent::start(
        &server,
        "db-host",
        json!({"env": {"REGION": "eu-hidden-7"}, "provides": {"db": {"version": "9.1.0"}}}),
        1,
    )
    .await;
    let task = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "k".into(),
            placement: Some(pb::Placement {
                selector: "env.REGION=x".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await;
    let schema_task = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "k".into(),
            placement: Some(pb::Placement {
                json_schema: Some(json_to_struct(&json!({
                    "properties": {"env": {"properties": {"REGION": {"enum": ["x"]}}}}
                }))),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await;
    // Open servers have no roles: everybody may read agents, and does.
    let open = explain(&server, &task.task_id).await;
    assert!(
        open.verdicts[0].reason.contains("eu-hidden-7"),
        "{:?}",
        open.verdicts
    );
    server.stop().await;

    // With tokens: the submitter sees the verdict, not the value; the
    // operator sees both.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.json");
    std::fs::write(
        &path,
        json!([
            {"name": "a", "namespace": "default", "role": "agent", "token": "sy_t_agent_0123456789"},
            {"name": "s", "namespace": "default", "role": "submitter", "token": "sy_t_submit_0123456789"},
            {"name": "o", "namespace": "default", "role": "operator", "token": "sy_t_operator_0123456789"},
        ])
        .to_string(),
    )
    .unwrap();
    let server = TestServer::start_with(backend, |c| c.tokens_file = Some(path.clone())).await;
    let channel = server.channel().await;
    let mut agents = pb::agent_service_client::AgentServiceClient::new(channel.clone());
    agents
        .register_agent(with(
            "sy_t_agent_0123456789",
            pb::RegisterAgentRequest {
                name: "db-host".into(),
                capabilities: Some(json_to_struct(&json!({"env": {"REGION": "eu-hidden-7"}}))),
                capacity: 1,
                handled_kinds: vec!["*".into()],
                ..Default::default()
            },
        ))
        .await
        .unwrap();
    let mut tasks = pb::task_service_client::TaskServiceClient::new(channel);
    let mut ids = Vec::new();
    for request in [
        pb::SubmitTaskRequest {
            kind: "k".into(),
            placement: Some(pb::Placement {
                selector: "env.REGION=x".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
        pb::SubmitTaskRequest {
            kind: "k".into(),
            placement: schema_task.placement.clone(),
            ..Default::default()
        },
    ] {
        let t = tasks
            .submit_task(with("sy_t_submit_0123456789", request))
            .await
            .unwrap()
            .into_inner()
            .task
            .unwrap();
        ids.push(t.task_id);
    }
    for id in &ids {
        let explain = |token: &'static str| {
            let mut tasks = tasks.clone();
            let id = id.clone();
            async move {
                tasks
                    .explain_task(with(token, pb::ExplainTaskRequest { task_id: id }))
                    .await
                    .unwrap()
                    .into_inner()
            }
        };
        let submitter = explain("sy_t_submit_0123456789").await;
        let reason = &submitter.verdicts[0].reason;
        assert!(!reason.contains("eu-hidden-7"), "{reason}");
        assert!(reason.contains("[redacted]"), "{reason}");
        assert!(
            reason.starts_with("env.REGION") || reason.contains("enum"),
            "the verdict stays: {reason}"
        );
        let operator = explain("sy_t_operator_0123456789").await;
        assert!(
            operator.verdicts[0].reason.contains("eu-hidden-7"),
            "{:?}",
            operator.verdicts
        );
    }
    server.stop().await;
}

fn with<T>(token: &str, m: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(m);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// Everything the store holds, as text: the SQLite files, or every table of
/// the PostgreSQL database.
async fn stored_text(server: &TestServer) -> String {
    if let Some(path) = server.url.strip_prefix("sqlite://") {
        let mut out = String::new();
        for suffix in ["", "-wal"] {
            if let Ok(bytes) = std::fs::read(format!("{path}{suffix}")) {
                out.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
        return out;
    }
    use sqlx::{Connection, Row};
    let mut conn = sqlx::PgConnection::connect(&server.url).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let mut out = String::new();
    for table in tables {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT coalesce(string_agg(t::text, E'\\n'), '') FROM {table} t"
        )))
        .fetch_one(&mut conn)
        .await
        .unwrap();
        out.push_str(&row.get::<String, _>(0));
    }
    out
}

const GITHUB: &str = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB";
const AWS: &str = "AKIAIOSFODNN7EXAMPLE";
const PASSWORD: &str = "hunter2hunter2";

async fn secrets_are_found_by_value_and_never_stored(backend: Backend) {
    let server = TestServer::start(backend).await;
    let document = json!({
        "tags": ["linux"],
        "cloud": {"AWS_ACCESS_KEY_ID": AWS, "note": format!("key {AWS}")},
        "GITHUB_PAT": GITHUB,
        "ssh_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END OPENSSH PRIVATE KEY-----",
        "auth": "Bearer abcdef0123456789",
        "db": format!("postgres://app:{PASSWORD}@db/prod"),
        "build": {"commit": "3f786850e387550fdab836ed7e6dc881de23001b"},
    });
    let reg = pb::agent_service_client::AgentServiceClient::new(server.channel().await)
        .register_agent(pb::RegisterAgentRequest {
            name: "leaky".into(),
            capabilities: Some(json_to_struct(&document)),
            capacity: 1,
            handled_kinds: vec!["*".into()],
            labels: [("notes".to_owned(), GITHUB.to_owned())].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut agent = TestAgent::connect(&server, &reg, document.clone(), Vec::new()).await;
    let ack = agent
        .heartbeat(
            pb::AgentStatus::Degraded,
            &[&format!("cannot reach postgres://app:{PASSWORD}@db/prod")],
            None,
        )
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let mut admin = server.admin().await;
    admin
        .set_agent_overrides(pb::SetAgentOverridesRequest {
            agent_id: reg.agent_id.clone(),
            overrides: Some(json_to_struct(
                &json!({"signing": {"passphrase": "p4ss", "token_hint": GITHUB}}),
            )),
        })
        .await
        .unwrap();
    let task = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "k".into(),
            labels: [
                ("ci_token".to_owned(), "abc".to_owned()),
                ("by".to_owned(), AWS.to_owned()),
            ]
            .into(),
            ..Default::default()
        },
    )
    .await;
    agent.heartbeat(pb::AgentStatus::Ready, &[], None).await;
    let grant = agent.grant().await;
    let ack = agent
        .update(
            &grant,
            pb::lease_update::Update::Failed(pb::LeaseFailed {
                error: Some(pb::TaskError {
                    message: format!("push with {GITHUB} failed: password={PASSWORD}"),
                    code: "handler_error".into(),
                    retryable: false,
                    details: Some(json_to_struct(
                        &json!({"stderr": format!("Authorization: Bearer {GITHUB}")}),
                    )),
                    ..Default::default()
                }),
            }),
        )
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);

    // Shown: the agent, its overrides, the task and its failure.
    let agent_view = admin
        .get_agent(pb::GetAgentRequest {
            agent_id: reg.agent_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let failed = get_task(&server, &task.task_id).await;
    let shown = format!("{agent_view:?}{failed:?}");
    for secret in [GITHUB, AWS, PASSWORD, "b3Bl", "abcdef0123456789", "p4ss"] {
        assert!(!shown.contains(secret), "{secret} is shown: {shown}");
    }
    assert!(
        shown.contains("3f786850e387550fdab836ed7e6dc881de23001b"),
        "a git sha is no secret"
    );
    let error = failed.error.unwrap();
    assert!(
        error.message.starts_with("push with [redacted] failed"),
        "{}",
        error.message
    );
    // Stored: nowhere.
    let stored = stored_text(&server).await;
    for secret in [GITHUB, AWS, PASSWORD, "abcdef0123456789", "p4ss"] {
        assert!(!stored.contains(secret), "{secret} is stored");
    }
    server.stop().await;
}

async fn every_input_is_bounded(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut tasks = server.tasks().await;
    let task = |f: &dyn Fn(&mut pb::SubmitTaskRequest)| {
        let mut r = pb::SubmitTaskRequest {
            kind: "k".into(),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    let cases: Vec<(pb::SubmitTaskRequest, &str)> = vec![
        (
            task(&|r| {
                r.placement = Some(pb::Placement {
                    selector: "a,".repeat(100_000) + "a",
                    ..Default::default()
                })
            }),
            "placement.selector",
        ),
        (
            task(&|r| {
                r.placement = Some(pb::Placement {
                    required_tags: (0..50_000).map(|i| format!("t{i}")).collect(),
                    ..Default::default()
                })
            }),
            "placement.required_tags",
        ),
        (
            task(&|r| {
                r.labels = [("k".repeat(100_000), "v".to_owned())].into();
            }),
            "labels",
        ),
        (
            task(&|r| {
                r.labels = (0..1000)
                    .map(|i| (format!("k{i}"), "v".to_owned()))
                    .collect();
            }),
            "labels",
        ),
        (
            task(&|r| {
                r.not_before = Some(prost_types::Timestamp {
                    seconds: i64::MAX / 1000,
                    nanos: 0,
                });
            }),
            "not_before",
        ),
    ];
    for (request, field) in cases {
        let err = tasks.submit_task(request).await.unwrap_err();
        refused_field(err, field);
    }
    assert!(crate::common::all_tasks(&server).await.is_empty());

    // Simulation: a hypothetical document over the document limits.
    let mut admin = server.admin().await;
    for doc in [nested(33), json!({"blob": "x".repeat(300 * 1024)})] {
        let err = admin
            .simulate_placement(pb::SimulatePlacementRequest {
                hypothetical_capabilities: Some(json_to_struct(&doc)),
                ..Default::default()
            })
            .await
            .unwrap_err();
        refused_field(err, "hypothetical_capabilities");
    }

    // An agent's reports: NaN progress is refused; a huge failure is kept,
    // cut to size.
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let t = submit_request(&server, task(&|_| {})).await;
    let grant = agent.grant().await;
    let ack = agent
        .update(
            &grant,
            pb::lease_update::Update::Progress(pb::TaskProgress {
                percent: f64::NAN,
                ..Default::default()
            }),
        )
        .await;
    assert_eq!(ack.code, Code::InvalidArgument as i32, "{}", ack.message);
    assert!(
        ack.message.starts_with("lease_update.progress.percent"),
        "{}",
        ack.message
    );
    let details: serde_json::Map<String, Value> =
        (0..20_000).map(|i| (format!("d{i}"), json!(i))).collect();
    let ack = agent
        .update(
            &grant,
            pb::lease_update::Update::Failed(pb::LeaseFailed {
                error: Some(pb::TaskError {
                    message: "m".repeat(500 * 1024),
                    code: "handler_error".into(),
                    retryable: false,
                    details: Some(json_to_struct(&Value::Object(details))),
                    ..Default::default()
                }),
            }),
        )
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let failed = get_task(&server, &t.task_id).await;
    let error = failed.error.unwrap();
    assert!(error.message.len() <= 8 * 1024, "{}", error.message.len());
    let details = switchyard_server::api::convert::struct_to_json(&error.details.unwrap()).unwrap();
    assert!(
        details["dropped"].as_str().unwrap().contains("limit"),
        "{details}"
    );
    server.stop().await;
}

/// Calls `ListTasks` with `token` until `pass` holds for its code; the
/// last code (the server re-reads tokens within a second).
async fn until_code(server: &TestServer, token: Option<&str>, pass: impl Fn(Code) -> bool) -> Code {
    let mut tasks = server.tasks().await;
    let deadline = tokio::time::Instant::now() + crate::common::PROMPT;
    loop {
        let request = pb::ListTasksRequest::default();
        let request = match token {
            Some(t) => with(t, request),
            None => tonic::Request::new(request),
        };
        let code = match tasks.list_tasks(request).await {
            Ok(_) => Code::Ok,
            Err(s) => s.code(),
        };
        if pass(code) || tokio::time::Instant::now() > deadline {
            return code;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

async fn tokens_can_be_revoked_rotated_and_expire(backend: Backend) {
    use switchyard_server::auth::{Role, hash_token};
    use switchyard_server::model::TokenRecord;
    let server = TestServer::start(backend).await;
    assert_eq!(until_code(&server, None, |c| c == Code::Ok).await, Code::Ok);
    // Another replica's view of the same database.
    let store = switchyard_server::store::open(&server.url).await.unwrap();

    // An open server gains a token: it enforces tokens from then on.
    let ci = "sy_ci_token_0123456789abcdef";
    let record = TokenRecord::new("ci".into(), "default".into(), Role::Submitter, now_ms());
    store.insert_token(&record, &hash_token(ci)).await.unwrap();
    assert_eq!(
        until_code(&server, None, |c| c != Code::Ok).await,
        Code::Unauthenticated
    );
    assert_eq!(
        until_code(&server, Some(ci), |c| c == Code::Ok).await,
        Code::Ok
    );
    let listed = store.list_tokens("default").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, hash_token(ci)[..12]);
    // The last use is written off the request's path.
    let deadline = tokio::time::Instant::now() + crate::common::PROMPT;
    while store.list_tokens("default").await.unwrap()[0]
        .last_used_at_ms
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "last use never written"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // Revoked (as `switchyard-server token revoke` does): refused.
    switchyard_server::tokens::run(
        store.as_ref(),
        switchyard_server::config::TokenCommand::Revoke {
            name: "ci".into(),
            namespace: "default".into(),
        },
    )
    .await
    .unwrap();
    assert_eq!(
        until_code(&server, Some(ci), |c| c != Code::Ok).await,
        Code::Unauthenticated
    );

    // Rotated with a grace: both work; without one: only the new one.
    let old = "sy_deploy_old_0123456789abcdef";
    let new = "sy_deploy_new_0123456789abcdef";
    let newest = "sy_deploy_newest_0123456789ab";
    let record = TokenRecord::new("deploy".into(), "default".into(), Role::Operator, now_ms());
    store.insert_token(&record, &hash_token(old)).await.unwrap();
    assert_eq!(
        until_code(&server, Some(old), |c| c == Code::Ok).await,
        Code::Ok
    );
    let rotated = store
        .rotate_token(
            "default",
            "deploy",
            &hash_token(new),
            None,
            now_ms(),
            3_600_000,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rotated.role, Role::Operator);
    assert_eq!(
        until_code(&server, Some(new), |c| c == Code::Ok).await,
        Code::Ok
    );
    assert_eq!(
        until_code(&server, Some(old), |c| c == Code::Ok).await,
        Code::Ok
    );
    store
        .rotate_token("default", "deploy", &hash_token(newest), None, now_ms(), 0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        until_code(&server, Some(new), |c| c != Code::Ok).await,
        Code::Unauthenticated
    );
    assert_eq!(
        until_code(&server, Some(newest), |c| c == Code::Ok).await,
        Code::Ok
    );
    assert_eq!(
        until_code(&server, Some(old), |c| c == Code::Ok).await,
        Code::Ok,
        "still in its grace"
    );

    // Expired: refused from the first use.
    let stale = "sy_stale_token_0123456789abcd";
    let mut record = TokenRecord::new("stale".into(), "default".into(), Role::Submitter, now_ms());
    record.expires_at_ms = Some(now_ms() - 1);
    store
        .insert_token(&record, &hash_token(stale))
        .await
        .unwrap();
    let err = server
        .tasks()
        .await
        .list_tasks(with(stale, pb::ListTasksRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("expired"), "{}", err.message());
    store.close().await;
    server.stop().await;
}

async fn a_removed_tokens_file_entry_stops_working(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.json");
    let write = |entries: Value| std::fs::write(&path, entries.to_string()).unwrap();
    let keep = json!({"name": "keep", "namespace": "default", "role": "submitter", "token": "sy_keep_0123456789abcdef"});
    let gone = json!({"name": "gone", "namespace": "default", "role": "submitter", "token": "sy_gone_0123456789abcdef"});
    write(json!([keep, gone]));
    let server = TestServer::start_with(backend, |c| c.tokens_file = Some(path.clone())).await;
    let gone_token = Some("sy_gone_0123456789abcdef");
    assert_eq!(
        until_code(&server, gone_token, |c| c == Code::Ok).await,
        Code::Ok
    );
    write(json!([keep]));
    assert_eq!(
        until_code(&server, gone_token, |c| c != Code::Ok).await,
        Code::Unauthenticated
    );
    assert_eq!(
        until_code(&server, Some("sy_keep_0123456789abcdef"), |c| c == Code::Ok).await,
        Code::Ok
    );
    server.stop().await;
}

async fn agent_tokens_are_bound_to_their_names(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.json");
    std::fs::write(
        &path,
        json!([
            {"name": "builders", "namespace": "default", "role": "agent", "token": "sy_builders_0123456789",
             "agent_names": ["build-*"]},
            {"name": "other", "namespace": "default", "role": "agent", "token": "sy_other_agent_0123456789"},
        ])
        .to_string(),
    )
    .unwrap();
    let server = TestServer::start_with(backend, |c| c.tokens_file = Some(path.clone())).await;
    let mut agents = pb::agent_service_client::AgentServiceClient::new(server.channel().await);
    let register = |name: &str| pb::RegisterAgentRequest {
        name: name.into(),
        capacity: 1,
        handled_kinds: vec!["*".into()],
        ..Default::default()
    };
    let err = agents
        .register_agent(with("sy_builders_0123456789", register("deploy-1")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("build-*"), "{}", err.message());
    agents
        .register_agent(with("sy_builders_0123456789", register("build-1")))
        .await
        .unwrap();
    // Another token may not take over a name whose agent is online.
    let err = agents
        .register_agent(with("sy_other_agent_0123456789", register("build-1")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    // The same token may re-register it (a restart).
    agents
        .register_agent(with("sy_builders_0123456789", register("build-1")))
        .await
        .unwrap();
    server.stop().await;
}

async fn pages_are_cut_by_bytes(backend: Backend) {
    let server = TestServer::start(backend).await;
    for i in 0..6 {
        submit_request(
            &server,
            pb::SubmitTaskRequest {
                kind: "big".into(),
                payload: Some(json_to_struct(
                    &json!({"i": i, "blob": "x".repeat(250_000)}),
                )),
                ..Default::default()
            },
        )
        .await;
    }
    // A client that takes at most 1 MiB per message reads every task.
    let mut tasks = server.tasks().await.max_decoding_message_size(1024 * 1024);
    let mut seen = 0;
    let mut pages = 0;
    let mut token = String::new();
    loop {
        let page = tasks
            .list_tasks(pb::ListTasksRequest {
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect("every page fits 1 MiB")
            .into_inner();
        assert!(!page.tasks.is_empty());
        seen += page.tasks.len();
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, 6);
    assert!(pages >= 2, "six 250 KB tasks need two pages or more");
    server.stop().await;
}

/// One gRPC message as it goes in a DATA frame: a flag byte, the length, the bytes.
fn grpc_frame(message: &impl prost::Message) -> bytes::Bytes {
    let body = message.encode_to_vec();
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(0);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    out.extend_from_slice(&body);
    out.into()
}

/// A fleet multiplexed on one HTTP/2 connection, each agent sending a burst
/// of heartbeats as one small DATA frame each (as grpcio and raw clients
/// do; tonic coalesces them), keeps every stream: every heartbeat is
/// acknowledged and the connection is not closed for flooding.
async fn a_fleet_on_one_connection_survives_bursts(backend: Backend) {
    const AGENTS: usize = 100;
    const BURST: u64 = 40;
    let server = TestServer::start(backend).await;
    let mut registrations = Vec::new();
    let mut client = pb::agent_service_client::AgentServiceClient::new(server.channel().await);
    for i in 0..AGENTS {
        let reg = client
            .register_agent(pb::RegisterAgentRequest {
                name: format!("burst-{i}"),
                capacity: 1,
                handled_kinds: vec!["*".into()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        registrations.push(reg);
    }
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    // The client reads every stream at once, with room for all the acks.
    let (h2, connection) = h2::client::Builder::new()
        .initial_connection_window_size(16 * 1024 * 1024)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let mut h2 = h2.ready().await.unwrap();
    let mut streams = Vec::new();
    for reg in &registrations {
        let request = http::Request::post(format!(
            "http://{}/switchyard.v1.AgentService/Connect",
            server.addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (response, mut send) = h2.send_request(request, false).unwrap();
        let hello = pb::ConnectRequest {
            sequence: 1,
            message: Some(pb::connect_request::Message::Hello(pb::Hello {
                agent_id: reg.agent_id.clone(),
                session_epoch: reg.session_epoch,
                held_leases: Vec::new(),
            })),
        };
        send.send_data(grpc_frame(&hello), false).unwrap();
        streams.push((response, send));
        h2 = h2.ready().await.unwrap();
    }
    // Every agent bursts at once, a DATA frame per heartbeat.
    for (_, send) in &mut streams {
        for sequence in 2..2 + BURST {
            let beat = pb::ConnectRequest {
                sequence,
                message: Some(pb::connect_request::Message::Heartbeat(pb::Heartbeat {
                    status: pb::AgentStatus::Ready as i32,
                    ..Default::default()
                })),
            };
            send.send_data(grpc_frame(&beat), false).unwrap();
        }
    }
    let mut readers = Vec::new();
    for (i, (response, send)) in streams.into_iter().enumerate() {
        readers.push(tokio::spawn(async move {
            let _send = send; // the agent's half stays open
            let response = tokio::time::timeout(crate::common::PROMPT, response)
                .await
                .unwrap_or_else(|_| panic!("agent {i}: no response"))
                .unwrap_or_else(|e| panic!("agent {i}: the stream failed: {e}"));
            let mut body = response.into_body();
            let mut buffer = Vec::new();
            let mut acked = 0;
            while acked < BURST {
                let chunk = tokio::time::timeout(crate::common::PROMPT, body.data())
                    .await
                    .unwrap_or_else(|_| panic!("agent {i}: acks stopped after {acked}"))
                    .unwrap_or_else(|| panic!("agent {i}: the stream ended after {acked} acks"))
                    .unwrap_or_else(|e| {
                        panic!("agent {i}: the stream failed after {acked} acks: {e}")
                    });
                let _ = body.flow_control().release_capacity(chunk.len());
                buffer.extend_from_slice(&chunk);
                while buffer.len() >= 5 {
                    let len = u32::from_be_bytes(buffer[1..5].try_into().unwrap()) as usize;
                    if buffer.len() < 5 + len {
                        break;
                    }
                    let message = pb::ConnectResponse::decode(&buffer[5..5 + len]).unwrap();
                    buffer.drain(..5 + len);
                    if let Some(pb::connect_response::Message::Ack(a)) = message.message {
                        assert_eq!(a.code, 0, "agent {i}: {}", a.message);
                        acked += 1;
                    }
                }
            }
        }));
    }
    for reader in readers {
        reader.await.unwrap();
    }
    drop(h2);
    connection.abort();
    server.stop().await;
}

/// Runs `switchyard-server` with `args` to its end (it must not start);
/// its exit status, standard output and standard error.
fn server_binary(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard-server"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_settings_fail_before_listening_with_their_cause_and_no_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let db = format!("sqlite://{}", dir.path().join("s.db").display());
    let junk = junk.to_str().unwrap();
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec![
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                &db,
                "--tls-cert",
                junk,
                "--tls-key",
                junk,
            ],
            "holds no PEM certificate",
        ),
        (
            vec![
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                &db,
                "--tls-cert",
                junk,
            ],
            "--tls-key",
        ),
        (
            vec![
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                "postgres://u:hunter2@127.0.0.1:1/x",
            ],
            "Connection refused",
        ),
    ];
    for (args, cause) in cases {
        let (status, stdout, stderr) = server_binary(&args);
        assert!(!status.success(), "{args:?} started");
        assert!(
            !stdout.contains("listening"),
            "{args:?} said it listens: {stdout}"
        );
        assert!(stderr.contains(cause), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("stack backtrace") && !stderr.contains("backtrace::"),
            "{stderr}"
        );
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

/// The first answer of a reflection `list_services` call with `token`.
async fn reflect(server: &TestServer, token: Option<&str>) -> Result<(), Code> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::{ServerReflectionRequest, server_reflection_request};
    let mut client = ServerReflectionClient::new(server.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let stream = tokio_stream::iter([request]);
    let request = match token {
        Some(t) => with(t, stream),
        None => tonic::Request::new(stream),
    };
    match client.server_reflection_info(request).await {
        Ok(response) => {
            let mut stream = response.into_inner();
            match stream.message().await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err(Code::Unknown),
                Err(s) => Err(s.code()),
            }
        }
        Err(s) => Err(s.code()),
    }
}

async fn reflection_answers_whom_the_flag_says(backend: Backend) {
    use switchyard_server::reflection::Reflection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.json");
    std::fs::write(
        &path,
        json!([{"name": "s", "namespace": "default", "role": "submitter", "token": "sy_reflect_0123456789"}])
            .to_string(),
    )
    .unwrap();
    for (mode, anonymous, with_token) in [
        (
            Reflection::Authenticated,
            Err(Code::Unauthenticated),
            Ok(()),
        ),
        (Reflection::Public, Ok(()), Ok(())),
        (
            Reflection::Off,
            Err(Code::Unimplemented),
            Err(Code::Unimplemented),
        ),
    ] {
        let server = TestServer::start_with(backend, |c| {
            c.tokens_file = Some(path.clone());
            c.reflection = mode;
        })
        .await;
        assert_eq!(
            reflect(&server, None).await,
            anonymous,
            "{mode:?} without a token"
        );
        assert_eq!(
            reflect(&server, Some("sy_reflect_0123456789")).await,
            with_token,
            "{mode:?} with a token"
        );
        server.stop().await;
    }
    // An open server answers everyone, as it answers every RPC.
    let server = TestServer::start(backend).await;
    assert_eq!(reflect(&server, None).await, Ok(()));
    server.stop().await;
}

crate::on_both_stores!(
    a_schema_too_deep_for_the_runners_is_refused,
    a_submitter_does_not_read_agent_values_in_explanations,
    secrets_are_found_by_value_and_never_stored,
    every_input_is_bounded,
    tokens_can_be_revoked_rotated_and_expire,
    a_removed_tokens_file_entry_stops_working,
    agent_tokens_are_bound_to_their_names,
    pages_are_cut_by_bytes,
    a_fleet_on_one_connection_survives_bursts,
    reflection_answers_whom_the_flag_says
);
