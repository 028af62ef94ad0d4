//! Two replicas on one PostgreSQL, end to end: a replica is told the
//! others' changes only while something on it reads them (an agent's
//! session, a watcher), so what each must hear is shown here through real
//! servers: a task queued through one while nothing read on the other is
//! leased to an agent that connects to the other later; a cancel through
//! one revokes the lease of an agent connected to the other; a fleet
//! watched on one sees a drain made through the other; a refused Hello
//! opens no connection for it.

use serde_json::json;
use sqlx::Connection;
use switchyard_proto::v1::{self as pb, connect_response::Message as Down, lease_update::Update};
use tokio_stream::StreamExt;

use crate::common::{Backend, PROMPT, TestAgent, TestServer, submit, wait_for_state};

/// The database's sessions named `prefix …` (a replica's connections).
async fn named(server: &TestServer, prefix: &str) -> i64 {
    let mut conn = sqlx::PgConnection::connect(&server.url).await.unwrap();
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name LIKE $1 || ' %'",
    )
    .bind(prefix)
    .fetch_one(&mut conn)
    .await
    .unwrap()
}

/// Two replicas of a server on one fresh PostgreSQL database.
async fn two_replicas() -> (TestServer, TestServer) {
    let server = TestServer::start(Backend::Postgres).await;
    let other = server.replica().await;
    (server, other)
}

/// Stops both (the replica first: the first drops the database).
async fn stop(server: TestServer, other: TestServer) {
    other.stop().await;
    server.stop().await;
}

/// Submitted through one replica while the other had no agent and no
/// watcher (so it was not told): an agent that connects to the other is
/// leased it, its dispatcher walking the queue afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_queued_through_another_replica_reaches_an_agent_that_connects_later() {
    let (server, other) = two_replicas().await;
    let task = submit(&server, "k", "late").await;
    assert_eq!(named(&server, "switchyard-dispatcher").await, 0);
    let mut agent = TestAgent::start(&other, "late", json!({"tags": ["late"]}), 1).await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    agent.run_to_success(&grant, json!({})).await;
    wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
    drop(agent);
    stop(server, other).await;
}

/// From its Welcome on, an agent's replica holds the connection that tells
/// the others it reads the dispatcher's events, so a cancel made through
/// another replica revokes the agent's lease (nothing else would tell the
/// agent before the lease's end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_hears_a_cancel_made_through_another_replica() {
    let (server, other) = two_replicas().await;
    let mut agent = TestAgent::start(&other, "worker", json!({"tags": ["w"]}), 1).await;
    assert_eq!(named(&server, "switchyard-dispatcher").await, 1);
    let task = submit(&other, "k", "w").await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    for update in [
        Update::Accepted(pb::LeaseAccepted {}),
        Update::Started(pb::LeaseStarted {}),
    ] {
        assert_eq!(agent.update(&grant, update).await.code, 0);
    }
    server
        .tasks()
        .await
        .cancel_task(pb::CancelTaskRequest {
            task_id: task.task_id.clone(),
            reason: "from the other replica".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let revoked = agent
        .expect("the revocation", |m| match m {
            Down::LeaseRevocation(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert_eq!(revoked.lease_id, grant.lease_id);
    assert_eq!(revoked.reason(), pb::RevocationReason::Canceled);
    drop(agent);
    stop(server, other).await;
}

/// A fleet watched on a replica with no agent of its own: before the
/// watch's first message the replica holds the connection that tells the
/// others it reads the dispatcher's events, and a drain made through the
/// other replica reaches the watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_watch_sees_a_drain_made_through_another_replica() {
    let (server, other) = two_replicas().await;
    let agent = TestAgent::start(&server, "drained", json!({"tags": ["d"]}), 1).await;
    let mut stream = other
        .admin()
        .await
        .watch_agents(pb::WatchAgentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(PROMPT, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.synced, "{first:?}");
    // The agent's replica and the watching one.
    assert_eq!(named(&server, "switchyard-dispatcher").await, 2);
    server
        .admin()
        .await
        .drain_agent(pb::DrainAgentRequest {
            agent_id: agent.agent_id.clone(),
            reason: "maintenance".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    loop {
        let m = tokio::time::timeout(PROMPT, stream.next())
            .await
            .expect("the watch goes on")
            .expect("the watch ends only after the drain")
            .unwrap();
        if m.agents
            .iter()
            .any(|a| a.agent_id == agent.agent_id && a.drained)
        {
            break;
        }
    }
    drop(agent);
    stop(server, other).await;
}

/// A Hello the server refuses (here a stale epoch) opens no dispatcher
/// connection: the session takes its hold only once the Hello is checked,
/// so a caller that cannot open a session cannot make a replica hold a
/// connection and greet the others. An accepted one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_hello_opens_no_dispatcher_connection() {
    let server = TestServer::start(Backend::Postgres).await;
    let document = json!({"tags": ["h"]});
    let reg = TestAgent::register(&server, "hello", document.clone(), 1).await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(pb::ConnectRequest {
        sequence: 1,
        message: Some(pb::connect_request::Message::Hello(pb::Hello {
            agent_id: reg.agent_id.clone(),
            session_epoch: reg.session_epoch + 1,
            held_leases: vec![],
        })),
    })
    .await
    .unwrap();
    let refused = tokio::time::timeout(
        PROMPT,
        pb::agent_service_client::AgentServiceClient::new(server.channel().await)
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await
    .unwrap();
    assert_eq!(refused.unwrap_err().code(), tonic::Code::FailedPrecondition);
    assert_eq!(named(&server, "switchyard-dispatcher").await, 0);
    let agent = TestAgent::connect(&server, &reg, document, Vec::new()).await;
    assert_eq!(named(&server, "switchyard-dispatcher").await, 1);
    drop(agent);
    server.stop().await;
}
