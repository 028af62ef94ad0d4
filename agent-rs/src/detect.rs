//! Built-in detection: the base tier. Each probe is independent and
//! time-limited (a missing or hanging tool only leaves its entry out): tool
//! versions shaped `software.<tool>.{version, major_version, minor_version,
//! patch_version}`, OS release and `/etc/os-release`, memory and load
//! averages (sysinfo), CPUs, NVIDIA GPUs when `nvidia-smi` answers (index,
//! uuid, name, memory, driver), `resources` (what the agent offers: CPU in
//! millicores, memory in MB, the GPUs as devices; a tier may override or add
//! to it, e.g. a named count such as `resources.licenses.matlab`), and `tags`
//! derived from what was found. The
//! Python and Node runners detect the same, held to the shared vectors in
//! `tests/conformance/detect.json` (the tool list, version parsing,
//! `/etc/os-release`, `nvidia-smi` rows, tags).

use std::time::Duration;

use serde_json::{Map, Value, json};
use switchyard_core::document::software_entry;
use tokio::process::Command;

/// The tools probed, with the arguments that print their version.
pub const TOOLS: [(&str, &str, &[&str]); 15] = [
    ("git", "git", &["--version"]),
    ("clang", "clang", &["--version"]),
    ("cmake", "cmake", &["--version"]),
    ("node", "node", &["--version"]),
    ("uv", "uv", &["--version"]),
    ("scons", "scons", &["--version"]),
    ("vboxmanage", "vboxmanage", &["--version"]),
    ("deno", "deno", &["--version"]),
    ("python3", "python3", &["--version"]),
    ("docker", "docker", &["--version"]),
    ("cargo", "cargo", &["--version"]),
    ("rustc", "rustc", &["--version"]),
    ("go", "go", &["version"]),
    ("java", "java", &["-version"]),
    ("gcc", "gcc", &["--version"]),
];

/// The first version-looking token of a tool's output (`git version
/// 2.39.5` → `2.39.5`, `v20.11.1` → `20.11.1`, `go1.22.1` → `1.22.1`).
pub fn version_in(output: &str) -> Option<String> {
    let re = regex_lite_version();
    output.lines().find_map(|line| {
        line.split(|c: char| c.is_whitespace() || c == '"' || c == ',' || c == '(' || c == ')')
            .filter_map(|tok| {
                let t = tok.trim_start_matches('v').trim_start_matches("go");
                re(t).then(|| {
                    t.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                        .to_owned()
                })
            })
            .next()
    })
}

/// A token is a version if it starts with digits and contains a dot.
fn regex_lite_version() -> impl Fn(&str) -> bool {
    |t: &str| {
        let mut parts = t.split('.');
        let first = parts.next().unwrap_or_default();
        !first.is_empty() && first.chars().all(|c| c.is_ascii_digit()) && t.contains('.')
    }
}

async fn probe(program: &str, args: &[&str], timeout: Duration) -> Option<String> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .ok()?
        .ok()?;
    if !out.status.success() {
        return None;
    }
    // Some tools (java) print their version on standard error.
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    version_in(&text)
}

/// Tool versions, probed concurrently (each with its own timeout).
pub async fn software(timeout: Duration) -> Map<String, Value> {
    let mut probes = tokio::task::JoinSet::new();
    for (name, program, args) in TOOLS {
        probes.spawn(async move { (name, probe(program, args, timeout).await) });
    }
    let mut out = Map::new();
    while let Some(joined) = probes.join_next().await {
        if let Ok((name, Some(version))) = joined {
            out.insert(name.to_owned(), software_entry(&version));
        }
    }
    out
}

/// `/etc/os-release` as SheetBot reports it.
pub fn os_release(text: &str) -> Map<String, Value> {
    let mut fields = std::collections::HashMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            fields.insert(k.trim().to_owned(), v.trim().trim_matches('"').to_owned());
        }
    }
    let mut out = Map::new();
    if let Some(v) = fields.get("NAME") {
        out.insert("name".into(), json!(v));
    }
    if let Some(v) = fields.get("PRETTY_NAME") {
        out.insert("pretty_name".into(), json!(v));
    }
    if let Some(v) = fields.get("VERSION_CODENAME") {
        out.insert("versionCodename".into(), json!(v));
    }
    if let Some(v) = fields.get("VERSION_ID") {
        out.insert("versionId".into(), json!(v));
        out.insert("release".into(), software_entry(v));
    }
    out
}

