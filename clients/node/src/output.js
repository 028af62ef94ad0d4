// A task's output on the runner (the Rust agent's `output.rs`): what a handler writes with
// `ctx.log(...)`, `console` (`process.stdout` and `process.stderr`), line-buffered per stream,
// batched (every `flushEveryMs`, or at once when a batch fills) and bounded per task by a total
// and a rate. Past either bound the newest output is kept in a tail of `tailBytes` and the rest
// dropped; the tail goes out when the rate allows or the task ends, its first chunk saying how
// many bytes were dropped before it. Batches go to the session in order, before the lease's final
// report.
//
// Capture follows the handler, not the process: `installCapture()` wraps `process.stdout.write`
// and `process.stderr.write` (which `console` writes through), and a write made in a handler's
// async context (an AsyncLocalStorage the runner enters for each handler; promises, timers and
// callbacks started inside inherit it) goes to its task's output. Anything written outside a
// handler goes where it always went. A child process a handler starts writes to its own
// descriptors, not the task: pipe it through `console` or `ctx.log`.
import { AsyncLocalStorage } from "node:async_hooks";
import { format } from "node:util";
import { OutputStream } from "./gen/switchyard/v1/task_pb.js";

/** How much of a task's output the runner sends, and how it batches it (as the Rust agent). */
export const DEFAULT_OUTPUT_LIMITS = Object.freeze({
  /** Most bytes sent per task (the tail sent at its end aside). */
  maxBytes: 8 * 1024 * 1024,
  /** Bytes per second sent per task, on average. */
  bytesPerSec: 1024 * 1024,
  /** Bytes a task may send at once before the rate holds it back. */
  burstBytes: 1024 * 1024,
  /** The newest output kept while over a bound, sent when the rate allows or the task ends. */
  tailBytes: 64 * 1024,
  /** How often pending output is sent. */
  flushEveryMs: 250,
  /** Pending output that is sent at once. */
  batchBytes: 64 * 1024,
});

/** The most text one chunk carries (the server keeps 64 KiB of one). */
const CHUNK_BYTES = 32 * 1024;
/** A line longer than this is sent in pieces. */
const LINE_BYTES = 16 * 1024;

const bytes = (text) => Buffer.byteLength(text, "utf8");

/** `text`'s first `n` bytes (fewer if a character would be cut), as text. */
function headBytes(text, n) {
  const data = Buffer.from(text, "utf8");
  let end = Math.min(n, data.length);
  while (end > 0 && end < data.length && (data[end] & 0xc0) === 0x80) end -= 1;
  return data.subarray(0, end).toString("utf8");
}

/** Output kept past a bound: the newest, and what was dropped before it. */
class Tail {
  blocks = [];
  bytes = 0;
  dropped = 0;

  push(stream, text, limit) {
    this.blocks.push({ stream, text, size: bytes(text) });
    this.bytes += this.blocks.at(-1).size;
    while (this.bytes > limit && this.blocks.length > 0) {
      const front = this.blocks[0];
      const excess = this.bytes - limit;
      if (front.size <= excess) {
        this.blocks.shift();
        this.bytes -= front.size;
        this.dropped += front.size;
        continue;
      }
      const data = Buffer.from(front.text, "utf8");
      let cut = excess;
      const newline = data.indexOf(10, cut);
      if (newline >= 0) cut = newline + 1;
      while (cut < data.length && (data[cut] & 0xc0) === 0x80) cut += 1;
      const rest = data.subarray(cut).toString("utf8");
      this.bytes -= front.size - bytes(rest);
      this.dropped += front.size - bytes(rest);
      front.text = rest;
      front.size = bytes(rest);
      if (!rest) this.blocks.shift();
    }
  }
}

/**
 * One lease's output between its handler and the session. `deliver(chunks)` gets each batch (a
 * list of `OutputChunk` values), in order.
 */
export class OutputBuffer {
  constructor(limits, deliver, clock = () => performance.now() / 1000) {
    this.limits = { ...DEFAULT_OUTPUT_LIMITS, ...limits };
    this.closed = false;
    this.#deliver = deliver;
    this.#clock = clock;
    this.#tokens = this.limits.burstBytes;
    this.#refilled = clock();
    this.#partial = new Map([OutputStream.STDOUT, OutputStream.STDERR, OutputStream.LOG].map((s) => [s, { text: "", stale: false }]));
  }

  #deliver;
  #clock;
  #sequence = 0n;
  #partial;
  #pending = [];
  #pendingBytes = 0;
  #tail = null;
  #tokens;
  #refilled;
  #sent = 0;

  /** Writes `text` to `stream` (lines are sent whole where they can be). */
  write(stream, text) {
    if (this.closed || !text) return;
    const open = this.#partial.get(stream);
    open.text += text;
    const end = open.text.lastIndexOf("\n");
    if (end < 0 && bytes(open.text) < LINE_BYTES) return;
    const whole = end < 0 ? open.text.length : end + 1;
    const lines = open.text.slice(0, whole);
    open.text = open.text.slice(whole);
    open.stale = false;
    this.#admit(stream, lines);
  }

