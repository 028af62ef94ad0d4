//! Handlers and handler packs: how a Rust program (and the agent binary)
//! says which task kinds it runs. A pack names the capabilities it provides
//! and the parameters they need; packs merge first-registration-wins with
//! duplicates reported, never a panic (the core's `merge_packs`), and a
//! capability whose required parameter is missing is reported unhealthy
//! (the agent is DEGRADED for it) instead of the agent failing to start.
//! A handler or pack may require capabilities: while one is missing or
//! unhealthy its kinds are withdrawn from what the agent advertises (the
//! agent is DEGRADED, naming handler and capability) and come back with it.
//! Parameter values are resolved from the environment and never sent,
//! logged or shown. A handler's output (`ctx.log`, `ctx.stdout`,
//! `ctx.stderr`) goes to the server with the task.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use switchyard_core::pack::{
    Advertised, MergedPacks, Pack, PackRejection, advertise, merge_packs, resolve_params,
};
use switchyard_proto::v1::OutputStream;
pub use switchyard_proto::v1::ReleaseCause;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::output::OutputSink;

/// Why an attempt failed, or why the handler hands the task back.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskFailure {
    /// For people.
    pub message: String,
    /// Machine-readable cause, e.g. `exit_code`, `timeout`, `handler_error`.
    pub code: String,
    /// False if a retry cannot help.
    pub retryable: bool,
    /// Handler detail (exit code, output tails).
    pub details: Value,
    /// Hand the task back instead of failing the attempt, for this reason
    /// (see [`TaskFailure::release`]).
    pub release: Option<ReleaseCause>,
}

impl TaskFailure {
    /// A retryable failure with a message and code.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: code.to_owned(),
            retryable: true,
            details: Value::Null,
            release: None,
        }
    }

    /// Hands the task back without spending an attempt (like Celery's
    /// `Reject`): `Busy` or `Other` for now (the server offers it again
    /// after a backoff), `CannotHandle` or `CannotDecode` for good on this
    /// agent (it is not offered the task again until the agent changes).
    /// Every release counts toward the server's per-task bound.
    pub fn release(cause: ReleaseCause, reason: impl Into<String>) -> Self {
        Self {
            release: Some(cause),
            ..Self::new("released", reason)
        }
    }
}

/// A progress report from a running handler.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// 0 to 100, or negative if unknown.
    pub percent: f64,
    /// A short status line.
    pub message: String,
}

/// What a handler gets for one attempt.
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// The task's id.
    pub task_id: String,
    /// Its kind.
    pub kind: String,
    /// Its payload.
    pub payload: Value,
    /// Cancelled when the server revokes the lease or the agent gives up.
    pub cancel: CancellationToken,
    /// What the lease holds on this agent: slots, and for a task with a resource request the
    /// amounts and the GPUs assigned to it alone.
    pub resources: Assigned,
    /// The task's execution timeout, if it has one: the server revokes the
    /// lease then, so a handler may as well stop by itself.
    pub execution_timeout: Option<std::time::Duration>,
    /// Where the handler's output goes: kept with the task on the server,
    /// followed live by `switchyard logs -f` (see [`TaskContext::log`]).
    pub output: OutputSink,
    progress: mpsc::UnboundedSender<Progress>,
}

/// What a lease holds on the agent (the grant's `AssignedResources`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assigned {
    /// Slots.
    pub slots: u32,
    /// CPU in millicores (0: none asked for).
    pub cpu_millicores: u64,
    /// Memory in MB (0: none asked for).
    pub memory_mb: u64,
    /// The GPUs assigned, by uuid (or index), in the order the agent lists them.
    pub gpu_ids: Vec<String>,
    /// Named countable resources.
    pub named: BTreeMap<String, u64>,
}

impl Assigned {
    /// The environment a process running the task gets, so it uses what was assigned:
    /// `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES` (the GPUs, comma-separated) when GPUs
    /// were assigned, and `SWITCHYARD_SLOTS`, `SWITCHYARD_CPU_MILLICORES`,
    /// `SWITCHYARD_MEMORY_MB`, `SWITCHYARD_GPU_IDS` for what was asked.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("SWITCHYARD_SLOTS".to_owned(), self.slots.max(1).to_string())];
        if self.cpu_millicores > 0 {
            env.push((
                "SWITCHYARD_CPU_MILLICORES".to_owned(),
                self.cpu_millicores.to_string(),
            ));
        }
        if self.memory_mb > 0 {
            env.push((
                "SWITCHYARD_MEMORY_MB".to_owned(),
                self.memory_mb.to_string(),
            ));
        }
        if !self.gpu_ids.is_empty() {
            let ids = self.gpu_ids.join(",");
            env.push(("CUDA_VISIBLE_DEVICES".to_owned(), ids.clone()));
            env.push(("NVIDIA_VISIBLE_DEVICES".to_owned(), ids.clone()));
            env.push(("SWITCHYARD_GPU_IDS".to_owned(), ids));
        }
        env
    }
}

impl TaskContext {
    /// A context whose progress reports go to `progress`.
    pub fn new(
        task_id: String,
        kind: String,
        payload: Value,
        cancel: CancellationToken,
        progress: mpsc::UnboundedSender<Progress>,
    ) -> Self {
        Self {
            task_id,
            kind,
            payload,
            cancel,
            resources: Assigned {
                slots: 1,
                ..Assigned::default()
            },
            execution_timeout: None,
            output: OutputSink::discard(),
            progress,
        }
    }

