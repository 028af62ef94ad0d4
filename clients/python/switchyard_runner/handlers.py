"""Handlers and handler packs: how a Python program says which task kinds it runs.

A handler is a callable taking a :class:`TaskContext` (``async def`` preferred; a plain function
runs in a worker thread) and returning the task's result (a dict; ``None`` is ``{}``, anything
else becomes ``{"result": value}``). Raising :class:`TaskFailure` fails the attempt with its code;
any other exception fails it with code ``handler_error``, retryable. Raising :class:`Release`
hands the task back instead, without spending an attempt (like Celery's ``Reject``):
``raise Release("quota exhausted")`` is :attr:`ReleaseCause.BUSY`, offered again after a jittered
backoff; ``cause=ReleaseCause.CANNOT_HANDLE`` or ``CANNOT_DECODE`` says this runner cannot run
it as given (the server does not offer it to this runner again until its kinds or document change
or it registers again); ``OTHER`` backs off like ``BUSY``. Every release counts toward the
server's per-task bound (``--max-releases-per-task``), past which the task FAILS with code
``released_too_often``.

The server grants a runner only tasks of the kinds it advertises: the kinds of its handlers.
A :class:`HandlerPack` bundles handlers with the named capabilities it provides and their
parameters, and may require capabilities (``requires=["ai.llm@1"]``, or a name alone for any
version); a single handler may too (``Runner.handler("summarize", requires=["ai.llm@1"])``).
While a required capability is missing, unhealthy or of another major version in the runner's
document, the kinds that need it are withdrawn from what it advertises and the runner heartbeats
DEGRADED naming handler and capability; they come back with the capability
(:meth:`Handlers.advertise`, the core's ``advertise``). Packs merge first-registration-wins (the
core's ``merge_packs``); duplicates and malformed kinds are reported in
:attr:`Handlers.rejections`, never raised. A capability whose required parameter is missing is
reported unhealthy and the runner heartbeats DEGRADED instead of failing to start.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from switchyard_runner.core.pack import (
    Advertised,
    MergedPacks,
    Pack,
    PackRejection,
    ProvidedCapability,
    advertise,
    merge_packs,
    resolve_params,
    unhealthy_reasons,
)
from switchyard_runner.output import LOG

Handler = Callable[["TaskContext"], Union[Awaitable[Any], Any]]
"""A task handler: ``async def handle(task: TaskContext) -> dict``."""


class TaskFailure(Exception):
    """Raised by a handler to fail the attempt with a specific code."""

    def __init__(self, message: str, code: str = "handler_error", retryable: bool = True, details: dict | None = None):
        super().__init__(message)
        self.message = message
        """For people."""
        self.code = code
        """Machine-readable cause, e.g. ``timeout``."""
        self.retryable = retryable
        """False if a retry cannot help."""
        self.details = details
        """Handler detail, a JSON object."""


class ReleaseCause(enum.IntEnum):
    """Why a runner hands a lease back (``switchyard.v1.ReleaseCause``): what the server does with
    the task next. A handler raises :class:`Release` with ``BUSY``, ``OTHER``, ``CANNOT_HANDLE``
    or ``CANNOT_DECODE``; the runner itself uses the others."""

    DRAINING = 1
    """The runner is shutting down: the task goes back at once."""
    REVOCATION_ACKNOWLEDGED = 2
    """The runner stopped after the server revoked the lease to cancel the task."""
    CANNOT_HANDLE = 3
    """No handler for the kind, or it cannot run the task as given: not offered to this runner
    again until its kinds or document change or it registers again."""
    CANNOT_DECODE = 4
    """The task cannot be decoded or is invalid: as ``CANNOT_HANDLE``."""
    BUSY = 5
    """Busy for now (at capacity, a resource momentarily short): offered again after a backoff."""
    OTHER = 6
    """Anything else: offered again after a backoff."""


_HANDLER_CAUSES = (ReleaseCause.BUSY, ReleaseCause.OTHER, ReleaseCause.CANNOT_HANDLE, ReleaseCause.CANNOT_DECODE)


class Release(Exception):
    """Raised by a handler to hand the task back instead of failing the attempt (see the module doc).

    >>> raise Release("model quota exhausted")  # doctest: +SKIP
    >>> raise Release("payload is not a PDF", cause=ReleaseCause.CANNOT_DECODE)  # doctest: +SKIP
    """

    def __init__(self, reason: str, cause: ReleaseCause | int = ReleaseCause.BUSY):
        cause = ReleaseCause(cause)
        if cause not in _HANDLER_CAUSES:
            raise ValueError(f"a handler releases with BUSY, OTHER, CANNOT_HANDLE or CANNOT_DECODE, not {cause.name}")
        super().__init__(reason)
        self.reason = reason
        """Why, for people (the server records it, and names it when the runner refused the task)."""
        self.cause = cause
        """What the server does with the task next."""


@dataclass(frozen=True)
class Resources:
    """What a lease holds on the runner (the grant's ``AssignedResources``): its slots and, for a
    task with a resource request, the amounts and the GPUs assigned to it alone."""

    slots: int = 1
    cpu_millicores: int = 0
    memory_mb: int = 0
    gpu_ids: tuple[str, ...] = ()
    """The GPUs assigned, by uuid (or index), in the order the runner lists them."""
    named: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, assigned: Any) -> Resources:
        """From a ``switchyard.v1.AssignedResources`` (one slot when the grant has none)."""
        if assigned is None:
            return cls()
        return cls(
            slots=max(1, assigned.slots),
            cpu_millicores=assigned.cpu_millicores,
            memory_mb=assigned.memory_mb,
            gpu_ids=tuple(assigned.gpu_ids),
            named=dict(assigned.named),
        )

    def env(self) -> dict[str, str]:
        """The environment a process started for the task should get, so it uses what was
        assigned: ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` when GPUs were assigned,
        and ``SWITCHYARD_SLOTS``, ``SWITCHYARD_CPU_MILLICORES``, ``SWITCHYARD_MEMORY_MB``,
        ``SWITCHYARD_GPU_IDS`` for what was asked (as the Rust agent sets them for ``exec``)."""
        env = {"SWITCHYARD_SLOTS": str(max(1, self.slots))}
        if self.cpu_millicores:
            env["SWITCHYARD_CPU_MILLICORES"] = str(self.cpu_millicores)
        if self.memory_mb:
            env["SWITCHYARD_MEMORY_MB"] = str(self.memory_mb)
        if self.gpu_ids:
            ids = ",".join(self.gpu_ids)
            env.update(CUDA_VISIBLE_DEVICES=ids, NVIDIA_VISIBLE_DEVICES=ids, SWITCHYARD_GPU_IDS=ids)
        return env


@dataclass
class TaskContext:
    """What a handler gets for one attempt."""

    task_id: str
    """The task's id."""
    kind: str
    """Its kind."""
    payload: dict
    """Its payload."""
    lease_id: str
    """The lease this attempt runs under."""
    attempt: int
    """The attempt number: 1 for the first, one more after each unsuccessful attempt."""
    task: Any
    """The full ``switchyard.v1.Task`` message."""
    resources: Resources = field(default_factory=Resources)
    """What the lease holds: pass ``resources.env()`` to a process the handler starts."""
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the server revokes the lease or the runner gives up on it (the handler's asyncio
    task is also cancelled; a threaded handler should poll this)."""
    _progress: Callable[[float, str], None] | None = None
    _output: Any = None

    def progress(self, percent: float, message: str = "") -> None:
        """Reports progress (0 to 100, negative if unknown) to the server; best effort."""
        if self._progress is not None:
            self._progress(percent, message)

    def log(self, message: str, *args: Any) -> None:
        """A line of the handler's own log (the task's ``log`` output stream), kept with the task
        and followed live by ``switchyard logs -f``; ``args`` are ``%``-formatted into ``message``
        as ``logging`` does. ``print`` and ``logging`` in the handler reach the task too (see
        :mod:`switchyard_runner.output`)."""
        if self._output is None:
            return
        text = message % args if args else str(message)
        self._output.write(LOG, text if text.endswith("\n") else text + "\n")


@dataclass(frozen=True)
class HandlerPack:
    """A pack: an id, the handlers for the kinds it runs, the capabilities it provides, and those
    its handlers require.

    ``provides`` maps a dotted capability name to its version and parameters, e.g.
    ``{"ai.llm": ProvidedCapability("1.2.0", {"API_KEY": Param(sensitive=True)})}``.
    ``requires`` lists capability refs, e.g. ``["ai.llm@1", "comm.gateway"]``: while one is not in
    the runner's document, healthy and of that major version, the pack's kinds are withdrawn.
    """

    id: str
    handlers: Mapping[str, Handler] = field(default_factory=dict)
    provides: Mapping[str, ProvidedCapability] = field(default_factory=dict)
    requires: Sequence[str] = ()

    def declaration(self) -> Pack:
        """The pack as the core sees it."""
        return Pack(
            id=self.id, handlers=tuple(self.handlers), provides=dict(self.provides), requires=tuple(self.requires)
        )


class Handlers:
    """The handlers a runner runs, merged from packs (first registration wins)."""

    def __init__(self) -> None:
        self._packs: list[HandlerPack] = []
        self.merged = MergedPacks()
        """The core's merge of the pack declarations."""
        self._by_kind: dict[str, Handler] = {}

    def add(self, pack: HandlerPack) -> None:
        """Adds a pack; contributions already claimed are reported in :attr:`rejections`."""
        self._packs.append(pack)
        self.merged = merge_packs([p.declaration() for p in self._packs])
        self._by_kind = {}
        for kind, pack_id in self.merged.handlers.items():
            owner = next(p for p in self._packs if p.id == pack_id)
            self._by_kind[kind] = owner.handlers[kind]

    def get(self, kind: str) -> Handler | None:
        """The handler for ``kind``."""
        return self._by_kind.get(kind)

    @property
    def kinds(self) -> list[str]:
        """The kinds handled, withdrawn or not (:meth:`advertise` says which are advertised)."""
        return sorted(self._by_kind)

    def advertise(self, document: Any) -> Advertised:
        """The kinds to advertise given the runner's ``document``, and those withdrawn because a
        capability their pack requires is missing or unhealthy (the core's ``advertise``)."""
        return advertise(self.merged, document)

    @property
    def rejections(self) -> list[PackRejection]:
        """What the merge rejected (duplicate packs, kinds, capabilities)."""
        return list(self.merged.rejections)

    def provides(self, lookup: Callable[[str], str | None]) -> tuple[dict, list[str]]:
        """The ``provides`` subtree and the reasons of unhealthy capabilities (for DEGRADED)."""
        provides = resolve_params(self.merged, lookup)
        return provides, unhealthy_reasons(provides)
