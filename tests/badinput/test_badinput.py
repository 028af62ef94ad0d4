"""Bad input over the wire: oversized and deeply nested documents, invalid
patches, unknown enum values, wrong generations, malformed selectors, bad ids
and invalid UTF-8, sent through the real gRPC API of a real
``switchyard-server`` (embedded SQLite in a temporary directory).

For every case the suite checks three things: the answer is the expected
status code (INVALID_ARGUMENT naming the field where the server produces
one; on the session stream, an Ack with the code or a ResyncRequest), the
server still answers health SERVING, and nothing stored changed (ListTasks,
ListAgents and GetAgent of the agents involved are the same before and after).

Where the stubs cannot build the bad message (invalid UTF-8, unknown fields
of the wrong wire type, truncated bytes), the request is hand-encoded and sent
with a raw bytes serializer.

A request that does not decode as protobuf (truncated, a wrong wire type,
invalid UTF-8, nesting past prost's limit) is INVALID_ARGUMENT naming the
message and, where prost says, the field (the server's codec turns prost's
INTERNAL into the caller's error).

CURRENT BEHAVIOUR, NOT A CONTRACT: cases marked ``# FINDING`` assert what the
server does today where it is arguably wrong (e.g. tonic answers OUT_OF_RANGE
for a message over its size limit). They are reported to the lead; change the
expectation when the server changes.
``BADINPUT_SHOW=1 pytest -s tests/badinput`` prints every answer.
"""

from __future__ import annotations

import os
import pathlib
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "deploy"))

from replicas import Replica  # noqa: E402
from switchyard_runner.health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from switchyard_runner.v1 import (  # noqa: E402
    agent_admin_service_pb2,
    agent_admin_service_pb2_grpc,
    agent_pb2,
    agent_service_pb2,
    agent_service_pb2_grpc,
    capability_pb2,
    placement_pb2,
    task_pb2,
    task_service_pb2,
    task_service_pb2_grpc,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def nested(depth: int) -> dict:
    """An object nested `depth` levels deep (the outer object is level 1)."""
    doc: dict = {"leaf": 1}
    for _ in range(depth - 1):
        doc = {"n": doc}
    return doc


# --- hand-encoded protobuf ----------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def ld(field_number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings, bytes, messages)."""
    return varint(field_number << 3 | 2) + varint(len(payload)) + payload


# A JSON object nested d levels is about 3d protobuf levels (Struct, map entry,
# Value), so depth 33 (one over the document limit of 32) is the deepest that
# still decodes under the usual protobuf recursion limit of 100.

# --- the server and its fixtures ---------------------------------------------


@dataclass
class Server:
    replica: Replica
    tasks: task_service_pb2_grpc.TaskServiceStub
    agents: agent_service_pb2_grpc.AgentServiceStub
    admin: agent_admin_service_pb2_grpc.AgentAdminServiceStub
    health: health_pb2_grpc.HealthStub
    agent_id: str  # registered, never connected
    session: Session
    any_task_id: str  # a stored task

    def raw(self, method: str, response_type: type) -> grpc.UnaryUnaryMultiCallable:
        return self.replica.channel.unary_unary(
            method, request_serializer=lambda b: b, response_deserializer=response_type.FromString
        )


class Session:
    """A connected agent: one Connect stream the cases write bad messages on."""

    def __init__(self, stub: agent_service_pb2_grpc.AgentServiceStub, name: str) -> None:
        reg = stub.RegisterAgent(
            agent_service_pb2.RegisterAgentRequest(
                name=name, capacity=1, capabilities=struct({"tags": ["stream"], "memory": {"total": 1024}}),
                handled_kinds=["*"],
            ),
            timeout=5,
        )
        self.agent_id = reg.agent_id
        self.generation = reg.capability_generation
        self._out: queue.Queue = queue.Queue()
        self._seq = 0
        self._in: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.send(hello=agent_service_pb2.Hello(agent_id=reg.agent_id, session_epoch=reg.session_epoch))
        self._call = stub.Connect(iter(self._out.get, None))
        threading.Thread(target=self._read, daemon=True).start()
        welcome = self.next_message()
        assert welcome.WhichOneof("message") == "welcome", welcome
        # Heartbeats keep the session alive between cases (the server closes
        # sessions silent for three intervals); their Acks are skipped below.
        interval = reg.heartbeat_interval.ToMilliseconds() / 1000 or 0.2
        threading.Thread(target=self._beat, args=(interval,), daemon=True).start()

    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.send(heartbeat=agent_service_pb2.Heartbeat(status=agent_pb2.AGENT_STATUS_READY))

    def _read(self) -> None:
        try:
            for response in self._call:
                self._in.put(response)
        except grpc.RpcError as err:
            self._in.put(err)

    def send(self, **message: object) -> int:
        with self._lock:
            self._seq += 1
            self._out.put(agent_service_pb2.ConnectRequest(sequence=self._seq, **message))
            return self._seq

    def next_message(self, timeout: float = 5) -> agent_service_pb2.ConnectResponse:
        item = self._in.get(timeout=timeout)
        if isinstance(item, grpc.RpcError):
            raise item
        return item

    def exchange(self, **message: object) -> list[agent_service_pb2.ConnectResponse]:
        """Sends one message; returns what came back up to and including its Ack."""
        seq = self.send(**message)
        got = []
        while True:
            response = self.next_message()
            got.append(response)
            if response.WhichOneof("message") == "ack" and response.ack.sequence == seq:
                return got

    def close(self) -> None:
        self._stop.set()
        self._out.put(None)
        self._call.cancel()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("badinput") / "switchyard.db"
    replica = Replica("badinput", f"sqlite://{db}")
    channel = replica.channel
    tasks = task_service_pb2_grpc.TaskServiceStub(channel)
    agents = agent_service_pb2_grpc.AgentServiceStub(channel)
    reg = agents.RegisterAgent(
        agent_service_pb2.RegisterAgentRequest(
            name="bad-input-agent", capacity=2, capabilities=struct({"tags": ["linux"], "os": "linux"}),
            labels={"suite": "badinput"}, handled_kinds=["*"],
        ),
        timeout=5,
    )
    # A parked task (no agent has `nobody`) and a queued one, so ListTasks has content.
    for selector in ("nobody", "nobody, linux"):
        task = tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                kind="baseline", payload=struct({"x": 1}), placement=placement_pb2.Placement(selector=selector)
            ),
            timeout=5,
        ).task
    session = Session(agents, "bad-input-stream")
    try:
        yield Server(
            replica, tasks, agents, agent_admin_service_pb2_grpc.AgentAdminServiceStub(channel),
            health_pb2_grpc.HealthStub(channel), reg.agent_id, session, task.task_id,
        )
    finally:
        session.close()
        replica.stop()


