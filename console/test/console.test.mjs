// The web console in a real browser (Debian's Chromium, driven by
// playwright-core) against a real server (SQLite, tokens, the console on an
// ephemeral port) and real agents (the Node runner): the fleet page shows
// an agent that connects while it is open; a parked task's group and its
// reason appear on the queue page, then go when an agent that fits
// connects and runs it; an operator drains an agent from its page; a
// submitter's token sees the queue but not the agents; a task's page shows
// its timeline and the output its runner sent; the fleet and queue pages'
// first stream is the one early.js started (asked once). Each page is saved
// as a screenshot in $CONSOLE_SCREENSHOTS (default target/console-screenshots).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { once } from "node:events";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { TaskService } from "../../clients/node/src/gen/switchyard/v1/task_service_pb.js";
import { AgentAdminService } from "../../clients/node/src/gen/switchyard/v1/agent_admin_service_pb.js";
import { Runner } from "../../clients/node/src/index.js";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const shots = process.env.CONSOLE_SCREENSHOTS ?? join(repo, "target", "console-screenshots");
const TOKENS = { operator: "op-console-test-token", submitter: "sub-console-test-token", agent: "agent-console-test-token" };
/** How long a test waits for what the page should show (a bound, never a measurement). */
const SHOWN = 15_000;

let server;
let browser;
let grpc;
const cleanup = [];

function serverBinary() {
  const bin = process.env.SWITCHYARD_SERVER_BIN ?? join(repo, "target", "debug", "switchyard-server");
  assert.ok(existsSync(bin), `${bin} not found: run \`cargo build -p switchyard-server\` first`);
  return bin;
}

