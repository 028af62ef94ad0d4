"""The fault suite's machinery: a TCP proxy in front of PostgreSQL (to cut the
servers off the database the way a database restart does, without touching
the PostgreSQL that other tests share), replicas that come back on new ports,
agent processes that can be SIGKILLed, and a submitter loop.

The replicas and the fresh database come from ``tests/deploy/replicas.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import random
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

import grpc
from google.protobuf import struct_pb2

from replicas import FreshDatabase, Replica, log, struct  # noqa: F401 - re-exported for the tests
from switchyard_runner.v1 import placement_pb2, task_service_pb2

HERE = pathlib.Path(__file__).resolve().parent

# --- PostgreSQL behind a proxy that can be cut ------------------------------


class PgProxy:
    """A TCP proxy on 127.0.0.1:<ephemeral> to the real PostgreSQL.

    ``cut()`` resets every open connection and refuses new ones (accepts and
    closes them at once) until ``restore()``: from the servers' side, exactly a
    database restart.

    With ``delay_s``, every byte coming back from upstream is held that long
    before it is passed on (the other way goes at once): a distant link, as a
    standby in another zone sees its primary. A cut drops what is in flight.
    """

    def __init__(self, upstream_host: str, upstream_port: int, delay_s: float = 0.0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.delay_s = delay_s
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._down = False
        self._closed = False
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True, name="pg-proxy").start()

    def url(self, database_url: str) -> str:
        parts = urllib.parse.urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)
        user = f"{netloc[0]}@" if len(netloc) == 2 else ""
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                down = self._down
            if down:
                _reset(client)
                continue
            with self._lock:
                upstream = self.upstream
            try:
                server = socket.create_connection(upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._conns.update((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        delayed = _Delayed(client, self.delay_s) if self.delay_s else None
        try:
            while True:
                readable, _, _ = select.select([client, server], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if delayed is not None and sock is server:
                        delayed.put(data)
                    else:
                        peers[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in (client, server):
                _reset(sock)
            with self._lock:
                self._conns.discard(client)
                self._conns.discard(server)

    def cut(self) -> None:
        self._drop()
        self.cuts += 1

    def retarget(self, host: str, port: int) -> None:
        """Connect new clients to ``host:port`` from now on (a failover moving
        the address the servers know), dropping the connections to the old
        upstream, and accept again."""
        with self._lock:
            self.upstream = (host, port)
        self._drop()
        self.restore()

    def _drop(self) -> int:
        with self._lock:
            self._down = True
            conns = list(self._conns)
            self._conns.clear()
        for sock in conns:
            _reset(sock)
        log(f"postgres proxy: cut {len(conns) // 2} connections; refusing new ones")
        return len(conns) // 2

    def restore(self) -> None:
        with self._lock:
            self._down = False
        log("postgres proxy: accepting again")

    def close(self) -> None:
        self._closed = True
        self._drop()
        self._listener.close()


class _Delayed:
    """Sends what it is given to ``sock`` ``delay_s`` after it was given, in
    order, until the socket fails (the proxy reset it)."""

    def __init__(self, sock: socket.socket, delay_s: float) -> None:
        self._sock = sock
        self._delay_s = delay_s
        self._queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self._ready = threading.Condition()
        threading.Thread(target=self._deliver, daemon=True, name="pg-proxy-delay").start()

    def put(self, data: bytes) -> None:
        with self._ready:
            self._queue.append((time.monotonic() + self._delay_s, data))
            self._ready.notify()

    def _deliver(self) -> None:
        try:
            while True:
                with self._ready:
                    while not self._queue:
                        self._ready.wait()
                    due, data = self._queue.popleft()
                time.sleep(max(0.0, due - time.monotonic()))  # the link's latency itself
                self._sock.sendall(data)
        except (OSError, ValueError):
            return


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


# --- replicas that restart on new ports -------------------------------------

SERVER_FLAGS = ("--ack-window-ms", "1000")


class Cluster:
    """Replicas on one database; the live addresses are kept in a file the
    agents re-read on every reconnect."""

    def __init__(self, database_url: str, workdir: pathlib.Path, count: int, listen: str = "127.0.0.1:0") -> None:
        """``listen="0.0.0.0:0"`` when agents in other network namespaces
        (``netns.Host``) must reach the replicas too."""
        self.database_url = database_url
        self.listen = listen
        # Off loopback the server wants tokens; the suite's own namespaces are
        # all that can reach it.
        self.flags = SERVER_FLAGS if listen.startswith("127.") else (*SERVER_FLAGS, "--insecure")
        self.addresses_file = workdir / "addresses"
        self.replicas: list[Replica | None] = []
        self.kills = 0
        for i in range(count):
            self.replicas.append(Replica(f"R{i}", database_url, *self.flags, listen=listen))
        self._publish()

    def _publish(self) -> None:
        live = [r.address for r in self.replicas if r is not None]
        tmp = self.addresses_file.with_suffix(".tmp")
        tmp.write_text("\n".join(live) + "\n")
        tmp.replace(self.addresses_file)

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r is not None]

    def kill(self, index: int) -> None:
        replica = self.replicas[index]
        if replica is None:
            return
        replica.kill()
        self.replicas[index] = None
        self.kills += 1
        self._publish()

    def restart(self, index: int) -> None:
        if self.replicas[index] is None:
            self.replicas[index] = Replica(f"R{index}", self.database_url, *self.flags, listen=self.listen)
            self._publish()

    def stop(self) -> None:
        for replica in self.live():
            replica.stop()


# --- agent processes ---------------------------------------------------------


@dataclass
class AgentSpec:
    """One agent of the suite's fleet: what it reports and what it runs.
    Its document holds its tags, ``os``, ``chaos.cores`` and its taints, and
    it handles ``kinds`` only, so a task's placement can fail it on every
    kind of hard constraint the suite uses (kind, taint, tag, requirement,
    slots)."""

    name: str
    tags: list[str]
    capacity: int
    cores: int = 2
    kinds: list[str] = field(default_factory=lambda: ["*"])
    taints: list[str] = field(default_factory=list)

    def document(self) -> dict:
        doc: dict = {
            "tags": list(self.tags),
            "os": "windows" if "windows" in self.tags else "linux",
            "chaos": {"agent": self.name, "cores": self.cores},
        }
        if self.taints:
            doc["taints"] = list(self.taints)
        return doc

    def shape(self) -> dict:
        """What the invariant checker holds placements to."""
        return {"document": self.document(), "kinds": list(self.kinds), "capacity": self.capacity}


class AgentProcess:
    """``chaos_agent.py`` in its own process, so it can be SIGKILLed.

    A restart after a kill comes back under a new name (``NAME-r1``, ...): a
    replacement machine. Restarting under the same name would hit a server bug
    (the new session's heartbeats renew the dead process's leases forever; see
    ``test_agent_restart.py``), which would hide every other invariant behind
    stuck tasks. ``same_name=True`` restarts under the same name to show it.
    """

    def __init__(
        self, spec: AgentSpec, addresses_file: pathlib.Path, logdir: pathlib.Path, hold_ms: int,
        same_name: bool = False, host=None,  # netns.Host: run there, reaching the replicas at its gateway
    ) -> None:
        self.spec = spec
        self.host = host
        self.base_name = spec.name
        self.same_name = same_name
        self.addresses_file = addresses_file
        self.logdir = logdir
        self.names: list[str] = [spec.name]  # every name this agent ran under
        self.hold_ms = hold_ms
        self.proc: subprocess.Popen | None = None
        self.kills = 0
        self.killed = False
        self.mid_task_kills = 0

    @property
    def log_path(self) -> pathlib.Path:
        return self.logdir / f"{self.spec.name}.jsonl"

    def start(self) -> None:
        if self.killed and not self.same_name:
            self.spec = dataclasses.replace(self.spec, name=f"{self.base_name}-r{self.kills}")
            self.names.append(self.spec.name)
        self.killed = False
        argv = [
            sys.executable, str(HERE / "chaos_agent.py"),
            "--name", self.spec.name,
            "--tags", ",".join(self.spec.tags),
            "--capacity", str(self.spec.capacity),
            "--document", json.dumps(self.spec.document()),
            "--kinds", ",".join(self.spec.kinds),
            "--addresses-file", str(self.addresses_file),
            "--log", str(self.log_path),
            "--hold-ms", str(self.hold_ms),
        ]
        if self.host is not None:
            argv = self.host.argv([*argv, "--address-host", self.host.gateway])
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=None if os.environ.get("TEST_LOG") else subprocess.DEVNULL,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def unfinished_grants(self) -> int:
        """Grants in this agent's log with no final report yet: work in hand."""
        return len(self._unfinished())

    def newest_unfinished_grant(self) -> float:
        """When the newest of its unfinished grants arrived (0 if none): the
        agent least likely to finish before a kill lands."""
        return max(self._unfinished().values(), default=0.0)

    def _unfinished(self) -> dict[str, float]:
        from invariants import read_agent_log

        if not self.log_path.exists():
            return {}
        open_leases: dict[str, float] = {}
        for e in read_agent_log(self.log_path):
            if e["event"] == "start":
                open_leases.clear()  # a new process holds nothing
            elif e["event"] == "grant":
                open_leases[e["lease"]] = e["t"]
            elif e["event"] in ("report", "revoked"):
                open_leases.pop(e["lease"], None)
        return open_leases

    def kill(self) -> bool:
        """SIGKILL; True if the agent had work in hand (a grant without a final report)."""
        if not self.alive():
            return False
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.kills += 1
        self.killed = True
        holding = self.unfinished_grants()
        if holding:
            self.mid_task_kills += 1
        log(f"agent {self.spec.name} killed with SIGKILL holding {holding} unfinished leases")
        return holding > 0

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()


