//! What the web console reads, over real gRPC on both stores: the queue
//! summary (live tasks by state, queued tasks by reason, groups of one kind
//! and placement with what matching says), WatchQueue sending it again as
//! the queue and the fleet change, WatchAgents listing the fleet and then
//! each change (a new session, a drain, a selector's narrowing); and the
//! console's own port: the page for any path, its files, and the services
//! over gRPC-Web.

use serde_json::json;
use switchyard_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;
use tonic::Streaming;

use crate::common::{Backend, PROMPT, TestAgent, TestServer};

async fn summary(server: &TestServer) -> pb::QueueSummary {
    server
        .tasks()
        .await
        .get_queue_summary(pb::GetQueueSummaryRequest::default())
        .await
        .unwrap()
        .into_inner()
        .summary
        .unwrap()
}

fn count<T: Copy + PartialEq>(pairs: impl IntoIterator<Item = (T, u64)>, want: T) -> u64 {
    pairs
        .into_iter()
        .find(|(k, _)| *k == want)
        .map_or(0, |(_, n)| n)
}

fn group<'a>(summary: &'a pb::QueueSummary, kind: &str) -> &'a pb::QueueGroup {
    summary
        .groups
        .iter()
        .find(|g| g.kind == kind)
        .unwrap_or_else(|| panic!("a group of kind {kind} in {summary:?}"))
}

async fn the_summary_groups_queued_tasks_and_says_why(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "cpu-1", json!({"tags": ["cpu"]}), 1).await;
    for _ in 0..3 {
        crate::common::submit(&server, "render", "gpu").await;
    }
    // The first fills the agent's one slot; the second waits for it.
    crate::common::submit(&server, "build", "cpu").await;
    agent.grant().await;
    crate::common::submit(&server, "build", "cpu").await;
    // Not due for an hour: counted as not yet due, not as waiting.
    crate::common::submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "later".into(),
            not_before: Some(prost_types::Timestamp {
                seconds: now_secs() + 3600,
                nanos: 0,
            }),
            ..Default::default()
        },
    )
    .await;

    let s = summary(&server).await;
    let states = s.states.iter().map(|c| (c.state(), c.count));
    assert_eq!(count(states.clone(), pb::TaskState::Queued), 5, "{s:?}");
    assert_eq!(count(states, pb::TaskState::Leased), 1, "{s:?}");
    let reasons = s.queued_reasons.iter().map(|c| (c.reason(), c.count));
    assert_eq!(count(reasons.clone(), pb::QueuedReason::Parked), 3, "{s:?}");
    assert_eq!(
        count(reasons.clone(), pb::QueuedReason::WaitingForCapacity),
        1,
        "{s:?}"
    );
    assert_eq!(count(reasons, pb::QueuedReason::Backoff), 1, "{s:?}");

    // The largest group first.
    assert_eq!(s.groups[0].kind, "render", "{s:?}");
    let parked = group(&s, "render");
    assert_eq!(parked.tasks, 3);
    assert_eq!(parked.reason(), pb::QueuedReason::Parked);
    assert!(
        parked.explanation.contains("missing tag gpu"),
        "{}",
        parked.explanation
    );
    assert_eq!((parked.capable_agents, parked.eligible_agents), (0, 0));
    assert!(parked.oldest_submitted_at.is_some());
    assert_eq!(
        parked.placement.as_ref().unwrap().required_tags,
        vec!["gpu".to_owned()]
    );
    let busy = group(&s, "build");
    assert_eq!(busy.tasks, 1);
    assert_eq!(busy.reason(), pb::QueuedReason::WaitingForCapacity);
    assert_eq!((busy.capable_agents, busy.eligible_agents), (1, 0));
    let later = group(&s, "later");
    assert_eq!((later.tasks, later.not_yet_due), (1, 1));
    assert_eq!((s.agents_taking_work, s.agents_registered), (1, 1));
    assert_eq!(s.more_groups, 0);
    server.stop().await;
}

fn now_secs() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

/// The next message of a live stream (bounded by PROMPT, never measured).
async fn next<T>(stream: &mut Streaming<T>) -> T {
    tokio::time::timeout(PROMPT, stream.next())
        .await
        .expect("the stream sends within PROMPT")
        .expect("the stream goes on")
        .unwrap()
}

async fn watch_queue_follows_the_queue_and_the_fleet(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut stream = server
        .tasks()
        .await
        .watch_queue(pb::WatchQueueRequest::default())
        .await
        .unwrap()
        .into_inner();
    // First the groups as counted (none), then matched against the fleet.
    let first = next(&mut stream).await.summary.unwrap();
    assert!(first.groups.is_empty() && !first.explained, "{first:?}");
    let explained = next(&mut stream).await.summary.unwrap();
    assert!(
        explained.groups.is_empty() && explained.explained,
        "{explained:?}"
    );
    let task = crate::common::submit(&server, "render", "gpu").await;
    let parked = loop {
        let s = next(&mut stream).await.summary.unwrap();
        if !s.groups.is_empty() && s.explained {
            break s;
        }
    };
    assert_eq!(group(&parked, "render").reason(), pb::QueuedReason::Parked);
    // An agent that fits connects and takes it: the group goes.
    let mut agent = TestAgent::start(&server, "gpu-1", json!({"tags": ["gpu"]}), 1).await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    loop {
        let s = next(&mut stream).await.summary.unwrap();
        if s.groups.is_empty() {
            break;
        }
    }
    server.stop().await;
}

