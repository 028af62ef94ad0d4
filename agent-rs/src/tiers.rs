//! The capability tiers of an agent directory, read exactly as SheetBot
//! agents read them: `.capabilities.json` (static), the output of
//! `.capabilities.dynamic.{sh,py,mjs,js,ts}` (dynamic; `getCapabilities`
//! is called with the static tier), and `.capabilities.override.json`,
//! merged over the built-in base facts by the core. Every script runs in its
//! own process, in the agent directory, with a timeout; a failing tier is a
//! rejection and is skipped, never fatal. Missing files are ignored.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use switchyard_core::tier::{Merged, Rejection, Tier};
use switchyard_core::{Limits, redact};
use tokio::process::Command;

/// The dynamic-script extensions, in the order they are looked for.
pub const DYNAMIC_EXTENSIONS: [&str; 5] = ["sh", "py", "mjs", "js", "ts"];

/// The tiers read from a directory, before merging.
#[derive(Debug, Clone, Default)]
pub struct DirectoryTiers {
    /// `.capabilities.json`, if present and valid.
    pub static_tier: Option<Value>,
    /// The dynamic script's output, if a script ran successfully.
    pub dynamic_tier: Option<Value>,
    /// `.capabilities.override.json`, if present and valid.
    pub override_tier: Option<Value>,
    /// Files that exist but could not be used.
    pub rejections: Vec<Rejection>,
}

fn reject(tier: Tier, reason: String) -> Rejection {
    Rejection {
        tier: Some(tier),
        path: String::new(),
        reason,
    }
}

/// Reads a JSON tier file; `Ok(None)` if it does not exist.
fn read_json(path: &Path, tier: Tier) -> Result<Option<Value>, Rejection> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|err| reject(tier, format!("{} is not valid JSON: {err}", path.display()))),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(reject(tier, format!("reading {}: {err}", path.display()))),
    }
}

/// The dynamic script in `dir`, if any (first of [`DYNAMIC_EXTENSIONS`]).
pub fn dynamic_script(dir: &Path) -> Option<PathBuf> {
    DYNAMIC_EXTENSIONS
        .iter()
        .map(|ext| dir.join(format!(".capabilities.dynamic.{ext}")))
        .find(|p| p.is_file())
}

