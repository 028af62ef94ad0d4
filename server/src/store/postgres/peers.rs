//! Whether another replica listens: a replica notifies its changes only
//! while one does. Its own subscribers hear its changes at their commit
//! (as on SQLite), so a replica alone on its database sent every change
//! through PostgreSQL only to hear it back: a transaction, a commit and a
//! delivery for each batch of notifications, and an encoding and a
//! decoding for each (`BENCHMARKS.md` has what they cost).
//!
//! Each replica's listener connection is named after it
//! ([`listener_name`]), and a replica counts the others' listeners (and any
//! other session listening on the events' channel, as a replica of an
//! earlier release does) once a second ([`watch`]). A replica that starts
//! greets the others on [`GREETINGS`] once it listens, and waits (at most
//! [`GREETING_WAIT`]) until each named one answered: a replica answers
//! after it has begun to notify, so every change committed after the new
//! replica's `open` returns reaches it, and its own reads at start cover
//! what came before. Until its first count, and whenever it cannot count,
//! a replica notifies.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::postgres::PgPool;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::CHANNEL;
use crate::error::Result;
use crate::store::plan::db;

/// The channel of greetings and their answers between replicas.
pub(super) const GREETINGS: &str = "switchyard_replicas";

/// The name every replica's listener connection takes, before its origin.
const LISTENER: &str = "switchyard-listener";

/// How often a replica counts the others' listeners.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// How long a starting replica waits for the others' answers.
const GREETING_WAIT: Duration = Duration::from_secs(2);

/// The listener connection's `application_name` for the replica `origin`.
pub(super) fn listener_name(origin: Uuid) -> String {
    format!("{LISTENER} {origin}")
}

/// Other sessions of this database listening for the replicas' events:
/// `(named replicas, all)`. A listener named as a replica's, or one whose
/// last statement listened on the events' channel (a replica of an
/// earlier release, whose listener is not named).
const OTHERS: &str = "SELECT \
  COUNT(*) FILTER (WHERE application_name LIKE $2 || ' %')::int8, COUNT(*)::int8 \
  FROM pg_stat_activity WHERE datname = current_database() AND application_name <> $1 \
  AND (application_name LIKE $2 || ' %' OR query = $3)";

/// What this replica knows of the others.
#[derive(Debug)]
pub(super) struct Peers {
    /// Another replica listens (or greeted this one since the last count).
    listening: AtomicBool,
    /// Greetings heard: a count begun before one cannot say that nobody
    /// listens.
    greetings: AtomicU64,
}

impl Peers {
    /// Not counted yet: notify.
    pub(super) fn new() -> Self {
        Self {
            listening: AtomicBool::new(true),
            greetings: AtomicU64::new(0),
        }
    }

    /// Whether this replica's changes are to be notified.
    pub(super) fn listening(&self) -> bool {
        self.listening.load(Ordering::SeqCst)
    }

    /// Greetings heard so far, to be given back to [`Peers::counted`].
    fn greetings(&self) -> u64 {
        self.greetings.load(Ordering::SeqCst)
    }

