//! What operators read about a fleet: a watch that replays a task's history
//! shows each step as it was, not the end repeated; a watch on one replica
//! follows a change made through another; two sessions contending
//! for one agent name are warned about; `/metrics` speaks Prometheus (404
//! off its path, `# HELP` on every series, finished tasks by state).

use serde_json::json;
use sqlx::Connection;
use switchyard_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;

use crate::common::{Backend, PROMPT, TestAgent, TestServer};

async fn watch(server: &TestServer, task_id: &str) -> tonic::Streaming<pb::WatchTaskResponse> {
    server
        .tasks()
        .await
        .watch_task(pb::WatchTaskRequest {
            task_id: task_id.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn watch_transcript(server: &TestServer, task_id: &str) -> Vec<pb::WatchTaskResponse> {
    let mut stream = watch(server, task_id).await;
    let mut items = Vec::new();
    while let Some(item) = tokio::time::timeout(PROMPT, stream.next())
        .await
        .expect("the watch goes on")
    {
        items.push(item.unwrap());
    }
    items
}

async fn a_late_watch_shows_each_step_as_it_was(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "w", json!({"tags": ["w"]}), 1).await;
    let task = crate::common::submit(&server, "k", "w").await;
    let grant = agent.grant().await;
    agent.run_to_success(&grant, json!({"done": true})).await;
    let items = watch_transcript(&server, &task.task_id).await;
    let steps: Vec<(String, pb::TaskState)> = items
        .iter()
        .map(|i| {
            (
                i.event.as_ref().map(|e| e.kind.clone()).unwrap_or_default(),
                i.task.as_ref().unwrap().state(),
            )
        })
        .collect();
    assert_eq!(steps.first().unwrap().0, "submitted", "{steps:?}");
    // Before: every step carried the task as it ended, SUCCEEDED.
    assert_eq!(steps.first().unwrap().1, pb::TaskState::Queued, "{steps:?}");
    for item in &items[..items.len() - 1] {
        let task = item.task.as_ref().unwrap();
        assert_eq!(task.state, item.event.as_ref().unwrap().state, "{item:?}");
        assert!(
            task.result.is_none(),
            "a step before the end has no result: {item:?}"
        );
    }
    assert!(
        steps
            .iter()
            .any(|(kind, state)| kind == "started" && *state == pb::TaskState::Running),
        "{steps:?}"
    );
    let last = items.last().unwrap().task.as_ref().unwrap();
    assert_eq!(last.state(), pb::TaskState::Succeeded);
    assert_eq!(
        last.result.as_ref().map(|r| r.fields.contains_key("done")),
        Some(true)
    );
    server.stop().await;
}

async fn register_as(server: &TestServer, name: &str, runner: &str) -> pb::RegisterAgentResponse {
    switchyard_proto::v1::agent_service_client::AgentServiceClient::new(server.channel().await)
        .register_agent(pb::RegisterAgentRequest {
            name: name.into(),
            capabilities: Some(switchyard_server::api::convert::json_to_struct(&json!({}))),
            capacity: 1,
            runner: runner.into(),
            handled_kinds: vec!["*".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn listed(server: &TestServer, name: &str) -> pb::Agent {
    server
        .admin()
        .await
        .list_agents(pb::ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .agents
        .into_iter()
        .find(|a| a.name == name)
        .unwrap()
}

async fn two_live_sessions_sharing_a_name_are_warned_about(backend: Backend) {
    let server = TestServer::start(backend).await;
    // One runner registers and connects, goes away and comes back (whether
    // or not the server has marked it offline yet): a restart, no warning.
    let reg = register_as(&server, "restarts", "node").await;
    let agent = TestAgent::connect(&server, &reg, json!({}), Vec::new()).await;
    agent.hang_up();
    register_as(&server, "restarts", "node").await;
    assert!(listed(&server, "restarts").await.status_reasons.is_empty());

    // Two runners on one host under one name: each registration replaces
    // the other's live session.
    let python = register_as(&server, "host-1", "switchyard-runner/0.1.0 (python)").await;
    let _live = TestAgent::connect(&server, &python, json!({}), Vec::new()).await;
    register_as(&server, "host-1", "switchyard-node/0.1.0 (node)").await;
    let once = listed(&server, "host-1").await;
    assert!(
        once.status_reasons.is_empty(),
        "one takeover is a restart: {once:?}"
    );
    register_as(&server, "host-1", "switchyard-runner/0.1.0 (python)").await;
    let agent = listed(&server, "host-1").await;
    let warning = agent
        .status_reasons
        .iter()
        .find(|r| r.starts_with("name contended"))
        .unwrap_or_else(|| panic!("no contention warning: {agent:?}"));
    assert!(warning.contains("2 registrations"), "{warning}");
    assert!(
        warning.contains("switchyard-runner/0.1.0 (python) replacing switchyard-node/0.1.0 (node)"),
        "{warning}"
    );
    server.stop().await;
}

crate::on_both_stores!(
    a_late_watch_shows_each_step_as_it_was,
    two_live_sessions_sharing_a_name_are_warned_about
);

/// A watch on one replica follows a change another replica makes: before
/// the watch's first message its replica holds the connection that tells
/// the others it follows tasks' changes (a replica with no watcher is not
/// told them), so the other replica notifies the cancel, and the watch
/// sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_follows_a_change_made_through_another_replica() {
    let server = TestServer::start(Backend::Postgres).await;
    let task = crate::common::submit(&server, "k", "w").await;
    let mut stream = watch(&server, &task.task_id).await;
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.task.unwrap().state(), pb::TaskState::Queued);
    let other = switchyard_server::store::open(&server.url).await.unwrap();
    let followers: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name LIKE 'switchyard-follower %'",
    )
    .fetch_one(&mut sqlx::PgConnection::connect(&server.url).await.unwrap())
    .await
    .unwrap();
    assert_eq!(followers, 1, "the watching replica's follower connection");
    let id = task.task_id.parse().unwrap();
    let now = switchyard_server::clock::Clock::system().now_ms();
    other
        .cancel_task(id, "from the other replica", None, now)
        .await
        .unwrap();
    loop {
        let item = tokio::time::timeout(PROMPT, stream.next())
            .await
            .expect("the watch goes on")
            .expect("the watch ends only after the cancel")
            .unwrap();
        if item.task.unwrap().state() == pb::TaskState::Canceled {
            break;
        }
    }
    other.close().await;
    server.stop().await;
}

async fn http_get(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(
            format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut body = String::new();
    tokio::time::timeout(PROMPT, socket.read_to_string(&mut body))
        .await
        .unwrap()
        .unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_speak_prometheus_and_count_finished_tasks() {
    let server = TestServer::start_with(Backend::Sqlite, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap())
    })
    .await;
    let addr = server.metrics_addr.expect("the metrics address");
    let mut agent = TestAgent::start(&server, "m", json!({"tags": ["m"]}), 1).await;
    let task = crate::common::submit(&server, "k", "m").await;
    let grant = agent.grant().await;
    agent.run_to_success(&grant, json!({})).await;
    let canceled = crate::common::submit(&server, "k", "nobody").await;
    server
        .tasks()
        .await
        .cancel_task(pb::CancelTaskRequest {
            task_id: canceled.task_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    crate::common::wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;

    let body = http_get(addr, "GET", "/metrics").await;
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for line in [
        "# HELP switchyard_grants_total ",
        "# HELP switchyard_tasks_finished_total ",
        "switchyard_tasks_finished_total{state=\"succeeded\"}",
        "switchyard_tasks_finished_total{state=\"canceled\"}",
    ] {
        assert!(body.contains(line), "{line} missing from:\n{body}");
    }
    // Items per batch are counted in items: before, the seconds' buckets
    // (0.00001 to 1) put every batch in +Inf.
    assert!(
        body.contains("switchyard_batch_items_bucket{le=\"5\"}"),
        "{body}"
    );
    // Every series the exposition names has its help.
    for series in body.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = series.split(' ').next().unwrap();
        assert!(
            body.contains(&format!("# HELP {name} ")),
            "{name} has no HELP"
        );
    }
    // Only GET /metrics answers with them: before, any path and method did.
    let elsewhere = http_get(addr, "GET", "/").await;
    assert!(elsewhere.starts_with("HTTP/1.1 404"), "{elsewhere}");
    let posted = http_get(addr, "POST", "/metrics").await;
    assert!(posted.starts_with("HTTP/1.1 405"), "{posted}");
    server.stop().await;
}
