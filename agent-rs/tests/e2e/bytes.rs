//! What a heartbeat costs on the wire for this machine's real document: a
//! heartbeat carrying the JSON-Patch diff of a memory and load change versus
//! the full document (what a snapshot, or a protocol without diffs, sends).
//! Prints both sizes (`cargo test -p switchyard-agent --test e2e bytes -- --nocapture`).

use prost::Message;
use serde_json::json;
use switchyard_agent::Handlers;
use switchyard_agent::capabilities::Capabilities;
use switchyard_proto::convert::{json_to_struct, patch_to_proto};
use switchyard_proto::v1 as pb;

#[tokio::test]
async fn a_load_change_heartbeat_is_a_small_fraction_of_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let caps = Capabilities::load(
        dir.path(),
        &Handlers::new(),
        std::time::Duration::from_secs(10),
    )
    .await;
    let before = caps.document().clone();
    let mut after = before.clone();
    after["memory"]["free"] = json!(before["memory"]["free"].as_u64().unwrap_or(1000) + 137);
    after["memory"]["available"] =
        json!(before["memory"]["available"].as_u64().unwrap_or(2000) + 211);
    after["loadavg"] = json!({"1min": 1.23, "5min": 0.98, "15min": 0.77});
    let patch = switchyard_core::diff::diff(&before, &after);
    let heartbeat = pb::ConnectRequest {
        sequence: 1234,
        message: Some(pb::connect_request::Message::Heartbeat(pb::Heartbeat {
            status: pb::AgentStatus::Ready as i32,
            status_reasons: vec![],
            load: Some(pb::AgentLoad {
                running_leases: 1,
                load_average: 1.23,
            }),
            capability_diff: Some(pb::CapabilityDiff {
                base_generation: 7,
                operations: patch_to_proto(&patch),
            }),
            handled_kinds: None,
        })),
    };
    let bare = pb::ConnectRequest {
        sequence: 1234,
        message: Some(pb::connect_request::Message::Heartbeat(pb::Heartbeat {
            status: pb::AgentStatus::Ready as i32,
            status_reasons: vec![],
            load: Some(pb::AgentLoad {
                running_leases: 1,
                load_average: 1.23,
            }),
            capability_diff: None,
            handled_kinds: None,
        })),
    };
    let full = pb::ConnectRequest {
        sequence: 1234,
        message: Some(pb::connect_request::Message::CapabilitySnapshot(
            pb::CapabilitySnapshot {
                capabilities: Some(json_to_struct(&after)),
                provenance: vec![],
                rejections: vec![],
            },
        )),
    };
    let (diff_len, bare_len, full_len) = (
        heartbeat.encoded_len(),
        bare.encoded_len(),
        full.encoded_len(),
    );
    println!(
        "heartbeat bytes on this machine: {bare_len} with no change, {diff_len} with a memory+loadavg diff \
         ({} operations), {full_len} for the full document ({:.1}% of it)",
        patch.0.len(),
        100.0 * diff_len as f64 / full_len as f64
    );
    assert!(
        diff_len * 5 < full_len,
        "a diff heartbeat ({diff_len} B) must stay far below the document ({full_len} B)"
    );
}
