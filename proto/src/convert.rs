//! Conversions between the wire types (protobuf `Struct`, `Value`,
//! `Timestamp`, `Duration`, JSON Patch operations) and the JSON values and
//! millisecond times the core, the store and the agent work in. Numbers
//! that JSON cannot hold (NaN, infinities) are refused rather than silently
//! changed.

use prost_types::{ListValue, Struct, Value as PbValue, value::Kind};
use serde_json::{Map, Number, Value};

/// Why a protobuf value has no JSON equivalent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct NotJson {
    /// Where in the value (dotted path).
    pub path: String,
    /// What was wrong.
    pub reason: &'static str,
}

/// A protobuf `Struct` as a JSON object.
pub fn struct_to_json(s: &Struct) -> Result<Value, NotJson> {
    fields_to_json(&s.fields, "")
}

fn fields_to_json(
    fields: &std::collections::BTreeMap<String, PbValue>,
    path: &str,
) -> Result<Value, NotJson> {
    let mut map = Map::new();
    for (key, value) in fields {
        let child = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        map.insert(key.clone(), value_to_json(value, &child)?);
    }
    Ok(Value::Object(map))
}

/// A protobuf `Value` as JSON; `path` names it in errors.
pub fn value_to_json(value: &PbValue, path: &str) -> Result<Value, NotJson> {
    Ok(match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::NumberValue(n)) => number_to_json(*n).ok_or_else(|| NotJson {
            path: path.to_owned(),
            reason: "number is NaN or infinite",
        })?,
        Some(Kind::StructValue(s)) => fields_to_json(&s.fields, path)?,
        Some(Kind::ListValue(list)) => Value::Array(
            list.values
                .iter()
                .enumerate()
                .map(|(i, v)| value_to_json(v, &format!("{path}.{i}")))
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// Integral doubles become JSON integers, so `16384` stays `16384`.
fn number_to_json(n: f64) -> Option<Value> {
    if !n.is_finite() {
        return None;
    }
    // 2^53: every integer below it is exact in an f64.
    if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 {
        #[allow(clippy::cast_possible_truncation)]
        return Some(Value::Number(Number::from(n as i64)));
    }
    Number::from_f64(n).map(Value::Number)
}

/// A JSON value as a protobuf `Value`.
pub fn json_to_value(value: &Value) -> PbValue {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(json_to_value).collect(),
        }),
        Value::Object(map) => Kind::StructValue(json_to_struct_map(map)),
    };
    PbValue { kind: Some(kind) }
}

/// A JSON value as a protobuf `Struct`; anything but an object becomes an
/// empty struct (callers validate shape before storing).
pub fn json_to_struct(value: &Value) -> Struct {
    match value {
        Value::Object(map) => json_to_struct_map(map),
        _ => Struct::default(),
    }
}

fn json_to_struct_map(map: &Map<String, Value>) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect(),
    }
}

/// A protobuf `Struct` as JSON, with values JSON cannot hold as null (for
/// data the caller trusts, such as a payload the server already checked).
pub fn struct_to_json_lossy(s: &Struct) -> Value {
    struct_to_json(s).unwrap_or_else(|_| Value::Object(Map::new()))
}

/// A JSON Patch as wire operations.
pub fn patch_to_proto(patch: &json_patch::Patch) -> Vec<crate::v1::PatchOperation> {
    use crate::v1::{PatchOp, PatchOperation};
    patch
        .0
        .iter()
        .map(|op| {
            let (kind, path, from, value) = match op {
                json_patch::PatchOperation::Add(o) => (
                    PatchOp::Add,
                    o.path.to_string(),
                    String::new(),
                    Some(&o.value),
                ),
                json_patch::PatchOperation::Remove(o) => {
                    (PatchOp::Remove, o.path.to_string(), String::new(), None)
                }
                json_patch::PatchOperation::Replace(o) => (
                    PatchOp::Replace,
                    o.path.to_string(),
                    String::new(),
                    Some(&o.value),
                ),
                json_patch::PatchOperation::Move(o) => {
                    (PatchOp::Move, o.path.to_string(), o.from.to_string(), None)
                }
                json_patch::PatchOperation::Copy(o) => {
                    (PatchOp::Copy, o.path.to_string(), o.from.to_string(), None)
                }
                json_patch::PatchOperation::Test(o) => (
                    PatchOp::Test,
                    o.path.to_string(),
                    String::new(),
                    Some(&o.value),
                ),
            };
            PatchOperation {
                op: kind as i32,
                path,
                from,
                value: value.map(json_to_value),
            }
        })
        .collect()
}

