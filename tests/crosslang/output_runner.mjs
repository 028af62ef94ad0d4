// The Node runner with one handler, `conformance.output`, that writes the steps its task's payload
// carries (tests/conformance/output.json) the way Node programs write: `process.stdout.write`,
// `process.stderr.write` and `ctx.log`; then fails if the payload says so.
//
// `node output_runner.mjs SERVER_URL AGENT_DIR NAME`; stops on SIGTERM.
import { Runner, TaskFailure } from "../../clients/node/src/index.js";

const [server, dir, name] = process.argv.slice(2);
const runner = new Runner({ server, dir, name, capacity: 1 });
runner.handler("conformance.output", async (task, ctx) => {
  const input = task.payload;
  for (const step of input.steps) {
    if (step.stream === "stdout") process.stdout.write(step.text);
    else if (step.stream === "stderr") process.stderr.write(step.text);
    else ctx.log(step.text);
  }
  if (input.fail) throw new TaskFailure("the scenario fails", { code: "scenario" });
  return {};
});
await runner.run();