/// Memory in MB and load averages, cheap enough for every heartbeat.
pub fn load_facts() -> Map<String, Value> {
    let mut out = Map::new();
    if let Ok(mut sys) = sysinfo::System::new_with_specifics(
        sysinfo::RefreshKind::nothing()
            .with_memory(sysinfo::MemoryRefreshKind::nothing().with_ram()),
    ) {
        sys.refresh_memory();
        let mb = |b: u64| b / (1024 * 1024);
        out.insert(
            "memory".into(),
            json!({"total": mb(sys.total_memory()), "free": mb(sys.free_memory()),
                   "available": mb(sys.available_memory()), "unit": "MB"}),
        );
    }
    if let Ok(l) = sysinfo::System::load_average() {
        let round = |x: f64| (x * 100.0).round() / 100.0;
        out.insert(
            "loadavg".into(),
            json!({"1min": round(l.one), "5min": round(l.five), "15min": round(l.fifteen)}),
        );
    }
    out
}

/// Everything the agent knows about its machine: the base tier.
pub async fn base(probe_timeout: Duration) -> Value {
    let mut doc = Map::new();
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    };
    doc.insert("os".into(), json!(os));
    doc.insert("arch".into(), json!(std::env::consts::ARCH));
    if let Ok(host) = sysinfo::System::host_name() {
        doc.insert("hostname".into(), json!(host));
    }
    if let Ok(release) = sysinfo::System::kernel_version() {
        doc.insert("os_release".into(), software_entry(&release));
    }
    if let Ok(text) = std::fs::read_to_string("/etc/os-release") {
        doc.insert("linux".into(), Value::Object(os_release(&text)));
    }
    let mut cpu_count = 0;
    if let Ok(sys) = sysinfo::System::new_with_specifics(
        sysinfo::RefreshKind::nothing().with_cpu(sysinfo::CpuRefreshKind::nothing()),
    ) {
        let model = sys
            .cpus()
            .first()
            .map(|c| c.brand().trim().to_owned())
            .unwrap_or_default();
        cpu_count = sys.cpus().len() as u64;
        doc.insert(
            "cpu".into(),
            json!({"count": sys.cpus().len(), "model": model}),
        );
    }
    doc.extend(load_facts());
    let software = software(probe_timeout).await;
    let gpus = nvidia_gpus(probe_timeout).await;
    let memory_total = doc
        .get("memory")
        .and_then(|m| m.get("total"))
        .and_then(Value::as_u64);
    doc.insert(
        "resources".into(),
        resources(cpu_count, memory_total, &gpus),
    );
    let tags = tags(os, std::env::consts::ARCH, &software, gpus.len());
    if !gpus.is_empty() {
        doc.insert("gpus".into(), Value::Array(gpus));
    }
    doc.insert("software".into(), Value::Object(software));
    doc.insert("tags".into(), json!(tags));
    Value::Object(doc)
}

/// What the agent offers: `cpu_millicores` (1,000 a CPU) and `memory_mb`
/// when known, and every GPU as a device (`index`, `uuid`, `model`,
/// `memory_mb`).
pub fn resources(cpu_count: u64, memory_total_mb: Option<u64>, gpus: &[Value]) -> Value {
    let mut out = Map::new();
    if cpu_count > 0 {
        out.insert("cpu_millicores".into(), json!(cpu_count * 1000));
    }
    if let Some(mb) = memory_total_mb {
        out.insert("memory_mb".into(), json!(mb));
    }
    let devices: Vec<Value> = gpus
        .iter()
        .map(|g| {
            json!({"index": g["index"], "uuid": g["uuid"], "model": g["name"],
                   "memory_mb": g["memory_mb"]})
        })
        .collect();
    out.insert("gpus".into(), Value::Array(devices));
    Value::Object(out)
}

/// The tags detection derives: the OS and architecture, `docker` when docker
/// answered, `gpu` and `nvidia` when GPUs did.
pub fn tags(os: &str, arch: &str, software: &Map<String, Value>, gpus: usize) -> Vec<String> {
    let mut tags = vec![os.to_owned(), arch.to_owned()];
    if software.contains_key("docker") {
        tags.push("docker".into());
    }
    if gpus > 0 {
        tags.push("gpu".into());
        tags.push("nvidia".into());
    }
    tags
}

/// The query `nvidia-smi` answers, one GPU a row.
pub const NVIDIA_SMI_ARGS: [&str; 2] = [
    "--query-gpu=index,uuid,name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
];

