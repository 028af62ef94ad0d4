//! Builds the gRPC router and serves it: the three switchyard.v1 services,
//! the standard health service (so load balancers and Kubernetes probes can
//! ask), and server reflection in both v1 and v1alpha (grpcurl 1.8 speaks
//! only v1alpha).

use std::future::Future;

use switchyard_proto::v1::{
    agent_admin_service_server::AgentAdminServiceServer, agent_service_server::AgentServiceServer,
    task_service_server::TaskServiceServer,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tracing::info;

use crate::api::{AdminApi, AgentApi, Api, TaskApi};
use crate::config::ServerConfig;
use crate::error::Result;
use crate::store;

/// Opens the store named by `config`, runs its migrations, and serves gRPC
/// on `listener` until `shutdown` completes.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let store = store::open(&config.database_url).await?;
    store.migrate().await?;
    info!(backend = store.backend(), "store ready");
    let api = Api::new(store.clone());

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<AgentServiceServer<AgentApi>>().await;
    health.set_serving::<TaskServiceServer<TaskApi>>().await;
    health
        .set_serving::<AgentAdminServiceServer<AdminApi>>()
        .await;

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(switchyard_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };

    Server::builder()
        .add_service(health_service)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(AgentServiceServer::new(AgentApi(api.clone())))
        .add_service(TaskServiceServer::new(TaskApi(api.clone())))
        .add_service(AgentAdminServiceServer::new(AdminApi(api)))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await?;

    store.close().await;
    info!("server stopped");
    Ok(())
}
