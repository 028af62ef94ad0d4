// Shared helpers for the end-to-end tests: fast server flags, runner directories, a runner
// started against a server, bounded waits, and following a task with WatchTask.
import { once } from "node:events";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { TaskService } from "../src/gen/switchyard/v1/task_service_pb.js";
import { AgentAdminService } from "../src/gen/switchyard/v1/agent_admin_service_pb.js";
import { TaskState } from "../src/gen/switchyard/v1/task_pb.js";
import { Runner } from "../src/index.js";

/** Server flags that make heartbeats, sweeps and ack windows fast enough for tests. */
export const FAST = ["--heartbeat-interval-ms", "200", "--sweep-interval-ms", "100", "--ack-window-ms", "2000"];

export const TERMINAL = new Set([TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED]);

const quiet = { debug() {}, info() {}, warn() {}, error() {} };
const logger = process.env.TEST_LOG
  ? { debug() {}, info: console.error, warn: console.error, error: console.error }
  : quiet;

/** Rejects after `ms` with a message naming what was awaited. */
export function within(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms}ms waiting for ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** A promise with its resolve function, for handlers to signal and wait on. */
export function deferred() {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  return { promise, resolve };
}

/** A temporary runner directory with the given tier files (`{".capabilities.json": {...}}`). */
export function runnerDir(files = {}) {
  const dir = mkdtempSync(join(tmpdir(), "switchyard-runner-"));
  for (const [name, content] of Object.entries(files)) {
    writeFileSync(join(dir, name), typeof content === "string" ? content : JSON.stringify(content));
  }
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Clients for a server address. */
export function clients(address) {
  const transport = createGrpcTransport({ baseUrl: `http://${address}` });
  return { tasks: createClient(TaskService, transport), admin: createClient(AgentAdminService, transport) };
}

let counter = 0;

/**
 * Starts a runner against `address`; `setup(runner)` registers handlers. Resolves once the
 * session is welcomed.
 */
export async function startRunner(address, dir, setup = () => {}, options = {}) {
  const runner = new Runner({
    server: `http://${address}`,
    dir,
    name: `node-test-${process.pid}-${++counter}`,
    capacity: 4,
    refreshMs: 60_000,
    graceMs: 2_000,
    backoff: { initialMs: 100, maxMs: 500 },
    logger,
    ...options,
  });
  setup(runner);
  const connected = once(runner, "connected");
  const running = runner.run({ handleSignals: false });
  running.catch(() => {});
  await within(connected, 10_000, "the runner's session");
  return { runner, running };
}

/** Follows a task with WatchTask until `until(task)` holds (default: a terminal state). */
export async function watch(tasks, taskId, until = (t) => TERMINAL.has(t.state), ms = 15_000) {
  const signal = AbortSignal.timeout(ms);
  let last;
  try {
    for await (const res of tasks.watchTask({ taskId }, { signal })) {
      if (res.task) {
        last = res.task;
        if (until(last)) return last;
      }
    }
  } catch (err) {
    if (signal.aborted) {
      throw new Error(`timed out after ${ms}ms watching task ${taskId} (last state ${last?.state})`);
    }
    throw err;
  }
  // The watch ended (the task is terminal): read it once more.
  const { task } = await tasks.getTask({ taskId });
  if (until(task)) return task;
  throw new Error(`the watch of ${taskId} ended in state ${TaskState[task.state]} without the condition`);
}

/** Calls `read` until `ok(result)` or the deadline (for state nothing streams); returns the last result. */
export async function poll(read, ok, ms = 5_000, every = 50) {
  const deadline = Date.now() + ms;
  for (;;) {
    const result = await read();
    if (ok(result) || Date.now() > deadline) return result;
    await new Promise((r) => setTimeout(r, every));
  }
}
