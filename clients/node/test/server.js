// Test helper: starts a real switchyard-server on an ephemeral port with an
// SQLite store in a temporary directory, and resolves to its address.
// The binary is $SWITCHYARD_SERVER_BIN or the workspace's
// target/debug/switchyard-server.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

export function serverBinary() {
  const bin = process.env.SWITCHYARD_SERVER_BIN ?? join(repo, "target", "debug", "switchyard-server");
  if (!existsSync(bin)) {
    throw new Error(`${bin} not found: run \`cargo build -p switchyard-server\` first`);
  }
  return bin;
}

// Options: `args` (extra server flags), `listen` (default `127.0.0.1:0`) and `dir` (an existing
// directory whose switchyard.db to reuse; the caller then owns it). `kill()` stops the server
// without removing its directory, so a test can restart it on the same port and database.
export async function startServer({ args = [], listen = "127.0.0.1:0", dir: keepDir } = {}) {
  const dir = keepDir ?? mkdtempSync(join(tmpdir(), "switchyard-node-"));
  const child = spawn(
    serverBinary(),
    ["--listen", listen, "--database-url", `sqlite://${dir}/switchyard.db`, ...args],
    { stdio: ["ignore", "pipe", process.env.TEST_LOG ? "inherit" : "ignore"] },
  );
  const lines = createInterface({ input: child.stdout });
  const address = await new Promise((resolveAddr, reject) => {
    child.once("exit", (code) => reject(new Error(`server exited early with ${code}`)));
    lines.once("line", (line) => {
      const m = /listening on (\S+)/.exec(line);
      if (m) resolveAddr(m[1]);
      else reject(new Error(`unexpected first line from the server: ${line}`));
    });
  });
  const kill = async (signal = "SIGTERM") => {
    lines.close();
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill(signal);
      await exited;
    }
  };
  return {
    address,
    dir,
    kill,
    async stop() {
      await kill();
      if (!keepDir) rmSync(dir, { recursive: true, force: true });
    },
  };
}
