"""Helpers for the multi-replica tests: a fresh PostgreSQL database, real
``switchyard-server`` processes on it, the real Rust agent, and a small agent
written against the AgentService protocol (the Python stubs) that knows every
replica's address and moves to the next one when its session breaks.

Nothing here mocks the server: the tests drive the same binaries and the same
wire protocol a deployment does.
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
from google.protobuf import struct_pb2

from switchyard_runner.v1 import (
    agent_pb2,
    agent_service_pb2,
    agent_service_pb2_grpc,
    placement_pb2,
    task_pb2,
    task_service_pb2,
    task_service_pb2_grpc,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
TEST_PG = os.environ.get("SWITCHYARD_TEST_PG", "postgres://postgres@127.0.0.1:5432/test")
TEST_LOG = bool(os.environ.get("TEST_LOG"))


def log(message: str) -> None:
    """Progress lines; pytest shows them with -s or on failure."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def binary(env: str, name: str) -> pathlib.Path:
    """A binary from ``$env``, else the workspace's debug build."""
    explicit = os.environ.get(env)
    path = pathlib.Path(explicit) if explicit else REPO / "target" / "debug" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: set {env} or run `cargo build --workspace --bins`")
    return path


# --- the database ---------------------------------------------------------


def _with_db(url: str, db: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{db}"))


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", TEST_PG, "-v", "ON_ERROR_STOP=1", "-qc", sql],
        check=True,
        stdout=subprocess.DEVNULL,
    )


class FreshDatabase:
    """A uniquely named database, dropped on exit (with its connections)."""

    def __init__(self) -> None:
        self.name = f"switchyard_deploy_{uuid.uuid4().hex[:12]}"
        self.url = _with_db(TEST_PG, self.name)

    def __enter__(self) -> FreshDatabase:
        _psql(f'CREATE DATABASE "{self.name}"')
        return self

    def __exit__(self, *exc: object) -> None:
        _psql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


# --- the server -----------------------------------------------------------


class Replica:
    """One ``switchyard-server`` process on an ephemeral loopback port."""

    def __init__(
        self, name: str, database_url: str, *extra: str, listen: str = "127.0.0.1:0", wrap=None,
        advertise: str = "",
    ) -> None:
        """``wrap`` turns the command line into the one to run (a network
        namespace's ``ip netns exec``); ``advertise`` is the host the others
        reach it at, in place of the one it says it listens on."""
        self.name = name
        argv = [
            str(binary("SWITCHYARD_SERVER_BIN", "switchyard-server")),
            "--listen", listen,
            "--database-url", database_url,
            "--heartbeat-interval-ms", "200",
            "--sweep-interval-ms", "100",
            "--lease-ttl-ms", "2000",
            *extra,
        ]
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            wrap(argv) if wrap else argv,
            stdout=subprocess.PIPE,
            stderr=None if TEST_LOG else self._stderr,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"replica {name} did not start: {line!r}\n{self.stderr()}")
        self.address = match.group(1)
        if advertise:
            self.address = f"{advertise}:{self.address.rsplit(':', 1)[1]}"
        self.channel = grpc.insecure_channel(self.address)
        self.tasks = task_service_pb2_grpc.TaskServiceStub(self.channel)
        log(f"replica {name} listening on {self.address} (pid {self.proc.pid})")

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye; sockets reset by the kernel."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.channel.close()
        log(f"replica {self.name} killed with SIGKILL")

    def stop(self) -> None:
        # Close our own connection first: the server's graceful shutdown
        # waits for open client connections.
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- tasks ----------------------------------------------------------------


def struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def submit(replica: Replica, kind: str, payload: dict, selector: str) -> task_pb2.Task:
    response = replica.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(
            kind=kind,
            payload=struct(payload),
            placement=placement_pb2.Placement(selector=selector),
        ),
        timeout=5,
    )
    return response.task


def task_events(replica: Replica, task_id: str) -> list[task_pb2.TaskEvent]:
    events: list[task_pb2.TaskEvent] = []
    token = ""
    while True:
        page = replica.tasks.ListTaskEvents(
            task_service_pb2.ListTaskEventsRequest(task_id=task_id, page_token=token), timeout=5
        )
        events.extend(page.events)
        token = page.next_page_token
        if not token:
            return events


TERMINAL = {
    task_pb2.TASK_STATE_SUCCEEDED,
    task_pb2.TASK_STATE_FAILED,
    task_pb2.TASK_STATE_CANCELED,
}


def wait_terminal(replica: Replica, task_ids: list[str], timeout: float) -> dict[str, task_pb2.Task]:
    """Polls GetTask until every task is terminal or `timeout` passes."""
    deadline = time.monotonic() + timeout
    done: dict[str, task_pb2.Task] = {}
    while True:
        for task_id in task_ids:
            if task_id in done:
                continue
            task = replica.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id), timeout=5).task
            if task.state in TERMINAL:
                done[task_id] = task
        if len(done) == len(task_ids) or time.monotonic() > deadline:
            return done
        time.sleep(0.1)


