// graphile-worker 0.17.3 processing pre-inserted no-op jobs.
// Usage: node graphile.mjs DATABASE_URL JOBS default|tuned
// Prints one JSON line: {"system", "jobs", "seconds", "jobs_per_sec"}.
// `tuned` is the documented performance configuration
// (https://worker.graphile.org/docs/performance): 24 concurrent jobs, a pool
// of 25, a local queue of 500 and batched completions with no delay.
import { Logger, run, runMigrations, makeWorkerUtils } from "graphile-worker";
import pg from "pg";

const [url, jobsArg, mode] = process.argv.slice(2);
const jobs = Number(jobsArg);
const tuned = mode === "tuned";
// Per-job INFO lines would cost more than the no-op jobs; keep warnings and errors.
const quiet = new Logger(() => (level, message) => { if (level === "error" || level === "warning") console.error(message); });

await runMigrations({ connectionString: url, logger: quiet });
const client = new pg.Client({ connectionString: url });
await client.connect();
// Pre-insert in chunks through graphile-worker's own add_jobs.
const utils = await makeWorkerUtils({ connectionString: url, logger: quiet });
for (let i = 0; i < jobs; i += 1000) {
  const n = Math.min(1000, jobs - i);
  await utils.addJobs(Array.from({ length: n }, (_, k) => ({ identifier: "noop", payload: { n: i + k } })));
}
await utils.release();

const options = tuned
  ? {
      concurrency: 24,
      maxPoolSize: 25,
      preset: { worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
    }
  : {};
let done = 0;
const started = process.hrtime.bigint();
const runner = await run({
  connectionString: url,
  noHandleSignals: true,
  logger: quiet,
  taskList: { noop: async () => { done += 1; } },
  ...options,
});
// Completed jobs are deleted; the run ends when the jobs table is empty.
for (;;) {
  const { rows } = await client.query("select count(*)::int as n from graphile_worker._private_jobs");
  if (rows[0].n === 0) break;
  await new Promise((r) => setTimeout(r, 20));
}
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
await runner.stop();
await client.end();
console.log(JSON.stringify({ system: `graphile-worker ${tuned ? "tuned" : "defaults"}`, jobs, handled: done, seconds, jobs_per_sec: jobs / seconds }));
