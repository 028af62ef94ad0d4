// The runner's capability document: base facts, the directory tiers (with broken, failing and
// hanging dynamic scripts), redaction, the CLI, and agreement with the Rust agent on a
// SheetBot-style directory.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { baseFacts, Capabilities, mergeDirectory, readDirectory } from "../src/index.js";
import { runnerDir } from "./helpers.js";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../../..");
const cli = join(here, "..", "src", "cli.js");
const fixture = join(here, "fixtures", "sheetbot");

function agentBinary() {
  const bin = process.env.SWITCHYARD_AGENT_BIN ?? join(repo, "target", "debug", "switchyard-agent");
  if (!existsSync(bin)) throw new Error(`${bin} not found: run \`cargo build -p switchyard-agent\` first`);
  return bin;
}

function lookup(doc, dotted) {
  return dotted.split(".").reduce((v, k) => (v !== null && typeof v === "object" ? v[k] : undefined), doc);
}

test("base facts are shaped like the Rust agent's", () => {
  const base = baseFacts();
  assert.equal(typeof base.os, "string");
  assert.equal(typeof base.arch, "string");
  assert.equal(typeof base.hostname, "string");
  assert.deepEqual(Object.keys(base.memory).sort(), ["available", "free", "total", "unit"]);
  assert.equal(base.memory.unit, "MB");
  assert.ok(Number.isInteger(base.memory.total) && base.memory.total > 0);
  assert.deepEqual(Object.keys(base.loadavg).sort(), ["15min", "1min", "5min"]);
  assert.deepEqual(base.tags, [base.os, base.arch]);
});

test("the CLI prints the merged, redacted document as JSON and nothing else", () => {
  const out = execFileSync(process.execPath, [cli, "capabilities", "--dir", fixture], {
    encoding: "utf8",
    timeout: 30_000,
  });
  const doc = JSON.parse(out);
  assert.equal(doc.hostname, "custom-agent-name");
  assert.equal(doc.github.token, "[redacted]");
  assert.equal(doc.llm.apiKey, "[redacted]");
  assert.equal(doc.llm.max_tokens, 4096);
  assert.equal(doc.licenseServer, "[redacted]");
  assert.equal(doc.db.dsn, "[redacted]");
  assert.equal(doc.session_cookie, "[redacted]");
  assert.equal(doc.remove_me, undefined);
  assert.deepEqual(doc.tags, ["sheetbot", "linux"]);
  assert.deepEqual(doc.packages, ["typescript", "node", "deno"]);
  assert.deepEqual(doc.detected, { from_static: "production", pool_doubled: 10 });
  assert.equal(doc.memory.total, 16384);

  const explained = JSON.parse(
    execFileSync(process.execPath, [cli, "capabilities", "--dir", fixture, "--explain"], { encoding: "utf8", timeout: 30_000 }),
  );
  assert.equal(explained.provenance.hostname, "override");
  assert.equal(explained.provenance.environment, "dynamic");
  assert.equal(explained.provenance["memory.free"], "base");
  assert.deepEqual(explained.rejections, []);

  const usage = spawnSync(process.execPath, [cli, "nope"], { encoding: "utf8", timeout: 30_000 });
  assert.equal(usage.status, 2);
  assert.equal(usage.stdout, "");
});

test("the Node runner and the Rust agent agree on every key not set by the base tier", () => {
  const node = JSON.parse(
    execFileSync(process.execPath, [cli, "capabilities", "--dir", fixture, "--explain"], { encoding: "utf8", timeout: 30_000 }),
  );
  const rust = JSON.parse(
    execFileSync(agentBinary(), ["--dir", fixture, "capabilities"], { encoding: "utf8", timeout: 60_000 }),
  );
  const nonBase = Object.entries(node.provenance).filter(([, tier]) => tier !== "base");
  assert.ok(nonBase.length >= 15, `only ${nonBase.length} non-base leaves`);
  for (const [path] of nonBase) {
    assert.deepEqual(lookup(node.document, path), lookup(rust, path), `value at ${path}`);
  }
  // Keys the tiers delete are gone from both.
  assert.equal(rust.remove_me, undefined);
  assert.equal(node.document.remove_me, undefined);
});

test("a dynamic script that throws, hangs, prints no object or is not valid is a rejection, never a crash", async () => {
  const cases = [
    ["mjs", "export async function getCapabilities() { throw new Error('boom'); }", /failed/],
    ["mjs", "export function getCapabilities() { setInterval(() => {}, 1000); return new Promise(() => {}); }", /timed out/],
    ["js", "export function getCapabilities() { return [1, 2]; }", /not an object/],
    ["mjs", "export const nothing = 1;", /failed/],
    ["mjs", "this is not javascript", /failed/],
  ];
  for (const [ext, source, reason] of cases) {
    const d = runnerDir({
      ".capabilities.json": { tags: ["kept"] },
      [`.capabilities.dynamic.${ext}`]: source,
      ".capabilities.override.json": { also: "kept" },
    });
    try {
      const started = Date.now();
      const tiers = await readDirectory(d.dir, 1_000);
      assert.ok(Date.now() - started < 10_000);
      assert.equal(tiers.rejections.length, 1, source);
      assert.equal(tiers.rejections[0].tier, "dynamic");
      assert.match(tiers.rejections[0].reason, reason, source);
      const merged = mergeDirectory(baseFacts(), tiers);
      assert.deepEqual(merged.document.tags, ["kept"]);
      assert.equal(merged.document.also, "kept");
      assert.equal(merged.rejections[0].tier, "dynamic");
    } finally {
      d.remove();
    }
  }
});

test("invalid tier files are rejected and the rest applies; base tags stay unless a tier sets tags", async () => {
  const d = runnerDir({
    ".capabilities.json": "{ not json",
    ".capabilities.override.json": ["not", "an", "object"],
  });
  try {
    const caps = await new Capabilities({ dir: d.dir }).load();
    assert.deepEqual(
      caps.merged.rejections.map((r) => [r.tier, r.path]),
      [
        ["static", ""],
        ["override", ""],
      ],
    );
    // The detected tags: OS and architecture first, then what the probes found.
    assert.deepEqual(caps.document.tags, caps.detected.tags);
    assert.deepEqual(caps.document.tags.slice(0, 2), [caps.document.os, caps.document.arch]);
    assert.equal(caps.merged.provenance.get("tags"), "base");
  } finally {
    d.remove();
  }
});

test("refresh notices edited tier files", async () => {
  const d = runnerDir({ ".capabilities.json": { level: 1 } });
  try {
    const caps = await new Capabilities({ dir: d.dir }).load();
    assert.equal(caps.document.level, 1);
    const { writeFileSync } = await import("node:fs");
    writeFileSync(join(d.dir, ".capabilities.override.json"), JSON.stringify({ level: 2 }));
    assert.equal(await caps.refresh(), true);
    assert.equal(caps.document.level, 2);
    assert.equal(caps.merged.provenance.get("level"), "override");
  } finally {
    d.remove();
  }
});
