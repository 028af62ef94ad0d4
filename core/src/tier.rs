//! The tier merge that builds an agent's capability document: base, then static, then dynamic,
//! then override on the agent, then the operator tier on the server. Objects merge deeply with
//! RFC 7386 semantics (a `null` deletes a key); arrays and scalars replace. The merge is pure and
//! total: a tier that is not an object, or a value over the [`Limits`], goes to the rejection list
//! (tier, path, reason) and the rest applies. It records provenance: for every leaf of the result
//! (a scalar, an array, or an empty object) the tier whose value is there.
//!
//! Rules for limits: a key that is too long, or a container nested too deep, is rejected at its
//! own path and its siblings still apply. Arrays replace as a unit, so a violation anywhere inside
//! an array rejects the whole array at the array's path. If a tier would make the whole document
//! exceed `max_serialized_bytes`, that whole tier is rejected (path `""`).

use crate::limits::{self, Limits, join, serialized_len};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One layer of a capability document, in merge order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Facts the agent detects about itself (os, arch, tool versions, memory, load).
    Base,
    /// `.capabilities.json`.
    Static,
    /// The output of `.capabilities.dynamic.*`.
    Dynamic,
    /// `.capabilities.override.json`.
    Override,
    /// Set by an operator; applied by the server over everything the agent reports.
    Operator,
}

impl Tier {
    /// Every tier in merge order.
    pub const ALL: [Tier; 5] = [
        Tier::Base,
        Tier::Static,
        Tier::Dynamic,
        Tier::Override,
        Tier::Operator,
    ];

    /// The stable lowercase name (`base`, `static`, `dynamic`, `override`, `operator`).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Base => "base",
            Tier::Static => "static",
            Tier::Dynamic => "dynamic",
            Tier::Override => "override",
            Tier::Operator => "operator",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name is not one of the five tiers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tier `{0}`")]
pub struct UnknownTier(pub String);

impl FromStr for Tier {
    type Err = UnknownTier;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tier::ALL
            .into_iter()
            .find(|t| {
                t.as_str().eq_ignore_ascii_case(s)
                    || s.eq_ignore_ascii_case(&format!("TIER_{}", t.as_str()))
            })
            .ok_or_else(|| UnknownTier(s.to_owned()))
    }
}

/// One part of a tier (or diff, or pack) that was not applied, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// The tier the value came from; `None` outside tier merges.
    pub tier: Option<Tier>,
    /// Dotted path of the rejected value; empty for the whole tier.
    pub path: String,
    /// Why, for people.
    pub reason: String,
}

/// The result of a tier merge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Merged {
    /// The merged document; always a JSON object.
    pub document: Value,
    /// For every leaf path of `document`, the tier that set it.
    pub provenance: BTreeMap<String, Tier>,
    /// What was not applied, in the order found.
    pub rejections: Vec<Rejection>,
}

impl Default for Merged {
    fn default() -> Self {
        Self {
            document: Value::Object(Map::new()),
            provenance: BTreeMap::new(),
            rejections: Vec::new(),
        }
    }
}

/// Merges `tiers` in the order given (callers pass them in [`Tier`] order) over an empty document.
pub fn merge_tiers(tiers: &[(Tier, Value)], limits: &Limits) -> Merged {
    let mut merged = Merged::default();
    for (tier, value) in tiers {
        merged.apply(*tier, value, limits);
    }
    merged
}

