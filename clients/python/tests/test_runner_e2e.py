"""The runner against the real server: register, lease and complete, retries, unparking on a
capability diff, cancellation, an execution timeout, DEGRADED packs, and resuming a lease across a
server restart."""

from __future__ import annotations

import asyncio
import json
import pathlib

from helpers import Client, make_runner, running
from switchyard_runner import HandlerPack, Param, ProvidedCapability, Runner, TaskContext, convert
from switchyard_runner.v1 import agent_pb2, task_pb2

SUCCEEDED = (task_pb2.TASK_STATE_SUCCEEDED,)


async def test_registers_with_its_document(server_address: str, client: Client, tmp_path: pathlib.Path) -> None:
    (tmp_path / ".capabilities.json").write_text(json.dumps({"environment": "test", "db_password": "hunter2"}))
    async with running(make_runner(server_address, tmp_path)) as runner:
        agent = await client.agent(runner.agent_id)
        assert agent.runner.startswith("switchyard-runner/") and agent.runner.endswith("(python)")
        assert list(agent.handled_kinds) == [], "no handlers: it advertises no kinds"
        doc = agent.capabilities.document
        assert doc["environment"] == "test"
        assert doc["db_password"] == "[redacted]"
        assert doc["os"] and doc["arch"]
        tiers = {p.path: p.tier for p in agent.capabilities.provenance}
        assert tiers["environment"] == 2 and tiers["os"] == 1


async def test_lease_and_complete(server_address: str, client: Client) -> None:
    runner = make_runner(server_address)
    progress: list[int] = []

    @runner.handler("echo")
    async def echo(task: TaskContext) -> dict:
        task.progress(50, "half way")
        progress.append(task.attempt)
        return {"echo": task.payload}

    async with running(runner):
        assert list((await client.agent(runner.agent_id)).handled_kinds) == ["echo"]
        task = await client.submit("echo", {"n": 3, "s": "hi"})
        done = await client.wait_for(task.task_id, SUCCEEDED)
        assert dict(done.result)["echo"]["s"] == "hi"
        assert done.result["echo"]["n"] == 3
        assert done.attempts == 0
        assert progress == [1]


async def test_whole_numbers_arrive_as_integers_and_one_past_2_53_fails_named(
    server_address: str, client: Client
) -> None:
    runner = make_runner(server_address)

    @runner.handler("exact")
    async def exact(task: TaskContext) -> dict:
        return {"exit_code": 0, "port": 8080, "load": 0.5, "seen": task.payload}

    @runner.handler("too-big")
    async def too_big(task: TaskContext) -> dict:
        return {"ok": True, "id": 2**53 + 1}

    async with running(runner):
        task = await client.submit("exact", {"n": 3})
        done = await client.wait_for(task.task_id, SUCCEEDED)
        result = convert.from_struct(done.result)
        assert json.dumps(result, sort_keys=True) == (
            '{"exit_code": 0, "load": 0.5, "port": 8080, "seen": {"n": 3}}'
        ), "the handler saw an int payload and its ints came back as ints"
        task = await client.submit("too-big", max_attempts=1)
        failed = await client.wait_for(task.task_id, (task_pb2.TASK_STATE_FAILED,))
        assert failed.error.message.startswith(
            "the handler's result cannot be sent: result.id: number is beyond ±(2^53 − 1)"
        ), failed.error.message
        assert not failed.error.retryable


