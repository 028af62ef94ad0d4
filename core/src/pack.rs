//! Handler packs: how a runner (the Rust agent, the Python runner, the Node runner) combines the
//! task handlers and named capabilities that packs contribute. [`merge_packs`] is a pure,
//! deterministic fold in which the first registration wins: pack ids are claimed first and a
//! later duplicate pack id is rejected atomically (it contributes nothing anywhere, and later
//! unique packs still apply); a handler kind or capability name already claimed is dropped and
//! reported in the rejection channel; nothing panics. [`resolve_params`] then turns the merged
//! capabilities into the document's `provides` subtree: `{name: {version, healthy, reason}}`,
//! where a required parameter (no default) that the lookup does not supply — or supplies as an
//! empty string — makes that capability `healthy: false` with `reason: "missing parameter X"`.
//! Parameter values, sensitive or not, never enter the document. A pack may require capabilities
//! (`requires: ["ai.llm@1"]`); [`advertise`] withdraws its kinds while one of them is missing or
//! unhealthy in the agent's document, and says why (the agent reports DEGRADED with the reasons).

use crate::version;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// A declared configuration parameter of a capability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Param {
    /// What the parameter is for.
    #[serde(default)]
    pub description: String,
    /// The default; `None` (absent or `null`) makes the parameter required.
    #[serde(default)]
    pub default: Option<Value>,
    /// Whether the value is a secret (injected from a vault, never logged).
    #[serde(default)]
    pub sensitive: bool,
}

/// A named capability a pack provides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidedCapability {
    /// Its version, e.g. `1.4.0`; the major version is what capability refs match.
    pub version: String,
    /// Its parameters by name (e.g. `API_KEY`).
    #[serde(default)]
    pub params: BTreeMap<String, Param>,
}

/// A unit of handlers and capabilities a runner loads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pack {
    /// Unique pack id.
    pub id: String,
    /// Task kinds the pack handles.
    #[serde(default)]
    pub handlers: Vec<String>,
    /// Capabilities the pack provides, by dotted name.
    #[serde(default)]
    pub provides: BTreeMap<String, ProvidedCapability>,
    /// Capabilities its handlers need (`ai.llm@1`, or a name alone for any version): while one is
    /// missing or unhealthy in the agent's document, the pack's kinds are withdrawn from what
    /// the agent advertises (see [`advertise`]).
    #[serde(default)]
    pub requires: Vec<String>,
}

/// What kind of pack contribution a rejection is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PackItemKind {
    /// The whole pack.
    Pack,
    /// One handler kind.
    Handler,
    /// One provided capability.
    Capability,
}

/// A pack contribution that was not merged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackRejection {
    /// The contributing pack.
    pub pack: String,
    /// What kind of contribution.
    pub kind: PackItemKind,
    /// The pack id, handler kind or capability name.
    pub id: String,
    /// Why, for people.
    pub reason: String,
}

/// A capability in the merged set, with the pack that contributed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimedCapability {
    /// The pack that registered it first.
    pub pack: String,
    /// The capability.
    #[serde(flatten)]
    pub capability: ProvidedCapability,
}

/// The result of [`merge_packs`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MergedPacks {
    /// Accepted pack ids, in order.
    pub packs: Vec<String>,
    /// Task kind → the pack that handles it.
    pub handlers: BTreeMap<String, String>,
    /// Capability name → what provides it.
    pub provides: BTreeMap<String, ClaimedCapability>,
    /// Task kind → the capabilities its pack requires (kinds whose pack requires none are absent).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requires: BTreeMap<String, Vec<String>>,
    /// What was not merged, in order.
    pub rejections: Vec<PackRejection>,
}