# --- the submitter -----------------------------------------------------------


@dataclass
class Submitted:
    """A task the submitter was told the store took, with its placement in
    the few forms the suite uses (the checker evaluates them itself)."""

    key: str
    task_id: str
    required_tags: list[str]
    fail_first: bool
    concurrency_key: str = ""
    kind: str = "chaos"
    #: (key, operator, value): operators ``gte``, ``eq``.
    requirements: list[tuple[str, str, object]] = field(default_factory=list)
    tolerations: list[str] = field(default_factory=list)
    slots: int = 1


#: The concurrency keys some chaos tasks count against, and each one's limit.
CONCURRENCY_KEYS = 3
CONCURRENCY_LIMIT = 3

OPERATORS = {"gte": placement_pb2.OPERATOR_GTE, "eq": placement_pb2.OPERATOR_EQ}


def submit_request(task: Submitted, i: int, max_attempts: int) -> task_service_pb2.SubmitTaskRequest:
    """The SubmitTask request of a task as the suite describes it."""
    placement = placement_pb2.Placement(
        required_tags=task.required_tags,
        requirements=[
            placement_pb2.Requirement(key=key, operator=OPERATORS[op], values=[_value(v)])
            for key, op, v in task.requirements
        ],
        tolerations=task.tolerations,
    )
    if task.slots > 1:
        placement.resources.slots = task.slots
    return task_service_pb2.SubmitTaskRequest(
        kind=task.kind,
        payload=struct({"i": i, "fail_first": task.fail_first}),
        placement=placement,
        idempotency_key=task.key,
        max_attempts=max_attempts,
        labels={"suite": "chaos"},
        concurrency_key=task.concurrency_key,
        concurrency_limit=CONCURRENCY_LIMIT if task.concurrency_key else 0,
    )


