//! What the Rust agent advertises and how it hands work back: without
//! `--allow-exec` it handles no kind and is never granted an `exec` task
//! (the explanation says why); a handler whose required capability is
//! unhealthy is withdrawn, the agent DEGRADED naming both, and it comes back
//! with the capability; a task its handler keeps handing back reaches the
//! server's bound and fails, while other tasks run.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use switchyard_agent::{
    AgentConfig, Handler, Handlers, ReleaseCause, TaskContext, TaskFailure, run,
};
use switchyard_proto::v1 as pb;

use crate::common::{
    PIPED, Server, agent, agent_with, leased_to, submit_exec, wait_for, wait_for_log,
};

/// The issue's repro: an agent started without `--allow-exec` and an
/// `exec` task it otherwise matches. Before, the agent was leased and
/// released it about 700 times in 20 s; now it is never granted it, and an
/// agent that runs `exec` takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allow_exec_the_agent_is_never_granted_exec() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["demo"]}"#,
    )
    .unwrap();
    let mut server = Server::start(dir.path()).await;
    let task = submit_exec(&server, &["true"], "demo").await;
    let mut idle = agent_with(&server, dir.path(), "no-exec", &[PIPED], Stdio::piped());
    wait_for_log(&mut idle, "connected agent=").await;
    let registered = server.agent_until("no-exec", |_| true).await;
    assert!(registered.handled_kinds.is_empty());

    let explained = server
        .tasks()
        .await
        .explain_task(pb::ExplainTaskRequest {
            task_id: task.task_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(explained.verdicts[0].reason, "does not handle kind exec");
    assert_eq!(
        explained.task.unwrap().queued_reason(),
        pb::QueuedReason::Parked
    );

    // An agent that runs `exec` takes it; the idle one never had it.
    let _worker = agent(&server, dir.path(), "exec");
    wait_for(&server, &task.task_id, pb::TaskState::Succeeded).await;
    let worker = server.agent_until("exec", |_| true).await;
    assert_eq!(worker.handled_kinds, ["exec"]);
    assert_eq!(leased_to(&server, &task.task_id).await, [worker.agent_id]);
    server.stop().await;
}

/// Returns its payload.
struct Echo;

#[async_trait]
impl Handler for Echo {
    async fn run(&self, task: TaskContext) -> Result<Value, TaskFailure> {
        Ok(task.payload)
    }
}

/// Hands every task back, busy, counting them.
struct NotNow(Arc<AtomicUsize>);

#[async_trait]
impl Handler for NotNow {
    async fn run(&self, _task: TaskContext) -> Result<Value, TaskFailure> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(TaskFailure::release(ReleaseCause::Busy, "not now"))
    }
}

fn config(server: &Server, dir: &std::path::Path, name: &str) -> AgentConfig {
    AgentConfig {
        server: server.url(),
        token: None,
        tls: Default::default(),
        name: name.to_owned(),
        namespace: "default".to_owned(),
        dir: dir.to_owned(),
        capacity: 1,
        refresh: Duration::from_millis(200),
        script_timeout: Duration::from_secs(5),
        redetect: Duration::from_secs(3600),
        grace: Duration::from_secs(5),
        labels: Default::default(),
        output: Default::default(),
    }
}

/// Seed 003's REQUIRES: a handler needing `ai.llm@1` is withdrawn while
/// the capability is unhealthy (the agent DEGRADED, naming handler and
/// capability), and its task parked; when the capability is healthy again
/// the kind comes back and the task runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_whose_required_capability_is_unhealthy_is_withdrawn_until_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let unhealthy = json!({"provides": {"ai.llm": {
        "version": "1.2.0", "healthy": false, "reason": "quota exhausted"}}});
    let tier = dir.path().join(".capabilities.json");
    std::fs::write(&tier, unhealthy.to_string()).unwrap();
    let mut server = Server::start(dir.path()).await;
    let handlers = Handlers::new()
        .handler_requiring("summarize", &["ai.llm@1"], Echo)
        .handler("echo", Echo);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run(config(&server, dir.path(), "llm"), handlers, async {
        let _ = stopped.await;
    }));
    let degraded = server
        .agent_until("llm", |a| a.status() == pb::AgentStatus::Degraded)
        .await;
    assert_eq!(degraded.handled_kinds, ["echo"]);
    assert_eq!(
        degraded.status_reasons,
        ["handler summarize withdrawn: needs ai.llm@1, unhealthy: quota exhausted"]
    );
    let task = server
        .tasks()
        .await
        .submit_task(pb::SubmitTaskRequest {
            kind: "summarize".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    assert_eq!(task.queued_reason(), pb::QueuedReason::Parked);

    // The capability is back: so is the kind, and the task runs.
    let healthy = json!({"provides": {"ai.llm": {"version": "1.2.0", "healthy": true}}});
    std::fs::write(&tier, healthy.to_string()).unwrap();
    wait_for(&server, &task.task_id, pb::TaskState::Succeeded).await;
    let ready = server
        .agent_until("llm", |a| a.status() == pb::AgentStatus::Ready)
        .await;
    assert_eq!(ready.handled_kinds, ["echo", "summarize"]);
    let _ = stop.send(());
    agent.await.unwrap().unwrap();
    server.stop().await;
}

/// A task the handler keeps handing back is granted the bound's number of
/// times and FAILS with the reason; a task beside it on the one-slot agent
/// runs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_the_handler_keeps_handing_back_reaches_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_bounded(dir.path(), 3).await;
    let refused = Arc::new(AtomicUsize::new(0));
    let handlers = Handlers::new()
        .handler("stubborn", NotNow(refused.clone()))
        .handler("echo", Echo);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run(config(&server, dir.path(), "w"), handlers, async {
        let _ = stopped.await;
    }));
    let submit = |kind: &'static str| {
        let server = &server;
        async move {
            server
                .tasks()
                .await
                .submit_task(pb::SubmitTaskRequest {
                    kind: kind.into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .task
                .unwrap()
        }
    };
    let stubborn = submit("stubborn").await;
    let echo = submit("echo").await;
    wait_for(&server, &echo.task_id, pb::TaskState::Succeeded).await;
    let failed = wait_for(&server, &stubborn.task_id, pb::TaskState::Failed).await;
    assert_eq!(failed.error.unwrap().code, "released_too_often");
    assert_eq!(refused.load(Ordering::SeqCst), 3);
    assert_eq!(leased_to(&server, &stubborn.task_id).await.len(), 3);
    let _ = stop.send(());
    agent.await.unwrap().unwrap();
    server.stop().await;
}
