//! Placement policy over real gRPC on both stores: binpack fills one agent
//! before the next while spread alternates, a tainted agent takes only
//! tasks that tolerate its taint (and says so in explanations), a retry goes
//! to another agent than the one its attempt failed on, SimulatePlacement
//! names the policy and why the first agent ranks first, and bad
//! tolerations or policies are refused naming the field.

use serde_json::json;
use switchyard_proto::v1::{self as pb, lease_update::Update};
use switchyard_server::api::convert::json_to_struct;

use crate::common::{
    Backend, TestAgent, TestServer, all_tasks, explain, get_task, placement_refused,
    submit_request, wait_for_state,
};
use crate::on_both_stores;

on_both_stores!(
    binpack_fills_one_agent_before_the_next_and_spread_alternates,
    a_tainted_agent_takes_only_tasks_that_tolerate_it,
    a_retry_goes_to_another_agent_than_the_one_it_failed_on,
    simulate_names_the_policy_and_why_the_first_agent_ranks_first,
    spread_by_balances_tasks_over_the_values_of_a_key,
    bad_tolerations_and_policies_are_refused_naming_the_field,
);

fn request(selector: &str, policy: pb::PlacementPolicy) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        kind: "exec".into(),
        placement: Some(pb::Placement {
            selector: selector.into(),
            policy: policy as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Submits, waits until it is leased, and has the agent that holds it take
/// and accept the grant; returns which of `agents` that is.
async fn placed(
    server: &TestServer,
    agents: &mut [&mut TestAgent],
    request: pb::SubmitTaskRequest,
) -> usize {
    let task = submit_request(server, request).await;
    let leased = wait_for_state(server, &task.task_id, pb::TaskState::Leased).await;
    let holder = leased.lease.expect("lease").agent_id;
    let i = agents
        .iter()
        .position(|a| a.agent_id == holder)
        .expect("a known agent holds it");
    let grant = agents[i].grant().await;
    assert_eq!(grant.task.as_ref().unwrap().task_id, task.task_id);
    let accepted = agents[i]
        .update(&grant, Update::Accepted(pb::LeaseAccepted {}))
        .await;
    assert_eq!(accepted.code, 0, "{}", accepted.message);
    i
}

async fn binpack_fills_one_agent_before_the_next_and_spread_alternates(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = TestAgent::start(&server, "a", json!({}), 3).await;
    let mut b = TestAgent::start(&server, "b", json!({}), 3).await;
    let mut agents = [&mut a, &mut b];
    let binpack = || request("", pb::PlacementPolicy::Binpack);
    let first = placed(&server, &mut agents, binpack()).await;
    for _ in 0..2 {
        assert_eq!(placed(&server, &mut agents, binpack()).await, first);
    }
    // Full: the next goes to the other one.
    assert_eq!(placed(&server, &mut agents, binpack()).await, 1 - first);
    server.stop().await;

    let server = TestServer::start(backend).await;
    let mut a = TestAgent::start(&server, "a", json!({}), 3).await;
    let mut b = TestAgent::start(&server, "b", json!({}), 3).await;
    let mut agents = [&mut a, &mut b];
    let spread = || request("", pb::PlacementPolicy::Unspecified);
    let first = placed(&server, &mut agents, spread()).await;
    assert_eq!(placed(&server, &mut agents, spread()).await, 1 - first);
    assert_eq!(placed(&server, &mut agents, spread()).await, first);
    // The server's default for the namespace decided, and the task says so.
    let tasks = all_tasks(&server).await;
    assert!(
        tasks
            .iter()
            .all(|t| t.placement.as_ref().unwrap().policy() == pb::PlacementPolicy::Spread)
    );
    server.stop().await;

    // A namespace default of binpack applies to tasks that do not say.
    let server = TestServer::start_with(backend, |c| {
        c.placement_policy = vec![switchyard_server::config::PolicyDefault {
            namespace: Some("default".into()),
            policy: switchyard_core::placement::PlacementPolicy::Binpack,
        }];
    })
    .await;
    let mut a = TestAgent::start(&server, "a", json!({}), 3).await;
    let mut b = TestAgent::start(&server, "b", json!({}), 3).await;
    let mut agents = [&mut a, &mut b];
    let first = placed(&server, &mut agents, spread()).await;
    assert_eq!(placed(&server, &mut agents, spread()).await, first);
    server.stop().await;
}

async fn a_tainted_agent_takes_only_tasks_that_tolerate_it(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut cpu = TestAgent::start(&server, "cpu", json!({"tags": ["linux"]}), 1).await;
    let gpu_doc = json!({"tags": ["linux", "gpu"], "taints": ["gpu"]});
    let mut gpu = TestAgent::start(&server, "gpu", gpu_doc, 4).await;
    let spread = pb::PlacementPolicy::Unspecified;
    // The GPU agent is the less loaded, but ordinary work goes to the CPU one.
    let mut agents = [&mut cpu, &mut gpu];
    assert_eq!(
        placed(&server, &mut agents, request("linux", spread)).await,
        0
    );
    // The CPU agent is full: ordinary work waits rather than take the GPUs.
    let waiting = submit_request(&server, request("linux", spread)).await;
    let why = explain(&server, &waiting.task_id).await;
    assert_eq!(
        why.summary,
        "0/2 agents eligible: 1 at capacity, 1 tainted gpu"
    );
    let gpu_verdict = why.verdicts.iter().find(|v| v.agent_name == "gpu").unwrap();
    assert_eq!(gpu_verdict.reason, "tainted gpu: task does not tolerate it");
    assert_eq!(
        get_task(&server, &waiting.task_id).await.queued_reason(),
        pb::QueuedReason::WaitingForCapacity
    );
    // Work that tolerates the taint goes to it.
    assert_eq!(
        placed(
            &server,
            &mut agents,
            request("linux, tolerates gpu", spread)
        )
        .await,
        1
    );
    // A task that needs the GPU agent but does not tolerate it is parked.
    let parked = submit_request(&server, request("gpu", spread)).await;
    let why = explain(&server, &parked.task_id).await;
    assert_eq!(
        why.summary,
        "0/2 agents eligible: 1 missing tag gpu, 1 tainted gpu"
    );
    assert_eq!(
        get_task(&server, &parked.task_id).await.queued_reason(),
        pb::QueuedReason::Parked
    );
    // An operator lifting the taint (the operator tier) unparks it.
    let agent_id = agents[1].agent_id.clone();
    server
        .admin()
        .await
        .set_agent_overrides(pb::SetAgentOverridesRequest {
            agent_id,
            overrides: Some(json_to_struct(&json!({"taints": []}))),
        })
        .await
        .unwrap();
    // Untainted, it takes both the parked task and the one that waited for
    // the CPU agent (the older first).
    let mut granted = Vec::new();
    for _ in 0..2 {
        granted.push(agents[1].grant().await.task.unwrap().task_id);
    }
    assert_eq!(granted, [waiting.task_id, parked.task_id]);
    server.stop().await;
}

async fn a_retry_goes_to_another_agent_than_the_one_it_failed_on(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = TestAgent::start(&server, "a", json!({}), 1).await;
    let mut b = TestAgent::start(&server, "b", json!({}), 1).await;
    // Binpack ranks the agent granted most recently first: without
    // avoidance the retry would go straight back to the agent it failed on.
    let mut task = request("", pb::PlacementPolicy::Binpack);
    task.max_attempts = 3;
    let submitted = submit_request(&server, task).await;
    let leased = wait_for_state(&server, &submitted.task_id, pb::TaskState::Leased).await;
    let first = leased.lease.unwrap().agent_id;
    let (failing, other) = if first == a.agent_id {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let grant = failing.grant().await;
    let accepted = Update::Accepted(pb::LeaseAccepted {});
    assert_eq!(failing.update(&grant, accepted.clone()).await.code, 0);
    let failure = Update::Failed(pb::LeaseFailed {
        error: Some(pb::TaskError {
            message: "out of disk".into(),
            code: "handler_error".into(),
            retryable: true,
            details: None,
            ..Default::default()
        }),
    });
    assert_eq!(failing.update(&grant, failure.clone()).await.code, 0);
    // After the backoff the retry goes elsewhere.
    let retry = other.grant().await;
    assert_eq!(retry.task.as_ref().unwrap().task_id, submitted.task_id);
    assert_eq!(other.update(&retry, accepted).await.code, 0);
    let why = explain(&server, &submitted.task_id).await;
    let avoided = why
        .verdicts
        .iter()
        .find(|v| v.agent_id == failing.agent_id)
        .unwrap();
    assert_eq!(
        avoided.reason,
        "an earlier attempt failed on it; another capable agent takes the retry"
    );
    // It failed there too: with no agent it has not failed on, the third
    // attempt may go to either.
    assert_eq!(other.update(&retry, failure).await.code, 0);
    let third = wait_for_state(&server, &submitted.task_id, pb::TaskState::Leased).await;
    assert_eq!(third.attempts, 2);
    server.stop().await;
}

/// Two agents in eu and one in us: tasks that spread by region alternate
/// between the regions, not the agents (with plain spread, eu would take
/// two of every three).
async fn spread_by_balances_tasks_over_the_values_of_a_key(backend: Backend) {
    let server = TestServer::start(backend).await;
    let region = |r: &str| json!({"custom_properties": {"region": r}});
    let mut eu1 = TestAgent::start(&server, "eu1", region("eu"), 4).await;
    let mut eu2 = TestAgent::start(&server, "eu2", region("eu"), 4).await;
    let mut us1 = TestAgent::start(&server, "us1", region("us"), 4).await;
    let mut agents = [&mut eu1, &mut eu2, &mut us1];
    let spread = || {
        request(
            "spread by custom_properties.region",
            pb::PlacementPolicy::Unspecified,
        )
    };
    let mut regions = Vec::new();
    for _ in 0..6 {
        let i = placed(&server, &mut agents, spread()).await;
        regions.push(if i == 2 { "us" } else { "eu" });
    }
    let us = regions.iter().filter(|r| **r == "us").count();
    assert_eq!(us, 3, "{regions:?}");
    for pair in regions.chunks(2) {
        assert_ne!(pair[0], pair[1], "{regions:?}");
    }
    // The stored placement says what it spreads by.
    let tasks = all_tasks(&server).await;
    assert!(
        tasks
            .iter()
            .all(|t| t.placement.as_ref().unwrap().spread_by == "custom_properties.region")
    );
    server.stop().await;
}

async fn simulate_names_the_policy_and_why_the_first_agent_ranks_first(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = TestAgent::start(&server, "a", json!({}), 4).await;
    let _b = TestAgent::start(&server, "b", json!({}), 4).await;
    let mut agents = [&mut a];
    placed(
        &server,
        &mut agents,
        request("", pb::PlacementPolicy::Unspecified),
    )
    .await;
    let simulate = |policy: pb::PlacementPolicy| {
        let server = &server;
        async move {
            server
                .admin()
                .await
                .simulate_placement(pb::SimulatePlacementRequest {
                    placement: Some(pb::Placement {
                        policy: policy as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let spread = simulate(pb::PlacementPolicy::Unspecified).await;
    assert_eq!(spread.policy(), pb::PlacementPolicy::Spread);
    assert_eq!(
        spread.ranking,
        "b ranks first of 2 under spread: more of its slots free (4/4 against 3/4)"
    );
    let binpack = simulate(pb::PlacementPolicy::Binpack).await;
    assert_eq!(binpack.policy(), pb::PlacementPolicy::Binpack);
    assert_eq!(
        binpack.ranking,
        "a ranks first of 2 under binpack: the least spare room that still fits (3/4 free against 4/4)"
    );
    assert_eq!(binpack.verdicts[0].agent_name, "a");
    server.stop().await;
}

async fn bad_tolerations_and_policies_are_refused_naming_the_field(backend: Backend) {
    let server = TestServer::start(backend).await;
    let cases = [
        (
            pb::Placement {
                tolerations: vec!["gpu pool".into()],
                ..Default::default()
            },
            "placement.tolerations[0]",
        ),
        (
            pb::Placement {
                tolerations: vec![String::new()],
                ..Default::default()
            },
            "placement.tolerations[0]",
        ),
        (
            pb::Placement {
                policy: 7,
                ..Default::default()
            },
            "placement.policy",
        ),
        (
            pb::Placement {
                selector: "tolerates \"a b\"".into(),
                ..Default::default()
            },
            "placement.tolerations[0]",
        ),
    ];
    for (placement, field) in cases {
        placement_refused(&server, placement, field).await;
    }
    let tasks = all_tasks(&server).await;
    assert!(tasks.is_empty());
    server.stop().await;
}
