//! Whether this replica follows tasks' changes, as the other replicas
//! learn it: while something here follows them (a watcher of a task or of
//! the queue), the replica holds a connection named for it
//! ([`peers::follower_name`]), which the others count once a second, and
//! greets them when it begins, waiting for their answers, so no change
//! they commit after [`Follow::follow`] returns goes unnotified. The
//! connection is kept for [`LINGER`] after the last follower goes, so a
//! watcher started now and then (a CLI waiting on a task) does not
//! reconnect and greet each time; while followed, it is checked every
//! [`KEEP_EVERY`] and opened again (and the others greeted again) if it
//! was lost, as a restarted or failed-over database loses it.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use tokio::sync::{Mutex, mpsc};
use uuid::Uuid;

use super::peers::{self, Peers};
use crate::store::Following;

/// How long the follower connection outlives the last follower.
const LINGER: Duration = Duration::from_secs(30);

/// How often the follower connection is checked while followed.
const KEEP_EVERY: Duration = Duration::from_secs(1);

/// The longest a connect or a check of the follower connection may take:
/// new watchers wait for them, and a socket cut off without a reset would
/// otherwise hold them until TCP gives up.
const WAIT: Duration = Duration::from_secs(5);

/// This replica's followers of tasks' changes, and what tells the others.
#[derive(Debug)]
pub(super) struct Follow {
    /// Where greetings are sent from.
    pool: PgPool,
    /// The database, with the follower connection's name.
    named: PgConnectOptions,
    /// This replica.
    origin: Uuid,
    /// What this replica knows of the others (counted again on greeting).
    peers: Arc<Peers>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Followers holding a [`Following`] of this replica.
    followers: usize,
    /// The follower connection, while held.
    connection: Option<PgConnection>,
    /// Times the followers fell to none: a close waiting out [`LINGER`]
    /// closes only if no follower came and went since.
    emptied: u64,
    /// The other replicas' answers to this one's greetings.
    answers: mpsc::Receiver<Uuid>,
}

impl Follow {
    pub(super) fn new(
        pool: PgPool,
        url: PgConnectOptions,
        origin: Uuid,
        peers: Arc<Peers>,
        answers: mpsc::Receiver<Uuid>,
    ) -> Self {
        Self {
            pool,
            named: url.application_name(&peers::follower_name(origin)),
            origin,
            peers,
            state: Mutex::new(State {
                followers: 0,
                connection: None,
                emptied: 0,
                answers,
            }),
        }
    }

    /// Greets the other replicas as this one starts, following nothing
    /// (see [`peers::greet`]).
    pub(super) async fn greet_at_start(&self) {
        let mut state = self.state.lock().await;
        peers::greet(
            &self.pool,
            self.origin,
            &self.peers,
            &mut state.answers,
            false,
        )
        .await;
    }

    /// Follows tasks' changes until the answer is dropped. The first
    /// follower opens the follower connection and greets the others,
    /// waiting for their answers; the followers after it (or a follower
    /// within [`LINGER`] of the last) find the connection open. A replica
    /// that cannot open it follows still: the others then notify it what
    /// their counts say, and its watchers read on their timers.
    pub(super) async fn follow(self: &Arc<Self>) -> Following {
        let mut state = self.state.lock().await;
        state.followers += 1;
        if state.connection.is_none() {
            self.connect(&mut state).await;
        }
        Following::held(Held(self.clone()))
    }

    /// Opens the follower connection and greets the others as a follower.
    async fn connect(&self, state: &mut State) {
        match tokio::time::timeout(WAIT, PgConnection::connect_with(&self.named)).await {
            Ok(Ok(connection)) => {
                state.connection = Some(connection);
                peers::greet(
                    &self.pool,
                    self.origin,
                    &self.peers,
                    &mut state.answers,
                    true,
                )
                .await;
            }
            Ok(Err(err)) => tracing::warn!(
                cause = %err,
                "cannot tell the other replicas that this one follows tasks' changes"
            ),
            Err(_) => tracing::warn!(
                waited = ?WAIT,
                "cannot tell the other replicas that this one follows tasks' changes: no connection"
            ),
        }
    }

    /// While followed, opens the follower connection again if it was lost
    /// (or never opened).
    async fn keep(&self) {
        let mut state = self.state.lock().await;
        if state.followers == 0 {
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

    /// A follower went; the last one closes the connection after
    /// [`LINGER`], unless another came meanwhile.
    async fn unfollow(&self) {
        let mut state = self.state.lock().await;
        state.followers -= 1;
        if state.followers > 0 {
            return;
        }
        state.emptied += 1;
        let emptied = state.emptied;
        drop(state);
        tokio::time::sleep(LINGER).await;
        let mut state = self.state.lock().await;
        if state.followers == 0
            && state.emptied == emptied
            && let Some(connection) = state.connection.take()
        {
            let _ = connection.close().await;
        }
    }

    /// Closes the follower connection, as the store closes.
    pub(super) async fn close(&self) {
        if let Some(connection) = self.state.lock().await.connection.take() {
            let _ = connection.close().await;
        }
    }
}

/// Keeps `follow`'s connection up while followed ([`KEEP_EVERY`]), until
/// the store is dropped.
pub(super) async fn keep(follow: Arc<Follow>) {
    loop {
        tokio::time::sleep(KEEP_EVERY).await;
        follow.keep().await;
    }
}

/// One follower's hold on [`Follow`].
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
