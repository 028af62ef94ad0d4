//! The simulated fleet and the work it is given: SheetBot-shaped capability
//! documents that differ in OS, architecture, tools and their versions,
//! tags and memory, and a mix of placements from "any Linux agent" down to
//! a few percent of the fleet, or (`one-in-n`) exactly one agent per task.
//! Everything is derived from the agent's index, so a run is reproducible;
//! [`Mix::selectivity`] checks the placements against the fleet with the real
//! matcher before any task is sent.

use std::borrow::Cow;

use anyhow::Context;
use serde_json::{Value, json};
use switchyard_core::document::software_entry;
use switchyard_core::placement::compile;
use switchyard_core::selector;

/// Debian packages a build agent reports (SheetBot's `packages` list, cut down).
const PACKAGES: &[&str] = &[
    "bash",
    "build-essential",
    "ca-certificates",
    "cmake-data",
    "coreutils",
    "curl",
    "dpkg",
    "g++",
    "gcc",
    "gdb",
    "git",
    "gnupg",
    "libc6-dev",
    "libssl-dev",
    "make",
    "openssh-client",
    "perl",
    "pkg-config",
    "python3",
    "python3-pip",
    "rsync",
    "sudo",
    "tar",
    "unzip",
    "xz-utils",
    "zip",
    "zlib1g-dev",
];

/// The operating system of agent `i`: 80% Linux, 10% macOS, 10% Windows.
fn os(i: usize) -> &'static str {
    match i % 10 {
        3 => "macos",
        7 => "windows",
        _ => "linux",
    }
}

/// The full capability document of agent `i` with `capacity` slots.
pub fn document(i: usize, capacity: u32) -> Value {
    let os = os(i);
    let arch = if os == "macos" || (os == "linux" && i % 5 == 4) {
        "aarch64"
    } else {
        "x86_64"
    };
    let cpus = [4, 8, 16, 32][i % 4];
    let total = [8192, 16384, 32768, 65536][(i / 4) % 4];
    let mut software = serde_json::Map::new();
    let mut put = |name: &str, version: &str| {
        software.insert(name.to_owned(), software_entry(version));
    };
    put("git", ["2.34.1", "2.39.2", "2.43.0"][i % 3]);
    put("node", ["18.19.0", "20.11.1", "22.3.0"][(i / 3) % 3]);
    put("python3", ["3.10.12", "3.11.9", "3.12.4"][(i / 2) % 3]);
    put("cmake", ["3.22.1", "3.28.3"][i % 2]);
    let docker = os == "linux" && (i / 10).is_multiple_of(2);
    let mut tags = vec![json!(os), json!(arch)];
    match os {
        "linux" => {
            put("clang", ["14.0.0", "18.1.3"][(i / 7) % 2]);
            put("uv", "0.4.18");
            if docker {
                put("docker", "24.0.7");
                tags.push(json!("docker"));
            }
            tags.push(json!(["ubuntu-22.04", "ubuntu-24.04"][(i / 5) % 2]));
            if i % 10 == 1 {
                tags.push(json!("gpu"));
            }
        }
        "macos" => {
            put("xcode", ["14.3.1", "15.4"][(i / 10) % 2]);
            put("clang", "15.0.0");
            tags.push(json!("macos-14"));
        }
        _ => {
            put("msvc", ["19.38.33130", "19.40.33811"][(i / 10) % 2]);
            tags.push(json!("windows-2022"));
        }
    }
    let team = ["web", "infra", "mobile", "data"][i % 4];
    let region = ["eu-west", "us-east", "ap-south"][i % 3];
    let packages = if os == "linux" {
        json!(PACKAGES)
    } else {
        json!([])
    };
    json!({
        "os": os,
        "arch": arch,
        "hostname": format!("{os}-build-{i:05}"),
        "cpus": cpus,
        "memory": {
            "total": total,
            "free": total / 3,
            "available": total / 2,
            "unit": "MB",
        },
        "loadavg": {"1min": 0.5, "5min": 0.4, "15min": 0.3},
        "build": {"arch": arch, "os": os},
        "software": software,
        "tags": tags,
        "max_concurrent_tasks": capacity,
        "packages": packages,
        "resources": {"cpu_millicores": cpus * 1000, "memory_mb": total},
        "custom_properties": {
            "team": team,
            "region": region,
            // Unique and stable per agent: the fact `one-in-n` placements pin.
            "bench_slot": i,
        },
    })
}

/// Makes `document` provide `n` capabilities, named with a dot as
/// capability packs name theirs (`bench.cap-0`, `bench.cap-1`, …).
pub fn provide(document: &mut Value, n: usize) {
    if n == 0 {
        return;
    }
    let provides: serde_json::Map<String, Value> = (0..n)
        .map(|k| (format!("bench.cap-{k}"), json!({"version": "1.0.0"})))
        .collect();
    document["provides"] = Value::Object(provides);
}