# --- the Rust agent -------------------------------------------------------


class RustAgent:
    """``switchyard-agent`` against one replica, with the given tags."""

    def __init__(self, name: str, replica: Replica, tags: list[str], capacity: int = 2) -> None:
        self.name = name
        self.dir = tempfile.TemporaryDirectory()
        pathlib.Path(self.dir.name, ".capabilities.json").write_text(json.dumps({"tags": tags}))
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [
                str(binary("SWITCHYARD_AGENT_BIN", "switchyard-agent")),
                "--server", f"http://{replica.address}",
                "--dir", self.dir.name,
                "--name", name,
                "--allow-exec",
                "--refresh-secs", "1",
                "--capacity", str(capacity),
            ],
            stdout=subprocess.DEVNULL,
            stderr=None if TEST_LOG else self._stderr,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.dir.cleanup()


# --- a protocol agent that fails over -------------------------------------


@dataclass
class HeldLease:
    lease_id: str
    task_id: str
    fencing_token: int
    done: bool = False


@dataclass
class AgentRecord:
    """What the protocol agent saw, for the test to assert on and print."""

    grant_times: dict[str, float] = field(default_factory=dict)
    grants_by_address: dict[str, list[str]] = field(default_factory=dict)
    sessions: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


class ProtocolAgent:
    """An agent speaking AgentService directly, given every replica's address.

    It registers and holds one Connect stream to the first address; when the
    stream breaks (or the server sends Drain) it registers again with the next
    address and sends Hello with the leases it still holds, then reports the
    work it finished meanwhile. Each grant is accepted, started, held for
    ``hold_s`` and reported succeeded.
    """

    def __init__(
        self,
        name: str,
        addresses: list[str],
        tags: list[str],
        capacity: int = 2,
        hold_s: float = 0.0,
    ) -> None:
        self.name = name
        self.addresses = addresses
        self.tags = tags
        self.capacity = capacity
        self.hold_s = hold_s
        self.record = AgentRecord()
        self.connected = threading.Event()
        self._lock = threading.Lock()
        self._held: dict[str, HeldLease] = {}
        self._outbox: queue.Queue | None = None
        self._seq = 0
        self._pending_final: dict[int, str] = {}
        self._stop = threading.Event()
        self._address = ""
        self._welcomed = False
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name=f"agent-{name}", daemon=True)

    def start(self) -> ProtocolAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._outbox is not None:
                self._outbox.put(None)
            if self._call is not None:
                self._call.cancel()
        self._thread.join(timeout=5)

    # -- sending

    def _send(self, **message: object) -> int | None:
        """Queues one ConnectRequest on the current session; None if there is none."""
        with self._lock:
            if self._outbox is None:
                return None
            self._seq += 1
            self._outbox.put(agent_service_pb2.ConnectRequest(sequence=self._seq, **message))
            return self._seq

    def _report(self, lease: HeldLease, **update: object) -> int | None:
        return self._send(
            lease_update=agent_service_pb2.LeaseUpdate(
                lease_id=lease.lease_id,
                task_id=lease.task_id,
                fencing_token=lease.fencing_token,
                **update,
            )
        )

    def _report_success(self, lease: HeldLease) -> None:
        with self._lock:
            if self._outbox is None:
                return  # reported after the next Welcome
            self._seq += 1
            seq = self._seq
            self._pending_final[seq] = lease.lease_id
            self._outbox.put(
                agent_service_pb2.ConnectRequest(
                    sequence=seq,
                    lease_update=agent_service_pb2.LeaseUpdate(
                        lease_id=lease.lease_id,
                        task_id=lease.task_id,
                        fencing_token=lease.fencing_token,
                        succeeded=agent_service_pb2.LeaseSucceeded(result=struct({"by": self.name})),
                    ),
                )
            )

    # -- work

    def _work(self, lease: HeldLease) -> None:
        self._report(lease, started=agent_service_pb2.LeaseStarted())
        if self.hold_s:
            time.sleep(self.hold_s)
        with self._lock:
            if lease.lease_id not in self._held:
                return  # revoked meanwhile
            lease.done = True
        self._report_success(lease)

    # -- sessions

    def _run(self) -> None:
        attempt = 0
        backoff = 0.05
        while not self._stop.is_set():
            address = self.addresses[attempt % len(self.addresses)]
            self._welcomed = False
            try:
                self._session(address)
            except grpc.RpcError as err:
                if self._welcomed and not self._stop.is_set():  # say so once per lost session, not per retry
                    log(f"agent {self.name}: session with {address} ended: {err.code().name}")
            except Exception as err:  # noqa: BLE001 - keep the agent alive, say why
                log(f"agent {self.name}: session with {address} failed: {err!r}")
            with self._lock:
                self._outbox = None
            self.connected.clear()
            if self._stop.is_set():
                return
            if self._welcomed:
                backoff = 0.05
            attempt += 1  # the next replica
            # Back off while no replica answers (up to 1 s), like a real agent.
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def _session(self, address: str) -> None:
        channel = grpc.insecure_channel(address)
        try:
            stub = agent_service_pb2_grpc.AgentServiceStub(channel)
            reg = stub.RegisterAgent(
                agent_service_pb2.RegisterAgentRequest(
                    name=self.name,
                    capabilities=struct({"tags": self.tags}),
                    capacity=self.capacity,
                    runner="switchyard-deploy-tests (python)",
                    handled_kinds=["*"],
                ),
                timeout=2,
            )
            interval = reg.heartbeat_interval.ToMilliseconds() / 1000 or 0.2
            outbox: queue.Queue = queue.Queue()

            def requests() -> Iterator[agent_service_pb2.ConnectRequest]:
                while True:
                    item = outbox.get()
                    if item is None:
                        return
                    yield item

            with self._lock:
                self._seq = 0
                self._pending_final.clear()
                self._outbox = outbox
                held = [
                    agent_service_pb2.HeldLease(
                        lease_id=h.lease_id, task_id=h.task_id, fencing_token=h.fencing_token
                    )
                    for h in self._held.values()
                ]
            self._address = address
            self.record.sessions.append(address)
            self._send(hello=agent_service_pb2.Hello(
                agent_id=reg.agent_id, session_epoch=reg.session_epoch, held_leases=held
            ))
            responses = stub.Connect(requests())
            with self._lock:
                self._call = responses
            beat_stop = threading.Event()
            beats = threading.Thread(target=self._heartbeats, args=(interval, beat_stop), daemon=True)
            beats.start()
            try:
                for response in responses:
                    if self._stop.is_set():
                        break
                    if not self._handle(response, address):
                        break
            finally:
                beat_stop.set()
                outbox.put(None)
                responses.cancel()
        finally:
            channel.close()

    def _heartbeats(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            with self._lock:
                running = len(self._held)
            self._send(heartbeat=agent_service_pb2.Heartbeat(
                status=agent_pb2.AGENT_STATUS_READY,
                load=agent_service_pb2.AgentLoad(running_leases=running),
            ))

    def _handle(self, response: agent_service_pb2.ConnectResponse, address: str) -> bool:
        """Handles one server message; False ends the session."""
        which = response.WhichOneof("message")
        if which == "welcome":
            welcome = response.welcome
            with self._lock:
                for revocation in welcome.revoked:
                    self._held.pop(revocation.lease_id, None)
                    self.record.revoked.append(revocation.lease_id)
                resumed = [self._held[i] for i in welcome.resumed_lease_ids if i in self._held]
                # A held lease the server neither resumed nor revoked is gone too.
                for lease_id in list(self._held):
                    if lease_id not in welcome.resumed_lease_ids:
                        self._held.pop(lease_id)
                self.record.resumed.extend(welcome.resumed_lease_ids)
            if welcome.resumed_lease_ids or welcome.revoked:
                log(
                    f"agent {self.name} at {address}: resumed {list(welcome.resumed_lease_ids)}, "
                    f"revoked {[r.lease_id for r in welcome.revoked]}"
                )
            self._welcomed = True
            self.connected.set()
            for lease in resumed:
                if lease.done:
                    self._report_success(lease)
        elif which == "lease_grant":
            grant = response.lease_grant
            now = time.perf_counter()
            lease = HeldLease(grant.lease_id, grant.task.task_id, grant.fencing_token)
            with self._lock:
                self._held[lease.lease_id] = lease
                self.record.grant_times.setdefault(lease.task_id, now)
                self.record.grants_by_address.setdefault(address, []).append(lease.task_id)
            self._report(lease, accepted=agent_service_pb2.LeaseAccepted())
            threading.Thread(target=self._work, args=(lease,), daemon=True).start()
        elif which == "lease_revocation":
            with self._lock:
                self._held.pop(response.lease_revocation.lease_id, None)
                self.record.revoked.append(response.lease_revocation.lease_id)
        elif which == "ack":
            ack = response.ack
            with self._lock:
                lease_id = self._pending_final.pop(ack.sequence, None)
                if lease_id is not None:
                    lease = self._held.pop(lease_id, None)
                    if ack.code == 0 and lease is not None:
                        self.record.completed.append(lease.task_id)
                    elif ack.code != 0:
                        self.record.refused.append(f"{lease_id}: {ack.code} {ack.message}")
        elif which == "drain":
            log(f"agent {self.name}: drained by {address}: {response.drain.reason}")
            return False
        return True
