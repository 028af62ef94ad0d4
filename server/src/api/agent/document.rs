//! A capability document as it arrives (at registration and in a
//! snapshot): held to the document limits (INVALID_ARGUMENT naming the
//! field), redacted again on receipt (anything sensitive-looking becomes a
//! rejection, never stored), and its provenance and rejections turned into
//! the JSON the store keeps.

use serde_json::{Value, json};
use switchyard_core::redact;
use switchyard_core::tier::Tier;
use switchyard_proto::v1 as pb;

use crate::api::convert::struct_to_json;
use crate::api::{Api, field_path, invalid};
use crate::error::Result;
use crate::wire;

/// The document in `doc` (the request's `field`), within the limits and
/// redacted, and the server's rejections of what it redacted.
pub(super) fn accept(
    api: &Api,
    field: &str,
    doc: &prost_types::Struct,
) -> Result<(Value, Vec<Value>)> {
    let mut value =
        struct_to_json(doc).map_err(|e| invalid(&format!("{field}.{}", e.path), e.reason))?;
    if let Some(v) = api.settings.document_limits.violations(&value).first() {
        return Err(invalid(&field_path(field, &v.path), &v.reason));
    }
    // The agent's own `sensitive` list (from its static tier) counts too.
    let declared = redact::declared_sensitive(&value);
    let redacted = redact::redact(&mut value, &declared);
    let rejections = redacted
        .into_iter()
        .map(|path| json!({"tier": "", "path": path, "reason": "sensitive value redacted by the server"}))
        .collect();
    Ok((value, rejections))
}

/// The provenance entries as the store keeps them: path to tier name.
pub(super) fn provenance(entries: &[pb::ProvenanceEntry]) -> Value {
    Value::Object(
        entries
            .iter()
            .filter_map(|e| {
                let tier = wire::core_tier(pb::Tier::try_from(e.tier).ok()?)?;
                Some((e.path.clone(), Value::String(tier.as_str().to_owned())))
            })
            .collect(),
    )
}

/// The agent's rejections and the server's `extra` ones, as the store
/// keeps them.
pub(super) fn rejections(rejections: &[pb::Rejection], mut extra: Vec<Value>) -> Value {
    let mut all: Vec<Value> = rejections
        .iter()
        .take(crate::api::bounds::MAX_REASONS)
        .map(|r| {
            let tier = pb::Tier::try_from(r.tier)
                .ok()
                .and_then(wire::core_tier)
                .map(Tier::as_str)
                .unwrap_or("");
            let cut = |s: &str| crate::api::bounds::cut(s, crate::api::bounds::MAX_REASON_BYTES);
            json!({"tier": tier, "path": cut(&r.path), "reason": cut(&r.reason)})
        })
        .collect();
    all.append(&mut extra);
    Value::Array(all)
}

/// The server's rejections on the wire.
pub(super) fn wire_rejections(rejections: &[Value]) -> Vec<pb::Rejection> {
    rejections
        .iter()
        .map(|r| pb::Rejection {
            tier: pb::Tier::Unspecified as i32,
            path: r["path"].as_str().unwrap_or_default().to_owned(),
            reason: r["reason"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}
