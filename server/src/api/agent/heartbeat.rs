//! Heartbeats: the agent's status, and a capability diff against the
//! generation the server holds. The diff is applied to the document the
//! session holds; the renewal, status and document are written in one
//! group commit with other sessions' heartbeats (no store read on the way;
//! a heartbeat with nothing to write skips the store). A heartbeat also
//! carries the task kinds the agent handles when they change; they reach
//! the index once written, and lift the agent's refusals. The matcher's
//! index follows the committed document: a diff that changes only volatile
//! facts (free memory, load) reaches the index at once and the store at
//! most [`PERSIST_VOLATILE_MS`] later, or later beside a fleet too large
//! for that ([`VOLATILE_WRITES_PER_SEC`]). One that only replaces numbers
//! there, the common heartbeat, is set in place in the document the session
//! shares with the index: no copy, no walk of the whole document, no
//! posting moved (the index never posts volatile values). Any other
//! diff reaches the index once its write committed, and a write that lost
//! its compare-and-set (an operator changed the document meanwhile) puts
//! the stored document back in the index and asks the agent to resync.
//!
//! The ack says what became of the heartbeat: FAILED_PRECONDITION,
//! `capability diff not applied: <why>`, when its diff was not (the rest
//! was, and a ResyncRequest follows), else OK; and each lease it renewed
//! with the expiry the store wrote (the renewal plus the task's own TTL),
//! the earliest of them in `leases_expire_at`, nothing when it renewed none.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use json_patch::jsonptr::Pointer;
use serde_json::Value;
use switchyard_core::kinds::HandledKinds;
use switchyard_core::limits::serialized_len;
use switchyard_core::tier::with_operator_tier;
use switchyard_core::{diff, redact};
use switchyard_proto::v1 as pb;
use tonic::Code;
use tracing::warn;

use super::register::handled_kinds;
use super::session::{AppliedDiff, Session};
use crate::api::convert::{timestamp, value_to_json};
use crate::error::{Error, Result};
use crate::model::{AgentStatus, Beat, BeatApplied, DocumentWrite};
use crate::wire::session::{ack, resync};

/// How stale the stored copy of volatile facts may get: a heartbeat writes
/// the document when its last write is older than this, or than
/// [`persist_volatile_every_ms`] allows beside a large fleet.
const PERSIST_VOLATILE_MS: i64 = 60_000;

/// The documents a replica writes behind a second for volatile facts alone,
/// at most: past 6,000 sessions each one's interval stretches with their
/// number (30,000 sessions: every 300 s), since each write is a whole
/// document and the store's writes slow everyone's commits.
const VOLATILE_WRITES_PER_SEC: i64 = 100;

/// How often a session writes volatile facts behind when `sessions` are
/// attached to the replica.
fn persist_volatile_every_ms(sessions: usize) -> i64 {
    let sessions = i64::try_from(sessions).unwrap_or(i64::MAX);
    PERSIST_VOLATILE_MS.max(sessions.saturating_mul(1_000) / VOLATILE_WRITES_PER_SEC)
}

/// How often a session refreshes the agent's stored last-seen time.
const TOUCH_EVERY_MS: i64 = 30_000;

/// What the ack of a heartbeat whose diff was not applied says: the diff's
/// fate and why, and that the rest of the heartbeat was applied.
fn not_applied(reason: &str) -> String {
    format!(
        "capability diff not applied: {reason}; the rest of the heartbeat was applied; \
         a ResyncRequest asks for the full document"
    )
}

/// The status a heartbeat reports, or why it cannot be one.
fn reported_status(status: i32) -> Result<AgentStatus> {
    match pb::AgentStatus::try_from(status) {
        Ok(pb::AgentStatus::Degraded) => Ok(AgentStatus::Degraded),
        Ok(pb::AgentStatus::Draining) => Ok(AgentStatus::Draining),
        Ok(pb::AgentStatus::Ready | pb::AgentStatus::Unspecified) => Ok(AgentStatus::Ready),
        Ok(pb::AgentStatus::Offline) | Err(_) => Err(Error::invalid(
            "heartbeat.status",
            "must be READY, DEGRADED or DRAINING",
        )),
    }
}

