"""Helpers for end-to-end tests: clients, a runner running in the background, and waits that
end on events (WatchTask), each with a deadline; an agent's status and kinds are only visible by
polling, so :meth:`Client.agent_until` polls them."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator, Callable, Container

import grpc

from switchyard_runner import Runner
from switchyard_runner.v1 import (
    agent_admin_service_pb2,
    agent_admin_service_pb2_grpc,
    agent_pb2,
    placement_pb2,
    task_pb2,
    task_service_pb2,
    task_service_pb2_grpc,
)
from switchyard_runner import convert

TERMINAL = (task_pb2.TASK_STATE_SUCCEEDED, task_pb2.TASK_STATE_FAILED, task_pb2.TASK_STATE_CANCELED)


def make_runner(address: str, directory: pathlib.Path | None = None, **overrides) -> Runner:
    """A runner tuned for tests: fast refresh and reconnects, a short grace period."""
    settings = dict(
        server=address, name=f"py-{id(overrides)}", directory=directory, refresh_interval=0.2,
        backoff_initial=0.05, backoff_max=0.5, grace_period=5.0, params=lambda name: None,
    )
    settings.update(overrides)
    return Runner(**settings)


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

    async def submit(
        self, kind: str, payload: dict | None = None, required_tags: list[str] | None = None, max_attempts: int = 0, selector: str = ""
    ) -> task_pb2.Task:
        placement = placement_pb2.Placement(required_tags=required_tags or [], selector=selector)
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

    async def agent(self, agent_id: str) -> agent_pb2.Agent:
        return (await self.admin.GetAgent(agent_admin_service_pb2.GetAgentRequest(agent_id=agent_id), timeout=5)).agent

    async def agents(self) -> list[agent_pb2.Agent]:
        """The agents of the default namespace (ListAgents, every page)."""
        agents: list[agent_pb2.Agent] = []
        token = ""
        while True:
            reply = await self.admin.ListAgents(agent_admin_service_pb2.ListAgentsRequest(page_token=token), timeout=5)
            agents.extend(reply.agents)
            token = reply.next_page_token
            if not token:
                return agents

    async def agent_until(
        self, predicate: Callable[[agent_pb2.Agent], bool], name: str, timeout: float = 10.0
    ) -> agent_pb2.Agent:
        """The agent named ``name`` (as ListAgents shows it) once ``predicate`` holds for it."""

        async def poll() -> agent_pb2.Agent:
            while True:
                for agent in await self.agents():
                    if agent.name == name and predicate(agent):
                        return agent
                await asyncio.sleep(0.05)  # nothing to await: an agent's status is only visible by polling

        return await asyncio.wait_for(poll(), timeout)

    async def verdict(self, task_id: str, agent_id: str) -> placement_pb2.AgentVerdict:
        """ExplainTask's verdict on the task for one agent."""
        reply = await self.tasks.ExplainTask(task_service_pb2.ExplainTaskRequest(task_id=task_id), timeout=5)
        found = [v for v in reply.verdicts if v.agent_id == agent_id]
        assert found, f"no verdict for {agent_id} in {reply}"
        return found[0]

    async def history(self, task_id: str) -> list[task_pb2.TaskEvent]:
        """The task's events, oldest first (ListTaskEvents, every page)."""
        events: list[task_pb2.TaskEvent] = []
        token = ""
        while True:
            reply = await self.tasks.ListTaskEvents(
                task_service_pb2.ListTaskEventsRequest(task_id=task_id, page_token=token), timeout=5
            )
            events.extend(reply.events)
            token = reply.next_page_token
            if not token:
                return events

    async def output(self, task_id: str) -> list[task_pb2.TaskOutputChunk]:
        """The task's output, oldest first (ListTaskOutput, every page)."""
        chunks: list[task_pb2.TaskOutputChunk] = []
        token = ""
        while True:
            reply = await self.tasks.ListTaskOutput(
                task_service_pb2.ListTaskOutputRequest(task_id=task_id, page_token=token), timeout=5
            )
            chunks.extend(reply.chunks)
            token = reply.next_page_token
            if not token:
                return chunks

    async def leased_to(self, task_id: str) -> list[str]:
        """The agent of every grant of the task (its ``leased`` events), oldest first."""
        return [e.agent_id for e in await self.history(task_id) if e.kind == "leased"]

    async def close(self) -> None:
        await self.channel.close()
