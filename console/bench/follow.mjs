// Holds the console's two live streams open, without a browser (a benchmark,
// not a test): WatchAgents and WatchQueue over gRPC-Web on the console's
// port, as the fleet and queue pages do, for --hold seconds; prints how many
// messages each sent. Separates what open pages cost the server from what
// the browser drawing them costs the machine.
//
//   node console/bench/follow.mjs --console http://127.0.0.1:8080 [--token T] [--hold 30] [--wait-agents N]
import { parseArgs } from "node:util";
import { createClient } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { TaskService } from "../../clients/node/src/gen/switchyard/v1/task_service_pb.js";
import { AgentAdminService } from "../../clients/node/src/gen/switchyard/v1/agent_admin_service_pb.js";

const { values } = parseArgs({
  options: {
    console: { type: "string" },
    token: { type: "string", default: "" },
    hold: { type: "string", default: "30" },
    "wait-agents": { type: "string", default: "0" },
  },
});
const transport = createGrpcWebTransport({
  baseUrl: values.console.replace(/\/$/, ""),
  interceptors: [(next) => (req) => {
    if (values.token) req.header.set("authorization", `Bearer ${values.token}`);
    return next(req);
  }],
});
const tasks = createClient(TaskService, transport);
const admin = createClient(AgentAdminService, transport);
const abort = new AbortController();
const counts = { agents_messages: 0, queue_messages: 0 };
let agents = 0;
let synced;
const wanted = Number(values["wait-agents"]);
const started = new Promise((resolve) => (synced = resolve));
const follow = async (open, onMessage) => {
  for (;;) {
    try {
      for await (const m of open()) onMessage(m);
      return;
    } catch (err) {
      if (abort.signal.aborted) return;
      await new Promise((r) => setTimeout(r, 300));
    }
  }
};
const fleet = follow(
  () => admin.watchAgents({}, { signal: abort.signal }),
  (m) => {
    counts.agents_messages++;
    agents += m.agents.length;
    if (agents >= wanted) synced();
  },
);
await started;
const queue = follow(() => tasks.watchQueue({}, { signal: abort.signal }), () => counts.queue_messages++);
await new Promise((r) => setTimeout(r, Number(values.hold) * 1000));
abort.abort();
await Promise.allSettled([fleet, queue]);
console.log(JSON.stringify(counts));
