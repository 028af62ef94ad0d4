//! Diffs between generations of a capability document: an RFC 6902 JSON Patch produced and
//! applied with the `json-patch` crate. [`diff`] keeps patches small: where several members of
//! one object changed, it emits whichever is shorter when serialized — the per-member
//! operations `json-patch` produces, or one `replace` of the whole object (so a memory and
//! load-average refresh is two `replace`s, not five). An agent sends a patch tagged with the generation it was
//! made against; [`apply`] checks that generation, applies the operations atomically, and checks
//! the patch and the result against the same [`Limits`] as documents. Every failure is a
//! [`DiffError`], which the server turns into a resync request.

use crate::error::DiffError;
use crate::limits::Limits;
use json_patch::jsonptr::{Pointer, PointerBuf};
use json_patch::{AddOperation, RemoveOperation, ReplaceOperation};
pub use json_patch::{Patch, PatchOperation};
use serde_json::Value;

/// The patch that turns `from` into `to` (`apply(from, diff(from, to)) == to`).
pub fn diff(from: &Value, to: &Value) -> Patch {
    Patch(diff_at(from, to, &PointerBuf::root()))
}

fn diff_at(from: &Value, to: &Value, at: &PointerBuf) -> Vec<PatchOperation> {
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => {
            if a == b {
                return Vec::new();
            }
            let mut ops = Vec::new();
            for (key, new) in b {
                let mut child = at.clone();
                child.push_back(key.as_str());
                match a.get(key) {
                    Some(old) => ops.extend(diff_at(old, new, &child)),
                    None => ops.push(PatchOperation::Add(AddOperation {
                        path: child,
                        value: new.clone(),
                    })),
                }
            }
            for key in a.keys().filter(|k| !b.contains_key(*k)) {
                let mut child = at.clone();
                child.push_back(key.as_str());
                ops.push(PatchOperation::Remove(RemoveOperation { path: child }));
            }
            if !at.is_root() && ops.len() > 1 {
                let whole = PatchOperation::Replace(ReplaceOperation {
                    path: at.clone(),
                    value: to.clone(),
                });
                if json_len(&whole) < json_len(&ops) {
                    return vec![whole];
                }
            }
            ops
        }
        _ => {
            let mut ops = json_patch::diff(from, to).0;
            if !at.is_root() {
                for op in &mut ops {
                    match op {
                        PatchOperation::Add(o) => o.path = at.concat(&o.path),
                        PatchOperation::Remove(o) => o.path = at.concat(&o.path),
                        PatchOperation::Replace(o) => o.path = at.concat(&o.path),
                        PatchOperation::Test(o) => o.path = at.concat(&o.path),
                        PatchOperation::Move(o) => {
                            o.path = at.concat(&o.path);
                            o.from = at.concat(&o.from);
                        }
                        PatchOperation::Copy(o) => {
                            o.path = at.concat(&o.path);
                            o.from = at.concat(&o.from);
                        }
                    }
                }
            }
            ops
        }
    }
}

fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

/// The serialized (compact JSON) size of a patch in bytes.
pub fn patch_len(patch: &Patch) -> usize {
    json_len(patch)
}

/// Every place `patch` may change: each operation's `path`, and the `from`
/// of a `move` (a `test` changes nothing). The document after the patch
/// equals the one before it everywhere outside these subtrees.
pub fn touched(patch: &Patch) -> Vec<&Pointer> {
    let mut out = Vec::with_capacity(patch.0.len());
    for op in &patch.0 {
        match op {
            PatchOperation::Add(o) => out.push(o.path.as_ptr()),
            PatchOperation::Remove(o) => out.push(o.path.as_ptr()),
            PatchOperation::Replace(o) => out.push(o.path.as_ptr()),
            PatchOperation::Copy(o) => out.push(o.path.as_ptr()),
            PatchOperation::Move(o) => {
                out.push(o.path.as_ptr());
                out.push(o.from.as_ptr());
            }
            PatchOperation::Test(_) => {}
        }
    }
    out
}

/// The RFC 6902 name of an operation (`add`, `remove`, ...).
pub fn op_name(op: &PatchOperation) -> &'static str {
    match op {
        PatchOperation::Add(_) => "add",
        PatchOperation::Remove(_) => "remove",
        PatchOperation::Replace(_) => "replace",
        PatchOperation::Move(_) => "move",
        PatchOperation::Copy(_) => "copy",
        PatchOperation::Test(_) => "test",
    }
}

