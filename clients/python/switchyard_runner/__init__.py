"""Switchyard for Python: the generated stubs and the agent runner.

Layout:
- ``switchyard_runner.runner``: :class:`Runner` and :class:`RunnerConfig`, the session with the server.
- ``switchyard_runner.handlers``: :class:`TaskContext` (with the :class:`Resources` its lease holds),
  :class:`TaskFailure`, :class:`Release` (hand a task
  back, with a :class:`ReleaseCause`), :class:`HandlerPack`; the kinds a runner advertises.
- ``switchyard_runner.capabilities``: the runner's capability document (base facts and the tiers).
- ``switchyard_runner.tiers``: reading an agent directory's tiers (SheetBot's conventions).
- ``switchyard_runner.identity``: the agent directory made canonical (:class:`AgentDirectoryError`
  when it is missing) and the default agent name, ``{hostname}-python-{h}``.
- ``switchyard_runner.detect``: base facts (os, arch, hostname, memory, load).
- ``switchyard_runner.core``: the capability core (merge, redaction, diffs, packs and the kinds they
  advertise, kind names), no IO.
- ``switchyard_runner.convert``: JSON to and from protobuf types.
- ``switchyard_runner.v1``, ``switchyard_runner.health.v1``: the generated messages and gRPC stubs
  (from ``scripts/gen-stubs``; do not edit).
- ``python -m switchyard_runner``: ``capabilities [--explain]`` and ``run``.
"""

from switchyard_runner.core.pack import Param, ProvidedCapability
from switchyard_runner.handlers import HandlerPack, Release, ReleaseCause, Resources, TaskContext, TaskFailure
from switchyard_runner.identity import AgentDirectoryError, default_agent_name
from switchyard_runner.runner import Runner, RunnerConfig

__all__ = [
    "AgentDirectoryError",
    "HandlerPack",
    "Param",
    "ProvidedCapability",
    "Release",
    "ReleaseCause",
    "Runner",
    "RunnerConfig",
    "Resources",
    "TaskContext",
    "TaskFailure",
    "default_agent_name",
]
