//! Shared helpers: a fresh store per test on either backend, and builders
//! for tasks, agents and grants.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use sqlx::Connection;
use switchyard_server::error::Result;
use switchyard_server::model::{
    AgentParts, AgentRecord, AgentRegistration, Beat, Completion, CompletionOutcome, GrantOutcome,
    GrantRequest, LeaseRecord, LeaseReport, NewTask, Page, ReportKind, Submission, TaskFilter,
    TaskRecord,
};
use switchyard_server::store::{self, Store, StoreOptions};
use uuid::Uuid;

/// The retry backoff base the suite's stores use (ms).
pub const BACKOFF_BASE_MS: i64 = 100;

/// The release bound the test stores run with: small, so a test reaches it.
pub const MAX_RELEASES: u32 = 5;

/// A start time for tests' injected clock.
pub const T0: i64 = 1_700_000_000_000;

/// A store on a database of its own; call [`Fixture::finish`] at the end.
pub struct Fixture {
    pub store: Arc<dyn Store>,
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres { admin: String, name: String },
    Done,
}

/// The PostgreSQL admin URL tests create their databases with.
pub fn pg_admin_url() -> String {
    std::env::var("SWITCHYARD_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

impl Fixture {
    /// A migrated store on a new SQLite file.
    pub async fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = open(&url).await;
        Self {
            store,
            url,
            cleanup: Cleanup::Sqlite(dir),
        }
    }

    /// A migrated store on a new PostgreSQL database.
    pub async fn postgres() -> Self {
        let admin = pg_admin_url();
        let name = format!("switchyard_test_{}", Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .expect("connect to the PostgreSQL admin URL");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .expect("create the test database");
        conn.close().await.expect("close the admin connection");
        let base = admin
            .rsplit_once('/')
            .map_or(admin.as_str(), |(base, _)| base);
        let url = format!("{base}/{name}");
        let store = open(&url).await;
        Self {
            store,
            url,
            cleanup: Cleanup::Postgres { admin, name },
        }
    }

    /// Another store instance on the same database (a second replica).
    pub async fn another_instance(&self) -> Arc<dyn Store> {
        open(&self.url).await
    }

    /// Closes the store and opens it again on the same database.
    pub async fn reopen(&mut self) {
        self.store.close().await;
        self.store = open(&self.url).await;
    }

    /// Closes the store and drops its database.
    pub async fn finish(mut self) {
        self.store.close().await;
        if let Cleanup::Postgres { admin, name } = &self.cleanup {
            drop_database(admin, name).await;
        }
        self.cleanup = Cleanup::Done;
    }
}

impl Drop for Fixture {
    /// A test that panicked before [`Fixture::finish`] still drops its
    /// database (on a thread of its own: the test's runtime is unwinding).
    fn drop(&mut self) {
        if let Cleanup::Postgres { admin, name } =
            std::mem::replace(&mut self.cleanup, Cleanup::Done)
        {
            let _ = std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    rt.block_on(drop_database(&admin, &name));
                }
            })
            .join();
        }
    }
}

async fn drop_database(admin: &str, name: &str) {
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .expect("connect to the PostgreSQL admin URL");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await
    .expect("drop the test database");
}

async fn open(url: &str) -> Arc<dyn Store> {
    let store = store::open_with(
        url,
        StoreOptions {
            backoff_base_ms: BACKOFF_BASE_MS,
            max_releases: MAX_RELEASES,
            ..StoreOptions::default()
        },
    )
    .await
    .expect("open the store");
    store.migrate().await.expect("migrate");
    store
}

/// Generates `mod sqlite` and `mod postgres` tests calling each
/// `async fn NAME(fx: &Fixture)` of the enclosing module.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let mut fx = $crate::common::Fixture::sqlite().await;
                    super::$name(&mut fx).await;
                    fx.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let mut fx = $crate::common::Fixture::postgres().await;
                    super::$name(&mut fx).await;
                    fx.finish().await;
                }
            )*
        }
    };
}

/// `$body` with `$pool` a new pool on the database at `$url` (an
/// `sqlx::SqlitePool` or an `sqlx::PgPool`, as the URL says), closed after:
/// for a test that reads or writes the tables past the store. Both
/// backends' `$body` must have the same type.
#[macro_export]
macro_rules! on_database {
    ($url:expr, |$pool:ident| $body:expr) => {{
        let url: &str = $url;
        if url.starts_with("sqlite:") {
            let $pool = sqlx::SqlitePool::connect(url).await.unwrap();
            let out = $body;
            $pool.close().await;
            out
        } else {
            let $pool = sqlx::PgPool::connect(url).await.unwrap();
            let out = $body;
            $pool.close().await;
            out
        }
    }};
}

