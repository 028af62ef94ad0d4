"""The Rust agent library, the Python runner and the Node runner send a task's output alike: each
runs a handler that writes the steps of ``tests/conformance/output.json`` the way its language
writes (the Rust ``ctx.stdout``/``ctx.stderr``/``ctx.log``, Python's ``print`` and ``ctx.log``,
Node's ``process.stdout.write`` and ``ctx.log``), against one real server; the output the server
keeps, with adjacent chunks of one stream joined, must be each case's ``expected``, and a failed
attempt's error must carry ``expected_tail``.

The server is ``$SWITCHYARD_SERVER_BIN`` (default ``target/debug/switchyard-server``); the Rust
program is ``target/debug/examples/output_scenario`` (built by ``cargo test``, or
``cargo build -p switchyard-agent --examples``).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator

import grpc
import pytest

from switchyard_runner import convert
from switchyard_runner.v1 import placement_pb2, task_pb2, task_service_pb2, task_service_pb2_grpc

REPO = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
CASES = json.loads((REPO / "tests" / "conformance" / "output.json").read_text())
STREAMS = {
    task_pb2.OUTPUT_STREAM_STDOUT: "stdout",
    task_pb2.OUTPUT_STREAM_STDERR: "stderr",
    task_pb2.OUTPUT_STREAM_LOG: "log",
}


def built(path: pathlib.Path, how: str) -> pathlib.Path:
    if not path.exists():
        pytest.fail(f"{path} not found: {how}")
    return path


def rust(server: str, directory: pathlib.Path, name: str) -> list[str]:
    program = built(
        REPO / "target" / "debug" / "examples" / "output_scenario",
        "run `cargo build -p switchyard-agent --examples` first",
    )
    return [str(program), f"http://{server}", str(directory), name]


def python(server: str, directory: pathlib.Path, name: str) -> list[str]:
    return [sys.executable, str(HERE / "output_runner.py"), server, str(directory), name]


def node(server: str, directory: pathlib.Path, name: str) -> list[str]:
    return ["node", str(HERE / "output_runner.mjs"), f"http://{server}", str(directory), name]


RUNNERS: dict[str, Callable[[str, pathlib.Path, str], list[str]]] = {"rust": rust, "python": python, "node": node}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    binary = pathlib.Path(os.environ.get("SWITCHYARD_SERVER_BIN", REPO / "target" / "debug" / "switchyard-server"))
    built(binary, "run `cargo build -p switchyard-server` first")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:0", "--database-url", f"sqlite://{tmp}/switchyard.db"],
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("TEST_LOG") else subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        match = re.search(r"listening on (\S+)", proc.stdout.readline())
        assert match, "the server did not start"
        try:
            yield match.group(1)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def joined(chunks) -> list[dict]:
    """The chunks as (stream, text), adjacent ones of one stream joined."""
    out: list[dict] = []
    for chunk in chunks:
        stream = STREAMS[chunk.stream]
        if out and out[-1]["stream"] == stream:
            out[-1]["text"] += chunk.text
        elif chunk.text:
            out.append({"stream": stream, "text": chunk.text})
    return out


async def run_case(server: str, tag: str, case: dict) -> task_pb2.Task:
    """Submits the case to the runner tagged ``tag`` and follows it to its end."""
    async with grpc.aio.insecure_channel(server) as channel:
        tasks = task_service_pb2_grpc.TaskServiceStub(channel)
        submitted = await tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                kind="conformance.output",
                payload=convert.to_struct({"steps": case["steps"], "fail": case["fail"]}),
                placement=placement_pb2.Placement(selector=tag),
                max_attempts=1,
            ),
            timeout=5,
        )
        task_id = submitted.task.task_id

        async def follow() -> task_pb2.Task:
            async for item in tasks.WatchTask(task_service_pb2.WatchTaskRequest(task_id=task_id)):
                if item.task.state in (task_pb2.TASK_STATE_SUCCEEDED, task_pb2.TASK_STATE_FAILED):
                    return item.task
            return (await tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))).task

        done = await asyncio.wait_for(follow(), 30)
        chunks = []
        token = ""
        while True:
            page = await tasks.ListTaskOutput(
                task_service_pb2.ListTaskOutputRequest(task_id=task_id, page_token=token), timeout=5
            )
            chunks.extend(page.chunks)
            token = page.next_page_token
            if not token:
                break
        return done, chunks


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_every_runner_sends_the_same_output(server: str, runner: str, tmp_path: pathlib.Path) -> None:
    tag = f"output-{runner}"
    (tmp_path / ".capabilities.json").write_text(json.dumps({"tags": [tag]}))
    proc = subprocess.Popen(
        RUNNERS[runner](server, tmp_path, f"output-{runner}"),
        stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("TEST_LOG") else subprocess.DEVNULL,
    )
    try:
        for case in CASES:
            done, chunks = asyncio.run(run_case(server, tag, case))
            expected_state = task_pb2.TASK_STATE_FAILED if case["fail"] else task_pb2.TASK_STATE_SUCCEEDED
            assert done.state == expected_state, f"{runner}, {case['name']}: {done}"
            assert joined(chunks) == case["expected"], f"{runner}, {case['name']}"
            if "expected_tail" in case:
                assert done.error.output_tail == case["expected_tail"], f"{runner}, {case['name']}"
    finally:
        proc.terminate()
        proc.wait(timeout=15)
