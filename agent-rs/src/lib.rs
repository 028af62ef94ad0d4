//! The Switchyard agent as a library: what people install on every machine
//! of their fleet, and what a Rust program embeds to run its own handlers.
//!
//! # Layout
//! - [`detect`]: built-in detection, the base tier (tool versions, OS,
//!   memory, load, CPUs, GPUs, derived tags), each probe time-limited.
//! - [`tiers`]: the agent directory's SheetBot tiers (`.capabilities.json`,
//!   `.capabilities.dynamic.{sh,py,mjs,js,ts}`, `.capabilities.override.json`)
//!   and their merge over the base tier.
//! - [`capabilities`]: the live document: refreshed load, re-read tiers on
//!   change, pack health.
//! - [`identity`]: the agent directory made absolute (missing: an error)
//!   and the default name, `{hostname}-rust-{hash of the directory}`.
//! - [`install`]: `switchyard-agent install`, a systemd unit and its
//!   environment file (the token, readable by root only).
//! - [`handler`]: the `Handler` trait and handler packs (first registration
//!   wins; missing required parameters make a capability unhealthy).
//! - [`exec`]: the `exec` task kind (argv, env, cwd, timeout, process-group
//!   kill, its stdout and stderr streamed as the task's output), enabled
//!   with `--allow-exec`.
//! - [`output`]: a task's output on the agent: line-buffered, batched,
//!   bounded per task by a total and a rate (a tail kept past them).
//! - [`session`]: register, the `Connect` stream, heartbeats with diffs,
//!   lease execution and reports, reconnect and resume, drain.

pub mod capabilities;
pub mod detect;
pub mod exec;
pub mod handler;
pub mod identity;
pub mod install;
pub mod output;
pub mod session;
pub mod tiers;

pub use handler::{
    Assigned, Handler, HandlerPack, Handlers, ReleaseCause, TaskContext, TaskFailure,
};
pub use output::{OutputLimits, OutputSink};
pub use session::{AgentConfig, run};