fn valid_dotted_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|seg| {
            !seg.is_empty()
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// Merges packs in order; see the module doc.
pub fn merge_packs(packs: &[Pack]) -> MergedPacks {
    let mut merged = MergedPacks::default();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for pack in packs {
        let reject = |kind, id: &str, reason: String| PackRejection {
            pack: pack.id.clone(),
            kind,
            id: id.to_owned(),
            reason,
        };
        if pack.id.is_empty() {
            merged
                .rejections
                .push(reject(PackItemKind::Pack, "", "pack id is empty".into()));
            continue;
        }
        if !seen.insert(pack.id.as_str()) {
            merged.rejections.push(reject(
                PackItemKind::Pack,
                &pack.id,
                "duplicate pack id; the pack contributes nothing".into(),
            ));
            continue;
        }
        merged.packs.push(pack.id.clone());
        for kind in &pack.handlers {
            if let Err(err) = crate::kinds::check_kind(kind) {
                let reason = format!("handler kind {err}");
                merged
                    .rejections
                    .push(reject(PackItemKind::Handler, kind, reason));
            } else if let Some(owner) = merged.handlers.get(kind) {
                let reason = format!("already handled by pack {owner}");
                merged
                    .rejections
                    .push(reject(PackItemKind::Handler, kind, reason));
            } else {
                merged.handlers.insert(kind.clone(), pack.id.clone());
                if !pack.requires.is_empty() {
                    merged.requires.insert(kind.clone(), pack.requires.clone());
                }
            }
        }
        for (name, capability) in &pack.provides {
            if !valid_dotted_name(name) {
                let reason = format!("`{name}` is not a dotted name");
                merged
                    .rejections
                    .push(reject(PackItemKind::Capability, name, reason));
            } else if version::parse_lenient(&capability.version).is_none() {
                let reason = format!("version `{}` is not a version", capability.version);
                merged
                    .rejections
                    .push(reject(PackItemKind::Capability, name, reason));
            } else if let Some(owner) = merged.provides.get(name) {
                let reason = format!("already provided by pack {}", owner.pack);
                merged
                    .rejections
                    .push(reject(PackItemKind::Capability, name, reason));
            } else {
                merged.provides.insert(
                    name.clone(),
                    ClaimedCapability {
                        pack: pack.id.clone(),
                        capability: capability.clone(),
                    },
                );
            }
        }
    }
    merged
}

/// The `provides` subtree for the merged capabilities: `{name: {version, healthy, reason?}}`.
/// `lookup` answers a parameter's configured value by parameter name; only whether it answers
/// matters, and no value is copied into the result.
pub fn resolve_params(merged: &MergedPacks, lookup: &dyn Fn(&str) -> Option<String>) -> Value {
    let mut provides = Map::new();
    for (name, claimed) in &merged.provides {
        let missing: Vec<&str> = claimed
            .capability
            .params
            .iter()
            .filter(|(param, spec)| {
                spec.default.is_none() && lookup(param).is_none_or(|v| v.is_empty())
            })
            .map(|(param, _)| param.as_str())
            .collect();
        let mut entry = Map::new();
        entry.insert("version".into(), json!(claimed.capability.version));
        entry.insert("healthy".into(), json!(missing.is_empty()));
        match missing.as_slice() {
            [] => {}
            [one] => {
                entry.insert("reason".into(), json!(format!("missing parameter {one}")));
            }
            many => {
                entry.insert(
                    "reason".into(),
                    json!(format!("missing parameters {}", many.join(", "))),
                );
            }
        }
        provides.insert(name.clone(), Value::Object(entry));
    }
    Value::Object(provides)
}

/// A handler kind withdrawn from what the agent advertises, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Withdrawal {
    /// The kind.
    pub kind: String,
    /// The required capability that is not there, as the pack wrote it.
    pub capability: String,
    /// What is wrong with it: `not provided`, `unhealthy: missing parameter API_KEY`,
    /// `version 2.0.0, not major 1`, `not a capability ref (name@major)`.
    pub problem: String,
}

impl Withdrawal {
    /// The reason the agent reports with its DEGRADED status.
    pub fn reason(&self) -> String {
        format!(
            "handler {} withdrawn: needs {}, {}",
            self.kind, self.capability, self.problem
        )
    }
}

/// What an agent advertises: the kinds it handles now, and those withdrawn.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advertised {
    /// The kinds handled, sorted.
    pub kinds: Vec<String>,
    /// The kinds withdrawn because a required capability is missing or unhealthy, in kind order
    /// (a kind with several missing capabilities is listed once for each).
    pub withdrawn: Vec<Withdrawal>,
}

/// The kinds the merged packs handle given the agent's `document` (its `provides` subtree): a
/// kind whose pack requires a capability that is missing, unhealthy or of another major version
/// is withdrawn, and comes back when the capability does.
pub fn advertise(merged: &MergedPacks, document: &Value) -> Advertised {
    let mut out = Advertised::default();
    for kind in merged.handlers.keys() {
        let problems: Vec<Withdrawal> = merged
            .requires
            .get(kind)
            .into_iter()
            .flatten()
            .filter_map(|required| {
                requirement_problem(required, document).map(|problem| Withdrawal {
                    kind: kind.clone(),
                    capability: required.clone(),
                    problem,
                })
            })
            .collect();
        if problems.is_empty() {
            out.kinds.push(kind.clone());
        } else {
            out.withdrawn.extend(problems);
        }
    }
    out
}

