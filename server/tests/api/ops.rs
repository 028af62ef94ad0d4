//! Operations: TLS and mTLS; health through a PostgreSQL outage; SIGTERM
//! draining a connected agent with a running lease; Prometheus metrics; and
//! a secret scan of logs and the database after a run with tokens and
//! secret-looking capability keys.

use std::process::Stdio;

use serde_json::json;
use switchyard_proto::v1::{self as pb, agent_service_client::AgentServiceClient};
use switchyard_server::api::convert::json_to_struct;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio_stream::StreamExt;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::common::{Backend, PROMPT, TestAgent, TestServer, pg_admin_url};

/// A CA, a server certificate for localhost/127.0.0.1 and a client certificate.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(vec!["agent-1".to_owned()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    Pki {
        ca: ca.pem(),
        server_cert: server.pem(),
        server_key: server_key.serialize_pem(),
        client_cert: client.pem(),
        client_key: client_key.serialize_pem(),
    }
}

async fn health_over(endpoint: Endpoint) -> Result<ServingStatus, String> {
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(|s| format!("check: {s}"))?;
    Ok(reply.into_inner().status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mtls_accept_their_clients_and_refuse_plaintext() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let (cert, key, ca) = (
        write("s.pem", &pki.server_cert),
        write("s.key", &pki.server_key),
        write("ca.pem", &pki.ca),
    );
    let ca_cert = Certificate::from_pem(&pki.ca);

    // TLS.
    let server = TestServer::start_with(Backend::Sqlite, |c| {
        c.tls_cert = Some(cert.clone());
        c.tls_key = Some(key.clone());
    })
    .await;
    let tls = ClientTlsConfig::new()
        .ca_certificate(ca_cert.clone())
        .domain_name("localhost");
    let url = format!("https://{}", server.addr);
    let ok = health_over(
        Endpoint::from_shared(url.clone())
            .unwrap()
            .tls_config(tls.clone())
            .unwrap(),
    )
    .await;
    assert_eq!(ok, Ok(ServingStatus::Serving));
    let plain =
        health_over(Endpoint::from_shared(format!("http://{}", server.addr)).unwrap()).await;
    assert!(
        plain.is_err(),
        "plaintext must be refused when TLS is on: {plain:?}"
    );
    server.stop().await;

    // mTLS: a client certificate signed by the CA is required.
    let server = TestServer::start_with(Backend::Sqlite, |c| {
        c.tls_cert = Some(cert);
        c.tls_key = Some(key);
        c.tls_client_ca = Some(ca);
    })
    .await;
    let url = format!("https://{}", server.addr);
    let without = health_over(
        Endpoint::from_shared(url.clone())
            .unwrap()
            .tls_config(tls.clone())
            .unwrap(),
    )
    .await;
    assert!(
        without.is_err(),
        "mTLS must refuse a client without a certificate: {without:?}"
    );
    let with = tls.identity(Identity::from_pem(&pki.client_cert, &pki.client_key));
    let ok = health_over(
        Endpoint::from_shared(url.clone())
            .unwrap()
            .tls_config(with)
            .unwrap(),
    )
    .await;
    assert_eq!(ok, Ok(ServingStatus::Serving));
    // The CLI connects the same way, with a CA file and a client certificate.
    // Run with a deadline: a CLI that hangs fails the test instead of
    // stalling the suite (seen once: the process waited on a futex).
    let cli = |with_cert: bool| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard"));
        cmd.env_clear()
            .kill_on_drop(true)
            .args([
                "--server",
                &url.replace("127.0.0.1", "localhost"),
                "--ca-file",
            ])
            .arg(dir.path().join("ca.pem"));
        if with_cert {
            cmd.arg("--tls-cert")
                .arg(write("c.pem", &pki.client_cert))
                .arg("--tls-key")
                .arg(write("c.key", &pki.client_key));
        }
        cmd.args(["agents", "list"]);
        async move {
            tokio::time::timeout(PROMPT, cmd.output())
                .await
                .expect("the CLI answers in time")
                .unwrap()
        }
    };
    let listed = cli(true).await;
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert_eq!(
        cli(false).await.status.code(),
        Some(6),
        "no client certificate: refused"
    );
    server.stop().await;
}

/// A TCP proxy in front of PostgreSQL that the test can cut and restore:
/// from the server's side, exactly a database that went away and came back.
struct PgOutage {
    addr: std::net::SocketAddr,
    up: tokio::sync::watch::Sender<bool>,
}

