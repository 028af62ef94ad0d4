// What the Node runner advertises and how it hands work back, against the real server: a
// runner is granted only the kinds it handles (none without handlers) and ExplainTask says why
// not; a task its handler keeps handing back (`Release`) reaches the server's bound and fails
// while another task on the same one-slot runner runs; a handler whose required capability is
// unhealthy is withdrawn (the runner DEGRADED, naming both) and comes back with the capability.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { AgentStatus } from "../src/gen/switchyard/v1/agent_pb.js";
import { QueuedReason, TaskState } from "../src/gen/switchyard/v1/task_pb.js";
import { Release, ReleaseCause, Runner } from "../src/index.js";
import { startServer } from "./server.js";
import { clients, FAST, poll, runnerDir, startRunner, watch, within } from "./helpers.js";

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

/** A runner against `address` with its own directory, stopped after the tests. */
async function runner(address, setup, files, options) {
  const d = runnerDir(files);
  const started = await startRunner(address, d.dir, setup, options);
  cleanup.push(async () => {
    await within(started.runner.stop(), 10_000, "the runner to stop");
    d.remove();
  });
  return { ...started, dir: d.dir };
}

const tagged = (name) => ({ ".capabilities.json": { tags: [name] } });
const tag = (name) => ({ placement: { requiredTags: [name] } });
const parked = (t) => t.queuedReason === QueuedReason.PARKED;

/** The agents a task was leased to, in order (its `leased` events). */
async function leasedTo(tasks, taskId) {
  const { events } = await tasks.listTaskEvents({ taskId, pageSize: 1000 });
  return events.filter((e) => e.kind === "leased").map((e) => e.agentId);
}

/** ExplainTask's verdict on one agent. */
async function verdict(tasks, taskId, agentId) {
  const { verdicts } = await tasks.explainTask({ taskId });
  const found = verdicts.find((v) => v.agentId === agentId);
  assert.ok(found, `a verdict for agent ${agentId}`);
  return found;
}

/** The agent as ListAgents shows it. */
async function listed(admin, agentId) {
  const { agents } = await admin.listAgents({ pageSize: 1000 });
  const found = agents.find((a) => a.agentId === agentId);
  assert.ok(found, `agent ${agentId} in ListAgents`);
  return found;
}

test("Release takes the causes a handler may give, BUSY by default", () => {
  const busy = new Release("not now");
  assert.ok(busy instanceof Error);
  assert.equal(busy.cause, ReleaseCause.BUSY);
  assert.equal(busy.reason, "not now");
  assert.equal(busy.message, "not now");
  assert.equal(new Release("bad", { cause: ReleaseCause.CANNOT_DECODE }).cause, ReleaseCause.CANNOT_DECODE);
  for (const cause of [ReleaseCause.DRAINING, ReleaseCause.REVOCATION_ACKNOWLEDGED, ReleaseCause.UNSPECIFIED]) {
    assert.throws(() => new Release("x", { cause }), RangeError);
  }
});

test("a runner advertises its handlers' kinds, sorted, minus those withdrawn", async () => {
  const d = runnerDir({ ".capabilities.json": { provides: { "comm.gateway": { version: "2.0.0" } } } });
  try {
    const r = new Runner({ dir: d.dir, logger: { debug() {}, info() {}, warn() {}, error() {} } });
    assert.deepEqual(r.advertised, { kinds: [], withdrawn: [] }, "no handlers, no kinds");
    r.handler("zeta", async () => ({}));
    r.handler("notify", async () => ({}), { requires: ["comm.gateway@1"] });
    r.pack({ id: "bot", handlers: { reply: async () => ({}) }, requires: ["comm.gateway"] });
    r.handler("bad kind", async () => ({}));
    assert.deepEqual(
      r.packRejections.map(({ pack, kind, id, reason }) => ({ pack, kind, id, reason })),
      [
        {
          pack: "bad kind",
          kind: "handler",
          id: "bad kind",
          reason: "handler kind has ' ': no white space or control characters",
        },
      ],
    );
    await r.capabilities();
    assert.deepEqual(r.advertised, {
      kinds: ["reply", "zeta"],
      withdrawn: [
        {
          kind: "notify",
          capability: "comm.gateway@1",
          problem: "version 2.0.0, not major 1",
          reason: "handler notify withdrawn: needs comm.gateway@1, version 2.0.0, not major 1",
        },
      ],
    });
    assert.deepEqual(r.unhealthy, ["handler notify withdrawn: needs comm.gateway@1, version 2.0.0, not major 1"]);
  } finally {
    d.remove();
  }
});

