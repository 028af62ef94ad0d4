//! Who the agent is on its host: its directory, made absolute once
//! ([`agent_dir`], so scripts and tier reads never depend on the working
//! directory and a missing directory is an error, not an empty document),
//! and its default name ([`default_name`]), the same rule in the Rust agent
//! and the Python and Node runners (`tests/conformance/naming.json`):
//! `{hostname}-{runner}-{h}`, where `h` is the first six hex digits of the
//! SHA-256 of the canonical directory. Two runners on one host, or one
//! runner in two directories, so get names of their own, and a restart in
//! the same directory keeps its name.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// `dir` canonicalised (absolute, symlinks resolved), or why it cannot be
/// an agent directory.
pub fn agent_dir(dir: &Path) -> Result<PathBuf, String> {
    let canonical = std::fs::canonicalize(dir)
        .map_err(|err| format!("agent directory {}: {err}", dir.display()))?;
    if !canonical.is_dir() {
        return Err(format!(
            "agent directory {}: not a directory",
            dir.display()
        ));
    }
    Ok(canonical)
}

/// The name an agent registers under when none is given: the hostname,
/// the runner (`rust`, `python`, `node`) and a short hash of the canonical
/// agent directory.
pub fn default_name(hostname: &str, runner: &str, canonical_dir: &Path) -> String {
    let digest = Sha256::digest(canonical_dir.to_string_lossy().as_bytes());
    let h: String = digest.iter().take(3).map(|b| format!("{b:02x}")).collect();
    format!("{hostname}-{runner}-{h}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_or_a_file_is_refused() {
        let err = agent_dir(Path::new("/nonexistent/agent")).unwrap_err();
        assert!(err.contains("/nonexistent/agent"), "{err}");
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = agent_dir(file.path()).unwrap_err();
        assert!(err.contains("not a directory"), "{err}");
    }

    #[test]
    fn names_differ_by_runner_and_directory_and_stay_put() {
        let a = default_name("build-7", "rust", Path::new("/srv/a"));
        assert!(a.starts_with("build-7-rust-") && a.len() == "build-7-rust-".len() + 6);
        assert_eq!(a, default_name("build-7", "rust", Path::new("/srv/a")));
        assert_ne!(a, default_name("build-7", "python", Path::new("/srv/a")));
        assert_ne!(a, default_name("build-7", "rust", Path::new("/srv/b")));
    }
}
