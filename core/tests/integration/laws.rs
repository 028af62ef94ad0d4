//! Property-based laws: tier merges equal a fold of single-tier merges and agree with RFC 7386;
//! `apply(a, diff(a, b)) == b`; redaction is idempotent and leaves no sensitive value; ranking
//! is deterministic, never returns an agent failing a hard constraint (taints included), and the
//! index picks the matcher's first choice under either placement policy; resources granted one
//! task after another are never handed out twice.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use switchyard_core::diff;
use switchyard_core::index::AgentIndex;
use switchyard_core::kinds::HandledKinds;
use switchyard_core::limits::Limits;
use switchyard_core::matcher::{self, AgentId, AgentStatus, AgentView};
use switchyard_core::placement::{PlacementPolicy, compile};
use switchyard_core::redact;
use switchyard_core::resources;
use switchyard_core::selector;
use switchyard_core::tier::{Merged, Tier, merge_tiers};

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("os".to_owned()),
        Just("memory".to_owned()),
        Just("tags".to_owned()),
        Just("token".to_owned()),
        Just("apiKey".to_owned()),
        Just("max_tokens".to_owned()),
        Just("a/b".to_owned()),
        Just("m~n".to_owned()),
        "[a-z]{1,3}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-1000i64..1000).prop_map(|n| json!(n)),
        (-10.0f64..10.0).prop_map(|f| json!(f)),
        "[a-z0-9.]{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn object() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(key(), json_value(), 0..6)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// Removes nulls the way RFC 7386 does when a patch value is stored.
fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn has_sensitive_value(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, v)| {
            (redact::is_sensitive_key(k) && !v.is_null() && v != &json!(redact::MARKER))
                || has_sensitive_value(v)
        }),
        Value::Array(items) => items.iter().any(has_sensitive_value),
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn merging_tiers_equals_folding_single_merges(tiers in prop::collection::vec(object(), 0..5)) {
        let tagged: Vec<(Tier, Value)> = tiers.iter().cloned().zip(Tier::ALL).map(|(v, t)| (t, v)).collect();
        let limits = Limits::default();
        let all = merge_tiers(&tagged, &limits);
        let mut folded = Merged::default();
        for (t, v) in &tagged {
            folded.apply(*t, v, &limits);
        }
        prop_assert_eq!(&all, &folded);
        // Within the limits, the document is the RFC 7386 merge.
        let mut reference = json!({});
        for (_, v) in &tagged {
            json_patch::merge(&mut reference, v);
        }
        prop_assert_eq!(&all.document, &strip_nulls(&reference));
        prop_assert!(all.rejections.is_empty());
        // Provenance covers exactly the leaves.
        let mut leaves = BTreeSet::new();
        fn walk(v: &Value, path: String, out: &mut BTreeSet<String>) {
            match v {
                Value::Object(m) if !m.is_empty() => {
                    for (k, c) in m {
                        walk(c, if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, out);
                    }
                }
                _ => { out.insert(path); }
            }
        }
        if let Value::Object(m) = &all.document {
            for (k, c) in m { walk(c, k.clone(), &mut leaves); }
        }
        let keys: BTreeSet<String> = all.provenance.keys().cloned().collect();
        prop_assert_eq!(keys, leaves);
    }

    #[test]
    fn merged_documents_never_exceed_the_size_limit(tiers in prop::collection::vec(object(), 0..5), max in 2usize..200) {
        let tagged: Vec<(Tier, Value)> = tiers.into_iter().zip(Tier::ALL).map(|(v, t)| (t, v)).collect();
        let limits = Limits { max_serialized_bytes: max, ..Limits::default() };
        let merged = merge_tiers(&tagged, &limits);
        prop_assert!(serde_json::to_string(&merged.document).unwrap().len() <= max);
        prop_assert!(merged.document.is_object());
    }

    #[test]
    fn applying_a_diff_gives_the_target(a in object(), b in object(), generation in any::<u64>()) {
        let patch = diff::diff(&a, &b);
        let limits = Limits::default();
        prop_assert_eq!(diff::apply(&a, generation, generation, &patch, &limits), Ok(b.clone()));
        if a == b {
            prop_assert!(patch.is_empty());
        }
    }

    #[test]
    fn redaction_is_idempotent_and_complete(doc in object()) {
        let mut once = doc.clone();
        let paths = redact::redact(&mut once, &BTreeSet::new());
        prop_assert!(!has_sensitive_value(&once));
        let mut twice = once.clone();
        prop_assert!(redact::redact(&mut twice, &BTreeSet::new()).is_empty());
        prop_assert_eq!(&once, &twice);
        prop_assert_eq!(paths.is_empty(), once == doc);
    }

    #[test]
    fn ranking_is_deterministic_sound_and_indexed(
        specs in prop::collection::vec(
            (prop::collection::btree_set(prop_oneof![Just("linux"), Just("docker"), Just("gpu")], 0..3),
             0u32..3, 0u32..4, prop::option::of(0u64..5), 0usize..4, 0u32..40, any::<bool>(),
             0usize..6),
            0..30),
        kind in prop_oneof![
            Just(None), Just(Some("exec")), Just(Some("build.rust")), Just(Some("build")),
            Just(Some("deploy.prod.eu")),
        ],
        rekind in prop::collection::vec(0usize..6, 0..6),
        policy in prop_oneof![
            Just(None), Just(Some(PlacementPolicy::Spread)), Just(Some(PlacementPolicy::Binpack)),
        ],
        tolerations in prop_oneof![
            Just(vec![]), Just(vec!["gpu"]), Just(vec!["lic"]), Just(vec!["gpu", "lic"]),
        ],
        sel in prop_oneof![
            Just("linux"), Just("linux, docker"), Just("!gpu"), Just("n>=20"), Just("n=7"),
            Just("linux, prefer 3: gpu"), Just("prefer 2: docker, prefer 1: n<10"), Just("v@^2"),
            Just("provides ai.llm@1"), Just("prefer 4: provides ai.llm@1, docker"), Just(""),
            Just("n<3, linux"), Just("m>=16"), Just("m>8, n<=30"), Just("s>=2"), Just("w<2"),
            // Narrowed by the values that satisfy them (the index's
            // satisfying postings): versions, `in` over scalars and arrays,
            // regular expressions, versions as ordering, booleans.
            Just("v@>=1.5"), Just("v@<1, linux"), Just("m@>=16"), Just("s@^2"),
            Just("w in (3, 1)"), Just("w in (2)"), Just("m in (8, 32), n>=10"), Just("v~^2\\."),
            Just("v>=\"2.5.0\""), Just("b in (true)"), Just("b in (false, null)"), Just("s<3"),
            Just("w@>=1"), Just("prefer 2: v@^3, linux"),
        ],
    ) {
        let agents: Vec<AgentView> = specs.iter().enumerate().map(|(i, (tags, cap, active, last, status, n, llm, k))| {
            // `m`: few distinct numbers; `s`: numbers as text, or absent;
            // `w`: an array for some agents, an object for others.
            let m = [4, 8, 16, 32][(*n % 4) as usize];
            let mut doc = json!({"tags": tags, "n": n, "v": format!("{}.{}.0", n % 4, n), "m": m});
            if n % 3 == 0 {
                doc["s"] = json!(format!("{}", n % 5));
            }
            doc["w"] = match n % 5 {
                0 => json!([1, 3]),
                1 => json!({"x": 1}),
                _ => json!(n % 4),
            };
            // `b`: a boolean, null, a string or absent.
            match n % 4 {
                0 => doc["b"] = json!(true),
                1 => doc["b"] = json!(false),
                2 => doc["b"] = Value::Null,
                _ if n % 8 == 3 => doc["b"] = json!("true"),
                _ => {}
            }
            // Taints: an array, a lone string, two, or none.
            match n % 7 {
                0 => doc["taints"] = json!(["gpu"]),
                1 => doc["taints"] = json!("gpu"),
                2 => doc["taints"] = json!(["gpu", "lic"]),
                3 => doc["taints"] = json!([]),
                _ => {}
            }
            if *llm {
                doc["provides"] = json!({"ai.llm": {"version": "1.0.0", "healthy": n % 3 != 0}});
            }
            AgentView {
                held: Default::default(),
                agent_id: AgentId::from_name(&format!("a{:02}", (i * 7) % 31)),
                namespace: if i % 9 == 8 { "other".into() } else { "default".into() },
                status: [AgentStatus::Ready, AgentStatus::Degraded, AgentStatus::Draining, AgentStatus::Offline][*status],
                capacity: *cap,
                active_leases: *active,
                last_granted_at_ms: *last,
                document: Arc::new(doc),
                kinds: Arc::new(kinds_of(*k)),
            }
        }).collect();
        // Agent ids must be unique for a meaningful ranking.
        let mut seen = BTreeSet::new();
        let agents: Vec<AgentView> = agents.into_iter().filter(|a| seen.insert(a.agent_id)).collect();
        let mut parsed = selector::parse(sel).unwrap();
        parsed.policy = policy;
        parsed.tolerations = tolerations.iter().map(|t| (*t).to_owned()).collect();
        let mut placement = compile(&parsed).unwrap();
        if let Some(kind) = kind {
            placement = placement.with_kind(kind);
        }
        // Some agents change their kinds after they were indexed.
        let mut index = AgentIndex::new();
        for a in &agents {
            index.upsert(a.clone());
        }
        let mut agents = agents;
        for (a, k) in agents.iter_mut().zip(&rekind) {
            a.kinds = Arc::new(kinds_of(*k));
            prop_assert!(index.set_kinds(a.agent_id, a.kinds.clone()));
        }
        let first = matcher::explain(&placement, "default", &agents);
        let mut reversed = agents.clone();
        reversed.reverse();
        let second = matcher::explain(&placement, "default", &reversed);
        prop_assert_eq!(&first.ranked, &second.ranked);
        prop_assert_eq!(&first.summary, &second.summary);
        for id in &first.ranked {
            let a = agents.iter().find(|a| &a.agent_id == id).unwrap();
            prop_assert!(placement.satisfied_by(&a.document));
            prop_assert!(placement.untolerated_taint(&a.document).is_none());
            prop_assert!(kind.is_none_or(|k| a.kinds.handles(k)));
            prop_assert!(a.status.takes_work() && a.active_leases < a.capacity && a.namespace == "default");
        }
        prop_assert_eq!(
            index.select_best(&placement, "default").map(|s| s.agent_id),
            first.ranked.first().cloned()
        );
        let default_agents: Vec<AgentView> =
            agents.iter().filter(|a| a.namespace == "default").cloned().collect();
        let parked = matches!(
            matcher::explain(&placement, "default", &default_agents).outcome,
            matcher::Outcome::Parked(_)
        );
        prop_assert_eq!(index.any_capable(&placement, "default"), !parked);
        // Leaving out the agents that refused the task is explaining it
        // with their refusals.
        let refused: std::collections::BTreeMap<AgentId, String> =
            first.ranked.iter().take(1).map(|id| (*id, "no handler".to_owned())).collect();
        let except: Vec<AgentId> = refused.keys().copied().collect();
        let without = matcher::explain_refused(&placement, "default", &default_agents, &refused);
        prop_assert_eq!(
            index.select_best_except(&placement, "default", &except).map(|s| s.agent_id),
            without.ranked.first().cloned()
        );
        prop_assert_eq!(
            index.any_capable_except(&placement, "default", &except),
            !matches!(without.outcome, matcher::Outcome::Parked(_))
        );
        // A retry avoids the agents earlier attempts failed on while
        // another capable agent exists: the matcher's first choice again.
        let failed: BTreeSet<AgentId> = first.ranked.iter().skip(1).take(2).copied()
            .chain(default_agents.iter().take(2).map(|a| a.agent_id))
            .collect();
        let failed_ids: Vec<AgentId> = failed.iter().copied().collect();
        let retry = matcher::explain_task(&placement, "default", &default_agents, &refused, &failed);
        prop_assert_eq!(
            index.select_retry(&placement, "default", &except, &failed_ids).map(|s| s.agent_id),
            retry.ranked.first().cloned()
        );
        for id in &retry.ranked {
            let others = retry.verdicts.iter().any(|v| {
                v.satisfies_placement() && v.status.takes_work() && !failed.contains(&v.agent_id)
            });
            prop_assert!(!others || !failed.contains(id));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Granting tasks with resource requests one after another, as the dispatcher does (select,
    /// assign, hold), with leases ending in between: no device is ever held by two leases of an
    /// agent, no amount beyond the offer, no slot beyond capacity; the index picks the matcher's
    /// first choice every time, and a task is parked exactly when no agent could ever take it.
    #[test]
    fn resources_are_never_handed_out_twice(
        fleet in prop::collection::vec((0usize..4, 1u32..4, 0u64..3, any::<bool>()), 1..8),
        steps in prop::collection::vec((0usize..8, 0u32..3, 0usize..3, any::<bool>(), 0usize..16), 1..40),
        policy in prop_oneof![Just(PlacementPolicy::Spread), Just(PlacementPolicy::Binpack)],
    ) {
        let mut index = AgentIndex::new();
        let mut offers = Vec::new();
        for (i, (gpus, capacity, cpus, big)) in fleet.iter().enumerate() {
            let devices: Vec<Value> = (0..*gpus).map(|g| json!({
                "index": g, "uuid": format!("GPU-{i}-{g}"),
                "model": if *big && g % 2 == 0 { "H100" } else { "T4" },
                "memory_mb": if *big && g % 2 == 0 { 81559 } else { 15360 },
            })).collect();
            let mut doc = json!({"tags": ["linux"], "resources": {
                "cpu_millicores": cpus * 2000, "memory_mb": 8192, "gpus": devices,
                "licenses": {"matlab": i % 2},
            }});
            // Zones to spread over; some agents have none.
            if i % 4 != 3 {
                doc["zone"] = json!(["a", "b", "c"][i % 3]);
            }
            offers.push(doc.clone());
            index.upsert(AgentView {
                held: Default::default(),
                agent_id: AgentId::from_name(&format!("a{i}")),
                namespace: "default".into(),
                status: AgentStatus::Ready,
                capacity: *capacity,
                active_leases: 0,
                last_granted_at_ms: None,
                document: Arc::new(doc),
                kinds: Arc::new(HandledKinds::every()),
            });
        }
        let ids: Vec<AgentId> = (0..fleet.len()).map(|i| AgentId::from_name(&format!("a{i}"))).collect();
        let mut live: Vec<(AgentId, uuid::Uuid)> = Vec::new();
        for (n, (shape, gpus, amount, filtered, release)) in steps.iter().enumerate() {
            // Now and then a lease ends first.
            if *release < live.len() && n % 3 == 0 {
                let (agent, task) = live.remove(*release);
                prop_assert!(index.release(agent, task));
            }
            let text = match shape {
                0 => format!("needs gpus: {gpus}"),
                1 => format!("needs gpus: {} (memory_mb>=40000)", gpus + 1),
                2 => format!("needs cpu: {}", (amount + 1) * 1000),
                3 => format!("needs memory: {}", (amount + 1) * 3000),
                4 => format!("needs licenses.matlab: 1, needs slots: {}", gpus + 1),
                6 => "spread by zone".to_owned(),
                7 => format!("spread by zone, needs gpus: {gpus}, prefer 2: zone=b"),
                _ => "linux".to_owned(),
            };
            let mut parsed = selector::parse(&text).unwrap();
            if *filtered {
                parsed.merge(selector::parse("needs gpus: 1 (model~H)").unwrap());
            }
            parsed.policy = Some(policy);
            let placement = compile(&parsed).unwrap();
            let views: Vec<AgentView> = ids.iter().map(|id| index.get(*id).unwrap().clone()).collect();
            let explained = matcher::explain(&placement, "default", &views);
            let selected = index.select_best(&placement, "default").map(|s| s.agent_id);
            prop_assert_eq!(selected, explained.ranked.first().copied(), "{}", text);
            let never = views.iter().all(|v| placement.never_fits(&v.document, v.capacity).is_some());
            prop_assert_eq!(matches!(explained.outcome, matcher::Outcome::Parked(_)), never);
            prop_assert_eq!(index.any_capable(&placement, "default"), !never);
            if let Some(agent) = selected {
                let v = index.get(agent).unwrap();
                let claim = placement.assign(&v.document, v.capacity, v.active_leases, &v.held).unwrap();
                let task = uuid::Uuid::from_u128(n as u128 + 1);
                prop_assert!(index.hold(agent, task, claim, Some(n as u64)));
                live.push((agent, task));
            }
            for (i, id) in ids.iter().enumerate() {
                let v = index.get(*id).unwrap();
                let offer = resources::Offer::of(&offers[i]);
                prop_assert!(v.active_leases <= v.capacity);
                let mut gpus = BTreeSet::new();
                let (mut cpu, mut memory, mut matlab) = (0, 0, 0);
                for (agent, task) in &live {
                    if agent != id {
                        continue;
                    }
                    if let Some(c) = v.held.claim(*task) {
                        for g in &c.gpus {
                            prop_assert!(gpus.insert(g.clone()), "{} held twice", g);
                            prop_assert!(offer.gpus.iter().any(|d| d.id == g.as_str()));
                        }
                        cpu += c.cpu_millicores;
                        memory += c.memory_mb;
                        matlab += c.named.get("licenses.matlab").copied().unwrap_or(0);
                    }
                }
                prop_assert!(cpu <= offer.cpu_millicores.unwrap_or(0));
                prop_assert!(memory <= offer.memory_mb.unwrap_or(0));
                prop_assert!(matlab <= offer.named.get("licenses.matlab").copied().unwrap_or(0));
            }
        }
    }
}

/// A few kinds an agent may advertise.
fn kinds_of(k: usize) -> HandledKinds {
    let patterns: &[&str] = match k {
        0 => &["*"],
        1 => &[],
        2 => &["exec"],
        3 => &["build.*"],
        4 => &["exec", "build.rust"],
        _ => &["deploy.*", "build"],
    };
    HandledKinds::parse(patterns).expect("valid patterns")
}
