"""The Python runner: register, hold one ``Connect`` stream, heartbeat with JSON-Patch diffs of the
capability document, run what it is leased, and report (the Rust agent's ``session.rs``).

The session flow is the one ``AgentService``'s comment describes. Each session registers, sends
Hello (with the leases still held, so running handlers keep running across a reconnect), then
one loop handles everything from one inbox: server messages, heartbeat ticks, handler outcomes,
progress, output, and shutdown. When the stream breaks the runner reconnects with jittered exponential
backoff and re-sends output and final reports not yet acknowledged (the server skips output it
stored and takes a repeated final report idempotently). What a handler writes (``ctx.log``,
``print``, ``logging``) goes up as it is written, batched and bounded, before the lease's final
report (see :mod:`switchyard_runner.output`). ``stop()`` (SIGTERM under :meth:`Runner.run_forever`) drains: a DRAINING heartbeat,
new grants are released, running handlers get the grace period to finish, the rest are
cancelled and released, and :meth:`Runner.run` returns.

The runner registers with the task kinds it advertises (its handlers' kinds, less those withdrawn
because a capability they require is not in its document; see :mod:`switchyard_runner.handlers`), and
a heartbeat carries the whole list again whenever it changes; the server grants it only tasks of
those kinds, and a runner with no handlers nothing. Withdrawals are reported with the DEGRADED
status, after the unhealthy capabilities. Every release says why, for the server: DRAINING while
shutting down, BUSY at capacity, CANNOT_HANDLE for a kind with no handler or a withdrawn one,
CANNOT_DECODE for a grant whose task cannot be turned into a :class:`TaskContext`,
REVOCATION_ACKNOWLEDGED after the server revoked a lease to cancel it, and a handler's
:class:`~switchyard_runner.handlers.Release` its own cause and reason.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import inspect
import logging
import os
import pathlib
import random
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from switchyard_runner import convert
from switchyard_runner.capabilities import Capabilities
from switchyard_runner.core.diff import diff
from switchyard_runner.core.json_util import json_equal
from switchyard_runner.core.pack import Advertised, PackRejection
from switchyard_runner.handlers import Handler, HandlerPack, Handlers, Release, ReleaseCause, Resources, TaskContext, TaskFailure
from switchyard_runner.identity import RUNNER, agent_dir, default_agent_name
from switchyard_runner.output import OutputBuffer, OutputLimits, current_output, install_capture
from switchyard_runner.v1 import agent_pb2, agent_service_pb2 as pb, agent_service_pb2_grpc, capability_pb2, task_pb2

log = logging.getLogger(__name__)

RUNNER_VERSION = "0.1.0"


@dataclass
class RunnerConfig:
    """How a runner connects and behaves. Every field also reads a ``SWITCHYARD_*`` variable
    (see :meth:`from_env`)."""

    server: str = "127.0.0.1:50051"
    """The server (any replica), ``host:port`` (an ``http://`` prefix is accepted)."""
    name: str | None = None
    """The agent's name, unique in its namespace; default ``{hostname}-python-{h}``, ``h`` the first
    six hex digits of the SHA-256 of the agent directory (the working directory without one; see
    :func:`~switchyard_runner.identity.default_agent_name`), so runners sharing a host differ."""
    namespace: str = "default"
    """The namespace to serve."""
    directory: str | os.PathLike | None = None
    """The agent directory with the capability tiers; ``None`` for base facts only. Made absolute,
    symlinks resolved, when the config is made (a ``pathlib.Path`` then), so scripts and tier reads
    never depend on the working directory; one that does not exist or is not a directory raises
    :class:`~switchyard_runner.identity.AgentDirectoryError`."""
    capacity: int | None = None
    """Maximum concurrent leases; default ``max_concurrent_tasks`` from the document, else 1."""
    token: str | None = field(default=None, repr=False)
    """Bearer token (agent role); never printed."""
    ca_file: str | os.PathLike | None = None
    """CA bundle (PEM) that an ``https://`` server's certificate must chain to."""
    cert_file: str | os.PathLike | None = None
    """Client certificate (PEM), for servers that require mTLS."""
    key_file: str | os.PathLike | None = None
    """Client key (PEM), for servers that require mTLS."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels sent at registration."""
    refresh_interval: float = 30.0
    """Seconds between refreshes of memory/load and checks of the tier files."""
    script_timeout: float = 10.0
    """Seconds the dynamic capability script may run."""
    grace_period: float = 30.0
    """Seconds running handlers get to finish after ``stop()`` before they are released."""
    backoff_initial: float = 0.25
    """First reconnect delay in seconds (jittered 0.5x to 1.5x, doubling)."""
    backoff_max: float = 30.0
    """Longest reconnect delay in seconds."""
    params: Callable[[str], str | None] = field(default=os.environ.get, repr=False)
    """Looks up pack parameter values by name (default: the environment). Values are never sent."""
    output: OutputLimits = field(default_factory=OutputLimits)
    """How much of each task's output (``ctx.log``, ``print``, ``logging``) is sent, and how it is
    batched; ``SWITCHYARD_OUTPUT_MAX_BYTES`` and ``SWITCHYARD_OUTPUT_BYTES_PER_SEC`` set the bounds."""

    @classmethod
    def from_env(cls, **overrides: Any) -> RunnerConfig:
        """A config from ``SWITCHYARD_SERVER``, ``SWITCHYARD_AGENT_NAME``, ``SWITCHYARD_NAMESPACE``,
        ``SWITCHYARD_AGENT_DIR``, ``SWITCHYARD_CAPACITY``, ``SWITCHYARD_TOKEN``,
        ``SWITCHYARD_REFRESH_SECS``, ``SWITCHYARD_SCRIPT_TIMEOUT_SECS`` and ``SWITCHYARD_GRACE_SECS``,
        then ``overrides``."""
        env = os.environ.get
        config = cls()
        values: dict[str, Any] = {
            "server": env("SWITCHYARD_SERVER", config.server),
            "name": env("SWITCHYARD_AGENT_NAME"),
            "namespace": env("SWITCHYARD_NAMESPACE", config.namespace),
            "directory": env("SWITCHYARD_AGENT_DIR"),
            "capacity": int(env("SWITCHYARD_CAPACITY")) if env("SWITCHYARD_CAPACITY") else None,
            "token": env("SWITCHYARD_TOKEN"),
            "ca_file": env("SWITCHYARD_CA_FILE"),
            "cert_file": env("SWITCHYARD_TLS_CERT"),
            "key_file": env("SWITCHYARD_TLS_KEY"),
            "refresh_interval": float(env("SWITCHYARD_REFRESH_SECS", config.refresh_interval)),
            "script_timeout": float(env("SWITCHYARD_SCRIPT_TIMEOUT_SECS", config.script_timeout)),
            "grace_period": float(env("SWITCHYARD_GRACE_SECS", config.grace_period)),
        }
        rate = int(env("SWITCHYARD_OUTPUT_BYTES_PER_SEC", config.output.bytes_per_sec))
        values["output"] = replace(
            config.output,
            max_bytes=int(env("SWITCHYARD_OUTPUT_MAX_BYTES", config.output.max_bytes)),
            bytes_per_sec=max(1, rate),
            burst_bytes=max(1, rate),
        )
        values.update(overrides)
        return replace(config, **values)

    def __post_init__(self) -> None:
        if self.directory is not None:
            self.directory = agent_dir(self.directory)


@dataclass
class _Running:
    """A lease being worked on."""

    task_id: str
    fencing_token: int
    context: TaskContext
    job: asyncio.Task | None = None
    canceled: bool = False
    """The server revoked it for cancellation: report it released (REVOCATION_ACKNOWLEDGED)."""
    shut_down: bool = False
    """The grace period ran out: report it released (DRAINING)."""


class _Reconnect(Exception):
    def __init__(self, after: float):
        super().__init__(f"reconnect after {after}s")
        self.after = after


class Runner:
    """A Switchyard runner: capabilities from an agent directory, handlers by task kind.

    >>> runner = Runner(server="127.0.0.1:50051", directory=".")
    >>> @runner.handler("echo")
    ... async def echo(task: TaskContext) -> dict:
    ...     return {"echo": task.payload}
    >>> @runner.handler("summarize", requires=["ai.llm@1"])  # withdrawn while ai.llm is not there
    ... async def summarize(task: TaskContext) -> dict:
    ...     return {"summary": "..."}
    >>> runner.run_forever()  # doctest: +SKIP
    """

    def __init__(self, config: RunnerConfig | None = None, **overrides: Any):
        self.config = replace(config or RunnerConfig(), **overrides)
        """The configuration."""
        self.handlers = Handlers()
        """The handlers and packs."""
        self.capabilities = Capabilities(self.config.directory, self.config.script_timeout)
        """The capability document (loaded by :meth:`run`)."""
        # The directory the default name is derived from: the agent directory, else the working
        # directory when the runner was made.
        self._name_dir = self.config.directory if self.config.directory is not None else agent_dir(os.getcwd())
        self.agent_id: str | None = None
        """The id the server gave this agent (after the first registration)."""
        self.connected = asyncio.Event()
        """Set while a session is welcomed; cleared when it ends."""
        self._running: dict[str, _Running] = {}
        self._unacked_finals: dict[str, pb.LeaseUpdate] = {}
        # Output reports not yet acknowledged, oldest first, by a number of their own: resent after
        # a reconnect, before the finals (the server skips what it stored already).
        self._unacked_output: collections.OrderedDict[int, pb.LeaseUpdate] = collections.OrderedDict()
        self._unacked_output_bytes = 0
        self._next_output = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: asyncio.Queue | None = None
        self._session_id = 0
        self._draining = False
        self._grace_deadline: float | None = None
        self._wake = asyncio.Event()
        self._unhealthy: list[str] = []
        self._stopped = asyncio.Event()

    # ----- registration ------------------------------------------------------------------

    def handler(self, kind: str, requires: Sequence[str] = ()) -> Callable[[Handler], Handler]:
        """Decorator: ``@runner.handler("kind")`` registers a handler as a pack of its own (id = kind);
        ``requires=["ai.llm@1"]`` withdraws the kind while that capability is not there."""

        def register(fn: Handler) -> Handler:
            self.add_handler(kind, fn, requires)
            return fn

        return register

    def add_handler(self, kind: str, fn: Handler, requires: Sequence[str] = ()) -> None:
        """Registers ``fn`` for ``kind``, needing the capabilities ``requires`` (``name@major``, or a
        name alone for any version); a kind already claimed or malformed is reported, not raised."""
        self.pack(HandlerPack(id=kind, handlers={kind: fn}, requires=tuple(requires)))

    def pack(self, pack: HandlerPack) -> None:
        """Adds a handler pack; the first registration of a pack id, kind or capability wins. While
        running, the next heartbeat (sent at once) advertises the new kinds."""
        self.handlers.add(pack)
        for r in self.handlers.rejections:
            log.debug("pack %s: %s %s rejected: %s", r.pack, r.kind, r.id, r.reason)
        self._update_provides()
        self._post(("tick", None))

    @property
    def rejections(self) -> list[PackRejection]:
        """What the pack merge rejected."""
        return self.handlers.rejections

    def _update_provides(self) -> None:
        provides, self._unhealthy = self.handlers.provides(self.config.params)
        self.capabilities.provides = provides
        self.capabilities.merge()

    @property
    def advertised(self) -> Advertised:
        """The kinds the runner advertises given its document now, and those withdrawn."""
        return self.handlers.advertise(self.capabilities.document)

    @property
    def unhealthy(self) -> list[str]:
        """Why the runner is DEGRADED (unhealthy capabilities, then withdrawn handlers), if it is."""
        return list(self._unhealthy) + [w.reason for w in self.advertised.withdrawn]

    # ----- capabilities ------------------------------------------------------------------

    def set_capabilities(self, values: dict) -> None:
        """Merges ``values`` (RFC 7386; ``None`` deletes) into the dynamic tier and sends the diff
        with the next heartbeat, which is sent at once."""
        self.capabilities.set_runtime(values)
        self._post(("tick", None))

    async def refresh_capabilities(self, force: bool = True) -> None:
        """Re-reads the tier files (all of them when ``force``) and heartbeats any change at once."""
        if await self.capabilities.refresh(force):
            self._post(("tick", None))

    # ----- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Begins draining: DRAINING heartbeat, no new leases, running handlers get the grace period."""
        if self._draining:
            return
        log.info("shutting down: draining %d running lease(s)", len(self._running))
        self._draining = True
        self._grace_deadline = time.monotonic() + self.config.grace_period
        self._wake.set()
        self._post(("stop", None))

    def run_forever(self) -> None:
        """Runs until SIGTERM or SIGINT, then drains and returns (exit status 0)."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self.stop)
                except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
                    pass
            await self.run()

        asyncio.run(main())

    async def run(self) -> None:
        """Runs the runner until :meth:`stop` and the drain finish."""
        self._loop = asyncio.get_running_loop()
        install_capture()
        self._inbox = asyncio.Queue()
        self._wake = asyncio.Event()
        self._update_provides()
        await self.capabilities.load()
        refresher = asyncio.create_task(self._refresh_loop())
        grace = asyncio.create_task(self._grace_watch())
        backoff = self.config.backoff_initial
        try:
            while True:
                if self._finished():
                    return
                try:
                    await self._session()
                    return
                except _Reconnect as r:
                    backoff = self.config.backoff_initial
                    log.info("server asked us to reconnect in %.2fs", r.after)
                    await self._sleep_or_wake(r.after)
                except (grpc.RpcError, ConnectionError, OSError, asyncio.TimeoutError, _StreamEnded) as err:
                    if self._finished():
                        return
                    if self._hard_deadline_passed():
                        log.warning("gave up reporting %d lease(s) after shutdown", len(self._unacked_finals))
                        return
                    wait = backoff * random.uniform(0.5, 1.5)
                    log.warning("session ended (%s); reconnecting in %.2fs", _describe(err), wait)
                    await self._sleep_or_wake(wait)
                    backoff = min(backoff * 2, self.config.backoff_max)
        finally:
            self.connected.clear()
            refresher.cancel()
            grace.cancel()
            for running in list(self._running.values()):
                if running.job is not None:
                    running.job.cancel()
            self._stopped.set()

    def _finished(self) -> bool:
        return self._draining and not self._running and not self._unacked_finals

    def _hard_deadline_passed(self) -> bool:
        # After the grace period, a few more seconds to deliver the releases.
        return self._grace_deadline is not None and time.monotonic() > self._grace_deadline + 5.0

    async def _sleep_or_wake(self, seconds: float) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def wait_connected(self, timeout: float = 10.0) -> None:
        """Waits until a session is welcomed."""
        await asyncio.wait_for(self.connected.wait(), timeout)

    def _post(self, event: tuple) -> None:
        """Queues ``event`` for the session loop, from any thread; events keep their order (a
        lease's output before its final report)."""
        inbox, loop = self._inbox, self._loop
        if inbox is None or loop is None:
            return
        try:
            loop.call_soon_threadsafe(inbox.put_nowait, event)
        except RuntimeError:  # the loop is closed: the runner is gone
            pass

    def _keep_output(self, update: pb.LeaseUpdate) -> int:
        """Keeps an output report until it is acknowledged (the oldest go past 16 MiB); its number."""
        self._next_output += 1
        self._unacked_output[self._next_output] = update
        self._unacked_output_bytes += _output_bytes(update)
        while self._unacked_output_bytes > _UNACKED_OUTPUT_BYTES and self._unacked_output:
            _, oldest = self._unacked_output.popitem(last=False)
            self._unacked_output_bytes -= _output_bytes(oldest)
        return self._next_output

    def _output_acknowledged(self, number: int) -> None:
        update = self._unacked_output.pop(number, None)
        if update is not None:
            self._unacked_output_bytes -= _output_bytes(update)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh_interval)
            try:
                if await self.capabilities.refresh():
                    log.debug("capability document changed")
            except Exception:  # a refresh never stops the runner
                log.exception("refreshing capabilities failed")

    async def _grace_watch(self) -> None:
        while self._grace_deadline is None:
            await self._wake.wait()
            await asyncio.sleep(0)
        await asyncio.sleep(max(0.0, self._grace_deadline - time.monotonic()))
        if self._running:
            log.warning("grace period over: releasing %d running lease(s)", len(self._running))
        for running in list(self._running.values()):
            running.shut_down = True
            running.context.cancelled.set()
            if running.job is not None:
                running.job.cancel()

    # ----- the session -------------------------------------------------------------------

    def _target(self) -> str:
        server = self.config.server
        for prefix in ("http://", "https://", "grpc://"):
            server = server.removeprefix(prefix)
        return server.rstrip("/")

    def _channel(self) -> grpc.aio.Channel:
        """Plaintext for ``http://`` (or no scheme); TLS, verified against ``ca_file``, for ``https://``."""
        if not self.config.server.startswith("https://"):
            return grpc.aio.insecure_channel(self._target())

        def read(path: str | os.PathLike | None) -> bytes | None:
            return pathlib.Path(path).read_bytes() if path else None

        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(self.config.ca_file),
            private_key=read(self.config.key_file),
            certificate_chain=read(self.config.cert_file),
        )
        return grpc.aio.secure_channel(self._target(), credentials)

    def _metadata(self) -> tuple:
        return (("authorization", f"Bearer {self.config.token}"),) if self.config.token else ()

    def _capacity(self) -> int:
        if self.config.capacity:
            return max(1, self.config.capacity)
        n = self.capabilities.document.get("max_concurrent_tasks")
        return max(1, n) if isinstance(n, int) and not isinstance(n, bool) else 1

    @property
    def name(self) -> str:
        """The name the runner registers under: the configured one, else
        ``{hostname}-python-{h}`` (the document's hostname; ``h`` from the agent directory, or the
        working directory of a runner without one)."""
        if self.config.name:
            return self.config.name
        host = self.capabilities.document.get("hostname")
        host = host if isinstance(host, str) and host else socket.gethostname() or "runner"
        return default_agent_name(host, RUNNER, self._name_dir)

    def _status(self) -> tuple[int, list[str]]:
        """DRAINING while shutting down, else DEGRADED while a capability is unhealthy or a handler
        is withdrawn."""
        if self._draining:
            return agent_pb2.AGENT_STATUS_DRAINING, ["agent shutting down"]
        reasons = self.unhealthy
        if reasons:
            return agent_pb2.AGENT_STATUS_DEGRADED, reasons
        return agent_pb2.AGENT_STATUS_READY, []

    async def _session(self) -> None:
        """One session: register, connect, serve until it ends (returns when drained)."""
        assert self._inbox is not None
        self._session_id += 1
        sid = self._session_id
        metadata = self._metadata()
        channel = self._channel()
        tasks: list[asyncio.Task] = []
        outbound: asyncio.Queue = asyncio.Queue()
        call = None
        try:
            stub = agent_service_pb2_grpc.AgentServiceStub(channel)
            await self.capabilities.refresh()
            merged = self.capabilities.merged
            sent_kinds = self.handlers.advertise(merged.document).kinds
            reg = await stub.RegisterAgent(
                pb.RegisterAgentRequest(
                    name=self.name,
                    namespace=self.config.namespace,
                    capabilities=convert.to_struct(merged.document),
                    capacity=self._capacity(),
                    labels=dict(self.config.labels),
                    provenance=convert.provenance_entries(merged),
                    rejections=convert.rejections(merged),
                    runner=f"switchyard-runner/{RUNNER_VERSION} (python)",
                    handled_kinds=sent_kinds,
                ),
                timeout=10,
                metadata=metadata,
            )
            self.agent_id = reg.agent_id
            generation = reg.capability_generation
            sent_doc = copy.deepcopy(merged.document)
            interval = max(0.1, convert.duration_seconds(reg.heartbeat_interval, 5.0))

            sequence = 0

            def send(**message: Any) -> int:
                nonlocal sequence
                sequence += 1
                outbound.put_nowait(pb.ConnectRequest(sequence=sequence, **message))
                return sequence

            async def requests():
                while True:
                    item = await outbound.get()
                    if item is None:
                        return
                    yield item

            held = [
                pb.HeldLease(lease_id=lease_id, task_id=r.task_id, fencing_token=r.fencing_token)
                for lease_id, r in self._running.items()
            ] + [
                pb.HeldLease(lease_id=lease_id, task_id=u.task_id, fencing_token=u.fencing_token)
                for lease_id, u in self._unacked_finals.items()
                if lease_id not in self._running
            ]
            send(hello=pb.Hello(agent_id=reg.agent_id, session_epoch=reg.session_epoch, held_leases=held))
            call = stub.Connect(requests(), metadata=metadata)
            tasks.append(asyncio.create_task(self._read(call, sid)))
            tasks.append(asyncio.create_task(self._tick(interval, sid)))
            log.info("registered as %s (epoch %d)", reg.agent_id, reg.session_epoch)

            final_seqs: dict[int, str] = {}
            output_seqs: dict[int, int] = {}
            sent_finals: set[str] = set()
            # Output first: a lease's output comes before its final report.
            for number, update in list(self._unacked_output.items()):
                output_seqs[send(lease_update=update)] = number
            for lease_id, update in list(self._unacked_finals.items()):
                final_seqs[send(lease_update=update)] = lease_id
                sent_finals.add(lease_id)
            if self._draining:
                send(heartbeat=self._heartbeat(None))
            pending_doc: tuple[int, dict] | None = None

            while True:
                if self._finished():
                    log.info("drained: nothing left to run or report")
                    outbound.put_nowait(None)
                    return
                event = await self._inbox.get()
                what, event_sid = event[0], event[1]
                if event_sid is not None and event_sid != sid:
                    continue  # from an earlier session
                if what == "down":
                    message: pb.ConnectResponse = event[2]
                    kind = message.WhichOneof("message")
                    if kind == "welcome":
                        generation = message.welcome.capability_generation
                        for revoked in message.welcome.revoked:
                            running = self._running.pop(revoked.lease_id, None)
                            if running is not None:
                                log.warning("server no longer knows lease %s; stopping it", revoked.lease_id)
                                self._cancel(running)
                        self.connected.set()
                    elif kind == "lease_grant":
                        self._grant(message.lease_grant, send)
                    elif kind == "lease_revocation":
                        self._revoke(message.lease_revocation)
                    elif kind == "ack":
                        ack = message.ack
                        if pending_doc is not None and pending_doc[0] == ack.sequence:
                            if ack.code == 0 and ack.capability_generation != generation:
                                generation = ack.capability_generation
                                sent_doc = pending_doc[1]
                            pending_doc = None
                        number = output_seqs.pop(ack.sequence, None)
                        if number is not None:
                            if ack.code != 0:
                                log.debug("output refused (%d): %s", ack.code, ack.message)
                            self._output_acknowledged(number)
                        lease_id = final_seqs.pop(ack.sequence, None)
                        if lease_id is not None:
                            if ack.code != 0:
                                log.warning("final report for %s refused: %s", lease_id, ack.message)
                            self._unacked_finals.pop(lease_id, None)
                        elif ack.code != 0:
                            log.debug("message %d refused (%d): %s", ack.sequence, ack.code, ack.message)
                    elif kind == "resync_request":
                        log.info("server asked for the full document: %s", message.resync_request.reason)
                        merged = self.capabilities.merged
                        doc = copy.deepcopy(merged.document)
                        seq = send(
                            capability_snapshot=pb.CapabilitySnapshot(
                                capabilities=convert.to_struct(doc),
                                provenance=convert.provenance_entries(merged),
                                rejections=convert.rejections(merged),
                            )
                        )
                        generation = message.resync_request.server_generation
                        pending_doc = (seq, doc)
                    elif kind == "drain":
                        after = convert.duration_seconds(message.drain.reconnect_after, 1.0)
                        if not message.drain.HasField("reconnect_after"):
                            after = 1.0
                        log.info("server drained this session: %s", message.drain.reason)
                        raise _Reconnect(after)
                elif what == "closed":
                    raise _StreamEnded(event[2])
                elif what == "tick":
                    diff_message = None
                    doc = self.capabilities.document
                    if pending_doc is None and not json_equal(doc, sent_doc):
                        doc = copy.deepcopy(doc)
                        diff_message = capability_pb2.CapabilityDiff(
                            base_generation=generation, operations=convert.patch_to_proto(diff(sent_doc, doc))
                        )
                    kinds = self.advertised.kinds
                    changed_kinds = kinds if kinds != sent_kinds else None
                    seq = send(heartbeat=self._heartbeat(diff_message, changed_kinds))
                    if diff_message is not None:
                        pending_doc = (seq, doc)
                    if changed_kinds is not None:
                        log.info("handled kinds changed: %s", kinds)
                        sent_kinds = kinds
                elif what == "stop":
                    send(heartbeat=self._heartbeat(None))
                elif what == "progress":
                    lease_id, percent, text = event[2:]
                    running = self._running.get(lease_id)
                    if running is not None:
                        send(
                            lease_update=pb.LeaseUpdate(
                                lease_id=lease_id,
                                task_id=running.task_id,
                                fencing_token=running.fencing_token,
                                progress=task_pb2.TaskProgress(percent=percent, message=text),
                            )
                        )
                elif what == "output":
                    lease_id, task_id, fencing_token, chunks = event[2:]
                    update = pb.LeaseUpdate(
                        lease_id=lease_id,
                        task_id=task_id,
                        fencing_token=fencing_token,
                        output=pb.TaskOutput(chunks=chunks),
                    )
                    output_seqs[send(lease_update=update)] = self._keep_output(update)
                elif what == "final":
                    lease_id = event[2]
                    update = self._unacked_finals.get(lease_id)
                    if update is not None and lease_id not in sent_finals:
                        final_seqs[send(lease_update=update)] = lease_id
                        sent_finals.add(lease_id)
        finally:
            self.connected.clear()
            outbound.put_nowait(None)
            for task in tasks:
                task.cancel()
            if call is not None:
                call.cancel()
            await channel.close(grace=None)

    def _heartbeat(
        self, capability_diff: capability_pb2.CapabilityDiff | None, handled_kinds: list[str] | None = None
    ) -> pb.Heartbeat:
        """Status and reasons, load, the diff if any, and the handled kinds when they changed."""
        status, reasons = self._status()
        load = self.capabilities.document.get("loadavg", {})
        one = load.get("1min", 0.0) if isinstance(load, dict) else 0.0
        heartbeat = pb.Heartbeat(
            status=status,
            status_reasons=reasons,
            load=pb.AgentLoad(running_leases=len(self._running), load_average=float(one or 0.0)),
        )
        if capability_diff is not None:
            heartbeat.capability_diff.CopyFrom(capability_diff)
        if handled_kinds is not None:
            heartbeat.handled_kinds.CopyFrom(pb.HandledKinds(kinds=handled_kinds))
        return heartbeat

    async def _read(self, call: Any, sid: int) -> None:
        assert self._inbox is not None
        try:
            async for message in call:
                self._inbox.put_nowait(("down", sid, message))
            self._inbox.put_nowait(("closed", sid, "server closed the session stream"))
        except grpc.RpcError as err:
            self._inbox.put_nowait(("closed", sid, f"session stream failed: {_describe(err)}"))

    async def _tick(self, interval: float, sid: int) -> None:
        assert self._inbox is not None
        while True:
            await asyncio.sleep(interval)
            self._inbox.put_nowait(("tick", sid))

    # ----- leases ------------------------------------------------------------------------

    def _refusal(self, kind: str) -> tuple[ReleaseCause, str] | None:
        """Why the runner cannot take a grant of ``kind`` now, if it cannot: draining, at capacity
        (busy: the server offers it again later), or no handler for the kind or its handler
        withdrawn (the server offers it to this runner no more)."""
        if self._draining:
            return ReleaseCause.DRAINING, "agent is draining"
        if len(self._running) >= self._capacity():
            return ReleaseCause.BUSY, "agent at capacity"
        if self.handlers.get(kind) is None:
            return ReleaseCause.CANNOT_HANDLE, f"no handler for kind {kind}"
        withdrawn = next((w for w in self.advertised.withdrawn if w.kind == kind), None)
        if withdrawn is not None:
            return ReleaseCause.CANNOT_HANDLE, withdrawn.reason
        return None

    def _grant(self, grant: pb.LeaseGrant, send: Callable[..., int]) -> None:
        """A grant: accepted and started at once, or released with the cause and reason the runner
        cannot take it (a task it cannot decode included: the session goes on)."""
        task = grant.task
        ids = {"lease_id": grant.lease_id, "task_id": task.task_id, "fencing_token": grant.fencing_token}
        refusal = self._refusal(task.kind)
        if refusal is None:
            try:
                context = self._context(grant)
            except Exception as err:  # whatever fails while preparing a grant hands it back
                log.warning("cannot decode the task of grant %s", grant.lease_id, exc_info=True)
                refusal = ReleaseCause.CANNOT_DECODE, f"cannot decode the task: {_describe(err)}"
            else:
                send(lease_update=pb.LeaseUpdate(**ids, accepted=pb.LeaseAccepted()))
                send(lease_update=pb.LeaseUpdate(**ids, started=pb.LeaseStarted()))
                running = _Running(task_id=task.task_id, fencing_token=grant.fencing_token, context=context)
                self._running[grant.lease_id] = running
                running.job = asyncio.create_task(self._work(grant.lease_id, running, self.handlers.get(task.kind)))
                return
        cause, reason = refusal
        log.debug("releasing grant %s (%s): %s", grant.lease_id, cause.name, reason)
        send(lease_update=pb.LeaseUpdate(**ids, released=_released(cause, reason)))

    def _context(self, grant: pb.LeaseGrant) -> TaskContext:
        """The handler's view of a grant; raises if the task cannot be decoded."""
        task, lease_id = grant.task, grant.lease_id
        ids = (lease_id, task.task_id, grant.fencing_token)
        output = OutputBuffer(self.config.output, lambda chunks: self._post(("output", None, *ids, chunks)))
        return TaskContext(
            task_id=task.task_id,
            kind=task.kind,
            payload=convert.from_struct(task.payload),
            lease_id=lease_id,
            attempt=task.attempts + 1,
            task=task,
            resources=Resources.of(grant.resources if grant.HasField("resources") else None),
            _progress=lambda percent, text: self._post(("progress", None, lease_id, float(percent), text)),
            _output=output,
        )

    def _revoke(self, revocation: pb.LeaseRevocation) -> None:
        running = self._running.get(revocation.lease_id)
        if running is None:
            return
        canceled = revocation.reason == pb.REVOCATION_REASON_CANCELED
        log.info("lease %s revoked (%s); stopping its work", revocation.lease_id, pb.RevocationReason.Name(revocation.reason))
        if canceled:
            running.canceled = True
        else:  # expired or superseded: nothing to report
            del self._running[revocation.lease_id]
        self._cancel(running)

    @staticmethod
    def _cancel(running: _Running) -> None:
        running.context.cancelled.set()
        if running.job is not None:
            running.job.cancel()

    async def _work(self, lease_id: str, running: _Running, handler: Handler | None) -> None:
        outcome: tuple[str, Any]
        output: OutputBuffer = running.context._output
        # This task's context: print and logging in the handler (and in threads and tasks it
        # starts) reach its output.
        current_output.set(output)
        flusher = asyncio.create_task(self._flush_output(output))
        try:
            if handler is None:
                raise TaskFailure(f"no handler for kind {running.context.kind}")
            if inspect.iscoroutinefunction(handler):
                result = await handler(running.context)
            else:
                result = await asyncio.to_thread(handler, running.context)
                if inspect.isawaitable(result):
                    result = await result
            outcome = ("succeeded", result)
        except asyncio.CancelledError:
            outcome = ("cancelled", None)
        except Release as release:
            outcome = ("released", release)
        except TaskFailure as failure:
            outcome = ("failed", failure)
        except Exception as err:  # a handler's exception is a failed attempt, never a crash
            log.info("handler for %s raised %s", lease_id, type(err).__name__, exc_info=True)
            outcome = ("failed", TaskFailure(str(err) or type(err).__name__, code="handler_error", retryable=True))
        flusher.cancel()
        # The last of the output goes before the final report.
        output.flush(last=True)
        self._finish(lease_id, running, outcome)

    @staticmethod
    async def _flush_output(output: OutputBuffer) -> None:
        while output.flush():
            await asyncio.sleep(output.limits.flush_every)

    def _finish(self, lease_id: str, running: _Running, outcome: tuple[str, Any]) -> None:
        if self._running.get(lease_id) is not running:
            return  # revoked without a report
        del self._running[lease_id]
        ids = {"lease_id": lease_id, "task_id": running.task_id, "fencing_token": running.fencing_token}
        what, value = outcome
        if running.canceled:
            update = pb.LeaseUpdate(
                **ids, released=_released(ReleaseCause.REVOCATION_ACKNOWLEDGED, "canceled by the server")
            )
        elif running.shut_down:
            update = pb.LeaseUpdate(**ids, released=_released(ReleaseCause.DRAINING, "agent shut down"))
        elif what == "cancelled":
            update = pb.LeaseUpdate(**ids, released=_released(ReleaseCause.OTHER, "handler was cancelled"))
        elif what == "released":
            update = pb.LeaseUpdate(**ids, released=_released(value.cause, value.reason))
        elif what == "succeeded":
            result = value if isinstance(value, dict) else ({} if value is None else {"result": value})
            try:
                update = pb.LeaseUpdate(
                    **ids, succeeded=pb.LeaseSucceeded(result=convert.to_struct(result, "result"))
                )
            except (TypeError, ValueError) as err:
                failure = TaskFailure(
                    f"the handler's result cannot be sent: {err}", code="handler_error", retryable=False
                )
                update = _failed(ids, failure)
        else:
            update = _failed(ids, value)
        self._unacked_finals[lease_id] = update
        self._post(("final", None, lease_id))


