// pg-boss 10.4.2 processing pre-inserted no-op jobs.
// Usage: node pgboss.mjs DATABASE_URL JOBS BATCH_SIZE WORKERS POLL_SECONDS
// Prints one JSON line: {"system", "jobs", "seconds", "jobs_per_sec"}.
// Each worker fetches up to BATCH_SIZE jobs, runs the no-op handler on the
// batch, completes them, and polls again after POLL_SECONDS (0.5 is
// pg-boss's minimum) when the previous fetch took less than that.
import PgBoss from "pg-boss";
import pg from "pg";

const [url, jobsArg, batchArg, workersArg, pollArg] = process.argv.slice(2);
const jobs = Number(jobsArg);
const batchSize = Number(batchArg);
const workers = Number(workersArg);
const pollingIntervalSeconds = Number(pollArg);

const boss = new PgBoss({ connectionString: url, max: workers + 4, supervise: false, schedule: false });
boss.on("error", (e) => console.error(e));
await boss.start();
await boss.createQueue("noop");
for (let i = 0; i < jobs; i += 1000) {
  const n = Math.min(1000, jobs - i);
  await boss.insert(Array.from({ length: n }, (_, k) => ({ name: "noop", data: { n: i + k } })));
}
const client = new pg.Client({ connectionString: url });
await client.connect();

const started = process.hrtime.bigint();
for (let w = 0; w < workers; w += 1) {
  await boss.work("noop", { batchSize, pollingIntervalSeconds }, async () => {});
}
for (;;) {
  const { rows } = await client.query("select count(*)::int as n from pgboss.job where name = 'noop' and state = 'completed'");
  if (rows[0].n >= jobs) break;
  await new Promise((r) => setTimeout(r, 20));
}
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
await boss.stop({ graceful: false, wait: false });
await client.end();
console.log(JSON.stringify({ system: `pg-boss batch ${batchSize} x ${workers} workers, poll ${pollingIntervalSeconds}s`, jobs, seconds, jobs_per_sec: jobs / seconds }));
process.exit(0);
