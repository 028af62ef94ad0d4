//! Group commit: many callers' small writes become one transaction. Each
//! caller hands its items (the lease reports one agent session read at
//! once, say) to a [`GroupCommit`] and awaits its own results; one runner
//! task per kind of write collects whatever is waiting, applies it in one
//! store call and hands each caller back its share of the results.
//!
//! The runner takes a transaction slot *before* it collects: while every
//! slot is busy committing, new items wait in the queue, so the next batch
//! is as large as the load makes it. Under light load a batch is one
//! caller's items, unless the kind of write asks it to wait a little for
//! company ([`Linger`]); under heavy load one commit (one `fsync` on
//! PostgreSQL with `synchronous_commit` on) serves hundreds of reports from
//! many agents.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::{Error, Result};

/// How long a batch waits for more items after its first.
#[derive(Debug, Clone, Copy)]
pub enum Linger {
    /// Not at all: a batch is whatever waits when a slot frees.
    None,
    /// Always this long (for writes nobody waits on closely, like
    /// heartbeats).
    Always(Duration),
    /// Up to `wait`, if the runner had to wait for the first item, and only
    /// until the batch holds `enough` items; items already queued when a
    /// slot frees go at once. For writes whose callers wait for them, like
    /// lease reports: company is sought when the store is quiet, and a busy
    /// store finds it at once.
    WhenIdle {
        /// The longest wait.
        wait: Duration,
        /// Items that end the wait.
        enough: usize,
    },
}

/// The results of one store call over a batch, item by item.
type Applied<O> = Result<Vec<Result<O>>>;

/// What applies a batch (one transaction).
type ApplyFn<I, O> =
    Arc<dyn Fn(Vec<I>) -> Pin<Box<dyn Future<Output = Applied<O>> + Send>> + Send + Sync>;

/// One caller's items and where its results go.
struct Job<I, O> {
    items: Vec<I>,
    reply: oneshot::Sender<Result<Vec<Result<O>>>>,
}

/// The handle callers submit through; cheap to clone.
pub struct GroupCommit<I, O> {
    tx: mpsc::Sender<Job<I, O>>,
    /// Items sent and not yet taken into a batch.
    waiting: Arc<AtomicUsize>,
}

impl<I, O> Clone for GroupCommit<I, O> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            waiting: self.waiting.clone(),
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
    /// at once, each applied by `apply`, each waiting for more items after
    /// its first as `linger` says. Must be called inside a runtime.
    pub fn start<F, Fut>(max_items: usize, in_flight: usize, linger: Linger, apply: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Applied<O>> + Send + 'static,
    {
        let apply: ApplyFn<I, O> = Arc::new(move |items| Box::pin(apply(items)));
        let (tx, rx) = mpsc::channel(4_096);
        let waiting = Arc::new(AtomicUsize::new(0));
        let limits = (max_items.max(1), in_flight.max(1));
        tokio::spawn(run(rx, waiting.clone(), limits, linger, apply));
        Self { tx, waiting }
    }

    /// How many items wait for a batch (not yet taken into one being
    /// committed).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Submits `items` and waits for their results, in the same order. A
    /// failure of the whole batch (the database) is the `Err`
    /// ([`Error::Batch`], shared by every caller in the batch); a refusal of
    /// one item is that item's `Err`.
    pub async fn submit(&self, items: Vec<I>) -> Result<Vec<Result<O>>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let gone = || Error::Unavailable("server is shutting down".to_owned());
        let (reply, rx) = oneshot::channel();
        let count = items.len();
        self.waiting.fetch_add(count, Ordering::Relaxed);
        if self.tx.send(Job { items, reply }).await.is_err() {
            self.waiting.fetch_sub(count, Ordering::Relaxed);
            return Err(gone());
        }
        rx.await.map_err(|_| gone())?
    }
}

async fn run<I: Send + 'static, O: Send + 'static>(
    mut rx: mpsc::Receiver<Job<I, O>>,
    waiting: Arc<AtomicUsize>,
    (max_items, in_flight): (usize, usize),
    linger: Linger,
    apply: ApplyFn<I, O>,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (first, waited) = match rx.try_recv() {
            Ok(job) => (job, false),
            Err(_) => match rx.recv().await {
                Some(job) => (job, true),
                None => return,
            },
        };
        let (linger, enough) = match linger {
            Linger::Always(wait) => (wait, max_items),
            Linger::WhenIdle { wait, enough } if waited => (wait, enough.min(max_items)),
            Linger::None | Linger::WhenIdle { .. } => (Duration::ZERO, max_items),
        };
        let mut count = first.items.len();
        let mut jobs = vec![first];
        let until = tokio::time::Instant::now() + linger;
        while count < max_items {
            let linger = if count >= enough {
                Duration::ZERO
            } else {
                linger
            };
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
        waiting.fetch_sub(count, Ordering::Relaxed);
        tokio::spawn(commit(jobs, count, apply.clone(), slot));
    }
}

