//! What the contract says must be true, over real gRPC on both stores: a
//! heartbeat's ack says when each lease really expires (its task's own TTL)
//! and nothing when the agent holds none; ListTasks gives a queued task the
//! reason GetTask gives; numbers past ±(2^53 − 1) are refused, named, and
//! whole numbers come back exact; a diff that was not applied is acked as
//! not applied, a bad pointer named by its operation; a value nested too
//! deeply is refused in one line; and only an acknowledged lease counts an
//! attempt, however it ends.

use serde_json::json;
use switchyard_proto::convert::{json_to_struct, json_to_value, timestamp_ms};
use switchyard_proto::v1::{self as pb, connect_response::Message as Down, lease_update::Update};

use crate::common::{
    Backend, TestAgent, TestServer, get_agent, get_task, submit, submit_request, task_events,
    wait_for_state,
};
use crate::on_both_stores;

fn linux() -> serde_json::Value {
    json!({"os": "linux", "tags": ["linux"], "memory": {"total": 16384, "free": 8000}})
}

fn with_ttl(kind: &str, ttl_secs: i64) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        kind: kind.into(),
        placement: Some(pb::Placement {
            selector: "linux".into(),
            ..Default::default()
        }),
        lease_ttl: Some(prost_types::Duration {
            seconds: ttl_secs,
            nanos: 0,
        }),
        ..Default::default()
    }
}

async fn accept(agent: &mut TestAgent, grant: &pb::LeaseGrant) {
    let ack = agent
        .update(grant, Update::Accepted(pb::LeaseAccepted::default()))
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
}

/// The server's default TTL is 30 s; two tasks ask for 2 s and 10 s. The
/// ack of a heartbeat says each lease's own expiry (the one stored), and
/// the earliest of them; an agent holding none is told none.
async fn acks_say_each_leases_own_expiry_and_nothing_without_leases(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "w1", linux(), 2).await;
    let idle = agent.heartbeat(pb::AgentStatus::Ready, &[], None).await;
    assert_eq!(idle.code, 0, "{}", idle.message);
    assert_eq!(idle.leases_expire_at, None, "no lease, no expiry");
    assert!(idle.lease_expiries.is_empty());

    let short = submit_request(&server, with_ttl("short", 2)).await;
    let long = submit_request(&server, with_ttl("long", 10)).await;
    let g1 = agent.grant().await;
    let g2 = agent.grant().await;
    accept(&mut agent, &g1).await;
    accept(&mut agent, &g2).await;
    let ack = agent.heartbeat(pb::AgentStatus::Ready, &[], None).await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    assert_eq!(ack.lease_expiries.len(), 2, "{ack:?}");
    let expiry = |task_id: &str| {
        let e = ack
            .lease_expiries
            .iter()
            .find(|e| e.task_id == task_id)
            .unwrap_or_else(|| panic!("no expiry for {task_id}: {ack:?}"));
        timestamp_ms(e.expires_at.as_ref().unwrap())
    };
    let (s, l) = (expiry(&short.task_id), expiry(&long.task_id));
    // One renewal, two TTLs.
    assert_eq!(l - s, 8_000);
    assert_eq!(timestamp_ms(ack.leases_expire_at.as_ref().unwrap()), s);
    // As stored.
    for (task_id, at) in [(&short.task_id, s), (&long.task_id, l)] {
        let stored = get_task(&server, task_id).await.lease.unwrap();
        assert_eq!(timestamp_ms(stored.expires_at.as_ref().unwrap()), at);
        let named = ack.lease_expiries.iter().find(|e| e.task_id == *task_id);
        assert_eq!(named.unwrap().lease_id, stored.lease_id);
    }

    // Done with both: the next ack names none.
    agent.run_to_success(&g1, json!({})).await;
    agent.run_to_success(&g2, json!({})).await;
    wait_for_state(&server, &short.task_id, pb::TaskState::Succeeded).await;
    wait_for_state(&server, &long.task_id, pb::TaskState::Succeeded).await;
    let after = agent.heartbeat(pb::AgentStatus::Ready, &[], None).await;
    assert_eq!(after.leases_expire_at, None, "{after:?}");
    assert!(after.lease_expiries.is_empty());
    server.stop().await;
}

async fn list_tasks(server: &TestServer) -> Vec<pb::Task> {
    server
        .tasks()
        .await
        .list_tasks(pb::ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tasks
}

/// A parked task and one waiting for a busy agent are listed with the
/// reasons GetTask gives them; a running one with none.
async fn list_tasks_gives_the_reason_get_task_gives(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "w1", linux(), 1).await;
    let running = submit(&server, "echo", "linux").await;
    let grant = agent.grant().await;
    assert_eq!(grant.task.unwrap().task_id, running.task_id);
    let waiting = submit(&server, "echo", "linux").await;
    let parked = submit(&server, "echo", "os == windows").await;
    let listed = list_tasks(&server).await;
    let reason = |id: &str| {
        listed
            .iter()
            .find(|t| t.task_id == id)
            .unwrap_or_else(|| panic!("{id} not listed"))
            .queued_reason()
    };
    assert_eq!(reason(&parked.task_id), pb::QueuedReason::Parked);
    assert_eq!(
        reason(&waiting.task_id),
        pb::QueuedReason::WaitingForCapacity
    );
    assert_eq!(reason(&running.task_id), pb::QueuedReason::Unspecified);
    for id in [&parked.task_id, &waiting.task_id, &running.task_id] {
        assert_eq!(
            get_task(&server, id).await.queued_reason(),
            reason(id),
            "{id}"
        );
    }
    server.stop().await;
}

