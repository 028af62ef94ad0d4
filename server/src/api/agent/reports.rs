//! Lease reports: `accepted`, `started`, progress, output and the final
//! report of each lease, validated (INVALID_ARGUMENT naming the field;
//! output cut to its bounds and scrubbed of secrets), applied in one
//! group commit with other sessions' reports, and each acknowledged; an
//! applied report acknowledges its lease's grant to the dispatcher's
//! congestion control. A
//! release that refuses the task (the agent cannot handle or decode it) is
//! noted by the dispatcher, which offers the task to that agent no more. A slot
//! a final report freed is handed back to the dispatcher only after its
//! acknowledgement is queued: the agent counts the lease as held until it
//! hears the answer, and must not see a grant for the slot first. A final
//! report is never refused for its size (the lease would stay held): its
//! message is cut and over-large details are dropped with a note.

use serde_json::{Value, json};
use switchyard_core::secrets;
use switchyard_proto::v1 as pb;
use tracing::warn;

use super::session::Session;
use crate::api::convert::struct_to_json;
use crate::api::{bounds, invalid, parse_id};
use crate::error::Result;
use crate::model::output::{MAX_CHUNK_BYTES, MAX_CHUNKS_PER_REPORT};
use crate::model::{CompletionOutcome, LeaseReport, OutputChunk, ReleaseCause, ReportKind};
use crate::wire::output::stored_stream;

impl Session {
    /// Applies lease reports and acknowledges each.
    pub(super) async fn flush_reports(&mut self, reports: Vec<(u64, LeaseReport)>) {
        if reports.is_empty() {
            return;
        }
        let (sequences, reports): (Vec<u64>, Vec<LeaseReport>) = reports.into_iter().unzip();
        let refusals: Vec<Option<uuid::Uuid>> = reports.iter().map(refused_task).collect();
        let leases: Vec<(uuid::Uuid, uuid::Uuid)> =
            reports.iter().map(|r| (r.task_id, r.lease_id)).collect();
        match self.api.dispatcher.report(reports).await {
            Ok(results) => {
                let mut ended = Vec::new();
                let mut acknowledged = Vec::with_capacity(leases.len());
                for (((sequence, result), refused), (task_id, lease_id)) in
                    sequences.into_iter().zip(results).zip(refusals).zip(leases)
                {
                    let reply = match result {
                        Ok(applied) => {
                            acknowledged.push((task_id, lease_id));
                            if applied.ended {
                                ended.push(task_id);
                            }
                            if let (true, Some(task_id)) = (applied.ended, refused) {
                                self.api.dispatcher.note_refusal(task_id, self.agent_id);
                            }
                            self.ok(sequence)
                        }
                        Err(err) => self.refuse(sequence, &err),
                    };
                    self.send(reply);
                }
                self.api
                    .dispatcher
                    .acknowledged(self.agent_id, &acknowledged);
                for task_id in ended {
                    self.api
                        .dispatcher
                        .lease_ended(self.agent_id, Some(task_id));
                }
            }
            Err(err) => {
                warn!(cause = %err, "lease reports failed");
                for sequence in sequences {
                    self.send(self.refuse(sequence, &err));
                }
            }
        }
    }

    /// A lease update as a store report, validated.
    pub(super) fn to_report(&self, u: pb::LeaseUpdate) -> Result<LeaseReport> {
        use pb::lease_update::Update;
        let lease_id = parse_id("lease_update.lease_id", &u.lease_id)?;
        let task_id = parse_id("lease_update.task_id", &u.task_id)?;
        let kind = match u.update {
            None => return Err(invalid("lease_update.update", "empty")),
            Some(Update::Accepted(_)) => ReportKind::Accepted,
            Some(Update::Started(_)) => ReportKind::Started,
            Some(Update::Progress(p)) => {
                if !(p.percent.is_finite() && p.percent <= 100.0) {
                    return Err(invalid(
                        "lease_update.progress.percent",
                        "must be from 0 to 100, or negative for unknown",
                    ));
                }
                let message = bounds::cut(&p.message, bounds::MAX_REASON_BYTES);
                ReportKind::Progress(
                    json!({"percent": p.percent, "message": message, "reported_at_ms": self.api.now_ms()}),
                )
            }
            Some(Update::Succeeded(s)) => self.succeeded(s)?,
            Some(Update::Failed(f)) => {
                let e = f.error.unwrap_or_default();
                let details =
                    match &e.details {
                        Some(d) => bounds::details(struct_to_json(d).map_err(|err| {
                            invalid("lease_update.failed.error.details", err.reason)
                        })?),
                        None => Value::Null,
                    };
                let message = bounds::cut(&e.message, bounds::MAX_MESSAGE_BYTES);
                let code = bounds::cut(&e.code, bounds::MAX_LABEL_KEY_BYTES);
                let error = json!({"message": message, "code": code, "retryable": e.retryable, "details": details});
                ReportKind::Final(CompletionOutcome::Failed {
                    error,
                    retryable: e.retryable,
                })
            }
            Some(Update::Output(o)) => ReportKind::Output(output(o)?),
            Some(Update::Released(r)) => ReportKind::Final(CompletionOutcome::Released {
                cause: release_cause(r.cause),
                reason: bounds::cut(&r.reason, bounds::MAX_REASON_BYTES),
            }),
        };
        Ok(LeaseReport {
            lease_id,
            task_id,
            agent_id: self.agent_id,
            fencing_token: u.fencing_token,
            kind,
        })
    }

