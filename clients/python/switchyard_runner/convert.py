"""Conversions between JSON values and the protobuf types the contract uses (Struct, Value,
PatchOperation, ProvenanceEntry, Rejection)."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import struct_pb2

from switchyard_runner.core.json_util import JSON
from switchyard_runner.core.tier import Merged
from switchyard_runner.v1 import capability_pb2

_OPS = {
    "add": capability_pb2.PATCH_OP_ADD,
    "remove": capability_pb2.PATCH_OP_REMOVE,
    "replace": capability_pb2.PATCH_OP_REPLACE,
    "move": capability_pb2.PATCH_OP_MOVE,
    "copy": capability_pb2.PATCH_OP_COPY,
    "test": capability_pb2.PATCH_OP_TEST,
}


MAX_EXACT_INTEGER = 2**53 - 1
"""The largest magnitude a number in a ``Struct`` (an IEEE-754 double) carries exactly as an integer."""

BEYOND_EXACT = (
    "number is beyond ±(2^53 − 1) (9007199254740991), the most a Struct number carries exactly; "
    "send it as a string"
)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def to_value(value: JSON, path: str = "") -> struct_pb2.Value:
    """A JSON value as a ``google.protobuf.Value``. A number the contract cannot carry exactly (an
    integer past ±(2^53 − 1), a float of that magnitude, NaN or an infinity) raises ValueError
    naming it by ``path``, rather than travelling rounded."""
    out = struct_pb2.Value()
    if value is None:
        out.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{path or 'value'}: number is NaN or infinite")
        if abs(value) > MAX_EXACT_INTEGER:
            raise ValueError(f"{path or 'value'}: {BEYOND_EXACT}")
        out.number_value = float(value)
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, list):
        out.list_value.values.extend(to_value(v, _join(path, str(i))) for i, v in enumerate(value))
    elif isinstance(value, dict):
        out.struct_value.CopyFrom(to_struct(value, path))
    else:
        raise TypeError(f"{path or 'value'}: {type(value).__name__} is not JSON")
    return out


def to_struct(value: dict, path: str = "") -> struct_pb2.Struct:
    """A JSON object as a ``google.protobuf.Struct`` (see ``to_value`` for the numbers it refuses)."""
    out = struct_pb2.Struct()
    for key, item in value.items():
        out.fields[key].CopyFrom(to_value(item, _join(path, key)))
    return out


def from_value(value: struct_pb2.Value) -> JSON:
    """A ``google.protobuf.Value`` as JSON; integral numbers become ints."""
    which = value.WhichOneof("kind")
    if which == "number_value":
        n = value.number_value
        return int(n) if math.isfinite(n) and n.is_integer() and abs(n) <= MAX_EXACT_INTEGER else n
    if which == "string_value":
        return value.string_value
    if which == "bool_value":
        return value.bool_value
    if which == "struct_value":
        return from_struct(value.struct_value)
    if which == "list_value":
        return [from_value(v) for v in value.list_value.values]
    return None


def from_struct(value: struct_pb2.Struct | None) -> dict:
    """A ``google.protobuf.Struct`` as a JSON object."""
    if value is None:
        return {}
    return {key: from_value(item) for key, item in value.fields.items()}


def patch_to_proto(patch: list[dict]) -> list[capability_pb2.PatchOperation]:
    """RFC 6902 operations (JSON form) as ``PatchOperation`` messages."""
    out = []
    for op in patch:
        message = capability_pb2.PatchOperation(op=_OPS[op["op"]], path=op["path"])
        if "from" in op:
            setattr(message, "from", op["from"])
        if op["op"] in ("add", "replace", "test"):
            message.value.CopyFrom(to_value(op.get("value")))
        out.append(message)
    return out


def provenance_entries(merged: Merged) -> list[capability_pb2.ProvenanceEntry]:
    """The merge's provenance, sorted by path."""
    return [capability_pb2.ProvenanceEntry(path=p, tier=int(t)) for p, t in merged.provenance_entries()]


def rejections(merged: Merged) -> list[capability_pb2.Rejection]:
    """The merge's rejections."""
    return [
        capability_pb2.Rejection(tier=int(r.tier) if r.tier else 0, path=r.path, reason=r.reason)
        for r in merged.rejections
    ]


def duration_seconds(duration: Any, default: float) -> float:
    """A ``google.protobuf.Duration`` in seconds, or ``default`` when unset."""
    if duration is None or (duration.seconds == 0 and duration.nanos == 0):
        return default
    return duration.seconds + duration.nanos / 1e9
