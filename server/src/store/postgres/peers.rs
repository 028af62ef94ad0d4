//! Whether another replica reads the dispatcher's events, and whether
//! another follows tasks' changes: a replica notifies a task queued, an
//! agent changed and a lease ended or revoked only while another serves
//! agents or follows the fleet, the queue or a task (its dispatcher and
//! its watchers read them), and a task's changes and output only while
//! another follows tasks' changes (watchers of a task or of the queue).
//! Its own subscribers hear its changes at their commit (as on SQLite), so
//! a replica alone on its database, or beside replicas that read none of
//! it, sent every change through PostgreSQL only for it to be thrown away:
//! a transaction, a commit and a delivery for each batch of
//! notifications, and an encoding and a decoding for each
//! (`BENCHMARKS.md` has what they cost).
//!
//! Each replica's listener connection is named after it
//! ([`listener_name`]), and a replica counts the others once a second
//! ([`watch`]). A replica of this release says what it reads by holding a
//! connection named for each ([`dispatcher_name`], [`follower_name`]; the
//! `follow` module); a listener of the release before, which said only
//! what it follows, is counted as reading the dispatcher's events always,
//! and one of an earlier release (or any other session listening on the
//! events' channel) as reading everything. A replica that begins to read
//! either greets the others on [`GREETINGS`] (saying whether it follows
//! tasks' changes), and waits (at most [`GREETING_WAIT`]) until each named
//! one answered: a replica answers after it has begun to notify what the
//! greeting asks for, so every such change committed after the greeting's
//! wait reaches the greeter, and its own reads cover what came before.
//! Until its first count, and whenever it cannot count, a replica notifies
//! everything.

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

/// How long a greeting replica waits for the others' answers.
const GREETING_WAIT: Duration = Duration::from_secs(2);

/// How the name of a listener of the release before ends: its replica said,
/// by a follower connection, whether it follows tasks' changes, and read
/// the dispatcher's events always.
const SAYS_WHAT_IT_FOLLOWS: &str = "v2";

/// How the name of a listener of this release ends: its replica says, by a
/// connection for each (`follow`), whether it reads the dispatcher's events
/// and whether it follows tasks' changes.
const SAYS_WHAT_IT_READS: &str = "v3";

/// The name every replica's follower connection takes, before its origin.
const FOLLOWER: &str = "switchyard-follower";

/// The name every replica's dispatcher connection takes, before its origin.
const DISPATCHER: &str = "switchyard-dispatcher";

/// The listener connection's `application_name` for the replica `origin`.
pub(super) fn listener_name(origin: Uuid) -> String {
    format!("{LISTENER} {origin} {SAYS_WHAT_IT_READS}")
}

/// The `application_name` of the connection the replica `origin` holds
/// while it reads the dispatcher's events.
pub(super) fn dispatcher_name(origin: Uuid) -> String {
    format!("{DISPATCHER} {origin}")
}

/// The `application_name` of the connection the replica `origin` holds
/// while it follows tasks' changes.
pub(super) fn follower_name(origin: Uuid) -> String {
    format!("{FOLLOWER} {origin}")
}

/// Other sessions of this database that read the replicas' events:
/// `(named replicas, reading the dispatcher's events, following tasks'
/// changes)`. Named: a listener named as a replica's. Reading the
/// dispatcher's events: a dispatcher or a follower connection, or a
/// listener that does not say what it reads (the release before's, named,
/// or an earlier one's, whose last statement listened on the events'
/// channel). Following: a follower connection, or a listener that does not
/// say what it follows (an earlier release's, which reads every change).
const OTHERS: &str = "SELECT \
  COUNT(*) FILTER (WHERE application_name LIKE $2 || ' %')::int8, \
  COUNT(*) FILTER (WHERE application_name LIKE $4 || ' %' OR application_name LIKE $7 || ' %' \
    OR ((application_name LIKE $2 || ' %' OR query = $3) \
      AND application_name NOT LIKE $2 || ' % ' || $8))::int8, \
  COUNT(*) FILTER (WHERE application_name LIKE $4 || ' %' \
    OR ((application_name LIKE $2 || ' %' OR query = $3) \
      AND application_name NOT LIKE $2 || ' % ' || $5 \
      AND application_name NOT LIKE $2 || ' % ' || $8))::int8 \
  FROM pg_stat_activity WHERE datname = current_database() AND application_name NOT IN ($1, $6, $9) \
  AND (application_name LIKE $2 || ' %' OR query = $3 OR application_name LIKE $4 || ' %' \
    OR application_name LIKE $7 || ' %')";

