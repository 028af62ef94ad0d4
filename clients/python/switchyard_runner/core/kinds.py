"""Task kinds (the core's ``kinds.rs``): the rules for a kind's name, which :func:`merge_packs
<switchyard_runner.core.pack.merge_packs>` applies to every handler kind before a runner advertises it.

A kind is 1 to :data:`MAX_KIND_BYTES` UTF-8 bytes with no white space and no control characters,
and never contains ``*`` (``*`` alone and a trailing ``.*`` are patterns the server understands;
a runner's handlers are exact kinds). A runner advertises at most :data:`MAX_PATTERNS` kinds; an
empty list handles nothing, so a runner with no handlers is granted nothing.
"""

from __future__ import annotations

import unicodedata

MAX_KIND_BYTES = 256
"""The longest kind, in bytes."""

MAX_PATTERNS = 1024
"""The most kinds (patterns) one agent advertises."""

_WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
"""Unicode's White_Space property (what Rust's ``char::is_whitespace`` tests)."""

_ESCAPES = {"\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", " ": " "}


def check_kind(kind: str) -> str | None:
    """What is wrong with ``kind``, worded as the core's ``KindError``, or ``None`` if it is a kind.

    ``is empty``; ``is N bytes, at most 256 allowed``; ``has `*` other than as `*` alone or a
    trailing `.*```; ``has '\\t': no white space or control characters``.
    """
    if not kind:
        return "is empty"
    size = len(kind.encode("utf-8", "surrogatepass"))
    if size > MAX_KIND_BYTES:
        return f"is {size} bytes, at most {MAX_KIND_BYTES} allowed"
    if "*" in kind:
        return "has `*` other than as `*` alone or a trailing `.*`"
    for c in kind:
        if c in _WHITE_SPACE or unicodedata.category(c) == "Cc":
            return f"has {_debug_char(c)}: no white space or control characters"
    return None


def _debug_char(c: str) -> str:
    """A white space or control character as Rust's ``{:?}`` prints it: ``' '``, ``'\\t'``, ``'\\u{a0}'``."""
    return "'" + _ESCAPES.get(c, f"\\u{{{ord(c):x}}}") + "'"
