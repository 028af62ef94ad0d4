// The checked-in Node stubs talk to a real server over gRPC (HTTP/2).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createClient, ConnectError, Code } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus } from "../src/gen/grpc/health/v1/health_pb.js";
import { TaskService } from "../src/gen/switchyard/v1/task_service_pb.js";
import { startServer } from "./server.js";

let server;
let transport;

before(async () => {
  server = await startServer();
  transport = createGrpcTransport({ baseUrl: `http://${server.address}` });
});

after(async () => {
  await server?.stop();
});

test("health check reports SERVING for the server and each service", async () => {
  const health = createClient(Health, transport);
  const overall = await health.check({ service: "" });
  assert.equal(overall.status, HealthCheckResponse_ServingStatus.SERVING);
  for (const service of [
    "switchyard.v1.AgentService",
    "switchyard.v1.TaskService",
    "switchyard.v1.AgentAdminService",
  ]) {
    const reply = await health.check({ service });
    assert.equal(reply.status, HealthCheckResponse_ServingStatus.SERVING, service);
  }
});

test("an unknown service is NOT_FOUND", async () => {
  const health = createClient(Health, transport);
  await assert.rejects(health.check({ service: "no.such.Service" }), (err) => {
    assert.ok(err instanceof ConnectError);
    assert.equal(err.code, Code.NotFound);
    return true;
  });
});

test("the TaskService stub reaches the real service", async () => {
  const tasks = createClient(TaskService, transport);
  await assert.rejects(tasks.getTask({ taskId: "00000000-0000-7000-8000-000000000000" }), (err) => {
    assert.ok(err instanceof ConnectError);
    assert.ok([Code.Unimplemented, Code.NotFound].includes(err.code), `code ${err.code}`);
    return true;
  });
});
