"""A task's output on the runner (the Rust agent's ``output.rs``): what a handler writes with
:meth:`~switchyard_runner.handlers.TaskContext.log`, ``print`` (``sys.stdout``/``sys.stderr``) and
``logging``, line-buffered per stream, batched (every :attr:`OutputLimits.flush_every`, or at once
when a batch fills), and bounded per task by a total and a rate. Past either bound the newest
output is kept in a tail of :attr:`OutputLimits.tail_bytes` and the rest dropped; the tail goes
out when the rate allows or the task ends, its first chunk saying how many bytes were dropped
before it. The batches go to the session in order, before the lease's final report.

Capture follows the handler, not the process: :func:`install_capture` puts a proxy in front of
``sys.stdout`` and ``sys.stderr`` and a handler on the root logger, and both send to the output of
the task whose handler is running in the current context (a :mod:`contextvars` variable the runner
sets for each handler; threads started with ``asyncio.to_thread`` and tasks created inside a
handler inherit it). Anything written outside a handler goes where it always went. ``logging``
records reach the task when they pass the levels the program configured (``WARNING`` and above by
default, as for any handler of the root logger); the runner's own records are not the task's.
Output of a subprocess a handler starts goes to the process's descriptors, not the task: pass it
through ``ctx.log`` or ``print``.
"""

from __future__ import annotations

import contextvars
import io
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from switchyard_runner.v1 import agent_service_pb2 as pb, task_pb2

STDOUT = task_pb2.OUTPUT_STREAM_STDOUT
STDERR = task_pb2.OUTPUT_STREAM_STDERR
LOG = task_pb2.OUTPUT_STREAM_LOG

CHUNK_BYTES = 32 * 1024
"""The most text one chunk carries (the server keeps 64 KiB of one)."""

LINE_BYTES = 16 * 1024
"""A line longer than this is sent in pieces."""


@dataclass(frozen=True)
class OutputLimits:
    """How much of a task's output the runner sends, and how it batches it (as the Rust agent)."""

    max_bytes: int = 8 * 1024 * 1024
    """Most bytes sent per task (the tail sent at its end aside)."""
    bytes_per_sec: int = 1024 * 1024
    """Bytes per second sent per task, on average."""
    burst_bytes: int = 1024 * 1024
    """Bytes a task may send at once before the rate holds it back."""
    tail_bytes: int = 64 * 1024
    """The newest output kept while over a bound, sent when the rate allows or the task ends."""
    flush_every: float = 0.25
    """Seconds between sends of pending output."""
    batch_bytes: int = 64 * 1024
    """Pending output that is sent at once."""


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class _Tail:
    """Output kept past a bound: the newest, and what was dropped before it."""

    def __init__(self) -> None:
        self.blocks: deque[list] = deque()
        self.bytes = 0
        self.dropped = 0

    def push(self, stream: int, text: str, limit: int) -> None:
        size = _size(text)
        self.blocks.append([stream, text, size])
        self.bytes += size
        while self.bytes > limit and self.blocks:
            front = self.blocks[0]
            excess = self.bytes - limit
            if front[2] <= excess:
                self.blocks.popleft()
                self.bytes -= front[2]
                self.dropped += front[2]
                continue
            data = front[1].encode("utf-8", "surrogatepass")
            cut = excess
            newline = data.find(b"\n", cut)
            if newline >= 0:
                cut = newline + 1
            rest = data[cut:].decode("utf-8", "ignore")
            gone = len(data) - _size(rest)
            front[1], front[2] = rest, _size(rest)
            self.bytes -= gone
            self.dropped += gone
            if not rest:
                self.blocks.popleft()


