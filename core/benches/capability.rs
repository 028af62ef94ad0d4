//! Criterion benchmarks for the core's hot paths: merging a SheetBot-shaped document's tiers,
//! diffing two generations where only memory and load average changed, the index's part of
//! the common heartbeat (those five numbers set in place among 10,000 agents), and selecting the best
//! agent among 1,000 and 10,000 indexed agents for a task of kind `exec` (the kind a hard
//! constraint, as the server compiles it; one placement of a kind only a third of the agents
//! handle), once on a fixed index and once as a server's picks rotate the rank order (plus a
//! full explanation for scale); the typical placement ranked by binpack, and an ordinary
//! placement among a fleet whose idle GPU tenth is tainted `gpu` (the taint's postings keep
//! those agents, first in the spread order, out of the walk).

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use std::hint::black_box;
use std::sync::Arc;
use switchyard_core::diff;
use switchyard_core::index::AgentIndex;
use switchyard_core::kinds::HandledKinds;
use switchyard_core::limits::Limits;
use switchyard_core::matcher::{self, AgentId, AgentStatus, AgentView};
use switchyard_core::placement::{PlacementPolicy, compile};
use switchyard_core::selector;
use switchyard_core::tier::{Tier, merge_tiers};

const FIXTURE: &str = include_str!("sheetbot_tiers.json");

fn tiers() -> Vec<(Tier, Value)> {
    let all: Value = serde_json::from_str(FIXTURE).expect("fixture parses");
    ["base", "static", "dynamic", "override"]
        .into_iter()
        .map(|t| (t.parse().expect("tier"), all[t].clone()))
        .collect()
}

fn document() -> Value {
    merge_tiers(&tiers(), &Limits::default()).document
}

/// A fleet of `n` agents derived from the SheetBot document, varied so that a typical placement
/// is satisfied by about a third of them and some are busy.
fn fleet(n: usize) -> Vec<AgentView> {
    let base = document();
    (0..n)
        .map(|i| {
            let mut doc = base.clone();
            let node = ["18.19.0", "20.11.1", "22.3.0"][i % 3];
            doc["software"]["node"] = switchyard_core::document::software_entry(node);
            doc["tags"] = if i % 4 == 0 {
                json!(["linux", "x86_64"])
            } else {
                json!(["linux", "docker", "x86_64"])
            };
            if i % 10 == 0 {
                doc["tags"].as_array_mut().expect("tags").push(json!("gpu"));
            }
            doc["memory"]["total"] = json!(8192 * (1 + i % 8));
            doc["memory"]["free"] = json!(1000 + i);
            doc["hostname"] = json!(format!("build-{i:05}"));
            AgentView {
                held: Default::default(),
                agent_id: AgentId::from_name(&format!("agent-{i:05}")),
                namespace: "default".into(),
                status: if i % 50 == 0 {
                    AgentStatus::Draining
                } else {
                    AgentStatus::Ready
                },
                capacity: 4,
                active_leases: (i % 5) as u32,
                last_granted_at_ms: Some(1_000_000 + (i as u64 * 7919) % 100_000),
                document: Arc::new(doc),
                kinds: Arc::new(kinds(i)),
            }
        })
        .collect()
}

/// What agent `i` handles: every agent handles `exec` (exactly, by `*`, or
/// beside a `build.*` pattern), a third also `build.*`.
fn kinds(i: usize) -> HandledKinds {
    let patterns: &[&str] = match i % 3 {
        0 => &["exec"],
        1 => &["exec", "build.*"],
        _ => &["*"],
    };
    HandledKinds::parse(patterns).expect("valid patterns")
}

fn bench_merge(c: &mut Criterion) {
    let tiers = tiers();
    let limits = Limits::default();
    c.bench_function("merge_sheetbot_tiers", |b| {
        b.iter(|| merge_tiers(black_box(&tiers), &limits))
    });
}

