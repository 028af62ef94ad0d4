// Types for @switchyard/runner.
import { EventEmitter } from "node:events";
import type {
  Advertised,
  JsonObject,
  JsonValue,
  Limits,
  Merged,
  PackRejection,
  ProvidedCapability,
  Rejection,
  Withdrawal,
} from "./core/index.js";
import { ReleaseCause } from "./gen/switchyard/v1/agent_service_pb.js";

export type {
  Advertised,
  JsonObject,
  JsonValue,
  Limits,
  Merged,
  PackRejection,
  ProvidedCapability,
  Rejection,
  Withdrawal,
};
export { ReleaseCause };
export * as core from "./core/index.js";

export interface RunnerOptions {
  /** Server URL; default `$SWITCHYARD_SERVER` or `http://127.0.0.1:50051`. */
  server?: string;
  /**
   * Unique within the namespace; default `$SWITCHYARD_AGENT_NAME`, else
   * `{hostname}-node-{h}` with `h` the first six hex digits of the SHA-256 of the canonical
   * `dir` (`defaultAgentName`), so runners sharing a host have names of their own.
   */
  name?: string;
  /** Default `$SWITCHYARD_NAMESPACE` or `default`. */
  namespace?: string;
  /**
   * Directory with `.capabilities.json`, `.capabilities.dynamic.*`, `.capabilities.override.json`;
   * default `$SWITCHYARD_AGENT_DIR` or `.`. Made absolute with symlinks resolved when the runner
   * is made; one that does not exist or is not a directory throws `AgentDirectoryError`.
   */
  dir?: string;
  /** Maximum concurrent leases; default the document's `max_concurrent_tasks`, else 1. */
  capacity?: number;
  /** Labels sent at registration. */
  labels?: Record<string, string>;
  /** Bearer token (agent role); default `$SWITCHYARD_TOKEN`. Never logged. */
  token?: string;
  /** CA bundle (PEM file) for an `https://` server; default `$SWITCHYARD_CA_FILE`. */
  caFile?: string;
  /** Client certificate (PEM file) for mTLS; default `$SWITCHYARD_TLS_CERT`. */
  certFile?: string;
  /** Client key (PEM file) for mTLS; default `$SWITCHYARD_TLS_KEY`. */
  keyFile?: string;
  /** Pack parameter values by name (then the environment). Never sent or logged. */
  params?: Record<string, string>;
  /** How long a dynamic capability script may run (ms); default 10000. */
  scriptTimeoutMs?: number;
  /** How long running handlers may finish after stop()/SIGTERM (ms); default 30000. */
  graceMs?: number;
  /** How often memory/load are refreshed and the tier files checked (ms); default 30000. */
  refreshMs?: number;
  /** Reconnect backoff: jittered, doubling from `initialMs` (250) to `maxMs` (30000). */
  backoff?: { initialMs?: number; maxMs?: number };
  /** Where the runner logs; default warnings and errors to stderr. */
  logger?: Logger;
  /** How much of each task's output is sent, and how it is batched. */
  output?: OutputLimits;
}

export interface Logger {
  debug(...args: unknown[]): void;
  info(...args: unknown[]): void;
  warn(...args: unknown[]): void;
  error(...args: unknown[]): void;
}

/** The task a handler runs. */
export interface TaskInput {
  id: string;
  kind: string;
  payload: JsonObject;
  /** Attempts that ended without success so far. */
  attempts: number;
  maxAttempts: number;
  labels: Record<string, string>;
  priority: number;
}

/** What a handler gets besides its task. */
export interface TaskContext {
  leaseId: string;
  taskId: string;
  fencingToken: bigint;
  /** Aborted when the lease is revoked (cancel, expiry, superseded) or the drain's grace period ends. */
  signal: AbortSignal;
  /** Reports progress (best effort). */
  progress(percent: number, message?: string): void;
  /** What the lease holds: pass `resources.env()` to a process the handler starts. */
  resources: AssignedResources;
  /**
   * The handler's own log, kept with the task (its `log` output stream) and followed live by
   * `switchyard logs -f`: `ctx.log("step %d done", 1)`, or `ctx.log.info(...)` and the other
   * levels, which prefix the level. `console` output in the handler reaches the task too.
   */
  log: TaskLog;
}

/** `ctx.log`: one line of the task's log per call (`util.format` of the arguments). */
export interface TaskLog extends Logger {
  (...args: unknown[]): void;
}

