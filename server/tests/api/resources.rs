//! Consumable resources over real gRPC on both stores: a task that asks for
//! GPUs is granted devices no other live lease holds (named in the grant),
//! waits while they are held and says so, and gets them when a lease gives
//! them back — whether the lease succeeded, failed, was released, canceled
//! or expired; a request no agent could ever cover is parked with that
//! reason; bad requests are refused naming the field.

use serde_json::{Value, json};
use switchyard_proto::v1::{self as pb, lease_update::Update};

use crate::common::{
    Backend, TestAgent, TestServer, all_tasks, explain, get_task, placement_refused,
    submit_request, wait_for_state,
};
use crate::on_both_stores;

on_both_stores!(
    gpu_tasks_get_devices_of_their_own_and_wait_while_they_are_held,
    resources_come_back_on_every_way_a_lease_ends,
    a_request_no_agent_could_ever_cover_is_parked_with_that_reason,
    bad_resource_requests_are_refused_naming_the_field,
);

/// Two H100s (`GPU-0`, `GPU-1`) and two T4s (`GPU-2`, `GPU-3`), 8 CPUs,
/// 32 GB, two MATLAB licenses.
fn gpu_box() -> Value {
    let gpu = |i: u32, model: &str, memory: u32| json!({"index": i, "uuid": format!("GPU-{i}"), "model": model, "memory_mb": memory});
    json!({"tags": ["linux"], "resources": {
        "cpu_millicores": 8000, "memory_mb": 32000,
        "gpus": [gpu(0, "NVIDIA H100 80GB HBM3", 81559), gpu(1, "NVIDIA H100 80GB HBM3", 81559),
                 gpu(2, "Tesla T4", 15360), gpu(3, "Tesla T4", 15360)],
        "licenses": {"matlab": 2},
    }})
}

