//! `switchyard-agent install`: sets the agent up as a systemd service in one
//! command. It writes a unit that runs this binary (`run`) with the agent
//! directory as its working directory, restarts it when it exits, and gives
//! SIGTERM's drain the grace it asks for; and an environment file beside it
//! holding the settings, the token among them, readable by its owner only
//! (mode 0600), so the token is never in the unit, which any user can read.
//! It refuses to replace an existing unit unless told to.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What to install.
#[derive(Debug, Clone)]
pub struct Install {
    /// The unit's name, without `.service`.
    pub service: String,
    /// Where units go (`/etc/systemd/system`).
    pub unit_dir: PathBuf,
    /// The environment file (`/etc/switchyard-agent/<service>.env`).
    pub env_file: PathBuf,
    /// The binary the unit runs.
    pub exe: PathBuf,
    /// The agent directory, canonical.
    pub dir: PathBuf,
    /// The user the service runs as (default: systemd's, root).
    pub user: Option<String>,
    /// Seconds SIGTERM's drain may take; systemd waits 15 s more.
    pub grace_secs: u64,
    /// Replace an existing unit.
    pub force: bool,
    /// `SWITCHYARD_*` settings for the environment file, in order.
    pub env: Vec<(&'static str, String)>,
}

/// The files written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The unit file.
    pub unit: PathBuf,
    /// The environment file.
    pub env_file: PathBuf,
}

impl Install {
    /// The unit file's text.
    pub fn unit_text(&self) -> String {
        let mut unit = String::new();
        let _ = writeln!(unit, "# Written by `switchyard-agent install`.");
        let _ = writeln!(unit, "[Unit]");
        let _ = writeln!(
            unit,
            "Description=Switchyard agent ({})",
            self.dir.display()
        );
        let _ = writeln!(unit, "Wants=network-online.target");
        let _ = writeln!(unit, "After=network-online.target");
        let _ = writeln!(unit);
        let _ = writeln!(unit, "[Service]");
        let _ = writeln!(unit, "Type=exec");
        let _ = writeln!(unit, "EnvironmentFile={}", self.env_file.display());
        let _ = writeln!(unit, "WorkingDirectory={}", self.dir.display());
        let _ = writeln!(unit, "ExecStart={} run", self.exe.display());
        if let Some(user) = &self.user {
            let _ = writeln!(unit, "User={user}");
        }
        let _ = writeln!(unit, "Restart=always");
        let _ = writeln!(unit, "RestartSec=5");
        let _ = writeln!(unit, "KillMode=mixed");
        let _ = writeln!(unit, "TimeoutStopSec={}", self.grace_secs + 15);
        let _ = writeln!(unit);
        let _ = writeln!(unit, "[Install]");
        let _ = writeln!(unit, "WantedBy=multi-user.target");
        unit
    }

    /// The environment file's text, or the setting that cannot be written
    /// into one (a line break).
    pub fn env_text(&self) -> Result<String, String> {
        let mut text = String::from("# Written by `switchyard-agent install`; mode 0600.\n");
        for (key, value) in &self.env {
            if value.contains(['\n', '\r']) {
                return Err(format!("{key} has a line break"));
            }
            // systemd's quoting: double quotes, with \ and " escaped.
            let quoted = value.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(text, "{key}=\"{quoted}\"");
        }
        Ok(text)
    }

    /// Writes the environment file (0600, created with that mode) and the
    /// unit.
    pub fn write(&self) -> Result<Installed, String> {
        let unit = self.unit_dir.join(format!("{}.service", self.service));
        if unit.exists() && !self.force {
            return Err(format!(
                "{} exists (pass --force to replace it)",
                unit.display()
            ));
        }
        let env = self.env_text()?;
        if let Some(parent) = self.env_file.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|err| format!("creating {}: {err}", parent.display()))?;
        }
        write_private(&self.env_file, env.as_bytes())?;
        std::fs::create_dir_all(&self.unit_dir)
            .map_err(|err| format!("creating {}: {err}", self.unit_dir.display()))?;
        std::fs::write(&unit, self.unit_text())
            .map_err(|err| format!("writing {}: {err}", unit.display()))?;
        Ok(Installed {
            unit,
            env_file: self.env_file.clone(),
        })
    }
}

/// Writes `path` readable and writable by its owner only, from the moment
/// it exists.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|err| format!("writing {}: {err}", path.display()))?;
    file.write_all(bytes)
        .map_err(|err| format!("writing {}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn install(root: &Path) -> Install {
        Install {
            service: "switchyard-agent".into(),
            unit_dir: root.join("units"),
            env_file: root.join("etc/switchyard-agent.env"),
            exe: "/usr/local/bin/switchyard-agent".into(),
            dir: "/srv/agent".into(),
            user: Some("switchyard".into()),
            grace_secs: 30,
            force: false,
            env: vec![
                ("SWITCHYARD_SERVER", "https://sy.example:50051".into()),
                ("SWITCHYARD_TOKEN", "sy_a\"b\\c".into()),
            ],
        }
    }

    #[test]
    fn the_token_is_in_the_private_environment_file_not_the_unit() {
        let root = tempfile::tempdir().unwrap();
        let spec = install(root.path());
        let done = spec.write().unwrap();
        let unit = std::fs::read_to_string(&done.unit).unwrap();
        assert!(
            unit.contains("ExecStart=/usr/local/bin/switchyard-agent run"),
            "{unit}"
        );
        assert!(unit.contains("WorkingDirectory=/srv/agent"), "{unit}");
        assert!(unit.contains("User=switchyard"), "{unit}");
        assert!(unit.contains("TimeoutStopSec=45"), "{unit}");
        assert!(!unit.contains("sy_a"), "{unit}");
        let env = std::fs::read_to_string(&done.env_file).unwrap();
        assert!(env.contains(r#"SWITCHYARD_TOKEN="sy_a\"b\\c""#), "{env}");
        let mode = std::fs::metadata(&done.env_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A second install does not replace the unit unless forced.
        assert!(spec.write().unwrap_err().contains("--force"));
        Install {
            force: true,
            ..spec
        }
        .write()
        .unwrap();
    }

    #[test]
    fn a_line_break_in_a_setting_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut spec = install(root.path());
        spec.env.push(("SWITCHYARD_AGENT_NAME", "a\nb".into()));
        assert!(spec.write().unwrap_err().contains("SWITCHYARD_AGENT_NAME"));
    }
}
