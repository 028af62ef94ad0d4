//! The `exec` task kind: runs a command (argv, env, cwd, timeout: the
//! payload's `timeout_secs`, bounded by the task's execution timeout) in its
//! own process group, streams its standard output and error as the task's
//! output while it runs (batched and bounded by the agent's output limits)
//! and keeps their first bytes for the result, reports the exit code, and
//! kills the whole group on cancellation or timeout. Enabled only with
//! `--allow-exec`.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use switchyard_proto::v1::OutputStream;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use crate::handler::{Handler, TaskContext, TaskFailure};
use crate::output::{OutputSink, Utf8Carry};

/// Output kept per stream in the result.
pub const OUTPUT_LIMIT: usize = 64 * 1024;

/// The `exec` handler.
#[derive(Debug, Clone)]
pub struct Exec {
    /// Timeout when the payload gives none.
    pub default_timeout: Duration,
}

impl Default for Exec {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(3600),
        }
    }
}

/// Reads a process's stream to its end: every read goes to the task's
/// output as it comes (the sink batches and bounds it), and the first
/// [`OUTPUT_LIMIT`] bytes are kept for the result.
async fn read_stream(
    mut reader: impl AsyncRead + Unpin,
    stream: OutputStream,
    sink: OutputSink,
) -> (String, bool) {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut truncated = false;
    let mut text = Utf8Carry::default();
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                sink.write(stream, &text.decode(&buf[..n]));
                let room = OUTPUT_LIMIT.saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    sink.write(stream, &text.finish());
    (String::from_utf8_lossy(&kept).into_owned(), truncated)
}

fn bad_payload(message: &str) -> TaskFailure {
    TaskFailure {
        retryable: false,
        ..TaskFailure::new("bad_payload", message)
    }
}

#[async_trait]
impl Handler for Exec {
    async fn run(&self, task: TaskContext) -> Result<Value, TaskFailure> {
        let p = &task.payload;
        let argv: Vec<String> = p
            .get("argv")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let Some((program, args)) = argv.split_first() else {
            return Err(bad_payload(
                "payload.argv must be a non-empty array of strings",
            ));
        };
        let timeout = p
            .get("timeout_secs")
            .and_then(Value::as_f64)
            .filter(|t| *t > 0.0)
            .map_or(self.default_timeout, Duration::from_secs_f64);
        // The task's execution timeout bounds it too: the server revokes the
        // lease then, and the process group should not outlive it.
        let timeout = task.execution_timeout.map_or(timeout, |t| t.min(timeout));
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(env) = p.get("env").and_then(Value::as_object) {
            for (k, v) in env {
                if let Some(v) = v.as_str() {
                    cmd.env(k, v);
                }
            }
        }
        // What the lease holds wins over the payload: a task sees the GPUs assigned to it.
        cmd.envs(task.resources.env());
        if let Some(cwd) = p.get("cwd").and_then(Value::as_str) {
            cmd.current_dir(cwd);
        }
        let mut child = cmd.spawn().map_err(|err| {
            TaskFailure::new("spawn_failed", format!("cannot start {program}: {err}"))
        })?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let sink = &task.output;
        let stdout = child
            .stdout
            .take()
            .map(|s| tokio::spawn(read_stream(s, OutputStream::Stdout, sink.clone())));
        let stderr = child
            .stderr
            .take()
            .map(|s| tokio::spawn(read_stream(s, OutputStream::Stderr, sink.clone())));
        task.progress(-1.0, format!("running {program}"));
        let kill_group = || {
            if let Some(pgid) = pgid {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
        };
        let status = tokio::select! {
            status = child.wait() => status.map_err(|err| TaskFailure::new("wait_failed", err.to_string()))?,
            () = task.cancel.cancelled() => {
                kill_group();
                let _ = child.wait().await;
                return Err(TaskFailure { retryable: false, ..TaskFailure::new("canceled", "canceled; process group killed") });
            }
            () = tokio::time::sleep(timeout) => {
                kill_group();
                let _ = child.wait().await;
                return Err(TaskFailure::new("timeout", format!("timed out after {}s; process group killed", timeout.as_secs_f64())));
            }
        };
        let (out, out_truncated) = match stdout {
            Some(h) => h.await.unwrap_or_default(),
            None => Default::default(),
        };
        let (err, err_truncated) = match stderr {
            Some(h) => h.await.unwrap_or_default(),
            None => Default::default(),
        };
        let result = json!({
            "exit_code": status.code(),
            "stdout": out,
            "stderr": err,
            "truncated": out_truncated || err_truncated,
        });
        if status.success() {
            Ok(result)
        } else {
            Err(TaskFailure {
                message: format!("{program} exited with {status}"),
                details: result,
                ..TaskFailure::new("exit_code", "")
            })
        }
    }
}