/// A task every capable agent refused is parked in a listing too.
async fn list_tasks_parks_a_task_its_only_agent_refused(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "w1", linux(), 1).await;
    let task = submit(&server, "echo", "linux").await;
    let grant = agent.grant().await;
    let ack = agent
        .release(&grant, pb::ReleaseCause::CannotHandle, "no echo here")
        .await;
    assert_eq!(ack.code, 0, "{}", ack.message);
    wait_for_state(&server, &task.task_id, pb::TaskState::Queued).await;
    assert_eq!(
        get_task(&server, &task.task_id).await.queued_reason(),
        pb::QueuedReason::Parked
    );
    let listed = list_tasks(&server).await;
    assert_eq!(listed[0].queued_reason(), pb::QueuedReason::Parked);
    server.stop().await;
}

fn number(n: f64) -> prost_types::Value {
    prost_types::Value {
        kind: Some(prost_types::value::Kind::NumberValue(n)),
    }
}

/// ±(2^53 − 1) is carried and read back exact; anything larger is refused
/// naming the field, in a payload, a result and a capability diff, and
/// changes nothing.
async fn numbers_past_2_53_are_refused_and_whole_numbers_kept(backend: Backend) {
    const MAX: f64 = 9_007_199_254_740_991.0;
    let server = TestServer::start(backend).await;
    let mut payload = json_to_struct(&json!({"port": 8080}));
    payload.fields.insert("id".into(), number(MAX + 1.0));
    let mut request = with_ttl("echo", 30);
    request.payload = Some(payload.clone());
    let err = server
        .tasks()
        .await
        .submit_task(request.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message()
            .contains("payload.id: number is beyond ±(2^53 − 1)"),
        "{}",
        err.message()
    );
    assert!(list_tasks(&server).await.is_empty(), "nothing was stored");

    payload.fields.insert("id".into(), number(-MAX));
    request.payload = Some(payload);
    let task = submit_request(&server, request).await;
    let stored = get_task(&server, &task.task_id).await.payload.unwrap();
    assert_eq!(stored.fields["id"], number(-MAX));
    assert_eq!(stored.fields["port"], number(8080.0));

    let mut agent = TestAgent::start(&server, "w1", linux(), 1).await;
    let grant = agent.grant().await;
    accept(&mut agent, &grant).await;
    let mut result = json_to_struct(&json!({"exit_code": 0}));
    result.fields.insert("bytes".into(), number(1e300));
    let refused = agent
        .update(
            &grant,
            Update::Succeeded(pb::LeaseSucceeded {
                result: Some(result),
            }),
        )
        .await;
    assert_eq!(refused.code, tonic::Code::InvalidArgument as i32);
    assert!(
        refused.message.contains("result.bytes: number is beyond"),
        "{}",
        refused.message
    );
    assert_eq!(
        get_task(&server, &task.task_id).await.state(),
        pb::TaskState::Leased,
        "the refused report changed nothing"
    );

    // In a diff: not applied, and said so.
    let op = pb::PatchOperation {
        op: pb::PatchOp::Add as i32,
        path: "/disk".into(),
        from: String::new(),
        value: Some(number(MAX + 2.0)),
    };
    let ack = diff(&mut agent, vec![op]).await;
    assert_eq!(ack.code, tonic::Code::FailedPrecondition as i32);
    assert!(
        ack.message
            .contains("operation 0 (add /disk) failed: value: number is beyond"),
        "{}",
        ack.message
    );
    server.stop().await;
}

/// Sends a diff of `operations` against the generation the agent holds;
/// the ack.
async fn diff(agent: &mut TestAgent, operations: Vec<pb::PatchOperation>) -> pb::Ack {
    let base = agent.generation;
    diff_against(agent, base, operations).await
}

async fn diff_against(
    agent: &mut TestAgent,
    base_generation: u64,
    operations: Vec<pb::PatchOperation>,
) -> pb::Ack {
    let seq = agent
        .send(pb::connect_request::Message::Heartbeat(pb::Heartbeat {
            status: pb::AgentStatus::Ready as i32,
            capability_diff: Some(pb::CapabilityDiff {
                base_generation,
                operations,
            }),
            ..Default::default()
        }))
        .await;
    agent.ack(seq).await
}