/// The next heartbeat's document: memory and load average drift, as a real
/// machine's do; nothing else changes.
pub fn drift(document: &mut Value, agent: usize, beat: u64) {
    let total = document["memory"]["total"].as_u64().unwrap_or(8192);
    // A cheap deterministic wobble, different per agent and per beat.
    let w = (agent as u64)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(beat.wrapping_mul(40_503))
        % 1000;
    document["memory"]["free"] = json!(total / 4 + total * w / 4000);
    document["memory"]["available"] = json!(total / 3 + total * w / 3000);
    let load = (w as f64) / 250.0;
    document["loadavg"] = json!({
        "1min": (load * 100.0).round() / 100.0,
        "5min": (load * 80.0).round() / 100.0,
        "15min": (load * 60.0).round() / 100.0,
    });
}

/// One class of task in the mix.
#[derive(Debug, Clone)]
pub struct Class {
    /// The selector the task carries (for `one-in-n`, a description of the
    /// family of selectors).
    pub selector: String,
    /// Relative weight in the mix.
    pub weight: u32,
    /// Fraction of the fleet that can run it (filled by [`Mix::selectivity`]).
    pub eligible: f64,
}

/// The placements tasks are drawn from, in proportion to their weights.
#[derive(Debug, Clone)]
pub struct Mix {
    /// The classes, in order.
    pub classes: Vec<Class>,
    total: u32,
    /// `one-in-n`: task `n` is pinned to agent `n * stride % agents`.
    pinned: Option<Pinned>,
}

/// How `one-in-n` spreads tasks over the fleet.
#[derive(Debug, Clone, Copy)]
struct Pinned {
    agents: u64,
    /// A prime that does not divide `agents`, so `n * stride % agents` visits
    /// every agent once per `agents` consecutive tasks.
    stride: u64,
}

/// The selector that matches agent `slot` and no other.
pub fn slot_selector(slot: u64) -> String {
    format!("custom_properties.bench_slot={slot}")
}

impl Mix {
    /// `mixed`: varied selectivity (about 80% of the fleet down to a few
    /// percent); `any`: every task runs anywhere (no placement);
    /// `one-in-n`: every task can run on exactly one of the `agents` agents,
    /// a different one for each consecutive task.
    pub fn named(name: &str, agents: usize) -> anyhow::Result<Self> {
        let classes: Vec<(&'static str, u32)> = match name {
            "mixed" => vec![
                ("linux", 40),
                ("linux, docker, software.node.version@^20", 20),
                ("memory.total>=32768, cpus>=16", 15),
                ("gpu, software.python3.version@>=3.11", 10),
                ("os=macos, software.xcode.version@^15", 5),
                ("os=windows, arch=x86_64", 5),
                (
                    "custom_properties.team in (web, infra), custom_properties.region=eu-west, prefer 5: memory.total>=65536",
                    5,
                ),
            ],
            "any" => vec![("", 1)],
            "one-in-n" => {
                anyhow::ensure!(agents > 0, "one-in-n needs at least one agent");
                let agents = agents as u64;
                // Fails only for a fleet that is a multiple of all three (> 10^11).
                let stride = [7_919, 7_927, 7_933]
                    .into_iter()
                    .find(|p| !agents.is_multiple_of(*p))
                    .context("one-in-n: no stride prime is coprime to the fleet size")?;
                let pinned = Pinned { agents, stride };
                return Ok(Self {
                    classes: vec![Class {
                        selector: format!(
                            "custom_properties.bench_slot=K, K = n * {stride} mod {agents}"
                        ),
                        weight: 1,
                        eligible: 1.0 / agents as f64,
                    }],
                    total: 1,
                    pinned: Some(pinned),
                });
            }
            other => anyhow::bail!("unknown placement mix {other:?} (mixed, any, one-in-n)"),
        };
        let total = classes.iter().map(|c| c.1).sum();
        Ok(Self {
            classes: classes
                .into_iter()
                .map(|(selector, weight)| Class {
                    selector: selector.to_owned(),
                    weight,
                    eligible: 1.0,
                })
                .collect(),
            total,
            pinned: None,
        })
    }

