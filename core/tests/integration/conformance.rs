//! Runs every case of every file in `tests/conformance/` against the core.

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use switchyard_core::diff;
use switchyard_core::error::DiffError;
use switchyard_core::kinds::HandledKinds;
use switchyard_core::limits::Limits;
use switchyard_core::matcher::{self, AgentId, AgentStatus, AgentView, Outcome};
use switchyard_core::pack::{self, Pack};
use switchyard_core::placement::{self, Placement};
use switchyard_core::redact;
use switchyard_core::resources::{Claim, Held};
use switchyard_core::selector;
use switchyard_core::tier::{Tier, merge_tiers};

fn cases(file: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/conformance")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let cases: Vec<Value> =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {file}: {e}"));
    assert!(!cases.is_empty(), "{file} has no cases");
    cases
}

fn name(case: &Value) -> &str {
    case["name"].as_str().expect("every case has a name")
}

fn limits(case: &Value) -> Limits {
    case.get("limits")
        .map(|l| serde_json::from_value(l.clone()).expect("limits"))
        .unwrap_or_default()
}

#[test]
fn every_vector_file_is_covered() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".json"))
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            // detect.json is the runners' detection (agent-rs/src/detect.rs
            // and the Python and Node runners' tests).
            "detect.json",
            "diff.json",
            "kinds.json",
            "merge.json",
            // naming.json is the runners' default agent name
            // (agent-rs/src/identity.rs and the Python and Node runners'
            // tests).
            "naming.json",
            // numbers.json is how numbers travel in a Struct
            // (proto/src/convert.rs and the Python and Node runners' tests).
            "numbers.json",
            // output.json is a task's output as every runner sends it
            // (tests/crosslang/test_same_output.py, against a real server).
            "output.json",
            "packs.json",
            "placement.json",
            "redaction.json",
            "selector.json"
        ]
    );
}

#[test]
fn merge_vectors() {
    for case in cases("merge.json") {
        let tiers: Vec<(Tier, Value)> = case["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["tier"].as_str().unwrap().parse().unwrap(),
                    t["value"].clone(),
                )
            })
            .collect();
        let merged = merge_tiers(&tiers, &limits(&case));
        let expected = &case["expected"];
        assert_eq!(
            merged.document,
            expected["document"],
            "{}: document",
            name(&case)
        );
        let provenance: BTreeMap<String, String> = merged
            .provenance
            .iter()
            .map(|(p, t)| (p.clone(), t.as_str().to_owned()))
            .collect();
        let want: BTreeMap<String, String> =
            serde_json::from_value(expected["provenance"].clone()).unwrap();
        assert_eq!(provenance, want, "{}: provenance", name(&case));
        let rejections: Vec<Value> = merged
            .rejections
            .iter()
            .map(|r| json!({"tier": r.tier.map(Tier::as_str), "path": r.path}))
            .collect();
        assert_eq!(
            Value::Array(rejections),
            expected["rejections"],
            "{}: rejections",
            name(&case)
        );
        assert!(merged.rejections.iter().all(|r| !r.reason.is_empty()));
    }
}

#[test]
fn diff_vectors() {
    for case in cases("diff.json") {
        match case["kind"].as_str().unwrap() {
            "round_trip" => {
                let (a, b) = (&case["a"], &case["b"]);
                let patch = diff::diff(a, b);
                let after = diff::apply(a, 1, 1, &patch, &Limits::default());
                assert_eq!(after.as_ref(), Ok(b), "{}", name(&case));
                if a == b {
                    assert!(patch.0.is_empty(), "{}", name(&case));
                }
            }
            "apply" => {
                let patch: diff::Patch = serde_json::from_value(case["patch"].clone()).unwrap();
                let result = diff::apply(
                    &case["base"],
                    case["held_generation"].as_u64().unwrap(),
                    case["base_generation"].as_u64().unwrap(),
                    &patch,
                    &limits(&case),
                );
                match (case.get("expected"), case["error"].as_str(), result) {
                    (Some(expected), None, Ok(doc)) => {
                        assert_eq!(&doc, expected, "{}", name(&case))
                    }
                    (None, Some(kind), Err(err)) => {
                        let got = match &err {
                            DiffError::WrongGeneration { .. } => "wrong_generation",
                            DiffError::OperationFailed { index, .. } => {
                                assert_eq!(
                                    Some(*index as u64),
                                    case["error_index"].as_u64(),
                                    "{}",
                                    name(&case)
                                );
                                "operation_failed"
                            }
                            DiffError::OverLimits { .. } => "over_limits",
                            DiffError::NotAnObject { .. } => "not_an_object",
                        };
                        assert_eq!(got, kind, "{}: {err}", name(&case));
                    }
                    (_, _, other) => panic!("{}: unexpected {other:?}", name(&case)),
                }
            }
            other => panic!("unknown diff case kind {other}"),
        }
    }
}

