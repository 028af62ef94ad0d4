"""Handler packs (the core's ``pack.rs``): how a runner combines the task handlers and named
capabilities that packs contribute.

:func:`merge_packs` is a pure, deterministic fold in which the first registration wins: a later
duplicate pack id is rejected whole (it contributes nothing); a handler kind or capability name
already claimed is dropped and reported; nothing raises. :func:`resolve_params` turns the merged
capabilities into the document's ``provides`` subtree, ``{name: {version, healthy, reason?}}``,
where a required parameter (no default) that the lookup does not supply, or supplies as ``""``,
makes that capability ``healthy: false``. Parameter values never enter the document.

A handler kind must be a valid kind (:func:`switchyard_runner.core.kinds.check_kind`), or it is rejected
like a duplicate. A pack may require capabilities (``requires: ["ai.llm@1"]``, or a name alone for
any version): :func:`advertise` withdraws its kinds while one of them is missing, unhealthy or of
another major version in the runner's document, and says why (the runner reports DEGRADED with
the reasons); a kind comes back when its capabilities do.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from switchyard_runner.core.json_util import byte_sorted
from switchyard_runner.core.kinds import check_kind
from switchyard_runner.core.version import parse_lenient

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Param:
    """A declared configuration parameter of a capability."""

    description: str = ""
    """What the parameter is for."""
    default: Any = None
    """The default; ``None`` makes the parameter required."""
    sensitive: bool = False
    """Whether the value is a secret (never logged, never in the document)."""


@dataclass(frozen=True)
class ProvidedCapability:
    """A named capability a pack provides."""

    version: str
    """Its version, e.g. ``1.4.0``; capability refs match its major version."""
    params: dict[str, Param] = field(default_factory=dict)
    """Its parameters by name (e.g. ``API_KEY``)."""


@dataclass(frozen=True)
class Pack:
    """A pack's declaration: its id, the task kinds it handles, the capabilities it provides and
    those its handlers require."""

    id: str
    handlers: tuple[str, ...] = ()
    provides: dict[str, ProvidedCapability] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    """Capability refs (``ai.llm@1``, or ``ai.llm`` for any version) the pack's handlers need;
    while one is not there its kinds are withdrawn (see :func:`advertise`)."""

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Pack:
        """A pack from its JSON form (as in ``packs.json``)."""
        provides = {
            name: ProvidedCapability(
                version=cap["version"],
                params={p: Param(**spec) for p, spec in (cap.get("params") or {}).items()},
            )
            for name, cap in (value.get("provides") or {}).items()
        }
        return cls(
            id=value["id"],
            handlers=tuple(value.get("handlers") or ()),
            provides=provides,
            requires=tuple(value.get("requires") or ()),
        )


@dataclass(frozen=True)
class PackRejection:
    """A pack contribution that was not merged."""

    pack: str
    """The contributing pack."""
    kind: str
    """``pack``, ``handler`` or ``capability``."""
    id: str
    """The pack id, handler kind or capability name."""
    reason: str
    """Why, for people."""


@dataclass
class MergedPacks:
    """The result of :func:`merge_packs`."""

    packs: list[str] = field(default_factory=list)
    """Accepted pack ids, in order."""
    handlers: dict[str, str] = field(default_factory=dict)
    """Task kind to the pack that handles it."""
    provides: dict[str, tuple[str, ProvidedCapability]] = field(default_factory=dict)
    """Capability name to (pack id, capability)."""
    requires: dict[str, list[str]] = field(default_factory=dict)
    """Task kind to the capabilities required by the pack whose registration of it won (kinds
    whose pack requires none are absent)."""
    rejections: list[PackRejection] = field(default_factory=list)
    """What was not merged, in order."""


def valid_dotted_name(name: str) -> bool:
    """Whether ``name`` is dotted segments of ``[A-Za-z0-9_-]``."""
    return bool(name) and all(_SEGMENT.fullmatch(seg) for seg in name.split("."))


def merge_packs(packs: list[Pack]) -> MergedPacks:
    """Merges packs in order, first registration wins; see the module doc."""
    merged = MergedPacks()
    seen: set[str] = set()
    for pack in packs:

        def reject(kind: str, item: str, reason: str, pack: Pack = pack) -> None:
            merged.rejections.append(PackRejection(pack.id, kind, item, reason))

        if not pack.id:
            reject("pack", "", "pack id is empty")
            continue
        if pack.id in seen:
            reject("pack", pack.id, "duplicate pack id; the pack contributes nothing")
            continue
        seen.add(pack.id)
        merged.packs.append(pack.id)
        for kind in pack.handlers:
            problem = check_kind(kind)
            if problem is not None:
                reject("handler", kind, f"handler kind {problem}")
            elif kind in merged.handlers:
                reject("handler", kind, f"already handled by pack {merged.handlers[kind]}")
            else:
                merged.handlers[kind] = pack.id
                if pack.requires:
                    merged.requires[kind] = list(pack.requires)
        for name in byte_sorted(pack.provides):
            capability = pack.provides[name]
            if not valid_dotted_name(name):
                reject("capability", name, f"`{name}` is not a dotted name")
            elif parse_lenient(capability.version) is None:
                reject("capability", name, f"version `{capability.version}` is not a version")
            elif name in merged.provides:
                reject("capability", name, f"already provided by pack {merged.provides[name][0]}")
            else:
                merged.provides[name] = (pack.id, capability)
    return merged


def resolve_params(merged: MergedPacks, lookup: Callable[[str], str | None]) -> dict[str, dict]:
    """The ``provides`` subtree: ``{name: {version, healthy, reason?}}``.

    ``lookup`` answers a parameter's configured value by name; only whether it answers with a
    non-empty string matters, and no value is copied into the result.
    """
    provides: dict[str, dict] = {}
    for name in byte_sorted(merged.provides):
        _, capability = merged.provides[name]
        missing = [
            param
            for param in byte_sorted(capability.params)
            if capability.params[param].default is None and not lookup(param)
        ]
        entry: dict[str, Any] = {"version": capability.version, "healthy": not missing}
        if len(missing) == 1:
            entry["reason"] = f"missing parameter {missing[0]}"
        elif missing:
            entry["reason"] = f"missing parameters {', '.join(missing)}"
        provides[name] = entry
    return provides


def unhealthy_reasons(provides: dict[str, dict]) -> list[str]:
    """Status reasons for a DEGRADED heartbeat: ``capability NAME unhealthy: REASON``."""
    return [
        f"capability {name} unhealthy: {entry.get('reason', 'unhealthy')}"
        for name, entry in provides.items()
        if entry.get("healthy") is False
    ]


@dataclass(frozen=True)
class Withdrawal:
    """A handler kind withdrawn from what the runner advertises, and why."""

    kind: str
    """The kind."""
    capability: str
    """The required capability that is not there, as the pack wrote it."""
    problem: str
    """What is wrong with it: ``not provided``, ``unhealthy: missing parameter API_KEY``,
    ``version 2.0.0, not major 1``, ``not a capability ref (name@major)``."""

    @property
    def reason(self) -> str:
        """The reason the runner reports with its DEGRADED status."""
        return f"handler {self.kind} withdrawn: needs {self.capability}, {self.problem}"


@dataclass(frozen=True)
class Advertised:
    """What a runner advertises: the kinds it handles now, and those withdrawn."""

    kinds: list[str] = field(default_factory=list)
    """The kinds handled, sorted."""
    withdrawn: list[Withdrawal] = field(default_factory=list)
    """The kinds withdrawn because a required capability is missing or unhealthy, in kind order
    (a kind with several missing capabilities is listed once for each)."""


def advertise(merged: MergedPacks, document: Any) -> Advertised:
    """The kinds the merged packs handle given the runner's ``document`` (only its ``provides``
    subtree matters): a kind whose pack requires a capability that is missing, unhealthy or of
    another major version is withdrawn, and comes back when the capability does."""
    out = Advertised()
    for kind in byte_sorted(merged.handlers):
        problems = [
            Withdrawal(kind, required, problem)
            for required in merged.requires.get(kind, ())
            if (problem := requirement_problem(required, document)) is not None
        ]
        if problems:
            out.withdrawn.extend(problems)
        else:
            out.kinds.append(kind)
    return out


_U64_TEXT = re.compile(r"\+?[0-9]+")
_NOT_A_REF = "not a capability ref (name@major)"


def requirement_problem(required: str, document: Any) -> str | None:
    """Why a required capability (``name@major`` or ``name``) is not there, or ``None`` if it is."""
    name, at, major_text = required.partition("@")
    major: int | None = None
    if at:
        if not _U64_TEXT.fullmatch(major_text) or int(major_text) > 2**64 - 1:
            return _NOT_A_REF
        major = int(major_text)
    if not valid_dotted_name(name):
        return _NOT_A_REF
    provides = document.get("provides") if isinstance(document, dict) else None
    entry = provides.get(name) if isinstance(provides, dict) else None
    if not isinstance(entry, dict):
        return "not provided"
    version = _version_text(entry.get("version"))
    if major is not None:
        parsed = parse_lenient(version) if version is not None else None
        if parsed is None or parsed[0] != major:
            return f"version {version if version is not None else 'no version'}, not major {major}"
    healthy = entry.get("healthy")
    if healthy is False:
        reason = entry.get("reason")
        return f"unhealthy: {reason}" if isinstance(reason, str) else "unhealthy"
    return None


def _version_text(value: Any) -> str | None:
    """A provided capability's version as the core reads it: a string, or a number's text."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return str(value) if isinstance(value, int) else repr(value)
