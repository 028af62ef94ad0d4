//! Helpers: a server that can be stopped and restarted on the same port and
//! store (SQLite, or a PostgreSQL database of its own), the agent binary as
//! a child process, and task helpers.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use switchyard_proto::v1::{
    self as pb, agent_admin_service_client::AgentAdminServiceClient,
    task_service_client::TaskServiceClient,
};
use switchyard_server::ServerConfig;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

pub const PROMPT: Duration = Duration::from_secs(20);

/// A server on a fixed address and store (an SQLite file, or a PostgreSQL
/// database of its own), restartable.
pub struct Server {
    pub addr: SocketAddr,
    url: String,
    max_releases: u32,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<switchyard_server::error::Result<()>>>,
    /// The PostgreSQL database made for the server, dropped by
    /// [`Server::finish`].
    pg_database: Option<String>,
}

/// Which store a test server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Sqlite,
    Postgres,
}

/// The admin URL tests create their PostgreSQL databases through.
fn pg_admin_url() -> String {
    std::env::var("SWITCHYARD_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

impl Server {
    pub async fn start(dir: &Path) -> Self {
        Self::start_bounded(dir, switchyard_server::model::DEFAULT_MAX_RELEASES).await
    }

    /// A server whose tasks fail after `max_releases` hand-backs.
    pub async fn start_bounded(dir: &Path, max_releases: u32) -> Self {
        let url = format!("sqlite://{}", dir.join("switchyard.db").display());
        Self::start_at(url, max_releases, None).await
    }

    /// A server on `store` (SQLite in `dir`, or a fresh PostgreSQL database).
    pub async fn start_on(dir: &Path, store: Store) -> Self {
        if store == Store::Sqlite {
            return Self::start(dir).await;
        }
        use sqlx::Connection;
        let name = format!("sy_agent_{}", uuid::Uuid::new_v4().simple());
        let admin = pg_admin_url();
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .expect("connect to PostgreSQL");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("create database");
        conn.close().await.ok();
        let base = admin.rsplit_once('/').expect("admin url has a database").0;
        let url = format!("{base}/{name}");
        let max_releases = switchyard_server::model::DEFAULT_MAX_RELEASES;
        Self::start_at(url, max_releases, Some(name)).await
    }

    async fn start_at(url: String, max_releases: u32, pg_database: Option<String>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut server = Self {
            addr,
            url,
            max_releases,
            shutdown: None,
            handle: None,
            pg_database,
        };
        server.serve(listener);
        server
    }

    /// Stops the server and drops its PostgreSQL database, if it has one.
    pub async fn finish(mut self) {
        use sqlx::Connection;
        self.stop().await;
        if let Some(name) = self.pg_database.take()
            && let Ok(mut conn) = sqlx::PgConnection::connect(&pg_admin_url()).await
        {
            let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            let _ = sqlx::query(sqlx::AssertSqlSafe(drop))
                .execute(&mut conn)
                .await;
        }
    }

    fn serve(&mut self, listener: TcpListener) {
        let mut config = ServerConfig::for_tests(self.url.clone());
        config.heartbeat_interval_ms = 200;
        config.sweep_interval_ms = 100;
        config.max_releases_per_task = self.max_releases;
        let (tx, rx) = oneshot::channel::<()>();
        self.shutdown = Some(tx);
        self.handle = Some(tokio::spawn(switchyard_server::run(
            listener,
            config,
            async {
                let _ = rx.await;
            },
        )));
    }

    /// Stops the server (it drains connected agents) and waits for it.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(handle) = self.handle.take() {
            tokio::time::timeout(PROMPT, handle)
                .await
                .expect("stops")
                .expect("joins")
                .expect("ok");
        }
    }

    /// Starts again on the same address and store.
    pub async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("rebind the same port");
        self.serve(listener);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn channel(&self) -> Channel {
        Endpoint::from_shared(self.url())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn tasks(&self) -> TaskServiceClient<Channel> {
        TaskServiceClient::new(self.channel().await)
    }

    pub async fn admin(&self) -> AgentAdminServiceClient<Channel> {
        AgentAdminServiceClient::new(self.channel().await)
    }

    /// The agent named `name`, polled until `ok` holds for it (an agent's
    /// stored status has no event to await).
    pub async fn agent_until(&self, name: &str, ok: impl Fn(&pb::Agent) -> bool) -> pb::Agent {
        let mut admin = self.admin().await;
        tokio::time::timeout(PROMPT, async {
            loop {
                let agents = admin
                    .list_agents(pb::ListAgentsRequest::default())
                    .await
                    .expect("list agents")
                    .into_inner()
                    .agents;
                if let Some(agent) = agents.into_iter().find(|a| a.name == name && ok(a)) {
                    return agent;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("agent {name} not as expected in time"))
    }
}

/// Starts the agent binary (with `--allow-exec`).
pub fn agent(server: &Server, dir: &Path, name: &str) -> Child {
    agent_with(server, dir, name, &["--allow-exec"], Stdio::null())
}

/// Starts the agent binary with `extra` arguments, its log on `stderr`
/// (inherited with `TEST_LOG`, unless piped to be read).
pub fn agent_with(server: &Server, dir: &Path, name: &str, extra: &[&str], stderr: Stdio) -> Child {
    let stderr = if std::env::var_os("TEST_LOG").is_some() && extra.iter().all(|a| *a != PIPED) {
        Stdio::inherit()
    } else {
        stderr
    };
    let extra: Vec<&str> = extra.iter().copied().filter(|a| *a != PIPED).collect();
    Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
        .args(["--server", &server.url(), "--dir"])
        .arg(dir)
        .args([
            "--name",
            name,
            "--refresh-secs",
            "1",
            "--grace-secs",
            "10",
            "--capacity",
            "2",
        ])
        .args(extra)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the agent")
}

/// Not an agent argument: [`agent_with`] pipes the log even with `TEST_LOG`.
pub const PIPED: &str = "<piped>";

/// Waits until the child's piped log has a line containing `needle`, then
/// keeps reading it (echoed with `TEST_LOG`) so the agent never blocks on a
/// full pipe.
pub async fn wait_for_log(child: &mut Child, needle: &str) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let stderr = child.stderr.take().expect("stderr piped");
    let echo = std::env::var_os("TEST_LOG").is_some();
    let mut lines = BufReader::new(stderr).lines();
    tokio::time::timeout(PROMPT, async {
        while let Some(line) = lines.next_line().await.expect("read the log") {
            if echo {
                eprintln!("{line}");
            }
            if line.contains(needle) {
                return;
            }
        }
        panic!("the log ended before {needle:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("no {needle:?} in the log in time"));
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if echo {
                eprintln!("{line}");
            }
        }
    });
}

/// The events of a task's history.
pub async fn history(server: &Server, task_id: &str) -> Vec<pb::TaskEvent> {
    server
        .tasks()
        .await
        .list_task_events(pb::ListTaskEventsRequest {
            task_id: task_id.into(),
            ..Default::default()
        })
        .await
        .expect("history")
        .into_inner()
        .events
}

/// The agents a task was leased to, in order.
pub async fn leased_to(server: &Server, task_id: &str) -> Vec<String> {
    history(server, task_id)
        .await
        .into_iter()
        .filter(|e| e.kind == "leased")
        .map(|e| e.agent_id)
        .collect()
}

/// Submits an exec task.
pub async fn submit_exec(server: &Server, argv: &[&str], selector: &str) -> pb::Task {
    let payload = serde_json::json!({"argv": argv});
    server
        .tasks()
        .await
        .submit_task(pb::SubmitTaskRequest {
            kind: "exec".into(),
            payload: Some(switchyard_proto::convert::json_to_struct(&payload)),
            placement: Some(pb::Placement {
                selector: selector.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner()
        .task
        .expect("task")
}

/// Waits through WatchTask until the task is in `state` (or terminal).
pub async fn wait_for(server: &Server, task_id: &str, state: pb::TaskState) -> pb::Task {
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
    tokio::time::timeout(PROMPT, async {
        let mut last = None;
        while let Some(item) = stream.next().await {
            let task = item.expect("item").task.expect("task");
            // A replayed step carries the task as it was then: the task is
            // in `state` only if it still is.
            if task.state() == state {
                let now = server
                    .tasks()
                    .await
                    .get_task(pb::GetTaskRequest {
                        task_id: task_id.into(),
                    })
                    .await
                    .expect("get")
                    .into_inner()
                    .task
                    .expect("task");
                if now.state() == state {
                    return now;
                }
            }
            last = Some(task);
        }
        panic!("watch ended before {state:?}; last {last:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("task {task_id} did not reach {state:?} in time"))
}

/// The task's result as JSON.
pub fn result(task: &pb::Task) -> serde_json::Value {
    task.result
        .as_ref()
        .map(switchyard_proto::convert::struct_to_json_lossy)
        .unwrap_or_default()
}