#[test]
fn redaction_vectors() {
    for case in cases("redaction.json") {
        if let Some(texts) = case.get("texts") {
            for t in texts.as_array().unwrap() {
                let (text, want) = (t["text"].as_str().unwrap(), t["expected"].as_str().unwrap());
                let got = switchyard_core::secrets::redact_text(text);
                assert_eq!(got, want, "{}: {text:?}", name(&case));
                assert_eq!(
                    switchyard_core::secrets::redact_text(&got),
                    got,
                    "{}: idempotent",
                    name(&case)
                );
            }
            continue;
        }
        let extra: BTreeSet<String> = case
            .get("sensitive")
            .map(|s| redact::declared_sensitive(&json!({"sensitive": s})))
            .unwrap_or_default();
        let mut doc = case["document"].clone();
        let mut paths = redact::redact(&mut doc, &extra);
        paths.sort();
        assert_eq!(doc, case["expected"], "{}", name(&case));
        let mut want: Vec<String> = serde_json::from_value(case["redacted_paths"].clone()).unwrap();
        want.sort();
        assert_eq!(paths, want, "{}", name(&case));
        assert!(
            redact::redact(&mut doc, &extra).is_empty(),
            "{}: idempotent",
            name(&case)
        );
    }
}

#[test]
fn selector_vectors() {
    for case in cases("selector.json") {
        let parsed = selector::parse(case["selector"].as_str().unwrap());
        match (case.get("placement"), case.get("error"), parsed) {
            (Some(want), None, Ok(p)) => {
                let want: Placement = serde_json::from_value(want.clone()).unwrap();
                assert_eq!(p, want, "{}", name(&case));
            }
            (None, Some(want), Err(e)) => {
                assert_eq!(
                    Some(e.offset as u64),
                    want["offset"].as_u64(),
                    "{}: {e}",
                    name(&case)
                );
                let prefix = want["expected"].as_str().unwrap();
                assert!(
                    e.expected.starts_with(prefix),
                    "{}: expected {prefix:?}, got {e}",
                    name(&case)
                );
            }
            (_, _, other) => panic!("{}: unexpected {other:?}", name(&case)),
        }
    }
}

fn agent(v: &Value) -> AgentView {
    AgentView {
        // The vectors name agents; an id made of the name sorts as it does.
        agent_id: AgentId::from_name(v["agent_id"].as_str().expect("agent_id")),
        namespace: v["namespace"].as_str().unwrap_or("default").to_owned(),
        status: v["status"]
            .as_str()
            .unwrap_or("READY")
            .parse::<AgentStatus>()
            .expect("status"),
        capacity: v["capacity"].as_u64().unwrap_or(4) as u32,
        active_leases: v["active_leases"].as_u64().unwrap_or(0) as u32,
        last_granted_at_ms: v["last_granted_at_ms"].as_u64(),
        document: Arc::new(v["document"].clone()),
        held: Arc::new(Held::of(
            v.get("held")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(i, claim)| {
                    let claim: Claim = serde_json::from_value(claim.clone()).expect("a claim");
                    (uuid::Uuid::from_u128(i as u128 + 1), claim)
                }),
        )),
        kinds: Arc::new(match v.get("kinds") {
            Some(kinds) => {
                let patterns: Vec<String> = serde_json::from_value(kinds.clone()).expect("kinds");
                HandledKinds::parse(&patterns).expect("valid kinds")
            }
            None => HandledKinds::every(),
        }),
    }
}

