//! Agent sessions and dispatch end to end, over real gRPC, on both stores:
//! register, lease, complete; parking and unparking by a capability diff;
//! DEGRADED routing; drain; the deaf agent; the late agent held back;
//! reconnect and resume; session
//! supersession; stale fencing; cancel reaching a running agent; parked
//! tasks, however many and however deep, never starving the rest.

use serde_json::json;
use switchyard_proto::v1::{self as pb, connect_response::Message as Down, lease_update::Update};

use std::time::Duration;

use crate::common::{
    Backend, PROMPT, TestAgent, TestServer, get_task, submit, submit_request, task_events,
    wait_for_state,
};
use crate::on_both_stores;

fn linux(node: &str) -> serde_json::Value {
    json!({"os": "linux", "arch": "x86_64", "tags": ["linux"], "software": {"node": {"version": node}},
           "memory": {"total": 16384, "free": 8000, "unit": "MB"}, "loadavg": {"1min": 0.5}})
}

async fn register_lease_complete(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.11.1"), 2).await;
    let task = submit(&server, "echo", "linux, software.node.version@^20").await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    assert_eq!(grant.fencing_token, 1);
    agent.run_to_success(&grant, json!({"out": "hello"})).await;
    let done = wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
    assert_eq!(
        done.result.unwrap().fields["out"],
        switchyard_server::api::convert::json_to_value(&json!("hello"))
    );
    // The same final report again is acknowledged and changes nothing.
    let again = agent
        .update(
            &grant,
            Update::Succeeded(pb::LeaseSucceeded { result: None }),
        )
        .await;
    assert_eq!(again.code, 0, "{}", again.message);
    assert_eq!(
        get_task(&server, &task.task_id).await.state(),
        pb::TaskState::Succeeded
    );
    server.stop().await;
}

async fn parked_task_unparks_on_diff(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "build-1", linux("18.19.0"), 1).await;
    let task = submit(&server, "echo", "software.node.version@^20").await;
    let parked = get_task(&server, &task.task_id).await;
    assert_eq!(parked.state(), pb::TaskState::Queued);
    assert_eq!(parked.queued_reason(), pb::QueuedReason::Parked);
    let explain = server
        .tasks()
        .await
        .explain_task(pb::ExplainTaskRequest {
            task_id: task.task_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        explain.verdicts[0].reason,
        "software.node.version VERSION ^20: have 18.19.0"
    );
    // The agent upgrades node: one diff later the task is leased.
    let ack = agent
        .heartbeat(pb::AgentStatus::Ready, &[], Some(linux("20.1.0")))
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let grant = agent.grant().await;
    assert_eq!(grant.task.unwrap().task_id, task.task_id);
    server.stop().await;
}

async fn degraded_capability_stops_only_what_needs_it(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut doc = linux("20.0.0");
    doc["provides"] = json!({"ai.llm": {"version": "1.2.0", "healthy": false, "reason": "missing parameter API_KEY"}});
    let mut agent = TestAgent::start(&server, "llm-1", doc, 2).await;
    agent
        .heartbeat(
            pb::AgentStatus::Degraded,
            &["capability ai.llm unhealthy: missing parameter API_KEY"],
            None,
        )
        .await;
    let needs_llm = submit(&server, "chat", "provides ai.llm@1").await;
    let plain = submit(&server, "echo", "linux").await;
    let grant = agent.grant().await;
    assert_eq!(
        grant.task.unwrap().task_id,
        plain.task_id,
        "the plain task runs on the degraded agent"
    );
    let parked = get_task(&server, &needs_llm.task_id).await;
    assert_eq!(parked.queued_reason(), pb::QueuedReason::Parked);
    server.stop().await;
}

