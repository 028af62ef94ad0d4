"""The tier merge that builds a capability document (the core's ``tier.rs``).

Base, then static, then dynamic, then override on the agent, then the operator tier on the
server. Objects merge deeply with RFC 7386 semantics (``null`` deletes a key); arrays and
scalars replace. The merge is total: a tier that is not an object, or a value over the
:class:`Limits`, goes to the rejection list and the rest applies. Provenance records, for every
leaf of the result (a scalar, an array or an empty object), the tier whose value is there.

A key that is too long, or a container nested too deep, is rejected at its own path and its
siblings still apply; a violation anywhere inside an array rejects the whole array; a tier that
would make the document exceed ``max_serialized_bytes`` is rejected whole (path ``""``).
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field

from switchyard_runner.core.json_util import JSON, byte_sorted, join, kind, serialized_len
from switchyard_runner.core.limits import Limits, Violation, depth_reason, key_reason, size_reason


class Tier(enum.IntEnum):
    """One layer of a capability document, in merge order; values are the wire enum's."""

    BASE = 1
    STATIC = 2
    DYNAMIC = 3
    OVERRIDE = 4
    OPERATOR = 5

    @property
    def label(self) -> str:
        """The stable lowercase name (``base``, ``static``...)."""
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Tier:
        """A tier from ``static`` or ``TIER_STATIC`` (any case)."""
        name = text.upper().removeprefix("TIER_")
        return cls[name]


@dataclass
class Rejection:
    """One part of a tier (or diff, or pack) that was not applied, and why."""

    tier: Tier | None
    """The tier the value came from; ``None`` outside tier merges."""
    path: str
    """Dotted path of the rejected value; empty for the whole tier."""
    reason: str
    """Why, for people (not part of the cross-language contract)."""


@dataclass
class Merged:
    """The result of a tier merge."""

    document: dict = field(default_factory=dict)
    """The merged document; always a JSON object."""
    provenance: dict[str, Tier] = field(default_factory=dict)
    """For every leaf path of ``document``, the tier that set it."""
    rejections: list[Rejection] = field(default_factory=list)
    """What was not applied, in the order found."""

    def apply(self, tier: Tier, value: JSON, limits: Limits) -> None:
        """Merges one more tier on top."""
        if not isinstance(value, dict):
            self.rejections.append(Rejection(tier, "", f"tier is not a JSON object (it is {kind(value)})"))
            return
        may_overflow = serialized_len(self.document) + serialized_len(value) > limits.max_serialized_bytes
        before = (copy.deepcopy(self.document), dict(self.provenance)) if may_overflow else None
        mark = len(self.rejections)
        _MergeContext(tier, limits, self.provenance, self.rejections).merge_object(self.document, value, "", 1)
        if before is None:
            return
        size = serialized_len(self.document)
        if size > limits.max_serialized_bytes:
            self.document, self.provenance = before
            del self.rejections[mark:]
            self.rejections.append(Rejection(tier, "", size_reason(size, limits.max_serialized_bytes)))

    def provenance_entries(self) -> list[tuple[str, Tier]]:
        """``(path, tier)`` pairs sorted by path (byte order), as ``CapabilityView`` carries them."""
        return [(p, self.provenance[p]) for p in byte_sorted(self.provenance)]


def merge_tiers(tiers: list[tuple[Tier, JSON]], limits: Limits | None = None) -> Merged:
    """Merges ``tiers`` in the order given over an empty document."""
    limits = limits or Limits()
    merged = Merged()
    for tier, value in tiers:
        merged.apply(tier, value, limits)
    return merged


class _MergeContext:
    def __init__(self, tier: Tier, limits: Limits, provenance: dict[str, Tier], rejections: list[Rejection]):
        self.tier = tier
        self.limits = limits
        self.provenance = provenance
        self.rejections = rejections

    def reject(self, path: str, reason: str) -> None:
        self.rejections.append(Rejection(self.tier, path, reason))

    def forget(self, path: str) -> None:
        """Forgets the provenance of ``path`` and everything below it."""
        self.provenance.pop(path, None)
        prefix = path + "."
        for key in [k for k in self.provenance if k.startswith(prefix)]:
            del self.provenance[key]

    def merge_object(self, target: dict, patch: dict, path: str, depth: int) -> None:
        for key in byte_sorted(patch):
            value = patch[key]
            child_path = join(path, key)
            key_len = len(key.encode("utf-8"))
            if key_len > self.limits.max_key_bytes:
                self.reject(child_path, key_reason(key_len, self.limits.max_key_bytes))
                continue
            if value is None:
                if key in target:
                    del target[key]
                    self.forget(child_path)
            elif isinstance(value, dict):
                if depth + 1 > self.limits.max_depth:
                    self.reject(child_path, depth_reason(depth + 1, self.limits.max_depth))
                    continue
                existed_as_object = isinstance(target.get(key), dict)
                if not existed_as_object:
                    if key in target:
                        self.forget(child_path)
                    target[key] = {}
                child = target[key]
                was_empty = not child
                self.merge_object(child, value, child_path, depth + 1)
                if not child:
                    if not (existed_as_object and was_empty and child_path in self.provenance):
                        self.provenance[child_path] = self.tier
                else:
                    self.provenance.pop(child_path, None)
            else:
                violations: list[Violation] = []
                self.limits.structural_violations(value, child_path, depth + 1, violations)
                if violations:
                    first = violations[0]
                    reason = first.reason if first.path == child_path else f"{first.path}: {first.reason}"
                    self.reject(child_path, reason)
                    continue
                if key in target:
                    self.forget(child_path)
                target[key] = copy.deepcopy(value)
                self.provenance[child_path] = self.tier