/// How each script kind is run, following SheetBot's conventions.
fn script_command(script: &Path, static_json: &str) -> Option<Command> {
    let ext = script.extension()?.to_str()?;
    let path = script.to_str()?.to_owned();
    let mut cmd = match ext {
        // Sourced by bash; the function's printed JSON is read.
        "sh" => {
            let mut c = Command::new("bash");
            c.args([
                "-c",
                r#"source "$1" && getCapabilities "$2""#,
                "switchyard-dynamic",
                &path,
                static_json,
            ]);
            c
        }
        // Loaded by python3; getCapabilities(static_dict) is called.
        "py" => {
            let mut c = Command::new("python3");
            c.args([
                "-c",
                "import importlib.util, json, sys\n\
                 spec = importlib.util.spec_from_file_location('capabilities', sys.argv[1])\n\
                 module = importlib.util.module_from_spec(spec)\n\
                 spec.loader.exec_module(module)\n\
                 caps = module.getCapabilities(json.loads(sys.argv[2]))\n\
                 sys.stdout.write('\\n' + json.dumps(caps) + '\\n')",
                &path,
                static_json,
            ]);
            c
        }
        // Imported by node; getCapabilities(static) is awaited.
        "mjs" | "js" => {
            let mut c = Command::new("node");
            c.args([
                "--input-type=module",
                "-e",
                "import { pathToFileURL } from 'node:url';\n\
                 const [file, staticJson] = process.argv.slice(-2);\n\
                 const mod = await import(pathToFileURL(file).href);\n\
                 const caps = await mod.getCapabilities(JSON.parse(staticJson));\n\
                 process.stdout.write('\\n' + JSON.stringify(caps) + '\\n');",
                &path,
                static_json,
            ]);
            c
        }
        // Run under deno when it is installed.
        "ts" => {
            let mut c = Command::new("deno");
            c.args([
                "eval",
                "--ext=ts",
                "const [file, staticJson] = Deno.args;\n\
                 const mod = await import(new URL(file, 'file://').href);\n\
                 const caps = await mod.getCapabilities(JSON.parse(staticJson));\n\
                 console.log('\\n' + JSON.stringify(caps));",
                "--",
                &path,
                static_json,
            ]);
            c
        }
        _ => return None,
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    Some(cmd)
}

/// The JSON object a script printed: all of its output, or else its last
/// line that parses (scripts that also log to standard output still work).
fn parse_output(stdout: &str) -> Option<Value> {
    if let Ok(v) = serde_json::from_str::<Value>(stdout.trim()) {
        return Some(v);
    }
    stdout.lines().rev().find_map(|l| {
        serde_json::from_str::<Value>(l.trim())
            .ok()
            .filter(Value::is_object)
    })
}

/// Runs a dynamic script with the static tier as input.
pub async fn run_dynamic(
    dir: &Path,
    script: &Path,
    static_tier: &Value,
    timeout: Duration,
) -> Result<Value, Rejection> {
    let static_json = static_tier.to_string();
    // The script runs in `dir`, so it is handed by its absolute path: a
    // relative one (`--dir agents/a`) would be resolved from `dir` again.
    let script = &std::path::absolute(script).unwrap_or_else(|_| script.to_path_buf());
    let Some(mut cmd) = script_command(script, &static_json) else {
        return Err(reject(
            Tier::Dynamic,
            format!("{} is not a supported script", script.display()),
        ));
    };
    cmd.current_dir(dir);
    let name = script
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    let output = match tokio::time::timeout(timeout, cmd.output()).await {
        Err(_) => {
            return Err(reject(
                Tier::Dynamic,
                format!("{name} timed out after {}s", timeout.as_secs()),
            ));
        }
        Ok(Err(err)) => {
            return Err(reject(
                Tier::Dynamic,
                format!("{name} could not be started: {err}"),
            ));
        }
        Ok(Ok(output)) => output,
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: String = stderr
            .lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join(" | ");
        return Err(reject(
            Tier::Dynamic,
            format!("{name} failed ({}): {tail}", output.status),
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    match parse_output(&stdout) {
        Some(v @ Value::Object(_)) => Ok(v),
        Some(other) => Err(reject(
            Tier::Dynamic,
            format!(
                "{name} returned {}, not an object",
                switchyard_core::document::kind(&other)
            ),
        )),
        None => Err(reject(
            Tier::Dynamic,
            format!("{name} printed no JSON object"),
        )),
    }
}

/// Reads the static, dynamic and override tiers of `dir`.
pub async fn read_directory(dir: &Path, script_timeout: Duration) -> DirectoryTiers {
    let mut tiers = DirectoryTiers::default();
    match read_json(&dir.join(".capabilities.json"), Tier::Static) {
        Ok(v) => tiers.static_tier = v,
        Err(r) => tiers.rejections.push(r),
    }
    if let Some(script) = dynamic_script(dir) {
        let input = tiers
            .static_tier
            .clone()
            .unwrap_or_else(|| Value::Object(Default::default()));
        match run_dynamic(dir, &script, &input, script_timeout).await {
            Ok(v) => tiers.dynamic_tier = Some(v),
            Err(r) => tiers.rejections.push(r),
        }
    }
    match read_json(&dir.join(".capabilities.override.json"), Tier::Override) {
        Ok(v) => tiers.override_tier = v,
        Err(r) => tiers.rejections.push(r),
    }
    tiers
}

/// Merges base facts and a directory's tiers, then redacts sensitive values
/// (built-in key words plus the static tier's `sensitive` list). Tags
/// derived by detection apply only when no tier sets `tags` itself.
pub fn merge(base: Value, tiers: &DirectoryTiers, limits: &Limits) -> Merged {
    let mut base = base;
    let sets_tags = [
        &tiers.static_tier,
        &tiers.dynamic_tier,
        &tiers.override_tier,
    ]
    .iter()
    .any(|t| t.as_ref().is_some_and(|v| v.get("tags").is_some()));
    if sets_tags && let Some(obj) = base.as_object_mut() {
        obj.remove("tags");
    }
    let mut list = vec![(Tier::Base, base)];
    for (tier, value) in [
        (Tier::Static, &tiers.static_tier),
        (Tier::Dynamic, &tiers.dynamic_tier),
        (Tier::Override, &tiers.override_tier),
    ] {
        if let Some(v) = value {
            list.push((tier, v.clone()));
        }
    }
    let mut merged = switchyard_core::merge_tiers(&list, limits);
    merged
        .rejections
        .splice(0..0, tiers.rejections.iter().cloned());
    let extra = tiers
        .static_tier
        .as_ref()
        .map(redact::declared_sensitive)
        .unwrap_or_default();
    redact::redact(&mut merged.document, &extra);
    // The `sensitive` list itself is configuration, not a capability.
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_with_log_lines_still_parses() {
        assert_eq!(
            parse_output("detecting...\n{\"a\": 1}\n"),
            Some(serde_json::json!({"a": 1}))
        );
        assert_eq!(
            parse_output("{\"a\": 1}"),
            Some(serde_json::json!({"a": 1}))
        );
        assert_eq!(parse_output("nothing here"), None);
    }
}
