//! A capability document is a JSON object an agent reports about itself. Matching understands a
//! few conventional fields — `os`, `arch`, `hostname`, `tags` (flat strings),
//! `software.<tool>.{version, major_version, minor_version, patch_version}`,
//! `memory.{total, free, available, unit}`, `loadavg.{1min, 5min, 15min}`,
//! `max_concurrent_tasks`, `taints` (the task classes the agent reserves itself for: it takes
//! only tasks that tolerate each of them), and `provides.<dotted.name>.{version, healthy,
//! reason}` — and
//! everything else is free-form but still reachable by a dotted path. This module resolves such
//! paths and reads the conventional fields.
//!
//! Path rules: segments are separated by `.`; at an array, a segment of ASCII digits is an
//! index; at an object, the longest run of segments that names an existing key wins, so
//! `provides.ai.llm.version` reaches the key `ai.llm` under `provides`.

use crate::version;
use serde_json::{Map, Value, json};

/// Resolves a dotted path in `doc`. The empty path is `doc` itself.
pub fn lookup<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return Some(doc);
    }
    match doc {
        Value::Object(map) => {
            // Fast path: the whole remaining path is a key, or its first segment is.
            if let Some(v) = map.get(path) {
                return Some(v);
            }
            // Try prefixes ending at a dot, longest first.
            let mut end = path.len();
            while let Some(i) = path[..end].rfind('.') {
                if let Some(child) = map.get(&path[..i])
                    && let Some(found) = lookup(child, &path[i + 1..])
                {
                    return Some(found);
                }
                end = i;
            }
            None
        }
        Value::Array(items) => {
            let (seg, rest) = match path.split_once('.') {
                Some((s, r)) => (s, Some(r)),
                None => (path, None),
            };
            if seg.is_empty() || !seg.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let item = items.get(seg.parse::<usize>().ok()?)?;
            match rest {
                Some(r) => lookup(item, r),
                None => Some(item),
            }
        }
        _ => None,
    }
}

