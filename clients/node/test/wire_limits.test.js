// What the server accepts at its limits, this runner decodes. The Rust test
// server/tests/api/wire_limits.rs (run first by scripts/test) drives a real server to every
// nesting limit and writes each message it sent to target/wire-limits/; here each one is
// decoded with protobuf-es at its default limits.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { fromBinary, toJson } from "@bufbuild/protobuf";
import { ConnectResponseSchema } from "../src/gen/switchyard/v1/agent_service_pb.js";
import {
  ExplainTaskResponseSchema,
  ListTasksResponseSchema,
  WatchTaskResponseSchema,
} from "../src/gen/switchyard/v1/task_service_pb.js";
import {
  GetAgentResponseSchema,
  SimulatePlacementResponseSchema,
} from "../src/gen/switchyard/v1/agent_admin_service_pb.js";

const corpus = join(resolve(dirname(fileURLToPath(import.meta.url)), "../../.."), "target", "wire-limits");
const schemas = {
  grant: ConnectResponseSchema,
  watch: WatchTaskResponseSchema,
  "task-page": ListTasksResponseSchema,
  explain: ExplainTaskResponseSchema,
  agent: GetAgentResponseSchema,
  simulation: SimulatePlacementResponseSchema,
};

const depth = (v) =>
  v !== null && typeof v === "object"
    ? 1 + Math.max(0, ...Object.values(v).map(depth))
    : 0;

let files = [];
try {
  files = readdirSync(corpus).filter((f) => f.endsWith(".binpb")).sort();
} catch {
  // Reported by the first test.
}

test("the corpus has every message of both stores", () => {
  assert.ok(files.length > 0, `no corpus in ${corpus}: run the Rust wire_limits test first`);
  for (const backend of ["sqlite", "postgres"]) {
    for (const kind of Object.keys(schemas)) {
      assert.ok(files.includes(`${backend}-${kind}.binpb`), `${backend}-${kind}`);
    }
  }
});

for (const file of files) {
  test(`${file} decodes with the default limits`, () => {
    const kind = file.replace(/\.binpb$/, "").split("-").slice(1).join("-");
    const message = fromBinary(schemas[kind], readFileSync(join(corpus, file)));
    const json = toJson(schemas[kind], message);
    assert.ok(depth(json) >= 32, `${file} is only ${depth(json)} deep`);
  });
}