ZERO_ID = "00000000-0000-0000-0000-000000000000"
"""A well-formed id no lease or task has."""


def snapshot(s: Server) -> dict:
    """Everything stored that a bad request might touch, minus liveness times."""
    listed = s.tasks.ListTasks(task_service_pb2.ListTasksRequest(page_size=1000), timeout=5)
    agents = s.admin.ListAgents(agent_admin_service_pb2.ListAgentsRequest(page_size=1000), timeout=5)
    out: dict = {"tasks": listed.SerializeToString(deterministic=True), "agents": []}
    for agent in agents.agents:
        full = s.admin.GetAgent(agent_admin_service_pb2.GetAgentRequest(agent_id=agent.agent_id), timeout=5).agent
        full.ClearField("last_seen_at")  # heartbeats of the stream agent move it
        out["agents"].append(full.SerializeToString(deterministic=True))
    return out


def serving(s: Server) -> bool:
    reply = s.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


# --- the cases -----------------------------------------------------------------

# Each case: (id, function(server) -> (code, message), expected code, words the
# message must contain). Unary cases return the RpcError's code and details;
# stream cases return the Ack's or ResyncRequest's.

Case = tuple[str, Callable[[Server], tuple[object, str]], object, list[str]]


def unary(call: Callable[[Server], object]) -> Callable[[Server], tuple[object, str]]:
    def run(s: Server) -> tuple[object, str]:
        err = rpc_error(lambda: call(s))
        return err.code(), err.details() or ""

    return run


def submit(**fields: object) -> Callable[[Server], object]:
    return lambda s: s.tasks.SubmitTask(task_service_pb2.SubmitTaskRequest(kind="bad", **fields), timeout=10)


def selector(text: str) -> Callable[[Server], object]:
    return submit(placement=placement_pb2.Placement(selector=text))


def requirement(**fields: object) -> Callable[[Server], object]:
    return submit(placement=placement_pb2.Placement(requirements=[placement_pb2.Requirement(**fields)]))