/// Wire operations as a JSON Patch, or why they are not one (an unknown or
/// unset op, a missing value, a bad pointer).
pub fn patch_from_proto(ops: &[crate::v1::PatchOperation]) -> Result<json_patch::Patch, String> {
    use crate::v1::PatchOp;
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let name = match PatchOp::try_from(op.op) {
            Ok(PatchOp::Add) => "add",
            Ok(PatchOp::Remove) => "remove",
            Ok(PatchOp::Replace) => "replace",
            Ok(PatchOp::Move) => "move",
            Ok(PatchOp::Copy) => "copy",
            Ok(PatchOp::Test) => "test",
            _ => return Err(format!("operation {i}: unknown op {}", op.op)),
        };
        let mut v = serde_json::json!({"op": name, "path": op.path});
        if matches!(name, "move" | "copy") {
            v["from"] = Value::String(op.from.clone());
        }
        if matches!(name, "add" | "replace" | "test") {
            let value = op
                .value
                .as_ref()
                .ok_or_else(|| format!("operation {i}: {name} needs a value"))?;
            v["value"] =
                value_to_json(value, "value").map_err(|e| format!("operation {i}: {e}"))?;
        }
        out.push(v);
    }
    serde_json::from_value(Value::Array(out)).map_err(|e| format!("not a JSON Patch: {e}"))
}

/// Milliseconds since the Unix epoch as a protobuf `Timestamp`.
pub fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        #[allow(clippy::cast_possible_truncation)]
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A protobuf `Timestamp` as milliseconds since the Unix epoch.
pub fn timestamp_ms(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(ts.nanos) / 1_000_000)
}

/// Milliseconds as a protobuf `Duration`.
pub fn duration(ms: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ms.div_euclid(1000),
        #[allow(clippy::cast_possible_truncation)]
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A protobuf `Duration` as milliseconds; `None` if negative.
pub fn duration_ms(d: &prost_types::Duration) -> Option<i64> {
    let ms = d
        .seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(d.nanos) / 1_000_000);
    (ms >= 0).then_some(ms)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn struct_round_trips_through_json() {
        let doc = json!({"os": "linux", "memory": {"total": 16384, "unit": "MB"}, "loadavg": {"1min": 0.5},
                         "tags": ["docker", "gpu"], "debug": false, "gone": null});
        let pb = json_to_struct(&doc);
        assert_eq!(struct_to_json(&pb).unwrap(), doc);
    }

    #[test]
    fn integral_numbers_stay_integers() {
        let pb = json_to_value(&json!(16384));
        assert_eq!(value_to_json(&pb, "x").unwrap(), json!(16384));
        assert!(value_to_json(&pb, "x").unwrap().is_i64());
    }

    #[test]
    fn nan_is_refused_with_its_path() {
        let mut s = Struct::default();
        let inner = Struct {
            fields: [(
                "free".to_owned(),
                PbValue {
                    kind: Some(Kind::NumberValue(f64::NAN)),
                },
            )]
            .into(),
        };
        s.fields.insert(
            "memory".into(),
            PbValue {
                kind: Some(Kind::StructValue(inner)),
            },
        );
        let err = struct_to_json(&s).unwrap_err();
        assert_eq!(err.path, "memory.free");
    }

    #[test]
    fn times_convert_both_ways() {
        let ts = timestamp(1_700_000_000_123);
        assert_eq!((ts.seconds, ts.nanos), (1_700_000_000, 123_000_000));
        assert_eq!(timestamp_ms(&ts), 1_700_000_000_123);
        assert_eq!(duration_ms(&duration(30_000)), Some(30_000));
        assert_eq!(
            duration_ms(&prost_types::Duration {
                seconds: -1,
                nanos: 0
            }),
            None
        );
    }
}