/// Applies one batch of `count` items (holding its transaction `slot`
/// until done) and hands each caller its share of the results; a failure
/// of the whole batch is every caller's.
async fn commit<I, O>(
    jobs: Vec<Job<I, O>>,
    count: usize,
    apply: ApplyFn<I, O>,
    _slot: tokio::sync::OwnedSemaphorePermit,
) {
    let mut sizes = Vec::with_capacity(jobs.len());
    let mut items = Vec::with_capacity(count);
    let mut replies = Vec::with_capacity(jobs.len());
    for job in jobs {
        sizes.push(job.items.len());
        items.extend(job.items);
        replies.push(job.reply);
    }
    metrics::histogram!(crate::metrics::BATCH_ITEMS).record(count as f64);
    let failure = match apply(items).await {
        Ok(results) if results.len() == count => {
            let mut results = results.into_iter();
            for (size, reply) in sizes.into_iter().zip(replies) {
                let _ = reply.send(Ok(results.by_ref().take(size).collect()));
            }
            return;
        }
        Ok(results) => Error::Corrupt {
            context: "group commit",
            detail: format!(
                "a batch of {count} items produced {} results",
                results.len()
            ),
        },
        Err(err) => {
            tracing::warn!(cause = %err, items = count, "group commit failed");
            err
        }
    };
    let failure = Arc::new(failure);
    for reply in replies {
        let _ = reply.send(Err(Error::Batch(failure.clone())));
    }
}

#[cfg(test)]
mod tests {
    //! The runner on tokio's paused clock: a linger that runs out advances
    //! the clock by itself, so how long a batch waited is exact.

    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    /// What the store saw: each batch's size and when it was applied.
    type Applied = Arc<Mutex<Vec<(usize, Duration)>>>;

    /// A runner whose store records each batch, then waits for a permit of
    /// `gate` (as a slow commit would) and answers each item with itself.
    fn runner(
        in_flight: usize,
        linger: Linger,
        gate: Arc<Semaphore>,
    ) -> (GroupCommit<u32, u32>, Applied) {
        let applied: Applied = Arc::default();
        let (seen, start) = (applied.clone(), Instant::now());
        let group = GroupCommit::start(512, in_flight, linger, move |items: Vec<u32>| {
            seen.lock().unwrap().push((items.len(), start.elapsed()));
            let gate = gate.clone();
            async move {
                gate.acquire().await.unwrap().forget();
                Ok(items.into_iter().map(Ok).collect())
            }
        });
        (group, applied)
    }

    /// Lets every other task run until it waits.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_store_waits_for_company_until_there_is_enough() {
        let open = Arc::new(Semaphore::new(100));
        let linger = Linger::WhenIdle {
            wait: Duration::from_secs(10),
            enough: 2,
        };
        let (group, applied) = runner(2, linger, open);
        settle().await;
        let first = tokio::spawn({
            let group = group.clone();
            async move { group.submit(vec![1]).await }
        });
        settle().await;
        assert!(applied.lock().unwrap().is_empty(), "a lone report waits");
        let second = group.submit(vec![2]).await.unwrap();
        assert_eq!(first.await.unwrap().unwrap()[0].as_ref().ok(), Some(&1));
        assert_eq!(second[0].as_ref().ok(), Some(&2));
        // Enough came at once: one batch of both, no time waited.
        assert_eq!(*applied.lock().unwrap(), vec![(2, Duration::ZERO)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_item_waits_out_the_linger() {
        for linger in [
            Linger::Always(Duration::from_secs(10)),
            Linger::WhenIdle {
                wait: Duration::from_secs(10),
                enough: 32,
            },
        ] {
            let (group, applied) = runner(2, linger, Arc::new(Semaphore::new(100)));
            // The runner starts and finds nothing to do: the store is quiet.
            settle().await;
            group.submit(vec![7]).await.unwrap();
            assert_eq!(
                *applied.lock().unwrap(),
                vec![(1, Duration::from_secs(10))],
                "{linger:?}"
            );
        }
        let (group, applied) = runner(2, Linger::None, Arc::new(Semaphore::new(100)));
        group.submit(vec![7]).await.unwrap();
        assert_eq!(*applied.lock().unwrap(), vec![(1, Duration::ZERO)]);
    }

    #[tokio::test(start_paused = true)]
    async fn items_queued_while_the_store_is_busy_go_at_once() {
        let gate = Arc::new(Semaphore::new(0));
        let linger = Linger::WhenIdle {
            wait: Duration::from_secs(10),
            enough: 32,
        };
        let (group, applied) = runner(1, linger, gate.clone());
        settle().await;
        let first = tokio::spawn({
            let group = group.clone();
            async move { group.submit(vec![1]).await }
        });
        // The first batch waits out its linger, then commits slowly.
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(*applied.lock().unwrap(), vec![(1, Duration::from_secs(10))]);
        let second = tokio::spawn({
            let group = group.clone();
            async move { group.submit(vec![2]).await }
        });
        settle().await;
        gate.add_permits(2);
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        // The second was waiting when the slot freed: applied at once.
        assert_eq!(
            *applied.lock().unwrap(),
            vec![(1, Duration::from_secs(10)), (1, Duration::from_secs(11))]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn what_waits_is_counted_in_items_not_calls() {
        let gate = Arc::new(Semaphore::new(0));
        let (group, applied) = runner(1, Linger::None, gate.clone());
        // The only slot is taken by a slow batch.
        let first = tokio::spawn({
            let group = group.clone();
            async move { group.submit(vec![1]).await }
        });
        settle().await;
        assert_eq!(group.waiting(), 0, "taken into the batch");
        let second = tokio::spawn({
            let group = group.clone();
            async move { group.submit(vec![2, 3, 4, 5, 6]).await }
        });
        settle().await;
        assert_eq!(group.waiting(), 5, "one call of five items waits");
        gate.add_permits(2);
        first.await.unwrap().unwrap();
        assert_eq!(second.await.unwrap().unwrap().len(), 5);
        assert_eq!(group.waiting(), 0);
        assert_eq!(
            applied
                .lock()
                .unwrap()
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>(),
            vec![1, 5]
        );
    }
}