impl Session {
    /// A heartbeat (see the module doc); its acknowledgement.
    pub(super) async fn heartbeat(
        &mut self,
        sequence: u64,
        hb: pb::Heartbeat,
        now: i64,
    ) -> Result<pb::ConnectResponse> {
        let status = match reported_status(hb.status) {
            Ok(status) => status,
            Err(err) => return Ok(self.refuse(sequence, &err)),
        };
        if self.changed.swap(false, Ordering::SeqCst) {
            // An operator changed the stored agent: start from what is
            // stored (a diff based on the old generation then resyncs).
            let record = self.api.store.get_agent(self.agent_id).await?;
            self.load(&record);
        }
        let reasons: Vec<String> = hb
            .status_reasons
            .iter()
            .take(crate::api::bounds::MAX_REASONS)
            .map(|r| crate::api::bounds::cut(r, crate::api::bounds::MAX_REASON_BYTES))
            .collect();
        let status_change =
            (self.status != status || self.status_reasons != reasons).then_some((status, reasons));
        if let Some(announced) = &hb.handled_kinds {
            match handled_kinds("heartbeat.handled_kinds.kinds", &announced.kinds) {
                Ok(kinds) if kinds != self.kinds => self.pending_kinds = Some(kinds),
                Ok(_) => self.pending_kinds = None,
                Err(err) => return Ok(self.refuse(sequence, &err)),
            }
        }
        let mut resync_from = None;
        if let Some(d) = hb.capability_diff
            && !self.set_volatile_numbers(&d)
        {
            match self.apply_diff(d) {
                Ok(applied) => self.index_or_hold(applied),
                Err(reason) => resync_from = Some(reason),
            }
        }
        let beat = self.beat(status_change.clone(), now);
        let (touched, lifted) = (beat.touch, beat.lift_refusals);
        let outcome = match self.api.dispatcher.heartbeat(beat).await {
            Ok(outcome) => outcome,
            // The batch failed (the store): the agent hears why, and the
            // change waits for the next heartbeat's write.
            Err(err) => return Ok(self.refuse(sequence, &err)),
        };
        if touched {
            self.touched_at_ms = now;
        }
        self.held_leases_at_connect = false;
        if let Some(stale) = self.written(outcome.applied, now).await? {
            resync_from = Some(stale);
        }
        if let Some(kinds) = self.pending_kinds.take() {
            self.kinds_changed(kinds);
        }
        if lifted {
            self.api.dispatcher.lift_refusals(self.agent_id);
        }
        if let Some((status, reasons)) = status_change {
            self.status_changed(status, reasons).await?;
        }
        let mut reply = match resync_from {
            Some((reason, generation)) => {
                let told = not_applied(&reason);
                self.send(resync(generation, reason));
                ack(sequence, Code::FailedPrecondition, &told, self.generation)
            }
            None => self.ok(sequence),
        };
        if let Some(pb::connect_response::Message::Ack(a)) = &mut reply.message {
            a.leases_expire_at = outcome
                .renewed
                .iter()
                .map(|l| l.expires_at_ms)
                .min()
                .map(timestamp);
            a.lease_expiries = outcome
                .renewed
                .iter()
                .map(|l| pb::LeaseExpiry {
                    lease_id: l.lease_id.to_string(),
                    task_id: l.task_id.to_string(),
                    expires_at: Some(timestamp(l.expires_at_ms)),
                })
                .collect();
        }
        Ok(reply)
    }

    /// The writes of this heartbeat. The document is written when it moved
    /// past the stored generation and the change is more than volatile (or
    /// volatile facts were last written long enough ago). New kinds are
    /// written, and they or a change that is more than volatile lift the
    /// agent's refusals (the tasks it said it cannot run). Leases are renewed
    /// while the agent holds any (by this replica's count, reservations
    /// included); the stored last-seen time is refreshed now and then:
    /// liveness is judged in memory.
    fn beat(&self, status: Option<(AgentStatus, Vec<String>)>, now: i64) -> Beat {
        let durable = status.is_some() || self.unindexed.is_some();
        let every = persist_volatile_every_ms(self.api.dispatcher.connected_sessions());
        let due = now - self.persisted_at_ms >= every;
        let document =
            (self.generation != self.persisted && (durable || due)).then(|| self.document_write());
        let renew = self
            .api
            .dispatcher
            .view(self.agent_id)
            .is_none_or(|v| v.active_leases > 0)
            || self.held_leases_at_connect;
        let touch = now - self.touched_at_ms >= TOUCH_EVERY_MS;
        let kinds = self.pending_kinds.clone();
        Beat {
            agent_id: self.agent_id,
            session_epoch: self.epoch,
            renew,
            touch,
            status,
            lift_refusals: kinds.is_some() || (self.unindexed.is_some() && document.is_some()),
            document,
            kinds,
        }
    }

