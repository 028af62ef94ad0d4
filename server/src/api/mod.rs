//! The gRPC service implementations of the switchyard.v1 contract, and
//! the one place a crate [`Error`] becomes a `tonic::Status`
//! ([`status`]). Each service is a cheap handle over the shared [`Api`]
//! state (store, dispatcher, settings); handlers validate, call the domain,
//! and build their answers with [`crate::wire`].
//!
//! # Layout
//! - [`task`]: `TaskService` (submit, get, list, cancel, explain, history).
//! - `watch`: `WatchTask`, following a task's history as it happens.
//! - `live`: `WatchAgents` and `WatchQueue`, the fleet and the queue
//!   summary followed live (the console's pages).
//! - [`agent`]: `AgentService` (registration and the `Connect` session).
//! - [`admin`]: `AgentAdminService` (fleet view and steering, simulation).
//! - [`bounds`]: the limits of every sized or nested input, and the
//!   scrubbing of secrets from free text before it is stored.
//! - [`status`]: the error-to-status mapping.

pub mod admin;
pub mod agent;
pub mod bounds;
mod live;
pub mod status;
mod submit;
pub mod task;
mod watch;

pub use crate::wire::convert;

use std::sync::Arc;

use switchyard_core::Limits;
use switchyard_core::placement::PlacementPolicy;
use uuid::Uuid;

use crate::auth::{Caller, Tokens};
use crate::dispatch::Dispatcher;
use crate::error::{Error, Result};
use crate::store::Store;

/// Defaults and limits the API applies.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// Attempts a task gets when the submit does not say.
    pub default_max_attempts: u32,
    /// Lease TTL when the submit does not say.
    pub default_lease_ttl_ms: i64,
    /// Capability document and patch limits (the core's).
    pub document_limits: Limits,
    /// Most queued tasks a namespace may have (0: no cap).
    pub max_queued_tasks_per_namespace: u64,
    /// Most running tasks a namespace may have (0: no limit; the store
    /// enforces it, the API explains it).
    pub max_running_tasks_per_namespace: u64,
    /// Most agents a namespace may register (0: no cap).
    pub max_agents_per_namespace: u64,
    /// The placement policy of tasks that do not say, by namespace
    /// (`--placement-policy`).
    pub placement_policy: PolicyDefaults,
    /// The largest message the services send or take
    /// (`--max-message-bytes`): a call whose answer could pass it is refused
    /// before anything is stored.
    pub max_message_bytes: usize,
}

/// The default placement policy of each namespace: its own if set, else the
/// default of all, else spread.
#[derive(Debug, Clone, Default)]
pub struct PolicyDefaults {
    /// For every namespace not in `by_namespace`.
    pub default: PlacementPolicy,
    /// Namespaces with a default of their own.
    pub by_namespace: std::collections::BTreeMap<String, PlacementPolicy>,
}

impl PolicyDefaults {
    /// The defaults the flags give (a later value for the same namespace wins).
    pub fn from_flags(flags: &[crate::config::PolicyDefault]) -> Self {
        let mut out = Self::default();
        for flag in flags {
            match &flag.namespace {
                Some(ns) => {
                    out.by_namespace.insert(ns.clone(), flag.policy);
                }
                None => out.default = flag.policy,
            }
        }
        out
    }

    /// The policy of a task of `namespace` that does not say.
    pub fn of(&self, namespace: &str) -> PlacementPolicy {
        self.by_namespace
            .get(namespace)
            .copied()
            .unwrap_or(self.default)
    }
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            default_max_attempts: 3,
            default_lease_ttl_ms: 30_000,
            document_limits: Limits::default(),
            max_queued_tasks_per_namespace: 0,
            max_running_tasks_per_namespace: 0,
            max_agents_per_namespace: 0,
            placement_policy: PolicyDefaults::default(),
            max_message_bytes: 4 * 1024 * 1024,
        }
    }
}

/// State shared by every service.
#[derive(Debug, Clone)]
pub struct Api {
    /// Where everything is stored.
    pub store: Arc<dyn Store>,
    /// Matching and lease pushing; also the session registry.
    pub dispatcher: Dispatcher,
    /// Defaults and limits.
    pub settings: Arc<ApiSettings>,
    /// Who may call what.
    pub tokens: Tokens,
    /// Recent queued-task counts per namespace, for the submit cap.
    pub queued_counts: Arc<QueuedCounts>,
}

/// Queued-task counts per namespace, for `--max-queued-tasks-per-namespace`.
/// Counting a deep queue costs a scan of its index, so while a namespace is
/// below nine tenths of the cap a count up to a second old serves, plus the
/// submits this replica admitted since; nearer the cap every submit counts
/// afresh. The cap is therefore exact for one replica's own submits near
/// it, and other replicas' submits and re-queued tasks are seen within a
/// second.
#[derive(Debug, Default)]
pub struct QueuedCounts(
    std::sync::Mutex<std::collections::HashMap<String, (u64, std::time::Instant)>>,
);