    /// The context with its output going to `output`.
    pub fn with_output(mut self, output: OutputSink) -> Self {
        self.output = output;
        self
    }

    /// A line of the handler's own log (the task's `log` output stream).
    pub fn log(&self, line: impl AsRef<str>) {
        let line = line.as_ref();
        self.output.write(OutputStream::Log, line);
        if !line.ends_with('\n') {
            self.output.write(OutputStream::Log, "\n");
        }
    }

    /// Text the task writes to its standard output (sent line by line).
    pub fn stdout(&self, text: impl AsRef<str>) {
        self.output.write(OutputStream::Stdout, text.as_ref());
    }

    /// Text the task writes to its standard error (sent line by line).
    pub fn stderr(&self, text: impl AsRef<str>) {
        self.output.write(OutputStream::Stderr, text.as_ref());
    }

    /// The context with the task's execution timeout.
    pub fn with_execution_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.execution_timeout = timeout;
        self
    }

    /// The context with what the lease holds.
    pub fn with_resources(mut self, resources: Assigned) -> Self {
        self.resources = resources;
        self
    }

    /// Reports progress to the server (best effort).
    pub fn progress(&self, percent: f64, message: impl Into<String>) {
        let _ = self.progress.send(Progress {
            percent,
            message: message.into(),
        });
    }
}

/// Runs tasks of one kind.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Runs one attempt; the result becomes the task's result.
    async fn run(&self, task: TaskContext) -> Result<Value, TaskFailure>;
}

/// A pack: its declaration and the handlers for the kinds it lists.
#[derive(Clone)]
pub struct HandlerPack {
    /// Id, handled kinds, provided capabilities and their parameters.
    pub pack: Pack,
    /// The handler for each kind in `pack.handlers`.
    pub handlers: BTreeMap<String, Arc<dyn Handler>>,
}

impl std::fmt::Debug for HandlerPack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerPack")
            .field("pack", &self.pack)
            .finish_non_exhaustive()
    }
}

/// The handlers an agent runs, merged from packs.
#[derive(Clone, Default)]
pub struct Handlers {
    packs: Vec<HandlerPack>,
    merged: MergedPacks,
    by_kind: BTreeMap<String, Arc<dyn Handler>>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handlers")
            .field("kinds", &self.by_kind.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Handlers {
    /// No handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a single handler as a pack of its own (id = the kind).
    pub fn handler(self, kind: &str, handler: impl Handler) -> Self {
        self.handler_requiring(kind, &[], handler)
    }

    /// [`Handlers::handler`] for a handler that needs capabilities
    /// (`ai.llm@1`, or a name alone for any version): while one is missing
    /// or unhealthy in the agent's document, its kind is withdrawn from what
    /// the agent advertises and the agent is DEGRADED, saying why.
    pub fn handler_requiring(self, kind: &str, requires: &[&str], handler: impl Handler) -> Self {
        let pack = Pack {
            id: kind.to_owned(),
            handlers: vec![kind.to_owned()],
            provides: BTreeMap::new(),
            requires: requires.iter().map(|r| (*r).to_owned()).collect(),
        };
        self.pack(HandlerPack {
            pack,
            handlers: BTreeMap::from([(kind.to_owned(), Arc::new(handler) as Arc<dyn Handler>)]),
        })
    }

    /// Adds a pack; the first registration of a kind or capability wins.
    pub fn pack(mut self, pack: HandlerPack) -> Self {
        self.packs.push(pack);
        let declarations: Vec<Pack> = self.packs.iter().map(|p| p.pack.clone()).collect();
        self.merged = merge_packs(&declarations);
        self.by_kind.clear();
        for (kind, pack_id) in &self.merged.handlers {
            let handler = self
                .packs
                .iter()
                .find(|p| &p.pack.id == pack_id)
                .and_then(|p| p.handlers.get(kind));
            if let Some(h) = handler {
                self.by_kind.insert(kind.clone(), h.clone());
            }
        }
        self
    }

    /// The handler for a kind.
    pub fn get(&self, kind: &str) -> Option<Arc<dyn Handler>> {
        self.by_kind.get(kind).cloned()
    }

    /// The kinds handled.
    pub fn kinds(&self) -> Vec<String> {
        self.by_kind.keys().cloned().collect()
    }

    /// The kinds to advertise given the agent's document, and those
    /// withdrawn because a capability their pack requires is missing or
    /// unhealthy (the core's `advertise`, as every runner computes it).
    pub fn advertise(&self, document: &Value) -> Advertised {
        advertise(&self.merged, document)
    }

    /// What the merge rejected (duplicate packs, kinds, capabilities).
    pub fn rejections(&self) -> &[PackRejection] {
        &self.merged.rejections
    }

    /// The `provides` subtree with health from resolved parameters, and the
    /// reasons of unhealthy capabilities (for a DEGRADED status).
    pub fn provides(&self, lookup: &dyn Fn(&str) -> Option<String>) -> (Value, Vec<String>) {
        let provides = resolve_params(&self.merged, lookup);
        let unhealthy = provides
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(_, c)| c.get("healthy") == Some(&Value::Bool(false)))
                    .map(|(name, c)| {
                        let reason = c
                            .get("reason")
                            .and_then(Value::as_str)
                            .unwrap_or("unhealthy");
                        format!("capability {name} unhealthy: {reason}")
                    })
                    .collect()
            })
            .unwrap_or_default();
        (provides, unhealthy)
    }
}
