//! The dispatcher on its own: a real store (an SQLite file, and a
//! PostgreSQL database of its own), the injected clock, and sessions that
//! are plain channels, so a round, a sweep and a submit are driven by hand
//! and what each pushes is read off the channel.

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

on_both_stores!(
    a_round_fills_free_slots_in_priority_order,
    a_parked_task_is_skipped_and_remembered_until_an_agent_can_run_it,
    a_task_queued_during_a_walk_leaves_the_skip_standing_up_to_it,
    a_skip_past_its_time_is_read_again_beside_the_rounds,
    a_walk_goes_on_past_a_page_of_parked_tasks_where_the_first_is_not_parked,
    a_busy_placement_is_left_out_of_the_walk_while_no_agent_has_room_for_it,
    a_walk_that_read_what_was_queued_during_it_leaves_nothing_waiting,
    a_replica_does_not_hear_its_own_submit_queued_again,
    a_delayed_task_is_granted_once_it_comes_due,
    a_lapsed_lease_is_expired_revoked_and_granted_again,
    a_submit_is_leased_on_the_way_in_only_when_nothing_waits,
    a_refused_task_waits_on_its_own_until_an_agent_that_did_not_refuse_it_connects,
    followers_of_the_queue_share_one_summary_while_nothing_moves,
    the_tasks_of_a_placement_share_one_compiled_placement,
);

/// The queue's one group: its tasks and whether matching found an agent.
fn only_group(summary: &crate::model::QueueSummary) -> (u64, Option<QueuedReason>) {
    assert!(summary.explained, "{summary:?}");
    assert_eq!(summary.groups.len(), 1, "{summary:?}");
    (summary.groups[0].row.tasks, summary.groups[0].reason)
}

/// WatchQueue's followers get one explained summary while no pulse moves
/// and it is younger than SUMMARY_REUSE_MS (a task stored behind the
/// dispatcher's back, unheard of, is not read); it is made again once an
/// agent attaches or that time has passed, and a caller asking for the
/// summary itself (GetQueueSummary) always reads afresh.
async fn followers_of_the_queue_share_one_summary_while_nothing_moves(fx: &Fixture) {
    use super::explain::SUMMARY_REUSE_MS;
    let followed = || fx.dispatcher.followed_summary("default");
    fx.queue("gpu", 0, None).await;
    let first = followed().await.expect("summary");
    assert_eq!(only_group(&first), (1, Some(QueuedReason::Parked)));

    fx.queue("gpu", 0, None).await;
    fx.clock.advance(SUMMARY_REUSE_MS - 1);
    assert_eq!(followed().await.expect("summary"), first);
    let asked = fx
        .dispatcher
        .queue_summary("default", true)
        .await
        .expect("summary");
    assert_eq!(only_group(&asked), (2, Some(QueuedReason::Parked)));

    fx.queue("gpu", 0, None).await;
    let _agent = fx.connect("gpu-1", &["gpu"], 1).await;
    let after_attach = followed().await.expect("summary");
    assert_eq!(only_group(&after_attach), (3, None));

    fx.queue("gpu", 0, None).await;
    assert_eq!(followed().await.expect("summary"), after_attach);
    fx.clock.advance(SUMMARY_REUSE_MS);
    assert_eq!(only_group(&followed().await.expect("summary")), (4, None));
}

/// Tasks a walk reads and leaves waiting (busy, parked, or granted by
/// another replica) keep nothing of their own here: the dispatcher keeps
/// one compiled placement per kind and placement. It kept one per task
/// read until a round here granted it, so a drain of a million parked
/// tasks grew the server by 550 MiB, and a task granted elsewhere was
/// never forgotten.
async fn the_tasks_of_a_placement_share_one_compiled_placement(fx: &Fixture) {
    let mut agent = fx.connect("a", &["linux"], 1).await;
    fx.queue("gpu", 0, None).await;
    for _ in 0..20 {
        fx.queue("linux", 0, None).await;
    }
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants().len(), 1);
    // Read and left waiting: the agent is busy, or none can run it.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let state = fx.dispatcher.state();
    assert_eq!(state.placements.len(), 2);
    let linux = state
        .placements
        .values()
        .find(|p| p.placement().required_tags == ["linux"]);
    let linux = linux.expect("linux compiled");
    let of_tasks = state.task_placements.values();
    assert!(
        of_tasks.filter(|p| !Arc::ptr_eq(p, linux)).count() <= 1,
        "only gpu's differs"
    );
}

