// The Node runner against the real switchyard-server on an ephemeral port: registration,
// leases and results, failed attempts and retries, capability diffs, cancellation, execution
// timeouts, packs with missing parameters (DEGRADED), drain, the causes its releases carry,
// and a server restart the runner survives. Handled kinds and hand-backs are in kinds.test.js.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { AgentStatus } from "../src/gen/switchyard/v1/agent_pb.js";
import { QueuedReason, TaskState } from "../src/gen/switchyard/v1/task_pb.js";
import { TaskFailure } from "../src/index.js";
import { startServer } from "./server.js";
import { clients, deferred, FAST, poll, runnerDir, startRunner, watch, within } from "./helpers.js";

let server;
let api;
const cleanup = [];

before(async () => {
  server = await startServer({ args: FAST });
  api = clients(server.address);
});

after(async () => {
  for (const fn of cleanup.reverse()) await fn();
  await server?.stop();
});

/** A runner with its own directory, stopped after the tests. */
async function runner(setup, files = { ".capabilities.json": { tags: ["node-e2e"] } }, options) {
  const d = runnerDir(files);
  const started = await startRunner(server.address, d.dir, setup, options);
  cleanup.push(async () => {
    await within(started.runner.stop(), 10_000, "the runner to stop");
    d.remove();
  });
  return { ...started, dir: d.dir };
}

const tag = (name) => ({ placement: { requiredTags: [name] } });

test("registers with its merged document, provenance and runner name", async () => {
  const { runner: r } = await runner(() => {}, {
    ".capabilities.json": { tags: ["reg-tag"], github: { token: "ghp_secret" } },
    ".capabilities.override.json": { environment: "ci" },
  });
  const { agent } = await api.admin.getAgent({ agentId: r.agentId });
  assert.equal(agent.status, AgentStatus.READY);
  assert.match(agent.runner, /node/);
  const doc = agent.capabilities.document;
  assert.deepEqual(doc.tags, ["reg-tag"]);
  assert.equal(doc.environment, "ci");
  assert.equal(doc.github.token, "[redacted]");
  assert.equal(doc.memory.unit, "MB");
  const prov = Object.fromEntries(agent.capabilities.provenance.map((p) => [p.path, p.tier]));
  assert.equal(prov.environment, 4 /* TIER_OVERRIDE */);
  assert.equal(prov.os, 1 /* TIER_BASE */);
});

test("a lease is accepted, run and completed with the handler's result", async () => {
  await runner((r) => r.handler("echo", async (task) => ({ echoed: task.payload, kind: task.kind })), {
    ".capabilities.json": { tags: ["echo-tag"] },
  });
  const { task } = await api.tasks.submitTask({ kind: "echo", payload: { hello: "world" }, ...tag("echo-tag") });
  const done = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[done.state], "SUCCEEDED");
  assert.deepEqual(done.result, { echoed: { hello: "world" }, kind: "echo" });
});

