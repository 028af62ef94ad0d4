// Detection as the Rust agent does it, held to the shared vectors (tests/conformance/detect.json):
// the tool list, version parsing, software entries, /etc/os-release, nvidia-smi rows, the resources
// offered and the derived tags; and a real probe of this machine finds the Node running the tests.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import {
  TOOLS,
  archName,
  baseFacts,
  detectedResources,
  detectedTags,
  osName,
  osRelease,
  parseNvidiaSmi,
  probedFacts,
  softwareEntry,
  versionIn,
} from "../src/base.js";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const vectors = JSON.parse(readFileSync(resolve(repo, "tests/conformance/detect.json"), "utf8"));

describe("detect.json", () => {
  test("the tool list is the Rust agent's", () => assert.deepEqual(TOOLS, vectors.tools));
  test("versions in tool output", () => {
    for (const c of vectors.version_in) assert.equal(versionIn(c.output) ?? null, c.version, c.output);
  });
  test("software entries", () => {
    for (const c of vectors.software_entry) assert.deepEqual(softwareEntry(c.version), c.expected, c.version);
  });
  test("os-release", () => {
    for (const c of vectors.os_release) assert.deepEqual(osRelease(c.text), c.expected, c.text);
  });
  test("nvidia-smi rows", () => {
    for (const c of vectors.nvidia_smi) assert.deepEqual(parseNvidiaSmi(c.output), c.expected, c.output);
  });
  test("resources", () => {
    for (const c of vectors.resources) {
      assert.deepEqual(detectedResources(c.cpu_count, c.memory_total_mb, c.gpus), c.expected);
    }
  });
  test("tags", () => {
    for (const c of vectors.tags) {
      const software = Object.fromEntries(c.software.map((s) => [s, {}]));
      assert.deepEqual(detectedTags(c.os, c.arch, software, c.gpus), c.expected);
    }
  });
});

test("the probes find the tools that answer", async () => {
  const found = await probedFacts(10_000);
  assert.equal(found.software.node.major_version, Number(process.versions.node.split(".")[0]));
  assert.deepEqual(found.tags.slice(0, 2), [osName(), archName()]);
  assert.equal("gpus" in found, found.tags.includes("gpu"));
  assert.ok(found.resources.cpu_millicores >= 1000);
  assert.equal(found.resources.gpus.length, (found.gpus ?? []).length);
  const base = baseFacts();
  assert.ok(base.cpu.count >= 1);
  assert.equal(base.os_release.version.length > 0, true);
});
