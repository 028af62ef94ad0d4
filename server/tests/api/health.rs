//! Health and reflection: what load balancers, probes and grpcurl rely on.

use tokio_stream::StreamExt;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::{v1, v1alpha};

use crate::common::TestServer;

const SERVICES: [&str; 3] = [
    "switchyard.v1.AgentService",
    "switchyard.v1.TaskService",
    "switchyard.v1.AgentAdminService",
];

#[tokio::test]
async fn health_reports_serving_for_the_server_and_each_service() {
    let server = TestServer::start_sqlite().await;
    let mut health = HealthClient::new(server.channel().await);
    for service in std::iter::once("").chain(SERVICES) {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|status| panic!("health check of {service:?}: {status}"))
            .into_inner();
        assert_eq!(reply.status(), ServingStatus::Serving, "{service:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn reflection_v1alpha_lists_every_service() {
    let server = TestServer::start_sqlite().await;
    let mut client =
        v1alpha::server_reflection_client::ServerReflectionClient::new(server.channel().await);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut replies = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection stream")
        .into_inner();
    let reply = replies.next().await.expect("one reply").expect("reply ok");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("expected a service list, got {:?}", reply.message_response);
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for expected in SERVICES.iter().copied().chain(["grpc.health.v1.Health"]) {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn reflection_v1_describes_the_contract_with_its_comments() {
    let server = TestServer::start_sqlite().await;
    let mut client =
        v1::server_reflection_client::ServerReflectionClient::new(server.channel().await);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1::server_reflection_request::MessageRequest::FileContainingSymbol(
                "switchyard.v1.AgentService".into(),
            ),
        ),
    };
    let mut replies = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection stream")
        .into_inner();
    let reply = replies.next().await.expect("one reply").expect("reply ok");
    let Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(files)) =
        reply.message_response
    else {
        panic!(
            "expected file descriptors, got {:?}",
            reply.message_response
        );
    };
    let encoded: Vec<u8> = files.file_descriptor_proto.concat();
    // Source comments travel with the descriptor, so `grpcurl describe`
    // shows the documented contract.
    let text = String::from_utf8_lossy(&encoded);
    assert!(
        text.contains("agent_service.proto"),
        "descriptor of the service file"
    );
    assert!(
        text.contains("ONE Connect stream"),
        "the service's flow comment is published"
    );
    server.stop().await;
}