fn needs(selector: &str) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        kind: "exec".into(),
        placement: Some(pb::Placement {
            selector: selector.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The next grant, accepted; its task id and GPU ids.
async fn granted(agent: &mut TestAgent) -> (pb::LeaseGrant, String, Vec<String>) {
    let grant = agent.grant().await;
    let accepted = agent
        .update(&grant, Update::Accepted(pb::LeaseAccepted {}))
        .await;
    assert_eq!(accepted.code, 0, "{}", accepted.message);
    let task = grant.task.as_ref().unwrap().task_id.clone();
    let gpus = grant.resources.as_ref().unwrap().gpu_ids.clone();
    (grant, task, gpus)
}

async fn gpu_tasks_get_devices_of_their_own_and_wait_while_they_are_held(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "gpu-box", gpu_box(), 8).await;
    // Two jobs of two GPUs each on one machine, each with devices of its own.
    let first = submit_request(&server, needs("needs gpus: 2, needs memory: 4096")).await;
    let (first_grant, task, first_gpus) = granted(&mut agent).await;
    assert_eq!(task, first.task_id);
    assert_eq!(first_gpus, ["GPU-0", "GPU-1"]);
    let resources = first_grant.resources.clone().unwrap();
    assert_eq!((resources.slots, resources.memory_mb), (1, 4096));
    submit_request(&server, needs("needs gpus: 2")).await;
    let (_, _, second_gpus) = granted(&mut agent).await;
    assert_eq!(second_gpus, ["GPU-2", "GPU-3"]);
    // A job that wants the big GPUs waits for them, and says why.
    let big = needs("needs gpus: 2 (memory_mb>=40000, model~H100)");
    let waiting = submit_request(&server, big).await;
    let why = explain(&server, &waiting.task_id).await;
    assert_eq!(
        why.summary,
        "0/1 agents eligible: 1 short of free GPUs with memory_mb>=40000, model~H100"
    );
    assert_eq!(
        why.verdicts[0].reason,
        "needs 2 GPUs with memory_mb>=40000, model~H100: 0 of 2 free"
    );
    assert!(why.verdicts[0].capable);
    assert_eq!(
        get_task(&server, &waiting.task_id).await.queued_reason(),
        pb::QueuedReason::WaitingForCapacity
    );
    // Slots are free, but a job that needs none of the GPUs still runs.
    submit_request(&server, needs("needs cpu: 2000")).await;
    let (_, _, none) = granted(&mut agent).await;
    assert!(none.is_empty());
    // The first job ends: its GPUs go to the one that waited.
    run_to_success(&mut agent, &first_grant).await;
    let (_, task, gpus) = granted(&mut agent).await;
    assert_eq!(task, waiting.task_id);
    assert_eq!(gpus, ["GPU-0", "GPU-1"]);
    server.stop().await;
}

async fn run_to_success(agent: &mut TestAgent, grant: &pb::LeaseGrant) {
    let started = agent
        .update(grant, Update::Started(pb::LeaseStarted {}))
        .await;
    assert_eq!(started.code, 0, "{}", started.message);
    let done = agent
        .update(
            grant,
            Update::Succeeded(pb::LeaseSucceeded { result: None }),
        )
        .await;
    assert_eq!(done.code, 0, "{}", done.message);
}

/// An agent with one GPU and room for four leases: each way a lease of a
/// GPU task ends must hand the GPU to the next GPU task.
async fn resources_come_back_on_every_way_a_lease_ends(backend: Backend) {
    let server = TestServer::start(backend).await;
    let one_gpu = json!({"resources": {"gpus": [{"index": 0, "uuid": "GPU-only"}]}});
    let mut agent = TestAgent::start(&server, "one-gpu", one_gpu, 4).await;
    let gpu_task = || {
        let mut request = needs("needs gpus: 1");
        request.max_attempts = 1;
        request
    };
    let mut next = submit_request(&server, gpu_task()).await;
    for ending in ["succeeded", "failed", "released", "canceled", "expired"] {
        let (grant, task, gpus) = granted(&mut agent).await;
        assert_eq!(task, next.task_id, "{ending}");
        assert_eq!(gpus, ["GPU-only"], "{ending}");
        // While it is held, the next GPU task waits.
        next = submit_request(&server, gpu_task()).await;
        assert_eq!(
            explain(&server, &next.task_id).await.verdicts[0].reason,
            "needs 1 GPU: 0 of 1 free",
            "{ending}"
        );
        match ending {
            "succeeded" => run_to_success(&mut agent, &grant).await,
            "failed" => {
                let failed = Update::Failed(pb::LeaseFailed {
                    error: Some(pb::TaskError {
                        message: "boom".into(),
                        code: "handler_error".into(),
                        retryable: false,
                        details: None,
                        ..Default::default()
                    }),
                });
                assert_eq!(agent.update(&grant, failed).await.code, 0);
            }
            "released" => {
                let ack = agent
                    .release(&grant, pb::ReleaseCause::Busy, "not now")
                    .await;
                assert_eq!(ack.code, 0, "{}", ack.message);
                // Queued again; out of the way of the next GPU task.
                cancel(&server, &task).await;
            }
            "canceled" => {
                cancel(&server, &task).await;
                let revoked = agent
                    .expect("revocation", |m| match m {
                        pb::connect_response::Message::LeaseRevocation(r) => Some(r.clone()),
                        _ => None,
                    })
                    .await;
                assert_eq!(revoked.reason(), pb::RevocationReason::Canceled);
                let ack = agent
                    .release(&grant, pb::ReleaseCause::RevocationAcknowledged, "canceled")
                    .await;
                assert_eq!(ack.code, 0, "{}", ack.message);
                wait_for_state(&server, &task, pb::TaskState::Canceled).await;
            }
            _ => {
                // Another store instance expires it an hour on (on SQLite
                // unannounced: the replica's recount from the store notices).
                let other = switchyard_server::store::open(&server.url).await.unwrap();
                let now = switchyard_server::clock::Clock::system().now_ms();
                let expired = other.expire_leases(now + 3_600_000, 10).await.unwrap();
                assert_eq!(expired.len(), 1);
            }
        }
    }
    let (_, task, gpus) = granted(&mut agent).await;
    assert_eq!((task, gpus), (next.task_id, vec!["GPU-only".to_owned()]));
    server.stop().await;
}

async fn cancel(server: &TestServer, task_id: &str) {
    server
        .tasks()
        .await
        .cancel_task(pb::CancelTaskRequest {
            task_id: task_id.to_owned(),
            reason: "not needed".into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

async fn a_request_no_agent_could_ever_cover_is_parked_with_that_reason(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "gpu-box", gpu_box(), 8).await;
    let cases = [
        ("needs gpus: 8", "needs 8 GPUs: has 4", "too few GPUs"),
        (
            "needs gpus: 3 (memory_mb>=40000)",
            "needs 3 GPUs with memory_mb>=40000: 2 of its 4 match",
            "too few GPUs with memory_mb>=40000",
        ),
        (
            "needs memory: 40000",
            "needs memory 40000 MB: has 32000",
            "too little memory",
        ),
        (
            "needs licenses.matlab: 3",
            "needs licenses.matlab 3: has 2",
            "too little licenses.matlab",
        ),
        (
            "needs licenses.abaqus: 1",
            "needs licenses.abaqus 1: offers none",
            "too little licenses.abaqus",
        ),
        ("needs slots: 9", "needs 9 slots: has 8", "too few slots"),
    ];
    for (selector, reason, summary) in cases {
        let task = submit_request(&server, needs(selector)).await;
        assert_eq!(task.queued_reason(), pb::QueuedReason::Parked, "{selector}");
        let why = explain(&server, &task.task_id).await;
        assert_eq!(why.verdicts[0].reason, reason, "{selector}");
        assert!(!why.verdicts[0].capable, "{selector}");
        assert_eq!(why.summary, format!("0/1 agents eligible: 1 {summary}"));
        assert_eq!(
            get_task(&server, &task.task_id).await.queued_reason(),
            pb::QueuedReason::Parked,
            "{selector}"
        );
    }
    // What the agent can cover still runs past the parked ones.
    let runs = submit_request(&server, needs("needs licenses.matlab: 2, needs slots: 8")).await;
    let (_, task, _) = granted(&mut agent).await;
    assert_eq!(task, runs.task_id);
    server.stop().await;
}

async fn bad_resource_requests_are_refused_naming_the_field(backend: Backend) {
    let server = TestServer::start(backend).await;
    let request = |resources: pb::ResourceRequest| pb::Placement {
        resources: Some(resources),
        ..Default::default()
    };
    let cases = [
        (
            request(pb::ResourceRequest {
                gpu_selector: "memory_mb>=".into(),
                gpus: 1,
                ..Default::default()
            }),
            "placement.resources.gpu_selector",
        ),
        (
            request(pb::ResourceRequest {
                gpu_selector: "h100".into(),
                gpus: 1,
                ..Default::default()
            }),
            "placement.resources.gpu_selector",
        ),
        (
            request(pb::ResourceRequest {
                gpu_selector: "memory_mb>=40000".into(),
                ..Default::default()
            }),
            "placement.resources.gpu_requirements",
        ),
        (
            request(pb::ResourceRequest {
                slots: 10_001,
                ..Default::default()
            }),
            "placement.resources.slots",
        ),
        (
            request(pb::ResourceRequest {
                memory_mb: 1 << 60,
                ..Default::default()
            }),
            "placement.resources.memory_mb",
        ),
        (
            request(pb::ResourceRequest {
                named: [("licenses.matlab".to_owned(), 0)].into(),
                ..Default::default()
            }),
            "placement.resources.named[\"licenses.matlab\"]",
        ),
        (
            request(pb::ResourceRequest {
                named: [("two words".to_owned(), 1)].into(),
                ..Default::default()
            }),
            "placement.resources.named[\"two words\"]",
        ),
        (
            pb::Placement {
                spread_by: "two words".into(),
                ..Default::default()
            },
            "placement.spread_by",
        ),
        (
            pb::Placement {
                selector: "needs gpus: 99999999999".into(),
                ..Default::default()
            },
            "placement.selector",
        ),
    ];
    for (placement, field) in cases {
        placement_refused(&server, placement, field).await;
    }
    assert!(all_tasks(&server).await.is_empty());
    server.stop().await;
}
