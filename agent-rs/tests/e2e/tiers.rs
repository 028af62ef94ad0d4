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
