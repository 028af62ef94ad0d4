"""The example runner runs as a program: it serves `echo`, and SIGTERM drains it to exit 0."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import sys

from helpers import Client
from switchyard_runner.v1 import task_pb2

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "echo_runner.py"


async def test_echo_example_serves_and_exits_cleanly_on_sigterm(server_address: str, tmp_path: pathlib.Path) -> None:
    env = dict(os.environ, SWITCHYARD_SERVER=server_address, SWITCHYARD_AGENT_DIR=str(tmp_path), SWITCHYARD_GRACE_SECS="5")
    proc = await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLE), env=env)
    client = Client(server_address)
    try:
        task = await client.submit("echo", {"hello": "world"})
        done = await client.wait_for(task.task_id, (task_pb2.TASK_STATE_SUCCEEDED,), timeout=20)
        assert done.result["echo"]["hello"] == "world"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await client.close()
