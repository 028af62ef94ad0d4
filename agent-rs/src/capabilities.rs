//! The agent's capability document: built-in detection (the base tier, with
//! the `provides` of its handler packs), then the agent directory's static,
//! dynamic and override tiers, merged and redacted by the core. Tool
//! detection is slow-changing and runs at start and on `--redetect`; memory
//! and load are refreshed on every `--refresh`; the tier files are re-read
//! when they change on disk.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use switchyard_core::Limits;
use switchyard_core::tier::Merged;

use crate::detect;
use crate::handler::Handlers;
use crate::tiers::{self, DYNAMIC_EXTENSIONS};

/// Builds and refreshes the document.
#[derive(Debug)]
pub struct Capabilities {
    /// The agent directory.
    dir: PathBuf,
    /// How long a dynamic script may run.
    script_timeout: Duration,
    /// How long one detection probe may run.
    probe_timeout: Duration,
    /// The base tier from the last full detection.
    detected: Value,
    /// The handlers' `provides` subtree and unhealthy reasons.
    provides: (Value, Vec<String>),
    /// The directory tiers as last read.
    directory: tiers::DirectoryTiers,
    /// Modification times of the tier files when last read.
    stamps: Vec<Option<SystemTime>>,
    /// The last merge.
    merged: Merged,
}

fn tier_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![
        dir.join(".capabilities.json"),
        dir.join(".capabilities.override.json"),
    ];
    files.extend(
        DYNAMIC_EXTENSIONS
            .iter()
            .map(|e| dir.join(format!(".capabilities.dynamic.{e}"))),
    );
    files
}

fn stamps(dir: &Path) -> Vec<Option<SystemTime>> {
    tier_files(dir)
        .iter()
        .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
        .collect()
}

/// Parameter values for packs: the environment (never copied anywhere).
fn env_lookup(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Capabilities {
    /// Detects, reads the directory and merges.
    pub async fn load(dir: &Path, handlers: &Handlers, script_timeout: Duration) -> Self {
        let probe_timeout = Duration::from_secs(5);
        let mut caps = Self {
            dir: dir.to_owned(),
            script_timeout,
            probe_timeout,
            detected: detect::base(probe_timeout).await,
            provides: handlers.provides(&env_lookup),
            directory: tiers::DirectoryTiers::default(),
            stamps: Vec::new(),
            merged: Merged::default(),
        };
        caps.reread_directory().await;
        caps.merge();
        caps
    }

    async fn reread_directory(&mut self) {
        self.stamps = stamps(&self.dir);
        self.directory = tiers::read_directory(&self.dir, self.script_timeout).await;
    }

    fn merge(&mut self) {
        let mut base = self.detected.clone();
        if let (Some(obj), Some(provides)) = (base.as_object_mut(), self.provides.0.as_object())
            && !provides.is_empty()
        {
            obj.insert("provides".into(), Value::Object(provides.clone()));
        }
        self.merged = tiers::merge(base, &self.directory, &Limits::default());
    }

    /// Refreshes memory and load, and re-reads the tiers if a file changed
    /// (or `force`). Returns true if the document changed.
    pub async fn refresh(&mut self, force: bool) -> bool {
        let before = self.merged.document.clone();
        if let Some(obj) = self.detected.as_object_mut() {
            obj.extend(detect::load_facts());
        }
        if force || stamps(&self.dir) != self.stamps {
            self.reread_directory().await;
        }
        self.merge();
        before != self.merged.document
    }

    /// Re-runs full detection (tool versions etc.).
    pub async fn redetect(&mut self) {
        self.detected = detect::base(self.probe_timeout).await;
        self.merge();
    }

    /// The merged, redacted document.
    pub fn document(&self) -> &Value {
        &self.merged.document
    }

    /// The merge with provenance and rejections.
    pub fn merged(&self) -> &Merged {
        &self.merged
    }

    /// Why the agent is DEGRADED (unhealthy capabilities), if it is.
    pub fn unhealthy(&self) -> &[String] {
        &self.provides.1
    }
}