fn bench_diff(c: &mut Criterion) {
    let a = document();
    let mut b = a.clone();
    b["memory"]["free"] = json!(9800);
    b["memory"]["available"] = json!(18944);
    b["loadavg"] = json!({"1min": 2.5, "5min": 1.75, "15min": 1.02});
    let patch = diff::diff(&a, &b);
    let full = serde_json::to_string(&b).expect("serializes").len();
    eprintln!(
        "diff size: {} bytes of {} ({:.2}%)",
        diff::patch_len(&patch),
        full,
        100.0 * diff::patch_len(&patch) as f64 / full as f64
    );
    c.bench_function("diff_memory_loadavg", |bench| {
        bench.iter(|| diff::diff(black_box(&a), black_box(&b)))
    });
    let limits = Limits::default();
    c.bench_function("apply_memory_loadavg", |bench| {
        bench.iter(|| diff::apply(black_box(&a), 1, 1, black_box(&patch), &limits))
    });
}

/// The common heartbeat as the index sees it: five volatile numbers (free
/// and available memory, the three load averages) set in place in one
/// agent's document among 10,000 indexed agents, agents in turn, with
/// values that vary from beat to beat; with the SheetBot document's dotted
/// capability names (`ai.llm`) and without them.
fn bench_heartbeat(c: &mut Criterion) {
    for dotted in [false, true] {
        let mut agents = fleet(10_000);
        if !dotted {
            for a in &mut agents {
                Arc::make_mut(&mut a.document)
                    .as_object_mut()
                    .expect("an object")
                    .remove("provides");
            }
        }
        let mut index = AgentIndex::new();
        let mut held: Vec<Arc<Value>> = Vec::with_capacity(agents.len());
        for a in &agents {
            index.upsert(a.clone());
            held.push(a.document.clone());
        }
        let key = |path: &[&str]| path.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
        let (free, available) = (key(&["memory", "free"]), key(&["memory", "available"]));
        let loads = [
            key(&["loadavg", "1min"]),
            key(&["loadavg", "5min"]),
            key(&["loadavg", "15min"]),
        ];
        let mut beat = 0u64;
        let name = if dotted {
            "index_heartbeat_volatile_dotted_10000"
        } else {
            "index_heartbeat_volatile_10000"
        };
        c.bench_function(name, |b| {
            b.iter(|| {
                beat += 1;
                let i = (beat as usize * 7_919) % agents.len();
                let w = beat.wrapping_mul(40_503) % 1_000;
                let load = |f: f64| json!(((w as f64) * f).round() / 100.0);
                let leaves = [
                    (free.clone(), json!(1_000 + w)),
                    (available.clone(), json!(2_000 + w)),
                    (loads[0].clone(), load(0.4)),
                    (loads[1].clone(), load(0.32)),
                    (loads[2].clone(), load(0.24)),
                ];
                assert!(index.set_leaves(agents[i].agent_id, &mut held[i], black_box(&leaves)));
            })
        });
    }
}

/// A placement for a task of kind `exec`, as the server compiles it.
fn placement(text: &str) -> switchyard_core::placement::CompiledPlacement {
    compile(&selector::parse(text).expect("parses"))
        .expect("compiles")
        .with_kind("exec")
}

