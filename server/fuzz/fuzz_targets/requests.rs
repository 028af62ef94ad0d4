//! Fuzzes the request validation path of every RPC: the input's first byte picks a request
//! type, the rest is decoded as that message (prost) and sent to a real server (SQLite, open,
//! started once) over gRPC, as a session's first message after a valid `Hello` for the stream.
//! The server must never panic (the panic hook aborts, which libFuzzer reports), never answer
//! INTERNAL or UNKNOWN, and whatever task it accepts must decode again inside a grant with
//! prost's default recursion limit: the runners' view of it.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use switchyard_proto::v1::{
    self as pb, agent_admin_service_client::AgentAdminServiceClient,
    agent_service_client::AgentServiceClient, task_service_client::TaskServiceClient,
};
use tonic::transport::Channel;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
    agent: pb::RegisterAgentResponse,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default_hook(info);
            std::process::abort();
        }));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("fuzz.db").display());
        let (channel, agent) = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("address");
            let config = switchyard_server::config::ServerConfig::for_tests(url);
            tokio::spawn(switchyard_server::run(listener, config, std::future::pending()));
            let channel = loop {
                match Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await {
                    Ok(c) => break c,
                    Err(_) => tokio::task::yield_now().await,
                }
            };
            let agent = loop {
                let registered = AgentServiceClient::new(channel.clone())
                    .register_agent(pb::RegisterAgentRequest {
                        name: "fuzz".into(),
                        capacity: 4,
                        handled_kinds: vec!["*".into()],
                        ..Default::default()
                    })
                    .await;
                if let Ok(r) = registered {
                    break r.into_inner();
                }
            };
            (channel, agent)
        });
        Fixture {
            runtime,
            channel,
            agent,
            _dir: dir,
        }
    })
}

fn check<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Option<T> {
    match result {
        Ok(r) => Some(r.into_inner()),
        Err(status) => {
            assert!(
                !matches!(status.code(), tonic::Code::Internal | tonic::Code::Unknown),
                "{status:?}"
            );
            None
        }
    }
}

/// A task the server shows must decode as a runner receives it.
fn decodes_in_a_grant(task: Option<pb::Task>) {
    let wire = pb::ConnectResponse {
        message: Some(pb::connect_response::Message::LeaseGrant(pb::LeaseGrant {
            task,
            ..Default::default()
        })),
    }
    .encode_to_vec();
    pb::ConnectResponse::decode(wire.as_slice()).expect("a grant of an accepted task decodes");
}

macro_rules! decode_or_return {
    ($ty:ty, $bytes:expr) => {
        match <$ty>::decode($bytes) {
            Ok(m) => m,
            Err(_) => return,
        }
    };
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let tasks = TaskServiceClient::new(f.channel.clone());
    let admin = AgentAdminServiceClient::new(f.channel.clone());
    let agents = AgentServiceClient::new(f.channel.clone());
    f.runtime.block_on(async move {
        let (mut tasks, mut admin, mut agents) = (tasks, admin, agents);
        match which % 15 {
            0 => {
                let m = decode_or_return!(pb::SubmitTaskRequest, bytes);
                if let Some(r) = check(tasks.submit_task(m).await) {
                    decodes_in_a_grant(r.task);
                }
            }
            1 => {
                let m = decode_or_return!(pb::GetTaskRequest, bytes);
                check(tasks.get_task(m).await);
            }
            2 => {
                let m = decode_or_return!(pb::ListTasksRequest, bytes);
                if let Some(r) = check(tasks.list_tasks(m).await) {
                    r.tasks.into_iter().for_each(|t| decodes_in_a_grant(Some(t)));
                }
            }
            3 => {
                let m = decode_or_return!(pb::CancelTaskRequest, bytes);
                check(tasks.cancel_task(m).await);
            }
            4 => {
                let m = decode_or_return!(pb::ExplainTaskRequest, bytes);
                check(tasks.explain_task(m).await);
            }
            5 => {
                let m = decode_or_return!(pb::ListTaskEventsRequest, bytes);
                check(tasks.list_task_events(m).await);
            }
            6 => {
                let mut m = decode_or_return!(pb::RegisterAgentRequest, bytes);
                if m.name == "fuzz" {
                    m.name.push('2'); // keep the session's agent
                }
                check(agents.register_agent(m).await);
            }
            7 => {
                let m = decode_or_return!(pb::ListAgentsRequest, bytes);
                check(admin.list_agents(m).await);
            }
            8 => {
                let m = decode_or_return!(pb::GetAgentRequest, bytes);
                check(admin.get_agent(m).await);
            }
            9 => {
                let m = decode_or_return!(pb::DrainAgentRequest, bytes);
                check(admin.drain_agent(m).await);
            }
            10 => {
                let m = decode_or_return!(pb::UndrainAgentRequest, bytes);
                check(admin.undrain_agent(m).await);
            }
            11 => {
                let m = decode_or_return!(pb::SetAgentOverridesRequest, bytes);
                check(admin.set_agent_overrides(m).await);
            }
            12 => {
                let m = decode_or_return!(pb::SimulatePlacementRequest, bytes);
                check(admin.simulate_placement(m).await);
            }
            13 => {
                let m = decode_or_return!(pb::SubmitTasksRequest, bytes);
                if let Some(r) = check(tasks.submit_tasks(m).await) {
                    r.results.into_iter().for_each(|r| decodes_in_a_grant(r.task));
                }
            }
            _ => {
                // A session message, after a Hello that opens the stream.
                let mut m = decode_or_return!(pb::ConnectRequest, bytes);
                m.sequence = 2;
                let hello = pb::ConnectRequest {
                    sequence: 1,
                    message: Some(pb::connect_request::Message::Hello(pb::Hello {
                        agent_id: f.agent.agent_id.clone(),
                        session_epoch: f.agent.session_epoch,
                        held_leases: Vec::new(),
                    })),
                };
                let up = tokio_stream::iter([hello, m]);
                if let Some(mut down) = check(agents.connect(up).await) {
                    // The welcome (or a refusal), then whatever answers the message.
                    for _ in 0..2 {
                        match down.message().await {
                            Ok(Some(_)) => {}
                            Ok(None) => break,
                            Err(status) => {
                                assert!(
                                    !matches!(status.code(), tonic::Code::Internal | tonic::Code::Unknown),
                                    "{status:?}"
                                );
                                break;
                            }
                        }
                    }
                }
            }
        }
    });
});