    /// The selector of task number `n` (spread evenly through the run).
    pub fn selector(&self, n: u64) -> Cow<'_, str> {
        if let Some(p) = self.pinned {
            return Cow::Owned(slot_selector(p.slot(n)));
        }
        Cow::Borrowed(&self.classes[self.class_of(n)].selector)
    }

    /// The class of task number `n`: an index into [`Mix::classes`].
    pub fn class_of(&self, n: u64) -> usize {
        if self.pinned.is_some() {
            return 0;
        }
        // A multiplicative hash so the classes interleave instead of coming in runs.
        let mut slot = (n.wrapping_mul(2_654_435_761) % u64::from(self.total)) as u32;
        for (i, c) in self.classes.iter().enumerate() {
            if slot < c.weight {
                return i;
            }
            slot -= c.weight;
        }
        0
    }

    /// The fraction of the tasks in class `i` (by weight).
    pub fn share(&self, i: usize) -> f64 {
        self.classes
            .get(i)
            .map_or(0.0, |c| f64::from(c.weight) / f64::from(self.total))
    }

    /// Fills in each class's eligible fraction of `agents` agents with the
    /// real matcher; fails if any class would match no agent (its tasks would
    /// park forever and the run would never finish). For `one-in-n` it checks
    /// a sample of [`PINNED_SAMPLE`] tasks' selectors against the whole fleet
    /// (each must match exactly its own agent), not one selector per agent.
    pub fn selectivity(&mut self, agents: usize, capacity: u32) -> anyhow::Result<()> {
        let docs: Vec<Value> = (0..agents).map(|i| document(i, capacity)).collect();
        if let Some(p) = self.pinned {
            anyhow::ensure!(
                p.agents == agents as u64,
                "one-in-n mix built for {} agents, checked against {agents}",
                p.agents
            );
            let sample = PINNED_SAMPLE.min(p.agents);
            for k in 0..sample {
                // Spread the sample over a whole cycle of the fleet.
                let n = k * p.agents / sample;
                let slot = p.slot(n);
                let compiled = compiled(&slot_selector(slot))?;
                let matching: Vec<usize> = docs
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| compiled.unmet(d).is_none())
                    .map(|(i, _)| i)
                    .collect();
                anyhow::ensure!(
                    matching == [slot as usize],
                    "task {n}'s placement {:?} matches agents {matching:?}, not just agent {slot}",
                    slot_selector(slot)
                );
            }
            return Ok(());
        }
        for c in &mut self.classes {
            let compiled = compiled(&c.selector)?;
            let n = docs.iter().filter(|d| compiled.unmet(d).is_none()).count();
            anyhow::ensure!(
                n > 0,
                "no agent of {agents} can run {:?}; use more agents or --placements any",
                c.selector
            );
            c.eligible = n as f64 / agents as f64;
        }
        Ok(())
    }
}

/// How many `one-in-n` selectors [`Mix::selectivity`] checks against the
/// whole fleet (64 × 10,000 agents is well under a second).
pub const PINNED_SAMPLE: u64 = 64;

impl Pinned {
    /// The agent task `n` is pinned to.
    fn slot(self, n: u64) -> u64 {
        // u128: n * stride must not wrap for any task count.
        ((u128::from(n) * u128::from(self.stride)) % u128::from(self.agents)) as u64
    }
}

/// Parses and compiles `selector` with the server's own code.
fn compiled(selector: &str) -> anyhow::Result<switchyard_core::placement::CompiledPlacement> {
    let placement =
        selector::parse(selector).map_err(|e| anyhow::anyhow!("selector {selector:?}: {e}"))?;
    compile(&placement).map_err(|e| anyhow::anyhow!("selector {selector:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_n_pins_each_task_to_one_agent_and_visits_every_agent() {
        let agents = 300;
        let mut mix = Mix::named("one-in-n", agents).unwrap();
        mix.selectivity(agents, 1).unwrap();
        let mut seen: Vec<String> = (0..agents as u64)
            .map(|n| mix.selector(n).into_owned())
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), agents);
    }

    /// `--provides`: capabilities named with a dot, each one a placement
    /// can ask for; none leaves the document as it was.
    #[test]
    fn provided_capabilities_are_dotted_and_matched() {
        use switchyard_core::placement::compile;
        use switchyard_core::selector;
        let plain = document(7, 4);
        let mut doc = plain.clone();
        provide(&mut doc, 0);
        assert_eq!(doc, plain);
        provide(&mut doc, 3);
        let names: Vec<&String> = doc["provides"].as_object().unwrap().keys().collect();
        assert_eq!(names, ["bench.cap-0", "bench.cap-1", "bench.cap-2"]);
        let wants = |text: &str| compile(&selector::parse(text).unwrap()).unwrap();
        assert!(wants("provides bench.cap-2@1").satisfied_by(&doc));
        assert!(!wants("provides bench.cap-3@1").satisfied_by(&doc));
        assert!(!wants("provides bench.cap-0@1").satisfied_by(&plain));
    }

    /// A task's class is the one whose selector it carries, and the classes
    /// take the tasks in proportion to their shares.
    #[test]
    fn each_task_carries_its_class_selector_in_proportion() {
        let mix = Mix::named("mixed", 50).unwrap();
        let shares: f64 = (0..mix.classes.len()).map(|i| mix.share(i)).sum();
        assert!((shares - 1.0).abs() < 1e-9, "{shares}");
        let mut counts = vec![0u64; mix.classes.len()];
        let tasks = 100_000;
        for n in 0..tasks {
            let class = mix.class_of(n);
            assert_eq!(mix.selector(n), mix.classes[class].selector);
            counts[class] += 1;
        }
        for (i, count) in counts.iter().enumerate() {
            let share = *count as f64 / tasks as f64;
            assert!((share - mix.share(i)).abs() < 0.01, "class {i}: {share}");
        }
    }
}