impl QueuedCounts {
    /// How long a count serves while below nine tenths of the cap.
    const FRESH: std::time::Duration = std::time::Duration::from_secs(1);

    /// Admits `n` more tasks to `namespace` under `cap` (all or none), or
    /// says how many tasks are queued there when they would pass it.
    pub async fn admit(&self, store: &dyn Store, namespace: &str, cap: u64, n: u64) -> Result<()> {
        let trusted_below = cap - cap / 10;
        {
            let mut counts = self.lock();
            if let Some((count, at)) = counts.get_mut(namespace)
                && at.elapsed() < Self::FRESH
                && *count + n <= trusted_below
            {
                *count += n;
                return Ok(());
            }
        }
        let queued = store.queued_in_namespace(namespace).await?;
        let admitted = queued + n <= cap;
        let counted = if admitted { queued + n } else { queued };
        self.lock()
            .insert(namespace.to_owned(), (counted, std::time::Instant::now()));
        if admitted {
            Ok(())
        } else {
            let adding = if n == 1 {
                String::new()
            } else {
                format!(" and the call adds {n}")
            };
            Err(Error::ResourceExhausted(format!(
                "namespace {namespace} has {queued} queued tasks{adding}; the limit is {cap} \
                 (--max-queued-tasks-per-namespace)"
            )))
        }
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (u64, std::time::Instant)>>
    {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Api {
    /// A handle over the given parts.
    pub fn new(
        store: Arc<dyn Store>,
        dispatcher: Dispatcher,
        settings: ApiSettings,
        tokens: Tokens,
    ) -> Self {
        Self {
            store,
            dispatcher,
            settings: Arc::new(settings),
            tokens,
            queued_counts: Arc::default(),
        }
    }

    /// Now, from the injected clock.
    pub fn now_ms(&self) -> i64 {
        self.dispatcher.clock().now_ms()
    }

    /// The caller of a request, from its `authorization` header
    /// (UNAUTHENTICATED without a valid token when tokens are configured).
    pub async fn caller<T>(&self, request: &tonic::Request<T>) -> Result<Caller> {
        let header = request.metadata().get("authorization");
        // A header that is not visible ASCII is no token at all.
        let text = header.map(|h| h.to_str().unwrap_or_default());
        self.tokens.caller(text).await
    }
}

/// `switchyard.v1.AgentService`: registration and agent sessions.
#[derive(Debug, Clone)]
pub struct AgentApi(pub Api);

/// `switchyard.v1.TaskService`: submit, read, watch, explain and cancel tasks.
#[derive(Debug, Clone)]
pub struct TaskApi(pub Api);

/// `switchyard.v1.AgentAdminService`: see and steer the fleet.
#[derive(Debug, Clone)]
pub struct AdminApi(pub Api);

/// INVALID_ARGUMENT with a field violation naming `field` and what was
/// wrong; the message says the same for clients that ignore details.
pub fn invalid(field: &str, description: &str) -> Error {
    Error::invalid(field, description)
}

/// A duration field in milliseconds, within `range`; outside it (or
/// negative) INVALID_ARGUMENT naming the field, saying it must be between
/// `range_text`.
pub fn duration_within(
    field: &str,
    d: &prost_types::Duration,
    range: std::ops::RangeInclusive<i64>,
    range_text: &str,
) -> Result<i64> {
    match convert::duration_ms(d) {
        Some(ms) if range.contains(&ms) => Ok(ms),
        _ => Err(invalid(field, &format!("must be between {range_text}"))),
    }
}

/// `field.path`, or just `field` for a violation at its root.
pub fn field_path(field: &str, path: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{field}.{path}")
    }
}

/// Parses an id field.
pub fn parse_id(field: &str, text: &str) -> Result<Uuid> {
    text.parse()
        .map_err(|_| invalid(field, &format!("{text:?} is not a UUID")))
}

/// The namespace a request names (`default` if empty), validated.
pub fn namespace(field: &str, text: &str) -> Result<String> {
    if text.is_empty() {
        return Ok("default".to_owned());
    }
    let ok = text.len() <= 63
        && text.chars().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_' || c == '.'
        });
    if !ok {
        return Err(invalid(field, "use at most 63 of a-z, 0-9, '-', '_', '.'"));
    }
    Ok(text.to_owned())
}

/// Page size: default 100, at most 1000.
pub fn page_size(field: &str, size: i32) -> Result<u32> {
    match size {
        0 => Ok(100),
        1..=1000 => Ok(u32::try_from(size).unwrap_or(100)),
        _ => Err(invalid(
            field,
            "must be between 1 and 1000 (0 for the default of 100)",
        )),
    }
}
