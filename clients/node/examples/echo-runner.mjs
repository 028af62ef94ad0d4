// A Switchyard runner that echoes payloads back: node examples/echo-runner.mjs
// Reads SWITCHYARD_SERVER (default http://127.0.0.1:50051) and the tier files in
// SWITCHYARD_AGENT_DIR (default .); Ctrl-C or SIGTERM drains and exits 0.
import { Runner } from "@switchyard/runner";

const runner = new Runner({ capacity: 4 });
runner.handler("echo", async (task, ctx) => {
  ctx.progress(50, "echoing");
  return { echoed: task.payload };
});
runner.on("connected", ({ agentId }) => console.log(`echo runner connected as ${agentId}`));
await runner.run();
