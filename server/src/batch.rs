//! Group commit: many callers' small writes become one transaction. Each
//! caller hands its items (the lease reports one agent session read at
//! once, say) to a [`GroupCommit`] and awaits its own results; one runner
//! task per kind of write collects whatever is waiting, applies it in one
//! store call and hands each caller back its share of the results.
//!
//! The runner takes a transaction slot *before* it collects: while every
//! slot is busy committing, new items wait in the queue, so the next batch
//! is as large as the load makes it. Under light load a batch is one
//! caller's items and costs nothing extra; under heavy load one commit (one
//! `fsync` on PostgreSQL with `synchronous_commit` on) serves hundreds of
//! reports from many agents.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tonic::Status;

use crate::error::Result;

/// The results of one store call over a batch, item by item.
type Applied<O> = Result<Vec<Result<O>>>;

/// What applies a batch (one transaction).
type ApplyFn<I, O> =
    Arc<dyn Fn(Vec<I>) -> Pin<Box<dyn Future<Output = Applied<O>> + Send>> + Send + Sync>;

/// One caller's items and where its results go.
struct Job<I, O> {
    items: Vec<I>,
    reply: oneshot::Sender<Result<Vec<Result<O>>, Status>>,
}

/// The handle callers submit through; cheap to clone.
pub struct GroupCommit<I, O> {
    tx: mpsc::Sender<Job<I, O>>,
}

impl<I, O> Clone for GroupCommit<I, O> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<I, O> std::fmt::Debug for GroupCommit<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl<I: Send + 'static, O: Send + 'static> GroupCommit<I, O> {
    /// Starts the runner: batches of at most `max_items` items (callers'
    /// item lists are never split), at most `in_flight` batches committing
    /// at once, each applied by `apply`. With a `linger`, a batch waits that
    /// long after its first item for more (for writes nobody waits on
    /// closely, like heartbeats). Must be called inside a runtime.
    pub fn start<F, Fut>(
        max_items: usize,
        in_flight: usize,
        linger: std::time::Duration,
        apply: F,
    ) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Applied<O>> + Send + 'static,
    {
        let apply: ApplyFn<I, O> = Arc::new(move |items| Box::pin(apply(items)));
        let (tx, rx) = mpsc::channel(4_096);
        tokio::spawn(run(rx, max_items.max(1), in_flight.max(1), linger, apply));
        Self { tx }
    }

    /// Submits `items` and waits for their results, in the same order. A
    /// failure of the whole batch (the database) is the `Err`; a refusal of
    /// one item is that item's `Err`.
    pub async fn submit(&self, items: Vec<I>) -> Result<Vec<Result<O>>, Status> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job { items, reply })
            .await
            .map_err(|_| Status::unavailable("server is shutting down"))?;
        rx.await
            .map_err(|_| Status::unavailable("server is shutting down"))?
    }
}

async fn run<I: Send + 'static, O: Send + 'static>(
    mut rx: mpsc::Receiver<Job<I, O>>,
    max_items: usize,
    in_flight: usize,
    linger: std::time::Duration,
    apply: ApplyFn<I, O>,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut count = first.items.len();
        let mut jobs = vec![first];
        let until = tokio::time::Instant::now() + linger;
        while count < max_items {
            let job = match rx.try_recv() {
                Ok(job) => job,
                Err(_) if linger.is_zero() => break,
                Err(_) => match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(job)) => job,
                    _ => break,
                },
            };
            count += job.items.len();
            jobs.push(job);
        }
        let apply = apply.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut sizes = Vec::with_capacity(jobs.len());
            let mut items = Vec::with_capacity(count);
            let mut replies = Vec::with_capacity(jobs.len());
            for job in jobs {
                sizes.push(job.items.len());
                items.extend(job.items);
                replies.push(job.reply);
            }
            metrics::histogram!(crate::metrics::BATCH_ITEMS).record(count as f64);
            match apply(items).await {
                Ok(results) if results.len() == count => {
                    let mut results = results.into_iter();
                    for (size, reply) in sizes.into_iter().zip(replies) {
                        let _ = reply.send(Ok(results.by_ref().take(size).collect()));
                    }
                }
                Ok(results) => {
                    let status = Status::internal(format!(
                        "a batch of {count} items produced {} results",
                        results.len()
                    ));
                    for reply in replies {
                        let _ = reply.send(Err(status.clone()));
                    }
                }
                Err(err) => {
                    tracing::warn!(cause = %err, items = count, "group commit failed");
                    let status = Status::from(err);
                    for reply in replies {
                        let _ = reply.send(Err(status.clone()));
                    }
                }
            }
        });
    }
}