/// GPUs from `nvidia-smi`'s rows (`index, uuid, name, memory MB, driver`):
/// a row of another shape is left out, an unreadable number is null.
pub fn parse_nvidia_smi(output: &str) -> Vec<Value> {
    output
        .lines()
        .filter_map(|l| {
            let parts: Vec<&str> = l.split(',').map(str::trim).collect();
            (parts.len() == 5).then(|| {
                json!({
                    "index": parts[0].parse::<u64>().ok(),
                    "uuid": parts[1],
                    "name": parts[2],
                    "memory_mb": parts[3].parse::<u64>().ok(),
                    "driver": parts[4],
                })
            })
        })
        .collect()
}

/// NVIDIA GPUs from `nvidia-smi`, if it answers.
async fn nvidia_gpus(timeout: Duration) -> Vec<Value> {
    let mut cmd = Command::new("nvidia-smi");
    cmd.args(NVIDIA_SMI_ARGS)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let Ok(Ok(out)) = tokio::time::timeout(timeout, cmd.output()).await else {
        return Vec::new();
    };
    if !out.status.success() {
        return Vec::new();
    }
    parse_nvidia_smi(&String::from_utf8_lossy(&out.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_found_in_tool_output() {
        assert_eq!(version_in("git version 2.39.5").as_deref(), Some("2.39.5"));
        assert_eq!(version_in("v20.11.1").as_deref(), Some("20.11.1"));
        assert_eq!(
            version_in("go version go1.22.1 linux/amd64").as_deref(),
            Some("1.22.1")
        );
        assert_eq!(
            version_in("openjdk version \"17.0.15\" 2025-04-15").as_deref(),
            Some("17.0.15")
        );
        assert_eq!(
            version_in("cargo 1.95.0 (f2d3ce0bd 2026-03-21)").as_deref(),
            Some("1.95.0")
        );
        assert_eq!(version_in("Python 3.11.7").as_deref(), Some("3.11.7"));
        assert_eq!(version_in("no version here"), None);
    }

    /// The shared detection vectors, as the Python and Node runners read them.
    #[test]
    fn detection_follows_the_shared_vectors() {
        let v: Value =
            serde_json::from_str(include_str!("../../tests/conformance/detect.json")).unwrap();
        let tools: Vec<Value> = TOOLS
            .iter()
            .map(|(name, program, args)| json!([name, program, args]))
            .collect();
        assert_eq!(json!(tools), v["tools"]);
        for case in v["version_in"].as_array().unwrap() {
            let output = case["output"].as_str().unwrap();
            assert_eq!(json!(version_in(output)), case["version"], "{output:?}");
        }
        for case in v["software_entry"].as_array().unwrap() {
            let version = case["version"].as_str().unwrap();
            assert_eq!(software_entry(version), case["expected"], "{version}");
        }
        for case in v["os_release"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            assert_eq!(
                Value::Object(os_release(text)),
                case["expected"],
                "{text:?}"
            );
        }
        for case in v["nvidia_smi"].as_array().unwrap() {
            let output = case["output"].as_str().unwrap();
            assert_eq!(
                json!(parse_nvidia_smi(output)),
                case["expected"],
                "{output:?}"
            );
        }
        for case in v["resources"].as_array().unwrap() {
            let got = resources(
                case["cpu_count"].as_u64().unwrap(),
                case["memory_total_mb"].as_u64(),
                case["gpus"].as_array().unwrap(),
            );
            assert_eq!(got, case["expected"], "{case}");
        }
        for case in v["tags"].as_array().unwrap() {
            let software: Map<String, Value> = case["software"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| (t.as_str().unwrap().to_owned(), json!({})))
                .collect();
            let gpus = case["gpus"].as_u64().unwrap() as usize;
            let got = tags(
                case["os"].as_str().unwrap(),
                case["arch"].as_str().unwrap(),
                &software,
                gpus,
            );
            assert_eq!(json!(got), case["expected"]);
        }
    }

    #[test]
    fn os_release_is_shaped_like_sheetbot() {
        let f = os_release(
            "NAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nVERSION_CODENAME=bookworm\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        );
        assert_eq!(f["name"], json!("Debian GNU/Linux"));
        assert_eq!(f["versionCodename"], json!("bookworm"));
        assert_eq!(f["release"]["major_version"], json!(12));
    }
}