    /// A volatile diff reaches the index at once, unless a diff before it
    /// still waits for its write; any other diff waits for its own.
    fn index_or_hold(&mut self, applied: AppliedDiff) {
        if applied.volatile && self.unindexed.is_none() {
            self.index(applied);
        } else {
            self.unindexed = Some(applied);
        }
    }

    /// Puts an applied diff's document in the dispatcher's index.
    fn index(&self, applied: AppliedDiff) {
        let touched = applied
            .touched
            .as_ref()
            .map(|(from, at)| (from, at.as_slice()));
        self.api
            .dispatcher
            .replace_document(self.agent_id, applied.document, touched);
    }

    /// What the heartbeat's write did: the document it committed goes to
    /// the index; a write that lost its compare-and-set puts the stored
    /// document there instead, and is the reason to resync (with the
    /// generation held).
    async fn written(&mut self, applied: BeatApplied, now: i64) -> Result<Option<(String, u64)>> {
        match applied {
            BeatApplied::Written(generation) => {
                self.persisted = generation;
                self.persisted_at_ms = now;
                if let Some(held) = self.unindexed.take() {
                    self.index(held);
                }
                Ok(None)
            }
            BeatApplied::Stale(held) => {
                let record = self.api.store.get_agent(self.agent_id).await?;
                self.load(&record);
                let document = Arc::new(record.document);
                self.api
                    .dispatcher
                    .replace_document(self.agent_id, document, None);
                Ok(Some((
                    format!("document changed concurrently (generation {held})"),
                    held,
                )))
            }
            BeatApplied::Renewed => {
                if let Some(held) = self.unindexed.take() {
                    self.index(held);
                }
                Ok(None)
            }
        }
    }

    /// New kinds were written: the session and the index hold them.
    fn kinds_changed(&mut self, kinds: Vec<String>) {
        let parsed = HandledKinds::parse(&kinds).unwrap_or_default();
        self.kinds = kinds;
        self.api
            .dispatcher
            .set_kinds(self.agent_id, Arc::new(parsed));
    }

    /// A status change was written: the index follows the stored status (an
    /// operator drain keeps it DRAINING), re-read since changes are rare.
    async fn status_changed(&mut self, status: AgentStatus, reasons: Vec<String>) -> Result<()> {
        self.status = status;
        self.status_reasons = reasons;
        if let Some(mut view) = self.api.dispatcher.view(self.agent_id) {
            let record = self.api.store.get_agent(self.agent_id).await?;
            view.status = record.effective_status();
            self.api.dispatcher.update_view(view);
        }
        Ok(())
    }

    /// The common heartbeat, cheaply: a diff against the generation held
    /// whose every operation replaces a number at a volatile path
    /// ([`diff::VOLATILE`]) with a number, on a document no operator tier is
    /// merged over, while no diff waits for its write. The numbers are set
    /// in place, in the document the session shares with the index
    /// ([`Dispatcher::set_leaves`]): no copy of the document, no walk for its
    /// limits (numbers change neither its shape nor, beyond the bytes
    /// counted here, its size), no redaction (a number in the document is at
    /// no sensitive path, where redaction leaves a string) and no posting
    /// of the index moved. The result is what [`Session::apply_diff`] gives.
    /// False, with nothing changed, for any other diff: it then goes that
    /// general way, which also explains any refusal.
    ///
    /// [`Dispatcher::set_leaves`]: crate::dispatch::Dispatcher::set_leaves
    fn set_volatile_numbers(&mut self, d: &pb::CapabilityDiff) -> bool {
        let limits = &self.api.settings.document_limits;
        let plain = self
            .operator_overrides
            .as_object()
            .is_none_or(serde_json::Map::is_empty);
        if d.base_generation != self.generation
            || self.unindexed.is_some()
            || !plain
            || d.operations.is_empty()
            || d.operations.len() > limits.max_array_items
        {
            return false;
        }
        let mut leaves = Vec::with_capacity(d.operations.len());
        let (mut bytes, mut patch_bytes) = (self.reported_bytes, 2);
        for op in &d.operations {
            let Some((keys, value, old_bytes)) = volatile_number(&self.reported, op) else {
                return false;
            };
            bytes = (bytes + serialized_len(&value)).saturating_sub(old_bytes);
            // An operation as JSON, generously: its path, a number and the
            // punctuation around them.
            patch_bytes += op.path.len() + 64;
            leaves.push((keys, value));
        }
        if bytes > limits.max_serialized_bytes || patch_bytes > limits.max_serialized_bytes {
            return false;
        }
        if !self
            .api
            .dispatcher
            .set_leaves(self.agent_id, &mut self.reported, &leaves)
        {
            return false;
        }
        self.reported_bytes = bytes;
        self.generation += 1;
        true
    }