    /// A count begun when `greetings` greetings had been heard found others
    /// listening or not; a greeting heard since outweighs a count of none,
    /// even one heard while this stores it: a greeting counted after the
    /// second look stores its `true` after this `false`.
    fn counted(&self, listening: bool, greetings: u64) {
        if listening {
            self.listening.store(true, Ordering::SeqCst);
        } else if self.greetings() == greetings {
            self.listening.store(false, Ordering::SeqCst);
            if self.greetings() != greetings {
                self.listening.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Another replica greeted this one: it listens from now on (the
    /// greeting counted first, see [`Peers::counted`]).
    pub(super) fn greeted(&self) {
        self.greetings.fetch_add(1, Ordering::SeqCst);
        self.listening.store(true, Ordering::SeqCst);
    }
}

/// `(named replicas, all)` listening besides `origin` (see [`OTHERS`]).
async fn others(pool: &PgPool, origin: Uuid) -> Result<(i64, i64)> {
    sqlx::query_as(OTHERS)
        .bind(listener_name(origin))
        .bind(LISTENER)
        .bind(format!(r#"LISTEN "{CHANNEL}""#))
        .fetch_one(pool)
        .await
        .map_err(db("counting the other replicas"))
}

/// Keeps `peers` up with the others' listeners, once a second, until the
/// store is dropped.
pub(super) async fn watch(pool: PgPool, origin: Uuid, peers: Arc<Peers>) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let greetings = peers.greetings();
        let listening = match others(&pool, origin).await {
            Ok((_, all)) => all > 0,
            Err(err) => {
                tracing::debug!(cause = %err, "cannot count the other replicas; notifying");
                true
            }
        };
        peers.counted(listening, greetings);
    }
}

/// A greeting (`welcome: None`) or its answer, as notified on [`GREETINGS`].
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Greeting {
    /// The replica that sent it.
    #[serde(rename = "o")]
    origin: Uuid,
    /// The replica it answers.
    #[serde(rename = "w", default, skip_serializing_if = "Option::is_none")]
    welcome: Option<Uuid>,
}

/// Sends `greeting` on [`GREETINGS`].
async fn send(pool: &PgPool, greeting: &Greeting) -> Result<()> {
    let payload = serde_json::to_string(greeting).map_err(|err| crate::error::Error::Corrupt {
        context: "encoding a greeting",
        detail: err.to_string(),
    })?;
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(GREETINGS)
        .bind(payload)
        .execute(pool)
        .await
        .map_err(db("greeting the other replicas"))?;
    Ok(())
}

/// What the replica `origin` does with a notification heard on
/// [`GREETINGS`] (`payload`): another replica's greeting is counted
/// ([`Peers::greeted`]) and then answered, so an answer means this replica
/// notifies; an answer to this one's greeting goes to `answers`; its own
/// greeting is ignored.
pub(super) async fn heard(
    pool: &PgPool,
    origin: Uuid,
    peers: &Peers,
    answers: &mpsc::Sender<Uuid>,
    payload: &str,
) {
    match serde_json::from_str::<Greeting>(payload) {
        Ok(greeting) if greeting.origin == origin => {}
        Ok(Greeting {
            origin: from,
            welcome: None,
        }) => {
            peers.greeted();
            let answer = Greeting {
                origin,
                welcome: Some(from),
            };
            if let Err(err) = send(pool, &answer).await {
                tracing::warn!(cause = %err, "cannot answer a replica's greeting");
            }
        }
        Ok(Greeting {
            origin: from,
            welcome: Some(welcomed),
        }) => {
            if welcomed == origin {
                let _ = answers.try_send(from);
            }
        }
        Err(err) => tracing::warn!(cause = %err, "ignoring an unreadable greeting"),
    }
}

/// Counts the other replicas for `peers` and greets those listening
/// already (this one listening), waiting until each named one answered on
/// `answers`, at most [`GREETING_WAIT`]. A replica that cannot count or
/// greet them notifies, and learns of the others from their counts.
pub(super) async fn greet(
    pool: &PgPool,
    origin: Uuid,
    peers: &Peers,
    answers: &mut mpsc::Receiver<Uuid>,
) {
    let greetings = peers.greetings();
    let named = match others(pool, origin).await {
        Ok((named, all)) => {
            peers.counted(all > 0, greetings);
            named
        }
        Err(err) => {
            tracing::warn!(cause = %err, "cannot count the other replicas; notifying");
            return;
        }
    };
    if named == 0 {
        return;
    }
    let hello = Greeting {
        origin,
        welcome: None,
    };
    if let Err(err) = send(pool, &hello).await {
        tracing::warn!(cause = %err, "cannot greet the other replicas");
        return;
    }
    let expected = usize::try_from(named).unwrap_or(usize::MAX);
    let mut answered = HashSet::new();
    let waited = tokio::time::timeout(GREETING_WAIT, async {
        while answered.len() < expected {
            match answers.recv().await {
                Some(replica) => {
                    answered.insert(replica);
                }
                None => break,
            }
        }
    })
    .await;
    if waited.is_err() {
        tracing::info!(
            answered = answered.len(),
            listening = expected,
            "not every replica answered this one's greeting; the others notify it from their next count of listeners"
        );
    }
}

#[cfg(test)]
mod tests {
    //! What a count may say against the greetings heard.

    use super::*;

    #[test]
    fn a_greeting_heard_during_a_count_outweighs_a_count_of_none() {
        let peers = Peers::new();
        assert!(peers.listening(), "not counted yet: notify");
        let before = peers.greetings();
        peers.counted(false, before);
        assert!(!peers.listening(), "counted alone");
        let before = peers.greetings();
        peers.greeted();
        peers.counted(false, before);
        assert!(peers.listening(), "a count begun before the greeting");
        peers.counted(false, peers.greetings());
        assert!(!peers.listening(), "a count begun after it, of none");
        peers.counted(true, 0);
        assert!(peers.listening());
    }
}
