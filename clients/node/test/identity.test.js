// Who a runner is: its agent directory, canonical from the moment the runner or its
// capabilities are made (relative paths, symlinks, missing directories, the CLI), its default
// name (`{hostname}-node-{h}`, checked against tests/conformance/naming.json), two runners on one
// host registering as two agents, and every dynamic-script kind the Rust agent runs.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, realpathSync, symlinkSync, writeFileSync } from "node:fs";
import { hostname } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { AgentStatus } from "../src/gen/switchyard/v1/agent_pb.js";
import { AgentDirectoryError, agentDir, Capabilities, defaultAgentName, readDirectory, Runner } from "../src/index.js";
import { startServer } from "./server.js";
import { clients, FAST, poll, runnerDir, startRunner, within } from "./helpers.js";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../../..");
const cli = join(here, "..", "src", "cli.js");
const vectors = JSON.parse(readFileSync(join(repo, "tests", "conformance", "naming.json"), "utf8"));

const SCRIPT = "export function getCapabilities(s) { return { from_script: s.tier ?? 'none' }; }\n";

/** `agents/a` under a fresh directory, with a static tier and a dynamic script that reads it. */
function agentTree() {
  const root = runnerDir();
  const agent = join(root.dir, "agents", "a");
  mkdirSync(agent, { recursive: true });
  writeFileSync(join(agent, ".capabilities.json"), JSON.stringify({ tier: "static" }));
  writeFileSync(join(agent, ".capabilities.dynamic.mjs"), SCRIPT);
  return { root: root.dir, agent, remove: root.remove };
}

test("default names match the conformance vectors", () => {
  assert.ok(vectors.length >= 4);
  for (const v of vectors) assert.equal(defaultAgentName(v.hostname, v.runner, v.dir), v.name, v.name);
});

test("a missing directory or a file is an error naming it, from the runner, its capabilities and the env", () => {
  const t = agentTree();
  try {
    const missing = join(t.root, "nope");
    const file = join(t.agent, ".capabilities.json");
    assert.throws(() => new Runner({ dir: missing }), {
      name: "AgentDirectoryError",
      message: `agent directory ${missing}: No such file or directory`,
    });
    assert.throws(() => new Capabilities({ dir: file }), new AgentDirectoryError(file, "not a directory"));
    process.env.SWITCHYARD_AGENT_DIR = missing;
    try {
      assert.throws(() => new Runner(), AgentDirectoryError);
    } finally {
      delete process.env.SWITCHYARD_AGENT_DIR;
    }
  } finally {
    t.remove();
  }
});

test("a relative or symlinked directory is made canonical once, and its dynamic script runs", async () => {
  const t = agentTree();
  try {
    const link = join(t.root, "link");
    symlinkSync(t.agent, link);
    const real = realpathSync(t.agent);
    const rel = relative(process.cwd(), t.agent);
    assert.ok(!rel.startsWith("/"));
    assert.equal(agentDir(rel), real);
    assert.equal(new Runner({ dir: link }).dir, real);
    for (const dir of [rel, relative(process.cwd(), link)]) {
      const caps = await new Capabilities({ dir }).load();
      assert.equal(caps.dir, real);
      assert.deepEqual(caps.merged.rejections, []);
      assert.equal(caps.document.from_script, "static");
      assert.equal(caps.merged.provenance.get("from_script"), "dynamic");
    }
  } finally {
    t.remove();
  }
});

test("the CLI takes a relative directory and refuses a missing one with exit status 2", () => {
  const t = agentTree();
  try {
    const ok = spawnSync(process.execPath, [cli, "capabilities", "--dir", "agents/a"], {
      cwd: t.root,
      encoding: "utf8",
      timeout: 30_000,
    });
    assert.equal(ok.status, 0, ok.stderr);
    assert.equal(JSON.parse(ok.stdout).from_script, "static");
    const missing = spawnSync(process.execPath, [cli, "capabilities", "--dir", "agents/missing"], {
      cwd: t.root,
      encoding: "utf8",
      timeout: 30_000,
    });
    assert.equal(missing.status, 2);
    assert.equal(missing.stdout, "");
    assert.equal(missing.stderr, "switchyard-node: agent directory agents/missing: No such file or directory\n");
  } finally {
    t.remove();
  }
});

test("the default name is the host, the runner and the directory; a given name wins", async () => {
  const t = agentTree();
  try {
    const runner = new Runner({ dir: t.agent });
    assert.equal(runner.name, defaultAgentName(hostname(), "node", realpathSync(t.agent)));
    assert.match(runner.name, /-node-[0-9a-f]{6}$/);
    assert.equal(new Runner({ dir: t.agent, name: "explicit" }).name, "explicit");
    // A tier that sets the hostname names the agent, as in the Rust agent and the Python runner.
    writeFileSync(join(t.agent, ".capabilities.override.json"), JSON.stringify({ hostname: "tier-host" }));
    const renamed = new Runner({ dir: t.agent });
    await renamed.capabilities();
    assert.equal(renamed.name, defaultAgentName("tier-host", "node", realpathSync(t.agent)));
    process.env.SWITCHYARD_AGENT_NAME = "from-env";
    try {
      assert.equal(new Runner({ dir: t.agent }).name, "from-env");
    } finally {
      delete process.env.SWITCHYARD_AGENT_NAME;
    }
  } finally {
    t.remove();
  }
});

