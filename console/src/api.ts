// The console's one way to the server: the TaskService and the
// AgentAdminService over gRPC-Web, on the origin that served the page,
// with the bearer token the person gave (kept in this browser's
// sessionStorage) — the same services, tokens and roles as every client.
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";

import { TaskService } from "../../clients/node/src/gen/switchyard/v1/task_service_pb.js";
import { AgentAdminService } from "../../clients/node/src/gen/switchyard/v1/agent_admin_service_pb.js";
import { AgentStatus } from "../../clients/node/src/gen/switchyard/v1/agent_pb.js";
import { TaskState, QueuedReason } from "../../clients/node/src/gen/switchyard/v1/task_pb.js";
import { Tier } from "../../clients/node/src/gen/switchyard/v1/capability_pb.js";

export * from "../../clients/node/src/gen/switchyard/v1/agent_pb.js";
export * from "../../clients/node/src/gen/switchyard/v1/task_pb.js";
export * from "../../clients/node/src/gen/switchyard/v1/task_service_pb.js";
export * from "../../clients/node/src/gen/switchyard/v1/agent_admin_service_pb.js";
export * from "../../clients/node/src/gen/switchyard/v1/placement_pb.js";
export * from "../../clients/node/src/gen/switchyard/v1/capability_pb.js";

const TOKEN_KEY = "switchyard.token";
const NAMESPACE_KEY = "switchyard.namespace";

export function token(): string {
  return sessionStorage.getItem(TOKEN_KEY) ?? "";
}

export function setToken(value: string): void {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function namespace(): string {
  return sessionStorage.getItem(NAMESPACE_KEY) || "default";
}

export function setNamespace(value: string): void {
  sessionStorage.setItem(NAMESPACE_KEY, value || "default");
}

const bearer: Interceptor = (next) => async (req) => {
  const t = token();
  if (t) req.header.set("authorization", `Bearer ${t}`);
  return next(req);
};

/** The stream public/early.js started before this script ran. */
interface Early {
  url: string;
  body: Uint8Array;
  authorization: string;
  abort: () => void;
  taken: boolean;
  /** Set when the page's call took the response over (and so did not ask again). */
  handedOver?: boolean;
  response: Promise<Response>;
}

function sameBytes(a: Uint8Array, b: unknown): boolean {
  if (!(b instanceof Uint8Array) || a.length !== b.length) return false;
  return a.every((byte, i) => byte === b[i]);
}

/**
 * `fetch`, except that the page's first call to the stream early.js
 * started takes that stream over — when it is the same request (the same
 * message, the same token); a different first call aborts it.
 */
const fetchOrTakeEarly: typeof fetch = (input, init) => {
  const early = (window as { __switchyardEarly?: Early }).__switchyardEarly;
  if (early && !early.taken && String(input) === early.url) {
    early.taken = true;
    const authorization = new Headers(init?.headers).get("authorization") ?? "";
    if (sameBytes(early.body, init?.body) && authorization === early.authorization) {
      const signal = init?.signal;
      if (signal?.aborted) early.abort();
      else signal?.addEventListener("abort", () => early.abort(), { once: true });
      early.handedOver = true;
      return early.response;
    }
    early.abort();
  }
  return fetch(input, init);
};

const transport = createGrpcWebTransport({
  baseUrl: window.location.origin,
  interceptors: [bearer],
  fetch: fetchOrTakeEarly,
});

export const tasks = createClient(TaskService, transport);
export const admin = createClient(AgentAdminService, transport);

/** What went wrong, for people: the server's message, or why the token does not reach. */
export function describe(err: unknown): string {
  const e = ConnectError.from(err);
  if (e.code === Code.Unauthenticated) return "No valid token: enter one above.";
  if (e.code === Code.PermissionDenied) return `Not allowed with this token: ${e.rawMessage}`;
  return `${Code[e.code]}: ${e.rawMessage}`;
}

/** Whether an error is the caller leaving (a stream aborted on purpose). */
export function isAbort(err: unknown): boolean {
  return ConnectError.from(err).code === Code.Canceled;
}

export function when(ts: Timestamp | undefined): Date | undefined {
  return ts ? timestampDate(ts) : undefined;
}

/** `3s ago`, `5m ago`, `2h ago`. */
export function ago(date: Date | undefined, now: number): string {
  if (!date) return "never";
  const s = Math.max(0, Math.round((now - date.getTime()) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

/** An enum value's name without its prefix, lower case: `ready`, `waiting for capacity`. */
function named(e: Record<number, string>, value: number): string {
  const name = e[value] ?? String(value);
  return name.toLowerCase().replaceAll("_", " ");
}

export const statusName = (s: AgentStatus) => named(AgentStatus, s);
export const stateName = (s: TaskState) => named(TaskState, s);
export const reasonName = (r: QueuedReason) => named(QueuedReason, r);
export const tierName = (t: Tier) => named(Tier, t);
export { AgentStatus, TaskState, QueuedReason, Tier };