async fn a_round_fills_free_slots_in_priority_order(fx: &Fixture) {
    let mut agent = fx.connect("a", &["linux"], 2).await;
    let low = fx.queue("linux", 0, None).await;
    let high = fx.queue("linux", 5, None).await;
    let middle = fx.queue("linux", 1, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 2);
    assert_eq!(agent.grants(), [high, middle]);
    assert_eq!(
        fx.store.get_task(low).await.unwrap().state,
        TaskState::Queued
    );
    let leased = fx.store.get_task(high).await.unwrap();
    assert_eq!(
        (leased.state, leased.agent_id),
        (TaskState::Leased, Some(agent.id))
    );
    // The agent is full: nothing more until a slot frees.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let done = Completion {
        lease_id: leased.lease_id.unwrap(),
        task_id: high,
        agent_id: agent.id,
        fencing_token: leased.fencing_token,
        outcome: CompletionOutcome::Succeeded { result: json!({}) },
    };
    fx.store.complete_leases(&[done], fx.now()).await.unwrap();
    fx.dispatcher.lease_ended(agent.id, Some(high));
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants(), [low]);
}

async fn a_parked_task_is_skipped_and_remembered_until_an_agent_can_run_it(fx: &Fixture) {
    let mut linux = fx.connect("a", &["linux"], 4).await;
    let gpu_task = fx.queue("gpu", 9, None).await;
    let linux_task = fx.queue("linux", 0, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(linux.grants(), [linux_task]);
    assert_eq!(fx.dispatcher.state().queue.parked_keys().len(), 1);
    // A round now finds nothing to read past the parked head.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let mut gpu = fx.connect("g", &["gpu"], 1).await;
    assert!(fx.dispatcher.state().queue.parked_keys().is_empty());
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(gpu.grants(), [gpu_task]);
    assert!(linux.grants().is_empty());
}

/// Under a steady stream of submits every walk has tasks queued while it is
/// under way. Each leaves the walk's skip standing as far as the task, so
/// the next round starts past the parked head and reads the task first
/// (before, it read every parked task again: at a million of them, seconds
/// per round); so does one queued ahead of the parked head once the skip is
/// made. A signal that does not say where its task is undoes it.
async fn a_task_queued_during_a_walk_leaves_the_skip_standing_up_to_it(fx: &Fixture) {
    let mut linux = fx.connect("a", &["linux"], 4).await;
    for _ in 0..3 {
        fx.queue("gpu", 9, None).await;
    }
    // A walk reads its pages, then a task is queued before it ends (by
    // another replica: a submit here would be leased on the way in, the
    // walk having read the whole queue).
    let queue_while_walking = |priority: i32| async move {
        fx.dispatcher.note_queued();
        let mut walk = fx.dispatcher.start_walk().expect("a walk");
        while fx.dispatcher.walk_page(&mut walk).await.expect("page") {}
        let during = fx.queued_elsewhere("linux", priority).await;
        fx.dispatcher.finish_walk(&walk);
        during
    };
    for priority in [0, 10] {
        let during = queue_while_walking(priority).await;
        let next = fx.dispatcher.start_walk().expect("a walk");
        assert_eq!(next.starts_at(), Some(QueueCursor::before(&during)));
        assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
        assert_eq!(linux.grants(), [during.id]);
    }
    // Queued ahead of a standing skip (on another replica: heard by the
    // store's event): it stands, up to the task.
    fx.dispatcher.note_queued();
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let ahead = fx.queued_elsewhere("linux", 10).await;
    let next = fx.dispatcher.start_walk().expect("a walk");
    assert_eq!(next.starts_at(), Some(QueueCursor::before(&ahead)));
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(linux.grants(), [ahead.id]);

    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    while fx.dispatcher.walk_page(&mut walk).await.expect("page") {}
    fx.dispatcher.note_queued();
    fx.dispatcher.finish_walk(&walk);
    let next = fx.dispatcher.start_walk().expect("a walk");
    assert_eq!(next.starts_at(), None);
}

/// The replica that took a submit notes the queued task as the submit
/// returns; the store's event for it goes to the other replicas only. Heard
/// here too, it came late (on PostgreSQL, a notification's round trip
/// later): a round may have leased the task meanwhile, and the late signal
/// said a task waited ahead of the parked head, so the next round read every
/// parked task again. The event of the cancel that follows does come back.
async fn a_replica_does_not_hear_its_own_submit_queued_again(fx: &Fixture) {
    use crate::model::StoreEvent;
    let mut events = fx.store.subscribe();
    let submitted = fx
        .dispatcher
        .submit_task(task("gpu", 0, None), &compiled("gpu"))
        .await
        .expect("submit");
    assert_eq!(submitted.task.state, TaskState::Queued);
    let id = submitted.task.id;
    fx.store
        .cancel_task(id, "test", None, fx.now())
        .await
        .expect("cancel");
    let mut heard = Vec::new();
    loop {
        let event = events.recv().await.expect("an event");
        let canceled = matches!(event, StoreEvent::TaskChanged { task_id, .. } if task_id == id);
        heard.push(event);
        if canceled {
            break;
        }
    }
    assert!(
        !heard
            .iter()
            .any(|e| matches!(e, StoreEvent::TaskQueued { task_id, .. } if *task_id == id)),
        "{heard:?}"
    );
}

/// A skip past its time is read again beside the rounds, which go on
/// starting past the parked head meanwhile: while the head holds only
/// parked tasks the skip is renewed; a task that came ahead of it with no
/// signal (a delayed task whose due time was not kept) drops it, and the
/// next round walks from the head and grants that task.
async fn a_skip_past_its_time_is_read_again_beside_the_rounds(fx: &Fixture) {
    use super::queue::SKIP_TTL_MS;
    let mut linux = fx.connect("a", &["linux"], 4).await;
    fx.queue("gpu", 9, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    fx.clock.advance(SKIP_TTL_MS);
    fx.dispatcher.recheck_skip().await;
    let skip = fx.dispatcher.state().queue.skip.expect("renewed");
    assert_eq!((skip.to, skip.made_at_ms), (None, fx.now()));

    // A reading under way while the rounds move the skip's end (a task
    // queued ahead of it, from another replica, moves it back; leasing that
    // task, on) still renews it.
    let queued = fx.queued_elsewhere("linux", 0).await;
    fx.clock.advance(SKIP_TTL_MS);
    let rechecking = &fx.dispatcher.shared.rechecking_skip;
    rechecking.store(true, std::sync::atomic::Ordering::SeqCst);
    let read = fx.dispatcher.read_skipped_head().await.expect("a skip");
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(linux.grants(), [queued.id]);
    let done = CompletionOutcome::Succeeded { result: json!({}) };
    settle(fx, &linux, queued.id, done).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    let moved = fx.dispatcher.state().queue.skip.expect("a skip");
    assert_eq!(moved.to, None);
    fx.dispatcher.apply_skipped_head(read);
    let skip = fx.dispatcher.state().queue.skip.expect("renewed");
    assert_eq!((skip.to, skip.made_at_ms), (None, fx.now()));
    rechecking.store(false, std::sync::atomic::Ordering::SeqCst);

    let sneaked = fx.queue("linux", 10, None).await;
    // Not read again before its time: the round starts past the head.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    fx.clock.advance(SKIP_TTL_MS);
    fx.dispatcher.recheck_skip().await;
    assert!(fx.dispatcher.state().queue.skip.is_none());
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(linux.grants(), [sneaked]);
}

/// After a whole page of parked tasks the walk does not read the rest of
/// them (each would be read only to be left out): it goes on just before
/// the first task that is not parked, and grants it on the next page. When
/// every task left is parked, the walk has reached the end of what it can
/// run.
async fn a_walk_goes_on_past_a_page_of_parked_tasks_where_the_first_is_not_parked(fx: &Fixture) {
    let mut linux = fx.connect("a", &["linux"], 4).await;
    for _ in 0..40 {
        fx.queue("gpu", 9, None).await;
    }
    let runnable = fx.queue("linux", 0, None).await;
    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    assert!(fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    let task = fx.store.get_task(runnable).await.expect("stored");
    assert_eq!(walk.cursor(), Some(QueueCursor::before(&task)));
    assert!(!fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert_eq!(linux.grants(), [runnable]);
    fx.dispatcher.finish_walk(&walk);

    for _ in 0..40 {
        fx.queue("arm", 9, None).await;
    }
    fx.dispatcher.note_queued();
    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    assert!(!fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert!(walk.walked(), "every task left is parked: the end");
}

/// Tasks an agent here can run but that no agent has room for are read by
/// a page, then left out of every page while no agent here has room for
/// their placement, as a parked placement's are: a backlog for a busy
/// agent at the head of the queue was read again by every page of every
/// round (up to 64 pages a round), before the walk reached anything it
/// could lease. A walk that left them out does not find the queue clear,
/// but a submit that no busy placement's agent could take is still leased
/// on the way in; once a slot frees, or the finding is a second old, they
/// are read again.
async fn a_busy_placement_is_left_out_of_the_walk_while_no_agent_has_room_for_it(fx: &Fixture) {
    let mut gpu = fx.connect("g", &["gpu"], 1).await;
    let mut linux = fx.connect("l", &["linux"], 4).await;
    let mut gpu_tasks = Vec::new();
    for _ in 0..40 {
        gpu_tasks.push(fx.queue("gpu", 9, None).await);
    }
    let first_linux = fx.queue("linux", 0, None).await;
    fx.dispatcher.note_queued();
    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    // A page of gpu tasks: one leased, the rest busy.
    assert!(fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert_eq!(gpu.grants(), [gpu_tasks[0]]);
    // The next page leaves them out and reaches the linux task.
    assert!(!fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert_eq!(linux.grants(), [first_linux]);
    fx.dispatcher.finish_walk(&walk);
    assert!(!fx.dispatcher.queue_clear(), "busy tasks wait");

    // The next walk's first page leaves them out from the start.
    let second_linux = fx.queue("linux", 0, None).await;
    fx.dispatcher.note_queued();
    let mut walk = fx.dispatcher.start_walk().expect("a walk");
    assert!(!fx.dispatcher.walk_page(&mut walk).await.expect("page"));
    assert_eq!(linux.grants(), [second_linux]);
    fx.dispatcher.finish_walk(&walk);
    assert!(!fx.dispatcher.queue_clear(), "busy tasks wait");
    let next = fx
        .dispatcher
        .start_walk()
        .expect("busy tasks are not parked");
    assert_eq!(next.starts_at(), None, "the walk learned no parked head");
    fx.dispatcher.finish_walk(&next);
    assert!(
        fx.dispatcher.nothing_leasable_waits(),
        "only busy tasks wait"
    );
    let submitted = fx
        .dispatcher
        .submit_task(task("linux", 0, None), &compiled("linux"))
        .await
        .expect("submit");
    assert_eq!(submitted.task.state, TaskState::Leased, "on the way in");
    assert_eq!(linux.grants(), [submitted.task.id]);

    // A slot frees: they are read again, in order.
    let done = CompletionOutcome::Succeeded { result: json!({}) };
    settle(fx, &gpu, gpu_tasks[0], done).await;
    assert!(
        !fx.dispatcher.nothing_leasable_waits(),
        "a busy placement has room"
    );
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(gpu.grants(), [gpu_tasks[1]]);

    // Found busy a second ago or more, they are read again too.
    let busy = |fx: &Fixture| {
        let mut state = fx.dispatcher.state();
        let state = &mut *state;
        state.queue.busy.keys(&state.index, fx.now()).len()
    };
    assert_eq!(busy(fx), 1);
    fx.clock.advance(1_000);
    assert_eq!(busy(fx), 0);
}

/// A walk that read to the end of the queue every task queued while it
/// was under way leaves nothing waiting, as of its last read: under a
/// steady stream of submits nearly every walk had one, so once a submit was
/// queued (beside a busy backlog, each time its finding lapsed) every later
/// one was queued too and waited for a round of its own. A task queued
/// after the walk's last read still waits, and overtaking it is not allowed.
async fn a_walk_that_read_what_was_queued_during_it_leaves_nothing_waiting(fx: &Fixture) {
    let mut gpu = fx.connect("g", &["gpu"], 1).await;
    let mut linux = fx.connect("l", &["linux"], 8).await;
    let submit = || async {
        fx.dispatcher
            .submit_task(task("linux", 0, None), &compiled("linux"))
            .await
            .expect("submit")
            .task
    };
    let walk_all = |mut walk| async move {
        while fx.dispatcher.walk_page(&mut walk).await.expect("page") {}
        walk
    };
    // Nothing busy yet: the task queued once the walk began is read and
    // leased by it.
    fx.dispatcher.note_queued();
    let walk = fx.dispatcher.start_walk().expect("a walk");
    let during = submit().await;
    assert_eq!(during.state, TaskState::Queued);
    let walk = walk_all(walk).await;
    fx.dispatcher.finish_walk(&walk);
    assert_eq!(linux.grants(), [during.id]);
    assert!(fx.dispatcher.nothing_leasable_waits(), "read and leased");
    let next = submit().await;
    assert_eq!(next.state, TaskState::Leased, "on the way in");
    assert_eq!(linux.grants(), [next.id]);

    // Queued after the walk's last read: it waits for a round.
    fx.dispatcher.note_queued();
    let walk = walk_all(fx.dispatcher.start_walk().expect("a walk")).await;
    let after = submit().await;
    fx.dispatcher.finish_walk(&walk);
    assert!(!fx.dispatcher.nothing_leasable_waits(), "not read");
    assert_eq!(submit().await.state, TaskState::Queued, "no overtaking");
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 2);
    assert_eq!(linux.grants().first(), Some(&after.id));

    // Beside a backlog for the busy gpu agent, left out of the walk.
    for _ in 0..40 {
        fx.queue("gpu", 9, None).await;
    }
    fx.dispatcher.note_queued();
    fx.dispatcher.dispatch_round().await.unwrap();
    assert_eq!(gpu.grants().len(), 1);
    fx.dispatcher.note_queued();
    let walk = fx.dispatcher.start_walk().expect("a walk");
    let during = submit().await;
    let walk = walk_all(walk).await;
    fx.dispatcher.finish_walk(&walk);
    assert_eq!(linux.grants(), [during.id]);
    assert!(
        fx.dispatcher.nothing_leasable_waits(),
        "only busy tasks wait"
    );
    assert_eq!(submit().await.state, TaskState::Leased, "on the way in");
    // A second later the next page reads them again, but until a page
    // finds them otherwise, submits are still leased on the way in.
    fx.clock.advance(1_000);
    assert!(fx.dispatcher.nothing_leasable_waits(), "a finding to renew");
    let busy = |fx: &Fixture| {
        let mut state = fx.dispatcher.state();
        let state = &mut *state;
        state.queue.busy.keys(&state.index, fx.now()).len()
    };
    assert_eq!(busy(fx), 0, "read again");
    // (A walk by hand: the grants here are never acknowledged, and a
    // round would hold their agents back by now.)
    let walk = walk_all(fx.dispatcher.start_walk().expect("a walk")).await;
    fx.dispatcher.finish_walk(&walk);
    assert_eq!(busy(fx), 1, "found busy again");
    assert!(
        fx.dispatcher.nothing_leasable_waits(),
        "only busy tasks wait"
    );
    // A busy task queued while a walk finds nothing past the backlog.
    linux.grants();
    fx.dispatcher.note_queued();
    let walk = fx.dispatcher.start_walk().expect("a walk");
    fx.queued_elsewhere("gpu", 9).await;
    let walk = walk_all(walk).await;
    fx.dispatcher.finish_walk(&walk);
    assert!(
        fx.dispatcher.nothing_leasable_waits(),
        "only busy tasks wait"
    );
    assert!(gpu.grants().is_empty());
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

async fn a_refused_task_waits_on_its_own_until_an_agent_that_did_not_refuse_it_connects(
    fx: &Fixture,
) {
    let mut a = fx.connect("a", &["linux"], 1).await;
    let refused = fx.queue("linux", 9, None).await;
    let other = fx.queue("linux", 0, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(a.grants(), [refused]);
    let cannot = CompletionOutcome::Released {
        reason: "no handler".into(),
        cause: ReleaseCause::CannotHandle,
    };
    settle(fx, &a, refused, cannot).await;
    fx.dispatcher.note_refusal(refused, a.id);
    // The slot goes to the other task of the same placement: the placement
    // is not parked, only the refused task waits.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(a.grants(), [other]);
    assert!(fx.dispatcher.state().queue.parked_keys().is_empty());
    let done = CompletionOutcome::Succeeded { result: json!({}) };
    settle(fx, &a, other, done).await;
    // Nothing else to run: the head of the queue is known to be parked.
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    assert!(a.grants().is_empty());
    // An agent that did not refuse it takes it at once, past that memory.
    let mut b = fx.connect("b", &["linux"], 1).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(b.grants(), [refused]);
    assert!(a.grants().is_empty());
}

async fn a_delayed_task_is_granted_once_it_comes_due(fx: &Fixture) {
    let mut agent = fx.connect("a", &["linux"], 1).await;
    let later = fx.queue("linux", 0, Some(T0 + 1_000)).await;
    fx.dispatcher.note_due(T0 + 1_000);
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    assert_eq!(
        fx.dispatcher.until_due(fx.now()),
        Some(std::time::Duration::from_millis(1_000))
    );
    fx.clock.advance(1_000);
    fx.dispatcher.take_due(fx.now());
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants(), [later]);
}

async fn a_lapsed_lease_is_expired_revoked_and_granted_again(fx: &Fixture) {
    let mut agent = fx.connect("a", &["linux"], 1).await;
    let id = fx.queue("linux", 0, None).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants(), [id]);
    // Past the ack window, and past the lease's TTL unrenewed.
    fx.clock.advance(10_000);
    fx.dispatcher.touch(agent.id);
    fx.dispatcher.sweep().await.unwrap();
    let revoked = agent.revocations();
    assert_eq!(revoked, [(id, RevocationReason::Expired)]);
    let task = fx.store.get_task(id).await.unwrap();
    assert_eq!(task.state, TaskState::Queued);
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 1);
    assert_eq!(agent.grants(), [id]);
    assert_eq!(fx.store.get_task(id).await.unwrap().fencing_token, 2);
}

async fn a_submit_is_leased_on_the_way_in_only_when_nothing_waits(fx: &Fixture) {
    // Before any round has seen the queue, a submit does not jump it.
    let nobody = fx
        .dispatcher
        .submit_task(task("gpu", 0, None), &compiled("gpu"))
        .await
        .unwrap();
    assert_eq!(nobody.task.state, TaskState::Queued);
    assert_eq!(nobody.queued_reason, Some(QueuedReason::Parked));
    let mut agent = fx.connect("a", &["linux"], 1).await;
    assert_eq!(fx.dispatcher.dispatch_round().await.unwrap(), 0);
    // The queue holds only a parked task: a submit is leased at once.
    let linux = compiled("linux");
    let first = fx
        .dispatcher
        .submit_task(task("linux", 0, None), &linux)
        .await
        .unwrap();
    assert_eq!((first.task.state, first.created), (TaskState::Leased, true));
    assert_eq!(first.queued_reason, None);
    assert_eq!(agent.grants(), [first.task.id]);
    // The agent is full: the next one waits for capacity.
    let second = fx
        .dispatcher
        .submit_task(task("linux", 0, None), &linux)
        .await
        .unwrap();
    assert_eq!(second.task.state, TaskState::Queued);
    assert_eq!(second.queued_reason, Some(QueuedReason::WaitingForCapacity));
    assert!(agent.grants().is_empty());
}
