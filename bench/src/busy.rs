//! Busy tasks: a backlog that an agent here can run, but that has no room.
//!
//! `--busy N` submits N tasks before the fleet connects, at priority 10
//! (ahead of every other task), that only one agent can run: a holder with
//! capacity 1 and a tag no fleet agent has. The holder takes one and keeps
//! it (accepted and started, never finished), so the other N - 1 wait busy
//! at the head of the queue while the fleet's own tasks flow behind them, as
//! a backlog for a saturated pool of special machines waits in front of
//! everyday work.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde_json::{Value, json};
use switchyard_proto::convert::json_to_struct;
use switchyard_proto::v1 as pb;
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::agent::{self, Counters, HOLD, Leave};
use crate::fleet;

/// The tag only the holder has.
const TAG: &str = "bench-busy";

/// What `--busy` did.
#[derive(Debug, Serialize)]
pub struct BusyReport {
    /// Busy tasks submitted (and failed submits).
    pub tasks: u64,
    pub submit_errors: u64,
    /// The holder took one of them and keeps it.
    pub held: u64,
}

/// The holder's document: a fleet agent's, with the busy tag.
fn holder_document(index: usize) -> Value {
    let mut document = fleet::document(index, 1);
    if let Some(tags) = document["tags"].as_array_mut() {
        tags.push(json!(TAG));
    }
    document
}

/// Submits `tasks` busy tasks from `submitters` concurrent submitters,
/// `batch` to a call; returns (ok, errors).
pub async fn submit(channel: Channel, tasks: u64, submitters: usize, batch: u64) -> (u64, u64) {
    let errors = crate::submit_pool(
        &[channel],
        tasks,
        submitters,
        batch,
        0.0,
        move |n| pb::SubmitTaskRequest {
            kind: "parked".into(),
            priority: 10,
            payload: Some(json_to_struct(&json!({ HOLD: 1, "n": n }))),
            placement: Some(pb::Placement {
                selector: TAG.into(),
                ..Default::default()
            }),
            ..Default::default()
        },
        |_| {},
    )
    .await;
    (tasks - errors, errors)
}

/// The holder's session, connected and holding one busy task.
pub struct Holder {
    stop: watch::Sender<bool>,
    session: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Holder {
    /// Connects the holder (agent `index`) and waits until it was granted
    /// a busy task, for at most `timeout`.
    pub async fn start(
        channel: Channel,
        run_id: &str,
        index: usize,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let registered =
            agent::register_as(channel.clone(), run_id, index, holder_document(index), 1).await?;
        let counters = Arc::new(Counters::new(0));
        let (stop, stop_rx) = watch::channel(false);
        let (welcomed_tx, _welcomed_rx) = tokio::sync::oneshot::channel();
        let session = tokio::spawn(agent::run(
            channel,
            registered,
            counters.clone(),
            stop_rx,
            welcomed_tx,
            Leave::HangUp,
            0,
        ));
        let deadline = tokio::time::Instant::now() + timeout;
        while counters.grants.load(Ordering::Relaxed) == 0 {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the busy tasks' holder was granted none within {timeout:?}"
            );
            anyhow::ensure!(!session.is_finished(), "the busy tasks' holder hung up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self { stop, session })
    }

    /// Hangs up.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        self.session.await.context("the holder panicked")?
    }
}