async fn drained_agent_gets_nothing_until_undrained(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.0.0"), 1).await;
    let mut admin = server.admin().await;
    let drained = admin
        .drain_agent(pb::DrainAgentRequest {
            agent_id: agent.agent_id.clone(),
            reason: "maintenance".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(drained.status(), pb::AgentStatus::Draining);
    let task = submit(&server, "echo", "linux").await;
    assert_eq!(
        get_task(&server, &task.task_id).await.queued_reason(),
        pb::QueuedReason::Parked
    );
    admin
        .undrain_agent(pb::UndrainAgentRequest {
            agent_id: agent.agent_id.clone(),
        })
        .await
        .unwrap();
    let grant = agent.grant().await;
    assert_eq!(grant.task.unwrap().task_id, task.task_id);
    server.stop().await;
}

async fn deaf_agent_loses_its_grant_to_a_listening_one(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.ack_window_ms = 300).await;
    let mut deaf = TestAgent::start(&server, "deaf", linux("20.0.0"), 1).await;
    let task = submit(&server, "echo", "linux").await;
    let first = deaf.grant().await;
    // The deaf agent never acknowledges; a second, attentive agent appears.
    let mut attentive = TestAgent::start(&server, "attentive", linux("20.0.0"), 1).await;
    let revocation = deaf
        .expect("revocation", |m| match m {
            Down::LeaseRevocation(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert_eq!(revocation.lease_id, first.lease_id);
    assert_eq!(revocation.reason(), pb::RevocationReason::Unacknowledged);
    // Whoever gets it next holds a newer token; the deaf agent's report is refused.
    let stale = deaf
        .update(&first, Update::Accepted(pb::LeaseAccepted {}))
        .await;
    assert_eq!(
        stale.code,
        tonic::Code::FailedPrecondition as i32,
        "{}",
        stale.message
    );
    let second = attentive.grant().await;
    assert_eq!(second.task.as_ref().unwrap().task_id, task.task_id);
    // Token 2 if the attentive agent was connected when the grant was
    // revoked; higher if the deaf agent got (and lost) it again first.
    assert!(second.fencing_token > first.fencing_token);
    attentive.run_to_success(&second, json!({})).await;
    wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
    server.stop().await;
}

/// An agent that has left a grant unacknowledged for longer than
/// `--ack-late-ms` gets no more grants, free slots or not, until it
/// acknowledges one: a task only it can run waits (not leased on the way
/// in, and passed over by the round that grants a later task elsewhere),
/// and reaches it once it acknowledges.
async fn a_late_agent_gets_no_more_until_it_acknowledges(backend: Backend) {
    let server = TestServer::start_with(backend, |c| {
        c.ack_window_ms = 600_000;
        c.ack_late_ms = 50;
    })
    .await;
    let mut slow = TestAgent::start(&server, "slow", linux("20.0.0"), 4).await;
    let mut other =
        TestAgent::start(&server, "other", json!({"os": "macos", "tags": ["mac"]}), 1).await;
    let first = submit(&server, "echo", "linux").await;
    let held = slow.grant().await;
    assert_eq!(held.task.as_ref().unwrap().task_id, first.task_id);
    // Nothing but time makes the grant late.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second = submit(&server, "echo", "linux").await;
    assert_eq!(
        second.state(),
        pb::TaskState::Queued,
        "leased on the way in to a late agent"
    );
    // A later task, for the other agent: once it is granted, a round has
    // walked past the second task (a page's grants commit together).
    let barrier = submit(&server, "echo", "mac").await;
    let grant = other.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, barrier.task_id);
    assert_eq!(
        get_task(&server, &second.task_id).await.state(),
        pb::TaskState::Queued,
        "granted to an agent that had not acknowledged what it held"
    );
    let ack = slow
        .update(&held, Update::Accepted(pb::LeaseAccepted {}))
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let next = slow.grant().await;
    assert_eq!(next.task.as_ref().unwrap().task_id, second.task_id);
    server.stop().await;
}

/// An agent that hangs up without acknowledging a grant (one that was
/// draining and left, say) loses it when its session ends, not after the
/// ack window: here the window is ten minutes, and the task still reaches
/// another agent promptly, with a newer token.
async fn an_agent_gone_before_acknowledging_loses_its_grant_at_once(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.ack_window_ms = 600_000).await;
    let mut leaving = TestAgent::start(&server, "leaving", linux("20.0.0"), 1).await;
    let task = submit(&server, "echo", "linux").await;
    let first = leaving.grant().await;
    leaving.hang_up();
    let mut staying = TestAgent::start(&server, "staying", linux("20.0.0"), 1).await;
    let second = staying.grant().await;
    assert_eq!(second.task.as_ref().unwrap().task_id, task.task_id);
    assert!(second.fencing_token > first.fencing_token);
    staying.run_to_success(&second, json!({})).await;
    wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
    server.stop().await;
}

async fn reconnect_resumes_held_leases(backend: Backend) {
    let server = TestServer::start(backend).await;
    let reg = TestAgent::register(&server, "build-1", linux("20.0.0"), 1).await;
    let mut agent = TestAgent::connect(&server, &reg, linux("20.0.0"), Vec::new()).await;
    let task = submit(&server, "echo", "linux").await;
    let grant = agent.grant().await;
    assert_eq!(
        agent
            .update(&grant, Update::Accepted(pb::LeaseAccepted {}))
            .await
            .code,
        0
    );
    assert_eq!(
        agent
            .update(&grant, Update::Started(pb::LeaseStarted {}))
            .await
            .code,
        0
    );
    agent.hang_up();
    // Re-register (new epoch) and resume the held lease.
    let reg2 = TestAgent::register(&server, "build-1", linux("20.0.0"), 1).await;
    assert_eq!(reg2.agent_id, reg.agent_id, "same identity");
    assert!(reg2.session_epoch > reg.session_epoch);
    let held = vec![pb::HeldLease {
        lease_id: grant.lease_id.clone(),
        task_id: task.task_id.clone(),
        fencing_token: grant.fencing_token,
    }];
    let mut again = TestAgent::connect(&server, &reg2, linux("20.0.0"), held).await;
    assert_eq!(
        again.welcome.resumed_lease_ids,
        vec![grant.lease_id.clone()]
    );
    let ack = again
        .update(
            &grant,
            Update::Succeeded(pb::LeaseSucceeded { result: None }),
        )
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
    server.stop().await;
}

async fn newer_session_closes_the_older(backend: Backend) {
    let server = TestServer::start(backend).await;
    let reg = TestAgent::register(&server, "build-1", linux("20.0.0"), 1).await;
    let mut old = TestAgent::connect(&server, &reg, linux("20.0.0"), Vec::new()).await;
    let reg2 = TestAgent::register(&server, "build-1", linux("20.0.0"), 1).await;
    let _new = TestAgent::connect(&server, &reg2, linux("20.0.0"), Vec::new()).await;
    let drain = old
        .expect("drain", |m| match m {
            Down::Drain(d) => Some(d.clone()),
            _ => None,
        })
        .await;
    assert!(drain.reason.contains("superseded"), "{}", drain.reason);
    // Connecting with the old epoch is now refused.
    let stale = tokio::time::timeout(PROMPT, async {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
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
        switchyard_proto::v1::agent_service_client::AgentServiceClient::new(server.channel().await)
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    })
    .await
    .unwrap();
    assert_eq!(stale.unwrap_err().code(), tonic::Code::FailedPrecondition);
    server.stop().await;
}

/// A second Connect with the epoch the agent registered (a retry of the
/// same registration) supersedes the first session and nothing else: the
/// first hears a Drain and ends, and the agent stays READY and keeps
/// getting work on the second.
async fn a_second_connect_with_the_same_epoch_supersedes_the_first_only(backend: Backend) {
    let server = TestServer::start(backend).await;
    let doc = json!({"tags": ["twin"]});
    let reg = TestAgent::register(&server, "twin", doc.clone(), 1).await;
    let mut first = TestAgent::connect(&server, &reg, doc.clone(), Vec::new()).await;
    let mut second = TestAgent::connect(&server, &reg, doc, Vec::new()).await;
    let drain = first
        .expect("drain", |m| match m {
            Down::Drain(d) => Some(d.clone()),
            _ => None,
        })
        .await;
    assert!(drain.reason.contains("superseded"), "{}", drain.reason);
    // The first session's reader has ended (and detached what it could)
    // once its stream is over.
    first.expect_end().await;
    let agent = server
        .admin()
        .await
        .get_agent(pb::GetAgentRequest {
            agent_id: reg.agent_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(agent.status(), pb::AgentStatus::Ready);
    let task = submit(&server, "echo", "twin").await;
    let grant = second.grant().await;
    assert_eq!(grant.task.unwrap().task_id, task.task_id);
    server.stop().await;
}

/// A heartbeat's diff whose write loses its compare-and-set (the stored
/// generation moved on meanwhile, here by another store instance whose
/// change this replica does not hear of) is not what the matcher sees:
/// the index goes back to the stored document, and the agent is asked to
/// resync. SQLite only: on PostgreSQL the other instance's change is
/// announced, and the session may reload before it writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diff_whose_write_went_stale_never_reaches_the_matcher() {
    let server = TestServer::start(Backend::Sqlite).await;
    let doc = json!({"tags": ["base"]});
    let mut agent = TestAgent::start(&server, "a", doc.clone(), 1).await;
    let agent_id: uuid::Uuid = agent.agent_id.parse().unwrap();
    let other = switchyard_server::store::open(&server.url).await.unwrap();
    let stored = other.get_agent(agent_id).await.unwrap();
    other
        .set_operator_overrides(
            agent_id,
            &json!({}),
            &stored.document,
            &stored.provenance,
            1,
        )
        .await
        .unwrap();
    let ack = agent
        .heartbeat(
            pb::AgentStatus::Ready,
            &[],
            Some(json!({"tags": ["base", "gpu"]})),
        )
        .await;
    // The write went stale: the ack says the diff was not applied.
    assert_eq!(ack.code, tonic::Code::FailedPrecondition as i32, "{ack:?}");
    assert!(
        ack.message
            .starts_with("capability diff not applied: document changed concurrently"),
        "{}",
        ack.message
    );
    let resync = agent
        .expect("resync request", |m| match m {
            Down::ResyncRequest(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert_eq!(resync.server_generation, stored.generation + 1);
    let task = submit(&server, "echo", "gpu").await;
    assert_eq!(task.state(), pb::TaskState::Queued);
    assert_eq!(task.queued_reason(), pb::QueuedReason::Parked);
    other.close().await;
    server.stop().await;
}

async fn cancel_reaches_the_running_agent(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.0.0"), 1).await;
    let task = submit(&server, "sleep", "linux").await;
    let grant = agent.grant().await;
    assert_eq!(
        agent
            .update(&grant, Update::Accepted(pb::LeaseAccepted {}))
            .await
            .code,
        0
    );
    assert_eq!(
        agent
            .update(&grant, Update::Started(pb::LeaseStarted {}))
            .await
            .code,
        0
    );
    let canceled = server
        .tasks()
        .await
        .cancel_task(pb::CancelTaskRequest {
            task_id: task.task_id.clone(),
            reason: "not needed".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    assert!(canceled.cancel_requested);
    let revocation = agent
        .expect("revocation", |m| match m {
            Down::LeaseRevocation(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert_eq!(revocation.reason(), pb::RevocationReason::Canceled);
    let ack = agent
        .update(
            &grant,
            Update::Released(pb::LeaseReleased {
                reason: "canceled".into(),
                cause: pb::ReleaseCause::RevocationAcknowledged as i32,
            }),
        )
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    wait_for_state(&server, &task.task_id, pb::TaskState::Canceled).await;
    server.stop().await;
}

async fn bad_input_is_invalid_argument_naming_the_field(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut tasks = server.tasks().await;
    let err = tasks
        .submit_task(pb::SubmitTaskRequest {
            kind: "echo".into(),
            placement: Some(pb::Placement {
                selector: "linux, memory.total>=".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with("placement.selector:"),
        "{}",
        err.message()
    );
    let err = tasks
        .submit_task(pb::SubmitTaskRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("kind:"), "{}", err.message());
    let err = tasks
        .get_task(pb::GetTaskRequest {
            task_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = tasks
        .get_task(pb::GetTaskRequest {
            task_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    // A page token the server did not issue is refused, not read as the end.
    let err = tasks
        .list_tasks(pb::ListTasksRequest {
            page_token: "forged".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with("page_token:"),
        "{}",
        err.message()
    );
    // Nothing was stored by the refused submits.
    let list = tasks
        .list_tasks(pb::ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.tasks.is_empty());
    server.stop().await;
}

async fn parked_high_priority_tasks_never_block_runnable_ones(backend: Backend) {
    let server = TestServer::start(backend).await;
    // More parked high-priority tasks than one page of the queue holds, and
    // more than a round reads in pages sized to one free slot (64 x 16):
    // pages grow while they leave tasks behind.
    park(&server, 1_100, |_| "gpu".into()).await;
    let runnable = submit(&server, "echo", "linux").await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.0.0"), 1).await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.unwrap().task_id, runnable.task_id);
    server.stop().await;
}

/// Parked tasks deeper than one dispatch round reads (64 pages; here pages
/// of 4 tasks) neither starve a runnable task behind them nor lose their
/// own turn: each is leased, oldest first, once an agent that can run it
/// appears, whether it connects or gains the capability by a heartbeat.
async fn parked_tasks_deeper_than_a_round_reads_never_starve(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.dispatch_page = 4).await;
    // Two placements nobody can run, interleaved: the first is gpu, the
    // second tpu.
    let parked = park(&server, 300, |i| ["gpu", "tpu"][i % 2].into()).await;
    let first: std::collections::HashMap<&str, String> = [
        ("gpu", parked[0].task_id.clone()),
        ("tpu", parked[1].task_id.clone()),
    ]
    .into();
    let runnable = submit(&server, "echo", "linux").await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.0.0"), 1).await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, runnable.task_id);
    agent.run_to_success(&grant, json!({})).await;
    // A second runnable task, submitted while the parked ones wait.
    let next = submit(&server, "echo", "linux").await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, next.task_id);
    agent.run_to_success(&grant, json!({})).await;
    // An agent that can run one placement connects: the oldest of it first.
    let mut tpu = linux("20.0.0");
    tpu["tags"] = json!(["linux", "tpu"]);
    let mut tpu_agent = TestAgent::start(&server, "tpu-1", tpu, 1).await;
    let grant = tpu_agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, first["tpu"]);
    // The first agent gains the other capability by a heartbeat.
    let mut gpu = linux("20.0.0");
    gpu["tags"] = json!(["linux", "gpu"]);
    let ack = agent
        .heartbeat(pb::AgentStatus::Ready, &[], Some(gpu))
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, first["gpu"]);
    server.stop().await;
}

/// More distinct parked placements than the dispatcher remembers (256),
/// over twice as deep as a round reads (64 pages of 4): the next round goes
/// on where the last one stopped, so the runnable task behind them is still
/// reached. Fails if rounds always start at the head.
async fn parked_tasks_of_many_placements_never_starve(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.dispatch_page = 4).await;
    park(&server, 600, |slot| {
        format!("custom_properties.slot={slot}")
    })
    .await;
    let runnable = submit(&server, "echo", "linux").await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.0.0"), 1).await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, runnable.task_id);
    server.stop().await;
}

/// A submit of `kind` needing `selector`, at `priority`.
fn request(kind: &str, selector: &str, priority: i32) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        kind: kind.into(),
        priority,
        placement: Some(pb::Placement {
            selector: selector.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Submits `count` tasks at priority 10, task `i` needing `selector(i)`
/// (placements the test's agents cannot run), over one connection; returns
/// them in submit order.
async fn park(
    server: &TestServer,
    count: usize,
    selector: impl Fn(usize) -> String,
) -> Vec<pb::Task> {
    let mut tasks = server.tasks().await;
    let mut parked = Vec::with_capacity(count);
    for i in 0..count {
        let task = tasks
            .submit_task(request("train", &selector(i), 10))
            .await
            .unwrap()
            .into_inner()
            .task
            .unwrap();
        parked.push(task);
    }
    parked
}

/// A walk from the head of the queue may start past the parked tasks
/// there; a task queued ahead of that point is not skipped, and goes
/// before a task queued behind it. (Whether a dispatch round runs between
/// the two submits is up to timing, so a dispatcher that wrongly keeps its
/// place is caught by this test often, not always.)
async fn a_task_queued_ahead_of_the_parked_head_is_not_skipped(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut plain = TestAgent::start(&server, "plain", linux("20.0.0"), 1).await;
    let mut special = linux("20.0.0");
    special["tags"] = json!(["linux", "special"]);
    let mut special = TestAgent::start(&server, "special", special, 1).await;
    park(&server, 50, |_| "gpu".into()).await;
    // The special agent is busy; a second special task waits behind the
    // parked head of the queue.
    let first = submit(&server, "echo", "special").await;
    let grant = special.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, first.task_id);
    let waiting = submit(&server, "echo", "special").await;
    assert_eq!(waiting.state(), pb::TaskState::Queued);
    // Ahead of everything, then behind everything: the plain agent takes
    // the one ahead first.
    let ahead = submit_request(&server, request("echo", "linux", 20)).await;
    let behind = submit(&server, "echo", "linux").await;
    let grant = plain.grant().await;
    assert_eq!(
        grant.task.as_ref().unwrap().task_id,
        ahead.task_id,
        "the task behind ({}) went first",
        behind.task_id
    );
    server.stop().await;
}

/// A delayed task ahead of the parked head of the queue is leased once it
/// is due, though nothing is queued meanwhile. Fails if the dispatcher's
/// place past the parked head never expires.
async fn a_delayed_task_ahead_of_the_parked_head_is_leased_when_due(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "plain", linux("20.0.0"), 1).await;
    park(&server, 50, |_| "gpu".into()).await;
    let due = std::time::SystemTime::now() + Duration::from_secs(1);
    let delayed = submit_request(
        &server,
        pb::SubmitTaskRequest {
            not_before: Some(prost_types::Timestamp::from(due)),
            ..request("echo", "linux", 20)
        },
    )
    .await;
    assert_eq!(delayed.state(), pb::TaskState::Queued);
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, delayed.task_id);
    server.stop().await;
}

/// The capabilities the store holds for an agent.
/// The merged document of a stored agent, as JSON.
fn document_of(view: &pb::CapabilityView) -> serde_json::Value {
    switchyard_server::api::convert::struct_to_json(view.document.as_ref().unwrap()).unwrap()
}

async fn stored(server: &TestServer, agent_id: &str) -> pb::CapabilityView {
    server
        .admin()
        .await
        .get_agent(pb::GetAgentRequest {
            agent_id: agent_id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap()
        .capabilities
        .unwrap()
}

/// A diff of only free memory and load reaches matching at once but is
/// written to the store behind (heartbeats stay cheap at fleet scale); a
/// diff of anything else is written with its heartbeat.
async fn volatile_diffs_match_at_once_and_are_written_behind(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.1.0"), 1).await;
    let before = stored(&server, &agent.agent_id).await;
    let task = submit(&server, "echo", "memory.free>=12000").await;
    assert_eq!(
        get_task(&server, &task.task_id).await.queued_reason(),
        pb::QueuedReason::Parked
    );
    let mut more_memory = linux("20.1.0");
    more_memory["memory"]["free"] = json!(15000);
    let ack = agent
        .heartbeat(pb::AgentStatus::Ready, &[], Some(more_memory.clone()))
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    assert_eq!(ack.capability_generation, before.generation + 1);
    // Matching saw it: the task is leased.
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    // The store still holds the older copy.
    let after = stored(&server, &agent.agent_id).await;
    assert_eq!(after.generation, before.generation);
    // Agents replace `/memory` whole when that is shorter: still volatile.
    let mut less_memory = more_memory.clone();
    less_memory["memory"]["free"] = json!(14000);
    less_memory["memory"]["available"] = json!(14500);
    let (ack, patch) = agent.heartbeat_as_agents_do(less_memory).await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let ops = serde_json::to_value(&patch).unwrap();
    assert_eq!(ops.as_array().map(Vec::len), Some(1), "{ops}");
    assert_eq!(ops[0]["path"], json!("/memory"), "{ops}");
    assert_eq!(
        stored(&server, &agent.agent_id).await.generation,
        before.generation
    );
    // A durable change (a new tool version) writes everything at once.
    let mut upgraded = more_memory;
    upgraded["software"]["node"]["version"] = json!("20.2.0");
    let ack = agent
        .heartbeat(pb::AgentStatus::Ready, &[], Some(upgraded))
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let written = stored(&server, &agent.agent_id).await;
    assert_eq!(written.generation, before.generation + 3);
    let doc = document_of(&written);
    assert_eq!(doc["memory"]["free"], json!(15000));
    assert_eq!(doc["software"]["node"]["version"], json!("20.2.0"));
    server.stop().await;
}

/// Free memory declared sensitive stays redacted however the heartbeat
/// that changes it is applied: the number the agent sends is neither
/// matched on nor stored.
async fn a_volatile_number_at_a_sensitive_path_stays_redacted(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut secret = linux("20.1.0");
    secret["sensitive"] = json!(["memory.free"]);
    let mut agent = TestAgent::start(&server, "build-1", secret.clone(), 1).await;
    secret["memory"]["free"] = json!(15000);
    let ack = agent
        .heartbeat(pb::AgentStatus::Ready, &[], Some(secret.clone()))
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let task = submit(&server, "echo", "memory.free>=12000").await;
    assert_eq!(
        get_task(&server, &task.task_id).await.queued_reason(),
        pb::QueuedReason::Parked
    );
    secret["software"]["node"]["version"] = json!("20.2.0");
    let ack = agent
        .heartbeat(pb::AgentStatus::Ready, &[], Some(secret))
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let written = stored(&server, &agent.agent_id).await;
    let doc = document_of(&written);
    assert_eq!(doc["memory"]["free"], json!("[redacted]"));
    assert_eq!(doc["software"]["node"]["version"], json!("20.2.0"));
    server.stop().await;
}

/// A lease ended where the agent's replica did not take part (another store
/// instance expires it: on SQLite nothing is announced, so the replica's
/// recount from the store must notice; on PostgreSQL `LeaseEnded` is heard)
/// frees the agent's slot: the next task goes to the capacity-1 agent. On
/// PostgreSQL the agent first hears that the lease expired: it may still be
/// working on it, and would otherwise hold two leases with room for one.
async fn a_lease_ended_behind_the_replicas_back_frees_the_slot(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.1.0"), 1).await;
    let first = submit(&server, "echo", "linux").await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, first.task_id);
    let other = switchyard_server::store::open(&server.url).await.unwrap();
    let now = switchyard_server::clock::Clock::system().now_ms();
    // An hour on: the lease has expired, and the first task's retry is an
    // hour away.
    let expired = other.expire_leases(now + 3_600_000, 10).await.unwrap();
    assert_eq!(expired.len(), 1);
    let second = submit(&server, "echo", "linux").await;
    if backend == Backend::Postgres {
        let first_heard = agent
            .expect("revocation or grant", |m| match m {
                Down::LeaseRevocation(r) => Some(Ok(r.clone())),
                Down::LeaseGrant(g) => Some(Err(g.lease_id.clone())),
                _ => None,
            })
            .await;
        let revocation = first_heard.expect("the revocation comes before the next grant");
        assert_eq!(revocation.lease_id, grant.lease_id);
        assert_eq!(revocation.reason(), pb::RevocationReason::Expired);
    }
    let next = agent.grant().await;
    assert_eq!(next.task.as_ref().unwrap().task_id, second.task_id);
    server.stop().await;
}

/// A task submitted to run later is granted when it comes due, not at the
/// dispatcher's next unprompted look at the queue: that is ten minutes away
/// here, so only the due time can prompt it (before, the round that found
/// nothing due was also remembered for up to 5 s).
async fn a_delayed_task_is_granted_when_it_comes_due(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.dispatch_recheck_ms = 600_000).await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.0.0"), 1).await;
    let due = std::time::SystemTime::now() + Duration::from_millis(300);
    let task = submit_request(
        &server,
        pb::SubmitTaskRequest {
            kind: "echo".into(),
            placement: Some(pb::Placement {
                selector: "linux".into(),
                ..Default::default()
            }),
            not_before: Some(due.into()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(task.state(), pb::TaskState::Queued);
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    assert!(
        std::time::SystemTime::now() >= due,
        "granted before it was due"
    );
    agent.run_to_success(&grant, json!({})).await;
    wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
    server.stop().await;
}

/// With an agent free and nothing waiting, a submit is leased in its own
/// transaction (the response already says LEASED and the agent gets the
/// grant); while a task waits for capacity, a newer submit is queued
/// behind it instead of taking the next free slot.
async fn submit_leases_on_the_way_in_but_never_overtakes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.0.0"), 1).await;
    // Until the dispatcher has seen the queue empty once, submits queue;
    // each finished task gives it a round.
    let mut leased_on_submit = None;
    for _ in 0..20 {
        let task = submit(&server, "echo", "linux").await;
        let grant = agent.grant().await;
        assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
        agent.run_to_success(&grant, json!({})).await;
        wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
        if task.state() == pb::TaskState::Leased {
            leased_on_submit = Some(task);
            break;
        }
    }
    let task = leased_on_submit.expect("a submit leased on the way in");
    let kinds: Vec<String> = task_events(&server, &task.task_id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds[..2], ["submitted", "leased"]);

    // The agent is busy: the next task waits, and a newer one may not
    // overtake it when the slot frees.
    let busy = submit(&server, "echo", "linux").await;
    let busy_grant = agent.grant().await;
    assert_eq!(busy_grant.task.as_ref().unwrap().task_id, busy.task_id);
    let waiting = submit(&server, "echo", "linux").await;
    assert_eq!(waiting.state(), pb::TaskState::Queued);
    agent.run_to_success(&busy_grant, json!({})).await;
    let newer = submit(&server, "echo", "linux").await;
    let next = agent.grant().await;
    assert_eq!(
        next.task.as_ref().unwrap().task_id,
        waiting.task_id,
        "the newer task {} overtook the waiting one",
        newer.task_id
    );
    server.stop().await;
}

async fn silent_agent_goes_offline_and_its_stream_closes(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.heartbeat_interval_ms = 100).await;
    let mut agent = TestAgent::start(&server, "quiet", linux("20.0.0"), 1).await;
    // The agent never heartbeats: after three intervals the server closes
    // the session (the stream ends) and marks the agent OFFLINE.
    agent.expect_end().await;
    let got = server
        .admin()
        .await
        .get_agent(pb::GetAgentRequest {
            agent_id: agent.agent_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(got.status(), pb::AgentStatus::Offline);
    server.stop().await;
}

async fn operator_overrides_unpark_and_show_their_tier(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "build-1", linux("20.0.0"), 1).await;
    let task = submit(&server, "deploy", "zone=eu-1").await;
    assert_eq!(
        get_task(&server, &task.task_id).await.queued_reason(),
        pb::QueuedReason::Parked
    );
    let updated = server
        .admin()
        .await
        .set_agent_overrides(pb::SetAgentOverridesRequest {
            agent_id: agent.agent_id.clone(),
            overrides: Some(switchyard_server::api::convert::json_to_struct(
                &json!({"zone": "eu-1"}),
            )),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    let caps = updated.capabilities.unwrap();
    let zone = caps
        .provenance
        .iter()
        .find(|p| p.path == "zone")
        .expect("zone has provenance");
    assert_eq!(zone.tier(), pb::Tier::Operator);
    let os = caps
        .provenance
        .iter()
        .find(|p| p.path == "os")
        .expect("os has provenance");
    assert_ne!(os.tier(), pb::Tier::Operator);
    let grant = agent.grant().await;
    assert_eq!(grant.task.unwrap().task_id, task.task_id);
    // Any ack carries the moved generation; a diff against it applies.
    let plain = agent.heartbeat(pb::AgentStatus::Ready, &[], None).await;
    assert_eq!(plain.code, 0, "{}", plain.message);
    assert_eq!(plain.capability_generation, caps.generation);
    let ack = agent
        .heartbeat(pb::AgentStatus::Ready, &[], Some(linux("20.1.0")))
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    server.stop().await;
}

on_both_stores!(
    a_lease_ended_behind_the_replicas_back_frees_the_slot,
    a_delayed_task_is_granted_when_it_comes_due,
    volatile_diffs_match_at_once_and_are_written_behind,
    a_volatile_number_at_a_sensitive_path_stays_redacted,
    submit_leases_on_the_way_in_but_never_overtakes,
    silent_agent_goes_offline_and_its_stream_closes,
    operator_overrides_unpark_and_show_their_tier,
    register_lease_complete,
    parked_high_priority_tasks_never_block_runnable_ones,
    parked_tasks_deeper_than_a_round_reads_never_starve,
    parked_tasks_of_many_placements_never_starve,
    a_task_queued_ahead_of_the_parked_head_is_not_skipped,
    a_delayed_task_ahead_of_the_parked_head_is_leased_when_due,
    parked_task_unparks_on_diff,
    degraded_capability_stops_only_what_needs_it,
    drained_agent_gets_nothing_until_undrained,
    deaf_agent_loses_its_grant_to_a_listening_one,
    a_late_agent_gets_no_more_until_it_acknowledges,
    an_agent_gone_before_acknowledging_loses_its_grant_at_once,
    reconnect_resumes_held_leases,
    newer_session_closes_the_older,
    a_second_connect_with_the_same_epoch_supersedes_the_first_only,
    cancel_reaches_the_running_agent,
    bad_input_is_invalid_argument_naming_the_field,
);
