//! A capability snapshot: the agent's full document, in answer to a
//! resync request. It replaces the stored document under the generation
//! compare-and-set, the session starts over from what is stored, and the
//! index follows the committed document.

use std::sync::Arc;

use switchyard_core::tier::with_operator_tier;
use switchyard_proto::v1 as pb;
use tonic::Code;

use super::document;
use super::session::Session;
use crate::error::Result;
use crate::store::ReportedDocument;
use crate::wire::session::ack;

impl Session {
    /// Stores a snapshot; its acknowledgement carries the new generation.
    pub(super) async fn snapshot(
        &mut self,
        sequence: u64,
        s: pb::CapabilitySnapshot,
        now: i64,
    ) -> Result<pb::ConnectResponse> {
        let doc = s.capabilities.unwrap_or_default();
        let field = "capability_snapshot.capabilities";
        let (reported, server_rejections) = match document::accept(&self.api, field, &doc) {
            Ok(x) => x,
            Err(err) => {
                let status = tonic::Status::from(&err);
                return Ok(ack(
                    sequence,
                    Code::InvalidArgument,
                    status.message(),
                    self.generation,
                ));
            }
        };
        let record = self.api.store.get_agent(self.agent_id).await?;
        let provenance = document::provenance(&s.provenance);
        let (merged, effective_provenance) =
            with_operator_tier(&reported, &provenance, &record.operator_overrides);
        let write = ReportedDocument {
            reported,
            document: merged,
            provenance: effective_provenance,
            rejections: document::rejections(&s.rejections, server_rejections),
        };
        let generation = self
            .api
            .store
            .update_agent_document(self.agent_id, record.generation, &write, now)
            .await?;
        let record = self.api.store.get_agent(self.agent_id).await?;
        self.load(&record);
        self.generation = generation;
        if let Some(mut view) = self.api.dispatcher.view(self.agent_id) {
            view.document = Arc::new(record.document);
            self.api.dispatcher.update_view(view);
        }
        Ok(ack(sequence, Code::Ok, "", generation))
    }
}
