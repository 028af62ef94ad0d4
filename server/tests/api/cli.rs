//! The `switchyard` CLI binary against a real server: submit with `--wait`
//! while an agent runs the task, JSON output, a retry policy and deadlines
//! from flags, explain, agents, and the exit codes scripts branch on; a
//! task's output followed with `logs -f` and `submit --wait`, printed with
//! `logs`, and a failed attempt's last lines shown by `get`; many tasks
//! from JSON lines with `submit-many`, a refused one named by its line.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use switchyard_proto::v1 as pb;

use crate::common::{PROMPT, TestAgent, TestServer};

fn cli(server: &TestServer) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    cmd.env_clear()
        .env("SWITCHYARD_SERVER", format!("http://{}", server.addr))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn run(mut cmd: Command) -> (i32, String, String) {
    let out = tokio::time::timeout(PROMPT, cmd.output())
        .await
        .expect("cli in time")
        .expect("cli runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_get_explain_and_exit_codes() {
    let server = TestServer::start_sqlite().await;
    let mut agent = TestAgent::start(
        &server,
        "alpha",
        json!({"os": "linux", "tags": ["linux"]}),
        1,
    )
    .await;

    // submit --wait: the CLI follows the task while the agent runs it.
    let mut submit = cli(&server);
    submit
        .args([
            "--output",
            "json",
            "submit",
            "echo",
            "--require",
            "linux",
            "--payload",
            "-",
            "--wait",
        ])
        .stdin(Stdio::piped());
    let mut child = submit.spawn().expect("spawn cli");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(br#"{"message": "hi"}"#)
        .await
        .expect("write payload");
    drop(stdin);
    let grant = agent.grant().await;
    let task = grant.task.clone().expect("task");
    assert_eq!(
        task.payload.expect("payload").fields["message"],
        switchyard_server::api::convert::json_to_value(&json!("hi"))
    );
    agent.run_to_success(&grant, json!({"echo": "hi"})).await;
    let out = tokio::time::timeout(PROMPT, child.wait_with_output())
        .await
        .expect("cli ends")
        .expect("cli output");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    // JSON lines are the replies as grpcurl prints them: the submit's, then
    // each watch message.
    assert_eq!(lines[0]["task"]["taskId"], json!(task.task_id));
    assert_eq!(lines[0]["created"], json!(true));
    let last = lines.last().expect("a last line");
    assert_eq!(last["task"]["state"], json!("TASK_STATE_SUCCEEDED"));
    assert_eq!(last["task"]["result"], json!({"echo": "hi"}));

    // get, as JSON.
    let mut get = cli(&server);
    get.args(["get", &task.task_id, "--output", "json"]);
    let (code, stdout, _) = run(get).await;
    assert_eq!(code, 0);
    let got: Value = serde_json::from_str(stdout.trim()).expect("json");
    assert_eq!(got["task"]["state"], json!("TASK_STATE_SUCCEEDED"));

    // Unknown task: exit 3.
    let mut missing = cli(&server);
    missing.args(["get", &uuid::Uuid::now_v7().to_string()]);
    let (code, _, stderr) = run(missing).await;
    assert_eq!(code, 3, "{stderr}");

    // A bad selector: refused (exit 5), naming the field.
    let mut bad = cli(&server);
    bad.args(["submit", "echo", "--require", "memory.total>="]);
    let (code, _, stderr) = run(bad).await;
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("placement.selector"), "{stderr}");

    // A retry policy from flags, shown with its defaults filled in; one out
    // of range is refused (exit 5), naming the field.
    let mut retried = cli(&server);
    retried.args([
        "--output",
        "json",
        "submit",
        "train",
        "--require",
        "gpu",
        "--retry-initial-backoff-ms",
        "1500",
        "--retry-jitter",
        "0",
    ]);
    let (code, stdout, stderr) = run(retried).await;
    assert_eq!(code, 0, "{stderr}");
    let retried: Value = serde_json::from_str(stdout.trim()).expect("json");
    assert_eq!(
        retried["task"]["retry"],
        json!({"initialBackoff": "1.500s", "maxBackoff": "300s", "multiplier": 2, "jitter": 0})
    );
    let mut bad_retry = cli(&server);
    bad_retry.args(["submit", "echo", "--retry-multiplier", "0.5"]);
    let (code, _, stderr) = run(bad_retry).await;
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("retry.multiplier"), "{stderr}");

    // Deadlines from flags, shown in milliseconds; one out of range is
    // refused naming the field.
    let mut timed = cli(&server);
    timed.args([
        "--output",
        "json",
        "submit",
        "train",
        "--require",
        "gpu",
        "--start-timeout-secs",
        "600",
        "--execution-timeout-secs",
        "3600",
        "--cancel-grace-secs",
        "30",
    ]);
    let (code, stdout, stderr) = run(timed).await;
    assert_eq!(code, 0, "{stderr}");
    let timed: Value = serde_json::from_str(stdout.trim()).expect("json");
    assert_eq!(timed["task"]["startTimeout"], json!("600s"));
    assert_eq!(timed["task"]["executionTimeout"], json!("3600s"));
    assert_eq!(timed["task"]["cancelGrace"], json!("30s"));
    let mut bad_timeout = cli(&server);
    bad_timeout.args(["submit", "echo", "--execution-timeout-secs", "0"]);
    let (code, _, stderr) = run(bad_timeout).await;
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("execution_timeout"), "{stderr}");

    // A parked task, explained.
    let mut parked = cli(&server);
    parked.args(["--output", "json", "submit", "train", "--require", "gpu"]);
    let (code, stdout, _) = run(parked).await;
    assert_eq!(code, 0);
    let parked: Value = serde_json::from_str(stdout.trim()).expect("json");
    assert_eq!(
        parked["task"]["queuedReason"],
        json!("QUEUED_REASON_PARKED")
    );
    let mut explain = cli(&server);
    explain.args(["explain", parked["task"]["taskId"].as_str().expect("id")]);
    let (code, stdout, _) = run(explain).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains("0/1 agents eligible: 1 missing tag gpu"),
        "{stdout}"
    );
    assert!(stdout.contains("alpha"), "{stdout}");

    // agents list.
    let mut agents = cli(&server);
    agents.args(["agents", "list"]);
    let (code, stdout, _) = run(agents).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains("alpha") && stdout.contains("ready"),
        "{stdout}"
    );

    // No server: exit 6.
    // A server that accepts and then says nothing: unavailable once the
    // deadline passes, not a hang.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut mute = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    mute.env_clear().args([
        "--server",
        &format!("http://{}", silent.local_addr().unwrap()),
        "--timeout-secs",
        "1",
        "agents",
        "list",
    ]);
    let (code, _, err) = run(mute).await;
    assert_eq!(code, 6, "{err}");
    drop(silent);
    let mut unreachable = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    unreachable
        .env_clear()
        .args(["--server", "http://127.0.0.1:1", "list"]);
    let (code, _, _) = run(unreachable).await;
    assert_eq!(code, 6);

    server.stop().await;
}

