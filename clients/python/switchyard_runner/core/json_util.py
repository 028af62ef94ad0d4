"""JSON helpers shared by the core modules: strict equality, compact serialization, kinds.

Python's ``True == 1``; JSON's does not. Everything here treats booleans and numbers as the
distinct JSON types they are.
"""

from __future__ import annotations

import json
from typing import Any

JSON = Any
"""A decoded JSON value: dict, list, str, int, float, bool or None."""


def compact(value: JSON) -> str:
    """The compact serialization (no spaces, UTF-8 text), as serde_json writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def serialized_len(value: JSON) -> int:
    """The length in bytes of ``value`` serialized as compact UTF-8 JSON."""
    return len(compact(value).encode("utf-8"))


def kind(value: JSON) -> str:
    """The JSON type name of ``value`` (``an object``, ``an array``...), for reasons."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def json_equal(a: JSON, b: JSON) -> bool:
    """JSON equality: booleans never equal numbers; 1 equals 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(json_equal(v, b[k]) for k, v in a.items())
        )
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)):
        return isinstance(b, (int, float)) and a == b
    return type(a) is type(b) and a == b


def byte_sorted(keys: Any) -> list[str]:
    """Keys in byte (UTF-8) order, the order of serde_json's sorted maps."""
    return sorted(keys, key=lambda k: k.encode("utf-8"))


def join(path: str, key: str) -> str:
    """Joins a dotted path and a key (``""`` + ``a`` is ``a``)."""
    return f"{path}.{key}" if path else key


def lookup(doc: JSON, path: str) -> tuple[bool, JSON]:
    """The value at dotted ``path`` as the core's ``document::lookup`` finds it (keys may hold dots).

    Returns ``(found, value)``.
    """
    if path == "":
        return True, doc
    if isinstance(doc, dict):
        if path in doc:
            return True, doc[path]
        end = len(path)
        while True:
            i = path.rfind(".", 0, end)
            if i < 0:
                return False, None
            if path[:i] in doc:
                found, value = lookup(doc[path[:i]], path[i + 1 :])
                if found:
                    return True, value
            end = i
    if isinstance(doc, list):
        seg, _, rest = path.partition(".")
        if not (seg.isascii() and seg.isdigit()) or int(seg) >= len(doc):
            return False, None
        return lookup(doc[int(seg)], rest) if "." in path else (True, doc[int(seg)])
    return False, None
