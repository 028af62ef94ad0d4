// The runner's output: the buffer batches and numbers lines in order, sends an open line after one
// flush, keeps the tail and counts the drop past the total, holds output back (not dropped) past
// the rate, counts bytes not UTF-16 units; and against the real server, `console` and `ctx.log`
// in a handler are the task's output, in order, and a failed attempt's error carries its last
// lines, while `console` outside a handler goes where it always went.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { OutputStream, TaskState } from "../src/gen/switchyard/v1/task_pb.js";
import { OutputBuffer, currentOutput, installCapture } from "../src/output.js";
import { startServer } from "./server.js";
import { clients, FAST, runnerDir, startRunner, watch, within } from "./helpers.js";

const { STDOUT, STDERR, LOG } = OutputStream;

function collect(limits = {}, clock) {
  const batches = [];
  return { buffer: new OutputBuffer(limits, (chunks) => batches.push(chunks), clock), chunks: () => batches.flat() };
}

test("lines are batched and numbered in order", () => {
  const { buffer, chunks } = collect();
  buffer.write(STDOUT, "one\ntw");
  buffer.write(STDOUT, "o\n");
  buffer.write(STDERR, "oops\n");
  buffer.write(STDOUT, "three\n");
  assert.deepEqual(chunks(), [], "nothing before a flush");
  buffer.flush();
  assert.deepEqual(
    chunks().map((c) => [c.stream, c.sequence, c.text]),
    [
      [STDOUT, 1n, "one\ntwo\n"],
      [STDERR, 2n, "oops\n"],
      [STDOUT, 3n, "three\n"],
    ],
  );
});

test("an open line waits one flush, then goes as it is", () => {
  const { buffer, chunks } = collect();
  buffer.write(STDOUT, "progress 10%");
  buffer.flush();
  assert.equal(chunks().length, 0);
  buffer.flush();
  assert.equal(chunks()[0].text, "progress 10%");
  buffer.write(LOG, "last words");
  assert.equal(buffer.flush(true), true);
  assert.equal(chunks().at(-1).text, "last words");
  buffer.write(STDOUT, "after the end\n");
  assert.equal(buffer.flush(), false);
  assert.equal(chunks().length, 2);
});

test("past the total the tail is kept and the drop counted", () => {
  const { buffer, chunks } = collect({ maxBytes: 100, bytesPerSec: 2 ** 30, burstBytes: 2 ** 30, tailBytes: 30 });
  let written = 0;
  for (let n = 0; n < 1000; n++) {
    const line = `line ${String(n).padStart(4, "0")}\n`;
    written += line.length;
    buffer.write(STDOUT, line);
  }
  buffer.flush();
  buffer.flush(true);
  const text = chunks().map((c) => c.text).join("");
  const dropped = chunks().reduce((n, c) => n + Number(c.droppedBytes), 0);
  assert.ok(text.startsWith("line 0000\n") && text.endsWith("line 0999\n"));
  assert.equal(text.length + dropped, written);
  assert.ok(text.length <= 130);
  assert.ok(chunks().find((c) => c.droppedBytes > 0n).text.startsWith("line 09"));
});

test("past the rate output waits in the tail until the rate allows", () => {
  let now = 0;
  const { buffer, chunks } = collect({ bytesPerSec: 100, burstBytes: 100, tailBytes: 1000 }, () => now);
  buffer.write(STDOUT, `${"a".repeat(99)}\n`);
  buffer.write(STDOUT, "b\n");
  buffer.flush();
  assert.deepEqual(chunks().map((c) => c.text.length), [100]);
  now = 1;
  buffer.flush();
  assert.deepEqual([chunks()[1].text, chunks()[1].droppedBytes], ["b\n", 0n], "held back, not dropped");
});

test("characters are counted in bytes and never cut", () => {
  const { buffer, chunks } = collect({ maxBytes: 10, bytesPerSec: 2 ** 30, burstBytes: 2 ** 30, tailBytes: 6 });
  buffer.write(STDOUT, "éé\n");
  buffer.write(STDOUT, "ééé\néé\n");
  buffer.flush(true);
  assert.equal(chunks().map((c) => c.text).join(""), "éé\néé\n");
  assert.equal(chunks().reduce((n, c) => n + Number(c.droppedBytes), 0), 7);
});

test("console in a handler's context reaches its task only", async () => {
  installCapture();
  const { buffer, chunks } = collect();
  await currentOutput.run(buffer, async () => {
    console.log("from the handler");
    await new Promise((r) => setTimeout(r, 1));
    console.error("after a timer");
  });
  buffer.flush(true);
  assert.deepEqual(
    chunks().map((c) => [c.stream, c.text]),
    [
      [STDOUT, "from the handler\n"],
      [STDERR, "after a timer\n"],
    ],
  );
});

let server;
let api;

before(async () => {
  server = await startServer({ args: FAST });
  api = clients(server.address);
});

after(async () => {
  await server?.stop();
});

/** Every chunk of a task's output. */
async function output(taskId) {
  const chunks = [];
  let pageToken = "";
  do {
    const page = await api.tasks.listTaskOutput({ taskId, pageToken });
    chunks.push(...page.chunks);
    pageToken = page.nextPageToken;
  } while (pageToken);
  return chunks;
}

test("console and ctx.log in a handler are the task's output", async () => {
  const d = runnerDir({ ".capabilities.json": { tags: ["node-output"] } });
  const { runner } = await startRunner(server.address, d.dir, (r) => {
    r.handler("chatty", async (input, ctx) => {
      console.log("hello from console.log");
      console.error("a warning on stderr");
      ctx.log("step %d of %d done", 1, 2);
      ctx.log.warn("careful");
      return {};
    });
    r.handler("failing", async () => {
      for (let n = 1; n <= 25; n++) console.log(`line ${n}`);
      throw new Error("boom");
    });
  });
  try {
    const tag = { placement: { requiredTags: ["node-output"] } };
    const { task } = await api.tasks.submitTask({ kind: "chatty", ...tag });
    assert.equal((await watch(api.tasks, task.taskId)).state, TaskState.SUCCEEDED);
    assert.deepEqual(
      (await output(task.taskId)).map((c) => [c.stream, c.text]),
      [
        [STDOUT, "hello from console.log\n"],
        [STDERR, "a warning on stderr\n"],
        [LOG, "step 1 of 2 done\nWARN careful\n"],
      ],
    );
    const failing = (await api.tasks.submitTask({ kind: "failing", maxAttempts: 1, ...tag })).task;
    const failed = await watch(api.tasks, failing.taskId);
    assert.equal(failed.state, TaskState.FAILED);
    assert.deepEqual(
      failed.error.outputTail.split("\n"),
      Array.from({ length: 20 }, (_, i) => `line ${i + 6}`),
    );
  } finally {
    await within(runner.stop(), 10_000, "the runner to stop");
    d.remove();
  }
});
