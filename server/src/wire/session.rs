//! What the server sends down an agent's `Connect` stream: grants,
//! revocations, acknowledgements, resync requests, the welcome and drains.
//! The dispatcher and the session's reader both build them here.

use switchyard_proto::v1 as pb;
use switchyard_proto::v1::connect_response::Message as Down;

use super::convert::{duration, timestamp};
use crate::model::{LeaseRecord, RevocationCause, TaskRecord};

/// A message down the stream.
fn down(message: Down) -> pb::ConnectResponse {
    pb::ConnectResponse {
        message: Some(message),
    }
}

/// A grant of `lease` on `task`.
pub fn grant(task: &TaskRecord, lease: &LeaseRecord) -> pb::ConnectResponse {
    down(Down::LeaseGrant(pb::LeaseGrant {
        lease_id: lease.id.to_string(),
        fencing_token: lease.fencing_token,
        task: Some(super::granted_task(task, lease)),
        expires_at: Some(timestamp(lease.expires_at_ms)),
        resources: Some(super::placement::assigned(&lease.claim)),
    }))
}

/// The wire reason of a revocation cause.
pub fn revocation_reason(cause: RevocationCause) -> pb::RevocationReason {
    match cause {
        RevocationCause::Canceled => pb::RevocationReason::Canceled,
        RevocationCause::Expired => pb::RevocationReason::Expired,
        RevocationCause::Superseded => pb::RevocationReason::Superseded,
        RevocationCause::Unacknowledged => pb::RevocationReason::Unacknowledged,
        RevocationCause::UnknownLease => pb::RevocationReason::UnknownLease,
        RevocationCause::Timeout => pb::RevocationReason::Timeout,
        RevocationCause::DrainDeadline => pb::RevocationReason::DrainDeadline,
    }
}

/// A revocation of a lease (by its ids), for `cause`, with details for
/// people.
pub fn revocation(
    lease_id: impl ToString,
    task_id: impl ToString,
    cause: RevocationCause,
    message: &str,
) -> pb::LeaseRevocation {
    pb::LeaseRevocation {
        lease_id: lease_id.to_string(),
        task_id: task_id.to_string(),
        reason: revocation_reason(cause) as i32,
        message: message.to_owned(),
    }
}

/// [`revocation`] as a stream message.
pub fn revoke(
    lease_id: impl ToString,
    task_id: impl ToString,
    cause: RevocationCause,
    message: &str,
) -> pb::ConnectResponse {
    down(Down::LeaseRevocation(revocation(
        lease_id, task_id, cause, message,
    )))
}

/// The acknowledgement of message `sequence`: a gRPC status `code` (with
/// details when not OK) and the capability generation the server holds.
pub fn ack(
    sequence: u64,
    code: tonic::Code,
    message: &str,
    generation: u64,
) -> pb::ConnectResponse {
    down(Down::Ack(pb::Ack {
        sequence,
        code: code as i32,
        message: message.to_owned(),
        capability_generation: generation,
        leases_expire_at: None,
        lease_expiries: Vec::new(),
    }))
}

/// A request for the full document: the diff was not applied.
pub fn resync(server_generation: u64, reason: String) -> pb::ConnectResponse {
    down(Down::ResyncRequest(pb::ResyncRequest {
        server_generation,
        reason,
    }))
}

/// The first answer on a stream.
pub fn welcome(
    generation: u64,
    resumed_lease_ids: Vec<String>,
    revoked: Vec<pb::LeaseRevocation>,
    heartbeat_interval_ms: i64,
) -> pb::ConnectResponse {
    down(Down::Welcome(pb::Welcome {
        capability_generation: generation,
        resumed_lease_ids,
        revoked,
        heartbeat_interval: Some(duration(heartbeat_interval_ms)),
    }))
}

/// Tells the agent to close this session and reconnect (anywhere) after
/// `reconnect_after_ms`.
pub fn drain(reason: &str, reconnect_after_ms: i64) -> pb::ConnectResponse {
    down(Down::Drain(pb::Drain {
        reason: reason.to_owned(),
        reconnect_after: Some(duration(reconnect_after_ms)),
    }))
}
