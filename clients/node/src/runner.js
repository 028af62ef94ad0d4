// The Node runner's life with the server, matching the Rust agent (`agent-rs/src/session.rs`):
// register with the task kinds it handles (the core's `advertise`: its handlers' kinds minus
// those whose required capabilities are missing or unhealthy; none when it has no handlers, and
// then it is granted nothing), hold one `Connect` stream, heartbeat at the server's interval
// with JSON-Patch diffs of the capability document against the generation the server holds (a
// ResyncRequest is answered with a CapabilitySnapshot) and with the handled kinds whenever they
// changed, acknowledge each grant at once, report started, progress and exactly one final
// report, and stop a handler (its AbortSignal) when its lease is revoked. A grant it cannot take
// is released with its cause: DRAINING, BUSY (at capacity), CANNOT_HANDLE (no handler, or the
// handler withdrawn), CANNOT_DECODE (the task cannot be prepared); a canceled lease with
// REVOCATION_ACKNOWLEDGED; a handler may hand its task back by throwing `Release`. Every release
// counts toward the server's per-task bound. When the stream breaks it reconnects with jittered
// exponential backoff and resumes the leases it still holds (running handlers keep running);
// output and final reports not yet acknowledged are sent again. `stop()` (and SIGTERM) drains: a
// DRAINING heartbeat, nothing new accepted, running handlers get a grace period, the rest are
// released. What a handler writes (`ctx.log`, `console`) goes up as it is written, batched and
// bounded, before its lease's final report (`output.js`).
import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { fromJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { AgentService, ReleaseCause, RevocationReason } from "./gen/switchyard/v1/agent_service_pb.js";
import { AgentStatus } from "./gen/switchyard/v1/agent_pb.js";
import { PatchOp, Tier } from "./gen/switchyard/v1/capability_pb.js";
import { Capabilities } from "./capabilities.js";
import { agentDir, defaultAgentName, RUNNER } from "./identity.js";
import { currentOutput, DEFAULT_OUTPUT_LIMITS, installCapture, OutputBuffer, taskLog } from "./output.js";
import {
  advertise,
  clone,
  diff,
  isObject,
  jsonEqual,
  mergePacks,
  resolveParams,
  uncarried,
  unhealthyReasons,
} from "./core/index.js";

const VERSION = "0.1.0";

/** A handler failure with a chosen code, retryability and details (any other error is `handler_error`, retryable). */
export class TaskFailure extends Error {
  /**
   * @param {string} message
   * @param {{code?: string, retryable?: boolean, details?: Record<string, unknown>}} [options]
   */
  constructor(message, { code = "handler_error", retryable = true, details } = {}) {
    super(message);
    this.name = "TaskFailure";
    this.code = code;
    this.retryable = retryable;
    this.details = details;
  }
}

/** The causes a handler may give when it hands its task back (the others are the runner's own). */
const HANDLER_RELEASE_CAUSES = new Set([
  ReleaseCause.BUSY,
  ReleaseCause.OTHER,
  ReleaseCause.CANNOT_HANDLE,
  ReleaseCause.CANNOT_DECODE,
]);

/**
 * Thrown by a handler to hand its task back instead of failing the attempt (like Celery's
 * `Reject`): no attempt is spent. `BUSY` (the default) or `OTHER`: the server offers the task
 * again after a jittered backoff. `CANNOT_HANDLE` or `CANNOT_DECODE`: it is not offered to this
 * runner again until the runner's kinds or document change or it registers again. Every release
 * counts toward the server's per-task bound (`--max-releases-per-task`, default 20), past which
 * the task fails with `released_too_often`.
 */
export class Release extends Error {
  /**
   * @param {string} reason
   * @param {{cause?: ReleaseCause}} [options]
   */
  constructor(reason, { cause = ReleaseCause.BUSY } = {}) {
    if (!HANDLER_RELEASE_CAUSES.has(cause)) {
      throw new RangeError(
        `a handler releases with BUSY, OTHER, CANNOT_HANDLE or CANNOT_DECODE, not ${ReleaseCause[cause] ?? cause}`,
      );
    }
    super(reason);
    this.name = "Release";
    /** Why, for people: the release's reason. */
    this.reason = reason;
    /** What the server does with the task (a `ReleaseCause`); shadows `Error#cause`. */
    this.cause = cause;
  }
}

/** A `released` final report or refusal with its cause. */
const released = (cause, reason) => ({ case: "released", value: { cause, reason } });

const WIRE_TIER = {
  base: Tier.BASE,
  static: Tier.STATIC,
  dynamic: Tier.DYNAMIC,
  override: Tier.OVERRIDE,
  operator: Tier.OPERATOR,
};
const WIRE_OP = {
  add: PatchOp.ADD,
  remove: PatchOp.REMOVE,
  replace: PatchOp.REPLACE,
  move: PatchOp.MOVE,
  copy: PatchOp.COPY,
  test: PatchOp.TEST,
};

const durationMs = (d, fallback) =>
  d ? Number(d.seconds) * 1000 + Math.floor(d.nanos / 1e6) : fallback;

/** A resolved JSON copy (drops `undefined`, functions, ...), as a Struct can carry it. */
const plainJson = (v) => (v === undefined ? undefined : JSON.parse(JSON.stringify(v)));

/**
 * A handler's result as the Struct it is sent as; throws, naming the field, for a number the
 * contract cannot carry exactly (past ±(2^53 − 1), or a BigInt) rather than sending it rounded.
 */
function toStruct(result) {
  if (result === undefined || result === null) return {};
  const found = uncarried(result, "result");
  if (found) throw new Error(`${found.path}: ${found.reason}`);
  const json = plainJson(result);
  return isObject(json) ? json : { value: json };
}

/** The task as a handler gets it (throws if the grant's task cannot be read). */
function taskInput(task) {
  return {
    id: task.taskId,
    kind: task.kind,
    payload: task.payload ?? {},
    attempts: task.attempts,
    maxAttempts: task.maxAttempts,
    labels: { ...task.labels },
    priority: task.priority,
  };
}

/**
 * What a lease holds on the runner (the grant's AssignedResources): slots, and for a task with a
 * resource request the amounts and the GPUs assigned to it alone. `env()` is the environment a
 * process started for the task should get (CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES when
 * GPUs were assigned, SWITCHYARD_SLOTS, SWITCHYARD_CPU_MILLICORES, SWITCHYARD_MEMORY_MB and
 * SWITCHYARD_GPU_IDS for what was asked), as the Rust agent sets them for `exec`.
 */
export function assignedResources(assigned) {
  const r = {
    slots: Math.max(1, assigned?.slots ?? 1),
    cpuMillicores: Number(assigned?.cpuMillicores ?? 0n),
    memoryMb: Number(assigned?.memoryMb ?? 0n),
    gpuIds: [...(assigned?.gpuIds ?? [])],
    named: Object.fromEntries(Object.entries(assigned?.named ?? {}).map(([k, v]) => [k, Number(v)])),
  };
  r.env = () => {
    const env = { SWITCHYARD_SLOTS: String(r.slots) };
    if (r.cpuMillicores) env.SWITCHYARD_CPU_MILLICORES = String(r.cpuMillicores);
    if (r.memoryMb) env.SWITCHYARD_MEMORY_MB = String(r.memoryMb);
    if (r.gpuIds.length) {
      const ids = r.gpuIds.join(",");
      Object.assign(env, { CUDA_VISIBLE_DEVICES: ids, NVIDIA_VISIBLE_DEVICES: ids, SWITCHYARD_GPU_IDS: ids });
    }
    return env;
  };
  return Object.freeze(r);
}

/** The most bytes of output kept for re-sending after a reconnect. */
const UNACKED_OUTPUT_BYTES = 16 * 1024 * 1024;

/** The bytes of text an output report carries. */
function outputBytes(report) {
  return report.update.value.chunks.reduce((n, c) => n + Buffer.byteLength(c.text, "utf8"), 0);
}

function sleep(ms, signal) {
  return new Promise((resolveSleep) => {
    if (signal?.aborted) return resolveSleep();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolveSleep();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** A push-fed async iterable: the request side of the session stream. */
class Outbox {
  #items = [];
  #wake = null;
  #closed = false;
  push(item) {
    if (this.#closed) return;
    this.#items.push(item);
    this.#notify();
  }
  close() {
    this.#closed = true;
    this.#notify();
  }
  #notify() {
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }
  async *[Symbol.asyncIterator]() {
    for (;;) {
      if (this.#items.length > 0) yield this.#items.shift();
      else if (this.#closed) return;
      else await new Promise((r) => (this.#wake = r));
    }
  }
}

const quietLogger = {
  debug() {},
  info() {},
  warn: (...a) => console.error("[switchyard-runner]", ...a),
  error: (...a) => console.error("[switchyard-runner]", ...a),
};

/**
 * A Switchyard runner. See `index.d.ts` for the options and the handler signature.
 */
export class Runner extends EventEmitter {
  /** @param {import("./index.js").RunnerOptions} [options] */
  constructor(options = {}) {
    super();
    const o = options;
    /** The server's base URL. */
    this.server = o.server ?? process.env.SWITCHYARD_SERVER ?? "http://127.0.0.1:50051";
    /** The agent directory, canonical (absolute, symlinks resolved); a missing one throws `AgentDirectoryError`. */
    this.dir = agentDir(o.dir ?? process.env.SWITCHYARD_AGENT_DIR ?? ".");
    this.#givenName = o.name || process.env.SWITCHYARD_AGENT_NAME || undefined;
    this.namespace = o.namespace ?? process.env.SWITCHYARD_NAMESPACE ?? "default";
    /** Maximum concurrent leases; defaults to the document's `max_concurrent_tasks`, else 1. */
    this.capacity = o.capacity;
    this.labels = o.labels ?? {};
    /** Bearer token; kept off the instance's enumerable fields so it is never logged. */
    Object.defineProperty(this, "token", { value: o.token ?? process.env.SWITCHYARD_TOKEN, enumerable: false });
    /** CA bundle (PEM) for an https:// server; client certificate and key for mTLS. */
    this.caFile = o.caFile ?? process.env.SWITCHYARD_CA_FILE;
    this.certFile = o.certFile ?? process.env.SWITCHYARD_TLS_CERT;
    this.keyFile = o.keyFile ?? process.env.SWITCHYARD_TLS_KEY;
    this.graceMs = o.graceMs ?? 30_000;
    /** How much of each task's output (`ctx.log`, `console`) is sent, and how it is batched. */
    const rate = Number(process.env.SWITCHYARD_OUTPUT_BYTES_PER_SEC ?? DEFAULT_OUTPUT_LIMITS.bytesPerSec);
    this.outputLimits = {
      ...DEFAULT_OUTPUT_LIMITS,
      maxBytes: Number(process.env.SWITCHYARD_OUTPUT_MAX_BYTES ?? DEFAULT_OUTPUT_LIMITS.maxBytes),
      bytesPerSec: Math.max(1, rate),
      burstBytes: Math.max(1, rate),
      ...(o.output ?? {}),
    };
    this.refreshMs = o.refreshMs ?? 30_000;
    this.backoff = { initialMs: 250, maxMs: 30_000, ...(o.backoff ?? {}) };
    this.log = o.logger ?? quietLogger;
    /** Parameter values for packs: the `params` option, then the environment; never sent or logged. */
    const params = o.params ?? {};
    Object.defineProperty(this, "lookup", {
      value: (name) => (Object.hasOwn(params, name) ? params[name] : process.env[name]),
      enumerable: false,
    });
    /** Packs as registered: declaration and handler functions. */
    this.packs = [];
    /** The pack merge (first registration wins). */
    this.mergedPacks = mergePacks([]);
    /** Task kind → handler function, from the pack that won it. */
    this.byKind = new Map();
    this.caps = new Capabilities({
      dir: this.dir,
      scriptTimeoutMs: o.scriptTimeoutMs ?? 10_000,
      provides: () => this.#provides().provides,
    });

    /** Leases being worked on, by lease id: {taskId, fencingToken, abort, canceled}. */
    this.running = new Map();
    /** Final reports not yet acknowledged, by lease id (re-sent after a reconnect). */
    this.unackedFinals = new Map();
    /**
     * Output reports not yet acknowledged, oldest first, by a number of their own: re-sent after a
     * reconnect, before the finals (the server skips what it stored already).
     */
    this.unackedOutput = new Map();
    /** True once stop() began: take nothing new. */
    this.draining = false;
    /** The agent id the server gave us. */
    this.agentId = undefined;
    this.#session = null;
    this.#wake = new AbortController();
    this.#loaded = null;
  }

  /**
   * The name it registers under: the one given, else `{hostname}-node-{h}` (the document's
   * hostname, as the Rust agent and the Python runner take it; `h` the first six hex digits of
   * the SHA-256 of the canonical directory).
   */
  get name() {
    if (this.#givenName) return this.#givenName;
    const host = this.caps.document?.hostname;
    return defaultAgentName(typeof host === "string" && host ? host : hostname(), RUNNER, this.dir);
  }

  /** The name option or `$SWITCHYARD_AGENT_NAME`, if either was given. */
  #givenName;
  #session;
  #wake;
  #loaded;
  #runPromise = null;
  #graceTimer = null;
  #hardDeadline = 0;
  #refreshing = Promise.resolve(false);
  #nextOutput = 0;
  #unackedOutputBytes = 0;

  /**
   * Registers a handler for one task kind (a pack of its own whose id is the kind). With
   * `requires` (`["ai.llm@1"]`, or a name alone for any version) the kind is withdrawn from
   * what the runner advertises while one of those capabilities is missing, unhealthy or of
   * another major version in its document (the runner is then DEGRADED, saying why).
   * @param {string} kind
   * @param {import("./index.js").Handler} fn
   * @param {{requires?: string[]}} [options]
   */
  handler(kind, fn, { requires = [] } = {}) {
    return this.pack({ id: kind, handlers: { [kind]: fn }, requires });
  }

  /**
   * Registers a handler pack:
   * `{id, handlers: {kind: fn}, provides: {name: {version, params}}, requires: ["name@major"]}`.
   * First registration wins; what is rejected is reported (`packRejections`, a warning), never thrown.
   */
  pack(pack) {
    const handlers = isObject(pack?.handlers) ? pack.handlers : {};
    const declaration = {
      id: pack?.id ?? "",
      handlers: Object.keys(handlers),
      provides: pack?.provides ?? {},
      requires: Array.isArray(pack?.requires) ? pack.requires.map(String) : [],
    };
    this.packs.push({ declaration, handlers });
    const before = this.mergedPacks.rejections.length;
    this.mergedPacks = mergePacks(this.packs.map((p) => p.declaration));
    for (const r of this.mergedPacks.rejections.slice(before)) {
      this.log.warn(`pack ${r.pack}: ${r.kind} ${r.id} rejected: ${r.reason}`);
    }
    this.byKind.clear();
    for (const [kind, packId] of this.mergedPacks.handlers) {
      const owner = this.packs.find((p) => p.declaration.id === packId);
      const fn = owner?.handlers[kind];
      if (typeof fn === "function") this.byKind.set(kind, fn);
    }
    return this;
  }

  /** What the pack merge rejected (duplicate packs, kinds, capabilities). */
  get packRejections() {
    return this.mergedPacks.rejections;
  }

  /** The kinds this runner has handlers for (advertised or withdrawn; see `advertised`). */
  get kinds() {
    return [...this.byKind.keys()];
  }

  /**
   * What the runner advertises given its current document: `{kinds, withdrawn}`, the kinds it
   * handles now (sorted) and those withdrawn because a capability they require is not there.
   * @returns {import("./core/index.js").Advertised}
   */
  get advertised() {
    const { kinds, withdrawn } = advertise(this.mergedPacks, this.#document());
    return { kinds: kinds.filter((kind) => this.byKind.has(kind)), withdrawn };
  }

  #provides() {
    const provides = resolveParams(this.mergedPacks, this.lookup);
    return { provides, unhealthy: unhealthyReasons(provides) };
  }

  /** Why the runner is DEGRADED (unhealthy capabilities of its packs, withdrawn handlers), if it is. */
  get unhealthy() {
    return [...this.#provides().unhealthy, ...this.advertised.withdrawn.map((w) => w.reason)];
  }

  /** The status and reasons to report: DRAINING while shutting down, else DEGRADED while `unhealthy`. */
  #status() {
    if (this.draining) return { status: AgentStatus.DRAINING, reasons: ["agent shutting down"] };
    const reasons = this.unhealthy;
    return { status: reasons.length > 0 ? AgentStatus.DEGRADED : AgentStatus.READY, reasons };
  }

  /** Loads the capability document (once); resolves to the merge `{document, provenance, rejections}`. */
  async capabilities() {
    this.#loaded ??= this.caps.load();
    await this.#loaded;
    return this.caps.merged;
  }

  /** Refreshes memory/load and re-reads changed tier files (all with `force`); true if the document changed. */
  refreshCapabilities({ force = false } = {}) {
    this.#refreshing = this.#refreshing.then(
      () => this.caps.refresh(force),
      () => this.caps.refresh(force),
    );
    return this.#refreshing;
  }

  /**
   * Runs until stopped: connects, serves leases, reconnects. Resolves when drained.
   * @param {{handleSignals?: boolean, exitOnSignal?: boolean}} [options]
   */
  run({ handleSignals = true, exitOnSignal = true } = {}) {
    this.#runPromise ??= this.#run(handleSignals, exitOnSignal);
    return this.#runPromise;
  }

  async #run(handleSignals, exitOnSignal) {
    let signaled = false;
    const onSignal = (sig) => {
      signaled = true;
      this.log.info(`${sig}: draining`);
      void this.stop();
    };
    if (handleSignals) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    installCapture();
    await this.capabilities();
    const refresher = setInterval(() => void this.refreshCapabilities().catch(() => {}), this.refreshMs);
    refresher.unref();
    let backoff = this.backoff.initialMs;
    try {
      for (;;) {
        if (this.#finished()) return;
        let end;
        try {
          end = await this.#runSession();
        } catch (err) {
          end = { error: err };
        }
        if (end.stopped || this.#finished()) return;
        if (end.reconnectAfterMs !== undefined) {
          backoff = this.backoff.initialMs;
          this.log.info(`server asked us to reconnect after ${end.reconnectAfterMs}ms`);
          await sleep(end.reconnectAfterMs, this.#wake.signal);
          continue;
        }
        const wait = Math.round(backoff * (0.5 + Math.random()));
        this.log.warn(`session ended (${end.error?.message ?? end.error}); reconnecting in ${wait}ms`);
        this.emit("disconnected", end.error);
        await sleep(wait, this.#wake.signal);
        backoff = Math.min(backoff * 2, this.backoff.maxMs);
      }
    } finally {
      clearInterval(refresher);
      clearTimeout(this.#graceTimer);
      if (handleSignals) {
        process.off("SIGTERM", onSignal);
        process.off("SIGINT", onSignal);
      }
      this.emit("stopped");
      if (signaled && exitOnSignal) process.exit(0);
    }
  }

  /** Whether a drain is complete (or out of time). */
  #finished() {
    if (!this.draining) return false;
    if (this.running.size === 0 && this.unackedFinals.size === 0) return true;
    return Date.now() >= this.#hardDeadline;
  }

  /** Drains: DRAINING, nothing new, running handlers get `graceMs`, the rest are released. Resolves when done. */
  async stop() {
    if (!this.draining) {
      this.draining = true;
      this.#hardDeadline = Date.now() + this.graceMs + 5_000;
      this.log.info(`draining with ${this.running.size} running`);
      const s = this.#session;
      if (s) {
        s.send({ case: "heartbeat", value: this.#heartbeatBody(s, false) });
      }
      this.#graceTimer = setTimeout(() => this.#releaseAll("agent shut down"), this.graceMs);
      this.#graceTimer.unref();
      // A hard stop in case the server is gone and nothing can be reported.
      setTimeout(() => this.#checkDrained(true), this.graceMs + 5_000).unref();
      this.#checkDrained();
    }
    if (this.#runPromise) await this.#runPromise;
  }

  #releaseAll(reason) {
    for (const [leaseId, r] of this.running) {
      clearInterval(r.flusher);
      r.output.flush(true);
      r.abort.abort(new Error(reason));
      this.running.delete(leaseId);
      this.#final(leaseId, r, released(ReleaseCause.DRAINING, reason));
    }
    this.#checkDrained();
  }

  /** Ends a reconnect wait now (each wait gets a fresh signal, so a wake-up never turns into a busy loop). */
  #wakeUp() {
    const wake = this.#wake;
    this.#wake = new AbortController();
    wake.abort();
  }

  #checkDrained(force = false) {
    if (!this.draining) return;
    if (force || (this.running.size === 0 && this.unackedFinals.size === 0)) {
      if (this.#session) this.#session.finish({ stopped: true });
      this.#wakeUp();
    }
  }

  #document() {
    return this.caps.document;
  }

  #provenance() {
    return [...this.caps.merged.provenance.entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([path, tier]) => ({ path, tier: WIRE_TIER[tier] }));
  }

  #rejections() {
    return this.caps.merged.rejections.map((r) => ({
      tier: r.tier ? WIRE_TIER[r.tier] : Tier.UNSPECIFIED,
      path: r.path,
      reason: r.reason,
    }));
  }

  #capacity() {
    if (this.capacity !== undefined) return Math.max(1, this.capacity);
    const fromDoc = this.#document().max_concurrent_tasks;
    return Number.isInteger(fromDoc) && fromDoc > 0 ? fromDoc : 1;
  }

  /** TLS files for an https:// server: the CA to verify it, and a client certificate for mTLS. */
  #tlsOptions() {
    if (!this.server.startsWith("https://")) return undefined;
    const read = (path) => (path ? readFileSync(path) : undefined);
    return { ca: read(this.caFile), cert: read(this.certFile), key: read(this.keyFile) };
  }

  #headers() {
    return this.token ? { authorization: `Bearer ${this.token}` } : {};
  }

  async #runSession() {
    const sessionManager = new Http2SessionManager(this.server, { pingIntervalMs: 10_000 }, this.#tlsOptions());
    const transport = createGrpcTransport({ baseUrl: this.server, sessionManager });
    const client = createClient(AgentService, transport);
    const abort = new AbortController();
    const outbox = new Outbox();
    const timers = [];
    /** The session: what one Connect stream needs to remember. */
    const s = {
      sequence: 0n,
      generation: 0n,
      /** The document the server holds (the last one it acknowledged). */
      sentDoc: {},
      /** A diff or snapshot in flight: {seq, doc}. */
      pendingDoc: null,
      /** The handled kinds last sent (at registration or in a heartbeat). */
      sentKinds: [],
      /** Final reports in flight: sequence → lease id. */
      finalSeqs: new Map(),
      /** Output reports in flight: sequence → their number. */
      outputSeqs: new Map(),
      finish: () => {},
      send: (message) => {
        s.sequence += 1n;
        outbox.push({ sequence: s.sequence, message });
        return s.sequence;
      },
    };
    const ended = new Promise((r) => (s.finish = r));
    try {
      await this.refreshCapabilities();
      const handledKinds = this.advertised.kinds;
      const reg = await client.registerAgent(
        {
          name: this.name,
          namespace: this.namespace,
          capabilities: this.#document(),
          capacity: this.#capacity(),
          labels: this.labels,
          provenance: this.#provenance(),
          rejections: this.#rejections(),
          runner: `switchyard-runner-node/${VERSION} (node ${process.versions.node})`,
          handledKinds,
        },
        { headers: this.#headers(), timeoutMs: 10_000, signal: abort.signal },
      );
      this.agentId = reg.agentId;
      s.generation = reg.capabilityGeneration;
      s.sentDoc = clone(this.#document());
      s.sentKinds = handledKinds;
      this.emit("registered", { agentId: reg.agentId, sessionEpoch: reg.sessionEpoch, handledKinds });
      s.send({
        case: "hello",
        value: {
          agentId: reg.agentId,
          sessionEpoch: reg.sessionEpoch,
          // A lease whose final report waits for an acknowledgement is still held: unnamed, the
          // server would count it lost and run its task again.
          heldLeases: [
            ...[...this.running].map(([leaseId, r]) => ({
              leaseId,
              taskId: r.taskId,
              fencingToken: r.fencingToken,
            })),
            ...[...this.unackedFinals]
              .filter(([leaseId]) => !this.running.has(leaseId))
              .map(([leaseId, u]) => ({ leaseId, taskId: u.taskId, fencingToken: u.fencingToken })),
          ],
        },
      });
      const stream = client.connect(outbox, { headers: this.#headers(), signal: abort.signal });
      this.#session = s;
      // Re-send output and final reports the previous session did not see acknowledged: output
      // first, as a lease's output comes before its final report.
      for (const [number, report] of this.unackedOutput) {
        s.outputSeqs.set(s.send({ case: "leaseUpdate", value: report }), number);
      }
      for (const [leaseId, update] of this.unackedFinals) {
        s.finalSeqs.set(s.send({ case: "leaseUpdate", value: update }), leaseId);
      }
      const startTicker = (ms) => {
        clearInterval(timers[0]);
        timers[0] = setInterval(() => this.#heartbeat(s), Math.max(ms, 50));
        s.intervalMs = ms;
      };
      startTicker(durationMs(reg.heartbeatInterval, 5_000));
      s.startTicker = startTicker;
      if (this.draining) s.send({ case: "heartbeat", value: this.#heartbeatBody(s, false) });
      const reading = (async () => {
        for await (const res of stream) this.#onMessage(s, res);
        return { error: new Error("server closed the session stream") };
      })().catch((err) => ({ error: err }));
      this.#checkDrained();
      const end = await Promise.race([ended, reading]);
      if (end.stopped) {
        // Half-close so what we queued is flushed, and give the server a moment to close its side.
        outbox.close();
        await Promise.race([reading, sleep(1_000)]);
      }
      return end;
    } finally {
      clearInterval(timers[0]);
      if (this.#session === s) this.#session = null;
      outbox.close();
      abort.abort();
      sessionManager.abort();
    }
  }

  /**
   * A heartbeat: status and reasons, load, and for a regular one (`withDiff`) the handled kinds
   * when they changed (a required capability went or came back, a handler was added) and, when
   * the document changed and no diff is in flight, the diff from what the server holds.
   */
  #heartbeatBody(s, withDiff) {
    const { status, reasons } = this.#status();
    const body = {
      status,
      statusReasons: reasons,
      load: {
        runningLeases: this.running.size,
        loadAverage: Number(this.#document().loadavg?.["1min"] ?? 0) || 0,
      },
    };
    const { kinds } = this.advertised;
    if (withDiff && !jsonEqual(kinds, s.sentKinds)) {
      this.log.info(`handled kinds now: ${kinds.join(", ") || "none"}`);
      body.handledKinds = { kinds };
      s.sentKinds = kinds;
    }
    if (withDiff && !s.pendingDoc && !jsonEqual(this.#document(), s.sentDoc)) {
      const doc = clone(this.#document());
      body.capabilityDiff = {
        baseGeneration: s.generation,
        operations: diff(s.sentDoc, doc).map((op) => ({
          op: WIRE_OP[op.op],
          path: op.path,
          from: op.from ?? "",
          // google.protobuf.Value is not unboxed by protobuf-es (Struct is): convert explicitly.
          value: op.value === undefined ? undefined : fromJson(ValueSchema, plainJson(op.value)),
        })),
      };
      body.doc = doc;
    }
    return body;
  }

  #heartbeat(s) {
    const { doc, ...body } = this.#heartbeatBody(s, true);
    const seq = s.send({ case: "heartbeat", value: body });
    if (doc) s.pendingDoc = { seq, doc };
  }

  #onMessage(s, res) {
    const m = res.message;
    this.log.debug(`received ${m.case}`);
    switch (m.case) {
      case "welcome": {
        const w = m.value;
        s.generation = w.capabilityGeneration;
        for (const r of w.revoked) {
          const running = this.running.get(r.leaseId);
          if (running) {
            this.log.warn(`lease ${r.leaseId}: the server no longer knows it; stopping its work`);
            this.running.delete(r.leaseId);
            running.abort.abort(new Error(r.message || "lease revoked"));
          }
        }
        const ms = durationMs(w.heartbeatInterval, s.intervalMs);
        if (ms !== s.intervalMs) s.startTicker(ms);
        this.emit("connected", { agentId: this.agentId, resumed: w.resumedLeaseIds });
        this.#checkDrained();
        break;
      }
      case "leaseGrant":
        this.#onGrant(s, m.value);
        break;
      case "leaseRevocation": {
        const rev = m.value;
        const running = this.running.get(rev.leaseId);
        if (running) {
          const canceled = rev.reason === RevocationReason.CANCELED;
          this.log.info(`lease ${rev.leaseId} revoked (${RevocationReason[rev.reason]}); stopping its work`);
          running.canceled = canceled;
          // Expired or superseded: nothing to report; canceled: `released` once the handler returns.
          if (!canceled) this.running.delete(rev.leaseId);
          running.abort.abort(new Error(rev.message || `lease revoked: ${RevocationReason[rev.reason]}`));
          this.emit("revoked", { leaseId: rev.leaseId, taskId: rev.taskId, reason: rev.reason });
        }
        this.#checkDrained();
        break;
      }
      case "ack": {
        const ack = m.value;
        if (s.pendingDoc && s.pendingDoc.seq === ack.sequence) {
          if (ack.code === 0 && ack.capabilityGeneration !== s.generation) {
            s.generation = ack.capabilityGeneration;
            s.sentDoc = s.pendingDoc.doc;
          }
          s.pendingDoc = null;
        }
        const number = s.outputSeqs.get(ack.sequence);
        if (number !== undefined) {
          s.outputSeqs.delete(ack.sequence);
          if (ack.code !== 0) this.log.debug(`output refused (${ack.code}: ${ack.message})`);
          this.#outputAcknowledged(number);
        }
        const leaseId = s.finalSeqs.get(ack.sequence);
        if (leaseId !== undefined) {
          s.finalSeqs.delete(ack.sequence);
          if (ack.code !== 0) this.log.warn(`lease ${leaseId}: final report refused (${ack.code}: ${ack.message})`);
          this.unackedFinals.delete(leaseId);
          this.emit("reported", { leaseId, code: ack.code });
          this.#checkDrained();
        } else if (ack.code !== 0) {
          this.log.debug(`message ${ack.sequence} refused (${ack.code}: ${ack.message})`);
        }
        break;
      }
      case "resyncRequest": {
        this.log.info(`server asked for the full document: ${m.value.reason}`);
        const doc = clone(this.#document());
        const seq = s.send({
          case: "capabilitySnapshot",
          value: { capabilities: doc, provenance: this.#provenance(), rejections: this.#rejections() },
        });
        s.generation = m.value.serverGeneration;
        s.pendingDoc = { seq, doc };
        this.emit("resync", { reason: m.value.reason, serverGeneration: m.value.serverGeneration });
        break;
      }
      case "drain": {
        this.log.info(`server drained this session: ${m.value.reason}`);
        const reconnectAfterMs = durationMs(m.value.reconnectAfter, 1_000);
        this.emit("drain", { reason: m.value.reason, reconnectAfterMs });
        s.finish({ reconnectAfterMs });
        break;
      }
      default:
        break;
    }
  }

  #onGrant(s, grant) {
    const task = grant.task;
    if (!task) return;
    const update = (u) =>
      s.send({
        case: "leaseUpdate",
        value: { leaseId: grant.leaseId, taskId: task.taskId, fencingToken: grant.fencingToken, update: u },
      });
    if (this.running.has(grant.leaseId)) {
      update({ case: "accepted", value: {} });
      return;
    }
    let refuse = this.#refusal(task.kind);
    let input;
    if (!refuse) {
      try {
        input = taskInput(task);
      } catch (err) {
        refuse = released(ReleaseCause.CANNOT_DECODE, `cannot decode the task: ${err?.message ?? err}`);
      }
    }
    if (refuse) {
      this.log.debug(`releasing grant ${grant.leaseId}: ${refuse.value.reason}`);
      update(refuse);
      return;
    }
    update({ case: "accepted", value: {} });
    update({ case: "started", value: {} });
    this.#start(grant, task, input);
  }

  /**
   * Why the runner cannot take a grant of `kind` now, as the release to send, if it cannot:
   * draining, at capacity (busy: the server offers it again later), or no handler for the kind
   * or its handler withdrawn (the server offers it to this runner no more until it changes).
   */
  #refusal(kind) {
    if (this.draining) return released(ReleaseCause.DRAINING, "agent is draining");
    if (this.running.size >= this.#capacity()) return released(ReleaseCause.BUSY, "agent at capacity");
    if (!this.byKind.has(kind)) return released(ReleaseCause.CANNOT_HANDLE, `no handler for kind ${kind}`);
    const withdrawal = this.advertised.withdrawn.find((w) => w.kind === kind);
    if (withdrawal) return released(ReleaseCause.CANNOT_HANDLE, withdrawal.reason);
    return undefined;
  }

  #start(grant, task, input) {
    const fn = this.byKind.get(task.kind);
    const abort = new AbortController();
    const leaseId = grant.leaseId;
    const entry = { taskId: task.taskId, fencingToken: grant.fencingToken, abort, canceled: false };
    entry.output = new OutputBuffer(this.outputLimits, (chunks) => this.#output(leaseId, entry, chunks));
    entry.flusher = setInterval(() => entry.output.flush(), this.outputLimits.flushEveryMs);
    entry.flusher.unref();
    this.running.set(grant.leaseId, entry);
    const ctx = {
      leaseId,
      taskId: task.taskId,
      fencingToken: grant.fencingToken,
      signal: abort.signal,
      resources: assignedResources(grant.resources),
      log: taskLog(entry.output),
      progress: (percent, message = "") => {
        const s = this.#session;
        if (!s || this.running.get(leaseId) !== entry) return;
        s.send({
          case: "leaseUpdate",
          value: {
            leaseId,
            taskId: entry.taskId,
            fencingToken: entry.fencingToken,
            update: { case: "progress", value: { percent, message } },
          },
        });
      },
    };
    this.emit("lease", { leaseId, taskId: task.taskId, kind: task.kind });
    // The handler's async context: `console` in it (and in what it starts) reaches its output.
    currentOutput
      .run(entry.output, () => Promise.resolve().then(() => fn(input, ctx)))
      .then(
        (result) => this.#done(leaseId, entry, { ok: true, result }),
        (error) => this.#done(leaseId, entry, { ok: false, error }),
      );
  }

  #done(leaseId, entry, outcome) {
    clearInterval(entry.flusher);
    if (this.running.get(leaseId) !== entry) {
      entry.output.closed = true; // revoked meanwhile: nothing to report
      return;
    }
    // The last of the output goes before the final report.
    entry.output.flush(true);
    this.running.delete(leaseId);
    let update;
    if (entry.canceled) {
      update = released(ReleaseCause.REVOCATION_ACKNOWLEDGED, "canceled by the server");
    } else if (!outcome.ok && outcome.error instanceof Release) {
      update = released(outcome.error.cause, outcome.error.reason);
    } else if (outcome.ok) {
      let result;
      try {
        result = toStruct(outcome.result);
      } catch (err) {
        outcome = {
          ok: false,
          error: new TaskFailure(`the handler's result cannot be sent: ${err.message}`, {
            code: "handler_error",
            retryable: false,
          }),
        };
      }
      if (outcome.ok) update = { case: "succeeded", value: { result } };
    }
    if (!update) {
      const err = outcome.error;
      const failure = err instanceof TaskFailure;
      let message = String(err?.message ?? err);
      let details = failure && isObject(err.details) ? err.details : undefined;
      const bad = details && uncarried(details, "error.details");
      if (bad) {
        // Details the contract cannot carry are dropped, said in the message, rather than making
        // the server refuse the whole report.
        message = `${message} (details dropped: ${bad.path}: ${bad.reason})`;
        details = undefined;
      }
      update = {
        case: "failed",
        value: {
          error: {
            message,
            code: failure ? err.code : "handler_error",
            retryable: failure ? err.retryable : true,
            details: details ? plainJson(details) : undefined,
          },
        },
      };
    }
    this.#final(leaseId, entry, update);
    this.#checkDrained();
  }

  /** A batch of a lease's output: kept until acknowledged (the oldest go past 16 MiB), and sent. */
  #output(leaseId, entry, chunks) {
    const report = {
      leaseId,
      taskId: entry.taskId,
      fencingToken: entry.fencingToken,
      update: { case: "output", value: { chunks } },
    };
    const number = ++this.#nextOutput;
    this.unackedOutput.set(number, report);
    this.#unackedOutputBytes += outputBytes(report);
    for (const [oldest, kept] of this.unackedOutput) {
      if (this.#unackedOutputBytes <= UNACKED_OUTPUT_BYTES) break;
      this.unackedOutput.delete(oldest);
      this.#unackedOutputBytes -= outputBytes(kept);
    }
    const s = this.#session;
    if (s) s.outputSeqs.set(s.send({ case: "leaseUpdate", value: report }), number);
  }

  #outputAcknowledged(number) {
    const report = this.unackedOutput.get(number);
    if (report === undefined) return;
    this.unackedOutput.delete(number);
    this.#unackedOutputBytes -= outputBytes(report);
  }

  #final(leaseId, entry, update) {
    const report = { leaseId, taskId: entry.taskId, fencingToken: entry.fencingToken, update };
    this.unackedFinals.set(leaseId, report);
    const s = this.#session;
    if (s) s.finalSeqs.set(s.send({ case: "leaseUpdate", value: report }), leaseId);
  }
}
