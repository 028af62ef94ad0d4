"""What the server accepts at its limits, this runner decodes.

The Rust test `server/tests/api/wire_limits.rs` (run first by `scripts/test`) drives a real server
to every nesting limit and writes each message it sent to `target/wire-limits/`; here each one is
decoded with Python's protobuf at its default limits.
"""

from __future__ import annotations

import pathlib

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from switchyard_runner.v1 import agent_admin_service_pb2 as admin
from switchyard_runner.v1 import agent_service_pb2 as agent
from switchyard_runner.v1 import task_service_pb2 as tasks

CORPUS = pathlib.Path(__file__).resolve().parents[3] / "target" / "wire-limits"

TYPES: dict[str, type[Message]] = {
    "grant": agent.ConnectResponse,
    "watch": tasks.WatchTaskResponse,
    "task-page": tasks.ListTasksResponse,
    "explain": tasks.ExplainTaskResponse,
    "agent": admin.GetAgentResponse,
    "simulation": admin.SimulatePlacementResponse,
}


def depth(value: object) -> int:
    """Containers deep: 0 for a scalar."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def files() -> list[pathlib.Path]:
    found = sorted(CORPUS.glob("*.binpb"))
    assert found, f"no corpus in {CORPUS}: run `cargo nextest run -p switchyard-server --test api wire_limits` first"
    return found


def test_the_corpus_has_every_message_of_both_stores() -> None:
    names = {f.name for f in files()}
    for backend in ("sqlite", "postgres"):
        for kind in TYPES:
            assert f"{backend}-{kind}.binpb" in names


@pytest.mark.parametrize("path", files(), ids=lambda p: p.stem)
def test_decodes_with_default_limits(path: pathlib.Path) -> None:
    kind = path.stem.split("-", 1)[1]
    message = TYPES[kind].FromString(path.read_bytes())
    as_json = json_format.MessageToDict(message)
    # The deepest values made it through whole: 32 levels are 32 here too.
    assert depth(as_json) >= 32, f"{path.name} is only {depth(as_json)} deep"
