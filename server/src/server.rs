//! Builds the gRPC router and serves it: the three switchyard.v1 services,
//! the standard health service (NOT_SERVING while the store is unreachable;
//! past a third of the lease TTL out of reach, the agents connected here are
//! sent to another replica),
//! and server reflection in both v1 and v1alpha (grpcurl 1.8 speaks only
//! v1alpha). Also starts the dispatcher, the metrics endpoint and the web
//! console (with `--console-listen`), and on shutdown stops granting, tells
//! agents to reconnect elsewhere, lets in-flight requests finish within the
//! grace period, and closes the store.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use switchyard_proto::v1::{
    agent_admin_service_server::AgentAdminServiceServer, agent_service_server::AgentServiceServer,
    task_service_server::TaskServiceServer,
};
use tokio::net::TcpListener;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{error, info, warn};

use crate::api::{AdminApi, AgentApi, Api, ApiSettings, TaskApi};
use crate::auth::Tokens;
use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::dispatch::{DispatchSettings, Dispatcher};
use crate::error::{Error, Result};
use crate::model::TaskState;
use crate::reflection::{Guarded, Reflection};
use crate::store::{self, Store};

/// Opens the store named by `config`, runs its migrations, and serves gRPC
/// on `listener` until `shutdown` completes.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    run_with_clock(listener, config, Clock::system(), shutdown).await
}

const SERVICES: [&str; 3] = [
    "switchyard.v1.AgentService",
    "switchyard.v1.TaskService",
    "switchyard.v1.AgentAdminService",
];

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    for service in SERVICES {
        health.set_service_status(service, status).await;
    }
}

/// Pings the store every second; health follows it. Once the store has
/// been out of reach for `move_after` (a third of the lease TTL, at least a
/// second), the agents connected here are sent to another replica: when
/// only this replica lost the database (a partition), the others can keep
/// their leases alive; when every replica lost it, they come back as it does.
async fn watch_store(
    store: Arc<dyn Store>,
    health: HealthReporter,
    dispatcher: Dispatcher,
    move_after: Duration,
) {
    let mut serving = true;
    let mut last_reached = tokio::time::Instant::now();
    let mut agents_sent = false;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        ticker.tick().await;
        let ok = matches!(
            tokio::time::timeout(Duration::from_secs(2), store.ping()).await,
            Ok(Ok(()))
        );
        if ok {
            last_reached = tokio::time::Instant::now();
            agents_sent = false;
        } else if !agents_sent && last_reached.elapsed() >= move_after {
            agents_sent = true;
            let told = dispatcher.send_agents_elsewhere("this replica cannot reach the store");
            warn!(
                agents = told,
                "store out of reach: agents sent to other replicas"
            );
        }
        if ok != serving {
            serving = ok;
            if ok {
                info!("store reachable again: SERVING");
                set_health(&health, ServingStatus::Serving).await;
            } else {
                error!("store unreachable: NOT_SERVING");
                set_health(&health, ServingStatus::NotServing).await;
            }
        }
    }
}

/// Keeps `switchyard_tasks{namespace,state}` current for the live states
/// (queued, leased, running), counting again [`next_count_in`] after each
/// count.
async fn count_tasks(store: Arc<dyn Store>) {
    let mut shown = HashSet::new();
    loop {
        let started = tokio::time::Instant::now();
        let counts = store.count_tasks().await;
        let took = started.elapsed();
        if let Ok(counts) = counts {
            for (namespace, state, n) in gauge_values(&mut shown, counts) {
                metrics::gauge!(crate::metrics::TASKS, "namespace" => namespace, "state" => state)
                    .set(n);
            }
        }
        tokio::time::sleep(next_count_in(took)).await;
    }
}

/// The gauge's shortest pause between two counts.
const COUNT_EVERY: Duration = Duration::from_secs(5);

/// How long the gauge waits after a count that took `took`: at least
/// [`COUNT_EVERY`], and fifty times the count, so counting keeps the store
/// busy at most 2% of the time. Counting the queued tasks reads every one,
/// and beside a large queue counting every 5 s stalled live dispatch (see
/// BENCHMARKS.md, "the task gauge paced by its own cost").
fn next_count_in(took: Duration) -> Duration {
    COUNT_EVERY.max(took.saturating_mul(50))
}