test("a runner that does not handle a task's kind is never granted it", async () => {
  const { runner: idle } = await runner(
    server.address,
    (r) => r.handler("kinds.other", async () => ({})),
    tagged("kinds-a"),
  );
  const { task } = await api.tasks.submitTask({ kind: "kinds.wanted", payload: { n: 1 }, ...tag("kinds-a") });
  const waiting = await watch(api.tasks, task.taskId, parked, 10_000);
  assert.equal(TaskState[waiting.state], "QUEUED");
  assert.equal((await verdict(api.tasks, task.taskId, idle.agentId)).reason, "does not handle kind kinds.wanted");

  // A runner that handles the kind takes it; the idle one never had it.
  const { runner: worker } = await runner(
    server.address,
    (r) => r.handler("kinds.wanted", async (t) => ({ got: t.payload })),
    tagged("kinds-a"),
  );
  const done = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[done.state], "SUCCEEDED");
  assert.deepEqual(done.result, { got: { n: 1 } });
  assert.deepEqual(await leasedTo(api.tasks, task.taskId), [worker.agentId]);
  assert.deepEqual((await listed(api.admin, worker.agentId)).handledKinds, ["kinds.wanted"]);
  assert.deepEqual((await listed(api.admin, idle.agentId)).handledKinds, ["kinds.other"]);
});

test("a runner with no handlers advertises no kinds and is granted nothing", async () => {
  const { runner: empty } = await runner(server.address, () => {}, tagged("kinds-none"));
  assert.deepEqual((await listed(api.admin, empty.agentId)).handledKinds, []);
  const { task } = await api.tasks.submitTask({ kind: "kinds.anything", ...tag("kinds-none") });
  const waiting = await watch(api.tasks, task.taskId, parked, 10_000);
  assert.equal(TaskState[waiting.state], "QUEUED");
  assert.equal((await verdict(api.tasks, task.taskId, empty.agentId)).reason, "does not handle kind kinds.anything");
  assert.deepEqual(await leasedTo(api.tasks, task.taskId), []);
  await api.tasks.cancelTask({ taskId: task.taskId });
});

test("a task the handler keeps handing back reaches the server's bound and fails; another task runs", async () => {
  const bounded = await startServer({ args: [...FAST, "--max-releases-per-task", "3"] });
  cleanup.push(() => bounded.stop());
  const { tasks } = clients(bounded.address);
  let handedBack = 0;
  await runner(
    bounded.address,
    (r) => {
      r.handler("stubborn", async () => {
        handedBack += 1;
        throw new Release("not now");
      });
      r.handler("echo", async (t) => ({ echoed: t.payload }));
    },
    tagged("kinds-bound"),
    { capacity: 1 },
  );
  const { task: stubborn } = await tasks.submitTask({ kind: "stubborn", ...tag("kinds-bound") });
  const { task: echo } = await tasks.submitTask({ kind: "echo", payload: { n: 2 }, ...tag("kinds-bound") });
  const [failed, echoed] = await Promise.all([watch(tasks, stubborn.taskId), watch(tasks, echo.taskId)]);
  assert.equal(TaskState[echoed.state], "SUCCEEDED");
  assert.deepEqual(echoed.result, { echoed: { n: 2 } });
  assert.equal(TaskState[failed.state], "FAILED");
  assert.equal(failed.error.code, "released_too_often");
  assert.match(failed.error.message, /not now/);
  assert.equal(failed.attempts, 0, "a release spends no attempt");
  assert.equal(handedBack, 3);
  assert.equal((await leasedTo(tasks, stubborn.taskId)).length, 3);
  const { events } = await tasks.listTaskEvents({ taskId: stubborn.taskId });
  const releases = events.filter((e) => e.kind === "released").map((e) => e.message);
  assert.equal(releases.length, 2, "the third hand-back fails the task");
  for (const message of releases) assert.match(message, /\(busy\): not now/);
});

