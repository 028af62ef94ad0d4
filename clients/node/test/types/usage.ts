// Compiled with `tsc --noEmit` by test/types.test.js: the published types describe the API.
import {
  AgentDirectoryError,
  agentDir,
  defaultAgentName,
  Release,
  ReleaseCause,
  Runner,
  TaskFailure,
  type TaskContext,
  type TaskInput,
  type Withdrawal,
} from "@switchyard/runner";
import {
  advertise,
  checkKind,
  mergeTiers,
  redact,
  redactText,
  containsSecret,
  PATTERNS,
  diff,
  applyDiff,
  mergePacks,
  resolveParams,
} from "@switchyard/runner/core";

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
  })
  .pack({ id: "bot", handlers: { reply: async () => ({}) }, requires: ["ai.llm@1", "comm.gateway"] })
  .handler(
    "classify",
    async (task) => {
      if (!task.payload.text) throw new Release("no text", { cause: ReleaseCause.CANNOT_DECODE });
      throw new Release("at the model's rate limit");
    },
    { requires: ["ai.llm@1"] },
  );
const withdrawn: Withdrawal[] = runner.advertised.withdrawn;
const advertisedKinds: string[] = runner.advertised.kinds;
const busy: ReleaseCause = new Release("later").cause;
// @ts-expect-error DRAINING is the runner's own cause, not a handler's.
new Release("x", { cause: ReleaseCause.DRAINING });
const kindProblem: string | null = checkKind("build.docker");
const ad = advertise(mergePacks([{ id: "p", handlers: ["x"], requires: ["ai.llm@1"] }]), {});
runner.on("connected", ({ agentId, resumed }) => console.log(agentId, resumed.length));
const rejections: readonly { pack: string; kind: string }[] = runner.packRejections;
const stopped: Promise<void> = runner.stop();

const merged = mergeTiers([["base", { os: "linux" }], ["static", { tags: ["a"] }]]);
const paths: string[] = redact(merged.document);
const reason: string = redactText("connect postgres://app:hunter2@db/sy failed");
const secret: boolean = containsSecret(reason);
const shapes: number = PATTERNS.filter(([, group, check]) => group === 0 && !check).length;
const patch = diff(merged.document, { os: "darwin" });
const next = applyDiff(merged.document, 1n, 1n, patch);
const provides = resolveParams(mergePacks([{ id: "p" }]), () => undefined);
const defaultName: string = defaultAgentName("build-7", "node", agentDir("."));
const missingDir: string | undefined = new Error("x") instanceof AgentDirectoryError ? "dir" : undefined;
export { defaultName, missingDir, rejections, stopped, paths, reason, secret, shapes, next, provides, withdrawn, advertisedKinds, busy, kindProblem, ad };
