//! Conversions between the wire types (protobuf `Struct`, `Value`,
//! `Timestamp`, `Duration`, JSON Patch operations) and the JSON values and
//! millisecond times the core, the store and the agent work in. Numbers
//! that JSON cannot hold (NaN, infinities) are refused rather than silently
//! changed.
//!
//! A number in a `Struct` is an IEEE-754 double, so the contract carries
//! integers exactly up to ±(2^53 − 1) ([`MAX_EXACT_INTEGER`]) and no
//! further: past it doubles are 2 or more apart, and an integer may
//! already have been rounded on its way. A number of that magnitude is
//! refused wherever a value is read from the wire ([`value_to_json`]) and
//! checked before one is sent ([`check_carried`]); an integral number
//! within it reads back as a JSON integer, so `8080` stays `8080`.

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
        map.insert(key.clone(), value_to_json(value, &join(path, key))?);
    }
    Ok(Value::Object(map))
}

/// A protobuf `Value` as JSON; `path` names it in errors.
pub fn value_to_json(value: &PbValue, path: &str) -> Result<Value, NotJson> {
    Ok(match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::NumberValue(n)) => number_to_json(*n).map_err(|reason| NotJson {
            path: path.to_owned(),
            reason,
        })?,
        Some(Kind::StructValue(s)) => fields_to_json(&s.fields, path)?,
        Some(Kind::ListValue(list)) => Value::Array(
            list.values
                .iter()
                .enumerate()
                .map(|(i, v)| value_to_json(v, &join(path, &i.to_string())))
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// The largest magnitude a number in a `Struct` carries exactly as an
/// integer: 2^53 − 1 (JavaScript's `Number.MAX_SAFE_INTEGER`).
pub const MAX_EXACT_INTEGER: i64 = 9_007_199_254_740_991;

/// Why a number of [`MAX_EXACT_INTEGER`]'s magnitude or more is refused.
pub const BEYOND_EXACT: &str = "number is beyond ±(2^53 − 1) (9007199254740991), the most a \
    Struct number carries exactly; send it as a string";

/// Integral doubles become JSON integers, so `16384` stays `16384`; NaN,
/// infinities and magnitudes past [`MAX_EXACT_INTEGER`] are refused.
#[allow(clippy::cast_precision_loss)]
fn number_to_json(n: f64) -> Result<Value, &'static str> {
    if !n.is_finite() {
        return Err("number is NaN or infinite");
    }
    if n.abs() > MAX_EXACT_INTEGER as f64 {
        return Err(BEYOND_EXACT);
    }
    if n.fract() == 0.0 {
        #[allow(clippy::cast_possible_truncation)]
        return Ok(Value::Number(Number::from(n as i64)));
    }
    Number::from_f64(n)
        .map(Value::Number)
        .ok_or("number is NaN or infinite")
}

/// Checks that every number in `value` travels in a `Struct` exactly: an
/// integer within ±[`MAX_EXACT_INTEGER`], or a fraction of no larger
/// magnitude. `path` names `value` in the error (dotted, as
/// [`struct_to_json`] names fields).
#[allow(clippy::cast_precision_loss)]
pub fn check_carried(value: &Value, path: &str) -> Result<(), NotJson> {
    let beyond = || NotJson {
        path: path.to_owned(),
        reason: BEYOND_EXACT,
    };
    match value {
        Value::Number(n) => {
            let exact = if let Some(i) = n.as_i64() {
                i.unsigned_abs() <= MAX_EXACT_INTEGER.unsigned_abs()
            } else if n.is_u64() {
                false
            } else {
                n.as_f64()
                    .is_some_and(|f| f.abs() <= MAX_EXACT_INTEGER as f64)
            };
            if exact { Ok(()) } else { Err(beyond()) }
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check_carried(v, &join(path, &i.to_string()))),
        Value::Object(map) => map
            .iter()
            .try_for_each(|(k, v)| check_carried(v, &join(path, k))),
        Value::Null | Value::Bool(_) | Value::String(_) => Ok(()),
    }
}

/// `path.key`, or `key` at the root.
fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
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
/// unset op, a missing value, a bad pointer), naming the operation as a
/// failed one is named when applied: `operation 2 (add memory/free)
/// failed: ...`.
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
            _ => {
                return Err(format!(
                    "operation {i} ({} {}) failed: unknown op (add, remove, replace, move, copy \
                     or test)",
                    op.op, op.path
                ));
            }
        };
        let failed = |reason: &dyn std::fmt::Display| {
            format!("operation {i} ({name} {}) failed: {reason}", op.path)
        };
        let mut v = serde_json::json!({"op": name, "path": op.path});
        if matches!(name, "move" | "copy") {
            v["from"] = Value::String(op.from.clone());
        }
        if matches!(name, "add" | "replace" | "test") {
            let value = op
                .value
                .as_ref()
                .ok_or_else(|| failed(&format_args!("{name} needs a value")))?;
            v["value"] = value_to_json(value, "value").map_err(|e| failed(&e))?;
        }
        for (field, pointer) in [("path", &op.path), ("from", &op.from)] {
            let named = field == "path" || matches!(name, "move" | "copy");
            if named && !pointer.is_empty() && !pointer.starts_with('/') {
                return Err(failed(&format_args!(
                    "{field} {pointer:?} is not a JSON pointer: it must be empty or start with '/'"
                )));
            }
        }
        out.push(serde_json::from_value(v).map_err(|e| failed(&e))?);
    }
    Ok(json_patch::Patch(out))
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
    fn numbers_past_two_to_the_53_are_refused_both_ways() {
        let max = 9_007_199_254_740_991_i64;
        // Read from the wire: the largest exact integer reads back as one;
        // a double past it (2^53, all a client's 2^53 + 1 can become) is
        // refused with its path, as is a huge fraction.
        let at = |n: f64| {
            let s = json_to_struct(&json!({"port": 8080, "big": {"n": 0}}));
            let mut s = s;
            if let Some(PbValue {
                kind: Some(Kind::StructValue(inner)),
            }) = s.fields.get_mut("big")
            {
                inner.fields.insert(
                    "n".into(),
                    PbValue {
                        kind: Some(Kind::NumberValue(n)),
                    },
                );
            }
            struct_to_json(&s)
        };
        #[allow(clippy::cast_precision_loss)]
        let max_f = max as f64;
        assert_eq!(at(max_f).unwrap()["big"]["n"], json!(max));
        assert_eq!(at(-max_f).unwrap()["big"]["n"], json!(-max));
        assert_eq!(at(max_f).unwrap()["port"], json!(8080));
        for beyond in [max_f + 1.0, -(max_f + 1.0), 1e300] {
            let err = at(beyond).unwrap_err();
            assert_eq!(err.path, "big.n");
            assert_eq!(err.reason, BEYOND_EXACT);
        }
        assert_eq!(at(0.5).unwrap()["big"]["n"], json!(0.5));
        // Checked before sending: the exact integer of a JSON document, not
        // its rounded double.
        assert!(check_carried(&json!({"n": max, "m": -max, "f": 1.5}), "").is_ok());
        for (doc, path) in [
            (json!({"n": max + 1}), "result.n"),
            (json!({"a": [1, {"n": -max - 1}]}), "result.a.1.n"),
            (json!({"n": u64::MAX}), "result.n"),
            (json!({"n": 1e300}), "result.n"),
        ] {
            let err = check_carried(&doc, "result").unwrap_err();
            assert_eq!(err.path, path, "{doc}");
        }
    }

    #[test]
    fn a_bad_operation_is_named_by_its_index_op_and_path() {
        use crate::v1::{PatchOp, PatchOperation};
        let add = |path: &str| PatchOperation {
            op: PatchOp::Add as i32,
            path: path.to_owned(),
            from: String::new(),
            value: Some(json_to_value(&json!(1))),
        };
        let err = patch_from_proto(&[add("/ok"), add("memory/free")]).unwrap_err();
        assert_eq!(
            err,
            "operation 1 (add memory/free) failed: path \"memory/free\" is not a JSON pointer: \
             it must be empty or start with '/'"
        );
        let mv = PatchOperation {
            op: PatchOp::Move as i32,
            path: "/a".into(),
            from: "b".into(),
            value: None,
        };
        let err = patch_from_proto(&[mv]).unwrap_err();
        assert!(
            err.starts_with("operation 0 (move /a) failed: from \"b\""),
            "{err}"
        );
        let mut no_value = add("/x");
        no_value.value = None;
        let err = patch_from_proto(&[add("/ok"), add("/ok"), no_value]).unwrap_err();
        assert_eq!(err, "operation 2 (add /x) failed: add needs a value");
        assert_eq!(
            patch_from_proto(&[add(""), add("/a/b")]).unwrap().0.len(),
            2
        );
    }

    /// `tests/conformance/numbers.json`, as the runners read it.
    #[test]
    fn the_number_vectors_pass() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/conformance/numbers.json"
        );
        let cases: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(!cases.is_empty());
        for case in &cases {
            let name = case["name"].as_str().unwrap();
            if case["kind"] == "send" {
                let value: Value = serde_json::from_str(case["json"].as_str().unwrap()).unwrap();
                let root = case["path"].as_str().unwrap();
                match (check_carried(&value, root), case.get("error_path")) {
                    (Err(err), Some(at)) => assert_eq!(err.path, *at, "{name}"),
                    (Ok(()), None) => {
                        let sent = struct_to_json(&json_to_struct(&value)).unwrap();
                        assert_eq!(sent, case["sent"], "{name}");
                        // Integers as integers: the same text.
                        assert_eq!(sent.to_string(), case["sent"].to_string(), "{name}");
                    }
                    (got, _) => panic!("{name}: {got:?}"),
                }
            } else {
                let numbers = case["numbers"].as_array().unwrap();
                let integers = case["integers"].as_array().unwrap();
                for (n, integer) in numbers.iter().zip(integers) {
                    let got = value_to_json(&json_to_value(n), "n").unwrap();
                    assert_eq!(got.is_i64(), integer.as_bool().unwrap(), "{name}: {n}");
                    assert_eq!(got.as_f64(), n.as_f64(), "{name}: {n}");
                }
            }
        }
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
