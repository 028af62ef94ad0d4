//! A program embedding the agent library with one handler, `conformance.output`, that writes the
//! steps its task's payload carries (`tests/conformance/output.json`) to `ctx.stdout`,
//! `ctx.stderr` and `ctx.log`, then fails if the payload says so. The cross-language test
//! (`tests/crosslang/test_same_output.py`) runs it beside the Python and Node runners.
//!
//! `output_scenario SERVER_URL AGENT_DIR NAME`; stops on SIGTERM or Ctrl-C.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use switchyard_agent::{AgentConfig, Handler, Handlers, TaskContext, TaskFailure};

/// Replays the payload's steps.
struct Replay;

#[async_trait]
impl Handler for Replay {
    async fn run(&self, task: TaskContext) -> Result<Value, TaskFailure> {
        let steps = task.payload["steps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for step in steps {
            let text = step["text"].as_str().unwrap_or_default();
            match step["stream"].as_str() {
                Some("stdout") => task.stdout(text),
                Some("stderr") => task.stderr(text),
                _ => task.log(text),
            }
        }
        if task.payload["fail"] == json!(true) {
            return Err(TaskFailure::new("scenario", "the scenario fails"));
        }
        Ok(json!({}))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(server), Some(dir), Some(name)) = (args.next(), args.next(), args.next()) else {
        anyhow::bail!("usage: output_scenario SERVER_URL AGENT_DIR NAME");
    };
    let config = AgentConfig {
        server,
        token: None,
        tls: Default::default(),
        name,
        namespace: "default".into(),
        dir: switchyard_agent::identity::agent_dir(std::path::Path::new(&dir))
            .map_err(anyhow::Error::msg)?,
        capacity: 1,
        refresh: Duration::from_secs(30),
        script_timeout: Duration::from_secs(10),
        redetect: Duration::from_secs(3600),
        grace: Duration::from_secs(5),
        labels: Default::default(),
        output: Default::default(),
    };
    let handlers = Handlers::new().handler("conformance.output", Replay);
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    switchyard_agent::run(config, handlers, stop).await
}
