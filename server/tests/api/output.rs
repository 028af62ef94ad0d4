//! A task's output over real gRPC on both stores: what a runner sends is
//! kept in order with the task, followed live by WatchTask (the final state
//! after the last output) and replayed by a later watch and by
//! ListTaskOutput; attempts are kept apart; a failed attempt's error carries
//! its last lines; output from a lease that is not held is refused and
//! nothing is stored; a resent chunk is stored once; secrets are redacted;
//! the per-task bound drops the oldest and says so; the namespace's bound
//! drops its oldest tasks' output and a running task goes on after it;
//! bad output is refused naming the field; with the bound at 0 nothing is
//! kept.

use serde_json::json;
use switchyard_proto::v1::{self as pb, lease_update::Update};
use switchyard_server::model::OutputBounds;
use tokio_stream::StreamExt;

use crate::common::{
    Backend, PROMPT, TestAgent, TestServer, get_task, submit_request, wait_for_state,
};
use crate::on_both_stores;

on_both_stores!(
    output_is_followed_live_and_replayed_in_order,
    attempts_are_kept_apart_and_a_failure_carries_its_last_lines,
    output_from_a_lease_not_held_is_refused,
    a_resent_chunk_is_stored_once,
    secrets_in_output_are_redacted,
    the_task_bound_drops_the_oldest_and_says_so,
    the_namespace_bound_drops_the_oldest_tasks_output,
    bad_output_is_refused_naming_the_field,
    with_no_output_kept_output_is_acknowledged_and_dropped,
);

fn chunk(stream: pb::OutputStream, sequence: u64, text: &str) -> pb::OutputChunk {
    pb::OutputChunk {
        stream: stream as i32,
        sequence,
        text: text.to_owned(),
        dropped_bytes: 0,
    }
}

fn output(chunks: Vec<pb::OutputChunk>) -> Update {
    Update::Output(pb::TaskOutput { chunks })
}

fn stdout(sequence: u64, text: &str) -> pb::OutputChunk {
    chunk(pb::OutputStream::Stdout, sequence, text)
}