impl PgOutage {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, rx) = tokio::sync::watch::channel(true);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                if !*rx.borrow() {
                    drop(client);
                    continue;
                }
                let mut rx = rx.clone();
                tokio::spawn(async move {
                    let Ok(mut pg) = tokio::net::TcpStream::connect("127.0.0.1:5432").await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut pg) => {}
                        _ = rx.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Self { addr, up }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_store_through_a_postgres_outage() {
    use sqlx::Connection;
    let outage = PgOutage::start().await;
    let name = format!("sy_outage_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&pg_admin_url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let url = format!("postgres://postgres@{}/{name}", outage.addr);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(switchyard_server::run(
        listener,
        switchyard_server::ServerConfig::for_tests(url),
        async {
            let _ = stopped.await;
        },
    ));
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: "switchyard.v1.TaskService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    async fn next(
        watch: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
    ) -> ServingStatus {
        tokio::time::timeout(PROMPT, watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
            .status()
    }
    assert_eq!(next(&mut watch).await, ServingStatus::Serving);
    outage.up.send(false).unwrap();
    assert_eq!(
        next(&mut watch).await,
        ServingStatus::NotServing,
        "health must follow the store down"
    );
    outage.up.send(true).unwrap();
    assert_eq!(
        next(&mut watch).await,
        ServingStatus::Serving,
        "and back up"
    );
    drop(watch);
    let _ = stop.send(());
    tokio::time::timeout(PROMPT, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
}

/// Starts the server binary; returns the child and its address.
async fn server_binary(args: &[&str], envs: &[(&str, &str)]) -> (tokio::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard-server"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(PROMPT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let addr = line
        .strip_prefix("switchyard-server listening on ")
        .unwrap()
        .to_owned();
    (child, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_agents_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("sy.db").display());
    let (mut child, addr) =
        server_binary(&["--database-url", &db, "--shutdown-grace-ms", "3000"], &[]).await;
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let reg = AgentServiceClient::new(channel.clone())
        .register_agent(pb::RegisterAgentRequest {
            name: "a".into(),
            capacity: 1,
            capabilities: Some(json_to_struct(&json!({"tags": ["x"]}))),
            handled_kinds: vec!["*".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(pb::ConnectRequest {
        sequence: 1,
        message: Some(pb::connect_request::Message::Hello(pb::Hello {
            agent_id: reg.agent_id.clone(),
            session_epoch: reg.session_epoch,
            held_leases: vec![],
        })),
    })
    .await
    .unwrap();
    let mut stream = AgentServiceClient::new(channel.clone())
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    switchyard_proto::v1::task_service_client::TaskServiceClient::new(channel)
        .submit_task(pb::SubmitTaskRequest {
            kind: "k".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let grant = loop {
        let m = tokio::time::timeout(PROMPT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(pb::connect_response::Message::LeaseGrant(g)) = m.message {
            break g;
        }
    };
    for (seq, update) in [
        (2, pb::lease_update::Update::Accepted(pb::LeaseAccepted {})),
        (3, pb::lease_update::Update::Started(pb::LeaseStarted {})),
    ] {
        tx.send(pb::ConnectRequest {
            sequence: seq,
            message: Some(pb::connect_request::Message::LeaseUpdate(pb::LeaseUpdate {
                lease_id: grant.lease_id.clone(),
                task_id: grant.task.clone().unwrap().task_id,
                fencing_token: grant.fencing_token,
                update: Some(update),
            })),
        })
        .await
        .unwrap();
    }
    // A running lease; now SIGTERM the server.
    let pid = nix_pid(&child);
    signal_term(pid);
    let drain = loop {
        let m = tokio::time::timeout(PROMPT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(pb::connect_response::Message::Drain(d)) = m.message {
            break d;
        }
    };
    assert_eq!(drain.reason, "server shutting down");
    drop(tx);
    let status = tokio::time::timeout(PROMPT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "server exit: {status}");
}

fn nix_pid(child: &tokio::process::Child) -> i32 {
    i32::try_from(child.id().unwrap()).unwrap()
}

fn signal_term(pid: i32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_reports_grants_and_agents() {
    let server = TestServer::start_with(Backend::Sqlite, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap())
    })
    .await;
    let port = server.metrics_addr.expect("the metrics address");
    let mut agent = TestAgent::start(&server, "m", json!({"tags": ["m"]}), 1).await;
    crate::common::submit(&server, "k", "m").await;
    let grant = agent.grant().await;
    agent.run_to_success(&grant, json!({})).await;
    let mut socket = tokio::net::TcpStream::connect(port).await.unwrap();
    socket
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    tokio::time::timeout(PROMPT, socket.read_to_string(&mut body))
        .await
        .unwrap()
        .unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for metric in [
        "switchyard_grants_total",
        "switchyard_connected_agents",
        "switchyard_match_seconds",
        "switchyard_store_seconds",
    ] {
        assert!(body.contains(metric), "{metric} missing from:\n{body}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_logs_or_the_database() {
    const SECRETS: [&str; 4] = [
        "SECRET-API-KEY-111",
        "SECRET-PASSWORD-222",
        "SECRET-DIFF-TOKEN-333",
        "SECRET-LICENSE-444",
    ];
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("sy.db");
    let db = format!("sqlite://{}", db_path.display());
    // A token created with the CLI (only its hash is stored) and one from a file.
    let created = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard-server"))
        .args([
            "token",
            "create",
            "--name",
            "fleet",
            "--namespace",
            "default",
            "--role",
            "agent",
            "--database-url",
            &db,
        ])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let agent_token = String::from_utf8(created.stdout).unwrap().trim().to_owned();
    let submitter_token = "sy_file_submitter_token_5555";
    let tokens = dir.path().join("tokens.json");
    std::fs::write(&tokens, json!([{"name": "ci", "namespace": "default", "role": "submitter", "token": submitter_token}]).to_string()).unwrap();
    let (mut child, addr) = server_binary(
        &[
            "--database-url",
            &db,
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--log-format",
            "json",
        ],
        &[("RUST_LOG", "debug")],
    )
    .await;
    let stderr = child.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut text = String::new();
        let mut stderr = stderr;
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let with = |token: &str| {
        format!("Bearer {token}")
            .parse::<tonic::metadata::MetadataValue<_>>()
            .unwrap()
    };
    let doc = json!({"tags": ["s"], "api_key": SECRETS[0], "db": {"password": SECRETS[1]},
                     "sensitive": ["license"], "license": SECRETS[3]});
    let mut register = tonic::Request::new(pb::RegisterAgentRequest {
        name: "s".into(),
        capacity: 1,
        capabilities: Some(json_to_struct(&doc)),
        handled_kinds: vec!["*".into()],
        ..Default::default()
    });
    register
        .metadata_mut()
        .insert("authorization", with(&agent_token));
    let reg = AgentServiceClient::new(channel.clone())
        .register_agent(register)
        .await
        .unwrap()
        .into_inner();
    // A diff that adds a secret-looking key.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(pb::ConnectRequest {
        sequence: 1,
        message: Some(pb::connect_request::Message::Hello(pb::Hello {
            agent_id: reg.agent_id.clone(),
            session_epoch: reg.session_epoch,
            held_leases: vec![],
        })),
    })
    .await
    .unwrap();
    let mut connect = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    connect
        .metadata_mut()
        .insert("authorization", with(&agent_token));
    let mut stream = AgentServiceClient::new(channel.clone())
        .connect(connect)
        .await
        .unwrap()
        .into_inner();
    let patch: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/github_token", "value": SECRETS[2]}]),
    )
    .unwrap();
    tx.send(pb::ConnectRequest {
        sequence: 2,
        message: Some(pb::connect_request::Message::Heartbeat(pb::Heartbeat {
            status: pb::AgentStatus::Ready as i32,
            capability_diff: Some(pb::CapabilityDiff {
                base_generation: reg.capability_generation,
                operations: switchyard_proto::convert::patch_to_proto(&patch),
            }),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    loop {
        let m = tokio::time::timeout(PROMPT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(pb::connect_response::Message::Ack(a)) = m.message
            && a.sequence == 2
        {
            assert_eq!(a.code, 0, "{}", a.message);
            break;
        }
    }
    let mut submit = tonic::Request::new(pb::SubmitTaskRequest {
        kind: "k".into(),
        ..Default::default()
    });
    submit
        .metadata_mut()
        .insert("authorization", with(submitter_token));
    switchyard_proto::v1::task_service_client::TaskServiceClient::new(channel)
        .submit_task(submit)
        .await
        .unwrap();
    drop(tx);
    signal_term(nix_pid(&child));
    assert!(
        tokio::time::timeout(PROMPT, child.wait())
            .await
            .unwrap()
            .unwrap()
            .success()
    );
    let log = log.await.unwrap();
    assert!(
        log.contains("agent registered"),
        "the log was captured: {log}"
    );
    let mut stored = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("sy.db")
        {
            stored.extend(std::fs::read(&path).unwrap());
        }
    }
    let stored = String::from_utf8_lossy(&stored);
    for secret in SECRETS
        .iter()
        .copied()
        .chain([agent_token.as_str(), submitter_token])
    {
        assert!(!log.contains(secret), "{secret} is in the log");
        assert!(!stored.contains(secret), "{secret} is in the database");
    }
}