def register(
    name: str, capabilities: dict | struct_pb2.Struct, capacity: int = 1, kinds: tuple[str, ...] = ("*",)
) -> Callable[[Server], object]:
    caps = capabilities if isinstance(capabilities, struct_pb2.Struct) else struct(capabilities)
    # `name` is new each time: a rejected register must not create the agent.
    return lambda s: s.agents.RegisterAgent(
        agent_service_pb2.RegisterAgentRequest(name=name, capacity=capacity, capabilities=caps, handled_kinds=kinds),
        timeout=10,
    )


def overrides(value: dict) -> Callable[[Server], object]:
    return lambda s: s.admin.SetAgentOverrides(
        agent_admin_service_pb2.SetAgentOverridesRequest(agent_id=s.agent_id, overrides=struct(value)), timeout=10
    )


def nan_struct() -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.fields["x"].number_value = float("nan")
    return s


def beyond_exact_struct() -> struct_pb2.Struct:
    """An integer a double cannot carry exactly (2^53 + 1 arrives as 2^53)."""
    s = struct_pb2.Struct()
    s.fields["x"].number_value = float(2**53 + 1)
    return s


def stream(**message: object) -> Callable[[Server], tuple[object, str]]:
    """One message on the session stream; the Ack's code, or the resync."""

    def run(s: Server) -> tuple[object, str]:
        got = s.session.exchange(**message)
        for response in got:
            if response.WhichOneof("message") == "resync_request":
                return "RESYNC", response.resync_request.reason
        ack = got[-1].ack
        return grpc.StatusCode(_code(ack.code)) if ack.code else grpc.StatusCode.OK, ack.message

    return run


def _code(number: int) -> tuple:
    return next(c.value for c in grpc.StatusCode if c.value[0] == number)


def diff(base: int | None, *ops: capability_pb2.PatchOperation) -> Callable[[Server], tuple[object, str]]:
    def run(s: Server) -> tuple[object, str]:
        generation = s.session.generation if base is None else base
        return stream(heartbeat=agent_service_pb2.Heartbeat(
            status=agent_pb2.AGENT_STATUS_READY,
            capability_diff=capability_pb2.CapabilityDiff(base_generation=generation, operations=list(ops)),
        ))(s)

    return run


def op(kind: int, path: str, value: object = None, from_: str = "") -> capability_pb2.PatchOperation:
    operation = capability_pb2.PatchOperation(op=kind, path=path)
    if from_:
        setattr(operation, "from", from_)
    if value is not None:
        v = struct_pb2.Value()
        if isinstance(value, dict):
            v.struct_value.update(value)
        elif isinstance(value, str):
            v.string_value = value
        else:
            v.number_value = value
        operation.value.CopyFrom(v)
    return operation


def raw_nested_struct(depth: int) -> bytes:
    """A Struct nested `depth` levels, as bytes: about three protobuf levels per
    JSON level, past what the Python runtime (and prost) will build or parse."""
    body = ld(1, ld(1, b"leaf") + ld(2, b"\x19" + b"\x00" * 7 + b"\x40"))  # {"leaf": 2.0}
    for _ in range(depth - 1):
        body = ld(1, ld(1, b"n") + ld(2, ld(5, body)))
    return body


def raw_submit(body: bytes) -> Callable[[Server], tuple[object, str]]:
    def run(s: Server) -> tuple[object, str]:
        call = s.raw("/switchyard.v1.TaskService/SubmitTask", task_service_pb2.SubmitTaskResponse)
        err = rpc_error(lambda: call(body, timeout=10))
        return err.code(), err.details() or ""

    return run


def raw_get_task(body: bytes) -> Callable[[Server], tuple[object, str]]:
    def run(s: Server) -> tuple[object, str]:
        call = s.raw("/switchyard.v1.TaskService/GetTask", task_service_pb2.GetTaskResponse)
        err = rpc_error(lambda: call(body, timeout=10))
        return err.code(), err.details() or ""

    return run


BIG = "x" * (300 * 1024)  # over the 256 KiB document limit, under the 4 MiB message limit
HUGE = "x" * (5 * 1024 * 1024)  # over the 4 MiB message limit
ADD, REMOVE, REPLACE, MOVE, COPY, TEST = 1, 2, 3, 4, 5, 6

