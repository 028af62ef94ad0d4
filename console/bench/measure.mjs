// Measures the console against a running server (a benchmark, not a test):
// how long the fleet page takes from navigation to its first rows and to its
// whole first listing ("N agents"), and the queue page to its groups counted
// and explained, in headless Chromium; then
// keeps both pages open for --hold seconds and counts the live updates each
// received (the fleet's summary line and the queue's counts changing).
//
//   node console/bench/measure.mjs --console http://127.0.0.1:8080 [--token T] [--hold 60] [--runs 3]
//                                  [--wait-agents N]   (first wait until the fleet page lists N agents)
//
// Prints one JSON object.
import { parseArgs } from "node:util";
import { chromium } from "playwright-core";

const { values } = parseArgs({
  options: {
    console: { type: "string" },
    token: { type: "string", default: "" },
    hold: { type: "string", default: "0" },
    runs: { type: "string", default: "3" },
    "wait-agents": { type: "string", default: "0" },
    chromium: { type: "string", default: process.env.CHROMIUM ?? "/usr/bin/chromium" },
  },
});
if (!values.console) throw new Error("--console URL is required");
const base = values.console.replace(/\/$/, "");

const browser = await chromium.launch({ executablePath: values.chromium, args: ["--no-sandbox", "--disable-gpu"] });
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
if (values.token) await context.addInitScript((t) => sessionStorage.setItem("switchyard.token", t), values.token);

/** Milliseconds from navigation to `ready` holding on the page. */
async function load(path, ready) {
  const page = await context.newPage();
  const start = performance.now();
  await page.goto(`${base}${path}`);
  await page.waitForFunction(ready, null, { timeout: 120_000, polling: 10 });
  return { page, start, ms: Math.round(performance.now() - start) };
}

const fleetReady = () => /^\d+ agents/.test(document.querySelector('[data-testid="fleet-summary"]')?.textContent ?? "");
const queueReady = () =>
  document.querySelectorAll('[data-testid="queue-group"]').length > 0 || !!document.querySelector('[data-testid="no-groups"]');
const queueExplained = () =>
  document.querySelectorAll('[data-testid="queue-group"]:not([data-reason="matching"])').length > 0 ||
  !!document.querySelector('[data-testid="no-groups"]');

const result = { fleet_rows_ms: [], fleet_ms: [], queue_ms: [], queue_explained_ms: [] };
const wanted = Number(values["wait-agents"]);
if (wanted > 0) {
  const page = await context.newPage();
  // The server may still be starting: try its address until it answers.
  for (let tries = 0; ; tries++) {
    try {
      await page.goto(`${base}/`);
      break;
    } catch (err) {
      if (tries > 600) throw err;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  await page.waitForFunction(
    (n) => Number(/^(\d+) agents/.exec(document.querySelector('[data-testid="fleet-summary"]')?.textContent ?? "")?.[1] ?? 0) >= n,
    wanted,
    { timeout: 900_000, polling: 500 },
  );
  await page.close();
}
for (let i = 0; i < Number(values.runs); i++) {
  const fleet = await load("/", () => !!document.querySelector("tr[data-agent]"));
  result.fleet_rows_ms.push(fleet.ms);
  await fleet.page.waitForFunction(fleetReady, null, { timeout: 120_000, polling: 10 });
  result.fleet_ms.push(Math.round(performance.now() - fleet.start));
  result.agents_shown = await fleet.page.getByTestId("fleet-summary").innerText();
  await fleet.page.close();
  const queue = await load("/queue", queueReady);
  result.queue_ms.push(queue.ms);
  await queue.page.waitForFunction(queueExplained, null, { timeout: 120_000, polling: 10 });
  result.queue_explained_ms.push(Math.round(performance.now() - queue.start));
  result.groups_shown = await queue.page.getByTestId("queue-group").count();
  result.queue_counts = await queue.page.getByTestId("queue-counts").innerText();
  await queue.page.close();
}

const hold = Number(values.hold);
if (hold > 0) {
  const fleet = await load("/", fleetReady);
  const queue = await load("/queue", queueReady);
  const seen = { fleet: new Set(), queue: new Set() };
  const until = Date.now() + hold * 1000;
  while (Date.now() < until) {
    seen.fleet.add(await fleet.page.getByTestId("fleet-summary").innerText());
    seen.queue.add(await queue.page.getByTestId("queue-counts").innerText());
    await new Promise((r) => setTimeout(r, 250));
  }
  result.hold_secs = hold;
  result.fleet_updates_seen = seen.fleet.size - 1;
  result.queue_updates_seen = seen.queue.size - 1;
}
await browser.close();
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
result.fleet_ms_median = median(result.fleet_ms);
result.fleet_rows_ms_median = median(result.fleet_rows_ms);
result.queue_ms_median = median(result.queue_ms);
result.queue_explained_ms_median = median(result.queue_explained_ms);
console.log(JSON.stringify(result));
