"""Helpers for end-to-end tests: clients, a runner running in the background, and waits that
end on events (WatchTask), each with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Container

import grpc

from switchyard import Runner
from switchyard.v1 import (
    agent_admin_service_pb2,
    agent_admin_service_pb2_grpc,
    placement_pb2,
    task_pb2,
    task_service_pb2,
    task_service_pb2_grpc,
)
from switchyard import convert

TERMINAL = (task_pb2.TASK_STATE_SUCCEEDED, task_pb2.TASK_STATE_FAILED, task_pb2.TASK_STATE_CANCELED)


@contextlib.asynccontextmanager
async def running(runner: Runner, timeout: float = 15.0) -> AsyncIterator[Runner]:
    """Runs ``runner`` in the background until it is welcomed; drains it on exit."""
    job = asyncio.create_task(runner.run())
    try:
        waiter = asyncio.create_task(runner.wait_connected(timeout))
        done, _ = await asyncio.wait({job, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if job in done:
            waiter.cancel()
            job.result()
            raise AssertionError("the runner stopped before connecting")
        waiter.result()
        yield runner
    finally:
        runner.stop()
        try:
            await asyncio.wait_for(job, timeout)
        except asyncio.TimeoutError:
            job.cancel()
            raise


class Client:
    """The task and admin services over one channel."""

    def __init__(self, address: str):
        self.channel = grpc.aio.insecure_channel(address)
        self.tasks = task_service_pb2_grpc.TaskServiceStub(self.channel)
        self.admin = agent_admin_service_pb2_grpc.AgentAdminServiceStub(self.channel)

    async def submit(self, kind: str, payload: dict | None = None, required_tags: list[str] | None = None, max_attempts: int = 0) -> task_pb2.Task:
        placement = placement_pb2.Placement(required_tags=required_tags or [])
        reply = await self.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                kind=kind, payload=convert.to_struct(payload or {}), placement=placement, max_attempts=max_attempts
            ),
            timeout=5,
        )
        return reply.task

    async def get(self, task_id: str) -> task_pb2.Task:
        return (await self.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id), timeout=5)).task

    async def wait_for(self, task_id: str, states: Container[int], timeout: float = 15.0) -> task_pb2.Task:
        """Follows WatchTask until the task is in one of ``states``."""

        async def watch() -> task_pb2.Task:
            while True:
                call = self.tasks.WatchTask(task_service_pb2.WatchTaskRequest(task_id=task_id))
                try:
                    async for item in call:
                        if item.task.state in states:
                            return item.task
                        if item.task.state in TERMINAL:
                            raise AssertionError(f"task ended {task_pb2.TaskState.Name(item.task.state)}, not awaited")
                finally:
                    call.cancel()
                task = await self.get(task_id)  # the watch ended: the task may be terminal already
                if task.state in states:
                    return task
                if task.state in TERMINAL:
                    raise AssertionError(f"task ended {task_pb2.TaskState.Name(task.state)}: {task.error.message}")

        return await asyncio.wait_for(watch(), timeout)

    async def agent(self, agent_id: str):
        return (await self.admin.GetAgent(agent_admin_service_pb2.GetAgentRequest(agent_id=agent_id), timeout=5)).agent

    async def close(self) -> None:
        await self.channel.close()