test("a handler that cannot handle its task refuses it: it is not offered to that runner again", async () => {
  let refused = 0;
  const { runner: first } = await runner(
    server.address,
    (r) =>
      r.handler("kinds.gpu", async () => {
        refused += 1;
        throw new Release("no GPU here", { cause: ReleaseCause.CANNOT_HANDLE });
      }),
    tagged("kinds-refuse"),
  );
  const { task } = await api.tasks.submitTask({ kind: "kinds.gpu", ...tag("kinds-refuse") });
  const waiting = await watch(api.tasks, task.taskId, parked, 10_000);
  assert.equal(TaskState[waiting.state], "QUEUED");
  assert.equal(waiting.attempts, 0);
  assert.equal((await verdict(api.tasks, task.taskId, first.agentId)).reason, "refused the task: no GPU here");
  assert.equal(refused, 1);

  const { runner: second } = await runner(
    server.address,
    (r) => r.handler("kinds.gpu", async () => ({ ran: true })),
    tagged("kinds-refuse"),
  );
  const done = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[done.state], "SUCCEEDED");
  assert.deepEqual(await leasedTo(api.tasks, task.taskId), [first.agentId, second.agentId]);
  assert.equal(refused, 1);
});

test("a handler whose required capability is unhealthy is withdrawn until it is back", async () => {
  const unhealthy = {
    tags: ["kinds-llm"],
    provides: { "ai.llm": { version: "1.2.0", healthy: false, reason: "quota exhausted" } },
  };
  const { runner: r, dir } = await runner(
    server.address,
    (x) => {
      x.handler("summarize", async (t) => ({ summary: t.payload.text }), { requires: ["ai.llm@1"] });
      x.handler("kinds.echo", async () => ({}));
    },
    { ".capabilities.json": unhealthy },
  );
  // No event says a heartbeat landed, so the agent is polled (bounded).
  const { agent: degraded } = await poll(
    () => api.admin.getAgent({ agentId: r.agentId }),
    (res) => res.agent.status === AgentStatus.DEGRADED,
  );
  assert.equal(AgentStatus[degraded.status], "DEGRADED");
  assert.deepEqual(degraded.statusReasons, ["handler summarize withdrawn: needs ai.llm@1, unhealthy: quota exhausted"]);
  assert.deepEqual(degraded.handledKinds, ["kinds.echo"]);
  const { task } = await api.tasks.submitTask({ kind: "summarize", payload: { text: "tl;dr" }, ...tag("kinds-llm") });
  const waiting = await watch(api.tasks, task.taskId, parked, 10_000);
  assert.equal(TaskState[waiting.state], "QUEUED");
  assert.equal((await verdict(api.tasks, task.taskId, r.agentId)).reason, "does not handle kind summarize");

  // The capability is back: so is the kind, and the task runs.
  const healthy = { tags: ["kinds-llm"], provides: { "ai.llm": { version: "1.2.0", healthy: true } } };
  writeFileSync(join(dir, ".capabilities.json"), JSON.stringify(healthy));
  assert.equal(await r.refreshCapabilities(), true);
  assert.deepEqual(r.advertised, { kinds: ["kinds.echo", "summarize"], withdrawn: [] });
  const done = await watch(api.tasks, task.taskId);
  assert.equal(TaskState[done.state], "SUCCEEDED");
  assert.deepEqual(done.result, { summary: "tl;dr" });
  assert.deepEqual(await leasedTo(api.tasks, task.taskId), [r.agentId]);
  const { agent: ready } = await poll(
    () => api.admin.getAgent({ agentId: r.agentId }),
    (res) => res.agent.status === AgentStatus.READY,
  );
  assert.equal(AgentStatus[ready.status], "READY");
  assert.deepEqual(ready.statusReasons, []);
  assert.deepEqual(ready.handledKinds, ["kinds.echo", "summarize"]);
});
