//! Shared helpers: a real server on an ephemeral port over a fresh store
//! (an SQLite file in a temporary directory, or a PostgreSQL database
//! created for the test and dropped afterwards), and a scripted agent that
//! speaks the real `Connect` protocol.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use sqlx::Connection;
use switchyard_proto::v1::{
    self as pb, agent_admin_service_client::AgentAdminServiceClient,
    agent_service_client::AgentServiceClient, connect_request::Message as Up,
    connect_response::Message as Down, task_service_client::TaskServiceClient,
};
use switchyard_server::ServerConfig;
use switchyard_server::api::convert::json_to_struct;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

/// Generous bound for "it happens promptly" (never a sleep).
pub const PROMPT: Duration = Duration::from_secs(10);

/// Which store a test server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Runs each named `async fn(Backend)` once per store.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Postgres).await
                }
            )*
        }
    };
}

/// The admin URL tests create their PostgreSQL databases through.
pub fn pg_admin_url() -> String {
    std::env::var("SWITCHYARD_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A running server; call [`TestServer::stop`] at the end.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The metrics endpoint's address, when the test configured one.
    pub metrics_addr: Option<SocketAddr>,
    /// The console's address, when the test configured one.
    pub console_addr: Option<SocketAddr>,
    /// The database the server runs on (for a second store instance).
    pub url: String,
    shutdown: Option<oneshot::Sender<()>>,
    handle: JoinHandle<switchyard_server::error::Result<()>>,
    pg_database: Option<String>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Starts a server on an SQLite file in a fresh temporary directory.
    pub async fn start_sqlite() -> Self {
        Self::start(Backend::Sqlite).await
    }

    /// Starts a server on a fresh store of the given backend.
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, |_| {}).await
    }

    /// Starts a server, letting the test adjust its configuration.
    pub async fn start_with(backend: Backend, adjust: impl FnOnce(&mut ServerConfig)) -> Self {
        init_test_log();
        let dir = tempfile::tempdir().expect("temporary directory");
        let (url, pg_database) = match backend {
            Backend::Sqlite => (
                format!("sqlite://{}", dir.path().join("switchyard.db").display()),
                None,
            ),
            Backend::Postgres => {
                let name = format!("sy_api_{}", uuid::Uuid::new_v4().simple());
                let admin = pg_admin_url();
                let mut conn = sqlx::PgConnection::connect(&admin)
                    .await
                    .expect("connect to PostgreSQL");
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut conn)
                    .await
                    .expect("create database");
                conn.close().await.ok();
                let base = admin
                    .rsplit_once('/')
                    .map(|(b, _)| b.to_owned())
                    .expect("admin url has a database");
                (format!("{base}/{name}"), Some(name))
            }
        };
        Self::start_on(url, pg_database, dir, adjust).await
    }

    /// Another replica of this server: a server on the same database
    /// (PostgreSQL), stopped before this one, which drops the database.
    pub async fn replica(&self) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        Self::start_on(self.url.clone(), None, dir, |_| {}).await
    }

    async fn start_on(
        url: String,
        pg_database: Option<String>,
        dir: tempfile::TempDir,
        adjust: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        let mut config = ServerConfig::for_tests(url.clone());
        config.sweep_interval_ms = 50;
        adjust(&mut config);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        // Prepared here, so that the metrics and console listeners are
        // bound (on port 0 in tests: a port picked and let go could be
        // taken by a parallel test's server before this one binds it).
        let prepared =
            switchyard_server::server::prepare(config, switchyard_server::clock::Clock::system())
                .await
                .expect("server prepares");
        let metrics_addr = prepared.metrics_addr();
        let console_addr = prepared.console_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(prepared.serve(listener, async {
            let _ = rx.await;
        }));
        Self {
            addr,
            metrics_addr,
            console_addr,
            url,
            shutdown: Some(tx),
            handle,
            pg_database,
            _dir: dir,
        }
    }

    /// A channel to the server.
    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to the test server")
    }

    /// A task client.
    pub async fn tasks(&self) -> TaskServiceClient<Channel> {
        TaskServiceClient::new(self.channel().await)
    }

    /// An admin client.
    pub async fn admin(&self) -> AgentAdminServiceClient<Channel> {
        AgentAdminServiceClient::new(self.channel().await)
    }

    /// Signals shutdown, waits for the server to return, drops the database.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let result = tokio::time::timeout(PROMPT, &mut self.handle).await;
        if let Some(name) = self.pg_database.take()
            && let Ok(mut conn) = sqlx::PgConnection::connect(&pg_admin_url()).await
        {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(&mut conn)
            .await;
        }
        result
            .expect("server stops promptly")
            .expect("server task")
            .expect("server result");
    }
}

