//! The CLI's `--output json`: a reply as canonical proto3 JSON, the mapping
//! grpcurl prints for the same call (lowerCamelCase field names, enum value
//! names, 64-bit integers as strings, RFC 3339 timestamps, durations in
//! seconds, fields at their default left out). prost-reflect does the
//! mapping from the contract's descriptors, so nothing here maps a field by
//! hand. A number that is a whole number is printed as an integer (`8080`,
//! not `8080.0`), as grpcurl prints it: every number in a
//! `google.protobuf.Struct` (payloads, results, documents) is a double on
//! the wire. `submit-many` reads tasks the other way, from the JSON grpcurl
//! takes.

use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::Value;
use switchyard_proto::convert;

/// The contract's descriptors, with the well-known types it imports.
static POOL: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    DescriptorPool::decode(switchyard_proto::FILE_DESCRIPTOR_SET).map_err(|err| err.to_string())
});

/// `message` as proto3 JSON.
pub(super) fn to_json<M: prost::Name>(message: &M) -> Result<Value, String> {
    let pool = POOL.as_ref().map_err(Clone::clone)?;
    let name = M::full_name();
    let descriptor = pool
        .get_message_by_name(&name)
        .ok_or_else(|| format!("{name} is not in the contract's descriptors"))?;
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
        .map_err(|err| format!("{name}: {err}"))?;
    let mut value = dynamic
        .serialize_with_options(serde_json::value::Serializer, &SerializeOptions::new())
        .map_err(|err| format!("{name}: {err}"))?;
    whole_numbers_as_integers(&mut value);
    Ok(value)
}

/// A message from its proto3 JSON (what grpcurl's `-d` takes).
pub(super) fn from_json<M: prost::Name + Default>(text: &str) -> Result<M, String> {
    let pool = POOL.as_ref().map_err(Clone::clone)?;
    let name = M::full_name();
    let descriptor = pool
        .get_message_by_name(&name)
        .ok_or_else(|| format!("{name} is not in the contract's descriptors"))?;
    let mut reader = serde_json::Deserializer::from_str(text);
    let dynamic =
        DynamicMessage::deserialize(descriptor, &mut reader).map_err(|err| err.to_string())?;
    reader.end().map_err(|err| err.to_string())?;
    dynamic.transcode_to::<M>().map_err(|err| err.to_string())
}

/// Every whole number in `value` that a double holds exactly as an integer,
/// printed as one.
fn whole_numbers_as_integers(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                && f.abs() <= MAX_EXACT
            {
                #[allow(clippy::cast_possible_truncation)]
                let whole = f as i64;
                *value = Value::from(whole);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        Value::Object(map) => map.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
    }
}

/// [`convert::MAX_EXACT_INTEGER`] as a double (exact: it is below 2^53).
#[allow(clippy::cast_precision_loss)]
const MAX_EXACT: f64 = convert::MAX_EXACT_INTEGER as f64;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use switchyard_proto::v1 as pb;

    #[test]
    fn proto3_names_enums_int64_and_well_known_types() {
        let reply = pb::GetTaskResponse {
            task: Some(pb::Task {
                task_id: "t1".into(),
                state: pb::TaskState::Failed as i32,
                max_attempts: 3,
                lease: Some(pb::Lease {
                    fencing_token: 7,
                    ..Default::default()
                }),
                created_at: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 5_000_000,
                }),
                execution_timeout: Some(prost_types::Duration {
                    seconds: 90,
                    nanos: 500_000_000,
                }),
                ..Default::default()
            }),
        };
        let value = to_json(&reply).unwrap();
        assert_eq!(value["task"]["taskId"], json!("t1"));
        assert_eq!(value["task"]["state"], json!("TASK_STATE_FAILED"));
        assert_eq!(value["task"]["maxAttempts"], json!(3));
        assert_eq!(value["task"]["lease"]["fencingToken"], json!("7"));
        assert_eq!(
            value["task"]["createdAt"],
            json!("2023-11-14T22:13:20.005Z")
        );
        assert_eq!(value["task"]["executionTimeout"], json!("90.500s"));
        // Defaults are left out, as grpcurl leaves them out.
        assert!(value["task"].get("attempts").is_none(), "{value}");
        assert!(value["task"].get("priority").is_none(), "{value}");
    }

    #[test]
    fn whole_numbers_in_structs_print_as_integers() {
        let reply = pb::GetTaskResponse {
            task: Some(pb::Task {
                result: Some(convert::json_to_struct(
                    &json!({"exit_code": 0, "port": 8080, "load": 0.5, "n": [-3, 9_007_199_254_740_991_i64]}),
                )),
                ..Default::default()
            }),
        };
        let value = to_json(&reply).unwrap();
        let result = &value["task"]["result"];
        assert_eq!(
            result.to_string(),
            r#"{"exit_code":0,"load":0.5,"n":[-3,9007199254740991],"port":8080}"#
        );
    }
}
