"""An agent process dies holding a lease and comes back under the same name.

The new process registers (same agent id, a new session epoch) and sends
Hello with no held leases: it knows nothing of the old process's work. The
contract (agent_service.proto, steps 2 and 5; REVOCATION_REASON_SUPERSEDED:
"a newer session of the agent ... superseded it") says that lease should end:
revoked at Hello, or at the latest expired after its TTL. It must not be
renewed by the new session's heartbeats, which would keep the task RUNNING and
the agent's capacity taken forever.

Found by the fault suite: the lease used to stay ACTIVE, renewed by every
heartbeat of the new session, so the task never finished and, with capacity
1, the restarted agent never got another grant. The server now counts leases
a new session does not hold as lost at Hello; this test keeps it that way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from harness import FreshDatabase, Replica, struct
from switchyard_runner.v1 import (
    agent_pb2,
    agent_service_pb2,
    agent_service_pb2_grpc,
    placement_pb2,
    task_pb2,
    task_service_pb2,
)

LEASE_TTL_S = 2.0  # the replica's --lease-ttl-ms


@pytest.fixture
def replica() -> Iterator[Replica]:
    with FreshDatabase() as db:
        r = Replica("R", db.url, "--ack-window-ms", "1000")
        try:
            yield r
        finally:
            r.stop()


class Session:
    """One registration and Connect stream of the agent `name`, heartbeating."""

    def __init__(self, replica: Replica, name: str) -> None:
        self.stub = agent_service_pb2_grpc.AgentServiceStub(replica.channel)
        reg = self.stub.RegisterAgent(
            agent_service_pb2.RegisterAgentRequest(
                name=name, capacity=1, capabilities=struct({"tags": ["zombie"]}), handled_kinds=["*"]
            ),
            timeout=5,
        )
        self.agent_id = reg.agent_id
        self.out: list = []
        self.cond = threading.Condition()
        self.queue: list = [agent_service_pb2.ConnectRequest(
            sequence=1, hello=agent_service_pb2.Hello(agent_id=reg.agent_id, session_epoch=reg.session_epoch))]
        self.seq = 1
        self.closed = threading.Event()
        self.grants: list[agent_service_pb2.LeaseGrant] = []
        self.call = self.stub.Connect(self._requests())
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _requests(self):
        while not self.closed.is_set():
            with self.cond:
                while not self.queue and not self.closed.is_set():
                    self.cond.wait(0.1)
                items, self.queue = self.queue, []
            yield from items

    def send(self, **message: object) -> None:
        with self.cond:
            self.seq += 1
            self.queue.append(agent_service_pb2.ConnectRequest(sequence=self.seq, **message))
            self.cond.notify()

    def _read(self) -> None:
        try:
            for response in self.call:
                if response.WhichOneof("message") == "lease_grant":
                    self.grants.append(response.lease_grant)
        except Exception:  # noqa: BLE001 - the stream ends when the test kills it
            pass

    def _beat(self) -> None:
        while not self.closed.wait(0.2):
            self.send(heartbeat=agent_service_pb2.Heartbeat(status=agent_pb2.AGENT_STATUS_READY))

    def kill(self) -> None:
        """The process dies: no report, no goodbye."""
        self.closed.set()
        self.call.cancel()


def test_a_lease_of_a_dead_agent_process_ends_after_the_agent_restarts(replica: Replica):
    first = Session(replica, "restarting-agent")
    task = replica.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(kind="k", placement=placement_pb2.Placement(required_tags=["zombie"])),
        timeout=5,
    ).task
    deadline = time.monotonic() + 5
    while not first.grants and time.monotonic() < deadline:
        time.sleep(0.02)
    assert first.grants, "the agent never got the task"
    grant = first.grants[0]
    first.send(lease_update=agent_service_pb2.LeaseUpdate(
        lease_id=grant.lease_id, task_id=grant.task.task_id, fencing_token=grant.fencing_token,
        accepted=agent_service_pb2.LeaseAccepted()))
    first.send(lease_update=agent_service_pb2.LeaseUpdate(
        lease_id=grant.lease_id, task_id=grant.task.task_id, fencing_token=grant.fencing_token,
        started=agent_service_pb2.LeaseStarted()))
    time.sleep(0.3)
    first.kill()

    second = Session(replica, "restarting-agent")  # same name: same agent id, new epoch, holds nothing
    assert second.agent_id == first.agent_id
    try:
        time.sleep(3 * LEASE_TTL_S)  # well past the lease's TTL, heartbeating all along
        now = replica.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id), timeout=5).task
        # Either the old lease ended and the task went back to the queue (and
        # perhaps to the new session), or it is still the old lease: the bug.
        assert now.lease.lease_id != grant.lease_id, (
            f"task {task.task_id} is still {task_pb2.TaskState.Name(now.state)} on lease {grant.lease_id} of the dead process "
            f"{3 * LEASE_TTL_S:.0f}s later (TTL {LEASE_TTL_S:.0f}s); the new session got {len(second.grants)} grants"
        )
    finally:
        second.kill()