/// Checks `patch` (as its JSON form) against `limits`: its serialized size, the depth, keys and
/// arrays of its operands, and its number of operations (at most `max_array_items`).
pub fn check_patch(patch: &Patch, limits: &Limits) -> Result<(), DiffError> {
    let as_json = serde_json::to_value(patch).unwrap_or(Value::Null);
    let violations = limits.violations(&as_json);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(DiffError::OverLimits {
            what: "patch",
            violations,
        })
    }
}

/// Applies `patch`, made against `base_generation`, to `held`, which is generation
/// `held_generation`. Returns the next generation's document; `held` is never modified.
pub fn apply(
    held: &Value,
    held_generation: u64,
    base_generation: u64,
    patch: &Patch,
    limits: &Limits,
) -> Result<Value, DiffError> {
    if held_generation != base_generation {
        return Err(DiffError::WrongGeneration {
            held: held_generation,
            base: base_generation,
        });
    }
    check_patch(patch, limits)?;
    let mut next = held.clone();
    // A failed patch leaves `next` half-applied; it is discarded, which keeps the application
    // atomic without relying on the crate's undo path.
    json_patch::patch_unsafe(&mut next, patch).map_err(|e| {
        let op = patch.0.get(e.operation);
        DiffError::OperationFailed {
            index: e.operation,
            op: op.map(op_name).unwrap_or("unknown").to_owned(),
            path: e.path.to_string(),
            reason: e.kind.to_string(),
        }
    })?;
    if !next.is_object() {
        return Err(DiffError::NotAnObject {
            kind: crate::document::kind(&next),
        });
    }
    let violations = limits.violations(&next);
    if !violations.is_empty() {
        return Err(DiffError::OverLimits {
            what: "document",
            violations,
        });
    }
    Ok(next)
}

/// Facts that change on nearly every heartbeat (free memory, load): the
/// server writes a document whose diffs touch only these to its store
/// behind, at most now and then, and matching sees them at once.
pub const VOLATILE: &[&str] = &["/memory/free", "/memory/available", "/loadavg"];

/// Whether pointer `path` is `prefix` or below it.
fn at_or_under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Whether `at` is at or under a [`VOLATILE`] path: whatever changes there
/// is volatile.
pub fn is_volatile(at: &Pointer) -> bool {
    VOLATILE.iter().any(|v| at_or_under(at.as_str(), v))
}

