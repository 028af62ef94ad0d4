//! SheetBot-format agent directories: the dynamic script conventions of
//! shell, Python and Node, exactly as SheetBot agents write them, and
//! fault-tolerant loading.

use std::time::Duration;

use serde_json::json;
use switchyard_agent::tiers::{self, DirectoryTiers};
use switchyard_core::Limits;

async fn read(dir: &std::path::Path) -> DirectoryTiers {
    tiers::read_directory(dir, Duration::from_secs(20)).await
}

#[tokio::test]
async fn shell_dynamic_script_is_sourced_and_called_with_the_static_tier() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"packages": ["typescript", "node"]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join(".capabilities.dynamic.sh"),
        r#"#!/bin/bash

getCapabilities() {
    local static_caps="$1"
    local count=$(echo "$static_caps" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["packages"]))')
    echo "{\"shell\": {\"static_packages\": $count}, \"memory\": {\"unit\": \"MB\"}}"
}
"#,
    )
    .unwrap();
    let t = read(dir.path()).await;
    assert!(t.rejections.is_empty(), "{:?}", t.rejections);
    assert_eq!(
        t.dynamic_tier,
        Some(json!({"shell": {"static_packages": 2}, "memory": {"unit": "MB"}}))
    );
}

#[tokio::test]
async fn python_dynamic_script_follows_sheetbot() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"environment": "production"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join(".capabilities.dynamic.py"),
        r#"import subprocess
import json
import platform

def getCapabilities(staticCapabilities):
    capabilities = {}
    try:
        result = subprocess.run(['git', '--version'], capture_output=True, text=True)
        if result.returncode == 0:
            capabilities['git'] = {'version': result.stdout.split()[-1]}
    except:
        pass
    capabilities['seen_environment'] = staticCapabilities['environment']
    capabilities['os'] = platform.system().lower()
    return capabilities
"#,
    )
    .unwrap();
    let t = read(dir.path()).await;
    assert!(t.rejections.is_empty(), "{:?}", t.rejections);
    let d = t.dynamic_tier.unwrap();
    assert_eq!(d["seen_environment"], json!("production"));
    assert_eq!(d["os"], json!("linux"));
}

#[tokio::test]
async fn node_dynamic_script_follows_sheetbot() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"max_concurrent_tasks": 4}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join(".capabilities.dynamic.mjs"),
        r#"import os from "node:os";

export async function getCapabilities(staticCapabilities) {
  return { node: { version: process.version.slice(1) }, doubled: staticCapabilities.max_concurrent_tasks * 2, platform: os.platform() };
}
"#,
    )
    .unwrap();
    let t = read(dir.path()).await;
    assert!(t.rejections.is_empty(), "{:?}", t.rejections);
    let d = t.dynamic_tier.unwrap();
    assert_eq!(d["doubled"], json!(8));
    assert_eq!(d["platform"], json!("linux"));
}

#[tokio::test]
async fn a_failing_script_is_a_rejection_and_the_rest_applies() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".capabilities.json"), r#"{"tags": ["a"]}"#).unwrap();
    std::fs::write(
        dir.path().join(".capabilities.dynamic.py"),
        "def getCapabilities(s):\n    raise RuntimeError('boom')\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join(".capabilities.override.json"),
        r#"{"hostname": "forced"}"#,
    )
    .unwrap();
    let t = read(dir.path()).await;
    assert_eq!(t.rejections.len(), 1);
    assert!(
        t.rejections[0].reason.contains("boom"),
        "{}",
        t.rejections[0].reason
    );
    let merged = tiers::merge(
        json!({"os": "linux", "hostname": "real", "tags": ["linux"]}),
        &t,
        &Limits::default(),
    );
    assert_eq!(merged.document["hostname"], json!("forced"));
    assert_eq!(
        merged.document["tags"],
        json!(["a"]),
        "static tags replace derived ones"
    );
}

#[tokio::test]
async fn a_hanging_script_times_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.dynamic.sh"),
        "getCapabilities() { sleep 30; }\n",
    )
    .unwrap();
    let t = tiers::read_directory(dir.path(), Duration::from_millis(300)).await;
    assert_eq!(t.rejections.len(), 1);
    assert!(
        t.rejections[0].reason.contains("timed out"),
        "{}",
        t.rejections[0].reason
    );
}

#[tokio::test]
async fn secrets_never_leave_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"api_key": "k-123", "deploy": {"password": "hunter2"}, "sensitive": ["license_code"], "license_code": "LIC-9"}"#,
    )
    .unwrap();
    let t = read(dir.path()).await;
    let merged = tiers::merge(json!({}), &t, &Limits::default());
    let text = merged.document.to_string();
    for secret in ["k-123", "hunter2", "LIC-9"] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
}

/// Runs the agent binary's `capabilities` in `cwd` with `--dir dir`.
fn capabilities_in(cwd: &std::path::Path, dir: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["--dir", dir, "capabilities"])
        .output()
        .unwrap()
}

#[tokio::test]
async fn a_relative_directory_runs_its_dynamic_script_and_a_missing_one_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("agents/a");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(".capabilities.dynamic.sh"),
        "getCapabilities() { echo '{\"from_script\": true}'; }\n",
    )
    .unwrap();
    // Before: the script ran in agents/a but was handed agents/a/…, so
    // bash found nothing and the tier was rejected.
    let out = capabilities_in(root.path(), "agents/a");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["from_script"], json!(true), "{doc}");
    // The library alone, with a relative path, too.
    let cwd = std::env::current_dir().unwrap();
    let relative = pathdiff(&dir, &cwd);
    let script = tiers::dynamic_script(&relative).unwrap();
    let value = tiers::run_dynamic(&relative, &script, &json!({}), Duration::from_secs(20)).await;
    assert_eq!(value.unwrap(), json!({"from_script": true}));

    // Before: exit 0 and an empty document.
    let out = capabilities_in(root.path(), "agents/missing");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("agents/missing"), "{stderr}");
}

/// `path` relative to `base` (both absolute), through `..` as needed.
fn pathdiff(path: &std::path::Path, base: &std::path::Path) -> std::path::PathBuf {
    let path: Vec<_> = path.components().collect();
    let base: Vec<_> = base.components().collect();
    let common = path.iter().zip(&base).take_while(|(a, b)| a == b).count();
    let mut out = std::path::PathBuf::new();
    for _ in common..base.len() {
        out.push("..");
    }
    for c in &path[common..] {
        out.push(c);
    }
    out
}

/// The default name follows the rule the three runners share
/// (`tests/conformance/naming.json`).
#[test]
fn default_names_follow_the_shared_vectors() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/conformance/naming.json"
    );
    let Ok(text) = std::fs::read_to_string(path) else {
        panic!("{path} is missing");
    };
    let vectors: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = vectors
        .as_array()
        .or_else(|| vectors["vectors"].as_array())
        .expect("a list of vectors");
    assert!(!cases.is_empty());
    for case in cases {
        let name = switchyard_agent::identity::default_name(
            case["hostname"].as_str().unwrap(),
            case["runner"].as_str().unwrap(),
            std::path::Path::new(case["dir"].as_str().unwrap()),
        );
        assert_eq!(name, case["name"].as_str().unwrap(), "{case}");
    }
}