/// A task of namespace `ns` with the given priority and attempt budget.
pub fn task(ns: &str, priority: i32, max_attempts: u32) -> NewTask {
    NewTask {
        namespace: ns.to_owned(),
        kind: "exec".to_owned(),
        payload: json!({"cmd": "true"}),
        placement: json!({"required_tags": []}),
        priority,
        max_attempts,
        retry: None,
        deadlines: Default::default(),
        fairness: None,
        concurrency_key: None,
        lease_ttl_ms: 30_000,
        idempotency_key: None,
        not_before_ms: None,
        labels: BTreeMap::from([("team".to_owned(), "infra".to_owned())]),
    }
}

/// Submits `task` at `now_ms` and returns the record.
pub async fn submit(store: &dyn Store, task: NewTask, now_ms: i64) -> TaskRecord {
    store.submit_task(task, now_ms).await.expect("submit").0
}

/// Submits `count` plain tasks to `ns`, one a millisecond from `T0`; their ids.
pub async fn submit_tasks(store: &dyn Store, ns: &str, count: i64) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for i in 0..count {
        ids.push(submit(store, task(ns, 0, 3), T0 + i).await.id);
    }
    ids
}

/// The tasks of `ns` as listed (the first hundred, newest first).
pub async fn tasks_in(store: &dyn Store, ns: &str) -> Vec<TaskRecord> {
    let filter = TaskFilter {
        namespace: ns.into(),
        ..Default::default()
    };
    let page = Page {
        size: 100,
        ..Default::default()
    };
    store.list_tasks(&filter, &page).await.expect("list").0
}

/// What the tests ask of a store beyond the server's own calls, each made
/// of them: one submit, one `started` or progress report, a touch, a
/// namespace's agents.
#[allow(async_fn_in_trait)]
pub trait TestStore {
    /// One task submitted on its own: the stored task, and whether it was
    /// created (false: an idempotent repeat).
    async fn submit_task(&self, task: NewTask, now_ms: i64) -> Result<(TaskRecord, bool)>;
    /// A `started` report on its own; the task after it.
    async fn report_started(
        &self,
        lease_id: Uuid,
        task_id: Uuid,
        agent_id: Uuid,
        fencing_token: u64,
        now_ms: i64,
    ) -> Result<TaskRecord>;
    /// A progress report on its own; the task after it.
    async fn report_progress(
        &self,
        lease_id: Uuid,
        task_id: Uuid,
        agent_id: Uuid,
        fencing_token: u64,
        progress: Value,
        now_ms: i64,
    ) -> Result<TaskRecord>;
    /// Records that the agent was heard from (a heartbeat that only
    /// touches); `NotFound` for an unknown agent.
    async fn touch_agent(&self, agent_id: Uuid, now_ms: i64) -> Result<()>;
    /// Every agent of a namespace, page after page.
    async fn agents_of(&self, namespace: &str) -> Result<Vec<AgentRecord>>;
}

/// One lease report (lease, task, agent, token) applied on its own; the
/// task after it.
async fn report_alone(
    store: &dyn Store,
    (lease_id, task_id, agent_id, fencing_token): (Uuid, Uuid, Uuid, u64),
    kind: ReportKind,
    now_ms: i64,
) -> Result<TaskRecord> {
    let report = LeaseReport {
        lease_id,
        task_id,
        agent_id,
        fencing_token,
        kind,
    };
    store
        .apply_reports(&[report], now_ms)
        .await?
        .pop()
        .expect("one result")?;
    store.get_task(task_id).await
}

impl TestStore for dyn Store {
    async fn submit_task(&self, task: NewTask, now_ms: i64) -> Result<(TaskRecord, bool)> {
        let submission = Submission {
            task,
            agent_id: None,
        };
        let mut results = self.submit_many(&[submission], now_ms).await?;
        let (record, created, _) = results.pop().expect("one result")?;
        Ok((record, created))
    }

    async fn report_started(
        &self,
        lease_id: Uuid,
        task_id: Uuid,
        agent_id: Uuid,
        fencing_token: u64,
        now_ms: i64,
    ) -> Result<TaskRecord> {
        let lease = (lease_id, task_id, agent_id, fencing_token);
        report_alone(self, lease, ReportKind::Started, now_ms).await
    }

    async fn report_progress(
        &self,
        lease_id: Uuid,
        task_id: Uuid,
        agent_id: Uuid,
        fencing_token: u64,
        progress: Value,
        now_ms: i64,
    ) -> Result<TaskRecord> {
        let lease = (lease_id, task_id, agent_id, fencing_token);
        report_alone(self, lease, ReportKind::Progress(progress), now_ms).await
    }