    /// Applies a diff to the document the session holds (a new generation)
    /// and returns the merged document for the matcher and whether the
    /// diff touched only volatile facts; or why it does not apply (and the
    /// generation to resync from).
    fn apply_diff(&mut self, d: pb::CapabilityDiff) -> Result<AppliedDiff, (String, u64)> {
        let patch = crate::api::convert::patch_from_proto(&d.operations)
            .map_err(|reason| (reason, self.generation))?;
        let limits = &self.api.settings.document_limits;
        let mut next = diff::apply(
            &self.reported,
            self.generation,
            d.base_generation,
            &patch,
            limits,
        )
        .map_err(|err| (err.to_string(), self.generation))?;
        let touched = diff::touched(&patch);
        let declared = redact::declared_sensitive(&next);
        // What the patch did not touch was redacted when it arrived; the
        // `sensitive` declaration changing means everything is looked at.
        let declaration_touched = touched.iter().any(|p| {
            p.first()
                .is_none_or(|t| t.decoded().as_ref() == "sensitive")
        });
        let redacted = if declaration_touched {
            redact::redact(&mut next, &declared)
        } else {
            redact::redact_at(&mut next, touched.iter().copied(), &declared)
        };
        if !redacted.is_empty() {
            warn!(paths = ?redacted, "sensitive values in a capability diff were redacted");
        }
        let volatile = touched
            .iter()
            .all(|p| diff::volatile_only(&self.reported, &next, p));
        let no_overrides = self
            .operator_overrides
            .as_object()
            .is_none_or(serde_json::Map::is_empty);
        let next = Arc::new(next);
        let applied = if volatile && no_overrides {
            // The common heartbeat: leaves replaced in place, provenance
            // unchanged, nothing to merge over them: the index shares the
            // session's document and re-indexes only what was touched.
            let at = touched.iter().map(|p| p.to_buf()).collect();
            AppliedDiff {
                document: next.clone(),
                volatile,
                touched: Some((self.reported.clone(), at)),
            }
        } else {
            let (document, provenance) =
                with_operator_tier(&next, &self.provenance, &self.operator_overrides);
            self.provenance = provenance;
            AppliedDiff {
                document: Arc::new(document),
                volatile,
                touched: None,
            }
        };
        self.reported_bytes = serialized_len(&next);
        self.reported = next;
        self.generation += 1;
        Ok(applied)
    }

    /// The document the session holds, to write at its generation.
    fn document_write(&self) -> DocumentWrite {
        let (document, provenance) =
            with_operator_tier(&self.reported, &self.provenance, &self.operator_overrides);
        DocumentWrite {
            expected_generation: self.persisted,
            generation: self.generation,
            reported: (*self.reported).clone(),
            document,
            provenance,
        }
    }
}

/// What `op` does if it replaces a number at a volatile path with a number
/// (see `Session::set_volatile_numbers`): the path's object keys from the
/// top, the new number, and the old one's size as JSON text.
fn volatile_number(held: &Value, op: &pb::PatchOperation) -> Option<(Vec<String>, Value, usize)> {
    if pb::PatchOp::try_from(op.op) != Ok(pb::PatchOp::Replace) {
        return None;
    }
    let pointer = Pointer::parse(&op.path).ok()?;
    if !diff::is_volatile(pointer) {
        return None;
    }
    let value = value_to_json(op.value.as_ref()?, "value").ok()?;
    let keys: Vec<String> = pointer.tokens().map(|t| t.decoded().into_owned()).collect();
    let old = keys
        .iter()
        .try_fold(held, |node, key| node.as_object()?.get(key))?;
    (value.is_number() && old.is_number()).then(|| (keys, value, serialized_len(old)))
}

#[cfg(test)]
mod tests {
    use super::persist_volatile_every_ms;

    #[test]
    fn volatile_writes_stretch_past_six_thousand_sessions() {
        assert_eq!(persist_volatile_every_ms(0), 60_000);
        assert_eq!(persist_volatile_every_ms(6_000), 60_000);
        assert_eq!(persist_volatile_every_ms(10_000), 100_000);
        assert_eq!(persist_volatile_every_ms(30_000), 300_000);
        assert_eq!(persist_volatile_every_ms(usize::MAX), i64::MAX / 100);
    }
}
