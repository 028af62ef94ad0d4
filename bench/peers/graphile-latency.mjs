// graphile-worker 0.17.3 push latency: from just before `addJob` is called to
// the moment the task function starts running in the worker.
// Usage: node bench/peers/graphile-latency.mjs postgres://postgres@127.0.0.1:5432/DB [--jobs N] [--rate R]
// Defaults: --jobs 2000, --rate 50 (jobs/s). 50 warm-up jobs run first and are not counted.
// Prints one JSON line: {"system", "jobs", "rate_target", "rate_achieved",
// "p50_ms", "p90_ms", "p99_ms", "max_ms", "seconds", ...}.
// The worker is graphile-worker's defaults: `run()` with nothing tuned
// (concurrency 1, 2 s poll, woken by LISTEN "jobs:insert"). Jobs are added one
// at a time, each awaited, through `makeWorkerUtils` (its own pg pool), paced
// to the target rate; if an `addJob` round trip is longer than the interval
// the next one starts at once, so the achieved rate can fall short of the
// target. Producer and worker share this process (and its event loop) so both
// timestamps come from the same `process.hrtime.bigint()` clock; the start
// time travels in the job payload.
import { Logger, run, runMigrations, makeWorkerUtils } from "graphile-worker";

const args = process.argv.slice(2);
const url = args[0];
const flag = (name, fallback) => {
  const i = args.indexOf(name);
  return i === -1 ? fallback : Number(args[i + 1]);
};
const jobs = flag("--jobs", 2000);
const rate = flag("--rate", 50);
const warmup = 50;
if (!url || !(jobs > 0) || !(rate > 0)) {
  console.error("Usage: node graphile-latency.mjs DATABASE_URL [--jobs N] [--rate R]");
  process.exit(2);
}
// Per-job INFO lines would cost more than the no-op jobs; keep warnings and errors.
const quiet = new Logger(() => (level, message) => { if (level === "error" || level === "warning") console.error(message); });

await runMigrations({ connectionString: url, logger: quiet });

// latencies[i] for measured job i (ns); warm-up jobs only count as seen.
const latencies = new Array(jobs);
let measuredSeen = 0;
let warmupSeen = 0;
const runner = await run({
  connectionString: url,
  noHandleSignals: true,
  logger: quiet,
  taskList: {
    noop: async (payload) => {
      const now = process.hrtime.bigint();
      if (payload.w) { warmupSeen += 1; return; }
      latencies[payload.i] = now - BigInt(payload.t);
      measuredSeen += 1;
    },
  },
});

const utils = await makeWorkerUtils({ connectionString: url, logger: quiet });
const intervalNs = BigInt(Math.round(1e9 / rate));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const waitFor = async (cond, what) => {
  const deadline = Date.now() + 60_000;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
};

// Adds `count` jobs one at a time, job k due at start + k * interval.
// Returns the first and last addJob start times and addJob round trips (ns).
const push = async (count, warm) => {
  const addNs = new Array(count);
  const start = process.hrtime.bigint();
  let lastStart = start;
  for (let k = 0; k < count; k += 1) {
    const due = start + BigInt(k) * intervalNs;
    const ahead = Number(due - process.hrtime.bigint()) / 1e6;
    if (ahead >= 1) await sleep(Math.floor(ahead));
    // Sub-millisecond remainder: yield rather than spin, so the worker's
    // notifications and queries sharing this event loop are not held up.
    while (process.hrtime.bigint() < due) await new Promise((r) => setImmediate(r));
    const t = process.hrtime.bigint();
    await utils.addJob("noop", warm ? { w: true, t: String(t) } : { i: k, t: String(t) });
    addNs[k] = process.hrtime.bigint() - t;
    lastStart = t;
  }
  return { start, lastStart, addNs };
};

await push(warmup, true);
await waitFor(() => warmupSeen === warmup, "warm-up jobs");

const { start, lastStart, addNs } = await push(jobs, false);
await waitFor(() => measuredSeen === jobs, "measured jobs");
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
await utils.release();
await runner.stop();

const ms = (ns) => Number(ns) / 1e6;
const pct = (sorted, p) => sorted[Math.max(0, Math.ceil(p * sorted.length) - 1)]; // nearest rank
const sorted = latencies.map(ms).sort((a, b) => a - b);
const adds = addNs.map(ms).sort((a, b) => a - b);
const round = (x) => Math.round(x * 1000) / 1000;
console.log(JSON.stringify({
  system: "graphile-worker defaults",
  jobs,
  rate_target: rate,
  // Intervals between addJob calls: (N - 1) over first-to-last call start.
  rate_achieved: round((jobs - 1) / (Number(lastStart - start) / 1e9)),
  p50_ms: round(pct(sorted, 0.5)),
  p90_ms: round(pct(sorted, 0.9)),
  p99_ms: round(pct(sorted, 0.99)),
  max_ms: round(sorted[sorted.length - 1]),
  add_p50_ms: round(pct(adds, 0.5)),
  add_p99_ms: round(pct(adds, 0.99)),
  seconds: round(seconds),
}));
process.exit(0);