test("a result's whole numbers arrive as integers; one past 2^53 fails the attempt, named", async () => {
  await runner(
    (r) =>
      r
        .handler("exact", async () => ({ exit_code: 0, port: 8080, load: 0.5 }))
        .handler("too-big", async () => ({ ok: true, id: 2 ** 60 }))
        .handler("big-details", async () => {
          throw new TaskFailure("exit 3", { code: "exit_code", retryable: false, details: { inode: 2 ** 60 } });
        }),
    { ".capabilities.json": { tags: ["numbers-tag"] } },
  );
  const { task: exact } = await api.tasks.submitTask({ kind: "exact", ...tag("numbers-tag") });
  const done = await watch(api.tasks, exact.taskId);
  assert.equal(TaskState[done.state], "SUCCEEDED");
  assert.equal(JSON.stringify(done.result), '{"exit_code":0,"load":0.5,"port":8080}');
  const { task: big } = await api.tasks.submitTask({ kind: "too-big", maxAttempts: 1, ...tag("numbers-tag") });
  const failed = await watch(api.tasks, big.taskId);
  assert.equal(TaskState[failed.state], "FAILED");
  assert.match(failed.error.message, /^the handler's result cannot be sent: result\.id: number is beyond ±\(2\^53 − 1\)/);
  assert.equal(failed.error.retryable, false);
  // A failure whose details cannot be carried is still that failure, its details dropped and said.
  const { task: details } = await api.tasks.submitTask({ kind: "big-details", maxAttempts: 1, ...tag("numbers-tag") });
  const dropped = await watch(api.tasks, details.taskId);
  assert.equal(TaskState[dropped.state], "FAILED");
  assert.equal(dropped.error.code, "exit_code");
  assert.match(dropped.error.message, /^exit 3 \(details dropped: error\.details\.inode: number is beyond/);
});

test("a handler gets the GPUs its lease holds", async () => {
  const gpus = [0, 1].map((i) => ({ index: i, uuid: `GPU-${i}`, model: "Tesla T4", memory_mb: 15360 }));
  let env;
  await runner((r) => r.handler("train", async (_task, ctx) => {
    env = ctx.resources.env();
    return { gpus: ctx.resources.gpuIds, memory: ctx.resources.memoryMb };
  }), { ".capabilities.json": { tags: ["gpu-tag"], resources: { gpus } } });
  const { task } = await api.tasks.submitTask({
    kind: "train",
    placement: { selector: "gpu-tag, needs gpus: 2, needs memory: 64" },
  });
  const done = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[done.state], "SUCCEEDED");
  assert.deepEqual(done.result, { gpus: ["GPU-0", "GPU-1"], memory: 64 });
  assert.equal(env.CUDA_VISIBLE_DEVICES, "GPU-0,GPU-1");
});

test("a handler's error is a failed attempt that is retried", async () => {
  let calls = 0;
  await runner(
    (r) =>
      r.handler("flaky", async () => {
        calls += 1;
        if (calls === 1) throw new Error("first attempt fails");
        return { ok: true };
      }),
    { ".capabilities.json": { tags: ["flaky-tag"] } },
  );
  const { task } = await api.tasks.submitTask({ kind: "flaky", maxAttempts: 2, ...tag("flaky-tag") });
  const done = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[done.state], "SUCCEEDED");
  assert.equal(done.attempts, 1);
  assert.equal(calls, 2);
  const { events } = await api.tasks.listTaskEvents({ taskId: task.taskId });
  assert.deepEqual(
    events.map((e) => e.kind).filter((k) => k === "attempt_failed" || k === "succeeded"),
    ["attempt_failed", "succeeded"],
  );
});

test("a failed last attempt fails the task with the handler's error", async () => {
  await runner(
    (r) => {
      r.handler("boom", async () => {
        throw new Error("it broke");
      });
      r.handler("fatal", async () => {
        throw new TaskFailure("bad input", { code: "invalid_payload", retryable: false, details: { field: "x" } });
      });
    },
    { ".capabilities.json": { tags: ["fail-tag"] } },
  );
  const { task } = await api.tasks.submitTask({ kind: "boom", maxAttempts: 1, ...tag("fail-tag") });
  const failed = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[failed.state], "FAILED");
  assert.deepEqual(
    { message: failed.error.message, code: failed.error.code, retryable: failed.error.retryable },
    { message: "it broke", code: "handler_error", retryable: true },
  );
  const { task: fatal } = await api.tasks.submitTask({ kind: "fatal", maxAttempts: 3, ...tag("fail-tag") });
  const done = await watch(api.tasks, fatal.taskId);
  assert.equal(TaskState[done.state], "FAILED");
  assert.equal(done.error.code, "invalid_payload");
  assert.equal(done.error.retryable, false);
  assert.deepEqual(done.error.details, { field: "x" });
});

test("a capability diff unparks a task", async () => {
  const { runner: r, dir } = await runner((x) => x.handler("late", async () => ({ done: 1 })), {
    ".capabilities.json": { tags: ["before"] },
  });
  let drops = 0;
  r.on("disconnected", () => drops++);
  const { task } = await api.tasks.submitTask({ kind: "late", ...tag("arrived-later") });
  const parked = await watch(api.tasks, task.taskId, (t) => t.queuedReason === QueuedReason.PARKED, 5_000);
  assert.equal(TaskState[parked.state], "QUEUED");
  writeFileSync(join(dir, ".capabilities.override.json"), JSON.stringify({ tags: ["before", "arrived-later"] }));
  assert.equal(await r.refreshCapabilities(), true);
  const done = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[done.state], "SUCCEEDED");
  const { agent } = await api.admin.getAgent({ agentId: r.agentId });
  assert.deepEqual(agent.capabilities.document.tags, ["before", "arrived-later"]);
  assert.equal(drops, 0, "the diff travelled on the open session (no re-registration)");
});