/** How much of each task's output the runner sends, and how it batches it. */
export interface OutputLimits {
  /** Most bytes sent per task (the tail sent at its end aside); default 8 MiB or `$SWITCHYARD_OUTPUT_MAX_BYTES`. */
  maxBytes?: number;
  /** Bytes per second sent per task, on average; default 1 MiB or `$SWITCHYARD_OUTPUT_BYTES_PER_SEC`. */
  bytesPerSec?: number;
  /** Bytes a task may send at once before the rate holds it back; default a second's worth. */
  burstBytes?: number;
  /** The newest output kept while over a bound; default 64 KiB. */
  tailBytes?: number;
  /** How often pending output is sent; default 250 ms. */
  flushEveryMs?: number;
  /** Pending output that is sent at once; default 64 KiB. */
  batchBytes?: number;
}

/** What a lease holds on the runner: its slots and, for a task with a resource request, the amounts and the GPUs assigned to it alone. */
export interface AssignedResources {
  readonly slots: number;
  readonly cpuMillicores: number;
  readonly memoryMb: number;
  /** The GPUs assigned, by uuid (or index), in the order the runner lists them. */
  readonly gpuIds: string[];
  readonly named: Record<string, number>;
  /** CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES (when GPUs were assigned) and SWITCHYARD_* for what was asked. */
  env(): Record<string, string>;
}

/**
 * Runs one attempt. The resolved value becomes the task's result (an object as is, anything
 * else as `{value}`); a thrown error is a failed attempt (`handler_error`, retryable) unless
 * it is a TaskFailure, or a Release (the task is handed back, no attempt spent).
 */
export type Handler = (task: TaskInput, ctx: TaskContext) => unknown | Promise<unknown>;

export interface HandlerPack {
  id: string;
  handlers?: Record<string, Handler>;
  provides?: Record<string, ProvidedCapability>;
  /**
   * Capabilities the handlers need (`ai.llm@1`, or a name alone for any version): while one is
   * missing, unhealthy or of another major version in the runner's document, the pack's kinds
   * are withdrawn from what the runner advertises and the runner is DEGRADED, saying why.
   */
  requires?: string[];
}

/** The causes a handler may hand its task back with. */
export type HandlerReleaseCause =
  | ReleaseCause.BUSY
  | ReleaseCause.OTHER
  | ReleaseCause.CANNOT_HANDLE
  | ReleaseCause.CANNOT_DECODE;

/**
 * Thrown by a handler to hand its task back instead of failing the attempt (like Celery's
 * `Reject`); no attempt is spent. `BUSY` (the default) and `OTHER`: offered again after a
 * jittered backoff. `CANNOT_HANDLE` and `CANNOT_DECODE`: not offered to this runner again until
 * its kinds or document change or it registers again. Every release counts toward the server's
 * per-task bound (`--max-releases-per-task`, default 20), past which the task FAILS with
 * `released_too_often`. Any other cause throws a RangeError.
 */
export declare class Release extends Error {
  constructor(reason: string, options?: { cause?: HandlerReleaseCause });
  /** Why, for people (also the message). */
  reason: string;
  /** What the server does with the task. Shadows `Error#cause`. */
  cause: HandlerReleaseCause;
}

/** A failed attempt with a chosen code, retryability and details. */
export declare class TaskFailure extends Error {
  constructor(message: string, options?: { code?: string; retryable?: boolean; details?: JsonObject });
  code: string;
  retryable: boolean;
  details?: JsonObject;
}

