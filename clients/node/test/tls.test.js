// The runner over TLS: an https:// server verified against a CA file, and
// mTLS with a client certificate. Certificates are made with openssl.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { TaskService } from "../src/gen/switchyard/v1/task_service_pb.js";
import { TaskState } from "../src/gen/switchyard/v1/task_pb.js";
import { startServer } from "./server.js";
import { FAST, runnerDir, startRunner, watch } from "./helpers.js";

const pki = mkdtempSync(join(tmpdir(), "switchyard-pki-"));
after(() => rmSync(pki, { recursive: true, force: true }));

function openssl(...args) {
  execFileSync("openssl", args, { cwd: pki, stdio: "ignore" });
}

function makePki() {
  openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca");
  writeFileSync(join(pki, "san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  for (const name of ["server", "client"]) {
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`);
    openssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", `${name}.pem`, "-days", "1", "-extfile", "san.ext");
  }
  return (name) => join(pki, name);
}

test("a runner leases and completes over mTLS with a CA file", async () => {
  const file = makePki();
  const server = await startServer({
    args: [...FAST, "--tls-cert", file("server.pem"), "--tls-key", file("server.key"), "--tls-client-ca", file("ca.pem")],
  });
  const port = server.address.split(":").pop();
  const url = `https://localhost:${port}`;
  const tls = { caFile: file("ca.pem"), certFile: file("client.pem"), keyFile: file("client.key") };
  const dir = runnerDir({ ".capabilities.json": { tags: ["tls"] } });
  try {
    const { runner, running } = await startRunner(server.address, dir.dir, (r) => {
      r.handler("echo", async (task) => ({ echoed: task.payload }));
    }, { server: url, ...tls });
    const transport = createGrpcTransport({
      baseUrl: url,
      nodeOptions: { ca: readFileSync(tls.caFile), cert: readFileSync(tls.certFile), key: readFileSync(tls.keyFile) },
    });
    const tasks = createClient(TaskService, transport);
    const { task } = await tasks.submitTask({ kind: "echo", payload: { hi: 1 }, placement: { selector: "tls" } });
    const done = await watch(tasks, task.taskId);
    assert.equal(done.state, TaskState.SUCCEEDED);
    runner.stop();
    await running;
  } finally {
    dir.remove();
    await server.stop();
  }
});