/// The gauge values for one count: every namespace and state counted, and
/// 0 for each one shown before that the store no longer counts (a gauge is
/// not left at its last value). `shown` remembers what has been shown.
fn gauge_values(
    shown: &mut HashSet<(String, &'static str)>,
    counts: Vec<(String, TaskState, u64)>,
) -> Vec<(String, &'static str, f64)> {
    let now: HashSet<(String, &'static str)> = counts
        .iter()
        .map(|(namespace, state, _)| (namespace.clone(), state.as_str()))
        .collect();
    let mut values: Vec<(String, &'static str, f64)> = counts
        .into_iter()
        .map(|(namespace, state, n)| (namespace, state.as_str(), n as f64))
        .collect();
    values.extend(
        shown
            .difference(&now)
            .map(|(namespace, state)| (namespace.clone(), *state, 0.0)),
    );
    shown.extend(now);
    values
}

fn read_pem(path: &std::path::Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::Config(format!("reading the {what} {}: {e}", path.display())))
}

/// [`run`] with an injected clock (tests move time by hand).
pub async fn run_with_clock(
    listener: TcpListener,
    config: ServerConfig,
    clock: Clock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    prepare(config, clock)
        .await?
        .serve(listener, shutdown)
        .await
}

/// A server with everything checked and opened (the store migrated, the
/// tokens and the TLS files read), not yet serving: the binary prepares
/// before it binds, so bad settings fail before it says it is listening.
pub struct Prepared {
    config: ServerConfig,
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    router: tonic::transport::server::Router,
    health: HealthReporter,
    metrics: Option<TcpListener>,
    /// The web console's listener and router, with `--console-listen`.
    console: Option<(TcpListener, axum::Router)>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").finish_non_exhaustive()
    }
}

/// Opens and checks everything `config` names; see [`Prepared`].
pub async fn prepare(config: ServerConfig, clock: Clock) -> Result<Prepared> {
    check_tls_files(&config)?;
    let options = store::StoreOptions {
        max_releases: config.max_releases_per_task,
        max_running_per_namespace: config.max_running_tasks_per_namespace,
        output: config.output_bounds().map_err(Error::Config)?,
        ..store::StoreOptions::default()
    };
    let store = store::open_with(&config.database_url, options).await?;
    store.migrate().await?;
    info!(backend = store.backend(), "store ready");
    let tokens = load_tokens(&config, store.clone()).await?;
    let dispatcher = Dispatcher::new(store.clone(), clock, dispatch_settings(&config));
    let api = Api::new(
        store.clone(),
        dispatcher.clone(),
        api_settings(&config),
        tokens,
    );
    let metrics = match config.metrics_listen {
        Some(addr) => Some(
            crate::metrics::bind(addr)
                .await
                .map_err(|e| Error::Config(format!("binding the metrics address {addr}: {e}")))?,
        ),
        None => None,
    };
    let console = match config.console_listen {
        Some(addr) => {
            if !addr.ip().is_loopback() && !api.tokens.enabled() && !config.insecure {
                return Err(Error::Config(format!(
                    "refusing to serve the console on {addr} without tokens: configure tokens, \
                     keep --console-listen on loopback, or pass --insecure"
                )));
            }
            let listener = crate::console::bind(addr)
                .await
                .map_err(|e| Error::Config(format!("binding the console address {addr}: {e}")))?;
            Some((
                listener,
                crate::console::router(api.clone(), config.max_message_bytes),
            ))
        }
        None => None,
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    let router = router(&config, api, health_service)?;
    Ok(Prepared {
        config,
        store,
        dispatcher,
        router,
        health,
        metrics,
        console,
    })
}

impl Prepared {
    /// Where the console listens, with `--console-listen` (its port, if
    /// the address asked for any).
    pub fn console_addr(&self) -> Option<std::net::SocketAddr> {
        self.console
            .as_ref()
            .and_then(|(listener, _)| listener.local_addr().ok())
    }

    /// Where the metrics endpoint listens, with `--metrics-listen` (its
    /// port, if the address asked for any).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// Serves gRPC on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let Prepared {
            config,
            store,
            dispatcher,
            router,
            health,
            metrics,
            console,
        } = self;
        let mut workers = dispatcher.spawn();
        if let Some(listener) = metrics {
            workers.push(tokio::spawn(crate::metrics::serve(listener)));
        }
        if let Some((listener, router)) = console {
            workers.push(tokio::spawn(crate::console::serve(listener, router)));
        }
        workers.push(tokio::spawn(crate::metrics::upkeep()));
        workers.push(tokio::spawn(count_tasks(store.clone())));
        set_health(&health, ServingStatus::Serving).await;
        let move_after = Duration::from_millis(
            u64::try_from(config.lease_ttl_ms / 3)
                .unwrap_or(0)
                .max(1_000),
        );
        workers.push(tokio::spawn(watch_store(
            store.clone(),
            health.clone(),
            dispatcher.clone(),
            move_after,
        )));

        // Shutdown: stop granting and send every agent elsewhere, then give
        // in-flight requests the grace period.
        let (stopped_tx, mut stopped) = tokio::sync::watch::channel(false);
        let graceful = async move {
            shutdown.await;
            info!("shutting down: draining agents");
            set_health(&health, ServingStatus::NotServing).await;
            dispatcher.drain_all("server shutting down");
            let _ = stopped_tx.send(true);
        };
        // Nagle's algorithm would hold small pushes (a grant is a few hundred
        // bytes) for tens of milliseconds: send them at once.
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let serve = router.serve_with_incoming_shutdown(incoming, graceful);
        let grace = Duration::from_millis(config.shutdown_grace_ms);
        let outcome = tokio::select! {
            result = serve => result.map_err(Error::from),
            () = async {
                let _ = stopped.wait_for(|s| *s).await;
                tokio::time::sleep(grace).await;
            } => {
                warn!(grace_ms = config.shutdown_grace_ms, "grace period over; closing remaining streams");
                Ok(())
            }
        };
        for worker in workers {
            worker.abort();
        }
        store.close().await;
        info!("server stopped");
        outcome
    }
}

