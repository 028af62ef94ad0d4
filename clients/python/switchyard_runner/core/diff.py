"""Diffs between generations of a capability document (the core's ``diff.rs``).

An RFC 6902 JSON Patch produced and applied with the ``jsonpatch`` library. A runner sends a
patch tagged with the generation it was made against; :func:`apply` checks that generation,
applies the operations atomically, and checks the patch and the result against the same
:class:`Limits` as documents. Every failure is a :class:`DiffError`.
"""

from __future__ import annotations

import copy

import jsonpatch
import jsonpointer

from switchyard_runner.core.json_util import JSON, json_equal, kind
from switchyard_runner.core.limits import Limits, Violation


class DiffError(Exception):
    """A patch that was not applied. ``code`` is the conformance vectors' error name."""

    def __init__(self, code: str, message: str, index: int | None = None):
        super().__init__(message)
        self.code = code
        """``wrong_generation``, ``over_limits``, ``operation_failed`` or ``not_an_object``."""
        self.index = index
        """For ``operation_failed``: the zero-based index of the failing operation."""


def diff(a: JSON, b: JSON) -> list[dict]:
    """The patch (a list of RFC 6902 operations) that turns ``a`` into ``b``; empty if equal."""
    if json_equal(a, b):
        return []
    return list(jsonpatch.make_patch(a, b).patch)


def check_patch(patch: list[dict], limits: Limits) -> None:
    """Checks the patch's JSON form against ``limits`` (its operations count as array items)."""
    violations = limits.violations(patch)
    if violations:
        raise DiffError("over_limits", "patch is over the limits: " + _describe(violations))


def apply(held: JSON, held_generation: int, base_generation: int, patch: list[dict], limits: Limits | None = None) -> JSON:
    """Applies ``patch``, made against ``base_generation``, to ``held`` (generation ``held_generation``).

    Returns the next generation's document; ``held`` is never modified.
    """
    limits = limits or Limits()
    if held_generation != base_generation:
        raise DiffError(
            "wrong_generation", f"diff against generation {base_generation}, server holds {held_generation}"
        )
    check_patch(patch, limits)
    doc = copy.deepcopy(held)
    for index, op in enumerate(patch):
        try:
            doc = jsonpatch.JsonPatch([op]).apply(doc, in_place=True)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, KeyError, IndexError, TypeError) as err:
            raise DiffError(
                "operation_failed", f"operation {index} ({op.get('op')} {op.get('path')}) failed: {err}", index
            ) from err
    if not isinstance(doc, dict):
        raise DiffError("not_an_object", f"the result is {kind(doc)}, not an object")
    violations = limits.violations(doc)
    if violations:
        raise DiffError("over_limits", "document is over the limits: " + _describe(violations))
    return doc


def _describe(violations: list[Violation]) -> str:
    return "; ".join(str(v) for v in violations)
