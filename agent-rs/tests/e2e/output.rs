//! An `exec` task's output from the agent binary: its stdout and stderr
//! reach the server while the process runs and are followed live, in order,
//! across a server restart on either store (the agent reconnects, the watch
//! resumes at its offset, nothing is repeated or lost); a process that
//! writes 100 MB hits the agent's bounds, the task goes on, and the stored
//! output says how much was dropped; a failed attempt's error carries its
//! last lines.

use switchyard_proto::v1 as pb;
use tokio_stream::StreamExt;

use crate::common::{PROMPT, Server, Store, agent, submit_exec, wait_for};

async fn watch_output(
    server: &Server,
    task_id: &str,
    offset: u64,
) -> tonic::Streaming<pb::WatchTaskResponse> {
    server
        .tasks()
        .await
        .watch_task(pb::WatchTaskRequest {
            task_id: task_id.to_owned(),
            output: true,
            output_offset: offset,
        })
        .await
        .expect("watch")
        .into_inner()
}

/// Reads the watch until its output holds `needle`; the chunks read.
async fn output_until(
    stream: &mut tonic::Streaming<pb::WatchTaskResponse>,
    needle: &str,
) -> Vec<pb::TaskOutputChunk> {
    let mut chunks: Vec<pb::TaskOutputChunk> = Vec::new();
    tokio::time::timeout(PROMPT, async {
        while !chunks
            .iter()
            .map(|c| c.text.as_str())
            .collect::<String>()
            .contains(needle)
        {
            let item = stream
                .next()
                .await
                .expect("the watch goes on")
                .expect("item");
            chunks.extend(item.output);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {needle:?} in the output in time"));
    chunks
}

/// Every chunk of the task's output.
async fn stored_output(server: &Server, task_id: &str) -> Vec<pb::TaskOutputChunk> {
    let mut tasks = server.tasks().await;
    let (mut chunks, mut page_token) = (Vec::new(), String::new());
    loop {
        let page = tasks
            .list_task_output(pb::ListTaskOutputRequest {
                task_id: task_id.to_owned(),
                page_size: 1000,
                page_token,
                fencing_token: 0,
            })
            .await
            .expect("list output")
            .into_inner();
        chunks.extend(page.chunks);
        if page.next_page_token.is_empty() {
            return chunks;
        }
        page_token = page.next_page_token;
    }
}

fn text(chunks: &[pb::TaskOutputChunk]) -> String {
    chunks.iter().map(|c| c.text.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_output_is_live_and_survives_a_server_restart_on_sqlite() {
    exec_output_is_live_and_survives_a_server_restart(Store::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_output_is_live_and_survives_a_server_restart_on_postgres() {
    exec_output_is_live_and_survives_a_server_restart(Store::Postgres).await;
}

async fn exec_output_is_live_and_survives_a_server_restart(store: Store) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["out"]}"#,
    )
    .unwrap();
    let (resume, finish) = (dir.path().join("resume"), dir.path().join("finish"));
    let mut server = Server::start_on(dir.path(), store).await;
    let _agent = agent(&server, dir.path(), "output-1");
    let wait =
        |file: &std::path::Path| format!("while [ ! -f {} ]; do sleep 0.05; done", file.display());
    let script = format!(
        "echo building; echo 'a warning' >&2; {}; echo 'after the restart'; {}; echo done",
        wait(&resume),
        wait(&finish)
    );
    let task = submit_exec(&server, &["sh", "-c", &script], "out").await;
    let mut live = watch_output(&server, &task.task_id, 0).await;
    // Live: the lines arrive while the process waits.
    let before = output_until(&mut live, "a warning").await;
    assert!(text(&before).contains("building\n"), "{before:?}");
    let offset = before
        .iter()
        .map(|c| c.offset + c.text.len() as u64)
        .max()
        .unwrap();

    server.stop().await;
    server.restart().await;
    std::fs::write(&resume, "").unwrap();
    // The watch resumes where it left off; the agent reconnected.
    let mut resumed = watch_output(&server, &task.task_id, offset).await;
    let after = output_until(&mut resumed, "after the restart").await;
    assert_eq!(text(&after), "after the restart\n", "nothing repeated");
    std::fs::write(&finish, "").unwrap();
    let done = wait_for(&server, &task.task_id, pb::TaskState::Succeeded).await;
    assert_eq!(done.attempts, 0);

    let stored = stored_output(&server, &task.task_id).await;
    let stdout: String = stored
        .iter()
        .filter(|c| c.stream() == pb::OutputStream::Stdout)
        .map(|c| c.text.as_str())
        .collect();
    assert_eq!(stdout, "building\nafter the restart\ndone\n");
    let stderr: String = stored
        .iter()
        .filter(|c| c.stream() == pb::OutputStream::Stderr)
        .map(|c| c.text.as_str())
        .collect();
    assert_eq!(stderr, "a warning\n");
    let sequences: Vec<u64> = stored.iter().map(|c| c.sequence).collect();
    assert!(sequences.windows(2).all(|w| w[0] < w[1]), "{sequences:?}");
    assert!(
        stored
            .iter()
            .all(|c| c.dropped_bytes == 0 && c.fencing_token == 1)
    );
    server.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_writer_hits_the_bound_and_the_task_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["out"]}"#,
    )
    .unwrap();
    let server = Server::start(dir.path()).await;
    let _agent = agent(&server, dir.path(), "output-2");
    // 100 MB in lines of 100 bytes, then one last line.
    let script = "head -c 100000000 /dev/zero | tr '\\0' x | fold -w 99; echo the end";
    let task = submit_exec(&server, &["sh", "-c", script], "out").await;
    let done = wait_for(&server, &task.task_id, pb::TaskState::Succeeded).await;
    assert_eq!(done.attempts, 0);
    let stored = stored_output(&server, &task.task_id).await;
    let kept: u64 = stored.iter().map(|c| c.text.len() as u64).sum();
    let dropped: u64 = stored.iter().map(|c| c.dropped_bytes).sum();
    eprintln!(
        "100 MB writer: {kept} bytes kept in {} chunks, {dropped} dropped",
        stored.len()
    );
    let agent_bound = switchyard_agent::OutputLimits::default();
    assert!(
        kept <= agent_bound.max_bytes + agent_bound.tail_bytes as u64,
        "{kept} bytes kept"
    );
    assert!(
        dropped > 90_000_000,
        "the marker says {dropped} bytes were dropped"
    );
    assert_eq!(
        kept + dropped,
        100_000_000 + 1_010_101 + 8,
        "every byte kept or counted"
    );
    assert!(text(&stored).ends_with("the end\n"), "the tail is kept");
    server.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_exec_keeps_its_last_lines_in_its_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".capabilities.json"),
        r#"{"tags": ["out"]}"#,
    )
    .unwrap();
    let server = Server::start(dir.path()).await;
    let _agent = agent(&server, dir.path(), "output-3");
    let script = "for i in $(seq 1 30); do echo line $i; done; echo oops >&2; exit 3";
    let payload = serde_json::json!({"argv": ["sh", "-c", script]});
    let task = server
        .tasks()
        .await
        .submit_task(pb::SubmitTaskRequest {
            kind: "exec".into(),
            payload: Some(switchyard_proto::convert::json_to_struct(&payload)),
            placement: Some(pb::Placement {
                selector: "out".into(),
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
    let failed = wait_for(&server, &task.task_id, pb::TaskState::Failed).await;
    let tail = failed.error.expect("error").output_tail;
    // stdout and stderr are two pipes read side by side, so where "oops"
    // falls among the stdout lines is the agent's reading order, not the
    // script's: the tail is held to the output as stored.
    let stored = stored_output(&server, &task.task_id).await;
    let of = |stream: pb::OutputStream| {
        stored
            .iter()
            .filter(|c| c.stream == stream as i32)
            .map(|c| c.text.as_str())
            .collect::<String>()
    };
    let expected: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    assert_eq!(of(pb::OutputStream::Stdout), expected);
    assert_eq!(of(pb::OutputStream::Stderr), "oops\n");
    let all = text(&stored);
    let last: Vec<&str> = all.lines().rev().take(20).collect();
    let last: Vec<&str> = last.into_iter().rev().collect();
    assert_eq!(tail.lines().collect::<Vec<_>>(), last, "{tail}");
    assert!(tail.contains("line 30"), "{tail}");
    assert!(!tail.contains("line 10\n"), "{tail}");
    server.finish().await;
}