async fn watch_agents_lists_the_fleet_then_each_change(backend: Backend) {
    let server = TestServer::start(backend).await;
    let _a = TestAgent::start(&server, "agent-a", json!({"tags": ["a"]}), 2).await;
    let mut admin = server.admin().await;
    let mut stream = admin
        .watch_agents(pb::WatchAgentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = next(&mut stream).await;
    assert!(first.synced, "{first:?}");
    let names: Vec<&str> = first.agents.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["agent-a"]);
    let a_id = first.agents[0].agent_id.clone();
    assert_eq!(first.agents[0].status(), pb::AgentStatus::Ready);

    // A second agent connects: only it is sent.
    let _b = TestAgent::start(&server, "agent-b", json!({"tags": ["b"]}), 1).await;
    let added = loop {
        let m = next(&mut stream).await;
        if m.agents.iter().any(|a| a.name == "agent-b") {
            break m;
        }
    };
    assert!(!added.synced);
    assert!(
        added.agents.iter().all(|a| a.name != "agent-a"),
        "{added:?}"
    );

    // A drain is sent as the agent, drained.
    admin
        .drain_agent(pb::DrainAgentRequest {
            agent_id: a_id.clone(),
            reason: "maintenance".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    loop {
        let m = next(&mut stream).await;
        if let Some(a) = m.agents.iter().find(|a| a.agent_id == a_id)
            && a.drained
        {
            assert!(
                a.status_reasons.iter().any(|r| r.contains("maintenance")),
                "{a:?}"
            );
            break;
        }
    }

    // Nothing changes: the watch still sends (an empty message), which is
    // how a caller that left over HTTP/1.1 is noticed.
    loop {
        let m = next(&mut stream).await;
        if m.agents.is_empty() && m.removed_agent_ids.is_empty() {
            assert!(!m.synced);
            break;
        }
    }

    // A selector narrows the watch to the agents it picks.
    let mut narrowed = admin
        .watch_agents(pb::WatchAgentsRequest {
            selector: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let picked = next(&mut narrowed).await;
    let names: Vec<&str> = picked.agents.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["agent-b"]);
    assert!(picked.synced);

    // A selector that does not parse names the field.
    let err = admin
        .watch_agents(pb::WatchAgentsRequest {
            selector: "a ==".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("selector"), "{}", err.message());
    server.stop().await;
}

crate::on_both_stores!(
    the_summary_groups_queued_tasks_and_says_why,
    watch_queue_follows_the_queue_and_the_fleet,
    watch_agents_lists_the_fleet_then_each_change,
);

/// One HTTP/1.1 exchange, the whole answer as bytes.
async fn http(addr: std::net::SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PROMPT, socket.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    answer
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_serves_its_page_and_the_services_over_grpc_web() {
    let server = TestServer::start_with(Backend::Sqlite, |c| {
        c.console_listen = Some("127.0.0.1:0".parse().unwrap())
    })
    .await;
    let addr = server.console_addr.expect("the console address");
    // The gRPC port is up once a call answers; the console was bound before it.
    summary(&server).await;

    let page = String::from_utf8(http(addr, &get("/")).await).unwrap();
    assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
    assert!(page.contains("content-type: text/html"), "{page}");
    assert!(page.contains(r#"<div id="root">"#), "{page}");
    // A page of the console, loaded by its address, is the page too.
    let deep = String::from_utf8(http(addr, &get("/agents/0190abcd")).await).unwrap();
    assert!(deep.contains(r#"<div id="root">"#), "{deep}");
    // Its script, named in the page, is served as JavaScript.
    let script = page
        .split("src=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page names its script");
    let js = String::from_utf8_lossy(&http(addr, &get(script)).await).into_owned();
    assert!(js.starts_with("HTTP/1.1 200 OK"), "{}", &js[..200]);
    assert!(
        js.contains("content-type: text/javascript"),
        "{}",
        &js[..300]
    );

    // GetQueueSummary over gRPC-Web: an empty message, framed.
    let body = [0u8, 0, 0, 0, 0];
    let mut request = format!(
        "POST /switchyard.v1.TaskService/GetQueueSummary HTTP/1.1\r\nHost: x\r\n\
         Content-Type: application/grpc-web+proto\r\nX-Grpc-Web: 1\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let answer = http(addr, &request).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(
        text.contains("content-type: application/grpc-web+proto"),
        "{text}"
    );
    // The trailers frame says the call succeeded; the message names the namespace.
    assert!(text.contains("grpc-status:0"), "{text}");
    assert!(text.contains("default"), "{text}");
    server.stop().await;
}