/// Why a required capability (`name@major` or `name`) is not there, or `None` if it is.
fn requirement_problem(required: &str, document: &Value) -> Option<String> {
    let (name, major) = match required.split_once('@') {
        Some((name, major)) => match major.parse::<u64>() {
            Ok(major) => (name, Some(major)),
            Err(_) => return Some("not a capability ref (name@major)".to_owned()),
        },
        None => (required, None),
    };
    if !valid_dotted_name(name) {
        return Some("not a capability ref (name@major)".to_owned());
    }
    let Some(provided) = crate::document::CapabilityDocument(document).provided(name) else {
        return Some("not provided".to_owned());
    };
    if let Some(major) = major {
        let have = provided.version.as_deref();
        if have.and_then(version::parse_lenient).map(|v| v.major) != Some(major) {
            let have = have.unwrap_or("no version");
            return Some(format!("version {have}, not major {major}"));
        }
    }
    if !provided.healthy {
        return Some(match provided.reason {
            Some(reason) => format!("unhealthy: {reason}"),
            None => "unhealthy".to_owned(),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(v: Value) -> Pack {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn first_registration_wins_and_duplicates_are_atomic() {
        let packs = vec![
            pack(
                json!({"id": "core", "handlers": ["build", "test"], "provides": {"ai.llm": {"version": "1.0.0"}}}),
            ),
            pack(
                json!({"id": "extra", "handlers": ["test", "lint"], "provides": {"ai.llm": {"version": "2.0.0"}, "comm.gateway": {"version": "1.1"}}}),
            ),
            pack(
                json!({"id": "core", "handlers": ["deploy"], "provides": {"x.y": {"version": "1"}}}),
            ),
            pack(json!({"id": "late", "handlers": ["deploy"]})),
        ];
        let m = merge_packs(&packs);
        assert_eq!(m.packs, vec!["core", "extra", "late"]);
        assert_eq!(m.handlers.get("test").map(String::as_str), Some("core"));
        assert_eq!(m.handlers.get("lint").map(String::as_str), Some("extra"));
        assert_eq!(m.handlers.get("deploy").map(String::as_str), Some("late"));
        assert_eq!(m.provides["ai.llm"].pack, "core");
        assert!(!m.provides.contains_key("x.y"));
        let kinds: Vec<(PackItemKind, &str)> = m
            .rejections
            .iter()
            .map(|r| (r.kind, r.id.as_str()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (PackItemKind::Handler, "test"),
                (PackItemKind::Capability, "ai.llm"),
                (PackItemKind::Pack, "core"),
            ]
        );
    }

    #[test]
    fn invalid_contributions_are_rejected() {
        let m = merge_packs(&[
            pack(json!({"id": ""})),
            pack(
                json!({"id": "p", "handlers": [""], "provides": {"bad..name": {"version": "1"}, "ok": {"version": "nope"}}}),
            ),
        ]);
        assert_eq!(m.packs, vec!["p"]);
        assert_eq!(m.rejections.len(), 4);
        assert!(m.provides.is_empty());
    }

    #[test]
    fn resolve_params_reports_health_never_values() {
        let m = merge_packs(&[pack(json!({"id": "p", "provides": {
            "ai.llm": {"version": "1.2.0", "params": {
                "API_URL": {"description": "endpoint", "default": "http://localhost:8080"},
                "API_KEY": {"description": "token", "default": null, "sensitive": true},
                "TIMEOUT": {"default": 30.0}}},
            "comm.gateway": {"version": "1.0.0", "params": {"SMTP_PASSWORD": {"default": "", "sensitive": true}}},
            "db.pg": {"version": "3.0.0", "params": {"DSN": {}, "USER": {}}}
        }}))]);
        let lookup = |name: &str| match name {
            "API_URL" => Some("https://secret-host".to_owned()),
            "USER" => Some(String::new()),
            _ => None,
        };
        let provides = resolve_params(&m, &lookup);
        assert_eq!(
            provides,
            json!({
                "ai.llm": {"version": "1.2.0", "healthy": false, "reason": "missing parameter API_KEY"},
                "comm.gateway": {"version": "1.0.0", "healthy": true},
                "db.pg": {"version": "3.0.0", "healthy": false, "reason": "missing parameters DSN, USER"}
            })
        );
        assert!(!provides.to_string().contains("secret-host"));
        let all = |_: &str| Some("v".to_owned());
        assert_eq!(resolve_params(&m, &all)["ai.llm"]["healthy"], json!(true));
    }
}
