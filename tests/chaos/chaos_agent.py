"""A protocol agent for the fault suite, run as its own process so the suite
can SIGKILL it mid-task.

It speaks AgentService directly (the Python stubs): RegisterAgent, one Connect
stream, Hello with the leases it still holds, heartbeats, and for each grant
accepted, started, a short hold, then succeeded (or, for a task whose payload
says ``fail_first`` and whose grant carries fencing token 1, a retryable
failure). When the stream breaks it re-reads the replica addresses from
``--addresses-file`` (the suite rewrites it when a replica restarts on a new
port) and moves to the next one.

Everything it sees is appended to ``--log`` as JSON lines, flushed line by
line, for the invariant checker: ``start``, ``registered``, ``welcome``,
``grant`` (lease, task, fencing token, the document generation, tags,
document and handled kinds the agent had reported when the grant arrived,
and how many leases it then held),
``report`` (a final report sent) and ``report_ack`` (the server's answer),
``revoked``. A line cut short by SIGKILL is ignored by the reader.

A successful report's result names the agent, the lease and its fencing
token, so the checker can tell which attempt a stored result came from.

Usage: python chaos_agent.py --name N --tags a,b --capacity 2
       [--document JSON] [--kinds chaos,chaos.batch] [--address-host GATEWAY]
       --addresses-file F --log L [--hold-ms 150]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import queue
import sys
import threading
import time
from collections.abc import Iterator

import grpc
from google.protobuf import json_format, struct_pb2

from switchyard_runner.v1 import agent_pb2, agent_service_pb2, agent_service_pb2_grpc, task_pb2

# Codes of a refusal that means the lease is gone for good (stale token, not
# held, unknown lease); anything else non-OK is retried.
FINAL_REFUSALS = {grpc.StatusCode.FAILED_PRECONDITION.value[0], grpc.StatusCode.NOT_FOUND.value[0]}


def struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


class Log:
    """Append-only JSON lines, one write and flush per line."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        self._lock = threading.Lock()

    def write(self, event: str, **fields: object) -> None:
        line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, **fields})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


