"""The handler API without a server: what a runner advertises as its document changes, requires
on packs and single handlers, malformed kinds, and :class:`Release`'s causes."""

from __future__ import annotations

import pytest

from switchyard_runner import HandlerPack, Release, ReleaseCause, Runner
from switchyard_runner.v1 import agent_service_pb2 as pb


def test_release_causes_are_the_contract_s() -> None:
    for cause in ReleaseCause:
        assert pb.ReleaseCause.Value(f"RELEASE_CAUSE_{cause.name}") == cause
    assert Release("not now").cause is ReleaseCause.BUSY
    assert Release("not a PDF", cause=ReleaseCause.CANNOT_DECODE).cause is ReleaseCause.CANNOT_DECODE
    assert Release("later", pb.RELEASE_CAUSE_OTHER).cause is ReleaseCause.OTHER
    with pytest.raises(ValueError, match="DRAINING"):
        Release("bye", ReleaseCause.DRAINING)


def test_a_required_capability_withdraws_the_kind_until_it_is_there() -> None:
    runner = Runner(params=lambda name: None)
    runner.add_handler("echo", lambda task: {})
    runner.add_handler("summarize", lambda task: {}, requires=["ai.llm@1"])
    runner.pack(HandlerPack("bot", handlers={"reply": lambda task: {}}, requires=["ai.llm@1", "comm.gateway"]))
    assert runner.advertised.kinds == ["echo"]
    assert runner.unhealthy == [
        "handler reply withdrawn: needs ai.llm@1, not provided",
        "handler reply withdrawn: needs comm.gateway, not provided",
        "handler summarize withdrawn: needs ai.llm@1, not provided",
    ]

    runner.set_capabilities({"provides": {"ai.llm": {"version": "2.0.0"}, "comm.gateway": {"version": "1"}}})
    assert runner.advertised.kinds == ["echo"]
    assert [w.problem for w in runner.advertised.withdrawn] == ["version 2.0.0, not major 1"] * 2

    runner.set_capabilities({"provides": {"ai.llm": {"version": "1.4.0"}}})
    assert runner.advertised.kinds == ["echo", "reply", "summarize"]
    assert runner.unhealthy == []


def test_a_malformed_handler_kind_is_rejected_and_not_advertised() -> None:
    runner = Runner(params=lambda name: None)
    runner.add_handler("two words", lambda task: {})
    runner.add_handler("build.*", lambda task: {})
    runner.add_handler("build.docker", lambda task: {})
    assert runner.advertised.kinds == ["build.docker"]
    assert [(r.kind, r.id, r.reason) for r in runner.rejections] == [
        ("handler", "two words", "handler kind has ' ': no white space or control characters"),
        ("handler", "build.*", "handler kind has `*` other than as `*` alone or a trailing `.*`"),
    ]


def test_failure_details_the_contract_cannot_carry_are_dropped_and_said() -> None:
    from switchyard_runner import TaskFailure
    from switchyard_runner.runner import _failed

    ids = {"lease_id": "l1", "task_id": "t1", "fencing_token": 1}
    kept = _failed(ids, TaskFailure("exit 3", code="exit_code", details={"exit_code": 3}))
    assert kept.failed.error.details["exit_code"] == 3
    dropped = _failed(ids, TaskFailure("exit 3", code="exit_code", details={"inode": 2**64 - 1}))
    assert dropped.failed.error.message.startswith(
        "exit 3 (details dropped: error.details.inode: number is beyond"
    ), dropped.failed.error.message
    assert not dropped.failed.error.HasField("details")
