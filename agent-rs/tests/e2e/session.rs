//! The agent's session with a real server.

use std::time::Duration;

use serde_json::json;
use switchyard_proto::v1 as pb;

use crate::common::{PROMPT, Server, agent, result, submit_exec, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_task_runs_and_returns_its_output() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["e2e"]}"#,
    )
    .unwrap();
    let server = Server::start(dir.path()).await;
    let _agent = agent(&server, dir.path(), "exec-1");
    let task = submit_exec(
        &server,
        &["sh", "-c", "echo out; echo err >&2; exit 0"],
        "e2e",
    )
    .await;
    let done = wait_for(&server, &task.task_id, pb::TaskState::Succeeded).await;
    let r = result(&done);
    assert_eq!(r["exit_code"], json!(0));
    assert_eq!(r["stdout"], json!("out\n"));
    assert_eq!(r["stderr"], json!("err\n"));

    // A failing command is a failed attempt carrying its exit code.
    let failing = server
        .tasks()
        .await
        .submit_task(pb::SubmitTaskRequest {
            kind: "exec".into(),
            payload: Some(switchyard_proto::convert::json_to_struct(
                &json!({"argv": ["sh", "-c", "exit 3"]}),
            )),
            placement: Some(pb::Placement {
                selector: "e2e".into(),
                ..Default::default()
            }),
            max_attempts: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    let failed = wait_for(&server, &failing.task_id, pb::TaskState::Failed).await;
    let error = failed.error.unwrap();
    assert_eq!(error.code, "exit_code");
    let mut server = server;
    server.stop().await;
}

/// A task that asks for GPUs runs with the GPUs assigned to it in
/// `CUDA_VISIBLE_DEVICES` (whatever its payload's env says), as the static
/// tier's `resources` offers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_sees_the_gpus_its_lease_holds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["e2e"], "resources": {"gpus": [
            {"index": 0, "uuid": "GPU-a", "model": "Tesla T4", "memory_mb": 15360},
            {"index": 1, "uuid": "GPU-b", "model": "NVIDIA H100", "memory_mb": 81559}]}}"#,
    )
    .unwrap();
    let mut server = Server::start(dir.path()).await;
    let _agent = agent(&server, dir.path(), "gpu-1");
    let payload = json!({
        "argv": ["sh", "-c", "echo \"$CUDA_VISIBLE_DEVICES $SWITCHYARD_GPU_IDS $SWITCHYARD_MEMORY_MB\""],
        "env": {"CUDA_VISIBLE_DEVICES": "GPU-stolen"},
    });
    let task = server
        .tasks()
        .await
        .submit_task(pb::SubmitTaskRequest {
            kind: "exec".into(),
            payload: Some(switchyard_proto::convert::json_to_struct(&payload)),
            placement: Some(pb::Placement {
                selector: "e2e, needs gpus: 1 (memory_mb>=40000), needs memory: 1".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    let done = wait_for(&server, &task.task_id, pb::TaskState::Succeeded).await;
    assert_eq!(result(&done)["stdout"], json!("GPU-b GPU-b 1\n"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_file_edit_reaches_the_server_and_unparks() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["e2e"]}"#,
    )
    .unwrap();
    let mut server = Server::start(dir.path()).await;
    let _agent = agent(&server, dir.path(), "override-1");
    let task = submit_exec(&server, &["true"], "e2e, region=eu-west").await;
    let queued = server
        .tasks()
        .await
        .get_task(pb::GetTaskRequest {
            task_id: task.task_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    assert_eq!(queued.state(), pb::TaskState::Queued);
    // The operator of the machine edits the override tier on disk.
    std::fs::write(
        dir.path().join(".capabilities.override.json"),
        r#"{"region": "eu-west"}"#,
    )
    .unwrap();
    wait_for(&server, &task.task_id, pb::TaskState::Succeeded).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_reconnects_after_a_server_restart_and_its_lease_completes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["e2e"]}"#,
    )
    .unwrap();
    let marker = dir.path().join("release");
    let mut server = Server::start(dir.path()).await;
    let _agent = agent(&server, dir.path(), "restart-1");
    // A task that runs until the test releases it.
    let script = format!(
        "while [ ! -f {} ]; do sleep 0.05; done; echo finished",
        marker.display()
    );
    let task = submit_exec(&server, &["sh", "-c", &script], "e2e").await;
    wait_for(&server, &task.task_id, pb::TaskState::Running).await;
    server.stop().await;
    server.restart().await;
    std::fs::write(&marker, "").unwrap();
    let done = wait_for(&server, &task.task_id, pb::TaskState::Succeeded).await;
    assert_eq!(result(&done)["stdout"], json!("finished\n"));
    assert_eq!(
        done.attempts, 0,
        "the lease survived the restart: no attempt was lost"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_running_work_then_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["e2e"]}"#,
    )
    .unwrap();
    let mut server = Server::start(dir.path()).await;
    let mut child = agent(&server, dir.path(), "drain-1");
    let task = submit_exec(&server, &["sh", "-c", "sleep 0.5; echo drained"], "e2e").await;
    wait_for(&server, &task.task_id, pb::TaskState::Running).await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(PROMPT, child.wait())
        .await
        .expect("agent exits")
        .unwrap();
    assert!(status.success(), "{status}");
    let done = wait_for(&server, &task.task_id, pb::TaskState::Succeeded).await;
    assert_eq!(result(&done)["stdout"], json!("drained\n"));
    // Draining took nothing new: a task submitted now stays queued.
    let later = submit_exec(&server, &["true"], "e2e").await;
    tokio::time::sleep(Duration::from_millis(0)).await;
    let t = server
        .tasks()
        .await
        .get_task(pb::GetTaskRequest {
            task_id: later.task_id,
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    assert_eq!(t.state(), pb::TaskState::Queued);
    server.stop().await;
}

/// Whether a process is gone (exited, or a zombie nobody reaped yet).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// A command that runs past its task's execution timeout: the server
/// revokes the attempt (the task has one attempt, so it FAILS with code
/// `timeout`) and the agent kills the command's whole process group, the
/// background grandchild too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_timeout_kills_the_process_group() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["e2e"]}"#,
    )
    .unwrap();
    let mut server = Server::start(dir.path()).await;
    let _agent = agent(&server, dir.path(), "timeout-1");
    let pidfile = dir.path().join("grandchild.pid");
    let script = format!("sleep 120 & echo $! > {}; wait", pidfile.display());
    let payload = json!({"argv": ["sh", "-c", script]});
    let task = server
        .tasks()
        .await
        .submit_task(pb::SubmitTaskRequest {
            kind: "exec".into(),
            payload: Some(switchyard_proto::convert::json_to_struct(&payload)),
            placement: Some(pb::Placement {
                selector: "e2e".into(),
                ..Default::default()
            }),
            max_attempts: 1,
            execution_timeout: Some(switchyard_proto::convert::duration(1_000)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task
        .unwrap();
    let failed = wait_for(&server, &task.task_id, pb::TaskState::Failed).await;
    assert_eq!(failed.error.unwrap().code, "timeout");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The kill is the agent's, a moment after the server's revocation: wait
    // for it, however long the host takes, up to the suite's patience.
    tokio::time::timeout(PROMPT, async {
        while !gone(pid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the grandchild was killed with its process group");
    server.stop().await;
}
