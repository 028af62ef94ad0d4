"""Switchyard for Python: the generated stubs and the agent runner.

Layout:
- ``switchyard.runner``: :class:`Runner` and :class:`RunnerConfig`, the session with the server.
- ``switchyard.handlers``: :class:`TaskContext` (with the :class:`Resources` its lease holds),
  :class:`TaskFailure`, :class:`Release` (hand a task
  back, with a :class:`ReleaseCause`), :class:`HandlerPack`; the kinds a runner advertises.
- ``switchyard.capabilities``: the runner's capability document (base facts and the tiers).
- ``switchyard.tiers``: reading an agent directory's tiers (SheetBot's conventions).
- ``switchyard.detect``: base facts (os, arch, hostname, memory, load).
- ``switchyard.core``: the capability core (merge, redaction, diffs, packs and the kinds they
  advertise, kind names), no IO.
- ``switchyard.convert``: JSON to and from protobuf types.
- ``switchyard.v1``, ``switchyard.health.v1``: the generated messages and gRPC stubs
  (from ``scripts/gen-stubs``; do not edit).
- ``python -m switchyard``: ``capabilities [--explain]`` and ``run``.
"""

from switchyard.core.pack import Param, ProvidedCapability
from switchyard.handlers import HandlerPack, Release, ReleaseCause, Resources, TaskContext, TaskFailure
from switchyard.runner import Runner, RunnerConfig

__all__ = [
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
]
