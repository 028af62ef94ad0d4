//! `WatchTask`: a task's history entries as they happen, each with the task
//! as of that entry (its state then; what only a later state has left
//! out), until it ends; with `output`, the task's output too, what is
//! stored first and then as it is stored, the final state sent after the
//! last output. The watch wakes on the dispatcher's change notifications
//! (fed from every replica's store events: changes and stored output), and
//! re-reads the task now and then anyway: a notification can be lost (the
//! database restarted, or the replica that changed it died on the way).

use std::pin::Pin;

use switchyard_proto::v1 as pb;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tonic::Status;
use uuid::Uuid;

use super::{Api, bounds};
use crate::model::{TaskRecord, TaskState};
use crate::store::Following;
use crate::wire;

/// How long a watch waits for a change notification before it re-reads the
/// task anyway.
const WATCH_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// A watch's stream.
pub(super) type WatchStream =
    Pin<Box<dyn Stream<Item = Result<pb::WatchTaskResponse, Status>> + Send>>;

/// One watch of one task.
pub(super) struct Watch {
    api: Api,
    id: Uuid,
    /// Subscribed before the first read, so no change falls in between.
    changes: broadcast::Receiver<Uuid>,
    /// Other replicas' changes reach `changes` while held.
    _following: Following,
    tx: mpsc::Sender<Result<pb::WatchTaskResponse, Status>>,
    /// The last history entry sent.
    last_sequence: u64,
    /// The task state last sent.
    sent_state: Option<TaskState>,
    /// With output: the offset of the task's output read up to.
    output: Option<u64>,
}

/// Chunks of output read at once.
const OUTPUT_PAGE: u32 = 1_000;

impl Watch {
    /// Follows `record` (read after `changes` subscribed) in a task of its
    /// own; the stream of what it sends.
    ///
    /// With `output` (an offset to read the task's output from), the
    /// output too: what is stored first, then what arrives, the final
    /// state sent after the last output.
    pub(super) fn start(
        api: Api,
        record: TaskRecord,
        (changes, following): (broadcast::Receiver<Uuid>, Following),
        output: Option<u64>,
    ) -> WatchStream {
        let (tx, rx) = mpsc::channel(64);
        let watch = Watch {
            api,
            id: record.id,
            changes,
            _following: following,
            tx,
            last_sequence: 0,
            sent_state: None,
            output,
        };
        tokio::spawn(watch.run(record));
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    async fn run(mut self, mut record: TaskRecord) {
        loop {
            match self.send_news(&record).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(status) => {
                    let _ = self.tx.send(Err(status)).await;
                    return;
                }
            }
            if record.state.is_terminal() || !self.wait_for_change().await {
                return;
            }
            record = match self.api.store.get_task(self.id).await {
                Ok(r) => r,
                Err(err) => {
                    let _ = self.tx.send(Err(Status::from(err))).await;
                    return;
                }
            };
        }
    }

    /// Everything in the history since the last message, each with the task
    /// as of the entry ([`as_of`]; the last one as read), and with output,
    /// the output stored since, before a final state. The history can run
    /// ahead of that read (a change committed in between); the next read
    /// then brings no new entry, and the task is sent alone, so the last
    /// message always shows the task as it ends. False once the watcher is
    /// gone.
    async fn send_news(&mut self, record: &TaskRecord) -> Result<bool, Status> {
        let events = self
            .api
            .store
            .task_events(self.id, self.last_sequence, 1000)
            .await?;
        let task = self.api.task_with_reason(record).await?;
        let mut news = Vec::with_capacity(events.len() + 1);
        if events.is_empty() && self.sent_state != Some(record.state) {
            news.push(pb::WatchTaskResponse {
                event: None,
                task: Some(task.clone()),
                output: Vec::new(),
            });
        }
        self.sent_state = Some(record.state);
        for (i, event) in events.iter().enumerate() {
            self.last_sequence = event.sequence;
            let event = wire::event(event);
            let latest = i + 1 == events.len() && event.state == task.state;
            news.push(pb::WatchTaskResponse {
                task: Some(if latest {
                    task.clone()
                } else {
                    as_of(&task, &event)
                }),
                event: Some(event),
                output: Vec::new(),
            });
        }
        // A final state comes after the output: the task's last word.
        let last = news.pop_if(|m| {
            m.task
                .as_ref()
                .and_then(|t| wire::store_task_state(t.state()))
                .is_some_and(TaskState::is_terminal)
        });
        for item in news {
            if self.tx.send(Ok(item)).await.is_err() {
                return Ok(false);
            }
        }
        if !self.send_output().await? {
            return Ok(false);
        }
        if let Some(item) = last
            && self.tx.send(Ok(item)).await.is_err()
        {
            return Ok(false);
        }
        Ok(true)
    }

    /// The output stored since the last read, in messages within the page
    /// budget; false once the watcher is gone.
    async fn send_output(&mut self) -> Result<bool, Status> {
        let Some(mut read_to) = self.output else {
            return Ok(true);
        };
        loop {
            let chunks = self
                .api
                .store
                .task_output(self.id, read_to, None, OUTPUT_PAGE)
                .await?;
            let (mut output, next) = wire::output::chunks(&chunks, read_to);
            read_to = next;
            self.output = Some(read_to);
            while !output.is_empty() {
                let fit = bounds::fitting(&output).max(1);
                let rest = output.split_off(fit);
                let item = pb::WatchTaskResponse {
                    event: None,
                    task: None,
                    output,
                };
                if self.tx.send(Ok(item)).await.is_err() {
                    return Ok(false);
                }
                output = rest;
            }
            if chunks.len() < OUTPUT_PAGE as usize {
                return Ok(true);
            }
        }
    }

    /// Waits for this task to change (on any replica), or for the re-check;
    /// false when the watch must end (the server shuts down).
    async fn wait_for_change(&mut self) -> bool {
        let recheck = tokio::time::sleep(WATCH_RECHECK);
        tokio::pin!(recheck);
        loop {
            let changed = tokio::select! {
                changed = self.changes.recv() => changed,
                () = &mut recheck => return true,
                () = self.api.dispatcher.stopped() => {
                    let gone = Status::unavailable("server shutting down; watch again on another replica");
                    let _ = self.tx.send(Err(gone)).await;
                    return false;
                }
            };
            match changed {
                Ok(changed) if changed == self.id => return true,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return true,
                Err(broadcast::error::RecvError::Closed) => return false,
            }
        }
    }
}

/// `task` (as read now) as it stood after `event`, an earlier entry of its
/// history: the event's state and time; the result, error, progress and
/// queued reason, which belong to the state read, left out; the lease kept
/// only if it is the event's. Attempts, labels and the rest are as read.
fn as_of(task: &pb::Task, event: &pb::TaskEvent) -> pb::Task {
    let lease = task
        .lease
        .clone()
        .filter(|lease| !event.lease_id.is_empty() && lease.lease_id == event.lease_id);
    pb::Task {
        state: event.state,
        queued_reason: pb::QueuedReason::Unspecified as i32,
        result: None,
        error: None,
        progress: None,
        lease,
        updated_at: event.occurred_at,
        ..task.clone()
    }
}
