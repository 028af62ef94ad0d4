//! `AgentService`: registration and the one `Connect` stream per agent
//! session. `Connect` reads the Hello, opens the session, spawns its reader
//! and returns the stream's outbound half: the bounded queue the dispatcher
//! pushes grants, revocations, acks, resync requests and drains into.
//!
//! # Layout
//! - `register`: `RegisterAgent`.
//! - `hello`: the first message; resuming held leases, counting orphaned
//!   ones lost.
//! - `session`: the session's reader and what it holds.
//! - `heartbeat`: heartbeats and capability diffs.
//! - `reports`: lease reports.
//! - `snapshot`: capability snapshots.
//! - `document`: a reported document's limits, redaction, provenance.

mod document;
mod heartbeat;
mod hello;
mod register;
mod reports;
mod session;
mod snapshot;

use switchyard_proto::v1::{
    self as pb, agent_service_server::AgentService, connect_request::Message as Up,
};
use tokio_stream::StreamExt;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};
use uuid::Uuid;

use self::session::Session;
use super::{AgentApi, Api};
use crate::auth::{Caller, Need};
use crate::error::{Error, Result};
use crate::model::AgentRecord;

impl Api {
    /// An agent the caller may see and steer (operators of its namespace);
    /// agents of other namespaces are NOT_FOUND, like missing ones.
    pub(crate) async fn agent_for(&self, caller: &Caller, id: Uuid) -> Result<AgentRecord> {
        let record = self.store.get_agent(id).await?;
        if !caller.sees(&record.namespace) {
            return Err(Error::NotFound {
                what: "agent",
                id: id.to_string(),
            });
        }
        caller.require(Need::Fleet, &record.namespace)?;
        Ok(record)
    }
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn register_agent(
        &self,
        request: Request<pb::RegisterAgentRequest>,
    ) -> Result<Response<pb::RegisterAgentResponse>, Status> {
        let caller = self.0.caller(&request).await?;
        let registered = self.0.register(&caller, request.into_inner()).await?;
        Ok(Response::new(registered))
    }

    async fn connect(
        &self,
        request: Request<Streaming<pb::ConnectRequest>>,
    ) -> Result<Response<BoxStream<pb::ConnectResponse>>, Status> {
        let api = self.0.clone();
        let caller = api.caller(&request).await?;
        let mut inbound = request.into_inner();
        if api.dispatcher.stopping() {
            return Err(Status::unavailable(
                "server is shutting down; connect to another replica",
            ));
        }
        let hello = read_hello(&mut inbound).await?;
        let opened = api.open_session(&caller, hello).await?;
        let outbound = Session::start(api, opened, inbound)?;
        // Boxed items keep the channel's preallocated slots small: a
        // `ConnectResponse` inline is most of a kilobyte, 32 to a block.
        let stream = tokio_stream::wrappers::ReceiverStream::new(outbound);
        Ok(Response::new(Box::pin(stream.map(|m| Ok(*m)))))
    }
}

/// The first message, which must be Hello (a stream that fails first
/// answers with its own status).
async fn read_hello(inbound: &mut Streaming<pb::ConnectRequest>) -> Result<pb::Hello, Status> {
    let first = inbound
        .next()
        .await
        .ok_or_else(|| Status::invalid_argument("stream closed before hello"))??;
    match first.message {
        Some(Up::Hello(hello)) => Ok(hello),
        _ => Err(Error::invalid(
            "message",
            "the first message on a Connect stream must be hello",
        )
        .into()),
    }
}
