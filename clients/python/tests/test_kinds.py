"""What the Python runner advertises and how it hands work back, against the real server: a
runner is never granted a kind it does not handle, nor is ``python -m switchyard_runner run`` (it
handles none), and the explanation says why; a task its handler keeps handing back reaches the
server's bound and fails while another task runs; a handler whose required capability is
unhealthy is withdrawn, the runner DEGRADED naming both, until the capability is back."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import sys

import pytest

from helpers import Client, make_runner, running
from switchyard_runner import Release, TaskContext
from switchyard_runner.v1 import agent_pb2, task_pb2

SUCCEEDED = (task_pb2.TASK_STATE_SUCCEEDED,)
FAILED = (task_pb2.TASK_STATE_FAILED,)


async def echo(task: TaskContext) -> dict:
    return {"echo": task.payload}


async def test_a_kind_the_runner_does_not_handle_is_never_granted_to_it(server_address: str, client: Client) -> None:
    echo_only = make_runner(server_address, name="echo-only")
    echo_only.add_handler("echo", echo)
    async with running(echo_only):
        assert list((await client.agent(echo_only.agent_id)).handled_kinds) == ["echo"]
        task = await client.submit("convert", {"file": "a.md"})
        assert task.queued_reason == task_pb2.QUEUED_REASON_PARKED
        verdict = await client.verdict(task.task_id, echo_only.agent_id)
        assert verdict.reason == "does not handle kind convert"
        assert not verdict.eligible and not verdict.capable

        # A runner that handles `convert` takes it; the other one never had it.
        converter = make_runner(server_address, name="converter")
        converter.add_handler("convert", echo)
        async with running(converter):
            done = await client.wait_for(task.task_id, SUCCEEDED)
            assert done.result["echo"]["file"] == "a.md"
            assert await client.leased_to(task.task_id) == [converter.agent_id]


async def test_run_mode_advertises_no_kinds_and_is_granted_nothing(
    server_address: str, client: Client, tmp_path: pathlib.Path
) -> None:
    env = dict(os.environ, SWITCHYARD_AGENT_NAME="py-run-mode", SWITCHYARD_GRACE_SECS="5")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "switchyard_runner", "run", "--dir", str(tmp_path), "--server", server_address, env=env,
    )
    try:
        idle = await client.agent_until(lambda a: a.status == agent_pb2.AGENT_STATUS_READY, "py-run-mode", timeout=20)
        assert list(idle.handled_kinds) == []
        task = await client.submit("echo", {"n": 1})
        assert (await client.verdict(task.task_id, idle.agent_id)).reason == "does not handle kind echo"

        worker = make_runner(server_address, name="echo-worker")
        worker.add_handler("echo", echo)
        async with running(worker):
            await client.wait_for(task.task_id, SUCCEEDED)
            assert await client.leased_to(task.task_id) == [worker.agent_id]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.server_args("--max-releases-per-task", "3")
async def test_a_task_the_handler_keeps_handing_back_reaches_the_bound(server_address: str, client: Client) -> None:
    runner = make_runner(server_address, capacity=1)
    handed_back: list[str] = []

    @runner.handler("stubborn")
    async def stubborn(task: TaskContext) -> dict:
        handed_back.append(task.lease_id)
        raise Release("not now")  # BUSY: offered again after a backoff

    runner.add_handler("echo", echo)
    async with running(runner):
        stuck = await client.submit("stubborn")
        other = await client.submit("echo", {"beside": True})
        await client.wait_for(other.task_id, SUCCEEDED)
        failed = await client.wait_for(stuck.task_id, FAILED, timeout=30)
        assert failed.error.code == "released_too_often"
        assert len(handed_back) == 3 and len(set(handed_back)) == 3
        assert await client.leased_to(stuck.task_id) == [runner.agent_id] * 3
        ends = [e for e in await client.history(stuck.task_id) if e.kind in ("released", "failed")]
        assert [e.kind for e in ends] == ["released", "released", "failed"]
        assert all(e.message.startswith("the agent released the task (busy): not now") for e in ends), ends


async def test_a_handler_whose_required_capability_is_unhealthy_is_withdrawn_until_it_is_back(
    server_address: str, client: Client, tmp_path: pathlib.Path
) -> None:
    tier = tmp_path / ".capabilities.json"
    tier.write_text(json.dumps(
        {"provides": {"ai.llm": {"version": "1.2.0", "healthy": False, "reason": "quota exhausted"}}}
    ))
    runner = make_runner(server_address, tmp_path, name="llm")

    @runner.handler("summarize", requires=["ai.llm@1"])
    async def summarize(task: TaskContext) -> dict:
        return {"summary": "short"}

    runner.add_handler("echo", echo)
    async with running(runner):
        degraded = await client.agent_until(lambda a: a.status == agent_pb2.AGENT_STATUS_DEGRADED, "llm")
        assert list(degraded.handled_kinds) == ["echo"]
        withdrawal = "handler summarize withdrawn: needs ai.llm@1, unhealthy: quota exhausted"
        assert list(degraded.status_reasons) == [withdrawal]
        task = await client.submit("summarize")
        assert task.queued_reason == task_pb2.QUEUED_REASON_PARKED
        assert (await client.verdict(task.task_id, runner.agent_id)).reason == "does not handle kind summarize"

        # The capability is back (the refresh notices the file): so is the kind, by heartbeat.
        tier.write_text(json.dumps({"provides": {"ai.llm": {"version": "1.2.0", "healthy": True}}}))
        done = await client.wait_for(task.task_id, SUCCEEDED)
        assert done.result["summary"] == "short"
        ready = await client.agent_until(lambda a: a.status == agent_pb2.AGENT_STATUS_READY, "llm")
        assert list(ready.handled_kinds) == ["echo", "summarize"]
        assert list(ready.status_reasons) == []
        assert ready.session_epoch == degraded.session_epoch, "the kinds came back without a new registration"