test("a diff against a generation the server no longer holds is answered with a snapshot", async () => {
  const { runner: r, dir } = await runner(() => {}, { ".capabilities.json": { tags: ["resync-tag"], level: 1 } });
  // The operator tier moves the server's generation past the one the runner diffs against.
  await api.admin.setAgentOverrides({ agentId: r.agentId, overrides: { pinned: true } });
  let drops = 0;
  r.on("disconnected", () => drops++);
  const resynced = once(r, "resync");
  writeFileSync(join(dir, ".capabilities.override.json"), JSON.stringify({ level: 2 }));
  assert.equal(await r.refreshCapabilities(), true);
  const [{ reason }] = await within(resynced, 10_000, "a ResyncRequest");
  assert.match(reason, /generation/);
  const { agent } = await poll(
    () => api.admin.getAgent({ agentId: r.agentId }),
    (res) => res.agent.capabilities.document.level === 2,
  );
  assert.equal(agent.capabilities.document.level, 2);
  assert.equal(agent.capabilities.document.pinned, true);
  assert.equal(drops, 0);
});

test("cancel reaches a running handler through its AbortSignal", async () => {
  const started = deferred();
  const aborted = deferred();
  await runner(
    (r) =>
      r.handler("wait", (task, ctx) => {
        started.resolve();
        return new Promise((_, reject) => {
          ctx.signal.addEventListener("abort", () => {
            aborted.resolve(ctx.signal.reason);
            reject(new Error("aborted"));
          });
        });
      }),
    { ".capabilities.json": { tags: ["cancel-tag"] } },
  );
  const { task } = await api.tasks.submitTask({ kind: "wait", ...tag("cancel-tag") });
  await within(started.promise, 10_000, "the handler to start");
  await api.tasks.cancelTask({ taskId: task.taskId });
  await within(aborted.promise, 10_000, "the handler's AbortSignal");
  const done = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[done.state], "CANCELED");
  const { events } = await api.tasks.listTaskEvents({ taskId: task.taskId });
  assert.deepEqual(
    events.filter((e) => e.kind === "canceled").map((e) => e.message),
    ["the agent released the task (revocation_acknowledged): canceled by the server"],
  );
});

test("an execution timeout stops a running handler through its AbortSignal", async () => {
  const started = deferred();
  const aborted = deferred();
  await runner(
    (r) =>
      r.handler("stuck", (task, ctx) => {
        started.resolve();
        return new Promise((_, reject) => {
          ctx.signal.addEventListener("abort", () => {
            aborted.resolve(ctx.signal.reason);
            reject(new Error("aborted"));
          });
        });
      }),
    { ".capabilities.json": { tags: ["timeout-tag"] } },
  );
  const { task } = await api.tasks.submitTask({
    kind: "stuck",
    maxAttempts: 1,
    executionTimeout: { seconds: 1n, nanos: 0 },
    ...tag("timeout-tag"),
  });
  await within(started.promise, 10_000, "the handler to start");
  // The server revokes the attempt at its timeout, whatever the heartbeats say.
  const reason = await within(aborted.promise, 10_000, "the handler's AbortSignal");
  assert.match(String(reason), /TIMEOUT|timeout/);
  const done = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[done.state], "FAILED");
  assert.equal(done.error.code, "timeout");
});

test("progress reaches the server", async () => {
  const gate = deferred();
  await runner(
    (r) =>
      r.handler("slow", async (task, ctx) => {
        ctx.progress(40, "working");
        await gate.promise;
        return {};
      }),
    { ".capabilities.json": { tags: ["progress-tag"] } },
  );
  const { task } = await api.tasks.submitTask({ kind: "slow", ...tag("progress-tag") });
  // WatchTask streams state changes only, so progress is polled (bounded).
  const seen = await poll(() => api.tasks.getTask({ taskId: task.taskId }), (res) => res.task.progress?.percent === 40)
    .then((res) => res.task);
  assert.equal(seen.progress.message, "working");
  gate.resolve();
  assert.equal(TaskState[(await watch(api.tasks, task.taskId)).state], "SUCCEEDED");
});

