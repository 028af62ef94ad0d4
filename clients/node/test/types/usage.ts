// Compiled with `tsc --noEmit` by test/types.test.js: the published types describe the API.
import { Runner, TaskFailure, type TaskContext, type TaskInput } from "@switchyard/runner";
import { mergeTiers, redact, diff, applyDiff, mergePacks, resolveParams } from "@switchyard/runner/core";

const runner = new Runner({ server: "http://127.0.0.1:50051", dir: ".", capacity: 2, params: { API_KEY: "x" } });
runner
  .handler("echo", async (task: TaskInput, ctx: TaskContext) => {
    ctx.progress(10, "start");
    if (ctx.signal.aborted) throw new TaskFailure("stopped", { code: "aborted", retryable: false });
    return { echoed: task.payload };
  })
  .pack({
    id: "ai",
    handlers: { summarize: async () => ({ ok: true }) },
    provides: { "ai.llm": { version: "1.0.0", params: { API_KEY: { default: null, sensitive: true } } } },
  });
runner.on("connected", ({ agentId, resumed }) => console.log(agentId, resumed.length));
const rejections: readonly { pack: string; kind: string }[] = runner.packRejections;
const stopped: Promise<void> = runner.stop();

const merged = mergeTiers([["base", { os: "linux" }], ["static", { tags: ["a"] }]]);
const paths: string[] = redact(merged.document);
const patch = diff(merged.document, { os: "darwin" });
const next = applyDiff(merged.document, 1n, 1n, patch);
const provides = resolveParams(mergePacks([{ id: "p" }]), () => undefined);
export { rejections, stopped, paths, next, provides };
