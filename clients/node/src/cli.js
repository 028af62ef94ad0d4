#!/usr/bin/env node
// switchyard-node: prints the capability document the Node runner would register.
//
//   node src/cli.js capabilities --dir D [--explain] [--script-timeout-secs N]
//
// `capabilities` prints the merged, redacted capability document as JSON on stdout and
// nothing else; with `--explain` it prints `{document, provenance, rejections}` instead. It
// connects to no server; the task kinds a runner advertises come from the handlers a program
// registers (`Runner#advertised`). An agent directory that does not exist or is not a directory
// ends it with one line on standard error and exit status 2.
import { parseArgs } from "node:util";
import { Capabilities } from "./capabilities.js";
import { canonical } from "./core/json.js";
import { AgentDirectoryError } from "./identity.js";

const USAGE = "usage: switchyard-node capabilities [--dir DIR] [--explain] [--script-timeout-secs N]";

async function main(argv) {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      dir: { type: "string", default: process.env.SWITCHYARD_AGENT_DIR ?? "." },
      explain: { type: "boolean", default: false },
      "script-timeout-secs": { type: "string", default: process.env.SWITCHYARD_SCRIPT_TIMEOUT_SECS ?? "10" },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  if (positionals[0] !== "capabilities" || positionals.length !== 1) {
    process.stderr.write(`${USAGE}\n`);
    return 2;
  }
  const timeout = Number(values["script-timeout-secs"]);
  if (!Number.isFinite(timeout) || timeout <= 0) {
    process.stderr.write("--script-timeout-secs must be a positive number\n");
    return 2;
  }
  let caps;
  try {
    caps = new Capabilities({ dir: values.dir, scriptTimeoutMs: timeout * 1000 });
  } catch (err) {
    if (!(err instanceof AgentDirectoryError)) throw err;
    process.stderr.write(`switchyard-node: ${err.message}\n`);
    return 2;
  }
  await caps.load();
  const out = values.explain
    ? {
        document: canonical(caps.document),
        provenance: caps.merged.provenanceObject(),
        rejections: caps.merged.rejections,
      }
    : canonical(caps.document);
  process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err) => {
    process.stderr.write(`switchyard-node: ${err?.stack ?? err}\n`);
    process.exitCode = 1;
  },
);
