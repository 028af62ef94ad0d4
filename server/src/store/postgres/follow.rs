//! What this replica reads of the others' events, as they learn it: while
//! something here reads them, the replica holds a connection named for it,
//! which the others count once a second: a dispatcher connection
//! ([`peers::dispatcher_name`]) while agents are connected here or the
//! fleet is followed (a task queued, an agent changed, a lease ended or
//! revoked), a follower connection ([`peers::follower_name`]) while a task
//! or the queue is watched (tasks' changes and output, and the
//! dispatcher's events besides). It greets them when it begins, waiting
//! for their answers, so no such event they commit after [`Follow::follow`]
//! returns goes unnotified. The connection is kept for [`LINGER`] after the
//! last reader goes, so a reader started now and then (a CLI waiting on a
//! task, an agent reconnecting) does not reconnect and greet each time;
//! while read, it is checked every [`KEEP_EVERY`] and opened again (and the
//! others greeted again) if it was lost, as a restarted or failed-over
//! database loses it.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use tokio::sync::{Mutex, mpsc};
use uuid::Uuid;

use super::peers::{self, Peers};
use crate::store::Following;

/// How long the connection outlives the last reader.
const LINGER: Duration = Duration::from_secs(30);

/// How often the connection is checked while read.
const KEEP_EVERY: Duration = Duration::from_secs(1);

/// The longest a connect or a check of the connection may take: new
/// readers (watchers, agents connecting) wait for them, and a socket cut
/// off without a reset would otherwise hold them until TCP gives up.
const WAIT: Duration = Duration::from_secs(5);

/// What is read: the dispatcher's events, or tasks' changes as well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reads {
    /// A task queued, an agent changed, a lease ended or revoked.
    Dispatch,
    /// Those, and a task's changes and output.
    Tasks,
}

impl Reads {
    /// What the others are told this replica reads, in warnings.
    fn what(self) -> &'static str {
        match self {
            Reads::Dispatch => "reads the dispatcher's events",
            Reads::Tasks => "follows tasks' changes",
        }
    }
}

/// The other replicas' answers to this replica's greetings, shared by its
/// two [`Follow`]s: one greets at a time.
pub(super) type Answers = Arc<Mutex<mpsc::Receiver<Uuid>>>;

/// This replica's readers of one kind of the others' events, and what
/// tells the others.
#[derive(Debug)]
pub(super) struct Follow {
    /// What the readers read.
    reads: Reads,
    /// Where greetings are sent from.
    pool: PgPool,
    /// The database, with the connection's name.
    named: PgConnectOptions,
    /// This replica.
    origin: Uuid,
    /// What this replica knows of the others (counted again on greeting).
    peers: Arc<Peers>,
    /// The answers to this replica's greetings.
    answers: Answers,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Readers holding a [`Following`] of this replica.
    readers: usize,
    /// The connection, while held.
    connection: Option<PgConnection>,
    /// Times the readers fell to none: a close waiting out [`LINGER`]
    /// closes only if no reader came and went since.
    emptied: u64,
}

impl Follow {
    pub(super) fn new(
        reads: Reads,
        pool: PgPool,
        url: PgConnectOptions,
        origin: Uuid,
        peers: Arc<Peers>,
        answers: Answers,
    ) -> Self {
        let name = match reads {
            Reads::Dispatch => peers::dispatcher_name(origin),
            Reads::Tasks => peers::follower_name(origin),
        };
        Self {
            reads,
            pool,
            named: url.application_name(&name),
            origin,
            peers,
            answers,
            state: Mutex::new(State {
                readers: 0,
                connection: None,
                emptied: 0,
            }),
        }
    }

    /// Reads the others' events of this kind until the answer is dropped.
    /// The first reader opens the connection and greets the others,
    /// waiting for their answers; the readers after it (or a reader within
    /// [`LINGER`] of the last) find the connection open. A replica that
    /// cannot open it reads still: the others then notify it what their
    /// counts say, and its watchers and dispatcher read the store on their
    /// timers. The readers after a first that could not open it leave the
    /// next try to [`keep`], so a fleet of agents connecting while the
    /// database refuses one more connection does not try once each, in
    /// turn.
    pub(super) async fn follow(self: &Arc<Self>) -> Following {
        let mut state = self.state.lock().await;
        state.readers += 1;
        if state.readers == 1 && state.connection.is_none() {
            self.connect(&mut state).await;
        }
        Following::held(Held(self.clone()))
    }

    /// Opens the connection and greets the others as a reader.
    async fn connect(&self, state: &mut State) {
        let what = self.reads.what();
        match tokio::time::timeout(WAIT, PgConnection::connect_with(&self.named)).await {
            Ok(Ok(connection)) => {
                state.connection = Some(connection);
                let mut answers = self.answers.lock().await;
                peers::greet(
                    &self.pool,
                    self.origin,
                    &self.peers,
                    &mut answers,
                    self.reads == Reads::Tasks,
                )
                .await;
            }
            Ok(Err(err)) => tracing::warn!(
                cause = %err,
                "cannot tell the other replicas that this one {what}"
            ),
            Err(_) => tracing::warn!(
                waited = ?WAIT,
                "cannot tell the other replicas that this one {what}: no connection"
            ),
        }
    }

    /// While read, opens the connection again if it was lost (or never
    /// opened).
    async fn keep(&self) {
        let mut state = self.state.lock().await;
        if state.readers == 0 {
            return;
        }
        let alive = match state.connection.as_mut() {
            Some(connection) => matches!(
                tokio::time::timeout(WAIT, connection.ping()).await,
                Ok(Ok(()))
            ),
            None => false,
        };
        if !alive {
            state.connection = None;
            self.connect(&mut state).await;
        }
    }

    /// A reader went; the last one closes the connection after
    /// [`LINGER`], unless another came meanwhile.
    async fn unfollow(&self) {
        let mut state = self.state.lock().await;
        state.readers -= 1;
        if state.readers > 0 {
            return;
        }
        state.emptied += 1;
        let emptied = state.emptied;
        drop(state);
        tokio::time::sleep(LINGER).await;
        let mut state = self.state.lock().await;
        if state.readers == 0
            && state.emptied == emptied
            && let Some(connection) = state.connection.take()
        {
            let _ = connection.close().await;
        }
    }

    /// Closes the connection, as the store closes.
    pub(super) async fn close(&self) {
        if let Some(connection) = self.state.lock().await.connection.take() {
            let _ = connection.close().await;
        }
    }
}

/// Keeps the connections of `follows` up while read ([`KEEP_EVERY`]), until
/// the store is dropped.
pub(super) async fn keep(follows: [Arc<Follow>; 2]) {
    loop {
        tokio::time::sleep(KEEP_EVERY).await;
        for follow in &follows {
            follow.keep().await;
        }
    }
}

/// One reader's hold on [`Follow`].
struct Held(Arc<Follow>);

impl Drop for Held {
    fn drop(&mut self) {
        let follow = self.0.clone();
        // Without a runtime the process is ending, and the connection with it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { follow.unfollow().await });
        }
    }
}
