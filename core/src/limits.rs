//! The limits every capability document and every patch obeys, so that one agent cannot make the
//! server hold or walk an unbounded value: serialized size, nesting depth, object key length and
//! array length. [`Limits::violations`] walks a value and reports every violation with the dotted
//! path where it occurs; the tier merge and patch application turn those into rejections or
//! errors.
//!
//! Depth counts containers: the document object is depth 1, an object or array directly inside
//! it is depth 2, and so on; scalars add nothing. A document with `max_depth = 32` can therefore
//! hold containers up to 31 keys below the root.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::io;

/// Configurable limits; [`Limits::default`] holds the documented defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Largest serialized (compact JSON) size in bytes. Default 256 KiB.
    pub max_serialized_bytes: usize,
    /// Deepest container nesting (the root object is depth 1). Default 32.
    pub max_depth: usize,
    /// Longest object key in bytes. Default 256.
    pub max_key_bytes: usize,
    /// Most items in one array. Default 4,096.
    pub max_array_items: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_serialized_bytes: 256 * 1024,
            max_depth: 32,
            max_key_bytes: 256,
            max_array_items: 4096,
        }
    }
}

/// One limit violation: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Dotted path of the offending value (empty for the whole value).
    pub path: String,
    /// What is over which limit, e.g. `array has 5000 items, limit 4096`.
    pub reason: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

impl Limits {
    /// Every violation in `value`, treated as a whole document (depth 1 at its root), including
    /// its serialized size.
    pub fn violations(&self, value: &Value) -> Vec<Violation> {
        let mut out = Vec::new();
        if !self.structurally_within(value, 1) {
            self.structural_violations(value, "", 1, &mut out);
        }
        let size = serialized_len(value);
        if size > self.max_serialized_bytes {
            out.push(Violation {
                path: String::new(),
                reason: size_reason(size, self.max_serialized_bytes),
            });
        }
        out
    }

    /// Depth, key-length and array-length violations of `value`, which sits at `path` with its
    /// own container depth `depth` (1 for a document root). Serialized size is not checked.
    pub fn structural_violations(
        &self,
        value: &Value,
        path: &str,
        depth: usize,
        out: &mut Vec<Violation>,
    ) {
        match value {
            Value::Object(map) => {
                if depth > self.max_depth {
                    out.push(Violation {
                        path: path.to_owned(),
                        reason: depth_reason(depth, self.max_depth),
                    });
                    return;
                }
                for (key, child) in map {
                    let child_path = join(path, key);
                    if key.len() > self.max_key_bytes {
                        out.push(Violation {
                            path: child_path,
                            reason: key_reason(key.len(), self.max_key_bytes),
                        });
                        continue;
                    }
                    self.structural_violations(child, &child_path, depth + 1, out);
                }
            }
            Value::Array(items) => {
                if depth > self.max_depth {
                    out.push(Violation {
                        path: path.to_owned(),
                        reason: depth_reason(depth, self.max_depth),
                    });
                    return;
                }
                if items.len() > self.max_array_items {
                    out.push(Violation {
                        path: path.to_owned(),
                        reason: format!(
                            "array has {} items, limit {}",
                            items.len(),
                            self.max_array_items
                        ),
                    });
                    return;
                }
                for (i, child) in items.iter().enumerate() {
                    self.structural_violations(child, &join(path, &i.to_string()), depth + 1, out);
                }
            }
            _ => {}
        }
    }
}

impl Limits {
    /// Whether `value` at container depth `depth` has no depth, key or array violation; a fast
    /// check that builds no paths.
    pub fn structurally_within(&self, value: &Value, depth: usize) -> bool {
        match value {
            Value::Object(map) => {
                depth <= self.max_depth
                    && map.iter().all(|(k, v)| {
                        k.len() <= self.max_key_bytes && self.structurally_within(v, depth + 1)
                    })
            }
            Value::Array(items) => {
                depth <= self.max_depth
                    && items.len() <= self.max_array_items
                    && items.iter().all(|v| self.structurally_within(v, depth + 1))
            }
            _ => true,
        }
    }
}

pub(crate) fn depth_reason(depth: usize, limit: usize) -> String {
    format!("nesting depth {depth} exceeds limit {limit}")
}

pub(crate) fn key_reason(len: usize, limit: usize) -> String {
    format!("key is {len} bytes, limit {limit}")
}

pub(crate) fn size_reason(size: usize, limit: usize) -> String {
    format!("document would be {size} bytes serialized, limit {limit}")
}

/// Joins a dotted path and a key (`""` + `a` is `a`).
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        let mut s = String::with_capacity(path.len() + 1 + key.len());
        s.push_str(path);
        s.push('.');
        s.push_str(key);
        s
    }
}

/// The length in bytes of `value` serialized as compact JSON, computed without allocating the
/// text.
pub fn serialized_len(value: &Value) -> usize {
    struct Counter(usize);
    impl io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Serializing a `Value` into an infallible writer cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn small() -> Limits {
        Limits {
            max_serialized_bytes: 64,
            max_depth: 3,
            max_key_bytes: 4,
            max_array_items: 2,
        }
    }

    #[test]
    fn defaults_are_documented_values() {
        let l = Limits::default();
        assert_eq!(l.max_serialized_bytes, 262_144);
        assert_eq!(l.max_depth, 32);
        assert_eq!(l.max_key_bytes, 256);
        assert_eq!(l.max_array_items, 4096);
    }

    #[test]
    fn within_limits_has_no_violations() {
        assert!(small().violations(&json!({"a": {"b": [1, 2]}})).is_empty());
    }

    #[test]
    fn depth_limit_counts_containers() {
        assert!(
            small()
                .violations(&json!({"a": {"b": {"c": 1}}}))
                .is_empty()
        );
        let v = small().violations(&json!({"a": {"b": {"c": {}}}}));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].path, "a.b.c");
        assert!(v[0].reason.contains("depth 4"));
    }

    #[test]
    fn key_limit_in_bytes() {
        let v = small().violations(&json!({"abcde": 1, "ok": 2}));
        assert_eq!(
            v,
            vec![Violation {
                path: "abcde".into(),
                reason: "key is 5 bytes, limit 4".into()
            }]
        );
    }

    #[test]
    fn array_limit() {
        let v = small().violations(&json!({"a": [1, 2, 3]}));
        assert_eq!(v[0].path, "a");
        assert_eq!(v[0].reason, "array has 3 items, limit 2");
    }

    #[test]
    fn array_items_get_index_paths() {
        let v = small().violations(&json!({"a": [{"toolong": 1}]}));
        assert_eq!(v[0].path, "a.0.toolong");
    }

    #[test]
    fn size_limit() {
        let big = json!({"a": "x".repeat(100)});
        let v = small().violations(&big);
        assert_eq!(v.len(), 1);
        assert!(v[0].reason.contains("limit 64"));
        assert_eq!(
            serialized_len(&big),
            serde_json::to_string(&big).unwrap().len()
        );
    }
}
