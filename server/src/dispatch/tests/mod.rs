//! The dispatcher on its own: a real store (an SQLite file, and a
//! PostgreSQL database of its own), the injected clock, and sessions that
//! are plain channels, so a round, a sweep and a submit are driven by hand
//! and what each pushes is read off the channel. Here the fixture and its
//! helpers; the tests, each run on both stores, by what they drive: the
//! queue walk and its skip (`walk`), busy placements and what a walk leaves
//! waiting (`busy`), leases and submits (`leases`), what the dispatcher
//! shares between tasks and callers (`shared`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::{Value, json};
use switchyard_core::placement::{self, CompiledPlacement};
use switchyard_core::selector;
use switchyard_proto::v1::connect_response::Message as Down;
use switchyard_proto::v1::{self as pb, RevocationReason};
use tokio::sync::{Notify, mpsc};
use uuid::Uuid;

use super::sessions::Attach;
use super::{DispatchSettings, Dispatcher};
use crate::clock::{Clock, ManualClock};
use crate::model::{
    AgentRegistration, Completion, CompletionOutcome, NewTask, QueueCursor, QueuedReason,
    ReleaseCause, Submission, TaskState,
};
use crate::store::test_db::TestDatabase;
use crate::store::{self, Store};

/// The start of the tests' clock.
const T0: i64 = 1_700_000_000_000;

/// A dispatcher over a fresh store, its clock, and what to clean up.
struct Fixture {
    dispatcher: Dispatcher,
    store: Arc<dyn Store>,
    clock: ManualClock,
    _dir: tempfile::TempDir,
    /// A PostgreSQL store's database (dropped with the fixture).
    pg: Option<TestDatabase>,
}

impl Fixture {
    async fn new(postgres: bool) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let pg = if postgres {
            Some(TestDatabase::create("sy_dispatch").await)
        } else {
            None
        };
        let url = pg.as_ref().map_or_else(
            || format!("sqlite://{}", dir.path().join("store.db").display()),
            |db| db.url.clone(),
        );
        let store = store::open(&url).await.expect("open the store");
        store.migrate().await.expect("migrate");
        let (clock, manual) = Clock::manual(T0);
        let settings = DispatchSettings {
            batch_size: 16,
            ..DispatchSettings::default()
        };
        Self {
            dispatcher: Dispatcher::new(store.clone(), clock, settings),
            store,
            clock: manual,
            _dir: dir,
            pg,
        }
    }

    async fn finish(mut self) {
        self.store.close().await;
        if let Some(db) = self.pg.take() {
            db.drop_now().await;
        }
    }

    fn now(&self) -> i64 {
        self.dispatcher.now_ms()
    }

    /// Registers an agent with `tags` and `capacity` and attaches a
    /// session for it; the session's stream.
    async fn connect(&self, name: &str, tags: &[&str], capacity: u32) -> Agent {
        let document = json!({"tags": tags});
        let registration = AgentRegistration {
            namespace: "default".into(),
            name: name.into(),
            reported: document.clone(),
            document: document.clone(),
            provenance: json!({}),
            rejections: json!([]),
            capacity,
            labels: BTreeMap::new(),
            runner: "test".into(),
            handled_kinds: vec!["*".into()],
            registered_by: String::new(),
        };
        let record = self
            .store
            .register_agent(&registration, self.now())
            .await
            .expect("register");
        let (tx, rx) = mpsc::channel(64);
        let attach = Attach {
            agent_id: record.id,
            epoch: record.session_epoch,
            tx,
            close: Arc::new(Notify::new()),
            changed: Arc::new(AtomicBool::new(false)),
            view: record.view(),
        };
        self.dispatcher.attach(attach).expect("attached");
        Agent { id: record.id, rx }
    }

    /// Stores a task needing `selector`, of `priority`, due at `not_before`.
    async fn queue(&self, selector: &str, priority: i32, not_before: Option<i64>) -> Uuid {
        let submission = Submission {
            task: task(selector, priority, not_before),
            agent_id: None,
        };
        let mut out = self
            .store
            .submit_many(&[submission], self.now())
            .await
            .expect("submit");
        out.pop().expect("one").expect("stored").0.id
    }
}

impl Fixture {
    /// Stores a task as another replica's submit does, and tells the
    /// dispatcher as that replica's store event would (with its place).
    async fn queued_elsewhere(&self, selector: &str, priority: i32) -> crate::model::TaskRecord {
        let id = self.queue(selector, priority, None).await;
        let task = self.store.get_task(id).await.expect("stored");
        self.dispatcher
            .note_queued_at(task.priority, task.queue_rank, task.id);
        task
    }
}

/// A connected agent's id and stream.
struct Agent {
    id: Uuid,
    rx: mpsc::Receiver<Box<pb::ConnectResponse>>,
}

impl Agent {
    /// The task ids of the grants waiting on the stream, in order.
    fn grants(&mut self) -> Vec<Uuid> {
        let mut granted = Vec::new();
        while let Ok(message) = self.rx.try_recv() {
            if let Some(Down::LeaseGrant(grant)) = message.message {
                let task = grant.task.expect("granted task");
                granted.push(task.task_id.parse().expect("task id"));
            }
        }
        granted
    }

    /// The revocations waiting on the stream: task id and reason.
    fn revocations(&mut self) -> Vec<(Uuid, RevocationReason)> {
        let mut revoked = Vec::new();
        while let Ok(message) = self.rx.try_recv() {
            if let Some(Down::LeaseRevocation(r)) = message.message {
                revoked.push((r.task_id.parse().expect("task id"), r.reason()));
            }
        }
        revoked
    }
}

fn task(selector: &str, priority: i32, not_before_ms: Option<i64>) -> NewTask {
    let placement = compiled(selector).placement().clone();
    NewTask {
        namespace: "default".into(),
        kind: "exec".into(),
        payload: Value::Null,
        placement: serde_json::to_value(placement).expect("placement"),
        priority,
        max_attempts: 3,
        retry: None,
        deadlines: Default::default(),
        fairness: None,
        concurrency_key: None,
        lease_ttl_ms: 10_000,
        idempotency_key: None,
        not_before_ms,
        labels: BTreeMap::new(),
    }
}

fn compiled(selector: &str) -> CompiledPlacement {
    placement::compile(&selector::parse(selector).expect("selector")).expect("compile")
}

/// Runs `test` on an SQLite store, then on a PostgreSQL one.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let fx = super::Fixture::new(false).await;
                    super::$name(&fx).await;
                    fx.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    let fx = super::Fixture::new(true).await;
                    super::$name(&fx).await;
                    fx.finish().await;
                }
            )*
        }
    };
}

/// Settles the lease of `task_id` with `outcome` and tells the dispatcher
/// the slot is free.
async fn settle(fx: &Fixture, agent: &Agent, task_id: Uuid, outcome: CompletionOutcome) {
    let leased = fx.store.get_task(task_id).await.unwrap();
    let done = Completion {
        lease_id: leased.lease_id.unwrap(),
        task_id,
        agent_id: agent.id,
        fencing_token: leased.fencing_token,
        outcome,
    };
    fx.store.complete_leases(&[done], fx.now()).await.unwrap();
    fx.dispatcher.lease_ended(agent.id, Some(task_id));
}

mod busy;
mod leases;
mod shared;
mod walk;