test("a pack with a missing required parameter makes its capability unhealthy and the runner DEGRADED", async () => {
  const { runner: r } = await runner(
    (x) => {
      x.pack({
        id: "ai",
        handlers: { summarize: async () => ({}) },
        provides: {
          "ai.llm": {
            version: "1.2.0",
            params: {
              API_URL: { description: "endpoint", default: "http://localhost:8080" },
              SWITCHYARD_TEST_MISSING_KEY: { description: "key", default: null, sensitive: true },
            },
          },
        },
      });
      x.handler("summarize", async () => ({})); // duplicate kind: reported, never thrown
    },
    { ".capabilities.json": { tags: ["pack-tag"] } },
  );
  assert.deepEqual(
    r.packRejections.map(({ pack, kind, id }) => ({ pack, kind, id })),
    [{ pack: "summarize", kind: "handler", id: "summarize" }],
  );
  // No event says a heartbeat landed, so the agent is polled (bounded).
  const { agent } = await poll(
    () => api.admin.getAgent({ agentId: r.agentId }),
    (res) => res.agent.status === AgentStatus.DEGRADED,
  );
  assert.equal(AgentStatus[agent.status], "DEGRADED");
  assert.deepEqual(agent.statusReasons, [
    "capability ai.llm unhealthy: missing parameter SWITCHYARD_TEST_MISSING_KEY",
  ]);
  assert.deepEqual(agent.capabilities.document.provides, {
    "ai.llm": { version: "1.2.0", healthy: false, reason: "missing parameter SWITCHYARD_TEST_MISSING_KEY" },
  });
});

test("stop() drains: running handlers finish within the grace period, then run() resolves", async () => {
  const started = deferred();
  const gate = deferred();
  const d = runnerDir({ ".capabilities.json": { tags: ["drain-tag"] } });
  cleanup.push(async () => d.remove());
  const { runner: r, running } = await startRunner(server.address, d.dir, (x) =>
    x.handler("drain", async () => {
      started.resolve();
      await gate.promise;
      return { finished: true };
    }),
  );
  const { task } = await api.tasks.submitTask({ kind: "drain", ...tag("drain-tag") });
  await within(started.promise, 10_000, "the handler to start");
  const stopping = r.stop();
  assert.equal(r.draining, true);
  gate.resolve();
  await within(stopping, 10_000, "the drain");
  await running;
  assert.equal(TaskState[(await watch(api.tasks, task.taskId)).state], "SUCCEEDED");
});

test("a handler still running after the grace period is released and the task re-queued", async () => {
  const started = deferred();
  const d = runnerDir({ ".capabilities.json": { tags: ["grace-tag"] } });
  cleanup.push(async () => d.remove());
  const { runner: r } = await startRunner(
    server.address,
    d.dir,
    (x) =>
      x.handler("stubborn", async () => {
        started.resolve();
        await new Promise(() => {}); // ignores its signal
      }),
    { graceMs: 300 },
  );
  const { task } = await api.tasks.submitTask({ kind: "stubborn", ...tag("grace-tag") });
  await within(started.promise, 10_000, "the handler to start");
  await within(r.stop(), 10_000, "the drain");
  const requeued = await watch(api.tasks, task.taskId, (t) => t.state === TaskState.QUEUED, 10_000);
  assert.equal(requeued.attempts, 0, "a release counts no attempt");
  const { events } = await api.tasks.listTaskEvents({ taskId: task.taskId });
  assert.deepEqual(
    events.filter((e) => e.kind === "released").map((e) => e.message),
    ["the agent released the task (draining): agent shut down"],
  );
  await api.tasks.cancelTask({ taskId: task.taskId });
});