  /**
   * Sends what is pending (and a line left open since the last flush); with `last`, everything
   * left, the tail included, and takes no more output. False once closed.
   */
  flush(last = false) {
    if (this.closed) return false;
    for (const [stream, open] of this.#partial) {
      if (!open.text) continue;
      if (last || open.stale) {
        const text = open.text;
        open.text = "";
        open.stale = false;
        this.#admit(stream, text);
      } else {
        open.stale = true;
      }
    }
    this.#refill();
    const tail = this.#tail;
    const release =
      tail !== null &&
      (last || (this.#tokens >= tail.bytes && this.#sent + tail.bytes <= this.limits.maxBytes));
    let dropped = 0;
    if (release) {
      this.#tail = null;
      dropped = tail.dropped;
      this.#send(0);
      for (const block of tail.blocks) this.#pend(block.stream, block.text);
    }
    this.#send(dropped);
    if (last) this.closed = true;
    return true;
  }

  #refill() {
    const now = this.#clock();
    this.#tokens = Math.min(this.limits.burstBytes, this.#tokens + (now - this.#refilled) * this.limits.bytesPerSec);
    this.#refilled = now;
  }

  #admit(stream, text) {
    if (this.#tail !== null) {
      this.#tail.push(stream, text, this.limits.tailBytes);
      return;
    }
    this.#refill();
    const allowance = Math.floor(Math.min(Math.max(this.#tokens, 0), Math.max(this.limits.maxBytes - this.#sent, 0)));
    const size = bytes(text);
    let taken = text;
    if (size > allowance) {
      const head = headBytes(text, allowance);
      const newline = head.lastIndexOf("\n");
      taken = newline < 0 ? "" : head.slice(0, newline + 1);
    }
    if (taken) this.#pend(stream, taken);
    if (taken.length < text.length) {
      this.#tail = new Tail();
      this.#tail.push(stream, text.slice(taken.length), this.limits.tailBytes);
    }
    if (this.#pendingBytes >= this.limits.batchBytes) this.#send(0);
  }

  #pend(stream, text) {
    const size = bytes(text);
    this.#tokens -= size;
    this.#sent += size;
    this.#pendingBytes += size;
    const last = this.#pending.at(-1);
    if (last && last.stream === stream && last.size + size <= CHUNK_BYTES) {
      last.text += text;
      last.size += size;
    } else {
      this.#pending.push({ stream, text, size });
    }
  }

  #send(dropped) {
    const chunks = [];
    let marker = dropped;
    for (const { stream, text } of this.#pending) {
      let rest = text;
      while (rest) {
        const piece = headBytes(rest, CHUNK_BYTES) || rest.slice(0, 1);
        this.#sequence += 1n;
        chunks.push({ stream, sequence: this.#sequence, text: piece, droppedBytes: BigInt(marker) });
        marker = 0;
        rest = rest.slice(piece.length);
      }
    }
    if (marker > 0) {
      this.#sequence += 1n;
      chunks.push({ stream: OutputStream.STDOUT, sequence: this.#sequence, text: "", droppedBytes: BigInt(marker) });
    }
    this.#pending = [];
    this.#pendingBytes = 0;
    if (chunks.length > 0) this.#deliver(chunks);
  }
}

/** The output of the task whose handler runs in this async context (entered by the runner). */
export const currentOutput = new AsyncLocalStorage();

/**
 * `ctx.log`: a function that writes one line of the handler's own log (`util.format` of its
 * arguments) to the task's `log` stream, with `debug`, `info`, `warn` and `error` methods that
 * prefix the level.
 */
export function taskLog(output) {
  const line = (prefix, args) => {
    const text = prefix + format(...args);
    output.write(OutputStream.LOG, text.endsWith("\n") ? text : `${text}\n`);
  };
  const log = (...args) => line("", args);
  for (const level of ["debug", "info", "warn", "error"]) {
    log[level] = (...args) => line(`${level.toUpperCase()} `, args);
  }
  return log;
}

let installed = false;

/** Routes `process.stdout` and `process.stderr` writes in handlers (and so `console`) to their tasks' output. Idempotent. */
export function installCapture() {
  if (installed) return;
  installed = true;
  for (const [target, stream] of [
    [process.stdout, OutputStream.STDOUT],
    [process.stderr, OutputStream.STDERR],
  ]) {
    const original = target.write;
    target.write = function write(chunk, encoding, callback) {
      const output = currentOutput.getStore();
      if (output === undefined) return original.apply(this, arguments);
      const text = typeof chunk === "string" ? chunk : Buffer.from(chunk).toString(typeof encoding === "string" ? encoding : "utf8");
      output.write(stream, text);
      const done = typeof encoding === "function" ? encoding : callback;
      if (typeof done === "function") queueMicrotask(() => done());
      return true;
    };
  }
}