/// A task of kind `exec` with `max_attempts`, retried after 100 ms.
async fn submit(server: &TestServer, max_attempts: u32) -> pb::Task {
    submit_request(
        server,
        pb::SubmitTaskRequest {
            kind: "exec".into(),
            max_attempts,
            retry: Some(pb::RetryPolicy {
                initial_backoff: Some(switchyard_proto::convert::duration(100)),
                jitter: Some(0.0),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
}

/// Accepts and starts a grant.
async fn start(agent: &mut TestAgent, grant: &pb::LeaseGrant) {
    for update in [
        Update::Accepted(pb::LeaseAccepted {}),
        Update::Started(pb::LeaseStarted {}),
    ] {
        assert_eq!(agent.update(grant, update).await.code, 0);
    }
}

/// Every chunk of a task's output, page after page.
async fn all_output(
    server: &TestServer,
    task_id: &str,
    fencing_token: u64,
) -> Vec<pb::TaskOutputChunk> {
    let mut tasks = server.tasks().await;
    let (mut chunks, mut page_token) = (Vec::new(), String::new());
    loop {
        let page = tasks
            .list_task_output(pb::ListTaskOutputRequest {
                task_id: task_id.to_owned(),
                page_size: 7,
                page_token,
                fencing_token,
            })
            .await
            .expect("list task output")
            .into_inner();
        chunks.extend(page.chunks);
        if page.next_page_token.is_empty() {
            return chunks;
        }
        page_token = page.next_page_token;
    }
}

fn texts(chunks: &[pb::TaskOutputChunk]) -> String {
    chunks.iter().map(|c| c.text.as_str()).collect()
}

/// A watch of a task with its output, from `offset`.
async fn watch(
    server: &TestServer,
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

/// The watch's next message that carries output.
async fn next_output(
    stream: &mut tonic::Streaming<pb::WatchTaskResponse>,
) -> Vec<pb::TaskOutputChunk> {
    tokio::time::timeout(PROMPT, async {
        loop {
            let item = stream
                .next()
                .await
                .expect("the watch goes on")
                .expect("watch item");
            if !item.output.is_empty() {
                return item.output;
            }
            let state = item.task.map(|t| t.state());
            assert!(
                !matches!(
                    state,
                    Some(pb::TaskState::Succeeded | pb::TaskState::Failed)
                ),
                "the task ended before its output came"
            );
        }
    })
    .await
    .expect("output in time")
}

/// The rest of a watch: its output's text, and the last state it sent.
async fn rest_of(stream: &mut tonic::Streaming<pb::WatchTaskResponse>) -> (String, pb::TaskState) {
    let mut text = String::new();
    let mut last = pb::TaskState::Unspecified;
    tokio::time::timeout(PROMPT, async {
        while let Some(item) = stream.next().await {
            let item = item.expect("watch item");
            let ended = matches!(last, pb::TaskState::Succeeded | pb::TaskState::Failed);
            assert!(
                !ended || item.output.is_empty(),
                "no output after the final state"
            );
            text.push_str(&texts(&item.output));
            if let Some(task) = item.task {
                last = task.state();
            }
        }
    })
    .await
    .expect("the watch ends in time");
    (text, last)
}

async fn output_is_followed_live_and_replayed_in_order(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit(&server, 1).await;
    let grant = agent.grant().await;
    start(&mut agent, &grant).await;
    let mut live = watch(&server, &task.task_id, 0).await;
    let first = vec![
        stdout(1, "compiling\n"),
        chunk(pb::OutputStream::Stderr, 2, "warning: unused\n"),
        chunk(pb::OutputStream::Log, 3, "INFO step 1 done\n"),
    ];
    assert_eq!(agent.update(&grant, output(first)).await.code, 0);
    // Live: the output arrives while the task still runs.
    let seen = next_output(&mut live).await;
    assert_eq!(
        texts(&seen),
        "compiling\nwarning: unused\nINFO step 1 done\n"
    );
    let streams: Vec<pb::OutputStream> = seen.iter().map(pb::TaskOutputChunk::stream).collect();
    assert_eq!(
        streams,
        [
            pb::OutputStream::Stdout,
            pb::OutputStream::Stderr,
            pb::OutputStream::Log
        ]
    );
    assert_eq!(seen[0].offset, 0);
    assert_eq!(seen[1].offset, 10);
    assert!(
        seen.iter()
            .all(|c| c.fencing_token == grant.fencing_token && c.lease_id == grant.lease_id)
    );
    assert_eq!(
        get_task(&server, &task.task_id).await.state(),
        pb::TaskState::Running
    );

    assert_eq!(
        agent
            .update(&grant, output(vec![stdout(4, "linking\n")]))
            .await
            .code,
        0
    );
    assert_eq!(texts(&next_output(&mut live).await), "linking\n");
    agent.succeed(&grant, json!({"ok": true})).await;
    let (rest, last) = rest_of(&mut live).await;
    assert_eq!((rest.as_str(), last), ("", pb::TaskState::Succeeded));

    // Replayed: by a late watch (the final state after the output) and by
    // pages of ListTaskOutput, and from an offset.
    let all = "compiling\nwarning: unused\nINFO step 1 done\nlinking\n";
    let (replayed, last) = rest_of(&mut watch(&server, &task.task_id, 0).await).await;
    assert_eq!((replayed.as_str(), last), (all, pb::TaskState::Succeeded));
    let listed = all_output(&server, &task.task_id, 0).await;
    assert_eq!(texts(&listed), all);
    let sequences: Vec<u64> = listed.iter().map(|c| c.sequence).collect();
    assert_eq!(sequences, [1, 2, 3, 4]);
    assert!(listed.iter().all(|c| c.dropped_bytes == 0));
    let after_two = listed[2].offset;
    let (tail, _) = rest_of(&mut watch(&server, &task.task_id, after_two).await).await;
    assert_eq!(tail, "INFO step 1 done\nlinking\n");
    server.stop().await;
}

async fn attempts_are_kept_apart_and_a_failure_carries_its_last_lines(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit(&server, 2).await;
    let first = agent.grant().await;
    start(&mut agent, &first).await;
    let lines: Vec<pb::OutputChunk> = (1..=30)
        .map(|n| stdout(n, &format!("attempt one, line {n}\n")))
        .collect();
    assert_eq!(agent.update(&first, output(lines)).await.code, 0);
    let failed = Update::Failed(pb::LeaseFailed {
        error: Some(pb::TaskError {
            message: "exit 1".into(),
            code: "exit_code".into(),
            retryable: true,
            ..Default::default()
        }),
    });
    assert_eq!(agent.update(&first, failed).await.code, 0);
    let requeued = get_task(&server, &task.task_id).await;
    let tail = &requeued
        .error
        .as_ref()
        .expect("the attempt's error")
        .output_tail;
    let expected: Vec<String> = (11..=30)
        .map(|n| format!("attempt one, line {n}"))
        .collect();
    assert_eq!(tail, &expected.join("\n"), "the last 20 lines");

    let second = agent.grant().await;
    assert!(second.fencing_token > first.fencing_token);
    start(&mut agent, &second).await;
    let again = output(vec![stdout(1, "attempt two\n")]);
    assert_eq!(agent.update(&second, again).await.code, 0);
    agent.succeed(&second, json!({})).await;

    let all = all_output(&server, &task.task_id, 0).await;
    assert_eq!(all.len(), 31);
    assert!(
        all[..30]
            .iter()
            .all(|c| c.fencing_token == first.fencing_token)
    );
    assert_eq!(all[30].fencing_token, second.fencing_token);
    assert_eq!(all[30].lease_id, second.lease_id);
    assert_eq!(all[30].text, "attempt two\n");
    let only_second = all_output(&server, &task.task_id, second.fencing_token).await;
    assert_eq!(texts(&only_second), "attempt two\n");
    let only_first = all_output(&server, &task.task_id, first.fencing_token).await;
    assert_eq!(only_first.len(), 30);
    server.stop().await;
}

async fn output_from_a_lease_not_held_is_refused(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit(&server, 2).await;
    let grant = agent.grant().await;
    start(&mut agent, &grant).await;
    let released = agent
        .release(&grant, pb::ReleaseCause::Busy, "busy for now")
        .await;
    assert_eq!(released.code, 0);
    // Late: the lease ended; its holder's output is fenced off.
    let late = agent
        .update(&grant, output(vec![stdout(1, "too late\n")]))
        .await;
    assert_eq!(
        late.code,
        tonic::Code::FailedPrecondition as i32,
        "{}",
        late.message
    );
    // A stale token is refused just the same once the task is granted again.
    let regrant = agent.grant().await;
    start(&mut agent, &regrant).await;
    let stale = agent
        .update(&grant, output(vec![stdout(2, "stale\n")]))
        .await;
    assert_eq!(
        stale.code,
        tonic::Code::FailedPrecondition as i32,
        "{}",
        stale.message
    );
    assert!(all_output(&server, &task.task_id, 0).await.is_empty());
    server.stop().await;
}

async fn a_resent_chunk_is_stored_once(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit(&server, 1).await;
    let grant = agent.grant().await;
    start(&mut agent, &grant).await;
    let once = output(vec![stdout(1, "one\n"), stdout(2, "two\n")]);
    assert_eq!(agent.update(&grant, once).await.code, 0);
    // After a reconnect a runner resends what it did not see acknowledged.
    let again = output(vec![stdout(2, "two\n"), stdout(3, "three\n")]);
    assert_eq!(agent.update(&grant, again).await.code, 0);
    let all = all_output(&server, &task.task_id, 0).await;
    assert_eq!(texts(&all), "one\ntwo\nthree\n");
    server.stop().await;
}

async fn secrets_in_output_are_redacted(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit(&server, 1).await;
    let grant = agent.grant().await;
    start(&mut agent, &grant).await;
    let token = "ghp_0123456789abcdefghijklmnopqrstuvwxyz";
    let leaky = output(vec![
        stdout(1, &format!("cloning with {token}\n")),
        stdout(2, "connecting to postgres://app:hunter2@db/prod\n"),
    ]);
    assert_eq!(agent.update(&grant, leaky).await.code, 0);
    let failed = Update::Failed(pb::LeaseFailed {
        error: Some(pb::TaskError {
            message: "clone failed".into(),
            ..Default::default()
        }),
    });
    assert_eq!(agent.update(&grant, failed).await.code, 0);
    let stored = texts(&all_output(&server, &task.task_id, 0).await);
    assert_eq!(
        stored,
        "cloning with [redacted]\nconnecting to postgres://app:[redacted]@db/prod\n"
    );
    let done = get_task(&server, &task.task_id).await;
    let tail = &done.error.expect("error").output_tail;
    assert!(!tail.contains(token) && !tail.contains("hunter2"), "{tail}");
    server.stop().await;
}

async fn the_task_bound_drops_the_oldest_and_says_so(backend: Backend) {
    let bound = OutputBounds::MIN_PER_TASK;
    let server = TestServer::start_with(backend, |c| c.output_bytes_per_task = bound).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit(&server, 1).await;
    let grant = agent.grant().await;
    start(&mut agent, &grant).await;
    // 200 lines of 1,000 bytes, in reports of 50.
    let line = |n: u64| format!("{n:05} {}\n", "x".repeat(993));
    for report in 0..4 {
        let chunks = (1..=50)
            .map(|i| {
                let n = report * 50 + i;
                stdout(n, &line(n))
            })
            .collect();
        assert_eq!(agent.update(&grant, output(chunks)).await.code, 0);
    }
    // A runner's own drop comes through as a gap too.
    let mut marked = stdout(201, "the end\n");
    marked.dropped_bytes = 5_000;
    assert_eq!(agent.update(&grant, output(vec![marked])).await.code, 0);
    agent.succeed(&grant, json!({})).await;

    let all = all_output(&server, &task.task_id, 0).await;
    let kept: u64 = all.iter().map(|c| c.text.len() as u64).sum();
    let dropped: u64 = all.iter().map(|c| c.dropped_bytes).sum();
    assert!(kept <= bound, "{kept} kept, bound {bound}");
    assert_eq!(
        kept + dropped,
        200 * 1_000 + 5_000 + 8,
        "every byte kept or counted dropped"
    );
    assert!(
        all[0].dropped_bytes > 0 && all[0].offset == all[0].dropped_bytes,
        "{:?}",
        all[0].offset
    );
    assert_eq!(all.last().unwrap().text, "the end\n");
    assert_eq!(all.last().unwrap().dropped_bytes, 5_000);
    assert!(
        texts(&all).contains(&line(200)),
        "the newest lines are kept"
    );
    server.stop().await;
}

async fn the_namespace_bound_drops_the_oldest_tasks_output(backend: Backend) {
    let per_task = OutputBounds::MIN_PER_TASK;
    let server = TestServer::start_with(backend, |c| {
        c.output_bytes_per_task = per_task;
        c.output_bytes_per_namespace = 2 * per_task;
        // The server's own sweeper never trims here: a trim of its that
        // held the lock would make the test's trim below a no-op.
        c.sweep_interval_ms = 3_600_000;
    })
    .await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 3).await;
    let mut running = Vec::new();
    for _ in 0..3 {
        let task = submit(&server, 1).await;
        let grant = agent.grant().await;
        start(&mut agent, &grant).await;
        let lines = (1..=60)
            .map(|n| stdout(n, &format!("{}\n", "y".repeat(999))))
            .collect();
        assert_eq!(agent.update(&grant, output(lines)).await.code, 0);
        running.push((task, grant));
    }
    // The sweeper keeps the bound every tenth sweep; trimming through a
    // store of the same database now is the same step, and the only trim.
    let bounds = OutputBounds {
        per_task,
        per_namespace: 2 * per_task,
    };
    let store = switchyard_server::store::open_with(
        &server.url,
        switchyard_server::store::StoreOptions {
            output: bounds,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    store.trim_output().await.unwrap();
    store.close().await;
    let outputs = [
        all_output(&server, &running[0].0.task_id, 0).await,
        all_output(&server, &running[1].0.task_id, 0).await,
        all_output(&server, &running[2].0.task_id, 0).await,
    ];
    for dropped in &outputs[..2] {
        assert_eq!(dropped.len(), 1, "one mark of what went");
        assert_eq!(
            (dropped[0].text.as_str(), dropped[0].dropped_bytes),
            ("", 60_000)
        );
    }
    assert_eq!(
        texts(&outputs[2]).len(),
        60_000,
        "the newest task's output stays"
    );
    // A task whose output went goes on writing after it.
    let (task, grant) = &running[0];
    assert_eq!(
        agent
            .update(grant, output(vec![stdout(61, "still here\n")]))
            .await
            .code,
        0
    );
    let after = all_output(&server, &task.task_id, 0).await;
    assert_eq!(texts(&after), "still here\n");
    assert_eq!((after[1].offset, after[1].dropped_bytes), (60_000, 0));
    server.stop().await;
}

async fn bad_output_is_refused_naming_the_field(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit(&server, 1).await;
    let grant = agent.grant().await;
    start(&mut agent, &grant).await;
    let unspecified = chunk(pb::OutputStream::Unspecified, 1, "x\n");
    let too_many = (1..=1_025).map(|n| stdout(n, "x\n")).collect();
    for (chunks, field) in [
        (vec![], "lease_update.output.chunks"),
        (vec![unspecified], "lease_update.output.chunks[0].stream"),
        (
            vec![stdout(0, "x\n")],
            "lease_update.output.chunks[0].sequence",
        ),
        (
            vec![stdout(2, "x\n"), stdout(2, "y\n")],
            "lease_update.output.chunks[1].sequence",
        ),
        (too_many, "lease_update.output.chunks"),
    ] {
        let ack = agent.update(&grant, output(chunks)).await;
        assert_eq!(
            ack.code,
            tonic::Code::InvalidArgument as i32,
            "{field}: {}",
            ack.message
        );
        assert!(ack.message.contains(field), "{field}: {}", ack.message);
    }
    // A text past a chunk's 64 KiB keeps its end; the rest counts as dropped.
    let long = format!("{}end\n", "z".repeat(70_000));
    assert_eq!(
        agent
            .update(&grant, output(vec![stdout(1, &long)]))
            .await
            .code,
        0
    );
    let all = all_output(&server, &task.task_id, 0).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].text.len(), 64 * 1024);
    assert!(all[0].text.ends_with("end\n"));
    assert_eq!(all[0].dropped_bytes as usize, long.len() - 64 * 1024);
    server.stop().await;
}

async fn with_no_output_kept_output_is_acknowledged_and_dropped(backend: Backend) {
    let server = TestServer::start_with(backend, |c| c.output_bytes_per_task = 0).await;
    let mut agent = TestAgent::start(&server, "a", json!({}), 1).await;
    let task = submit(&server, 1).await;
    let grant = agent.grant().await;
    start(&mut agent, &grant).await;
    assert_eq!(
        agent
            .update(&grant, output(vec![stdout(1, "x\n")]))
            .await
            .code,
        0
    );
    agent.succeed(&grant, json!({})).await;
    wait_for_state(&server, &task.task_id, pb::TaskState::Succeeded).await;
    assert!(all_output(&server, &task.task_id, 0).await.is_empty());
    server.stop().await;
}