impl Merged {
    /// Merges one more tier on top. Equivalent to having passed it last to [`merge_tiers`].
    pub fn apply(&mut self, tier: Tier, value: &Value, limits: &Limits) {
        let Value::Object(patch) = value else {
            self.rejections.push(Rejection {
                tier: Some(tier),
                path: String::new(),
                reason: format!(
                    "tier is not a JSON object (it is {})",
                    crate::document::kind(value)
                ),
            });
            return;
        };
        // A merge's serialization is never longer than both inputs' together, so the snapshot
        // needed to undo an oversized tier is only taken when that bound exceeds the limit.
        let may_overflow =
            serialized_len(&self.document) + serialized_len(value) > limits.max_serialized_bytes;
        let before = may_overflow.then(|| (self.document.clone(), self.provenance.clone()));
        let mark = self.rejections.len();
        let mut doc = match std::mem::take(&mut self.document) {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        let mut ctx = MergeContext {
            tier,
            limits,
            provenance: &mut self.provenance,
            rejections: &mut self.rejections,
        };
        ctx.merge_object(&mut doc, patch, "", 1);
        self.document = Value::Object(doc);
        let Some(before) = before else {
            return;
        };
        let size = serialized_len(&self.document);
        if size > limits.max_serialized_bytes {
            (self.document, self.provenance) = before;
            self.rejections.truncate(mark);
            self.rejections.push(Rejection {
                tier: Some(tier),
                path: String::new(),
                reason: limits::size_reason(size, limits.max_serialized_bytes),
            });
        }
    }

    /// The provenance as `(path, tier)` pairs sorted by path, as `CapabilityView` carries it.
    pub fn provenance_entries(&self) -> impl Iterator<Item = (&str, Tier)> {
        self.provenance.iter().map(|(p, t)| (p.as_str(), *t))
    }
}

struct MergeContext<'a> {
    tier: Tier,
    limits: &'a Limits,
    provenance: &'a mut BTreeMap<String, Tier>,
    rejections: &'a mut Vec<Rejection>,
}

impl MergeContext<'_> {
    fn reject(&mut self, path: String, reason: String) {
        self.rejections.push(Rejection {
            tier: Some(self.tier),
            path,
            reason,
        });
    }

    /// Forgets the provenance of `path` and everything below it.
    fn forget(&mut self, path: &str) {
        self.provenance.remove(path);
        let lo = format!("{path}.");
        let hi = format!("{path}/"); // '/' is the byte after '.'
        let below: Vec<String> = self
            .provenance
            .range(lo..hi)
            .map(|(k, _)| k.clone())
            .collect();
        for k in below {
            self.provenance.remove(&k);
        }
    }

    /// Merges `patch` into `target`, an object at `path` whose container depth is `depth`.
    fn merge_object(
        &mut self,
        target: &mut Map<String, Value>,
        patch: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) {
        for (key, value) in patch {
            let child_path = join(path, key);
            if key.len() > self.limits.max_key_bytes {
                self.reject(
                    child_path,
                    limits::key_reason(key.len(), self.limits.max_key_bytes),
                );
                continue;
            }
            match value {
                Value::Null => {
                    if target.remove(key).is_some() {
                        self.forget(&child_path);
                    }
                }
                Value::Object(child_patch) => {
                    if depth + 1 > self.limits.max_depth {
                        self.reject(
                            child_path,
                            limits::depth_reason(depth + 1, self.limits.max_depth),
                        );
                        continue;
                    }
                    let existed_as_object = matches!(target.get(key), Some(Value::Object(_)));
                    if !existed_as_object
                        && target
                            .insert(key.clone(), Value::Object(Map::new()))
                            .is_some()
                    {
                        self.forget(&child_path);
                    }
                    let Some(Value::Object(child)) = target.get_mut(key) else {
                        continue;
                    };
                    let was_empty = child.is_empty();
                    self.merge_object(child, child_patch, &child_path, depth + 1);
                    if child.is_empty() {
                        // An empty object is a leaf. It keeps its provenance if it was already an
                        // empty object; otherwise this tier made it (created or emptied it).
                        if !(existed_as_object
                            && was_empty
                            && self.provenance.contains_key(&child_path))
                        {
                            self.provenance.insert(child_path, self.tier);
                        }
                    } else {
                        self.provenance.remove(&child_path);
                    }
                }
                leaf => {
                    let mut violations = Vec::new();
                    if !self.limits.structurally_within(leaf, depth + 1) {
                        self.limits.structural_violations(
                            leaf,
                            &child_path,
                            depth + 1,
                            &mut violations,
                        );
                    }
                    if let Some(first) = violations.into_iter().next() {
                        let reason = if first.path == child_path {
                            first.reason
                        } else {
                            format!("{}: {}", first.path, first.reason)
                        };
                        self.reject(child_path, reason);
                        continue;
                    }
                    if target.insert(key.clone(), leaf.clone()).is_some() {
                        self.forget(&child_path);
                    }
                    self.provenance.insert(child_path, self.tier);
                }
            }
        }
    }
}