/// Refuses TLS files that hold no certificate or no private key, saying
/// which, before anything serves (the TLS library only says "transport
/// error", and only once a connection comes).
fn check_tls_files(config: &ServerConfig) -> Result<()> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = |path: &std::path::Path, what: &str| -> Result<()> {
        let pem = read_pem(path, what)?;
        let found =
            CertificateDer::pem_slice_iter(&pem).collect::<std::result::Result<Vec<_>, _>>();
        match found {
            Ok(certs) if !certs.is_empty() => Ok(()),
            Ok(_) => Err(Error::Config(format!(
                "the {what} {} holds no PEM certificate",
                path.display()
            ))),
            Err(e) => Err(Error::Config(format!(
                "the {what} {} is not valid PEM: {e}",
                path.display()
            ))),
        }
    };
    match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => {
            certs(cert, "TLS certificate")?;
            let pem = read_pem(key, "TLS key")?;
            PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                Error::Config(format!(
                    "the TLS key {} holds no usable PEM private key: {e}",
                    key.display()
                ))
            })?;
        }
        (None, None) => {}
        _ => {
            return Err(Error::Config(
                "--tls-cert and --tls-key go together: give both or neither".to_owned(),
            ));
        }
    }
    if let Some(ca) = &config.tls_client_ca {
        if config.tls_cert.is_none() {
            return Err(Error::Config(
                "--tls-client-ca needs --tls-cert and --tls-key".to_owned(),
            ));
        }
        certs(ca, "client CA")?;
    }
    Ok(())
}

/// The tokens the server authenticates with. With none at all it is open,
/// which it refuses on a non-loopback address unless `--insecure`.
async fn load_tokens(config: &ServerConfig, store: Arc<dyn Store>) -> Result<Tokens> {
    let tokens = Tokens::load(config.tokens_file.as_deref(), store).await?;
    if !tokens.enabled() {
        if !config.is_loopback() && !config.insecure {
            return Err(Error::Config(format!(
                "refusing to serve {} without tokens: configure --tokens-file or `switchyard-server token create`, \
                 or pass --insecure",
                config.listen
            )));
        }
        warn!(
            "NO TOKENS CONFIGURED: the server is OPEN — anyone who can reach {} can submit tasks and act as an agent",
            config.listen
        );
    }
    Ok(tokens)
}