async def test_a_handler_gets_the_gpus_its_lease_holds(server_address: str, client: Client, tmp_path: pathlib.Path) -> None:
    gpus = [{"index": i, "uuid": f"GPU-{i}", "model": "Tesla T4", "memory_mb": 15360} for i in range(2)]
    (tmp_path / ".capabilities.json").write_text(json.dumps({"resources": {"gpus": gpus}}))
    runner = make_runner(server_address, tmp_path)
    seen: list[dict] = []

    @runner.handler("train")
    async def train(task: TaskContext) -> dict:
        seen.append(task.resources.env())
        return {"gpus": list(task.resources.gpu_ids)}

    async with running(runner):
        task = await client.submit("train", selector="needs gpus: 2, needs memory: 64")
        done = await client.wait_for(task.task_id, SUCCEEDED)
        assert list(done.result["gpus"]) == ["GPU-0", "GPU-1"]
        assert seen[0]["CUDA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"
        assert seen[0]["SWITCHYARD_MEMORY_MB"] == "64"


async def test_handler_exception_is_a_failed_attempt_then_retried(server_address: str, client: Client) -> None:
    runner = make_runner(server_address)
    calls: list[int] = []

    @runner.handler("flaky")
    def flaky(task: TaskContext) -> dict:  # a plain function runs in a thread
        calls.append(task.attempt)
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")
        return {"ok": True}

    async with running(runner):
        task = await client.submit("flaky", max_attempts=2)
        done = await client.wait_for(task.task_id, SUCCEEDED, timeout=20)
        assert done.state == task_pb2.TASK_STATE_SUCCEEDED
        assert done.attempts == 1
        assert calls == [1, 2]


async def test_capability_diff_unparks_a_task(server_address: str, client: Client, tmp_path: pathlib.Path) -> None:
    override = tmp_path / ".capabilities.override.json"
    override.write_text(json.dumps({"environment": "test"}))
    runner = make_runner(server_address, tmp_path)

    @runner.handler("needs-gpu")
    async def needs_gpu(task: TaskContext) -> dict:
        return {}

    async with running(runner):
        task = await client.submit("needs-gpu", required_tags=["pytest-gpu"])
        parked = await client.get(task.task_id)
        assert parked.state == task_pb2.TASK_STATE_QUEUED
        assert parked.queued_reason == task_pb2.QUEUED_REASON_PARKED
        # The override file changes; the refresh notices and the heartbeat carries the diff.
        override.write_text(json.dumps({"environment": "test", "tags": ["linux", "pytest-gpu"]}))
        await client.wait_for(task.task_id, SUCCEEDED)
        agent = await client.agent(runner.agent_id)
        assert list(agent.capabilities.document["tags"]) == ["linux", "pytest-gpu"]


async def test_set_capabilities_unparks_a_task(server_address: str, client: Client) -> None:
    runner = make_runner(server_address, refresh_interval=60)

    @runner.handler("needs-tool")
    async def needs_tool(task: TaskContext) -> dict:
        return {}

    async with running(runner):
        task = await client.submit("needs-tool", required_tags=["pytest-tool"])
        assert (await client.get(task.task_id)).queued_reason == task_pb2.QUEUED_REASON_PARKED
        runner.set_capabilities({"tags": ["pytest-tool"], "tool": {"version": "1.2.3"}})
        await client.wait_for(task.task_id, SUCCEEDED)


async def test_cancel_reaches_a_running_handler(server_address: str, client: Client) -> None:
    runner = make_runner(server_address)
    started, stopped = asyncio.Event(), asyncio.Event()

    @runner.handler("forever")
    async def forever(task: TaskContext) -> dict:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise
        return {}

    async with running(runner):
        task = await client.submit("forever")
        await asyncio.wait_for(started.wait(), 10)
        from switchyard_runner.v1 import task_service_pb2

        await client.tasks.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="test"), timeout=5)
        await asyncio.wait_for(stopped.wait(), 10)
        done = await client.wait_for(task.task_id, (task_pb2.TASK_STATE_CANCELED,))
        assert done.state == task_pb2.TASK_STATE_CANCELED
        assert not runner._running
        last = (await client.history(task.task_id))[-1]
        assert last.kind == "canceled"
        assert last.message == "the agent released the task (revocation_acknowledged): canceled by the server"


async def test_an_execution_timeout_stops_the_handler(server_address: str, client: Client) -> None:
    runner = make_runner(server_address)
    started, stopped = asyncio.Event(), asyncio.Event()

    @runner.handler("stuck")
    async def stuck(task: TaskContext) -> dict:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise
        return {}

    async with running(runner):
        from google.protobuf import duration_pb2
        from switchyard_runner.v1 import task_service_pb2

        reply = await client.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(kind="stuck", max_attempts=1, execution_timeout=duration_pb2.Duration(seconds=1)),
            timeout=5,
        )
        await asyncio.wait_for(started.wait(), 10)
        # The server revokes the attempt at its timeout (REVOCATION_REASON_TIMEOUT): the
        # runner stops the handler and reports nothing; the task fails with code timeout.
        await asyncio.wait_for(stopped.wait(), 10)
        done = await client.wait_for(reply.task.task_id, (task_pb2.TASK_STATE_FAILED,))
        assert done.error.code == "timeout"
        assert done.attempts == 1
        assert not runner._running