fn bench_select(c: &mut Criterion) {
    let typical = placement("linux, docker, software.node.version@^20, memory.total>=16384");
    let preferring = placement(
        "linux, docker, software.node.version@^20, prefer 5: gpu, prefer 1: memory.total>=32768",
    );
    let rare = placement("gpu, software.node.version@^22");
    // A kind a third of the agents handle (by their `build.*` pattern).
    let rare_kind = compile(&selector::parse("linux, docker").expect("parses"))
        .expect("compiles")
        .with_kind("build.rust");
    for n in [1_000usize, 10_000] {
        let agents = fleet(n);
        let mut index = AgentIndex::new();
        for a in &agents {
            index.upsert(a.clone());
        }
        let expected = matcher::explain(&typical, "default", &agents)
            .ranked
            .first()
            .cloned();
        assert_eq!(
            index.select_best(&typical, "default").map(|s| s.agent_id),
            expected
        );
        let expected = matcher::explain(&preferring, "default", &agents)
            .ranked
            .first()
            .cloned();
        assert_eq!(
            index
                .select_best(&preferring, "default")
                .map(|s| s.agent_id),
            expected
        );
        c.bench_function(&format!("select_best_typical_{n}"), |b| {
            b.iter(|| index.select_best(black_box(&typical), "default"))
        });
        c.bench_function(&format!("select_best_rare_{n}"), |b| {
            b.iter(|| index.select_best(black_box(&rare), "default"))
        });
        c.bench_function(&format!("select_best_with_preferences_{n}"), |b| {
            b.iter(|| index.select_best(black_box(&preferring), "default"))
        });
        let expected = matcher::explain(&rare_kind, "default", &agents)
            .ranked
            .first()
            .cloned();
        assert_eq!(
            index.select_best(&rare_kind, "default").map(|s| s.agent_id),
            expected
        );
        c.bench_function(&format!("select_best_rare_kind_{n}"), |b| {
            b.iter(|| index.select_best(black_box(&rare_kind), "default"))
        });
        // A server's steady state: every pick is granted and at once
        // released, so the picked agent moves to the back of the rank order,
        // and the agents the placements rarely want gather at the front.
        // Each iteration is one selection (placements in turn) plus the two
        // load updates of the grant and the release.
        let rotating: Vec<_> = [
            "linux, docker, software.node.version@^20",
            "linux",
            "memory.total>=32768",
            "gpu, software.node.version@>=20",
            "software.node.version@^18, prefer 2: docker",
        ]
        .into_iter()
        .map(placement)
        .collect();
        let mut turn = 0usize;
        let mut now = 2_000_000u64;
        c.bench_function(&format!("select_best_rotating_{n}"), |b| {
            b.iter(|| {
                turn += 1;
                let placement = &rotating[turn % rotating.len()];
                if let Some(s) = index.select_best(black_box(placement), "default") {
                    now += 1;
                    let active = index.get(s.agent_id).map_or(0, |v| v.active_leases);
                    index.update_load(s.agent_id, active + 1, Some(now));
                    index.update_load(s.agent_id, active, Some(now));
                }
            })
        });
        let mut binpack =
            selector::parse("linux, docker, software.node.version@^20, memory.total>=16384")
                .expect("parses");
        binpack.policy = Some(PlacementPolicy::Binpack);
        let binpack = compile(&binpack).expect("compiles").with_kind("exec");
        let expected = matcher::explain(&binpack, "default", &agents)
            .ranked
            .first()
            .cloned();
        assert_eq!(
            index.select_best(&binpack, "default").map(|s| s.agent_id),
            expected
        );
        c.bench_function(&format!("select_best_binpack_{n}"), |b| {
            b.iter(|| index.select_best(black_box(&binpack), "default"))
        });
        // The GPU tenth tainted and idle: first in the spread order, never
        // taken by ordinary work.
        let mut tainted = AgentIndex::new();
        let pool: Vec<AgentView> = agents
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let mut a = a.clone();
                if i % 10 == 0 {
                    let mut doc = (*a.document).clone();
                    doc["taints"] = json!(["gpu"]);
                    a.document = Arc::new(doc);
                    a.active_leases = 0;
                    a.last_granted_at_ms = None;
                }
                a
            })
            .collect();
        for a in &pool {
            tainted.upsert(a.clone());
        }
        let ordinary = placement("linux, docker");
        let expected = matcher::explain(&ordinary, "default", &pool)
            .ranked
            .first()
            .cloned();
        assert_eq!(
            tainted
                .select_best(&ordinary, "default")
                .map(|s| s.agent_id),
            expected
        );
        c.bench_function(&format!("select_best_tainted_pool_{n}"), |b| {
            b.iter(|| tainted.select_best(black_box(&ordinary), "default"))
        });
        // Every agent offers CPU and memory; the GPU tenth four GPUs, half
        // of them big. Each holds a lease or two of what its load says.
        let mut offering = AgentIndex::new();
        let offered: Vec<AgentView> = agents
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let mut a = a.clone();
                let mut doc = (*a.document).clone();
                let gpus: Vec<Value> = if i % 10 == 0 {
                    (0..4)
                        .map(|g| {
                            json!({"index": g, "uuid": format!("GPU-{i}-{g}"),
                                        "memory_mb": if g % 2 == 0 { 81559 } else { 15360 }})
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                doc["resources"] =
                    json!({"cpu_millicores": 8000, "memory_mb": 32000, "gpus": gpus});
                a.document = Arc::new(doc);
                a
            })
            .collect();
        for a in &offered {
            offering.upsert(a.clone());
        }
        let with_resources = placement(
            "linux, docker, software.node.version@^20, memory.total>=16384, needs cpu: 2000, needs memory: 4096",
        );
        let gpus = placement("gpu, needs gpus: 2 (memory_mb>=40000)");
        for (name, placement) in [("resources", &with_resources), ("gpus", &gpus)] {
            let expected = matcher::explain(placement, "default", &offered)
                .ranked
                .first()
                .cloned();
            assert_eq!(
                offering
                    .select_best(placement, "default")
                    .map(|s| s.agent_id),
                expected
            );
            c.bench_function(&format!("select_best_{name}_{n}"), |b| {
                b.iter(|| offering.select_best(black_box(placement), "default"))
            });
        }
        // `select_best_rotating` with resource requests: the same five
        // placements, each asking for CPU and memory (the GPU one for a GPU
        // too); each iteration selects, assigns and holds the claim, and
        // releases it.
        let rotating_resources: Vec<_> = [
            "linux, docker, software.node.version@^20, needs cpu: 1000, needs memory: 2048",
            "linux, needs cpu: 1000, needs memory: 2048",
            "memory.total>=32768, needs cpu: 1000, needs memory: 2048",
            "gpu, software.node.version@>=20, needs cpu: 1000, needs memory: 2048, needs gpus: 1",
            "software.node.version@^18, prefer 2: docker, needs cpu: 1000, needs memory: 2048",
        ]
        .into_iter()
        .map(placement)
        .collect();
        let mut task = 0u128;
        c.bench_function(&format!("select_best_resources_rotating_{n}"), |b| {
            b.iter(|| {
                task += 1;
                let placement = &rotating_resources[task as usize % rotating_resources.len()];
                if let Some(s) = offering.select_best(black_box(placement), "default") {
                    let v = offering.get(s.agent_id).expect("indexed");
                    let claim = placement
                        .assign(&v.document, v.capacity, v.active_leases, &v.held)
                        .expect("fits");
                    let id = uuid::Uuid::from_u128(task);
                    offering.hold(s.agent_id, id, claim, Some(task as u64));
                    offering.release(s.agent_id, id);
                }
            })
        });
        if n == 1_000 {
            c.bench_function("explain_all_1000", |b| {
                b.iter(|| matcher::explain(black_box(&typical), "default", &agents))
            });
        }
        if n == 10_000 {
            // What a queue summary does per group: the whole fleet explained
            // for a placement no agent satisfies (as `switchyard-bench
            // --parked` makes them: a tag none has, more memory than any has).
            for (name, text) in [
                ("tag", "bench-parked-0"),
                ("memory", "memory.total>=1048577"),
            ] {
                let parked = placement(text).with_kind("exec");
                c.bench_function(&format!("explain_parked_{name}_{n}"), |b| {
                    b.iter(|| matcher::explain(black_box(&parked), "default", &agents))
                });
            }
            c.bench_function(&format!("explain_typical_{n}"), |b| {
                b.iter(|| matcher::explain(black_box(&typical), "default", &agents))
            });
        }
    }
}

criterion_group!(
    benches,
    bench_merge,
    bench_diff,
    bench_heartbeat,
    bench_select
);
criterion_main!(benches);
