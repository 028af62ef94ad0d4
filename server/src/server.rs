//! Builds the gRPC router and serves it: the three switchyard.v1 services,
//! the standard health service (so load balancers and Kubernetes probes can
//! ask), and server reflection in both v1 and v1alpha (grpcurl 1.8 speaks
//! only v1alpha). Also starts the dispatcher, and on shutdown drains the
//! connected agents before the listener closes.

use std::future::Future;

use switchyard_proto::v1::{
    agent_admin_service_server::AgentAdminServiceServer, agent_service_server::AgentServiceServer,
    task_service_server::TaskServiceServer,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tracing::info;

use crate::api::{AdminApi, AgentApi, Api, ApiSettings, TaskApi};
use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::dispatch::{DispatchSettings, Dispatcher};
use crate::error::Result;
use crate::store;

/// Opens the store named by `config`, runs its migrations, and serves gRPC
/// on `listener` until `shutdown` completes.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    run_with_clock(listener, config, Clock::system(), shutdown).await
}

/// [`run`] with an injected clock (tests move time by hand).
pub async fn run_with_clock(
    listener: TcpListener,
    config: ServerConfig,
    clock: Clock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let store = store::open(&config.database_url).await?;
    store.migrate().await?;
    info!(backend = store.backend(), "store ready");
    let dispatcher = Dispatcher::new(
        store.clone(),
        clock,
        DispatchSettings {
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            ack_window_ms: config.ack_window_ms,
            sweep_interval_ms: config.sweep_interval_ms,
            ..DispatchSettings::default()
        },
    );
    let workers = dispatcher.spawn();
    let api = Api::new(
        store.clone(),
        dispatcher.clone(),
        ApiSettings {
            default_max_attempts: config.max_attempts,
            default_lease_ttl_ms: config.lease_ttl_ms,
            ..ApiSettings::default()
        },
    );

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

    let draining = dispatcher.clone();
    let shutdown = async move {
        shutdown.await;
        // Stop granting and send every agent elsewhere before the listener
        // closes; in-flight RPCs then finish.
        draining.drain_all("server shutting down");
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

    for worker in workers {
        worker.abort();
    }
    store.close().await;
    info!("server stopped");
    Ok(())
}