def _value(v: object) -> struct_pb2.Value:
    value = struct_pb2.Value()
    if isinstance(v, str):
        value.string_value = v
    else:
        value.number_value = float(v)  # type: ignore[arg-type]
    return value


@dataclass
class Submitter:
    """Submits ``count`` tasks through whichever replica answers, each with
    an idempotency key, retrying a failed submit with the same key until the
    store takes it: every other four tasks in one ``SubmitTasks`` call (the
    call retried whole), the rest a ``SubmitTask`` each, so both paths take
    the faults. Records what it was told. Placements draw on every kind
    of hard constraint: required tags from ``selectors``, now and then a
    requirement on ``chaos.cores`` or ``os``, the kind ``chaos.batch`` (which
    some agents do not handle), a toleration of the ``spot`` taint, two
    slots."""

    cluster: Cluster
    selectors: list[list[str]]
    count: int
    seed: int
    pace_s: float
    max_attempts: int = 20
    submitted: list[Submitted] = field(default_factory=list)
    retries: int = 0

    def run(self, stop: threading.Event) -> None:
        rng = random.Random(self.seed)
        run_id = os.urandom(4).hex()
        batch: list[tuple[Submitted, task_service_pb2.SubmitTaskRequest]] = []
        for i in range(self.count):
            if stop.is_set():
                return
            tags = rng.choice(self.selectors)
            fail_first = rng.random() < 0.15
            # One task in ten counts against one of three concurrency keys
            # (the checker holds every key to its limit).
            limited = rng.random() < 0.1
            requirements: list[tuple[str, str, object]] = []
            if rng.random() < 0.2:
                requirements.append(("chaos.cores", "gte", 4))
            if rng.random() < 0.1:
                requirements.append(("os", "eq", "linux"))
            task = Submitted(
                key=f"chaos-{run_id}-{i}",
                task_id="",
                required_tags=list(tags),
                fail_first=fail_first,
                concurrency_key=f"chaos-limit-{i % CONCURRENCY_KEYS}" if limited else "",
                kind="chaos.batch" if rng.random() < 0.25 else "chaos",
                requirements=requirements,
                tolerations=["spot"] if rng.random() < 0.3 else [],
                slots=2 if rng.random() < 0.1 else 1,
            )
            batch.append((task, submit_request(task, i, self.max_attempts)))
            if (i // 4) % 2 == 1 and len(batch) < 4 and i + 1 < self.count:
                continue
            self._submit(batch, rng)
            self.submitted.extend(task for task, _ in batch)
            time.sleep(self.pace_s * len(batch))
            batch = []

    def _submit(
        self, batch: list[tuple[Submitted, task_service_pb2.SubmitTaskRequest]], rng: random.Random
    ) -> None:
        """Submits ``batch`` (one task: ``SubmitTask``; more: one
        ``SubmitTasks`` call) until the store takes it, noting each task's id."""
        deadline = time.monotonic() + 60
        while True:
            live = self.cluster.live()
            replica = live[rng.randrange(len(live))] if live else None
            try:
                if replica is None:
                    raise RuntimeError("no live replica")
                if len(batch) == 1:
                    task, request = batch[0]
                    task.task_id = replica.tasks.SubmitTask(request, timeout=3).task.task_id
                else:
                    calls = task_service_pb2.SubmitTasksRequest(tasks=[request for _, request in batch])
                    results = replica.tasks.SubmitTasks(calls, timeout=3).results
                    for (task, _), result in zip(batch, results, strict=True):
                        task.task_id = result.task.task_id
                return
            except (grpc.RpcError, RuntimeError, ValueError) as err:
                self.retries += 1
                if time.monotonic() > deadline:
                    raise RuntimeError(f"submit {batch[0][0].key} kept failing: {err}") from err
                time.sleep(0.1)