async def test_missing_required_parameter_degrades_not_stops(server_address: str, client: Client) -> None:
    runner = make_runner(server_address, params={"LLM_URL": "http://x"}.get)
    llm = ProvidedCapability("1.2.0", {"API_KEY": Param("the key", sensitive=True), "LLM_URL": Param("endpoint")})
    runner.pack(HandlerPack("llm", handlers={"chat": lambda task: {"reply": "hi"}}, provides={"ai.llm": llm}))
    runner.pack(HandlerPack("llm", handlers={"other": lambda task: {}}))  # duplicate id: reported, not raised
    assert [(r.kind, r.id) for r in runner.rejections] == [("pack", "llm")]

    async with running(runner):
        task = await client.submit("chat")
        await client.wait_for(task.task_id, SUCCEEDED)

        await client.agent_until(lambda a: a.status == agent_pb2.AGENT_STATUS_DEGRADED, runner.config.name)
        agent = await client.agent(runner.agent_id)  # with its document
        assert list(agent.handled_kinds) == ["chat"], "a handler that requires nothing stays"
        assert list(agent.status_reasons) == ["capability ai.llm unhealthy: missing parameter API_KEY"]
        provides = agent.capabilities.document["provides"]["ai.llm"]
        assert provides["healthy"] is False and provides["version"] == "1.2.0"
        assert "http://x" not in str(agent.capabilities.document)


async def test_running_lease_survives_a_server_restart(server, client: Client) -> None:
    runner = make_runner(server.address)
    started, release = asyncio.Event(), asyncio.Event()
    leases: list[str] = []

    @runner.handler("long")
    async def long(task: TaskContext) -> dict:
        leases.append(task.lease_id)
        started.set()
        await release.wait()
        return {"done": True}

    async with running(runner):
        task = await client.submit("long")
        await asyncio.wait_for(started.wait(), 10)
        server.kill()
        await asyncio.wait_for(_disconnected(runner), 10)
        await asyncio.to_thread(server.start)
        await runner.wait_connected(15)
        release.set()
        done = await client.wait_for(task.task_id, SUCCEEDED, timeout=20)
        assert done.attempts == 0
        assert leases == [leases[0]], "the task was not leased again"


async def _disconnected(runner: Runner) -> None:
    while runner.connected.is_set():
        await asyncio.sleep(0.02)  # the runner exposes no disconnect event; poll its flag


async def test_stop_drains_running_handlers(server_address: str, client: Client) -> None:
    runner = make_runner(server_address)
    started = asyncio.Event()

    @runner.handler("slow")
    async def slow(task: TaskContext) -> dict:
        started.set()
        await asyncio.sleep(0.5)
        return {"finished": True}

    job = asyncio.create_task(runner.run())
    await runner.wait_connected(10)
    task = await client.submit("slow")
    await asyncio.wait_for(started.wait(), 10)
    runner.stop()
    await asyncio.wait_for(job, 10)
    done = await client.wait_for(task.task_id, SUCCEEDED)
    assert done.result["finished"] is True


async def test_print_logging_and_ctx_log_are_the_tasks_output(server_address: str, client: Client) -> None:
    import logging
    import sys

    runner = make_runner(server_address)

    @runner.handler("chatty")
    async def chatty(task: TaskContext) -> dict:
        print("hello from print")
        print("a warning on stderr", file=sys.stderr)
        logging.getLogger("app").warning("careful: %s", "disk almost full")
        task.log("step %d of %d done", 1, 2)
        return {}

    @runner.handler("threaded")
    def threaded(task: TaskContext) -> dict:  # a plain function runs in a thread
        for n in range(1, 26):
            print(f"thread line {n}")
        raise RuntimeError("boom")

    async with running(runner):
        task = await client.submit("chatty")
        await client.wait_for(task.task_id, SUCCEEDED)
        seen = [(c.stream, c.text) for c in await client.output(task.task_id)]
        assert seen == [
            (task_pb2.OUTPUT_STREAM_STDOUT, "hello from print\n"),
            (task_pb2.OUTPUT_STREAM_STDERR, "a warning on stderr\n"),
            (task_pb2.OUTPUT_STREAM_LOG, "WARNING app: careful: disk almost full\nstep 1 of 2 done\n"),
        ]
        failing = await client.submit("threaded", max_attempts=1)
        failed = await client.wait_for(failing.task_id, (task_pb2.TASK_STATE_FAILED,))
        assert failed.error.output_tail.splitlines() == [f"thread line {n}" for n in range(6, 26)]
        text = "".join(c.text for c in await client.output(failing.task_id))
        assert text == "".join(f"thread line {n}\n" for n in range(1, 26))