/// Shows server logs when `TEST_LOG` is set.
fn init_test_log() {
    if std::env::var_os("TEST_LOG").is_some() {
        switchyard_server::telemetry::init(switchyard_server::telemetry::LogFormat::Text);
    }
}

/// Submits a task with a selector; returns it.
pub async fn submit(server: &TestServer, kind: &str, selector: &str) -> pb::Task {
    submit_request(
        server,
        pb::SubmitTaskRequest {
            kind: kind.into(),
            placement: Some(pb::Placement {
                selector: selector.into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
}

/// Submits a task request; returns it.
pub async fn submit_request(server: &TestServer, request: pb::SubmitTaskRequest) -> pb::Task {
    server
        .tasks()
        .await
        .submit_task(request)
        .await
        .expect("submit")
        .into_inner()
        .task
        .expect("task")
}

/// Submits an `exec` task with `placement` and expects INVALID_ARGUMENT
/// naming `field`.
pub async fn placement_refused(server: &TestServer, placement: pb::Placement, field: &str) {
    let err = server
        .tasks()
        .await
        .submit_task(pb::SubmitTaskRequest {
            kind: "exec".into(),
            placement: Some(placement),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains(field), "{field}: {}", err.message());
}

/// A task's history, oldest first (one page).
pub async fn task_events(server: &TestServer, task_id: &str) -> Vec<pb::TaskEvent> {
    server
        .tasks()
        .await
        .list_task_events(pb::ListTaskEventsRequest {
            task_id: task_id.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events
}

/// Reads an agent as operators see it.
pub async fn get_agent(server: &TestServer, agent_id: &str) -> pb::Agent {
    server
        .admin()
        .await
        .get_agent(pb::GetAgentRequest {
            agent_id: agent_id.to_owned(),
        })
        .await
        .expect("get agent")
        .into_inner()
        .agent
        .expect("agent")
}

/// Reads a task.
pub async fn get_task(server: &TestServer, task_id: &str) -> pb::Task {
    server
        .tasks()
        .await
        .get_task(pb::GetTaskRequest {
            task_id: task_id.into(),
        })
        .await
        .expect("get task")
        .into_inner()
        .task
        .expect("task")
}

/// What ExplainTask says of a task.
pub async fn explain(server: &TestServer, task_id: &str) -> pb::ExplainTaskResponse {
    server
        .tasks()
        .await
        .explain_task(pb::ExplainTaskRequest {
            task_id: task_id.into(),
        })
        .await
        .expect("explain")
        .into_inner()
}

/// The first page of the default namespace's tasks.
pub async fn all_tasks(server: &TestServer) -> Vec<pb::Task> {
    server
        .tasks()
        .await
        .list_tasks(pb::ListTasksRequest::default())
        .await
        .expect("list tasks")
        .into_inner()
        .tasks
}

/// Waits (through WatchTask, not by polling) until the task is in `state`.
pub async fn wait_for_state(server: &TestServer, task_id: &str, state: pb::TaskState) -> pb::Task {
    let mut stream = server
        .tasks()
        .await
        .watch_task(pb::WatchTaskRequest {
            task_id: task_id.into(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let found = tokio::time::timeout(PROMPT, async {
        while let Some(item) = stream.next().await {
            let task = item.expect("watch item").task.expect("task");
            // A replayed step carries the task as it was then: the task is
            // in `state` only if it still is.
            if task.state() == state {
                let now = get_task(server, task_id).await;
                if now.state() == state {
                    return Some(now);
                }
            }
        }
        None
    })
    .await
    .unwrap_or_else(|_| panic!("task {task_id} did not reach {state:?} in time"));
    found.unwrap_or_else(|| panic!("watch of {task_id} ended before {state:?}"))
}

/// A scripted agent speaking the real protocol.
pub struct TestAgent {
    pub agent_id: String,
    pub generation: u64,
    pub welcome: pb::Welcome,
    document: Value,
    sequence: u64,
    tx: mpsc::Sender<pb::ConnectRequest>,
    rx: tonic::Streaming<pb::ConnectResponse>,
    /// Messages read while looking for something else.
    backlog: std::collections::VecDeque<Down>,
}

impl TestAgent {
    /// Registers `name` with `document` and `capacity`, then connects.
    pub async fn start(server: &TestServer, name: &str, document: Value, capacity: u32) -> Self {
        let reg = Self::register(server, name, document.clone(), capacity).await;
        Self::connect(server, &reg, document, Vec::new()).await
    }

    /// [`TestAgent::start`] for an agent that handles only `kinds`.
    pub async fn start_handling(
        server: &TestServer,
        name: &str,
        document: Value,
        capacity: u32,
        kinds: &[&str],
    ) -> Self {
        let reg = Self::register_handling(server, name, document.clone(), capacity, kinds).await;
        Self::connect(server, &reg, document, Vec::new()).await
    }

    /// Registers only, handling every kind (`*`).
    pub async fn register(
        server: &TestServer,
        name: &str,
        document: Value,
        capacity: u32,
    ) -> pb::RegisterAgentResponse {
        Self::register_handling(server, name, document, capacity, &["*"]).await
    }

    /// Registers only, handling `kinds`.
    pub async fn register_handling(
        server: &TestServer,
        name: &str,
        document: Value,
        capacity: u32,
        kinds: &[&str],
    ) -> pb::RegisterAgentResponse {
        AgentServiceClient::new(server.channel().await)
            .register_agent(pb::RegisterAgentRequest {
                name: name.into(),
                namespace: String::new(),
                capabilities: Some(json_to_struct(&document)),
                capacity,
                runner: "test".into(),
                handled_kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
                ..Default::default()
            })
            .await
            .expect("register")
            .into_inner()
    }

    /// Opens a session for a registration, resuming `held` leases.
    pub async fn connect(
        server: &TestServer,
        reg: &pb::RegisterAgentResponse,
        document: Value,
        held: Vec<pb::HeldLease>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(64);
        tx.send(pb::ConnectRequest {
            sequence: 1,
            message: Some(Up::Hello(pb::Hello {
                agent_id: reg.agent_id.clone(),
                session_epoch: reg.session_epoch,
                held_leases: held,
            })),
        })
        .await
        .expect("queue hello");
        let mut stream = AgentServiceClient::new(server.channel().await)
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("connect")
            .into_inner();
        let first = tokio::time::timeout(PROMPT, stream.next())
            .await
            .expect("welcome in time")
            .expect("a message")
            .expect("welcome ok");
        let Some(Down::Welcome(welcome)) = first.message else {
            panic!("expected welcome, got {first:?}")
        };
        Self {
            agent_id: reg.agent_id.clone(),
            generation: welcome.capability_generation,
            welcome,
            document,
            sequence: 1,
            tx,
            rx: stream,
            backlog: Default::default(),
        }
    }

    /// Sends a message; returns its sequence number.
    pub async fn send(&mut self, message: Up) -> u64 {
        self.sequence += 1;
        self.tx
            .send(pb::ConnectRequest {
                sequence: self.sequence,
                message: Some(message),
            })
            .await
            .expect("send on the session");
        self.sequence
    }

    /// Waits for a message matching `pick`, keeping the others for later.
    pub async fn expect<T>(&mut self, what: &str, mut pick: impl FnMut(&Down) -> Option<T>) -> T {
        let mut skipped = Vec::new();
        let found = loop {
            let m = match self.backlog.pop_front() {
                Some(m) => m,
                None => match tokio::time::timeout(PROMPT, self.rx.next()).await {
                    Ok(Some(Ok(m))) => match m.message {
                        Some(m) => m,
                        None => continue,
                    },
                    Ok(_) => panic!("stream ended while waiting for {what}"),
                    Err(_) => panic!("no {what} in time; skipped {skipped:?}"),
                },
            };
            if let Some(t) = pick(&m) {
                break t;
            }
            skipped.push(m);
        };
        for m in skipped.into_iter().rev() {
            self.backlog.push_front(m);
        }
        found
    }

    /// Waits until the server ends the stream (skipping other messages).
    pub async fn expect_end(&mut self) {
        loop {
            match tokio::time::timeout(PROMPT, self.rx.next()).await {
                Ok(Some(Ok(_))) => continue,
                Ok(_) => return,
                Err(_) => panic!("the server did not end the stream in time"),
            }
        }
    }

    /// The next lease grant.
    pub async fn grant(&mut self) -> pb::LeaseGrant {
        self.expect("lease grant", |m| match m {
            Down::LeaseGrant(g) => Some(g.clone()),
            _ => None,
        })
        .await
    }

    /// The ack of message `sequence`.
    pub async fn ack(&mut self, sequence: u64) -> pb::Ack {
        self.expect(&format!("ack {sequence}"), |m| match m {
            Down::Ack(a) if a.sequence == sequence => Some(a.clone()),
            _ => None,
        })
        .await
    }

    /// A lease update for `grant`; returns the server's ack.
    pub async fn update(
        &mut self,
        grant: &pb::LeaseGrant,
        update: pb::lease_update::Update,
    ) -> pb::Ack {
        let task_id = grant
            .task
            .as_ref()
            .map(|t| t.task_id.clone())
            .unwrap_or_default();
        let seq = self
            .send(Up::LeaseUpdate(pb::LeaseUpdate {
                lease_id: grant.lease_id.clone(),
                task_id,
                fencing_token: grant.fencing_token,
                update: Some(update),
            }))
            .await;
        self.ack(seq).await
    }

    /// Accepts, starts and succeeds a grant with `result`.
    pub async fn run_to_success(&mut self, grant: &pb::LeaseGrant, result: Value) {
        use pb::lease_update::Update;
        assert_eq!(
            self.update(grant, Update::Accepted(pb::LeaseAccepted {}))
                .await
                .code,
            0
        );
        assert_eq!(
            self.update(grant, Update::Started(pb::LeaseStarted {}))
                .await
                .code,
            0
        );
        let ack = self
            .update(
                grant,
                Update::Succeeded(pb::LeaseSucceeded {
                    result: Some(json_to_struct(&result)),
                }),
            )
            .await;
        assert_eq!(ack.code, 0, "{}", ack.message);
    }

    /// Succeeds a grant already accepted and started, with `result`.
    pub async fn succeed(&mut self, grant: &pb::LeaseGrant, result: Value) {
        let succeeded = pb::lease_update::Update::Succeeded(pb::LeaseSucceeded {
            result: Some(json_to_struct(&result)),
        });
        let ack = self.update(grant, succeeded).await;
        assert_eq!(ack.code, 0, "{}", ack.message);
    }

    /// Sends a heartbeat with status and, if the document changed, the diff
    /// from the last one; returns the ack.
    pub async fn heartbeat(
        &mut self,
        status: pb::AgentStatus,
        reasons: &[&str],
        document: Option<Value>,
    ) -> pb::Ack {
        let diff = document.map(|next| {
            let patch = json_patch::diff(&self.document, &next);
            self.document = next;
            pb::CapabilityDiff {
                base_generation: self.generation,
                operations: switchyard_proto::convert::patch_to_proto(&patch),
            }
        });
        self.beat(status, reasons, diff).await
    }

    /// A heartbeat whose diff is made as the agents make theirs
    /// (`switchyard_core::diff::diff`: an object whose members changed may
    /// be replaced whole); returns the ack and the patch sent.
    pub async fn heartbeat_as_agents_do(
        &mut self,
        next: Value,
    ) -> (pb::Ack, switchyard_core::diff::Patch) {
        let patch = switchyard_core::diff::diff(&self.document, &next);
        self.document = next;
        let diff = pb::CapabilityDiff {
            base_generation: self.generation,
            operations: switchyard_proto::convert::patch_to_proto(&patch),
        };
        let ack = self.beat(pb::AgentStatus::Ready, &[], Some(diff)).await;
        (ack, patch)
    }

    async fn beat(
        &mut self,
        status: pb::AgentStatus,
        reasons: &[&str],
        diff: Option<pb::CapabilityDiff>,
    ) -> pb::Ack {
        let seq = self
            .send(Up::Heartbeat(pb::Heartbeat {
                status: status as i32,
                status_reasons: reasons.iter().map(|r| (*r).to_owned()).collect(),
                load: None,
                capability_diff: diff,
                handled_kinds: None,
            }))
            .await;
        let ack = self.ack(seq).await;
        self.generation = ack.capability_generation;
        ack
    }

    /// A READY heartbeat announcing the kinds the agent handles from now on;
    /// returns the ack.
    pub async fn announce_kinds(&mut self, kinds: &[&str]) -> pb::Ack {
        let seq = self
            .send(Up::Heartbeat(pb::Heartbeat {
                status: pb::AgentStatus::Ready as i32,
                handled_kinds: Some(pb::HandledKinds {
                    kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
                }),
                ..Default::default()
            }))
            .await;
        self.ack(seq).await
    }

    /// Releases a grant with `cause` and `reason`; returns the ack.
    pub async fn release(
        &mut self,
        grant: &pb::LeaseGrant,
        cause: pb::ReleaseCause,
        reason: &str,
    ) -> pb::Ack {
        let released = pb::lease_update::Update::Released(pb::LeaseReleased {
            reason: reason.to_owned(),
            cause: cause as i32,
        });
        self.update(grant, released).await
    }

    /// Closes the agent's half of the stream.
    pub fn hang_up(self) {}
}
