//! Routing by what an agent can run: the kinds it handles are a hard
//! constraint (a task of another kind is parked, and explained so), a task
//! an agent refuses is not offered to it again until it changes, and every
//! hand-back counts toward a per-task bound, so no grant and release can
//! cycle for ever.

use serde_json::json;
use switchyard_proto::v1::{self as pb, agent_service_client::AgentServiceClient};
use tonic::Code;

use crate::common::{Backend, TestAgent, TestServer, explain, get_task, submit, wait_for_state};
use crate::on_both_stores;

on_both_stores!(
    an_agent_is_granted_only_the_kinds_it_handles,
    an_agent_that_handles_no_kind_is_granted_nothing,
    a_task_an_agent_refused_is_not_offered_to_it_again_until_it_changes,
    a_task_every_runner_refuses_reaches_its_bound_and_other_tasks_still_run,
    a_grant_that_kills_the_session_every_time_reaches_the_bound,
    bad_kinds_are_refused_naming_the_field_and_change_nothing,
);

/// The events of a task's history, in order.
async fn history(server: &TestServer, task_id: &str) -> Vec<pb::TaskEvent> {
    server
        .tasks()
        .await
        .list_task_events(pb::ListTaskEventsRequest {
            task_id: task_id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events
}

/// How many times the task was leased.
async fn times_leased(server: &TestServer, task_id: &str) -> usize {
    history(server, task_id)
        .await
        .iter()
        .filter(|e| e.kind == "leased")
        .count()
}

/// The first repro: an agent that handles only `exec` and a task of
/// kind `build`. Before, the agent was granted it, released it ("no
/// handler") and was granted it again, hundreds of times a second, while
/// `explain` called it eligible; an ordinary task beside it waited.
async fn an_agent_is_granted_only_the_kinds_it_handles(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start_handling(&server, "w", json!({}), 1, &["exec"]).await;
    let build = submit(&server, "build", "").await;
    let exec = submit(&server, "exec", "").await;
    // The one slot goes to the task the agent can run.
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, exec.task_id);
    agent.run_to_success(&grant, json!({})).await;
    wait_for_state(&server, &exec.task_id, pb::TaskState::Succeeded).await;

    let reply = explain(&server, &build.task_id).await;
    assert_eq!(
        reply.summary,
        "0/1 agents eligible: 1 not handling kind build"
    );
    assert_eq!(reply.verdicts[0].reason, "does not handle kind build");
    assert!(!reply.verdicts[0].capable);
    let task = get_task(&server, &build.task_id).await;
    assert_eq!(task.state(), pb::TaskState::Queued);
    assert_eq!(task.queued_reason(), pb::QueuedReason::Parked);
    assert_eq!(times_leased(&server, &build.task_id).await, 0);

    // SimulatePlacement names the kind the same way.
    let simulated = server
        .admin()
        .await
        .simulate_placement(pb::SimulatePlacementRequest {
            placement: Some(pb::Placement::default()),
            kind: "build".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(simulated.verdicts[0].reason, "does not handle kind build");

    // Starting to handle the kind unparks the task, by event.
    let ack = agent.announce_kinds(&["exec", "build.*", "build"]).await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, build.task_id);
    let agents = server
        .admin()
        .await
        .list_agents(pb::ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .agents;
    assert_eq!(agents[0].handled_kinds, ["build", "build.*", "exec"]);
    server.stop().await;
}

/// A runner with no handlers advertises none: it is granted nothing (the
/// Python runner's `run` mode released whatever it was granted).
async fn an_agent_that_handles_no_kind_is_granted_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut idle = TestAgent::start_handling(&server, "idle", json!({}), 4, &[]).await;
    let task = submit(&server, "anything", "").await;
    let reply = explain(&server, &task.task_id).await;
    assert_eq!(reply.verdicts[0].reason, "does not handle kind anything");
    // An agent that handles it takes it; the idle one was never offered it.
    let mut worker = TestAgent::start(&server, "worker", json!({}), 1).await;
    let grant = worker.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    worker.run_to_success(&grant, json!({})).await;
    wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
    let leased: Vec<String> = history(&server, &task.task_id)
        .await
        .into_iter()
        .filter(|e| e.kind == "leased")
        .map(|e| e.agent_id)
        .collect();
    assert_eq!(leased, [worker.agent_id.clone()]);
    // Its heartbeat is answered; it holds nothing.
    let ack = idle.heartbeat(pb::AgentStatus::Ready, &[], None).await;
    assert_eq!(ack.code, 0);
    server.stop().await;
}

/// "Cannot handle" excludes that agent for that task until its kinds or
/// document change: the next grant is another task, the explanation names
/// the refusal, and a task every capable agent refused is parked.
async fn a_task_an_agent_refused_is_not_offered_to_it_again_until_it_changes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "w", json!({"tags": ["linux"]}), 1).await;
    let refused = submit(&server, "build", "").await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, refused.task_id);
    let ack = agent
        .release(
            &grant,
            pb::ReleaseCause::CannotHandle,
            "no handler for kind build",
        )
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    // The slot goes to the next task, not back to the refused one.
    let other = submit(&server, "exec", "").await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, other.task_id);
    agent.run_to_success(&grant, json!({})).await;
    wait_for_state(&server, &other.task_id, pb::TaskState::Succeeded).await;

    let reply = explain(&server, &refused.task_id).await;
    assert_eq!(
        reply.verdicts[0].reason,
        "refused the task: no handler for kind build"
    );
    assert_eq!(reply.summary, "0/1 agents eligible: 1 refused the task");
    let task = reply.task.unwrap();
    assert_eq!(task.queued_reason(), pb::QueuedReason::Parked);
    assert_eq!(times_leased(&server, &refused.task_id).await, 1);

    // A change that is more than volatile facts lifts the refusal: the
    // task is offered again.
    let ack = agent
        .heartbeat(
            pb::AgentStatus::Ready,
            &[],
            Some(json!({"tags": ["linux", "docker"]})),
        )
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, refused.task_id);
    server.stop().await;
}