/// Something the other replicas want told, as last counted and as greeted
/// since.
#[derive(Debug)]
struct Wanted {
    /// Another replica wants it (or greeted this one for it since the last
    /// count).
    on: AtomicBool,
    /// Greetings heard for it: a count begun before one cannot say that
    /// nobody wants it.
    greetings: AtomicU64,
}

impl Wanted {
    /// Not counted yet: wanted.
    fn new() -> Self {
        Self {
            on: AtomicBool::new(true),
            greetings: AtomicU64::new(0),
        }
    }

    fn on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// Greetings heard so far, to be given back to [`Wanted::counted`].
    fn greetings(&self) -> u64 {
        self.greetings.load(Ordering::SeqCst)
    }

    /// A count begun when `greetings` greetings had been heard found it
    /// wanted or not; a greeting heard since outweighs a count of none,
    /// even one heard while this stores it: a greeting counted after the
    /// second look stores its `true` after this `false`.
    fn counted(&self, on: bool, greetings: u64) {
        if on {
            self.on.store(true, Ordering::SeqCst);
        } else if self.greetings() == greetings {
            self.on.store(false, Ordering::SeqCst);
            if self.greetings() != greetings {
                self.on.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Another replica greeted this one for it: wanted from now on (the
    /// greeting counted first, see [`Wanted::counted`]).
    fn greeted(&self) {
        self.greetings.fetch_add(1, Ordering::SeqCst);
        self.on.store(true, Ordering::SeqCst);
    }
}

/// What this replica knows of the others.
#[derive(Debug)]
pub(super) struct Peers {
    /// Another replica reads the dispatcher's events (a task queued, an
    /// agent changed, a lease ended or revoked): they are to be notified.
    dispatching: Wanted,
    /// Another replica follows tasks' changes: a task's changes and output
    /// are to be notified too.
    following: Wanted,
}

/// The greetings heard before a count: `(dispatching, following)`.
type Heard = (u64, u64);

impl Peers {
    /// Not counted yet: notify everything.
    pub(super) fn new() -> Self {
        Self {
            dispatching: Wanted::new(),
            following: Wanted::new(),
        }
    }

    /// Whether the dispatcher's events are to be notified.
    pub(super) fn dispatching(&self) -> bool {
        self.dispatching.on()
    }

    /// Whether tasks' changes and output are to be notified as well.
    pub(super) fn following(&self) -> bool {
        self.following.on()
    }

    fn heard(&self) -> Heard {
        (self.dispatching.greetings(), self.following.greetings())
    }

    /// A count begun when `heard` found others reading the dispatcher's
    /// events and following tasks' changes, or not (see
    /// [`Wanted::counted`]).
    fn counted(&self, others: Others, heard: Heard) {
        self.dispatching.counted(others.dispatching > 0, heard.0);
        self.following.counted(others.following > 0, heard.1);
    }

    /// Another replica greeted this one: it reads the dispatcher's events
    /// from now on (a greeting of an earlier release says it listens, and
    /// it reads them too), and, if it said so, follows tasks' changes.
    pub(super) fn greeted(&self, follows: bool) {
        self.dispatching.greeted();
        if follows {
            self.following.greeted();
        }
    }
}

/// The other sessions counted by [`OTHERS`].
#[derive(Debug, Clone, Copy)]
struct Others {
    named: i64,
    dispatching: i64,
    following: i64,
}

/// The others reading the dispatcher's events and following tasks' changes
/// besides `origin` (see [`OTHERS`]).
async fn others(pool: &PgPool, origin: Uuid) -> Result<Others> {
    let (named, dispatching, following) = sqlx::query_as(OTHERS)
        .bind(listener_name(origin))
        .bind(LISTENER)
        .bind(format!(r#"LISTEN "{CHANNEL}""#))
        .bind(FOLLOWER)
        .bind(SAYS_WHAT_IT_FOLLOWS)
        .bind(follower_name(origin))
        .bind(DISPATCHER)
        .bind(SAYS_WHAT_IT_READS)
        .bind(dispatcher_name(origin))
        .fetch_one(pool)
        .await
        .map_err(db("counting the other replicas"))?;
    Ok(Others {
        named,
        dispatching,
        following,
    })
}

/// Keeps `peers` up with what the others read, once a second, until the
/// store is dropped.
pub(super) async fn watch(pool: PgPool, origin: Uuid, peers: Arc<Peers>) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        count(&pool, origin, &peers).await;
    }
}

/// Counts what the others read, for `peers` (as the store opens, and then
/// by [`watch`]). A replica that cannot count them notifies everything.
pub(super) async fn count(pool: &PgPool, origin: Uuid, peers: &Peers) {
    let heard = peers.heard();
    let counted = match others(pool, origin).await {
        Ok(others) => others,
        Err(err) => {
            tracing::debug!(cause = %err, "cannot count the other replicas; notifying");
            Others {
                named: 0,
                dispatching: 1,
                following: 1,
            }
        }
    };
    peers.counted(counted, heard);
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
    /// A greeting from a replica that follows tasks' changes from now on
    /// (an earlier release's never says so, and reads this as a greeting).
    #[serde(rename = "f", default, skip_serializing_if = "std::ops::Not::not")]
    follows: bool,
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
/// notifies what the greeting asked for; an answer to this one's greeting goes to `answers`; its own
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
            follows,
        }) => {
            peers.greeted(follows);
            let answer = Greeting {
                origin,
                welcome: Some(from),
                follows: false,
            };
            if let Err(err) = send(pool, &answer).await {
                tracing::warn!(cause = %err, "cannot answer a replica's greeting");
            }
        }
        Ok(Greeting {
            origin: from,
            welcome: Some(welcomed),
            ..
        }) => {
            if welcomed == origin {
                let _ = answers.try_send(from);
            }
        }
        Err(err) => tracing::warn!(cause = %err, "ignoring an unreadable greeting"),
    }
}

/// Counts the other replicas for `peers` and greets those listening
/// already (this one reading the dispatcher's events, and following tasks'
/// changes if `follows`), waiting until each named one answered on
/// `answers`, at most [`GREETING_WAIT`]. A replica that cannot count or
/// greet them notifies, and learns of the others from their counts; they
/// learn of it from theirs.
pub(super) async fn greet(
    pool: &PgPool,
    origin: Uuid,
    peers: &Peers,
    answers: &mut mpsc::Receiver<Uuid>,
    follows: bool,
) {
    let heard = peers.heard();
    let named = match others(pool, origin).await {
        Ok(others) => {
            peers.counted(others, heard);
            others.named
        }
        Err(err) => {
            tracing::warn!(cause = %err, "cannot count the other replicas; notifying");
            return;
        }
    };
    if named == 0 {
        return;
    }
    // An answer to an earlier greeting, late, would stand for one to this.
    while answers.try_recv().is_ok() {}
    let hello = Greeting {
        origin,
        welcome: None,
        follows,
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
        let wanted = Wanted::new();
        assert!(wanted.on(), "not counted yet: wanted");
        let before = wanted.greetings();
        wanted.counted(false, before);
        assert!(!wanted.on(), "counted alone");
        let before = wanted.greetings();
        wanted.greeted();
        wanted.counted(false, before);
        assert!(wanted.on(), "a count begun before the greeting");
        wanted.counted(false, wanted.greetings());
        assert!(!wanted.on(), "a count begun after it, of none");
        wanted.counted(true, 0);
        assert!(wanted.on());
    }

    #[test]
    fn a_greeting_asks_to_be_told_tasks_changes_only_if_it_says_so() {
        let peers = Peers::new();
        assert!(peers.dispatching() && peers.following(), "not counted yet");
        let none = Others {
            named: 0,
            dispatching: 0,
            following: 0,
        };
        peers.counted(none, peers.heard());
        assert!(!peers.dispatching() && !peers.following(), "counted alone");
        let before = peers.heard();
        peers.greeted(false);
        peers.counted(none, before);
        assert!(peers.dispatching(), "greeted during the count");
        assert!(!peers.following(), "by a replica that follows no task");
        let before = peers.heard();
        peers.greeted(true);
        peers.counted(none, before);
        assert!(peers.following(), "greeted by a follower during the count");
        let listens = Others {
            named: 1,
            dispatching: 1,
            following: 0,
        };
        peers.counted(listens, peers.heard());
        assert!(peers.dispatching() && !peers.following(), "counted since");
    }

    #[test]
    fn a_greeting_of_an_earlier_release_reads_as_following_nothing() {
        let old: Greeting =
            serde_json::from_str(r#"{"o":"00000000-0000-0000-0000-000000000001"}"#).unwrap();
        assert!(!old.follows);
        let follows = Greeting {
            origin: Uuid::nil(),
            welcome: None,
            follows: true,
        };
        let text = serde_json::to_string(&follows).unwrap();
        assert!(text.contains(r#""f":true"#), "{text}");
        let answer = Greeting {
            origin: Uuid::nil(),
            welcome: Some(Uuid::nil()),
            follows: false,
        };
        let text = serde_json::to_string(&answer).unwrap();
        assert!(!text.contains(r#""f""#), "{text}");
    }
}
