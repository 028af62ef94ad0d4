//! The server under test: either one this process starts (a server binary
//! on a given database, on an ephemeral port, with the per-namespace caps
//! lifted) or an existing one given by address. Its CPU time and peak RSS
//! come from `/proc/<pid>/stat` and `/proc/<pid>/status` (`VmHWM`).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A server this process started; stopped with SIGTERM on [`Spawned::stop`].
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    /// The address it printed.
    pub addr: String,
    /// Its process id, for `/proc`.
    pub pid: u32,
}

impl Spawned {
    /// Starts `bin` on `database_url` at `127.0.0.1:0` with `extra` flags;
    /// waits for its `listening on` line. Its logs go to `log` (or nowhere).
    pub async fn start(
        bin: &PathBuf,
        database_url: &str,
        heartbeat_interval_ms: u64,
        extra: &[String],
        log: Option<&PathBuf>,
    ) -> anyhow::Result<Self> {
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::File::create(path)
                    .with_context(|| format!("creating server log {}", path.display()))?,
            ),
            None => Stdio::null(),
        };
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--database-url", database_url])
            .args(["--max-queued-tasks-per-namespace", "0"])
            .args(["--max-agents-per-namespace", "0"])
            .args(["--shutdown-grace-ms", "1000"])
            .arg("--heartbeat-interval-ms")
            .arg(heartbeat_interval_ms.to_string())
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("server exited at once")?;
        let stdout = child.stdout.take().context("server stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.strip_prefix("switchyard-server listening on ") {
                    return Ok::<_, std::io::Error>(Some(addr.trim().to_owned()));
                }
            }
            Ok(None)
        })
        .await
        .context("server did not say where it listens within 60 s")?
        .context("reading server stdout")?
        .context("server exited before listening (see its log)")?;
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self { child, addr, pid })
    }

    /// SIGTERM, then SIGKILL if it has not exited within 10 s.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await.context("killing the server")?;
        }
        Ok(())
    }
}

/// One reading of a process's resource use.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size now, in KiB.
    pub rss_kib: u64,
    /// Peak resident set size so far (`VmHWM`), in KiB.
    pub peak_rss_kib: u64,
    /// Threads.
    pub threads: u64,
}

/// Reads `/proc/<pid>`; `None` if the process is gone or not readable.
pub fn sample(pid: u32) -> Option<Sample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Some(Sample {
        cpu_seconds: (utime + stime) / clock_ticks(),
        rss_kib: field("VmRSS:"),
        peak_rss_kib: field("VmHWM:"),
        threads: field("Threads:"),
    })
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux we run on).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}