/// The third repro: a task a runner keeps handing back. Every
/// release counts, whatever its cause; at the bound the task FAILS with
/// the reason, it was granted exactly the bound's number of times, and the
/// other task on the same one-slot agent ran meanwhile (busy releases back
/// off, so the slot is free for it).
async fn a_task_every_runner_refuses_reaches_its_bound_and_other_tasks_still_run(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.max_releases_per_task = 3).await;
    let mut agent = TestAgent::start(&server, "w", json!({}), 1).await;
    let stubborn = submit(&server, "stubborn", "").await;
    let ordinary = submit(&server, "ordinary", "").await;
    let mut stubborn_grants = 0;
    let mut ordinary_done = false;
    while !ordinary_done
        || get_task(&server, &stubborn.task_id).await.state() != pb::TaskState::Failed
    {
        let grant = agent.grant().await;
        let task = grant.task.clone().unwrap();
        if task.task_id == stubborn.task_id {
            stubborn_grants += 1;
            let ack = agent
                .release(&grant, pb::ReleaseCause::Busy, "not now")
                .await;
            assert_eq!(ack.code, 0, "{}", ack.message);
            if stubborn_grants == 3 {
                wait_for_state(&server, &stubborn.task_id, pb::TaskState::Failed).await;
            }
        } else {
            assert_eq!(task.task_id, ordinary.task_id);
            agent.run_to_success(&grant, json!({})).await;
            wait_for_state(&server, &ordinary.task_id, pb::TaskState::Succeeded).await;
            ordinary_done = true;
        }
    }
    assert_eq!(stubborn_grants, 3);
    let failed = get_task(&server, &stubborn.task_id).await;
    let error = failed.error.unwrap();
    assert_eq!(error.code, "released_too_often");
    assert!(!error.retryable);
    assert!(
        error.message.starts_with("released 3 times"),
        "{}",
        error.message
    );
    assert_eq!(times_leased(&server, &stubborn.task_id).await, 3);
    server.stop().await;
}

/// The second repro: a grant the runner cannot even decode kills
/// its stream; the grant comes back when the agent reconnects. A grant
/// never acknowledged counts toward the same bound, so it stops.
async fn a_grant_that_kills_the_session_every_time_reaches_the_bound(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.max_releases_per_task = 3).await;
    let poison = submit(&server, "poison", "").await;
    for _ in 0..3 {
        let mut agent = TestAgent::start(&server, "w", json!({}), 1).await;
        let grant = agent.grant().await;
        assert_eq!(grant.task.as_ref().unwrap().task_id, poison.task_id);
        // The decoder fails: the stream dies without a word.
        agent.hang_up();
        let task = get_task(&server, &poison.task_id).await;
        if task.state() == pb::TaskState::Leased {
            // The session's end revokes the grant; wait for it.
            let state = wait_for_any(&server, &poison.task_id).await;
            assert!(
                matches!(state, pb::TaskState::Queued | pb::TaskState::Failed),
                "{state:?}"
            );
        }
    }
    let failed = wait_for_state(&server, &poison.task_id, pb::TaskState::Failed).await;
    assert_eq!(failed.error.unwrap().code, "released_too_often");
    assert_eq!(times_leased(&server, &poison.task_id).await, 3);
    server.stop().await;
}

/// Waits until the task leaves LEASED.
async fn wait_for_any(server: &TestServer, task_id: &str) -> pb::TaskState {
    use tokio_stream::StreamExt;
    let mut stream = server
        .tasks()
        .await
        .watch_task(pb::WatchTaskRequest {
            task_id: task_id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(crate::common::PROMPT, async {
        while let Some(item) = stream.next().await {
            let state = item.unwrap().task.unwrap().state();
            if state != pb::TaskState::Leased {
                return state;
            }
        }
        panic!("watch ended")
    })
    .await
    .expect("the grant is revoked in time")
}

/// Bad kinds anywhere are INVALID_ARGUMENT naming the field; nothing
/// changes.
async fn bad_kinds_are_refused_naming_the_field_and_change_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let err = AgentServiceClient::new(server.channel().await)
        .register_agent(pb::RegisterAgentRequest {
            name: "bad".into(),
            capacity: 1,
            handled_kinds: vec!["exec".into(), "build *".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("handled_kinds[1]"),
        "{}",
        err.message()
    );
    let listed = server
        .admin()
        .await
        .list_agents(pb::ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .agents;
    assert!(listed.is_empty());

    let err = server
        .tasks()
        .await
        .submit_task(pb::SubmitTaskRequest {
            kind: "two words".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("kind"), "{}", err.message());

    let mut agent = TestAgent::start_handling(&server, "w", json!({}), 1, &["exec"]).await;
    let ack = agent.announce_kinds(&["ok", "a*b"]).await;
    assert_eq!(ack.code, Code::InvalidArgument as i32);
    assert!(
        ack.message.contains("heartbeat.handled_kinds.kinds[1]"),
        "{}",
        ack.message
    );
    let listed = server
        .admin()
        .await
        .list_agents(pb::ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .agents;
    assert_eq!(listed[0].handled_kinds, ["exec"]);
    // The agent still gets what it handles.
    let task = submit(&server, "exec", "").await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    server.stop().await;
}