#[test]
fn placement_vectors() {
    for case in cases("placement.json") {
        let mut p: Placement = case
            .get("placement")
            .map(|p| serde_json::from_value(p.clone()).unwrap())
            .unwrap_or_default();
        if let Some(sel) = case["selector"].as_str() {
            p.merge(selector::parse(sel).unwrap());
        }
        let compiled = placement::compile(&p).map(|c| match case["kind"].as_str() {
            Some(kind) => c.with_kind(kind),
            None => c,
        });
        if let Some(field) = case["compile_error"].as_str() {
            assert_eq!(
                compiled.map(|_| ()).unwrap_err().field,
                field,
                "{}",
                name(&case)
            );
            continue;
        }
        let compiled = compiled.unwrap_or_else(|e| panic!("{}: {e}", name(&case)));
        let agents: Vec<AgentView> = case["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(agent)
            .collect();
        let namespace = case["namespace"].as_str().unwrap_or("default");
        let e = matcher::explain(&compiled, namespace, &agents);
        let names: BTreeMap<AgentId, &str> = case["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let n = a["agent_id"].as_str().unwrap();
                (AgentId::from_name(n), n)
            })
            .collect();
        let want = &case["expected"];
        let ranked: Vec<&str> = e.ranked.iter().map(|id| names[id]).collect();
        assert_eq!(json!(ranked), want["ranked"], "{}: ranked", name(&case));
        assert_eq!(
            e.summary,
            want["summary"].as_str().unwrap(),
            "{}: summary",
            name(&case)
        );
        let (outcome, parked) = match e.outcome {
            Outcome::Placeable => ("placeable", None),
            Outcome::WaitingForCapacity => ("waiting_for_capacity", None),
            Outcome::Parked(r) => ("parked", Some(serde_json::to_value(r).unwrap())),
        };
        assert_eq!(
            outcome,
            want["outcome"].as_str().unwrap(),
            "{}: outcome",
            name(&case)
        );
        assert_eq!(
            parked.as_ref(),
            want.get("parked_reason"),
            "{}: parked reason",
            name(&case)
        );
        for (id, reason) in want["reasons"].as_object().unwrap() {
            let v = e
                .verdicts
                .iter()
                .find(|v| v.agent_id == AgentId::from_name(id))
                .unwrap();
            assert_eq!(
                &v.reason_text(),
                reason.as_str().unwrap(),
                "{}: reason of {id}",
                name(&case)
            );
        }
        let capable: Vec<&str> = e
            .verdicts
            .iter()
            .filter(|v| v.capable)
            .map(|v| names[&v.agent_id])
            .collect();
        assert_eq!(json!(capable), want["capable"], "{}: capable", name(&case));
    }
}

#[test]
fn kinds_vectors() {
    for case in cases("kinds.json") {
        let packs: Vec<Pack> = serde_json::from_value(case["packs"].clone()).unwrap();
        let advertised = pack::advertise(&pack::merge_packs(&packs), &case["document"]);
        let want = &case["expected"];
        assert_eq!(json!(advertised.kinds), want["kinds"], "{}", name(&case));
        let withdrawn: Vec<Value> = advertised
            .withdrawn
            .iter()
            .map(|w| json!({"kind": w.kind, "capability": w.capability, "problem": w.problem, "reason": w.reason()}))
            .collect();
        assert_eq!(
            Value::Array(withdrawn),
            want["withdrawn"],
            "{}",
            name(&case)
        );
    }
}

#[test]
fn pack_vectors() {
    for case in cases("packs.json") {
        let packs: Vec<Pack> = serde_json::from_value(case["packs"].clone()).unwrap();
        let merged = pack::merge_packs(&packs);
        let want = &case["expected"];
        assert_eq!(json!(merged.packs), want["packs"], "{}", name(&case));
        assert_eq!(json!(merged.handlers), want["handlers"], "{}", name(&case));
        let provided_by: BTreeMap<&str, &str> = merged
            .provides
            .iter()
            .map(|(k, v)| (k.as_str(), v.pack.as_str()))
            .collect();
        assert_eq!(json!(provided_by), want["provided_by"], "{}", name(&case));
        let rejections: Vec<Value> = merged
            .rejections
            .iter()
            .map(|r| json!({"pack": r.pack, "kind": r.kind, "id": r.id}))
            .collect();
        assert_eq!(
            Value::Array(rejections),
            want["rejections"],
            "{}",
            name(&case)
        );
        let params: BTreeMap<String, String> =
            serde_json::from_value(case["params"].clone()).unwrap();
        let lookup = |k: &str| params.get(k).cloned();
        let provides = pack::resolve_params(&merged, &lookup);
        assert_eq!(provides, want["provides"], "{}", name(&case));
        let text = provides.to_string();
        for value in params.values().filter(|v| !v.is_empty()) {
            assert!(
                !text.contains(value.as_str()),
                "{}: parameter value leaked",
                name(&case)
            );
        }
    }
}