CASES: list[Case] = [
    # Oversized documents.
    # A violation at the root of a document names the field itself.
    ("payload over 256 KiB", unary(submit(payload=struct({"blob": BIG}))), INVALID, ["payload: document would be"]),
    ("capabilities over 256 KiB", unary(register("too-big", {"blob": BIG})), INVALID, ["capabilities"]),
    ("overrides over 256 KiB", unary(overrides({"blob": BIG})), INVALID, ["overrides: document would be"]),
    ("array of 5000 items", unary(submit(payload=struct({"a": list(range(5000))}))), INVALID, ["payload", "4096"]),
    ("key of 300 bytes", unary(register("long-key", {"k" * 300: 1})), INVALID, ["capabilities"]),
    # Over the 4 MiB gRPC message limit: tonic refuses before decoding.
    ("message over 4 MiB", unary(submit(payload=struct({"blob": HUGE}))),
     grpc.StatusCode.OUT_OF_RANGE, ["message length too large"]),  # FINDING (tonic): OUT_OF_RANGE, not RESOURCE_EXHAUSTED
    # Deeply nested documents: over depth 32 is the document limit ...
    ("payload nested 33 deep", unary(submit(payload=struct(nested(33)))), INVALID, ["payload", "depth"]),
    ("capabilities nested 33 deep", unary(register("deep", nested(33))), INVALID, ["capabilities", "depth"]),
    ("overrides nested 33 deep", unary(overrides(nested(33))), INVALID, ["overrides", "depth"]),
    # ... and past prost's recursion limit (100) the request does not even decode.
    ("payload nested 60 deep (hand-encoded)", raw_submit(ld(2, b"ok") + ld(3, raw_nested_struct(60))),
     INVALID, ["does not decode as a SubmitTaskRequest", "payload is nested too deeply", "100 nested messages"]),
    # Numbers JSON cannot hold.
    ("NaN in payload", unary(submit(payload=nan_struct())), INVALID, ["payload.x", "NaN"]),
    ("integer past 2^53 in payload", unary(submit(payload=beyond_exact_struct())), INVALID, ["payload.x", "2^53"]),
    # Malformed selectors: INVALID_ARGUMENT naming placement.selector and the offset.
    ("selector: dangling operator", unary(selector("linux, memory.total>=")), INVALID, ["placement.selector"]),
    ("selector: unbalanced", unary(selector("linux, (docker")), INVALID, ["placement.selector"]),
    ("selector: bad version range", unary(selector("software.node.version@^^20")), INVALID, ["placement.selector"]),
    ("selector: lone comma", unary(selector(",,")), INVALID, ["placement.selector"]),
    ("selector: bad capability ref", unary(selector("provides ai.llm@x")), INVALID, ["placement.selector"]),
    # Unknown enum values.
    ("operator 99", unary(requirement(key="os", operator=99, values=[struct_pb2.Value(string_value="x")])),
     INVALID, ["placement.requirements[0].operator"]),
    ("operator unset", unary(requirement(key="os", values=[struct_pb2.Value(string_value="x")])),
     INVALID, ["placement.requirements[0].operator"]),
    ("task state 99 in ListTasks", unary(lambda s: s.tasks.ListTasks(
        task_service_pb2.ListTasksRequest(states=[99]), timeout=5)), INVALID, ["states[0]"]),
    ("agent status 99 in ListAgents", unary(lambda s: s.admin.ListAgents(
        agent_admin_service_pb2.ListAgentsRequest(statuses=[99]), timeout=5)), INVALID, ["statuses"]),
    ("heartbeat status 99", stream(heartbeat=agent_service_pb2.Heartbeat(status=99)), INVALID, ["heartbeat.status"]),
    ("heartbeat status OFFLINE", stream(heartbeat=agent_service_pb2.Heartbeat(status=agent_pb2.AGENT_STATUS_OFFLINE)),
     INVALID, ["heartbeat.status"]),
    ("patch op 99", diff(None, op(99, "/x", 1)), "RESYNC", []),
    # Other malformed placements.
    ("regex that does not compile", unary(requirement(
        key="os", operator=placement_pb2.OPERATOR_REGEX, values=[struct_pb2.Value(string_value="(")])),
     INVALID, ["placement.requirements[0]"]),
    ("EQ with two operands", unary(requirement(
        key="os", operator=placement_pb2.OPERATOR_EQ,
        values=[struct_pb2.Value(string_value="a"), struct_pb2.Value(string_value="b")])),
     INVALID, ["placement.requirements[0]"]),
    ("JSON Schema that is not one", unary(submit(placement=placement_pb2.Placement(
        json_schema=struct({"type": 12})))), INVALID, ["placement.json_schema"]),
    ("toleration with whitespace", unary(submit(placement=placement_pb2.Placement(tolerations=["gpu pool"]))),
     INVALID, ["placement.tolerations[0]", "whitespace"]),
    ("empty toleration", unary(submit(placement=placement_pb2.Placement(tolerations=[""]))),
     INVALID, ["placement.tolerations[0]", "empty"]),
    ("toleration of 300 bytes", unary(submit(placement=placement_pb2.Placement(tolerations=["t" * 300]))),
     INVALID, ["placement.tolerations[0]", "300 bytes"]),
    ("tolerates without a usable taint", unary(selector('tolerates "a\tb"')), INVALID, ["placement.tolerations[0]"]),
    ("unknown placement policy", unary(submit(placement=placement_pb2.Placement(policy=9))),
     INVALID, ["placement.policy", "unknown policy 9"]),
    ("GPU selector that does not parse", unary(submit(placement=placement_pb2.Placement(
        resources=placement_pb2.ResourceRequest(gpus=1, gpu_selector="memory_mb>=")))),
     INVALID, ["placement.resources.gpu_selector"]),
    ("GPU requirements without GPUs", unary(submit(placement=placement_pb2.Placement(
        resources=placement_pb2.ResourceRequest(gpu_selector="memory_mb>=40000")))),
     INVALID, ["placement.resources.gpu_requirements", "gpus of at least 1"]),
    ("more slots than any task may ask", unary(submit(placement=placement_pb2.Placement(
        resources=placement_pb2.ResourceRequest(slots=20_000)))),
     INVALID, ["placement.resources.slots", "10000"]),
    ("memory past 2^53", unary(submit(placement=placement_pb2.Placement(
        resources=placement_pb2.ResourceRequest(memory_mb=1 << 60)))),
     INVALID, ["placement.resources.memory_mb"]),
    ("named resource of zero", unary(submit(placement=placement_pb2.Placement(
        resources=placement_pb2.ResourceRequest(named={"licenses.matlab": 0})))),
     INVALID, ['placement.resources.named["licenses.matlab"]', "at least 1"]),
    ("needs without an amount", unary(selector("needs gpus: many")), INVALID, ["placement.selector", "amount"]),
    ("spread key with whitespace", unary(submit(placement=placement_pb2.Placement(spread_by="a b"))),
     INVALID, ["placement.spread_by"]),
    # Wrong generations and invalid patches: a ResyncRequest, nothing applied.
    ("diff against a future generation", diff(10_000, op(REPLACE, "/memory/total", 2048)), "RESYNC", ["generation"]),
    ("diff against generation 0", diff(0, op(REPLACE, "/memory/total", 2048)), "RESYNC", ["generation"]),
    ("patch: remove a missing path", diff(None, op(REMOVE, "/nope")), "RESYNC", []),
    ("patch: failing test", diff(None, op(TEST, "/memory/total", 1), op(REPLACE, "/memory/total", 9)), "RESYNC", []),
    ("patch: pointer without slash", diff(None, op(ADD, "memory", 1)), "RESYNC", []),
    ("patch: move from a missing path", diff(None, op(MOVE, "/a", from_="/nope")), "RESYNC", []),
    ("patch: over the size limit", diff(None, op(ADD, "/blob", BIG)), "RESYNC", []),
    # Two operations, so that no single Value is too deep for the Python runtime
    # to build: 16 levels at /a, then 18 more inside it (35 in all).
    ("patch: over the depth limit",
     diff(None, op(ADD, "/a", nested(16)), op(ADD, "/a" + "/n" * 15 + "/x", nested(18))), "RESYNC", ["depth"]),
    ("snapshot nested 33 deep", stream(capability_snapshot=agent_service_pb2.CapabilitySnapshot(
        capabilities=struct(nested(33)))), INVALID, ["capability_snapshot.capabilities", "depth"]),
    ("empty ConnectRequest", stream(), INVALID, ["message"]),
    ("second hello", stream(hello=agent_service_pb2.Hello(agent_id="x")), INVALID, ["hello"]),
    ("lease update with a bad lease id", stream(lease_update=agent_service_pb2.LeaseUpdate(
        lease_id="nope", task_id="nope", accepted=agent_service_pb2.LeaseAccepted())),
     INVALID, ["lease_update.lease_id"]),
    # Output: checked before anything is looked up, naming the chunk.
    ("output with no chunks", stream(lease_update=agent_service_pb2.LeaseUpdate(
        lease_id=ZERO_ID, task_id=ZERO_ID, output=agent_service_pb2.TaskOutput())),
     INVALID, ["lease_update.output.chunks", "empty"]),
    ("output chunk without a stream", stream(lease_update=agent_service_pb2.LeaseUpdate(
        lease_id=ZERO_ID, task_id=ZERO_ID, output=agent_service_pb2.TaskOutput(chunks=[
            agent_service_pb2.OutputChunk(sequence=1, text="x\n")]))),
     INVALID, ["lease_update.output.chunks[0].stream"]),
    ("output chunks out of order", stream(lease_update=agent_service_pb2.LeaseUpdate(
        lease_id=ZERO_ID, task_id=ZERO_ID, output=agent_service_pb2.TaskOutput(chunks=[
            agent_service_pb2.OutputChunk(stream=task_pb2.OUTPUT_STREAM_STDOUT, sequence=2, text="a"),
            agent_service_pb2.OutputChunk(stream=task_pb2.OUTPUT_STREAM_STDOUT, sequence=1, text="b")]))),
     INVALID, ["lease_update.output.chunks[1].sequence"]),
    ("ListTaskOutput page token forged", unary(lambda s: s.tasks.ListTaskOutput(
        task_service_pb2.ListTaskOutputRequest(task_id=s.any_task_id, page_token="Zm9v"), timeout=5)),
     INVALID, ["page_token"]),
    ("WatchTask offset without output", unary(lambda s: list(s.tasks.WatchTask(
        task_service_pb2.WatchTaskRequest(task_id=s.any_task_id, output_offset=5), timeout=5))),
     INVALID, ["output_offset"]),
    # Ids, names, numbers.
    ("task id not a UUID", unary(lambda s: s.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id="../etc"),
                                                            timeout=5)), INVALID, ["task_id"]),
    ("agent id not a UUID", unary(lambda s: s.admin.GetAgent(
        agent_admin_service_pb2.GetAgentRequest(agent_id="x"), timeout=5)), INVALID, ["agent_id"]),
    ("ListTasks page token forged", unary(lambda s: s.tasks.ListTasks(
        task_service_pb2.ListTasksRequest(page_token="Zm9v"), timeout=5)), INVALID, ["page_token"]),
    ("ListTaskEvents page token forged", unary(lambda s: s.tasks.ListTaskEvents(
        task_service_pb2.ListTaskEventsRequest(task_id=s.any_task_id, page_token="Zm9v"), timeout=5)),
     INVALID, ["page_token"]),
    ("kind missing", unary(lambda s: s.tasks.SubmitTask(task_service_pb2.SubmitTaskRequest(), timeout=5)),
     INVALID, ["kind"]),
    ("max_attempts 1000", unary(submit(max_attempts=1000)), INVALID, ["max_attempts"]),
    ("lease_ttl negative", unary(submit(lease_ttl=duration_pb2.Duration(seconds=-5))), INVALID, ["lease_ttl"]),
    ("namespace with capitals", unary(submit(namespace="Bad/NS")), INVALID, ["namespace"]),
    ("capacity 0", unary(register("zero-capacity", {"tags": []}, capacity=0)), INVALID, ["capacity"]),
    # Task kinds: a kind is 1-256 bytes without white space, and `*` only as a pattern.
    ("kind with a space", unary(lambda s: s.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(kind="two words"), timeout=5)), INVALID, ["kind", "white space"]),
    ("kind of 300 bytes", unary(lambda s: s.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(kind="k" * 300), timeout=5)), INVALID, ["kind", "256"]),
    ("kind with a wildcard", unary(lambda s: s.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(kind="build.*"), timeout=5)), INVALID, ["kind", "`*`"]),
    # SubmitTasks: every task checked before any is stored, a bad one named by its index.
    ("SubmitTasks with a bad third task", unary(lambda s: s.tasks.SubmitTasks(
        task_service_pb2.SubmitTasksRequest(tasks=[
            task_service_pb2.SubmitTaskRequest(kind="ok"), task_service_pb2.SubmitTaskRequest(kind="ok"),
            task_service_pb2.SubmitTaskRequest(kind="two words")]), timeout=5)),
     INVALID, ["tasks[2].kind", "white space"]),
    ("SubmitTasks with no task", unary(lambda s: s.tasks.SubmitTasks(
        task_service_pb2.SubmitTasksRequest(), timeout=5)), INVALID, ["tasks", "from 1 to 1000"]),
    ("SubmitTasks of 1001 tasks", unary(lambda s: s.tasks.SubmitTasks(
        task_service_pb2.SubmitTasksRequest(tasks=[task_service_pb2.SubmitTaskRequest(kind="ok")] * 1001),
        timeout=5)), INVALID, ["tasks", "1001"]),
    ("SubmitTasks relying on a later task's limit", unary(lambda s: s.tasks.SubmitTasks(
        task_service_pb2.SubmitTasksRequest(tasks=[
            task_service_pb2.SubmitTaskRequest(kind="ok", concurrency_key="bulk-new"),
            task_service_pb2.SubmitTaskRequest(kind="ok", concurrency_key="bulk-new", concurrency_limit=5)]),
        timeout=5)), INVALID, ["tasks[0].concurrency_limit"]),
    ("handled kind with a space", unary(register("bad-kinds", {"tags": []}, kinds=("exec", "two words"))),
     INVALID, ["handled_kinds[1]"]),
    ("handled kind pattern in the middle", unary(register("bad-pattern", {"tags": []}, kinds=("a.*.b",))),
     INVALID, ["handled_kinds[0]"]),
    ("2000 handled kinds", unary(register("many-kinds", {"tags": []}, kinds=tuple(f"k{i}" for i in range(2000)))),
     INVALID, ["handled_kinds", "1024"]),
    ("heartbeat with a bad kind", stream(heartbeat=agent_service_pb2.Heartbeat(
        status=agent_pb2.AGENT_STATUS_READY, handled_kinds=agent_service_pb2.HandledKinds(kinds=["ok", ""]))),
     INVALID, ["heartbeat.handled_kinds.kinds[1]"]),
    # Invalid UTF-8 in string fields, hand-encoded: prost refuses to decode,
    # and the error names the message and the field.
    ("invalid UTF-8 in kind", raw_submit(ld(2, b"\xff\xfe bad")),
     INVALID, ["does not decode as a SubmitTaskRequest", "kind", "UTF-8"]),
    ("invalid UTF-8 in a payload key", raw_submit(ld(2, b"ok") + ld(3, ld(1, ld(1, b"\xc3\x28") + ld(2, b"")))),
     INVALID, ["does not decode as a SubmitTaskRequest", "payload", "UTF-8"]),
    ("invalid UTF-8 in a selector", raw_submit(ld(2, b"ok") + ld(4, ld(5, b"linux, \xed\xa0\x80"))),
     INVALID, ["does not decode as a SubmitTaskRequest", "selector", "UTF-8"]),
    ("invalid UTF-8 in task id", raw_get_task(ld(1, b"\x80\x80")),
     INVALID, ["does not decode as a GetTaskRequest", "task_id", "UTF-8"]),
    # Bytes that are not protobuf at all.
    ("truncated message", raw_submit(b"\x12\x10ab"), INVALID, ["does not decode as a SubmitTaskRequest"]),
    ("wrong wire type for kind", raw_submit(b"\x10\x05"), INVALID, ["does not decode as a SubmitTaskRequest"]),
]


@pytest.mark.parametrize(("name", "send", "expected", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(server: Server, name, send, expected, words):
    before = snapshot(server)
    code, message = send(server)
    if os.environ.get("BADINPUT_SHOW"):
        print(f"\n{name}: {code} {message[:200]!r}")
    assert code == expected, f"{name}: got {code} {message!r}, expected {expected}"
    for word in words:
        assert word in message, f"{name}: message {message!r} does not mention {word!r}"
    assert serving(server), f"{name}: the server stopped serving"
    assert snapshot(server) == before, f"{name}: something stored changed"


def test_the_session_survives_every_bad_message(server: Server):
    """After all of it the stream is still open and a good heartbeat is acknowledged OK."""
    got = server.session.exchange(heartbeat=agent_service_pb2.Heartbeat(status=agent_pb2.AGENT_STATUS_READY))
    assert got[-1].ack.code == 0, got[-1]