/// Runs `switchyard submit … --wait` (text) while `agent` ends the task with
/// `end`; the exit code and what it printed.
async fn wait_in_text(
    server: &TestServer,
    agent: &mut TestAgent,
    end: Option<switchyard_proto::v1::lease_update::Update>,
) -> (i32, String) {
    use switchyard_proto::v1::{self as pb, lease_update::Update};
    let mut submit = cli(server);
    submit.args([
        "submit",
        "echo",
        "--require",
        "linux",
        "--max-attempts",
        "1",
        "--wait",
    ]);
    let child = submit.spawn().expect("spawn cli");
    let grant = agent.grant().await;
    match end {
        None => agent.run_to_success(&grant, json!({"echo": "hi"})).await,
        Some(end) => {
            assert_eq!(
                agent
                    .update(&grant, Update::Accepted(pb::LeaseAccepted {}))
                    .await
                    .code,
                0
            );
            assert_eq!(agent.update(&grant, end).await.code, 0);
        }
    }
    let out = tokio::time::timeout(PROMPT, child.wait_with_output())
        .await
        .expect("cli ends")
        .expect("cli output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_prints_the_result_or_the_error_and_tables_count_attempts_truthfully() {
    use switchyard_proto::v1::{self as pb, lease_update::Update};
    let server = TestServer::start_sqlite().await;
    let mut agent = TestAgent::start(&server, "alpha", json!({"tags": ["linux"]}), 1).await;

    let (code, stdout) = wait_in_text(&server, &mut agent, None).await;
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains(r#"result: {"echo":"hi"}"#), "{stdout}");
    assert!(stdout.contains("succeeded  succeeded"), "{stdout}");

    let failed = Update::Failed(pb::LeaseFailed {
        error: Some(pb::TaskError {
            message: "disk full".into(),
            code: "handler_error".into(),
            retryable: true,
            details: None,
            ..Default::default()
        }),
    });
    let (code, stdout) = wait_in_text(&server, &mut agent, Some(failed)).await;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("error: disk full (handler_error)"),
        "{stdout}"
    );

    // A task that succeeded on its first attempt is on attempt 1 of 3, not 0.
    let mut list = cli(&server);
    list.args(["list", "--state", "succeeded"]);
    let (code, stdout, _) = run(list).await;
    assert_eq!(code, 0);
    let row = stdout.lines().nth(1).expect("a row");
    assert!(row.contains("  1/1  "), "{stdout}");
    let header = stdout.lines().next().expect("a header");
    // Columns line up: each value starts where its header does.
    let at = header.find("ATTEMPT").expect("ATTEMPT column");
    assert_eq!(&row[at..at + 3], "1/1", "{stdout}");
    server.stop().await;
}

#[tokio::test]
async fn completions_and_the_manual_page_come_from_the_command_definitions() {
    for (shell, marker) in [
        ("bash", "_switchyard()"),
        ("zsh", "#compdef switchyard"),
        ("fish", "complete -c switchyard"),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
        cmd.env_clear().args(["completion", shell]);
        let (code, stdout, stderr) = run(cmd).await;
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains(marker), "{shell}: {stdout}");
        assert!(stdout.contains("submit"), "{shell}");
    }
    let mut man = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    man.env_clear().arg("man");
    let (code, stdout, _) = run(man).await;
    assert_eq!(code, 0);
    assert!(stdout.contains(".TH switchyard"), "{stdout}");
    assert!(stdout.contains("submit"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_many_sends_json_lines_in_calls_and_names_a_refused_line() {
    let server = TestServer::start_sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tasks.jsonl");
    std::fs::write(
        &file,
        "{\"kind\": \"build\", \"placement\": {\"selector\": \"linux\"}}\n\n\
         {\"kind\": \"test\", \"priority\": 5, \"payload\": {\"n\": 2}}\n\
         {\"kind\": \"lint\", \"labels\": {\"team\": \"web\"}}\n",
    )
    .unwrap();
    let mut many = cli(&server);
    many.arg("submit-many").arg(&file).args(["--batch", "2"]);
    let (code, stdout, stderr) = run(many).await;
    assert_eq!(code, 0, "{stderr}");
    let ids: Vec<&str> = stdout.lines().collect();
    assert_eq!(ids.len(), 3, "{stdout}");
    let mut tasks = server.tasks().await;
    let mut kinds = Vec::new();
    for id in &ids {
        let task = tasks
            .get_task(pb::GetTaskRequest {
                task_id: (*id).to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
            .task
            .unwrap();
        kinds.push((
            task.kind.clone(),
            task.priority,
            task.labels.get("team").cloned(),
        ));
    }
    assert_eq!(
        kinds,
        vec![
            ("build".to_owned(), 0, None),
            ("test".to_owned(), 5, None),
            ("lint".to_owned(), 0, Some("web".to_owned())),
        ]
    );

    // A task the server refuses: its line is named, and its call stores nothing.
    std::fs::write(
        &file,
        "{\"kind\": \"a\"}\n{\"kind\": \"b\", \"maxAttempts\": 500}\n",
    )
    .unwrap();
    let mut refused = cli(&server);
    refused.arg("submit-many").arg(&file);
    let (code, _, stderr) = run(refused).await;
    assert_eq!(code, 5, "{stderr}");
    assert!(
        stderr.contains("tasks[1] (line 2).max_attempts"),
        "{stderr}"
    );
    // A line that is not a task: a usage error naming it, nothing sent.
    std::fs::write(&file, "{\"kind\": \"a\"}\n{\"kinds\": 1}\n").unwrap();
    let mut unreadable = cli(&server);
    unreadable.arg("submit-many").arg(&file);
    let (code, _, stderr) = run(unreadable).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");
    let listed = tasks
        .list_tasks(pb::ListTasksRequest {
            namespace: "default".into(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tasks;
    assert_eq!(listed.len(), 3, "only the first file's tasks");
    server.stop().await;
}

/// A lease update that writes `lines` to stdout (numbered from `from`).
fn output_update(from: u64, lines: &[(pb::OutputStream, &str)]) -> pb::lease_update::Update {
    pb::lease_update::Update::Output(pb::TaskOutput {
        chunks: lines
            .iter()
            .zip(from..)
            .map(|((stream, text), sequence)| pb::OutputChunk {
                stream: *stream as i32,
                sequence,
                text: (*text).to_owned(),
                dropped_bytes: 0,
            })
            .collect(),
    })
}

/// Reads `reader` until `needle` has appeared; what was read.
async fn read_until(reader: &mut (impl tokio::io::AsyncRead + Unpin), needle: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(PROMPT, async {
        while !String::from_utf8_lossy(&seen).contains(needle) {
            let n = reader.read(&mut buf).await.expect("read the cli");
            assert!(
                n > 0,
                "the cli ended before {needle:?}: {}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {needle:?} in time"));
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follows_output_live_and_prints_it_stored_and_a_failure_shows_its_last_lines() {
    use pb::OutputStream::{Stderr, Stdout};
    use pb::lease_update::Update;
    let server = TestServer::start_sqlite().await;
    let mut agent = TestAgent::start(&server, "alpha", json!({"tags": ["linux"]}), 1).await;
    let task = crate::common::submit(&server, "build", "linux").await;
    let grant = agent.grant().await;
    for update in [
        Update::Accepted(pb::LeaseAccepted {}),
        Update::Started(pb::LeaseStarted {}),
    ] {
        assert_eq!(agent.update(&grant, update).await.code, 0);
    }
    let first = output_update(1, &[(Stdout, "first line\n"), (Stderr, "a warning\n")]);
    assert_eq!(agent.update(&grant, first).await.code, 0);

    // logs -f: what is stored, then live, until the task ends.
    let mut follow = cli(&server);
    follow.args(["logs", &task.task_id, "-f"]);
    let mut child = follow.spawn().expect("spawn cli");
    let mut stdout = child.stdout.take().expect("stdout");
    read_until(&mut stdout, "first line\n").await;
    let second = output_update(3, &[(Stdout, "second line\n")]);
    assert_eq!(agent.update(&grant, second).await.code, 0);
    read_until(&mut stdout, "second line\n").await;
    agent.succeed(&grant, json!({})).await;
    let out = tokio::time::timeout(PROMPT, child.wait_with_output())
        .await
        .expect("cli ends")
        .expect("cli output");
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("a warning\n") && stderr.contains("task succeeded"),
        "{stderr}"
    );

    // logs: the stored output, stdout to stdout and the rest to stderr.
    let mut logs = cli(&server);
    logs.args(["logs", &task.task_id]);
    let (code, stdout, stderr) = run(logs).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "first line\nsecond line\n");
    assert_eq!(stderr, "a warning\n");

    // submit --wait prints the output as it comes; a failed attempt's last
    // lines are in its error, shown by get.
    let mut submit = cli(&server);
    submit.args([
        "submit",
        "build",
        "--require",
        "linux",
        "--max-attempts",
        "1",
        "--wait",
    ]);
    let mut child = submit.spawn().expect("spawn cli");
    let grant = agent.grant().await;
    let task_id = grant.task.clone().expect("task").task_id;
    for update in [
        Update::Accepted(pb::LeaseAccepted {}),
        Update::Started(pb::LeaseStarted {}),
    ] {
        assert_eq!(agent.update(&grant, update).await.code, 0);
    }
    let lines = output_update(1, &[(Stdout, "compiling\n"), (Stdout, "error: it broke\n")]);
    assert_eq!(agent.update(&grant, lines).await.code, 0);
    let mut stdout = child.stdout.take().expect("stdout");
    read_until(&mut stdout, "error: it broke\n").await;
    let failed = Update::Failed(pb::LeaseFailed {
        error: Some(pb::TaskError {
            message: "exit 1".into(),
            code: "exit_code".into(),
            ..Default::default()
        }),
    });
    assert_eq!(agent.update(&grant, failed).await.code, 0);
    let out = tokio::time::timeout(PROMPT, child.wait_with_output())
        .await
        .expect("cli ends")
        .expect("cli output");
    assert_eq!(out.status.code(), Some(1));
    let mut get = cli(&server);
    get.args(["get", &task_id]);
    let (code, stdout, _) = run(get).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains(
            "error: exit 1 (exit_code)\n  last output:\n    compiling\n    error: it broke\n"
        ),
        "{stdout}"
    );
    server.stop().await;
}