_UNACKED_OUTPUT_BYTES = 16 * 1024 * 1024
"""The most bytes of output kept for resending after a reconnect."""


def _output_bytes(update: pb.LeaseUpdate) -> int:
    return sum(len(c.text) for c in update.output.chunks)


def _released(cause: ReleaseCause, reason: str) -> pb.LeaseReleased:
    """A release with its cause."""
    return pb.LeaseReleased(reason=reason, cause=int(cause))


def _failed(ids: dict, failure: TaskFailure) -> pb.LeaseUpdate:
    error = task_pb2.TaskError(message=failure.message, code=failure.code, retryable=failure.retryable)
    if isinstance(failure.details, dict):
        try:
            error.details.CopyFrom(convert.to_struct(failure.details, "error.details"))
        except (TypeError, ValueError) as err:
            # Details the contract cannot carry are dropped, said in the message, rather than
            # making the server refuse the whole report.
            error.message = f"{failure.message} (details dropped: {err})"
    return pb.LeaseUpdate(**ids, failed=pb.LeaseFailed(error=error))


class _StreamEnded(Exception):
    """The session stream ended or failed."""


def _describe(err: BaseException) -> str:
    if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
        try:
            return f"{err.code().name}: {err.details()}"
        except Exception:  # pragma: no cover
            pass
    return str(err) or type(err).__name__