fn dispatch_settings(config: &ServerConfig) -> DispatchSettings {
    DispatchSettings {
        heartbeat_interval_ms: config.heartbeat_interval_ms,
        ack_window_ms: config.ack_window_ms,
        ack_late_ms: config.ack_late_ms,
        max_submits_waiting: config.max_submits_waiting as usize,
        sweep_interval_ms: config.sweep_interval_ms,
        batch_size: config.dispatch_page,
        recheck_ms: config.dispatch_recheck_ms,
        report_linger_ms: config.report_linger_ms,
        max_running_per_namespace: config.max_running_tasks_per_namespace,
        ..DispatchSettings::default()
    }
}

fn api_settings(config: &ServerConfig) -> ApiSettings {
    ApiSettings {
        default_max_attempts: config.max_attempts,
        default_lease_ttl_ms: config.lease_ttl_ms,
        max_queued_tasks_per_namespace: config.max_queued_tasks_per_namespace,
        max_running_tasks_per_namespace: config.max_running_tasks_per_namespace,
        max_agents_per_namespace: config.max_agents_per_namespace,
        placement_policy: crate::api::PolicyDefaults::from_flags(&config.placement_policy),
        max_message_bytes: config.max_message_bytes,
        ..ApiSettings::default()
    }
}

/// The tonic router: limits, keepalives and TLS from the configuration;
/// health, reflection (v1 and v1alpha) and the three services.
fn router(
    config: &ServerConfig,
    api: Api,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> Result<tonic::transport::server::Router> {
    let mut builder = Server::builder()
        .concurrency_limit_per_connection(config.concurrency_per_connection)
        .initial_connection_window_size(config.http2_connection_window_bytes)
        .timeout(Duration::from_millis(config.request_timeout_ms))
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) {
        let identity = Identity::from_pem(
            read_pem(cert, "TLS certificate")?,
            read_pem(key, "TLS key")?,
        );
        let mut tls = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &config.tls_client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(read_pem(ca, "client CA")?));
        }
        builder = builder.tls_config(tls)?;
        info!(mtls = config.tls_client_ca.is_some(), "TLS on");
    }
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(switchyard_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            // The error details errors carry (google.rpc.BadRequest and the
            // rest), so grpcurl can decode them.
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
    };
    let max = config.max_message_bytes;
    let tokens = api.tokens.clone();
    let mut router = builder.add_service(health);
    router = match config.reflection {
        Reflection::Off => router,
        Reflection::Public => router
            .add_service(reflection().build_v1()?)
            .add_service(reflection().build_v1alpha()?),
        Reflection::Authenticated => router
            .add_service(Guarded::new(reflection().build_v1()?, tokens.clone()))
            .add_service(Guarded::new(reflection().build_v1alpha()?, tokens)),
    };
    Ok(router
        .add_service(
            AgentServiceServer::new(AgentApi(api.clone()))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(
            TaskServiceServer::new(TaskApi(api.clone()))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(
            AgentAdminServiceServer::new(AdminApi(api))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_that_takes_long_is_made_less_often() {
        assert_eq!(next_count_in(Duration::from_millis(3)), COUNT_EVERY);
        assert_eq!(next_count_in(Duration::from_millis(100)), COUNT_EVERY);
        assert_eq!(
            next_count_in(Duration::from_millis(300)),
            Duration::from_secs(15)
        );
        assert_eq!(next_count_in(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn a_state_no_longer_counted_is_shown_as_zero() {
        let mut shown = HashSet::new();
        let first = gauge_values(
            &mut shown,
            vec![
                ("a".into(), TaskState::Queued, 3),
                ("a".into(), TaskState::Leased, 2),
            ],
        );
        assert_eq!(first.len(), 2);
        let mut second = gauge_values(&mut shown, vec![("b".into(), TaskState::Running, 1)]);
        second.sort_by(|x, y| (&x.0, x.1).cmp(&(&y.0, y.1)));
        assert_eq!(
            second,
            [
                ("a".to_owned(), "leased", 0.0),
                ("a".to_owned(), "queued", 0.0),
                ("b".to_owned(), "running", 1.0),
            ]
        );
    }
}