async fn resync_reason(agent: &mut TestAgent) -> String {
    agent
        .expect("a ResyncRequest", |m| match m {
            Down::ResyncRequest(r) => Some(r.reason.clone()),
            _ => None,
        })
        .await
}

/// A diff against a generation the server does not hold is acked as not
/// applied (FAILED_PRECONDITION, saying why), the heartbeat otherwise
/// applied (its lease renewed), and a ResyncRequest follows; a pointer
/// that is not one is named by its operation, as any failed operation is.
async fn a_diff_not_applied_is_acked_as_such(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "w1", linux(), 1).await;
    let task = submit(&server, "echo", "linux").await;
    let grant = agent.grant().await;
    accept(&mut agent, &grant).await;
    let held = agent.generation;
    let add = |path: &str| pb::PatchOperation {
        op: pb::PatchOp::Add as i32,
        path: path.into(),
        from: String::new(),
        value: Some(json_to_value(&json!(1))),
    };
    let ack = diff_against(&mut agent, held + 3, vec![add("/a")]).await;
    assert_eq!(ack.code, tonic::Code::FailedPrecondition as i32, "{ack:?}");
    assert!(
        ack.message.starts_with("capability diff not applied: "),
        "{}",
        ack.message
    );
    assert!(ack.message.contains("generation"), "{}", ack.message);
    assert_eq!(ack.capability_generation, held);
    assert_eq!(
        ack.lease_expiries.len(),
        1,
        "the lease was renewed: {ack:?}"
    );
    assert_eq!(ack.lease_expiries[0].task_id, task.task_id);
    assert!(resync_reason(&mut agent).await.contains("generation"));

    let ack = diff(&mut agent, vec![add("/a"), add("memory/free")]).await;
    assert_eq!(ack.code, tonic::Code::FailedPrecondition as i32, "{ack:?}");
    let named = "operation 1 (add memory/free) failed: path \"memory/free\" is not a JSON pointer";
    assert!(ack.message.contains(named), "{}", ack.message);
    assert!(resync_reason(&mut agent).await.starts_with(named));

    // Nothing of either was applied.
    let stored = get_agent(&server, &agent.agent_id).await;
    let document = stored.capabilities.unwrap().document.unwrap();
    assert!(!document.fields.contains_key("a"), "{document:?}");
    server.stop().await;
}

/// A payload nested 100 deep is refused in one line naming the field and
/// the limit, not prost's chain of every message on the way.
async fn a_value_nested_too_deeply_is_refused_in_one_line(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!({ "d": deep });
    }
    let mut request = with_ttl("echo", 30);
    request.payload = Some(json_to_struct(&deep));
    let err = server.tasks().await.submit_task(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let message = err.message();
    assert!(
        message.starts_with(
            "the request does not decode as a SubmitTaskRequest: payload is nested too deeply: \
             protobuf decoding stops at 100 nested messages"
        ),
        "{message}"
    );
    assert!(
        message.len() < 300 && !message.contains('\n'),
        "{} characters: {message}",
        message.len()
    );
    server.stop().await;
}

/// Only a lease the agent acknowledged counts an attempt: a grant that
/// expires unacknowledged is a release (as one revoked unacknowledged is),
/// one that expires after LeaseAccepted is a lost attempt.
async fn only_an_acknowledged_lease_counts_an_attempt(backend: Backend) {
    let server = TestServer::start_with(backend, |c| {
        // The sweeper, not the ack window, ends the unacknowledged grant.
        c.ack_window_ms = 600_000;
        c.sweep_interval_ms = 100;
    })
    .await;
    let mut agent = TestAgent::start(&server, "w1", linux(), 1).await;
    let mut request = with_ttl("echo", 1);
    request.max_attempts = 2;
    let task = submit_request(&server, request).await;
    let first = agent.grant().await;
    // Never acknowledged, never renewed: it expires, and is granted again.
    let second = agent.grant().await;
    assert_eq!(second.fencing_token, first.fencing_token + 1);
    let t = get_task(&server, &task.task_id).await;
    assert_eq!(t.attempts, 0, "an unacknowledged grant is no attempt");
    let expired = task_events(&server, &task.task_id).await;
    assert!(
        expired
            .iter()
            .any(|e| e.message == "the lease expired before the agent acknowledged it"),
        "{expired:?}"
    );
    accept(&mut agent, &second).await;
    let third = agent.grant().await;
    assert_eq!(third.fencing_token, second.fencing_token + 1);
    assert_eq!(get_task(&server, &task.task_id).await.attempts, 1);
    server.stop().await;
}

on_both_stores!(
    acks_say_each_leases_own_expiry_and_nothing_without_leases,
    list_tasks_gives_the_reason_get_task_gives,
    list_tasks_parks_a_task_its_only_agent_refused,
    numbers_past_2_53_are_refused_and_whole_numbers_kept,
    a_diff_not_applied_is_acked_as_such,
    a_value_nested_too_deeply_is_refused_in_one_line,
    only_an_acknowledged_lease_counts_an_attempt,
);