/// Whether the change a patch made at `at` (one of [`touched`]'s pointers),
/// turning `old` into `new`, is to [`VOLATILE`] facts only: `at` is at or
/// under a volatile path, or is above some and nothing but volatile leaves
/// differ below it (an agent may send `/memory` whole).
pub fn volatile_only(old: &Value, new: &Value, at: &Pointer) -> bool {
    fn same_outside(old: Option<&Value>, new: Option<&Value>, at: &str) -> bool {
        if VOLATILE.iter().any(|v| at_or_under(at, v)) {
            return true;
        }
        match (old, new) {
            (Some(Value::Object(a)), Some(Value::Object(b)))
                if VOLATILE.iter().any(|v| at_or_under(v, at)) =>
            {
                a.keys()
                    .chain(b.keys())
                    .all(|k| same_outside(a.get(k), b.get(k), &format!("{at}/{k}")))
            }
            (a, b) => a == b,
        }
    }
    let at = at.as_str();
    same_outside(old.pointer(at), new.pointer(at), at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_free_memory_and_load_are_volatile() {
        let old = json!({"memory": {"total": 8, "free": 3, "available": 4}, "loadavg": {"1min": 0.5}, "tags": ["a"]});
        let ptr = |p: &str| PointerBuf::parse(p).unwrap();
        let mut new = old.clone();
        new["memory"]["free"] = json!(2);
        assert!(volatile_only(&old, &new, &ptr("/memory/free")));
        for (at, volatile) in [
            ("/memory/free", true),
            ("/memory/available", true),
            ("/loadavg/1min", true),
            ("/loadavg", true),
            ("/memory", false),
            ("/memory/freebies", false),
            ("/memory/total", false),
            ("", false),
        ] {
            assert_eq!(is_volatile(&ptr(at)), volatile, "{at}");
        }
        // `/memory` sent whole, only free memory differing: still volatile.
        assert!(volatile_only(&old, &new, &ptr("/memory")));
        new["loadavg"]["1min"] = json!(0.9);
        assert!(volatile_only(&old, &new, &ptr("/loadavg")));
        new["memory"]["total"] = json!(16);
        assert!(!volatile_only(&old, &new, &ptr("/memory")));
        let mut tagged = old.clone();
        tagged["tags"] = json!(["a", "b"]);
        assert!(!volatile_only(&old, &tagged, &ptr("/tags")));
        assert!(!volatile_only(&old, &tagged, &ptr("")));
    }

    fn patch(v: Value) -> Patch {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn round_trip() {
        let a = json!({"memory": {"free": 1}, "tags": ["a", "b"], "x": 1});
        let b = json!({"memory": {"free": 2}, "tags": ["b"], "y": [1]});
        let p = diff(&a, &b);
        assert_eq!(apply(&a, 7, 7, &p, &Limits::default()).unwrap(), b);
    }

    #[test]
    fn coalesces_objects_when_shorter() {
        let a = json!({"memory": {"total": 8192, "free": 2048, "available": 4096, "unit": "MB"}, "os": "linux", "big": {"x": "y".repeat(200)}});
        let b = json!({"memory": {"total": 8192, "free": 1900, "available": 3900, "unit": "MB"}, "os": "linux", "big": {"x": "y".repeat(200), "z": 1}});
        let p = diff(&a, &b);
        let ops = serde_json::to_value(&p).unwrap();
        assert_eq!(ops.as_array().unwrap().len(), 2, "{ops}");
        assert_eq!(ops[0]["path"], json!("/big/z"));
        assert_eq!(ops[1]["path"], json!("/memory"));
        assert_eq!(apply(&a, 0, 0, &p, &Limits::default()).unwrap(), b);
        assert!(diff(&a, &a).is_empty());
    }

    #[test]
    fn escapes_and_nested_arrays() {
        let a = json!({"a/b": {"m~n": [1, 2, {"x": 1}]}});
        let b = json!({"a/b": {"m~n": [1, {"x": 2}]}});
        let p = diff(&a, &b);
        assert_eq!(apply(&a, 0, 0, &p, &Limits::default()).unwrap(), b);
    }

    #[test]
    fn wrong_generation() {
        let a = json!({});
        let err = apply(&a, 3, 2, &Patch::default(), &Limits::default()).unwrap_err();
        assert_eq!(err, DiffError::WrongGeneration { held: 3, base: 2 });
    }

    #[test]
    fn failing_operation_is_typed_and_atomic() {
        let a = json!({"a": 1});
        let p = patch(json!([
            {"op": "replace", "path": "/a", "value": 2},
            {"op": "test", "path": "/a", "value": 3}
        ]));
        match apply(&a, 1, 1, &p, &Limits::default()).unwrap_err() {
            DiffError::OperationFailed {
                index, op, path, ..
            } => {
                assert_eq!((index, op.as_str(), path.as_str()), (1, "test", "/a"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(a, json!({"a": 1}));
        let missing = patch(json!([{"op": "remove", "path": "/nope"}]));
        assert!(matches!(
            apply(&a, 1, 1, &missing, &Limits::default()),
            Err(DiffError::OperationFailed { index: 0, .. })
        ));
    }

    #[test]
    fn patch_over_limits() {
        let limits = Limits {
            max_array_items: 2,
            ..Limits::default()
        };
        let a = json!({});
        let p = patch(json!([{"op": "add", "path": "/a", "value": [1, 2, 3]}]));
        let err = apply(&a, 0, 0, &p, &limits).unwrap_err();
        assert!(
            matches!(err, DiffError::OverLimits { what: "patch", .. }),
            "{err}"
        );
        let many = patch(json!([
            {"op": "add", "path": "/a", "value": 1},
            {"op": "add", "path": "/b", "value": 1},
            {"op": "add", "path": "/c", "value": 1}
        ]));
        assert!(matches!(
            apply(&a, 0, 0, &many, &limits),
            Err(DiffError::OverLimits { what: "patch", .. })
        ));
    }

    #[test]
    fn result_over_limits() {
        let limits = Limits {
            max_array_items: 2,
            ..Limits::default()
        };
        let a = json!({"a": [1, 2]});
        let p = patch(json!([{"op": "add", "path": "/a/-", "value": 3}]));
        let err = apply(&a, 0, 0, &p, &limits).unwrap_err();
        assert!(
            matches!(
                err,
                DiffError::OverLimits {
                    what: "document",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn replacing_root_with_non_object_is_rejected() {
        let p = patch(json!([{"op": "replace", "path": "", "value": 5}]));
        assert_eq!(
            apply(&json!({}), 0, 0, &p, &Limits::default()).unwrap_err(),
            DiffError::NotAnObject { kind: "number" }
        );
    }
}