/// The JSON type name of a value, for reasons (`string`, `number`, `object`, ...).
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A value as people read it in reasons: strings bare, everything else as compact JSON.
pub fn display(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A named capability as reported under `provides.<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvidedCapability<'a> {
    /// `provides.<name>.version`, if a string or number.
    pub version: Option<String>,
    /// `provides.<name>.healthy`; absent counts as healthy.
    pub healthy: bool,
    /// `provides.<name>.reason`, why it is unhealthy.
    pub reason: Option<&'a str>,
}

/// A read-only view of a capability document with accessors for the conventional fields.
#[derive(Debug, Clone, Copy)]
pub struct CapabilityDocument<'a>(pub &'a Value);

impl<'a> CapabilityDocument<'a> {
    /// The value at a dotted path.
    pub fn get(&self, path: &str) -> Option<&'a Value> {
        lookup(self.0, path)
    }

    /// `os`, when a string (SheetBot sometimes nests an object there; that yields `None`).
    pub fn os(&self) -> Option<&'a str> {
        self.0.get("os").and_then(Value::as_str)
    }

    /// `arch`.
    pub fn arch(&self) -> Option<&'a str> {
        self.0.get("arch").and_then(Value::as_str)
    }

    /// `hostname`.
    pub fn hostname(&self) -> Option<&'a str> {
        self.0.get("hostname").and_then(Value::as_str)
    }

    /// The string items of `tags`; non-strings are ignored.
    pub fn tags(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .get("tags")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
    }

    /// Whether `tags` holds `tag` exactly.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags().any(|t| t == tag)
    }

    /// The agent's taints: the strings of the `taints` array, or `taints` itself when it is one
    /// string; a task goes to the agent only if it tolerates every one.
    pub fn taints(&self) -> impl Iterator<Item = &'a str> + 'a {
        let taints = self.0.get("taints");
        let one = taints.and_then(Value::as_str);
        taints
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .chain(one)
    }

    /// `software.<tool>.version`.
    pub fn software_version(&self, tool: &str) -> Option<&'a str> {
        self.0.get("software")?.get(tool)?.get("version")?.as_str()
    }

    /// `memory.total`, in `memory.unit` (SheetBot reports MB).
    pub fn memory_total(&self) -> Option<f64> {
        self.0.get("memory")?.get("total")?.as_f64()
    }

    /// `max_concurrent_tasks`, when a non-negative integer.
    pub fn max_concurrent_tasks(&self) -> Option<u64> {
        self.0.get("max_concurrent_tasks")?.as_u64()
    }

    /// `provides.<name>`, when it is an object.
    pub fn provided(&self, name: &str) -> Option<ProvidedCapability<'a>> {
        let entry = self.0.get("provides")?.get(name)?.as_object()?;
        Some(ProvidedCapability {
            version: entry.get("version").and_then(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            }),
            healthy: entry
                .get("healthy")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            reason: entry.get("reason").and_then(Value::as_str),
        })
    }
}

/// The conventional `software.<tool>` entry for a detected version string:
/// `{version, major_version, minor_version, patch_version}`, the numbers read leniently
/// (`v18.2` gives 18, 2, 0). An unparseable version yields only `{version}`.
pub fn software_entry(version_text: &str) -> Value {
    let mut entry = Map::new();
    entry.insert("version".into(), json!(version_text));
    if let Some(v) = version::parse_lenient(version_text) {
        entry.insert("major_version".into(), json!(v.major));
        entry.insert("minor_version".into(), json!(v.minor));
        entry.insert("patch_version".into(), json!(v.patch));
    }
    Value::Object(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_nested_and_arrays() {
        let d = json!({"a": {"b": [10, {"c": "x"}]}, "memory": {"total": 8}});
        assert_eq!(lookup(&d, "a.b.0"), Some(&json!(10)));
        assert_eq!(lookup(&d, "a.b.1.c"), Some(&json!("x")));
        assert_eq!(lookup(&d, "a.b.2"), None);
        assert_eq!(lookup(&d, "a.b.x"), None);
        assert_eq!(lookup(&d, "memory.total"), Some(&json!(8)));
        assert_eq!(lookup(&d, "memory.total.x"), None);
        assert_eq!(lookup(&d, ""), Some(&d));
    }

    #[test]
    fn lookup_dotted_keys() {
        let d = json!({"provides": {"ai.llm": {"version": "1.2.0"}, "ai": {"x": 1}}});
        assert_eq!(lookup(&d, "provides.ai.llm.version"), Some(&json!("1.2.0")));
        assert_eq!(lookup(&d, "provides.ai.x"), Some(&json!(1)));
    }

    #[test]
    fn digit_keys_in_objects_are_keys() {
        let d = json!({"loadavg": {"1min": 0.5}, "m": {"0": "zero"}});
        assert_eq!(lookup(&d, "loadavg.1min"), Some(&json!(0.5)));
        assert_eq!(lookup(&d, "m.0"), Some(&json!("zero")));
    }

    #[test]
    fn conventional_fields() {
        let d = json!({
            "os": "linux", "arch": "x86_64", "hostname": "h", "tags": ["a", 3, "b"],
            "software": {"node": {"version": "20.1.0"}}, "memory": {"total": 16384},
            "max_concurrent_tasks": 4,
            "provides": {"ai.llm": {"version": "1.0.0", "healthy": false, "reason": "missing parameter API_KEY"}}
        });
        let c = CapabilityDocument(&d);
        assert_eq!(c.os(), Some("linux"));
        assert_eq!(c.arch(), Some("x86_64"));
        assert_eq!(c.hostname(), Some("h"));
        assert_eq!(c.tags().collect::<Vec<_>>(), vec!["a", "b"]);
        assert!(c.has_tag("b") && !c.has_tag("3"));
        assert_eq!(c.taints().count(), 0);
        let tainted = json!({"taints": ["gpu", 3, "licensed"]});
        let t = CapabilityDocument(&tainted);
        assert_eq!(t.taints().collect::<Vec<_>>(), vec!["gpu", "licensed"]);
        let one = json!({"taints": "gpu"});
        assert_eq!(
            CapabilityDocument(&one).taints().collect::<Vec<_>>(),
            vec!["gpu"]
        );
        assert_eq!(c.software_version("node"), Some("20.1.0"));
        assert_eq!(c.memory_total(), Some(16384.0));
        assert_eq!(c.max_concurrent_tasks(), Some(4));
        let p = c.provided("ai.llm").unwrap();
        assert!(!p.healthy);
        assert_eq!(p.reason, Some("missing parameter API_KEY"));
        assert_eq!(c.get("provides.ai.llm.version"), Some(&json!("1.0.0")));
    }

    #[test]
    fn software_entry_parses_leniently() {
        assert_eq!(
            software_entry("v18.2"),
            json!({"version": "v18.2", "major_version": 18, "minor_version": 2, "patch_version": 0})
        );
        assert_eq!(software_entry("unknown"), json!({"version": "unknown"}));
    }
}