    async fn touch_agent(&self, agent_id: Uuid, now_ms: i64) -> Result<()> {
        let agent = self.get_agent(agent_id).await?;
        let beat = Beat {
            agent_id,
            session_epoch: agent.session_epoch,
            renew: false,
            touch: true,
            status: None,
            document: None,
            kinds: None,
            lift_refusals: false,
        };
        self.heartbeats(&[beat], now_ms)
            .await?
            .pop()
            .expect("one result")?;
        Ok(())
    }

    async fn agents_of(&self, namespace: &str) -> Result<Vec<AgentRecord>> {
        let mut all = Vec::new();
        let mut page = Page {
            size: 1_000,
            after: None,
        };
        loop {
            let (agents, next) = self
                .list_agents(namespace, &[], &page, AgentParts::Full)
                .await?;
            all.extend(agents);
            match next {
                Some(after) => page.after = Some(after),
                None => return Ok(all),
            }
        }
    }
}

/// Registers an agent `name` in `ns` with `capacity`.
pub async fn agent(store: &dyn Store, ns: &str, name: &str, capacity: u32) -> AgentRecord {
    let provenance = json!({"tags": "agent"});
    register(
        store,
        ns,
        name,
        capacity,
        json!({"tags": ["linux"]}),
        provenance,
    )
    .await
}

/// Registers an agent `name` in `ns` with `capacity` that offers two GPUs
/// (`GPU-0`, `GPU-1`), 32,000 MB of memory and 4,000 millicores.
pub async fn gpu_agent(store: &dyn Store, ns: &str, name: &str, capacity: u32) -> AgentRecord {
    let document = json!({"tags": ["linux"], "resources": {
        "cpu_millicores": 4000, "memory_mb": 32000,
        "gpus": [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}],
    }});
    register(store, ns, name, capacity, document, json!({})).await
}

async fn register(
    store: &dyn Store,
    ns: &str,
    name: &str,
    capacity: u32,
    document: Value,
    provenance: Value,
) -> AgentRecord {
    store
        .register_agent(
            &AgentRegistration {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                reported: document.clone(),
                document,
                provenance,
                rejections: json!([]),
                capacity,
                labels: BTreeMap::new(),
                runner: "switchyard-agent/0.1.0 (rust)".to_owned(),
                handled_kinds: vec!["*".to_owned()],
                registered_by: String::new(),
            },
            T0,
        )
        .await
        .expect("register agent")
}

/// Asks for a lease of `task_id` on `agent_id` holding `claim`.
pub fn claiming(task_id: Uuid, agent_id: Uuid, claim: Value) -> GrantRequest {
    GrantRequest::new(
        task_id,
        agent_id,
        serde_json::from_value(claim).expect("a claim"),
    )
}

/// `request`, as sent by a requester that saw the agent's other leases hold
/// `held` (task, claim).
pub fn seeing(mut request: GrantRequest, held: &[(Uuid, Value)]) -> GrantRequest {
    let held = held.iter().map(|(task, claim)| {
        let claim = serde_json::from_value(claim.clone()).expect("a claim");
        (*task, claim)
    });
    request.seen = Some(std::sync::Arc::new(switchyard_core::resources::Held::of(
        held,
    )));
    request
}

/// Registers `count` agents `w0`, `w1`, … in `ns` with `capacity`; their ids.
pub async fn agents(store: &dyn Store, ns: &str, count: usize, capacity: u32) -> Vec<Uuid> {
    let mut ids = Vec::with_capacity(count);
    for i in 0..count {
        ids.push(agent(store, ns, &format!("w{i}"), capacity).await.id);
    }
    ids
}

/// Grants one task to one agent and returns the lease, panicking if refused.
pub async fn grant(store: &dyn Store, task_id: Uuid, agent_id: Uuid, now_ms: i64) -> LeaseRecord {
    let outcomes = store
        .grant_leases(&[GrantRequest::one_slot(task_id, agent_id)], now_ms)
        .await
        .expect("grant");
    match outcomes.as_slice() {
        [GrantOutcome::Granted(lease)] => lease.clone(),
        other => panic!("grant refused: {other:?}"),
    }
}

/// The final report `outcome` of `lease`, as its holder sends it.
pub fn completion(lease: &LeaseRecord, outcome: CompletionOutcome) -> Completion {
    Completion {
        lease_id: lease.id,
        task_id: lease.task_id,
        agent_id: lease.agent_id,
        fencing_token: lease.fencing_token,
        outcome,
    }
}

/// A small deterministic pseudo-random sequence (no extra dependency).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % below as u64) as usize
    }
}