/** Starts the server with tokens and the console; resolves to its gRPC and console addresses. */
async function startServer() {
  const dir = mkdtempSync(join(tmpdir(), "switchyard-console-"));
  const tokensFile = join(dir, "tokens.json");
  writeFileSync(
    tokensFile,
    JSON.stringify(
      Object.entries(TOKENS).map(([role, token]) => ({ name: `${role}-test`, namespace: "default", role, token })),
    ),
  );
  const child = spawn(
    serverBinary(),
    [
      "--listen", "127.0.0.1:0",
      "--console-listen", "127.0.0.1:0",
      "--database-url", `sqlite://${dir}/switchyard.db`,
      "--tokens-file", tokensFile,
      "--heartbeat-interval-ms", "200",
      "--sweep-interval-ms", "100",
    ],
    { stdio: ["ignore", "pipe", process.env.TEST_LOG ? "inherit" : "ignore"] },
  );
  const lines = createInterface({ input: child.stdout });
  const found = {};
  await new Promise((resolveFound, reject) => {
    child.once("exit", (code) => reject(new Error(`server exited early with ${code}`)));
    lines.on("line", (line) => {
      const grpcAddr = /listening on (\S+)/.exec(line);
      const consoleAddr = /console on (\S+)/.exec(line);
      if (grpcAddr) found.address = grpcAddr[1];
      if (consoleAddr) found.console = consoleAddr[1].replace(/\/$/, "");
      if (found.address && found.console) resolveFound();
    });
  });
  return {
    ...found,
    async stop() {
      lines.close();
      if (child.exitCode === null) {
        const exited = once(child, "exit");
        child.kill("SIGTERM");
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** gRPC clients (not the browser) with a role's token. */
function clients(address, role) {
  const transport = createGrpcTransport({
    baseUrl: `http://${address}`,
    interceptors: [(next) => (req) => {
      req.header.set("authorization", `Bearer ${TOKENS[role]}`);
      return next(req);
    }],
  });
  return { tasks: createClient(TaskService, transport), admin: createClient(AgentAdminService, transport) };
}

let counter = 0;

/** A Node runner with the given tags and handled kinds, connected; stopped after the tests. */
async function startRunner(name, { tags = [], kinds = ["echo"], onTask = async () => ({ ok: true }) } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "switchyard-console-runner-"));
  writeFileSync(join(dir, ".capabilities.json"), JSON.stringify({ tags }));
  const runner = new Runner({
    server: `http://${server.address}`,
    token: TOKENS.agent,
    dir,
    name: `${name}-${process.pid}-${++counter}`,
    capacity: 2,
    refreshMs: 60_000,
    graceMs: 1_000,
    backoff: { initialMs: 100, maxMs: 500 },
    logger: { debug() {}, info() {}, warn() {}, error() {} },
  });
  for (const kind of kinds) runner.handler(kind, onTask);
  const connected = once(runner, "connected");
  runner.run({ handleSignals: false }).catch(() => {});
  await connected;
  const stop = async () => {
    await runner.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  cleanup.push(stop);
  return { runner, stop };
}

/** A page whose session holds `role`'s token. */
async function pageAs(role) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  await context.addInitScript((token) => sessionStorage.setItem("switchyard.token", token), TOKENS[role]);
  const page = await context.newPage();
  cleanup.push(() => context.close());
  return page;
}

async function shoot(page, name) {
  mkdirSync(shots, { recursive: true });
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

before(async () => {
  server = await startServer();
  grpc = { operator: clients(server.address, "operator"), submitter: clients(server.address, "submitter") };
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu"],
  });
});

after(async () => {
  for (const fn of cleanup.reverse()) await fn().catch(() => {});
  await browser?.close();
  await server?.stop();
});

test("the fleet page shows an agent that connects while it is open, live", async () => {
  const page = await pageAs("operator");
  await page.goto(`${server.console}/`);
  await page.getByTestId("fleet-summary").filter({ hasText: "agents" }).waitFor({ timeout: SHOWN });
  const { runner } = await startRunner("fleet-live");
  const { agents } = await grpc.operator.admin.listAgents({ pageSize: 1000 });
  const name = agents.find((a) => a.agentId === runner.agentId)?.name;
  assert.ok(name, "the runner's agent is registered");
  const row = page.locator(`tr[data-agent="${name}"]`);
  await row.waitFor({ timeout: SHOWN });
  assert.match(await row.innerText(), /ready/);
  await shoot(page, "fleet");
  // A selector narrows the list on the server: this agent lacks the tag.
  await page.locator('input[name="selector"]').fill("no-such-tag");
  await page.getByRole("button", { name: "filter" }).click();
  await row.waitFor({ state: "detached", timeout: SHOWN });
  await page.getByTestId("fleet-summary").filter({ hasText: "0 agents" }).waitFor({ timeout: SHOWN });
});

test("a parked task's group and reason appear on the queue page, and go once an agent that fits runs it", async () => {
  const page = await pageAs("operator");
  await page.goto(`${server.console}/queue`);
  await page.getByTestId("no-groups").waitFor({ timeout: SHOWN });
  const { task } = await grpc.submitter.tasks.submitTask({
    kind: "render",
    placement: { requiredTags: ["gpu-console"] },
  });
  const group = page.locator('[data-testid="queue-group"][data-reason="parked"]').filter({ hasText: "render" });
  await group.waitFor({ timeout: SHOWN });
  // No agent so far can take it (those of other tests handle other kinds).
  assert.match(await group.innerText(), /0\/\d+ agents eligible/);
  assert.match(await group.innerText(), /0 capable, 0 with room/);
  await shoot(page, "queue");

  await startRunner("gpu", {
    tags: ["gpu-console"],
    kinds: ["render"],
    onTask: async (input, ctx) => {
      console.log("rendering frame 1 of 1");
      ctx.log.warn("low on VRAM");
      return { frames: 1 };
    },
  });
  await page.getByTestId("no-groups").waitFor({ timeout: SHOWN });
  const { task: done } = await grpc.submitter.tasks.getTask({ taskId: task.taskId });
  assert.ok(done.state >= 2, `the task was leased (state ${done.state})`);

  // Its page: the timeline and the final state.
  await page.goto(`${server.console}/tasks/${task.taskId}`);
  await page.getByTestId("task-state").filter({ hasText: "succeeded" }).waitFor({ timeout: SHOWN });
  assert.match(await page.getByTestId("timeline").innerText(), /leased/);
  // Its output, as the runner sent it.
  const output = page.getByTestId("output");
  await output.filter({ hasText: "low on VRAM" }).waitFor({ timeout: SHOWN });
  assert.match(await output.innerText(), /rendering frame 1 of 1/);
  await shoot(page, "task");
});

test("an operator drains an agent from its page", async () => {
  const { runner } = await startRunner("drain-me");
  const { agents } = await grpc.operator.admin.listAgents({ pageSize: 1000 });
  const agent = agents.find((a) => a.name.startsWith("drain-me"));
  assert.ok(agent, "the agent is registered");
  const page = await pageAs("operator");
  await page.goto(`${server.console}/agents/${agent.agentId}`);
  await page.getByTestId("agent-status").filter({ hasText: "ready" }).waitFor({ timeout: SHOWN });
  await page.getByTestId("document").locator('[data-path="tags"]').waitFor({ timeout: SHOWN });
  await shoot(page, "agent");
  await page.getByPlaceholder("why (shown as its status reason)").fill("maintenance from the test");
  await page.getByRole("button", { name: "drain" }).click();
  await page.getByTestId("agent-status").filter({ hasText: "draining" }).waitFor({ timeout: SHOWN });
  const { agent: after } = await grpc.operator.admin.getAgent({ agentId: agent.agentId });
  assert.equal(after.drained, true);
  assert.ok(after.statusReasons.some((r) => r.includes("maintenance from the test")), after.statusReasons.join("; "));
  void runner;
});

test("the what-if form says which agents would take a selector and why the others would not", async () => {
  await startRunner("whatif-linux", { tags: ["whatif-a"] });
  const page = await pageAs("operator");
  await page.goto(`${server.console}/what-if`);
  await page.locator('input[name="selector"]').fill("whatif-a");
  await page.getByRole("button", { name: "ask" }).click();
  const summary = page.getByTestId("whatif-summary");
  await Promise.race([
    summary.waitFor({ timeout: SHOWN }),
    page.getByRole("alert").waitFor({ timeout: SHOWN }).then(async () => {
      throw new Error(`the page says: ${await page.getByRole("alert").innerText()}`);
    }),
  ]);
  assert.match(await summary.innerText(), /eligible/);
  assert.match(await page.locator("table").innerText(), /missing tag whatif-a/);
  await shoot(page, "what-if");
});

test("a submitter's token sees the queue but not the agents", async () => {
  const page = await pageAs("submitter");
  await page.goto(`${server.console}/`);
  const alert = page.getByRole("alert");
  await alert.waitFor({ timeout: SHOWN });
  assert.match(await alert.innerText(), /Not allowed/);
  assert.equal(await page.locator("tr[data-agent]").count(), 0);
  await shoot(page, "fleet-as-submitter");

  const { agents } = await grpc.operator.admin.listAgents({ pageSize: 1 });
  await page.goto(`${server.console}/agents/${agents[0].agentId}`);
  await page.getByRole("alert").first().waitFor({ timeout: SHOWN });
  assert.equal(await page.getByTestId("document").count(), 0);

  await page.goto(`${server.console}/queue`);
  await page.getByTestId("queue-counts").waitFor({ timeout: SHOWN });
  assert.equal(await page.getByRole("alert").count(), 0);
});

test("without a token the page asks for one and shows nothing", async () => {
  const context = await browser.newContext();
  cleanup.push(() => context.close());
  const page = await context.newPage();
  await page.goto(`${server.console}/queue`);
  const alert = page.getByRole("alert");
  await alert.waitFor({ timeout: SHOWN });
  assert.match(await alert.innerText(), /No valid token/);
  assert.equal(await page.getByTestId("queue-counts").count(), 0);
});

test("the page's first stream is the one early.js started before the script loaded, with this tab's namespace and token", async () => {
  for (const [path, method, shown] of [
    ["/queue", "/switchyard.v1.TaskService/WatchQueue", "queue-counts"],
    ["/", "/switchyard.v1.AgentAdminService/WatchAgents", "fleet-summary"],
  ]) {
    const page = await pageAs("operator");
    const asked = [];
    page.on("request", (r) => {
      if (r.url().endsWith(method)) asked.push(r.postDataBuffer());
    });
    await page.goto(`${server.console}${path}`);
    await page.getByTestId(shown).waitFor({ timeout: SHOWN });
    assert.equal(await page.evaluate(() => window.__switchyardEarly?.handedOver), true, path);
    // Asked once: the page took the early stream over instead of asking again.
    assert.equal(asked.length, 1, `${method} asked ${asked.length} times on ${path}`);
    assert.equal(await page.getByRole("alert").count(), 0);

    // A namespace chosen in this tab reaches the early request too: this
    // token's namespace is "default", so the server refuses "elsewhere".
    await page.locator('input[name="namespace"]').fill("elsewhere");
    await page.getByRole("button", { name: "use" }).click();
    asked.length = 0;
    await page.reload();
    const alert = page.getByRole("alert");
    await alert.waitFor({ timeout: SHOWN });
    assert.match(await alert.innerText(), /Not allowed/);
    assert.equal(await page.evaluate(() => window.__switchyardEarly?.handedOver), true, `${path} after the reload`);
    // (The page asks again after the refusal, so count only what was asked.)
    assert.ok(asked.length >= 1 && asked.every((body) => body.includes(Buffer.from("elsewhere"))), "every request names the tab's namespace");
  }
});