/// The agent's own document with the operator tier merged over it (the
/// server's last tier), and the provenance of every leaf: the agent's own
/// (`agent_provenance`, path to tier name; a leaf it does not name counts
/// as dynamic) where the agent's value stands, `operator` where the
/// operator's does. Both are JSON, as the server stores them.
pub fn with_operator_tier(
    reported: &Value,
    agent_provenance: &Value,
    operator: &Value,
) -> (Value, Value) {
    let merged = merge_tiers(
        &[
            (Tier::Dynamic, reported.clone()),
            (Tier::Operator, operator.clone()),
        ],
        &Limits::default(),
    );
    let mut provenance = Map::new();
    for (path, tier) in merged.provenance_entries() {
        let name = if tier == Tier::Operator {
            Tier::Operator.as_str()
        } else {
            agent_provenance
                .get(path)
                .and_then(Value::as_str)
                .unwrap_or(Tier::Dynamic.as_str())
        };
        provenance.insert(path.to_owned(), Value::String(name.to_owned()));
    }
    (merged.document, Value::Object(provenance))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_tier_wins_and_is_named_in_the_provenance() {
        let reported = serde_json::json!({"os": "linux", "tags": ["a"], "cpus": 4});
        let provenance = serde_json::json!({"os": "base", "tags": "static"});
        let operator = serde_json::json!({"tags": ["a", "gpu"]});
        let (document, merged) = with_operator_tier(&reported, &provenance, &operator);
        assert_eq!(
            document,
            serde_json::json!({"os": "linux", "tags": ["a", "gpu"], "cpus": 4})
        );
        assert_eq!(
            merged,
            serde_json::json!({"os": "base", "tags": "operator", "cpus": "dynamic"})
        );
    }
    use serde_json::json;

    fn prov(m: &Merged) -> Vec<(String, Tier)> {
        m.provenance.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    #[test]
    fn tier_names_round_trip() {
        for t in Tier::ALL {
            assert_eq!(t.as_str().parse::<Tier>().unwrap(), t);
            assert_eq!(serde_json::to_value(t).unwrap(), json!(t.as_str()));
        }
        assert_eq!("TIER_STATIC".parse::<Tier>().unwrap(), Tier::Static);
        assert!("nope".parse::<Tier>().is_err());
    }

    #[test]
    fn deep_merge_null_deletes_arrays_replace() {
        let m = merge_tiers(
            &[
                (
                    Tier::Base,
                    json!({"os": "linux", "memory": {"total": 8, "free": 2}, "tags": ["a"]}),
                ),
                (
                    Tier::Static,
                    json!({"memory": {"free": null, "unit": "MB"}, "tags": ["b", "c"]}),
                ),
            ],
            &Limits::default(),
        );
        assert_eq!(
            m.document,
            json!({"os": "linux", "memory": {"total": 8, "unit": "MB"}, "tags": ["b", "c"]})
        );
        assert_eq!(
            prov(&m),
            vec![
                ("memory.total".into(), Tier::Base),
                ("memory.unit".into(), Tier::Static),
                ("os".into(), Tier::Base),
                ("tags".into(), Tier::Static),
            ]
        );
        assert!(m.rejections.is_empty());
    }

    #[test]
    fn scalar_replaced_by_object_and_back() {
        let m = merge_tiers(
            &[
                (Tier::Base, json!({"os": "linux"})),
                (
                    Tier::Dynamic,
                    json!({"os": {"release": {"version": "5.15"}}}),
                ),
                (Tier::Override, json!({"os": {"release": "x"}})),
            ],
            &Limits::default(),
        );
        assert_eq!(m.document, json!({"os": {"release": "x"}}));
        assert_eq!(prov(&m), vec![("os.release".into(), Tier::Override)]);
    }

    #[test]
    fn empty_objects_are_leaves() {
        let m = merge_tiers(
            &[
                (Tier::Base, json!({"a": {}, "b": {"c": 1}})),
                (Tier::Static, json!({"a": {}, "b": {"c": null}})),
            ],
            &Limits::default(),
        );
        assert_eq!(m.document, json!({"a": {}, "b": {}}));
        assert_eq!(
            prov(&m),
            vec![("a".into(), Tier::Base), ("b".into(), Tier::Static)]
        );
    }

    #[test]
    fn non_object_tier_is_rejected_rest_applies() {
        let m = merge_tiers(
            &[
                (Tier::Base, json!({"os": "linux"})),
                (Tier::Static, json!([1, 2])),
                (Tier::Dynamic, json!(null)),
                (Tier::Override, json!({"arch": "x86_64"})),
            ],
            &Limits::default(),
        );
        assert_eq!(m.document, json!({"os": "linux", "arch": "x86_64"}));
        assert_eq!(m.rejections.len(), 2);
        assert_eq!(m.rejections[0].tier, Some(Tier::Static));
        assert_eq!(m.rejections[0].path, "");
        assert!(m.rejections[0].reason.contains("not a JSON object"));
    }

    #[test]
    fn over_limit_values_are_rejected_at_their_path() {
        let limits = Limits {
            max_array_items: 2,
            max_key_bytes: 3,
            max_depth: 3,
            ..Limits::default()
        };
        let m = merge_tiers(
            &[(
                Tier::Static,
                json!({"ok": 1, "arr": [1, 2, 3], "long": 1, "a": {"b": {"c": {"d": 1}}, "x": 2}}),
            )],
            &limits,
        );
        assert_eq!(m.document, json!({"ok": 1, "a": {"b": {}, "x": 2}}));
        let paths: Vec<&str> = m.rejections.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(paths, vec!["a.b.c", "arr", "long"]);
        assert_eq!(m.rejections[1].reason, "array has 3 items, limit 2");
    }

    #[test]
    fn violation_inside_array_rejects_whole_array() {
        let limits = Limits {
            max_key_bytes: 4,
            ..Limits::default()
        };
        let m = merge_tiers(&[(Tier::Base, json!({"gpus": [{"model": "x"}]}))], &limits);
        assert_eq!(m.document, json!({}));
        assert_eq!(m.rejections[0].path, "gpus");
        assert!(
            m.rejections[0]
                .reason
                .starts_with("gpus.0.model: key is 5 bytes")
        );
    }

    #[test]
    fn tier_that_overflows_size_is_rejected_whole() {
        let limits = Limits {
            max_serialized_bytes: 40,
            ..Limits::default()
        };
        let m = merge_tiers(
            &[
                (Tier::Base, json!({"os": "linux"})),
                (Tier::Static, json!({"blob": "x".repeat(50), "arch": "arm"})),
            ],
            &limits,
        );
        assert_eq!(m.document, json!({"os": "linux"}));
        assert_eq!(prov(&m), vec![("os".into(), Tier::Base)]);
        assert_eq!(m.rejections.len(), 1);
        assert_eq!(m.rejections[0].tier, Some(Tier::Static));
        assert_eq!(m.rejections[0].path, "");
    }

    #[test]
    fn apply_equals_merge_tiers() {
        let tiers = [
            (Tier::Base, json!({"a": 1, "b": {"c": 2}})),
            (Tier::Static, json!({"b": {"d": 3}})),
            (Tier::Operator, json!({"a": null})),
        ];
        let all = merge_tiers(&tiers, &Limits::default());
        let mut step = Merged::default();
        for (t, v) in &tiers {
            step.apply(*t, v, &Limits::default());
        }
        assert_eq!(all, step);
        assert_eq!(all.document, json!({"b": {"c": 2, "d": 3}}));
    }
}