class Lease:
    def __init__(self, lease_id: str, task_id: str, token: int, payload: dict) -> None:
        self.lease_id = lease_id
        self.task_id = task_id
        self.token = token
        self.payload = payload
        self.final: agent_service_pb2.LeaseUpdate | None = None  # the final report, once decided
        self.final_kind = ""


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.name = args.name
        self.tags = [t for t in args.tags.split(",") if t]
        self.capacity = args.capacity
        self.document = json.loads(args.document) if args.document else {"tags": self.tags}
        self.document["tags"] = self.tags
        self.kinds = [k for k in args.kinds.split(",") if k] or ["*"]
        self.address_host = args.address_host
        self.hold_s = args.hold_ms / 1000
        self.addresses_file = pathlib.Path(args.addresses_file)
        self.log = Log(args.log)
        self.lock = threading.Lock()
        self.held: dict[str, Lease] = {}
        self.outbox: queue.Queue | None = None
        self.seq = 0
        self.pending: dict[int, tuple[str, str, str]] = {}  # sequence -> (lease, task, report kind)
        self.generation = 0
        self.agent_id = ""

    # -- sending

    def send(self, lease: Lease | None = None, kind: str = "", **message: object) -> bool:
        with self.lock:
            if self.outbox is None:
                return False
            self.seq += 1
            if lease is not None:
                self.pending[self.seq] = (lease.lease_id, lease.task_id, kind)
            self.outbox.put(agent_service_pb2.ConnectRequest(sequence=self.seq, **message))
            return True

    def update(self, lease: Lease, kind: str, **update: object) -> bool:
        return self.send(
            lease,
            kind,
            lease_update=agent_service_pb2.LeaseUpdate(
                lease_id=lease.lease_id, task_id=lease.task_id, fencing_token=lease.token, **update
            ),
        )

    def send_final(self, lease: Lease) -> None:
        assert lease.final is not None
        if self.send(lease, lease.final_kind, lease_update=lease.final):
            self.log.write(
                "report", lease=lease.lease_id, task=lease.task_id, token=lease.token, kind=lease.final_kind
            )

    # -- work

    def work(self, lease: Lease) -> None:
        self.update(lease, "started", started=agent_service_pb2.LeaseStarted())
        time.sleep(self.hold_s)
        with self.lock:
            if lease.lease_id not in self.held:
                return  # revoked meanwhile
        base = dict(lease_id=lease.lease_id, task_id=lease.task_id, fencing_token=lease.token)
        if lease.payload.get("fail_first") and lease.token == 1:
            lease.final_kind = "failed"
            lease.final = agent_service_pb2.LeaseUpdate(
                **base,
                failed=agent_service_pb2.LeaseFailed(
                    error=task_pb2.TaskError(message="injected first-attempt failure", code="chaos", retryable=True)
                ),
            )
        else:
            lease.final_kind = "succeeded"
            lease.final = agent_service_pb2.LeaseUpdate(
                **base, succeeded=agent_service_pb2.LeaseSucceeded(result=struct({"by": self.name, "lease": lease.lease_id, "token": lease.token}))
            )
        self.send_final(lease)

    def retry_later(self, lease_id: str, kind: str) -> None:
        def again() -> None:
            with self.lock:
                lease = self.held.get(lease_id)
            if lease is None:
                return
            if kind in ("succeeded", "failed") and lease.final is not None:
                self.send_final(lease)
            elif kind == "accepted":
                self.update(lease, "accepted", accepted=agent_service_pb2.LeaseAccepted())

        threading.Timer(0.3, again).start()

    # -- sessions

    def addresses(self) -> list[str]:
        try:
            listed = [a for a in self.addresses_file.read_text().split() if a]
        except OSError:
            return []
        if self.address_host:
            # In a network namespace of its own: the replicas are at its gateway.
            listed = [f"{self.address_host}:{a.rsplit(':', 1)[1]}" for a in listed]
        return listed

    def run(self) -> None:
        self.log.write("start", name=self.name, tags=self.tags, capacity=self.capacity)
        attempt = 0
        backoff = 0.05
        while True:
            addresses = self.addresses()
            if addresses:
                address = addresses[attempt % len(addresses)]
                welcomed = False
                try:
                    welcomed = self.session(address)
                except grpc.RpcError:
                    welcomed = False
                except Exception as err:  # noqa: BLE001 - keep the agent alive, say why
                    self.log.write("session_error", address=address, error=repr(err))
                with self.lock:
                    self.outbox = None
                if welcomed:
                    backoff = 0.05
            attempt += 1
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    def session(self, address: str) -> bool:
        welcomed = False
        channel = grpc.insecure_channel(address)
        try:
            stub = agent_service_pb2_grpc.AgentServiceStub(channel)
            reg = stub.RegisterAgent(
                agent_service_pb2.RegisterAgentRequest(
                    name=self.name,
                    capabilities=struct(self.document),
                    capacity=self.capacity,
                    runner="switchyard-chaos-tests (python)",
                    handled_kinds=self.kinds,
                ),
                timeout=2,
            )
            self.agent_id = reg.agent_id
            self.generation = reg.capability_generation
            self.log.write(
                "registered", address=address, agent_id=reg.agent_id, epoch=reg.session_epoch,
                generation=reg.capability_generation, tags=self.tags,
            )
            interval = reg.heartbeat_interval.ToMilliseconds() / 1000 or 0.2
            outbox: queue.Queue = queue.Queue()

            def requests() -> Iterator[agent_service_pb2.ConnectRequest]:
                while True:
                    item = outbox.get()
                    if item is None:
                        return
                    yield item

            with self.lock:
                self.seq = 0
                self.pending.clear()
                self.outbox = outbox
                held = [
                    agent_service_pb2.HeldLease(lease_id=h.lease_id, task_id=h.task_id, fencing_token=h.token)
                    for h in self.held.values()
                ]
            self.send(hello=agent_service_pb2.Hello(agent_id=reg.agent_id, session_epoch=reg.session_epoch, held_leases=held))
            responses = stub.Connect(requests())
            stop = threading.Event()
            threading.Thread(target=self.heartbeats, args=(interval, stop), daemon=True).start()
            try:
                for response in responses:
                    which = response.WhichOneof("message")
                    if which == "welcome":
                        welcomed = True
                        self.welcome(response.welcome, address)
                    elif which == "lease_grant":
                        self.grant(response.lease_grant, address)
                    elif which == "lease_revocation":
                        r = response.lease_revocation
                        with self.lock:
                            self.held.pop(r.lease_id, None)
                        self.log.write("revoked", lease=r.lease_id, task=r.task_id, reason=r.reason)
                    elif which == "ack":
                        self.ack(response.ack)
                    elif which == "drain":
                        self.log.write("drain", address=address, reason=response.drain.reason)
                        break
            finally:
                stop.set()
                outbox.put(None)
                responses.cancel()
        finally:
            channel.close()
        return welcomed

    def heartbeats(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            with self.lock:
                running = len(self.held)
            self.send(heartbeat=agent_service_pb2.Heartbeat(
                status=agent_pb2.AGENT_STATUS_READY, load=agent_service_pb2.AgentLoad(running_leases=running)
            ))

    def welcome(self, welcome: agent_service_pb2.Welcome, address: str) -> None:
        with self.lock:
            for r in welcome.revoked:
                self.held.pop(r.lease_id, None)
            for lease_id in list(self.held):
                if lease_id not in welcome.resumed_lease_ids:
                    self.held.pop(lease_id)
            resumed = [self.held[i] for i in welcome.resumed_lease_ids if i in self.held]
        self.log.write(
            "welcome", address=address, resumed=list(welcome.resumed_lease_ids),
            revoked=[r.lease_id for r in welcome.revoked],
        )
        for lease in resumed:
            if lease.final is not None:
                self.send_final(lease)

    def grant(self, grant: agent_service_pb2.LeaseGrant, address: str) -> None:
        payload = json_format.MessageToDict(grant.task.payload)
        lease = Lease(grant.lease_id, grant.task.task_id, grant.fencing_token, payload)
        with self.lock:
            self.held[lease.lease_id] = lease
            holding = len(self.held)
        self.log.write(
            "grant", address=address, agent_id=self.agent_id, lease=lease.lease_id, task=lease.task_id,
            token=lease.token, generation=self.generation, tags=self.tags, document=self.document,
            kinds=self.kinds, holding=holding, capacity=self.capacity,
        )
        self.update(lease, "accepted", accepted=agent_service_pb2.LeaseAccepted())
        threading.Thread(target=self.work, args=(lease,), daemon=True).start()

    def ack(self, ack: agent_service_pb2.Ack) -> None:
        if ack.capability_generation:
            self.generation = ack.capability_generation
        with self.lock:
            entry = self.pending.pop(ack.sequence, None)
        if entry is None:
            return
        lease_id, task_id, kind = entry
        if kind in ("succeeded", "failed"):
            self.log.write(
                "report_ack", lease=lease_id, task=task_id, kind=kind,
                code=ack.code, message=ack.message,
            )
            if ack.code == 0 or ack.code in FINAL_REFUSALS:
                with self.lock:
                    self.held.pop(lease_id, None)
            else:
                self.retry_later(lease_id, kind)
        elif kind == "accepted" and ack.code != 0:
            if ack.code in FINAL_REFUSALS:
                with self.lock:
                    self.held.pop(lease_id, None)
            else:
                self.retry_later(lease_id, kind)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--tags", default="")
    parser.add_argument("--capacity", type=int, default=2)
    parser.add_argument("--document", default="", help="the capability document (JSON); its tags are --tags")
    parser.add_argument("--kinds", default="*", help="the kinds it handles, comma-separated")
    parser.add_argument("--address-host", default="", help="reach the replicas' ports at this host instead")
    parser.add_argument("--addresses-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--hold-ms", type=int, default=150)
    Agent(parser.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