export declare class Runner extends EventEmitter {
  constructor(options?: RunnerOptions);
  readonly server: string;
  /** The name it registers under (the option, `$SWITCHYARD_AGENT_NAME`, or `defaultAgentName`). */
  readonly name: string;
  readonly namespace: string;
  /** The agent directory, canonical (absolute, symlinks resolved). */
  readonly dir: string;
  /** The id the server gave this runner (after the first registration). */
  readonly agentId: string | undefined;
  /** True once stop() began. */
  readonly draining: boolean;
  /** Leases being worked on, by lease id. */
  readonly running: ReadonlyMap<string, { taskId: string; fencingToken: bigint }>;
  /**
   * Registers a handler for one kind (a pack whose id is the kind). First registration wins.
   * With `requires`, the kind is withdrawn while one of those capabilities is not there.
   */
  handler(kind: string, fn: Handler, options?: { requires?: string[] }): this;
  /** Registers a handler pack. First registration wins; rejections are reported, never thrown. */
  pack(pack: HandlerPack): this;
  /** What the pack merge rejected. */
  readonly packRejections: readonly PackRejection[];
  /** The kinds it has handlers for (advertised or withdrawn). */
  readonly kinds: string[];
  /**
   * What it advertises given its current document: the kinds it handles now (sorted; none
   * without handlers, and then it is granted nothing) and those withdrawn, with why.
   */
  readonly advertised: Advertised;
  /** Reasons the runner is DEGRADED (unhealthy capabilities of its packs, withdrawn handlers). */
  readonly unhealthy: string[];
  /** Loads (once) and returns the merged capability document with provenance and rejections. */
  capabilities(): Promise<Merged>;
  /** Refreshes memory/load and re-reads changed tier files (all with `force`); true if the document changed. */
  refreshCapabilities(options?: { force?: boolean }): Promise<boolean>;
  /**
   * Runs until stopped. With `handleSignals` (default true) SIGTERM and SIGINT drain, and then
   * the process exits 0 unless `exitOnSignal` is false.
   */
  run(options?: { handleSignals?: boolean; exitOnSignal?: boolean }): Promise<void>;
  /** Drains: DRAINING, nothing new accepted, running handlers get the grace period, the rest are released. */
  stop(): Promise<void>;

  on(
    event: "registered",
    listener: (e: { agentId: string; sessionEpoch: bigint; handledKinds: string[] }) => void,
  ): this;
  on(event: "connected", listener: (e: { agentId: string; resumed: string[] }) => void): this;
  on(event: "disconnected", listener: (error: unknown) => void): this;
  on(event: "lease", listener: (e: { leaseId: string; taskId: string; kind: string }) => void): this;
  on(event: "revoked", listener: (e: { leaseId: string; taskId: string; reason: number }) => void): this;
  on(event: "reported", listener: (e: { leaseId: string; code: number }) => void): this;
  on(event: "resync", listener: (e: { reason: string; serverGeneration: bigint }) => void): this;
  on(event: "drain", listener: (e: { reason: string; reconnectAfterMs: number }) => void): this;
  on(event: "stopped", listener: () => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
}

/** An agent directory that does not exist or is not a directory; the message names it. */
export declare class AgentDirectoryError extends Error {
  constructor(dir: string, problem: string);
  /** The directory as it was given. */
  readonly dir: string;
}
/** `dir` canonicalised (absolute, symlinks resolved); throws `AgentDirectoryError`. */
export declare function agentDir(dir: string): string;
/**
 * The name an agent registers under when none is given: `{hostname}-{runner}-{h}`, `h` the
 * first six hex digits of the SHA-256 of `dir` (canonical) as UTF-8 — the Rust agent's and
 * the Python runner's rule too (`tests/conformance/naming.json`).
 */
export declare function defaultAgentName(hostname: string, runner: "rust" | "python" | "node" | (string & {}), dir: string): string;

/**
 * The capability document a runner reports: base facts, then the directory's tiers. The
 * directory is made canonical; a missing one throws `AgentDirectoryError`.
 */
export declare class Capabilities {
  constructor(options: {
    dir: string;
    scriptTimeoutMs?: number;
    limits?: Limits;
    provides?: () => Record<string, JsonValue>;
  });
  load(): Promise<this>;
  refresh(force?: boolean): Promise<boolean>;
  readonly document: JsonObject;
  merged: Merged;
}

export interface DirectoryTiers {
  static?: JsonValue;
  dynamic?: JsonObject;
  override?: JsonValue;
  rejections: Rejection[];
}
export declare const DYNAMIC_EXTENSIONS: readonly string[];
export declare function readDirectory(dir: string, scriptTimeoutMs?: number): Promise<DirectoryTiers>;
export declare function mergeDirectory(base: JsonObject, tiers: DirectoryTiers, limits?: Limits): Merged;
export declare function runDynamic(
  dir: string,
  script: string,
  staticTier: JsonValue,
  timeoutMs: number,
): Promise<{ value?: JsonObject; rejection?: Rejection }>;
export declare function baseFacts(): JsonObject;
export declare function loadFacts(): JsonObject;
/** What the detection probes find: `software` (the tools that answer), `gpus`, and the tags derived from them. */
export declare function probedFacts(timeoutMs?: number): Promise<JsonObject>;
