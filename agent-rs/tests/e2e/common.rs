//! Helpers: a server that can be stopped and restarted on the same port and
//! store, the agent binary as a child process, and task helpers.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use switchyard_proto::v1::{self as pb, task_service_client::TaskServiceClient};
use switchyard_server::ServerConfig;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

pub const PROMPT: Duration = Duration::from_secs(20);

/// A server on a fixed address and SQLite file, restartable.
pub struct Server {
    pub addr: SocketAddr,
    url: String,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<switchyard_server::error::Result<()>>>,
}

impl Server {
    pub async fn start(dir: &Path) -> Self {
        let url = format!("sqlite://{}", dir.join("switchyard.db").display());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut server = Self {
            addr,
            url,
            shutdown: None,
            handle: None,
        };
        server.serve(listener);
        server
    }

    fn serve(&mut self, listener: TcpListener) {
        let mut config = ServerConfig::for_tests(self.url.clone());
        config.heartbeat_interval_ms = 200;
        config.sweep_interval_ms = 100;
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

    pub async fn tasks(&self) -> TaskServiceClient<Channel> {
        let channel = Endpoint::from_shared(self.url())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        TaskServiceClient::new(channel)
    }
}

/// Starts the agent binary.
pub fn agent(server: &Server, dir: &Path, name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
        .args(["--server", &server.url(), "--dir"])
        .arg(dir)
        .args([
            "--name",
            name,
            "--allow-exec",
            "--refresh-secs",
            "1",
            "--grace-secs",
            "10",
            "--capacity",
            "2",
        ])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("TEST_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the agent")
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
        })
        .await
        .expect("watch")
        .into_inner();
    tokio::time::timeout(PROMPT, async {
        let mut last = None;
        while let Some(item) = stream.next().await {
            let task = item.expect("item").task.expect("task");
            if task.state() == state {
                return task;
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
