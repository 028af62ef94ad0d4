//! Shared helpers: a real server on an ephemeral port over a fresh store.

use std::net::SocketAddr;

use switchyard_server::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

/// A running server; dropping it does not stop it, call [`TestServer::stop`].
pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    handle: JoinHandle<switchyard_server::error::Result<()>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Starts a server on an SQLite file in a fresh temporary directory.
    pub async fn start_sqlite() -> Self {
        init_test_log();
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("switchyard.db").display());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(switchyard_server::run(
            listener,
            ServerConfig::for_tests(url),
            async {
                let _ = rx.await;
            },
        ));
        Self {
            addr,
            shutdown: Some(tx),
            handle,
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

    /// Signals shutdown and waits for the server to return.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.handle
            .await
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
