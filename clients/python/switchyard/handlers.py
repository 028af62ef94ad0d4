"""Handlers and handler packs: how a Python program says which task kinds it runs.

A handler is a callable taking a :class:`TaskContext` (``async def`` preferred; a plain function
runs in a worker thread) and returning the task's result (a dict; ``None`` is ``{}``, anything
else becomes ``{"result": value}``). Raising :class:`TaskFailure` fails the attempt with its code;
any other exception fails it with code ``handler_error``, retryable.

A :class:`HandlerPack` bundles handlers with the named capabilities it provides and their
parameters. Packs merge first-registration-wins (the core's ``merge_packs``); duplicates are
reported in :attr:`Handlers.rejections`, never raised. A capability whose required parameter is
missing is reported unhealthy and the runner heartbeats DEGRADED instead of failing to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from switchyard.core.pack import MergedPacks, Pack, PackRejection, ProvidedCapability, merge_packs, resolve_params, unhealthy_reasons

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
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the server revokes the lease or the runner gives up on it (the handler's asyncio
    task is also cancelled; a threaded handler should poll this)."""
    _progress: Callable[[float, str], None] | None = None

    def progress(self, percent: float, message: str = "") -> None:
        """Reports progress (0 to 100, negative if unknown) to the server; best effort."""
        if self._progress is not None:
            self._progress(percent, message)


@dataclass(frozen=True)
class HandlerPack:
    """A pack: an id, the handlers for the kinds it runs, and the capabilities it provides.

    ``provides`` maps a dotted capability name to its version and parameters, e.g.
    ``{"ai.llm": ProvidedCapability("1.2.0", {"API_KEY": Param(sensitive=True)})}``.
    """

    id: str
    handlers: Mapping[str, Handler] = field(default_factory=dict)
    provides: Mapping[str, ProvidedCapability] = field(default_factory=dict)

    def declaration(self) -> Pack:
        """The pack as the core sees it."""
        return Pack(id=self.id, handlers=tuple(self.handlers), provides=dict(self.provides))


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
        """The kinds handled."""
        return sorted(self._by_kind)

    @property
    def rejections(self) -> list[PackRejection]:
        """What the merge rejected (duplicate packs, kinds, capabilities)."""
        return list(self.merged.rejections)

    def provides(self, lookup: Callable[[str], str | None]) -> tuple[dict, list[str]]:
        """The ``provides`` subtree and the reasons of unhealthy capabilities (for DEGRADED)."""
        provides = resolve_params(self.merged, lookup)
        return provides, unhealthy_reasons(provides)
