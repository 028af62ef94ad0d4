// examples/echo-runner.mjs runs as its own process: it connects, echoes a task, and on
// SIGTERM drains and exits 0.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { TaskState } from "../src/gen/switchyard/v1/task_pb.js";
import { startServer } from "./server.js";
import { clients, FAST, runnerDir, watch, within } from "./helpers.js";

const example = join(dirname(fileURLToPath(import.meta.url)), "..", "examples", "echo-runner.mjs");
const cleanup = [];
after(async () => {
  for (const fn of cleanup.reverse()) await fn();
});

test("the echo example runs a task and drains on SIGTERM with exit code 0", async () => {
  const server = await startServer({ args: FAST });
  cleanup.push(() => server.stop());
  const d = runnerDir({ ".capabilities.json": { tags: ["example-tag"] } });
  cleanup.push(async () => d.remove());
  const child = spawn(process.execPath, [example], {
    env: { ...process.env, SWITCHYARD_SERVER: `http://${server.address}`, SWITCHYARD_AGENT_DIR: d.dir },
    stdio: ["ignore", "pipe", process.env.TEST_LOG ? "inherit" : "ignore"],
  });
  const exited = once(child, "exit");
  cleanup.push(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGKILL");
      await exited;
    }
  });
  const lines = createInterface({ input: child.stdout });
  const connected = new Promise((resolve) =>
    lines.on("line", (line) => {
      if (line.startsWith("echo runner connected as ")) resolve(line);
    }),
  );
  await within(connected, 15_000, "the example to connect");

  const { tasks } = clients(server.address);
  const { task } = await tasks.submitTask({
    kind: "echo",
    payload: { n: 1 },
    placement: { requiredTags: ["example-tag"] },
  });
  const done = await watch(tasks, task.taskId);
  assert.equal(TaskState[done.state], "SUCCEEDED");
  assert.deepEqual(done.result, { echoed: { n: 1 } });

  child.kill("SIGTERM");
  const [code, signal] = await within(exited, 15_000, "the example to exit");
  assert.equal(signal, null);
  assert.equal(code, 0);
});