class OutputBuffer:
    """One lease's output between its handler and the session; safe to write from any thread.
    ``deliver`` gets each batch (a list of ``OutputChunk``), in order, with the buffer's lock
    held."""

    def __init__(
        self, limits: OutputLimits, deliver: Callable[[list], None], clock: Callable[[], float] = time.monotonic
    ):
        self.limits = limits
        self._deliver = deliver
        self._clock = clock
        self._lock = threading.Lock()
        self._sequence = 0
        self._partial: dict[int, list] = {STDOUT: ["", False], STDERR: ["", False], LOG: ["", False]}
        self._pending: list[list] = []
        self._pending_bytes = 0
        self._tail: _Tail | None = None
        self._tokens = float(limits.burst_bytes)
        self._refilled = clock()
        self._sent = 0
        self.closed = False

    def write(self, stream: int, text: str) -> None:
        """Writes ``text`` to ``stream`` (lines are sent whole where they can be)."""
        if not text:
            return
        with self._lock:
            if self.closed:
                return
            slot = self._partial[stream]
            slot[0] += text
            end = slot[0].rfind("\n")
            if end < 0 and _size(slot[0]) < LINE_BYTES:
                return
            whole = len(slot[0]) if end < 0 else end + 1
            lines, slot[0], slot[1] = slot[0][:whole], slot[0][whole:], False
            self._admit(stream, lines)

    def flush(self, last: bool = False) -> bool:
        """Sends what is pending (and a line left open since the last flush); with ``last``,
        everything left, the tail included, and takes no more output. False once closed."""
        with self._lock:
            if self.closed:
                return False
            for stream, slot in self._partial.items():
                if not slot[0]:
                    continue
                if last or slot[1]:
                    text, slot[0], slot[1] = slot[0], "", False
                    self._admit(stream, text)
                else:
                    slot[1] = True
            self._refill()
            tail = self._tail
            release = tail is not None and (
                last or (self._tokens >= tail.bytes and self._sent + tail.bytes <= self.limits.max_bytes)
            )
            dropped = 0
            if release and tail is not None:
                self._tail = None
                dropped = tail.dropped
                self._send(0)
                for stream, text, _ in tail.blocks:
                    self._pend(stream, text)
            self._send(dropped)
            if last:
                self.closed = True
            return True

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(
            float(self.limits.burst_bytes), self._tokens + (now - self._refilled) * self.limits.bytes_per_sec
        )
        self._refilled = now

    def _admit(self, stream: int, text: str) -> None:
        if self._tail is not None:
            self._tail.push(stream, text, self.limits.tail_bytes)
            return
        self._refill()
        allowance = int(min(max(self._tokens, 0.0), max(self.limits.max_bytes - self._sent, 0)))
        data = text.encode("utf-8", "surrogatepass")
        if len(data) <= allowance:
            taken = len(data)
        else:
            newline = data.rfind(b"\n", 0, allowance)
            taken = newline + 1 if newline >= 0 else 0
        if taken:
            self._pend(stream, data[:taken].decode("utf-8", "surrogatepass"))
        if taken < len(data):
            tail = _Tail()
            tail.push(stream, data[taken:].decode("utf-8", "surrogatepass"), self.limits.tail_bytes)
            self._tail = tail
        if self._pending_bytes >= self.limits.batch_bytes:
            self._send(0)

    def _pend(self, stream: int, text: str) -> None:
        size = _size(text)
        self._tokens -= size
        self._sent += size
        self._pending_bytes += size
        if self._pending and self._pending[-1][0] == stream and self._pending[-1][2] + size <= CHUNK_BYTES:
            self._pending[-1][1] += text
            self._pending[-1][2] += size
        else:
            self._pending.append([stream, text, size])

    def _send(self, dropped: int) -> None:
        chunks = []
        for stream, text, _ in self._pending:
            data = text.encode("utf-8", "surrogatepass")
            while data:
                piece = data[:CHUNK_BYTES]
                # Never cut a character in two.
                while piece and (data[len(piece) : len(piece) + 1] or b"\x00")[0] & 0xC0 == 0x80:
                    piece = piece[:-1]
                self._sequence += 1
                chunks.append(
                    pb.OutputChunk(
                        stream=stream,
                        sequence=self._sequence,
                        text=piece.decode("utf-8", "replace"),
                        dropped_bytes=dropped,
                    )
                )
                dropped = 0
                data = data[len(piece) :]
        if dropped:
            self._sequence += 1
            chunks.append(pb.OutputChunk(stream=STDOUT, sequence=self._sequence, dropped_bytes=dropped))
        self._pending = []
        self._pending_bytes = 0
        if chunks:
            self._deliver(chunks)


current_output: contextvars.ContextVar[OutputBuffer | None] = contextvars.ContextVar(
    "switchyard_current_output", default=None
)
"""The output of the task whose handler runs in this context (set by the runner)."""


class _StreamProxy(io.TextIOBase):
    """Stands in for ``sys.stdout`` or ``sys.stderr``: a write in a handler's context goes to its
    task's output, any other to the stream it replaced."""

    def __init__(self, original, stream: int):
        self._original = original
        self._stream = stream

    def write(self, text: str) -> int:
        output = current_output.get()
        if output is None:
            return self._original.write(text)
        output.write(self._stream, text)
        return len(text)

    def flush(self) -> None:
        if current_output.get() is None:
            self._original.flush()

    def __getattr__(self, name: str):
        return getattr(self._original, name)


class _TaskLogHandler(logging.Handler):
    """Sends the records logged in a handler's context to its task's log stream (the runner's own
    records excepted)."""

    def emit(self, record: logging.LogRecord) -> None:
        output = current_output.get()
        if output is None or record.name.startswith("switchyard_runner"):
            return
        try:
            output.write(LOG, self.format(record) + "\n")
        except Exception:  # a record that cannot be formatted is logging's to report
            self.handleError(record)


_installed = threading.Lock()


def install_capture() -> None:
    """Routes ``print`` and ``logging`` in handlers to their tasks' output. Idempotent; called by
    every :meth:`Runner.run`, so a program (or a test harness) that replaced ``sys.stdout`` since is
    captured again."""
    with _installed:
        if not isinstance(sys.stdout, _StreamProxy):
            sys.stdout = _StreamProxy(sys.stdout, STDOUT)
        if not isinstance(sys.stderr, _StreamProxy):
            sys.stderr = _StreamProxy(sys.stderr, STDERR)
        root = logging.getLogger()
        if not any(isinstance(h, _TaskLogHandler) for h in root.handlers):
            handler = _TaskLogHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            root.addHandler(handler)