test("the runner survives a server restart and its running lease completes", async () => {
  const first = await startServer({ args: FAST });
  const dirKeep = first.dir;
  let current = first;
  const started = deferred();
  const gate = deferred();
  const d = runnerDir({ ".capabilities.json": { tags: ["restart-tag"] } });
  const { runner: r } = await startRunner(first.address, d.dir, (x) =>
    x.handler("long", async () => {
      started.resolve();
      await gate.promise;
      return { survived: true };
    }),
  );
  try {
    const { tasks } = clients(first.address);
    const { task } = await tasks.submitTask({ kind: "long", ...tag("restart-tag") });
    await within(started.promise, 10_000, "the handler to start");
    const disconnected = once(r, "disconnected");
    await first.kill("SIGKILL");
    await within(disconnected, 10_000, "the runner to notice the server is gone");
    const reconnected = once(r, "connected");
    current = await startServer({ args: FAST, listen: first.address, dir: dirKeep });
    const [welcome] = await within(reconnected, 15_000, "the runner to reconnect");
    assert.equal(r.running.size, 1, "the handler kept running across the reconnect");
    const leaseId = [...r.running.keys()][0];
    assert.deepEqual(welcome.resumed, [leaseId]);
    gate.resolve();
    const done = await watch(clients(current.address).tasks, task.taskId);
    assert.equal(TaskState[done.state], "SUCCEEDED");
    assert.deepEqual(done.result, { survived: true });
    assert.equal(done.attempts, 0);

    // A final report made while the server is down is sent again after the reconnect.
    const started2 = deferred();
    const gate2 = deferred();
    let runs2 = 0;
    r.handler("long2", async () => {
      runs2 += 1;
      started2.resolve();
      await gate2.promise;
      return { reported: "later" };
    });
    const { tasks: tasks2 } = clients(current.address);
    const { task: second } = await tasks2.submitTask({ kind: "long2", ...tag("restart-tag") });
    await within(started2.promise, 10_000, "the second handler to start");
    const down = once(r, "disconnected");
    await current.kill("SIGKILL");
    await within(down, 10_000, "the runner to notice the server is gone again");
    gate2.resolve();
    await new Promise((res) => setImmediate(res));
    assert.equal(r.unackedFinals.size, 1, "the final report waits for a session");
    const reported = once(r, "reported");
    const back = once(r, "connected");
    current = await startServer({ args: FAST, listen: first.address, dir: dirKeep });
    await within(back, 15_000, "the runner to reconnect again");
    const done2 = await watch(clients(current.address).tasks, second.taskId);
    assert.equal(TaskState[done2.state], "SUCCEEDED");
    assert.deepEqual(done2.result, { reported: "later" });
    const [ack] = await within(reported, 10_000, "the re-sent final report's ack");
    assert.equal(ack.code, 0, "the re-sent final report is accepted");
    assert.equal(done2.attempts, 0, "the lease was held across the reconnect: no attempt was lost");
    assert.equal(runs2, 1, "the task did not run again");
    assert.equal(r.unackedFinals.size, 0);
  } finally {
    await within(r.stop(), 10_000, "the runner to stop");
    await current.kill();
    await first.stop();
    d.remove();
  }
});

test("a Drain from a stopping server is followed: the runner reconnects after the given delay", async () => {
  const first = await startServer({ args: FAST });
  let current = first;
  const d = runnerDir({ ".capabilities.json": { tags: ["drain-msg-tag"] } });
  const { runner: r } = await startRunner(first.address, d.dir, (x) => x.handler("after", async () => ({ ok: 1 })));
  try {
    const drained = once(r, "drain");
    await first.kill("SIGTERM");
    const [drain] = await within(drained, 10_000, "the server's Drain");
    assert.match(drain.reason, /shut/);
    assert.equal(drain.reconnectAfterMs, 1_000);
    const reconnected = once(r, "connected");
    current = await startServer({ args: FAST, listen: first.address, dir: first.dir });
    await within(reconnected, 15_000, "the runner to reconnect");
    const { tasks } = clients(current.address);
    const { task } = await tasks.submitTask({ kind: "after", ...tag("drain-msg-tag") });
    assert.equal(TaskState[(await watch(tasks, task.taskId)).state], "SUCCEEDED");
  } finally {
    await within(r.stop(), 10_000, "the runner to stop");
    await current.kill();
    await first.stop();
    d.remove();
  }
});
