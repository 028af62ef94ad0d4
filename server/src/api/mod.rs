//! The gRPC service implementations of the switchyard.v1 contract. Each
//! service is a cheap handle over the shared server state; RPCs that later
//! work fills in answer `UNIMPLEMENTED` through the generated default
//! methods.

use std::sync::Arc;

use switchyard_proto::v1::{
    agent_admin_service_server::AgentAdminService, agent_service_server::AgentService,
    task_service_server::TaskService,
};

use crate::store::Store;

/// State shared by every service.
#[derive(Debug, Clone)]
pub struct Api {
    /// The task store; every service reads and writes through it.
    pub store: Arc<dyn Store>,
}

impl Api {
    /// A handle over the given store.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }
}

/// `switchyard.v1.AgentService`: registration and agent sessions.
#[derive(Debug, Clone)]
pub struct AgentApi(pub Api);

/// `switchyard.v1.TaskService`: submit, read, watch, explain and cancel
/// tasks.
#[derive(Debug, Clone)]
pub struct TaskApi(pub Api);

/// `switchyard.v1.AgentAdminService`: see and steer the fleet.
#[derive(Debug, Clone)]
pub struct AdminApi(pub Api);

impl AgentService for AgentApi {}
impl TaskService for TaskApi {}
impl AgentAdminService for AdminApi {}