// One script per kind the Rust agent runs (agent-rs/src/tiers.rs), each logging first and
// returning the static tier it was handed.
const SCRIPTS = {
  sh: 'getCapabilities() {\n  echo "probing..."\n  printf \'{"lang": "sh", "static": %s}\\n\' "$1"\n}\n',
  py: "def getCapabilities(static):\n    print('probing...')\n    return {'lang': 'py', 'static': static}\n",
  mjs: "export async function getCapabilities(s) {\n  console.log('probing...');\n  return { lang: 'mjs', static: s };\n}\n",
  js: "exports.getCapabilities = async (s) => ({ lang: 'js', static: s });\n",
};

test("every dynamic-script kind the Rust agent runs is run, and the first in its order wins", async () => {
  for (const [ext, source] of Object.entries(SCRIPTS)) {
    const d = runnerDir({ ".capabilities.json": { a: 1, name: "ünï" }, [`.capabilities.dynamic.${ext}`]: source });
    try {
      const tiers = await readDirectory(d.dir, 10_000);
      assert.deepEqual(tiers.rejections, [], ext);
      assert.deepEqual(tiers.dynamic, { lang: ext, static: { a: 1, name: "ünï" } }, ext);
    } finally {
      d.remove();
    }
  }
  const both = runnerDir({ ".capabilities.dynamic.py": SCRIPTS.py, ".capabilities.dynamic.sh": SCRIPTS.sh });
  try {
    assert.equal((await readDirectory(both.dir)).dynamic.lang, "sh");
  } finally {
    both.remove();
  }
});

test("a TypeScript script runs under deno, or is a rejection naming it", async () => {
  const d = runnerDir({ ".capabilities.dynamic.ts": "export function getCapabilities(s: object) { return { lang: 'ts' }; }\n" });
  try {
    const tiers = await readDirectory(d.dir, 10_000);
    const deno = spawnSync("deno", ["--version"]).status === 0;
    if (deno) assert.equal(tiers.dynamic.lang, "ts");
    else {
      assert.deepEqual(tiers.rejections, [
        { tier: "dynamic", path: "", reason: ".capabilities.dynamic.ts needs deno, which is not installed (not on PATH)" },
      ]);
    }
  } finally {
    d.remove();
  }
});

test("a hanging shell script is killed with what it started", async () => {
  const d = runnerDir();
  try {
    const pidFile = join(d.dir, "sleep.pid");
    writeFileSync(
      join(d.dir, ".capabilities.dynamic.sh"),
      `getCapabilities() {\n  sleep 60 &\n  echo $! > "${pidFile}"\n  wait\n}\n`,
    );
    const started = Date.now();
    const tiers = await readDirectory(d.dir, 500);
    assert.ok(Date.now() - started < 10_000);
    assert.match(tiers.rejections[0].reason, /timed out/);
    const pid = Number(readFileSync(pidFile, "utf8"));
    // Nothing to await: the orphaned child is reaped by init, seen only in /proc.
    const state = () => {
      try {
        return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ").pop()[0];
      } catch {
        return null;
      }
    };
    const last = await poll(state, (s) => s === null || s === "Z", 5_000, 20);
    assert.ok(last === null || last === "Z", "the script's child outlived it");
  } finally {
    d.remove();
  }
});

let server;
before(async () => {
  server = await startServer({ args: FAST });
});
after(async () => {
  await server?.stop();
});

test("two runners on one host, in two directories, are two agents", async () => {
  const dirs = [runnerDir(), runnerDir()];
  const started = [];
  try {
    for (const d of dirs) started.push(await startRunner(server.address, d.dir, () => {}, { name: undefined }));
    const names = dirs.map((d) => defaultAgentName(hostname(), "node", realpathSync(d.dir)));
    assert.deepEqual(
      started.map((s) => s.runner.name),
      names,
    );
    const { admin } = clients(server.address);
    const ready = (r) => r.agents.filter((a) => names.includes(a.name) && a.status === AgentStatus.READY);
    const listed = await poll(() => admin.listAgents({}), (r) => ready(r).length === 2, 5_000);
    assert.equal(ready(listed).length, 2, JSON.stringify(listed.agents.map((a) => [a.name, a.status])));
    assert.notEqual(started[0].runner.agentId, started[1].runner.agentId);
  } finally {
    for (const s of started) await within(s.runner.stop(), 10_000, "the runner to stop");
    for (const d of dirs) d.remove();
  }
});
