// How long the console's two live streams take to say something, over the
// wire alone (a benchmark, not a test): WatchAgents to its first message and
// to the whole first listing (`synced`), WatchQueue to its first summary and
// to its first explained one, each opened anew --runs times over gRPC-Web on
// the console's port. Separates what the server takes from what a browser
// adds (console/bench/measure.mjs).
//
//   node console/bench/first.mjs --console http://127.0.0.1:8080 [--token T] [--runs 3]
//
// Prints one JSON object (milliseconds).
import { parseArgs } from "node:util";
import { createClient } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { TaskService } from "../../clients/node/src/gen/switchyard/v1/task_service_pb.js";
import { AgentAdminService } from "../../clients/node/src/gen/switchyard/v1/agent_admin_service_pb.js";

const { values } = parseArgs({
  options: {
    console: { type: "string" },
    token: { type: "string", default: "" },
    runs: { type: "string", default: "3" },
  },
});
if (!values.console) throw new Error("--console URL is required");
const transport = createGrpcWebTransport({
  baseUrl: values.console.replace(/\/$/, ""),
  interceptors: [
    (next) => async (req) => {
      if (values.token) req.header.set("authorization", `Bearer ${values.token}`);
      return next(req);
    },
  ],
});
const tasks = createClient(TaskService, transport);
const admin = createClient(AgentAdminService, transport);

const result = { agents_first_ms: [], agents_synced_ms: [], queue_first_ms: [], queue_explained_ms: [] };
for (let i = 0; i < Number(values.runs); i++) {
  let abort = new AbortController();
  let start = performance.now();
  let agents = 0;
  for await (const m of admin.watchAgents({ namespace: "default" }, { signal: abort.signal })) {
    if (agents === 0) result.agents_first_ms.push(Math.round(performance.now() - start));
    agents += m.agents.length;
    if (m.synced) break;
  }
  result.agents_synced_ms.push(Math.round(performance.now() - start));
  result.agents = agents;
  abort.abort();
  abort = new AbortController();
  start = performance.now();
  let first = true;
  for await (const m of tasks.watchQueue({ namespace: "default" }, { signal: abort.signal })) {
    if (first) result.queue_first_ms.push(Math.round(performance.now() - start));
    first = false;
    if (m.summary?.explained) break;
  }
  result.queue_explained_ms.push(Math.round(performance.now() - start));
  abort.abort();
  // Apart, as one person opening pages one after another would be.
  await new Promise((r) => setTimeout(r, 3000));
}
console.log(JSON.stringify(result));
