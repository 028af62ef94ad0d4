"""The limits every capability document and every patch obeys (the core's ``limits.rs``).

Serialized size, nesting depth, object key length and array length. Depth counts containers:
the document object is depth 1, an object or array directly inside it is depth 2, and so on;
scalars add nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from switchyard_runner.core.json_util import JSON, byte_sorted, join, serialized_len


@dataclass(frozen=True)
class Limits:
    """Configurable limits; the defaults are the documented ones."""

    max_serialized_bytes: int = 256 * 1024
    """Largest compact-JSON size in bytes."""
    max_depth: int = 32
    """Deepest container nesting (the root object is depth 1)."""
    max_key_bytes: int = 256
    """Longest object key in UTF-8 bytes."""
    max_array_items: int = 4096
    """Most items in one array."""

    @classmethod
    def from_json(cls, value: dict[str, Any] | None) -> Limits:
        """Limits from a JSON object; absent fields take the default."""
        value = value or {}
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in value.items() if k in names})

    def violations(self, value: JSON) -> list[Violation]:
        """Every violation of ``value`` as a whole document, including its serialized size."""
        out: list[Violation] = []
        self.structural_violations(value, "", 1, out)
        size = serialized_len(value)
        if size > self.max_serialized_bytes:
            out.append(Violation("", size_reason(size, self.max_serialized_bytes)))
        return out

    def structural_violations(self, value: JSON, path: str, depth: int, out: list[Violation]) -> None:
        """Depth, key and array violations of ``value`` sitting at ``path`` with depth ``depth``."""
        if isinstance(value, dict):
            if depth > self.max_depth:
                out.append(Violation(path, depth_reason(depth, self.max_depth)))
                return
            for key in byte_sorted(value):
                child_path = join(path, key)
                key_len = len(key.encode("utf-8"))
                if key_len > self.max_key_bytes:
                    out.append(Violation(child_path, key_reason(key_len, self.max_key_bytes)))
                    continue
                self.structural_violations(value[key], child_path, depth + 1, out)
        elif isinstance(value, list):
            if depth > self.max_depth:
                out.append(Violation(path, depth_reason(depth, self.max_depth)))
                return
            if len(value) > self.max_array_items:
                out.append(Violation(path, f"array has {len(value)} items, limit {self.max_array_items}"))
                return
            for i, child in enumerate(value):
                self.structural_violations(child, join(path, str(i)), depth + 1, out)


@dataclass(frozen=True)
class Violation:
    """One limit violation: where (dotted path, empty for the whole value) and what."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


def depth_reason(depth: int, limit: int) -> str:
    """The reason text of a depth violation."""
    return f"nesting depth {depth} exceeds limit {limit}"


def key_reason(length: int, limit: int) -> str:
    """The reason text of a key-length violation."""
    return f"key is {length} bytes, limit {limit}"


def size_reason(size: int, limit: int) -> str:
    """The reason text of a size violation."""
    return f"document would be {size} bytes serialized, limit {limit}"