    /// A success, its result within the document limits.
    fn succeeded(&self, s: pb::LeaseSucceeded) -> Result<ReportKind> {
        const FIELD: &str = "lease_update.succeeded.result";
        let result = match &s.result {
            Some(r) => {
                struct_to_json(r).map_err(|e| invalid(&format!("{FIELD}.{}", e.path), e.reason))?
            }
            None => json!({}),
        };
        if let Some(v) = self
            .api
            .settings
            .document_limits
            .violations(&result)
            .first()
        {
            return Err(invalid(&format!("{FIELD}.{}", v.path), &v.reason));
        }
        Ok(ReportKind::Final(CompletionOutcome::Succeeded { result }))
    }
}

/// An output report's chunks, checked (INVALID_ARGUMENT naming the field
/// that is wrong), each text cut to its last [`MAX_CHUNK_BYTES`] (what is
/// cut counted as dropped before it) and scrubbed of secrets.
fn output(report: pb::TaskOutput) -> Result<Vec<OutputChunk>> {
    const FIELD: &str = "lease_update.output.chunks";
    if report.chunks.is_empty() {
        return Err(invalid(FIELD, "empty"));
    }
    if report.chunks.len() > MAX_CHUNKS_PER_REPORT {
        return Err(invalid(
            FIELD,
            &format!("at most {MAX_CHUNKS_PER_REPORT} chunks per report"),
        ));
    }
    let mut last = 0;
    let mut chunks = Vec::with_capacity(report.chunks.len());
    for (i, chunk) in report.chunks.into_iter().enumerate() {
        let stream = pb::OutputStream::try_from(chunk.stream)
            .ok()
            .and_then(stored_stream)
            .ok_or_else(|| {
                invalid(
                    &format!("{FIELD}[{i}].stream"),
                    "must be stdout, stderr or log",
                )
            })?;
        if chunk.sequence <= last {
            return Err(invalid(
                &format!("{FIELD}[{i}].sequence"),
                "must be above 0 and above the chunk before it",
            ));
        }
        last = chunk.sequence;
        let (text, cut) = last_bytes(chunk.text, MAX_CHUNK_BYTES);
        chunks.push(OutputChunk {
            stream,
            sequence: chunk.sequence,
            text: secrets::redact_text(&text),
            dropped_bytes: chunk.dropped_bytes.saturating_add(cut),
        });
    }
    Ok(chunks)
}

/// The last `max` bytes of `text` (from a character boundary), and how many
/// bytes went.
fn last_bytes(text: String, max: usize) -> (String, u64) {
    if text.len() <= max {
        return (text, 0);
    }
    let mut from = text.len() - max;
    while !text.is_char_boundary(from) {
        from += 1;
    }
    (text[from..].to_owned(), from as u64)
}

/// A release's cause; unset or unknown (a newer agent) is OTHER.
fn release_cause(cause: i32) -> ReleaseCause {
    match pb::ReleaseCause::try_from(cause) {
        Ok(pb::ReleaseCause::Draining) => ReleaseCause::Draining,
        Ok(pb::ReleaseCause::RevocationAcknowledged) => ReleaseCause::RevocationAcknowledged,
        Ok(pb::ReleaseCause::CannotHandle) => ReleaseCause::CannotHandle,
        Ok(pb::ReleaseCause::CannotDecode) => ReleaseCause::CannotDecode,
        Ok(pb::ReleaseCause::Busy) => ReleaseCause::Busy,
        Ok(pb::ReleaseCause::Other | pb::ReleaseCause::Unspecified) | Err(_) => ReleaseCause::Other,
    }
}

/// The task a report refuses (a release saying the agent cannot handle or
/// decode it), if it is one.
fn refused_task(report: &LeaseReport) -> Option<uuid::Uuid> {
    match &report.kind {
        ReportKind::Final(CompletionOutcome::Released { cause, .. }) if cause.refuses() => {
            Some(report.task_id)
        }
        _ => None,
    }
}
